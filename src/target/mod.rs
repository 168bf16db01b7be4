//! The registry of SSH targets: what an admin registered (host, port, user, how to
//! authenticate, host-key policy), its approval status, and its recorded or pinned host key.
//! Secrets are stored vault-sealed (AES-256-GCM, alias as associated data), never in
//! plaintext and never with the path they came from.
//!
//! Every status change, add, remove and host-key record or mismatch writes its audit row in
//! the same transaction. Never: returns a secret from a listing, or decrypts one (only
//! `exec::ssh` asks the vault, to authenticate).

pub mod allow;
pub mod cli;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgPool, Row};
use zeroize::Zeroizing;

use crate::audit;
use crate::vault::Vault;

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
    pub(crate) fn parse(s: &str) -> Status {
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

/// Host-key policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HostKeyPolicy {
    /// Trust on first use.
    Tofu,
    /// Only a pinned key is accepted.
    Strict,
}

impl HostKeyPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            HostKeyPolicy::Tofu => "tofu",
            HostKeyPolicy::Strict => "strict",
        }
    }
}

/// The host key a target is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostKey {
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    /// Key algorithm when known (`ssh-ed25519`, …); a pin by fingerprint alone has none.
    pub algorithm: Option<String>,
    /// `tofu` (recorded on first connection) or `pinned` (by an operator).
    pub source: String,
    pub at: Option<DateTime<Utc>>,
}

/// A target as the registry shows it: never a secret, never a key path.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub alias: String,
    /// Changes when the alias is removed and added again.
    pub generation: i64,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub description: Option<String>,
    pub auth: AuthKind,
    /// Whether a user certificate accompanies the key.
    pub has_cert: bool,
    pub host_key_policy: HostKeyPolicy,
    pub host_key: Option<HostKey>,
    pub status: Status,
    pub added_by: String,
    pub created_at: DateTime<Utc>,
}

/// Secrets of a new target, in plaintext only for the moment of import.
pub enum NewSecrets {
    /// An unencrypted OpenSSH private key (decrypted by the CLI if it had a passphrase) and
    /// the certificate text if any.
    Key {
        key: Zeroizing<String>,
        cert: Option<String>,
    },
    Password(Zeroizing<String>),
    Agent,
}

/// A target to add.
pub struct NewTarget {
    pub alias: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    pub description: Option<String>,
    pub secrets: NewSecrets,
    pub host_key_policy: HostKeyPolicy,
    /// A pinned host key given at add time.
    pub pinned: Option<HostKey>,
    /// Approved at once (an operator added it).
    pub approve: bool,
}

/// Sealed secrets of one target, as stored; opened only by `exec::ssh` to authenticate.
pub struct SealedSecrets {
    pub key: Option<Vec<u8>>,
    pub cert: Option<Vec<u8>>,
    pub password: Option<Vec<u8>>,
}

/// Registry errors.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("no target named `{0}`")]
    NotFound(String),
    #[error("a target named `{0}` already exists")]
    Exists(String),
    #[error("{0}")]
    Invalid(String),
    #[error("the vault could not seal the secret")]
    Vault,
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

/// Words that are never an alias (chat commands use them as keywords; any case).
pub const RESERVED_ALIASES: [&str; 4] = ["all", "local", "off", "help"];

/// Whether `alias` is a valid target alias: letters, digits, `.`, `_`, `-`, a letter or digit
/// first, at most 63, not a reserved word. The one alias rule: the chat parser uses it and the
/// database CHECKs the same.
pub fn valid_alias(alias: &str) -> bool {
    let b = alias.as_bytes();
    !RESERVED_ALIASES
        .iter()
        .any(|r| r.eq_ignore_ascii_case(alias))
        && !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

const COLUMNS: &str = "alias, generation, host, port, username, description, auth_kind, \
    sealed_cert IS NOT NULL AS has_cert, host_key_policy, host_key_fingerprint, \
    host_key_algorithm, host_key_source, host_key_at, status, added_by, created_at";

fn from_row(r: &sqlx::postgres::PgRow) -> Target {
    let fp: Option<String> = r.get("host_key_fingerprint");
    Target {
        alias: r.get("alias"),
        generation: r.get("generation"),
        host: r.get("host"),
        port: r.get::<i32, _>("port") as u16,
        user: r.get("username"),
        description: r.get("description"),
        auth: match r.get::<&str, _>("auth_kind") {
            "password" => AuthKind::Password,
            "agent" => AuthKind::Agent,
            _ => AuthKind::Key,
        },
        has_cert: r.get("has_cert"),
        host_key_policy: if r.get::<&str, _>("host_key_policy") == "strict" {
            HostKeyPolicy::Strict
        } else {
            HostKeyPolicy::Tofu
        },
        host_key: fp.map(|fingerprint| HostKey {
            fingerprint,
            algorithm: r.get("host_key_algorithm"),
            source: r
                .get::<Option<String>, _>("host_key_source")
                .unwrap_or_default(),
            at: r.get("host_key_at"),
        }),
        status: Status::parse(r.get("status")),
        added_by: r.get("added_by"),
        created_at: r.get("created_at"),
    }
}

/// Adds a target, sealing its secrets; audited as `target.add`.
pub async fn add(
    db: &PgPool,
    vault: &Vault,
    new: NewTarget,
    actor: &str,
) -> Result<Target, TargetError> {
    if !valid_alias(&new.alias) {
        return Err(TargetError::Invalid(format!(
            "`{}` is not a valid alias: use letters, digits, `.`, `_`, `-`, a letter or digit first (at most 63; not all, local, off or help)",
            new.alias
        )));
    }
    if new.host.trim().is_empty() || new.user.trim().is_empty() {
        return Err(TargetError::Invalid(
            "host and user must not be empty".into(),
        ));
    }
    let bad = |s: &str| s.chars().any(|c| c.is_whitespace() || c.is_control());
    if bad(&new.host) || bad(&new.user) {
        return Err(TargetError::Invalid(
            "host and user must not contain spaces or control characters".into(),
        ));
    }
    if new.port == 0 {
        return Err(TargetError::Invalid("the port must be 1–65535".into()));
    }
    let seal = |data: &[u8]| vault.seal(&new.alias, data).map_err(|_| TargetError::Vault);
    let (kind, key, cert, password) = match &new.secrets {
        NewSecrets::Key { key, cert } => (
            AuthKind::Key,
            Some(seal(key.as_bytes())?),
            cert.as_deref().map(|c| seal(c.as_bytes())).transpose()?,
            None,
        ),
        NewSecrets::Password(p) => (AuthKind::Password, None, None, Some(seal(p.as_bytes())?)),
        NewSecrets::Agent => (AuthKind::Agent, None, None, None),
    };
    let status = if new.approve {
        Status::Approved
    } else {
        Status::Pending
    };
    let mut tx = db.begin().await?;
    let row = sqlx::query(&format!(
        "INSERT INTO targets (alias, host, port, username, description, auth_kind, sealed_key, \
         sealed_cert, sealed_password, host_key_policy, host_key_fingerprint, host_key_algorithm, \
         host_key_source, host_key_at, status, added_by) \
         VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16) \
         ON CONFLICT (alias) DO NOTHING RETURNING {COLUMNS}"
    ))
    .bind(&new.alias)
    .bind(new.host.trim())
    .bind(new.port as i32)
    .bind(new.user.trim())
    .bind(&new.description)
    .bind(kind.as_str())
    .bind(key)
    .bind(cert)
    .bind(password)
    .bind(new.host_key_policy.as_str())
    .bind(new.pinned.as_ref().map(|p| p.fingerprint.clone()))
    .bind(new.pinned.as_ref().and_then(|p| p.algorithm.clone()))
    .bind(new.pinned.as_ref().map(|_| "pinned"))
    .bind(new.pinned.as_ref().map(|_| Utc::now()))
    .bind(status.as_str())
    .bind(actor)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Err(TargetError::Exists(new.alias));
    };
    let target = from_row(&row);
    audit::record(
        &mut tx,
        audit::Entry {
            actor,
            action: "target.add",
            subject: &target.alias,
            detail: json!({
                "host": target.host, "port": target.port, "user": target.user,
                "auth": kind.as_str(), "cert": target.has_cert,
                "host_key_policy": target.host_key_policy.as_str(),
                "pinned": target.host_key.as_ref().map(|k| &k.fingerprint),
                "status": status.as_str(),
            }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(target)
}

/// Every target, by alias.
pub async fn list(db: &PgPool) -> Result<Vec<Target>, TargetError> {
    let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM targets ORDER BY alias"))
        .fetch_all(db)
        .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// One target.
pub async fn get(db: &PgPool, alias: &str) -> Result<Target, TargetError> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM targets WHERE alias = $1"))
        .bind(alias)
        .fetch_optional(db)
        .await?;
    row.as_ref()
        .map(from_row)
        .ok_or_else(|| TargetError::NotFound(alias.to_string()))
}

/// Changes a target's status; audited as `target.approve` / `target.disable` /
/// `target.pending`. Returns the previous status.
pub async fn set_status(
    db: &PgPool,
    alias: &str,
    status: Status,
    actor: &str,
) -> Result<Status, TargetError> {
    let mut tx = db.begin().await?;
    let prev: Option<String> =
        sqlx::query_scalar("SELECT status FROM targets WHERE alias = $1 FOR UPDATE")
            .bind(alias)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(prev) = prev else {
        return Err(TargetError::NotFound(alias.to_string()));
    };
    sqlx::query("UPDATE targets SET status = $2, updated_at = now() WHERE alias = $1")
        .bind(alias)
        .bind(status.as_str())
        .execute(&mut *tx)
        .await?;
    let action = match status {
        Status::Approved => "target.approve",
        Status::Disabled => "target.disable",
        Status::Pending => "target.pending",
    };
    audit::record(
        &mut tx,
        audit::Entry {
            actor,
            action,
            subject: alias,
            detail: json!({ "from": prev, "to": status.as_str() }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Status::parse(&prev))
}

/// Removes a target and its sealed secrets; audited as `target.remove`.
pub async fn remove(db: &PgPool, alias: &str, actor: &str) -> Result<(), TargetError> {
    let mut tx = db.begin().await?;
    let gone = sqlx::query("DELETE FROM targets WHERE alias = $1")
        .bind(alias)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if gone == 0 {
        return Err(TargetError::NotFound(alias.to_string()));
    }
    audit::record(
        &mut tx,
        audit::Entry {
            actor,
            action: "target.remove",
            subject: alias,
            detail: json!({}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The sealed secrets of a target (for `exec::ssh` authentication only).
pub async fn sealed_secrets(db: &PgPool, alias: &str) -> Result<SealedSecrets, TargetError> {
    let row = sqlx::query(
        "SELECT sealed_key, sealed_cert, sealed_password FROM targets WHERE alias = $1",
    )
    .bind(alias)
    .fetch_optional(db)
    .await?
    .ok_or_else(|| TargetError::NotFound(alias.to_string()))?;
    Ok(SealedSecrets {
        key: row.get("sealed_key"),
        cert: row.get("sealed_cert"),
        password: row.get("sealed_password"),
    })
}

/// Outcome of binding a presented host key to a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKeyVerdict {
    /// It matches the recorded or pinned key.
    Match,
    /// None was recorded; it is now (tofu, or pinned with `--trust`).
    Recorded,
    /// A different key is recorded: refused, audited.
    Mismatch { expected: String },
    /// A strict target without a pinned key: refused until an operator pins one.
    Unpinned,
}

/// Checks `fingerprint` against the target's key in one transaction: records it on first use
/// (tofu) or when `pin` is set, audits a record (`hostkey.record` / `hostkey.pin`) or a
/// mismatch (`hostkey.mismatch`, naming both fingerprints).
pub async fn check_host_key(
    db: &PgPool,
    alias: &str,
    fingerprint: &str,
    algorithm: &str,
    pin: bool,
    actor: &str,
) -> Result<HostKeyVerdict, TargetError> {
    let mut tx = db.begin().await?;
    let row = sqlx::query(
        "SELECT host_key_policy, host_key_fingerprint FROM targets WHERE alias = $1 FOR UPDATE",
    )
    .bind(alias)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| TargetError::NotFound(alias.to_string()))?;
    let policy: String = row.get("host_key_policy");
    let recorded: Option<String> = row.get("host_key_fingerprint");
    let verdict = match recorded {
        Some(expected) if expected == fingerprint => HostKeyVerdict::Match,
        Some(expected) => {
            audit::record(
                &mut tx,
                audit::Entry {
                    actor,
                    action: "hostkey.mismatch",
                    subject: alias,
                    detail: json!({ "expected": expected, "presented": fingerprint, "algorithm": algorithm }),
                },
            )
            .await?;
            HostKeyVerdict::Mismatch { expected }
        }
        None if policy == "strict" && !pin => HostKeyVerdict::Unpinned,
        None => {
            let source = if pin { "pinned" } else { "tofu" };
            sqlx::query(
                "UPDATE targets SET host_key_fingerprint = $2, host_key_algorithm = $3, \
                 host_key_source = $4, host_key_at = now(), updated_at = now() WHERE alias = $1",
            )
            .bind(alias)
            .bind(fingerprint)
            .bind(algorithm)
            .bind(source)
            .execute(&mut *tx)
            .await?;
            audit::record(
                &mut tx,
                audit::Entry {
                    actor,
                    action: if pin { "hostkey.pin" } else { "hostkey.record" },
                    subject: alias,
                    detail: json!({ "fingerprint": fingerprint, "algorithm": algorithm }),
                },
            )
            .await?;
            HostKeyVerdict::Recorded
        }
    };
    tx.commit().await?;
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases() {
        for ok in ["web", "db-1", "a.b_c", "X"] {
            assert!(valid_alias(ok), "{ok}");
        }
        for bad in ["", "-x", "a b", "a/b", "ü", &"x".repeat(64), "all", "Off"] {
            assert!(!valid_alias(bad), "{bad}");
        }
    }
}
