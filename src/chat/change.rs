//! The operations of SSH Mode, shared by the users' commands and the model's requests: bind,
//! release, grant, revoke, decide, and the reports (status, list). Each one loads the facts
//! and the section's state in one transaction, asks [`authz`] (the act's function), applies
//! the permit and writes its audit row (refusals included) in that same transaction
//! (invariant 5).
//! Never: answers anyone (callers turn results into words), or decides by itself who may act.

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;

use super::{binding, grant};
use crate::audit;
use crate::authz::{self, Actor, Bind, Binding, Denial, Grant, Kind, Section};
use crate::target::{self, Status, Target, allow};

/// What an operation needs: the database, the time of the request, the grant lifetime.
#[derive(Clone, Copy)]
pub struct Ctl<'a> {
    pub db: &'a PgPool,
    pub now: DateTime<Utc>,
    pub yolo_ttl: std::time::Duration,
}

/// What kind of conversation a section is, for who may bind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversation {
    /// A thread (its owner may bind it; anyone while it has none).
    Thread,
    /// A group chat itself: admins only.
    Group,
    /// A one-to-one chat itself: its user.
    Direct,
}

/// The section as [`authz`] sees it; a thread's owner is read in the caller's transaction
/// (after the section's lock).
async fn section_facts(
    conn: &mut sqlx::PgConnection,
    section: &str,
    conv: Conversation,
) -> sqlx::Result<(Conversation, Option<String>)> {
    Ok(match conv {
        Conversation::Thread => (conv, binding::owner(conn, section).await?),
        _ => (conv, None),
    })
}

fn as_section(facts: &(Conversation, Option<String>)) -> Section<'_> {
    match facts {
        (Conversation::Thread, owner) => Section::Thread {
            owner: owner.as_deref(),
        },
        (Conversation::Group, _) => Section::Group,
        (Conversation::Direct, _) => Section::Direct,
    }
}

/// A binding that was made (or already held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub alias: String,
    /// `user@host`.
    pub destination: String,
    /// The target it replaced, if it switched.
    pub replaced: Option<String>,
    pub unchanged: bool,
}

async fn refuse(
    conn: &mut sqlx::PgConnection,
    actor: Actor<'_>,
    action: &str,
    section: Option<&str>,
    alias: Option<&str>,
    r: &Denial,
) -> sqlx::Result<()> {
    audit::record_chat(
        conn,
        audit::ChatEntry {
            actor: actor.name(),
            action,
            section,
            target: alias,
            outcome: "refused",
            detail: match r {
                Denial::Jump { jump, .. } => json!({ "reason": r.code(), "jump": jump }),
                _ => json!({ "reason": r.code() }),
            },
        },
    )
    .await
}

/// Checks, without changing anything, that `actor` could bind a *new* section of `chat_id`
/// to `alias` (a `/ssh use` in a parent chat, before its thread exists). A refusal is audited.
pub async fn check_use(
    ctl: Ctl<'_>,
    actor: Actor<'_>,
    section: &str,
    chat_id: &str,
    alias: &str,
) -> anyhow::Result<Result<allow::Facts, Denial>> {
    let mut tx = ctl.db.begin().await?;
    let facts = allow::facts(&mut tx, alias, chat_id).await?;
    // The thread this opens is new: nobody owns it yet.
    let asked = Bind {
        alias,
        target: facts.as_ref(),
        section: Section::Thread { owner: None },
        current: None,
        grants: &[],
    };
    let out = match authz::bind(actor, asked) {
        Ok(permit) => Ok(permit.target().clone()),
        Err(r) => {
            refuse(
                &mut tx,
                actor,
                "binding.set",
                Some(section),
                Some(alias),
                &r,
            )
            .await?;
            Err(r)
        }
    };
    tx.commit().await?;
    Ok(out)
}

/// Binds `section` (a `conv` of chat `chat_id`) to `alias` for `actor`. A user who binds a
/// thread nobody owns becomes its owner. (The model's binds rest on grants; `conv` is a
/// user's question.)
pub async fn bind(
    ctl: Ctl<'_>,
    actor: Actor<'_>,
    section: &str,
    conv: Conversation,
    chat_id: &str,
    alias: &str,
) -> anyhow::Result<Result<Bound, Denial>> {
    let mut tx = ctl.db.begin().await?;
    let current = binding::current(&mut tx, section, ctl.now).await?;
    let facts = allow::facts(&mut tx, alias, chat_id).await?;
    let grants = grant::live(&mut tx, section, ctl.now).await?;
    let sect = section_facts(&mut tx, section, conv).await?;
    let asked = Bind {
        alias,
        target: facts.as_ref(),
        section: as_section(&sect),
        current: current.as_ref(),
        grants: &grants,
    };
    let out = match authz::bind(actor, asked) {
        Err(r) => {
            refuse(
                &mut tx,
                actor,
                "binding.set",
                Some(section),
                Some(alias),
                &r,
            )
            .await?;
            Err(r)
        }
        Ok(permit) => {
            let facts = permit.target();
            let replaced = current
                .as_ref()
                .filter(|c| c.alias != alias)
                .map(|c| c.alias.clone());
            let unchanged = matches!(permit, authz::Permit::AlreadyBound { .. });
            if let authz::Permit::Bind { kind, grant_id, .. } = permit {
                // The same target by a user turns a model-made binding sticky; that is a change.
                let b = Binding {
                    section: section.to_string(),
                    alias: alias.to_string(),
                    kind,
                    owner: match actor {
                        Actor::User { open_id, .. } => open_id.to_string(),
                        Actor::Model => "model".to_string(),
                    },
                    bound_at: ctl.now,
                    grant_id,
                    chat_id: Some(chat_id.to_string()),
                    generation: Some(facts.generation),
                };
                binding::set(&mut tx, &b).await?;
                if let (Actor::User { open_id, .. }, (Conversation::Thread, None)) = (actor, &sect)
                {
                    binding::claim_owner(&mut tx, section, open_id, binding::Owned::Bound, ctl.now)
                        .await?;
                }
                audit::record_chat(
                    &mut tx,
                    audit::ChatEntry {
                        actor: actor.name(),
                        action: if replaced.is_some() {
                            "binding.switch"
                        } else {
                            "binding.set"
                        },
                        section: Some(section),
                        target: Some(alias),
                        outcome: "ok",
                        detail: json!({ "kind": kind.as_str(), "grant": grant_id, "from": replaced }),
                    },
                )
                .await?;
            }
            Ok(Bound {
                alias: alias.to_string(),
                destination: facts.destination.clone(),
                replaced,
                unchanged,
            })
        }
    };
    tx.commit().await?;
    Ok(out)
}

/// Returns `section` to local for `actor`; `Ok(None)` when it was local already.
pub async fn release(
    ctl: Ctl<'_>,
    actor: Actor<'_>,
    section: &str,
) -> anyhow::Result<Result<Option<Binding>, Denial>> {
    let mut tx = ctl.db.begin().await?;
    let current = binding::current(&mut tx, section, ctl.now).await?;
    let out = match authz::release(actor, current.as_ref()) {
        Err(r) => {
            let alias = current.as_ref().map(|c| c.alias.as_str());
            refuse(&mut tx, actor, "binding.release", Some(section), alias, &r).await?;
            Err(r)
        }
        Ok(Some(b)) => {
            let b = b.clone();
            binding::clear(&mut tx, section).await?;
            audit::record_chat(
                &mut tx,
                audit::ChatEntry {
                    actor: actor.name(),
                    action: "binding.release",
                    section: Some(section),
                    target: Some(&b.alias),
                    outcome: "ok",
                    detail: json!({ "kind": b.kind.as_str(), "owner": b.owner }),
                },
            )
            .await?;
            Ok(Some(b))
        }
        Ok(None) => Ok(None),
    };
    tx.commit().await?;
    Ok(out)
}

/// `/ssh yolo on <alias>|all` in `section` (a `conv`).
pub async fn grant_on(
    ctl: Ctl<'_>,
    actor: Actor<'_>,
    section: &str,
    conv: Conversation,
    chat_id: &str,
    alias: Option<&str>,
) -> anyhow::Result<Result<Grant, Denial>> {
    let mut tx = ctl.db.begin().await?;
    binding::current(&mut tx, section, ctl.now).await?;
    let facts = match alias {
        Some(a) => allow::facts(&mut tx, a, chat_id).await?,
        None => None,
    };
    let sect = section_facts(&mut tx, section, conv).await?;
    let out = match authz::grant(actor, alias, facts.as_ref(), as_section(&sect)) {
        Err(r) => {
            refuse(&mut tx, actor, "grant.add", Some(section), alias, &r).await?;
            Err(r)
        }
        Ok(()) => {
            let ttl =
                chrono::Duration::from_std(ctl.yolo_ttl).unwrap_or(chrono::Duration::hours(12));
            let g = grant::open(&mut tx, section, alias, actor.name(), ctl.now, ttl).await?;
            audit::record_chat(
                &mut tx,
                audit::ChatEntry {
                    actor: actor.name(),
                    action: "grant.add",
                    section: Some(section),
                    target: Some(alias.unwrap_or("*")),
                    outcome: "ok",
                    detail: json!({ "grant": g.id, "expires_at": g.expires_at }),
                },
            )
            .await?;
            Ok(g)
        }
    };
    tx.commit().await?;
    Ok(out)
}

/// What `/ssh yolo off` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    pub grants: usize,
    /// The model-made binding it returned to local.
    pub released: Option<String>,
}

/// `/ssh yolo off` in `section`: closes its grants, and returns a model-made binding to local.
pub async fn grant_off(
    ctl: Ctl<'_>,
    actor: Actor<'_>,
    section: &str,
) -> anyhow::Result<Result<Revoked, Denial>> {
    let mut tx = ctl.db.begin().await?;
    let before = binding::current(&mut tx, section, ctl.now).await?;
    let out = match authz::revoke_grants(actor) {
        Err(r) => {
            refuse(&mut tx, actor, "grant.revoke", Some(section), None, &r).await?;
            Err(r)
        }
        Ok(()) => {
            let ids = grant::revoke_all(&mut tx, section, actor.name(), ctl.now).await?;
            // Commands allowed "in this thread" are asked about again.
            crate::turns::call_approval::end_thread_allowances(&mut tx, section).await?;
            audit::record_chat(
                &mut tx,
                audit::ChatEntry {
                    actor: actor.name(),
                    action: "grant.revoke",
                    section: Some(section),
                    target: None,
                    outcome: "ok",
                    detail: json!({ "grants": ids }),
                },
            )
            .await?;
            // The binding the model made under a grant just closed goes with it.
            let after = binding::current(&mut tx, section, ctl.now).await?;
            let released = match (before, after) {
                (Some(b), None) => Some(b.alias),
                _ => None,
            };
            Ok(Revoked {
                grants: ids.len(),
                released,
            })
        }
    };
    tx.commit().await?;
    Ok(out)
}

/// What `/ssh status` shows.
#[derive(Debug, Clone)]
pub struct Report {
    pub binding: Option<Binding>,
    /// The bound target as the registry shows it (no secrets).
    pub target: Option<Target>,
    pub grants: Vec<Grant>,
}

/// The section's state at `now` (releasing what expired, audited).
pub async fn report(db: &PgPool, section: &str, now: DateTime<Utc>) -> anyhow::Result<Report> {
    let mut tx = db.begin().await?;
    let b = binding::current(&mut tx, section, now).await?;
    let grants = grant::live(&mut tx, section, now).await?;
    tx.commit().await?;
    let target = match &b {
        Some(b) => target::get(db, &b.alias).await.ok(),
        None => None,
    };
    Ok(Report {
        binding: b,
        target,
        grants,
    })
}

/// Targets `chat_id` may see, any status (for `/ssh list` and refusals).
pub async fn visible(db: &PgPool, chat_id: &str) -> anyhow::Result<Vec<Target>> {
    Ok(allow::visible_in(db, chat_id).await?)
}

/// Completes a pending `/ssh use` from a parent chat: binds `thread_id` to the target recorded
/// under its root message, unless the thread has a binding already. Idempotent.
pub async fn complete_pending(
    db: &PgPool,
    now: DateTime<Utc>,
    thread_id: &str,
    root_message_id: &str,
) -> anyhow::Result<Option<Binding>> {
    let mut tx = db.begin().await?;
    let Some(p) = binding::take_pending(&mut tx, root_message_id).await? else {
        return Ok(None);
    };
    // The bot opened this thread: its messages are for the agent from now on.
    super::threads::record(
        &mut *tx,
        thread_id,
        &p.chat_id,
        super::threads::Reason::Opened,
        now,
    )
    .await?;
    let current = binding::current(&mut tx, thread_id, now).await?;
    // Who opened the thread owns it (a thread someone bound before keeps its owner).
    binding::claim_owner(&mut tx, thread_id, &p.owner, binding::Owned::Opened, now).await?;
    let out = match current {
        Some(b) => Some(b),
        None => {
            let b = Binding {
                section: thread_id.to_string(),
                alias: p.alias.clone(),
                kind: Kind::Sticky,
                owner: p.owner.clone(),
                bound_at: now,
                grant_id: None,
                chat_id: Some(p.chat_id.clone()),
                generation: p.generation,
            };
            binding::set(&mut tx, &b).await?;
            audit::record_chat(
                &mut tx,
                audit::ChatEntry {
                    actor: &p.owner,
                    action: "binding.set",
                    section: Some(thread_id),
                    target: Some(&p.alias),
                    outcome: "ok",
                    detail: json!({ "kind": "sticky", "chat": p.chat_id, "root": root_message_id }),
                },
            )
            .await?;
            Some(b)
        }
    };
    tx.commit().await?;
    Ok(out)
}

/// An admin's decision on a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    pub fn status(self) -> Status {
        match self {
            Decision::Approve => Status::Approved,
            Decision::Reject => Status::Disabled,
        }
    }
    pub fn word(self) -> &'static str {
        match self {
            Decision::Approve => "approved",
            Decision::Reject => "rejected",
        }
    }
}

/// Approves or rejects `alias` for `actor` (a command in `section`, or a card click with what
/// the card `shown`: then only a target still pending in that generation, and an approval
/// only of the host key shown). The status change is audited by the registry in its
/// transaction; the decision's context (section, outcome) and every refusal are audited here.
pub async fn decide(
    db: &PgPool,
    actor: Actor<'_>,
    alias: &str,
    decision: Decision,
    section: Option<&str>,
    shown: Option<&target::Shown<'_>>,
) -> anyhow::Result<Result<Status, Denial>> {
    if let Err(r) = authz::decide_target(actor) {
        let mut tx = db.begin().await?;
        refuse(&mut tx, actor, "target.decide", section, Some(alias), &r).await?;
        tx.commit().await?;
        return Ok(Err(r));
    }
    let changed = match shown {
        None => target::set_status(db, alias, decision.status(), actor.name())
            .await
            .map(Some),
        Some(shown) => {
            target::decide_shown(db, alias, decision.status(), actor.name(), shown).await
        }
    };
    let prev = match changed {
        Ok(Some(prev)) => prev,
        Ok(None) => {
            let r = Denial::Expired(alias.to_string());
            let mut tx = db.begin().await?;
            refuse(&mut tx, actor, "target.decide", section, Some(alias), &r).await?;
            tx.commit().await?;
            return Ok(Err(r));
        }
        Err(target::TargetError::NotFound(_)) => {
            let r = Denial::UnknownTarget(alias.to_string());
            let mut tx = db.begin().await?;
            refuse(&mut tx, actor, "target.decide", section, Some(alias), &r).await?;
            tx.commit().await?;
            return Ok(Err(r));
        }
        Err(e) => return Err(e.into()),
    };
    let mut tx = db.begin().await?;
    audit::record_chat(
        &mut tx,
        audit::ChatEntry {
            actor: actor.name(),
            action: "target.decide",
            section,
            target: Some(alias),
            outcome: decision.word(),
            detail: json!({ "from": prev.as_str() }),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(Ok(prev))
}
