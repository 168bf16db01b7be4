//! The MCP endpoint's bearer tokens: created (printed once, stored as a SHA-256), listed,
//! revoked, and checked on every request before anything else of it is read.
//!
//! A token is `smcp_<id>_<secret>` (16 and 64 hex digits): the id finds its row, then the
//! SHA-256 of the whole token is compared with the stored one in constant time. A token names
//! the targets it may use (`--targets a,b`, or `--all`), whether `local` is one of them
//! (`--local`), the highest workspace permission of its calls, and when it expires. Its name is
//! its section (workspace, audit actor) and may be given again once it is revoked; its id is
//! this very token ([`Token::key`]).
//!
//! Never: stores, logs or returns a token after `create` printed it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgPool, Row as _};
use subtle::ConstantTimeEq;

use crate::workspace::Permission;

/// What a token starts with.
const PREFIX: &str = "smcp_";

/// Between a token's section and its id in its [`Token::key`] (never in a name).
const KEY_ID: char = '#';

/// The (section, token id) of a [`Token::key`].
pub fn split_key(key: &str) -> Option<(&str, &str)> {
    key.rsplit_once(KEY_ID)
}

/// A token as stored: everything but the secret.
#[derive(Debug, Clone, Serialize)]
pub struct Token {
    pub name: String,
    /// The id in the token's text (`smcp_<id>_…`): this very token, where the name may be
    /// given again to a new one once it is revoked.
    #[serde(skip)]
    pub id: String,
    /// The targets named at creation (ignored when `all_targets`).
    pub targets: Vec<String>,
    pub all_targets: bool,
    /// Whether `local` is a target for it.
    pub local: bool,
    #[serde(serialize_with = "crate::workspace::serialize_permission")]
    pub permission: Permission,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl Token {
    /// The section its calls work in (working directories, workspaces, the audit trail): the
    /// token's name, so a token issued again under the name works where the old one did.
    pub fn section(&self) -> String {
        format!("mcp:{}", self.name)
    }

    /// What this very token holds in a serving process — its interactive shells, its resolved
    /// places, its share of the endpoint's bounds — is keyed by this: its section and its id,
    /// so a new token under a revoked one's name starts with none of it.
    pub fn key(&self) -> String {
        format!("{}{KEY_ID}{}", self.section(), self.id)
    }

    /// Whether it has expired at `now`.
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// Whether it may use `target` (`local` for the service's own machine). A target must
    /// also be approved when used; that is checked then.
    pub fn may_use(&self, target: &str) -> bool {
        let scope = crate::authz::TokenScope {
            local: self.local,
            all_targets: self.all_targets,
            targets: &self.targets,
        };
        crate::authz::use_target(scope, target)
    }
}

/// What `create` is asked for.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub name: String,
    pub targets: Vec<String>,
    pub all_targets: bool,
    pub local: bool,
    pub permission: Permission,
    pub expires_at: Option<DateTime<Utc>>,
}

/// Why a token was not accepted. Says nothing about which part failed beyond that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no valid bearer token")]
    Invalid,
    #[error("the token has expired")]
    Expired,
}

/// A fresh token: (the token to print once, its id, its SHA-256).
fn mint() -> anyhow::Result<(String, String, Vec<u8>)> {
    use ring::rand::SecureRandom;
    let rng = ring::rand::SystemRandom::new();
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    rng.fill(&mut id)
        .and_then(|()| rng.fill(&mut secret))
        .map_err(|_| anyhow::anyhow!("the system random source failed"))?;
    let token = format!("{PREFIX}{}_{}", hex::encode(id), hex::encode(secret));
    let hash = digest(&token);
    Ok((token, hex::encode(id), hash))
}

/// The SHA-256 of a whole token (what is stored).
pub fn digest(token: &str) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
        .as_ref()
        .to_vec()
}

/// A token name: 1–64 of `A-Z a-z 0-9 . _ -`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Creates a token and audits it; returns the token, which is never shown again.
pub async fn create(db: &PgPool, new: &NewToken, actor: &str) -> anyhow::Result<String> {
    anyhow::ensure!(
        valid_name(&new.name),
        "a token name is 1-64 letters, digits, `.`, `_` or `-`"
    );
    let unknown: Vec<String> = sqlx::query_scalar(
        "SELECT t FROM unnest($1::text[]) t WHERE t NOT IN (SELECT alias FROM targets)",
    )
    .bind(&new.targets)
    .fetch_all(db)
    .await?;
    anyhow::ensure!(
        unknown.is_empty(),
        "no such target: {} (`sshmode target list` shows them)",
        unknown.join(", ")
    );
    let (token, id, hash) = mint()?;
    let mut tx = db.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO mcp_tokens (name, token_id, token_hash, targets, all_targets, local,
                                 permission, expires_at, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (name) DO NOTHING",
    )
    .bind(&new.name)
    .bind(&id)
    .bind(&hash)
    .bind(&new.targets)
    .bind(new.all_targets)
    .bind(new.local)
    .bind(new.permission.as_str())
    .bind(new.expires_at)
    .bind(actor)
    .execute(&mut *tx)
    .await?;
    anyhow::ensure!(
        inserted.rows_affected() == 1,
        "a token named `{}` exists; revoke it first",
        new.name
    );
    crate::audit::record(
        &mut tx,
        crate::audit::Entry {
            actor,
            action: "mcp.token.create",
            subject: &new.name,
            detail: serde_json::json!({
                "targets": new.targets,
                "all_targets": new.all_targets,
                "local": new.local,
                "permission": new.permission.as_str(),
                "expires_at": new.expires_at,
            }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(token)
}

/// Every token, by name.
pub async fn list(db: &PgPool) -> sqlx::Result<Vec<Token>> {
    let rows = sqlx::query(
        "SELECT name, token_id, targets, all_targets, local, permission, expires_at, created_at
         FROM mcp_tokens ORDER BY name",
    )
    .fetch_all(db)
    .await?;
    rows.iter().map(from_row).collect()
}

/// Revokes (deletes) a token, audited; `false` when there is none of that name.
pub async fn revoke(db: &PgPool, name: &str, actor: &str) -> sqlx::Result<bool> {
    let mut tx = db.begin().await?;
    let gone = sqlx::query("DELETE FROM mcp_tokens WHERE name = $1")
        .bind(name)
        .execute(&mut *tx)
        .await?
        .rows_affected()
        == 1;
    if gone {
        crate::audit::record(
            &mut tx,
            crate::audit::Entry {
                actor,
                action: "mcp.token.revoke",
                subject: name,
                detail: serde_json::json!({}),
            },
        )
        .await?;
    }
    tx.commit().await?;
    Ok(gone)
}

/// Which of the token ids `ids` name a token that still exists and has not expired at `now`.
pub async fn live(
    db: &PgPool,
    ids: &[String],
    now: DateTime<Utc>,
) -> sqlx::Result<std::collections::HashSet<String>> {
    let live: Vec<String> = sqlx::query_scalar(
        "SELECT token_id FROM mcp_tokens
         WHERE token_id = ANY($1) AND (expires_at IS NULL OR expires_at > $2)",
    )
    .bind(ids)
    .bind(now)
    .fetch_all(db)
    .await?;
    Ok(live.into_iter().collect())
}

fn from_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Token> {
    Ok(Token {
        name: r.try_get("name")?,
        id: r.try_get("token_id")?,
        targets: r.try_get("targets")?,
        all_targets: r.try_get("all_targets")?,
        local: r.try_get("local")?,
        permission: Permission::parse(r.try_get("permission")?).unwrap_or(Permission::Read),
        expires_at: r.try_get("expires_at")?,
        created_at: r.try_get("created_at")?,
    })
}

/// The token a request's `Authorization: Bearer …` value names, if it is valid now.
pub async fn check(
    db: &PgPool,
    bearer: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<Result<Token, Refusal>> {
    let Some((id, secret)) = bearer.strip_prefix(PREFIX).and_then(|t| t.split_once('_')) else {
        return Ok(Err(Refusal::Invalid));
    };
    if id.len() != 16 || secret.len() != 64 {
        return Ok(Err(Refusal::Invalid));
    }
    let row = sqlx::query(
        "SELECT name, token_id, token_hash, targets, all_targets, local, permission, expires_at,
                created_at
         FROM mcp_tokens WHERE token_id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?;
    let Some(row) = row else {
        return Ok(Err(Refusal::Invalid));
    };
    let stored: Vec<u8> = row.try_get("token_hash")?;
    if !bool::from(digest(bearer).ct_eq(&stored)) {
        return Ok(Err(Refusal::Invalid));
    }
    let token = from_row(&row)?;
    if token.expired(now) {
        return Ok(Err(Refusal::Expired));
    }
    Ok(Ok(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_has_its_shape_and_its_hash_is_of_the_whole_token() {
        let (token, id, hash) = mint().unwrap();
        let rest = token.strip_prefix(PREFIX).unwrap();
        let (i, secret) = rest.split_once('_').unwrap();
        assert_eq!(i, id);
        assert_eq!((i.len(), secret.len()), (16, 64));
        assert_eq!(hash, digest(&token));
        assert_ne!(mint().unwrap().0, token);
    }

    #[test]
    fn names_are_short_and_plain() {
        assert!(valid_name("laptop-ide_1.x"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name("a:b"));
        assert!(!valid_name(&"a".repeat(65)));
    }

    #[test]
    fn local_needs_its_flag_and_all_covers_only_targets() {
        let t = Token {
            name: "t".into(),
            id: "0123456789abcdef".into(),
            targets: vec!["web".into()],
            all_targets: false,
            local: false,
            permission: Permission::ReadWrite,
            expires_at: None,
            created_at: Utc::now(),
        };
        assert!(t.may_use("web"));
        assert!(!t.may_use("db"));
        assert!(!t.may_use("local"));
        let all = Token {
            all_targets: true,
            ..t.clone()
        };
        assert!(all.may_use("db"));
        assert!(!all.may_use("local"));
        assert!(Token { local: true, ..t }.may_use("local"));
    }
}
