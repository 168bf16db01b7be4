//! Skills: named Markdown runbooks shared by the whole deployment, stored in Postgres
//! (`skills`), listed, viewed and managed (create, update, delete) by the agent's `skills`
//! tool. Every change is audited. The built-in **SSH Mode** skill ([`BUILTIN_NAME`]) ships
//! with the binary, is listed first, and can never be created, overwritten or deleted.
//!
//! Never: stores a skill the secret filter refuses; lets a stored row shadow the built-in
//! skill (the table CHECKs the name too); touches a backend.

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

/// A skill's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub name: String,
    pub description: String,
    pub builtin: bool,
}

/// A whole skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub body: String,
    pub builtin: bool,
    pub updated_by: String,
    pub updated_at: Option<DateTime<Utc>>,
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
    #[error("the deployment already keeps {SKILLS_MAX} skills; delete one first")]
    Full,
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

/// All skills: the built-in one first, then the stored ones by name.
pub async fn list(db: &PgPool) -> anyhow::Result<Vec<Summary>> {
    let rows = sqlx::query("SELECT name, description FROM skills ORDER BY name LIMIT $1")
        .bind(SKILLS_MAX)
        .fetch_all(db)
        .await?;
    let mut out = vec![Summary {
        name: BUILTIN_NAME.into(),
        description: BUILTIN_DESCRIPTION.into(),
        builtin: true,
    }];
    out.extend(rows.iter().map(|r| Summary {
        name: r.get("name"),
        description: r.get("description"),
        builtin: false,
    }));
    Ok(out)
}

/// One skill by name.
pub async fn view(db: &PgPool, name: &str) -> anyhow::Result<Option<Skill>> {
    if name == BUILTIN_NAME {
        return Ok(Some(Skill {
            name: BUILTIN_NAME.into(),
            description: BUILTIN_DESCRIPTION.into(),
            body: BUILTIN_BODY.into(),
            builtin: true,
            updated_by: "sshmode".into(),
            updated_at: None,
        }));
    }
    let row = sqlx::query(
        "SELECT name, description, body, updated_by, updated_at FROM skills WHERE name = $1",
    )
    .bind(name)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| Skill {
        name: r.get("name"),
        description: r.get("description"),
        body: r.get("body"),
        builtin: false,
        updated_by: r.get("updated_by"),
        updated_at: Some(r.get("updated_at")),
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

/// Applies a checked change (audited as `skill.create|update|delete` in the same
/// transaction).
pub async fn manage(
    db: &PgPool,
    actor: &str,
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
    let mut tx = db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('skills'))")
        .execute(&mut *tx)
        .await?;
    let changed = match op {
        Op::Create => {
            let count: i64 = sqlx::query_scalar("SELECT count(*) FROM skills")
                .fetch_one(&mut *tx)
                .await?;
            if count >= SKILLS_MAX {
                return Ok(Err(SkillError::Full));
            }
            sqlx::query(
                "INSERT INTO skills (name, description, body, updated_by) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(name)
            .bind(&description)
            .bind(body)
            .bind(actor)
            .execute(&mut *tx)
            .await?
            .rows_affected()
        }
        Op::Update => sqlx::query(
            "UPDATE skills SET description = COALESCE($2, description), body = COALESCE($3, body), \
             updated_by = $4, updated_at = now() WHERE name = $1",
        )
        .bind(name)
        .bind(&description)
        .bind(body)
        .bind(actor)
        .execute(&mut *tx)
        .await?
        .rows_affected(),
        Op::Delete => sqlx::query("DELETE FROM skills WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
    };
    if changed == 0 {
        return Ok(Err(match op {
            Op::Create => SkillError::Exists(name.into()),
            _ => SkillError::NotFound(name.into()),
        }));
    }
    audit::record_chat(
        &mut tx,
        audit::ChatEntry {
            actor,
            action: match op {
                Op::Create => "skill.create",
                Op::Update => "skill.update",
                Op::Delete => "skill.delete",
            },
            section: Some(section),
            target: None,
            outcome: "ok",
            detail: json!({"skill": name, "op": op.word(), "body_chars": body.map(|b| b.chars().count())}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(()))
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
