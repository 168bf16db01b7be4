//! Lark's call budgets for the whole deployment: every replica takes its calls' places from the
//! same buckets in PostgreSQL (`lark_budgets`, migration `20261205020000_lark_budgets.sql`), so
//! the app-wide, message-API and per-chat ceilings hold however many replicas run. Each bucket
//! is a GCRA on the database's clock; one call takes its place in all of its buckets at one
//! instant, in one statement (`lark_budget_take`), and then waits for that instant locally.
//!
//! The buckets are set inside Lark's documented ceilings so that they hold for **any** window,
//! not only for aligned ones: a bucket of `per_sec` with a burst of `burst` grants at most
//! `burst + per_sec × T` calls in any span of `T` seconds. App: 40/s with a burst of 5 (≤ 45 in
//! any second, under 50, leaving room for the jitter between a grant and the call's arrival).
//! Message APIs: 16/s with a burst of 24 (≤ 1000 in any 61 s). A chat: 4/s with a burst of 1
//! (≤ 5 in any second).
//!
//! Priority across replicas: a bulk call takes a place only within [`BULK_HORIZON`] of now
//! (else it waits and asks again), a receipt within its whole wait, so bulk traffic never
//! books more than a quarter second ahead of a receipt anywhere in the deployment; inside a
//! replica the lanes of [`super::lane`] still order calls, receipts first.
//!
//! If the database cannot be reached the call goes ahead under the replica's own limits
//! (logged): the budget is a ceiling to respect, not a reason to stop answering.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::PgPool;
use tokio::time::Instant;

use super::lane::{Kind, Overloaded, Priority};

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

/// Every call of the app.
pub const APP: Rate = Rate {
    per_sec: 40.0,
    burst: 5,
};
/// Calls of message APIs (`/open-apis/im/…`), on top of [`APP`].
pub const MESSAGE: Rate = Rate {
    per_sec: 16.0,
    burst: 24,
};
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

    /// Waits for one call's place in the app's buckets (and its chat's, when keyed by one), at
    /// most `wait`; `Err` when no place came within it.
    pub async fn take(
        &self,
        priority: Priority,
        kind: Kind,
        chat: Option<&str>,
        wait: Duration,
    ) -> Result<(), Overloaded> {
        let deadline = Instant::now() + wait;
        let mut buckets = vec![(format!("{}/app", self.app), APP)];
        if kind == Kind::Message {
            buckets.push((format!("{}/message", self.app), MESSAGE));
        }
        if let Some(c) = chat {
            buckets.push((format!("{}/chat/{c}", self.app), CHAT));
        }
        let keys: Vec<&str> = buckets.iter().map(|(k, _)| k.as_str()).collect();
        let steps: Vec<f64> = buckets.iter().map(|(_, r)| r.step()).collect();
        let tolerances: Vec<f64> = buckets.iter().map(|(_, r)| r.tolerance()).collect();
        self.cleanup().await;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let horizon = match priority {
                Priority::Urgent => left,
                Priority::Bulk => BULK_HORIZON.min(left),
            };
            let taken: Result<f64, _> =
                sqlx::query_scalar("SELECT lark_budget_take($1, $2, $3, $4)")
                    .bind(&keys)
                    .bind(&steps)
                    .bind(&tolerances)
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
        let r = sqlx::query(
            "DELETE FROM lark_budgets WHERE key IN (
                 SELECT key FROM lark_budgets WHERE tat < now() - interval '1 minute' LIMIT $1)",
        )
        .bind(CLEANUP_MAX)
        .execute(&self.db)
        .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "cleaning the Lark budgets failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `burst + per_sec × T` calls at most in any span of T seconds: within Lark's ceilings.
    #[test]
    fn the_buckets_stay_inside_larks_ceilings_in_any_window() {
        let most = |r: Rate, secs: f64| f64::from(r.burst) + r.per_sec * secs;
        assert!(most(APP, 1.0) <= 50.0);
        assert!(most(MESSAGE, 61.0) <= 1000.0);
        assert!(most(CHAT, 1.0) <= 5.0);
    }
}
