//! A chat's end and a person's leaving, as the platform reports them. The bot removed from a
//! chat, or the chat disbanded ([`bot_left`]): every section of the chat stops and lets go —
//! running turns stopped and waiting ones dropped, interactive shells closed, grants and
//! allowances ended, waiting approvals lapsed, bindings released, schedules paused — and the
//! chat is marked departed, so nothing is posted there again until the bot is added back
//! ([`bot_added`], which starts it clean). A person removed from a chat ([`people_left`]): the
//! grants and allowances they gave there end, the approvals they wait for lapse, and the
//! schedules they created there pause and say why. Every change is audited with `system` as
//! the actor.
//!
//! Every replica follows the chats the bot left ([`follow_departures`]) and closes what it
//! holds of them: interactive shells, and the pooled connections of the targets released.
//!
//! Never: deletes content (retention and `sshmode erase` do); posts in a departed chat.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::AnchorPlace;
use super::binding;
use super::dispatch::Deps;
use super::grant;
use crate::audit::{self, ChatEntry};
use crate::turns::{self, StopOutcome};

/// The actor of what the platform's events end.
const SYSTEM: &str = "system";

/// How the bot left a chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// Removed from it (`im.chat.member.bot.deleted_v1`).
    Removed,
    /// The chat was disbanded (`im.chat.disbanded_v1`).
    Disbanded,
}

impl Gone {
    fn as_str(self) -> &'static str {
        match self {
            Gone::Removed => "removed",
            Gone::Disbanded => "disbanded",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Gone::Removed => "the bot was removed from this chat",
            Gone::Disbanded => "the chat was disbanded",
        }
    }
}

/// What ended when the bot left a chat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Left {
    pub sections: usize,
    pub turns_stopped: usize,
    pub requests_dropped: usize,
    pub shells: usize,
    pub grants: usize,
    pub bindings: usize,
    pub allowances: u64,
    pub approvals: u64,
    pub schedules: usize,
}

/// The sections of `chat_id`: the chat itself, the threads the bot took part in, and every
/// section a turn, a request, a binding or a schedule names in it.
async fn sections_of(db: &PgPool, chat_id: &str) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(
        "SELECT $1::text
         UNION SELECT thread_id FROM bot_threads WHERE chat_id = $1
         UNION SELECT section_id FROM turns WHERE chat_id = $1
         UNION SELECT section_id FROM turn_requests WHERE chat_id = $1
         UNION SELECT section FROM bindings WHERE chat_id = $1
         UNION SELECT section_id FROM schedules WHERE chat_id = $1",
    )
    .bind(chat_id)
    .fetch_all(db)
    .await
}

/// The bot left `chat_id` (`gone`, by `operator`): everything of the chat stops and ends.
/// Idempotent: a second delivery finds nothing more to end.
pub async fn bot_left(
    deps: &Deps,
    chat_id: &str,
    gone: Gone,
    operator: Option<&str>,
) -> anyhow::Result<Left> {
    let now = deps.clock.now();
    crate::lifecycle::mark_departed(&deps.db, chat_id, gone.as_str(), operator, now).await?;
    let sections = sections_of(&deps.db, chat_id).await?;
    let mut left = Left {
        sections: sections.len(),
        ..Left::default()
    };
    let mut released: Vec<String> = Vec::new();
    for s in &sections {
        // As `/stop` twice: the running turn stops, the waiting requests are dropped.
        if let StopOutcome::Stopping { .. } = turns::request_stop(&deps.db, s, SYSTEM).await? {
            left.turns_stopped += 1;
        }
        if let StopOutcome::DroppedWaiting { dropped } =
            turns::request_stop(&deps.db, s, SYSTEM).await?
        {
            left.requests_dropped += dropped.len();
        }
        left.shells += deps.exec.shells.close_section(s, gone.why());
        let mut tx = deps.db.begin().await?;
        let bound = binding::current(&mut tx, s, now).await?;
        for g in grant::revoke_all(&mut tx, s, SYSTEM, now).await? {
            left.grants += 1;
            record(
                &mut tx,
                "grant.revoke",
                s,
                None,
                json!({"grant": g, "reason": gone.why()}),
            )
            .await?;
        }
        left.allowances += turns::call_approval::end_thread_allowances(&mut tx, s).await?;
        left.approvals += turns::call_approval::lapse_waiting(&mut tx, s, None).await?;
        if let Some(b) = bound {
            binding::clear(&mut tx, s).await?;
            left.bindings += 1;
            if !released.contains(&b.alias) {
                released.push(b.alias.clone());
            }
            record(
                &mut tx,
                "binding.release",
                s,
                Some(&b.alias),
                json!({"kind": b.kind.as_str(), "owner": b.owner, "reason": gone.why()}),
            )
            .await?;
        }
        tx.commit().await?;
    }
    // Every replica closes the pooled connections of these targets that nothing else binds
    // (this one at once, the others when they follow the departure).
    if !released.is_empty() {
        crate::lifecycle::released(&deps.db, chat_id, &released).await?;
        for alias in &released {
            if !bound_anywhere(&deps.db, alias).await? {
                deps.exec.ssh.close_unused(alias).await;
            }
        }
    }
    // The chat is gone: its schedules pause without a word (nothing can be posted there).
    for (id, section, _) in crate::schedule::live_in_chat(&deps.db, chat_id, None).await? {
        pause(deps, id, &section, gone.why(), now).await?;
        left.schedules += 1;
    }
    tracing::info!(lark.chat_id = %chat_id, chat.gone = gone.as_str(), sections = left.sections, turns = left.turns_stopped, shells = left.shells, bindings = left.bindings, schedules = left.schedules, "the bot left a chat");
    Ok(left)
}

/// Whether any thread is bound to `alias`.
async fn bound_anywhere(db: &PgPool, alias: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM bindings WHERE alias = $1)")
        .bind(alias)
        .fetch_one(db)
        .await
}

/// How often every replica looks for chats the bot left.
const FOLLOW_EVERY: Duration = Duration::from_secs(2);
/// Departures read at once.
const FOLLOW_BATCH: i64 = 100;
/// How long a released target's busy connections are waited for before they are left to
/// idle out.
const RELEASE_WAIT: Duration = Duration::from_secs(60);
/// Released targets followed at once (there are never more than the approved targets).
const RELEASE_MAX: usize = 1_000;

/// Every replica's part in a chat's end: what this process holds of a chat the bot left —
/// its interactive shells, and the pooled connections of the targets its bindings held and
/// nothing binds now — is closed, whichever replica handled the event. Follows
/// `departed_chats` in order, from the newest departure at start, until `shutdown`.
pub async fn follow_departures(
    db: PgPool,
    exec: Arc<crate::exec::Executors>,
    shutdown: CancellationToken,
) {
    let mut seen = loop {
        match crate::lifecycle::last_departure(&db).await {
            Ok(n) => break n,
            Err(e) => {
                tracing::debug!(error = %e, "reading departures failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(FOLLOW_EVERY) => {}
                }
            }
        }
    };
    // Released targets whose connections were busy: (alias, until when to try again).
    let mut closing: Vec<(String, tokio::time::Instant)> = Vec::new();
    let mut tick = tokio::time::interval(FOLLOW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let departures = match crate::lifecycle::departures_since(&db, seen, FOLLOW_BATCH).await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "reading departures failed; retrying");
                continue;
            }
        };
        for d in departures {
            seen = d.seq;
            let why = if d.reason == "disbanded" {
                Gone::Disbanded.why()
            } else {
                Gone::Removed.why()
            };
            match sections_of(&db, &d.chat_id).await {
                Ok(sections) => {
                    for s in &sections {
                        exec.shells.close_section(s, why);
                    }
                }
                Err(e) => {
                    tracing::warn!(lark.chat_id = %d.chat_id, error = %e, "the sections of a chat the bot left could not be read; its shells idle out")
                }
            }
            let until = tokio::time::Instant::now() + RELEASE_WAIT;
            for alias in d.released {
                if closing.len() < RELEASE_MAX && !closing.iter().any(|(a, _)| *a == alias) {
                    closing.push((alias, until));
                }
            }
        }
        let now = tokio::time::Instant::now();
        let mut kept = Vec::with_capacity(closing.len());
        for (alias, until) in closing.drain(..) {
            match bound_anywhere(&db, &alias).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(_) => {
                    kept.push((alias, until));
                    continue;
                }
            }
            if exec.ssh.close_unused(&alias).await > 0 && now < until {
                kept.push((alias, until));
            }
        }
        closing = kept;
    }
}

/// The bot was added to `chat_id`: a departed chat starts clean (what ended stays ended; paused
/// schedules can be resumed).
pub async fn bot_added(deps: &Deps, chat_id: &str) -> anyhow::Result<()> {
    crate::lifecycle::clear_departed(&deps.db, chat_id).await?;
    Ok(())
}

/// What ended when people left a chat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeopleLeft {
    pub grants: usize,
    pub allowances: u64,
    pub approvals: u64,
    pub schedules: usize,
}

/// `people` were removed from `chat_id`: the grants and allowances they gave there end, the
/// approvals they wait for lapse, and the schedules they created there pause and say why.
pub async fn people_left(
    deps: &Deps,
    chat_id: &str,
    people: &[String],
) -> anyhow::Result<PeopleLeft> {
    let now = deps.clock.now();
    let sections = sections_of(&deps.db, chat_id).await?;
    let mut out = PeopleLeft::default();
    for person in people {
        let mut tx = deps.db.begin().await?;
        for (g, section) in grant::revoke_by(&mut tx, &sections, person, SYSTEM, now).await? {
            out.grants += 1;
            record(
                &mut tx,
                "grant.revoke",
                &section,
                None,
                json!({"grant": g, "reason": "its grantor left the chat", "grantor": person}),
            )
            .await?;
        }
        out.allowances +=
            turns::call_approval::end_allowances_by(&mut tx, &sections, person).await?;
        for s in &sections {
            out.approvals += turns::call_approval::lapse_waiting(&mut tx, s, Some(person)).await?;
        }
        tx.commit().await?;
        if crate::lifecycle::is_departed(&deps.db, chat_id).await? {
            continue;
        }
        let why = format!("its creator {person} left the chat");
        for (id, section, root) in
            crate::schedule::live_in_chat(&deps.db, chat_id, Some(person)).await?
        {
            let place = AnchorPlace {
                chat_id: chat_id.to_string(),
                section: section.clone(),
                root_message_id: root,
            };
            let text = format!(
                "⏰ Schedule #{id} is paused: {why}. The thread's owner or an admin can /cron resume {id} or /cron remove {id}."
            );
            // Told first: a retry after the schedule paused would find it paused.
            deps.anchors
                .post(&place, &text, &format!("schedule:{id}:left:{person}"))
                .await?;
            pause(deps, id, &section, &why, now).await?;
            out.schedules += 1;
        }
    }
    Ok(out)
}

/// Pauses schedule `id` (of `section`) for `why`, audited.
async fn pause(
    deps: &Deps,
    id: i64,
    section: &str,
    why: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let mut tx = deps.db.begin().await?;
    crate::schedule::pause(&mut tx, id, SYSTEM, Some(why), now).await?;
    record(
        &mut tx,
        "schedule.pause",
        section,
        None,
        json!({"schedule": id, "reason": why}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn record(
    conn: &mut sqlx::PgConnection,
    action: &str,
    section: &str,
    target: Option<&str>,
    detail: serde_json::Value,
) -> sqlx::Result<()> {
    audit::record_chat(
        conn,
        ChatEntry {
            actor: SYSTEM,
            action,
            section: Some(section),
            target,
            outcome: "ok",
            detail,
        },
    )
    .await
}
