//! A PTY on a target: a session channel of the target's pooled connection (one channel permit
//! of the pool, held while the shell lives) with `pty-req` (full terminal modes) and then
//! `shell`, each confirmed by the server before the shell counts as open. The shell's drain
//! task (`exec::pty`) reads the channel continuously.
//!
//! Never: opens outside the pool's channel budget; calls a shell open the server refused.

use std::sync::Arc;

use async_trait::async_trait;
use russh::client::Msg;
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf, Pty};

use super::{Lease, SshBackend, TargetPool};
use crate::exec::ExecError;
use crate::exec::pty::{PtyHost, PtyInput, PtyIo, PtyOutput, Size};

/// Most shells per target: half the pool's channels, and never more than this.
const MAX_SHELLS: usize = 8;

/// Terminal modes for `pty-req`, as an interactive terminal has them: the usual control
/// characters, signals, canonical input with echo, CR→NL on input, NL→CRNL on output, 8 bits.
const MODES: &[(Pty, u32)] = &[
    (Pty::VINTR, 3),
    (Pty::VQUIT, 28),
    (Pty::VERASE, 127),
    (Pty::VKILL, 21),
    (Pty::VEOF, 4),
    (Pty::VSTART, 17),
    (Pty::VSTOP, 19),
    (Pty::VSUSP, 26),
    (Pty::VWERASE, 23),
    (Pty::VLNEXT, 22),
    (Pty::ICRNL, 1),
    (Pty::IXON, 0),
    (Pty::IUTF8, 1),
    (Pty::ISIG, 1),
    (Pty::ICANON, 1),
    (Pty::ECHO, 1),
    (Pty::ECHOE, 1),
    (Pty::ECHOK, 1),
    (Pty::ECHOCTL, 1),
    (Pty::ECHOKE, 1),
    (Pty::IEXTEN, 1),
    (Pty::OPOST, 1),
    (Pty::ONLCR, 1),
    (Pty::CS8, 1),
    (Pty::TTY_OP_ISPEED, 38400),
    (Pty::TTY_OP_OSPEED, 38400),
];

#[async_trait]
impl PtyHost for SshBackend {
    fn name(&self) -> &str {
        self.pool.alias()
    }

    fn location(&self) -> String {
        self.pool.target.location()
    }

    fn shell_budget(&self) -> usize {
        let c = &self.pool.config;
        (c.ssh_max_connections * c.ssh_channels_per_connection / 2).min(MAX_SHELLS)
    }

    async fn open_pty(&self, size: Size, term: &str) -> Result<PtyIo, ExecError> {
        open(&self.pool, size, term).await
    }
}

async fn open(pool: &Arc<TargetPool>, size: Size, term: &str) -> Result<PtyIo, ExecError> {
    let (lease, channel) = pool.channel().await?;
    let (mut rx, tx) = channel.split();
    let mut early = Vec::new();
    let asked = async {
        tx.request_pty(true, term, size.cols as u32, size.rows as u32, 0, 0, MODES)
            .await
            .map_err(|e| pool.lost(e))?;
        confirmed(&mut rx, &mut early, "a terminal (pty-req)")
            .await
            .map_err(|why| pool.lost(why))?;
        tx.request_shell(true).await.map_err(|e| pool.lost(e))?;
        confirmed(&mut rx, &mut early, "a shell")
            .await
            .map_err(|why| pool.lost(why))
    };
    match tokio::time::timeout(pool.config.ssh_connect_timeout, asked).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            let _ = tx.close().await;
            return Err(e);
        }
        Err(_) => {
            let _ = tx.close().await;
            return Err(pool.lost("the server did not answer the terminal request"));
        }
    }
    Ok(PtyIo {
        output: Box::new(Output {
            early: Some(early).filter(|e| !e.is_empty()),
            rx,
        }),
        input: Arc::new(Input {
            tx,
            alias: pool.alias().to_string(),
            _lease: lease,
        }),
    })
}

/// Waits for the server's answer to a request; output that arrives first is kept.
async fn confirmed(
    rx: &mut ChannelReadHalf,
    early: &mut Vec<u8>,
    what: &str,
) -> Result<(), String> {
    loop {
        match rx.wait().await {
            Some(ChannelMsg::Success) => return Ok(()),
            Some(ChannelMsg::Failure) => return Err(format!("the server refused {what}")),
            Some(ChannelMsg::Data { data }) | Some(ChannelMsg::ExtendedData { data, .. }) => {
                if early.len() < 64 * 1024 {
                    early.extend_from_slice(&data);
                }
            }
            Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => {
                return Err(format!(
                    "the channel closed before the server granted {what}"
                ));
            }
            Some(_) => {}
        }
    }
}

struct Output {
    /// Output read while the requests were confirmed.
    early: Option<Vec<u8>>,
    rx: ChannelReadHalf,
}

#[async_trait]
impl PtyOutput for Output {
    async fn next(&mut self) -> Option<Vec<u8>> {
        if let Some(e) = self.early.take() {
            return Some(e);
        }
        loop {
            match self.rx.wait().await? {
                ChannelMsg::Data { data } | ChannelMsg::ExtendedData { data, .. } => {
                    return Some(data.to_vec());
                }
                ChannelMsg::Close => return None,
                _ => {}
            }
        }
    }
}

/// The channel's writing half, holding the pool's channel permit while the shell lives.
struct Input {
    tx: ChannelWriteHalf<Msg>,
    alias: String,
    _lease: Lease,
}

#[async_trait]
impl PtyInput for Input {
    async fn send(&self, data: &[u8]) -> Result<(), ExecError> {
        self.tx
            .data_bytes(data.to_vec())
            .await
            .map_err(|e| ExecError::Connection {
                alias: self.alias.clone(),
                reason: e.to_string(),
            })
    }

    async fn close(&self) {
        let _ = self.tx.eof().await;
        let _ = self.tx.close().await;
    }
}
