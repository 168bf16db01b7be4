//! One SSH connection to one target: TCP with `TCP_NODELAY`, host-key verification against
//! the registry (the key seen at `target add` and pinned by approval, trust on first use for
//! a target added offline, or a pinned key for `strict` targets; a mismatch is refused and
//! audited), then authentication with the vaulted key (or key + certificate), password, or
//! the ssh-agent. [`probe_host_key`] is the one handshake `target add` makes to see the key.
//!
//! Secrets are opened from the vault here and only here, held in `Zeroizing` buffers, and
//! never logged. Never: accepts a host key the registry does not bind to the target.

use std::sync::{Arc, Mutex};

use russh::client;
use russh::keys::{Certificate, HashAlg, PrivateKeyWithHashAlg, PublicKeyOrCertificate};

use super::registry::{AuthKind, Endpoint, HostKeyVerdict, TargetRegistry, Trust};
use crate::config::ExecConfig;
use crate::exec::ExecError;
use crate::vault::{Field, Place, Vault};

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
        let mut handle = client::connect(
            client_config(opts.config),
            (target.host.as_str(), target.port),
            handler,
        )
        .await
        .map_err(|e| handshake_error(target, &seen, e))?;
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
    let seen = Arc::new(Mutex::new(None));
    let handler = Probe { seen: seen.clone() };
    let timeout = config.ssh_connect_timeout;
    let attempt = client::connect(client_config(config), (host, port), handler);
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
        let place = Place {
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
