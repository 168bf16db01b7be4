//! Admin approval of targets: a card to each admin (`SSHMODE_ADMINS`, one-to-one) when a
//! target becomes pending, decisions by card click or by `/ssh approve|reject`, and the cards
//! rewritten afterwards to show who decided and when. Owns `approval_cards` and
//! `card_decisions`. Who may decide is [`authz::decide_target`]'s call, through
//! [`change::decide`] (and for a click's toast, [`click_toast`]). Never: answers a click
//! synchronously with anything but a toast (the platform's callback path makes no outbound
//! call).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;
use tokio_util::sync::CancellationToken;

use super::change::{self, Decision};
use super::dispatch::Deps;
use super::port::{TargetApprovalView, TargetCardState, Toast};
use crate::authz::{self, Actor, Denial};
use crate::target::{self, Status};

/// How often pending targets are looked for.
const NOTIFY_EVERY: Duration = Duration::from_secs(5);
/// Most cards sent in one pass.
const NOTIFY_BATCH: i64 = 50;
/// A card claimed but not recorded as sent after this long is sent again (same idempotency
/// key, so Lark does not post it twice).
const RESEND_AFTER_SECS: i64 = 120;

/// A button's value on an approval card: the decision, and what the card shows it on (the
/// target's alias, generation and host key), which is all a click may decide.
pub fn button_value(
    alias: &str,
    generation: i64,
    fingerprint: Option<&str>,
    decision: Decision,
) -> Value {
    serde_json::json!({
        "act": match decision { Decision::Approve => "approve", Decision::Reject => "reject" },
        "alias": alias,
        "gen": generation,
        "fp": fingerprint,
    })
}

/// A button's value, read back.
struct Pressed {
    alias: String,
    decision: Decision,
    generation: Option<i64>,
    /// `Some(None)`: the card showed no host key; `None`: its value does not say.
    fingerprint: Option<Option<String>>,
}

impl Pressed {
    /// What the card showed; `None` when it does not name a generation (nothing to decide).
    fn shown(&self) -> Option<target::Shown<'_>> {
        Some(target::Shown {
            generation: self.generation?,
            fingerprint: self.fingerprint.as_ref().map(|f| f.as_deref()),
        })
    }
}

fn read_value(v: &Value) -> Option<Pressed> {
    let decision = match v.get("act")?.as_str()? {
        "approve" => Decision::Approve,
        "reject" => Decision::Reject,
        _ => return None,
    };
    let alias = v.get("alias")?.as_str()?;
    let fingerprint = match v.get("fp") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(fp) => Some(Some(fp.as_str()?.to_string())),
    };
    target::valid_alias(alias).then(|| Pressed {
        alias: alias.to_string(),
        decision,
        generation: v.get("gen").and_then(Value::as_i64),
        fingerprint,
    })
}

/// What a click by `actor` is told at once (`None` for a button that is not a target
/// approval's: no answer); the decision itself is applied by a worker.
pub fn click_toast(actor: Actor<'_>, value: &Value) -> Option<Toast> {
    let Pressed {
        alias, decision: d, ..
    } = read_value(value)?;
    Some(match authz::decide_target(actor) {
        Ok(()) => Toast {
            kind: "info",
            text: format!(
                "Received: `{alias}` will be {}. The card updates shortly.",
                d.word()
            ),
        },
        Err(refused) => Toast {
            kind: "error",
            text: refused.to_string(),
        },
    })
}

/// A click as the worker applies it.
#[derive(Debug, Clone)]
pub struct Click {
    pub message_id: String,
    pub operator: String,
    pub value: Value,
}

/// Applies a card click once per (message, operator, value): authorised by the operator's
/// open_id (refusals audited), and only on what the card showed — a target still pending in
/// the card's generation, approved only with the host key the card showed. Then the cards
/// are rewritten; a card that no longer applies is rewritten to say it expired.
pub async fn apply_click(deps: &Deps, click: &Click) -> anyhow::Result<()> {
    let Some(pressed) = read_value(&click.value) else {
        return Ok(());
    };
    let value = click.value.to_string();
    let fresh = sqlx::query(
        "INSERT INTO card_decisions (message_id, operator, value, at) VALUES ($1, $2, $3, $4)
         ON CONFLICT DO NOTHING",
    )
    .bind(&click.message_id)
    .bind(&click.operator)
    .bind(&value)
    .bind(deps.clock.now())
    .execute(&deps.db)
    .await?
    .rows_affected()
        == 1;
    if !fresh {
        return Ok(());
    }
    let actor = Actor::User {
        open_id: &click.operator,
        admin: deps.config.is_admin(&click.operator),
    };
    let alias = &pressed.alias;
    // A value without a generation decides nothing: it is treated as expired (generations
    // are positive).
    let shown = pressed.shown().unwrap_or(target::Shown {
        generation: 0,
        fingerprint: None,
    });
    let decided =
        change::decide(&deps.db, actor, alias, pressed.decision, None, Some(&shown)).await;
    let applied = match decided {
        // Decided: a failure to rewrite the cards is reported, but the click has acted and
        // is not applied again.
        Ok(Ok(_)) => return update_cards(deps, alias).await,
        Ok(Err(Denial::Expired(_))) => {
            deps.admins
                .update_target_approval(&click.message_id, &expired_view(&pressed))
                .await
        }
        Ok(Err(_)) => Ok(()),
        Err(e) => Err(e),
    };
    if applied.is_err() {
        // Let the retry act: the click has not taken effect.
        let _ = sqlx::query(
            "DELETE FROM card_decisions WHERE message_id = $1 AND operator = $2 AND value = $3",
        )
        .bind(&click.message_id)
        .bind(&click.operator)
        .bind(&value)
        .execute(&deps.db)
        .await;
    }
    applied
}

/// A card whose click no longer applies, as it is rewritten: what it showed, marked expired.
fn expired_view(p: &Pressed) -> TargetApprovalView {
    TargetApprovalView {
        alias: p.alias.clone(),
        generation: p.generation.unwrap_or_default(),
        destination: None,
        added_by: None,
        fingerprint: p.fingerprint.clone().flatten(),
        state: TargetCardState::Expired,
    }
}

fn view(t: &target::Target, state: TargetCardState) -> TargetApprovalView {
    TargetApprovalView {
        alias: t.alias.clone(),
        generation: t.generation,
        destination: Some(t.destination()),
        added_by: Some(t.added_by.clone()),
        fingerprint: t.host_key.as_ref().map(|k| k.fingerprint.clone()),
        state,
    }
}

/// Rewrites every approval card of `alias`'s current generation to show the last decision
/// recorded in the audit log.
pub async fn update_cards(deps: &Deps, alias: &str) -> anyhow::Result<()> {
    let t = match target::get(&deps.db, alias).await {
        Ok(t) => t,
        Err(target::TargetError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let decided: Option<(String, String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT actor, outcome, at FROM audit_log
         WHERE action = 'target.decide' AND target = $1 AND outcome IN ('approved', 'rejected')
         ORDER BY id DESC LIMIT 1",
    )
    .bind(alias)
    .fetch_optional(&deps.db)
    .await?;
    let Some((by, what, at)) = decided else {
        return Ok(());
    };
    let cards: Vec<(String, String)> = sqlx::query_as(
        "UPDATE approval_cards SET decided_by = $3, decision = $4, decided_at = $5
         WHERE generation = $1 AND alias = $2 AND message_id IS NOT NULL
         RETURNING admin, message_id",
    )
    .bind(t.generation)
    .bind(alias)
    .bind(&by)
    .bind(&what)
    .bind(at)
    .fetch_all(&deps.db)
    .await?;
    let v = view(
        &t,
        TargetCardState::Decided {
            by,
            what,
            when: at.format("%Y-%m-%d %H:%M UTC").to_string(),
        },
    );
    for (_, message_id) in cards {
        deps.admins.update_target_approval(&message_id, &v).await?;
    }
    Ok(())
}

/// Sends an approval card to each admin for each pending target that has none yet. Returns
/// how many were sent.
pub async fn notify_pending(deps: &Deps) -> anyhow::Result<usize> {
    if deps.config.admins.is_empty() {
        return Ok(0);
    }
    let now = deps.clock.now();
    let due = sqlx::query(
        "SELECT t.alias, t.generation, a.admin FROM targets t CROSS JOIN UNNEST($1::text[]) a(admin)
         WHERE t.status = 'pending' AND NOT EXISTS (
             SELECT 1 FROM approval_cards c WHERE c.generation = t.generation AND c.admin = a.admin
               AND (c.message_id IS NOT NULL OR c.created_at > $2))
         ORDER BY t.created_at LIMIT $3",
    )
    .bind(&deps.config.admins)
    .bind(now - chrono::Duration::seconds(RESEND_AFTER_SECS))
    .bind(NOTIFY_BATCH)
    .fetch_all(&deps.db)
    .await?;
    let mut sent = 0;
    for row in due {
        let alias: String = row.get("alias");
        let generation: i64 = row.get("generation");
        let admin: String = row.get("admin");
        // Claim it (another replica may be sending the same card).
        let claimed = sqlx::query(
            "INSERT INTO approval_cards (generation, alias, admin, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (generation, admin) DO UPDATE SET created_at = EXCLUDED.created_at
             WHERE approval_cards.message_id IS NULL AND approval_cards.created_at <= $5",
        )
        .bind(generation)
        .bind(&alias)
        .bind(&admin)
        .bind(now)
        .bind(now - chrono::Duration::seconds(RESEND_AFTER_SECS))
        .execute(&deps.db)
        .await?
        .rows_affected()
            == 1;
        if !claimed {
            continue;
        }
        let t = target::get(&deps.db, &alias).await?;
        if t.status != Status::Pending || t.generation != generation {
            continue;
        }
        let key = format!("approval:{generation}:{admin}");
        let message_id = deps
            .admins
            .send_target_approval(&admin, &view(&t, TargetCardState::Pending), &key)
            .await?;
        sqlx::query(
            "UPDATE approval_cards SET message_id = $3, sent_at = $4 WHERE generation = $1 AND admin = $2",
        )
        .bind(generation)
        .bind(&admin)
        .bind(&message_id)
        .bind(deps.clock.now())
        .execute(&deps.db)
        .await?;
        sent += 1;
    }
    Ok(sent)
}

/// Sends approval cards until `shutdown`; a failed pass is logged and retried next time.
pub async fn run_notifier(deps: Deps, shutdown: CancellationToken) {
    loop {
        // A pass waiting on a slow platform does not hold up shutdown; an interrupted send is
        // made again later under the same idempotency key.
        let pass = tokio::select! {
            r = notify_pending(&deps) => r,
            _ = shutdown.cancelled() => return,
        };
        if let Err(e) = pass {
            tracing::warn!(error = format!("{e:#}"), "sending approval cards failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(NOTIFY_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
