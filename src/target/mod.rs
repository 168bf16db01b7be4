//! The registry of SSH targets: what an admin registered (host, port, user, how to
//! authenticate, host-key policy), its approval status, and its host key — seen at `add`,
//! recorded on first use, or pinned. Secrets are stored vault-sealed (AES-256-GCM, bound to
//! the row's alias and generation and to the field), never in plaintext and never with the
//! path they came from.
//!
//! **Approval pins the host key**: [`approve`] (and [`set_status`] to approved) turns the key
//! the admin was shown into the pinned one, in the same transaction as the status change. A
//! decision made on what an approval card showed ([`decide_shown`]) applies only while the
//! target is still pending in that generation with that key.
//!
//! Every status change, add, remove, host-key record, pin, rekey or mismatch writes its audit
//! row in the same transaction. Never: returns a secret from a listing, or decrypts one (only
//! `exec::ssh` asks the vault, to authenticate, and [`reseal_legacy`] to re-seal).

pub mod allow;
pub mod cli;
pub mod import;
pub mod keyring;
pub mod policy;
pub mod ssh_config;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgPool, Row};
use zeroize::Zeroizing;

use crate::audit;
pub use crate::exec::ssh::registry::{
    AuthKind, Endpoint, HostKeyVerdict, MAX_HOPS, RegistryError, SealedSecrets, Status,
    TargetRegistry, Trust,
};
use crate::vault::{Field, Slot, Vault};

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
    /// `seen` (by `target add`; approval pins it), `tofu` (recorded on first connection) or
    /// `pinned` (by approval or an operator).
    pub source: String,
    pub at: Option<DateTime<Utc>>,
}

impl HostKey {
    /// One line for people: `SHA256:… ssh-ed25519 (seen at add; approving pins it)`.
    pub fn describe(&self) -> String {
        let how = match self.source.as_str() {
            "seen" => "seen by `target add`; approving the target pins it",
            "tofu" => "recorded on first use",
            "pinned" => "pinned",
            other => other,
        };
        match &self.algorithm {
            Some(a) => format!("{} {a} ({how})", self.fingerprint),
            None => format!("{} ({how})", self.fingerprint),
        }
    }
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
    /// The highest workspace permission a chat may choose on this target.
    #[serde(serialize_with = "crate::workspace::serialize_permission")]
    pub max_permission: crate::workspace::Permission,
    /// The directory sections start in (`None`: the remote user's home).
    pub workspace: Option<String>,
    /// The target this one is reached through (its jump host), if any.
    pub jump: Option<String>,
}

impl Target {
    /// Where this target's commands run, for the head of every tool result: its alias, user
    /// and host (`web · deploy@10.0.0.5`), with the port when it is not 22.
    pub fn location(&self) -> String {
        self.endpoint().location()
    }

    /// What the SSH pool needs of it.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            alias: self.alias.clone(),
            generation: self.generation,
            host: self.host.clone(),
            port: self.port,
            user: self.user.clone(),
            auth: self.auth,
            status: self.status,
            jump: self.jump.clone(),
        }
    }

    /// How the target is reached, for people: ` via bastion`, or nothing for a direct one.
    pub fn via(&self) -> String {
        self.endpoint().via()
    }

    /// `user@host:port`, then ` via <jump>` when it is reached through a jump host.
    pub fn destination(&self) -> String {
        format!("{}@{}:{}{}", self.user, self.host, self.port, self.via())
    }
}

/// The registry in PostgreSQL, as the SSH pool reads it.
pub struct Registry {
    pub db: PgPool,
}

/// The registry on `db`, for the executors.
pub fn registry(db: PgPool) -> std::sync::Arc<dyn TargetRegistry> {
    std::sync::Arc::new(Registry { db })
}

fn registry_error(e: TargetError) -> RegistryError {
    match e {
        TargetError::NotFound(a) => RegistryError::NotFound(a),
        other => RegistryError::Failed(other.to_string()),
    }
}

#[async_trait::async_trait]
impl TargetRegistry for Registry {
    async fn path(&self, alias: &str) -> Result<Vec<Endpoint>, RegistryError> {
        path(&self.db, alias)
            .await
            .map(|p| p.iter().map(Target::endpoint).collect())
            .map_err(registry_error)
    }

    async fn check_host_key(
        &self,
        alias: &str,
        fingerprint: &str,
        algorithm: &str,
        trust: Option<&Trust>,
        actor: &str,
    ) -> Result<HostKeyVerdict, RegistryError> {
        check_host_key(&self.db, alias, fingerprint, algorithm, trust, actor)
            .await
            .map_err(registry_error)
    }

    async fn sealed_secrets(
        &self,
        alias: &str,
        generation: i64,
    ) -> Result<SealedSecrets, RegistryError> {
        sealed_secrets(&self.db, alias, generation)
            .await
            .map_err(registry_error)
    }
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
    /// The host key given (`pinned`) or seen (`seen`) at add time. A seen key is pinned at
    /// once when `approve` is set.
    pub host_key: Option<HostKey>,
    /// Approved at once (an operator added it).
    pub approve: bool,
    /// The registered target it is reached through, if any.
    pub jump: Option<String>,
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
    #[error(
        "target `{0}` has no host key to replace the recorded one with; pass --host-key KEY_LINE|SHA256:FP"
    )]
    NoHostKey(String),
    /// A jump host cannot be removed while targets are reached through it.
    #[error(
        "target `{alias}` is the jump host of {dependents}: remove those first, or move them with `sshmode target set <alias> --jump <other>` or `--no-jump`"
    )]
    JumpInUse { alias: String, dependents: String },
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// A vault record could not be opened or sealed again (`vault rotate-key`).
    #[error("{0}")]
    Sealed(#[from] crate::vault::VaultError),
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
    host_key_algorithm, host_key_source, host_key_at, status, added_by, created_at, \
    max_permission, workspace, jump";

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
        max_permission: crate::workspace::Permission::parse(r.get("max_permission"))
            .unwrap_or(crate::workspace::Permission::Read),
        workspace: r.get("workspace"),
        jump: r.get("jump"),
    }
}

/// Checks what an add would refuse, before anything (a connection) is made for it.
pub fn validate(new: &NewTarget) -> Result<(), TargetError> {
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
    Ok(())
}

/// Adds a target, sealing its secrets; audited as `target.add`.
pub async fn add(
    db: &PgPool,
    vault: &Vault,
    new: NewTarget,
    actor: &str,
) -> Result<Target, TargetError> {
    validate(&new)?;
    let status = if new.approve {
        Status::Approved
    } else {
        Status::Pending
    };
    // Approval pins the key the operator was shown — but a strict target's key must be checked
    // by the operator (`--host-key`, `target test --trust SHA256:…`, or `target approve`
    // after reading it), so adding with `--approve` does not pin a key nobody looked at.
    let host_key = new.host_key.clone().map(|mut k| {
        if new.approve && k.source == "seen" && new.host_key_policy == HostKeyPolicy::Tofu {
            k.source = "pinned".into();
        }
        k
    });
    let mut tx = db.begin().await?;
    if let Some(jump) = &new.jump {
        check_jump(&mut tx, &new.alias, jump).await?;
    }
    // The generation first: the sealed records are bound to it.
    let generation: i64 =
        sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('targets', 'generation'))")
            .fetch_one(&mut *tx)
            .await?;
    let seal = |field: Field, data: &[u8]| {
        let place = Slot {
            alias: &new.alias,
            generation,
            field,
        };
        vault.seal(&place, data).map_err(|_| TargetError::Vault)
    };
    let (kind, key, cert, password) = match &new.secrets {
        NewSecrets::Key { key, cert } => (
            AuthKind::Key,
            Some(seal(Field::Key, key.as_bytes())?),
            cert.as_deref()
                .map(|c| seal(Field::Cert, c.as_bytes()))
                .transpose()?,
            None,
        ),
        NewSecrets::Password(p) => (
            AuthKind::Password,
            None,
            None,
            Some(seal(Field::Password, p.as_bytes())?),
        ),
        NewSecrets::Agent => (AuthKind::Agent, None, None, None),
    };
    let row = sqlx::query(&format!(
        "INSERT INTO targets (alias, generation, host, port, username, description, auth_kind, \
         sealed_key, sealed_cert, sealed_password, seal_version, host_key_policy, \
         host_key_fingerprint, host_key_algorithm, host_key_source, host_key_at, status, added_by, \
         jump) \
         VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,2,$11,$12,$13,$14,$15,$16,$17,$18) \
         ON CONFLICT (alias) DO NOTHING RETURNING {COLUMNS}"
    ))
    .bind(&new.alias)
    .bind(generation)
    .bind(new.host.trim())
    .bind(new.port as i32)
    .bind(new.user.trim())
    .bind(&new.description)
    .bind(kind.as_str())
    .bind(key)
    .bind(cert)
    .bind(password)
    .bind(new.host_key_policy.as_str())
    .bind(host_key.as_ref().map(|k| k.fingerprint.clone()))
    .bind(host_key.as_ref().and_then(|k| k.algorithm.clone()))
    .bind(host_key.as_ref().map(|k| k.source.clone()))
    .bind(host_key.as_ref().map(|_| Utc::now()))
    .bind(status.as_str())
    .bind(actor)
    .bind(&new.jump)
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
                "host_key": target.host_key.as_ref().map(|k| &k.fingerprint),
                "host_key_source": target.host_key.as_ref().map(|k| &k.source),
                "status": status.as_str(),
                "jump": target.jump,
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

/// The way to `alias`: the target itself, then its jump host, that one's jump host, and so on
/// outwards — at most [`MAX_HOPS`]` + 2` entries, so a chain too long (or a loop, which
/// [`check_jump`] keeps out of the table) shows as one longer than [`MAX_HOPS`]` + 1`.
pub async fn path(db: &PgPool, alias: &str) -> Result<Vec<Target>, TargetError> {
    let rows = sqlx::query(&format!(
        "WITH RECURSIVE chain (alias, next, depth) AS ( \
             SELECT alias, jump, 0 FROM targets WHERE alias = $1 \
             UNION ALL \
             SELECT t.alias, t.jump, c.depth + 1 FROM targets t JOIN chain c ON t.alias = c.next \
             WHERE c.depth <= $2) \
         SELECT {COLUMNS} FROM targets JOIN chain USING (alias) ORDER BY chain.depth"
    ))
    .bind(alias)
    .bind(MAX_HOPS as i32)
    .fetch_all(db)
    .await?;
    if rows.is_empty() {
        return Err(TargetError::NotFound(alias.to_string()));
    }
    Ok(rows.iter().map(from_row).collect())
}

/// Refuses `jump` as the jump host of `alias` when it does not exist, is `alias` itself, is
/// reached through `alias` (a loop), or would put `alias` more than [`MAX_HOPS`] jump hosts
/// away. Jump changes are serialised (a transaction-scoped advisory lock), so two changes made
/// at once cannot close a loop that neither sees.
async fn check_jump(
    tx: &mut sqlx::PgConnection,
    alias: &str,
    jump: &str,
) -> Result<(), TargetError> {
    sqlx::query("SELECT pg_advisory_xact_lock(727001)")
        .execute(&mut *tx)
        .await?;
    if jump == alias {
        return Err(TargetError::Invalid(format!(
            "`{alias}` cannot be its own jump host"
        )));
    }
    let chain: Vec<String> = sqlx::query_scalar(
        "WITH RECURSIVE chain (alias, next, depth) AS ( \
             SELECT alias, jump, 0 FROM targets WHERE alias = $1 \
             UNION ALL \
             SELECT t.alias, t.jump, c.depth + 1 FROM targets t JOIN chain c ON t.alias = c.next \
             WHERE c.depth <= $2) \
         SELECT alias FROM chain ORDER BY depth",
    )
    .bind(jump)
    .bind(MAX_HOPS as i32)
    .fetch_all(&mut *tx)
    .await?;
    if chain.is_empty() {
        return Err(TargetError::Invalid(format!(
            "no target named `{jump}` to jump through; add it first"
        )));
    }
    if let Some(at) = chain.iter().position(|a| a == alias) {
        let ring: Vec<&str> = std::iter::once(alias)
            .chain(chain[..=at].iter().map(String::as_str))
            .collect();
        return Err(TargetError::Invalid(format!(
            "`{jump}` is itself reached through `{alias}` ({}): a jump chain may not loop",
            ring.join(" → ")
        )));
    }
    if chain.len() > MAX_HOPS {
        return Err(TargetError::Invalid(format!(
            "`{alias}` would be reached through more than {MAX_HOPS} jump hosts"
        )));
    }
    Ok(())
}

/// The targets reached directly through `alias` (it is their jump host), by alias; at most 100.
pub async fn dependents(db: &PgPool, alias: &str) -> Result<Vec<String>, TargetError> {
    Ok(
        sqlx::query_scalar("SELECT alias FROM targets WHERE jump = $1 ORDER BY alias LIMIT 100")
            .bind(alias)
            .fetch_all(db)
            .await?,
    )
}

/// What [`approve`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// The status before.
    pub previous: Status,
    /// The key now pinned; `None` when none was known yet (a target added `--offline`: its
    /// first connection records one, or, when strict, an operator pins one).
    pub pinned: Option<HostKey>,
}

/// Approves a target and pins the host key the admin was shown (seen by `target add`, or
/// recorded since), in one transaction; audited as `target.approve` (naming the key) and
/// `hostkey.pin`. The chat's approval and `sshmode target approve` both come here.
pub async fn approve(db: &PgPool, alias: &str, actor: &str) -> Result<Approval, TargetError> {
    let (previous, pinned) = change_status(db, alias, Status::Approved, actor, None)
        .await?
        .ok_or_else(|| TargetError::NotFound(alias.to_string()))?;
    Ok(Approval { previous, pinned })
}

/// Changes a target's status; audited as `target.approve` / `target.disable` /
/// `target.pending`. Approving pins the host key, as [`approve`] does. Returns the previous
/// status.
pub async fn set_status(
    db: &PgPool,
    alias: &str,
    status: Status,
    actor: &str,
) -> Result<Status, TargetError> {
    Ok(change_status(db, alias, status, actor, None)
        .await?
        .ok_or_else(|| TargetError::NotFound(alias.to_string()))?
        .0)
}

/// What a decision was shown (an approval card): the target's generation and host key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown<'a> {
    pub generation: i64,
    /// The host key's fingerprint it showed (`Some(None)`: it showed none); `None` when it does
    /// not say (a card from before cards named it), which can reject but never approve.
    pub fingerprint: Option<Option<&'a str>>,
}

/// Decides a target as an admin was shown it: only while it is still `pending` in the shown
/// generation, and an approval only while its host key is the one shown (the one it pins).
/// `Ok(None)` when that no longer holds: nothing changes, and nothing is audited here (the
/// caller audits the refusal). Otherwise as [`set_status`].
pub async fn decide_shown(
    db: &PgPool,
    alias: &str,
    status: Status,
    actor: &str,
    shown: &Shown<'_>,
) -> Result<Option<Status>, TargetError> {
    Ok(change_status(db, alias, status, actor, Some(shown))
        .await?
        .map(|(prev, _)| prev))
}

async fn change_status(
    db: &PgPool,
    alias: &str,
    status: Status,
    actor: &str,
    shown: Option<&Shown<'_>>,
) -> Result<Option<(Status, Option<HostKey>)>, TargetError> {
    let mut tx = db.begin().await?;
    let row = sqlx::query(
        "SELECT status, generation, host_key_fingerprint, host_key_algorithm, host_key_source \
         FROM targets WHERE alias = $1 FOR UPDATE",
    )
    .bind(alias)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        if shown.is_some() {
            return Ok(None);
        }
        return Err(TargetError::NotFound(alias.to_string()));
    };
    let prev: String = row.get("status");
    let fingerprint: Option<String> = row.get("host_key_fingerprint");
    let source: Option<String> = row.get("host_key_source");
    if let Some(shown) = shown {
        let still = Status::parse(&prev) == Status::Pending
            && row.get::<i64, _>("generation") == shown.generation
            && (status != Status::Approved || shown.fingerprint == Some(fingerprint.as_deref()));
        if !still {
            return Ok(None);
        }
    }
    sqlx::query("UPDATE targets SET status = $2, updated_at = now() WHERE alias = $1")
        .bind(alias)
        .bind(status.as_str())
        .execute(&mut *tx)
        .await?;
    let mut pinned = None;
    let mut pin_audit = None;
    if status == Status::Approved
        && let Some(fp) = &fingerprint
    {
        if source.as_deref() != Some("pinned") {
            sqlx::query(
                "UPDATE targets SET host_key_source = 'pinned', host_key_at = now() WHERE alias = $1",
            )
            .bind(alias)
            .execute(&mut *tx)
            .await?;
            pin_audit = Some(json!({ "fingerprint": fp, "by": "approval", "was": source }));
        }
        pinned = Some(HostKey {
            fingerprint: fp.clone(),
            algorithm: row.get("host_key_algorithm"),
            source: "pinned".into(),
            at: Some(Utc::now()),
        });
    }
    let action = match status {
        Status::Approved => "target.approve",
        Status::Disabled => "target.disable",
        Status::Pending => "target.pending",
    };
    let mut detail = json!({ "from": prev, "to": status.as_str() });
    if status == Status::Approved {
        detail["host_key"] = json!(fingerprint);
    }
    audit::record(
        &mut tx,
        audit::Entry {
            actor,
            action,
            subject: alias,
            detail,
        },
    )
    .await?;
    if let Some(detail) = pin_audit {
        audit::record(
            &mut tx,
            audit::Entry {
                actor,
                action: "hostkey.pin",
                subject: alias,
                detail,
            },
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Some((Status::parse(&prev), pinned)))
}

/// Replaces the recorded or pinned host key after a legitimate change; the new key is pinned.
/// Audited as `hostkey.rekey` with both fingerprints. Returns the key replaced, if any.
pub async fn rekey(
    db: &PgPool,
    alias: &str,
    key: &HostKey,
    actor: &str,
) -> Result<Option<String>, TargetError> {
    let mut tx = db.begin().await?;
    let prev: Option<Option<String>> =
        sqlx::query_scalar("SELECT host_key_fingerprint FROM targets WHERE alias = $1 FOR UPDATE")
            .bind(alias)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(prev) = prev else {
        return Err(TargetError::NotFound(alias.to_string()));
    };
    sqlx::query(
        "UPDATE targets SET host_key_fingerprint = $2, host_key_algorithm = $3, \
         host_key_source = 'pinned', host_key_at = now(), updated_at = now() WHERE alias = $1",
    )
    .bind(alias)
    .bind(&key.fingerprint)
    .bind(&key.algorithm)
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        audit::Entry {
            actor,
            action: "hostkey.rekey",
            subject: alias,
            detail: json!({ "from": prev, "to": key.fingerprint, "algorithm": key.algorithm }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(prev)
}

/// What `sshmode target set` changes; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The default workspace of the target's sections: `Some(None)` returns it to the remote
    /// user's home.
    pub workspace: Option<Option<String>>,
    pub max_permission: Option<crate::workspace::Permission>,
    /// The jump host: `Some(None)` makes the target direct again.
    pub jump: Option<Option<String>>,
}

/// Changes a target's workspace default and maximum permission; audited as `target.set` with
/// both values before and after. A lowered maximum holds from the next tool call of every
/// section on the target.
pub async fn set_settings(
    db: &PgPool,
    alias: &str,
    settings: &Settings,
    actor: &str,
) -> Result<Target, TargetError> {
    // The same rule and normal form as a chat's `/workspace set` on a target.
    let chosen = match &settings.workspace {
        Some(Some(dir)) => Some(Some(
            crate::workspace::remote_dir(dir).map_err(TargetError::Invalid)?,
        )),
        other => other.clone(),
    };
    let mut tx = db.begin().await?;
    let prev = sqlx::query(
        "SELECT workspace, max_permission, jump FROM targets WHERE alias = $1 FOR UPDATE",
    )
    .bind(alias)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| TargetError::NotFound(alias.to_string()))?;
    let (old_ws, old_max, old_jump): (Option<String>, String, Option<String>) = (
        prev.get("workspace"),
        prev.get("max_permission"),
        prev.get("jump"),
    );
    if let Some(Some(jump)) = &settings.jump {
        check_jump(&mut tx, alias, jump).await?;
    }
    let jump = settings.jump.clone().unwrap_or(old_jump.clone());
    let workspace = chosen.unwrap_or(old_ws.clone());
    let max = settings
        .max_permission
        .map(|p| p.as_str().to_string())
        .unwrap_or(old_max.clone());
    let row = sqlx::query(&format!(
        "UPDATE targets SET workspace = $2, max_permission = $3, jump = $4, updated_at = now() \
         WHERE alias = $1 RETURNING {COLUMNS}"
    ))
    .bind(alias)
    .bind(&workspace)
    .bind(&max)
    .bind(&jump)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        audit::Entry {
            actor,
            action: "target.set",
            subject: alias,
            detail: json!({
                "workspace": { "from": old_ws, "to": workspace },
                "max_permission": { "from": old_max, "to": max },
                "jump": { "from": old_jump, "to": jump },
            }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(from_row(&row))
}

/// Removes a target and its sealed secrets; audited as `target.remove`.
///
/// A jump host is not removed while targets are reached through it ([`TargetError::JumpInUse`],
/// naming them; the database's foreign key holds the same rule against a race).
pub async fn remove(db: &PgPool, alias: &str, actor: &str) -> Result<(), TargetError> {
    let in_use = |dependents: Vec<String>| TargetError::JumpInUse {
        alias: alias.to_string(),
        dependents: dependents
            .iter()
            .map(|d| format!("`{d}`"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let behind = dependents(db, alias).await?;
    if !behind.is_empty() {
        return Err(in_use(behind));
    }
    let mut tx = db.begin().await?;
    let gone = match sqlx::query("DELETE FROM targets WHERE alias = $1")
        .bind(alias)
        .execute(&mut *tx)
        .await
    {
        Ok(r) => r.rows_affected(),
        Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => {
            drop(tx);
            return Err(in_use(dependents(db, alias).await?));
        }
        Err(e) => return Err(e.into()),
    };
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

/// The sealed secrets of generation `generation` of a target (for `exec::ssh`
/// authentication only). A row still at seal version 1 (its re-seal failed) is refused rather
/// than opened the old way.
pub async fn sealed_secrets(
    db: &PgPool,
    alias: &str,
    generation: i64,
) -> Result<SealedSecrets, TargetError> {
    let row = sqlx::query(
        "SELECT sealed_key, sealed_cert, sealed_password, seal_version FROM targets \
         WHERE alias = $1 AND generation = $2",
    )
    .bind(alias)
    .bind(generation)
    .fetch_optional(db)
    .await?
    .ok_or_else(|| TargetError::NotFound(alias.to_string()))?;
    if row.get::<i16, _>("seal_version") != 2 {
        return Err(TargetError::Invalid(format!(
            "the secrets of `{alias}` are still in the old vault format and could not be re-sealed at start; remove the target and add it again"
        )));
    }
    Ok(SealedSecrets {
        key: row.get("sealed_key"),
        cert: row.get("sealed_cert"),
        password: row.get("sealed_password"),
    })
}

/// A row's sealed key, certificate and password, in that order.
type SealedFields = [Option<Vec<u8>>; 3];

/// Whether `text` holds a secret of any registered target (its key, certificate or password).
/// The records are opened and compared inside the vault ([`Vault::contains_secret`]); only the
/// answer comes back. Rows still at seal version 1 are skipped (they are refused when used).
pub async fn holds_secret(db: &PgPool, vault: &Vault, text: &str) -> Result<bool, TargetError> {
    let owned = sealed_rows(db).await?;
    Ok(vault.contains_secret(text, &records(&owned)))
}

/// Where `text` holds a secret of any registered target, plain, base64 or hex, or the master
/// key: searched inside the vault ([`Vault::find_secrets`]); only places, kinds and tags come
/// back.
pub async fn find_secrets(
    db: &PgPool,
    vault: &Vault,
    text: &str,
) -> Result<Vec<crate::mask::Found>, TargetError> {
    let owned = sealed_rows(db).await?;
    Ok(vault.find_secrets(text, &records(&owned)))
}

/// Every row's sealed fields (seal version 2).
async fn sealed_rows(db: &PgPool) -> Result<Vec<(String, i64, SealedFields)>, TargetError> {
    let rows = sqlx::query(
        "SELECT alias, generation, sealed_key, sealed_cert, sealed_password FROM targets \
         WHERE seal_version = 2 ORDER BY generation LIMIT 10000",
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get("alias"),
                r.get("generation"),
                [
                    r.get("sealed_key"),
                    r.get("sealed_cert"),
                    r.get("sealed_password"),
                ],
            )
        })
        .collect())
}

/// The vault records of [`sealed_rows`].
fn records(owned: &[(String, i64, SealedFields)]) -> Vec<crate::vault::SealedRecord<'_>> {
    let fields = [
        crate::vault::Field::Key,
        crate::vault::Field::Cert,
        crate::vault::Field::Password,
    ];
    owned
        .iter()
        .flat_map(|(alias, generation, sealed)| {
            sealed.iter().zip(fields).filter_map(move |(s, field)| {
                s.as_deref().map(|sealed| crate::vault::SealedRecord {
                    place: crate::vault::Slot {
                        alias,
                        generation: *generation,
                        field,
                    },
                    sealed,
                })
            })
        })
        .collect()
}

/// How many targets hold a sealed secret (a key, certificate or password): what a new master
/// key would leave unreadable.
pub async fn sealed_count(db: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT count(*) FROM targets WHERE sealed_key IS NOT NULL OR sealed_cert IS NOT NULL \
         OR sealed_password IS NOT NULL",
    )
    .fetch_one(db)
    .await
}

/// Most rows [`opens_a_record`] tries.
const MAX_PROBED: i64 = 1000;

/// Whether `vault` opens at least one target's sealed record (in either format): the proof,
/// before a database has a canary, that this key is the one its secrets were sealed with.
pub async fn opens_a_record(db: &PgPool, vault: &Vault) -> Result<bool, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT alias, generation, seal_version, sealed_key, sealed_cert, sealed_password \
         FROM targets ORDER BY generation LIMIT $1",
    )
    .bind(MAX_PROBED)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().any(|row| {
        let alias: String = row.get("alias");
        let generation: i64 = row.get("generation");
        let legacy = row.get::<i16, _>("seal_version") == 1;
        [
            (Field::Key, "sealed_key"),
            (Field::Cert, "sealed_cert"),
            (Field::Password, "sealed_password"),
        ]
        .into_iter()
        .any(|(field, column)| {
            let Some(sealed) = row.get::<Option<Vec<u8>>, _>(column) else {
                return false;
            };
            if legacy {
                return vault.open_legacy(&alias, &sealed).is_ok();
            }
            let place = Slot {
                alias: &alias,
                generation,
                field,
            };
            vault.open(&place, &sealed).is_ok()
        })
    }))
}

/// Re-seals every row still at seal version 1 (vault records bound to the alias alone) for
/// its (alias, generation, field), one row per transaction; idempotent, and safe to run from
/// several processes at once (a row is locked and re-checked). A row whose records do not
/// open (another master key) is left as it is, logged, and refused when used. Returns the
/// number of rows re-sealed.
pub async fn reseal_legacy(db: &PgPool, vault: &Vault) -> Result<usize, TargetError> {
    let legacy: Vec<i64> = sqlx::query_scalar(
        "SELECT generation FROM targets WHERE seal_version = 1 ORDER BY generation LIMIT 100000",
    )
    .fetch_all(db)
    .await?;
    let mut done = 0;
    for generation in legacy {
        let mut tx = db.begin().await?;
        let row = sqlx::query(
            "SELECT alias, sealed_key, sealed_cert, sealed_password FROM targets \
             WHERE generation = $1 AND seal_version = 1 FOR UPDATE",
        )
        .bind(generation)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else { continue };
        let alias: String = row.get("alias");
        let reseal = |field: Field, column: &str| -> Result<Option<Vec<u8>>, ()> {
            let Some(old) = row.get::<Option<Vec<u8>>, _>(column) else {
                return Ok(None);
            };
            let plain = vault.open_legacy(&alias, &old).map_err(|_| ())?;
            let place = Slot {
                alias: &alias,
                generation,
                field,
            };
            vault.seal(&place, &plain).map(Some).map_err(|_| ())
        };
        let sealed = (|| {
            Ok::<_, ()>((
                reseal(Field::Key, "sealed_key")?,
                reseal(Field::Cert, "sealed_cert")?,
                reseal(Field::Password, "sealed_password")?,
            ))
        })();
        let Ok((key, cert, password)) = sealed else {
            tracing::warn!(ssh.target = %alias, "its vaulted secrets could not be re-sealed (another master key?); it stays unusable until added again");
            continue;
        };
        sqlx::query(
            "UPDATE targets SET sealed_key = $2, sealed_cert = $3, sealed_password = $4, \
             seal_version = 2, updated_at = now() WHERE generation = $1",
        )
        .bind(generation)
        .bind(key)
        .bind(cert)
        .bind(password)
        .execute(&mut *tx)
        .await?;
        audit::record(
            &mut tx,
            audit::Entry {
                actor: "system",
                action: "target.reseal",
                subject: &alias,
                detail: json!({ "generation": generation, "seal_version": 2 }),
            },
        )
        .await?;
        tx.commit().await?;
        done += 1;
    }
    if done > 0 {
        tracing::info!(
            targets = done,
            "vault records re-sealed for their target row and field"
        );
    }
    Ok(done)
}

/// Most targets one key rotation re-seals.
const MAX_RESEAL: i64 = 100_000;

/// Re-seals every target's vault records and the vault's canary, opened with `old`, under
/// `new`, in one transaction with its audit row (`vault.rotate`): either every record moves to
/// the new key or none does.
/// A record `old` cannot open fails the whole rotation (nothing is lost by stopping).
pub async fn reseal_all(
    db: &PgPool,
    old: &Vault,
    new: &Vault,
    actor: &str,
) -> Result<usize, TargetError> {
    let mut tx = db.begin().await?;
    let rows = sqlx::query(
        "SELECT alias, generation, sealed_key, sealed_cert, sealed_password FROM targets \
          ORDER BY generation LIMIT $1 FOR UPDATE",
    )
    .bind(MAX_RESEAL)
    .fetch_all(&mut *tx)
    .await?;
    for row in &rows {
        let alias: String = row.get("alias");
        let generation: i64 = row.get("generation");
        let reseal = |field: Field, column: &str| -> Result<Option<Vec<u8>>, TargetError> {
            let Some(sealed) = row.get::<Option<Vec<u8>>, _>(column) else {
                return Ok(None);
            };
            let place = Slot {
                alias: &alias,
                generation,
                field,
            };
            let plain = old.open(&place, &sealed)?;
            Ok(Some(new.seal(&place, &plain)?))
        };
        let (key, cert, password) = (
            reseal(Field::Key, "sealed_key")?,
            reseal(Field::Cert, "sealed_cert")?,
            reseal(Field::Password, "sealed_password")?,
        );
        sqlx::query(
            "UPDATE targets SET sealed_key = $2, sealed_cert = $3, sealed_password = $4, \
             updated_at = now() WHERE generation = $1",
        )
        .bind(generation)
        .bind(key)
        .bind(cert)
        .bind(password)
        .execute(&mut *tx)
        .await?;
    }
    // The canary moves with them: the new key is the vault's from the same commit.
    if !crate::target::keyring::reseal_canary(&mut tx, old, new).await? {
        return Err(TargetError::Invalid(
            "the current master key does not open the vault's canary record: it is not the key \
             this database was sealed with"
                .into(),
        ));
    }
    audit::record(
        &mut tx,
        audit::Entry {
            actor,
            action: "vault.rotate",
            subject: "master-key",
            detail: json!({ "targets": rows.len() }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(rows.len())
}

/// Checks `fingerprint` against the target's key in one transaction: records it on first use
/// (tofu), pins it when the operator trusts it (`trust`, which a `SHA256:…` must match),
/// and audits a record (`hostkey.record` / `hostkey.pin`), a refused trust
/// (`hostkey.trust_mismatch`) or a mismatch (`hostkey.mismatch`, naming both fingerprints).
pub async fn check_host_key(
    db: &PgPool,
    alias: &str,
    fingerprint: &str,
    algorithm: &str,
    trust: Option<&Trust>,
    actor: &str,
) -> Result<HostKeyVerdict, TargetError> {
    let mut tx = db.begin().await?;
    let row = sqlx::query(
        "SELECT host_key_policy, host_key_fingerprint, host_key_source, jump FROM targets \
         WHERE alias = $1 FOR UPDATE",
    )
    .bind(alias)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| TargetError::NotFound(alias.to_string()))?;
    let policy: String = row.get("host_key_policy");
    let recorded: Option<String> = row.get("host_key_fingerprint");
    let source: Option<String> = row.get("host_key_source");
    // A target behind a jump host: its rows name the hop the key was seen through.
    let jump: Option<String> = row.get("jump");
    let via = |mut detail: serde_json::Value| {
        if let Some(j) = &jump {
            detail["via"] = json!(j);
        }
        detail
    };
    let verdict = match (recorded, trust) {
        (_, Some(Trust::Fingerprint(checked))) if checked != fingerprint => {
            audit::record(
                &mut tx,
                audit::Entry {
                    actor,
                    action: "hostkey.trust_mismatch",
                    subject: alias,
                    detail: via(json!({ "checked": checked, "presented": fingerprint, "algorithm": algorithm })),
                },
            )
            .await?;
            HostKeyVerdict::TrustMismatch {
                checked: checked.clone(),
            }
        }
        (Some(expected), _) if expected != fingerprint => {
            audit::record(
                &mut tx,
                audit::Entry {
                    actor,
                    action: "hostkey.mismatch",
                    subject: alias,
                    detail: via(json!({ "expected": expected, "presented": fingerprint, "algorithm": algorithm })),
                },
            )
            .await?;
            HostKeyVerdict::Mismatch { expected }
        }
        (Some(_), Some(_)) if source.as_deref() != Some("pinned") => {
            pin_presented(&mut tx, alias, fingerprint, algorithm, actor, source).await?;
            HostKeyVerdict::Pinned
        }
        // A strict target accepts only a pinned key, not one merely seen or recorded.
        (Some(_), None) if policy == "strict" && source.as_deref() != Some("pinned") => {
            HostKeyVerdict::Unpinned
        }
        (Some(_), _) => HostKeyVerdict::Match,
        (None, Some(_)) => {
            pin_presented(&mut tx, alias, fingerprint, algorithm, actor, None).await?;
            HostKeyVerdict::Recorded
        }
        (None, None) if policy == "strict" => HostKeyVerdict::Unpinned,
        (None, None) => {
            sqlx::query(
                "UPDATE targets SET host_key_fingerprint = $2, host_key_algorithm = $3, \
                 host_key_source = 'tofu', host_key_at = now(), updated_at = now() WHERE alias = $1",
            )
            .bind(alias)
            .bind(fingerprint)
            .bind(algorithm)
            .execute(&mut *tx)
            .await?;
            audit::record(
                &mut tx,
                audit::Entry {
                    actor,
                    action: "hostkey.record",
                    subject: alias,
                    detail: via(json!({ "fingerprint": fingerprint, "algorithm": algorithm })),
                },
            )
            .await?;
            HostKeyVerdict::Recorded
        }
    };
    tx.commit().await?;
    Ok(verdict)
}

/// Pins the presented key an operator trusted; audited as `hostkey.pin`.
async fn pin_presented(
    tx: &mut sqlx::PgConnection,
    alias: &str,
    fingerprint: &str,
    algorithm: &str,
    actor: &str,
    was: Option<String>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE targets SET host_key_fingerprint = $2, host_key_algorithm = $3, \
         host_key_source = 'pinned', host_key_at = now(), updated_at = now() WHERE alias = $1",
    )
    .bind(alias)
    .bind(fingerprint)
    .bind(algorithm)
    .execute(&mut *tx)
    .await?;
    audit::record(
        tx,
        audit::Entry {
            actor,
            action: "hostkey.pin",
            subject: alias,
            detail: json!({ "fingerprint": fingerprint, "algorithm": algorithm, "by": "trust", "was": was }),
        },
    )
    .await
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
