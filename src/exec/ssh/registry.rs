//! What the SSH pool reads from the target registry, as a port: the registry
//! ([`crate::target::Registry`]) implements [`TargetRegistry`], and the pool never names the
//! module above it. A target's connection facts ([`Endpoint`]), the check of a presented host
//! key against the recorded or pinned one (which records and audits), and the sealed secrets
//! of one generation.

use async_trait::async_trait;
use serde::Serialize;

/// Approval status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Registered but not yet usable.
    Pending,
    /// Usable by chats.
    Approved,
    /// No new commands run on it.
    Disabled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Approved => "approved",
            Status::Disabled => "disabled",
        }
    }
    pub fn parse(s: &str) -> Status {
        match s {
            "approved" => Status::Approved,
            "disabled" => Status::Disabled,
            _ => Status::Pending,
        }
    }
}

/// How the service authenticates to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthKind {
    /// A private key from the vault (optionally with an OpenSSH user certificate).
    Key,
    /// A password from the vault.
    Password,
    /// The ssh-agent at `SSH_AUTH_SOCK`.
    Agent,
}

impl AuthKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthKind::Key => "key",
            AuthKind::Password => "password",
            AuthKind::Agent => "agent",
        }
    }
}

/// A target as the SSH pool needs it: where and as whom to connect, how to authenticate,
/// whether it may be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub alias: String,
    /// Changes when the alias is removed and added again.
    pub generation: i64,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub auth: AuthKind,
    pub status: Status,
    /// The target this one is reached through (its jump host), if any.
    pub jump: Option<String>,
}

impl Endpoint {
    /// Where this target's commands run, for the head of every tool result: its alias, user
    /// and host (`web · deploy@10.0.0.5`), with the port when it is not 22.
    pub fn location(&self) -> String {
        let port = if self.port == 22 {
            String::new()
        } else {
            format!(":{}", self.port)
        };
        format!(
            "{} · {}@{}{port}{}",
            self.alias,
            self.user,
            self.host,
            self.via()
        )
    }

    /// How the target is reached, for people: ` via bastion`, or nothing for a direct one.
    pub fn via(&self) -> String {
        match &self.jump {
            Some(j) => format!(" via {j}"),
            None => String::new(),
        }
    }
}

/// Most jump hosts between the service and a target. A longer chain is refused when a jump is
/// set, and a connection never follows more hops than this (nor the same hop twice).
pub const MAX_HOPS: usize = 8;

/// Sealed secrets of one target, as stored; opened only by `exec::ssh` to authenticate.
pub struct SealedSecrets {
    pub key: Option<Vec<u8>>,
    pub cert: Option<Vec<u8>>,
    pub password: Option<Vec<u8>>,
}

/// Outcome of binding a presented host key to a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyVerdict {
    /// It matches the recorded or pinned key.
    Match,
    /// None was recorded; it is now (tofu, or pinned with `--trust`).
    Recorded,
    /// It matches the key recorded before, which the operator's `--trust` has now pinned.
    Pinned,
    /// A different key is recorded: refused, audited.
    Mismatch { expected: String },
    /// A strict target without a pinned key: refused until an operator pins one.
    Unpinned,
    /// `--trust SHA256:…` named another key than the one presented: refused, nothing pinned.
    TrustMismatch { checked: String },
}

/// What an operator asks `target test --trust` to pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// `--trust` alone: the presented key, if none other is recorded.
    Presented,
    /// `--trust SHA256:…`: only a presented key with this fingerprint.
    Fingerprint(String),
}

/// Why the registry could not answer.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("no target named `{0}`")]
    NotFound(String),
    #[error("{0}")]
    Failed(String),
}

/// The registry, as the SSH pool reads it.
#[async_trait]
pub trait TargetRegistry: Send + Sync {
    /// The way to `alias`, as it is now: the target itself, then its jump host, that one's
    /// jump host, and so on outwards (at most [`MAX_HOPS`]` + 2` entries, so a chain too long
    /// shows as one longer than [`MAX_HOPS`]` + 1`).
    async fn path(&self, alias: &str) -> Result<Vec<Endpoint>, RegistryError>;
    /// Checks `fingerprint` against the target's key: records it on first use, pins it when
    /// the operator trusts it, refuses a mismatch; audited as `actor`.
    async fn check_host_key(
        &self,
        alias: &str,
        fingerprint: &str,
        algorithm: &str,
        trust: Option<&Trust>,
        actor: &str,
    ) -> Result<HostKeyVerdict, RegistryError>;
    /// The sealed secrets of `alias` in `generation`.
    async fn sealed_secrets(
        &self,
        alias: &str,
        generation: i64,
    ) -> Result<SealedSecrets, RegistryError>;
}
