//! One Lark Open API's call budget on this replica, shared by two lanes. The platform counts
//! its frequency limits per API (per app, per tenant): the client keeps one [`Lanes`] for each
//! API it calls, so replies never wait behind reactions, nor reactions behind replies. Every
//! call takes one slot of its API's per-second budget, and needs room in a sliding window of
//! that API's recent grants (Lark's per-minute allowance, a burst within it allowed up to the
//! per-second cap). A call in the *urgent* lane — the receipt reaction a user is waiting to
//! see — gets the next free slot ahead of every call of the same API waiting in the *bulk*
//! lane (final reactions, reaction removals), and the last `urgent_reserve` places of the
//! window are for the urgent lane only.
//!
//! Both lanes are bounded queues and every wait is bounded. An urgent call that finds its lane
//! full fails at once (a receipt that comes late is worth little, and the caller logs it); a
//! bulk call that finds its lane full waits for a place. Either fails with [`Overloaded`] when
//! no slot was granted within its lane's deadline, so a caller is always told; a waiter that
//! gives up (timed out or dropped) takes no slot from the others.
//!
//! Written here because governor (which keeps the per-chat limit) hands a free cell to
//! whichever caller polls first and has no notion of priority or of a window; the budget
//! itself is a few lines of GCRA, the algorithm governor uses.
//!
//! No task of its own: the call at the head of the lanes (the oldest urgent call, else the
//! oldest bulk call) takes its slot itself once the budget and the window allow, and every
//! change of the lanes wakes the call then at their head. Never sends anything itself.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Which lane a call waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Goes ahead of every waiting bulk call (receipt reactions).
    Urgent,
    /// Everything else.
    Bulk,
}

/// The budget and the bounds of the two lanes.
#[derive(Debug, Clone, Copy)]
pub struct LaneConfig {
    /// Time between two slots at the sustained rate (20 ms for 50 calls/s).
    pub interval: Duration,
    /// Slots that may be taken back to back after an idle spell (at least 1).
    pub burst: u32,
    /// Most calls waiting in the urgent lane; one more fails at once.
    pub urgent_capacity: usize,
    /// Most calls waiting in the bulk lane; one more waits for a place.
    pub bulk_capacity: usize,
    /// Longest wait of an urgent call for its slot.
    pub urgent_wait: Duration,
    /// Longest wait of a bulk call for a place in its lane and then its slot.
    pub bulk_wait: Duration,
    /// Calls granted within any `window` are at most `window_max` (at least 1) ...
    pub window: Duration,
    pub window_max: usize,
    /// ... of which the last `urgent_reserve` places only urgent calls may take.
    pub urgent_reserve: usize,
}

/// A call did not get a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Overloaded {
    #[error("its queue is full")]
    Full,
    #[error("no slot within {0:?}")]
    TimedOut(Duration),
}

/// A waiting call: woken when it may have come to the head of the lanes.
struct Waiter {
    id: u64,
    wake: Arc<Notify>,
}

/// The two lanes and the state of the budget.
struct State {
    urgent: VecDeque<Waiter>,
    bulk: VecDeque<Waiter>,
    /// The next waiter's number.
    next_id: u64,
    /// The theoretical arrival time of the next call at the sustained rate (GCRA).
    tat: Instant,
    /// When the calls of the last window were granted, oldest first (at most `window_max`).
    recent: VecDeque<Instant>,
}

/// What the call at the head of the lanes may do now.
enum Turn {
    /// It took its slot.
    Granted,
    /// Not before this instant.
    At(Instant),
    /// Not until the lanes change: another call heads them, or the window is full and holds
    /// no grant that could leave it.
    Later,
}

/// The two lanes in front of one API's budget.
pub struct Lanes {
    state: Mutex<State>,
    /// Wakes a bulk call waiting for a place: one was freed.
    freed: Notify,
    config: LaneConfig,
}

impl Lanes {
    pub fn new(config: LaneConfig) -> Lanes {
        Lanes {
            state: Mutex::new(State {
                urgent: VecDeque::new(),
                bulk: VecDeque::new(),
                next_id: 0,
                tat: Instant::now(),
                recent: VecDeque::new(),
            }),
            freed: Notify::new(),
            config,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot in `priority`'s lane; `Err` when the urgent lane is full, or when the
    /// lane's deadline passed before a slot was granted.
    pub async fn acquire(&self, priority: Priority) -> Result<(), Overloaded> {
        let (capacity, wait) = match priority {
            Priority::Urgent => (self.config.urgent_capacity, self.config.urgent_wait),
            Priority::Bulk => (self.config.bulk_capacity, self.config.bulk_wait),
        };
        let capacity = capacity.max(1);
        let deadline = Instant::now() + wait;
        let timed_out = |_| Overloaded::TimedOut(wait);
        let wake = Arc::new(Notify::new());
        let id = loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = self.lock();
                let id = state.next_id;
                let lane = state.lane(priority);
                if lane.len() < capacity {
                    lane.push_back(Waiter {
                        id,
                        wake: wake.clone(),
                    });
                    state.next_id += 1;
                    break id;
                }
                if priority == Priority::Urgent {
                    return Err(Overloaded::Full);
                }
            }
            tokio::time::timeout_at(deadline, freed)
                .await
                .map_err(timed_out)?;
        };
        // A call that gives up leaves its lane.
        let mut place = Place {
            lanes: self,
            priority,
            id,
            granted: false,
        };
        loop {
            let turn = self.lock().take(id, &self.config, Instant::now());
            // A wake-up sent since the lock was let go is kept for this wait.
            let woken = wake.notified();
            let until = match turn {
                Turn::Granted => {
                    place.granted = true;
                    if priority == Priority::Bulk {
                        self.freed.notify_one();
                    }
                    return Ok(());
                }
                Turn::At(at) => Some(at),
                Turn::Later => None,
            };
            let next = async {
                match until {
                    Some(at) => tokio::select! {
                        _ = woken => {}
                        _ = tokio::time::sleep_until(at) => {}
                    },
                    None => woken.await,
                }
            };
            tokio::time::timeout_at(deadline, next)
                .await
                .map_err(timed_out)?;
        }
    }
}

impl State {
    fn lane(&mut self, priority: Priority) -> &mut VecDeque<Waiter> {
        match priority {
            Priority::Urgent => &mut self.urgent,
            Priority::Bulk => &mut self.bulk,
        }
    }

    /// Wakes the call at the head of the lanes: the only one that may take the next slot.
    fn wake_head(&self) {
        if let Some(w) = self.urgent.front().or(self.bulk.front()) {
            w.wake.notify_one();
        }
    }

    /// Gives call `id` the next slot if it heads the lanes, the budget has a slot free (a GCRA:
    /// one is free once `tat - tolerance` has passed) and the window has room: for an urgent
    /// call while it holds fewer than `window_max` grants, for a bulk call while it has room
    /// beyond the urgent reserve.
    fn take(&mut self, id: u64, config: &LaneConfig, now: Instant) -> Turn {
        while self
            .recent
            .front()
            .is_some_and(|t| *t + config.window <= now)
        {
            self.recent.pop_front();
        }
        let priority = match (self.urgent.front(), self.bulk.front()) {
            (Some(w), _) if w.id == id => Priority::Urgent,
            (None, Some(w)) if w.id == id => Priority::Bulk,
            _ => return Turn::Later,
        };
        let window_max = config.window_max.max(1);
        let room = match priority {
            Priority::Urgent => self.recent.len() < window_max,
            Priority::Bulk => self.recent.len() + config.urgent_reserve < window_max,
        };
        if !room {
            // The window has room again when its oldest grant leaves it.
            return match self.recent.front() {
                Some(t) => Turn::At(*t + config.window),
                None => Turn::Later,
            };
        }
        let tolerance = config.interval * config.burst.max(1).saturating_sub(1);
        let free_at = self.tat.checked_sub(tolerance).unwrap_or(self.tat);
        if now < free_at {
            return Turn::At(free_at);
        }
        self.lane(priority).pop_front();
        self.tat = self.tat.max(now) + config.interval;
        self.recent.push_back(now);
        self.wake_head();
        Turn::Granted
    }
}

/// A call's place in its lane, given up when the call goes away without its slot.
struct Place<'a> {
    lanes: &'a Lanes,
    priority: Priority,
    id: u64,
    granted: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        {
            let mut state = self.lanes.lock();
            let id = self.id;
            let lane = state.lane(self.priority);
            if let Some(at) = lane.iter().position(|w| w.id == id) {
                lane.remove(at);
            }
            state.wake_head();
        }
        if self.priority == Priority::Bulk {
            self.lanes.freed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn config(interval_ms: u64) -> LaneConfig {
        LaneConfig {
            interval: Duration::from_millis(interval_ms),
            burst: 1,
            urgent_capacity: 4,
            bulk_capacity: 64,
            urgent_wait: Duration::from_secs(60),
            bulk_wait: Duration::from_secs(600),
            window: Duration::from_secs(60),
            window_max: 10_000,
            urgent_reserve: 0,
        }
    }

    /// Lets every spawned task run up to its next wait, without moving the paused clock.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    type Log = Arc<Mutex<Vec<(&'static str, Duration)>>>;

    fn spawn(lanes: &Arc<Lanes>, log: &Log, label: &'static str, p: Priority, t0: Instant) {
        let (lanes, log) = (lanes.clone(), log.clone());
        tokio::spawn(async move {
            lanes.acquire(p).await.unwrap();
            log.lock().unwrap().push((label, t0.elapsed()));
        });
    }

    async fn wait_for(log: &Log, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(3600);
        while log.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "only {:?}", log.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[test]
    fn the_lanes_run_no_task_of_their_own() {
        // Made outside any runtime, so nothing can have been spawned for them.
        let lanes = Lanes::new(config(100));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let t0 = Instant::now();
            lanes.acquire(Priority::Bulk).await.unwrap();
            lanes.acquire(Priority::Urgent).await.unwrap();
            // The second call still waited for its slot.
            assert_eq!(t0.elapsed(), Duration::from_millis(100));
        });
    }

    #[tokio::test(start_paused = true)]
    async fn an_urgent_call_goes_ahead_of_every_waiting_bulk_call() {
        let lanes = Arc::new(Lanes::new(config(100)));
        let log: Log = Arc::default();
        let t0 = Instant::now();
        for _ in 0..5 {
            spawn(&lanes, &log, "bulk", Priority::Bulk, t0);
        }
        settle().await;
        // The first bulk call took the free slot; four wait.
        assert_eq!(log.lock().unwrap().len(), 1);
        spawn(&lanes, &log, "urgent", Priority::Urgent, t0);
        wait_for(&log, 6).await;
        let log = log.lock().unwrap();
        let order: Vec<_> = log.iter().map(|(l, _)| *l).collect();
        assert_eq!(order, ["bulk", "urgent", "bulk", "bulk", "bulk", "bulk"]);
        // It had the next slot, not the sixth.
        assert_eq!(log[1].1, Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn both_lanes_together_keep_the_budget() {
        let mut c = config(20);
        c.burst = 5;
        c.urgent_capacity = 64;
        let lanes = Arc::new(Lanes::new(c));
        let log: Log = Arc::default();
        let t0 = Instant::now();
        for i in 0..60 {
            let p = if i % 3 == 0 {
                Priority::Urgent
            } else {
                Priority::Bulk
            };
            spawn(&lanes, &log, if i % 3 == 0 { "u" } else { "b" }, p, t0);
        }
        wait_for(&log, 60).await;
        let times: Vec<Duration> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
        // A burst of 5, then one slot per 20 ms: in any window of length w at most
        // 5 + w / 20 ms calls.
        for (i, a) in times.iter().enumerate() {
            for (j, b) in times.iter().enumerate().skip(i) {
                let w = (*b - *a).as_millis() as usize;
                assert!(j - i < 5 + w / 20 + 1, "{} calls in {w} ms", j - i + 1);
            }
        }
        // Every urgent call was served before the bulk calls waiting with it: at most the
        // first burst may have gone to bulk calls queued before the urgent ones.
        let order: Vec<_> = log.lock().unwrap().iter().map(|(l, _)| *l).collect();
        let last_urgent = order.iter().rposition(|l| *l == "u").unwrap();
        assert!(last_urgent < 20 + 5, "{order:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_urgent_lane_fails_at_once() {
        let lanes = Lanes::new(config(1000));
        lanes.acquire(Priority::Bulk).await.unwrap();
        let t0 = Instant::now();
        let (a, b, c, d, e) = tokio::join!(
            lanes.acquire(Priority::Urgent),
            lanes.acquire(Priority::Urgent),
            lanes.acquire(Priority::Urgent),
            lanes.acquire(Priority::Urgent),
            async {
                settle().await;
                let r = lanes.acquire(Priority::Urgent).await;
                (r, t0.elapsed())
            },
        );
        assert_eq!(e, (Err(Overloaded::Full), Duration::ZERO));
        for r in [a, b, c, d] {
            assert_eq!(r, Ok(()));
        }
        assert_eq!(t0.elapsed(), Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_bulk_lane_makes_the_caller_wait_then_fail_and_takes_no_slot() {
        let mut c = config(3_000);
        c.bulk_capacity = 1;
        c.bulk_wait = Duration::from_secs(2);
        let lanes = Lanes::new(c);
        lanes.acquire(Priority::Bulk).await.unwrap();
        let t0 = Instant::now();
        // One waits in the lane, one waits for a place in it; neither gets a slot in 2 s.
        let (queued, outside) = tokio::join!(lanes.acquire(Priority::Bulk), async {
            settle().await;
            lanes.acquire(Priority::Bulk).await
        });
        let timed_out = Err(Overloaded::TimedOut(Duration::from_secs(2)));
        assert_eq!(queued, timed_out);
        assert_eq!(outside, timed_out);
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        // Those that gave up hold no place and take no slot: the next caller gets the very
        // next one, at 3 s (within its own 2 s).
        lanes.acquire(Priority::Bulk).await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn calls_keep_the_window_ceiling_and_leave_room_for_receipts() {
        let mut c = config(1);
        c.burst = 100;
        c.urgent_capacity = 64;
        c.window = Duration::from_secs(1);
        c.window_max = 10;
        c.urgent_reserve = 2;
        let lanes = Arc::new(Lanes::new(c));
        let log: Log = Arc::default();
        let t0 = Instant::now();
        for _ in 0..12 {
            spawn(&lanes, &log, "bulk", Priority::Bulk, t0);
        }
        settle().await;
        // Bulk calls stop at the reserve, with the budget's slots still free.
        wait_for(&log, 8).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(log.lock().unwrap().len(), 8);
        // Receipts take the reserve and no more.
        for _ in 0..3 {
            spawn(&lanes, &log, "urgent", Priority::Urgent, t0);
        }
        wait_for(&log, 10).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        {
            let log = log.lock().unwrap();
            assert_eq!(log.len(), 10, "{log:?}");
            assert!(log[8..].iter().all(|(l, _)| *l == "urgent"), "{log:?}");
            assert!(log.iter().all(|(_, t)| *t < Duration::from_millis(500)));
        }
        // The rest go once the first grants leave the window: the receipt first.
        wait_for(&log, 15).await;
        let log = log.lock().unwrap();
        assert_eq!(log[10].0, "urgent", "{log:?}");
        assert!(log[10].1 >= Duration::from_secs(1), "{log:?}");
        // In any one-second window, at most 10 calls.
        let mut times: Vec<Duration> = log.iter().map(|(_, t)| *t).collect();
        times.sort();
        for (i, a) in times.iter().enumerate() {
            let within = times[i..]
                .iter()
                .filter(|b| **b - *a < Duration::from_secs(1))
                .count();
            assert!(
                within <= 10,
                "{within} calls within a second of {a:?}: {log:?}"
            );
        }
    }
}
