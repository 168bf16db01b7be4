//! A target's approval policy: who answers its approval cards (`admins`, or the requester
//! too) and what a command the guard asks about does there (`ask`, `refuse`, `allow`). Set by
//! `sshmode target set --approvers/--risky`, audited as `target.set`.

use serde_json::json;
use sqlx::{PgPool, Row};

use super::TargetError;
use crate::audit;
use crate::config::Risky;

/// A target's approval policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// `admins` (default) or `requester`.
    pub approvers: String,
    pub risky: Risky,
}

/// The policy of `alias`.
pub async fn get(db: &PgPool, alias: &str) -> Result<Policy, TargetError> {
    let r = sqlx::query("SELECT approvers, risky FROM targets WHERE alias = $1")
        .bind(alias)
        .fetch_optional(db)
        .await?
        .ok_or_else(|| TargetError::NotFound(alias.to_string()))?;
    Ok(Policy {
        approvers: r.get("approvers"),
        risky: r.get::<String, _>("risky").parse().unwrap_or(Risky::Ask),
    })
}

/// Changes what is given of the policy of `alias`; audited with before and after.
pub async fn set(
    db: &PgPool,
    alias: &str,
    approvers: Option<&str>,
    risky: Option<Risky>,
    actor: &str,
) -> Result<Policy, TargetError> {
    if let Some(a) = approvers
        && a != "admins"
        && a != "requester"
    {
        return Err(TargetError::Invalid(format!(
            "`{a}` is not one of admins, requester"
        )));
    }
    let mut tx = db.begin().await?;
    let before = sqlx::query("SELECT approvers, risky FROM targets WHERE alias = $1 FOR UPDATE")
        .bind(alias)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| TargetError::NotFound(alias.to_string()))?;
    let (old_a, old_r): (String, String) = (before.get("approvers"), before.get("risky"));
    let new_a = approvers.map(str::to_string).unwrap_or(old_a.clone());
    let new_r = risky
        .map(|r| r.as_str().to_string())
        .unwrap_or(old_r.clone());
    sqlx::query(
        "UPDATE targets SET approvers = $2, risky = $3, updated_at = now() WHERE alias = $1",
    )
    .bind(alias)
    .bind(&new_a)
    .bind(&new_r)
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        audit::Entry {
            actor,
            action: "target.set",
            subject: alias,
            detail: json!({
                "approvers": { "from": old_a, "to": new_a },
                "risky": { "from": old_r, "to": new_r },
            }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Policy {
        approvers: new_a,
        risky: new_r.parse().unwrap_or(Risky::Ask),
    })
}
