//! Skills: named Markdown runbooks stored in Postgres (`skills`), listed, viewed and managed
//! (create, update, delete) by the agent's `skills` tool. A skill belongs to the chat whose
//! model wrote it and is visible only there, because its text goes back to a model as
//! guidance: one chat's injected text must not steer another chat's agent. An admin makes a
//! skill visible in every chat with `sshmode skill promote <name>` ([`promote`]); a promoted
//! skill is read-only to the model. Every change and every refusal of a shared skill is
//! audited. The built-in **SSH Mode** skill ([`BUILTIN_NAME`]) ships with the binary, is
//! listed first in every chat, and can never be created, overwritten or deleted.
//!
//! Never: lists, shows or changes a skill for a chat other than its own unless an admin
//! promoted it (every query names the chat); lets the model change a promoted skill; stores a
//! skill the secret filter refuses; lets a stored row shadow the built-in skill (the table
//! CHECKs the name too); touches a backend.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgPool, Row};

use crate::audit;

/// The built-in skill's name.
pub const BUILTIN_NAME: &str = "ssh-mode";
/// Its one-line description.
pub const BUILTIN_DESCRIPTION: &str = "How to work on SSH targets: status, verifying, threads, asking for /ssh use or yolo, returning to local, checking tools run remotely, keeping memory and skills up to date.";
/// Its text, shipped with the binary.
pub const BUILTIN_BODY: &str = include_str!("ssh_mode_skill.md");

/// Longest name, description and body, in characters.
pub const NAME_MAX: usize = 64;
pub const DESCRIPTION_MAX: usize = 200;
pub const BODY_MAX: usize = 16_000;
/// Most stored skills (besides the built-in one).
pub const SKILLS_MAX: i64 = 200;
/// Most skills one chat keeps, so that no chat can use up the deployment's room.
pub const SKILLS_PER_CHAT: i64 = 50;

/// Who can see a skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    /// Only the chat whose model wrote it.
    Chat(String),
    /// Every chat: the built-in skill, or one an admin promoted.
    Shared,
    /// No chat: written before skills were scoped, by a chat no record names; an admin may
    /// promote it.
    Hidden,
}

impl Visibility {
    fn of(chat_id: Option<String>, promoted: bool) -> Visibility {
        match (promoted, chat_id) {
            (true, _) => Visibility::Shared,
            (false, Some(c)) => Visibility::Chat(c),
            (false, None) => Visibility::Hidden,
        }
    }

    /// `chat oc_…`, `all chats` or `hidden`.
    pub fn describe(&self) -> String {
        match self {
            Visibility::Chat(c) => format!("chat {c}"),
            Visibility::Shared => "all chats".into(),
            Visibility::Hidden => "hidden".into(),
        }
    }
}

/// Whose view of the skills: one chat's (the model's) or the operator's (the CLI: all of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Viewer<'a> {
    Chat(&'a str),
    Operator,
}

impl Viewer<'_> {
    /// The chat a query is limited to; `None` for the operator.
    fn chat(self) -> Option<String> {
        match self {
            Viewer::Chat(c) => Some(c.to_string()),
            Viewer::Operator => None,
        }
    }
}

/// Rows a viewer sees: `$1` is the chat, NULL for the operator.
const VISIBLE: &str = "($1::text IS NULL OR chat_id = $1 OR promoted_at IS NOT NULL)";

/// A skill's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub name: String,
    pub description: String,
    pub builtin: bool,
    pub scope: Visibility,
}

/// A whole skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub body: String,
    pub builtin: bool,
    pub scope: Visibility,
    pub updated_by: String,
    pub updated_at: Option<DateTime<Utc>>,
    /// Who promoted it, when an admin did.
    pub promoted_by: Option<String>,
}

/// What [`promote`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promoted {
    /// The scope the skill had before.
    pub before: Visibility,
}

/// What `manage` may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Update,
    Delete,
}

impl Op {
    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "create" => Op::Create,
            "update" => Op::Update,
            "delete" => Op::Delete,
            _ => return None,
        })
    }

    fn word(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Update => "update",
            Op::Delete => "delete",
        }
    }
}

/// Why a skill was not changed (shown to the model).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkillError {
    #[error(
        "`ssh-mode` is the built-in SSH Mode skill: it is read-only and cannot be created, overwritten or deleted; create a skill under another name"
    )]
    Builtin,
    #[error(
        "a skill name is 1 to {NAME_MAX} characters of a-z, 0-9 and `-`, starting with a letter or digit"
    )]
    BadName,
    #[error("the {0} is too long: at most {1} characters")]
    TooLong(&'static str, usize),
    #[error("the {0} is required for {1}")]
    Missing(&'static str, &'static str),
    #[error("there is no skill `{0}`")]
    NotFound(String),
    #[error("a skill `{0}` exists already; use update")]
    Exists(String),
    #[error(
        "the skill `{0}` is shared with every chat by an admin: it is read-only; create a skill under another name instead"
    )]
    Shared(String),
    #[error("the name `{0}` is taken by another chat's skill; choose another name")]
    Taken(String),
    #[error("the deployment already keeps {SKILLS_MAX} skills; delete one first")]
    Full,
    #[error("this chat already keeps {SKILLS_PER_CHAT} skills; delete one first")]
    ChatFull,
}

/// Whether `name` is a valid skill name.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= NAME_MAX
        && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// The skills `viewer` sees: the built-in one first, then the stored ones by name.
pub async fn list(db: &PgPool, viewer: Viewer<'_>) -> anyhow::Result<Vec<Summary>> {
    let rows = sqlx::query(&format!(
        "SELECT name, description, chat_id, promoted_at IS NOT NULL AS promoted FROM skills \
         WHERE {VISIBLE} ORDER BY name LIMIT $2"
    ))
    .bind(viewer.chat())
    .bind(SKILLS_MAX)
    .fetch_all(db)
    .await?;
    let mut out = vec![Summary {
        name: BUILTIN_NAME.into(),
        description: BUILTIN_DESCRIPTION.into(),
        builtin: true,
        scope: Visibility::Shared,
    }];
    out.extend(rows.iter().map(|r| Summary {
        name: r.get("name"),
        description: r.get("description"),
        builtin: false,
        scope: Visibility::of(r.get("chat_id"), r.get("promoted")),
    }));
    Ok(out)
}

/// One skill by name, if `viewer` may see it.
pub async fn view(db: &PgPool, viewer: Viewer<'_>, name: &str) -> anyhow::Result<Option<Skill>> {
    if name == BUILTIN_NAME {
        return Ok(Some(Skill {
            name: BUILTIN_NAME.into(),
            description: BUILTIN_DESCRIPTION.into(),
            body: BUILTIN_BODY.into(),
            builtin: true,
            scope: Visibility::Shared,
            updated_by: "sshmode".into(),
            updated_at: None,
            promoted_by: None,
        }));
    }
    let row = sqlx::query(&format!(
        "SELECT name, description, body, updated_by, updated_at, chat_id, promoted_by, \
         promoted_at IS NOT NULL AS promoted FROM skills WHERE name = $2 AND {VISIBLE}"
    ))
    .bind(viewer.chat())
    .bind(name)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| Skill {
        name: r.get("name"),
        description: r.get("description"),
        body: r.get("body"),
        builtin: false,
        scope: Visibility::of(r.get("chat_id"), r.get("promoted")),
        updated_by: r.get("updated_by"),
        updated_at: Some(r.get("updated_at")),
        promoted_by: r.get("promoted_by"),
    }))
}

/// Checks a change before the secret filter and the store see it.
pub fn check(
    op: Op,
    name: &str,
    description: Option<&str>,
    body: Option<&str>,
) -> Result<(), SkillError> {
    if name == BUILTIN_NAME {
        return Err(SkillError::Builtin);
    }
    if !valid_name(name) {
        return Err(SkillError::BadName);
    }
    if op == Op::Create {
        if body.is_none_or(|b| b.trim().is_empty()) {
            return Err(SkillError::Missing("body", "create"));
        }
        if description.is_none_or(|d| d.trim().is_empty()) {
            return Err(SkillError::Missing("description", "create"));
        }
    }
    if op == Op::Update && body.is_none() && description.is_none() {
        return Err(SkillError::Missing("body or description", "update"));
    }
    if description.is_some_and(|d| d.chars().count() > DESCRIPTION_MAX) {
        return Err(SkillError::TooLong("description", DESCRIPTION_MAX));
    }
    if body.is_some_and(|b| b.chars().count() > BODY_MAX) {
        return Err(SkillError::TooLong("body", BODY_MAX));
    }
    Ok(())
}

/// Applies a checked change for the model of `chat_id` (audited as
/// `skill.create|update|delete` in the same transaction). A created skill belongs to
/// `chat_id`; only that chat's unpromoted skills can be updated or deleted, and an attempt on a
/// promoted one is refused and audited.
#[allow(clippy::too_many_arguments)]
pub async fn manage(
    db: &PgPool,
    actor: &str,
    chat_id: &str,
    section: &str,
    op: Op,
    name: &str,
    description: Option<&str>,
    body: Option<&str>,
) -> anyhow::Result<Result<(), SkillError>> {
    if let Err(e) = check(op, name, description, body) {
        return Ok(Err(e));
    }
    let description = description.map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "));
    let action = match op {
        Op::Create => "skill.create",
        Op::Update => "skill.update",
        Op::Delete => "skill.delete",
    };
    let mut tx = db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('skills'))")
        .execute(&mut *tx)
        .await?;
    let changed = match op {
        Op::Create => {
            let (count, mine): (i64, i64) =
                sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE chat_id = $1) FROM skills")
                    .bind(chat_id)
                    .fetch_one(&mut *tx)
                    .await?;
            if mine >= SKILLS_PER_CHAT {
                return Ok(Err(SkillError::ChatFull));
            }
            if count >= SKILLS_MAX {
                return Ok(Err(SkillError::Full));
            }
            sqlx::query(
                "INSERT INTO skills (name, description, body, updated_by, chat_id) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO NOTHING",
            )
            .bind(name)
            .bind(&description)
            .bind(body)
            .bind(actor)
            .bind(chat_id)
            .execute(&mut *tx)
            .await?
            .rows_affected()
        }
        Op::Update => sqlx::query(
            "UPDATE skills SET description = COALESCE($2, description), body = COALESCE($3, body), \
             updated_by = $4, updated_at = now() \
             WHERE name = $1 AND chat_id = $5 AND promoted_at IS NULL",
        )
        .bind(name)
        .bind(&description)
        .bind(body)
        .bind(actor)
        .bind(chat_id)
        .execute(&mut *tx)
        .await?
        .rows_affected(),
        Op::Delete => sqlx::query(
            "DELETE FROM skills WHERE name = $1 AND chat_id = $2 AND promoted_at IS NULL",
        )
        .bind(name)
        .bind(chat_id)
        .execute(&mut *tx)
        .await?
        .rows_affected(),
    };
    if changed == 0 {
        // Why not: the existing row's scope as this chat may learn it.
        let existing: Option<(Option<String>, bool)> =
            sqlx::query_as("SELECT chat_id, promoted_at IS NOT NULL FROM skills WHERE name = $1")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
        let err = match (op, existing) {
            (_, Some((_, true))) => SkillError::Shared(name.into()),
            (Op::Create, Some((Some(c), false))) if c == chat_id => SkillError::Exists(name.into()),
            (Op::Create, Some(_)) => SkillError::Taken(name.into()),
            _ => SkillError::NotFound(name.into()),
        };
        if matches!(err, SkillError::Shared(_)) {
            audit::record_chat(
                &mut tx,
                audit::ChatEntry {
                    actor,
                    action,
                    section: Some(section),
                    target: None,
                    outcome: "refused",
                    detail: json!({"skill": name, "op": op.word(), "chat": chat_id,
                                   "reason": "promoted skills are read-only to the model"}),
                },
            )
            .await?;
            tx.commit().await?;
        }
        return Ok(Err(err));
    }
    audit::record_chat(
        &mut tx,
        audit::ChatEntry {
            actor,
            action,
            section: Some(section),
            target: None,
            outcome: "ok",
            detail: json!({"skill": name, "op": op.word(), "chat": chat_id,
                           "body_chars": body.map(|b| b.chars().count())}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(()))
}

/// Makes the skill `name` visible in every chat (an admin's action, audited as
/// `skill.promote`; a name that is no skill is refused and audited too). Promoting a promoted
/// skill changes nothing.
pub async fn promote(
    db: &PgPool,
    name: &str,
    actor: &str,
) -> anyhow::Result<Result<Promoted, SkillError>> {
    if name == BUILTIN_NAME {
        return Ok(Err(SkillError::Builtin));
    }
    let mut tx = db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('skills'))")
        .execute(&mut *tx)
        .await?;
    let row: Option<(Option<String>, bool)> = sqlx::query_as(
        "SELECT chat_id, promoted_at IS NOT NULL FROM skills WHERE name = $1 FOR UPDATE",
    )
    .bind(name)
    .fetch_optional(&mut *tx)
    .await?;
    let shown: String = name.chars().take(NAME_MAX).collect();
    let Some((chat_id, promoted)) = row else {
        audit::record_chat(
            &mut tx,
            audit::ChatEntry {
                actor,
                action: "skill.promote",
                section: None,
                target: None,
                outcome: "refused",
                detail: json!({"skill": shown, "reason": "no such skill"}),
            },
        )
        .await?;
        tx.commit().await?;
        return Ok(Err(SkillError::NotFound(shown)));
    };
    if !promoted {
        sqlx::query("UPDATE skills SET promoted_by = $2, promoted_at = now() WHERE name = $1")
            .bind(name)
            .bind(actor)
            .execute(&mut *tx)
            .await?;
    }
    audit::record_chat(
        &mut tx,
        audit::ChatEntry {
            actor,
            action: "skill.promote",
            // The chat's own section, so the chat's audit trail shows it.
            section: chat_id.as_deref(),
            target: None,
            outcome: if promoted { "unchanged" } else { "ok" },
            detail: json!({"skill": name, "chat": chat_id}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(Promoted {
        before: Visibility::of(chat_id, promoted),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_skill_covers_its_topics() {
        for needle in [
            "/ssh list",
            "/ssh status",
            "key path",
            "thread",
            "/ssh use",
            "yolo",
            "/ssh local",
            "hostname",
            "id -un",
            "memory",
            "skills",
        ] {
            assert!(BUILTIN_BODY.contains(needle), "{needle}");
        }
    }

    #[test]
    fn the_builtin_skill_is_never_managed() {
        for op in [Op::Create, Op::Update, Op::Delete] {
            assert_eq!(
                check(op, BUILTIN_NAME, Some("d"), Some("b")),
                Err(SkillError::Builtin)
            );
        }
    }

    #[test]
    fn names_and_sizes() {
        assert!(valid_name("deploy-web-2"));
        for bad in ["", "-x", "Deploy", "a b", "a/b", &"x".repeat(65)] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert_eq!(
            check(Op::Create, "x", Some("d"), None),
            Err(SkillError::Missing("body", "create"))
        );
        assert_eq!(
            check(Op::Create, "x", Some("d"), Some(&"b".repeat(BODY_MAX + 1))),
            Err(SkillError::TooLong("body", BODY_MAX))
        );
        assert_eq!(check(Op::Delete, "x", None, None), Ok(()));
    }
}
