//! Lark's call budgets for the whole deployment: every replica takes its calls' places from the
//! same buckets in PostgreSQL, so the ceilings hold however many replicas run. The platform
//! counts its frequency limits **per API** (per app, per tenant), so each API has its own:
//!
//! - a GCRA bucket per second (`lark_budgets`, migration `20261205020000_lark_budgets.sql`),
//!   on the database's clock: [`PER_SECOND`], 40/s with a burst of 5, grants at most
//!   `burst + per_sec × T` calls in any span of `T` seconds — at most 45 in any second, under
//!   the platform's 50, leaving room for the jitter between a grant and the call's arrival;
//! - an allowance over a sliding window (`lark_budget_windows`, migration
//!   `20261210010000_lark_budget_windows.sql`): at most [`PER_WINDOW`] (950) calls in any
//!   [`WINDOW`] (61 s: a call reaches Lark a little after it leaves) against the platform's
//!   1000 a minute. A burst within the window is allowed, up to the per-second cap — the
//!   allowance is not paced out as a rate.
//!
//! A call keyed by a chat also takes a place in the chat's bucket ([`CHAT`], 4/s with a burst
//! of 1: Lark allows about 5 a second per group, shared with every other bot in it, so this
//! cannot prevent the platform's own 230020 — the client retries those). One call takes its
//! place in all of its buckets and windows at one instant, in one statement
//! (`lark_budget_take_windowed`), and then waits for that instant locally. Streamed CardKit
//! updates are exempt from the API limits (the platform says so) and take no place here.
//!
//! Priority across replicas: a bulk call takes a place only within [`BULK_HORIZON`] of now
//! (else it waits and asks again), a receipt within its whole wait, so bulk traffic never
//! books more than a quarter second ahead of a receipt anywhere in the deployment; inside a
//! replica the lanes of [`super::lane`] still order calls of one API, receipts first.
//!
//! If the database cannot be reached the call goes ahead under the replica's own limits
//! (logged): the budget is a ceiling to respect, not a reason to stop answering.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::lane::{Overloaded, Priority};

/// How far ahead a bulk call may book its place.
pub const BULK_HORIZON: Duration = Duration::from_millis(250);
/// How often idle rows are deleted, and most per pass.
const CLEANUP_EVERY: Duration = Duration::from_secs(600);
const CLEANUP_MAX: i64 = 10_000;

/// One bucket: its sustained rate and burst.
#[derive(Debug, Clone, Copy)]
pub struct Rate {
    pub per_sec: f64,
    pub burst: u32,
}

impl Rate {
    fn step(self) -> f64 {
        1.0 / self.per_sec
    }
    fn tolerance(self) -> f64 {
        f64::from(self.burst.max(1) - 1) * self.step()
    }
}

/// Each API's calls per second (the platform: about 50/s per API).
pub const PER_SECOND: Rate = Rate {
    per_sec: 40.0,
    burst: 5,
};
/// Each API's calls in any [`WINDOW`] (the platform: 1000 a minute per API).
pub const PER_WINDOW: u32 = 950;
/// The window of [`PER_WINDOW`]: a minute, and a second for the time a call takes to arrive.
pub const WINDOW: Duration = Duration::from_secs(61);
/// Calls keyed by one chat, on top of the others.
pub const CHAT: Rate = Rate {
    per_sec: 4.0,
    burst: 1,
};

/// The deployment's buckets, in the service's PostgreSQL.
pub struct SharedBudget {
    db: PgPool,
    /// The app's own key, so that apps sharing a database do not share budgets.
    app: String,
    last_cleanup: Mutex<Option<Instant>>,
    /// Whether a database failure was logged (once).
    failing: std::sync::atomic::AtomicBool,
}

impl SharedBudget {
    pub fn new(db: PgPool, app_id: &str) -> SharedBudget {
        SharedBudget {
            db,
            app: app_id.to_string(),
            last_cleanup: Mutex::new(None),
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Waits for one call's place in `api`'s bucket and window (and its chat's bucket, when
    /// keyed by one), at most `wait`; `Err` when no place came within it.
    pub async fn take(
        &self,
        priority: Priority,
        api: &str,
        chat: Option<&str>,
        wait: Duration,
    ) -> Result<(), Overloaded> {
        let deadline = Instant::now() + wait;
        let api_key = format!("{}/api/{api}", self.app);
        let mut buckets = vec![(api_key.clone(), PER_SECOND)];
        if let Some(c) = chat {
            buckets.push((format!("{}/chat/{c}", self.app), CHAT));
        }
        let keys: Vec<&str> = buckets.iter().map(|(k, _)| k.as_str()).collect();
        let steps: Vec<f64> = buckets.iter().map(|(_, r)| r.step()).collect();
        let tolerances: Vec<f64> = buckets.iter().map(|(_, r)| r.tolerance()).collect();
        let window_keys = [api_key.as_str()];
        let window_secs = [WINDOW.as_secs() as i32];
        let window_max = [PER_WINDOW as i32];
        self.cleanup().await;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let horizon = match priority {
                Priority::Urgent => left,
                Priority::Bulk => BULK_HORIZON.min(left),
            };
            let taken: Result<f64, _> =
                sqlx::query_scalar("SELECT lark_budget_take_windowed($1, $2, $3, $4, $5, $6, $7)")
                    .bind(&keys)
                    .bind(&steps)
                    .bind(&tolerances)
                    .bind(&window_keys[..])
                    .bind(&window_secs[..])
                    .bind(&window_max[..])
                    .bind(horizon.as_secs_f64())
                    .fetch_one(&self.db)
                    .await;
            let secs = match taken {
                Ok(s) => s,
                Err(e) => {
                    if !self
                        .failing
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        tracing::warn!(error = %e, "the shared Lark budget is unreachable; calls go under this replica's own limits");
                    }
                    return Ok(());
                }
            };
            self.failing
                .store(false, std::sync::atomic::Ordering::Relaxed);
            if secs >= 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                return Ok(());
            }
            // Not within the horizon: ask again once it would be.
            let retry_at = Instant::now()
                + Duration::from_secs_f64(-secs)
                    .saturating_sub(horizon)
                    .max(Duration::from_millis(5));
            if retry_at > deadline {
                return Err(Overloaded::TimedOut(wait));
            }
            tokio::time::sleep_until(retry_at).await;
        }
    }

    /// Deletes idle rows now and then (a row whose time has passed holds nothing).
    async fn cleanup(&self) {
        {
            let mut last = self.last_cleanup.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            match *last {
                Some(t) if now < t + CLEANUP_EVERY => return,
                _ => *last = Some(now),
            }
        }
        let buckets = sqlx::query(
            "DELETE FROM lark_budgets WHERE key IN (
                 SELECT key FROM lark_budgets WHERE tat < now() - interval '1 minute' LIMIT $1)",
        )
        .bind(CLEANUP_MAX)
        .execute(&self.db)
        .await;
        // A window whose last counted second is more than a window ago holds nothing.
        let windows = sqlx::query(
            "DELETE FROM lark_budget_windows WHERE key IN (
                 SELECT key FROM lark_budget_windows
                 WHERE base + coalesce(array_length(counts, 1), 0) + $2
                       < extract(epoch FROM now())
                 LIMIT $1)",
        )
        .bind(CLEANUP_MAX)
        .bind(WINDOW.as_secs() as i64)
        .execute(&self.db)
        .await;
        if let Err(e) = buckets.and(windows) {
            tracing::debug!(error = %e, "cleaning the Lark budgets failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `burst + per_sec × T` calls at most in any span of T seconds: within Lark's ceilings
    /// (50 a second per API, 5 a second per group); the window under 1000 a minute.
    #[test]
    fn the_buckets_stay_inside_larks_ceilings_in_any_window() {
        let most = |r: Rate, secs: f64| f64::from(r.burst) + r.per_sec * secs;
        assert!(most(PER_SECOND, 1.0) <= 50.0);
        assert!(most(CHAT, 1.0) <= 5.0);
        assert!(PER_WINDOW < 1000 && WINDOW > Duration::from_secs(60));
        // A burst of receipts within a window is not paced out: 300 fit in 8 s.
        assert!(most(PER_SECOND, 8.0) >= 300.0);
    }
}
