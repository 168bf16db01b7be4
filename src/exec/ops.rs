//! The task tools' operations, written once over any [`Backend`]: terminal commands with a
//! per-section working directory, file reads with ranges and binary detection, atomic writes,
//! exact-string patches, content and file-name search, and code execution.
//!
//! Paths resolve on the backend's host: `~` is the backend user's home (asked of the backend),
//! a relative path is relative to the section's working directory on that backend. Every shell
//! command a tool hands us passes the [`Guard`] here, once, whatever the backend.
//!
//! Never: picks a backend (the caller passes one), or keeps a secret.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::guard::{Context, Guard, Objection};
use super::live::LiveTail;
use super::{Backend, Command, CwdStore, ExecError, Exit, Output, shell_quote};
use crate::config::ExecConfig;
use crate::metrics::{ExecLabels, Metrics};

/// Longest timeout a caller may ask for a single command.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Most bytes a file operation reads or writes at once.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Bytes examined for binary detection.
const SNIFF_BYTES: usize = 8192;
/// Most results a search returns.
const MAX_SEARCH_RESULTS: usize = 1000;
/// Longest line of a search result kept.
const MAX_MATCH_LINE: usize = 500;

/// Bounds applied to every operation.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Default command timeout.
    pub command_timeout: Duration,
    /// Head + tail bytes kept of a command's output (split between stdout and stderr).
    pub output_limit: usize,
    /// Default number of bytes `read_file` returns as text.
    pub read_text_bytes: u64,
}

impl Limits {
    pub fn from_config(c: &ExecConfig) -> Self {
        Limits {
            command_timeout: c.command_timeout,
            output_limit: c.output_limit,
            read_text_bytes: 256 * 1024,
        }
    }
}

/// Options of a terminal command.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Overrides the default timeout (capped at one hour).
    pub timeout: Option<Duration>,
    /// Extra environment variables for this command.
    pub env: Vec<(String, String)>,
    /// Shell text of ours run before the command in the same shell (e.g. the function
    /// definitions a `read` workspace puts around git); not judged by the guard.
    pub prelude: &'static str,
    /// The section's workspace on the backend's host, for the guard: a recursive delete
    /// outside it asks a person.
    pub workspace: Option<String>,
    /// A directory to run in for this command only (`~` and relative paths resolved as for
    /// files): the section's working directory is neither used nor changed. A directory that
    /// cannot be entered fails the command before it runs.
    pub workdir: Option<String>,
}

/// A terminal command's result.
#[derive(Debug, Clone)]
pub struct TerminalResult {
    pub output: Output,
    /// The working directory after the command (a `cd` in it holds for the next one).
    pub cwd: String,
}

/// Which part of a file to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRange {
    /// From the start, up to the text limit.
    Whole,
    /// `count` lines from 1-based line `start`.
    Lines { start: u64, count: u64 },
    /// `len` bytes from `offset`.
    Bytes { offset: u64, len: u64 },
}

/// What `read_file` found.
#[derive(Debug, Clone, Serialize)]
pub struct ReadResult {
    /// The resolved absolute path.
    pub path: String,
    /// The file's full size in bytes.
    pub size: u64,
    /// The text read; `None` when the file is binary.
    pub text: Option<String>,
    /// Whether the file looks binary (NUL bytes or not UTF-8).
    pub binary: bool,
    /// Whether more of the file exists past what was returned.
    pub truncated: bool,
}

/// What a search looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchTarget {
    /// Lines whose content matches the regex.
    Content,
    /// File names matching the glob.
    Files,
}

/// A search request.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    /// A regex (content) or a glob (files).
    pub pattern: String,
    /// Where to search; default the working directory.
    pub path: Option<String>,
    pub target: SearchTarget,
    /// Only files whose name matches this glob (content search).
    pub file_glob: Option<String>,
    /// Most results (capped at 1000).
    pub max_results: usize,
}

/// Search results: `path:line:text` lines (content) or paths (files).
#[derive(Debug, Clone, Serialize)]
pub struct SearchResult {
    pub matches: Vec<String>,
    /// More results existed than were returned.
    pub truncated: bool,
}

/// A patch's result.
#[derive(Debug, Clone, Serialize)]
pub struct PatchResult {
    pub path: String,
    pub replacements: usize,
}

/// One section's tool operations on one backend.
pub struct Ops {
    backend: Arc<dyn Backend>,
    /// The section whose working directory this is.
    section: String,
    guard: Arc<Guard>,
    cwds: Arc<CwdStore>,
    limits: Limits,
    /// Counts every command run, by backend and outcome.
    metrics: Arc<Metrics>,
    /// Where `terminal` and `execute_code` also write their output as it arrives.
    live: Option<Arc<LiveTail>>,
}

impl Ops {
    pub fn new(
        backend: Arc<dyn Backend>,
        section: String,
        guard: Arc<Guard>,
        cwds: Arc<CwdStore>,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Self {
        Ops {
            backend,
            section,
            guard,
            cwds,
            limits,
            metrics,
            live: None,
        }
    }

    /// These operations, with `terminal` and `execute_code` also writing their output into
    /// `live` as it arrives (the wrapper's own marker line left out of it).
    pub fn with_live(mut self, live: Option<Arc<LiveTail>>) -> Ops {
        self.live = live;
        self
    }

    /// Runs `cmd` on the backend and counts how it ended.
    async fn run(&self, cmd: Command<'_>, cancel: &CancellationToken) -> Result<Output, ExecError> {
        let result = self.backend.exec(cmd, cancel).await;
        let outcome = match &result {
            Ok(o) => match o.exit {
                Exit::Code(0) => "ok",
                Exit::Code(_) => "failed",
                Exit::Signal(_) => "signal",
                Exit::TimedOut => "timed_out",
                Exit::Cancelled => "cancelled",
            },
            Err(_) => "error",
        };
        self.metrics
            .exec_commands
            .get_or_create(&ExecLabels {
                backend: self.backend.name().to_string(),
                outcome: outcome.into(),
            })
            .inc();
        result
    }

    /// The backend these operations act on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The section's working directory on this backend.
    pub async fn cwd(&self) -> Result<String, ExecError> {
        match self.cwds.get(self.backend.name(), &self.section) {
            Some(d) => Ok(d),
            None => {
                let d = self.backend.initial_dir(&self.section).await?;
                self.cwds.set(self.backend.name(), &self.section, d.clone());
                Ok(d)
            }
        }
    }

    /// Resolves a tool's path on the backend's host: `~` → that user's home, relative →
    /// under the working directory.
    pub async fn resolve(&self, path: &str) -> Result<String, ExecError> {
        let path = path.trim();
        if path.is_empty() {
            return Err(ExecError::Invalid("the path is empty".into()));
        }
        if path == "~" {
            return self.backend.home().await;
        }
        if let Some(rest) = path.strip_prefix("~/") {
            let home = self.backend.home().await?;
            return Ok(join(&home, rest));
        }
        if path.starts_with('~') {
            return Err(ExecError::Invalid(format!(
                "{path}: `~user` paths are not supported; use an absolute path"
            )));
        }
        if path.starts_with('/') {
            return Ok(path.to_string());
        }
        Ok(join(&self.cwd().await?, path))
    }

    fn timeout(&self, asked: Option<Duration>) -> Duration {
        asked
            .unwrap_or(self.limits.command_timeout)
            .min(MAX_TIMEOUT)
    }

    fn halves(&self) -> (usize, usize) {
        let half = (self.limits.output_limit / 2).max(1);
        (half, half)
    }

    /// Runs a terminal command in the section's working directory and learns the directory
    /// it ended in. Refused by the guard before anything runs.
    pub async fn terminal(
        &self,
        command: &str,
        opts: RunOptions,
        cancel: &CancellationToken,
    ) -> Result<TerminalResult, ExecError> {
        self.terminal_as(command, opts, cancel, false).await
    }

    /// [`Ops::terminal`] for a command a person approved: the guard's `ask` no longer stops
    /// it, its refusals still do.
    pub async fn terminal_approved(
        &self,
        command: &str,
        opts: RunOptions,
        cancel: &CancellationToken,
    ) -> Result<TerminalResult, ExecError> {
        self.terminal_as(command, opts, cancel, true).await
    }

    /// The guard's objection to `command` as [`Ops::terminal`] would judge it with `opts`, if
    /// any, without running anything (the caller learns an `ask` before it records a start).
    pub async fn judge_terminal(
        &self,
        command: &str,
        opts: &RunOptions,
    ) -> Result<Option<Objection>, ExecError> {
        let (_, cwd, home) = self.terminal_places(opts).await?;
        let context = Context {
            cwd: Some(&cwd),
            home: home.as_deref(),
            env: &opts.env,
            workspace: opts.workspace.as_deref(),
        };
        Ok(self.guard.check_in(command, &context).err())
    }

    /// Where a terminal command runs: its own workdir (resolved) if it has one, the directory
    /// it starts in, and the account's home when known.
    async fn terminal_places(
        &self,
        opts: &RunOptions,
    ) -> Result<(Option<String>, String, Option<String>), ExecError> {
        let workdir = match &opts.workdir {
            Some(w) => Some(self.resolve(w).await?),
            None => None,
        };
        let cwd = match &workdir {
            Some(w) => w.clone(),
            None => self.cwd().await?,
        };
        let home = self.backend.home().await.ok();
        Ok((workdir, cwd, home))
    }

    async fn terminal_as(
        &self,
        command: &str,
        opts: RunOptions,
        cancel: &CancellationToken,
        approved: bool,
    ) -> Result<TerminalResult, ExecError> {
        let (workdir, cwd, home) = self.terminal_places(&opts).await?;
        let context = Context {
            cwd: Some(&cwd),
            home: home.as_deref(),
            env: &opts.env,
            workspace: opts.workspace.as_deref(),
        };
        match self.guard.check_in(command, &context) {
            Ok(()) => {}
            Err(o) if approved && o.verdict == crate::bash::Verdict::Ask => {}
            Err(o) => return Err(ExecError::Refused(o)),
        }
        let marker = format!("__sshmode_cwd_{}__", uuid::Uuid::new_v4().simple());
        let mut script = String::with_capacity(command.len() + 256);
        // The EXIT trap reports the final directory on stdout behind a one-time marker that
        // we cut off below; the command's own output and exit status are untouched.
        // (The marker is `[a-z0-9_]` only, so it needs no quoting.)
        script.push_str(&format!(
            "trap 'printf \"%s%s\\n\" {marker} \"$PWD\"' EXIT\n"
        ));
        if workdir.is_some() {
            // Asked for by this call: not entering it is the call's failure, never another
            // directory.
            script.push_str(&format!(
                "cd -- {d} || {{ printf 'sshmode: cannot enter the workdir %s\\n' {d} >&2; exit 126; }}\n",
                d = shell_quote(&cwd)
            ));
        } else {
            script.push_str(&format!(
                "cd -- {d} 2>/dev/null || {{ printf 'sshmode: %s is gone; starting in the home directory\\n' {d} >&2; cd; }}\n",
                d = shell_quote(&cwd)
            ));
        }
        // Values travel on standard input, not in the script: the script is the shell's
        // command line, which anyone on the host can read with `ps`.
        let env_input = env_block(&opts.env)?;
        if env_input.is_some() {
            script.push_str(ENV_READER);
        }
        if !opts.prelude.is_empty() {
            script.push_str(opts.prelude);
            script.push('\n');
        }
        script.push_str(command);
        script.push('\n');
        let (out_limit, err_limit) = self.halves();
        if let Some(live) = &self.live {
            live.hide_lines_starting_with(&marker);
        }
        let mut output = self
            .run(
                Command {
                    script: &script,
                    stdin: env_input.as_deref(),
                    timeout: self.timeout(opts.timeout),
                    // Room for the marker line, which is removed again.
                    stdout_limit: out_limit + marker.len() + 4096,
                    stderr_limit: err_limit,
                    live: self.live.clone(),
                },
                cancel,
            )
            .await?;
        let new_cwd = take_marker(&mut output.stdout, marker.as_bytes());
        if workdir.is_some() {
            // The section's directory is untouched by a call with its own.
            return Ok(TerminalResult {
                output,
                cwd: self.cwd().await?,
            });
        }
        let cwd = match new_cwd {
            Some(d) if d.starts_with('/') => {
                self.cwds.set(self.backend.name(), &self.section, d.clone());
                d
            }
            _ => cwd,
        };
        Ok(TerminalResult { output, cwd })
    }

    /// Runs `code` with the language's interpreter (reading the program from stdin) in the
    /// working directory. Shell code passes the guard first.
    pub async fn execute_code(
        &self,
        code: &str,
        language: Option<&str>,
        timeout: Option<Duration>,
        cancel: &CancellationToken,
    ) -> Result<Output, ExecError> {
        self.execute_code_as(code, language, timeout, None, cancel, false)
            .await
    }

    /// [`Ops::execute_code`] in a workspace (absolute), where shell code deleting recursively
    /// outside it is a question for a person, as a command's is; `approved`: a person allowed
    /// it, so the guard's `ask` no longer stops it (its refusals still do).
    pub async fn execute_code_as(
        &self,
        code: &str,
        language: Option<&str>,
        timeout: Option<Duration>,
        workspace: Option<&str>,
        cancel: &CancellationToken,
        approved: bool,
    ) -> Result<Output, ExecError> {
        let lang = language.unwrap_or("python").trim().to_ascii_lowercase();
        let interpreter = match lang.as_str() {
            "python" | "python3" | "py" => "python3 -",
            "bash" => "bash -s",
            "sh" | "shell" => "sh -s",
            "node" | "javascript" | "js" => "node -",
            "ruby" | "rb" => "ruby -",
            "perl" | "pl" => "perl -",
            other => {
                return Err(ExecError::Invalid(format!(
                    "unsupported language `{other}`; use python, bash, sh, node, ruby or perl"
                )));
            }
        };
        let cwd = self.cwd().await?;
        match self.judge_code_in(code, &lang, workspace, &cwd).await {
            None => {}
            Some(o) if approved && o.verdict == crate::bash::Verdict::Ask => {}
            Some(o) => return Err(ExecError::Refused(o)),
        }
        let script = format!(
            "cd -- {} 2>/dev/null || cd\nexec {interpreter}",
            shell_quote(&cwd)
        );
        let (out_limit, err_limit) = self.halves();
        self.run(
            Command {
                script: &script,
                stdin: Some(code.as_bytes()),
                timeout: self.timeout(timeout),
                stdout_limit: out_limit,
                stderr_limit: err_limit,
                live: self.live.clone(),
            },
            cancel,
        )
        .await
    }

    /// The guard's objection to `code` as [`Ops::execute_code_as`] would judge it, if any,
    /// without running anything: only shell code is judged.
    pub async fn judge_code(
        &self,
        code: &str,
        language: Option<&str>,
        workspace: Option<&str>,
    ) -> Result<Option<Objection>, ExecError> {
        let lang = language.unwrap_or("python").trim().to_ascii_lowercase();
        if !matches!(lang.as_str(), "bash" | "sh" | "shell") {
            return Ok(None);
        }
        let cwd = self.cwd().await?;
        Ok(self.judge_code_in(code, &lang, workspace, &cwd).await)
    }

    async fn judge_code_in(
        &self,
        code: &str,
        lang: &str,
        workspace: Option<&str>,
        cwd: &str,
    ) -> Option<Objection> {
        if !matches!(lang, "bash" | "sh" | "shell") {
            return None;
        }
        let home = self.backend.home().await.ok();
        let context = Context {
            cwd: Some(cwd),
            home: home.as_deref(),
            workspace,
            ..Context::default()
        };
        self.guard.check_in(code, &context).err()
    }

    /// `paths` (absolute) with every symlink resolved on the backend's host, as `realpath -m`
    /// gives them (missing trailing parts are kept): where a write would really land.
    pub async fn real_paths(
        &self,
        paths: &[&str],
        cancel: &CancellationToken,
    ) -> Result<Vec<String>, ExecError> {
        if let Some(p) = paths
            .iter()
            .find(|p| !p.starts_with('/') || p.contains('\n'))
        {
            return Err(ExecError::Invalid(format!(
                "{p}: not an absolute path on one line"
            )));
        }
        let script = real_paths_script(paths, false);
        let out = self
            .run(
                Command {
                    script: &script,
                    stdin: None,
                    timeout: self.limits.command_timeout.min(Duration::from_secs(30)),
                    stdout_limit: 64 * 1024,
                    stderr_limit: 1024,
                    live: None,
                },
                cancel,
            )
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if !out.exit.success() || lines.len() != paths.len() {
            return Err(ExecError::File(format!(
                "cannot tell where {} leads on this host (resolving its symlinks failed: {})",
                paths.last().copied().unwrap_or_default(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(lines)
    }

    /// Reads part of a file as text (or reports that it is binary).
    pub async fn read_file(&self, path: &str, range: ReadRange) -> Result<ReadResult, ExecError> {
        let path = self.resolve(path).await?;
        let text_limit = self.limits.read_text_bytes;
        let (offset, len) = match range {
            ReadRange::Whole => (0, text_limit),
            ReadRange::Bytes { offset, len } => (offset, len.min(MAX_FILE_BYTES)),
            ReadRange::Lines { start: 0, .. } => {
                return Err(ExecError::Invalid("line numbers start at 1".into()));
            }
            // Lines are found by reading from the start; bounded by the file limit.
            ReadRange::Lines { .. } => (0, MAX_FILE_BYTES),
        };
        let bytes = self.backend.read(&path, offset, len).await?;
        let end = offset + bytes.data.len() as u64;
        let sniff = &bytes.data[..bytes.data.len().min(SNIFF_BYTES)];
        if is_binary(sniff, bytes.data.len() > SNIFF_BYTES || end < bytes.size) {
            return Ok(ReadResult {
                path,
                size: bytes.size,
                text: None,
                binary: true,
                truncated: false,
            });
        }
        let text = String::from_utf8_lossy(&bytes.data);
        let (text, truncated) = match range {
            ReadRange::Lines { start, count } => {
                let mut lines = text.split_inclusive('\n').skip((start - 1) as usize);
                let taken: String = lines.by_ref().take(count as usize).collect();
                let more = lines.next().is_some() || end < bytes.size;
                let limit = text_limit as usize;
                if taken.len() > limit {
                    (cut_utf8(&taken, limit).to_string(), true)
                } else {
                    (taken, more)
                }
            }
            _ => (text.into_owned(), end < bytes.size),
        };
        Ok(ReadResult {
            path,
            size: bytes.size,
            text: Some(text),
            binary: false,
            truncated,
        })
    }

    /// Reads a whole file as bytes (at most 64 MiB).
    pub async fn read_bytes(&self, path: &str) -> Result<Vec<u8>, ExecError> {
        let path = self.resolve(path).await?;
        let bytes = self.backend.read(&path, 0, MAX_FILE_BYTES).await?;
        if bytes.size > MAX_FILE_BYTES {
            return Err(ExecError::Invalid(format!(
                "{path} is {} bytes; at most {MAX_FILE_BYTES} can be read at once",
                bytes.size
            )));
        }
        Ok(bytes.data)
    }

    /// Writes a file atomically; returns the resolved path.
    pub async fn write_file(&self, path: &str, content: &[u8]) -> Result<String, ExecError> {
        if content.len() as u64 > MAX_FILE_BYTES {
            return Err(ExecError::Invalid(format!(
                "content is {} bytes; at most {MAX_FILE_BYTES} can be written at once",
                content.len()
            )));
        }
        let path = self.resolve(path).await?;
        self.backend.write(&path, content).await?;
        Ok(path)
    }

    /// Replaces `old` by `new` in a text file: exactly once unless `replace_all`.
    pub async fn patch(
        &self,
        path: &str,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<PatchResult, ExecError> {
        if old.is_empty() {
            return Err(ExecError::Invalid("old_string is empty".into()));
        }
        let bytes = self.read_bytes(path).await?;
        let path = self.resolve(path).await?;
        let text = String::from_utf8(bytes)
            .map_err(|_| ExecError::Invalid(format!("{path} is not a UTF-8 text file")))?;
        let count = text.matches(old).count();
        if count == 0 {
            return Err(ExecError::Invalid(format!(
                "old_string was not found in {path}; read the file and copy the text exactly"
            )));
        }
        if count > 1 && !replace_all {
            return Err(ExecError::Invalid(format!(
                "old_string occurs {count} times in {path}; include more context to make it unique, or set replace_all"
            )));
        }
        let patched = replace_bounded(&text, old, new, count, &path)?;
        self.backend.write(&path, patched.as_bytes()).await?;
        Ok(PatchResult {
            path,
            replacements: count,
        })
    }

    /// Searches file contents (regex) or file names (glob): `rg` where the host has it,
    /// else `grep`/`find`.
    pub async fn search(
        &self,
        req: &SearchRequest,
        cancel: &CancellationToken,
    ) -> Result<SearchResult, ExecError> {
        if req.pattern.is_empty() {
            return Err(ExecError::Invalid("the pattern is empty".into()));
        }
        let root = match &req.path {
            Some(p) => self.resolve(p).await?,
            None => self.cwd().await?,
        };
        let max = req.max_results.clamp(1, MAX_SEARCH_RESULTS);
        let pat = shell_quote(&req.pattern);
        let root_q = shell_quote(&root);
        let script = match req.target {
            SearchTarget::Content => {
                let (rg_glob, grep_glob) = match &req.file_glob {
                    Some(g) => (
                        format!(" -g {}", shell_quote(g)),
                        format!(" --include={}", shell_quote(g)),
                    ),
                    None => (String::new(), String::new()),
                };
                format!(
                    "if command -v rg >/dev/null 2>&1; then rg --line-number --no-heading --color=never{rg_glob} -e {pat} -- {root_q}; \
                     else grep -rnIE{grep_glob} -e {pat} -- {root_q}; fi 2>/dev/null | head -n {}",
                    max + 1
                )
            }
            SearchTarget::Files => format!(
                "if command -v rg >/dev/null 2>&1; then rg --files --color=never -g {pat} -- {root_q}; \
                 else find {root_q} -name {pat} -not -path '*/.git/*'; fi 2>/dev/null | head -n {}",
                max + 1
            ),
        };
        let out = self
            .run(
                Command {
                    script: &script,
                    stdin: None,
                    timeout: self.limits.command_timeout,
                    stdout_limit: (max + 1) * (MAX_MATCH_LINE + 1024),
                    live: None,
                    stderr_limit: 4096,
                },
                cancel,
            )
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut matches: Vec<String> = text
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| cut_utf8(l, MAX_MATCH_LINE).to_string())
            .collect();
        let truncated = matches.len() > max;
        matches.truncate(max);
        Ok(SearchResult { matches, truncated })
    }
}

/// `text` with the `count` occurrences of `old` replaced by `new`, refused before anything is
/// built when the result would exceed [`MAX_FILE_BYTES`] (a short `old` replaced everywhere by
/// a long `new` multiplies the size).
fn replace_bounded(
    text: &str,
    old: &str,
    new: &str,
    count: usize,
    path: &str,
) -> Result<String, ExecError> {
    let size =
        text.len() as u128 - count as u128 * old.len() as u128 + count as u128 * new.len() as u128;
    if size > MAX_FILE_BYTES as u128 {
        return Err(ExecError::Invalid(format!(
            "replacing {count} occurrences would make {path} {size} bytes; at most {MAX_FILE_BYTES} can be written at once"
        )));
    }
    Ok(text.replace(old, new))
}

fn join(dir: &str, rest: &str) -> String {
    if rest.is_empty() {
        dir.to_string()
    } else if dir.ends_with('/') {
        format!("{dir}{rest}")
    } else {
        format!("{dir}/{rest}")
    }
}

/// The script printing each of `paths` with its symlinks resolved, as `realpath -m` does:
/// `realpath -m` where the host has it (GNU), else (BusyBox, whose `realpath` has no `-m`) a
/// portable form that walks each path's components left to right as `realpath -m` does —
/// `..` drops the last resolved component, an existing directory is resolved physically
/// (`cd -P`, `pwd -P`), a symlink to a file by `readlink -f` (one that leads nowhere is a
/// failure, never taken at face value), a missing component is kept as it is. Bounded by the
/// number of components.
fn real_paths_script(paths: &[&str], portable_only: bool) -> String {
    let quoted: Vec<String> = paths.iter().map(|p| shell_quote(p)).collect();
    let quoted = quoted.join(" ");
    let portable = format!(
        "for p in {quoted}; do r=; rest=$p\n\
         while [ -n \"$rest\" ]; do c=${{rest%%/*}}\n\
         case $rest in */*) rest=${{rest#*/}} ;; *) rest= ;; esac\n\
         case $c in ''|.) continue ;; ..) r=${{r%/*}}; continue ;; esac\n\
         n=$r/$c\n\
         if [ -d \"$n\" ]; then r=$(cd -P -- \"$n\" && pwd -P) || exit 1\n\
         elif [ -L \"$n\" ]; then r=$(readlink -f -- \"$n\") && [ -n \"$r\" ] || exit 1\n\
         else r=$n; fi; r=${{r%/}}\n\
         done; printf '%s\\n' \"${{r:-/}}\"; done\n"
    );
    if portable_only {
        return portable;
    }
    format!("if realpath -m / >/dev/null 2>&1; then realpath -m -- {quoted}; else\n{portable}fi\n")
}

/// Most variables one command may be given.
const MAX_ENV_VARS: usize = 128;
/// Most bytes of names and values together.
const MAX_ENV_BYTES: usize = 64 * 1024;

/// Reads `NAME ENCODED` lines from standard input up to a `.` line and exports each value
/// (decoded by `printf %b`; the `x` keeps trailing newlines through the substitution). POSIX
/// sh, so it works under any login shell the script may meet. What the command reads from
/// its standard input afterwards is what follows the block: nothing.
const ENV_READER: &str = "while IFS=' ' read -r __sshmode_k __sshmode_v; do \
[ \"$__sshmode_k\" = . ] && break; \
__sshmode_v=$(printf '%bx' \"$__sshmode_v\"); export \"$__sshmode_k=${__sshmode_v%x}\"; \
done; unset __sshmode_k __sshmode_v\n";

/// The standard input that carries `env` to [`ENV_READER`]: one `NAME ENCODED` line per
/// variable (every byte but `[A-Za-z0-9._/:@%+,=-]` as a `\0ooo` octal escape, so a value is
/// one line without spaces or backslashes of its own), then `.`. `None` when `env` is empty.
fn env_block(env: &[(String, String)]) -> Result<Option<Vec<u8>>, ExecError> {
    if env.is_empty() {
        return Ok(None);
    }
    if env.len() > MAX_ENV_VARS {
        return Err(ExecError::Invalid(format!(
            "{} environment variables given; at most {MAX_ENV_VARS}",
            env.len()
        )));
    }
    let total: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ENV_BYTES {
        return Err(ExecError::Invalid(format!(
            "the environment variables hold {total} bytes; at most {MAX_ENV_BYTES}"
        )));
    }
    let mut out = Vec::with_capacity(total * 2 + 8);
    for (k, v) in env {
        if !valid_env_name(k) {
            return Err(ExecError::Invalid(format!(
                "`{k}` is not a valid environment variable name"
            )));
        }
        if v.contains('\0') {
            return Err(ExecError::Invalid(format!(
                "the value of `{k}` contains a NUL byte, which no environment can hold"
            )));
        }
        out.extend_from_slice(k.as_bytes());
        out.push(b' ');
        for &b in v.as_bytes() {
            if b.is_ascii_alphanumeric() || b"._/:@%+,=-".contains(&b) {
                out.push(b);
            } else {
                out.extend_from_slice(format!("\\0{b:03o}").as_bytes());
            }
        }
        out.push(b'\n');
    }
    out.extend_from_slice(b".\n");
    Ok(Some(out))
}

fn valid_env_name(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Cuts the marker line (and everything after it) off `stdout`; returns the directory it named.
fn take_marker(stdout: &mut Vec<u8>, marker: &[u8]) -> Option<String> {
    let at = stdout.windows(marker.len()).rposition(|w| w == marker)?;
    let rest = &stdout[at + marker.len()..];
    let dir = rest.strip_suffix(b"\n").unwrap_or(rest);
    let dir = String::from_utf8(dir.to_vec()).ok();
    stdout.truncate(at);
    dir
}

/// NUL bytes, or bytes that are not UTF-8 (a multi-byte character cut at the end of a
/// partial read is allowed).
fn is_binary(sniff: &[u8], cut: bool) -> bool {
    if sniff.contains(&0) {
        return true;
    }
    match std::str::from_utf8(sniff) {
        Ok(_) => false,
        Err(e) => !(cut && e.error_len().is_none()),
    }
}

fn cut_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_portable_real_paths_agree_with_realpath_m() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        std::fs::create_dir_all(format!("{d}/ws/sub")).unwrap();
        std::os::unix::fs::symlink("/etc", format!("{d}/ws/out")).unwrap();
        std::os::unix::fs::symlink(format!("{d}/ws/sub"), format!("{d}/ws/in")).unwrap();
        std::fs::write(format!("{d}/ws/sub/f"), "x").unwrap();
        std::os::unix::fs::symlink(format!("{d}/ws/sub/f"), format!("{d}/ws/flink")).unwrap();
        let paths: Vec<String> = [
            "/ws",
            "/ws/out/passwd",
            "/ws/out/new/deeper",
            "/ws/in/new",
            "/ws/missing/../../x",
            "/ws/missing/../out/y",
            "/ws/out/../x",
            "/ws//sub/./f",
            "/ws/flink",
            "/ws/it's here",
        ]
        .iter()
        .map(|p| format!("{d}{p}"))
        .chain(["/".to_string(), "/nonexistent-sshmode/a/..".to_string()])
        .collect();
        let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
        let run = |portable: bool| {
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(real_paths_script(&refs, portable))
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let portable = run(true);
        assert_eq!(portable, run(false));
        assert_eq!(portable[1], "/etc/passwd", "a symlink out is followed");
        // A symlink that leads nowhere is a failure, not a path taken at face value.
        std::os::unix::fs::symlink("/nonexistent-sshmode/x/y", format!("{d}/ws/dangling")).unwrap();
        let dangling = format!("{d}/ws/dangling");
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(real_paths_script(&[&dangling], true))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{out:?}");
    }

    #[test]
    fn marker_is_cut_and_names_the_directory() {
        let mut out = b"hello\nno newline".to_vec();
        out.extend_from_slice(b"__m__/tmp/x y\n");
        assert_eq!(take_marker(&mut out, b"__m__").as_deref(), Some("/tmp/x y"));
        assert_eq!(out, b"hello\nno newline");
        let mut none = b"plain".to_vec();
        assert_eq!(take_marker(&mut none, b"__m__"), None);
        assert_eq!(none, b"plain");
    }

    #[test]
    fn replace_all_is_bounded_before_the_result_is_built() {
        assert_eq!(replace_bounded("a-a", "a", "bb", 2, "/f").unwrap(), "bb-bb");
        // 1 MiB of `a`, each replaced by 100 bytes: 100 MiB, over the limit.
        let text = "a".repeat(1 << 20);
        let new = "x".repeat(100);
        let e = replace_bounded(&text, "a", &new, 1 << 20, "/f").unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        // Shrinking is always fine.
        assert_eq!(replace_bounded(&text, "aa", "", 1 << 19, "/f").unwrap(), "");
    }

    #[test]
    fn binary_detection() {
        assert!(is_binary(b"ab\0cd", false));
        assert!(!is_binary("héllo".as_bytes(), false));
        assert!(is_binary(&[0xff, 0xfe, b'a'], false));
        // A cut multi-byte character at the end of a partial read is still text.
        let s = "aé".as_bytes();
        assert!(!is_binary(&s[..2], true));
        assert!(is_binary(&s[..2], false));
    }

    #[test]
    fn env_values_travel_on_stdin_and_survive_every_shell() {
        let values = [
            "plain",
            "",
            "it's $HOME `x` \"q\" \\n \\0101 %s %b",
            "trailing newlines\n\n",
            "  spaces  and\ttabs ",
            "héllo ☃ \u{1}\u{7f}",
            "-n",
            ".",
        ];
        let env: Vec<(String, String)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("V{i}"), v.to_string()))
            .collect();
        let block = env_block(&env).unwrap().unwrap();
        // One line per variable: nothing a shell would read as a space, quote or escape.
        assert!(
            !block.windows(6).any(|w| w == b"it's $"),
            "values travel encoded"
        );
        assert_eq!(block.iter().filter(|b| **b == b'\n').count(), env.len() + 1);
        for shell in ["sh", "bash"] {
            for (i, v) in values.iter().enumerate() {
                let script = format!("{ENV_READER}printf '%s' \"$V{i}\"; cat");
                let mut child = std::process::Command::new(shell)
                    .arg("-c")
                    .arg(&script)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                use std::io::Write;
                let mut input = block.clone();
                input.extend_from_slice(b"rest of stdin");
                child.stdin.take().unwrap().write_all(&input).unwrap();
                let out = child.wait_with_output().unwrap();
                let expected = format!("{v}rest of stdin");
                assert_eq!(
                    String::from_utf8_lossy(&out.stdout),
                    expected,
                    "{shell}: V{i}"
                );
            }
        }
        assert_eq!(env_block(&[]).unwrap(), None);
        assert!(env_block(&[("A".into(), "a\0b".into())]).is_err());
        assert!(env_block(&[("A;x".into(), "v".into())]).is_err());
        let many: Vec<_> = (0..=MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert!(env_block(&many).is_err());
        assert!(env_block(&[("BIG".into(), "x".repeat(MAX_ENV_BYTES))]).is_err());
    }

    #[test]
    fn env_names() {
        assert!(valid_env_name("FOO_1") && valid_env_name("_x"));
        assert!(!valid_env_name("1X") && !valid_env_name("A-B") && !valid_env_name("A;rm"));
    }
}
