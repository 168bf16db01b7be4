//! Bounded capture of a command's output: the first half of the budget is kept as it arrives,
//! the last half in a ring buffer, and everything in between is counted and dropped. Memory
//! stays at `limit` bytes however much a command prints, and the model still sees how the output
//! began and how it ended, with an explicit marker saying how much was cut.
//!
//! This module never interprets the bytes beyond UTF-8 boundary repair at the two cut points,
//! and never grows past its limit. A capture may pass every byte on, as it arrives, to a
//! [`LiveTail`] (a running command's live view).

use std::sync::Arc;

use super::live::LiveTail;

/// The text placed between head and tail when bytes were dropped. The count is always in it,
/// so a reader (or a model) knows the output is incomplete and by how much.
pub fn marker(omitted: u64) -> String {
    format!("\n… [{omitted} bytes omitted] …\n")
}

/// Head + tail capture with a fixed memory bound.
#[derive(Debug, Clone)]
pub struct HeadTail {
    /// How many leading bytes to keep: `limit / 2`.
    head_cap: usize,
    /// How many trailing bytes to keep: the rest of the limit, so head + tail == limit.
    tail_cap: usize,
    /// The first bytes seen, up to `head_cap`; filled before the tail gets anything.
    head: Vec<u8>,
    /// Ring buffer of the latest bytes after the head; grows to `tail_cap`, then wraps.
    tail: Vec<u8>,
    /// Index of the oldest byte in `tail` once it is full (0 while it is still filling).
    tail_start: usize,
    /// Every byte pushed, kept or not, for the omitted count.
    total: u64,
    /// A live view the same bytes also go to, as they arrive.
    live: Option<Arc<LiveTail>>,
}

impl HeadTail {
    /// A capture that keeps at most `limit` bytes: the first `limit / 2` and the last
    /// `limit - limit / 2`.
    pub fn new(limit: usize) -> HeadTail {
        let head_cap = limit / 2;
        let tail_cap = limit - head_cap;
        HeadTail {
            head_cap,
            tail_cap,
            // Small initial allocations: most outputs are short, so do not reserve the
            // whole limit up front.
            head: Vec::with_capacity(head_cap.min(4096)),
            tail: Vec::with_capacity(tail_cap.min(4096)),
            tail_start: 0,
            total: 0,
            live: None,
        }
    }

    /// The same capture, also writing every byte pushed into `live` (when given).
    pub fn observed(mut self, live: Option<Arc<LiveTail>>) -> HeadTail {
        self.live = live;
        self
    }

    /// Adds output bytes; any number of calls, memory stays bounded.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if let Some(live) = &self.live {
            live.push(bytes);
        }
        self.total += bytes.len() as u64;
        if self.head.len() < self.head_cap {
            let n = (self.head_cap - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        self.push_tail(bytes);
    }

    fn push_tail(&mut self, mut bytes: &[u8]) {
        let cap = self.tail_cap;
        if cap == 0 || bytes.is_empty() {
            return;
        }
        if bytes.len() >= cap {
            // Only the last `cap` bytes can survive; start the ring afresh.
            self.tail.clear();
            self.tail.extend_from_slice(&bytes[bytes.len() - cap..]);
            self.tail_start = 0;
            return;
        }
        if self.tail.len() < cap {
            let n = (cap - self.tail.len()).min(bytes.len());
            self.tail.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        // The ring is full: overwrite the oldest bytes, wrapping at most once per chunk.
        while !bytes.is_empty() {
            let n = (cap - self.tail_start).min(bytes.len());
            self.tail[self.tail_start..self.tail_start + n].copy_from_slice(&bytes[..n]);
            self.tail_start = (self.tail_start + n) % cap;
            bytes = &bytes[n..];
        }
    }

    /// Bytes seen so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes dropped between head and tail.
    pub fn omitted(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    /// The head and the tail in order (no marker).
    fn parts(mut self) -> (Vec<u8>, Vec<u8>, u64) {
        let omitted = self.omitted();
        self.tail.rotate_left(self.tail_start);
        (self.head, self.tail, omitted)
    }

    /// Head + marker + tail, or everything when nothing was dropped.
    pub fn into_bytes(self) -> Vec<u8> {
        let (mut head, tail, omitted) = self.parts();
        if omitted > 0 {
            head.extend_from_slice(marker(omitted).as_bytes());
        }
        head.extend_from_slice(&tail);
        head
    }

    /// The same as [`into_bytes`](Self::into_bytes) as lossy UTF-8. When bytes were dropped,
    /// a character cut in half at either cut point is trimmed (and counted as omitted) rather
    /// than rendered as replacement garbage.
    pub fn into_string(self) -> String {
        let (head, tail, omitted) = self.parts();
        if omitted == 0 {
            let mut all = head;
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        let head_keep = complete_prefix_len(&head);
        let tail_skip = partial_suffix_start(&tail);
        let trimmed = (head.len() - head_keep + tail_skip) as u64;
        let mut out = String::from_utf8_lossy(&head[..head_keep]).into_owned();
        out.push_str(&marker(omitted + trimmed));
        out.push_str(&String::from_utf8_lossy(&tail[tail_skip..]));
        out
    }
}

/// Length of `bytes` without a trailing, incomplete UTF-8 sequence (at most 3 bytes trimmed).
fn complete_prefix_len(bytes: &[u8]) -> usize {
    // Walk back over at most 3 continuation bytes to the lead byte of the last character.
    let mut i = bytes.len();
    let mut continuation = 0;
    while i > 0 && continuation < 4 {
        let b = bytes[i - 1];
        if b & 0xC0 == 0x80 {
            continuation += 1;
            i -= 1;
            continue;
        }
        let needed = match b {
            0x00..=0x7F => 0,
            0xC0..=0xDF => 1,
            0xE0..=0xEF => 2,
            0xF0..=0xF7 => 3,
            _ => return bytes.len(), // not a lead byte: invalid anyway, leave it to lossy
        };
        return if continuation < needed {
            i - 1
        } else {
            bytes.len()
        };
    }
    bytes.len()
}

/// Number of leading continuation bytes (the rest of a character cut at the front), at most 3.
fn partial_suffix_start(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .take(3)
        .take_while(|b| *b & 0xC0 == 0x80)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic, non-repeating-looking bytes so misplaced slices cannot pass by accident.
    fn pattern(n: usize) -> Vec<u8> {
        let mut x: u32 = 0x9E37_79B9;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn under_the_limit_is_unchanged() {
        let mut c = HeadTail::new(100);
        c.push(b"hello ");
        c.push(b"world");
        assert_eq!(c.total(), 11);
        assert_eq!(c.omitted(), 0);
        assert_eq!(c.clone().into_bytes(), b"hello world");
        assert_eq!(c.into_string(), "hello world");
    }

    #[test]
    fn exactly_at_the_limit_is_unchanged() {
        let data = pattern(64);
        let mut c = HeadTail::new(64);
        c.push(&data[..10]);
        c.push(&data[10..]);
        assert_eq!(c.omitted(), 0);
        assert_eq!(c.into_bytes(), data);
    }

    #[test]
    fn one_byte_over_the_limit_drops_one_byte() {
        let data = pattern(65);
        let mut c = HeadTail::new(64);
        c.push(&data);
        assert_eq!(c.omitted(), 1);
        let mut want = data[..32].to_vec();
        want.extend_from_slice(marker(1).as_bytes());
        want.extend_from_slice(&data[33..]);
        assert_eq!(c.into_bytes(), want);
    }

    #[test]
    fn odd_limit_keeps_exactly_limit_bytes() {
        let data = pattern(100);
        let mut c = HeadTail::new(7);
        c.push(&data);
        assert_eq!(c.omitted(), 93);
        let mut want = data[..3].to_vec();
        want.extend_from_slice(marker(93).as_bytes());
        want.extend_from_slice(&data[96..]);
        assert_eq!(c.into_bytes(), want);
    }

    #[test]
    fn ten_megabytes_in_odd_chunks_keep_head_and_tail_exactly() {
        let data = pattern(10 * 1024 * 1024 + 7);
        let limit = 64 * 1024;
        let mut c = HeadTail::new(limit);
        let sizes = [1usize, 7, 4093, 13, 65_537, 3, 100_003, 31];
        let (mut at, mut k) = (0, 0);
        while at < data.len() {
            let n = sizes[k % sizes.len()].min(data.len() - at);
            c.push(&data[at..at + n]);
            at += n;
            k += 1;
        }
        assert_eq!(c.total(), data.len() as u64);
        let omitted = (data.len() - limit) as u64;
        assert_eq!(c.omitted(), omitted);
        let out = c.into_bytes();
        let m = marker(omitted);
        assert_eq!(out.len(), limit + m.len());
        assert_eq!(&out[..limit / 2], &data[..limit / 2]);
        assert_eq!(&out[limit / 2..limit / 2 + m.len()], m.as_bytes());
        assert_eq!(&out[limit / 2 + m.len()..], &data[data.len() - limit / 2..]);
    }

    #[test]
    fn zero_length_pushes_change_nothing() {
        let mut c = HeadTail::new(8);
        c.push(b"");
        assert_eq!(c.total(), 0);
        c.push(b"abcdefghij");
        c.push(b"");
        assert_eq!(c.total(), 10);
        assert_eq!(c.omitted(), 2);
        let want = format!("abcd{}ghij", marker(2));
        assert_eq!(c.into_string(), want);
    }

    #[test]
    fn zero_limit_keeps_nothing_but_counts() {
        let mut c = HeadTail::new(0);
        c.push(b"abc");
        assert_eq!(c.omitted(), 3);
        assert_eq!(c.into_string(), marker(3));
    }

    #[test]
    fn an_observed_capture_passes_every_byte_on_and_keeps_its_own() {
        let live = Arc::new(LiveTail::new());
        let mut c = HeadTail::new(8).observed(Some(live.clone()));
        c.push(b"one\ntwo\n");
        c.push(b"three\n");
        assert_eq!(live.total(), 14);
        assert_eq!(live.snapshot(false).lines, ["one", "two", "three"]);
        assert_eq!(c.into_string(), format!("one\n{}ree\n", marker(6)));
    }

    #[test]
    fn marker_carries_the_count() {
        assert!(marker(12345).contains("12345 bytes omitted"));
    }

    #[test]
    fn multibyte_characters_cut_at_both_ends_are_trimmed() {
        // "é" is 2 bytes, "€" 3 bytes, "😀" 4 bytes.
        let text = "aé€😀".repeat(50);
        let bytes = text.as_bytes();
        for limit in 2..40 {
            let mut c = HeadTail::new(limit);
            c.push(bytes);
            let out = c.into_string();
            assert!(!out.contains('\u{FFFD}'), "limit {limit}: {out:?}");
            let (head, rest) = out.split_once('\n').expect("marker");
            let tail = rest.rsplit_once('\n').expect("marker").1;
            assert!(text.starts_with(head), "limit {limit}: head {head:?}");
            assert!(text.ends_with(tail), "limit {limit}: tail {tail:?}");
            // Whatever was trimmed is reported in the marker: kept + omitted == total.
            let omitted: usize = rest
                .split('[')
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .and_then(|n| n.parse().ok())
                .expect("count");
            assert_eq!(
                head.len() + tail.len() + omitted,
                bytes.len(),
                "limit {limit}"
            );
        }
    }

    #[test]
    fn multibyte_characters_survive_when_nothing_is_dropped() {
        let mut c = HeadTail::new(100);
        let text = "日本語のテキスト";
        // Push one byte at a time so every character is split across pushes.
        for b in text.as_bytes() {
            c.push(std::slice::from_ref(b));
        }
        assert_eq!(c.into_string(), text);
    }

    #[test]
    fn invalid_bytes_in_the_middle_are_rendered_lossily_not_dropped() {
        let mut c = HeadTail::new(100);
        c.push(b"ok\xFFok");
        assert_eq!(c.into_string(), "ok\u{FFFD}ok");
    }
}
