//! The terminal's state as the kernel keeps it, read beside the shell rather than from what
//! it prints: which process group has the terminal (the shell itself exactly when it reads its
//! next line), that group's leader (its parent, its start, its name, its directory), and
//! whether the terminal echoes what is typed. A backend reads it through [`PtyProbe`]: locally
//! from the PTY's master end and `/proc`, on a target from `/proc` and `stty` through a second
//! channel of the shell's pooled connection. Output the shell's commands print cannot change
//! any of it.
//!
//! Never: trusts text from the shell's output; blocks past its backend's bound (a part that
//! cannot be read is `None`).

use async_trait::async_trait;

/// The terminal's state now; each part `None` when it could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TtyState {
    /// The shell's own process group: its pid, as it leads its session.
    pub shell: Option<u32>,
    /// The terminal's foreground process group.
    pub foreground: Option<u32>,
    /// The leader of the foreground group, while it runs (the shell, when the group is its).
    pub leader: Option<Leader>,
    /// The terminal echoes what is typed (`ECHO`).
    pub echo: Option<bool>,
    /// The terminal hands input over a line at a time (`ICANON`).
    pub canonical: Option<bool>,
    /// Now, in the clock of [`Leader::start`].
    pub now: Option<u64>,
}

impl TtyState {
    /// Whether input is being read with echo off a line at a time: a password prompt
    /// (`getpass`, `read -s`, `sudo`). A line editor (readline, a full-screen program) turns
    /// both off and echoes by itself.
    pub fn hidden_input(&self) -> bool {
        self.echo == Some(false) && self.canonical != Some(false)
    }
}

/// The leader of a terminal's foreground process group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub pid: u32,
    /// Its parent's pid.
    pub ppid: u32,
    /// When it started: clock ticks since the host booted (`/proc/<pid>/stat`'s `starttime`).
    pub start: u64,
    /// Its name as the kernel keeps it (`comm`, at most 15 bytes).
    pub name: String,
    /// Its working directory.
    pub cwd: Option<String>,
}

/// Reads a shell's terminal state beside it.
#[async_trait]
pub trait PtyProbe: Send + Sync {
    /// The state now, as far as it can be read (bounded).
    async fn probe(&self) -> TtyState;
}

/// A probe for a shell whose state cannot be read: every part unknown.
pub struct Unknown;

#[async_trait]
impl PtyProbe for Unknown {
    async fn probe(&self) -> TtyState {
        TtyState::default()
    }
}

/// The fields of `/proc/<pid>/stat` the probe reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    pub name: String,
    pub ppid: u32,
    pub pgrp: u32,
    /// The controlling terminal's device number (0: none).
    pub tty_nr: u64,
    /// The controlling terminal's foreground process group (-1: none).
    pub tpgid: i64,
    pub start: u64,
}

impl Stat {
    /// Parses one `/proc/<pid>/stat` text. The name may hold anything, `)` and spaces
    /// included, so the fields are counted from its last `)`.
    pub fn parse(text: &str) -> Option<Stat> {
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        let pid = text[..open].trim().parse().ok()?;
        let name = text.get(open + 1..close)?.to_string();
        let f: Vec<&str> = text[close + 1..].split_whitespace().collect();
        // Field 3 (state) is f[0]: field k is f[k - 3].
        let num = |k: usize| f.get(k - 3).and_then(|v| v.parse::<i64>().ok());
        Some(Stat {
            pid,
            name,
            ppid: u32::try_from(num(4)?).ok()?,
            pgrp: u32::try_from(num(5)?).ok()?,
            tty_nr: u64::try_from(num(7)?).ok()?,
            tpgid: num(8)?,
            start: u64::try_from(num(22)?).ok()?,
        })
    }

    /// The foreground process group of its terminal, when there is one.
    pub fn foreground(&self) -> Option<u32> {
        u32::try_from(self.tpgid).ok().filter(|g| *g > 0)
    }
}

/// `ECHO` and `ICANON` as `stty -a` prints them (`echo`/`-echo`, `icanon`/`-icanon`, GNU,
/// BSD and BusyBox alike).
pub fn stty_flags(text: &str) -> (Option<bool>, Option<bool>) {
    let mut echo = None;
    let mut canonical = None;
    for word in text.split(|c: char| c.is_whitespace() || c == ';') {
        match word {
            "echo" => echo = Some(true),
            "-echo" => echo = Some(false),
            "icanon" => canonical = Some(true),
            "-icanon" => canonical = Some(false),
            _ => {}
        }
    }
    (echo, canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_from_the_last_parenthesis() {
        let line = "4242 (evil) 1 2 3 4 5) S 4100 4242 4100 34817 4242 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 1 2 3";
        let s = Stat::parse(line).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.name, "evil) 1 2 3 4 5");
        assert_eq!(
            (s.ppid, s.pgrp, s.tty_nr, s.tpgid),
            (4100, 4242, 34817, 4242)
        );
        assert_eq!(s.start, 98765);
        assert_eq!(s.foreground(), Some(4242));
        let none = "1 (init) S 0 1 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 5 1 2 3";
        assert_eq!(Stat::parse(none).unwrap().foreground(), None);
        assert_eq!(Stat::parse("garbage"), None);
        assert_eq!(Stat::parse("12 (x) S 1 2"), None);
    }

    #[test]
    fn stty_flags_are_read_as_each_stty_prints_them() {
        let gnu = "speed 38400 baud; rows 24; columns 80; line = 0;\nisig icanon iexten -echo echoe echok -echonl";
        assert_eq!(stty_flags(gnu), (Some(false), Some(true)));
        let bsd = "lflags: -icanon isig iexten echo echoe -echok echoke";
        assert_eq!(stty_flags(bsd), (Some(true), Some(false)));
        assert_eq!(stty_flags("nothing here"), (None, None));
        let state = |echo, canonical| TtyState {
            echo,
            canonical,
            ..TtyState::default()
        };
        // `read -s`, `sudo`: canonical without echo. readline and full-screen programs: neither.
        assert!(state(Some(false), Some(true)).hidden_input());
        assert!(state(Some(false), None).hidden_input());
        assert!(!state(Some(false), Some(false)).hidden_input());
        assert!(!state(Some(true), Some(true)).hidden_input());
        assert!(!state(None, None).hidden_input());
    }
}
