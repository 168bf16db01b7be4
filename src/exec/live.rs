//! Live output of a running command: a [`LiveTail`] is a small ring of the latest bytes a
//! command printed (stdout and stderr together, as they arrive), written by the capture path
//! ([`super::truncate::HeadTail::push`]) and sampled by whoever shows progress.
//!
//! The writer never waits: a push copies at most [`TAIL_BYTES`] into the ring under a lock held
//! for that copy only and wakes the sampler (a [`Notify`] permit, so wake-ups coalesce). Memory
//! is [`TAIL_BYTES`] however much a command prints; nothing is queued. A sampler that falls
//! behind simply sees a later tail.
//!
//! [`LiveTail::snapshot`] turns the ring into the last few complete lines, made printable
//! ([`printable`]: escape sequences and control characters removed; a carriage return ends a
//! line, as it does for a progress bar). A line cut at the front of the ring, and while the
//! command runs the line still being written, are left out, so a tail never shows part of a
//! line (nor half a secret on it). Filtering secrets and markup is the consumer's job.
//!
//! Never: holds more than [`TAIL_BYTES`]; blocks a writer on a reader.

use std::sync::Mutex;

use tokio::sync::Notify;

/// Latest output bytes kept.
pub const TAIL_BYTES: usize = 4096;
/// Lines a snapshot keeps.
pub const TAIL_LINES: usize = 5;
/// Characters a tail is cut to for display ([`Tail::text`]).
pub const TAIL_CHARS: usize = 400;

/// The latest output of one running command. Share it as `Arc<LiveTail>`.
#[derive(Default)]
pub struct LiveTail {
    ring: Mutex<Ring>,
    changed: Notify,
    /// A line starting with this is never shown (the wrapper's own marker line).
    hidden: Mutex<Option<String>>,
}

/// A fixed ring of the latest [`TAIL_BYTES`] bytes, filled by slice copies (no per-byte work).
#[derive(Default)]
struct Ring {
    /// Grows to [`TAIL_BYTES`], then wraps.
    buf: Vec<u8>,
    /// Index of the oldest byte once full (0 while filling).
    start: usize,
    /// Every byte pushed, kept or not.
    total: u64,
}

impl Ring {
    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let mut data = &data[data.len().saturating_sub(TAIL_BYTES)..];
        if self.buf.len() < TAIL_BYTES {
            let n = (TAIL_BYTES - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        while !data.is_empty() {
            let n = (TAIL_BYTES - self.start).min(data.len());
            self.buf[self.start..self.start + n].copy_from_slice(&data[..n]);
            self.start = (self.start + n) % TAIL_BYTES;
            data = &data[n..];
        }
    }

    /// The bytes in order, oldest first.
    fn bytes(&self) -> Vec<u8> {
        [&self.buf[self.start..], &self.buf[..self.start]].concat()
    }
}

impl std::fmt::Debug for LiveTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveTail")
    }
}

/// The last complete lines of a command's output, printable, not yet cut for display.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tail {
    pub lines: Vec<String>,
}

impl LiveTail {
    pub fn new() -> LiveTail {
        LiveTail::default()
    }

    /// Adds output bytes (never waits on a reader).
    pub fn push(&self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.ring
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(data);
        self.changed.notify_one();
    }

    /// Bytes pushed so far.
    pub fn total(&self) -> u64 {
        self.ring.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// Leaves out every line that starts with `prefix` (a marker the wrapper prints).
    pub fn hide_lines_starting_with(&self, prefix: &str) {
        *self.hidden.lock().unwrap_or_else(|p| p.into_inner()) = Some(prefix.to_string());
    }

    /// Waits until something was pushed since the last wait returned (at once if it was).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The last [`TAIL_LINES`] complete, non-blank lines. `ended`: the command is over, so
    /// its last line counts even without a newline.
    pub fn snapshot(&self, ended: bool) -> Tail {
        let (bytes, wrapped) = {
            let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            (ring.bytes(), ring.total > ring.buf.len() as u64)
        };
        let is_end = |b: &u8| *b == b'\n' || *b == b'\r';
        let mut from = 0;
        if wrapped {
            // The first line lost its beginning to the ring.
            match bytes.iter().position(is_end) {
                Some(i) => from = i + 1,
                None => return Tail::default(),
            }
        }
        let mut to = bytes.len();
        if !ended {
            // The line still being written is not shown until it ends.
            to = bytes
                .iter()
                .rposition(is_end)
                .map_or(0, |i| i + 1)
                .max(from);
        }
        let text = String::from_utf8_lossy(&bytes[from..to]);
        let hidden = self
            .hidden
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut lines: Vec<String> = text
            .split(['\n', '\r'])
            .map(|l| printable(l).trim_end().to_string())
            .filter(|l| !l.trim().is_empty())
            .filter(|l| hidden.as_deref().is_none_or(|h| !l.starts_with(h)))
            .collect();
        let skip = lines.len().saturating_sub(TAIL_LINES);
        lines.drain(..skip);
        Tail { lines }
    }
}

impl Tail {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// The lines joined, cut to [`TAIL_CHARS`] from the end: older lines go first, and a
    /// single longer line keeps its end behind `…`.
    pub fn text(&self) -> String {
        let mut kept: Vec<&str> = Vec::new();
        let mut chars = 0;
        for line in self.lines.iter().rev() {
            let n = line.chars().count() + usize::from(!kept.is_empty());
            if chars + n > TAIL_CHARS {
                if kept.is_empty() {
                    let tail: String = {
                        let all: Vec<char> = line.chars().collect();
                        all[all.len() - (TAIL_CHARS - 1)..].iter().collect()
                    };
                    return format!("…{tail}");
                }
                break;
            }
            chars += n;
            kept.push(line);
        }
        kept.reverse();
        kept.join("\n")
    }
}

/// `text` without terminal control: escape sequences (CSI, OSC, DCS, SOS, PM, APC and
/// two-character ones) are dropped whole, as are C0 controls but newline and tab, DEL, C1
/// controls (the 8-bit CSI and OSC among them) and the bidirectional overrides that make a
/// line read differently from what it holds.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\t' => out.push(c),
            '\u{1b}' => match chars.next() {
                // CSI: parameters and intermediates up to a final byte.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                }
                // Strings ended by BEL or ST (ESC \\).
                Some(']' | 'P' | 'X' | '^' | '_') => skip_string(&mut chars),
                // Intermediates (`ESC ( B`), then a final byte; a two-character sequence; or
                // a lone ESC at the end.
                Some(c) if ('\u{20}'..='\u{2f}').contains(&c) => {
                    for c in chars.by_ref() {
                        if !('\u{20}'..='\u{2f}').contains(&c) {
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\u{9b}' => {
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            }
            '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            c if c.is_control() => {}
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' => {}
            c => out.push(c),
        }
    }
    out
}

/// Skips a control string up to its terminator: BEL, ST (`ESC \\`) or the 8-bit ST.
fn skip_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(c) = chars.next() {
        match c {
            '\u{7}' | '\u{9c}' => return,
            '\u{1b}' => {
                if chars.peek() == Some(&'\\') {
                    chars.next();
                }
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(t: &LiveTail, ended: bool) -> Vec<String> {
        t.snapshot(ended).lines
    }

    #[test]
    fn the_line_being_written_waits_for_its_end() {
        let t = LiveTail::new();
        t.push(b"step-1\nstep-2\nhalf");
        assert_eq!(lines(&t, false), ["step-1", "step-2"]);
        t.push(b" done\n");
        assert_eq!(lines(&t, false), ["step-1", "step-2", "half done"]);
        t.push(b"last, no newline");
        assert_eq!(lines(&t, true).last().unwrap(), "last, no newline");
    }

    #[test]
    fn only_the_last_lines_are_kept_and_memory_stays_bounded() {
        let t = LiveTail::new();
        for i in 0..100_000 {
            t.push(format!("line {i}\n").as_bytes());
        }
        assert_eq!(
            lines(&t, false),
            [
                "line 99995",
                "line 99996",
                "line 99997",
                "line 99998",
                "line 99999"
            ]
        );
        assert!(t.ring.lock().unwrap().buf.len() <= TAIL_BYTES);
        t.push(&vec![b'x'; 3 * TAIL_BYTES]);
        assert!(t.ring.lock().unwrap().buf.len() <= TAIL_BYTES);
    }

    #[test]
    fn the_ring_keeps_the_latest_bytes_in_order_across_wraps() {
        let t = LiveTail::new();
        let mut all = Vec::new();
        for (i, n) in [1usize, 4095, 3, 5000, 17, 4096, 1, 9000, 2]
            .iter()
            .enumerate()
        {
            let chunk: Vec<u8> = (0..*n).map(|k| (k * 31 + i * 7) as u8).collect();
            t.push(&chunk);
            all.extend_from_slice(&chunk);
            let ring = t.ring.lock().unwrap();
            assert_eq!(
                ring.bytes(),
                all[all.len().saturating_sub(TAIL_BYTES)..],
                "{i}"
            );
            assert_eq!(ring.total, all.len() as u64);
        }
    }

    #[test]
    fn a_line_cut_by_the_ring_is_left_out_whole() {
        let t = LiveTail::new();
        let long = format!("secret-start{}\n", "y".repeat(TAIL_BYTES));
        t.push(long.as_bytes());
        t.push(b"next\n");
        assert_eq!(lines(&t, false), ["next"]);
        // One line longer than the ring and nothing after it: nothing to show.
        let t = LiveTail::new();
        t.push(&vec![b'z'; TAIL_BYTES + 10]);
        assert!(t.snapshot(true).is_empty());
    }

    #[test]
    fn escapes_controls_and_carriage_returns_never_reach_a_tail() {
        let t = LiveTail::new();
        t.push(
            b"\x1b[31mred\x1b[0m\n\x1b]0;title\x07after\n 10%\r 50%\r100%\n\x1b[2Jclear\x08\n\n\n",
        );
        assert_eq!(lines(&t, false), ["after", " 10%", " 50%", "100%", "clear"]);
        let t = LiveTail::new();
        t.push(b"ok\n\x1b[2J\x1b[Hnext\n");
        assert_eq!(lines(&t, false), ["ok", "next"]);
    }

    #[test]
    fn hidden_marker_lines_are_left_out() {
        let t = LiveTail::new();
        t.hide_lines_starting_with("__mark_");
        t.push(b"out\n__mark_/home/u\n");
        assert_eq!(lines(&t, true), ["out"]);
    }

    #[test]
    fn text_is_cut_from_the_front() {
        let tail = Tail {
            lines: vec!["a".repeat(300), "b".repeat(150), "c".into()],
        };
        assert_eq!(tail.text(), format!("{}\nc", "b".repeat(150)));
        let tail = Tail {
            lines: vec!["d".repeat(1000)],
        };
        let text = tail.text();
        assert_eq!(text.chars().count(), TAIL_CHARS);
        assert!(text.starts_with('…') && text.ends_with('d'));
    }

    #[tokio::test]
    async fn wake_ups_coalesce_and_are_never_lost() {
        let t = LiveTail::new();
        t.push(b"a\n");
        t.push(b"b\n");
        // A push before the wait is not lost: the wait returns at once.
        tokio::time::timeout(std::time::Duration::from_secs(1), t.changed())
            .await
            .expect("woken");
        // Both pushes made one wake-up.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), t.changed())
                .await
                .is_err()
        );
    }

    #[test]
    fn terminal_control_is_removed() {
        let cases = [
            ("plain\ttext\nnext", "plain\ttext\nnext"),
            ("\u{1b}[2J\u{1b}[1;1Hcleared", "cleared"),
            ("red \u{1b}[31mword\u{1b}[0m", "red word"),
            ("\u{1b}]0;owned title\u{7}after", "after"),
            ("\u{1b}]52;c;cm0gLXJmIH4=\u{1b}\\clip", "clip"),
            ("\u{1b}P1$qm\u{1b}\\dcs", "dcs"),
            ("\u{9b}31mc1\u{9d}8;;x\u{9c}", "c1"),
            ("over\rwrite\u{8}\u{7f}", "overwrite"),
            ("a\u{202e}txt.exe", "atxt.exe"),
            ("\u{1b}7\u{1b}8esc", "esc"),
            ("\u{1b}(B\u{1b}[mreset", "reset"),
            ("end\u{1b}", "end"),
            ("\u{1b}]unterminated", ""),
            ("ünïcødé 中文", "ünïcødé 中文"),
        ];
        for (input, want) in cases {
            assert_eq!(printable(input), want, "{input:?}");
        }
    }
}
