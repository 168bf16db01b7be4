//! The guard's policy over the one walk ([`crate::bash::effects`]): the walk lists what a
//! command does, in order — programs with their expanded arguments and the places they may
//! run in, writes, nested scripts, what it cannot see through, where a bound stopped it —
//! and this judges each effect with the rules (`rules`: refuse) and the risks (`ask`: a
//! person decides).
//!
//! It owns the mapping from effects to verdicts: a bound of the walk or a fork bomb is
//! refused; whatever the walk cannot see through (a command name, a script or an option
//! known only when it runs) asks a person, and so does a shell reading text known only when
//! it runs from a pipe; each program is judged at every place the walk says it may run in,
//! a glob command name as every known program it can match, an unknown one as the
//! destructive programs it could be; operator patterns apply to the command, every nested
//! script and every program. It never walks the command itself.

use std::time::Duration;

use super::ask::{printed, risky_rules, unknown_target_ask};
use super::code::code_as_data;
use super::host::kernel_target;
use super::rules::{broad_pattern, builtin_rules, danger, shown, vital_pattern, write_target};
use super::{Guard, Objection, abbreviate};
use crate::bash::basename;
use crate::bash::effects::{self, Effect, Limit, Nesting, Place, Start, Written};
use crate::bash::expand::{Env, Field};
use crate::bash::parse::ShellWord;
use crate::bash::spec::{self, SHELLS};

/// The guard's judgement of `command` in `context` within `cpu` of CPU time: `Err` refused,
/// `Ok(Some)` the first reason to ask a person, `Ok(None)` allowed. A refusal anywhere
/// outweighs every ask.
pub(super) fn judge(
    guard: &Guard,
    command: &str,
    context: &super::Context<'_>,
    cpu: Duration,
) -> Result<Option<Objection>, Objection> {
    let policy = Policy {
        guard,
        workspace: context.workspace,
    };
    policy.operator_rules(command)?;
    let start = Start {
        cwd: context.cwd,
        // Unknown, the home is still one place: `cd; rm -rf *` deletes it.
        home: context.home.or(Some(UNKNOWN_HOME)),
        env: context.env,
    };
    let mut ask = None;
    // A `find` that deletes throughout a system tree, or a command name known only when it
    // runs that could be a destructive one, is refused after the commands it runs are judged
    // (they follow it, from the same command): their refusal says more.
    let mut deferred: Option<(std::sync::Arc<str>, Objection)> = None;
    for effect in effects::walk_within(command, start, cpu) {
        let what = effect.what().clone();
        if let Some((_, r)) = deferred.take_if(|(from, _)| *from != what) {
            return Err(r);
        }
        match policy.effect(effect) {
            Ok(Some(r)) => {
                ask.get_or_insert(r);
            }
            Ok(None) => {}
            Err(r) if r.rule == FIND_DELETE || r.rule == UNRESOLVED => {
                deferred.get_or_insert((what, r));
            }
            Err(r) => return Err(r),
        }
    }
    match deferred {
        Some((_, r)) => Err(r),
        None => Ok(ask),
    }
}

/// The rule of a `find` that deletes throughout a system tree.
const FIND_DELETE: &str = "find-delete";
/// The rule of a command name known only when it runs that would be destructive.
const UNRESOLVED: &str = "unresolved-command";

/// The home directory when the caller does not know it: a path no file has, which the
/// rules read as `~` (the home directory) wherever it leads.
const UNKNOWN_HOME: &str = "/\u{0}home";

struct Policy<'g> {
    guard: &'g Guard,
    /// The workspace (absolute), when the caller names one: recursive deletes outside it ask.
    workspace: Option<&'g str>,
}

/// A reason to ask, when there is one.
type Judged = Result<Option<Objection>, Objection>;

impl Policy<'_> {
    fn effect(&self, effect: Effect) -> Judged {
        match effect {
            Effect::Bound { what, why, limit } => Err(bound(limit, &what, &why)),
            Effect::ForkBomb { function, .. } => Err(Objection::new(
                "fork-bomb",
                format!(
                    "refused: the function `{function}` starts copies of itself in a pipe or in \
                     the background without end (a fork bomb), which would exhaust the \
                     machine's processes; write a bounded loop instead"
                ),
            )),
            Effect::Opaque { what, why } => Ok(Some(Objection::ask(
                "opaque",
                format!("in `{}`, {why}", abbreviate(&what, 80)),
            ))),
            Effect::Script {
                language,
                how,
                code,
                ..
            } => {
                if let Some(code) = &code {
                    self.operator_rules(code)?;
                }
                let shell = SHELLS.contains(&language.as_str());
                if !shell {
                    return Ok(code_as_data(&language, how, code.as_deref()));
                }
                Ok((how == Nesting::Pipe && code.is_none()).then(|| {
                    Objection::ask(
                        "pipe-to-shell",
                        "it pipes text known only when it runs (fetched or decoded) into a \
                         shell, so nobody can see what it will do"
                            .into(),
                    )
                }))
            }
            Effect::Program {
                argv, at, piped, ..
            } => self.program(&argv, &at, piped),
            Effect::Write {
                target,
                how,
                at,
                what,
            } => {
                let path = target
                    .literal
                    .as_deref()
                    .or(target.if_empty.as_deref())
                    .unwrap_or_default();
                let mut ask = None;
                for env in places(&at) {
                    write_target(&env.resolve(path), how == Written::Appended, &|| {
                        what.to_string()
                    })?;
                    let field = Field::lit(path);
                    if ask.is_none()
                        && let Some(p) = kernel_target(std::iter::once(&field), &env)
                    {
                        ask = Some(Objection::ask(
                            "kernel-state",
                            format!(
                                "`{what}` writes to {p}, which changes the kernel's state at once"
                            ),
                        ));
                    }
                }
                // A file a command prints when it runs (`> "$(…)"`).
                if ask.is_none()
                    && self.workspace.is_some()
                    && how == Written::Truncated
                    && target.literal.is_none()
                    && printed(&target.source)
                {
                    ask = Some(unknown_target_ask(&what, &target.source));
                }
                Ok(ask)
            }
            Effect::Network { .. } | Effect::Duplicate { .. } => Ok(None),
        }
    }

    /// One program, at every place it may run in.
    fn program(&self, argv: &[ShellWord], at: &Place, piped: bool) -> Judged {
        let fields: Vec<Field> = argv.iter().map(field).collect();
        self.operator_rules(&shown(&fields, usize::MAX))?;
        let Some(name) = fields[0].val().map(basename) else {
            return unresolved(&fields, at).map(|()| None);
        };
        // A glob command name walked as a program it can match: say so.
        let pattern = basename(&argv[0].source);
        let glob = (pattern != name && spec::is_glob_name(pattern)).then_some(pattern);
        let named = |r: Objection| match glob {
            Some(pattern) => Objection {
                message: format!(
                    "{} (the command name `{pattern}` is a pattern that can match `{name}`; \
                     write the name literally)",
                    r.message
                ),
                ..r
            },
            None => r,
        };
        let mut ask = None;
        for env in places(at) {
            builtin_rules(&fields, &env).map_err(named)?;
            if name == "find" {
                find(argv, &fields, &env).map_err(named)?;
            }
            if ask.is_none() {
                ask = risky_rules(&fields, &env, self.workspace, piped);
            }
        }
        // `source <(curl …)`, `. "$F"`: a script this shell reads, known only when it runs.
        if ask.is_none()
            && matches!(name, "source" | ".")
            && let Some(script) = fields.get(1).filter(|f| f.val().is_none())
        {
            ask = Some(Objection::ask(
                "opaque-script",
                format!(
                    "it runs the script `{}`, which exists or is named only when the command \
                     runs, so nobody can see what it will do",
                    abbreviate(&script.display, 80)
                ),
            ));
        }
        Ok(ask)
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

/// A word of the walk as the rules read it: unknown parts judged as empty.
fn field(w: &ShellWord) -> Field {
    Field {
        value: w.literal.clone(),
        display: w.source.clone(),
        if_empty: w.if_empty.clone().unwrap_or_default(),
    }
}

/// The variables the rules resolve paths with, one for each place a program may run in
/// (one with the working directory unknown when no place is known).
fn places(at: &Place) -> Vec<Env> {
    let home = at.home.as_deref().map(str::to_owned);
    let env = |cwd: Option<&String>| Env {
        cwd: cwd.cloned(),
        home: home.clone(),
        links: at.links.clone(),
        ..Env::default()
    };
    match at.cwds.is_empty() {
        true => vec![env(None)],
        false => at.cwds.iter().map(Some).map(env).collect(),
    }
}

/// A command name known only when it runs: refused when its arguments would be destructive
/// for one of the commands the rules know.
fn unresolved(args: &[Field], at: &Place) -> Result<(), Objection> {
    for candidate in ["rm", "chmod", "chown", "chgrp", "dd"] {
        let mut probe = args.to_vec();
        probe[0] = Field::lit(candidate);
        if places(at)
            .iter()
            .any(|env| builtin_rules(&probe, env).is_err())
        {
            return Err(Objection::new(
                UNRESOLVED,
                format!(
                    "refused: the command name `{}` cannot be known before it runs, and `{}` \
                     would be destructive if it is `{candidate}`; write the command name \
                     literally",
                    args[0].display,
                    shown(args, 160)
                ),
            ));
        }
    }
    Ok(())
}

/// `find START… -delete` with nothing filtering the walk deletes START recursively; a delete
/// (`-delete`, `-exec rm`) that no narrow name test limits deletes throughout it.
fn find(argv: &[ShellWord], fields: &[Field], env: &Env) -> Result<(), Objection> {
    let (starts, expr) = spec::find_parts(&argv[1..]);
    let (mut delete, mut deletes) = (false, false);
    // A name test with a pattern that is not "everything", and nothing that inverts or
    // widens the match.
    let (mut narrowed, mut widened) = (false, false);
    let mut k = 0;
    while let Some(w) = expr.get(k) {
        k += 1;
        match w.literal.as_deref().unwrap_or("?") {
            test @ ("-name" | "-iname" | "-path" | "-ipath" | "-wholename" | "-iwholename"
            | "-regex" | "-iregex" | "-lname" | "-ilname") => {
                let pattern = expr
                    .get(k)
                    .and_then(|w| w.literal.as_deref())
                    .unwrap_or("*");
                // A pattern that matches the files the host needs (`*.so*`) narrows nothing.
                let vital = match test {
                    "-name" => vital_pattern(pattern),
                    "-iname" => vital_pattern(&pattern.to_ascii_lowercase()),
                    _ => false,
                };
                narrowed |= !broad_pattern(pattern) && !vital;
                k += 1;
            }
            "!" | "-not" | "-o" | "-or" | "," => widened = true,
            "-exec" | "-execdir" | "-ok" | "-okdir" => {
                let program = expr.get(k).and_then(|w| w.literal.as_deref());
                deletes |=
                    program.is_some_and(|n| matches!(basename(n), "rm" | "unlink" | "shred"));
                while let Some(w) = expr.get(k) {
                    k += 1;
                    if matches!(w.literal.as_deref(), Some(";" | "+")) {
                        break;
                    }
                }
            }
            "-delete" => delete = true,
            _ => {}
        }
    }
    let start_fields = || starts.iter().map(field);
    if delete && spec::find_unfiltered(&argv[1..]).is_some() {
        let mut rm = vec![Field::lit("rm"), Field::lit("-r")];
        rm.extend(start_fields());
        builtin_rules(&rm, env).map_err(|r| Objection {
            message: r.message.replace(&shown(&rm, 160), &shown(fields, 160)),
            ..r
        })?;
    }
    if (delete || deletes) && (widened || !narrowed) {
        for s in start_fields() {
            if let Some(what) = danger(&env.resolve(s.judged()), true) {
                return Err(Objection::new(
                    FIND_DELETE,
                    format!(
                        "refused: `{}` would delete files throughout {what}; narrow it with \
                         -name PATTERN, or search a specific directory",
                        shown(fields, 160)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The refusal for a bound of the walk: past it the command is not judged in part.
fn bound(limit: Limit, what: &str, why: &str) -> Objection {
    let what = abbreviate(what, 80);
    match limit {
        Limit::Depth => Objection::new(
            "too-deep",
            format!(
                "refused: the command nests shells, eval, substitutions or arithmetic more than \
                 {} levels deep (or opens more of them than it closes), too deep to check \
                 (at `{what}`: {why}); flatten it",
                crate::bash::MAX_DEPTH
            ),
        ),
        Limit::Ifs => Objection::new(
            "unknown-ifs",
            format!("refused: in `{what}`, {why}; set IFS to literal text or quote the expansion"),
        ),
        Limit::Wrappers | Limit::Size => Objection::new(
            "too-complex",
            format!(
                "refused: `{what}` is more than the guard will examine: {why}; simplify it or \
                 put it in a script file"
            ),
        ),
    }
}
