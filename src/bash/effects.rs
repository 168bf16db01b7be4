//! The one walk through a command: parses it once ([`super::parse`]) and, driven by the
//! command table ([`super::spec`]), lists its [`Effect`]s in the order they happen — a
//! program runs (with its arguments, expanded, and the directories it may run in), a file is written,
//! a nested script runs (`sh -c`, `eval`, `su -c`, an alias or trap, a here-string or a pipe
//! into a shell or an interpreter, an interpreter's inline code), a network endpoint is
//! opened, a descriptor is duplicated — and an [`Effect::Opaque`] for whatever it cannot see
//! through (a command name or a script known only when it runs, a word that could be any
//! option), and an [`Effect::Bound`] where one of the walk's bounds stopped it (nesting too
//! deep, too many wrappers, too much text, too many effects).
//!
//! It owns the order of things; the variables (assignments, `export`, `unset`, `read`, `for`
//! values, `sh -c`'s `$0`…), each known value expanded by [`super::expand`] — only `eval`
//! keeps what a nested script assigns, a command using `${X:-default}` with X unknown is
//! walked once more with X empty, one using a `for` variable once per value; `cd` and the
//! wrappers' directory options (the places a script may be in); unwrapping wrappers; known
//! text given to a shell (`echo … | sh`, here-documents); and following nested scripts,
//! `xargs` and `find -exec`. It never decides anything: a policy reads the list it returns
//! (the workspace judge at `read-write` does; the command guard, which still walks expanded
//! words itself, is to be the second). It never runs anything and never touches the
//! filesystem (paths are normalised lexically).
//!
//! Three parts of the walk have files of their own: `state`, what the script defines and
//! makes that later commands run through (aliases and functions, walked where used; `hash
//! -p`; variable attributes; links, followed; files written, read where they run; variables
//! that hold a command); `code`, programs that take code as data (an `awk` or `sed` program,
//! `vim`, `ed` and `gdb` commands as scripts in their language; git settings and
//! subcommands, makefiles, `at` and crontab jobs as shell code); `elsewhere`, commands run on
//! other hosts, in containers (their bind mounts links to this host's paths) or sandboxes,
//! walked where nothing about the place is known.
//!
//! Every bound fails closed: nesting deeper than [`MAX_DEPTH`], more than [`MAX_WRAPPERS`]
//! wrappers unwrapped, more than [`MAX_TEXT`] characters of nested scripts, more than
//! [`MAX_EFFECTS`] effects, more than [`MAX_LINKS`] links, or an expansion past its budget of
//! text or [`MAX_CPU`] (or past [`super::expand::MAX_BRACE`] words, or with an unknown `IFS`)
//! is a `Bound` effect, which a policy refuses (it is not a question for a person); more than [`MAX_CWDS`] places, or
//! [`MAX_CWD_BYTES`] of them, is an unknown place.

use std::sync::Arc;

use super::expand::{
    Bound, Env, Expander, Field, MAX_LOOP_VALUES, echo_output, fallback_names, param_names,
};
use super::parse::{
    self, Lexer, Op, Part, Redir, RedirKind, RedirectKind, Redirection, ShellWord, Tok, Word,
    is_identifier, render_source,
};
use super::spec::{self, SHELLS, Wrapper, maybe_option, option_is, scan, unknown_option};
use super::{MAX_DEPTH, MAX_WRAPPERS, basename};

mod code;
mod elsewhere;
mod state;

/// Most effects one walk lists; past it the walk stops with a `Bound` effect.
pub const MAX_EFFECTS: usize = 16 * 1024;
/// Most characters of scripts (the command and every nested script) one walk parses.
pub use super::expand::MAX_TEXT;
/// CPU time one walk may spend expanding words; past it the walk stops with a `Bound`.
pub const MAX_CPU: std::time::Duration = std::time::Duration::from_millis(250);
/// Most working directories a script is tracked as possibly being in; past it, unknown.
pub const MAX_CWDS: usize = 16;
/// Most bytes of those directories together; past it, unknown (each path a write names is
/// resolved against every one).
pub const MAX_CWD_BYTES: usize = 16 * 1024;

/// Where a command starts, as far as the caller knows (absolute paths).
#[derive(Debug, Clone, Copy, Default)]
pub struct Start<'a> {
    /// The working directory; `None` when unknown.
    pub cwd: Option<&'a str>,
    /// The home directory of the account it runs as, for `~`; `None` when unknown.
    pub home: Option<&'a str>,
    /// Variables the caller sets for the command.
    pub env: &'a [(String, String)],
}

/// Where an effect happens: the directories the script may be in by then (normalised; empty
/// when that cannot be known) and the home directory for `~` (`None` when unknown or
/// changed by the script).
///
/// Shared, not copied: every effect of a long script carries its place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Place {
    pub cwds: Arc<[String]>,
    pub home: Option<Arc<str>>,
    /// The links the script made before (link → target, absolute), and the mounts of a
    /// container the command runs in: a path through one is where it leads.
    pub links: Arc<[(String, String)]>,
}

impl Place {
    /// Where `path` can be, for each possible working directory, links followed; `None`
    /// when it cannot be known.
    pub fn resolve(&self, path: &str) -> Option<Vec<String>> {
        let all = resolve(path, &self.cwds, self.home.as_deref())?;
        Some(match self.links.is_empty() {
            true => all,
            false => all.iter().map(|p| follow_links(p, &self.links)).collect(),
        })
    }
}

/// How a file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// `>`: truncated, then written.
    Truncated,
    /// `>>`, `<>`: written without truncating.
    Appended,
    /// Named by an option of the program (`time -o FILE`).
    ByOption,
}

/// How a nested script reaches its interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nesting {
    /// `sh -c CODE`, `python -c CODE`, `perl -e CODE`.
    Inline,
    /// `eval WORDS`, `watch WORDS` (joined and run by a shell).
    Eval,
    /// `alias NAME=CODE`, `trap CODE SIGNALS`: run later, by the same shell.
    Deferred,
    /// An option of a wrapper or a program (`su -c`, `env -S`, `tar --to-command`).
    Option,
    /// `<<< CODE` into a shell or an interpreter.
    HereString,
    /// A command given to run elsewhere: by a shell on another host (`ssh HOST CMD`,
    /// `ansible -a CMD`), or in a container (`docker run IMAGE CMD`).
    Remote,
    /// A here-document into a shell or an interpreter.
    HereDocument,
    /// `… | sh`: the output of the command before it.
    Pipe,
    /// A script file, named as an operand or redirected in with `<`.
    File,
}

/// One thing a command does, in the order it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A program runs: its arguments as expanded, each known, unknown, or unknown with a
    /// value if its unknown parts are empty (a wrapper and the command it runs are each a
    /// program), and where. `what`, in every effect, is the simple command it comes from,
    /// as written (for messages), shared by all its effects.
    Program {
        argv: Vec<ShellWord>,
        at: Place,
        /// Whether it reads the output of a pipe (`curl … | python`).
        piped: bool,
        /// The simple command it comes from, as written (for messages).
        what: Arc<str>,
    },
    /// A file is written.
    Write {
        target: ShellWord,
        how: Written,
        at: Place,
        what: Arc<str>,
    },
    /// A nested script runs in `language` (a shell's or an interpreter's name). When it is
    /// a shell script with known code, its own effects follow this one.
    Script {
        language: String,
        how: Nesting,
        /// The code, when known: literal text, the known output piped in (`echo … | sh`), or
        /// an expanded here-string or here-document (its unknown parts as `${X}`).
        code: Option<String>,
        what: Arc<str>,
    },
    /// A redirection opens a network connection (`/dev/tcp/HOST/PORT`).
    Network { target: String, what: Arc<str> },
    /// A descriptor is duplicated or closed (`2>&1`, `3>&-`).
    Duplicate {
        fd: Option<String>,
        target: ShellWord,
        what: Arc<str>,
    },
    /// Something the walk cannot see through, and why.
    Opaque { what: Arc<str>, why: String },
    /// One of the walk's bounds stopped it here, and which: what follows is not listed.
    /// Unlike [`Effect::Opaque`], never a question for a person: a policy refuses it.
    Bound {
        what: Arc<str>,
        why: String,
        limit: Limit,
    },
    /// A function starts copies of itself in a pipe or in the background without end (a
    /// fork bomb).
    ForkBomb { function: String, what: Arc<str> },
}

/// Which bound stopped a walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Nesting deeper than [`MAX_DEPTH`], or a script that cannot be parsed.
    Depth,
    /// More than [`MAX_WRAPPERS`] wrappers on the way to one command.
    Wrappers,
    /// Too much text, CPU time, brace words or effects.
    Size,
    /// `IFS` set to something known only when the script runs.
    Ifs,
}

/// The effects of `script`, in order, starting at `start`. Never fails: what cannot be read
/// is an [`Effect::Opaque`].
pub fn walk(script: &str, start: Start<'_>) -> Vec<Effect> {
    walk_within(script, start, MAX_CPU)
}

/// The first program `script` starts that runs what is typed into it later
/// ([`spec::runs_typed_input`]: an editor, a pager, a client with a shell escape, an
/// interpreter's prompt), as the walk finds it — behind wrappers, in nested scripts, aliases
/// and traps.
pub fn typed_input_runner(script: &str, start: Start<'_>) -> Option<String> {
    walk(script, start).into_iter().find_map(|e| match e {
        Effect::Program { argv, .. } => {
            let name = basename(argv.first()?.literal.as_deref()?);
            spec::runs_typed_input(name, &argv[1..]).then(|| name.to_owned())
        }
        _ => None,
    })
}

/// [`walk`], with `cpu` in place of [`MAX_CPU`] as its budget of CPU time.
pub fn walk_within(script: &str, start: Start<'_>, cpu: std::time::Duration) -> Vec<Effect> {
    let mut env = Env {
        cwd: start.cwd.map(str::to_owned),
        home: start.home.map(str::to_owned),
        ..Env::default()
    };
    for (name, value) in start.env {
        env.set(name.clone(), Some(value.clone()));
    }
    let mut w = Walk {
        out: Vec::new(),
        cwds: start
            .cwd
            .map(|c| vec![normalise("/", c)])
            .unwrap_or_default()
            .into(),
        home: start.home.map(Arc::from),
        cd_unknown: false,
        cd_to: None,
        text: 0,
        wrappers: 0,
        env,
        expander: Expander::new(MAX_TEXT, cpu),
        stopped: false,
        output: None,
        defs: state::Defs::default(),
        inherited: None,
        last_find: None,
        find_piped: None,
    };
    w.notice(&[script]);
    w.script(script, 0);
    w.out
}

/// The walk's state: the effects so far and where the script may be.
struct Walk {
    out: Vec<Effect>,
    cwds: Arc<[String]>,
    home: Option<Arc<str>>,
    /// Whether a relative `cd` goes somewhere unknown (the script sets `CDPATH` or `PWD`).
    cd_unknown: bool,
    /// Set by the `cd` just walked: the places before it, and those it leads to if it
    /// succeeds.
    cd_to: Option<CdTo>,
    /// Characters of script parsed so far.
    text: usize,
    /// Wrappers unwrapped on the way to the command being walked.
    wrappers: usize,
    /// The variables as far as they are known here (assignments, `export`, `unset`, `read`,
    /// `for` values).
    env: Env,
    /// Expands words, within the walk's budget of text and CPU time.
    expander: Expander,
    /// Whether a bound of expansion stopped the walk: nothing more is listed.
    stopped: bool,
    /// The output of the program last walked, when it is known text (`echo`, `printf`,
    /// `cat` passing on known input).
    output: Option<String>,
    /// What the script defined and made so far that later commands run through: aliases,
    /// functions, `hash -p` names, links, files written, variable attributes (`state`).
    defs: state::Defs,
    /// The standard input the first command of the next nested script reads (a function's
    /// body, an alias's text, a remote command).
    inherited: Stdin,
    /// The `find` walked last and whether the next command reads its output (`find … |
    /// xargs rm`): its arguments.
    last_find: Option<Vec<ShellWord>>,
    find_piped: Option<Vec<ShellWord>>,
}

/// A word of the walk as a field of an expanded word.
fn field(w: &ShellWord) -> Field {
    Field {
        value: w.literal.clone(),
        display: w.source.clone(),
        if_empty: w.if_empty.clone().unwrap_or_default(),
    }
}

/// A field of an expanded word as a word of the walk: literal when its value is known.
fn expanded(f: Field) -> ShellWord {
    ShellWord {
        if_empty: f.value.is_none().then_some(f.if_empty),
        literal: f.value,
        source: f.display,
    }
}

/// Where a `cd` leaves the script: the places before it, and those it leads to if it
/// succeeds.
type CdTo = (Arc<[String]>, Arc<[String]>);

/// What a command's standard input is, when it matters (a shell or interpreter reads it).
type Stdin = Option<(Nesting, Option<String>)>;

impl Walk {
    /// `args` read as a program's options and operands (it wraps no command); when a word
    /// could be any option, `what` is opaque and there is nothing to read.
    fn options(
        &mut self,
        args: &[ShellWord],
        with_arg: &str,
        long_with_arg: &[&str],
        what: &Arc<str>,
    ) -> Option<crate::bash::spec::Scanned> {
        match scan(args, with_arg, long_with_arg, usize::MAX, false) {
            Ok(s) => Some(s),
            Err(why) => {
                self.opaque(what.clone(), why);
                None
            }
        }
    }

    fn full(&self) -> bool {
        self.out.len() >= MAX_EFFECTS
    }

    fn push(&mut self, effect: Effect) {
        match self.out.len() {
            n if n + 1 < MAX_EFFECTS => self.out.push(effect),
            n if n + 1 == MAX_EFFECTS => self.out.push(Effect::Bound {
                what: Arc::from("the script"),
                why: format!("it does more than the {MAX_EFFECTS} things the analysis follows"),
                limit: Limit::Size,
            }),
            _ => {}
        }
    }

    fn opaque(&mut self, what: impl Into<Arc<str>>, why: impl Into<String>) {
        self.push(Effect::Opaque {
            what: what.into(),
            why: why.into(),
        });
    }

    fn bound(&mut self, limit: Limit, what: impl Into<Arc<str>>, why: impl Into<String>) {
        self.push(Effect::Bound {
            limit,
            what: what.into(),
            why: why.into(),
        });
    }

    fn place(&self) -> Place {
        Place {
            cwds: self.cwds.clone(),
            home: self.home.clone(),
            links: self.defs.links.clone(),
        }
    }

    /// Forgets what the variables mentioned in `words` could change.
    fn notice(&mut self, words: &[&str]) {
        if mentions(words, "HOME") {
            self.home = None;
        }
        if ["CDPATH", "PWD"].iter().any(|v| mentions(words, v)) {
            self.cd_unknown = true;
        }
    }

    fn script(&mut self, text: &str, depth: usize) {
        if depth > MAX_DEPTH {
            return self.bound(
                Limit::Depth,
                text,
                "it nests scripts too deeply to be judged",
            );
        }
        self.text = self.text.saturating_add(text.len());
        if self.text > MAX_TEXT {
            return self.bound(
                Limit::Size,
                text,
                format!("its scripts together are longer than the {MAX_TEXT} characters read"),
            );
        }
        let commands = match parse::simple_commands(text) {
            Ok(c) => c,
            Err(e) => {
                let limit = match e {
                    parse::ParseError::TooLong { .. } => Limit::Size,
                    parse::ParseError::TooDeep => Limit::Depth,
                };
                return self.bound(limit, "the script", format!("it cannot be judged: {e}"));
            }
        };
        let words: Vec<&str> = commands
            .iter()
            .flat_map(|c| c.assignments.iter().chain(&c.argv))
            .filter_map(|w| w.literal.as_deref())
            .collect();
        self.notice(&words);
        let Ok(toks) = Lexer::new(text, 0).lex() else {
            return self.bound(
                Limit::Depth,
                "the script",
                "it nests too deeply to be judged",
            );
        };
        if let Err(b) = self.expander.spend(text.len()) {
            return self.expansion_bound("the script", b);
        }
        self.tokens(&toks, depth);
    }

    /// A bound of expansion (text, CPU time, braces, an unknown `IFS`) was hit: the walk stops.
    fn expansion_bound(&mut self, what: impl Into<Arc<str>>, b: Bound) {
        if self.stopped {
            return;
        }
        let limit = match b {
            Bound::UnknownIfs { .. } => Limit::Ifs,
            Bound::Text | Bound::Cpu(_) | Bound::Braces { .. } => Limit::Size,
        };
        self.bound(limit, what, format!("it cannot be judged whole: {b}"));
        self.stopped = true;
    }

    /// The simple commands of a token list, in order, each with the variables as the
    /// commands before it left them.
    fn tokens(&mut self, toks: &[Tok], depth: usize) {
        if self.stopped || self.full() {
            return;
        }
        match fork_bomb(toks, &mut |n| self.expander.spend(n)) {
            Ok(None) => {}
            Ok(Some(function)) => {
                return self.push(Effect::ForkBomb {
                    what: Arc::from(format!("{function}(){{ … }}")),
                    function,
                });
            }
            Err(b) => return self.expansion_bound("the script", b),
        }
        let definitions = self.define_functions(toks);
        // The places before the `cd … &&` that starts the and-list being walked: the list
        // may stop at any of its commands, so they stay possible after it.
        let mut before_and: Option<Arc<[String]>> = None;
        let mut words: Vec<&Word> = Vec::new();
        let mut redirs: Vec<&Redir> = Vec::new();
        // Whether the next simple command reads the output of a pipe, and that output when
        // it is known text (`echo … | sh`).
        let mut piped = false;
        let mut input: Option<String> = None;
        let mut at = 0;
        while at <= toks.len() {
            if self.stopped || self.full() {
                return;
            }
            // A function definition: its body is walked as it would run, but not here — what
            // it assigns and where it `cd`s stay inside it (a call walks it again, `state`).
            if words.is_empty()
                && redirs.is_empty()
                && let Some(&(_, start, end)) = definitions.iter().find(|(from, ..)| *from == at)
            {
                let saved = (self.env.clone(), self.cwds.clone());
                self.tokens(&toks[start..end], depth);
                (self.env, self.cwds) = saved;
                (piped, input) = (false, None);
                at = end;
                continue;
            }
            let tok = toks.get(at);
            at += 1;
            match tok {
                Some(Tok::Word(w)) => words.push(w),
                Some(Tok::Redir(r)) => redirs.push(r),
                _ => {
                    if let Some(Tok::Arith(w)) = tok {
                        self.substitutions(&w.parts, depth);
                    }
                    if !words.is_empty() || !redirs.is_empty() {
                        self.last_find = None;
                        let output = self.simple(&words, &redirs, depth, piped, input.take());
                        piped = matches!(tok, Some(Tok::Op(Op::Pipe)));
                        input = output.filter(|_| piped);
                        self.find_piped = self.last_find.take().filter(|_| piped);
                        // `cd DIR && …`: what follows runs only where the `cd` went.
                        let cd = self.cd_to.take();
                        if matches!(tok, Some(Tok::Op(Op::And))) {
                            if let Some((before, after)) = cd {
                                before_and.get_or_insert(before);
                                self.cwds = after;
                            }
                        } else if let Some(before) = before_and.take() {
                            self.cwds = union(&self.cwds, &before);
                        }
                    } else if !matches!(tok, Some(Tok::Op(Op::LParen | Op::RParen))) {
                        // `( a ) | b`: the pipe after a subshell feeds the next command too.
                        piped = matches!(tok, Some(Tok::Op(Op::Pipe)));
                        input = None;
                    }
                    words.clear();
                    redirs.clear();
                }
            }
        }
    }

    /// The commands inside a word's substitutions and arithmetic: they run first, in a
    /// subshell (what they assign is not kept).
    fn substitutions(&mut self, parts: &[Part], depth: usize) {
        for p in parts {
            match p {
                Part::Subst { toks, .. } => {
                    let saved = self.env.clone();
                    self.tokens(toks, depth);
                    self.env = saved;
                }
                Part::Opaque { inner, .. } => self.substitutions(inner, depth),
                Part::Lit { .. } | Part::Param { .. } => {}
            }
        }
    }

    /// A word's arguments, or `None` when a bound stopped the walk.
    fn expand(&mut self, w: &Word) -> Option<Vec<ShellWord>> {
        match self.expander.expand(w, &self.env) {
            Ok(fields) => Some(fields.into_iter().map(expanded).collect()),
            Err(b) => {
                self.expansion_bound(render_source(w), b);
                None
            }
        }
    }

    /// One simple command: reserved words, assignments and declarations (which the
    /// variables follow), then its redirections and the program it runs, with its words
    /// expanded. A `for` variable with known values is walked once per value, then once
    /// unknown; `${X:-default}` with X unknown, once more with X empty.
    ///
    /// Returns its output when that is known text (`echo`, `printf`, `cat` passing on known
    /// input), for a shell it is piped into.
    fn simple(
        &mut self,
        words: &[&Word],
        redirs: &[&Redir],
        depth: usize,
        piped: bool,
        input: Option<String>,
    ) -> Option<String> {
        if let Err(b) = self.expander.spend(64 + words.len() + redirs.len()) {
            self.expansion_bound("the script", b);
            return None;
        }
        // A nested script's first command reads what the script was given; a command reads
        // the `find` piped into it.
        let inherited = self.inherited.take();
        let from_find = self.find_piped.take();
        let mut names = Vec::new();
        for w in words {
            param_names(&w.parts, &mut names);
        }
        for r in redirs {
            param_names(&r.target.parts, &mut names);
        }
        if let Some((name, values)) = names
            .iter()
            .find_map(|n| self.env.loops.get(n).map(|v| (n.clone(), v.clone())))
        {
            for value in values {
                let saved = self.env.clone();
                self.env.set(name.clone(), Some(value));
                self.inherited = inherited.clone();
                self.find_piped = from_find.clone();
                self.simple(words, redirs, depth, piped, input.clone());
                self.env = saved;
            }
        }
        let mut defaulted = Vec::new();
        for w in words {
            fallback_names(&w.parts, &mut defaulted);
        }
        for r in redirs {
            fallback_names(&r.target.parts, &mut defaulted);
        }
        if let Some(name) = defaulted.into_iter().find(|n| {
            !self.env.vars.contains_key(n) && self.expander.lookup(n, &self.env).is_none()
        }) {
            let saved = self.env.clone();
            self.env.set(name, Some(String::new()));
            self.inherited = inherited.clone();
            self.find_piped = from_find.clone();
            self.simple(words, redirs, depth, piped, input.clone());
            self.env = saved;
        }
        if self.stopped || self.full() {
            return None;
        }
        for w in words {
            self.substitutions(&w.parts, depth);
        }
        for r in redirs {
            self.substitutions(&r.target.parts, depth);
            if let Some(body) = &r.body {
                self.substitutions(&body.parts, depth);
            }
        }
        if self.stopped || self.full() {
            return None;
        }
        // Reserved words and assignments at the start, read as the guard reads them.
        let mut i = 0;
        let mut first = None;
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
                // The reserved word, and its options (`time -p CMD`).
                Some("time") => {
                    i += 1;
                    while let Some("-p" | "--") = words.get(i).and_then(|w| w.bare()) {
                        i += 1;
                    }
                    continue;
                }
                Some("coproc") => {
                    // `coproc NAME { …; }` names the coprocess; `coproc CMD …` runs CMD.
                    let named = words.get(i + 1).and_then(|w| w.literal()).is_some_and(|n| {
                        is_identifier(&n) && words.get(i + 2).and_then(|w| w.bare()) == Some("{")
                    });
                    i += if named { 2 } else { 1 };
                    continue;
                }
                Some("for" | "select") => {
                    self.for_header(&words[i + 1..]);
                    return None;
                }
                Some("case") => return None,
                Some("function") => {
                    i += 2;
                    continue;
                }
                _ => {}
            }
            if w.assignment().is_some() {
                first.get_or_insert(i);
                assignments.push(*w);
                i += 1;
                continue;
            }
            break;
        }
        let rest = &words[i.min(words.len())..];
        if rest.is_empty() && assignments.is_empty() && redirs.is_empty() {
            return None;
        }
        let shown_from = first.unwrap_or(i).min(words.len());
        let what: Arc<str> = {
            let mut shown: Vec<String> = words[shown_from..]
                .iter()
                .map(|w| render_source(w))
                .collect();
            for r in redirs {
                let r = parse::redirection(r);
                shown.push(r.render());
            }
            shown.join(" ").into()
        };
        let mut stdin: Stdin = piped.then_some((Nesting::Pipe, input)).or(inherited);
        let mut here = None;
        // Files this command writes by redirection, named literally: what it prints goes there.
        let mut written: Vec<(String, bool)> = Vec::new();
        for r in redirs {
            let mut shown = parse::redirection(r);
            // A redirection's target is one word: expanded when it makes exactly one.
            if matches!(
                r.kind,
                RedirKind::Output | RedirKind::Append | RedirKind::Dup
            ) {
                let fields = self.expand(&r.target)?;
                if let [one] = fields.as_slice() {
                    shown.target = one.clone();
                } else {
                    shown.target.literal = None;
                }
            }
            if r.kind == RedirKind::HereString {
                match self.expander.expand_joined(&r.target.parts, &self.env) {
                    Ok(f) => {
                        // What a shell reads: the known parts, the others as `${X}`.
                        here = Some(f.text().to_owned());
                        shown.target = expanded(f);
                    }
                    Err(b) => {
                        self.expansion_bound(what, b);
                        return None;
                    }
                }
            }
            self.redirect(&shown, &what, &mut stdin);
            if let (RedirKind::Output | RedirKind::Append, Some(target)) =
                (r.kind, &shown.target.literal)
                && shown.fd.as_deref().is_none_or(|fd| fd == "1")
            {
                written.push((target.clone(), r.kind == RedirKind::Append));
            }
            if let Some(text) = here.take() {
                stdin = Some((Nesting::HereString, Some(text)));
            }
            // A here-document's text, its known parts expanded.
            if let (RedirKind::HereDoc, Some(body)) = (r.kind, &r.body) {
                match self.expander.expand_joined(&body.parts, &self.env) {
                    Ok(f) => stdin = Some((Nesting::HereDocument, Some(f.text().to_owned()))),
                    Err(b) => {
                        self.expansion_bound(what, b);
                        return None;
                    }
                }
            }
        }
        if rest.is_empty() {
            for w in &assignments {
                if let Some((name, parts, append)) = w.assignment() {
                    if !self.assign(name.clone(), &parts, append, &what) {
                        return None;
                    }
                    self.code_variable(&name, &what, depth);
                }
            }
            return None;
        }
        // Prefix assignments hold only for the command, but a variable that holds a command
        // (`GIT_SSH_COMMAND=… git fetch`) is code it may run.
        if !assignments.is_empty() {
            let saved = self.env.clone();
            for w in &assignments {
                if let Some((name, parts, append)) = w.assignment() {
                    if !self.assign(name.clone(), &parts, append, &what) {
                        return None;
                    }
                    self.code_variable(&name, &what, depth);
                }
            }
            self.env = saved;
        }
        if !self.declarations(rest, &what, depth) {
            return None;
        }
        let mut argv = Vec::new();
        for w in rest {
            let fields = self.expand(w)?;
            argv.extend(fields);
        }
        if argv.is_empty() {
            return None;
        }
        self.output = None;
        self.find_piped = from_find;
        self.command(&argv, &what, depth, stdin);
        self.find_piped = None;
        if !written.is_empty() {
            let text = self.output.take();
            self.wrote(&written, text, &what, depth);
            return None;
        }
        self.output.take()
    }

    /// `for NAME in WORDS`: NAME is unknown afterwards, and each of its values when they
    /// are all known (and few).
    fn for_header(&mut self, words: &[&Word]) {
        let Some(var) = words.first().and_then(|w| w.literal()) else {
            return;
        };
        let mut values = Vec::new();
        if words.get(1).and_then(|w| w.bare()) == Some("in") {
            for w in &words[2..] {
                match self.expander.expand(w, &self.env) {
                    Ok(f) => values.extend(f),
                    Err(b) => return self.expansion_bound(render_source(w), b),
                }
            }
        }
        let known: Option<Vec<String>> = values.into_iter().map(|f| f.value).collect();
        self.env.set(var.clone(), None);
        if let Some(known) = known.filter(|k| (1..=MAX_LOOP_VALUES).contains(&k.len())) {
            self.env.loops.insert(var, known);
        }
    }

    /// `NAME=value`, or `NAME+=value`, which appends to what NAME held. False when a bound
    /// stopped the walk.
    fn assign(&mut self, name: String, parts: &[Part], append: bool, what: &Arc<str>) -> bool {
        let f = match self.expander.expand_joined(parts, &self.env) {
            Ok(f) => f,
            Err(b) => {
                self.expansion_bound(what.clone(), b);
                return false;
            }
        };
        if self.assigned_attributed(&name) {
            return true;
        }
        let value = if append {
            // Not set on this line: it may come from the environment.
            let before = self.env.vars.get(&name).cloned().flatten();
            before.zip(f.value).map(|(a, b)| a + &b)
        } else {
            f.value
        };
        self.env.set(name, value);
        true
    }

    /// `export X=…`, `unset X`, `read X`: the variables follow. False when a bound stopped
    /// the walk.
    fn declarations(&mut self, rest: &[&Word], what: &Arc<str>, depth: usize) -> bool {
        let Some(first) = rest[0].bare() else {
            return true;
        };
        match first {
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                return self.declare(rest, what, depth);
            }
            "unset" => {
                for w in &rest[1..] {
                    if let Some(name) = w.literal() {
                        self.env.unset(&name);
                    }
                }
            }
            "read" | "mapfile" | "readarray" | "getopts" | "printf" => {
                for w in &rest[1..] {
                    if let Some(name) = w.literal().filter(|n| is_identifier(n)) {
                        self.env.set(name, None);
                    }
                }
            }
            _ => {}
        }
        true
    }

    /// One redirection's effects; a here-string or an input file becomes the input.
    fn redirect(&mut self, r: &Redirection, what: &Arc<str>, stdin: &mut Stdin) {
        if r.kind != RedirectKind::HereString
            && r.kind != RedirectKind::HereDocument
            && (r.target.literal.as_deref().is_some_and(network_path)
                || network_path(&r.target.source))
        {
            self.push(Effect::Network {
                target: r.target.source.clone(),
                what: what.clone(),
            });
        }
        let how = match r.kind {
            RedirectKind::Output => Some(Written::Truncated),
            RedirectKind::Append => Some(Written::Appended),
            _ => None,
        };
        if let Some(how) = how {
            self.push(Effect::Write {
                target: r.target.clone(),
                how,
                at: self.place(),
                what: what.clone(),
            });
        }
        match r.kind {
            RedirectKind::Output | RedirectKind::Append => {}
            RedirectKind::Duplicate => self.push(Effect::Duplicate {
                fd: r.fd.clone(),
                target: r.target.clone(),
                what: what.clone(),
            }),
            RedirectKind::HereString => {
                *stdin = Some((Nesting::HereString, r.target.literal.clone()));
            }
            RedirectKind::HereDocument => *stdin = Some((Nesting::HereDocument, None)),
            RedirectKind::Input => *stdin = Some((Nesting::File, None)),
        }
    }

    fn command(&mut self, words: &[ShellWord], what: &Arc<str>, depth: usize, stdin: Stdin) {
        if depth > MAX_DEPTH {
            return self.bound(
                Limit::Depth,
                what.clone(),
                "it nests commands too deeply to be judged",
            );
        }
        let Some(first) = words.first() else {
            return;
        };
        let piped = matches!(stdin, Some((Nesting::Pipe, _)));
        // A name `hash -p` bound runs the program it names.
        if let Some(hashed) = self.hashed(words) {
            return self.command(&hashed, what, depth, stdin);
        }
        let Some(name) = first.literal.as_deref() else {
            return self.unknown_name(words, what, depth, stdin);
        };
        self.push(Effect::Program {
            argv: words.to_vec(),
            at: self.place(),
            piped,
            what: what.clone(),
        });
        let base = basename(name);
        if spec::is_glob_name(base) {
            return self.globbed(words, what, depth, stdin);
        }
        // An alias or a function the script defined runs its own commands.
        self.defined(words, what, depth, &stdin);
        self.output = match base {
            "echo" | "printf" => echo_output(&words.iter().map(field).collect::<Vec<_>>()),
            // `cat` with options only passes its input on.
            "cat"
                if words[1..]
                    .iter()
                    .all(|w| w.literal.as_deref().is_some_and(|l| l.starts_with('-'))) =>
            {
                stdin.as_ref().and_then(|(_, code)| code.clone())
            }
            _ => None,
        };
        let args = &words[1..];
        match base {
            "cd" => self.cd(args),
            "pushd" | "popd" => self.cwds = Arc::from([]),
            "find" => {
                self.last_find = Some(words.to_vec());
                self.find(args, what, depth);
                // What `-exec` prints is not what the walk follows into a pipe.
                self.output = None;
            }
            "xargs" => {
                let input = stdin.and_then(|(_, text)| text);
                self.xargs(args, what, depth, input);
            }
            "eval" => self.joined(args, what, depth),
            "watch" => self.watch(args, what, depth),
            "alias" => {
                self.record_aliases(args);
                self.alias(args, what, depth);
            }
            "hash" => self.hash(args),
            "set" => self.set_positional(args),
            "let" => self.arithmetic_names(args),
            "ln" | "cp" | "link" | "mount" => self.link(base, args, what),
            "source" | "." => self.source(args, what, depth, stdin),
            "trap" => match scan(args, "", &[], usize::MAX, false) {
                Ok(s) => self.nested("sh", Nesting::Deferred, s.operands.first(), what, depth),
                Err(why) => self.opaque(what.clone(), why),
            },
            "runuser" => {
                let as_user = args
                    .iter()
                    .filter_map(|w| w.literal.as_deref())
                    .any(|v| v == "-u" || v.starts_with("--user"));
                if as_user {
                    self.wrapper(&spec::RUNUSER_AS, args, what, depth, stdin);
                } else {
                    self.su(args, what, depth, stdin);
                }
            }
            "su" => self.su(args, what, depth, stdin),
            _ if SHELLS.contains(&base) => self.shell(base, args, what, depth, stdin),
            _ if self.code_taker(base, args, what, depth, &stdin) => {}
            _ if self.elsewhere_runner(base, args, what, depth, &stdin) => {}
            _ => {
                if let Some(w) = spec::wrapper(base) {
                    self.wrapper(w, args, what, depth, stdin);
                } else if let Some(r) = spec::runner(base) {
                    self.runner(r, args, what, depth);
                } else if let Some(i) = spec::interpreter(base) {
                    self.interpreter(i, args, what, stdin);
                }
            }
        }
    }

    /// A command whose name is known only when it runs (`$X -rf /`, `"$@"`): opaque, and a
    /// program of unknown name with its arguments, for a policy that judges them as any
    /// program's. The unknown word may also be a wrapper or empty (`$SUDO rm …`), so the rest
    /// is walked as a command of its own, and `$SHELL -c CODE` as a shell's.
    fn unknown_name(&mut self, words: &[ShellWord], what: &Arc<str>, depth: usize, stdin: Stdin) {
        self.opaque(
            what.clone(),
            "its command name is known only when it runs, so it cannot be judged",
        );
        self.push(Effect::Program {
            argv: words.to_vec(),
            at: self.place(),
            piped: matches!(stdin, Some((Nesting::Pipe, _))),
            what: what.clone(),
        });
        let rest = &words[1..];
        let Some(next) = rest.first() else {
            return;
        };
        let c_flag = next
            .literal
            .as_deref()
            .is_some_and(|v| v.starts_with('-') && !v.starts_with("--") && v.contains('c'));
        if c_flag {
            return self.shell("sh", rest, what, depth, stdin);
        }
        self.unwrapped(rest, what, depth, stdin);
    }

    /// `/bin/r? -rf /`: the shell runs whatever file the pattern matches, so the command is
    /// walked as each known program ([`spec::known_names`]) the name can match, its name
    /// word keeping the pattern as its source.
    fn globbed(&mut self, words: &[ShellWord], what: &Arc<str>, depth: usize, stdin: Stdin) {
        let pattern = basename(words[0].literal.as_deref().unwrap_or_default());
        for candidate in spec::known_names() {
            if self.stopped || self.full() {
                return;
            }
            if candidate == pattern || !spec::glob_match(pattern, candidate) {
                continue;
            }
            let mut probe = words.to_vec();
            probe[0] = ShellWord {
                literal: Some(candidate.to_owned()),
                source: words[0].source.clone(),
                if_empty: None,
            };
            self.command(&probe, what, depth + 1, stdin.clone());
        }
    }

    /// The command a wrapper (or `xargs`, `find -exec`) runs. Wrappers unwrapped on the way
    /// to a command are counted, nested scripts included; past [`MAX_WRAPPERS`], a bound.
    fn unwrapped(&mut self, words: &[ShellWord], what: &Arc<str>, depth: usize, stdin: Stdin) {
        if self.wrappers >= MAX_WRAPPERS {
            return self.bound(
                Limit::Wrappers,
                what.clone(),
                format!(
                    "it stacks more than {MAX_WRAPPERS} wrapper commands, more than are unwrapped"
                ),
            );
        }
        self.wrappers += 1;
        self.command(words, what, depth, stdin);
        self.wrappers -= 1;
    }

    /// A script in `language` given as a word (`sh -c WORD`, `su -c WORD`, a trap).
    fn nested(
        &mut self,
        language: &str,
        how: Nesting,
        script: Option<&ShellWord>,
        what: &Arc<str>,
        depth: usize,
    ) {
        match script.map(|w| w.literal.as_deref()) {
            None => {}
            Some(Some(code)) => self.code(language, how, code, what, depth),
            Some(None) => self.opaque(
                what.clone(),
                "it runs a script known only when it runs, so it cannot be judged",
            ),
        }
    }

    /// Known shell code: the script effect, then the script's own effects. Only `eval`
    /// runs it in this shell: what any other nested script assigns is not kept (`watch`,
    /// joined like `eval`, restores the variables itself).
    fn code(&mut self, language: &str, how: Nesting, code: &str, what: &Arc<str>, depth: usize) {
        self.push(Effect::Script {
            language: language.to_owned(),
            how,
            code: Some(code.to_owned()),
            what: what.clone(),
        });
        // A here-string ends with a newline, which ends an unterminated quote's word.
        let read;
        let text = if how == Nesting::HereString {
            read = format!("{code}\n");
            &read
        } else {
            code
        };
        if how == Nesting::Eval {
            return self.script(text, depth + 1);
        }
        let saved = self.env.clone();
        self.script(text, depth + 1);
        self.env = saved;
    }

    /// A shell or interpreter with no script operand reads its standard input.
    fn reads_input(
        &mut self,
        language: &str,
        shell: bool,
        stdin: Stdin,
        what: &Arc<str>,
        depth: usize,
    ) {
        match stdin {
            Some((how, Some(code))) if shell => self.code(language, how, &code, what, depth),
            Some((how, code)) => self.push(Effect::Script {
                language: language.to_owned(),
                how,
                code,
                what: what.clone(),
            }),
            None => {}
        }
    }

    /// `su [opts] [user] [args]`: each command it is given, or a login shell reading its
    /// input.
    fn su(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: Stdin) {
        // Any word may hold `-c` (the shell's arguments follow the user).
        if let Some(w) = args.iter().find(|w| maybe_option(w)) {
            return self.opaque(what.clone(), unknown_option(w));
        }
        let values: Vec<Option<&str>> = args.iter().map(|w| w.literal.as_deref()).collect();
        let commands = spec::su_commands(&values);
        if commands.is_empty() {
            return self.reads_input("sh", true, stdin, what, depth);
        }
        for c in commands {
            match c {
                spec::SuCommand::Attached(code) => {
                    self.code("sh", Nesting::Option, &code, what, depth);
                }
                spec::SuCommand::Word(k) => {
                    self.nested("sh", Nesting::Option, args.get(k), what, depth);
                }
            }
        }
    }

    /// `cd DIR`: where the script may be afterwards. A `cd` that fails leaves it where it was,
    /// and one in a subshell is undone, so the old places stay possible.
    fn cd(&mut self, args: &[ShellWord]) {
        let operands: Vec<&ShellWord> = args
            .iter()
            .skip_while(|w| {
                w.literal
                    .as_deref()
                    .is_some_and(|l| l.starts_with('-') && l.len() > 1 && l != "--")
            })
            .filter(|w| w.literal.as_deref() != Some("--"))
            .collect();
        let target = match operands.first() {
            None => self.home.as_deref().map(str::to_owned),
            Some(w) => w.literal.clone(),
        };
        let new = match target.as_deref() {
            None | Some("-") => None,
            Some(t) if is_pattern(t) => None,
            Some(t) if self.cd_unknown && !t.starts_with('/') => None,
            Some(t) => resolve(t, &self.cwds, self.home.as_deref()),
        };
        let before = self.cwds.clone();
        let after = new.map_or_else(|| Arc::from([]), bounded);
        // A `cd` that fails leaves the script where it was.
        self.cwds = match after.is_empty() {
            true => Arc::from([]),
            false => bounded(joined(&before, &after)),
        };
        self.cd_to = Some((before, after));
    }

    /// `find … -exec CMD {} ;`: CMD runs, with `{}` unknown — except when nothing filters
    /// the walk, where `{}` is first the start path itself, and is that.
    fn find(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        let start = spec::find_unfiltered(args)
            .and_then(|start| start.literal.clone())
            .filter(|s| !s.contains("{}"));
        let mut i = 0;
        while let Some(w) = args.get(i) {
            i += 1;
            match w.literal.as_deref() {
                Some("-exec" | "-execdir" | "-ok" | "-okdir") => {
                    let end = args[i..]
                        .iter()
                        .position(|w| matches!(w.literal.as_deref(), Some(";" | "+")))
                        .map_or(args.len(), |k| i + k);
                    let inner: Vec<ShellWord> = args[i..end]
                        .iter()
                        .map(|w| match (&w.literal, &start) {
                            (Some(l), Some(start)) if l.contains("{}") => ShellWord {
                                literal: Some(l.replace("{}", start)),
                                source: w.source.replace("{}", start),
                                if_empty: None,
                            },
                            (Some(l), None) if l.contains("{}") => ShellWord {
                                literal: None,
                                source: w.source.clone(),
                                if_empty: None,
                            },
                            _ => w.clone(),
                        })
                        .collect();
                    self.unwrapped(&inner, what, depth, None);
                    i = end + 1;
                }
                Some("-fprint" | "-fprint0" | "-fprintf" | "-fls") => i += 1,
                _ => {}
            }
        }
    }

    /// `xargs CMD ARGS`: `CMD ARGS` plus words from the input — known when it is known text
    /// (`echo a b | xargs rm`), else unknown; with `-I R`, the input replaces R.
    fn xargs(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, input: Option<String>) {
        let mut i = 0;
        let mut replace: Option<String> = None;
        while let Some(w) = args.get(i) {
            let Some(arg) = w.literal.as_deref() else {
                if maybe_option(w) {
                    // Opaque; and as if it were empty, the words after it are the command.
                    self.opaque(what.clone(), unknown_option(w));
                    i += 1;
                    continue;
                }
                break;
            };
            if arg == "--" {
                i += 1;
                break;
            }
            if !arg.starts_with('-') || arg == "-" {
                break;
            }
            i += 1;
            if let Some(long) = arg.strip_prefix("--") {
                let (name, value) = long.split_once('=').unwrap_or((long, ""));
                if option_is(&format!("--{name}"), "", &["replace"]) {
                    replace = Some(if value.is_empty() { "{}" } else { value }.to_owned());
                } else if !long.contains('=')
                    && option_is(
                        arg,
                        "",
                        &[
                            "arg-file",
                            "delimiter",
                            "max-args",
                            "max-procs",
                            "max-chars",
                            "process-slot-var",
                        ],
                    )
                {
                    i += 1;
                }
                continue;
            }
            for (k, c) in arg.char_indices().skip(1) {
                let rest = &arg[k + c.len_utf8()..];
                if "adEILnPs".contains(c) {
                    let value = if rest.is_empty() {
                        i += 1;
                        args.get(i - 1).and_then(|w| w.literal.clone())
                    } else {
                        Some(rest.to_owned())
                    };
                    if c == 'I' {
                        replace = Some(value.unwrap_or_default());
                    }
                    break;
                }
                if "eil".contains(c) {
                    if c == 'i' {
                        replace = Some(if rest.is_empty() { "{}" } else { rest }.to_owned());
                    }
                    break;
                }
            }
        }
        let mut inner: Vec<ShellWord> = args[i.min(args.len())..].to_vec();
        if inner.is_empty() {
            inner.push(spec::word("echo"));
        }
        // `find … | xargs CMD` runs CMD on what find lists, as `find … -exec CMD {} +` does.
        if let Some(mut find) = self.find_piped.take() {
            find.push(spec::word("-exec"));
            find.extend(inner.iter().cloned());
            find.extend([spec::word("{}"), spec::word("+")]);
            self.push(Effect::Program {
                argv: find,
                at: self.place(),
                piped: false,
                what: what.clone(),
            });
        }
        match (input, replace.filter(|r| !r.is_empty())) {
            (Some(text), Some(r)) => {
                let line = text.lines().next().unwrap_or("").trim().to_owned();
                for w in inner.iter_mut() {
                    if let Some(l) = &mut w.literal {
                        *l = l.replace(&r, &line);
                    }
                    w.source = w.source.replace(&r, &line);
                }
            }
            (Some(text), None) => inner.extend(text.split_whitespace().map(spec::word)),
            // The words it replaces are unknown; judged with the input empty, they keep the
            // rest (`-I{} rm -rf /{}`).
            (None, Some(r)) => {
                for w in inner.iter_mut() {
                    if let Some(l) = w.literal.take_if(|l| l.contains(r.as_str())) {
                        w.if_empty = Some(l.replace(r.as_str(), ""));
                    }
                }
            }
            (None, None) => inner.push(ShellWord {
                literal: None,
                source: "(words read from the input)".to_owned(),
                if_empty: None,
            }),
        }
        self.unwrapped(&inner, what, depth, None);
    }

    /// `eval ARGS`: the arguments joined, run as a script.
    fn joined(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        if args.is_empty() {
            return;
        }
        let text: Option<Vec<&str>> = args.iter().map(|w| w.literal.as_deref()).collect();
        let script = match text {
            Some(parts) => spec::word(&parts.join(" ")),
            None => ShellWord {
                literal: None,
                source: args
                    .iter()
                    .map(|w| w.source.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
                if_empty: None,
            },
        };
        self.nested("sh", Nesting::Eval, Some(&script), what, depth);
    }

    /// `watch [-n SECS] COMMAND…`: the command words joined and run by `sh -c`, or with `-x`
    /// run directly.
    fn watch(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        // Its options end at the first word that is not one (`watch find . -exec …`).
        let scanned = match scan(args, "n", &["interval"], 0, false) {
            Ok(s) => s,
            Err(why) => return self.opaque(what.clone(), why),
        };
        let words = scanned.command.map_or(&[][..], |start| &args[start..]);
        if scanned.has("x", &["exec"]) {
            return self.unwrapped(words, what, depth, None);
        }
        // Run by `sh -c`, unlike `eval`: what it assigns is not kept.
        let saved = self.env.clone();
        self.joined(words, what, depth);
        self.env = saved;
    }

    /// `alias NAME=VALUE`: the value runs wherever the name is used.
    fn alias(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        for w in args {
            match w.literal.as_deref() {
                Some(l) => {
                    if let Some((_, value)) = l.split_once('=') {
                        self.code("sh", Nesting::Deferred, value, what, depth);
                    }
                }
                None => self.nested("sh", Nesting::Deferred, Some(w), what, depth),
            }
        }
    }

    /// `sh -c SCRIPT`, `sh FILE`, or a shell reading its input.
    fn shell(
        &mut self,
        name: &str,
        args: &[ShellWord],
        what: &Arc<str>,
        depth: usize,
        stdin: Stdin,
    ) {
        let mut i = 0;
        let mut c_flag = false;
        while let Some(w) = args.get(i) {
            i += 1;
            let Some(arg) = w.literal.as_deref() else {
                if maybe_option(w) && !c_flag {
                    return self.opaque(what.clone(), unknown_option(w));
                }
                i -= 1;
                break;
            };
            if arg == "--" || arg == "-" {
                break;
            }
            if arg.starts_with("--") {
                if matches!(arg, "--rcfile" | "--init-file") {
                    i += 1;
                }
                continue;
            }
            if !(arg.starts_with('-') || arg.starts_with('+')) {
                i -= 1;
                break;
            }
            c_flag |= arg.starts_with('-') && arg.contains('c');
            if arg.contains(['o', 'O']) {
                i += 1;
            }
        }
        if c_flag {
            // Arguments after the script are its `$0`, `$1`, …
            let saved = self.env.clone();
            for (n, arg) in args.iter().skip(i + 1).take(10).enumerate() {
                self.env.set(n.to_string(), arg.literal.clone());
            }
            self.nested(name, Nesting::Inline, args.get(i), what, depth);
            self.env = saved;
            return;
        }
        match args.get(i) {
            // A script file the script wrote: its text.
            Some(file) if self.run_written(file, Nesting::File, what, depth) => {}
            Some(file) if stdin_path(file) => self.reads_input(name, true, stdin, what, depth),
            Some(_) => self.push(Effect::Script {
                language: name.to_owned(),
                how: Nesting::File,
                code: None,
                what: what.clone(),
            }),
            None => self.reads_input(name, true, stdin, what, depth),
        }
    }

    /// `source FILE`, `. FILE`: in this shell, a file the script wrote (its text), or its
    /// standard input (`. /dev/stdin`).
    fn source(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: Stdin) {
        let Some(file) = args.iter().find(|w| w.literal.as_deref() != Some("--")) else {
            return;
        };
        if self.run_written(file, Nesting::Eval, what, depth) {
            return;
        }
        if stdin_path(file) {
            match stdin {
                Some((how, Some(code))) => {
                    self.push(Effect::Script {
                        language: "sh".into(),
                        how,
                        code: Some(code.clone()),
                        what: what.clone(),
                    });
                    self.script(&code, depth + 1);
                }
                other => self.reads_input("sh", true, other, what, depth),
            }
        }
    }

    /// A wrapper: its own writes and scripts, then the command it runs, where it runs it.
    fn wrapper(
        &mut self,
        w: &Wrapper,
        args: &[ShellWord],
        what: &Arc<str>,
        depth: usize,
        stdin: Stdin,
    ) {
        let s = match scan(args, w.with_arg, w.long_with_arg, w.operands, w.assignments) {
            Ok(s) => s,
            Err(why) => {
                // Opaque; and walked again with the words that could be any option gone (an
                // unset variable, unquoted: `sudo $FLAGS rm -rf /` runs `rm -rf /`), then as
                // empty arguments (quoted: `timeout "$T" rm -rf /` runs it too).
                self.opaque(what.clone(), why);
                let unknown = |a: &ShellWord| a.literal.is_none() && maybe_option(a);
                let gone: Vec<ShellWord> = args.iter().filter(|a| !unknown(a)).cloned().collect();
                let empty: Vec<ShellWord> = args
                    .iter()
                    .map(|a| match unknown(a) {
                        true => ShellWord {
                            literal: Some(String::new()),
                            ..a.clone()
                        },
                        false => a.clone(),
                    })
                    .collect();
                self.wrapper(w, &gone, what, depth, stdin.clone());
                self.wrapper(w, &empty, what, depth, stdin);
                return;
            }
        };
        // `env GIT_SSH_COMMAND=… git fetch`: a variable that holds a command is code.
        if w.assignments {
            let end = s.command.unwrap_or(args.len());
            for a in &args[..end] {
                let Some((name, value)) = a.literal.as_deref().and_then(|l| l.split_once('='))
                else {
                    continue;
                };
                if spec::CODE_VARIABLES.contains(&name) {
                    self.code("sh", Nesting::Deferred, value, what, depth);
                }
            }
        }
        for file in s.values(w.dest).flatten() {
            self.push(Effect::Write {
                target: file.clone(),
                how: Written::ByOption,
                at: self.place(),
                what: what.clone(),
            });
        }
        // `env -S 'A B' C` runs `A B C`, read as one script.
        let split = (w.splits && s.has(w.script.0, w.script.1))
            .then_some(s.command)
            .flatten();
        if let Some(start) = split {
            let strings: Option<Vec<String>> = s
                .values(w.script)
                .map(|v| v.and_then(|v| v.literal.clone()))
                .collect();
            let command = args[start..].iter().map(|a| a.literal.as_deref());
            let script = match strings {
                Some(strings) => spec::word(&spec::split_command(&strings, command)),
                None => ShellWord {
                    literal: None,
                    source: what.to_string(),
                    if_empty: None,
                },
            };
            return self.nested("sh", Nesting::Option, Some(&script), what, depth);
        }
        for script in s.values(w.script) {
            self.nested("sh", Nesting::Option, script, what, depth);
        }
        if s.has(w.no_command, &[]) {
            return;
        }
        // `env -C DIR`, `sudo -D DIR`: the command runs there; `chroot`: somewhere unknown.
        let saved = self.cwds.clone();
        let chroot = w.elsewhere || s.has(w.chroot.0, w.chroot.1);
        if chroot {
            self.cwds = Arc::from([]);
        }
        for dir in s.values(w.chdir).filter(|_| !chroot) {
            let dir = dir.and_then(|d| d.literal.as_deref());
            self.cwds = bounded(
                dir.and_then(|d| resolve(d, &self.cwds, self.home.as_deref()))
                    .unwrap_or_default(),
            );
        }
        match s.command {
            Some(start) => self.unwrapped(&args[start..], what, depth, stdin),
            // No command: it starts a shell, which reads its input.
            None if w.bare_shell => self.reads_input("sh", true, stdin, what, depth),
            None => {}
        }
        self.cwds = saved;
    }

    /// A program whose options run shell commands (`tar --to-command`, `rsync -e`).
    fn runner(&mut self, r: &spec::Runner, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        let words = if r.old_style {
            spec::old_style(args, r.with_arg)
        } else {
            args.to_vec()
        };
        let Some(s) = self.options(&words, r.with_arg, r.long_with_arg, what) else {
            return;
        };
        for script in s.values(r.script) {
            self.nested("sh", Nesting::Option, script, what, depth);
        }
        for action in s.values(("", r.exec_action)) {
            let command = action.and_then(|a| a.literal.as_deref()?.strip_prefix("exec="));
            if let Some(command) = command {
                self.code("sh", Nesting::Option, command, what, depth);
            }
        }
    }

    /// An interpreter: its inline code (`python -c`, `node --eval`), a script file, or its
    /// input. The code is not read further: it is another language.
    fn interpreter(
        &mut self,
        i: &spec::Interpreter,
        args: &[ShellWord],
        what: &Arc<str>,
        stdin: Stdin,
    ) {
        let script = |how, code: Option<&ShellWord>| Effect::Script {
            language: i.name.to_owned(),
            how,
            code: code.and_then(|c| c.literal.clone()),
            what: what.clone(),
        };
        let mut k = 0;
        while let Some(w) = args.get(k) {
            k += 1;
            let Some(arg) = w.literal.as_deref() else {
                k -= 1;
                break;
            };
            if arg == "-" {
                return self.reads_input(i.name, false, stdin, what, 0);
            }
            if arg == "--" {
                break;
            }
            if !arg.starts_with('-') {
                k -= 1;
                break;
            }
            if let Some(long) = arg.strip_prefix("--") {
                let (name, value) = match long.split_once('=') {
                    Some((n, v)) => (n, Some(spec::word(v))),
                    None => (long, None),
                };
                if spec::long_option_is(name, i.long_inline) {
                    let code = value.or_else(|| args.get(k).cloned());
                    return self.push(script(Nesting::Inline, code.as_ref()));
                }
                continue;
            }
            for (at, c) in arg.char_indices().skip(1) {
                if i.inline.contains(c) {
                    let rest = &arg[at + c.len_utf8()..];
                    let code = if rest.is_empty() {
                        args.get(k).cloned()
                    } else {
                        Some(spec::word(rest))
                    };
                    return self.push(script(Nesting::Inline, code.as_ref()));
                }
            }
        }
        match args.get(k) {
            Some(_) => self.push(script(Nesting::File, None)),
            None => self.reads_input(i.name, false, stdin, what, 0),
        }
    }
}

/// Whether a word names this process's standard input (`/dev/stdin`, `/dev/fd/0`,
/// `/proc/self/fd/0`).
fn stdin_path(w: &ShellWord) -> bool {
    w.literal.as_deref().is_some_and(|p| {
        matches!(
            normalise("/", p).as_str(),
            "/dev/stdin" | "/dev/fd/0" | "/proc/self/fd/0" | "/proc/thread-self/fd/0"
        )
    })
}

/// Fork bomb: a function that calls itself in a pipeline or in the background.
fn fork_bomb(
    toks: &[Tok],
    spend: &mut impl FnMut(usize) -> Result<(), Bound>,
) -> Result<Option<String>, Bound> {
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

/// The places of `a`, then those of `b` not in `a`.
fn joined(a: &[String], b: &[String]) -> Vec<String> {
    let mut cwds = a.to_vec();
    for p in b {
        if !cwds.contains(p) {
            cwds.push(p.clone());
        }
    }
    cwds
}

/// Both sets of places; none known when either is unknown (empty), or the union is too big.
fn union(a: &Arc<[String]>, b: &Arc<[String]>) -> Arc<[String]> {
    if a.is_empty() || b.is_empty() {
        return Arc::from([]);
    }
    bounded(joined(a, b))
}

impl Effect {
    /// The simple command it comes from, as written (`the script` for a bound of the whole).
    pub fn what(&self) -> &Arc<str> {
        match self {
            Effect::Program { what, .. }
            | Effect::Write { what, .. }
            | Effect::Script { what, .. }
            | Effect::Network { what, .. }
            | Effect::Duplicate { what, .. }
            | Effect::Opaque { what, .. }
            | Effect::Bound { what, .. }
            | Effect::ForkBomb { what, .. } => what,
        }
    }
}

/// `cwds` as the places a script may be, or none known when they are too many or too long.
fn bounded(cwds: Vec<String>) -> Arc<[String]> {
    let bytes: usize = cwds.iter().map(String::len).sum();
    if cwds.len() > MAX_CWDS || bytes > MAX_CWD_BYTES {
        return Arc::from([]);
    }
    cwds.into()
}

/// Whether a script mentions a variable that changes what `~` or a relative `cd` means.
fn mentions(words: &[&str], name: &str) -> bool {
    words.iter().any(|w| w.contains(name))
}

/// Whether a literal path would be expanded by the shell into other paths (a glob, or a
/// brace list): it cannot be judged as written.
pub fn is_pattern(path: &str) -> bool {
    path.contains(['*', '?', '['])
        || (path.contains('{') && (path.contains(',') || path.contains("..")))
}

/// `path` taken against the absolute directory `base`, with `.`, `..` and repeated slashes
/// removed. Never touches the filesystem.
pub fn normalise(base: &str, path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{base}/{path}")
    };
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Where `path` can be, for each possible working directory; `None` when it cannot be known
/// (`~user`, `~` without a known home, a relative path with an unknown working directory).
pub fn resolve(path: &str, cwds: &[String], home: Option<&str>) -> Option<Vec<String>> {
    if path == "~" || path.starts_with("~/") {
        return Some(vec![normalise("/", &format!("{}/{}", home?, &path[1..]))]);
    }
    if path.starts_with('~') {
        return None;
    }
    if path.starts_with('/') {
        return Some(vec![normalise("/", path)]);
    }
    if cwds.is_empty() {
        return None;
    }
    Some(cwds.iter().map(|cwd| normalise(cwd, path)).collect())
}

/// Most links one walk tracks (those the script makes, and the mounts of the containers it
/// runs); past it the walk stops with a `Bound`.
pub const MAX_LINKS: usize = 64;

/// `path` with every link the script made followed: a path at or below a link (a component
/// of `path` may be a pattern matching the link's) is taken at the link's target, then
/// again, at most [`MAX_LINKS`] times (links can point at each other). A relative path is
/// matched against the links made where the working directory was unknown, named as
/// written.
pub fn follow_links(path: &str, links: &[(String, String)]) -> String {
    let mut current = match path.starts_with('/') {
        true => normalise("/", path),
        false => relative(path),
    };
    for _ in 0..MAX_LINKS {
        // A link named literally first; a pattern matching a link's name otherwise.
        // (A pattern that ends the path stays a pattern: `b/*` is every name in `b`.)
        let through = |literal: bool| {
            links.iter().rev().find_map(|(link, target)| {
                let rest = below(&current, link, literal).filter(|r| literal || !r.is_empty())?;
                Some(normalise("/", &format!("{target}/{rest}")))
            })
        };
        let Some(next) = through(true).or_else(|| through(false)) else {
            break;
        };
        if next == current {
            break;
        }
        current = next;
    }
    current
}

/// What follows `link` in `path` when `path` is `link` or beneath it (component by
/// component, a component of `path` may be a pattern that matches the link's).
fn below(path: &str, link: &str, literal: bool) -> Option<String> {
    if path.starts_with('/') != link.starts_with('/') || link.is_empty() {
        return None;
    }
    let mut parts = path.split('/').filter(|c| !c.is_empty());
    for l in link.split('/').filter(|c| !c.is_empty()) {
        let p = parts.next()?;
        if p != l && (literal || !(spec::has_glob(p) && spec::glob_match(p, l))) {
            return None;
        }
    }
    Some(parts.collect::<Vec<_>>().join("/"))
}

/// A relative path with `.` and `dir/..` removed, lexically (a leading `..` stays).
pub fn relative(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// Whether a redirection to `path` would open a network connection: bash (and ksh) read
/// `/dev/tcp/HOST/PORT` and `/dev/udp/HOST/PORT` as sockets, in either direction. Matched
/// loosely — any mention, in any case, before or after lexical normalisation — so that no
/// spelling slips through; the price is taking a real file of such a name for a socket.
pub fn network_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let normal = normalise("/", &lower);
    [lower, normal]
        .iter()
        .any(|p| p.contains("dev/tcp") || p.contains("dev/udp"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bash::abbreviate;

    /// Where the tests of the walk and its parts start.
    pub(super) const START: Start<'static> = Start {
        cwd: Some("/srv/ws"),
        home: Some("/home/u"),
        env: &[],
    };

    /// Every program's argv (as literal text, unknown words as written), in order.
    pub(super) fn programs(script: &str) -> Vec<Vec<String>> {
        walk(script, START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Program { argv, .. } => Some(
                    argv.iter()
                        .map(|w| w.literal.clone().unwrap_or_else(|| w.source.clone()))
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    }

    fn names(script: &str) -> Vec<String> {
        programs(script).into_iter().map(|a| a[0].clone()).collect()
    }

    fn scripts(script: &str) -> Vec<(String, Nesting, Option<String>)> {
        walk(script, START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Script {
                    language,
                    how,
                    code,
                    ..
                } => Some((language, how, code)),
                _ => None,
            })
            .collect()
    }

    /// Why the walk could not see through `script`: opaque effects and bounds alike.
    fn opaque(script: &str) -> Vec<String> {
        walk(script, START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Opaque { why, .. } | Effect::Bound { why, .. } => Some(why),
                _ => None,
            })
            .collect()
    }

    /// The bounds that stopped the walk through `script`.
    fn bounds(script: &str) -> Vec<String> {
        walk(script, START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Bound { why, .. } => Some(why),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_wrapper_chain_yields_the_inner_program() {
        assert_eq!(
            programs("sudo -u bob env X=1 nice -n 5 timeout 10 taskset 1 rm -rf /x"),
            [
                vec![
                    "sudo", "-u", "bob", "env", "X=1", "nice", "-n", "5", "timeout", "10"
                ]
                .into_iter()
                .chain(["taskset", "1", "rm", "-rf", "/x"])
                .collect::<Vec<_>>(),
                vec![
                    "env", "X=1", "nice", "-n", "5", "timeout", "10", "taskset", "1"
                ]
                .into_iter()
                .chain(["rm", "-rf", "/x"])
                .collect(),
                vec![
                    "nice", "-n", "5", "timeout", "10", "taskset", "1", "rm", "-rf", "/x"
                ],
                vec!["timeout", "10", "taskset", "1", "rm", "-rf", "/x"],
                vec!["taskset", "1", "rm", "-rf", "/x"],
                vec!["rm", "-rf", "/x"],
            ]
        );
        // `env -C DIR` runs its command there, and only that command.
        let at: Vec<Place> = walk("env -C /tmp touch a; touch b", START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Program { at, argv, .. } if argv[0].source == "touch" => Some(at),
                _ => None,
            })
            .collect();
        assert_eq!(*at[0].cwds, ["/tmp"]);
        assert_eq!(*at[1].cwds, ["/srv/ws"]);
        // `chroot` runs it somewhere unknown.
        let chrooted = walk("chroot /mnt touch a", START);
        assert!(chrooted.iter().any(|e| matches!(e,
            Effect::Program { at, argv, .. } if argv[0].source == "touch" && at.cwds.is_empty())));
    }

    #[test]
    fn cd_then_a_relative_write_yields_the_right_paths() {
        let writes: Vec<Option<Vec<String>>> = walk("cd sub && echo x > f; cd /etc; : >> g", START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Write {
                    target, at, how, ..
                } => Some(at.resolve(target.literal.as_deref()?))
                    .filter(|_| how != Written::ByOption),
                _ => None,
            })
            .collect();
        assert_eq!(
            writes,
            [
                // After `cd sub &&`, only where the `cd` went.
                Some(vec!["/srv/ws/sub/f".to_owned()]),
                // After the and-list, a `cd` that failed left the script where it was.
                Some(vec![
                    "/srv/ws/sub/g".to_owned(),
                    "/srv/ws/g".to_owned(),
                    "/etc/g".to_owned()
                ]),
            ]
        );
        // `cd "$X"` goes somewhere unknown; so does `cd ~` once the script sets HOME, and a
        // `cd` past the bound on the places tracked.
        let long = format!("cd {}; echo > f", "a/".repeat(MAX_CWD_BYTES / 2));
        for script in ["cd \"$X\"; echo > f", "HOME=/x; cd; echo > f", &long] {
            let w = walk(script, START);
            assert!(
                w.iter()
                    .any(|e| matches!(e, Effect::Write { at, .. } if at.resolve("f").is_none())),
                "{script}: {w:?}"
            );
        }
    }

    #[test]
    fn nested_scripts_are_followed() {
        for (script, inner) in [
            ("sh -c 'rm -rf /x'", "rm"),
            ("bash -lc \"cd /; rm x\"", "rm"),
            ("eval 'rm x'", "rm"),
            ("eval rm x", "rm"),
            ("su -c 'rm x' bob", "rm"),
            ("env -S 'rm -f' x", "rm"),
            ("su --session-command='rm x' bob", "rm"),
            ("runuser -u bob --session-command 'rm x'", "rm"),
            ("flock /tmp/l -c 'rm x'", "rm"),
            ("xargs rm < list", "rm"),
            ("find . -name '*.o' -exec rm {} +", "rm"),
            ("watch 'rm x'", "rm"),
            ("trap 'rm x' EXIT", "rm"),
            ("alias ls='rm x'", "rm"),
            ("bash <<< 'rm x'", "rm"),
            ("tar --to-command='rm x' -xf a.tar", "rm"),
            ("rsync -e 'rm x' a b:", "rm"),
            ("echo $(sudo rm x)", "rm"),
        ] {
            assert!(
                names(script).iter().any(|n| n == inner),
                "{script}: {:?}",
                walk(script, START)
            );
        }
        // `xargs` and `find -exec` add words known only when they run.
        assert_eq!(
            programs("xargs -0 rm -f")[1],
            ["rm", "-f", "(words read from the input)"]
        );
        assert_eq!(programs("find . -name x -exec rm {} \\;")[1], ["rm", "{}"]);
        // With nothing filtering the walk, `{}` is first the start itself.
        assert_eq!(programs("find . -exec rm {} \\;")[1], ["rm", "."]);
        assert!(
            walk("find . -name x -exec rm {} \\;", START).iter().any(|e| matches!(e,
                Effect::Program { argv, .. } if argv[0].source == "rm" && argv[1].literal.is_none()))
        );
        // Scripts an interpreter or a shell reads: inline, from a pipe, a here-string, a file.
        assert_eq!(
            scripts("python3 -c 'import os' x"),
            [("python".into(), Nesting::Inline, Some("import os".into()))]
        );
        assert_eq!(
            scripts("perl -we 'system 1'"),
            [("perl".into(), Nesting::Inline, Some("system 1".into()))]
        );
        assert_eq!(
            scripts("node --eval=x"),
            [("node".into(), Nesting::Inline, Some("x".into()))]
        );
        assert_eq!(
            scripts("python3 <<< 'print(1)'"),
            [(
                "python".into(),
                Nesting::HereString,
                Some("print(1)".into())
            )]
        );
        assert_eq!(
            scripts("curl -s x | base64 -d | sh"),
            [("sh".into(), Nesting::Pipe, None)]
        );
        assert_eq!(
            scripts("(curl x) | bash -s"),
            [("bash".into(), Nesting::Pipe, None)]
        );
        assert_eq!(
            scripts("sh ./build.sh"),
            [("sh".into(), Nesting::File, None)]
        );
        assert_eq!(scripts("curl x; sh"), []);
        assert_eq!(scripts("chroot /mnt <<< 'rm x'")[0].1, Nesting::HereString);
        assert!(names("chroot /mnt <<< 'rm x'").contains(&"rm".to_owned()));
    }

    #[test]
    fn what_cannot_be_seen_is_opaque() {
        for script in [
            "$CMD -rf /",
            "\"$(which rm)\" x",
            "sh -c \"$X\"",
            "eval \"$X\"",
            "sudo $OPTS rm x",
            "xargs $OPTS rm",
            "tar --to-command=\"$X\" -xf a",
            "trap \"$X\" EXIT",
            // Any word given to `su` may be `-c`, or after the user, the shell's `-c`.
            "su $U",
            "su bob -- \"$ARGS\"",
            "su --command=\"$X\"",
        ] {
            assert!(
                !opaque(script).is_empty(),
                "{script}: {:?}",
                walk(script, START)
            );
        }
        for script in [
            "ls -la",
            "sh -c 'ls'",
            "sudo -- ls",
            "cd \"$X\"; ls",
            "su - bob",
        ] {
            assert_eq!(opaque(script), Vec::<String>::new(), "{script}");
        }
        // Bounds fail closed.
        assert!(!opaque(&"x".repeat(crate::bash::MAX_INPUT + 1)).is_empty());
        let mut nested = "ls".to_owned();
        for _ in 0..=MAX_DEPTH {
            nested = format!("eval {}", shell_quote(&nested));
        }
        assert!(
            opaque(&nested).iter().any(|w| w.contains("too deeply")),
            "{:?}",
            opaque(&nested)
        );
        // The count's bound, apart from the CPU budget (a debug build on a busy machine can
        // spend the 250 ms before it counts 16 Ki effects; that bound has its own test).
        let many = "ls>a;".repeat(MAX_EFFECTS / 2 + 1);
        let w = walk_within(&many, START, std::time::Duration::from_secs(60));
        assert_eq!(w.len(), MAX_EFFECTS, "{:?}", w.first());
        assert!(matches!(w.last(), Some(Effect::Bound { .. })));
    }

    #[test]
    fn words_are_expanded_with_the_variables_the_script_set() {
        let argv = |s: &str| programs(s).into_iter().next().unwrap_or_default();
        assert_eq!(argv("X=ls; $X -la /"), ["ls", "-la", "/"]);
        assert_eq!(names("export C=rm; $C x"), ["export", "rm"]);
        assert_eq!(argv("A=/e; A+=tc; rm -r $A"), ["rm", "-r", "/etc"]);
        // Word splitting, and `echo` output.
        assert_eq!(argv("X='rm -rf'; $X /"), ["rm", "-rf", "/"]);
        assert_eq!(argv("$(echo rm) -r /"), ["echo", "rm"]);
        assert_eq!(names("$(echo rm) -r /"), ["echo", "rm"]);
        // A wrapper's command, a nested script's, a `cd`'s directory.
        assert_eq!(names("W=sudo; P=rm; $W $P x"), ["sudo", "rm"]);
        assert_eq!(names("S='rm x'; sh -c \"$S\""), ["sh", "rm"]);
        let writes: Vec<Vec<String>> = walk("D=/tmp; cd $D; echo > f", START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Write { at, .. } => Some(at.cwds.to_vec()),
                _ => None,
            })
            .collect();
        assert_eq!(writes, [vec!["/srv/ws".to_owned(), "/tmp".to_owned()]]);
        // `for` values: once each, then once unknown.
        assert_eq!(names("for c in ls cat; do $c; done"), ["ls", "cat", "${c}"]);
        assert_eq!(opaque("for c in ls cat; do $c; done").len(), 1);
        // `${X:-default}` with X unknown: once with X empty, once unknown.
        assert_eq!(argv("rm ${T:-/tmp}/x"), ["rm", "/tmp/x"]);
        assert_eq!(programs("rm ${T:-/tmp}/x").len(), 2);
        // What makes a variable unknown again: `unset`, `read`, a prefix assignment (for
        // that command only), a substitution (a subshell).
        for unknown in [
            "X=ls; unset X; $X",
            "X=ls; read X; $X",
            "X=ls true; $X",
            "echo $(X=ls); $X",
        ] {
            assert_eq!(
                opaque(unknown),
                ["its command name is known only when it runs, so it cannot be judged"],
                "{unknown}"
            );
        }
        // Only `eval` assigns in this shell; other nested scripts run elsewhere or later.
        assert_eq!(names("eval X=ls; $X"), ["eval", "ls"]);
        for elsewhere in [
            "sh -c X=ls; $X",
            "alias a=X=ls; $X",
            "watch X=ls; $X",
            "trap X=ls EXIT; $X",
        ] {
            assert_eq!(opaque(elsewhere).len(), 1, "{elsewhere}");
        }
        // As the guard reads it, a reserved word after an assignment still starts a loop.
        assert_eq!(names("X=ls for c in rm; do $c; done"), ["rm", "${c}"]);
        // An unknown part may be empty: the argument says what it is then.
        let quoted = walk("rm -rf \"$U\"/*", START);
        let Some(Effect::Program { argv: words, .. }) = quoted.first() else {
            panic!("{quoted:?}");
        };
        assert_eq!(words[2].literal, None);
        assert_eq!(words[2].if_empty.as_deref(), Some("/*"));
        assert_eq!(words[0].if_empty, None);
        // A known empty word is no argument; a quoted one is.
        assert_eq!(argv("E=; rm $E x \"$E\""), ["rm", "x", ""]);
    }

    #[test]
    fn known_text_given_to_a_shell_is_followed() {
        assert_eq!(names("echo 'rm x' | sh"), ["echo", "sh", "rm"]);
        assert_eq!(
            names("X=rm; printf \"$X x\" | cat | bash"),
            ["printf", "cat", "bash", "rm"]
        );
        assert_eq!(names("sudo echo rm x | sh"), ["sudo", "echo", "sh", "rm"]);
        assert_eq!(names("sh <<EOF\nrm x\nEOF"), ["sh", "rm"]);
        assert_eq!(names("X=rm; sh <<< \"$X x\""), ["sh", "rm"]);
        assert_eq!(names("sh -c '$0 x' rm"), ["sh", "rm"]);
        // `xargs -I` replaces in the command name too: it is the input, known or not.
        assert_eq!(names("echo rm | xargs -I{} {} x"), ["echo", "xargs", "rm"]);
        assert_eq!(programs("echo a b | xargs rm")[2], ["rm", "a", "b"]);
        assert_eq!(opaque("cat f | xargs -I{} {}").len(), 1);
        // Unknown parts stay unknown in the script the shell reads.
        assert_eq!(opaque("sh <<< \"$X x\"").len(), 1);
        // Output that is not known text: the pipe is a script of unknown code.
        assert_eq!(names("echo -e 'rm\\tx' | sh"), ["echo", "sh"]);
        assert_eq!(names("cat f | sh"), ["cat", "sh"]);
        assert_eq!(
            names("find . -exec echo rm \\; | sh"),
            ["find", "echo", "sh"]
        );
        assert_eq!(
            scripts("echo rm x; sh"),
            Vec::<(String, Nesting, Option<String>)>::new()
        );
    }

    #[test]
    fn expansion_bounds_are_bounds() {
        let braces = format!("echo {}", "{a,b}".repeat(11));
        assert_eq!(bounds(&braces).len(), 1, "{braces}");
        assert!(bounds(&braces)[0].contains("brace expansion"));
        let ifs = "IFS=$Q; X='a b'; echo $X";
        assert_eq!(bounds(ifs).len(), 1);
        assert!(bounds(ifs)[0].contains("IFS"));
        // Loops over loops: each walk of a command is charged, so the budget stops them.
        let values = (0..16).map(|i| i.to_string()).collect::<Vec<_>>().join(" ");
        let loops: String = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|v| format!("for {v} in {values}; do "))
            .collect();
        let nested = format!("{loops}echo $a$b$c$d$e; done; done; done; done; done");
        assert_eq!(bounds(&nested).len(), 1, "{nested}");
        // Nothing after the bound is listed.
        assert!(!names(&format!("{braces}; rm x")).contains(&"rm".to_owned()));
    }

    #[test]
    fn bounds_are_bounds_not_opaque_effects() {
        let mut nested = "ls".to_owned();
        for _ in 0..=MAX_DEPTH {
            nested = format!("eval {}", shell_quote(&nested));
        }
        let long = "x".repeat(crate::bash::MAX_INPUT + 1);
        let many = "ls>a;".repeat(MAX_EFFECTS / 2 + 1);
        let deep = format!("echo {}", "$(".repeat(MAX_DEPTH + 2));
        let stacked = format!("{}rm -rf /x", "nice ".repeat(MAX_WRAPPERS + 1));
        for script in [&nested, &long, &many, &deep, &stacked] {
            let w = walk(script, START);
            assert!(
                w.iter().any(|e| matches!(e, Effect::Bound { .. })),
                "{}: {:?}",
                abbreviate(script, 80),
                w.last()
            );
            assert!(
                !w.iter().any(|e| matches!(e, Effect::Opaque { .. })),
                "{}",
                abbreviate(script, 80)
            );
        }
        assert!(
            bounds(&stacked)[0].contains("wrapper"),
            "{:?}",
            bounds(&stacked)
        );
        // Up to the bound, the innermost program is seen, as by the guard.
        let fits = format!("{}rm -rf /x", "nice ".repeat(MAX_WRAPPERS));
        assert_eq!(bounds(&fits), Vec::<String>::new());
        assert_eq!(names(&fits).last().map(String::as_str), Some("rm"));
        assert_eq!(names(&fits).len(), MAX_WRAPPERS + 1);
        // Wrappers are counted on the way to each command, not across the script.
        let side_by_side = format!("{0}ls; {0}ls", "nice ".repeat(MAX_WRAPPERS));
        assert_eq!(bounds(&side_by_side), Vec::<String>::new());
        // Through a nested script, they add up: the walk never recurses further than
        // MAX_DEPTH scripts of MAX_WRAPPERS wrappers.
        let across = format!(
            "{} sh -c '{}ls'",
            "nice ".repeat(MAX_WRAPPERS / 2 + 1),
            "nice ".repeat(MAX_WRAPPERS / 2)
        );
        assert!(!bounds(&across).is_empty(), "{:?}", walk(&across, START));
        // What cannot be seen is opaque, never a bound.
        for script in ["$CMD -rf /", "sh -c \"$X\"", "sudo $OPTS rm x"] {
            assert_eq!(bounds(script), Vec::<String>::new(), "{script}");
        }
    }

    fn shell_quote(s: &str) -> String {
        format!("'{}'", s.replace('\'', "'\\''"))
    }

    #[test]
    fn redirections_are_writes_sockets_and_duplicates() {
        let w = walk("cat < in > out 2>&1 >> log 3<>/dev/tcp/h/80", START);
        let kinds: Vec<&str> = w
            .iter()
            .map(|e| match e {
                Effect::Program { .. } => "program",
                Effect::Write {
                    how: Written::Truncated,
                    ..
                } => "write",
                Effect::Write {
                    how: Written::Appended,
                    ..
                } => "append",
                Effect::Write { .. } => "option",
                Effect::Duplicate { .. } => "dup",
                Effect::Network { .. } => "network",
                Effect::Script { .. } => "script",
                Effect::Opaque { .. } => "opaque",
                Effect::Bound { .. } => "bound",
                Effect::ForkBomb { .. } => "fork bomb",
            })
            .collect();
        assert_eq!(
            kinds,
            ["write", "dup", "append", "network", "append", "program"]
        );
        assert!(walk("strace -o /tmp/t ls", START).iter().any(|e| matches!(
            e,
            Effect::Write {
                how: Written::ByOption,
                ..
            }
        )));
    }

    /// Words and operators the walk has something to do with.
    const PIECES: &[&str] = &[
        "rm ",
        "cd ",
        "cd /tmp ",
        "cd .. ",
        "sudo ",
        "env -C /x ",
        "chroot /m ",
        "nice ",
        "xargs ",
        "find . -exec ",
        "\\; ",
        "{} ",
        "sh -c '",
        "bash ",
        "python3 -c ",
        "eval ",
        "trap ",
        "alias a=",
        "watch ",
        "tar --to-command=",
        "rsync -e ",
        "'",
        "\"",
        "$X ",
        "$(",
        ")",
        "`",
        "<<< ",
        "| ",
        "; ",
        "&& ",
        "> f ",
        ">> /etc/x ",
        "2>&1 ",
        "< /dev/tcp/h/1 ",
        "-- ",
        "-u ",
        "\n",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// Any input gives a bounded list; a program whose name is unknown comes right after
        /// the opaque effect saying so, and every place named is absolute.
        #[test]
        fn the_walk_is_bounded_and_names_every_program(
            parts in proptest::collection::vec(proptest::sample::select(PIECES), 0..24)
        ) {
            let script = parts.concat();
            let effects = walk(&script, START);
            proptest::prop_assert!(effects.len() <= MAX_EFFECTS);
            for (k, e) in effects.iter().enumerate() {
                match e {
                    Effect::Program { argv, at, .. } => {
                        let after_opaque =
                            matches!(effects.get(k.wrapping_sub(1)), Some(Effect::Opaque { .. }));
                        let named = argv.first().is_some_and(|w| w.literal.is_some());
                        proptest::prop_assert!(named || after_opaque);
                        proptest::prop_assert!(at.cwds.len() <= MAX_CWDS);
                        proptest::prop_assert!(at.cwds.iter().all(|c| c.starts_with('/')));
                    }
                    Effect::Write { at, .. } => {
                        proptest::prop_assert!(at.cwds.iter().all(|c| c.starts_with('/')));
                    }
                    _ => {}
                }
            }
        }
    }
}
