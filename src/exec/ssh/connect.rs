//! One SSH connection to one target: TCP with `TCP_NODELAY`, host-key verification against
//! the registry (the key seen at `target add` and pinned by approval, trust on first use for
//! a target added offline, or a pinned key for `strict` targets; a mismatch is refused and
//! audited), then authentication with the vaulted key (or key + certificate), password, or
//! the ssh-agent. [`probe_host_key`] is the one handshake `target add` makes to see the key.
//! A target behind a jump host is reached over a `direct-tcpip` channel of the jump host's
//! connection ([`connect_through`]; the pool opens the channel on its pooled connection,
//! [`open_path`] hop by hop for the CLI); each hop is checked and authenticated as its own
//! target.
//!
//! Secrets are opened from the vault here and only here, held in `Zeroizing` buffers, and
//! never logged. Never: accepts a host key the registry does not bind to the target.

use std::sync::{Arc, Mutex};

use russh::client;
use russh::client::Msg;
use russh::keys::{Certificate, HashAlg, PrivateKeyWithHashAlg, PublicKeyOrCertificate};

use super::registry::{AuthKind, Endpoint, HostKeyVerdict, TargetRegistry, Trust};
use crate::config::ExecConfig;
use crate::exec::ExecError;
use crate::vault::{Field, Slot, Vault};

/// What the host presented and what the registry said about it.
#[derive(Debug, Clone, Default)]
pub struct HostKeySeen {
    /// `SHA256:…` of the presented key.
    pub fingerprint: Option<String>,
    /// Its algorithm, e.g. `ssh-ed25519`.
    pub algorithm: Option<String>,
    pub verdict: Option<HostKeyVerdict>,
    /// Why the check could not be made (database unreachable, certificate offered, …).
    pub problem: Option<String>,
}

/// The russh client handler: verifies the server key against the registry.
pub struct Client {
    registry: Arc<dyn TargetRegistry>,
    alias: String,
    /// What the operator trusts (`target test --trust [SHA256:…]`); `None` for the pool.
    trust: Option<Trust>,
    /// Who the audit rows name.
    actor: String,
    /// Shared with the caller, who reads it after the handshake.
    seen: Arc<Mutex<HostKeySeen>>,
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key,
            PublicKeyOrCertificate::Certificate(_) => {
                self.seen.lock().expect("seen lock").problem =
                    Some("the host offered a host certificate, which is not supported".into());
                return Ok(false);
            }
        };
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        let algorithm = key.algorithm().to_string();
        let verdict = self
            .registry
            .check_host_key(
                &self.alias,
                &fingerprint,
                &algorithm,
                self.trust.as_ref(),
                &self.actor,
            )
            .await;
        let mut seen = self.seen.lock().expect("seen lock");
        seen.fingerprint = Some(fingerprint);
        seen.algorithm = Some(algorithm);
        match verdict {
            Ok(v) => {
                let ok = matches!(
                    v,
                    HostKeyVerdict::Match | HostKeyVerdict::Recorded | HostKeyVerdict::Pinned
                );
                seen.verdict = Some(v);
                Ok(ok)
            }
            Err(e) => {
                seen.problem = Some(format!("the host key could not be checked: {e}"));
                Ok(false)
            }
        }
    }
}

/// How to connect.
pub struct ConnectOptions<'a> {
    pub config: &'a ExecConfig,
    pub registry: &'a Arc<dyn TargetRegistry>,
    pub vault: &'a Vault,
    /// What the operator trusts (only `target test --trust`); `None` pins nothing.
    pub trust: Option<Trust>,
    /// Who audit rows name (`system` for the pool, `cli` for `target test`).
    pub actor: &'a str,
}

/// An authenticated connection.
pub type Connection = client::Handle<Client>;

/// The russh client configuration: Nagle off (every command is a small round trip),
/// keepalives so a dead peer is noticed.
pub fn client_config(cfg: &ExecConfig) -> Arc<client::Config> {
    Arc::new(client::Config {
        nodelay: true,
        keepalive_interval: Some(cfg.ssh_keepalive),
        keepalive_max: 3,
        ..Default::default()
    })
}

/// Connects to `target` and authenticates, within the connect timeout. Returns what the host
/// presented in any case, so `target test` can show the fingerprint even on failure.
pub async fn connect(
    target: &Endpoint,
    opts: ConnectOptions<'_>,
) -> (HostKeySeen, Result<Connection, ExecError>) {
    connect_with(target, opts, None::<russh::ChannelStream<Msg>>).await
}

/// [`connect`] over `stream`, a channel to the target that a jump host opened: the same
/// host-key check against the target's own record, and its own credentials.
pub async fn connect_through<S>(
    target: &Endpoint,
    opts: ConnectOptions<'_>,
    stream: S,
) -> (HostKeySeen, Result<Connection, ExecError>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    connect_with(target, opts, Some(stream)).await
}

async fn connect_with<S>(
    target: &Endpoint,
    opts: ConnectOptions<'_>,
    stream: Option<S>,
) -> (HostKeySeen, Result<Connection, ExecError>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let seen = Arc::new(Mutex::new(HostKeySeen::default()));
    let handler = Client {
        registry: opts.registry.clone(),
        alias: target.alias.clone(),
        trust: opts.trust.clone(),
        actor: opts.actor.to_string(),
        seen: seen.clone(),
    };
    let timeout = opts.config.ssh_connect_timeout;
    let attempt = async {
        let config = client_config(opts.config);
        let handshake = match stream {
            None => match tokio::net::TcpStream::connect((target.host.as_str(), target.port)).await
            {
                Ok(tcp) => {
                    let _ = tcp.set_nodelay(true);
                    client::connect_stream(config, QuickAck(tcp), handler).await
                }
                Err(e) => Err(russh::Error::IO(e)),
            },
            Some(s) => client::connect_stream(config, s, handler).await,
        };
        let mut handle = handshake.map_err(|e| handshake_error(target, &seen, e))?;
        authenticate(&mut handle, target, &opts).await?;
        Ok(handle)
    };
    let result = match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(unavailable(
            target,
            format!(
                "no answer from {}:{} within {}s",
                target.host,
                target.port,
                timeout.as_secs()
            ),
        )),
    };
    let seen = seen.lock().expect("seen lock").clone();
    (seen, result)
}

/// A connection's TCP stream that acknowledges what it reads at once (`TCP_QUICKACK` after
/// every read; Linux clears it by itself, so it is set again each time). A jump host's sshd
/// forwards a target's packets on a socket without `TCP_NODELAY`, each as it comes: with our
/// acknowledgements delayed (40 ms), each packet after the first would wait for the last
/// one's. Elsewhere it costs one system call per read.
struct QuickAck(tokio::net::TcpStream);

impl QuickAck {
    fn ack_now(&self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let one: libc::c_int = 1;
            // SAFETY: a valid descriptor owned by `self.0`, and a pointer to an int of the
            // size given; the result is ignored (a failure only leaves acks delayed).
            unsafe {
                libc::setsockopt(
                    self.0.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_QUICKACK,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
}

impl tokio::io::AsyncRead for QuickAck {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(r, std::task::Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.ack_now();
        }
        r
    }
}

impl tokio::io::AsyncWrite for QuickAck {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The russh handler of [`probe_host_key`]: notes the presented key and ends the handshake
/// there (it is refused, so nothing is ever authenticated against an unchecked key).
struct Probe {
    seen: Arc<Mutex<Option<(String, String)>>>,
}

impl client::Handler for Probe {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        if let PublicKeyOrCertificate::PublicKey { key, .. } = key {
            *self.seen.lock().expect("seen lock") = Some((
                key.fingerprint(HashAlg::Sha256).to_string(),
                key.algorithm().to_string(),
            ));
        }
        Ok(false)
    }
}

/// The host key `host:port` presents: `(SHA256:…, algorithm)`. One handshake, ended at the key
/// (no authentication), within the connect timeout; `target add` records what it returns.
pub async fn probe_host_key(
    config: &ExecConfig,
    host: &str,
    port: u16,
) -> Result<(String, String), String> {
    probe_with(config, host, port, None::<russh::ChannelStream<Msg>>).await
}

/// [`probe_host_key`] over `stream`, a channel to `host:port` that a jump host opened.
pub async fn probe_host_key_through<S>(
    config: &ExecConfig,
    host: &str,
    port: u16,
    stream: S,
) -> Result<(String, String), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    probe_with(config, host, port, Some(stream)).await
}

async fn probe_with<S>(
    config: &ExecConfig,
    host: &str,
    port: u16,
    stream: Option<S>,
) -> Result<(String, String), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let seen = Arc::new(Mutex::new(None));
    let handler = Probe { seen: seen.clone() };
    let timeout = config.ssh_connect_timeout;
    let attempt = async {
        match stream {
            None => client::connect(client_config(config), (host, port), handler).await,
            Some(s) => client::connect_stream(client_config(config), s, handler).await,
        }
    };
    let result = tokio::time::timeout(timeout, attempt).await;
    if let Some(key) = seen.lock().expect("seen lock").take() {
        return Ok(key);
    }
    Err(match result {
        Err(_) => format!("no answer from {host}:{port} within {}s", timeout.as_secs()),
        Ok(Err(russh::Error::IO(io))) => format!("cannot reach {host}:{port}: {io}"),
        Ok(Err(e)) => format!("SSH handshake with {host}:{port} failed: {e}"),
        Ok(Ok(_)) => format!("{host}:{port} presented no plain host key"),
    })
}

/// Opens a `direct-tcpip` channel to `host:port` on `jump`'s connection `handle`, within the
/// connect timeout. A refusal is said in the server's words: "administratively prohibited"
/// (its sshd forbids forwarding) or "connect failed" (it cannot reach the address). `Err(None)`:
/// the connection itself failed (the caller may retry on another one).
pub async fn open_tunnel<H: client::Handler>(
    handle: &client::Handle<H>,
    jump: &str,
    host: &str,
    port: u16,
    timeout: std::time::Duration,
) -> Result<russh::Channel<Msg>, Option<String>> {
    let opened = tokio::time::timeout(
        timeout,
        handle.channel_open_direct_tcpip(host, port as u32, "127.0.0.1", 0),
    )
    .await;
    match opened {
        Ok(Ok(ch)) => Ok(ch),
        Ok(Err(russh::Error::ChannelOpenFailure(why))) => {
            Err(Some(tunnel_refused(jump, host, port, &why)))
        }
        Ok(Err(_)) => Err(None),
        Err(_) => Err(Some(format!(
            "the jump host `{jump}` did not open a channel to {host}:{port} within {}s",
            timeout.as_secs()
        ))),
    }
}

/// Why a jump host refused to forward, in words an operator can act on.
fn tunnel_refused(jump: &str, host: &str, port: u16, why: &russh::ChannelOpenFailure) -> String {
    use russh::ChannelOpenFailure as F;
    match why {
        F::AdministrativelyProhibited => format!(
            "the jump host `{jump}` refused to forward to {host}:{port}: administratively prohibited (its sshd does not allow TCP forwarding: `AllowTcpForwarding no`, or `PermitOpen` excludes this address)"
        ),
        F::ConnectFailed => format!(
            "the jump host `{jump}` could not connect to {host}:{port} (connect failed): check the target's address from the jump host"
        ),
        F::ResourceShortage => {
            format!("the jump host `{jump}` refused to forward to {host}:{port}: resource shortage")
        }
        F::UnknownChannelType => format!(
            "the jump host `{jump}` does not offer port forwarding (direct-tcpip is unknown to it)"
        ),
        F::Other { code, reason } => format!(
            "the jump host `{jump}` refused to forward to {host}:{port}: {} (code {code})",
            reason.chars().take(200).collect::<String>()
        ),
    }
}

/// A connection made hop by hop for the CLI (`target add` through a jump host, `target test`):
/// the target's handle, and the jump hosts' handles its channel rides on, kept open with it.
pub struct PathConnection {
    pub handle: Connection,
    /// Outermost first; dropped after `handle`.
    _hops: Vec<Connection>,
}

/// The jump hosts `jumps` (nearest to the target first, as the registry's path lists them after
/// the target) connected hop by hop from the outermost, each checked and authenticated as its
/// own target; returns their handles and a channel from the nearest one to `host:port`.
pub async fn open_path(
    jumps: &[Endpoint],
    opts: &ConnectOptions<'_>,
    host: &str,
    port: u16,
) -> Result<(Vec<Connection>, russh::Channel<Msg>), String> {
    let mut hops: Vec<Connection> = Vec::with_capacity(jumps.len());
    let hop_opts = || ConnectOptions {
        config: opts.config,
        registry: opts.registry,
        vault: opts.vault,
        trust: None,
        actor: opts.actor,
    };
    for (i, hop) in jumps.iter().rev().enumerate() {
        let (_, result) = match hops.last() {
            None => connect(hop, hop_opts()).await,
            Some(prev) => {
                let outer = &jumps[jumps.len() - i];
                let ch = open_tunnel(
                    prev,
                    &outer.alias,
                    &hop.host,
                    hop.port,
                    opts.config.ssh_connect_timeout,
                )
                .await
                .map_err(|e| {
                    e.unwrap_or_else(|| format!("the connection to `{}` was lost", outer.alias))
                })?;
                connect_through(hop, hop_opts(), ch.into_stream()).await
            }
        };
        let handle = result.map_err(|e| format!("its jump host `{}`: {e}", hop.alias))?;
        hops.push(handle);
    }
    let nearest = jumps.first().ok_or("no jump host")?;
    let last = hops.last().ok_or("no jump host")?;
    let ch = open_tunnel(
        last,
        &nearest.alias,
        host,
        port,
        opts.config.ssh_connect_timeout,
    )
    .await
    .map_err(|e| e.unwrap_or_else(|| format!("the connection to `{}` was lost", nearest.alias)))?;
    Ok((hops, ch))
}

/// [`connect`] to `path[0]` through the jump hosts `path[1..]` (the registry's path's order): the
/// CLI's one-off connection. The trust (`target test --trust`) applies to the target only.
pub async fn connect_path(
    path: &[Endpoint],
    opts: ConnectOptions<'_>,
) -> (HostKeySeen, Result<PathConnection, ExecError>) {
    let target = &path[0];
    if path.len() == 1 {
        let (seen, r) = connect(target, opts).await;
        return (
            seen,
            r.map(|handle| PathConnection {
                handle,
                _hops: Vec::new(),
            }),
        );
    }
    let (hops, ch) = match open_path(&path[1..], &opts, &target.host, target.port).await {
        Ok(x) => x,
        Err(reason) => return (HostKeySeen::default(), Err(unavailable(target, reason))),
    };
    let (seen, r) = connect_through(target, opts, ch.into_stream()).await;
    (
        seen,
        r.map(|handle| PathConnection {
            handle,
            _hops: hops,
        }),
    )
}

fn unavailable(target: &Endpoint, reason: String) -> ExecError {
    ExecError::Unavailable {
        alias: target.alias.clone(),
        reason,
    }
}

fn handshake_error(target: &Endpoint, seen: &Mutex<HostKeySeen>, e: russh::Error) -> ExecError {
    let seen = seen.lock().expect("seen lock");
    let presented = seen.fingerprint.clone().unwrap_or_default();
    match &seen.verdict {
        Some(HostKeyVerdict::Mismatch { expected }) => {
            return ExecError::HostKeyMismatch {
                alias: target.alias.clone(),
                expected: expected.clone(),
                presented,
            };
        }
        Some(HostKeyVerdict::Unpinned) => {
            return unavailable(
                target,
                format!(
                    "host key {presented} is not pinned and the target is strict; check it on the host (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`) and pin it with `sshmode target test {} --trust SHA256:…`",
                    target.alias
                ),
            );
        }
        Some(HostKeyVerdict::TrustMismatch { checked }) => {
            return unavailable(
                target,
                format!(
                    "the server presents host key {presented}, not the {checked} you checked; nothing was pinned"
                ),
            );
        }
        _ => {}
    }
    if let Some(p) = &seen.problem {
        return unavailable(target, p.clone());
    }
    let reason = match e {
        russh::Error::IO(io) => format!("cannot reach {}:{}: {io}", target.host, target.port),
        other => format!(
            "SSH handshake with {}:{} failed: {other}",
            target.host, target.port
        ),
    };
    unavailable(target, reason)
}

async fn authenticate(
    handle: &mut Connection,
    target: &Endpoint,
    opts: &ConnectOptions<'_>,
) -> Result<(), ExecError> {
    let user = target.user.clone();
    let auth_failed = |what: &str| {
        unavailable(
            target,
            format!(
                "authentication as `{}` with {what} was refused",
                target.user
            ),
        )
    };
    let vault_failed = || unavailable(target, "its vaulted secret could not be opened".into());
    // Each record opens only for this target row (alias and generation) and its own field.
    let open = |sealed: &[u8], field: Field| {
        let place = Slot {
            alias: &target.alias,
            generation: target.generation,
            field,
        };
        opts.vault.open(&place, sealed).map_err(|_| vault_failed())
    };
    let ssh_failed = |e: russh::Error| unavailable(target, format!("authentication failed: {e}"));
    let accepted = |res: client::AuthResult, what: &str| {
        if res.success() {
            Ok(())
        } else {
            Err(auth_failed(what))
        }
    };

    match target.auth {
        AuthKind::Key | AuthKind::Password => {
            let sealed = opts
                .registry
                .sealed_secrets(&target.alias, target.generation)
                .await
                .map_err(|e| unavailable(target, e.to_string()))?;
            if target.auth == AuthKind::Password {
                let sealed = sealed.password.ok_or_else(vault_failed)?;
                let pw = open(&sealed, Field::Password)?;
                let pw = std::str::from_utf8(&pw).map_err(|_| vault_failed())?;
                // russh copies it into its `auth::Method::Password`, which zeroizes the
                // copy on drop; ours is the `Zeroizing` buffer `pw` borrows from.
                let res = handle
                    .authenticate_password(user, pw)
                    .await
                    .map_err(ssh_failed)?;
                return accepted(res, "the password");
            }
            let sealed_key = sealed.key.ok_or_else(vault_failed)?;
            let pem = open(&sealed_key, Field::Key)?;
            let pem = std::str::from_utf8(&pem).map_err(|_| vault_failed())?;
            let key =
                Arc::new(russh::keys::decode_secret_key(pem, None).map_err(|_| {
                    unavailable(target, "its vaulted key could not be decoded".into())
                })?);
            if let Some(sealed_cert) = sealed.cert {
                let cert = open(&sealed_cert, Field::Cert)?;
                let cert = std::str::from_utf8(&cert)
                    .ok()
                    .and_then(|c| Certificate::from_openssh(c.trim()).ok())
                    .ok_or_else(|| {
                        unavailable(
                            target,
                            "its vaulted certificate could not be decoded".into(),
                        )
                    })?;
                let res = handle
                    .authenticate_openssh_cert(user, key, cert)
                    .await
                    .map_err(ssh_failed)?;
                return accepted(res, "the user certificate");
            }
            let hash = if key.algorithm().is_rsa() {
                handle
                    .best_supported_rsa_hash()
                    .await
                    .ok()
                    .flatten()
                    .flatten()
            } else {
                None
            };
            let res = handle
                .authenticate_publickey(user, PrivateKeyWithHashAlg::new(key, hash))
                .await
                .map_err(ssh_failed)?;
            accepted(res, "the key")
        }
        AuthKind::Agent => {
            let sock = opts.config.ssh_auth_sock.as_ref().ok_or_else(|| {
                unavailable(
                    target,
                    "it uses the ssh-agent but SSH_AUTH_SOCK is not set".into(),
                )
            })?;
            let mut agent = russh::keys::agent::client::AgentClient::connect_uds(sock)
                .await
                .map_err(|e| unavailable(target, format!("cannot reach the ssh-agent: {e}")))?;
            let identities = agent
                .request_identities()
                .await
                .map_err(|e| unavailable(target, format!("the ssh-agent failed: {e}")))?;
            if identities.is_empty() {
                return Err(unavailable(target, "the ssh-agent holds no keys".into()));
            }
            let rsa_hash = handle
                .best_supported_rsa_hash()
                .await
                .ok()
                .flatten()
                .flatten();
            for id in identities.iter().take(16) {
                let key = id.public_key().into_owned();
                let hash = if key.algorithm().is_rsa() {
                    rsa_hash
                } else {
                    None
                };
                match handle
                    .authenticate_publickey_with(user.clone(), key, hash, &mut agent)
                    .await
                {
                    Ok(r) if r.success() => return Ok(()),
                    _ => continue,
                }
            }
            Err(auth_failed("the ssh-agent's keys"))
        }
    }
}
