//! One shell's terminal as the model reads it: a `vt100` screen (with scrollback), the raw
//! output kept in a bounded ring behind a byte cursor, and the answers to the terminal queries
//! `vt100` leaves unanswered — cursor position (`ESC[6n`, `ESC[?6n`), status (`ESC[5n`) and
//! device attributes (DA1 `ESC[c`, DA2 `ESC[>c`) — computed from the screen's state at the
//! moment the query is read, so a program that asks does not hang waiting.
//!
//! Never: performs I/O; grows past its bounds (screen size, scrollback rows, ring bytes).

use std::collections::VecDeque;
use std::num::NonZeroU16;

/// What the screen looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScreenView {
    /// The visible rows, trailing blanks cut.
    pub rows: Vec<String>,
    /// Cursor row and column, 0-based.
    pub cursor: (u16, u16),
    /// Whether a full-screen program switched to the alternate screen.
    pub alternate: bool,
    /// Rows and columns.
    pub size: (u16, u16),
}

impl ScreenView {
    /// The rows as text, one per line, blank rows at the bottom dropped.
    pub fn text(&self) -> String {
        let last = self
            .rows
            .iter()
            .rposition(|r| !r.is_empty())
            .map_or(0, |i| i + 1);
        self.rows[..last].join("\n")
    }

    /// The text of the cursor's row up to the cursor.
    pub fn before_cursor(&self) -> String {
        let row = self
            .rows
            .get(self.cursor.0 as usize)
            .map(String::as_str)
            .unwrap_or("");
        let mut s: String = row.chars().take(self.cursor.1 as usize).collect();
        // The rows are kept without trailing blanks; the cursor may be past them.
        let short = (self.cursor.1 as usize).saturating_sub(s.chars().count());
        s.extend(std::iter::repeat_n(' ', short));
        s
    }
}

/// Answers to terminal queries, written back to the program by the shell's drain task.
#[derive(Default)]
struct Answers {
    out: Vec<u8>,
}

impl vt100::Callbacks for Answers {
    fn unhandled_csi(
        &mut self,
        screen: &mut vt100::Screen,
        i1: Option<u8>,
        _i2: Option<u8>,
        params: &[&[u16]],
        c: char,
    ) {
        let first = params.first().and_then(|p| p.first()).copied().unwrap_or(0);
        let (row, col) = screen.cursor_position();
        match (i1, c, first) {
            // Cursor position report, 1-based (`ESC[?6n`: the DEC form, answered with `?`).
            (None, 'n', 6) => self
                .out
                .extend(format!("\x1b[{};{}R", row + 1, col + 1).as_bytes()),
            (Some(b'?'), 'n', 6) => self
                .out
                .extend(format!("\x1b[?{};{}R", row + 1, col + 1).as_bytes()),
            // Device status: OK.
            (None, 'n', 5) => self.out.extend(b"\x1b[0n"),
            // Primary device attributes: a VT100 with advanced video.
            (None, 'c', 0) => self.out.extend(b"\x1b[?1;2c"),
            // Secondary device attributes: a VT100, firmware 0.
            (Some(b'>'), 'c', 0) => self.out.extend(b"\x1b[>0;0;0c"),
            _ => {}
        }
    }
}

/// Most rows kept above the screen.
pub const SCROLLBACK_ROWS: usize = 1000;
/// Most bytes of raw output kept for `raw` reads; older bytes are dropped (and counted).
pub const RAW_KEEP: usize = 256 * 1024;

/// The terminal state of one shell.
pub struct Emulator {
    parser: vt100::Parser<Answers>,
    /// The last [`RAW_KEEP`] bytes of output, and the absolute offset of its first byte.
    raw: VecDeque<u8>,
    raw_start: u64,
}

impl Emulator {
    pub fn new(rows: u16, cols: u16) -> Emulator {
        let rows = NonZeroU16::new(rows).unwrap_or(NonZeroU16::MIN);
        let cols = NonZeroU16::new(cols).unwrap_or(NonZeroU16::MIN);
        Emulator {
            parser: vt100::Parser::new_with_callbacks(
                rows,
                cols,
                SCROLLBACK_ROWS,
                Answers::default(),
            ),
            raw: VecDeque::new(),
            raw_start: 0,
        }
    }

    /// Takes output from the program; returns the answers to the queries in it (empty when
    /// there were none), to be written back to the program in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.parser.process(bytes);
        self.raw.extend(bytes);
        if self.raw.len() > RAW_KEEP {
            let drop = self.raw.len() - RAW_KEEP;
            self.raw.drain(..drop);
            self.raw_start += drop as u64;
        }
        std::mem::take(&mut self.parser.callbacks_mut().out)
    }

    /// The offset just past the last byte of output (the cursor a `raw` read continues from).
    pub fn end(&self) -> u64 {
        self.raw_start + self.raw.len() as u64
    }

    pub fn screen(&self) -> ScreenView {
        let s = self.parser.screen();
        let (rows, cols) = s.size();
        ScreenView {
            rows: s
                .rows(0, cols.get())
                .map(|r| r.trim_end().to_string())
                .collect(),
            cursor: s.cursor_position(),
            alternate: s.alternate_screen(),
            size: (rows.get(), cols.get()),
        }
    }

    /// The output from `since` on, at most `limit` bytes of it, ANSI stripped; with the offset
    /// it read to and how many bytes before `since` were already dropped from the ring.
    pub fn raw_since(&self, since: u64, limit: usize) -> RawChunk {
        let from = since.max(self.raw_start).min(self.end());
        let skip = (from - self.raw_start) as usize;
        let take = (self.raw.len() - skip).min(limit);
        let bytes: Vec<u8> = self.raw.range(skip..skip + take).copied().collect();
        RawChunk {
            text: crate::exec::live::printable(&String::from_utf8_lossy(&bytes)),
            next: from + take as u64,
            dropped: from - since.min(from),
            more: from + (take as u64) < self.end(),
        }
    }
}

/// A slice of raw output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawChunk {
    /// The output, escape sequences and carriage returns removed.
    pub text: String,
    /// The cursor to read on from.
    pub next: u64,
    /// Bytes asked for that the ring no longer holds.
    pub dropped: u64,
    /// Whether more output follows `next` already.
    pub more: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_position_and_device_attribute_queries_are_answered_from_the_screen() {
        let mut e = Emulator::new(24, 80);
        assert_eq!(e.feed(b"hello"), b"");
        assert_eq!(e.feed(b"\x1b[6n"), b"\x1b[1;6R");
        // A query split across two reads is answered once, where it ends.
        assert_eq!(e.feed(b"\r\n\x1b["), b"");
        assert_eq!(e.feed(b"6n"), b"\x1b[2;1R");
        assert_eq!(e.feed(b"\x1b[?6n"), b"\x1b[?2;1R");
        assert_eq!(e.feed(b"\x1b[c\x1b[0c"), b"\x1b[?1;2c\x1b[?1;2c");
        assert_eq!(e.feed(b"\x1b[>c"), b"\x1b[>0;0;0c");
        assert_eq!(e.feed(b"\x1b[5n"), b"\x1b[0n");
        // What vt100 handles itself gets no answer.
        assert_eq!(e.feed(b"\x1b[2J\x1b[H\x1b[1m"), b"");
    }

    #[test]
    fn the_screen_shows_rows_cursor_and_the_alternate_screen() {
        let mut e = Emulator::new(5, 20);
        e.feed(b"$ ls\r\na  b\r\n$ ");
        let v = e.screen();
        assert_eq!(v.rows[..3], ["$ ls", "a  b", "$"]);
        assert_eq!(v.cursor, (2, 2));
        assert!(!v.alternate);
        assert_eq!(v.text(), "$ ls\na  b\n$");
        assert_eq!(v.before_cursor(), "$ ");
        e.feed(b"\x1b[?1049h\x1b[H\x1b[2Jfull screen");
        let v = e.screen();
        assert!(v.alternate);
        assert_eq!(v.rows[0], "full screen");
        assert_eq!(v.size, (5, 20));
    }

    #[test]
    fn raw_output_is_read_behind_a_cursor_stripped_and_bounded() {
        let mut e = Emulator::new(24, 80);
        e.feed(b"\x1b[1;31mred\x1b[0m\r\n\x1b]0;title\x07ok\r\n");
        let c = e.raw_since(0, 1 << 20);
        assert_eq!(c.text, "red\nok\n");
        assert!(!c.more);
        assert_eq!(c.next, e.end());
        let c2 = e.raw_since(c.next, 1 << 20);
        assert_eq!(c2.text, "");
        // A limit leaves the rest for the next read.
        let part = e.raw_since(0, 4);
        assert!(part.more);
        assert_eq!(part.next, 4);
        // The ring keeps the last RAW_KEEP bytes and says how many were dropped.
        let big = vec![b'x'; RAW_KEEP + 100];
        e.feed(&big);
        let c = e.raw_since(0, 16);
        assert!(c.dropped > 0);
        assert_eq!(c.text, "x".repeat(16));
    }
}
