//! Interactive shells: a PTY on the section's backend, its output drained continuously into
//! a terminal emulator ([`screen`]), read as a person sees it (the screen) or as text (the raw
//! output behind a cursor). [`Shells`] is the one registry per process, keyed by *section* and
//! shell id, with its bounds: shells per section, per host (below the SSH connection's channel
//! budget, so shells never starve commands) and in all, an idle timeout, scrollback, bytes per
//! read, the longest wait. A backend opens a PTY through [`PtyHost`]: over SSH a PTY channel
//! on the target's pooled connection (`exec::ssh::pty`), locally a PTY whose shell the launch
//! server starts as it starts a command (`exec::local::pty`).
//!
//! Every shell has a task (on the app's tracker) that reads its output whether or not anyone
//! reads the shell — an undrained SSH channel would stall the whole pooled connection — feeds it
//! to the emulator, writes the answers to terminal queries back, and closes the shell when it
//! ends, idles too long, or is closed. Shells live in this process's memory only: an id from
//! another process (a restart, another replica) is reported closed.
//!
//! At a password prompt (on the cursor's line) a shell takes only control input — Enter,
//! Ctrl-C, Ctrl-D — never text: a secret is never typed by the agent. Each shell keeps the line
//! being typed ([`typed`]), so a caller can judge the lines a write would submit
//! ([`Shells::entering`]) before it sends them ([`Shells::write_entered`]).
//!
//! Who reads those lines is taken from the terminal's kernel state ([`probe`]), never from the
//! screen (which the commands being judged draw): the shell itself when its process group has
//! the terminal, or when that cannot be read. A line goes to a program unjudged only when the
//! program leading the foreground group is one that runs what is typed into it anyway (an
//! editor, a pager, a prompt: [`crate::bash::spec::runs_typed_input`]), a child of the shell
//! started after a write whose judged lines started such a program and before the next write
//! the shell read — so a job started otherwise, or one that took the terminal from the
//! background, has its lines judged as shell lines, and so does whatever such a program leaves
//! behind in the input for the shell. The same state says when input is typed with echo off
//! (a password prompt), for the caller's audit.
//!
//! A shell that closes on its own account (it ended, idled out, its section's backend changed,
//! the service stopped) is queued, boundedly, for the audit ([`Shells::take_closed`]); a close a
//! caller asked for is recorded by that caller.
//!
//! Never: knows chats, models or bindings (a caller tells it the section's backend changed,
//! [`Shells::follow`]); falls back from a remote backend to the local one; keeps anything
//! unbounded.

pub mod probe;
pub mod screen;
mod typed;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ExecError;
pub use probe::{Leader, PtyProbe, TtyState};
pub use screen::{RawChunk, ScreenView};
pub use typed::EnteredLine;

/// Most shells open at once in one section.
pub const PER_SECTION: usize = 4;
/// Most shells open at once in this process.
pub const TOTAL: usize = 256;
/// A shell nobody wrote to or read for this long is closed.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// Most bytes of raw output one read returns.
pub const READ_BYTES: usize = 16 * 1024;
/// Most bytes one write sends.
pub const WRITE_BYTES: usize = 16 * 1024;
/// The longest a read waits.
pub const MAX_WAIT: Duration = Duration::from_secs(120);
/// Quiet time after which output counts as settled (a read without `expect`).
const SETTLE: Duration = Duration::from_millis(250);
/// How long an open waits for the first screen to settle.
const FIRST_SCREEN: Duration = Duration::from_secs(3);
/// Closed shells (and sections whose shells were closed) remembered, for the note.
const NOTES: usize = 1024;

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub rows: u16,
    pub cols: u16,
}

/// What a new shell asks for.
#[derive(Debug, Clone)]
pub struct OpenOpts {
    pub rows: u16,
    pub cols: u16,
    /// `TERM` for the program ([`valid_term`]).
    pub term: String,
    /// A person (or the backend's policy) allowed this shell, so lines the guard would ask
    /// about may be typed into it ([`Entering::risky_allowed`]).
    pub risky_allowed: bool,
}

/// Whether `term` is a terminal type's name (`xterm`, `vt100`, `screen-256color`): 1 to 32
/// letters, digits, `.`, `-`, `_` or `+`, so never a path to a terminfo file.
pub fn valid_term(term: &str) -> bool {
    !term.is_empty()
        && term.len() <= 32
        && term
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
}

impl Default for OpenOpts {
    fn default() -> Self {
        OpenOpts {
            rows: 24,
            cols: 80,
            term: "xterm".into(),
            risky_allowed: false,
        }
    }
}

/// The program's output, chunk by chunk; `None` once it ended (exit, channel closed).
#[async_trait]
pub trait PtyOutput: Send {
    async fn next(&mut self) -> Option<Vec<u8>>;
}

/// Input to the program, and the close of the PTY.
#[async_trait]
pub trait PtyInput: Send + Sync {
    async fn send(&self, data: &[u8]) -> Result<(), ExecError>;
    /// Ends the session (the program gets a hangup); idempotent.
    async fn close(&self);
}

/// An open PTY: its output, its input, and its terminal's state read beside it.
pub struct PtyIo {
    pub output: Box<dyn PtyOutput>,
    pub input: Arc<dyn PtyInput>,
    pub probe: Arc<dyn PtyProbe>,
}

/// A backend that can open a PTY running the user's shell.
#[async_trait]
pub trait PtyHost: Send + Sync {
    /// `local` or the target's alias: the key of the per-host bound.
    fn name(&self) -> &str;
    /// Where it runs, for the model (`web · deploy@10.0.0.5`).
    fn location(&self) -> String;
    /// Most shells open at once on this host.
    fn shell_budget(&self) -> usize;
    /// Opens a PTY of `size` with `TERM=term` running the user's login shell, and returns once
    /// the host confirmed both.
    async fn open_pty(&self, size: Size, term: &str) -> Result<PtyIo, ExecError>;
    /// Whether its shells may only read their workspace (a local `read` workspace: the sandbox
    /// grants it read-only, and the shell defines the read-only `git`).
    fn read_only(&self) -> bool {
        false
    }
}

/// Errors of the shell registry, for the model.
#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("{0}")]
    Exec(#[from] ExecError),
    /// No such shell here: closed, or opened in another process.
    #[error("{0}")]
    Closed(String),
    /// A bound refused the request.
    #[error("{0}")]
    Bound(String),
    /// The request itself is wrong.
    #[error("{0}")]
    Invalid(String),
}

/// A new shell, as `shell_open` reports it.
#[derive(Debug, Clone)]
pub struct ShellInfo {
    pub shell_id: String,
    pub location: String,
    pub screen: ScreenView,
    /// The raw output's end: a `raw` read from here gets only what comes next.
    pub end: u64,
}

/// One open shell, as `shell_list` reports it.
#[derive(Debug, Clone)]
pub struct ShellSummary {
    pub shell_id: String,
    /// The host's name (`local`, or a target alias).
    pub host: String,
    pub location: String,
    pub size: (u16, u16),
    pub idle: Duration,
    /// The cursor's line, up to the cursor (the prompt, often).
    pub prompt: String,
}

/// How a read shows the shell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// The visible screen, the cursor, the alternate-screen flag.
    Screen,
    /// The output since a cursor, escape sequences stripped.
    Raw,
}

/// What a read asks for.
#[derive(Debug, Clone)]
pub struct ReadOpts {
    pub mode: ReadMode,
    /// For `raw`: the offset to read from; by default where the last raw read stopped.
    pub since: Option<u64>,
    /// How long to wait (at most [`MAX_WAIT`]): until `expect` matches, or without it until
    /// new output has settled.
    pub wait: Duration,
    /// Returns as soon as this matches the screen (`screen`) or the output since the cursor
    /// (`raw`).
    pub expect: Option<regex::Regex>,
}

/// What a read found.
#[derive(Debug, Clone)]
pub struct ShellRead {
    pub location: String,
    /// The screen (`screen` mode).
    pub screen: Option<ScreenView>,
    /// The output (`raw` mode).
    pub raw: Option<RawChunk>,
    /// Whether `expect` matched (`None` without one).
    pub matched: Option<bool>,
    /// Set when the shell has ended, saying how (this is its last read).
    pub ended: Option<String>,
    /// The end of the raw output so far.
    pub end: u64,
    /// The wait was cancelled (the turn was stopped) before it ended.
    pub cancelled: bool,
}

/// What an audit row records for input typed with echo off.
pub const HIDDEN_INPUT: &str = "[input hidden]";

/// Who reads what is typed, by the terminal's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reader {
    /// The shell: its process group has the terminal, or that cannot be read.
    Shell,
    /// A program the shell was not seen to start from a judged line (a job of another kind, a
    /// shell's own jobs, one that took the terminal): what it reads may reach the shell, so its
    /// lines are judged as shell lines too.
    Unknown,
    /// This program, which runs what is typed into it anyway, started by the shell from a
    /// write whose lines were judged: its keys are not shell lines.
    Program(String),
}

/// What a write would submit to a shell, for its caller to judge.
#[derive(Debug, Clone)]
pub struct Entering {
    /// The lines its Enters submit.
    pub lines: Vec<EnteredLine>,
    /// Who reads them.
    pub reader: Reader,
    /// The working directory of the program that reads them (the shell's, when it does), to
    /// judge relative paths against; `None` when it cannot be read.
    pub cwd: Option<String>,
    /// Typed with echo off (a password prompt), or at what the screen shows as one when the
    /// terminal's state cannot be read: never to be recorded as typed.
    pub hidden: bool,
    /// The shell was opened with [`OpenOpts::risky_allowed`].
    pub risky_allowed: bool,
    /// The shell may only read its workspace ([`PtyHost::read_only`]).
    pub read_only: bool,
    /// When the terminal's state was read ([`Leader::start`]'s clock).
    now: Option<u64>,
    /// The shell's count of writes then: a write between this and [`Shells::write_entered`]
    /// makes it stale.
    writes: u64,
}

impl Entering {
    /// What an audit row records of `data`, the input this was read for: redacted of
    /// secret-like words (as commands are) and clipped to `max` characters, or
    /// [`HIDDEN_INPUT`] when it is typed with echo off.
    pub fn recorded(&self, data: &str, max: usize) -> String {
        if self.hidden {
            return HIDDEN_INPUT.to_string();
        }
        crate::mask::redact(data).chars().take(max).collect()
    }
}

/// Which jobs of a shell run what is typed into them, as far as its judged writes tell.
#[derive(Debug, Default)]
struct Jobs {
    /// Children of the shell started in this span (from, until: [`Leader::start`]'s clock)
    /// came from a write whose lines were judged and started a program that runs what is typed
    /// into it.
    window: Option<(u64, Option<u64>)>,
    /// Writes sent so far.
    writes: u64,
}

impl Jobs {
    /// Whether `leader`, the foreground group's leader, is such a program of `shell`.
    fn trusts(&self, shell: u32, leader: &Leader) -> bool {
        let Some((from, until)) = self.window else {
            return false;
        };
        leader.ppid == shell
            && leader.start >= from
            && until.is_none_or(|u| leader.start < u)
            && crate::bash::spec::typed_input_program(&leader.name)
    }

    /// After `e` was sent: a write of judged shell lines starting such a program (none in the
    /// background) opens the window; other lines read by the shell close it; lines given to a
    /// program end it for jobs started from then on.
    fn sent(&mut self, e: &Entering) {
        self.writes += 1;
        if e.lines.is_empty() {
            return;
        }
        self.window = match (&e.reader, self.window) {
            (Reader::Program(_), Some((from, None))) => e.now.map(|t| (from, Some(t))),
            (Reader::Program(_), w) => w,
            (Reader::Shell, _)
                if e.lines.iter().any(|l| l.starts.is_some())
                    && !e.lines.iter().any(|l| l.backgrounds) =>
            {
                e.now.map(|t| (t, None))
            }
            _ => None,
        };
    }
}

/// One open shell.
struct Shell {
    id: String,
    section: String,
    /// The host's name (`local`, or a target alias).
    host: String,
    location: String,
    size: Size,
    emu: StdMutex<screen::Emulator>,
    input: Arc<dyn PtyInput>,
    /// Bumped on every chunk of output and when the shell ends.
    changed: watch::Sender<u64>,
    /// Cancelled to close the shell; `stop_reason` says why.
    stop: CancellationToken,
    stop_reason: StdMutex<Option<String>>,
    /// Set once the shell ended (how).
    ended: StdMutex<Option<String>>,
    last_used: StdMutex<Instant>,
    /// Where the last `raw` read stopped.
    read_mark: StdMutex<u64>,
    /// The line being typed.
    typed: StdMutex<typed::TypedLine>,
    /// What its judged writes say about its jobs.
    jobs: StdMutex<Jobs>,
    /// Held by a write from its check to its record, so writes do not interleave.
    writing: tokio::sync::Mutex<()>,
    /// Reads the terminal's state.
    probe: Arc<dyn PtyProbe>,
    risky_allowed: bool,
    read_only: bool,
    /// The caller that closed it records the close itself.
    reported: std::sync::atomic::AtomicBool,
}

impl Shell {
    fn touch(&self) {
        *self.last_used.lock().expect("shell lock") = Instant::now();
    }

    fn ended(&self) -> Option<String> {
        self.ended.lock().expect("shell lock").clone()
    }

    fn close(&self, why: &str) {
        self.stop_reason
            .lock()
            .expect("shell lock")
            .get_or_insert_with(|| why.to_string());
        self.stop.cancel();
    }
}

/// The registry's state.
#[derive(Default)]
struct Registry {
    shells: StdMutex<Shelves>,
    /// Shells that closed without a caller recording it, for the audit ([`Shells::take_closed`]).
    unreported: StdMutex<VecDeque<ClosedShell>>,
    /// Woken when `unreported` grows.
    closed_wake: tokio::sync::Notify,
}

/// A shell that closed on its own account — it ended, idled out, its section's backend changed,
/// the service stopped — rather than by a caller that records the close itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedShell {
    /// The registry's key of its section.
    pub section: String,
    pub shell_id: String,
    /// `local` or the target's alias.
    pub host: String,
    pub why: String,
    /// When it was found closed: its audit row's time, so that the row follows the input
    /// that ended it even when that input's own row commits later.
    pub at: chrono::DateTime<chrono::Utc>,
}

#[derive(Default)]
struct Shelves {
    open: HashMap<String, Arc<Shell>>,
    /// (section, host) of opens in progress, counted against the bounds.
    opening: Vec<(String, String)>,
    /// Why a shell was closed, by id (for a later call on it), oldest first.
    closed: VecDeque<(String, String)>,
    /// A note for a section's next shell call (its shells were closed by a binding change).
    section_notes: VecDeque<(String, String)>,
}

impl Shelves {
    fn remember(list: &mut VecDeque<(String, String)>, key: &str, note: String) {
        list.retain(|(k, _)| k != key);
        if list.len() >= NOTES {
            list.pop_front();
        }
        list.push_back((key.to_string(), note));
    }

    fn count(&self, f: impl Fn(&str, &str) -> bool) -> usize {
        self.open
            .values()
            .filter(|s| f(&s.section, &s.host))
            .count()
            + self.opening.iter().filter(|(s, h)| f(s, h)).count()
    }
}

/// Takes back an open-in-progress place on drop.
struct Opening {
    registry: Arc<Registry>,
    key: (String, String),
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut s = self.registry.shells.lock().expect("shells lock");
        if let Some(i) = s.opening.iter().position(|k| *k == self.key) {
            s.opening.swap_remove(i);
        }
    }
}

/// Every interactive shell of this process. One per app (in `Executors`).
pub struct Shells {
    registry: Arc<Registry>,
    /// The app's tracker: each shell's drain task runs on it.
    tasks: TaskTracker,
    /// A shell unused this long is closed.
    idle: Duration,
}

impl Shells {
    pub fn new(tasks: TaskTracker) -> Shells {
        Shells::with_idle(tasks, IDLE)
    }

    /// With another idle timeout (tests).
    pub fn with_idle(tasks: TaskTracker, idle: Duration) -> Shells {
        Shells {
            registry: Arc::new(Registry::default()),
            tasks,
            idle,
        }
    }

    fn lookup(&self, section: &str, shell_id: &str) -> Result<Arc<Shell>, ShellError> {
        let s = self.registry.shells.lock().expect("shells lock");
        if let Some(shell) = s.open.get(shell_id)
            && shell.section == section
        {
            return Ok(shell.clone());
        }
        Err(ShellError::Closed(
            match s.closed.iter().find(|(id, _)| id == shell_id) {
                Some((_, why)) => format!("shell `{shell_id}` is closed: {why}"),
                None => format!(
                    "no shell `{shell_id}` is open in this thread; shells live in the memory of one service process, so one opened before a restart or on another replica is closed; open a new one with shell_open"
                ),
            },
        ))
    }

    /// Opens a shell for `section` on `host`, within the bounds, and returns it with its first
    /// screen (once the prompt has settled, at most a few seconds).
    pub async fn open(
        &self,
        host: Arc<dyn PtyHost>,
        section: &str,
        opts: OpenOpts,
    ) -> Result<ShellInfo, ShellError> {
        if !(2..=200).contains(&opts.rows) || !(10..=500).contains(&opts.cols) {
            return Err(ShellError::Invalid(
                "rows must be 2 to 200 and cols 10 to 500".into(),
            ));
        }
        if !valid_term(&opts.term) {
            return Err(ShellError::Invalid(
                "term must be a terminal type such as xterm or vt100".into(),
            ));
        }
        let name = host.name().to_string();
        let place = {
            let mut s = self.registry.shells.lock().expect("shells lock");
            if s.count(|sec, _| sec == section) >= PER_SECTION {
                return Err(ShellError::Bound(format!(
                    "this thread already has {PER_SECTION} shells open: close one with shell_close first"
                )));
            }
            let budget = host.shell_budget();
            if s.count(|_, h| h == name) >= budget {
                return Err(ShellError::Bound(format!(
                    "`{name}` already has {budget} shells open (the most it may have, so commands keep their channels); close one first or try later"
                )));
            }
            if s.count(|_, _| true) >= TOTAL {
                return Err(ShellError::Bound(format!(
                    "the service has {TOTAL} shells open, its limit; close one first or try later"
                )));
            }
            let key = (section.to_string(), name.clone());
            s.opening.push(key.clone());
            Opening {
                registry: self.registry.clone(),
                key,
            }
        };
        let size = Size {
            rows: opts.rows,
            cols: opts.cols,
        };
        let io = host.open_pty(size, &opts.term).await?;
        let shell = Arc::new(Shell {
            id: format!("sh_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            section: section.to_string(),
            host: name,
            location: host.location(),
            size,
            emu: StdMutex::new(screen::Emulator::new(opts.rows, opts.cols)),
            input: io.input,
            changed: watch::Sender::new(0),
            stop: CancellationToken::new(),
            stop_reason: StdMutex::new(None),
            ended: StdMutex::new(None),
            last_used: StdMutex::new(Instant::now()),
            read_mark: StdMutex::new(0),
            typed: StdMutex::new(typed::TypedLine::default()),
            jobs: StdMutex::new(Jobs::default()),
            writing: tokio::sync::Mutex::new(()),
            probe: io.probe,
            risky_allowed: opts.risky_allowed,
            read_only: host.read_only(),
            reported: Default::default(),
        });
        self.registry
            .shells
            .lock()
            .expect("shells lock")
            .open
            .insert(shell.id.clone(), shell.clone());
        // The open place is given back (it takes the lock itself) once the shell counts.
        drop(place);
        self.tasks.spawn(drain(
            shell.clone(),
            io.output,
            Arc::downgrade(&self.registry),
            self.idle,
        ));
        // The first screen: the prompt, once it has settled.
        let first = self
            .read_shell(
                &shell,
                ReadOpts {
                    mode: ReadMode::Screen,
                    since: None,
                    wait: FIRST_SCREEN,
                    expect: None,
                },
                &CancellationToken::new(),
            )
            .await;
        Ok(ShellInfo {
            shell_id: shell.id.clone(),
            location: shell.location.clone(),
            screen: first
                .screen
                .unwrap_or_else(|| shell.emu.lock().expect("shell lock").screen()),
            end: first.end,
        })
    }

    /// The lines `data` would submit to the shell (the line typed so far, continued by `data`),
    /// who would read them and where, by the terminal's state read now (bounded), without
    /// sending anything: for a caller to judge before [`Shells::write_entered`].
    pub async fn entering(
        &self,
        section: &str,
        shell_id: &str,
        data: &[u8],
    ) -> Result<Entering, ShellError> {
        let shell = self.lookup(section, shell_id)?;
        let state = shell.probe.probe().await;
        let writes = shell.jobs.lock().expect("shell lock").writes;
        let mut lines = shell.typed.lock().expect("shell lock").clone().feed(data);
        let leader = state.leader.as_ref();
        let reader = match (state.shell, state.foreground, leader) {
            (Some(own), Some(fg), _) if own == fg => Reader::Shell,
            (Some(own), Some(_), Some(l)) => {
                if shell.jobs.lock().expect("shell lock").trusts(own, l) {
                    Reader::Program(l.name.clone())
                } else {
                    Reader::Unknown
                }
            }
            (Some(_), Some(_), None) => Reader::Unknown,
            // The signal cannot be read: the shell, as far as anyone can tell.
            _ => Reader::Shell,
        };
        let cwd = leader.and_then(|l| l.cwd.clone());
        for line in &mut lines {
            let start = crate::bash::effects::Start {
                cwd: cwd.as_deref(),
                ..Default::default()
            };
            line.starts = crate::bash::effects::typed_input_runner(&line.text, start);
            line.backgrounds = crate::bash::parse::backgrounds(&line.text);
        }
        let at_prompt = password_prompt(
            &shell
                .emu
                .lock()
                .expect("shell lock")
                .screen()
                .before_cursor(),
        );
        let hidden = match state.echo {
            Some(_) => state.hidden_input() || at_prompt,
            None => at_prompt,
        };
        Ok(Entering {
            lines,
            reader,
            cwd,
            hidden,
            risky_allowed: shell.risky_allowed,
            read_only: shell.read_only,
            now: state.now,
            writes,
        })
    }

    /// Sends `data` to the shell, as typed, unjudged. Refused at a password prompt unless it
    /// is only control input (Enter, Ctrl-C, Ctrl-D, Ctrl-Z). A caller that judges what it
    /// types sends with [`Shells::write_entered`].
    pub async fn write(
        &self,
        section: &str,
        shell_id: &str,
        data: &[u8],
    ) -> Result<(), ShellError> {
        let shell = self.lookup(section, shell_id)?;
        let _writing = shell.writing.lock().await;
        self.send(&shell, data).await?;
        let mut jobs = shell.jobs.lock().expect("shell lock");
        jobs.writes += 1;
        // Nothing of it was judged: no job it starts runs unjudged.
        jobs.window = None;
        Ok(())
    }

    /// Sends `data`, whose lines `entering` ([`Shells::entering`] of the same data) showed its
    /// caller, who judged them; refused when another write reached the shell in between (the
    /// lines would not be the ones judged), and as [`Shells::write`] is.
    pub async fn write_entered(
        &self,
        section: &str,
        shell_id: &str,
        data: &[u8],
        entering: &Entering,
    ) -> Result<(), ShellError> {
        let shell = self.lookup(section, shell_id)?;
        let _writing = shell.writing.lock().await;
        if shell.jobs.lock().expect("shell lock").writes != entering.writes {
            return Err(ShellError::Invalid(format!(
                "nothing was sent: shell `{shell_id}` was written to while this write was judged; send it again"
            )));
        }
        self.send(&shell, data).await?;
        shell.jobs.lock().expect("shell lock").sent(entering);
        Ok(())
    }

    async fn send(&self, shell: &Arc<Shell>, data: &[u8]) -> Result<(), ShellError> {
        if let Some(why) = shell.ended() {
            self.forget(shell, &why);
            return Err(ShellError::Closed(format!(
                "shell `{}` has ended: {why}",
                shell.id
            )));
        }
        if data.len() > WRITE_BYTES {
            return Err(ShellError::Bound(format!(
                "at most {WRITE_BYTES} bytes per write; send the rest in further writes"
            )));
        }
        let view = shell.emu.lock().expect("shell lock").screen();
        let only_control = data
            .iter()
            .all(|b| matches!(b, b'\r' | b'\n' | 0x03 | 0x04 | 0x1a));
        if !only_control && password_prompt(&view.before_cursor()) {
            return Err(ShellError::Invalid(format!(
                "the shell shows a password prompt (`{}`): secrets are never typed by the agent. Send \\x03 (Ctrl-C) to abandon it, or Enter to go on without one; a user who wants this done can set up key or sudoers access",
                view.before_cursor().trim()
            )));
        }
        shell.touch();
        shell.input.send(data).await?;
        shell.typed.lock().expect("shell lock").feed(data);
        Ok(())
    }

    /// Reads the shell as `opts` asks, waiting (bounded, cancelled by `cancel`) for `expect`
    /// or for new output to settle.
    pub async fn read(
        &self,
        section: &str,
        shell_id: &str,
        opts: ReadOpts,
        cancel: &CancellationToken,
    ) -> Result<ShellRead, ShellError> {
        let shell = self.lookup(section, shell_id)?;
        shell.touch();
        let r = self.read_shell(&shell, opts, cancel).await;
        if let Some(why) = &r.ended {
            self.forget(&shell, why);
        }
        shell.touch();
        Ok(r)
    }

    async fn read_shell(
        &self,
        shell: &Shell,
        opts: ReadOpts,
        cancel: &CancellationToken,
    ) -> ShellRead {
        let wait = opts.wait.min(MAX_WAIT);
        let deadline = Instant::now() + wait;
        let mut rx = shell.changed.subscribe();
        let since = opts
            .since
            .unwrap_or_else(|| *shell.read_mark.lock().expect("shell lock"));
        let mut last_change: Option<Instant> = None;
        loop {
            rx.borrow_and_update();
            let ended = shell.ended();
            let (r, new_output) = {
                let emu = shell.emu.lock().expect("shell lock");
                let matched = opts.expect.as_ref().map(|re| match opts.mode {
                    ReadMode::Screen => re.is_match(&emu.screen().text()),
                    ReadMode::Raw => re.is_match(&emu.raw_since(since, screen::RAW_KEEP).text),
                });
                let r = ShellRead {
                    location: shell.location.clone(),
                    screen: (opts.mode == ReadMode::Screen).then(|| emu.screen()),
                    raw: (opts.mode == ReadMode::Raw).then(|| emu.raw_since(since, READ_BYTES)),
                    matched,
                    ended: ended.clone(),
                    end: emu.end(),
                    cancelled: false,
                };
                (r, emu.end() > since)
            };
            let settled = opts.expect.is_none()
                && match last_change {
                    Some(t) => t.elapsed() >= SETTLE,
                    None => false,
                };
            let now = Instant::now();
            if r.matched == Some(true) || ended.is_some() || now >= deadline || settled {
                if let Some(raw) = &r.raw {
                    *shell.read_mark.lock().expect("shell lock") = raw.next;
                }
                return r;
            }
            // Output already waiting past the cursor counts as new (it settles from now).
            if last_change.is_none() && new_output && opts.mode == ReadMode::Raw {
                last_change = Some(now);
            }
            let wake = match (opts.expect.is_none(), last_change) {
                (true, Some(t)) => (t + SETTLE).min(deadline),
                _ => deadline,
            };
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The shell is gone; the next round reports how it ended.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    last_change = Some(Instant::now());
                }
                _ = tokio::time::sleep_until(wake) => {}
                _ = cancel.cancelled() => {
                    if let Some(raw) = &r.raw {
                        *shell.read_mark.lock().expect("shell lock") = raw.next;
                    }
                    return ShellRead { cancelled: true, ..r };
                }
            }
        }
    }

    /// Closes a shell of `section`.
    pub fn close(&self, section: &str, shell_id: &str) -> Result<(), ShellError> {
        let shell = self.lookup(section, shell_id)?;
        let why = "closed by shell_close".to_string();
        shell
            .reported
            .store(true, std::sync::atomic::Ordering::SeqCst);
        shell.close(&why);
        self.forget(&shell, &why);
        Ok(())
    }

    /// The host (`local` or a target alias) of a shell of `section`, for a caller that
    /// checks its rules there before typing into or reading it.
    pub fn host(&self, section: &str, shell_id: &str) -> Result<String, ShellError> {
        self.lookup(section, shell_id).map(|s| s.host.clone())
    }

    /// The open shells of `section`.
    pub fn list(&self, section: &str) -> Vec<ShellSummary> {
        let s = self.registry.shells.lock().expect("shells lock");
        let mut list: Vec<ShellSummary> = s
            .open
            .values()
            .filter(|sh| sh.section == section && sh.ended().is_none())
            .map(|sh| ShellSummary {
                shell_id: sh.id.clone(),
                host: sh.host.clone(),
                location: sh.location.clone(),
                size: (sh.size.rows, sh.size.cols),
                idle: sh.last_used.lock().expect("shell lock").elapsed(),
                prompt: sh.emu.lock().expect("shell lock").screen().before_cursor(),
            })
            .collect();
        list.sort_by(|a, b| a.shell_id.cmp(&b.shell_id));
        list
    }

    /// Closes every shell of `section`, leaving `note` for its next shell call.
    pub fn close_section(&self, section: &str, note: &str) -> usize {
        let shells = self.section_shells(section);
        for shell in &shells {
            shell.close(note);
            self.forget(shell, note);
        }
        if !shells.is_empty() {
            let mut s = self.registry.shells.lock().expect("shells lock");
            Shelves::remember(&mut s.section_notes, section, note.to_string());
        }
        shells.len()
    }

    /// The open shells of `section`.
    fn section_shells(&self, section: &str) -> Vec<Arc<Shell>> {
        let s = self.registry.shells.lock().expect("shells lock");
        s.open
            .values()
            .filter(|sh| sh.section == section)
            .cloned()
            .collect()
    }

    /// The sections with a shell open whose key starts with `prefix` (at most [`TOTAL`]).
    pub fn sections(&self, prefix: &str) -> Vec<String> {
        let s = self.registry.shells.lock().expect("shells lock");
        let mut sections: Vec<String> = s
            .open
            .values()
            .filter(|sh| sh.section.starts_with(prefix))
            .map(|sh| sh.section.clone())
            .collect();
        sections.sort();
        sections.dedup();
        sections
    }

    /// Closes every shell of `section`, each remembered closed for `why`; the (id, host) of
    /// each, for the caller's audit.
    pub fn close_every(&self, section: &str, why: &str) -> Vec<(String, String)> {
        let shells = self.section_shells(section);
        for shell in &shells {
            shell
                .reported
                .store(true, std::sync::atomic::Ordering::SeqCst);
            shell.close(why);
            self.forget(shell, why);
        }
        shells
            .iter()
            .map(|sh| (sh.id.clone(), sh.host.clone()))
            .collect()
    }

    /// The section's backend is now `host`: its shells on any other host are closed, with a
    /// note for its next shell call.
    pub fn follow(&self, section: &str, host: &str) {
        let elsewhere: Vec<String> = {
            let s = self.registry.shells.lock().expect("shells lock");
            s.open
                .values()
                .filter(|sh| sh.section == section && sh.host != host)
                .map(|sh| sh.host.clone())
                .collect()
        };
        if let Some(old) = elsewhere.first() {
            self.close_section(
                section,
                &format!(
                    "this thread's backend changed from `{old}` to `{host}`, so its shells there were closed"
                ),
            );
        }
    }

    /// The note left for `section` (its shells were closed), taken once.
    pub fn take_note(&self, section: &str) -> Option<String> {
        let mut s = self.registry.shells.lock().expect("shells lock");
        let i = s.section_notes.iter().position(|(k, _)| k == section)?;
        s.section_notes.remove(i).map(|(_, n)| n)
    }

    /// The shells that closed on their own account since the last call (oldest first), for the
    /// audit; [`Shells::closed_changed`] wakes when there are more.
    pub fn take_closed(&self) -> Vec<ClosedShell> {
        let mut q = self.registry.unreported.lock().expect("closed lock");
        q.drain(..).collect()
    }

    /// Waits until a shell closed on its own account (see [`Shells::take_closed`]).
    pub async fn closed_changed(&self) {
        self.registry.closed_wake.notified().await
    }

    /// Closes every shell (shutdown).
    pub fn close_all(&self, why: &str) {
        let shells: Vec<Arc<Shell>> = {
            let s = self.registry.shells.lock().expect("shells lock");
            s.open.values().cloned().collect()
        };
        for shell in shells {
            shell.close(why);
            self.forget(&shell, why);
        }
    }

    /// Closes every shell once `shutdown` fires; spawn it on the app's tracker.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        shutdown.cancelled().await;
        self.close_all("the service is shutting down");
    }

    fn forget(&self, shell: &Shell, why: &str) {
        forget(&self.registry, shell, why);
    }
}

fn forget(registry: &Registry, shell: &Shell, why: &str) {
    let mut s = registry.shells.lock().expect("shells lock");
    let first = s
        .open
        .get(&shell.id)
        .is_some_and(|o| std::ptr::eq(&**o, shell));
    if first {
        s.open.remove(&shell.id);
    }
    Shelves::remember(&mut s.closed, &shell.id, why.to_string());
    drop(s);
    if first && !shell.reported.load(std::sync::atomic::Ordering::SeqCst) {
        let mut q = registry.unreported.lock().expect("closed lock");
        // Bounded: at most every shell there can be, twice over; the oldest goes first.
        if q.len() >= 2 * TOTAL {
            q.pop_front();
            tracing::warn!("the closed-shell queue is full: the oldest close is not audited");
        }
        q.push_back(ClosedShell {
            section: shell.section.clone(),
            shell_id: shell.id.clone(),
            host: shell.host.clone(),
            why: why.to_string(),
            at: chrono::Utc::now(),
        });
        drop(q);
        registry.closed_wake.notify_one();
    }
}

/// Whether the text before the cursor is a password prompt.
fn password_prompt(line: &str) -> bool {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(r"(?i)(password|passphrase|passcode|\bpin\b|verification code|one-time code)[^\n]*[:?]\s*$")
            .expect("password prompt pattern")
    })
    .is_match(line)
}

/// Reads the shell's output until it ends, it is closed, or it idles past `idle`.
async fn drain(
    shell: Arc<Shell>,
    mut output: Box<dyn PtyOutput>,
    registry: Weak<Registry>,
    idle: Duration,
) {
    let why = loop {
        let idle_at = *shell.last_used.lock().expect("shell lock") + idle;
        tokio::select! {
            chunk = output.next() => match chunk {
                None => break "the shell ended (its program exited or the connection closed)".to_string(),
                Some(bytes) => {
                    let answers = shell.emu.lock().expect("shell lock").feed(&bytes);
                    if !answers.is_empty() {
                        let _ = shell.input.send(&answers).await;
                    }
                    shell.changed.send_modify(|n| *n += 1);
                }
            },
            _ = shell.stop.cancelled() => {
                break shell
                    .stop_reason
                    .lock()
                    .expect("shell lock")
                    .clone()
                    .unwrap_or_else(|| "closed".into());
            }
            _ = tokio::time::sleep_until(idle_at) => {
                if shell.last_used.lock().expect("shell lock").elapsed() >= idle {
                    break format!("closed after {} minutes without use", idle.as_secs() / 60);
                }
            }
        }
    };
    shell.input.close().await;
    *shell.ended.lock().expect("shell lock") = Some(why.clone());
    shell.changed.send_modify(|n| *n += 1);
    tracing::debug!(shell.id = %shell.id, section.id = %shell.section, ssh.target = %shell.host, reason = %why, "shell closed");
    if let Some(registry) = registry.upgrade() {
        forget(&registry, &shell, &why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entering(reader: Reader, lines: &[(Option<&str>, bool)], now: u64) -> Entering {
        Entering {
            lines: lines
                .iter()
                .map(|(starts, backgrounds)| EnteredLine {
                    text: String::new(),
                    edited: false,
                    starts: starts.map(str::to_owned),
                    backgrounds: *backgrounds,
                })
                .collect(),
            reader,
            cwd: None,
            hidden: false,
            risky_allowed: false,
            read_only: false,
            now: Some(now),
            writes: 0,
        }
    }

    fn leader(ppid: u32, start: u64, name: &str) -> Leader {
        Leader {
            pid: 900,
            ppid,
            start,
            name: name.into(),
            cwd: None,
        }
    }

    #[test]
    fn only_such_a_program_the_shell_started_from_a_judged_write_is_trusted() {
        const SHELL: u32 = 100;
        let mut jobs = Jobs::default();
        // Nothing judged yet: no job is trusted.
        assert!(!jobs.trusts(SHELL, &leader(SHELL, 50, "vim")));
        // A judged write that starts vim opens the window at its probe.
        jobs.sent(&entering(Reader::Shell, &[(Some("vim"), false)], 10));
        assert!(jobs.trusts(SHELL, &leader(SHELL, 10, "vim")));
        assert!(jobs.trusts(SHELL, &leader(SHELL, 12, "less")));
        // Started before it, by another parent, or not such a program: judged.
        assert!(!jobs.trusts(SHELL, &leader(SHELL, 9, "vim")));
        assert!(!jobs.trusts(SHELL, &leader(4242, 12, "vim")));
        assert!(!jobs.trusts(SHELL, &leader(SHELL, 12, "sleep")));
        assert!(!jobs.trusts(SHELL, &leader(SHELL, 12, "bash")));
        // Keys given to it: jobs started from then on are not its.
        jobs.sent(&entering(
            Reader::Program("vim".into()),
            &[(None, false)],
            20,
        ));
        assert!(jobs.trusts(SHELL, &leader(SHELL, 12, "vim")));
        assert!(!jobs.trusts(SHELL, &leader(SHELL, 20, "vim")));
        // The next lines the shell reads end it; a write without an Enter changes nothing.
        jobs.sent(&entering(Reader::Shell, &[], 25));
        assert!(jobs.trusts(SHELL, &leader(SHELL, 12, "vim")));
        jobs.sent(&entering(Reader::Shell, &[(None, false)], 30));
        assert!(!jobs.trusts(SHELL, &leader(SHELL, 12, "vim")));
        // A line that also starts a job in the background, or lines read by a program the
        // shell did not start from them, open nothing.
        jobs.sent(&entering(Reader::Shell, &[(Some("vim"), true)], 40));
        assert!(!jobs.trusts(SHELL, &leader(SHELL, 41, "vim")));
        jobs.sent(&entering(Reader::Unknown, &[(Some("vim"), false)], 50));
        assert!(!jobs.trusts(SHELL, &leader(SHELL, 51, "vim")));
        assert_eq!(jobs.writes, 6);
    }

    #[test]
    fn password_prompts_are_recognised() {
        for p in [
            "[sudo] password for deploy: ",
            "Password:",
            "Enter passphrase for key '/root/.ssh/id_ed25519': ",
            "Enter PIN: ",
        ] {
            assert!(password_prompt(p), "{p}");
        }
        for p in [
            "$ ",
            "go? ",
            "user@host:~$ echo password",
            "Continue [y/N]? ",
        ] {
            assert!(!password_prompt(p), "{p}");
        }
    }
}
