//! What a script defines or makes that later commands run through, and the walk follows:
//! aliases and functions (walked again where they are used, a function with its arguments),
//! `hash -p` names (the program they name), variable attributes that change what is
//! assigned (`declare -n`, `-l`, `-u`, `-i`, arrays: such a variable is unknown), links
//! (`ln`, `cp -s`, `link`, `mount --bind`: a path through one is where it leads), files the
//! script writes with known text (run again by `source`, `sh FILE`, `BASH_ENV`; a shell's
//! start-up file's text walked as the code it is), and variables that hold a command
//! (`PROMPT_COMMAND`, `GIT_SSH_COMMAND`, …: their value walked as code).
//!
//! Everything here is lexical and bounded: an alias or function is never expanded inside
//! itself, links are at most [`MAX_LINKS`], a file's text at most [`MAX_VALUE`] characters.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Limit, MAX_LINKS, Nesting, Stdin, Walk, follow_links, normalise, relative, resolve};
use crate::bash::expand::MAX_VALUE;
use crate::bash::parse::{Op, Part, ShellWord, Tok, Word, is_identifier};
use crate::bash::spec::{self, scan};
use crate::bash::{basename, quote};

/// What the script has defined and made so far.
#[derive(Default)]
pub(super) struct Defs {
    /// `alias NAME=VALUE`, by name.
    aliases: HashMap<String, String>,
    /// Function bodies (with their braces), by name.
    functions: HashMap<String, Arc<[Tok]>>,
    /// Aliases and functions being expanded now: never expanded again inside themselves.
    expanding: Vec<String>,
    /// `hash -p PATH NAME`: NAME runs PATH (`None`: a path known only when it runs).
    hashed: HashMap<String, Option<String>>,
    /// Links made so far, in order (link → target, absolute).
    pub(super) links: Arc<[(String, String)]>,
    /// Files written by redirection, with their text when it is known.
    files: HashMap<String, Option<String>>,
    /// Variables whose attributes change what is assigned to them.
    attributed: HashMap<String, Attribute>,
}

/// An attribute that changes what a variable holds.
#[derive(Clone)]
enum Attribute {
    /// Case conversion, an integer, an array: the value is not the text assigned.
    Transform,
    /// A nameref: assigning to it assigns the variable it names (`None`: unknown).
    Nameref(Option<String>),
}

/// Option letters of `declare`/`typeset`/`local` that make a variable's value something
/// other than the text assigned: a nameref, case conversion, an integer, an array.
const TRANSFORMING: &[char] = &['n', 'l', 'u', 'c', 'i', 'a', 'A'];

impl Walk {
    /// Records the functions `toks` defines (`NAME() BODY`, `function NAME BODY`); returns
    /// where each definition starts and where its body starts and ends in `toks`.
    pub(super) fn define_functions(&mut self, toks: &[Tok]) -> Vec<(usize, usize, usize)> {
        let found = definitions(toks);
        for (name, _, start, end) in &found {
            self.defs
                .functions
                .insert(name.clone(), Arc::from(&toks[*start..*end]));
        }
        found.into_iter().map(|(_, f, s, e)| (f, s, e)).collect()
    }

    /// Whether `name` is an alias or a function the walk expands here.
    fn expandable(&self, name: &str) -> bool {
        !self.defs.expanding.iter().any(|n| n == name)
    }

    /// `NAME ARGS` where NAME is an alias or a function the script defined: the alias's text
    /// with the arguments after it, or the function's body with ARGS as `$1`, `$2`, …, each
    /// walked again here, reading the command's input. Also walked as a program of that name.
    pub(super) fn defined(
        &mut self,
        words: &[ShellWord],
        what: &Arc<str>,
        depth: usize,
        stdin: &Stdin,
    ) {
        let Some(name) = words[0].literal.as_deref().filter(|n| !n.contains('/')) else {
            return;
        };
        if !self.expandable(name) {
            return;
        }
        if let Some(value) = self.defs.aliases.get(name).cloned() {
            let mut text = value;
            for w in &words[1..] {
                text.push(' ');
                match &w.literal {
                    Some(l) => text.push_str(&quote(l)),
                    None => text.push_str("\"${__unknown_word}\""),
                }
            }
            self.defs.expanding.push(name.to_owned());
            self.inherited = stdin.clone();
            self.code("sh", Nesting::Eval, &text, what, depth);
            self.inherited = None;
            self.defs.expanding.pop();
        }
        if let Some(body) = self.defs.functions.get(name).cloned() {
            self.call(name, &body, &words[1..], depth, stdin);
        }
    }

    /// A function's body, walked with `args` as its positional parameters; what it declares
    /// local is restored afterwards.
    fn call(&mut self, name: &str, body: &[Tok], args: &[ShellWord], depth: usize, stdin: &Stdin) {
        let positional: Vec<String> = (1..=9)
            .map(|n| n.to_string())
            .chain(["#".into(), "@".into(), "*".into()])
            .collect();
        let locals = local_names(body);
        let saved: Vec<(String, Option<Option<String>>)> = positional
            .iter()
            .chain(&locals)
            .map(|n| (n.clone(), self.env.vars.get(n).cloned()))
            .collect();
        let saved_args = self.env.args.take();
        for (k, n) in positional.iter().take(9).enumerate() {
            let value = match args.get(k) {
                Some(a) => a.literal.clone(),
                None => Some(String::new()),
            };
            self.env.set(n.clone(), value);
        }
        self.env.args = args.iter().map(|a| a.literal.clone()).collect();
        self.defs.expanding.push(name.to_owned());
        self.inherited = stdin.clone();
        self.tokens(body, depth + 1);
        self.inherited = None;
        self.defs.expanding.pop();
        self.env.args = saved_args;
        for (n, v) in saved {
            match v {
                Some(v) => self.env.set(n, v),
                None => self.env.unset(&n),
            }
        }
    }

    /// `alias NAME=VALUE…`: recorded, for the commands that use NAME later.
    pub(super) fn record_aliases(&mut self, args: &[ShellWord]) {
        for w in args {
            if let Some((name, value)) = w.literal.as_deref().and_then(|l| l.split_once('=')) {
                self.defs.aliases.insert(name.to_owned(), value.to_owned());
            }
        }
    }

    /// The command with a name `hash -p` bound to a path: that path's program (unknown when
    /// the path is).
    pub(super) fn hashed(&self, words: &[ShellWord]) -> Option<Vec<ShellWord>> {
        let name = words[0].literal.as_deref().filter(|n| !n.contains('/'))?;
        let path = self.defs.hashed.get(name)?;
        let mut out = words.to_vec();
        out[0].literal = path.clone();
        Some(out)
    }

    /// `hash -p PATH NAME…` binds each NAME to PATH; `hash -r` and `hash -d` are not undone
    /// (a binding kept is judged the stricter way).
    pub(super) fn hash(&mut self, args: &[ShellWord]) {
        let mut k = 0;
        while let Some(w) = args.get(k) {
            k += 1;
            let Some(l) = w.literal.as_deref() else {
                continue;
            };
            if let Some(rest) = l.strip_prefix("-p") {
                let path = match rest.is_empty() {
                    true => {
                        k += 1;
                        args.get(k - 1).map(|p| p.literal.clone())
                    }
                    false => Some(Some(rest.to_owned())),
                };
                for name in args[k.min(args.len())..].iter() {
                    if let Some(n) = name.literal.as_deref().filter(|n| !n.starts_with('-')) {
                        self.defs
                            .hashed
                            .insert(n.to_owned(), path.clone().flatten());
                    }
                }
                return;
            }
        }
    }

    /// `declare`/`typeset`/`local`/`readonly`/`export` with their options: a variable given
    /// an attribute that changes what it holds (or options known only when it runs) is
    /// unknown from here on, and so is whatever a nameref names when assigned through it.
    /// Returns false when a bound stopped the walk.
    pub(super) fn declare(&mut self, rest: &[&Word], what: &Arc<str>, depth: usize) -> bool {
        let first = rest[0].bare().unwrap_or_default();
        let mut flags = String::new();
        let mut unknown = false;
        for w in &rest[1..] {
            match w.literal() {
                Some(l) if l.starts_with('-') && l.len() > 1 => flags.push_str(&l[1..]),
                None if w.assignment().is_none() => unknown = true,
                _ => {}
            }
        }
        let transforms = unknown
            || match first {
                "declare" | "typeset" | "local" => flags.contains(TRANSFORMING),
                "readonly" => flags.contains(['a', 'A']),
                _ => false,
            };
        let nameref = flags.contains('n') && first != "export";
        for w in &rest[1..] {
            if let Some((name, parts, append)) = w.assignment() {
                if transforms {
                    let attribute = match nameref {
                        true => Attribute::Nameref(literal_text(&parts)),
                        false => Attribute::Transform,
                    };
                    self.defs.attributed.insert(name.clone(), attribute);
                    self.env.set(name, None);
                } else if !self.assign(name.clone(), &parts, append, what) {
                    return false;
                } else {
                    self.code_variable(&name, what, depth);
                }
            } else if transforms && let Some(name) = w.literal().filter(|n| is_identifier(n)) {
                let attribute = match nameref {
                    true => Attribute::Nameref(None),
                    false => Attribute::Transform,
                };
                self.defs.attributed.insert(name.clone(), attribute);
                self.env.set(name, None);
            }
        }
        true
    }

    /// An assignment to a variable with an attribute: it is unknown, and through a nameref
    /// the variable it names (every variable, when that is unknown).
    pub(super) fn assigned_attributed(&mut self, name: &str) -> bool {
        let Some(attribute) = self.defs.attributed.get(name).cloned() else {
            return false;
        };
        match attribute {
            Attribute::Transform => {}
            Attribute::Nameref(Some(target)) => self.env.set(target, None),
            Attribute::Nameref(None) => {
                for v in self.env.vars.values_mut() {
                    *v = None;
                }
            }
        }
        self.env.set(name.to_owned(), None);
        true
    }

    /// `set -- ARGS` (or `set ARGS`): the positional parameters; options alone leave them.
    pub(super) fn set_positional(&mut self, args: &[ShellWord]) {
        let mut k = 0;
        let mut sets = false;
        while let Some(w) = args.get(k) {
            match w.literal.as_deref() {
                Some("--") => {
                    k += 1;
                    sets = true;
                    break;
                }
                Some("-o" | "+o") => k += 2,
                Some(l) if (l.starts_with('-') || l.starts_with('+')) && l.len() > 1 => k += 1,
                _ => {
                    sets = true;
                    break;
                }
            }
        }
        if !sets {
            return;
        }
        let words = &args[k.min(args.len())..];
        for n in 1..=9 {
            let value = match words.get(n - 1) {
                Some(w) => w.literal.clone(),
                None => Some(String::new()),
            };
            self.env.set(n.to_string(), value);
        }
        self.env.args = words.iter().map(|w| w.literal.clone()).collect();
    }

    /// `let NAME=EXPR…`: each NAME is unknown.
    pub(super) fn arithmetic_names(&mut self, args: &[ShellWord]) {
        for w in args {
            let text = w.literal.as_deref().unwrap_or(&w.source);
            let name: String = text
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if is_identifier(&name) {
                self.env.set(name, None);
            }
        }
    }

    /// A link `ln`, `cp -s`/`cp -l`, `link` or `mount --bind` makes: recorded, so that a path
    /// through it is judged where it leads. A link whose name or target is known only when it
    /// runs is opaque: paths through it cannot be judged.
    pub(super) fn link(&mut self, program: &str, args: &[ShellWord], what: &Arc<str>) {
        let Some(made) = link_operands(program, args) else {
            return;
        };
        let made = match made {
            Ok(m) => m,
            Err(why) => return self.opaque(what.clone(), why),
        };
        let before = self.defs.links.clone();
        let mut links: Vec<(String, String)> = before.to_vec();
        for (target, name, symbolic, into_dir) in made {
            let (Some(target), Some(name)) = (target, name) else {
                return self.opaque(
                    what.clone(),
                    "it makes a link whose name or target is known only when it runs, so \
                     paths through it cannot be judged",
                );
            };
            if name.is_empty() {
                continue;
            }
            // Where the script is unknown, a relative link is kept as named, for the
            // relative paths that use it.
            let names = match resolve(&name, &self.cwds, self.home.as_deref()) {
                Some(n) => n,
                None if !name.starts_with('~') => vec![relative(&name)],
                None => {
                    return self.opaque(
                        what.clone(),
                        "it makes a link in a home directory that is not known, so paths \
                         through it cannot be judged",
                    );
                }
            };
            for (k, at) in names.iter().enumerate() {
                let at = match into_dir {
                    true => format!("{}/{}", at, basename(target.trim_end_matches('/'))),
                    false => at.clone(),
                };
                // The link is made where its directory leads.
                let absolute = at.starts_with('/');
                let (dir, base) = at.rsplit_once('/').unwrap_or(("", &at));
                let dir = match (dir.is_empty(), absolute) {
                    (true, true) => "/".to_owned(),
                    (true, false) => String::new(),
                    (false, _) => follow_links(dir, &before),
                };
                let join = |dir: &str, path: &str| match dir.starts_with('/') {
                    true => normalise(dir, path),
                    false => relative(&format!("{dir}/{path}")),
                };
                let at = join(&dir, base);
                if at.is_empty() {
                    continue;
                }
                let to = if target.starts_with('/') {
                    normalise("/", &target)
                } else if target.starts_with('~') {
                    match resolve(&target, &self.cwds, self.home.as_deref()) {
                        Some(t) => t[0].clone(),
                        None => {
                            return self.opaque(
                                what.clone(),
                                "it makes a link to a place known only when it runs",
                            );
                        }
                    }
                } else if symbolic {
                    join(&dir, &target)
                } else {
                    match self.cwds.get(k) {
                        Some(cwd) => normalise(cwd, &target),
                        None => relative(&target),
                    }
                };
                if to.starts_with("..") {
                    return self.opaque(
                        what.clone(),
                        "it makes a link to a place above a directory that is not known, so \
                         paths through it cannot be judged",
                    );
                }
                if to == at {
                    continue;
                }
                if links.len() >= MAX_LINKS {
                    return self.bound(
                        Limit::Size,
                        what.clone(),
                        format!("it makes more than the {MAX_LINKS} links followed"),
                    );
                }
                links.retain(|(l, _)| *l != at);
                links.push((at, to));
            }
        }
        self.defs.links = links.into();
    }

    /// Text written by redirection: recorded for the commands that run the file later; a
    /// shell's start-up file's text is walked as the code it is (unknown text: opaque).
    pub(super) fn wrote(
        &mut self,
        targets: &[(String, bool)],
        text: Option<String>,
        what: &Arc<str>,
        depth: usize,
    ) {
        for (target, append) in targets {
            let Some(paths) = resolve(target, &self.cwds, self.home.as_deref()) else {
                continue;
            };
            for path in paths {
                let path = follow_links(&path, &self.defs.links);
                let before = self.defs.files.get(&path).cloned().flatten();
                let now = match (append, &text) {
                    (false, t) => t.clone(),
                    (true, Some(t)) => before.map(|b| b + t),
                    (true, None) => None,
                }
                .filter(|t| t.len() <= MAX_VALUE);
                if let Some(fields) = spec::cron_file(&path) {
                    match &text {
                        Some(t) if fields == 0 => {
                            self.code("sh", Nesting::Deferred, t, what, depth);
                        }
                        Some(t) => {
                            for job in super::code::cron_commands(t, fields) {
                                self.code("sh", Nesting::Deferred, &job, what, depth);
                            }
                        }
                        None => self.opaque(
                            what.clone(),
                            format!("it writes text known only when it runs into {path}, which cron runs"),
                        ),
                    }
                }
                if spec::startup_file(&path) {
                    match &text {
                        Some(code) => self.code("sh", Nesting::Deferred, code, what, depth),
                        None => self.opaque(
                            what.clone(),
                            format!(
                                "it writes text known only when it runs into {path}, which a \
                                 shell runs when it starts"
                            ),
                        ),
                    }
                }
                self.defs.files.insert(path, now);
            }
        }
    }

    /// A script file the script itself wrote, run by `source`, `sh FILE` or `BASH_ENV`:
    /// `Some(text)` when its text is known, `Some(None)` when the script wrote it with text
    /// known only when it runs; `None` when the script did not write it.
    pub(super) fn written_file(&self, word: &ShellWord) -> Option<Option<String>> {
        let path = word.literal.as_deref()?;
        let paths = resolve(path, &self.cwds, self.home.as_deref())?;
        paths.iter().find_map(|p| {
            let p = follow_links(p, &self.defs.links);
            self.defs.files.get(&p).cloned()
        })
    }

    /// Runs a file the script wrote: its known text as a script (in this shell for
    /// `source`), or opaque. False when the script did not write it.
    pub(super) fn run_written(
        &mut self,
        file: &ShellWord,
        how: Nesting,
        what: &Arc<str>,
        depth: usize,
    ) -> bool {
        match self.written_file(file) {
            None => false,
            Some(Some(text)) => {
                self.code("sh", how, &text, what, depth);
                true
            }
            Some(None) => {
                self.opaque(
                    what.clone(),
                    format!(
                        "it runs {}, which the script wrote with text known only when it runs",
                        file.source
                    ),
                );
                true
            }
        }
    }

    /// An assignment to a variable that holds a command another program runs
    /// ([`spec::CODE_VARIABLES`]): its value walked as that code; `BASH_ENV`/`ENV`, a file
    /// a shell runs at start, as the file when the script wrote it.
    pub(super) fn code_variable(&mut self, name: &str, what: &Arc<str>, depth: usize) {
        let Some(value) = self.env.vars.get(name).cloned() else {
            return;
        };
        if matches!(name, "BASH_ENV" | "ENV") {
            if let Some(v) = value {
                self.run_written(&spec::word(&v), Nesting::Deferred, what, depth);
            }
            return;
        }
        if !spec::CODE_VARIABLES.contains(&name) {
            return;
        }
        match value {
            Some(code) => self.code("sh", Nesting::Deferred, &code, what, depth),
            None => self.opaque(
                what.clone(),
                format!("it sets {name}, a command another program runs, to text known only when it runs"),
            ),
        }
    }
}

/// A word's text when it is all literal.
fn literal_text(parts: &[Part]) -> Option<String> {
    let mut out = String::new();
    for p in parts {
        match p {
            Part::Lit { text, .. } => out.push_str(text),
            _ => return None,
        }
    }
    Some(out)
}

/// The links a link-making command makes: (target, link name, symbolic, whether the name
/// may be a directory the link goes into), each `None` when known only when it runs; an
/// error when its options cannot be read; `None` when it makes no link.
#[allow(clippy::type_complexity)]
fn link_operands(
    program: &str,
    args: &[ShellWord],
) -> Option<Result<Vec<(Option<String>, Option<String>, bool, bool)>, String>> {
    let (with_arg, long): (&str, &[&str]) = match program {
        "ln" | "cp" => ("St", &["suffix", "target-directory"]),
        "mount" => (
            "otLUTNO",
            &[
                "options",
                "types",
                "label",
                "uuid",
                "fstab",
                "namespace",
                "source",
                "target",
                "test-opts",
            ],
        ),
        _ => ("", &[]),
    };
    // `cp` and `mount` make links only with these options, named literally.
    let named = |short: &str, long: &[&str]| {
        args.iter()
            .filter_map(|w| w.literal.as_deref())
            .any(|l| match l.strip_prefix("--") {
                Some(name) => long.iter().any(|n| name.split('=').next() == Some(*n)),
                None => l.starts_with('-') && l[1..].contains(|c| short.contains(c)),
            })
    };
    let maybe = match program {
        "cp" => named("sl", &["symbolic-link", "link"]),
        "mount" => {
            named("BR", &["bind", "rbind"])
                || args
                    .iter()
                    .any(|w| w.literal.as_deref().is_some_and(|l| l.contains("bind")))
        }
        _ => true,
    };
    if !maybe {
        return None;
    }
    let s = match scan(args, with_arg, long, usize::MAX, false) {
        Ok(s) => s,
        Err(why) => return Some(Err(why)),
    };
    let lit = |w: &ShellWord| w.literal.clone();
    let (symbolic, links) = match program {
        "ln" => (s.has("s", &["symbolic"]), true),
        "cp" => {
            let sym = s.has("s", &["symbolic-link"]);
            (sym, sym || s.has("l", &["link"]))
        }
        "link" => (false, true),
        "mount" => {
            let bind = s.has("BR", &["bind", "rbind"])
                || s.values(("o", &["options"]))
                    .flatten()
                    .any(|o| o.literal.as_deref().is_none_or(|o| o.contains("bind")));
            (false, bind)
        }
        _ => (false, false),
    };
    if !links {
        return None;
    }
    let mut out = Vec::new();
    if program == "mount" {
        let mut ops = s.operands.iter();
        let src = s
            .values(("", &["source"]))
            .flatten()
            .next()
            .or_else(|| ops.next());
        let dst = s
            .values(("", &["target"]))
            .flatten()
            .next()
            .or_else(|| ops.next());
        if let (Some(src), Some(dst)) = (src, dst) {
            out.push((lit(src), lit(dst), false, false));
        }
        return Some(Ok(out));
    }
    let dir = s.values(("t", &["target-directory"])).next();
    let no_dir = s.has("Tn", &["no-target-directory", "no-dereference"]);
    match (dir, s.operands.as_slice()) {
        (Some(dir), targets) => {
            let dir = dir.and_then(lit);
            for t in targets {
                out.push((lit(t), dir.clone(), symbolic, true));
            }
        }
        (None, [one]) => {
            let name = one
                .literal
                .as_deref()
                .map(|t| basename(t.trim_end_matches('/')).to_owned());
            out.push((lit(one), name, symbolic, false));
        }
        (None, [target, name]) => {
            out.push((lit(target), lit(name), symbolic, false));
            if !no_dir {
                out.push((lit(target), lit(name), symbolic, true));
            }
        }
        (None, []) => {}
        (None, [targets @ .., dir]) => {
            for t in targets {
                out.push((lit(t), lit(dir), symbolic, true));
            }
        }
    }
    Some(Ok(out))
}

/// The functions `toks` defines: each name, where its definition starts, and where its
/// body (braces or parentheses included) starts and ends.
fn definitions(toks: &[Tok]) -> Vec<(String, usize, usize, usize)> {
    let mut out = Vec::new();
    let mut at_command = true;
    let word = |k: usize| match toks.get(k) {
        Some(Tok::Word(w)) => Some(w),
        _ => None,
    };
    let op = |k: usize, o: Op| matches!(toks.get(k), Some(Tok::Op(x)) if *x == o);
    let mut i = 0;
    while i < toks.len() {
        let start = at_command;
        at_command = matches!(toks[i], Tok::Op(_));
        if !start {
            i += 1;
            continue;
        }
        let (name, mut j) = match word(i) {
            Some(w) if w.bare() == Some("function") => match word(i + 1).and_then(Word::literal) {
                Some(n) => match op(i + 2, Op::LParen) && op(i + 3, Op::RParen) {
                    true => (n, i + 4),
                    false => (n, i + 2),
                },
                None => {
                    i += 1;
                    continue;
                }
            },
            Some(w) if op(i + 1, Op::LParen) && op(i + 2, Op::RParen) => match w.literal() {
                Some(n) if !n.is_empty() && !n.contains('=') => (n, i + 3),
                _ => {
                    i += 1;
                    continue;
                }
            },
            _ => {
                if matches!(
                    word(i).and_then(Word::bare),
                    Some("{" | "then" | "do" | "else" | "!")
                ) {
                    at_command = true;
                }
                i += 1;
                continue;
            }
        };
        while op(j, Op::Semi) {
            j += 1;
        }
        let mut level = 0i32;
        let mut end = None;
        for (k, t) in toks.iter().enumerate().skip(j) {
            level += match t {
                Tok::Word(w) if w.bare() == Some("{") => 1,
                Tok::Word(w) if w.bare() == Some("}") => -1,
                Tok::Op(Op::LParen) => 1,
                Tok::Op(Op::RParen) => -1,
                _ => 0,
            };
            if level <= 0 {
                end = Some(k + 1);
                break;
            }
        }
        if let Some(end) = end.filter(|e| *e > j) {
            out.push((name, i, j, end));
        }
        i += 1;
    }
    out
}

/// Names a function body declares local (`local`, and `declare`/`typeset` without `-g`).
fn local_names(body: &[Tok]) -> Vec<String> {
    let mut out = Vec::new();
    let mut declaring = false;
    let mut global = false;
    let mut at_command = true;
    for t in body {
        match t {
            Tok::Op(_) => {
                declaring = false;
                at_command = true;
            }
            Tok::Word(w) if at_command => {
                let b = w.bare();
                if matches!(b, Some("{" | "}" | "then" | "do" | "else" | "!")) {
                    continue;
                }
                declaring = matches!(b, Some("local" | "declare" | "typeset"));
                global = false;
                at_command = false;
            }
            Tok::Word(w) if declaring => {
                if let Some(l) = w.literal()
                    && l.starts_with('-')
                {
                    global |= l.contains('g');
                    continue;
                }
                if global {
                    continue;
                }
                let name = match w.assignment() {
                    Some((n, _, _)) => Some(n),
                    None => w.literal().filter(|n| is_identifier(n)),
                };
                out.extend(name);
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::{START, programs};
    use super::super::{Effect, walk};

    fn runs(script: &str, argv: &[&str]) -> bool {
        programs(script).iter().any(|p| p == argv)
    }

    #[test]
    fn aliases_and_functions_run_their_commands_where_used() {
        assert!(runs(
            "shopt -s expand_aliases\nalias ls='rm -rf'\nls /etc",
            &["rm", "-rf", "/etc"]
        ));
        assert!(runs(
            "alias please='sudo -n'\nplease rm -rf /etc",
            &["rm", "-rf", "/etc"]
        ));
        // An alias is not expanded inside itself.
        assert!(runs("alias ls='ls -la'\nls /x", &["ls", "-la", "/x"]));
        assert!(runs(
            "as_root() { sudo -n \"$@\"; }; as_root rm -rf /etc",
            &["rm", "-rf", "/etc"]
        ));
        assert!(runs(
            "function tidy { find \"$1\" -delete; }; tidy /etc",
            &["find", "/etc", "-delete"]
        ));
        // What a function declares local is restored after it.
        assert!(runs(
            "d=/tmp; f() { local d=/etc; }; f; rm -rf $d",
            &["rm", "-rf", "/tmp"]
        ));
        // A function calling itself is walked once per call, not without end.
        assert!(runs("f() { f x; rm y; }; f", &["rm", "y"]));
        let writes: Vec<String> = walk("wipe() { : > \"$1\"; }; wipe /etc/shadow", START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Write { target, .. } => target.literal,
                _ => None,
            })
            .collect();
        assert!(writes.contains(&"/etc/shadow".to_owned()), "{writes:?}");
    }

    #[test]
    fn hashed_names_and_transforming_attributes() {
        assert!(runs(
            "hash -p /bin/rm ls; ls -rf /etc",
            &["/bin/rm", "-rf", "/etc"]
        ));
        // `declare -l`, namerefs: the value is not the text assigned, so it is unknown.
        for script in [
            "declare -l c=RM; $c -rf /etc",
            "declare -n ref=t; t=/etc; rm -rf \"$ref\"",
            "typeset -u x; x=a; rm -rf $x",
            "declare -n r=t; r=/etc; rm -rf $t",
        ] {
            let all = programs(script);
            let unknown = all.iter().any(|p| p.iter().any(|a| a.starts_with("${")));
            assert!(unknown, "{script}: {all:?}");
        }
        // `set --` sets the positional parameters.
        assert!(runs("set -- rm -rf /etc; \"$@\"", &["rm", "-rf", "/etc"]));
    }

    #[test]
    fn links_the_script_made_are_followed() {
        let places: Vec<Option<Vec<String>>> = walk("ln -s / r; rm -rf r/etc", START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Program { argv, at, .. } if argv[0].source == "rm" => {
                    Some(at.resolve("r/etc"))
                }
                _ => None,
            })
            .collect();
        assert_eq!(places, [Some(vec!["/etc".to_owned()])]);
        // A link to a link, a hard link, a link made elsewhere (`ln -s / a; ln -s a b`).
        let at = |script: &str, path: &str| {
            walk(script, START)
                .into_iter()
                .filter_map(|e| match e {
                    Effect::Program { argv, at, .. } if argv[0].source == "rm" => at.resolve(path),
                    _ => None,
                })
                .next_back()
        };
        assert_eq!(
            at("ln -s / a; ln -s a b; rm b/etc", "b/etc"),
            Some(vec!["/etc".into()])
        );
        assert_eq!(
            at("ln /etc/shadow s; rm s", "s"),
            Some(vec!["/etc/shadow".into()])
        );
        assert_eq!(
            at("cp -s /etc/passwd p; rm p", "p"),
            Some(vec!["/etc/passwd".into()])
        );
        // A link whose target is known only when it runs: opaque.
        assert!(
            walk("ln -s \"$X\" r; rm -rf r/etc", START)
                .iter()
                .any(|e| matches!(e, Effect::Opaque { .. }))
        );
    }

    #[test]
    fn files_written_with_known_text_and_variables_that_hold_commands() {
        assert!(runs(
            "echo 'rm -rf /x' > s.sh; sh s.sh",
            &["rm", "-rf", "/x"]
        ));
        assert!(runs(
            "echo 'rm -rf /x' > /tmp/e; BASH_ENV=/tmp/e bash -c true",
            &["rm", "-rf", "/x"]
        ));
        assert!(runs("printf 'rm x' > f; . ./f", &["rm", "x"]));
        assert!(runs("echo 'rm x' >> ~/.bashrc", &["rm", "x"]));
        assert!(runs(
            "echo '* * * * * root rm x' > /etc/cron.d/j",
            &["rm", "x"]
        ));
        assert!(runs("PROMPT_COMMAND='rm x' bash -i", &["rm", "x"]));
        assert!(runs(
            "export GIT_SSH_COMMAND='rm x'; git fetch",
            &["rm", "x"]
        ));
        assert!(runs("env GIT_PAGER='rm x' git log", &["rm", "x"]));
        assert!(runs(". /dev/stdin <<< 'rm x'", &["rm", "x"]));
    }
}
