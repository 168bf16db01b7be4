//! The command guard: refuses clearly destructive shell commands (recursive deletion of `/`,
//! the home directory or top-level system directories, formatting or overwriting disks, fork
//! bombs, shutting the machine down, recursive permission changes of system trees) before a
//! task tool hands them to a backend, with a message a model can act on.
//!
//! **This is defence in depth, not the security boundary.** A determined caller can always
//! obfuscate past a static check (`base64 -d | sh`, a script file, `python -c`, …). What keeps
//! a host safe is the account a command runs as, the admin's approval of SSH targets and who
//! may bind them. The guard's job is to catch the honest mistake and the obvious trick.
//!
//! Regex classifiers are bypassed by `sh -c "…"`, `$(…)`, `r''m`, `$X`, `sudo env nice …` and
//! the like, so the guard reads the command the way a POSIX shell would: a small hand-written
//! tokenizer (quotes, escapes, `$'…'`, `$(…)`/backtick/`<(…)` nesting, operators, redirections,
//! here-documents) splits it into simple commands; each one is expanded (literal variable
//! assignments made earlier on the same line, word splitting, brace expansion), stripped of
//! wrappers (`sudo`, `env`, `nice`, `timeout`, `xargs`, `busybox`, full paths, …) and judged on
//! its normalised name and arguments. Nested scripts (`sh -c`, `eval`, substitutions, input
//! piped into a shell, `find -exec`, `trap`, `alias`) are checked recursively. `cd` to a
//! known directory, `for` loops over known values and `${X:-default}` are followed. A command
//! name that cannot be known statically (`$X`, `$(…)`) is refused when its arguments would be
//! destructive for `rm`, `chmod`, `chown`, `chgrp` or `dd`. Writes into `/dev` are refused
//! except to the harmless nodes (`null`, `zero`, `std*`, `tty*`, `fd/*`, `pts/*`, `shm/*`, …).
//! No crate parses shell faithfully enough for this (the available ones are either full
//! interpreters or stop at quoting), hence the tokenizer here. Work is bounded: input over
//! [`MAX_INPUT`] bytes, nesting deeper than [`MAX_DEPTH`], or more than a fixed amount of
//! expanded text is refused, never examined partially. An echoed string is data, not a
//! command, and is not refused. Deliberately out of reach: other interpreters (`python -c`,
//! `perl -e`), commands sent elsewhere (`ssh host …`, `docker exec …`) and script files.
//!
//! Operators can add their own regexes (`SSHMODE_GUARD_EXTRA_FILE`, one per line); each is
//! matched against the raw text and against every normalised simple command.
//!
//! The guard never executes anything, never touches the filesystem when checking, and never
//! rewrites a command: it only answers yes or no.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use regex::{Regex, RegexBuilder};

/// Longest command the guard examines; longer ones are refused.
pub const MAX_INPUT: usize = 64 * 1024;
/// Deepest nesting of shells, `eval` and substitutions the guard follows.
pub const MAX_DEPTH: usize = 8;
/// Total characters lexed and expanded per check (all nesting levels together).
const BUDGET: usize = 1 << 20;
/// Longest variable value tracked; longer values count as unknown.
const MAX_VALUE: usize = 64 * 1024;
/// Most words one brace expansion may produce.
const MAX_BRACE: usize = 1024;
/// Most wrapper commands (`sudo env nice …`) unwrapped in one simple command.
const MAX_WRAPPERS: usize = 32;
/// Compiled size limit of one operator regex, so a pathological pattern cannot eat memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Top-level directories whose recursive deletion or re-permissioning breaks the system.
const SYSTEM_DIRS: &[&str] = &[
    "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "opt", "proc", "root",
    "sbin", "srv", "sys", "usr", "var",
];

/// Names that run their `-c` argument (or their standard input) as a shell script.
const SHELLS: &[&str] = &[
    "sh", "bash", "rbash", "zsh", "dash", "ksh", "mksh", "pdksh", "ash", "yash", "posh", "fish",
    "csh", "tcsh",
];

/// A refused command: which rule fired and a message saying what was refused and what to do
/// instead, written for the model that asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    /// Stable rule id (`recursive-delete`, `device-write`, `operator`, …) for metrics and logs.
    pub rule: String,
    /// What was refused and why, phrased so the caller can act on it.
    pub message: String,
}

impl Refusal {
    fn new(rule: &str, message: String) -> Refusal {
        Refusal {
            rule: rule.to_owned(),
            message,
        }
    }
}

/// Problems building a guard from operator configuration.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("guard pattern {line} of {origin} is not a valid regular expression: {reason}")]
    BadPattern {
        origin: String,
        line: usize,
        reason: String,
    },
    #[error("could not read guard patterns from {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One operator-configured pattern.
#[derive(Debug)]
struct OperatorRule {
    regex: Regex,
}

/// The command guard. Cloning is cheap (the compiled operator rules are shared).
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Operator-added patterns, compiled once at start-up; empty means built-ins only.
    extra: Arc<[OperatorRule]>,
}

impl Guard {
    /// A guard with the built-in rules plus `extra_patterns` (regex crate syntax), each
    /// matched against the raw command and every normalised simple command.
    pub fn new(extra_patterns: &[String]) -> Result<Guard, GuardError> {
        let lines = extra_patterns
            .iter()
            .enumerate()
            .map(|(i, p)| (i + 1, p.as_str()));
        Self::build(lines, "the configured patterns")
    }

    /// A guard with the built-in rules plus the patterns in `path`: one regex per line, blank
    /// lines and lines starting with `#` ignored, surrounding whitespace trimmed. `None` means
    /// built-ins only.
    pub fn from_file(path: Option<&Path>) -> Result<Guard, GuardError> {
        let Some(path) = path else {
            return Ok(Guard::default());
        };
        let text = std::fs::read_to_string(path).map_err(|source| GuardError::Read {
            path: path.to_owned(),
            source,
        })?;
        let lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        Self::build(lines, &path.display().to_string())
    }

    fn build<'a>(
        lines: impl Iterator<Item = (usize, &'a str)>,
        origin: &str,
    ) -> Result<Guard, GuardError> {
        let mut rules = Vec::new();
        for (line, pattern) in lines {
            let bad = |reason: String| GuardError::BadPattern {
                origin: origin.to_owned(),
                line,
                reason,
            };
            if pattern.is_empty() {
                return Err(bad("an empty pattern would refuse every command".into()));
            }
            let regex = RegexBuilder::new(pattern)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            rules.push(OperatorRule { regex });
        }
        Ok(Guard {
            extra: rules.into(),
        })
    }

    /// Checks one command line as a shell would run it. `Err` says what was refused and why.
    pub fn check(&self, command: &str) -> Result<(), Refusal> {
        if command.len() > MAX_INPUT {
            return Err(Refusal::new(
                "too-long",
                format!(
                    "refused: the command is {} bytes, over the guard's limit of {MAX_INPUT}; \
                     write long scripts to a file and run the file",
                    command.len()
                ),
            ));
        }
        let mut checker = Checker {
            guard: self,
            budget: BUDGET,
        };
        checker.script(command, &mut Env::default(), 0)
    }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

/// A piece of a word, after quote removal.
#[derive(Debug, Clone)]
enum Part {
    /// Literal text; `quoted` when it came from quotes or a backslash escape.
    Lit { text: String, quoted: bool },
    /// `$NAME` / `${NAME}`.
    Param { name: String, quoted: bool },
    /// `$(…)`, backticks, `$((…))` (`output`: its value is the command's output) or a process
    /// substitution `<(…)` (`output == false`: its value is a path).
    Subst {
        toks: Vec<Tok>,
        source: String,
        quoted: bool,
        output: bool,
    },
    /// `${…}` with operators: value unknown, except `${NAME:-word}` (`fallback`) when NAME
    /// is known; `inner` holds any substitutions inside it.
    Opaque {
        source: String,
        inner: Vec<Part>,
        fallback: Option<(String, Vec<Part>)>,
    },
}

#[derive(Debug, Clone, Default)]
struct Word {
    parts: Vec<Part>,
}

impl Word {
    fn lit(text: String) -> Word {
        Word {
            parts: vec![Part::Lit {
                text,
                quoted: false,
            }],
        }
    }

    fn push_str(&mut self, s: &str, quoted: bool) {
        if let Some(Part::Lit { text, quoted: q }) = self.parts.last_mut()
            && *q == quoted
        {
            text.push_str(s);
            return;
        }
        self.parts.push(Part::Lit {
            text: s.to_owned(),
            quoted,
        });
    }

    fn push(&mut self, c: char, quoted: bool) {
        self.push_str(c.encode_utf8(&mut [0; 4]), quoted);
    }

    /// The text when the word is entirely literal.
    fn literal(&self) -> Option<String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit { text, .. } => out.push_str(text),
                _ => return None,
            }
        }
        Some(out)
    }

    /// The text when the word is a single unquoted literal (reserved words, brace expansion).
    fn bare(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [
                Part::Lit {
                    text,
                    quoted: false,
                },
            ] => Some(text),
            _ => None,
        }
    }

    fn is_quoted(&self) -> bool {
        self.parts.iter().any(|p| match p {
            Part::Lit { quoted, .. } | Part::Param { quoted, .. } | Part::Subst { quoted, .. } => {
                *quoted
            }
            Part::Opaque { .. } => false,
        })
    }

    /// `NAME=value` / `NAME+=value`: the name and the value's parts.
    fn assignment(&self) -> Option<(String, Vec<Part>)> {
        let Some(Part::Lit {
            text,
            quoted: false,
        }) = self.parts.first()
        else {
            return None;
        };
        let eq = text.find('=')?;
        let name = text[..eq].strip_suffix('+').unwrap_or(&text[..eq]);
        if !is_identifier(name) {
            return None;
        }
        let mut value = vec![Part::Lit {
            text: text[eq + 1..].to_owned(),
            quoted: false,
        }];
        value.extend(self.parts[1..].iter().cloned());
        Some((name.to_owned(), value))
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `;`, newline, `;;` and friends.
    Semi,
    /// `&` (background).
    Amp,
    And,
    Or,
    /// `|` and `|&`.
    Pipe,
    LParen,
    RParen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RedirKind {
    Input,
    Output,
    /// `2>&1`, `<&-`: duplicates a descriptor, names no file.
    Dup,
    HereString,
    HereDoc,
}

#[derive(Debug, Clone)]
struct Redir {
    kind: RedirKind,
    target: Word,
    /// Here-document body (unquoted delimiter: expansions inside are live).
    body: Option<Word>,
}

#[derive(Debug, Clone)]
enum Tok {
    Word(Word),
    Op(Op),
    Redir(Redir),
}

/// Nesting went past [`MAX_DEPTH`].
struct TooDeep;

struct PendingHeredoc {
    tok: usize,
    delimiter: String,
    strip_tabs: bool,
    quoted: bool,
}

struct Lexer {
    s: Vec<char>,
    i: usize,
    /// Nesting level of this text (0 = the command as given).
    depth: usize,
}

impl Lexer {
    fn new(src: &str, depth: usize) -> Lexer {
        Lexer {
            s: src.chars().collect(),
            i: 0,
            depth,
        }
    }

    fn peek(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    fn starts_with(&self, p: &str) -> bool {
        p.chars().enumerate().all(|(k, c)| self.peek(k) == Some(c))
    }

    fn lex(mut self) -> Result<Vec<Tok>, TooDeep> {
        Ok(self.tokens(false)?.0)
    }

    /// Tokens up to the end, or (when `nested`) up to the `)` closing a substitution; returns
    /// them with the index where the text ended (the `)` or the end of input).
    fn tokens(&mut self, nested: bool) -> Result<(Vec<Tok>, usize), TooDeep> {
        let mut toks = Vec::new();
        let mut parens = 0usize;
        let mut heredocs: Vec<PendingHeredoc> = Vec::new();
        while let Some(c) = self.peek(0) {
            match c {
                ' ' | '\t' | '\r' => self.i += 1,
                '\\' if self.peek(1) == Some('\n') => self.i += 2,
                '#' => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                '\n' => {
                    self.i += 1;
                    toks.push(Tok::Op(Op::Semi));
                    self.heredoc_bodies(&mut toks, &mut heredocs)?;
                }
                ';' => {
                    self.i += 1;
                    while matches!(self.peek(0), Some(';' | '&')) {
                        self.i += 1;
                    }
                    toks.push(Tok::Op(Op::Semi));
                }
                '&' if self.peek(1) == Some('&') => {
                    self.i += 2;
                    toks.push(Tok::Op(Op::And));
                }
                '&' if self.peek(1) == Some('>') => self.redirect(&mut toks, &mut heredocs)?,
                '&' => {
                    self.i += 1;
                    toks.push(Tok::Op(Op::Amp));
                }
                '|' => {
                    let op = if self.peek(1) == Some('|') {
                        Op::Or
                    } else {
                        Op::Pipe
                    };
                    self.i += if matches!(self.peek(1), Some('|' | '&')) {
                        2
                    } else {
                        1
                    };
                    toks.push(Tok::Op(op));
                }
                '(' => {
                    parens += 1;
                    self.i += 1;
                    toks.push(Tok::Op(Op::LParen));
                }
                ')' => {
                    if nested && parens == 0 {
                        let end = self.i;
                        self.i += 1;
                        return Ok((toks, end));
                    }
                    parens = parens.saturating_sub(1);
                    self.i += 1;
                    toks.push(Tok::Op(Op::RParen));
                }
                '<' | '>' if self.peek(1) != Some('(') => {
                    self.redirect(&mut toks, &mut heredocs)?
                }
                c if c.is_ascii_digit() && self.fd_redirect_ahead() => {
                    self.redirect(&mut toks, &mut heredocs)?
                }
                _ => {
                    let w = self.word()?;
                    toks.push(Tok::Word(w));
                }
            }
        }
        Ok((toks, self.s.len()))
    }

    /// `2>file`, `10<&3`: digits directly followed by a redirection operator.
    fn fd_redirect_ahead(&self) -> bool {
        let mut k = 0;
        while self.peek(k).is_some_and(|c| c.is_ascii_digit()) {
            k += 1;
        }
        matches!(self.peek(k), Some('<' | '>'))
    }

    fn redirect(
        &mut self,
        toks: &mut Vec<Tok>,
        heredocs: &mut Vec<PendingHeredoc>,
    ) -> Result<(), TooDeep> {
        while self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        // Longest operators first.
        const OPS: &[(&str, RedirKind, bool)] = &[
            ("&>>", RedirKind::Output, false),
            ("&>", RedirKind::Output, false),
            ("<<<", RedirKind::HereString, false),
            ("<<-", RedirKind::HereDoc, true),
            ("<<", RedirKind::HereDoc, false),
            ("<>", RedirKind::Output, false),
            ("<&", RedirKind::Dup, false),
            ("<", RedirKind::Input, false),
            (">>", RedirKind::Output, false),
            (">|", RedirKind::Output, false),
            (">&", RedirKind::Dup, false),
            (">", RedirKind::Output, false),
        ];
        let (op, mut kind, strip_tabs) = OPS
            .iter()
            .copied()
            .find(|(op, _, _)| self.starts_with(op))
            .unwrap_or((">", RedirKind::Output, false));
        self.i += op.chars().count();
        while matches!(self.peek(0), Some(' ' | '\t')) {
            self.i += 1;
        }
        let target = match self.peek(0) {
            None | Some('\n' | ';' | '&' | '|' | '(' | ')' | '<' | '>') => Word::default(),
            _ => self.word()?,
        };
        if kind == RedirKind::Dup {
            let lit = target.literal().unwrap_or_default();
            let is_fd = lit == "-" || (!lit.is_empty() && lit.chars().all(|c| c.is_ascii_digit()));
            if !is_fd && op == ">&" {
                // `>& file` is `&> file`.
                kind = RedirKind::Output;
            }
        }
        if kind == RedirKind::HereDoc {
            heredocs.push(PendingHeredoc {
                tok: toks.len(),
                delimiter: target.literal().unwrap_or_else(|| render_source(&target)),
                strip_tabs,
                quoted: target.is_quoted(),
            });
        }
        toks.push(Tok::Redir(Redir {
            kind,
            target,
            body: None,
        }));
        Ok(())
    }

    /// Reads the bodies of here-documents announced on the line just ended.
    fn heredoc_bodies(
        &mut self,
        toks: &mut [Tok],
        heredocs: &mut Vec<PendingHeredoc>,
    ) -> Result<(), TooDeep> {
        for h in heredocs.drain(..) {
            let mut body = String::new();
            while self.i < self.s.len() {
                let end = (self.i..self.s.len())
                    .find(|&k| self.s[k] == '\n')
                    .unwrap_or(self.s.len());
                let line: String = self.s[self.i..end].iter().collect();
                self.i = (end + 1).min(self.s.len());
                let line = if h.strip_tabs {
                    line.trim_start_matches('\t')
                } else {
                    &line
                };
                if line == h.delimiter {
                    break;
                }
                body.push_str(line);
                body.push('\n');
            }
            let word = if h.quoted {
                Word {
                    parts: vec![Part::Lit {
                        text: body,
                        quoted: true,
                    }],
                }
            } else {
                let mut sub = Lexer::new(&body, self.depth);
                let mut w = Word::default();
                sub.double_quoted(&mut w, None)?;
                w
            };
            if let Some(Tok::Redir(r)) = toks.get_mut(h.tok) {
                r.body = Some(word);
            }
        }
        Ok(())
    }

    fn word(&mut self) -> Result<Word, TooDeep> {
        let mut w = Word::default();
        if matches!(self.peek(0), Some('<' | '>')) && self.peek(1) == Some('(') {
            self.i += 2;
            let part = self.substitution(false, false)?;
            w.parts.push(part);
        }
        while let Some(c) = self.peek(0) {
            match c {
                ' ' | '\t' | '\r' | '\n' | ';' | '&' | '|' | '(' | ')' | '<' | '>' => break,
                '\\' => {
                    self.i += 1;
                    match self.peek(0) {
                        Some('\n') => self.i += 1,
                        Some(c) => {
                            self.i += 1;
                            w.push(c, true);
                        }
                        None => {}
                    }
                }
                '\'' => {
                    self.i += 1;
                    let start = self.i;
                    while self.peek(0).is_some_and(|c| c != '\'') {
                        self.i += 1;
                    }
                    let text: String = self.s[start..self.i].iter().collect();
                    self.i = (self.i + 1).min(self.s.len());
                    w.push_str(&text, true);
                }
                '"' => {
                    self.i += 1;
                    self.double_quoted(&mut w, Some('"'))?;
                }
                '$' => self.dollar(&mut w, false)?,
                '`' => self.backtick(&mut w, false)?,
                _ => {
                    self.i += 1;
                    w.push(c, false);
                }
            }
        }
        Ok(w)
    }

    /// The inside of `"…"` (up to `terminator`), or of a here-document body (`None`).
    fn double_quoted(&mut self, w: &mut Word, terminator: Option<char>) -> Result<(), TooDeep> {
        // An empty "" is still an argument.
        w.push_str("", true);
        while let Some(c) = self.peek(0) {
            if Some(c) == terminator {
                self.i += 1;
                return Ok(());
            }
            match c {
                '\\' => match self.peek(1) {
                    Some(n @ ('$' | '`' | '"' | '\\')) => {
                        self.i += 2;
                        w.push(n, true);
                    }
                    Some('\n') => self.i += 2,
                    _ => {
                        self.i += 1;
                        w.push('\\', true);
                    }
                },
                '$' => self.dollar(w, true)?,
                '`' => self.backtick(w, true)?,
                _ => {
                    self.i += 1;
                    w.push(c, true);
                }
            }
        }
        Ok(())
    }

    fn dollar(&mut self, w: &mut Word, quoted: bool) -> Result<(), TooDeep> {
        match self.peek(1) {
            Some('\'') if !quoted => {
                self.i += 2;
                let text = self.ansi_c();
                w.push_str(&text, true);
            }
            Some('"') if !quoted => {
                self.i += 2;
                self.double_quoted(w, Some('"'))?;
            }
            Some('(') => {
                self.i += 2;
                let part = self.substitution(quoted, true)?;
                w.parts.push(part);
            }
            Some('{') => {
                self.i += 2;
                let part = self.braced(quoted)?;
                w.parts.push(part);
            }
            Some(c) if c == '_' || c.is_ascii_alphabetic() => {
                self.i += 1;
                let start = self.i;
                while self
                    .peek(0)
                    .is_some_and(|c| c == '_' || c.is_ascii_alphanumeric())
                {
                    self.i += 1;
                }
                let name = self.s[start..self.i].iter().collect();
                w.parts.push(Part::Param { name, quoted });
            }
            Some(c) if c.is_ascii_digit() || "@*#?$!-".contains(c) => {
                self.i += 2;
                w.parts.push(Part::Param {
                    name: c.to_string(),
                    quoted,
                });
            }
            _ => {
                self.i += 1;
                w.push('$', quoted);
            }
        }
        Ok(())
    }

    /// After `$(` or `<(`: the nested command up to its closing `)`.
    fn substitution(&mut self, quoted: bool, output: bool) -> Result<Part, TooDeep> {
        if self.depth + 1 > MAX_DEPTH {
            return Err(TooDeep);
        }
        let start = self.i;
        self.depth += 1;
        let (toks, end) = self.tokens(true)?;
        self.depth -= 1;
        Ok(Part::Subst {
            toks,
            source: self.s[start..end].iter().collect(),
            quoted,
            output,
        })
    }

    /// After `${`: a plain parameter, or an opaque expression whose value is unknown.
    fn braced(&mut self, quoted: bool) -> Result<Part, TooDeep> {
        let start = self.i;
        let mut depth = 1usize;
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '\\' => self.i = (self.i + 1).min(self.s.len()),
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = if depth == 0 { self.i - 1 } else { self.i };
        let inner: String = self.s[start..end].iter().collect();
        if is_identifier(&inner)
            || (inner.chars().count() == 1
                && inner.chars().all(|c| "@*#?$!-0123456789".contains(c)))
        {
            return Ok(Part::Param {
                name: inner,
                quoted,
            });
        }
        if self.depth + 1 > MAX_DEPTH {
            return Err(TooDeep);
        }
        let mut sub = Lexer::new(&inner, self.depth + 1);
        let mut w = Word::default();
        sub.double_quoted(&mut w, None)?;
        // `${NAME:-word}`, `${NAME-word}`, `${NAME:=word}`, `${NAME=word}`.
        let name_len = inner
            .find(|c: char| c != '_' && !c.is_ascii_alphanumeric())
            .unwrap_or(inner.len());
        let name = &inner[..name_len];
        let op = &inner[name_len..];
        let fallback =
            if is_identifier(name) && [":-", ":=", "-", "="].iter().any(|o| op.starts_with(o)) {
                let skip = if op.starts_with(':') { 2 } else { 1 };
                let mut sub = Lexer::new(&op[skip..], self.depth + 1);
                let mut d = Word::default();
                sub.double_quoted(&mut d, None)?;
                Some((name.to_owned(), d.parts))
            } else {
                None
            };
        Ok(Part::Opaque {
            source: format!("${{{inner}}}"),
            inner: w.parts,
            fallback,
        })
    }

    fn backtick(&mut self, w: &mut Word, quoted: bool) -> Result<(), TooDeep> {
        self.i += 1;
        let mut inner = String::new();
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '`' => break,
                '\\' => match self.peek(0) {
                    Some(n @ ('$' | '`' | '\\')) => {
                        self.i += 1;
                        inner.push(n);
                    }
                    _ => inner.push('\\'),
                },
                _ => inner.push(c),
            }
        }
        if self.depth + 1 > MAX_DEPTH {
            return Err(TooDeep);
        }
        let (toks, _) = Lexer::new(&inner, self.depth + 1).tokens(false)?;
        w.parts.push(Part::Subst {
            toks,
            source: inner,
            quoted,
            output: true,
        });
        Ok(())
    }

    /// After `$'`: ANSI-C quoting (`$'\x72\x6d'` is `rm`).
    fn ansi_c(&mut self) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '\'' => break,
                '\\' => {
                    let Some(e) = self.peek(0) else { break };
                    self.i += 1;
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'a' => out.push('\x07'),
                        'b' => out.push('\x08'),
                        'e' | 'E' => out.push('\x1b'),
                        'f' => out.push('\x0c'),
                        'v' => out.push('\x0b'),
                        'x' => out.push(self.radix_char(16, 2)),
                        'u' => out.push(self.radix_char(16, 4)),
                        'U' => out.push(self.radix_char(16, 8)),
                        '0'..='7' => {
                            self.i -= 1;
                            out.push(self.radix_char(8, 3));
                        }
                        'c' => {
                            if let Some(x) = self.peek(0) {
                                self.i += 1;
                                out.push(char::from((x as u8) & 0x1f));
                            }
                        }
                        other => out.push(other),
                    }
                }
                _ => out.push(c),
            }
        }
        out
    }

    fn radix_char(&mut self, radix: u32, max: usize) -> char {
        let mut v = 0u32;
        let mut n = 0;
        while n < max {
            match self.peek(0).and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    v = v * radix + d;
                    self.i += 1;
                    n += 1;
                }
                None => break,
            }
        }
        char::from_u32(v).unwrap_or('\u{FFFD}')
    }
}

/// Shell-ish text of a word with its unknown parts kept as expressions (`${X}`, `$(…)`).
fn render_source(w: &Word) -> String {
    let mut out = String::new();
    for p in &w.parts {
        match p {
            Part::Lit { text, .. } => out.push_str(text),
            Part::Param { name, .. } => out.push_str(&format!("${{{name}}}")),
            Part::Subst { source, output, .. } => {
                out.push_str(if *output { "$(" } else { "<(" });
                out.push_str(source);
                out.push(')');
            }
            Part::Opaque { source, .. } => out.push_str(source),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Expansion and checking
// ---------------------------------------------------------------------------------------------

/// One argument after expansion.
#[derive(Debug, Clone)]
struct Field {
    /// The value, or `None` when it depends on something unknown before the command runs.
    value: Option<String>,
    /// Shell-ish rendering for messages and for nested scripts (unknown parts as `${X}`).
    display: String,
}

impl Field {
    fn lit(s: &str) -> Field {
        Field {
            value: Some(s.to_owned()),
            display: s.to_owned(),
        }
    }

    fn val(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// The value, or the rendering with unknown parts, as script text.
    fn text(&self) -> &str {
        self.value.as_deref().unwrap_or(&self.display)
    }
}

/// What the command line has established so far, as far as it can be known statically.
#[derive(Debug, Clone, Default)]
struct Env {
    /// Shell variables assigned earlier on the line; `None` = assigned something unknown.
    vars: HashMap<String, Option<String>>,
    /// The values a `for` loop variable takes, when they are all known: commands using the
    /// variable are judged once per value.
    loops: HashMap<String, Vec<String>>,
    /// The working directory after a `cd` to a known place; `None` = unknown (the start).
    cwd: Option<String>,
}

impl Env {
    fn set(&mut self, name: String, value: Option<String>) {
        self.loops.remove(&name);
        self.vars.insert(name, value);
    }

    fn unset(&mut self, name: &str) {
        self.loops.remove(name);
        self.vars.remove(name);
    }

    /// `path` as seen from the working directory, when that is known.
    fn resolve<'a>(&self, path: &'a str) -> std::borrow::Cow<'a, str> {
        match &self.cwd {
            Some(cwd) if !path.starts_with('/') && !path.starts_with('~') => {
                format!("{cwd}/{path}").into()
            }
            _ => path.into(),
        }
    }
}

/// Most values of a `for` loop tracked; longer lists make the variable unknown.
const MAX_LOOP_VALUES: usize = 16;

/// A field under construction during expansion.
struct Building {
    value: Option<String>,
    display: String,
    /// Must be emitted even if empty (quoted or unknown content).
    keep: bool,
}

impl Building {
    fn new() -> Building {
        Building {
            value: Some(String::new()),
            display: String::new(),
            keep: false,
        }
    }

    fn push(&mut self, s: &str) {
        if let Some(v) = &mut self.value {
            v.push_str(s);
        }
        self.display.push_str(s);
    }

    fn unknown(&mut self, display: &str) {
        self.value = None;
        self.display.push_str(display);
        self.keep = true;
    }

    fn finish(&mut self, out: &mut Vec<Field>) {
        let b = std::mem::replace(self, Building::new());
        if b.keep || !b.display.is_empty() {
            out.push(Field {
                value: b.value,
                display: b.display,
            });
        }
    }
}

struct Checker<'g> {
    guard: &'g Guard,
    /// Characters still allowed to be lexed or expanded in this check.
    budget: usize,
}

impl Checker<'_> {
    fn spend(&mut self, n: usize) -> Result<(), Refusal> {
        self.budget = self.budget.checked_sub(n).ok_or_else(|| {
            Refusal::new(
                "too-complex",
                "refused: the command expands to more text than the guard will examine; \
                 simplify it or put it in a script file"
                    .into(),
            )
        })?;
        Ok(())
    }

    fn script(&mut self, src: &str, env: &mut Env, depth: usize) -> Result<(), Refusal> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        self.spend(src.len())?;
        self.operator_rules(src)?;
        let toks = Lexer::new(src, depth).lex().map_err(|TooDeep| too_deep())?;
        self.tokens(&toks, env, depth)
    }

    fn tokens(&mut self, toks: &[Tok], env: &mut Env, depth: usize) -> Result<(), Refusal> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        if let Some(name) = fork_bomb(toks, &mut |n| self.spend(n))? {
            return Err(Refusal::new(
                "fork-bomb",
                format!(
                    "refused: the function `{name}` starts copies of itself in a pipe or in the \
                     background without end (a fork bomb), which would exhaust the machine's \
                     processes; write a bounded loop instead"
                ),
            ));
        }
        let mut words: Vec<&Word> = Vec::new();
        let mut redirs: Vec<&Redir> = Vec::new();
        // Output of the previous simple command when it is known text and piped into this one.
        let mut piped: Option<String> = None;
        for tok in toks.iter().map(Some).chain([None]) {
            match tok {
                Some(Tok::Word(w)) => words.push(w),
                Some(Tok::Redir(r)) => redirs.push(r),
                _ => {
                    if words.is_empty() && redirs.is_empty() {
                        if !matches!(tok, Some(Tok::Op(Op::LParen | Op::RParen))) {
                            piped = None;
                        }
                        continue;
                    }
                    self.spend(words.len() + redirs.len())?;
                    let out = self.simple(&words, &redirs, env, depth, piped.take())?;
                    piped = if matches!(tok, Some(Tok::Op(Op::Pipe))) {
                        out
                    } else {
                        None
                    };
                    words.clear();
                    redirs.clear();
                }
            }
        }
        Ok(())
    }

    /// Substitutions inside `parts` run before their command: check them first.
    fn nested(&mut self, parts: &[Part], env: &Env, depth: usize) -> Result<(), Refusal> {
        for p in parts {
            match p {
                Part::Subst { toks, .. } => self.tokens(toks, &mut env.clone(), depth + 1)?,
                Part::Opaque { inner, .. } => self.nested(inner, env, depth + 1)?,
                Part::Lit { .. } | Part::Param { .. } => {}
            }
        }
        Ok(())
    }

    /// One simple command: its words and redirections. Returns its output when that is known
    /// literal text (for `echo … | sh`).
    fn simple(
        &mut self,
        words: &[&Word],
        redirs: &[&Redir],
        env: &mut Env,
        depth: usize,
        mut stdin: Option<String>,
    ) -> Result<Option<String>, Refusal> {
        // Each judgement costs something, so repeated ones (loops, defaults) stay bounded.
        self.spend(64 + words.len() + redirs.len())?;
        // A `for` variable with known values: judge the command once per value, then once
        // more with the variable unknown (which also keeps assignments in `env`).
        let mut names = Vec::new();
        for w in words {
            param_names(&w.parts, &mut names);
        }
        for r in redirs {
            param_names(&r.target.parts, &mut names);
        }
        if let Some((name, values)) = names
            .iter()
            .find_map(|n| env.loops.get(n).map(|v| (n.clone(), v.clone())))
        {
            for value in values {
                let mut each = env.clone();
                each.set(name.clone(), Some(value));
                self.simple(words, redirs, &mut each, depth, stdin.clone())?;
            }
        }
        // `${NAME:-word}` with NAME not known here: NAME may well be unset when this runs,
        // so judge the command with the default too.
        let mut defaulted = Vec::new();
        for w in words {
            fallback_names(&w.parts, &mut defaulted);
        }
        if let Some(name) = defaulted
            .into_iter()
            .find(|n| !env.vars.contains_key(n) && self.lookup(n, env).is_none())
        {
            let mut unset = env.clone();
            unset.set(name, Some(String::new()));
            self.simple(words, redirs, &mut unset, depth, stdin.clone())?;
        }
        for w in words {
            self.nested(&w.parts, env, depth)?;
        }
        for r in redirs {
            self.nested(&r.target.parts, env, depth)?;
            if let Some(body) = &r.body {
                self.nested(&body.parts, env, depth)?;
            }
        }
        for r in redirs {
            match r.kind {
                RedirKind::Output => {
                    for f in self.expand(&r.target, env)? {
                        if let Some(dev) = f.val().and_then(|v| block_device(&env.resolve(v))) {
                            let words: Vec<String> =
                                words.iter().map(|w| render_source(w)).collect();
                            let cmd = format!("{} > {}", words.join(" "), f.display);
                            return Err(device_write(cmd.trim_start(), &dev));
                        }
                    }
                }
                RedirKind::HereString => {
                    let f = self.expand_joined(&r.target.parts, env)?;
                    stdin = Some(format!("{}\n", f.text()));
                }
                RedirKind::HereDoc => {
                    if let Some(body) = &r.body {
                        stdin = Some(self.expand_joined(&body.parts, env)?.text().to_owned());
                    }
                }
                RedirKind::Input => stdin = None,
                RedirKind::Dup => {}
            }
        }

        // Reserved words and assignments at the start.
        let mut i = 0;
        let mut assignments = Vec::new();
        while let Some(w) = words.get(i) {
            match w.bare() {
                Some(
                    "{" | "}" | "!" | "if" | "then" | "else" | "elif" | "fi" | "do" | "done"
                    | "while" | "until" | "esac" | "in",
                ) => {
                    i += 1;
                    continue;
                }
                Some("for" | "select") => {
                    if let Some(var) = words.get(i + 1).and_then(|w| w.literal()) {
                        let mut values = Vec::new();
                        if words.get(i + 2).and_then(|w| w.bare()) == Some("in") {
                            for w in &words[i + 3..] {
                                values.extend(self.expand(w, env)?);
                            }
                        }
                        let known: Option<Vec<String>> =
                            values.into_iter().map(|f| f.value).collect();
                        env.set(var.clone(), None);
                        if let Some(known) =
                            known.filter(|k| (1..=MAX_LOOP_VALUES).contains(&k.len()))
                        {
                            env.loops.insert(var, known);
                        }
                    }
                    return Ok(None);
                }
                Some("case") => return Ok(None),
                Some("function") => {
                    i += 2;
                    continue;
                }
                _ => {}
            }
            if let Some(a) = w.assignment() {
                assignments.push(a);
                i += 1;
                continue;
            }
            break;
        }
        let rest = &words[i.min(words.len())..];
        if rest.is_empty() {
            for (name, parts) in assignments {
                let f = self.expand_joined(&parts, env)?;
                env.set(name, f.value);
            }
            return Ok(None);
        }
        self.declarations(rest, env, depth)?;

        let mut fields = Vec::new();
        for w in rest {
            fields.extend(self.expand(w, env)?);
        }
        self.command(fields, env, depth, stdin)
    }

    /// `export X=…`, `unset X`, `read X`, `alias x='…'`: keep the variable table honest.
    fn declarations(&mut self, rest: &[&Word], env: &mut Env, depth: usize) -> Result<(), Refusal> {
        let Some(first) = rest[0].bare() else {
            return Ok(());
        };
        match first {
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                for w in &rest[1..] {
                    if let Some((name, parts)) = w.assignment() {
                        let f = self.expand_joined(&parts, env)?;
                        env.set(name, f.value);
                    }
                }
            }
            "unset" => {
                for w in &rest[1..] {
                    if let Some(name) = w.literal() {
                        env.unset(&name);
                    }
                }
            }
            "read" | "mapfile" | "readarray" | "getopts" | "printf" => {
                for w in &rest[1..] {
                    if let Some(name) = w.literal().filter(|n| is_identifier(n)) {
                        env.set(name, None);
                    }
                }
            }
            "alias" => {
                // An alias body runs later as a command; judge it now.
                for w in &rest[1..] {
                    if let Some((_, parts)) = w.assignment() {
                        let f = self.expand_joined(&parts, env)?;
                        self.script(f.text(), &mut env.clone(), depth + 1)?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn lookup(&self, name: &str, env: &Env) -> Option<String> {
        match env.vars.get(name) {
            Some(v) => v.clone(),
            None => match name {
                // Classified as the home directory wherever it appears.
                "HOME" => Some("~".into()),
                // The default IFS: an unquoted `${IFS}` separates words.
                "IFS" => Some(" ".into()),
                _ => None,
            },
        }
    }

    /// The value of a command substitution when it is a plain `echo`/`printf` of known text.
    fn subst_output(&mut self, toks: &[Tok], env: &Env) -> Result<Option<String>, Refusal> {
        let mut words = Vec::new();
        for t in toks {
            match t {
                Tok::Word(w) => words.push(w),
                Tok::Op(Op::Semi) => {}
                _ => return Ok(None),
            }
        }
        let mut fields = Vec::new();
        for w in words {
            fields.extend(self.expand(w, env)?);
        }
        Ok(echo_output(&fields))
    }

    /// The value of one part: `Ok(text)`, or `Err(display)` when it is unknown before the
    /// command runs.
    fn part_value(&mut self, p: &Part, env: &Env) -> Result<Result<String, String>, Refusal> {
        Ok(match p {
            Part::Lit { text, .. } => Ok(text.clone()),
            Part::Param { name, .. } => {
                self.lookup(name, env).ok_or_else(|| format!("${{{name}}}"))
            }
            Part::Subst {
                toks,
                source,
                output,
                ..
            } => {
                let value = if *output {
                    self.subst_output(toks, env)?
                } else {
                    None
                };
                let open = if *output { "$(" } else { "<(" };
                value
                    .map(|v| v.trim_end().to_owned())
                    .ok_or_else(|| format!("{open}{source})"))
            }
            Part::Opaque {
                fallback: Some((name, default)),
                source,
                ..
            } => match self.lookup(name, env) {
                Some(v) if !v.is_empty() => Ok(v),
                // Known empty or unset on this line: the default applies.
                _ if env.vars.get(name).is_some_and(Option::is_some) => {
                    let d = self.expand_joined(default, env)?;
                    d.value.ok_or_else(|| source.clone())
                }
                _ => Err(source.clone()),
            },
            Part::Opaque { source, .. } => Err(source.clone()),
        })
    }

    /// A word's fields: brace expansion, parameter and substitution values, word splitting.
    fn expand(&mut self, w: &Word, env: &Env) -> Result<Vec<Field>, Refusal> {
        let mut out = Vec::new();
        for w in brace_expand(w)? {
            let mut cur = Building::new();
            for p in &w.parts {
                if let Part::Lit { text, quoted } = p {
                    cur.push(text);
                    cur.keep |= *quoted;
                    continue;
                }
                let quoted = matches!(
                    p,
                    Part::Param { quoted: true, .. } | Part::Subst { quoted: true, .. }
                );
                match self.part_value(p, env)? {
                    Ok(v) => self.push_value(&mut cur, &mut out, &v, quoted)?,
                    Err(display) => cur.unknown(&display),
                }
            }
            cur.finish(&mut out);
        }
        Ok(out)
    }

    fn push_value(
        &mut self,
        cur: &mut Building,
        out: &mut Vec<Field>,
        v: &str,
        quoted: bool,
    ) -> Result<(), Refusal> {
        self.spend(v.len())?;
        if quoted {
            cur.push(v);
            cur.keep = true;
            return Ok(());
        }
        if v.starts_with(char::is_whitespace) {
            cur.finish(out);
        }
        for (k, piece) in v.split_whitespace().enumerate() {
            if k > 0 {
                cur.finish(out);
            }
            cur.push(piece);
        }
        if v.ends_with(char::is_whitespace) && !v.trim().is_empty() {
            cur.finish(out);
        }
        Ok(())
    }

    /// A word as one string, without splitting (assignment values, here-strings).
    fn expand_joined(&mut self, parts: &[Part], env: &Env) -> Result<Field, Refusal> {
        let mut cur = Building::new();
        for p in parts {
            match self.part_value(p, env)? {
                Ok(v) => {
                    self.spend(v.len())?;
                    cur.push(&v);
                }
                Err(display) => cur.unknown(&display),
            }
        }
        let mut f = Field {
            value: cur.value,
            display: cur.display,
        };
        if f.display.len() > MAX_VALUE {
            f.value = None;
            f.display = "${…}".into();
        }
        Ok(f)
    }

    /// Expands script text into fields (for `env -S`).
    fn split_words(&mut self, text: &str, depth: usize) -> Result<Vec<Field>, Refusal> {
        self.spend(text.len())?;
        let toks = Lexer::new(text, depth)
            .lex()
            .map_err(|TooDeep| too_deep())?;
        let mut out = Vec::new();
        for t in &toks {
            if let Tok::Word(w) = t {
                out.extend(self.expand(w, &Env::default())?);
            }
        }
        Ok(out)
    }

    /// A normalised simple command: unwrap `sudo`, `env`, `nice`, … and run the rules on what
    /// actually executes; follow nested scripts.
    fn command(
        &mut self,
        mut args: Vec<Field>,
        env: &mut Env,
        depth: usize,
        mut stdin: Option<String>,
    ) -> Result<Option<String>, Refusal> {
        for _ in 0..MAX_WRAPPERS {
            let Some(first) = args.first() else {
                return Ok(None);
            };
            self.operator_rules(&shown(&args, usize::MAX))?;
            let Some(name) = first.val() else {
                // `$SUDO rm …`: the unknown word may be a wrapper or empty; judge the rest as a
                // command of its own first, so the refusal names what it found.
                if args.len() > 1 {
                    if depth + 1 > MAX_DEPTH {
                        return Err(too_deep());
                    }
                    self.command(args[1..].to_vec(), env, depth + 1, stdin.take())?;
                }
                self.unresolved(&args, env)?;
                // `$SHELL -c '…'`: the script is visible even if the shell's name is not.
                if args
                    .get(1)
                    .and_then(Field::val)
                    .is_some_and(|v| v.starts_with('-') && !v.starts_with("--") && v.contains('c'))
                {
                    self.shell(&args[1..], env, depth, None)?;
                }
                return Ok(None);
            };
            let rest = &args[1..];
            let next: Vec<Field> = match basename(name) {
                "sudo" | "doas" => strip_assignments(skip_options(
                    rest,
                    "ugpCDrtTUchR",
                    &[
                        "user",
                        "group",
                        "prompt",
                        "close-from",
                        "chdir",
                        "role",
                        "type",
                        "command-timeout",
                        "other-user",
                        "login-class",
                        "host",
                        "chroot",
                    ],
                )),
                "env" => self.env_args(rest, depth)?,
                "nice" => skip_options(rest, "n", &["adjustment"]).to_vec(),
                "ionice" => {
                    skip_options(rest, "cnpPu", &["class", "classdata", "pid", "pgid", "uid"])
                        .to_vec()
                }
                "nohup" | "builtin" | "busybox" | "setsid" | "command" | "unbuffer" => {
                    skip_options(rest, "", &[]).to_vec()
                }
                "exec" => skip_options(rest, "a", &[]).to_vec(),
                "time" => skip_options(rest, "of", &["output", "format"]).to_vec(),
                "stdbuf" => skip_options(rest, "ioe", &["input", "output", "error"]).to_vec(),
                "timeout" => skip_options(rest, "sk", &["signal", "kill-after"])
                    .get(1..)
                    .unwrap_or_default()
                    .to_vec(),
                "xargs" => xargs(rest, stdin.take()),
                "eval" => {
                    let text = rest.iter().map(Field::text).collect::<Vec<_>>().join(" ");
                    self.script(&text, env, depth + 1)?;
                    return Ok(None);
                }
                "trap" => {
                    if let Some(f) = skip_options(rest, "", &[]).first() {
                        self.script(f.text(), &mut env.clone(), depth + 1)?;
                    }
                    return Ok(None);
                }
                "su" => {
                    if let Some(cmd) = su_command(rest) {
                        self.script(cmd.text(), &mut env.clone(), depth + 1)?;
                    }
                    return Ok(None);
                }
                "find" => {
                    self.find(&args, env, depth)?;
                    break;
                }
                shell if SHELLS.contains(&shell) => {
                    self.shell(rest, env, depth, stdin)?;
                    return Ok(None);
                }
                _ => break,
            };
            args = next;
        }
        if args.is_empty() {
            return Ok(None);
        }
        builtin_rules(&args, env)?;
        if let Some("cd" | "pushd") = args[0].val().map(basename) {
            change_directory(&args[1..], env);
        }
        Ok(match args[0].val().map(basename) {
            Some("cat")
                if args[1..]
                    .iter()
                    .all(|a| a.val().is_some_and(|v| v.starts_with('-'))) =>
            {
                stdin
            }
            _ => echo_output(&args),
        })
    }

    fn shell(
        &mut self,
        rest: &[Field],
        env: &Env,
        depth: usize,
        stdin: Option<String>,
    ) -> Result<(), Refusal> {
        let mut i = 0;
        let mut has_c = false;
        while let Some(v) = rest.get(i).and_then(Field::val) {
            if v == "--" || v == "-" {
                i += 1;
                break;
            }
            if v.starts_with("--") {
                if matches!(v, "--rcfile" | "--init-file") {
                    i += 1;
                }
                i += 1;
                continue;
            }
            if (v.starts_with('-') || v.starts_with('+')) && v.len() > 1 {
                let flags = &v[1..];
                has_c |= v.starts_with('-') && flags.contains('c');
                if flags.contains(['o', 'O']) {
                    i += 1;
                }
                i += 1;
                continue;
            }
            break;
        }
        if has_c {
            if let Some(script) = rest.get(i) {
                // Arguments after the script are its `$0`, `$1`, …
                let mut inner = env.clone();
                for (n, arg) in rest[i + 1..].iter().take(10).enumerate() {
                    inner.set(n.to_string(), arg.value.clone());
                }
                self.script(script.text(), &mut inner, depth + 1)?;
            }
        } else if i >= rest.len()
            && let Some(input) = stdin
        {
            self.script(&input, &mut env.clone(), depth + 1)?;
        }
        Ok(())
    }

    fn env_args(&mut self, rest: &[Field], depth: usize) -> Result<Vec<Field>, Refusal> {
        let mut split = Vec::new();
        let mut i = 0;
        while let Some(v) = rest.get(i).and_then(Field::val) {
            if v == "--" {
                i += 1;
                break;
            }
            if let Some(long) = v.strip_prefix("--") {
                let (name, inline) = match long.split_once('=') {
                    Some((n, a)) => (n, Some(a)),
                    None => (long, None),
                };
                let arg = match (name, inline) {
                    ("split-string" | "unset" | "chdir", Some(a)) => Some(a.to_owned()),
                    ("split-string" | "unset" | "chdir", None) => {
                        i += 1;
                        rest.get(i).map(|f| f.text().to_owned())
                    }
                    _ => None,
                };
                if name == "split-string"
                    && let Some(s) = arg
                {
                    split.extend(self.split_words(&s, depth + 1)?);
                }
                i += 1;
                continue;
            }
            if v.starts_with('-') && v.len() > 1 {
                for (k, c) in v.char_indices().skip(1) {
                    if matches!(c, 'u' | 'C' | 'S') {
                        let attached = &v[k + c.len_utf8()..];
                        let arg = if attached.is_empty() {
                            i += 1;
                            rest.get(i).map(|f| f.text().to_owned())
                        } else {
                            Some(attached.to_owned())
                        };
                        if c == 'S'
                            && let Some(s) = arg
                        {
                            split.extend(self.split_words(&s, depth + 1)?);
                        }
                        break;
                    }
                }
                i += 1;
                continue;
            }
            if is_assignment(v) {
                i += 1;
                continue;
            }
            break;
        }
        split.extend(rest.get(i..).unwrap_or_default().iter().cloned());
        Ok(split)
    }

    /// `find START… -exec CMD {} \;` runs CMD; `-delete` deletes recursively. When nothing
    /// filters the walk, `{}` is first the start path itself, so judge CMD on that.
    fn find(&mut self, args: &[Field], env: &mut Env, depth: usize) -> Result<(), Refusal> {
        if depth + 1 > MAX_DEPTH {
            return Err(too_deep());
        }
        let rest = &args[1..];
        let mut i = 0;
        while let Some(v) = rest.get(i).and_then(Field::val) {
            if matches!(v, "-H" | "-L" | "-P") || v.starts_with("-D") || v.starts_with("-O") {
                i += 1;
            } else {
                break;
            }
        }
        let starts: Vec<&Field> = rest[i..]
            .iter()
            .take_while(|f| {
                f.val()
                    .is_some_and(|v| !v.starts_with('-') && v != "(" && v != "!")
            })
            .collect();
        let expr = &rest[i + starts.len()..];
        // Split the expression into actions and the rest.
        let mut unfiltered = true;
        let mut execs: Vec<Vec<Field>> = Vec::new();
        let mut delete = false;
        let mut k = 0;
        while k < expr.len() {
            let v = expr[k].val().unwrap_or("?");
            match v {
                "-exec" | "-execdir" | "-ok" | "-okdir" => {
                    let mut cmd = Vec::new();
                    k += 1;
                    while let Some(f) = expr.get(k) {
                        k += 1;
                        if matches!(f.val(), Some(";" | "+")) {
                            break;
                        }
                        cmd.push(f.clone());
                    }
                    execs.push(cmd);
                    continue;
                }
                "-delete" => delete = true,
                "-depth"
                | "-xdev"
                | "-mount"
                | "-follow"
                | "-noleaf"
                | "-print"
                | "-print0"
                | "-ignore_readdir_race" => {}
                "-maxdepth" | "-mindepth" => k += 1,
                _ => unfiltered = false,
            }
            k += 1;
        }
        let start = starts.first().map(|f| (*f).clone());
        if delete && unfiltered {
            let mut rm = vec![Field::lit("rm"), Field::lit("-r")];
            rm.extend(starts.iter().map(|f| (*f).clone()));
            builtin_rules(&rm, env).map_err(|r| Refusal {
                message: r.message.replace(&shown(&rm, 160), &shown(args, 160)),
                ..r
            })?;
        }
        for cmd in execs {
            let cmd = cmd
                .into_iter()
                .map(|f| match (&start, f.val()) {
                    (Some(s), Some(v)) if unfiltered && v.contains("{}") => Field {
                        value: s.val().map(|sv| v.replace("{}", sv)),
                        display: f.display.replace("{}", &s.display),
                    },
                    (_, Some(v)) if v.contains("{}") => Field {
                        value: None,
                        display: f.display,
                    },
                    _ => f,
                })
                .collect();
            self.command(cmd, env, depth + 1, None)?;
        }
        Ok(())
    }

    /// The command name is unknown until run time. Refuse when its arguments would be
    /// destructive for one of the commands the rules know.
    fn unresolved(&self, args: &[Field], env: &Env) -> Result<(), Refusal> {
        for candidate in ["rm", "chmod", "chown", "chgrp", "dd"] {
            let mut probe = args.to_vec();
            probe[0] = Field::lit(candidate);
            if builtin_rules(&probe, env).is_err() {
                return Err(Refusal::new(
                    "unresolved-command",
                    format!(
                        "refused: the command name `{}` cannot be known before it runs, and \
                         `{}` would be destructive if it is `{candidate}`; write the command \
                         name literally",
                        args[0].display,
                        shown(args, 160)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn operator_rules(&self, text: &str) -> Result<(), Refusal> {
        for rule in self.guard.extra.iter() {
            if rule.regex.is_match(text) {
                return Err(Refusal::new(
                    "operator",
                    format!(
                        "refused: `{}` matches the operator's guard rule `{}`, so it is not \
                         allowed on this host; do the task another way or ask an operator",
                        abbreviate(text, 160),
                        rule.regex.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Names of the parameters a word uses (not looking inside substitutions).
fn param_names(parts: &[Part], out: &mut Vec<String>) {
    for p in parts {
        match p {
            Part::Param { name, .. } => out.push(name.clone()),
            Part::Opaque {
                fallback: Some((name, _)),
                ..
            } => out.push(name.clone()),
            _ => {}
        }
    }
}

/// Names used as `${NAME:-default}` in a word.
fn fallback_names(parts: &[Part], out: &mut Vec<String>) {
    for p in parts {
        if let Part::Opaque {
            fallback: Some((name, _)),
            ..
        } = p
        {
            out.push(name.clone());
        }
    }
}

/// `cd DIR`: track the working directory when DIR is known, forget it otherwise.
fn change_directory(rest: &[Field], env: &mut Env) {
    let target = rest
        .iter()
        .find(|f| !f.val().is_some_and(|v| v.starts_with('-') && v.len() > 1));
    env.cwd = match target.map(|f| f.val()) {
        None => Some("~".into()),
        Some(Some("-")) | Some(None) => None,
        Some(Some(dir)) if dir.starts_with('/') || dir.starts_with('~') => Some(dir.to_owned()),
        Some(Some(dir)) => env.cwd.as_ref().map(|cwd| format!("{cwd}/{dir}")),
    };
}

fn too_deep() -> Refusal {
    Refusal::new(
        "too-deep",
        format!(
            "refused: the command nests shells, eval or command substitutions more than \
             {MAX_DEPTH} levels deep, too deep to check; flatten it"
        ),
    )
}

fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn is_assignment(v: &str) -> bool {
    v.split_once('=')
        .is_some_and(|(n, _)| is_identifier(n.strip_suffix('+').unwrap_or(n)))
}

fn strip_assignments(args: &[Field]) -> Vec<Field> {
    let n = args
        .iter()
        .take_while(|f| f.val().is_some_and(is_assignment))
        .count();
    args[n..].to_vec()
}

/// Skips getopt-style options: `with_arg` lists the short options that take an argument,
/// `long_with_arg` the long ones (when written without `=`). Stops at `--`, the first
/// non-option, or a field whose value is unknown.
fn skip_options<'a>(args: &'a [Field], with_arg: &str, long_with_arg: &[&str]) -> &'a [Field] {
    let mut i = 0;
    while let Some(v) = args.get(i).and_then(Field::val) {
        if v == "--" {
            i += 1;
            break;
        }
        if let Some(long) = v.strip_prefix("--") {
            i += if !long.contains('=') && long_with_arg.contains(&long) {
                2
            } else {
                1
            };
            continue;
        }
        if v.starts_with('-') && v.len() > 1 {
            let flags: Vec<char> = v[1..].chars().collect();
            let takes_next = flags
                .iter()
                .position(|c| with_arg.contains(*c))
                .is_some_and(|p| p == flags.len() - 1);
            i += if takes_next { 2 } else { 1 };
            continue;
        }
        break;
    }
    args.get(i..).unwrap_or_default()
}

/// `xargs [opts] CMD ARGS`: runs CMD ARGS plus its input (known when it was piped from an
/// `echo`); with `-I R`, the input replaces R.
fn xargs(rest: &[Field], stdin: Option<String>) -> Vec<Field> {
    let mut replace: Option<String> = None;
    let mut i = 0;
    while let Some(v) = rest.get(i).and_then(Field::val) {
        if v == "--" {
            i += 1;
            break;
        }
        if let Some(long) = v.strip_prefix("--") {
            let (name, inline) = long.split_once('=').unwrap_or((long, ""));
            if name == "replace" {
                replace = Some(if inline.is_empty() { "{}" } else { inline }.to_owned());
            } else if inline.is_empty()
                && matches!(
                    name,
                    "arg-file"
                        | "delimiter"
                        | "max-args"
                        | "max-procs"
                        | "max-chars"
                        | "max-lines"
                        | "process-slot-var"
                )
            {
                i += 1;
            }
            i += 1;
            continue;
        }
        if v.starts_with('-') && v.len() > 1 {
            let mut step = 1;
            for (k, c) in v.char_indices().skip(1) {
                let attached = &v[k + c.len_utf8()..];
                match c {
                    'I' => {
                        replace = if attached.is_empty() {
                            step = 2;
                            rest.get(i + 1).map(|f| f.text().to_owned())
                        } else {
                            Some(attached.to_owned())
                        };
                        break;
                    }
                    'i' => {
                        replace = Some(if attached.is_empty() { "{}" } else { attached }.into());
                        break;
                    }
                    'L' | 'n' | 'P' | 's' | 'd' | 'E' | 'a' => {
                        if attached.is_empty() {
                            step = 2;
                        }
                        break;
                    }
                    'e' | 'l' => break,
                    _ => {}
                }
            }
            i += step;
            continue;
        }
        break;
    }
    let mut cmd: Vec<Field> = rest.get(i..).unwrap_or_default().to_vec();
    if cmd.is_empty() {
        cmd.push(Field::lit("echo"));
    }
    match (stdin, replace) {
        (Some(input), Some(r)) => {
            let line = input.lines().next().unwrap_or("").trim().to_owned();
            for f in &mut cmd {
                if let Some(v) = &mut f.value {
                    *v = v.replace(&r, &line);
                }
                f.display = f.display.replace(&r, &line);
            }
        }
        (Some(input), None) => cmd.extend(input.split_whitespace().map(Field::lit)),
        (None, _) => {}
    }
    cmd
}

/// `su [opts] [user] -c CMD` / `--command=CMD`.
fn su_command(rest: &[Field]) -> Option<&Field> {
    let mut i = 0;
    while let Some(f) = rest.get(i) {
        match f.val() {
            Some("-c" | "--command") => return rest.get(i + 1),
            Some(v) if v.starts_with("--command=") => return None,
            _ => i += 1,
        }
    }
    None
}

/// Output of `echo`/`printf` with known arguments.
fn echo_output(fields: &[Field]) -> Option<String> {
    let name = basename(fields.first()?.val()?);
    let mut args = &fields[1..];
    match name {
        "echo" => {
            while let Some(v) = args.first().and_then(Field::val) {
                if v.len() > 1 && v.starts_with('-') && v[1..].chars().all(|c| "neE".contains(c)) {
                    args = &args[1..];
                } else {
                    break;
                }
            }
        }
        "printf" => {}
        _ => return None,
    }
    let values: Option<Vec<&str>> = args.iter().map(Field::val).collect();
    Some(values?.join(" "))
}

/// Brace expansion of an unquoted literal word: `/{etc,usr}` → `/etc /usr`.
fn brace_expand(w: &Word) -> Result<Vec<Word>, Refusal> {
    let Some(text) = w.bare() else {
        return Ok(vec![w.clone()]);
    };
    let mut out = Vec::new();
    let mut pending = vec![text.to_owned()];
    while let Some(s) = pending.pop() {
        match brace_group(&s) {
            Some((open, close, alternatives)) => {
                for alt in alternatives.iter().rev() {
                    pending.push(format!("{}{}{}", &s[..open], alt, &s[close + 1..]));
                }
            }
            None => out.push(Word::lit(s)),
        }
        if out.len() + pending.len() > MAX_BRACE {
            return Err(Refusal::new(
                "too-complex",
                format!(
                    "refused: brace expansion in `{}` produces more than {MAX_BRACE} words, \
                     more than the guard will examine; list the paths explicitly",
                    abbreviate(text, 80)
                ),
            ));
        }
    }
    Ok(out)
}

/// The first `{a,b,…}` group: byte offsets of its braces and its top-level alternatives.
fn brace_group(s: &str) -> Option<(usize, usize, Vec<&str>)> {
    let bytes = s.as_bytes();
    for (open, _) in s.match_indices('{') {
        let mut depth = 0usize;
        let mut commas = Vec::new();
        for (k, &b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        if commas.is_empty() {
                            break;
                        }
                        let mut alts = Vec::new();
                        let mut from = open + 1;
                        for c in commas {
                            alts.push(&s[from..c]);
                            from = c + 1;
                        }
                        alts.push(&s[from..k]);
                        return Some((open, k, alts));
                    }
                }
                b',' if depth == 1 => commas.push(k),
                _ => {}
            }
        }
    }
    None
}

/// Fork bomb: a function that calls itself in a pipeline or in the background.
fn fork_bomb(
    toks: &[Tok],
    spend: &mut impl FnMut(usize) -> Result<(), Refusal>,
) -> Result<Option<String>, Refusal> {
    for i in 0..toks.len() {
        let word = |k: usize| match toks.get(k) {
            Some(Tok::Word(w)) => Some(w),
            _ => None,
        };
        let op = |k: usize, o: Op| matches!(toks.get(k), Some(Tok::Op(x)) if *x == o);
        let (name, mut j) = match word(i) {
            Some(w) if w.bare() == Some("function") => match word(i + 1).and_then(Word::literal) {
                Some(n) => {
                    let j = if op(i + 2, Op::LParen) && op(i + 3, Op::RParen) {
                        i + 4
                    } else {
                        i + 2
                    };
                    (n, j)
                }
                None => continue,
            },
            Some(w) if op(i + 1, Op::LParen) && op(i + 2, Op::RParen) => match w.literal() {
                Some(n) if !n.is_empty() => (n, i + 3),
                _ => continue,
            },
            _ => continue,
        };
        while op(j, Op::Semi) {
            j += 1;
        }
        // The body: `{ … }` or `( … )` up to its matching close.
        let mut depth = 0i32;
        let mut end = toks.len();
        for (k, t) in toks.iter().enumerate().skip(j) {
            let d = match t {
                Tok::Word(w) if w.bare() == Some("{") => 1,
                Tok::Word(w) if w.bare() == Some("}") => -1,
                Tok::Op(Op::LParen) => 1,
                Tok::Op(Op::RParen) => -1,
                _ => 0,
            };
            depth += d;
            if depth <= 0 {
                end = k + 1;
                break;
            }
        }
        let body = &toks[j.min(end)..end];
        // Nested definitions rescan the same tokens; charge for it.
        spend(body.len())?;
        let mut at_command = true;
        let (mut calls_self, mut spawns) = (false, false);
        for t in body {
            match t {
                Tok::Op(o) => {
                    spawns |= matches!(o, Op::Pipe | Op::Amp);
                    at_command = true;
                }
                Tok::Word(w) if at_command => {
                    if matches!(w.bare(), Some("{" | "}" | "!" | "then" | "do" | "else")) {
                        continue;
                    }
                    calls_self |= w.literal().as_deref() == Some(name.as_str());
                    at_command = false;
                }
                _ => {}
            }
        }
        if calls_self && spawns {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

// ---------------------------------------------------------------------------------------------
// Rules on normalised simple commands
// ---------------------------------------------------------------------------------------------

/// The command as the rules see it: the name without its directory, then the arguments.
fn shown(args: &[Field], max: usize) -> String {
    let mut words: Vec<&str> = args.iter().map(|f| f.display.as_str()).collect();
    if let Some(name) = args.first().and_then(Field::val) {
        words[0] = basename(name);
    }
    abbreviate(&words.join(" "), max)
}

fn abbreviate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

fn device_write(cmd: &str, dev: &str) -> Refusal {
    Refusal::new(
        "device-write",
        format!(
            "refused: `{}` would write onto the device {dev}, destroying what is on it; write \
             to a regular file instead, or to /dev/null to discard output",
            abbreviate(cmd, 160)
        ),
    )
}

/// Options (`-x`, `--long`) and operands of a command's arguments.
fn split_args(args: &[Field]) -> (Vec<&str>, Vec<&str>) {
    let (mut opts, mut operands) = (Vec::new(), Vec::new());
    let mut done = false;
    for v in args.iter().filter_map(Field::val) {
        if !done && v == "--" {
            done = true;
        } else if !done && v.starts_with('-') && v.len() > 1 {
            opts.push(v);
        } else {
            operands.push(v);
        }
    }
    (opts, operands)
}

/// `--name` matches an option spelled `--n…` that getopt would accept as an abbreviation.
fn long_is(opt: &str, full: &str) -> bool {
    opt.strip_prefix("--")
        .map(|o| o.split('=').next().unwrap_or(o))
        .is_some_and(|o| !o.is_empty() && full.starts_with(o))
}

fn builtin_rules(args: &[Field], env: &Env) -> Result<(), Refusal> {
    let Some(name) = args.first().and_then(Field::val).map(basename) else {
        return Ok(());
    };
    let cmd = shown(args, 160);
    let (opts, operands) = split_args(&args[1..]);
    match name {
        "rm" | "chmod" | "chown" | "chgrp" => {
            if opts
                .iter()
                .any(|o| o.len() >= 4 && long_is(o, "no-preserve-root"))
            {
                return Err(Refusal::new(
                    "no-preserve-root",
                    format!(
                        "refused: `{cmd}` uses --no-preserve-root, which removes the protection \
                         against operating on /; drop that flag and name the exact paths"
                    ),
                ));
            }
            let recursive = opts.iter().any(|o| {
                long_is(o, "recursive")
                    || (!o.starts_with("--")
                        && (o.contains('R') || (name == "rm" && o.contains('r'))))
            });
            if !recursive {
                return Ok(());
            }
            // chmod's mode and chown's owner are operands too; they never look like paths
            // the rules care about, so every operand is classified.
            for p in &operands {
                if let Some(what) = danger(&env.resolve(p), name == "rm") {
                    return Err(if name == "rm" {
                        Refusal::new(
                            "recursive-delete",
                            format!(
                                "refused: `{cmd}` would recursively delete {what}; name the \
                                 exact directory to remove instead"
                            ),
                        )
                    } else {
                        Refusal::new(
                            "recursive-permissions",
                            format!(
                                "refused: `{cmd}` would recursively change the ownership or \
                                 permissions of {what}, which can leave the system unusable; \
                                 name the exact directory instead"
                            ),
                        )
                    });
                }
            }
            Ok(())
        }
        n if n == "mkfs" || n.starts_with("mkfs.") || n == "mke2fs" || n == "wipefs" => {
            Err(Refusal::new(
                "format-disk",
                format!(
                    "refused: `{cmd}` would erase a filesystem or the signatures on a disk, \
                     destroying its data; formatting devices is not allowed through this tool, \
                     ask an operator"
                ),
            ))
        }
        "dd" => {
            for v in &operands {
                if let Some(dev) = v
                    .strip_prefix("of=")
                    .and_then(|o| block_device(&env.resolve(o)))
                {
                    return Err(Refusal::new(
                        "dd-device",
                        format!(
                            "refused: `{cmd}` would write raw data onto the device {dev}, \
                             destroying what is on it; write to a regular file instead (for \
                             example of=./disk.img)"
                        ),
                    ));
                }
            }
            Ok(())
        }
        "tee" | "shred" => match operands.iter().find_map(|v| block_device(&env.resolve(v))) {
            Some(dev) => Err(device_write(&cmd, &dev)),
            None => Ok(()),
        },
        "cp" | "mv" | "install" => {
            match operands.last().and_then(|v| block_device(&env.resolve(v))) {
                Some(dev) => Err(device_write(&cmd, &dev)),
                None => Ok(()),
            }
        }
        "shutdown" | "reboot" | "halt" | "poweroff" => Err(power(&cmd)),
        "init" | "telinit" if operands.iter().any(|v| matches!(*v, "0" | "6")) => Err(power(&cmd)),
        "systemctl" | "loginctl"
            if operands.iter().any(|v| {
                matches!(*v, "poweroff" | "reboot" | "halt" | "kexec" | "soft-reboot")
            }) =>
        {
            Err(power(&cmd))
        }
        _ => Ok(()),
    }
}

fn power(cmd: &str) -> Refusal {
    Refusal::new(
        "power",
        format!(
            "refused: `{cmd}` would shut down or restart the machine, cutting off everything \
             running on it; ask an operator if a restart is really needed"
        ),
    )
}

/// Components of an absolute or `~`-relative path after removing `.`, `..` and empty parts;
/// `None` when `..` climbs above the start.
fn normalize(path: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out)
}

/// What a recursive operation on `path` would hit, when that is something it must not.
/// `home`: the home directory counts (for deletion, not for permission changes).
fn danger(path: &str, home: bool) -> Option<String> {
    if let Some(after) = path.strip_prefix('~') {
        if !home {
            return None;
        }
        let (user, rest) = after.split_once('/').unwrap_or((after, ""));
        let whose = if user.is_empty() {
            "your home directory".to_owned()
        } else {
            format!("the home directory of {user}")
        };
        return match normalize(rest).as_deref() {
            None => Some(format!("the directories above {whose}")),
            Some([]) => Some(whose),
            Some([g]) if broad_glob(g) => Some(format!("everything in {whose}")),
            Some(_) => None,
        };
    }
    if !path.starts_with('/') {
        return None;
    }
    // `..` above `/` stays at `/`.
    let mut comps: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                comps.pop();
            }
            c => comps.push(c),
        }
    }
    match comps.as_slice() {
        [] => Some("the root filesystem /".into()),
        [g] if broad_glob(g) => Some("everything under /".into()),
        [d] => system_dir(d).map(|s| format!("the system directory /{s}")),
        [d, g] if broad_glob(g) => system_dir(d).map(|s| format!("everything under /{s}")),
        _ => None,
    }
}

/// The system directory a top-level component names or (as a glob) matches.
fn system_dir(component: &str) -> Option<&'static str> {
    SYSTEM_DIRS
        .iter()
        .copied()
        .find(|d| *d == component || (has_glob(component) && glob_match(component, d)))
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// A component that matches (nearly) every name: `*`, `.*`, `?*`, `[a-z]*`, `*.*`.
fn broad_glob(c: &str) -> bool {
    let mut simplified = String::new();
    let mut chars = c.chars();
    while let Some(ch) = chars.next() {
        if ch == '[' {
            for x in chars.by_ref() {
                if x == ']' {
                    break;
                }
            }
            simplified.push('?');
        } else {
            simplified.push(ch);
        }
    }
    simplified.contains('*') && simplified.chars().all(|ch| matches!(ch, '*' | '?' | '.'))
}

/// Shell glob matching (`*`, `?`, `[…]`, `[!…]`) of a short name; dynamic programming, so no
/// pattern can make it backtrack exponentially.
fn glob_match(pattern: &str, name: &str) -> bool {
    enum Tokn {
        Star,
        Any,
        Class(Vec<char>, bool),
        Char(char),
    }
    let mut toks = Vec::new();
    let mut it = pattern.chars().peekable();
    while let Some(c) = it.next() {
        toks.push(match c {
            '*' => Tokn::Star,
            '?' => Tokn::Any,
            '[' => {
                let negate = matches!(it.peek(), Some('!' | '^'));
                if negate {
                    it.next();
                }
                let mut set = Vec::new();
                let mut prev: Option<char> = None;
                while let Some(x) = it.next() {
                    if x == ']' && !set.is_empty() {
                        break;
                    }
                    if x == '-'
                        && let (Some(lo), Some(&hi)) = (prev, it.peek())
                        && hi != ']'
                    {
                        it.next();
                        set.extend((lo..=hi).take(256));
                        prev = None;
                        continue;
                    }
                    set.push(x);
                    prev = Some(x);
                }
                Tokn::Class(set, negate)
            }
            c => Tokn::Char(c),
        });
    }
    let name: Vec<char> = name.chars().collect();
    // reach[j]: the pattern so far can match the first j characters.
    let mut reach = vec![false; name.len() + 1];
    reach[0] = true;
    for t in &toks {
        let mut next = vec![false; name.len() + 1];
        for j in 0..=name.len() {
            match t {
                Tokn::Star => next[j] = reach[j] || (j > 0 && next[j - 1]),
                _ if j == 0 => {}
                Tokn::Any => next[j] = reach[j - 1],
                Tokn::Char(c) => next[j] = reach[j - 1] && name[j - 1] == *c,
                Tokn::Class(set, negate) => {
                    next[j] = reach[j - 1] && (set.contains(&name[j - 1]) != *negate)
                }
            }
        }
        reach = next;
    }
    reach[name.len()]
}

/// The device a write to `path` would hit, unless it is a harmless one.
fn block_device(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let comps = normalize(path).unwrap_or_default();
    match comps.as_slice() {
        ["dev", first, ..] => {
            const HARMLESS: &[&str] = &[
                "null", "zero", "full", "random", "urandom", "stdin", "stdout", "stderr", "fd",
                "pts", "shm", "ptmx", "console",
            ];
            if HARMLESS.contains(first) || first.starts_with("tty") {
                None
            } else {
                Some(format!("/{}", comps.join("/")))
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Guard {
        Guard::default()
    }

    #[track_caller]
    fn assert_refused(cmd: &str, rule: &str) {
        match guard().check(cmd) {
            Ok(()) => panic!("allowed, expected `{rule}`: {cmd}"),
            Err(r) => assert_eq!(r.rule, rule, "wrong rule for {cmd}: {}", r.message),
        }
    }

    #[track_caller]
    fn assert_allowed(cmd: &str) {
        if let Err(r) = guard().check(cmd) {
            panic!("refused ({}): {cmd}: {}", r.rule, r.message);
        }
    }

    const DELETE: &str = "recursive-delete";

    #[test]
    fn recursive_delete_of_root_home_and_system_dirs() {
        for target in [
            "/",
            "/*",
            "//",
            "/.",
            "/./",
            "/..",
            "/../..",
            "/.*",
            "~",
            "~/",
            "~/*",
            "~root",
            "~/..",
            "$HOME",
            "${HOME}",
            "\"$HOME\"",
            "$HOME/",
            "$HOME/*",
            "/bin",
            "/boot",
            "/dev",
            "/etc",
            "/home",
            "/lib",
            "/lib64",
            "/opt",
            "/proc",
            "/root",
            "/sbin",
            "/srv",
            "/sys",
            "/usr",
            "/var",
            "/usr/",
            "/usr/*",
            "/etc/*",
            "/home/*",
            "/var/.",
            "/usr/./",
            "/tmp/../etc",
            "/u*",
            "/e?c",
            "/[e]tc",
            "/b*",
            "/usr/.*",
            "/{tmp,etc}",
        ] {
            assert_refused(&format!("rm -rf {target}"), DELETE);
        }
    }

    #[test]
    fn every_spelling_of_recursive_flags() {
        for flags in [
            "-rf",
            "-fr",
            "-r -f",
            "-R -f",
            "-Rf",
            "-fR",
            "-r",
            "-R",
            "--recursive --force",
            "--recursive",
            "--force --recursive",
            "--recur -f",
            "-v -r -f",
            "-rfv",
            "-f -- ",
        ] {
            let cmd = format!("rm {flags} /");
            if flags == "-f -- " {
                assert_allowed(&cmd);
            } else {
                assert_refused(&cmd, DELETE);
            }
        }
        assert_refused("rm / -rf", DELETE);
        assert_refused("rm -rf -- /", DELETE);
        assert_refused("rm -rf ./build /etc", DELETE);
    }

    #[test]
    fn no_preserve_root_is_refused() {
        for cmd in [
            "rm -rf --no-preserve-root /",
            "rm --no-preserve-root -r /tmp/x",
            "chmod -R --no-preserve-root 777 /",
            "chown --no-preserve-root -R me /",
            "rm -rf --no-preserve /",
        ] {
            assert_refused(cmd, "no-preserve-root");
        }
    }

    #[test]
    fn formatting_and_wiping_disks() {
        for cmd in [
            "mkfs /dev/sdb1",
            "mkfs.ext4 /dev/sda1",
            "mkfs.xfs -f /dev/nvme0n1p2",
            "/sbin/mkfs.vfat /dev/sdc",
            "mke2fs /dev/sdb",
            "wipefs -a /dev/sda",
        ] {
            assert_refused(cmd, "format-disk");
        }
    }

    #[test]
    fn dd_onto_devices() {
        for cmd in [
            "dd if=/dev/zero of=/dev/sda",
            "dd if=image.iso of=/dev/sdb bs=4M",
            "dd of=/dev/nvme0n1 if=/dev/urandom",
            "dd if=x of=/dev/disk/by-id/usb-1",
            "dd if=x of=/dev/mapper/root",
        ] {
            assert_refused(cmd, "dd-device");
        }
    }

    #[test]
    fn writing_onto_block_devices() {
        for cmd in [
            "echo hi > /dev/sda",
            "cat x >/dev/nvme0n1",
            "cat x >> /dev/sdb1",
            "cat x 1>/dev/sda",
            "cat x &>/dev/sda",
            "cat x >& /dev/sda",
            "cat x >| /dev/vda",
            "echo x | tee /dev/sdb",
            "echo x | tee -a out.log /dev/sdb",
            "cp disk.img /dev/sdc",
            "shred /dev/sda",
            "cat x > /dev/../dev/sda",
        ] {
            assert_refused(cmd, "device-write");
        }
    }

    #[test]
    fn fork_bombs() {
        for cmd in [
            ":(){ :|:& };:",
            ":(){ :|: & };:",
            "f(){ f|f& };f",
            "bomb() { bomb | bomb & }; bomb",
            "function b { b | b & }; b",
            "function b() { b & b & }; b",
            "x(){\n x | x &\n}\nx",
            "bash -c ':(){ :|:& };:'",
        ] {
            assert_refused(cmd, "fork-bomb");
        }
    }

    #[test]
    fn shutting_the_machine_down() {
        for cmd in [
            "shutdown -h now",
            "shutdown -r +5",
            "reboot",
            "halt",
            "poweroff",
            "/sbin/reboot -f",
            "init 0",
            "init 6",
            "telinit 6",
            "systemctl poweroff",
            "systemctl reboot",
            "systemctl halt",
            "systemctl --force reboot",
            "sudo systemctl -i poweroff",
        ] {
            assert_refused(cmd, "power");
        }
    }

    #[test]
    fn recursive_permission_changes_of_system_trees() {
        for cmd in [
            "chmod -R 777 /",
            "chmod -R 000 /etc",
            "chmod --recursive a+rwx /usr",
            "chown -R nobody /",
            "chown -R nobody:nogroup /var",
            "chgrp -R users /",
            "chmod -R -w /*",
            "chown -hR me /home",
        ] {
            assert_refused(cmd, "recursive-permissions");
        }
    }

    #[test]
    fn bypasses_are_seen_through() {
        for (cmd, rule) in [
            ("sh -c \"rm -rf /\"", DELETE),
            ("bash -lc 'rm -rf /'", DELETE),
            ("bash -o pipefail -c 'rm -rf /'", DELETE),
            ("zsh -c 'rm -rf ~'", DELETE),
            ("/bin/dash -ec 'rm -rf /'", DELETE),
            ("eval \"rm -rf /\"", DELETE),
            ("eval rm -rf /", DELETE),
            ("echo $(rm -rf /)", DELETE),
            ("echo \"$(rm -rf /)\"", DELETE),
            ("echo `rm -rf /`", DELETE),
            ("x=`echo \\`rm -rf /\\``", DELETE),
            ("diff <(rm -rf /) x", DELETE),
            ("ls; rm -rf /", DELETE),
            ("true && rm -rf /", DELETE),
            ("false || rm -rf /", DELETE),
            ("ls | rm -rf /", DELETE),
            ("sleep 1 & rm -rf /", DELETE),
            ("ls\nrm -rf /", DELETE),
            ("( rm -rf / )", DELETE),
            ("(cd /tmp && rm -rf /)", DELETE),
            ("{ rm -rf /; }", DELETE),
            ("if true; then rm -rf /; fi", DELETE),
            ("for i in 1; do rm -rf /; done", DELETE),
            ("sudo rm -rf /", DELETE),
            ("sudo -u root rm -rf /", DELETE),
            ("sudo -E -u root -- rm -rf /", DELETE),
            ("sudo --user=root rm -rf /", DELETE),
            ("sudo -Eu root rm -rf /", DELETE),
            ("doas rm -rf /", DELETE),
            ("env rm -rf /", DELETE),
            ("env FOO=1 BAR=2 rm -rf /", DELETE),
            ("env -i PATH=/bin rm -rf /", DELETE),
            ("env -u HOME rm -rf /", DELETE),
            ("env -S 'rm -rf /'", DELETE),
            ("/usr/bin/env rm -rf /", DELETE),
            ("nice -n 5 rm -rf /", DELETE),
            ("nice -5 rm -rf /", DELETE),
            ("nohup rm -rf / &", DELETE),
            ("timeout 5 rm -rf /", DELETE),
            ("timeout -s KILL 5s rm -rf /", DELETE),
            ("command rm -rf /", DELETE),
            ("exec rm -rf /", DELETE),
            ("builtin rm -rf /", DELETE),
            ("time rm -rf /", DELETE),
            ("time -p rm -rf /", DELETE),
            ("xargs rm -rf /", DELETE),
            ("echo / | xargs rm -rf", DELETE),
            ("echo / | xargs -I{} rm -rf {}", DELETE),
            ("busybox rm -rf /", DELETE),
            ("/bin/rm -rf /", DELETE),
            ("/usr/bin/rm -rf /", DELETE),
            ("r''m -rf /", DELETE),
            ("\"rm\" -rf /", DELETE),
            ("\\rm -rf /", DELETE),
            ("'r'\"m\" -rf /", DELETE),
            ("rm -r''f /", DELETE),
            ("rm -rf '/'", DELETE),
            ("$'\\x72\\x6d' -rf /", DELETE),
            ("X=rm; $X -rf /", DELETE),
            ("X=rm; ${X} -rf /", DELETE),
            ("X=rm\n\"$X\" -rf /", DELETE),
            ("X=r; Y=m; $X$Y -rf /", DELETE),
            ("export X=rm; $X -rf /", DELETE),
            ("X='rm -rf /'; $X", DELETE),
            ("D=/; rm -rf $D", DELETE),
            ("D=/etc; rm -rf \"$D\"", DELETE),
            ("rm${IFS}-rf${IFS}/", DELETE),
            ("{rm,-rf,/}", DELETE),
            ("$(echo rm) -rf /", DELETE),
            ("`echo rm` -rf /", DELETE),
            ("echo 'rm -rf /' | sh", DELETE),
            ("printf 'rm -rf /' | bash", DELETE),
            ("bash <<< 'rm -rf /'", DELETE),
            ("sh <<EOF\nrm -rf /\nEOF", DELETE),
            ("cat <<'EOF' | sh\nrm -rf /\nEOF", DELETE),
            ("sudo env nice -n 5 timeout 5 nohup /bin/rm -rf /", DELETE),
            ("sudo sh -c 'eval \"rm -rf /\"'", DELETE),
            ("su -c 'rm -rf /'", DELETE),
            ("su root -c 'rm -rf /'", DELETE),
            ("trap 'rm -rf /' EXIT", DELETE),
            ("alias x='rm -rf /'", DELETE),
            ("find / -delete", DELETE),
            ("find / -exec rm -rf {} +", DELETE),
            ("find . -exec rm -rf / \\;", DELETE),
            ("X=sh; $X -c 'rm -rf /'", DELETE),
            ("sudo -u root mkfs.ext4 /dev/sda1", "format-disk"),
            ("bash -c 'dd if=/dev/zero of=/dev/sda'", "dd-device"),
            ("sh -c 'echo x > /dev/sda'", "device-write"),
            ("X=/dev/sda; echo x > $X", "device-write"),
            ("sudo reboot", "power"),
            ("nohup sh -c 'sleep 5; reboot' &", "power"),
            ("$X -rf /", "unresolved-command"),
            ("${CMD} -rf /usr", "unresolved-command"),
            ("$(which rm) -rf /", "unresolved-command"),
            ("$X -R 777 /", "unresolved-command"),
            ("$X if=/dev/zero of=/dev/sda", "unresolved-command"),
            ("X=$(get); $X -rf /", "unresolved-command"),
            ("$SUDO rm -rf /", DELETE),
            ("$SUDO sh -c 'rm -rf /'", DELETE),
            ("\"$SHELL\" -c 'rm -rf /'", DELETE),
            ("sh -c 'rm -rf \"$1\"' _ /", DELETE),
            ("echo / | xargs sh -c 'rm -rf $0'", DELETE),
        ] {
            assert_refused(cmd, rule);
        }
    }

    #[test]
    fn working_directory_loops_and_defaults_are_followed() {
        for (cmd, rule) in [
            ("cd / && rm -rf *", DELETE),
            ("cd /usr; rm -rf ./*", DELETE),
            ("cd /usr/local && rm -rf ..", DELETE),
            ("cd /tmp; cd ..; rm -rf etc", DELETE),
            ("cd && rm -rf *", DELETE),
            ("cd ~ && rm -rf .", DELETE),
            ("for d in / /etc; do rm -rf \"$d\"; done", DELETE),
            ("for d in /tmp/a /usr; do echo $d; rm -rf $d; done", DELETE),
            (
                "for a in x; do for b in /; do rm -rf $b; done; done",
                DELETE,
            ),
            ("rm -rf ${HOME:-/tmp}", DELETE),
            ("D=; rm -rf ${D:-/}", DELETE),
            ("D=/; rm -rf ${D:-./build}", DELETE),
            ("rm -rf ${UNSET_HERE:-/}", DELETE),
            ("rm -rf \"${TARGET:-/usr}\"", DELETE),
            ("cd /dev && cat x > sda", "device-write"),
        ] {
            assert_refused(cmd, rule);
        }
        for cmd in [
            "cd /tmp && rm -rf *",
            "cd ~/project && rm -rf target",
            "cd $DIR && rm -rf *",
            "cd /usr && ls && cd /tmp/x && rm -rf *",
            "cd - && rm -rf *",
            "for f in a b c; do rm -rf $f; done",
            "for f in $(ls); do rm -rf $f; done",
            "rm -rf ${BUILD_DIR:-./build}",
            "rm -rf ${UNSET_HERE:-./build}",
        ] {
            assert_allowed(cmd);
        }
    }

    #[test]
    fn ordinary_work_is_allowed() {
        for cmd in [
            "rm -rf ./build",
            "rm -rf build target",
            "rm -rf /tmp/x",
            "rm -rf /tmp",
            "rm -rf ~/project/target",
            "rm -rf \"$HOME/project/target\"",
            "rm -rf $HOME/.cache/pip",
            "rm -rf /var/tmp/build-123",
            "rm -rf /usr/local/lib/old",
            "rm -rf *",
            "rm -rf .",
            "rm -rf \"$TMPDIR\"",
            "rm -f /etc/nginx/sites-enabled/default",
            "rm /etc",
            "echo \"rm -rf /\"",
            "echo 'rm -rf /' > notes.txt",
            "printf '%s\\n' 'mkfs /dev/sda'",
            "grep -r \"mkfs\" .",
            "grep -rn 'rm -rf /' docs/",
            "git commit -m 'never run rm -rf / or reboot'",
            "ls /dev",
            "ls -la /dev/sda",
            "cat /dev/null > file",
            "echo hi > /dev/null 2>&1",
            "echo hi >/dev/stderr",
            "echo hi > /dev/stdout",
            "echo hi > /dev/tty",
            "echo hi > /dev/fd/3",
            "cmd 2>/dev/null >&2",
            "dd if=/dev/zero of=./file bs=1M count=10",
            "dd if=/dev/sda of=./backup.img",
            "chmod -R 755 ./dir",
            "chmod -r file",
            "chmod 755 /usr/local/bin/tool",
            "chown -R me ~",
            "chown -R me:me /srv/app/data",
            "git reset --hard",
            "cargo build",
            "cargo test --workspace -- --nocapture",
            "python3 -c 'print(1)'",
            "sh -c 'echo hello'",
            "bash -lc 'cargo build && ./target/debug/app'",
            "sudo apt-get install -y ripgrep",
            "sudo systemctl restart nginx",
            "systemctl status sshd",
            "find . -name '*.o' -delete",
            "find / -name '*.log' -exec rm -f {} +",
            "find /tmp/x -delete",
            "X=ls; $X -la /",
            "$EDITOR file.txt",
            "\"$CC\" -o out main.c",
            "f(){ echo f | grep f; }; f",
            "fact(){ echo $1; }; fact 3",
            "echo $(date) > log.txt",
            "kill -9 1234",
            "tar czf /tmp/backup.tgz /etc",
            "cp -r /etc/nginx ./nginx-backup",
            "docker run --rm -v /:/host alpine ls /host",
            "init --version",
            "mkdir -p ~/x && cd ~/x",
            "journalctl -u app --since today | tail -n 50",
            "curl -s https://example.com | head",
            "cat <<EOF > config.toml\nrm = true\nEOF",
            "echo '{rm,-rf,/}'",
            "awk '{print $1}' file",
            "for f in *.txt; do echo $f; done",
            "case $x in a) echo a;; b) echo b;; esac",
            "",
            "   ",
            "# rm -rf /",
        ] {
            assert_allowed(cmd);
        }
    }

    #[test]
    fn messages_name_the_command_and_what_to_do() {
        let r = guard().check("rm -rf /").unwrap_err();
        assert_eq!(r.rule, DELETE);
        assert!(
            r.message.starts_with("refused: `rm -rf /`"),
            "{}",
            r.message
        );
        assert!(r.message.contains("root filesystem"), "{}", r.message);
        assert!(
            r.message.contains("name the exact directory"),
            "{}",
            r.message
        );
        assert_eq!(r.to_string(), r.message);

        let r = guard().check("sudo /bin/rm -rf /usr/*").unwrap_err();
        assert!(r.message.contains("`rm -rf /usr/*`"), "{}", r.message);
        assert!(r.message.contains("everything under /usr"), "{}", r.message);

        let r = guard().check("echo x > /dev/sda").unwrap_err();
        assert!(r.message.contains("`echo x > /dev/sda`"), "{}", r.message);

        let r = guard().check("$X -rf /").unwrap_err();
        assert!(r.message.contains("`${X}`"), "{}", r.message);
        assert!(r.message.contains("literally"), "{}", r.message);
    }

    #[test]
    fn oversized_input_is_refused_with_a_clear_message() {
        let long = format!("echo {}", "a".repeat(MAX_INPUT));
        let r = guard().check(&long).unwrap_err();
        assert_eq!(r.rule, "too-long");
        assert!(r.message.contains(&MAX_INPUT.to_string()), "{}", r.message);
        let fits = format!("echo {}", "a".repeat(MAX_INPUT - 5));
        assert_allowed(&fits);
    }

    #[test]
    fn nesting_is_bounded() {
        let mut cmd = "rm -rf /".to_owned();
        for _ in 0..MAX_DEPTH {
            cmd = format!("echo $({cmd})");
        }
        assert_refused(&cmd, DELETE);
        let deeper = format!("echo $({cmd})");
        assert_refused(&deeper, "too-deep");
        let harmless = format!(
            "{}true{}",
            "$(".repeat(MAX_DEPTH + 1),
            ")".repeat(MAX_DEPTH + 1)
        );
        assert_refused(&harmless, "too-deep");

        // Scripts fed to shells nest the same way (here-documents grow linearly).
        let nest = |levels: usize| {
            let mut cmd = "rm -rf /".to_owned();
            for k in 0..levels {
                cmd = format!("sh <<'E{k}'\n{cmd}\nE{k}");
            }
            cmd
        };
        assert_refused(&nest(MAX_DEPTH), DELETE);
        assert_refused(&nest(MAX_DEPTH + 1), "too-deep");

        // Deep nesting must not overflow the stack either.
        let huge = "$(".repeat(20_000);
        assert_refused(&huge, "too-deep");
    }

    #[test]
    fn expansion_blowup_is_bounded() {
        // Doubling a variable: values past the cap become unknown, and the check stays fast
        // and still sees what follows.
        let mut cmd = "a=xxxxxxxxxxxxxxxx".to_owned();
        for _ in 0..40 {
            cmd.push_str("; a=$a$a");
        }
        assert_allowed(&format!("{cmd}; echo $a"));
        assert_refused(&format!("{cmd}; rm -rf /"), DELETE);

        // Expanding a large value many times exhausts the budget.
        let big = "x".repeat(32 * 1024);
        let uses = " $a".repeat(40);
        assert_refused(&format!("a={big}; echo{uses}"), "too-complex");

        // Nested loops multiply the work; the budget bounds it.
        let values = (1..=16)
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let mut loops = String::new();
        for v in ["a", "b", "c", "d", "e"] {
            loops.push_str(&format!("for {v} in {values}; do "));
        }
        loops.push_str("echo $a$b$c$d$e");
        loops.push_str(&"; done".repeat(5));
        assert_refused(&loops, "too-complex");

        let braces = "echo {a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}";
        assert_refused(braces, "too-complex");
    }

    #[test]
    fn operator_patterns_apply_to_raw_text_and_normalised_commands() {
        let g = Guard::new(&[r"^docker\s+system\s+prune".into(), r"DROP\s+TABLE".into()]).unwrap();
        for cmd in [
            "docker system prune -af",
            "sudo docker system prune",
            "sh -c 'docker system prune'",
            "X=docker; $X system prune",
            "psql -c 'DROP TABLE users'",
        ] {
            let r = g.check(cmd).unwrap_err();
            assert_eq!(r.rule, "operator", "{cmd}");
            assert!(r.message.contains("operator"), "{}", r.message);
        }
        g.check("docker ps").unwrap();
        g.check("echo docker system prune").unwrap();
        // Built-ins still apply.
        assert_eq!(g.check("rm -rf /").unwrap_err().rule, DELETE);
    }

    #[test]
    fn operator_pattern_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("guard.txt");
        std::fs::write(&path, "# comment\n\n  ^terraform\\s+destroy  \n").unwrap();
        let g = Guard::from_file(Some(&path)).unwrap();
        assert_eq!(g.check("terraform destroy").unwrap_err().rule, "operator");
        g.check("terraform plan").unwrap();
        // A comment is not a command, and the pattern is anchored.
        g.check("# terraform destroy").unwrap();
    }

    #[test]
    fn bad_operator_patterns_name_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("guard.txt");
        std::fs::write(&path, "# ok\nfine\n\n(unclosed\n").unwrap();
        let err = Guard::from_file(Some(&path)).unwrap_err();
        match &err {
            GuardError::BadPattern { line, .. } => assert_eq!(*line, 4),
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("guard.txt"), "{err}");
        let err = Guard::new(&["ok".into(), "[".into()]).unwrap_err();
        assert!(
            matches!(err, GuardError::BadPattern { line: 2, .. }),
            "{err:?}"
        );
        assert!(Guard::new(&[String::new()]).is_err());
        let missing = Guard::from_file(Some(&dir.path().join("nope"))).unwrap_err();
        assert!(matches!(missing, GuardError::Read { .. }));
        assert!(Guard::from_file(None).unwrap().check("ls").is_ok());
    }

    /// Arbitrary input never panics or hangs: every answer is a yes or a refusal.
    #[test]
    fn arbitrary_input_never_panics() {
        let alphabet: Vec<char> = "rm -f/~$(){}[]<>|&;'\"\\`\n\t=*?#!:.0123456789aEOFé€😀-_%"
            .chars()
            .collect();
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let g = guard();
        for _ in 0..20_000 {
            let len = (next() % 48) as usize;
            let s: String = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let _ = g.check(&s);
        }
        // Structured fragments glued at random stress the nesting paths.
        let pieces = [
            "$(",
            ")",
            "`",
            "'",
            "\"",
            "${",
            "}",
            "<<E\n",
            "\nE\n",
            "sh -c ",
            "eval ",
            "<(",
            "for x in / a; do ",
            "; done",
            "f(){ ",
            " f|f& }",
            "cd / ; ",
            "rm -rf ",
            "X=rm; $X ",
            "${Y:-/}",
            "{a,b}",
            "xargs -I{} ",
            "env -S '",
            "$'\\x72'",
            " | sh",
        ];
        for _ in 0..5_000 {
            let n = (next() % 12) as usize;
            let s: String = (0..n)
                .map(|_| pieces[(next() % pieces.len() as u64) as usize])
                .collect();
            let _ = g.check(&s);
        }
    }

    #[test]
    fn glob_matching() {
        assert!(glob_match("u*", "usr"));
        assert!(glob_match("[a-f]tc", "etc"));
        assert!(glob_match("[!x]tc", "etc"));
        assert!(!glob_match("[!e]tc", "etc"));
        assert!(glob_match("?", "x"));
        assert!(!glob_match("u?", "usr"));
        assert!(glob_match("**************************a", "a"));
        assert!(!glob_match("tmp*", "usr"));
    }
}
