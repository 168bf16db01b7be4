//! The schedules' clock: every replica looks for due schedules about once a second, claims
//! them (`FOR UPDATE SKIP LOCKED`) and, in the claim's transaction, records each firing, writes
//! the inbox event that carries it (keyed by schedule and due time) and the schedule's next due
//! time. What a firing does is the inbox handler's (`chat::cron::fire`): the firing waits its
//! turn in its thread, behind the messages before it.
//!
//! Due times are read on the service's [`Clock`]. A schedule that missed several due times
//! (the service was down) fires once, late; its next due time is the first one after now.
//!
//! Never: posts, runs turns, or decides who may.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::inbox::{Inbox, NewEvent};
use crate::metrics::Metrics;
use crate::schedule::{self, Firing};

/// How often a replica looks for due schedules.
const TICK: Duration = Duration::from_secs(1);
/// Most schedules one claim takes (the rest wait for the next tick).
const CLAIM_MAX: i64 = 32;

/// How firings reach their threads.
pub enum Deliver {
    /// As inbox events, in each thread's order with people's messages (`serve`).
    Inbox(Arc<Inbox>),
    /// Handled at once after the claim commits (a console's one section, which has no inbox);
    /// a firing left queued by a console that stopped is handled by the next tick.
    Direct(Box<crate::chat::Deps>),
}

/// Claims due schedules and hands their firings on.
pub struct Scheduler {
    pub db: PgPool,
    pub clock: Arc<dyn Clock>,
    pub deliver: Deliver,
    pub metrics: Arc<Metrics>,
    /// Only this section (a console's).
    pub only: Option<String>,
    /// Sections starting with this are left alone (a console fires its own).
    pub except: Option<String>,
}

impl Scheduler {
    /// Ticks until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.tick().await {
                // A full claim: more may be due.
                Ok(n) if n as i64 >= CLAIM_MAX => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(
                        error = format!("{e:#}"),
                        "claiming due schedules failed; trying again"
                    )
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }

    /// One claim: the firings of the schedules due now, written with their next due times in
    /// one transaction. Returns how many schedules it claimed.
    pub async fn tick(&self) -> anyhow::Result<usize> {
        let now = self.clock.now();
        let mut tx = self.db.begin().await?;
        let due = schedule::claim_due(
            &mut tx,
            now,
            CLAIM_MAX,
            self.only.as_deref(),
            self.except.as_deref(),
        )
        .await?;
        let mut written = 0;
        let mut direct = Vec::new();
        for s in &due {
            let firing = Firing {
                schedule_id: s.id,
                due_at: s.next_due,
                late_ms: (now - s.next_due).num_milliseconds().max(0),
                run_by: None,
            };
            if schedule::record_firing(&mut tx, &firing, now).await? {
                self.metrics
                    .schedule_lateness_seconds
                    .observe(firing.late_ms as f64 / 1000.0);
                written += 1;
                let Deliver::Inbox(_) = &self.deliver else {
                    direct.push(firing);
                    continue_advance(&mut tx, s, now).await?;
                    continue;
                };
                let ev = NewEvent {
                    event_id: firing.event_id(),
                    event_type: schedule::FIRED.into(),
                    payload: json!({ "firing": firing }).to_string(),
                    section: Some(s.section_id.clone()),
                    message_id: None,
                    express: false,
                    inert: false,
                };
                crate::inbox::record_in(&mut tx, &ev, now).await?;
            }
            continue_advance(&mut tx, s, now).await?;
        }
        tx.commit().await?;
        match &self.deliver {
            Deliver::Inbox(inbox) if written > 0 => inbox.wake(),
            Deliver::Inbox(_) => {}
            Deliver::Direct(deps) => {
                if let Some(section) = &self.only {
                    direct.extend(schedule::left_queued(&self.db, section, now).await?);
                }
                for f in direct {
                    crate::chat::cron::fire(deps, &f).await?;
                }
            }
        }
        Ok(due.len())
    }
}

/// Writes a claimed schedule's next due time (pausing one that has none).
async fn continue_advance(
    tx: &mut sqlx::PgConnection,
    s: &schedule::Schedule,
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    let next = schedule::next_due(s, now);
    schedule::advance(tx, s.id, next.unwrap_or(far_future())).await?;
    if next.is_none() {
        schedule::pause(
            tx,
            s.id,
            "system",
            Some("its schedule has no further due time"),
            now,
        )
        .await?;
    }
    Ok(())
}

/// Where a schedule without a further due time is parked (it is paused as well).
fn far_future() -> DateTime<Utc> {
    use chrono::TimeZone;
    Utc.with_ymd_and_hms(9999, 12, 31, 0, 0, 0)
        .single()
        .expect("a valid date")
}
