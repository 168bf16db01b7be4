//! The SSH backend: one pool per app, keyed by target alias, shared by every section. Each
//! target gets one connection, many channels on it, and more connections (up to
//! `ssh_max_connections`) only when all channels are busy; beyond that, commands wait in a
//! bounded queue for `ssh_queue_timeout`. Dead connections are replaced on the next use, with
//! backoff after a failed connect and the failure reported, not hidden; idle ones are closed
//! by the reaper.
//!
//! Commands run on exec channels; files move over SFTP ([`sftp`]), or through the shell
//! ([`shellfs`]) on a connection whose server has no SFTP subsystem. Every command runs in a
//! session of its own — the server shell's where it leads one (OpenSSH makes the exec'd shell
//! a session leader), else one the wrapper creates with `setsid` (Dropbear leaves the shell in
//! the server's own group) — whose leader reports its pid first, behind a marker made for that
//! command. A command past its timeout or cancelled is
//! killed on the remote — that group gets TERM then KILL, and the kill reports whether any of
//! it is left — and its partial output returned; where the group could not be ended (no
//! `setsid` on the target, a survivor), [`Output::stop_note`] says so. A command dropped
//! midway is killed from a task on the app's tracker.
//!
//! A target behind a jump host connects over a `direct-tcpip` channel of the jump host's
//! pooled connection ([`TargetPool::tunnel`]), chains hop by hop, never more than
//! [`MAX_HOPS`] hops nor the same hop twice. The tunnel takes none of the jump
//! connection's channel budget, and a connection carrying a live tunnel is never reaped.
//!
//! Never: accepts an unknown or changed host key, keeps a secret outside the vault, signals a
//! pid it did not read from behind its marker (or one ≤ 1) — so never a group the wrapper did
//! not create —, claims a group ended that it could not end, or lets an SSH failure turn into
//! local execution.

pub mod connect;
mod pty;
pub mod registry;
mod sftp;
mod shellfs;

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use russh::client::Msg;
use russh::{ChannelMsg, ChannelWriteHalf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::truncate::HeadTail;
use super::{Backend, Command, ExecError, Exit, FileBytes, Output};
use crate::config::ExecConfig;
use crate::metrics::{Metrics, ReasonLabel};
use crate::vault::Vault;
use connect::{ConnectOptions, Connection};
use registry::{Endpoint, HostKeyVerdict, MAX_HOPS, RegistryError, Status, TargetRegistry};

/// Most commands waiting for a channel per target; more are refused at once as busy.
const MAX_QUEUED: usize = 1024;
/// First and longest wait before reconnecting after a failed connect.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Tries to open a channel before giving up, and the longest wait between tries.
const OPEN_ATTEMPTS: usize = 5;
const OPEN_RETRY_WAIT: Duration = Duration::from_millis(200);
/// How long the remote kill of a timed-out command may take.
const KILL_WAIT: Duration = Duration::from_secs(8);
/// How long a command stopped before it reported its process group is still read for it.
const PID_WAIT: Duration = Duration::from_secs(2);
/// How long a stopped command's channel is read for output already on its way.
const DRAIN_AFTER_STOP: Duration = Duration::from_millis(500);
/// Runs of the remote kill when one ends without reporting (see [`kill_group`]).
const KILL_ATTEMPTS: usize = 3;

/// Every SSH connection of the app.
pub struct SshPool {
    /// Itself, for the target pools: a target behind a jump host asks for the jump host's pool
    /// when it connects.
    me: Weak<SshPool>,
    config: ExecConfig,
    /// The target registry, read at every use.
    registry: Arc<dyn TargetRegistry>,
    vault: Arc<Vault>,
    /// Counts connection attempts by outcome.
    metrics: Arc<Metrics>,
    /// Per-target pools. Bounded by the number of approved targets: a pool is dropped when
    /// its target is found removed or no longer approved.
    targets: StdMutex<HashMap<String, Arc<TargetPool>>>,
    /// The app's task tracker: background remote kills run on it, so shutdown waits for them.
    tasks: TaskTracker,
}

impl SshPool {
    pub fn new(
        config: ExecConfig,
        registry: Arc<dyn TargetRegistry>,
        vault: Arc<Vault>,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| SshPool {
            me: me.clone(),
            config,
            registry,
            vault,
            metrics,
            targets: StdMutex::new(HashMap::new()),
            tasks,
        })
    }

    /// The backend of an approved target. Checks the registry each time, so a disabled or
    /// removed target stops being usable at once.
    pub async fn backend(&self, alias: &str) -> Result<Arc<SshBackend>, ExecError> {
        Ok(Arc::new(SshBackend {
            pool: self.pool(alias).await?,
        }))
    }

    /// The pool of an approved target whose jump hosts, if any, are approved too (one query
    /// for the whole path). A target or jump host found gone, pending or disabled has its pool
    /// dropped, and the error names the hop and why.
    async fn pool(&self, alias: &str) -> Result<Arc<TargetPool>, ExecError> {
        let unavailable = |reason: String| ExecError::Unavailable {
            alias: alias.to_string(),
            reason,
        };
        let mut path = match self.registry.path(alias).await {
            Ok(p) => p,
            Err(RegistryError::NotFound(_)) => {
                self.forget(alias);
                return Err(unavailable("no target has this alias".into()));
            }
            Err(e) => return Err(unavailable(e.to_string())),
        };
        if path.len() > MAX_HOPS + 1 {
            self.forget(alias);
            return Err(unavailable(format!(
                "it is reached through more than {} jump hosts (or its jump hosts form a loop)",
                MAX_HOPS
            )));
        }
        for (i, hop) in path.iter().enumerate() {
            let refused = match hop.status {
                Status::Approved => continue,
                Status::Pending => "is pending; an admin must approve it first",
                Status::Disabled => "is disabled",
            };
            self.forget(alias);
            return Err(unavailable(if i == 0 {
                format!("it {refused}")
            } else {
                format!("its jump host `{}` {refused}", hop.alias)
            }));
        }
        let t = path.swap_remove(0);
        let mut map = self.targets.lock().expect("ssh pool lock");
        let pool = match map.get(alias) {
            Some(p) if p.target.generation == t.generation && p.target.jump == t.jump => p.clone(),
            _ => {
                let p = Arc::new(TargetPool::new(
                    t,
                    self.config.clone(),
                    self.registry.clone(),
                    self.vault.clone(),
                    self.metrics.clone(),
                    self.tasks.clone(),
                    self.me.clone(),
                ));
                map.insert(alias.to_string(), p.clone());
                p
            }
        };
        Ok(pool)
    }

    /// Drops the pool of a target that is gone or no longer approved, so the map stays
    /// bounded by the usable targets; its connections close once their last command ends.
    fn forget(&self, alias: &str) {
        let gone = self.targets.lock().expect("ssh pool lock").remove(alias);
        if gone.is_some() {
            tracing::info!(ssh.target = %alias, "target no longer usable; its connections are closed");
        }
    }

    /// Closes `alias`'s pooled connections that carry nothing now (no channel, no tunnel):
    /// its bindings were released. Returns the connections still open (busy ones close at a
    /// later call, or idle out).
    pub async fn close_unused(&self, alias: &str) -> usize {
        let pool = self
            .targets
            .lock()
            .expect("ssh pool lock")
            .get(alias)
            .cloned();
        let Some(pool) = pool else {
            return 0;
        };
        pool.close_idle(Duration::ZERO).await;
        pool.live_connections().await
    }

    /// Open connections per target alias (for metrics and tests).
    pub async fn connection_counts(&self) -> HashMap<String, usize> {
        let pools: Vec<_> = self
            .targets
            .lock()
            .expect("ssh pool lock")
            .iter()
            .map(|(a, p)| (a.clone(), p.clone()))
            .collect();
        let mut out = HashMap::new();
        for (alias, p) in pools {
            out.insert(alias, p.live_connections().await);
        }
        out
    }

    /// Closes connections idle for longer than `ssh_idle`, until `shutdown`.
    pub async fn run_reaper(self: Arc<Self>, shutdown: CancellationToken) {
        let period =
            (self.config.ssh_idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let pools: Vec<_> = self
                .targets
                .lock()
                .expect("ssh pool lock")
                .values()
                .cloned()
                .collect();
            for p in pools {
                p.close_idle(self.config.ssh_idle).await;
            }
        }
        let pools: Vec<_> = self
            .targets
            .lock()
            .expect("ssh pool lock")
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in pools {
            p.close_idle(Duration::ZERO).await;
        }
    }
}

/// One SSH connection and how many of its channels are in use.
struct Conn {
    handle: Connection,
    /// Channels in use (bounded by `ssh_channels_per_connection`).
    busy: AtomicUsize,
    /// Live tunnels to targets behind this one (jump host): not counted in `busy`, but a
    /// connection carrying one is never closed as idle.
    tunnels: AtomicUsize,
    /// A channel open failed on it: no new channels; dropped once idle.
    broken: AtomicBool,
    /// For idle close.
    last_used: StdMutex<Instant>,
    /// Whether the server offers SFTP: [`SFTP_UNKNOWN`] until the first file operation on
    /// this connection finds out, then [`SFTP_YES`] or [`SFTP_NO`] (files go through the
    /// shell, [`shellfs`]).
    sftp: AtomicU8,
}

const SFTP_UNKNOWN: u8 = 0;
const SFTP_YES: u8 = 1;
const SFTP_NO: u8 = 2;

/// How a target's files move, as `target test` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilePath {
    /// Over the server's SFTP subsystem.
    Sftp,
    /// Through the shell on an exec channel: the server has no SFTP subsystem.
    Shell,
}

/// The connections of one target.
pub struct TargetPool {
    target: Endpoint,
    config: ExecConfig,
    /// The target registry, read at every use.
    registry: Arc<dyn TargetRegistry>,
    vault: Arc<Vault>,
    /// Counts connection attempts by outcome.
    metrics: Arc<Metrics>,
    /// One permit per channel the target may have open: connections × channels.
    slots: Arc<Semaphore>,
    /// Commands currently waiting for a permit (bounded by [`MAX_QUEUED`]).
    queued: AtomicUsize,
    /// Open connections; locked while picking one or connecting.
    conns: tokio::sync::Mutex<Vec<Arc<Conn>>>,
    /// The last connect failure: when, how many in a row, why.
    failure: StdMutex<Option<(Instant, u32, String)>>,
    /// The remote user's home, learned once.
    home: tokio::sync::OnceCell<String>,
    /// Signalled whenever a channel is given back: wakes commands waiting for a connection
    /// slot or for sshd to accept a session again.
    freed: Arc<Notify>,
    /// The app's task tracker, for background kills of dropped commands.
    tasks: TaskTracker,
    /// The app's pools, where a target behind a jump host finds the jump host's pool.
    pools: Weak<SshPool>,
}

/// A channel slot on a connection; returns itself on drop.
struct Lease {
    conn: Arc<Conn>,
    _permit: OwnedSemaphorePermit,
    /// The pool's "a channel was freed" signal.
    freed: Arc<Notify>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.conn.busy.fetch_sub(1, Ordering::AcqRel);
        *self.conn.last_used.lock().expect("conn lock") = Instant::now();
        self.freed.notify_waiters();
    }
}

/// A place in a target's wait queue, given back on drop.
struct Queued<'a>(&'a AtomicUsize);

impl<'a> Queued<'a> {
    /// Takes a place, or `None` when [`MAX_QUEUED`] are already waiting.
    fn enter(count: &'a AtomicUsize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_QUEUED).then_some(n + 1)
            })
            .ok()
            .map(|_| Queued(count))
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Drops closed connections, and broken ones nothing uses any more (no channel, no tunnel).
fn retain_usable(conns: &mut Vec<Arc<Conn>>) {
    conns.retain(|c| {
        let retired = c.broken.load(Ordering::Acquire)
            && c.busy.load(Ordering::Acquire) == 0
            && c.tunnels.load(Ordering::Acquire) == 0;
        !(c.handle.is_closed() || retired)
    });
}

/// Whether `e` is about target `alias`.
fn is_for(e: &ExecError, alias: &str) -> bool {
    matches!(e, ExecError::Unavailable { alias: a, .. } if a == alias)
}

/// Why a target behind `jump` cannot connect, from the jump host's own error.
fn jump_failed(jump: &str, e: ExecError) -> String {
    match e {
        ExecError::Unavailable { reason, .. } => {
            format!("its jump host `{jump}` is unavailable: {reason}")
        }
        ExecError::HostKeyMismatch {
            expected,
            presented,
            ..
        } => format!(
            "the host key of its jump host `{jump}` changed: expected {expected}, got {presented}; refusing to connect. If the change is legitimate, an admin checks the new key on the host and runs `sshmode target rekey {jump} --host-key SHA256:…`"
        ),
        ExecError::Busy { .. } => format!("its jump host `{jump}` has no connection free"),
        ExecError::Connection { reason, .. } => {
            format!("the connection to its jump host `{jump}` failed: {reason}")
        }
        other => format!("its jump host `{jump}`: {other}"),
    }
}

/// A tunnel through a jump host's connection, as the target's SSH session reads and writes it.
/// Holds the jump connection (counted as carrying a tunnel) until the session drops it.
struct TunnelStream {
    inner: russh::ChannelStream<Msg>,
    _hold: TunnelHold,
}

impl tokio::io::AsyncRead for TunnelStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TunnelStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A jump connection counted as carrying a tunnel; given back on drop.
struct TunnelHold {
    conn: Arc<Conn>,
    /// The jump pool's "a channel was freed" signal.
    freed: Arc<Notify>,
}

impl Drop for TunnelHold {
    fn drop(&mut self) {
        self.conn.tunnels.fetch_sub(1, Ordering::AcqRel);
        *self.conn.last_used.lock().expect("conn lock") = Instant::now();
        self.freed.notify_waiters();
    }
}

impl TargetPool {
    fn new(
        target: Endpoint,
        config: ExecConfig,
        registry: Arc<dyn TargetRegistry>,
        vault: Arc<Vault>,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
        pools: Weak<SshPool>,
    ) -> Self {
        let permits = config.ssh_max_connections * config.ssh_channels_per_connection;
        TargetPool {
            target,
            config,
            registry,
            vault,
            metrics,
            slots: Arc::new(Semaphore::new(permits)),
            queued: AtomicUsize::new(0),
            conns: tokio::sync::Mutex::new(Vec::new()),
            failure: StdMutex::new(None),
            home: tokio::sync::OnceCell::new(),
            freed: Arc::new(Notify::new()),
            tasks,
            pools,
        }
    }

    fn alias(&self) -> &str {
        &self.target.alias
    }

    async fn live_connections(&self) -> usize {
        // Every connection held, retiring ones included: this is what the limit bounds.
        self.conns.lock().await.len()
    }

    async fn close_idle(&self, idle: Duration) {
        let mut conns = self.conns.lock().await;
        let mut kept = Vec::with_capacity(conns.len());
        for c in conns.drain(..) {
            let unused =
                c.busy.load(Ordering::Acquire) == 0 && c.tunnels.load(Ordering::Acquire) == 0;
            let old = c.last_used.lock().expect("conn lock").elapsed() >= idle;
            if c.handle.is_closed() || (unused && (old || c.broken.load(Ordering::Acquire))) {
                let _ = c
                    .handle
                    .disconnect(russh::Disconnect::ByApplication, "idle", "en")
                    .await;
                tracing::debug!(ssh.target = %self.target.alias, "closed an idle connection");
            } else {
                kept.push(c);
            }
        }
        *conns = kept;
    }

    /// A channel slot: waits (bounded) for a permit, then picks a connection with a free
    /// channel, connecting a new one when all are full.
    async fn lease(&self) -> Result<Lease, ExecError> {
        // Counted out again on drop, so a caller that gives up (cancellation, shutdown)
        // while queued does not leave its place taken.
        let place = Queued::enter(&self.queued).ok_or_else(|| ExecError::Busy {
            alias: self.alias().to_string(),
            waited: Duration::ZERO,
        })?;
        let waited = self.config.ssh_queue_timeout;
        let deadline = tokio::time::Instant::now() + waited;
        let permit = tokio::time::timeout_at(deadline, self.slots.clone().acquire_owned()).await;
        drop(place);
        let busy = || ExecError::Busy {
            alias: self.alias().to_string(),
            waited,
        };
        let mut permit = match permit {
            Ok(Ok(p)) => p,
            _ => return Err(busy()),
        };
        loop {
            // Registered before looking, so a channel freed meanwhile is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            permit = match self.try_lease(permit).await? {
                Ok(lease) => return Ok(lease),
                Err(p) => p,
            };
            // Every connection is full and the connection limit is reached (a retiring
            // connection still finishing its commands counts): wait for a channel back.
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(busy());
            }
        }
    }

    /// A free channel on an open connection, or a new connection if fewer than the maximum
    /// exist; gives the permit back when neither is possible now.
    async fn try_lease(
        &self,
        permit: OwnedSemaphorePermit,
    ) -> Result<Result<Lease, OwnedSemaphorePermit>, ExecError> {
        let per_conn = self.config.ssh_channels_per_connection;
        let mut conns = self.conns.lock().await;
        retain_usable(&mut conns);
        for c in conns.iter() {
            if c.broken.load(Ordering::Acquire) {
                continue;
            }
            let took = c
                .busy
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                    (b < per_conn).then_some(b + 1)
                })
                .is_ok();
            if took {
                return Ok(Ok(Lease {
                    conn: c.clone(),
                    _permit: permit,
                    freed: self.freed.clone(),
                }));
            }
        }
        if conns.len() >= self.config.ssh_max_connections {
            return Ok(Err(permit));
        }
        // Every channel of every connection is busy (or there is none): connect.
        let conn = self.connect_new(&mut conns, &[]).await?;
        conn.busy.fetch_add(1, Ordering::AcqRel);
        Ok(Ok(Lease {
            conn,
            _permit: permit,
            freed: self.freed.clone(),
        }))
    }

    /// Connects one more connection (the caller holds `conns` and has checked the limit),
    /// directly or through the jump host, with backoff after failures, and adds it to `conns`
    /// with nothing in use yet. `path` holds the targets this connection is being made for
    /// (outermost last), when it is to carry a tunnel to them.
    async fn connect_new(
        &self,
        conns: &mut Vec<Arc<Conn>>,
        path: &[String],
    ) -> Result<Arc<Conn>, ExecError> {
        if let Some((at, n, reason)) = &*self.failure.lock().expect("failure lock") {
            let wait = backoff(*n);
            let since = at.elapsed();
            if since < wait {
                return Err(ExecError::Unavailable {
                    alias: self.alias().to_string(),
                    reason: format!(
                        "{reason} (next attempt in {:.1}s)",
                        (wait - since).as_secs_f32()
                    ),
                });
            }
        }
        let opts = || ConnectOptions {
            config: &self.config,
            registry: &self.registry,
            vault: &self.vault,
            trust: None,
            actor: "system",
        };
        let (seen, result) = match &self.target.jump {
            None => connect::connect(&self.target, opts()).await,
            Some(jump) => match self.through(jump, path).await {
                Ok(stream) => connect::connect_through(&self.target, opts(), stream).await,
                // The jump host's own pool backs off from its failures; a refusal to forward
                // costs one channel request. Neither delays this target's next attempt.
                Err(e) => return Err(e),
            },
        };
        let outcome = match (&result, &seen.verdict) {
            (Ok(_), _) => "ok",
            (Err(ExecError::HostKeyMismatch { .. }), _) => "host_key_mismatch",
            (Err(_), Some(HostKeyVerdict::Unpinned)) => "host_key_unpinned",
            (Err(_), _) => "failed",
        };
        self.metrics
            .ssh_connects
            .get_or_create(&ReasonLabel {
                reason: outcome.into(),
            })
            .inc();
        match result {
            Ok(handle) => {
                *self.failure.lock().expect("failure lock") = None;
                tracing::info!(ssh.target = %self.target.alias, ssh.via = self.target.jump.as_deref().unwrap_or("-"), ssh.connections = conns.len() + 1, "connected");
                let conn = Arc::new(Conn {
                    handle,
                    busy: AtomicUsize::new(0),
                    tunnels: AtomicUsize::new(0),
                    broken: AtomicBool::new(false),
                    last_used: StdMutex::new(Instant::now()),
                    sftp: AtomicU8::new(SFTP_UNKNOWN),
                });
                conns.push(conn.clone());
                Ok(conn)
            }
            Err(e)
                if matches!(
                    seen.verdict,
                    Some(HostKeyVerdict::Unpinned | HostKeyVerdict::Mismatch { .. })
                ) =>
            {
                // Waiting for an operator to pin or rekey: the next attempt re-reads the key.
                Err(e)
            }
            Err(e) => {
                let mut f = self.failure.lock().expect("failure lock");
                let n = f.as_ref().map(|(_, n, _)| n + 1).unwrap_or(1);
                let reason = match &e {
                    ExecError::Unavailable { reason, .. } => reason.clone(),
                    other => other.to_string(),
                };
                *f = Some((Instant::now(), n, reason));
                tracing::warn!(ssh.target = %self.target.alias, error = %e, "connect failed");
                Err(e)
            }
        }
    }

    /// A stream to this target through its jump host `jump`: a tunnel on the jump host's pooled
    /// connection. `path` holds the targets already waiting on this connect (outermost last);
    /// a jump host among them (a loop) or a path longer than [`MAX_HOPS`] is refused
    /// before anything is locked or opened.
    async fn through(&self, jump: &str, path: &[String]) -> Result<TunnelStream, ExecError> {
        let unavailable = |reason: String| ExecError::Unavailable {
            alias: self.alias().to_string(),
            reason,
        };
        let mut path = path.to_vec();
        path.push(self.alias().to_string());
        if path.iter().any(|a| a == jump) || path.len() > MAX_HOPS {
            return Err(unavailable(format!(
                "its jump hosts loop or exceed {} hops ({} → {jump}); refusing to connect",
                MAX_HOPS,
                path.join(" → ")
            )));
        }
        let pools = self
            .pools
            .upgrade()
            .ok_or_else(|| unavailable("the service is shutting down".into()))?;
        let hop = pools
            .pool(jump)
            .await
            .map_err(|e| unavailable(jump_failed(jump, e)))?;
        // Boxed: a chain of jump hosts recurses through here, once per hop (bounded above).
        Box::pin(hop.tunnel(&self.target.host, self.target.port, &path))
            .await
            .map_err(|e| match e {
                // The jump host's refusal to forward, already worded for this target.
                e @ ExecError::Unavailable { .. } if is_for(&e, self.alias()) => e,
                other => unavailable(jump_failed(jump, other)),
            })
    }

    /// A `direct-tcpip` channel to `host:port` on one of this target's connections (it is the
    /// jump host of the target at the end of `path`), connecting one if none is open. The
    /// channel takes no channel slot; the connection counts it as a live tunnel until the
    /// stream is dropped, so the reaper leaves it open. A refusal is said in the server's words.
    async fn tunnel(
        &self,
        host: &str,
        port: u16,
        path: &[String],
    ) -> Result<TunnelStream, ExecError> {
        let mut last = String::from("no connection to it could carry the tunnel");
        for _ in 0..2 {
            let conn = {
                let mut conns = self.conns.lock().await;
                retain_usable(&mut conns);
                let open = conns
                    .iter()
                    .find(|c| !c.broken.load(Ordering::Acquire))
                    .cloned();
                let conn = match open {
                    Some(c) => c,
                    None if conns.len() < self.config.ssh_max_connections => {
                        self.connect_new(&mut conns, path).await?
                    }
                    None => {
                        return Err(ExecError::Busy {
                            alias: self.alias().to_string(),
                            waited: Duration::ZERO,
                        });
                    }
                };
                // Counted before the lock is given back, so the reaper cannot close it now.
                conn.tunnels.fetch_add(1, Ordering::AcqRel);
                conn
            };
            let hold = TunnelHold {
                conn: conn.clone(),
                freed: self.freed.clone(),
            };
            match connect::open_tunnel(
                &conn.handle,
                self.alias(),
                host,
                port,
                self.config.ssh_connect_timeout,
            )
            .await
            {
                Ok(ch) => {
                    return Ok(TunnelStream {
                        inner: ch.into_stream(),
                        _hold: hold,
                    });
                }
                Err(Some(refused)) => {
                    // Said of the target it was for (the last on `path`).
                    return Err(ExecError::Unavailable {
                        alias: path.last().map_or(self.alias(), String::as_str).to_string(),
                        reason: refused,
                    });
                }
                Err(None) => {
                    // The connection failed under us: retire it and try a fresh one once.
                    conn.broken.store(true, Ordering::Release);
                    last = "the connection to it was lost".into();
                }
            }
        }
        Err(self.lost(last))
    }

    /// Opens a session channel. sshd may refuse a session for a moment while earlier ones on
    /// the connection are still being torn down (its `MaxSessions`): then we wait for a
    /// channel to come back and try again, a bounded number of times. A connection that fails
    /// otherwise is retired and the open retried on a fresh one.
    async fn channel(&self) -> Result<(Lease, russh::Channel<Msg>), ExecError> {
        let mut last = None;
        for _ in 0..OPEN_ATTEMPTS {
            let lease = self.lease().await?;
            // A peer that stops answering (without closing) must not hold us forever.
            let opened = tokio::time::timeout(
                self.config.ssh_connect_timeout,
                lease.conn.handle.channel_open_session(),
            )
            .await
            .unwrap_or(Err(russh::Error::ConnectionTimeout));
            match opened {
                Ok(ch) => return Ok((lease, ch)),
                Err(e @ russh::Error::ChannelOpenFailure(_)) if !lease.conn.handle.is_closed() => {
                    let freed = self.freed.notified();
                    tokio::pin!(freed);
                    freed.as_mut().enable();
                    drop(lease);
                    let _ = tokio::time::timeout(OPEN_RETRY_WAIT, freed).await;
                    last = Some(e);
                }
                Err(e) => {
                    lease.conn.broken.store(true, Ordering::Release);
                    tracing::debug!(ssh.target = %self.target.alias, error = %e, "channel open failed; retiring the connection");
                    last = Some(e);
                }
            }
        }
        Err(ExecError::Connection {
            alias: self.alias().to_string(),
            reason: last.map(|e| e.to_string()).unwrap_or_default(),
        })
    }

    /// Opens a channel and starts `script`, waiting for the server to confirm it started. A
    /// connection that dies before that (sshd restarted since the last command) is retired
    /// and the start retried once on a fresh one: nothing ran, so nothing runs twice.
    async fn start(&self, script: &str) -> Result<(Lease, russh::Channel<Msg>), ExecError> {
        let mut last = String::new();
        for _ in 0..2 {
            let (lease, mut channel) = self.channel().await?;
            if let Err(e) = channel.exec(true, script.as_bytes().to_vec()).await {
                lease.conn.broken.store(true, Ordering::Release);
                last = e.to_string();
                continue;
            }
            let confirmed = async {
                loop {
                    match channel.wait().await {
                        Some(ChannelMsg::Success) => return Ok(true),
                        Some(ChannelMsg::Failure) => return Err(()),
                        Some(ChannelMsg::Close) | Some(ChannelMsg::Eof) | None => return Ok(false),
                        Some(_) => {}
                    }
                }
            };
            match tokio::time::timeout(self.config.ssh_connect_timeout, confirmed).await {
                Ok(Ok(true)) => return Ok((lease, channel)),
                Ok(Err(())) => return Err(self.lost("the server refused to run the command")),
                Ok(Ok(false)) => {
                    last = "the connection closed before the command started".into();
                }
                Err(_) => {
                    // It may still start: not retried, so nothing runs twice.
                    lease.conn.broken.store(true, Ordering::Release);
                    return Err(self.lost("the server did not confirm the command started"));
                }
            }
            lease.conn.broken.store(true, Ordering::Release);
        }
        Err(self.lost(last))
    }

    fn lost(&self, e: impl std::fmt::Display) -> ExecError {
        ExecError::Connection {
            alias: self.alias().to_string(),
            reason: e.to_string(),
        }
    }

    /// Runs `cmd`; see [`Backend::exec`].
    async fn exec(
        &self,
        cmd: Command<'_>,
        cancel: &CancellationToken,
    ) -> Result<Output, ExecError> {
        // The command runs in a session (so a process group) the wrapper creates with
        // `setsid`, whose leader prints its pid behind a one-time marker, so nothing a login
        // script prints first (a `1` from an rc file) is ever taken for it.
        let mut pid_scan = PidScan::new();
        let script = wrap(pid_scan.marker(), cmd.script);
        // Waiting for a channel (bounded by the queue and connect timeouts) honours
        // cancellation; the command's own timeout starts once it runs.
        let (lease, channel) = tokio::select! {
            started = self.start(&script) => started?,
            _ = cancel.cancelled() => return Ok(Output {
                stdout: Vec::new(),
                stderr: Vec::new(),
                stdout_omitted: 0,
                stderr_omitted: 0,
                exit: Exit::Cancelled,
                stop_note: None,
            }),
        };
        let (mut rx, tx) = channel.split();
        // Input is sent while output is read: a command that does not read its input (or
        // writes much before reading) neither blocks us past the timeout nor deadlocks.
        // Then end of file, so a command reading stdin sees it, as locally (/dev/null).
        let input = async {
            if let Some(data) = cmd.stdin {
                tx.data_bytes(data.to_vec()).await?;
            }
            tx.eof().await
        };
        tokio::pin!(input);
        let mut input_sent = false;
        // Armed until the command has ended or been killed: a caller that drops this future
        // midway (shutdown, an abandoned tool call) must not leave it running remotely.
        let mut orphan = KillOnDrop {
            conn: lease.conn.clone(),
            alias: self.target.alias.clone(),
            pid: None,
            tasks: self.tasks.clone(),
            freed: self.freed.clone(),
        };
        let mut out = HeadTail::new(cmd.stdout_limit).observed(cmd.live.clone());
        let mut err = HeadTail::new(cmd.stderr_limit).observed(cmd.live.clone());
        let mut pid: Option<u32> = None;
        let mut exit = None;
        let mut stop_note = None;
        let deadline = tokio::time::sleep(cmd.timeout);
        tokio::pin!(deadline);
        let mut stop = None;
        loop {
            tokio::select! {
                // A command that exits without reading its input closes the channel: the
                // error is not the command's result, so it is ignored, as locally.
                _ = &mut input, if !input_sent => input_sent = true,
                msg = rx.wait() => match msg {
                    Some(ChannelMsg::Data { data }) => out.push(&data),
                    Some(ChannelMsg::ExtendedData { data, ext: 1 }) => {
                        if let Some(found) = pid_scan.push(&data, &mut err) {
                            pid = Some(found);
                            orphan.pid = pid;
                        }
                    }
                    Some(ChannelMsg::ExitStatus { exit_status }) => {
                        exit = Some(Exit::Code(exit_status as i32));
                    }
                    Some(ChannelMsg::ExitSignal { signal_name, .. }) => {
                        exit = Some(Exit::Signal(sig_name(&signal_name)));
                    }
                    Some(ChannelMsg::Close) | None => break,
                    Some(_) => {}
                },
                _ = &mut deadline => {
                    stop = Some(Exit::TimedOut);
                    break;
                }
                _ = cancel.cancelled() => {
                    stop = Some(Exit::Cancelled);
                    break;
                }
            }
        }
        if let Some(how) = stop {
            // A command stopped right after it started may not have reported its group yet:
            // wait for the line (bounded) rather than leave the group running.
            if pid.is_none() && !pid_scan.done {
                let _ = tokio::time::timeout(PID_WAIT, async {
                    while let Some(msg) = rx.wait().await {
                        match msg {
                            ChannelMsg::ExtendedData { data, ext: 1 } => {
                                if let Some(found) = pid_scan.push(&data, &mut err) {
                                    pid = Some(found);
                                    orphan.pid = pid;
                                }
                                if pid_scan.done {
                                    break;
                                }
                            }
                            ChannelMsg::Data { data } => out.push(&data),
                            ChannelMsg::Close => break,
                            _ => {}
                        }
                    }
                })
                .await;
            }
            stop_note = self.kill(&lease, &tx, pid).await;
            exit = Some(how);
            // What the command wrote before it was stopped may still be on its way: read it
            // (bounded) until the channel closes, so a stopped command keeps its output.
            let _ = tokio::time::timeout(DRAIN_AFTER_STOP, async {
                while let Some(msg) = rx.wait().await {
                    match msg {
                        ChannelMsg::Data { data } => out.push(&data),
                        ChannelMsg::ExtendedData { data, ext: 1 } => {
                            let _ = pid_scan.push(&data, &mut err);
                        }
                        ChannelMsg::Close => break,
                        _ => {}
                    }
                }
            })
            .await;
        }
        orphan.pid = None;
        pid_scan.flush(&mut err);
        let _ = tx.close().await;
        drop(lease);
        let exit = exit.ok_or_else(|| {
            self.lost("the channel closed before the command reported how it ended")
        })?;
        let (stdout_omitted, stderr_omitted) = (out.omitted(), err.omitted());
        Ok(Output {
            stdout: out.into_bytes(),
            stderr: err.into_bytes(),
            stdout_omitted,
            stderr_omitted,
            exit,
            stop_note,
        })
    }

    /// Kills a running command: a TERM signal request on its channel, then TERM and KILL to
    /// the process group its wrapper created, from a second channel on the same connection.
    /// Returns what may still run when the group could not be ended (or was never known).
    async fn kill(
        &self,
        lease: &Lease,
        channel: &ChannelWriteHalf<Msg>,
        pid: Option<u32>,
    ) -> Option<String> {
        let _ = channel.signal(russh::Sig::TERM).await;
        match pid {
            Some(pid) => match kill_group(&lease.conn, pid, self.alias()).await {
                GroupKill::Ended => None,
                GroupKill::Alive => Some(format!(
                    "its process group ({pid}) was signalled but still runs on the target"
                )),
                GroupKill::Unknown(why) => Some(format!(
                    "its process group ({pid}) may not have ended ({why}); processes it started may still run on the target"
                )),
            },
            None => Some(
                "it never reported a process group of its own (the target may lack `setsid`): only its shell was signalled, and processes it started may still run on the target".into(),
            ),
        }
    }

    async fn home(&self) -> Result<String, ExecError> {
        self.home
            .get_or_try_init(|| async {
                let out = self
                    .exec(
                        Command {
                            script: "printf '%s' \"$HOME\"",
                            stdin: None,
                            timeout: self.config.ssh_connect_timeout,
                            stdout_limit: 8192,
                            stderr_limit: 1024,
                            live: None,
                        },
                        &CancellationToken::new(),
                    )
                    .await?;
                let home = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if home.starts_with('/') {
                    Ok(home)
                } else {
                    Err(self.lost("the remote user's home directory is unknown"))
                }
            })
            .await
            .cloned()
    }
}

/// The script sent to the server for `script`. Where the server's shell already leads a
/// session of its own (OpenSSH makes each exec'd shell one; `/proc/$$/stat` says so), that
/// shell replaces itself with the command's shell: same pid, so the same session and process
/// group, of nothing but this command. Otherwise a subshell (never the server's own process,
/// so never a process group leader) replaces itself with `setsid`, which therefore starts a
/// new session — a process group of the wrapper's own making, on Dropbear too, whose exec'd
/// shell shares the server's group. Either way the leader prints `<marker><pid>` on stderr,
/// then runs `script` in that same shell, its standard input passed through. Without
/// `setsid` on the target it prints `<marker>none` and runs the script with no group it
/// vouches for (a stop then says so), whatever the server did. A death by signal is
/// re-raised, so the server reports the signal.
fn wrap(marker: &str, script: &str) -> String {
    // The pid line and the script in one shell: one start-up fewer than a shell that prints
    // and then execs another for the script.
    let inner = format!("printf '%s%s\\n' {marker} \"$$\" >&2\n{script}");
    let q = super::shell_quote(script);
    format!(
        "if command -v setsid >/dev/null 2>&1; then\n\
         {{ read -r __sshmode_stat < /proc/$$/stat; }} 2>/dev/null || __sshmode_stat=\n\
         set -- ${{__sshmode_stat##*) }}\n\
         if [ \"${{4:-}}\" = \"$$\" ]; then exec \"${{SHELL:-/bin/sh}}\" -c {inner}; fi\n\
         (exec setsid \"${{SHELL:-/bin/sh}}\" -c {inner})\n\
         else printf '%snone\\n' {marker} >&2; \"${{SHELL:-/bin/sh}}\" -c {q}\n\
         fi\n\
         __sshmode_rc=$?\n\
         if [ \"$__sshmode_rc\" -gt 128 ]; then __sshmode_sig=$(kill -l \"$__sshmode_rc\" 2>/dev/null)\n\
         case $__sshmode_sig in\n\
         HUP|INT|QUIT|ILL|TRAP|ABRT|BUS|FPE|KILL|USR1|SEGV|USR2|PIPE|ALRM|TERM|XCPU|XFSZ|SYS)\n\
         trap - \"$__sshmode_sig\"; kill -s \"$__sshmode_sig\" \"$$\" ;;\n\
         esac; fi\n\
         exit \"$__sshmode_rc\"\n",
        inner = super::shell_quote(&inner),
    )
}

/// What became of a process group sent TERM and KILL.
#[derive(Debug, Clone, PartialEq, Eq)]
enum GroupKill {
    /// No process of the group is left.
    Ended,
    /// Some process of the group survived the KILL.
    Alive,
    /// The kill could not be run or did not report back in time; why.
    Unknown(&'static str),
}

/// TERM, then KILL after up to 2 s, to the remote process group `pid`, from a second channel
/// on `conn` (outside the channel count: it is short-lived), then whether any of it is left.
/// Bounded by [`KILL_WAIT`]. A pid of 0 or 1 is never signalled: `kill -- -1` would reach
/// every process of the user.
async fn kill_group(conn: &Conn, pid: u32, alias: &str) -> GroupKill {
    if pid <= 1 {
        return GroupKill::Unknown("no group to signal");
    }
    let script = format!(
        "kill -TERM -- -{pid} 2>/dev/null; i=0; while [ $i -lt 20 ] && kill -0 -- -{pid} 2>/dev/null; do sleep 0.1; i=$((i+1)); done; kill -KILL -- -{pid} 2>/dev/null; \
         i=0; while [ $i -lt 10 ] && kill -0 -- -{pid} 2>/dev/null; do sleep 0.1; i=$((i+1)); done; \
         if kill -0 -- -{pid} 2>/dev/null; then echo alive; else echo ended; fi"
    );
    // Dropbear may close a channel opened just as the command's own shell dies without
    // running it (no output, no exit status): that attempt is retried — the script is
    // idempotent — a bounded number of times.
    let killed = async {
        let mut last = GroupKill::Unknown("the kill did not report back");
        for _ in 0..KILL_ATTEMPTS {
            last = kill_once(conn, &script).await;
            if last != GroupKill::Unknown("the kill did not report back") {
                break;
            }
        }
        last
    };
    match tokio::time::timeout(KILL_WAIT, killed).await {
        Ok(k) => {
            if k != GroupKill::Ended {
                tracing::warn!(ssh.target = %alias, ssh.kill = ?k, "a remote process group may not have ended");
            }
            k
        }
        Err(_) => {
            tracing::warn!(ssh.target = %alias, "remote kill did not finish in time");
            GroupKill::Unknown("the kill did not finish in time")
        }
    }
}

/// One run of the kill `script` on a second channel of `conn`, and what it reported.
async fn kill_once(conn: &Conn, script: &str) -> GroupKill {
    // Bounded: the answer is one short word.
    let said = match beside(conn, script, 64).await {
        Ok(said) => said,
        Err(Beside::NoChannel) => return GroupKill::Unknown("no second channel on the connection"),
        Err(Beside::Refused) => return GroupKill::Unknown("the server refused a second channel"),
        Err(Beside::NotStarted) => return GroupKill::Unknown("the kill could not be started"),
    };
    match said.trim_ascii() {
        b"ended" => GroupKill::Ended,
        b"alive" => GroupKill::Alive,
        _ => GroupKill::Unknown("the kill did not report back"),
    }
}

/// Why a script could not be run beside a connection's channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Beside {
    /// The connection gave no channel.
    NoChannel,
    /// The server kept refusing one (its session limit).
    Refused,
    /// The channel did not take the script.
    NotStarted,
}

/// Runs `script` on a second channel of `conn` (outside the channel count: it is
/// short-lived), and returns its standard output, at most `limit` bytes of it, once the
/// channel closes. Unbounded in time: the caller bounds it.
async fn beside(conn: &Conn, script: &str, limit: usize) -> Result<Vec<u8>, Beside> {
    // sshd may refuse a channel for a moment at its session limit, so retry a few times.
    let mut ch = None;
    for _ in 0..OPEN_ATTEMPTS {
        match conn.handle.channel_open_session().await {
            Ok(c) => {
                ch = Some(c);
                break;
            }
            Err(russh::Error::ChannelOpenFailure(_)) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(_) => return Err(Beside::NoChannel),
        }
    }
    let mut ch = ch.ok_or(Beside::Refused)?;
    if ch.exec(true, script.as_bytes().to_vec()).await.is_err() {
        return Err(Beside::NotStarted);
    }
    let mut said = Vec::new();
    while let Some(msg) = ch.wait().await {
        match msg {
            ChannelMsg::Data { data } if said.len() < limit => {
                let room = limit - said.len();
                said.extend_from_slice(&data[..data.len().min(room)]);
            }
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    Ok(said)
}

/// Most stderr bytes searched for the pid line (login scripts may print before it); past
/// that, a kill can only signal the command's channel.
const PID_SCAN_MAX: usize = 64 * 1024;
/// Longest pid text after the marker (`i32::MAX` has 10 digits).
const PID_DIGITS_MAX: usize = 10;

/// Finds the `<marker><pid>` line the wrapper prints first on stderr, behind a marker made
/// for this one command, and passes every other byte through to the command's stderr.
struct PidScan {
    /// `__sshmode_pid_<random>__`: `[a-z0-9_]`, so it needs no quoting in the script.
    marker: String,
    /// Bytes held back while they may still hold (part of) the marker line.
    held: Vec<u8>,
    /// Bytes examined so far (bounded by [`PID_SCAN_MAX`]).
    scanned: usize,
    /// The line was found, or the search given up: everything else passes straight through.
    done: bool,
}

impl PidScan {
    fn new() -> Self {
        PidScan {
            marker: format!("__sshmode_pid_{}__", uuid::Uuid::new_v4().simple()),
            held: Vec::new(),
            scanned: 0,
            done: false,
        }
    }

    fn marker(&self) -> &str {
        &self.marker
    }

    /// Feeds stderr bytes; what is not the pid line goes to `err`. Returns the pid once, when
    /// its line is complete and names a process group we may signal (> 1).
    fn push(&mut self, data: &[u8], err: &mut HeadTail) -> Option<u32> {
        if self.done {
            err.push(data);
            return None;
        }
        self.held.extend_from_slice(data);
        self.scanned += data.len();
        let m = self.marker.as_bytes();
        if let Some(at) = self.held.windows(m.len()).position(|w| w == m) {
            let after = at + m.len();
            match self.held[after..].iter().position(|b| *b == b'\n') {
                Some(nl) => {
                    let pid = parse_pid(&self.held[after..after + nl]);
                    err.push(&self.held[..at]);
                    err.push(&self.held[after + nl + 1..]);
                    self.held = Vec::new();
                    self.done = true;
                    return pid;
                }
                // The rest of the line is still on its way.
                None if self.held.len() - after <= PID_DIGITS_MAX => return None,
                // Not a pid line after all: no pid.
                None => {
                    self.flush(err);
                    return None;
                }
            }
        }
        if self.scanned > PID_SCAN_MAX {
            self.flush(err);
            return None;
        }
        // Keep only a tail that could still be the start of the marker line.
        let keep = m.len() + PID_DIGITS_MAX;
        if self.held.len() > keep {
            let cut = self.held.len() - keep;
            err.push(&self.held[..cut]);
            self.held.drain(..cut);
        }
        None
    }

    /// Gives up the search: whatever is held is the command's stderr.
    fn flush(&mut self, err: &mut HeadTail) {
        err.push(&self.held);
        self.held = Vec::new();
        self.done = true;
    }
}

/// A pid as the wrapper prints it: decimal digits only, and a group we may signal (> 1).
fn parse_pid(text: &[u8]) -> Option<u32> {
    if text.is_empty() || text.len() > PID_DIGITS_MAX || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let pid: u32 = std::str::from_utf8(text).ok()?.parse().ok()?;
    (pid > 1 && pid <= i32::MAX as u32).then_some(pid)
}

/// Kills a started command's process group if dropped while it still runs (armed by a known
/// pid): the remote twin of the local backend's group guard. Its shell then exits and sshd
/// closes the channel. The kill runs on the app's task tracker, so shutdown waits for it, and
/// holds a channel of the connection, so the idle reaper does not close it first.
struct KillOnDrop {
    conn: Arc<Conn>,
    alias: String,
    pid: Option<u32>,
    /// The app's task tracker.
    tasks: TaskTracker,
    /// The pool's "a channel was freed" signal, rung when the kill's channel is given back.
    freed: Arc<Notify>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(pid) = self.pid else { return };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.conn.busy.fetch_add(1, Ordering::AcqRel);
        let held = Held {
            conn: self.conn.clone(),
            freed: self.freed.clone(),
        };
        let alias = std::mem::take(&mut self.alias);
        self.tasks.spawn(async move {
            let _ = kill_group(&held.conn, pid, &alias).await;
            drop(held);
        });
    }
}

/// A channel of a connection counted as busy without a pool permit (the background kill);
/// given back on drop.
struct Held {
    conn: Arc<Conn>,
    freed: Arc<Notify>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.conn.busy.fetch_sub(1, Ordering::AcqRel);
        *self.conn.last_used.lock().expect("conn lock") = Instant::now();
        self.freed.notify_waiters();
    }
}

/// Runs `script` once on a fresh connection (for `target test`) and reports how it ended.
pub async fn run_once(
    handle: &Connection,
    alias: &str,
    script: &str,
    timeout: Duration,
) -> Result<Exit, ExecError> {
    let lost = |e: String| ExecError::Connection {
        alias: alias.to_string(),
        reason: e,
    };
    let run = async {
        let mut ch = handle
            .channel_open_session()
            .await
            .map_err(|e| lost(e.to_string()))?;
        ch.exec(true, script.as_bytes().to_vec())
            .await
            .map_err(|e| lost(e.to_string()))?;
        let mut exit = None;
        while let Some(msg) = ch.wait().await {
            match msg {
                ChannelMsg::ExitStatus { exit_status } => {
                    exit = Some(Exit::Code(exit_status as i32))
                }
                ChannelMsg::ExitSignal { signal_name, .. } => {
                    exit = Some(Exit::Signal(sig_name(&signal_name)))
                }
                ChannelMsg::Close => break,
                _ => {}
            }
        }
        exit.ok_or_else(|| lost("the channel closed without an exit status".into()))
    };
    tokio::time::timeout(timeout, run)
        .await
        .unwrap_or(Ok(Exit::TimedOut))
}

fn backoff(failures: u32) -> Duration {
    let n = failures.saturating_sub(1).min(10);
    (BACKOFF_MIN * 2u32.pow(n)).min(BACKOFF_MAX)
}

fn sig_name(s: &russh::Sig) -> String {
    use russh::Sig::*;
    match s {
        ABRT => "ABRT",
        ALRM => "ALRM",
        FPE => "FPE",
        HUP => "HUP",
        ILL => "ILL",
        INT => "INT",
        KILL => "KILL",
        PIPE => "PIPE",
        QUIT => "QUIT",
        SEGV => "SEGV",
        TERM => "TERM",
        USR1 => "USR1",
        Custom(c) => return c.trim_start_matches("SIG").to_string(),
    }
    .to_string()
}

/// One approved target, as a [`Backend`]: a handle on the app's shared pool.
pub struct SshBackend {
    pool: Arc<TargetPool>,
}

#[async_trait]
impl Backend for SshBackend {
    fn name(&self) -> &str {
        self.pool.alias()
    }

    fn location(&self) -> String {
        self.pool.target.location()
    }

    fn is_local(&self) -> bool {
        false
    }

    async fn home(&self) -> Result<String, ExecError> {
        self.pool.home().await
    }

    async fn initial_dir(&self, _section: &str) -> Result<String, ExecError> {
        self.pool.home().await
    }

    async fn exec(
        &self,
        cmd: Command<'_>,
        cancel: &CancellationToken,
    ) -> Result<Output, ExecError> {
        self.pool.exec(cmd, cancel).await
    }

    async fn read(&self, path: &str, offset: u64, len: u64) -> Result<FileBytes, ExecError> {
        match self.pool.sftp().await? {
            Some((lease, s)) => {
                let result = sftp::read(s, path, offset, len).await;
                drop(lease);
                result
            }
            None => shellfs::read(&self.pool, path, offset, len).await,
        }
    }

    async fn write(&self, path: &str, data: &[u8]) -> Result<(), ExecError> {
        match self.pool.sftp().await? {
            Some((lease, s)) => {
                let result = sftp::write(s, path, data).await;
                drop(lease);
                result
            }
            None => shellfs::write(&self.pool, path, data).await,
        }
    }
}

impl TargetPool {
    /// An SFTP session on a pooled channel, or `None` when the connection's server has no
    /// SFTP subsystem (learned once per connection, then remembered): the caller then moves
    /// the file through the shell.
    async fn sftp(&self) -> Result<Option<(Lease, sftp::Session)>, ExecError> {
        let (lease, channel) = self.channel().await?;
        if lease.conn.sftp.load(Ordering::Acquire) == SFTP_NO {
            let _ = channel.close().await;
            return Ok(None);
        }
        match sftp::open(self, &lease, channel).await? {
            Some(s) => {
                lease.conn.sftp.store(SFTP_YES, Ordering::Release);
                Ok(Some((lease, s)))
            }
            None => {
                if lease.conn.sftp.swap(SFTP_NO, Ordering::AcqRel) != SFTP_NO {
                    tracing::info!(ssh.target = %self.alias(), "no SFTP subsystem; files go through the shell");
                }
                Ok(None)
            }
        }
    }
}

/// Which way files move on the freshly connected `handle` (for `target test`): SFTP when the
/// server starts its subsystem, the shell otherwise.
pub async fn file_path(handle: &Connection, timeout: Duration) -> FilePath {
    let probe = async {
        let Ok(ch) = handle.channel_open_session().await else {
            return FilePath::Shell;
        };
        if ch.request_subsystem(true, "sftp").await.is_err() {
            return FilePath::Shell;
        }
        let raw = russh_sftp::client::RawSftpSession::new(ch.into_stream());
        raw.set_timeout(timeout.as_secs().max(1));
        match raw.init().await {
            Ok(_) => {
                let _ = raw.close_session();
                FilePath::Sftp
            }
            Err(_) => FilePath::Shell,
        }
    };
    tokio::time::timeout(timeout, probe)
        .await
        .unwrap_or(FilePath::Shell)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_place_is_given_back_even_when_its_waiter_gives_up() {
        let count = AtomicUsize::new(0);
        let places: Vec<_> = (0..MAX_QUEUED)
            .map(|_| Queued::enter(&count).expect("room"))
            .collect();
        assert!(Queued::enter(&count).is_none(), "the queue is bounded");
        drop(places);
        assert_eq!(count.load(Ordering::Acquire), 0);
        // A waiter dropped mid-wait (a cancelled command) gives its place back too.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let waiter = async {
                let _place = Queued::enter(&count).expect("room");
                std::future::pending::<()>().await;
            };
            let _ = tokio::time::timeout(Duration::from_millis(1), waiter).await;
        });
        assert_eq!(count.load(Ordering::Acquire), 0);
    }

    /// Feeds `chunks` to a scan; returns (pid, the stderr the command is left with).
    fn scan(chunks: &[&[u8]]) -> (Option<u32>, Vec<u8>, String) {
        let mut s = PidScan::new();
        let marker = s.marker().to_string();
        let mut err = HeadTail::new(1 << 20);
        let mut pid = None;
        for c in chunks {
            let c = String::from_utf8_lossy(c).replace("<M>", &marker);
            if let Some(p) = s.push(c.as_bytes(), &mut err) {
                assert!(pid.is_none(), "a pid is reported once");
                pid = Some(p);
            }
        }
        s.flush(&mut err);
        (pid, err.into_bytes(), marker)
    }

    #[test]
    fn the_pid_is_read_only_from_behind_the_marker() {
        // A login script that prints `1` first: kept as stderr, never taken for the pid.
        let (pid, err, _) = scan(&[b"1\n<M>4242\nboom\n"]);
        assert_eq!(pid, Some(4242));
        assert_eq!(err, b"1\nboom\n");
        // Split anywhere, even inside the marker.
        let (pid, err, m) = scan(&[b"motd\n"]);
        assert_eq!((pid, err), (None, b"motd\n".to_vec()));
        let line = format!("rc says hi\n{m}777\nafter");
        for cut in 0..line.len() {
            let (a, b) = line.as_bytes().split_at(cut);
            let (pid, err, _) = scan_with(&m, &[a, b]);
            assert_eq!(pid, Some(777), "cut at {cut}");
            assert_eq!(err, b"rc says hi\nafter", "cut at {cut}");
        }
        // No marker at all: no pid, and every byte is the command's.
        let (pid, err, _) = scan(&[b"1\n", b"2\n"]);
        assert_eq!((pid, err), (None, b"1\n2\n".to_vec()));
    }

    /// [`scan`] with a given marker (for splitting a line that already holds it).
    fn scan_with(marker: &str, chunks: &[&[u8]]) -> (Option<u32>, Vec<u8>, String) {
        let mut s = PidScan::new();
        s.marker = marker.to_string();
        let mut err = HeadTail::new(1 << 20);
        let mut pid = None;
        for c in chunks {
            if let Some(p) = s.push(c, &mut err) {
                pid = Some(p);
            }
        }
        s.flush(&mut err);
        (pid, err.into_bytes(), marker.to_string())
    }

    #[test]
    fn pids_we_must_never_signal_are_refused() {
        for bad in [
            "0",
            "1",
            "-1",
            " 42",
            "42 ",
            "4x",
            "",
            "99999999999",
            "4294967295",
        ] {
            assert_eq!(parse_pid(bad.as_bytes()), None, "{bad:?}");
        }
        assert_eq!(parse_pid(b"2"), Some(2));
        assert_eq!(parse_pid(b"2147483647"), Some(2147483647));
        let (pid, _, _) = scan(&[b"<M>1\n"]);
        assert_eq!(pid, None, "a marker line naming pid 1 is no pid");
        let (pid, _, _) = scan(&[b"<M>-1\n"]);
        assert_eq!(pid, None);
    }

    #[test]
    fn the_pid_search_is_bounded() {
        let noise = vec![b'x'; PID_SCAN_MAX + 1];
        let (pid, err, _) = scan(&[&noise, b"<M>42\n"]);
        assert_eq!(pid, None, "given up after the bound");
        assert!(err.starts_with(&noise) && err.ends_with(b"42\n"));
    }

    /// Runs `wrap(script)` under `shell` as a server would (`$SHELL -c`), with `input`.
    fn run_wrapped(shell: &str, script: &str, input: &[u8]) -> (std::process::Output, String) {
        run_wrapped_as(false, shell, script, input).1
    }

    /// [`run_wrapped`], the shell leading a session of its own when `leader` (as OpenSSH starts
    /// it); also returns the server shell's pid.
    fn run_wrapped_as(
        leader: bool,
        shell: &str,
        script: &str,
        input: &[u8],
    ) -> (u32, (std::process::Output, String)) {
        use std::io::Write;
        let mut s = PidScan::new();
        let marker = s.marker().to_string();
        let mut cmd = if leader {
            // Not a group leader itself, `setsid` makes the session and execs the shell.
            let mut c = std::process::Command::new("setsid");
            c.args(["-w", shell]);
            c
        } else {
            std::process::Command::new(shell)
        };
        let mut child = cmd
            .arg("-c")
            .arg(wrap(&marker, script))
            .env("SHELL", shell)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let server_pid = child.id();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        let mut err = HeadTail::new(1 << 20);
        let pid = s.push(&out.stderr, &mut err);
        s.flush(&mut err);
        let pid = pid.map(|p| p.to_string()).unwrap_or_default();
        (
            server_pid,
            (
                out,
                format!("{pid}|{}", String::from_utf8_lossy(&err.into_bytes())),
            ),
        )
    }

    #[test]
    fn a_shell_that_leads_its_own_session_runs_the_command_in_it() {
        use std::os::unix::process::ExitStatusExt;
        for shell in ["/bin/sh", "/bin/bash"] {
            // No subshell and no second session: the server's shell becomes the command's
            // shell, so the reported group is that session, and nothing else is in it.
            let (server, (out, err)) = run_wrapped_as(
                true,
                shell,
                "read -r line; printf '%s|' \"$line\"; ps -o pid=,pgid=,sid= -p $$ | tr -s ' ' | sed 's/^ //'",
                b"in put\n",
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            let (input, ids) = stdout.split_once('|').unwrap();
            assert_eq!(input, "in put", "{shell}: stdin passes through");
            let pid = err.split('|').next().unwrap();
            assert_eq!(pid, server.to_string(), "{shell}: {stdout} / {err}");
            let ids: Vec<&str> = ids.split_whitespace().collect();
            assert_eq!(ids, [pid, pid, pid], "{shell}: {stdout} / {err}");
            let (_, (out, err)) = run_wrapped_as(true, shell, "echo oops >&2; exit 3", b"");
            assert_eq!(out.status.code(), Some(3), "{shell}");
            assert!(err.ends_with("|oops\n"), "{shell}: {err}");
            let (_, (out, _)) = run_wrapped_as(true, shell, "kill -TERM $$", b"");
            assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{shell}");
        }
    }

    #[test]
    fn the_wrapper_runs_the_command_in_a_group_of_its_own_and_passes_everything_through() {
        use std::os::unix::process::ExitStatusExt;
        for shell in ["/bin/sh", "/bin/bash"] {
            // The reported pid leads the command's own process group and session.
            let (out, err) = run_wrapped(
                shell,
                "read -r line; printf '%s|' \"$line\"; ps -o pid=,pgid=,sid= -p $$ | tr -s ' ' | sed 's/^ //'",
                b"it's \"in\" put\n",
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            let (input, ids) = stdout.split_once('|').unwrap();
            assert_eq!(input, "it's \"in\" put", "{shell}: stdin passes through");
            let ids: Vec<&str> = ids.split_whitespace().collect();
            let pid = err.split('|').next().unwrap();
            assert_eq!(ids, [pid, pid, pid], "{shell}: {stdout} / {err}");
            assert!(out.status.success());
            // Exit codes, stderr and signals come back as the command made them.
            let (out, err) = run_wrapped(shell, "echo oops >&2; exit 3", b"");
            assert_eq!(out.status.code(), Some(3), "{shell}");
            assert!(err.ends_with("|oops\n"), "{shell}: {err}");
            let (out, _) = run_wrapped(shell, "exit 1", b"");
            assert_eq!(out.status.code(), Some(1), "{shell}: 1 is no signal");
            let (out, _) = run_wrapped(shell, "kill -TERM $$", b"");
            assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{shell}");
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(1), BACKOFF_MIN);
        assert_eq!(backoff(2), BACKOFF_MIN * 2);
        assert_eq!(backoff(50), BACKOFF_MAX);
    }
}
