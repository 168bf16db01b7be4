//! Checking: walks the parsed command the way the shell would run it and hands every simple
//! command, normalised, to the rules.
//!
//! It owns the order of things (substitutions before their command, assignments and `cd`
//! carried forward, `for` values, `${X:-default}`), the wrappers that run another command
//! (`sudo`, `env`, `nice`, `timeout`, `xargs`, `chroot`, `nsenter`, `systemd-run`, …), the
//! nested scripts (`sh -c`, `eval`, `su -c`, `trap`, `alias`, input piped into a shell,
//! `find -exec`), command names that are unknown or globs, fork bombs, and the check's
//! budget: characters expanded and CPU time. **Every bound fails closed**: past any of them
//! the command is refused, never judged in part.

use std::time::Duration;

use super::ask::risky_rules;
use super::rules::{builtin_rules, shown, write_target};
use super::{Guard, MAX_DEPTH, MAX_WRAPPERS, Objection, abbreviate, too_deep};
use crate::shell::basename;
use crate::shell::expand::{
    Bound, Env, Expander, Field, MAX_BRACE, MAX_LOOP_VALUES, MAX_TEXT, echo_output, fallback_names,
    param_names,
};
use crate::shell::parse::{
    Lexer, Op, Part, Redir, RedirKind, ShellWord, Tok, TooDeep, Word, is_identifier, render_source,
};
use crate::shell::spec::{self, SHELLS, is_assignment};

/// One check of one command: the guard's rules and what this check may still spend.
pub(super) struct Checker<'g> {
    guard: &'g Guard,
    /// Expands words, and holds what this check may still spend (text and CPU time).
    expander: Expander,
    /// The workspace (absolute), when the caller names one: recursive deletes outside it ask.
    workspace: Option<&'g str>,
    /// The first reason found to ask a person; the walk goes on, since a refusal later in
    /// the command outweighs it.
    ask: Option<Objection>,
    /// Whether the simple command being judged reads the output of a pipe.
    in_pipe: bool,
    /// The name of every program judged, each wrapper level included (for the test that the
    /// guard and the one walk see the same programs).
    #[cfg(test)]
    pub(super) seen: Vec<String>,
}

impl<'g> Checker<'g> {
    pub(super) fn new(
        guard: &'g Guard,
        workspace: Option<&'g str>,
        cpu_limit: Duration,
    ) -> Checker<'g> {
        Checker {
            guard,
            expander: Expander::new(MAX_TEXT, cpu_limit),
            workspace,
            ask: None,
            in_pipe: false,
            #[cfg(test)]
            seen: Vec::new(),
        }
    }

    /// The first reason to ask found by the walk.
    pub(super) fn into_ask(self) -> Option<Objection> {
        self.ask
    }

    fn note_ask(&mut self, r: Objection) {
        self.ask.get_or_insert(r);
    }

    /// Charges `n` units of work; refuses once the text budget or the CPU budget is spent.
    pub(super) fn spend(&mut self, n: usize) -> Result<(), Objection> {
        self.expander.spend(n).map_err(bound)
    }

    /// A word's arguments ([`Expander::expand`]).
    fn expand(&mut self, w: &Word, env: &Env) -> Result<Vec<Field>, Objection> {
        self.expander.expand(w, env).map_err(bound)
    }

    /// A word as one argument, unsplit ([`Expander::expand_joined`]).
    fn expand_joined(&mut self, parts: &[Part], env: &Env) -> Result<Field, Objection> {
        self.expander.expand_joined(parts, env).map_err(bound)
    }

    pub(super) fn script(
        &mut self,
        src: &str,
        env: &mut Env,
        depth: usize,
    ) -> Result<(), Objection> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        self.spend(src.len())?;
        self.operator_rules(src)?;
        let toks = Lexer::new(src, depth).lex().map_err(|TooDeep| too_deep())?;
        let in_pipe = self.in_pipe;
        let judged = self.tokens(&toks, env, depth);
        self.in_pipe = in_pipe;
        judged
    }

    fn tokens(&mut self, toks: &[Tok], env: &mut Env, depth: usize) -> Result<(), Objection> {
        if depth > MAX_DEPTH {
            return Err(too_deep());
        }
        if let Some(name) = fork_bomb(toks, &mut |n| self.spend(n))? {
            return Err(Objection::new(
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
        // Whether this one reads a pipe at all.
        let mut after_pipe = false;
        for tok in toks.iter().map(Some).chain([None]) {
            match tok {
                Some(Tok::Word(w)) => words.push(w),
                Some(Tok::Redir(r)) => redirs.push(r),
                _ => {
                    if let Some(Tok::Arith(w)) = tok {
                        self.spend(1)?;
                        self.nested(&w.parts, env, depth)?;
                    }
                    if words.is_empty() && redirs.is_empty() {
                        if !matches!(tok, Some(Tok::Op(Op::LParen | Op::RParen))) {
                            piped = None;
                            after_pipe = matches!(tok, Some(Tok::Op(Op::Pipe)));
                        }
                        continue;
                    }
                    self.spend(words.len() + redirs.len())?;
                    self.in_pipe = after_pipe;
                    let out = self.simple(&words, &redirs, env, depth, piped.take())?;
                    after_pipe = matches!(tok, Some(Tok::Op(Op::Pipe)));
                    piped = if after_pipe { out } else { None };
                    words.clear();
                    redirs.clear();
                }
            }
        }
        Ok(())
    }

    /// Substitutions inside `parts` run before their command: check them first.
    fn nested(&mut self, parts: &[Part], env: &Env, depth: usize) -> Result<(), Objection> {
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
    ) -> Result<Option<String>, Objection> {
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
            .find(|n| !env.vars.contains_key(n) && self.expander.lookup(n, env).is_none())
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
                RedirKind::Output | RedirKind::Append => {
                    let append = r.kind == RedirKind::Append;
                    for f in self.expand(&r.target, env)? {
                        let shown = || {
                            let words: Vec<String> =
                                words.iter().map(|w| render_source(w)).collect();
                            let op = if append { ">>" } else { ">" };
                            format!("{} {op} {}", words.join(" "), f.display)
                                .trim_start()
                                .to_owned()
                        };
                        write_target(&env.resolve(f.judged()), append, &shown)?;
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
                Some("coproc") => {
                    // `coproc NAME { …; }` names the coprocess; `coproc CMD …` runs CMD.
                    let named = words.get(i + 1).and_then(|w| w.literal()).is_some_and(|n| {
                        is_identifier(&n) && words.get(i + 2).and_then(|w| w.bare()) == Some("{")
                    });
                    i += if named { 2 } else { 1 };
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
            for (name, parts, append) in assignments {
                self.assign(name, &parts, append, env)?;
            }
            return Ok(None);
        }
        self.declarations(rest, env)?;

        let mut fields = Vec::new();
        for w in rest {
            fields.extend(self.expand(w, env)?);
        }
        self.command(fields, env, depth, stdin)
    }

    /// `NAME=value`, or `NAME+=value`, which appends to what NAME held.
    fn assign(
        &mut self,
        name: String,
        parts: &[Part],
        append: bool,
        env: &mut Env,
    ) -> Result<(), Objection> {
        let f = self.expand_joined(parts, env)?;
        let value = if append {
            let before = match env.vars.get(&name) {
                Some(v) => v.clone(),
                // Not set on this line: it may come from the environment.
                None => None,
            };
            before.zip(f.value).map(|(a, b)| a + &b)
        } else {
            f.value
        };
        env.set(name, value);
        Ok(())
    }

    /// `export X=…`, `unset X`, `read X`, `alias x='…'`: keep the variable table honest.
    fn declarations(&mut self, rest: &[&Word], env: &mut Env) -> Result<(), Objection> {
        let Some(first) = rest[0].bare() else {
            return Ok(());
        };
        match first {
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                for w in &rest[1..] {
                    if let Some((name, parts, append)) = w.assignment() {
                        self.assign(name, &parts, append, env)?;
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
            _ => {}
        }
        Ok(())
    }

    /// A normalised simple command: unwrap `sudo`, `env`, `nice`, … and run the rules on what
    /// actually executes; follow nested scripts.
    fn command(
        &mut self,
        mut args: Vec<Field>,
        env: &mut Env,
        depth: usize,
        mut stdin: Option<String>,
    ) -> Result<Option<String>, Objection> {
        let mut unwrapped = 0usize;
        let original = shown(&args, 160);
        loop {
            let Some(first) = args.first() else {
                return Ok(None);
            };
            if unwrapped > MAX_WRAPPERS {
                return Err(Objection::new(
                    "too-complex",
                    format!(
                        "refused: `{original}` stacks more than {MAX_WRAPPERS} wrapper commands, \
                         more than the guard will unwrap; run the command directly"
                    ),
                ));
            }
            self.spend(1)?;
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
            #[cfg(test)]
            self.seen.push(basename(name).to_owned());
            if is_glob_name(basename(name)) {
                self.globbed(&args, env, depth, stdin)?;
                return Ok(None);
            }
            let rest = &args[1..];
            let next: Vec<Field> = match basename(name) {
                "watch" => {
                    let after = skip_options(rest, "n", &["interval"]);
                    let exec = rest[..rest.len() - after.len()]
                        .iter()
                        .filter_map(Field::val)
                        .any(|v| v == "-x" || (v.starts_with("--e") && "--exec".starts_with(v)));
                    if exec {
                        after.to_vec()
                    } else {
                        // `watch CMD ARGS` joins its words and runs them with `sh -c`.
                        let text = after.iter().map(Field::text).collect::<Vec<_>>().join(" ");
                        self.script(&text, &mut env.clone(), depth + 1)?;
                        return Ok(None);
                    }
                }
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
                "su" | "runuser" => {
                    let as_user = rest
                        .iter()
                        .filter_map(Field::val)
                        .any(|v| v == "-u" || v.starts_with("--user"));
                    if basename(name) == "runuser" && as_user {
                        // `runuser -u USER [--] CMD …` runs CMD directly.
                        match self.wrapped(&spec::RUNUSER_AS, rest, env, depth)? {
                            Some(cmd) if !cmd.is_empty() => cmd,
                            _ => return Ok(None),
                        }
                    } else {
                        let values: Vec<Option<&str>> = rest.iter().map(Field::val).collect();
                        let commands: Vec<Field> = spec::su_commands(&values)
                            .into_iter()
                            .map(|c| match c {
                                spec::SuCommand::Attached(text) => Field::lit(&text),
                                spec::SuCommand::Word(k) => rest[k].clone(),
                            })
                            .collect();
                        if commands.is_empty() {
                            // A login shell, which reads its input.
                            self.shell(&[], env, depth, stdin)?;
                        }
                        for cmd in commands {
                            self.script(cmd.text(), &mut env.clone(), depth + 1)?;
                        }
                        return Ok(None);
                    }
                }
                "find" => {
                    self.find(&args, env, depth)?;
                    break;
                }
                shell if SHELLS.contains(&shell) => {
                    self.shell(rest, env, depth, stdin)?;
                    return Ok(None);
                }
                other => match spec::wrapper(other) {
                    Some(w) => match self.wrapped(w, rest, env, depth)? {
                        Some(cmd) if !cmd.is_empty() => cmd,
                        Some(_) if w.bare_shell => {
                            // No command: it starts a shell, which reads its input.
                            self.shell(&[], env, depth, stdin)?;
                            return Ok(None);
                        }
                        _ => return Ok(None),
                    },
                    None => {
                        if let Some(r) = spec::runner(other) {
                            self.runner(r, &args, env, depth)?;
                        }
                        break;
                    }
                },
            };
            args = next;
            unwrapped += 1;
        }
        if args.is_empty() {
            return Ok(None);
        }
        builtin_rules(&args, env)?;
        if let Some(r) = risky_rules(&args, env, self.workspace, self.in_pipe) {
            self.note_ask(r);
        }
        // `source <(curl …)`, `. "$F"`: a script this shell reads, known only when it runs.
        if let Some("source" | ".") = args[0].val()
            && let Some(script) = args.get(1).filter(|f| f.val().is_none())
        {
            self.note_ask(opaque_script(script));
        }
        // An alias body runs later as a command (behind a wrapper too): judge it now.
        if let Some("alias") = args[0].val().map(basename) {
            for f in &args[1..] {
                if let Some((_, body)) = f.text().split_once('=') {
                    self.script(body, &mut env.clone(), depth + 1)?;
                }
            }
        }
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

    /// A wrapper from the command table: follows the scripts its options run and returns
    /// the command it runs (`None`: it runs none).
    fn wrapped(
        &mut self,
        w: &spec::Wrapper,
        rest: &[Field],
        env: &Env,
        depth: usize,
    ) -> Result<Option<Vec<Field>>, Objection> {
        let mut scripts: Vec<String> = Vec::new();
        let mut i = 0;
        // Options may come before and between the operands (`flock FILE -c SCRIPT`).
        let mut operands = 0;
        'words: loop {
            while let Some(v) = rest.get(i).and_then(Field::val) {
                if v == "--" {
                    // What follows is operands, then the command.
                    i += 1 + w.operands.saturating_sub(operands).min(rest.len());
                    break 'words;
                }
                if let Some(long) = v.strip_prefix("--") {
                    let (name, inline) = match long.split_once('=') {
                        Some((n, a)) => (n, Some(a.to_owned())),
                        None => (long, None),
                    };
                    let arg = match inline {
                        Some(a) => Some(a),
                        None if spec::long_option_is(name, w.long_with_arg) => {
                            i += 1;
                            rest.get(i).map(|f| f.text().to_owned())
                        }
                        None => None,
                    };
                    if spec::long_option_is(name, w.script.1) {
                        scripts.extend(arg);
                    }
                    i += 1;
                    continue;
                }
                if v.starts_with('-') && v.len() > 1 {
                    for (k, c) in v.char_indices().skip(1) {
                        if w.no_command.contains(c) {
                            return Ok(None);
                        }
                        if w.with_arg.contains(c) {
                            let attached = &v[k + c.len_utf8()..];
                            let arg = if attached.is_empty() {
                                i += 1;
                                rest.get(i).map(|f| f.text().to_owned())
                            } else {
                                Some(attached.to_owned())
                            };
                            if w.script.0.contains(c) {
                                scripts.extend(arg);
                            }
                            break;
                        }
                    }
                    i += 1;
                    continue;
                }
                if w.assignments && is_assignment(v) {
                    i += 1;
                    continue;
                }
                break;
            }
            if operands >= w.operands || i >= rest.len() {
                break;
            }
            operands += 1;
            i += 1;
        }
        let cmd = rest.get(i..).unwrap_or_default();
        let cmd = if w.assignments {
            strip_assignments(cmd)
        } else {
            cmd.to_vec()
        };
        if w.splits && !scripts.is_empty() && !cmd.is_empty() && w.operands != usize::MAX {
            // `env -S 'A B' C` runs `A B C`.
            let text = spec::split_command(&scripts, cmd.iter().map(Field::val));
            self.script(&text, &mut env.clone(), depth + 1)?;
            return Ok(None);
        }
        for script in scripts {
            self.script(&script, &mut env.clone(), depth + 1)?;
        }
        if w.operands == usize::MAX {
            return Ok(None);
        }
        Ok(Some(cmd))
    }

    /// A program whose options run a shell command (`tar --to-command=CMD`, `rsync -e CMD`):
    /// each command is judged as a script; one known only when it runs, or a word that could
    /// be such an option, asks a person.
    fn runner(
        &mut self,
        r: &spec::Runner,
        args: &[Field],
        env: &Env,
        depth: usize,
    ) -> Result<(), Objection> {
        let words: Vec<ShellWord> = args[1..]
            .iter()
            .map(|f| ShellWord {
                literal: f.value.clone(),
                source: f.display.clone(),
                if_empty: f.value.is_none().then(|| f.if_empty.clone()),
            })
            .collect();
        let words = if r.old_style {
            spec::old_style(&words, r.with_arg)
        } else {
            words
        };
        let scanned = match spec::scan(&words, r.with_arg, r.long_with_arg, usize::MAX, false) {
            Ok(s) => s,
            Err(why) => {
                let cmd = shown(args, 80);
                self.note_ask(Objection::ask("opaque", format!("in `{cmd}`, {why}")));
                return Ok(());
            }
        };
        let mut scripts: Vec<ShellWord> = scanned.values(r.script).flatten().cloned().collect();
        for action in scanned.values(("", r.exec_action)).flatten() {
            match action.literal.as_deref() {
                Some(l) => scripts.extend(l.strip_prefix("exec=").map(spec::word)),
                None => scripts.push(action.clone()),
            }
        }
        for script in scripts {
            match script.literal {
                Some(code) => self.script(&code, &mut env.clone(), depth + 1)?,
                None => self.note_ask(opaque_script(&Field::unknown(&script.source))),
            }
        }
        Ok(())
    }

    fn shell(
        &mut self,
        rest: &[Field],
        env: &Env,
        depth: usize,
        stdin: Option<String>,
    ) -> Result<(), Objection> {
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
        } else if let Some(script) = rest.get(i) {
            if script.val().is_none() {
                self.note_ask(opaque_script(script));
            }
        } else {
            match stdin {
                Some(input) => self.script(&input, &mut env.clone(), depth + 1)?,
                None if self.in_pipe => self.note_ask(Objection::ask(
                    "pipe-to-shell",
                    "it pipes text known only when it runs (fetched or decoded) into a shell, \
                     so nobody can see what it will do"
                        .into(),
                )),
                None => {}
            }
        }
        Ok(())
    }

    /// `find START… -exec CMD {} \;` runs CMD; `-delete` deletes recursively. When nothing
    /// filters the walk, `{}` is first the start path itself, so judge CMD on that.
    fn find(&mut self, args: &[Field], env: &mut Env, depth: usize) -> Result<(), Objection> {
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
        // A name test with a pattern that is not "everything", and nothing that inverts or
        // widens the match.
        let (mut narrowed, mut widened) = (false, false);
        let mut k = 0;
        while k < expr.len() {
            let v = expr[k].val().unwrap_or("?");
            match v {
                "-name" | "-iname" | "-path" | "-ipath" | "-wholename" | "-iwholename"
                | "-regex" | "-iregex" | "-lname" | "-ilname" => {
                    unfiltered = false;
                    let pattern = expr.get(k + 1).and_then(Field::val).unwrap_or("*");
                    narrowed |= !super::rules::broad_pattern(pattern);
                    k += 2;
                    continue;
                }
                "!" | "-not" | "-o" | "-or" | "," => {
                    unfiltered = false;
                    widened = true;
                }
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
        let deletes = delete
            || execs.iter().any(|c| {
                c.first()
                    .and_then(Field::val)
                    .is_some_and(|n| matches!(basename(n), "rm" | "unlink" | "shred"))
            });
        if delete && unfiltered {
            let mut rm = vec![Field::lit("rm"), Field::lit("-r")];
            rm.extend(starts.iter().map(|f| (*f).clone()));
            builtin_rules(&rm, env).map_err(|r| Objection {
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
                        if_empty: v.replace("{}", &s.if_empty),
                    },
                    (_, Some(v)) if v.contains("{}") => Field {
                        value: None,
                        display: f.display,
                        if_empty: String::new(),
                    },
                    _ => f,
                })
                .collect();
            self.command(cmd, env, depth + 1, None)?;
        }
        if deletes && (widened || !narrowed) {
            for s in &starts {
                if let Some(what) = super::rules::danger(&env.resolve(s.judged()), false) {
                    return Err(Objection::new(
                        "find-delete",
                        format!(
                            "refused: `{}` would delete files throughout {what}; narrow it \
                             with -name PATTERN, or search a specific directory",
                            shown(args, 160)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `/bin/r? -rf /`: judge the command as every known command its name could match.
    fn globbed(
        &mut self,
        args: &[Field],
        env: &mut Env,
        depth: usize,
        stdin: Option<String>,
    ) -> Result<(), Objection> {
        if depth + 1 > MAX_DEPTH {
            return Err(too_deep());
        }
        let pattern = basename(args[0].val().unwrap_or_default());
        let table = spec::WRAPPERS.iter().map(|w| w.name);
        for candidate in KNOWN_NAMES.iter().copied().chain(table) {
            if !super::rules::glob_match(pattern, candidate) {
                continue;
            }
            let mut probe = args.to_vec();
            probe[0] = Field::lit(candidate);
            self.command(probe, &mut env.clone(), depth + 1, stdin.clone())
                .map_err(|r| Objection {
                    message: format!(
                        "{} (the command name `{}` is a pattern that can match `{candidate}`; \
                         write the name literally)",
                        r.message, args[0].display
                    ),
                    ..r
                })?;
        }
        Ok(())
    }

    /// The command name is unknown until run time. Refuse when its arguments would be
    /// destructive for one of the commands the rules know.
    fn unresolved(&self, args: &[Field], env: &Env) -> Result<(), Objection> {
        for candidate in ["rm", "chmod", "chown", "chgrp", "dd"] {
            let mut probe = args.to_vec();
            probe[0] = Field::lit(candidate);
            if builtin_rules(&probe, env).is_err() {
                return Err(Objection::new(
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

    fn operator_rules(&self, text: &str) -> Result<(), Objection> {
        for rule in self.guard.extra.iter() {
            if rule.regex.is_match(text) {
                return Err(Objection::new(
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
        // Input known only when it runs: the words it replaces, or adds, are unknown.
        (None, Some(r)) if !r.is_empty() => {
            for f in cmd.iter_mut().skip(1) {
                if let Some(v) = f.value.take_if(|v| v.contains(r.as_str())) {
                    f.if_empty = v.replace(r.as_str(), "");
                }
            }
        }
        (None, Some(_)) => {}
        (None, None) => cmd.push(Field::unknown("(words read from the input)")),
    }
    cmd
}

/// A command name that is a glob (`/bin/r?`): the shell runs whatever file it matches.
fn is_glob_name(name: &str) -> bool {
    !matches!(name, "[" | "[[") && super::rules::has_glob(name)
}

/// Names the checker or the rules treat specially; a glob command name is judged as each
/// of them it matches.
const KNOWN_NAMES: &[&str] = &[
    "rm",
    "chmod",
    "chown",
    "chgrp",
    "dd",
    "mkfs",
    "mkfs.ext4",
    "mkfs.ext3",
    "mkfs.xfs",
    "mkfs.btrfs",
    "mkfs.vfat",
    "mke2fs",
    "wipefs",
    "blkdiscard",
    "mkswap",
    "shutdown",
    "reboot",
    "halt",
    "poweroff",
    "init",
    "telinit",
    "systemctl",
    "loginctl",
    "tee",
    "shred",
    "cp",
    "mv",
    "install",
    "truncate",
    "rsync",
    "kill",
    "find",
    "sudo",
    "doas",
    "env",
    "nice",
    "ionice",
    "nohup",
    "builtin",
    "busybox",
    "toybox",
    "setsid",
    "command",
    "unbuffer",
    "exec",
    "time",
    "stdbuf",
    "timeout",
    "xargs",
    "eval",
    "trap",
    "su",
    "runuser",
    "pkexec",
    "chroot",
    "nsenter",
    "systemd-run",
    "sh",
    "bash",
    "rbash",
    "zsh",
    "dash",
    "ksh",
    "mksh",
    "pdksh",
    "ash",
    "yash",
    "posh",
    "fish",
    "csh",
    "tcsh",
];

/// The refusal for a bound of the expansion: past it the command is not judged in part.
fn bound(b: Bound) -> Objection {
    match b {
        Bound::Text => Objection::new(
            "too-complex",
            "refused: the command expands to more text than the guard will examine; \
             simplify it or put it in a script file"
                .into(),
        ),
        Bound::Cpu(limit) => Objection::new(
            "too-complex",
            format!(
                "refused: checking the command took more than the guard's {} ms of CPU \
                 time; simplify it or put it in a script file",
                limit.as_millis()
            ),
        ),
        Bound::Braces { word } => Objection::new(
            "too-complex",
            format!(
                "refused: brace expansion in `{word}` produces more than {MAX_BRACE} \
                 words, more than the guard will examine; list the paths explicitly"
            ),
        ),
        Bound::UnknownIfs { value } => Objection::new(
            "unknown-ifs",
            format!(
                "refused: IFS is set to something known only when the command runs, so \
                 how `{value}` splits into words cannot be checked; set IFS to literal text \
                 or quote the expansion"
            ),
        ),
    }
}

/// A script file named by something known only when it runs (`bash <(curl …)`).
fn opaque_script(script: &Field) -> Objection {
    Objection::ask(
        "opaque-script",
        format!(
            "it runs the script `{}`, which exists or is named only when the command runs, so \
             nobody can see what it will do",
            abbreviate(&script.display, 80)
        ),
    )
}

/// Fork bomb: a function that calls itself in a pipeline or in the background.
fn fork_bomb(
    toks: &[Tok],
    spend: &mut impl FnMut(usize) -> Result<(), Objection>,
) -> Result<Option<String>, Objection> {
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

#[cfg(test)]
mod tests {
    use super::super::testing::{DELETE, assert_allowed, assert_refused};

    use super::super::MAX_DEPTH;

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
            ("env -S 'rm -rf' /", DELETE),
            ("env --split-str='rm -rf' /", DELETE),
            ("xargs -I{} rm -rf /{}", DELETE),
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
            ("sudo alias x='rm -rf /'", DELETE),
            ("command alias x='rm -rf /'", DELETE),
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
}

#[cfg(test)]
mod bounds_and_wrappers {
    use super::super::testing::{DELETE, assert_allowed, assert_asked, assert_refused};
    use super::super::{CPU_BUDGET, Context, Guard, MAX_WRAPPERS};
    use std::time::Duration;

    #[test]
    fn every_bound_fails_closed() {
        // 33 stacked wrappers used to pass as a plain `nice`.
        let over = "nice ".repeat(MAX_WRAPPERS + 1);
        assert_refused(&format!("{over}rm -rf /etc"), "too-complex");
        assert_refused(&format!("{over}ls"), "too-complex");
        let fits = "nice ".repeat(MAX_WRAPPERS);
        assert_refused(&format!("{fits}rm -rf /etc"), DELETE);
        assert_allowed(&format!("{fits}ls"));
    }

    #[test]
    fn the_cpu_budget_fails_closed() {
        let g = Guard::default();
        let r = g
            .check_with("echo hi; ls", &Context::default(), Duration::ZERO)
            .unwrap_err();
        assert_eq!(r.rule, "too-complex");
        assert!(r.message.contains("CPU"), "{}", r.message);
        g.check_with("echo hi; ls", &Context::default(), CPU_BUDGET)
            .unwrap();
    }

    #[test]
    fn arithmetic_hides_no_commands() {
        for cmd in [
            "((x=1<<2))\nrm -rf /etc",
            "((x=1<<2)); rm -rf /etc",
            "echo $((1<<2))\nrm -rf /etc",
            "echo $[1<<2]\nrm -rf /etc",
            "x=$[1<<2]\nrm -rf /etc",
            "echo $(( $(rm -rf /) + 1 ))",
            "(( $(rm -rf /) ))",
            "echo $[ `rm -rf /` ]",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_allowed("((i++)); echo $((i << 2)) $[i*2]");
        assert_allowed("for ((i=0; i<3; i++)); do echo $i; done");
        assert_allowed("((cd /tmp) && ls)");
        // Each `((` looks ahead for its end; many unclosed ones are refused, not slow.
        assert_refused(&"((".repeat(30_000), "too-deep");
        assert_refused(
            &format!("{}\nrm -rf /etc", "$((1<<2".repeat(4_000)),
            "too-deep",
        );
    }

    #[test]
    fn su_runs_its_command_whatever_the_spelling() {
        for cmd in [
            "su -lc 'rm -rf /'",
            "su -c'rm -rf /'",
            "su --command='rm -rf /'",
            "su --command 'rm -rf /'",
            "su - root --command=\"rm -rf /\"",
            "su -l root -c 'rm -rf /'",
            "su -s /bin/bash -c 'rm -rf /' root",
            "su --session-command='rm -rf /'",
            "echo 'rm -rf /' | su",
            "echo 'rm -rf /' | su - root",
        ] {
            assert_refused(cmd, DELETE);
        }
        // Given twice, each command is judged.
        assert_refused("su -c ls -c 'rm -rf /'", DELETE);
        assert_refused("su -c 'rm -rf /' -c ls", DELETE);
        assert_allowed("su -c 'ls /' root");
        assert_allowed("su - deploy");
    }

    /// Wrappers the guard once missed while the judge knew them: both read one table now.
    #[test]
    fn every_wrapper_in_the_command_table_is_seen_through() {
        for cmd in [
            "taskset 1 rm -rf /",
            "taskset -c 0 rm -rf /",
            "chrt -f 10 rm -rf /",
            "flock /tmp/l -c 'rm -rf /'",
            "flock --command='rm -rf /' /tmp/l",
            "flock /tmp/l rm -rf /",
            "strace -o /tmp/t rm -rf /",
            "watch rm -rf /",
            "watch -n 5 'rm -rf /'",
            "watch -x rm -rf /",
            "script -qc 'rm -rf /' /dev/null",
            "script --command 'rm -rf /'",
            "unshare -m rm -rf /",
            "unbuffer rm -rf /",
            // An abbreviated long option takes its argument as the full one does.
            "sudo --chd /tmp rm -rf /",
            "sudo --us root rm -rf /",
            // `NAME+=value` is an assignment, not the command.
            "sudo X+=1 rm -rf /",
            "env X+=1 rm -rf /",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_allowed("taskset 1 make -j4");
        assert_allowed("watch -n 5 df -h");
        assert_allowed("script -q build.log");
        assert_allowed("flock /tmp/l -c 'cargo build'");
    }

    /// Programs whose options run a shell command: the command is judged like any script.
    #[test]
    fn commands_run_by_options_are_judged() {
        for cmd in [
            "tar --to-command='rm -rf /' -xf a.tar",
            "tar -xf a.tar --to-command 'rm -rf /'",
            "tar --to-comm='rm -rf /' -xf a.tar",
            "tar xf a.tar --checkpoint-action=exec='rm -rf /'",
            "tar -I 'rm -rf /' -xf a.tar",
            "tar xIf 'rm -rf /' a.tar",
            "rsync -e 'rm -rf /' a b:",
            "rsync --rsh='rm -rf /' a b:",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_asked("tar --to-command=\"$X\" -xf a.tar", "opaque");
        assert_asked("tar $OPTS -xf a.tar", "opaque");
        assert_asked("tar --to-command \"$X\" -xf a.tar", "opaque-script");
        assert_allowed("tar -xf a.tar -- --to-command=\"$X\"");
        assert_allowed("tar --to-command='cat' -xf a.tar");
        assert_allowed("tar czf /tmp/backup.tgz src");
        assert_allowed("rsync -e 'ssh -p 2222' -a src/ host:dst/");
    }

    #[test]
    fn more_wrappers_are_seen_through() {
        for cmd in [
            "coproc rm -rf /",
            "coproc killer { rm -rf /; }",
            "toybox rm -rf /",
            "pkexec rm -rf /",
            "pkexec --user root rm -rf /",
            "runuser -u root -- rm -rf /",
            "runuser -u root -c 'rm -rf /' -- ls",
            "runuser root -c 'rm -rf /'",
            "runuser -l root -c 'rm -rf /'",
            "chroot / rm -rf /",
            "chroot --userspec=0:0 /mnt rm -rf /",
            "echo 'rm -rf /' | chroot /",
            "nsenter -t 1 -m -u -i -n -p rm -rf /",
            "nsenter --target 1 --mount rm -rf /",
            "systemd-run rm -rf /",
            "systemd-run --unit x -p User=root rm -rf /",
            "systemd-run -t --uid=0 rm -rf /",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_allowed("coproc cat");
        // The command after `--` is the program, not `su`'s options.
        assert_allowed("runuser -u deploy -- ls -c 'rm -rf /'");
        assert_allowed("systemd-run --user --unit job ./build.sh");
        assert_allowed("chroot /srv/jail /bin/ls");
    }

    #[test]
    fn glob_command_names() {
        for cmd in [
            "/bin/r? -rf /",
            "/usr/bin/r* -rf /etc",
            "/bin/[r]m -rf /",
            "r[m] -rf /",
            "/bin/s? -c 'rm -rf /'",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_refused("/sbin/mkfs.e* /dev/sda1", "format-disk");
        assert_allowed("/bin/l? -la /");
        assert_allowed("[ -f x ] && echo y");
    }

    #[test]
    fn the_callers_working_directory_home_and_environment_count() {
        let g = Guard::default();
        let at = |cwd: &str, cmd: &str| {
            g.check_in(
                cmd,
                &Context {
                    cwd: Some(cwd),
                    home: Some("/home/me"),
                    ..Context::default()
                },
            )
        };
        // A previous command did `cd /`.
        for (cwd, cmd) in [
            ("/", "rm -rf *"),
            ("/", "rm -rf etc"),
            ("/usr", "rm -rf lib"),
            ("/usr/local", "rm -rf .."),
            ("/home/me", "rm -rf ."),
            ("/home/me", "rm -rf ./*"),
            ("/tmp", "rm -rf /home/me"),
        ] {
            let r = at(cwd, cmd).expect_err(cmd);
            assert_eq!(r.rule, DELETE, "{cwd}: {cmd}");
        }
        at("/tmp/work", "rm -rf *").unwrap();
        at("/home/me/project", "rm -rf target").unwrap();
        at("/", "ls; cd /tmp/x && rm -rf *").unwrap();
        // An unset variable is an empty argument, not the working directory.
        at("/", "rm -rf \"$UNSET\"").unwrap();
        at("/", "rm -rf $UNSET").unwrap();
        let env = [("TARGET".to_string(), "/".to_string())];
        let with_env = Context {
            env: &env,
            ..Context::default()
        };
        assert_eq!(
            g.check_in("rm -rf $TARGET", &with_env).unwrap_err().rule,
            DELETE
        );
        let env = [("TARGET".to_string(), "./build".to_string())];
        let with_env = Context {
            env: &env,
            ..Context::default()
        };
        g.check_in("rm -rf \"$TARGET\"", &with_env).unwrap();
        // Knowing nothing, a relative path is not judged.
        assert_allowed("rm -rf *");
    }
}

/// How words are expanded, as the guard judges them.
#[cfg(test)]
mod expansion {
    use super::super::testing::{DELETE, assert_allowed, assert_refused};

    #[test]
    fn brace_expansion_in_mixed_words() {
        for cmd in [
            "rm -rf ''/{etc,usr}",
            "rm -rf \"\"/{tmp,etc}",
            "rm -rf '/'{tmp,usr}",
            "rm -rf /{tmp/x,{a,b},etc}",
            "X=/; rm -rf $X{tmp,etc}",
        ] {
            assert_refused(cmd, DELETE);
        }
        // Quoted braces stay literal.
        assert_allowed("echo '{rm,-rf,/}'");
        assert_allowed("rm -rf '/{etc,usr}'");
        assert_allowed("rm -rf ''/{tmp/a,tmp/b}");
    }

    #[test]
    fn a_long_word_of_braces_is_scanned_once() {
        // Quadratic before: every `{` rescanned the rest of the word (1.7 s for 60 KB).
        // The check's CPU budget would refuse this if the scan were slow again.
        let word = "{".repeat(60 * 1024);
        assert_allowed(&format!("echo {word}"));
        let mixed = "{a,".repeat(20_000);
        assert_allowed(&format!("echo {mixed}"));
    }

    #[test]
    fn ifs_splitting() {
        for cmd in [
            "IFS=,; X=rm,-rf,/; $X",
            "IFS=/; X=x/-rf/; rm $X /",
            "IFS=:; for d in a:/; do rm -rf $d; done",
            "IFS=:; D=/tmp:/etc; rm -rf $D",
            "IFS=$(get); X=rm,-rf,/; $X",
        ] {
            assert!(
                super::super::Guard::default().check(cmd).is_err(),
                "allowed: {cmd}"
            );
        }
        assert_allowed("IFS=,; X=a,b; echo $X");
        assert_allowed("IFS=,; X='rm,-rf,/'; echo \"$X\"");
    }

    #[test]
    fn appends_add_to_the_value() {
        assert_refused("X=/; X+=etc; rm -rf $X", DELETE);
        assert_refused("X=/u; X+=sr; rm -rf \"$X\"", DELETE);
        assert_refused("export X=/; export X+=boot; rm -rf $X", DELETE);
        assert_allowed("X=/tmp; X+=/build; rm -rf $X");
    }

    #[test]
    fn interpreted_echo_and_printf_output_is_unknown() {
        for cmd in [
            "$(echo -e '\\x72\\x6d') -rf /",
            "$(printf '\\x72\\x6d') -rf /",
            "$(printf %s rm) -rf /",
            "X=$(printf '\\162\\155'); $X -rf /",
        ] {
            assert_refused(cmd, "unresolved-command");
        }
        // Plain text is still followed.
        assert_refused("$(echo rm) -rf /", DELETE);
        assert_refused("printf 'rm -rf /' | bash", DELETE);
    }

    #[test]
    fn unknown_values_may_be_empty() {
        for cmd in [
            "rm -rf \"$UNSET\"/*",
            "rm -rf $UNSET/",
            "rm -rf ${PREFIX}/usr",
            "rm -rf \"$(get)\"/etc",
            "rm -rf /$((0))",
        ] {
            assert_refused(cmd, DELETE);
        }
        let r = super::super::Guard::default()
            .check("rm -rf \"$UNSET\"/*")
            .unwrap_err();
        assert!(r.message.contains("empty"), "{}", r.message);
        assert_allowed("rm -rf \"$UNSET\"");
        assert_allowed("rm -rf \"${DIR:?}\"/*");
        assert_refused("rm -rf \"${DIR?}\"/*", DELETE);
        assert_allowed("rm -rf \"$DIR\"/build");
    }
}
