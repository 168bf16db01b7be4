//! A small map of recently checked answers that stay good for [`FRESH`]: a verified token, and a
//! token's resolved place on a target (its workspace, permission and the target's operations).
//! It spares each request of a busy client the database reads that found them, at the cost of a
//! change — a revoked token, a disabled target, a lowered permission, a new workspace — reaching
//! that client up to [`FRESH`] later. The clock is passed in, so the bound is testable.
//!
//! Never: holds more than its capacity; answers with an entry older than [`FRESH`].

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a checked answer is reused: the longest a revocation or a target, permission or
/// workspace change takes to reach an MCP client that is already calling.
pub const FRESH: Duration = Duration::from_secs(2);

/// Entries kept at most (past it, stale ones go, then all).
pub const CAPACITY: usize = 1024;

/// Answers by key, each good for [`FRESH`] from when it was put.
pub struct Fresh<K, V> {
    map: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash, V: Clone> Default for Fresh<K, V> {
    fn default() -> Self {
        Fresh {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash, V: Clone> Fresh<K, V> {
    /// The answer for `key` if it was put less than [`FRESH`] before `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let mut map = self.map.lock().expect("fresh lock");
        match map.get(key) {
            Some((v, at)) if now.saturating_duration_since(*at) < FRESH => Some(v.clone()),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for `key` from `now`.
    pub fn put(&self, key: K, value: V, now: Instant) {
        let mut map = self.map.lock().expect("fresh lock");
        if map.len() >= CAPACITY && !map.contains_key(&key) {
            map.retain(|_, (_, at)| now.saturating_duration_since(*at) < FRESH);
            if map.len() >= CAPACITY {
                map.clear();
            }
        }
        map.insert(key, (value, now));
    }

    /// Forgets `key` (an answer found wrong).
    pub fn forget(&self, key: &K) {
        self.map.lock().expect("fresh lock").remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().expect("fresh lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_reused_only_within_its_bound() {
        let f: Fresh<&str, u32> = Fresh::default();
        let t0 = Instant::now();
        assert_eq!(f.get(&"a", t0), None);
        f.put("a", 1, t0);
        assert_eq!(f.get(&"a", t0), Some(1));
        assert_eq!(f.get(&"a", t0 + FRESH - Duration::from_millis(1)), Some(1));
        assert_eq!(f.get(&"a", t0 + FRESH), None);
        // A stale entry is gone once seen stale.
        assert_eq!(f.len(), 0);
        f.put("b", 2, t0);
        f.forget(&"b");
        assert_eq!(f.get(&"b", t0), None);
    }

    #[test]
    fn it_never_holds_more_than_its_capacity() {
        let f: Fresh<usize, usize> = Fresh::default();
        let t0 = Instant::now();
        for i in 0..CAPACITY {
            f.put(i, i, t0);
        }
        assert_eq!(f.len(), CAPACITY);
        // Full of fresh entries: a new key clears the map rather than grow it.
        f.put(CAPACITY, 0, t0);
        assert!(f.len() <= CAPACITY);
        assert_eq!(f.get(&CAPACITY, t0), Some(0));
        // Stale entries are what goes first.
        let later = t0 + FRESH;
        for i in 0..CAPACITY - 1 {
            f.put(10_000 + i, i, later);
        }
        f.put(99_999, 1, later);
        assert!(f.len() <= CAPACITY);
        assert_eq!(f.get(&10_000, later), Some(0));
        assert_eq!(f.get(&99_999, later), Some(1));
    }
}
