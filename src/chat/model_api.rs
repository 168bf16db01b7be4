//! The model's side of SSH Mode: what the agent's `ssh_mode` tool calls. Every answer is a
//! short text the model can act on or pass on; a refusal says what a user can do about it.
//! Goes through the same operations and the same authorisation function as users' commands.
//! Never: returns a secret, a key path or a vault record.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::change::{self, Ctl};
use super::render;
use crate::authz::Actor;

/// Where the model asks from.
#[derive(Debug, Clone, Copy)]
pub struct Here<'a> {
    pub section: &'a str,
    pub chat_id: &'a str,
}

/// `status`: the section's backend and live grants.
pub async fn status(db: &PgPool, now: DateTime<Utc>, here: Here<'_>) -> anyhow::Result<String> {
    let r = change::report(db, here.section, now).await?;
    Ok(render::status(&r, now))
}

/// `list_targets`: the targets this chat may use.
pub async fn list_targets(db: &PgPool, here: Here<'_>) -> anyhow::Result<String> {
    let targets = change::visible(db, here.chat_id).await?;
    Ok(render::list(&targets))
}

/// `request_use(alias)`: binds this section to `alias` only under a live grant covering it; a
/// model-made binding never replaces a sticky one.
pub async fn request_use(
    db: &PgPool,
    now: DateTime<Utc>,
    yolo_ttl: std::time::Duration,
    here: Here<'_>,
    alias: &str,
) -> anyhow::Result<String> {
    if !crate::target::valid_alias(alias) {
        return Ok(format!(
            "`{}` is not a target alias. Use list_targets to see them.",
            alias.chars().take(64).collect::<String>()
        ));
    }
    let ctl = Ctl { db, now, yolo_ttl };
    // Who may bind by the kind of section is a user's question; the model's binds rest on
    // grants, which only who may bind the section can give.
    let conv = change::Conversation::Thread;
    Ok(
        match change::bind(ctl, Actor::Model, here.section, conv, here.chat_id, alias).await? {
            Ok(b) if b.unchanged => format!(
                "This thread already runs on `{}` ({}).",
                b.alias, b.destination
            ),
            Ok(b) => format!(
                "This thread now runs on `{}` ({}); task tools act there. Use request_local to return.",
                b.alias, b.destination
            ),
            Err(r) => r.to_string(),
        },
    )
}

/// `request_local`: clears a model-made binding, never a sticky one.
pub async fn request_local(
    db: &PgPool,
    now: DateTime<Utc>,
    here: Here<'_>,
) -> anyhow::Result<String> {
    let ctl = Ctl {
        db,
        now,
        yolo_ttl: std::time::Duration::from_secs(1),
    };
    Ok(
        match change::release(ctl, Actor::Model, here.section).await? {
            Ok(Some(b)) => format!("Left `{}`; this thread runs locally again.", b.alias),
            Ok(None) => "This thread already runs locally.".to_string(),
            Err(r) => r.to_string(),
        },
    )
}
