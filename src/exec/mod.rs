//! The execution layer: one [`Backend`] interface with a local and an SSH implementation,
//! the command guard and output truncation, and [`ops`], where the task tools' file, search,
//! terminal and code operations are written once over any backend.
//!
//! A backend offers a handful of primitives (run a script, read bytes, write bytes atomically,
//! the user's home); everything a tool needs is built from them in [`ops`], so local and remote
//! behave alike. Paths handed to a backend are absolute and already resolved *on that backend's
//! host* — `~` is the backend user's home (locally: the section's workspace), never the
//! service's.
//!
//! Never: knows chats, models or bindings; falls back from a remote backend to the local one.
//! [`Executors::backend`] returns the backend a place names or an error — there is no path
//! from an SSH failure to local execution.
//!
//! # In detail
//!
//! | path | owns | never |
//! |---|---|---|
//! | `src/exec/mod.rs` | the `Backend` trait (run a script, read bytes, write atomically, home, initial dir), `Place`, `Executors` (one per process, built by `app::build::Core`), per-(backend, section) working directories | chats, models, bindings |
//! | `src/exec/live.rs` | a running command's live tail: the latest 4 KiB of its output, written by the capture path without waiting, read as the last whole printable lines; `printable` (terminal control removed) | holding more than 4 KiB; blocking the command on a reader |
//! | `src/exec/ops.rs` | the task tools' operations written once over any backend: terminal (guard, cwd tracking, env, timeout, cancel), read (ranges, binary detection), write, patch, search (`rg`, else `grep`/`find`), execute_code | picking a backend |
//! | `src/exec/local/` | local backend (see *Local tool isolation* below): `LocalHost` (one per app) hands each section a `LocalBackend` confined to `sections/<section>` and its tmp; `bash -c` (under root through the launcher, in a PID namespace of its own) in its own session and process group, killed (TERM then KILL) on timeout/cancel and KILLed when the command ends | running unisolated without the operator's opt-in; waiting unboundedly after a kill |
//! | `src/exec/ssh/` | `SshPool` (per target: connections × channels as semaphore permits, bounded wait queue, backoff, idle reaper, each command in a session of its own (the server shell's where it leads one, as on OpenSSH, else one `setsid` makes), group kill by the marked pid of its leader, reporting a group it could not end), `connect` (TCP_NODELAY, host-key check against the registry, key / key+cert / password / agent auth, the `target add` host-key probe), `registry` (the port through which the pool reads the target registry: `Endpoint`, the host-key check, sealed secrets), `sftp` (pipelined reads and writes, `posix-rename@openssh.com`; whether the server has SFTP at all, learned once per connection), `shellfs` (files through the shell where there is no SFTP: `head -c`/`tail -c` reads, `cat` + `mv` atomic writes, POSIX/BusyBox tools only); jump hosts (a `direct-tcpip` tunnel on the jump host's pooled connection, outside its channel budget, never reaped while live; the SSH session over it checked as its own target) | accepting an unrecorded or changed host key; signalling a pid it did not read from its marker; falling back to local |
//! | `src/shell/` | the shell-analysis core both policies read commands with: `parse` (bash syntax → tokens; `parse::simple_commands`), `spec` (the one table of shells, interpreters, wrappers and programs whose options run commands: option letters and arities, operands, which options change directory, run a script or write a file; option syntax), `expand` (words to arguments: braces, parameters, `IFS`, possibly-empty unknowns, within a budget of text and CPU time), `effects` (the one walk: a command's effects in order), the shared bounds and `Verdict` | deciding anything; running or touching files; importing `exec` or `workspace` |
//! | `src/exec/guard/` | the command guard, the first policy over `shell` (verdicts `refuse`, `ask`, `allow`), in stages over the core's `expand`: `check` (execution order, context, wrappers, nested scripts, budgets), `rules` (what is refused, and the messages), `ask` (what a person should decide) | running, touching files, or judging past a bound |
//! | `src/exec/pty/` | interactive shells: `Shells` (per process, keyed by section and shell id; bounds per section, per host below the pool's channels, in all; idle timeout; closed when the section's backend moves, `follow`), a drain task per shell, `screen` (the `vt100` emulator, its answers to cursor-position and device-attribute queries, the raw output ring behind a byte cursor, ANSI stripping), the `PtyHost` port a backend opens a PTY through (`ssh::pty`: `pty-req` with full modes and `shell`, both confirmed, on a pooled channel; `local::pty`: `openpty` here, the shell started by the launch server on the slave end, which it makes its controlling terminal) | chats, models; typing text at a password prompt; an undrained PTY |
//! | `src/exec/truncate.rs` | head+tail output capture | — |
//! | `src/target/` | the registry (Postgres `targets`: sealed secrets as bytea, status, seen/recorded/pinned host key), `approve` (pins the key), `rekey`, the re-seal of first-format records, with audit rows in the same transaction; `cli.rs`: `sshmode target …` | returning or logging a secret |
//!
//! **How a tool call runs.** The agent's tool layer asks `Executors::ops_for(section, place)`:
//! `Place::Local` gives the local backend; `Place::Target(alias)` checks the registry (exists,
//! approved) and hands out a handle on the app-wide pool — or an error. No branch turns an error
//! into the local backend; the error is the tool's answer. `Ops` then resolves paths on the
//! backend's host (`~` = that user's home, asked of the backend; relative = under the section's
//! working directory there) and calls the backend's few primitives.
//!
//! **Working directory.** Each terminal command is wrapped: `trap` on EXIT prints `$PWD` behind a
//! one-time random marker on stdout, then `cd` to the remembered directory, then the environment
//! reader, then the command. The marker line is cut off the captured output and its directory
//! remembered for the (backend, section). Exit status and output are the command's own; if the
//! command replaces the EXIT trap or closes stdout, the directory simply stays as it was.
//!
//! **Environment values never appear in the script.** The script is the shell's command line
//! (`bash -c …` locally, the exec request over SSH), and anyone on the host can read it with
//! `ps`. So `ops` sends a tool's variables on the command's standard input — one line per
//! variable, the value with every byte outside `[A-Za-z0-9._/:@%+,=-]` as a `\0ooo` escape, then
//! a `.` line — and the wrapper reads them with POSIX `read` and `printf %b` and exports them.
//! `read` takes no byte past the block, so the command then reads the end of its input, as
//! before. Both backends only have to deliver `Command::stdin` to the script's standard input.
//!
//! **SSH pool.** Per target, a semaphore holds `max_connections × channels_per_connection`
//! permits; a command takes a permit (waiting at most `ssh_queue_timeout`, with at most 1024
//! waiting), then a free channel on the first connection that has one, and only when every
//! connection is full does it connect another — never more than `max_connections`, retiring ones
//! included; at the limit it waits (same deadline) for a channel to be given back. sshd may refuse
//! a session for a moment while closed ones are still torn down (`MaxSessions`): the open is
//! retried after the next channel is freed, a bounded number of times. A command waits for sshd's confirmation that it
//! started (at most the connect timeout; opening the channel too); a connection that dies before
//! that (sshd restarted) is retired and the start retried once on a fresh connection — nothing
//! ran, so nothing runs twice. A confirmation that never comes is not retried, since the command
//! may have started. Cancellation is honoured while a command waits for a channel, and a waiter
//! that gives up returns its queue place. Standard input is sent while output is read, so a
//! command that never reads its input still times out. A target found removed, pending or
//! disabled has its pool dropped (its connections close as their last commands end). Failed connects back off
//! (0.5 s doubling to 30 s) and the next callers get the last error with the time to the next
//! attempt. Keepalives detect dead peers; the reaper (on the app's `TaskTracker`) closes idle
//! connections. Connects are counted in `sshmode_ssh_connects_total{reason}` and tool commands
//! in `sshmode_exec_commands_total{backend,outcome}`. `TCP_NODELAY` is on: russh leaves Nagle on by default, which costs ~40 ms per
//! small round trip; and `TCP_QUICKACK` is set after every read, or a jump host's sshd (Nagle on)
//! would hold each forwarded packet 40 ms for our delayed acknowledgement of the last.
//!
//! **Jump hosts.** `SshPool::pool` reads a target's whole path in one recursive query (through
//! the registry port) and refuses it unless every hop is approved; a target's `connect_new`
//! asks the jump host's pool for a `tunnel` (the jump pool connects, recursively, as for a
//! command), so each hop keeps one pooled connection. Loops are refused in
//! `target::check_jump` (serialised by an advisory lock) and, should one be in the table
//! anyway, at connect time (≤ `MAX_HOPS`, no hop twice, before any lock is taken). A jump host
//! cannot be deleted while referenced (a foreign key).
//!
//! **Remote kill.** sshd makes each session's shell a session leader, so its pid is the process
//! group of everything the command starts. The script first prints `$$` on stderr behind a
//! marker made for that one command (`__sshmode_pid_<random>__`); the pid is read only from
//! behind it, within the first 64 KiB of stderr, and only if it is a number above 1 — whatever a
//! login script prints first (an rc file that prints `1`) stays the command's stderr and is never
//! taken for the pid, since `kill -- -1` would reach every process of the user. On timeout or
//! cancel we send a `signal` request, then run `kill -TERM -- -PID; …; kill -KILL -- -PID` on a
//! second channel, wait for it (bounded), and close the channel, returning the partial output;
//! without a pid only the signal request is sent. A command whose caller drops it midway
//! (shutdown, an abandoned tool call) has its group killed the same way from a task on the app's
//! `TaskTracker` — so shutdown waits for it — that holds a channel of the connection, so the idle
//! reaper does not close the connection under it.
//!
//! **Host keys: approval pins the key.** `target add` makes one handshake (no authentication;
//! `connect::probe_host_key` refuses the key once it has noted it) and records the key as
//! `seen`; `--host-key` given too must match it, or nothing is added. `show`, the approval card
//! and the add output show it (`HostKey::describe`). `target::approve` — used by `target approve`,
//! by `set_status(.., Approved, ..)` and so by the chat's approval — turns a seen or recorded key
//! into `pinned` in the same transaction as the status change (`target.approve` names the key,
//! `hostkey.pin` follows). So the key an admin approved is the one every connection must meet;
//! a man in the middle after `add` is refused as a mismatch, not recorded as the truth. Adding
//! with `--approve` pins the seen key for a `tofu` target; a `strict` target accepts only a key
//! an operator checked: `--host-key`, `target test --trust SHA256:…` (pins only if the server
//! presents that fingerprint; otherwise `hostkey.trust_mismatch` and nothing is pinned), or an
//! approval after reading it. `--offline` skips the handshake; then the first connection records
//! the key (tofu) as before. `check_server_key` asks `target::check_host_key`, which in one
//! transaction compares the `SHA256:` fingerprint with the recorded one and writes
//! `hostkey.record` / `hostkey.pin` / `hostkey.mismatch` audit rows. A changed key is refused
//! with a message naming `sshmode target rekey <alias> --host-key …`, which replaces it (pinned,
//! audited as `hostkey.rekey` with both fingerprints).
//!
//! **Secrets.** Opened from the vault only in `exec::ssh::connect`, into `Zeroizing` buffers, for
//! the authentication call (russh's password method zeroizes its own copy on drop), and by the
//! start-up re-seal below.
//!
//! **Files over SFTP.** One SFTP session per operation on a pooled channel; reads and writes keep
//! 32 requests of 64 KiB in flight. A write goes to `.name.sshmode-<uuid>` beside the target
//! (mode copied with `fsetstat`, `fsync@openssh.com` when offered) and is renamed over with
//! `posix-rename@openssh.com`; without that extension the write fails rather than replace
//! non-atomically. A server with no SFTP subsystem (it refuses the request, or accepts it and
//! closes the channel while the connection stays up) is remembered per connection, and its files
//! go through the shell (`exec::ssh::shellfs`) with the same guarantees. `RawSftpSession` is used because russh-sftp's high-level session exposes
//! neither posix-rename nor its raw session.
//! **One shell core, two policies.**
//! ```
//! command ──▶ bash::parse + bash::spec ──▶ bash::effects::walk: programs (argv, possible cwds),
//!             writes, nested scripts, sockets, descriptors, opaque (unseen, too deep, too big)
//!               ├─▶ workspace::judge  (permission: read ⊂ read-write ⊂ full)  ─┐ refuse
//!               └─▶ exec::guard       (refuse | ask | allow, at every level)  ─┴▶ the strictest wins
//! ```
//! `effects::walk` is the one walk: it tracks `cd`, unwraps wrappers and follows `sh -c`, `eval`,
//! `xargs`, `find -exec`, here-strings and pipes into interpreters by the one table, and lists
//! what it cannot see through as `Opaque`, where a bound stopped it as `Bound`. The read-write
//! judge is a policy over that list (both are refused); `read` needs no walk (an allow-list over `parse::simple_commands`).
//! The guard still walks expanded words itself (`check`, over `bash::expand`); moving it onto the list, with
//! `Opaque` as `ask` and `Bound` (a bound hit, at the guard's limits) as a refusal, is the step
//! left (first the walk must expand words with `bash::expand`: `X=ls; $X` is opaque to it). Each policy decides only its own question. A permission refusal is never softened to
//! `ask`, so strictness only grows from `full` to `read-write` to `read` (a property test checks
//! it). `ask` is refused until approvals in chat exist (`Objection::verdict`, audited).
//! `workspace::verdict` puts the two together; `sshmode guard check` (`workspace::cli`) prints it.
//!
//! **The guard** (`exec::guard`) is defence in depth, not the security boundary: what keeps a
//! host safe is the account a command runs as, the admin's approval of targets and who may bind
//! them. It refuses clearly destructive commands — recursive deletion of `/`, `~`, top-level
//! system directories and the vital second level (`/usr/lib`, `/var/lib`, `/proc/*/root`, also
//! as globs like `/u*/b*`), `find` deleting throughout them, `rsync --delete` onto them,
//! `mkfs`/`wipefs`/`blkdiscard`/`mkswap`, writes onto block devices or `/proc/sysrq-trigger`,
//! truncating system files (`> /etc/passwd`, `truncate`, `tee`, `cp` onto them), fork bombs,
//! shutdown/reboot and their systemd targets, `kill -1`, recursive chmod/chown of system trees —
//! with a message the model can act on. What is risky or opaque rather than catastrophic *asks* (`ask`):
//! inline interpreter code that deletes or runs programs, text piped into a shell or an
//! interpreter, a script named only at run time (`bash <(curl …)`), partition, firewall, account
//! and service changes, `crontab -r`, in-place edits of system files, `rm -r` outside the
//! workspace the caller names; the walk goes on after an ask, since a later refusal outweighs it. Regex classifiers are bypassed by `sh -c`, `$(…)`,
//! quoting, wrappers and variables, so the guard reads a command the way bash would, in four
//! stages: the core's `bash::parse` (quoting, substitutions, arithmetic — `((…))`, `$((…))`,
//! `$[…]` are single tokens, so `<<` inside is a shift, not a here-document — redirections,
//! here-documents), the core's `bash::expand` (brace expansion across quoted parts, variables assigned on the line
//! or passed by the call, `+=`, `IFS` splitting, the output of `echo`/`printf` only when nothing
//! in it is interpreted), `check` (execution order, `cd`, `for` values, every wrapper of `bash::spec` such as `sudo`,
//! `env`, `nice`, `timeout`, `xargs`, `chroot`, `nsenter`, `systemd-run`, `pkexec`, `runuser`,
//! `coproc`, `toybox`; nested scripts in `sh -c`, `su -c`/`-lc`/`--command=`, `flock -c`, `script -c`, `tar --to-command`, `rsync -e`, `watch`, `eval`, `trap`,
//! `alias`, `find -exec`, input piped into a shell; glob command names like `/bin/r?` judged as
//! every known command they match) and `rules`. `Ops::terminal` passes its **context**: the
//! section's working directory, the backend user's home and the call's variables, so `cd /` in
//! one call and `rm -rf *` in the next is refused (`execute_code` passes the directory). **Unknown is possibly empty**: a value known
//! only at run time is judged as empty too (`rm -rf "$UNSET"/*` is `rm -rf /*`).
//!
//! *Bounds, all failing closed* (past one the command is refused, never judged in part): 64 KiB
//! of input, nesting depth 8, 1 MiB of expanded text, 1024 words from one brace expansion, 32
//! stacked wrappers, and 250 ms of the thread's CPU time per check (`CLOCK_THREAD_CPUTIME_ID`,
//! read every 64 units of work). Brace groups are found in one pass with a stack (a 60 KB word of
//! `{` took 1.7 s with the old rescanning search). Operators add regexes in
//! `SSHMODE_GUARD_EXTRA_FILE`. `ops` applies the guard once, for both backends, to every shell
//! command run for a tool.
//!
//! *Why not `brush-parser`.* The tokenizer and parser of the brush shell (0.4.0, the current
//! release) were tried as the parsing stage and fall short of the guard's first promise, that
//! every answer comes back, quickly: on model-written input it can hang while allocating without
//! bound (`<<-$(( | sh)` — 23 GB before the OOM killer in a fuzz run; `coproc ${$[function ))<<- |
//! sh; then if` likewise), panic (`<<-$(( | sh); donerm -rf ⏎E⏎`, an `unwrap` in the tokenizer),
//! overflow the stack, which aborts the process (20 000 × `$(`), and take time exponential in
//! unclosed `(` (22 of them: 100 ms, doubling with each). A panic can be caught and time can be
//! bounded on another thread, but neither unbounded memory nor a stack overflow can be contained
//! in-process, and a pre-filter strong enough to rule them out would be a second parser. So the
//! guard keeps its own tokenizer (fuzzed in its tests, linear, depth-bounded), now split into the
//! stages above; its word model is close to brush's (`WordPiece`), so a later switch stays cheap
//! if those are fixed upstream.
//!
//! **Output** (`exec::truncate::HeadTail`) keeps the first and last halves of the limit
//! (`SSHMODE_OUTPUT_LIMIT_BYTES`, 64 KiB split between stdout and stderr) in a fixed buffer and a
//! ring, and puts a marker with the omitted byte count between them; memory stays bounded however
//! much a command prints. A `Command` may carry a `live` tail (`exec::live::LiveTail`, set by
//! `Ops::with_live` for `terminal` and `execute_code`): both captures, local and SSH, also copy
//! each chunk into its 4 KiB ring as it arrives and wake the sampler, without waiting on it; the
//! sampler reads the last whole lines, printable (`exec::live::printable`), the wrapper's marker
//! line left out.
//!
//! **The vault** (`src/vault.rs`) seals each secret with AES-256-GCM (ring) under the 32-byte
//! master key in `SSHMODE_MASTER_KEY_FILE` (created `0600` with `create_new`; a key file readable
//! by group or others, or of the wrong length, is refused, never overwritten). A record is
//! `version || nonce || ciphertext+tag` with a fresh random nonce. Its associated data is the
//! record's place, `vault::Slot`: the target's alias, the row's `generation` (a new one per
//! `add`, taken from the sequence before sealing) and the field (`key`, `cert`, `password`). So a
//! record copied onto another target's row, kept from a removed target and put on a re-added
//! alias, or moved into another field of its own row fails to open; `connect` also reads the
//! secrets by (alias, generation). The raw key lives only in `Zeroizing` memory and ring's key
//! schedule.
//!
//! **Re-sealing the first format.** Version 1 records were bound to the alias alone. SQL cannot
//! re-seal, so `target::reseal_legacy` runs at every start of the service (`App::build`) and of
//! the target commands that open the vault: for each row with `seal_version = 1` it locks the row,
//! checks it is still at 1, opens each record the old way, seals it for its place, sets
//! `seal_version = 2` and writes `target.reseal` — one transaction per row, so it is idempotent
//! and safe from several processes. A row that does not open (another master key) is left, logged,
//! and refused when used ("remove and add it again"); `connect` never opens a version 1 record.

pub mod guard;
pub mod live;
pub mod local;
pub mod ops;
pub mod pty;
pub mod ssh;
pub mod truncate;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ExecConfig;
use crate::metrics::Metrics;
use crate::vault::Vault;

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum Exit {
    /// Exited with this status.
    Code(i32),
    /// Killed by this signal (name without `SIG`, e.g. `KILL`).
    Signal(String),
    /// Ran past its timeout and was killed with its process group.
    TimedOut,
    /// Cancelled by the caller and killed with its process group.
    Cancelled,
}

impl Exit {
    /// Whether the command ran to completion with status 0.
    pub fn success(&self) -> bool {
        *self == Exit::Code(0)
    }
}

/// One script to run through the backend's shell.
#[derive(Debug, Clone)]
pub struct Command<'a> {
    /// A POSIX shell script (interpreted by `sh -c` locally, by the login shell over SSH).
    pub script: &'a str,
    /// Bytes written to the script's standard input, then end of file.
    pub stdin: Option<&'a [u8]>,
    /// Wall-clock limit; past it the process group is killed and the partial output returned.
    pub timeout: Duration,
    /// Head + tail bytes kept of stdout.
    pub stdout_limit: usize,
    /// Head + tail bytes kept of stderr.
    pub stderr_limit: usize,
    /// Where the output is also written as it arrives, for a live view of the running
    /// command (both streams; never waits, see [`live`]). `None`: nobody watches.
    pub live: Option<Arc<live::LiveTail>>,
}

/// What a command produced: bounded output and how it ended.
#[derive(Debug, Clone)]
pub struct Output {
    /// Stdout, head and tail kept with an omission marker between them when it overflowed.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes dropped from the middle of stdout (0 when it fitted).
    pub stdout_omitted: u64,
    pub stderr_omitted: u64,
    pub exit: Exit,
    /// Set when a timed-out or cancelled command's process group could not be ended: says,
    /// in words, what may still be running. `None` when it was ended (or ran to its end).
    pub stop_note: Option<String>,
}

/// A file's bytes (or a range of them) and its full size.
#[derive(Debug, Clone)]
pub struct FileBytes {
    pub data: Vec<u8>,
    /// The file's size on disk, which may exceed `data.len()`.
    pub size: u64,
}

/// Errors of the execution layer. Messages are short and meant for the user or the model;
/// they never carry secrets.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The command guard refused the command; the message says why and what to do instead.
    #[error("{0}")]
    Refused(guard::Objection),
    /// The target cannot be used now (unknown, not approved, unreachable, authentication).
    #[error("target `{alias}` is unavailable: {reason}")]
    Unavailable { alias: String, reason: String },
    /// The host presented a key other than the recorded one: refused.
    #[error(
        "host key of `{alias}` changed: expected {expected}, got {presented}; refusing to connect. If the change is legitimate, an admin checks the new key on the host and runs `sshmode target rekey {alias} --host-key SHA256:…`"
    )]
    HostKeyMismatch {
        alias: String,
        expected: String,
        presented: String,
    },
    /// Every channel of every allowed connection stayed busy for the queue timeout.
    #[error("target `{alias}` is busy: no free SSH channel within {waited:?}; try again shortly")]
    Busy { alias: String, waited: Duration },
    /// The section's local workspace is no longer a plain directory below the workspace root
    /// (swapped for a symlink, removed): refused, never followed.
    #[error("{0}")]
    Workspace(String),
    /// No such file or directory.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// A file operation failed; the message names the path and the reason.
    #[error("{0}")]
    File(String),
    /// The request itself is wrong (bad range, unsupported language, …).
    #[error("{0}")]
    Invalid(String),
    /// The connection broke while the operation ran.
    #[error("target `{alias}`: connection lost: {reason}")]
    Connection { alias: String, reason: String },
    /// A local failure to start or watch a process.
    #[error("{0}")]
    Local(String),
}

/// The primitives every backend offers. Dyn-compatible: used as `Arc<dyn Backend>`.
#[async_trait]
pub trait Backend: Send + Sync {
    /// `local` or the target alias; for logs and cwd bookkeeping.
    fn name(&self) -> &str;

    /// Where its commands run, for the head of a tool result: `local`, or a target's alias,
    /// user and host as its registry entry gave them.
    fn location(&self) -> String {
        self.name().to_string()
    }

    /// Whether this backend is the local one (for messages only; no behaviour hangs on it).
    fn is_local(&self) -> bool;

    /// The backend user's home directory, on the backend's host.
    async fn home(&self) -> Result<String, ExecError>;

    /// Where a section's shell starts when it has no working directory yet.
    async fn initial_dir(&self, section: &str) -> Result<String, ExecError>;

    /// Runs `cmd`; on timeout or cancellation kills it with its children and returns the
    /// partial output with [`Exit::TimedOut`] / [`Exit::Cancelled`].
    async fn exec(&self, cmd: Command<'_>, cancel: &CancellationToken)
    -> Result<Output, ExecError>;

    /// Reads at most `len` bytes of the file at absolute `path` from `offset`.
    async fn read(&self, path: &str, offset: u64, len: u64) -> Result<FileBytes, ExecError>;

    /// Replaces the file at absolute `path` atomically (temporary file + rename), creating
    /// missing parent directories and keeping an existing file's mode.
    async fn write(&self, path: &str, data: &[u8]) -> Result<(), ExecError>;
}

/// Where a section's task tools run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Local,
    /// An SSH target, by alias.
    Target(String),
}

impl Place {
    /// `local`, or the target's alias: how a backend is named in stored rows and the audit.
    pub fn name(&self) -> &str {
        match self {
            Place::Local => "local",
            Place::Target(alias) => alias,
        }
    }

    /// The target's alias; `None` for the local backend.
    pub fn target(&self) -> Option<&str> {
        match self {
            Place::Local => None,
            Place::Target(alias) => Some(alias),
        }
    }
}

/// Most per-(backend, section) working directories remembered; beyond it the oldest entry
/// is forgotten (that section's shell starts again at its initial directory).
const MAX_CWDS: usize = 10_000;

/// The execution layer as the rest of the app sees it: the local backend, the SSH pool, the
/// guard, and each section's working directory per backend. One per app.
pub struct Executors {
    /// Tunables (timeouts, limits, workspace root).
    config: ExecConfig,
    /// Local execution: workspaces, the sandbox, the cap on concurrent commands.
    local: Arc<local::LocalHost>,
    /// Every SSH connection of the app, keyed by target alias, shared by all sections.
    pub ssh: Arc<ssh::SshPool>,
    /// The command guard applied by [`ops`] to every shell command a tool runs.
    guard: Arc<guard::Guard>,
    /// Working directory per (backend name, section): a `cd` holds for the next command.
    cwds: Arc<CwdStore>,
    /// The app's metrics: commands by backend and outcome, SSH connects by outcome.
    metrics: Arc<Metrics>,
    /// Interactive shells (PTYs) of every section, on any backend.
    pub shells: Arc<pty::Shells>,
}

impl Executors {
    /// Builds the layer with metrics of its own (benchmarks, tests), its background work on
    /// `tasks` (wait for it before the store closes); the app uses [`Executors::with_metrics`].
    pub fn new(
        config: &ExecConfig,
        registry: Arc<dyn ssh::registry::TargetRegistry>,
        vault: Arc<Vault>,
        tasks: TaskTracker,
    ) -> anyhow::Result<Self> {
        Self::with_metrics(config, registry, vault, Arc::new(Metrics::new()), tasks)
    }

    /// Builds the layer, counting into `metrics`; the guard's extra patterns come from
    /// `config.guard_extra_file`. Background work (the remote kill of a dropped command) runs
    /// on `tasks`, the app's tracker, so shutdown waits for it.
    pub fn with_metrics(
        config: &ExecConfig,
        registry: Arc<dyn ssh::registry::TargetRegistry>,
        vault: Arc<Vault>,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
    ) -> anyhow::Result<Self> {
        let guard = guard::Guard::from_file(config.guard_extra_file.as_deref())
            .map_err(|e| anyhow::anyhow!("command guard: {e}"))?;
        Ok(Executors {
            config: config.clone(),
            local: Arc::new(local::LocalHost::new(
                config.workspace_root.clone(),
                &config.local,
            )?),
            ssh: ssh::SshPool::new(
                config.clone(),
                registry,
                vault,
                metrics.clone(),
                tasks.clone(),
            ),
            guard: Arc::new(guard),
            cwds: Arc::new(CwdStore::default()),
            metrics,
            shells: Arc::new(pty::Shells::new(tasks)),
        })
    }

    /// What isolates local tools here (`separate-uid+pidns+landlock-v7`, …, `none`).
    pub fn local_level(&self) -> &local::sandbox::Level {
        self.local.level()
    }

    /// Logs the local isolation level, with a warning when it is weak or absent.
    pub fn log_local_level(&self) {
        self.local.log_level();
    }

    /// Warns when local tools may connect to the service user's ssh-agent socket while
    /// targets authenticate through an agent (a non-root service below Landlock ABI 9).
    pub async fn warn_agent_targets(&self, db: &PgPool) {
        if !self.local_level().unix_sockets_open() {
            return;
        }
        let agents: i64 =
            match sqlx::query_scalar("SELECT count(*) FROM targets WHERE auth_kind = 'agent'")
                .fetch_one(db)
                .await
            {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "could not count the targets that use an agent");
                    return;
                }
            };
        if let Some(w) = self.local_level().agent_warning(agents) {
            tracing::warn!("{w}");
        }
    }

    /// The backend a place names for `section` (a local backend is confined to the section's
    /// workspace). For a target this checks that it exists and is approved; the connection
    /// itself is made (or reused) when the first operation runs. An error here or later is
    /// the caller's answer: nothing falls back to local.
    pub async fn backend(
        &self,
        section: &str,
        place: &Place,
    ) -> Result<Arc<dyn Backend>, ExecError> {
        match place {
            Place::Local => Ok(Arc::new(self.local.for_section(section))),
            Place::Target(alias) => Ok(self.ssh.backend(alias).await?),
        }
    }

    /// The tool operations of `section` over `backend`, with the guard, limits and the
    /// section's working directory on that backend.
    pub fn ops(&self, section: &str, backend: Arc<dyn Backend>) -> ops::Ops {
        ops::Ops::new(
            backend,
            section.to_string(),
            self.guard.clone(),
            self.cwds.clone(),
            ops::Limits::from_config(&self.config),
            self.metrics.clone(),
        )
    }

    /// The local operations of `section` working in `workspace` (its own directory or a
    /// shared one below the workspace root, as `/workspace set` chooses); the sandbox grants
    /// that directory, for reading only unless `writable`.
    pub fn local_ops_in(
        &self,
        section: &str,
        workspace: &std::path::Path,
        writable: bool,
    ) -> Result<ops::Ops, ExecError> {
        let backend = self.local.for_section_in(section, workspace, writable)?;
        Ok(self.ops(section, Arc::new(backend)))
    }

    /// The section's private temporary directory on this machine (its local tools' `TMPDIR`).
    pub fn local_tmp(&self, section: &str) -> std::path::PathBuf {
        self.local.tmp_of(section)
    }

    /// Both together: `ops(section, backend(place)?)`.
    pub async fn ops_for(&self, section: &str, place: &Place) -> Result<ops::Ops, ExecError> {
        let backend = self.backend(section, place).await?;
        Ok(self.ops(section, backend))
    }

    /// The per-(backend, section) working directories, for callers that persist them.
    pub fn cwds(&self) -> &CwdStore {
        &self.cwds
    }

    /// The variables the operator lets a tool call's `env` set below `full`
    /// (`SSHMODE_TOOL_ENV_ALLOW`), for the workspace judge.
    pub fn tool_env_allow(&self) -> &[String] {
        &self.config.tool_env_allow
    }

    /// The command guard every command and typed line is judged by.
    pub fn guard(&self) -> &guard::Guard {
        &self.guard
    }

    /// Where `section` opens an interactive shell on `place`: a PTY channel on a target's
    /// pooled connection, or locally a PTY whose shell the launch server starts in the
    /// section's own workspace. An error is the caller's answer; nothing falls back to local.
    pub async fn pty_host(
        &self,
        section: &str,
        place: &Place,
    ) -> Result<Arc<dyn pty::PtyHost>, ExecError> {
        match place {
            Place::Local => Ok(Arc::new(self.local.for_section(section).shell_host(""))),
            Place::Target(alias) => Ok(self.ssh.backend(alias).await?),
        }
    }

    /// A local shell's host for `section` working in `workspace` (as [`Executors::local_ops_in`]:
    /// the sandbox grants that directory, for reading only unless `writable`), whose shell starts
    /// with `prelude` defined (one shell function, or empty; as [`ops::RunOptions::prelude`]).
    pub fn local_pty_host_in(
        &self,
        section: &str,
        workspace: &std::path::Path,
        writable: bool,
        prelude: &'static str,
    ) -> Result<Arc<dyn pty::PtyHost>, ExecError> {
        Ok(Arc::new(
            self.local
                .for_section_in(section, workspace, writable)?
                .shell_host(prelude),
        ))
    }

    /// Closes idle SSH connections until `shutdown`, then every interactive shell; spawn it
    /// on the app's task tracker.
    pub async fn run_reaper(self: Arc<Self>, shutdown: CancellationToken) {
        tokio::join!(
            self.ssh.clone().run_reaper(shutdown.clone()),
            self.shells.clone().run(shutdown)
        );
    }
}

type CwdMap = HashMap<(String, String), (String, u64)>;

/// Working directories per (backend, section), bounded by [`MAX_CWDS`].
#[derive(Default)]
pub struct CwdStore {
    /// (backend name, section) → (directory, insertion tick for eviction), and the tick.
    inner: Mutex<(CwdMap, u64)>,
}

impl CwdStore {
    pub fn get(&self, backend: &str, section: &str) -> Option<String> {
        let guard = self.inner.lock().expect("cwd store lock");
        guard
            .0
            .get(&(backend.to_string(), section.to_string()))
            .map(|(d, _)| d.clone())
    }

    pub fn set(&self, backend: &str, section: &str, dir: String) {
        let mut guard = self.inner.lock().expect("cwd store lock");
        let (map, tick) = &mut *guard;
        *tick += 1;
        let now = *tick;
        map.insert((backend.to_string(), section.to_string()), (dir, now));
        if map.len() > MAX_CWDS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
    }
}

pub use crate::bash::quote as shell_quote;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_the_shell() {
        for s in ["plain", "it's", "a b\nc", "$(rm x) `y` \"z\"", ""] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_quote(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
    }

    #[test]
    fn cwd_store_is_bounded_and_keyed_by_backend_and_section() {
        let store = CwdStore::default();
        store.set("local", "s1", "/a".into());
        store.set("web", "s1", "/b".into());
        assert_eq!(store.get("local", "s1").as_deref(), Some("/a"));
        assert_eq!(store.get("web", "s1").as_deref(), Some("/b"));
        for i in 0..MAX_CWDS + 5 {
            store.set("local", &format!("x{i}"), "/c".into());
        }
        assert!(store.inner.lock().unwrap().0.len() <= MAX_CWDS);
        assert_eq!(store.get("local", "s1"), None, "oldest entry evicted");
    }
}
