//! The turn runner of one replica: claims sections, drives their turns with a heartbeat, and
//! gives the sections back. Concurrency is bounded by a semaphore; there is no in-memory list
//! of who runs what — a claim is a row in Postgres.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::store::{self, Fence, Fenced, Lease};
use super::{ActiveTurn, CancelReason, SectionFilter, TurnWork};

/// How often a running turn's lease is renewed and its stop flag read.
const BEAT: Duration = Duration::from_millis(500);
/// How long a turn whose lease was lost may take to unwind before it is dropped.
const LOST_GRACE: Duration = Duration::from_secs(5);

/// Runner tunables.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// A claim holds this long without a heartbeat.
    pub lease: Duration,
    /// Sections this replica works on at once.
    pub workers: usize,
    /// A turn's wall-clock budget, across resumes.
    pub budget: Duration,
    /// How often the runner looks for work when no notification arrives.
    pub poll: Duration,
}

/// One replica's turn runner.
pub struct Runner {
    /// This runner's name in `turn_sections.holder` (diagnostics only; fencing uses the
    /// generation).
    id: String,
    db: PgPool,
    config: RunnerConfig,
    work: Arc<dyn TurnWork>,
    /// The sections this runner claims.
    scope: SectionFilter,
    /// Cancelled to make the runner vanish the way a killed process does: turns are dropped
    /// mid-step, nothing more is written, leases are left to expire. Tests use it to stand in
    /// for `kill -9`.
    halt: CancellationToken,
    /// Sections held right now: claimed, and not yet given back or let go.
    held: AtomicUsize,
}

enum Driven {
    /// The turn returned; the lease is still ours.
    Returned,
    /// The turn returned with an error; give the section back.
    Errored,
    /// The lease is gone: write nothing more, do not release.
    Lost,
}

impl Runner {
    pub fn new(db: PgPool, config: RunnerConfig, work: Arc<dyn TurnWork>) -> Arc<Runner> {
        Self::scoped(db, config, work, SectionFilter::All)
    }

    /// A runner that claims only the sections `scope` covers.
    pub fn scoped(
        db: PgPool,
        config: RunnerConfig,
        work: Arc<dyn TurnWork>,
        scope: SectionFilter,
    ) -> Arc<Runner> {
        Arc::new(Runner {
            id: format!("runner-{}", uuid::Uuid::new_v4().simple()),
            db,
            config,
            work,
            scope,
            halt: CancellationToken::new(),
            held: AtomicUsize::new(0),
        })
    }

    /// Stops this runner as abruptly as a process death would (see [`Runner::halt`]).
    pub fn halt_abruptly(&self) {
        self.halt.cancel();
    }

    /// How many sections this runner holds now. Once a section is let go (finished, given
    /// back, or its lease lost to another runner), this runner writes nothing more for it.
    pub fn sections_held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Claims and runs turns until `shutdown`; each held section is a task on `tasks`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken, tasks: TaskTracker) {
        let slots = Arc::new(Semaphore::new(self.config.workers.max(1)));
        let mut listener = listen(&self.db).await;
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                _ = shutdown.cancelled() => break,
                _ = self.halt.cancelled() => break,
            };
            match store::claim(&self.db, &self.id, self.config.lease, &self.scope).await {
                Ok(Some(lease)) => {
                    tracing::debug!(section.id = %lease.section, turn.generation = lease.generation, "section claimed");
                    let me = self.clone();
                    let shutdown = shutdown.clone();
                    self.held.fetch_add(1, Ordering::AcqRel);
                    tasks.spawn(async move {
                        me.hold(lease, shutdown).await;
                        me.held.fetch_sub(1, Ordering::AcqRel);
                        drop(permit);
                    });
                    continue;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "claiming a turn failed; retrying"),
            }
            drop(permit);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.halt.cancelled() => break,
                _ = wake(&self.db, &mut listener, self.config.poll) => {}
            }
        }
    }

    /// Works on a claimed section: its running turn, then any turns of requests waiting
    /// behind it, then gives it back.
    async fn hold(&self, lease: Lease, shutdown: CancellationToken) {
        let fence = Fence::new(self.db.clone(), &lease);
        let work = async {
            loop {
                if shutdown.is_cancelled() {
                    return true;
                }
                let turn = match store::open_turn(&fence, self.config.budget).await {
                    Ok(Some(t)) => t,
                    Ok(None) => return true,
                    Err(Fenced::Lost) => return false,
                    Err(Fenced::Db(e)) => {
                        tracing::warn!(section.id = %lease.section, error = %e, "opening a turn failed");
                        return true;
                    }
                };
                match self.drive(&lease, &turn, &shutdown).await {
                    Driven::Returned => {}
                    Driven::Errored => return true,
                    Driven::Lost => return false,
                }
            }
        };
        let release = tokio::select! {
            r = work => r,
            _ = self.halt.cancelled() => return,
        };
        if release && let Err(e) = store::release(&self.db, &lease).await {
            // The lease expires by itself; another runner takes over then.
            tracing::warn!(section.id = %lease.section, error = %e, "releasing a section failed");
        }
    }

    /// Runs one turn beside its heartbeat, both polled concurrently (the heartbeat's renewal
    /// may wait on a lock the turn holds in an open transaction, so it must never pause the
    /// turn). Cancels the turn for a stop, the budget, a shutdown or a lost lease.
    async fn drive(
        &self,
        lease: &Lease,
        turn: &ActiveTurn,
        shutdown: &CancellationToken,
    ) -> Driven {
        let cancel = &turn.cancel;
        let work = self.work.run_turn(turn);
        tokio::pin!(work);
        let beat = self.beat(lease, turn);
        tokio::pin!(beat);
        let deadline = Instant::now() + turn.budget_left;
        let mut lost_at: Option<Instant> = None;
        loop {
            tokio::select! {
                biased;
                r = &mut work => {
                    if let Err(e) = &r {
                        tracing::warn!(section.id = %lease.section, turn.id = turn.id, error = %format!("{e:#}"), "turn ended with an error; it resumes later");
                    }
                    return match (cancel.reason(), r) {
                        (Some(CancelReason::LeaseLost), _) => Driven::Lost,
                        (_, Err(_)) => Driven::Errored,
                        (_, Ok(())) => Driven::Returned,
                    };
                }
                _ = &mut beat, if lost_at.is_none() => {
                    lost_at = Some(Instant::now());
                }
                _ = tokio::time::sleep_until(lost_at.unwrap_or(deadline) + LOST_GRACE), if lost_at.is_some() => {
                    return Driven::Lost;
                }
                _ = shutdown.cancelled(), if !cancel.token().is_cancelled() => {
                    cancel.cancel(CancelReason::Shutdown);
                }
                _ = tokio::time::sleep_until(deadline), if !cancel.token().is_cancelled() => {
                    cancel.cancel(CancelReason::Budget);
                }
            }
        }
    }

    /// The heartbeat: renews the lease, adds the time spent to the turn's budget use and reads
    /// the stop flag every [`BEAT`]. Returns (after cancelling the turn) once the lease is lost
    /// or renewals have failed for two thirds of the lease.
    async fn beat(&self, lease: &Lease, turn: &ActiveTurn) {
        let cancel = &turn.cancel;
        let mut tick = tokio::time::interval(BEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_beat = Instant::now();
        let mut last_ok = Instant::now();
        loop {
            tick.tick().await;
            let now = Instant::now();
            match store::heartbeat(&self.db, lease, self.config.lease, turn.id, now - last_beat)
                .await
            {
                Ok(b) if !b.held => {
                    tracing::warn!(section.id = %lease.section, turn.id = turn.id, "lease lost to another runner; cancelling this turn's work");
                    cancel.cancel(CancelReason::LeaseLost);
                    return;
                }
                Ok(b) => {
                    last_beat = now;
                    last_ok = Instant::now();
                    if b.stop_requested {
                        cancel.cancel(CancelReason::Stop);
                    }
                }
                Err(e) => {
                    // A runner that cannot renew must assume another takes over when the
                    // lease runs out, and stop its own tools before that.
                    if now - last_ok > self.config.lease * 2 / 3 {
                        tracing::warn!(section.id = %lease.section, error = %e, "lease renewals failing; cancelling this turn's work");
                        cancel.cancel(CancelReason::LeaseLost);
                        return;
                    }
                }
            }
        }
    }
}

/// A listener for enqueue notifications; `None` when it cannot connect (polling still works).
async fn listen(db: &PgPool) -> Option<PgListener> {
    let mut l = PgListener::connect_with(db).await.ok()?;
    l.listen(store::CHANNEL).await.ok()?;
    Some(l)
}

/// Waits for a notification or `poll`, whichever comes first. A broken listener is dropped and
/// reconnected on a later call; a lost notification costs at most one poll interval.
async fn wake(db: &PgPool, listener: &mut Option<PgListener>, poll: Duration) {
    match listener {
        Some(l) => match tokio::time::timeout(poll, l.recv()).await {
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "turn notifications lost; polling until reconnected");
                *listener = None;
            }
        },
        None => {
            tokio::time::sleep(poll).await;
            *listener = listen(db).await;
        }
    }
}
