//! ReadWrite: no deletion, no writes outside the workspace, as far as can be judged. Owns the
//! commands that delete, the wrappers that run another command, the writers and which of
//! their operands and options they write, and the walk through a script in order, following
//! where `cd` may have taken it.
//!
//! It fails closed: a command name, a destination or an option known only when it runs is
//! refused, and so is a script nested too deeply. It is a guard, not a sandbox (see `judge`),
//! never runs anything and never touches the filesystem.

// Shells (the guard's list) have their `-c SCRIPT` judged as a script; run on a file or stdin,
// they cannot be.
use crate::shell::parse::{self, RedirectKind, ShellWord};
use crate::shell::spec::{SHELLS, WRAPPERS, Wrapper};

use super::{
    Denied, Permission, Scope, harmless_device, inside, network_path, normalise, render,
    render_words, resolve,
};

/// Commands that delete or empty files, refused at `read-write` wherever they appear.
const DELETERS: &[(&str, &str)] = &[
    ("rm", "deletes files"),
    ("rmdir", "deletes directories"),
    ("unlink", "deletes files"),
    ("shred", "destroys files"),
    ("truncate", "empties files"),
    ("srm", "deletes files"),
    ("wipe", "destroys files"),
];

/// Deepest nesting of `sh -c`, `eval`, wrappers and `find -exec` followed.
const MAX_NESTING: usize = crate::shell::MAX_DEPTH;

/// Most working directories a script is tracked as possibly being in.
const MAX_CWDS: usize = 16;

/// Which operands of a [`Writer`] it writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dest {
    /// The last operand (the only one when there is one), unless a destination option names
    /// the target directory (`cp -t DIR`).
    Last,
    /// Every operand (`touch`, `mkdir`, `tee`; `mv` and `ln` too: moving away or linking to a
    /// file outside is a change outside).
    All,
    /// The second operand (`uniq IN OUT`).
    Second,
    /// Only what a destination option names (`sort -o`).
    Options,
    /// The working directory, unless a destination option names another (`wget`, `unzip`).
    Here,
}

/// A command that writes the files its operands or options name.
struct Writer {
    name: &'static str,
    /// Short options that take an argument.
    with_arg: &'static str,
    /// Long options that take an argument as the next word when not given `=`.
    long_with_arg: &'static [&'static str],
    /// Options (short, long) whose argument is written to.
    dest: (&'static str, &'static [&'static str]),
    operands: Dest,
    /// Options (short, long) that make it write into the working directory (`curl -O`).
    here: (&'static str, &'static [&'static str]),
    /// Options (short, long) that make every operand written to (`install -d`).
    all: (&'static str, &'static [&'static str]),
}

const WRITER: Writer = Writer {
    name: "",
    with_arg: "",
    long_with_arg: &[],
    dest: ("", &[]),
    operands: Dest::All,
    here: ("", &[]),
    all: ("", &[]),
};

const WRITERS: &[Writer] = &[
    Writer {
        name: "cp",
        with_arg: "St",
        long_with_arg: &["suffix", "target-directory"],
        dest: ("t", &["target-directory"]),
        operands: Dest::Last,
        ..WRITER
    },
    Writer {
        name: "install",
        with_arg: "gmoSt",
        long_with_arg: &[
            "group",
            "mode",
            "owner",
            "suffix",
            "target-directory",
            "strip-program",
        ],
        dest: ("t", &["target-directory"]),
        operands: Dest::Last,
        all: ("d", &["directory"]),
        ..WRITER
    },
    Writer {
        name: "mv",
        with_arg: "St",
        long_with_arg: &["suffix", "target-directory"],
        dest: ("t", &["target-directory"]),
        ..WRITER
    },
    Writer {
        name: "ln",
        with_arg: "St",
        long_with_arg: &["suffix", "target-directory"],
        dest: ("t", &["target-directory"]),
        ..WRITER
    },
    Writer {
        name: "tee",
        ..WRITER
    },
    Writer {
        name: "touch",
        with_arg: "drt",
        long_with_arg: &["date", "reference", "time"],
        ..WRITER
    },
    Writer {
        name: "mkdir",
        with_arg: "m",
        long_with_arg: &["mode"],
        ..WRITER
    },
    Writer {
        name: "sort",
        with_arg: "kotST",
        long_with_arg: &[
            "key",
            "output",
            "field-separator",
            "buffer-size",
            "temporary-directory",
            "files0-from",
            "compress-program",
            "random-source",
            "parallel",
            "batch-size",
        ],
        dest: ("o", &["output"]),
        operands: Dest::Options,
        ..WRITER
    },
    Writer {
        name: "curl",
        with_arg: "AbcdDeEFHKmoQrTuwxXyYz",
        long_with_arg: &[
            "output",
            "output-dir",
            "dump-header",
            "cookie-jar",
            "trace",
            "trace-ascii",
            "stderr",
            "libcurl",
            "etag-save",
            "hsts",
            "alt-svc",
            "header",
            "data",
            "request",
            "user",
            "user-agent",
            "referer",
            "cookie",
            "form",
            "upload-file",
            "write-out",
            "max-time",
            "proxy",
            "range",
            "config",
        ],
        dest: (
            "oDc",
            &[
                "output",
                "output-dir",
                "dump-header",
                "cookie-jar",
                "trace",
                "trace-ascii",
                "stderr",
                "libcurl",
                "etag-save",
                "hsts",
                "alt-svc",
            ],
        ),
        operands: Dest::Options,
        here: (
            "OJ",
            &["remote-name", "remote-name-all", "remote-header-name"],
        ),
        ..WRITER
    },
    Writer {
        name: "wget",
        with_arg: "OoaPeiBTtwUQlAIRDX",
        long_with_arg: &[
            "output-document",
            "output-file",
            "append-output",
            "directory-prefix",
        ],
        dest: (
            "OoaP",
            &[
                "output-document",
                "output-file",
                "append-output",
                "directory-prefix",
            ],
        ),
        operands: Dest::Here,
        ..WRITER
    },
    Writer {
        name: "unzip",
        with_arg: "dP",
        dest: ("d", &[]),
        operands: Dest::Here,
        ..WRITER
    },
    Writer {
        name: "uniq",
        with_arg: "fsw",
        long_with_arg: &["skip-fields", "skip-chars", "check-chars"],
        operands: Dest::Second,
        ..WRITER
    },
];

/// `git` subcommands that only read the repository.
const GIT_READS: &[&str] = &[
    "status",
    "log",
    "diff",
    "show",
    "grep",
    "blame",
    "ls-files",
    "ls-tree",
    "rev-parse",
    "rev-list",
    "describe",
    "shortlog",
    "cat-file",
    "version",
    "help",
];

/// `git clone` / `init` / `worktree` options that take an argument as the next word.
const GIT_CLONE_OPTIONS: (&str, &[&str]) = (
    "obucj",
    &[
        "origin",
        "branch",
        "upload-pack",
        "template",
        "reference",
        "reference-if-able",
        "separate-git-dir",
        "depth",
        "shallow-since",
        "shallow-exclude",
        "jobs",
        "filter",
        "config",
        "server-option",
        "bundle-uri",
        "object-format",
        "ref-format",
        "reason",
    ],
);

/// A command's arguments read the getopt way.
#[derive(Default)]
struct Scanned {
    /// Options as written (`-t`, `--target`), with their argument.
    options: Vec<(String, Option<ShellWord>)>,
    operands: Vec<ShellWord>,
    /// Where the wrapped command starts, for a wrapper.
    command: Option<usize>,
}

impl Scanned {
    /// Arguments of the options named (short letters, long names or their abbreviations).
    fn values<'s>(
        &'s self,
        (short, long): (&'s str, &'s [&'s str]),
    ) -> impl Iterator<Item = Option<&'s ShellWord>> + 's {
        self.options
            .iter()
            .filter(move |(name, _)| option_is(name, short, long))
            .map(|(_, value)| value.as_ref())
    }

    fn has(&self, short: &str, long: &[&str]) -> bool {
        self.options
            .iter()
            .any(|(name, _)| option_is(name, short, long))
    }
}

/// Whether `name` (`-x` or `--long`, possibly abbreviated) is one of these options.
fn option_is(name: &str, short: &str, long: &[&str]) -> bool {
    if let Some(l) = name.strip_prefix("--") {
        crate::shell::spec::long_option_is(l, long)
    } else {
        name.strip_prefix('-')
            .is_some_and(|c| !c.is_empty() && short.contains(c))
    }
}

/// Whether a word whose value is known only at run time may start with `-`.
fn maybe_option(w: &ShellWord) -> bool {
    w.literal.is_none() && w.source.starts_with(['$', '`', '-', '<', '>', '~'])
}

fn shell_word(text: &str) -> ShellWord {
    ShellWord {
        literal: Some(text.to_owned()),
        source: text.to_owned(),
    }
}

/// Reads `args` as options and operands. `operands` is how many operands come before a
/// wrapped command (`usize::MAX`: there is none); `assignments` skips `NAME=value` words.
fn scan(
    args: &[ShellWord],
    with_arg: &str,
    long_with_arg: &[&str],
    operands: usize,
    assignments: bool,
) -> Result<Scanned, String> {
    let mut out = Scanned::default();
    let mut i = 0;
    let mut options_end = false;
    while let Some(w) = args.get(i) {
        if out.operands.len() == operands && operands != usize::MAX {
            // The next operand is the wrapped command.
            if options_end || !w.literal.as_deref().is_some_and(|l| l.starts_with('-')) {
                if maybe_option(w) && !options_end {
                    return Err(unknown_option(w));
                }
                let assignment = w.literal.as_deref().is_some_and(is_assignment);
                if !(assignments && assignment) {
                    out.command = Some(i);
                    return Ok(out);
                }
                i += 1;
                continue;
            }
        }
        i += 1;
        let Some(lit) = w.literal.as_deref() else {
            if maybe_option(w) && !options_end {
                return Err(unknown_option(w));
            }
            out.operands.push(w.clone());
            continue;
        };
        if options_end || lit == "-" || !lit.starts_with('-') {
            out.operands.push(w.clone());
            continue;
        }
        if lit == "--" {
            options_end = true;
            continue;
        }
        if let Some(long) = lit.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(shell_word(v))),
                None if option_is(lit, "", long_with_arg) => {
                    let value = args.get(i).cloned();
                    i += 1;
                    (long, value)
                }
                None => (long, None),
            };
            out.options.push((format!("--{name}"), value));
            continue;
        }
        for (k, c) in lit.char_indices().skip(1) {
            if with_arg.contains(c) {
                let rest = &lit[k + c.len_utf8()..];
                let value = if rest.is_empty() {
                    i += 1;
                    args.get(i - 1).cloned()
                } else {
                    Some(shell_word(rest))
                };
                out.options.push((format!("-{c}"), value));
                break;
            }
            out.options.push((format!("-{c}"), None));
        }
    }
    Ok(out)
}

fn unknown_option(w: &ShellWord) -> String {
    format!(
        "`{}` is known only when it runs and could be an option, so it cannot be judged \
         (put `--` before the operands)",
        w.source
    )
}

fn unknown_argument(w: &ShellWord) -> String {
    format!(
        "`{}` is known only when it runs and could be a refused option",
        w.source
    )
}

fn is_assignment(word: &str) -> bool {
    crate::shell::spec::is_assignment(word)
}

/// Whether a literal path would be expanded by the shell into other paths (a glob, or a
/// brace list): it cannot be judged as written.
fn is_pattern(path: &str) -> bool {
    path.contains(['*', '?', '['])
        || (path.contains('{') && (path.contains(',') || path.contains("..")))
}

/// Whether a script mentions a variable that changes what `~` or a relative `cd` means.
fn mentions(words: &[&str], name: &str) -> bool {
    words.iter().any(|w| w.contains(name))
}

/// The read-write judge's state while it walks a script in order.
pub(super) struct ReadWrite<'a> {
    workspace: String,
    /// Where the script may be by now; empty when that cannot be known.
    cwds: Vec<String>,
    /// The home directory for `~`, unless unknown or reassigned by the script.
    home: Option<&'a str>,
    /// Whether a relative `cd` goes somewhere unknown (the script sets `CDPATH` or `PWD`).
    cd_unknown: bool,
}

type Judged = Result<(), Denied>;

impl<'a> ReadWrite<'a> {
    pub(super) fn new(scope: &Scope<'a>, script: &str) -> ReadWrite<'a> {
        let mut judge = ReadWrite {
            workspace: normalise("/", scope.workspace),
            cwds: vec![normalise("/", scope.cwd)],
            home: scope.home,
            cd_unknown: false,
        };
        judge.notice(&[script]);
        judge
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

    fn deny(&self, what: &str, why: impl Into<String>) -> Denied {
        Denied::new(Permission::ReadWrite, what, why)
    }

    pub(super) fn script(&mut self, text: &str, depth: usize) -> Judged {
        if depth > MAX_NESTING {
            return Err(self.deny(text, "it nests scripts too deeply to be judged"));
        }
        let commands = parse::simple_commands(text)
            .map_err(|e| self.deny("the script", format!("it cannot be judged: {e}")))?;
        let words: Vec<&str> = commands
            .iter()
            .flat_map(|c| c.assignments.iter().chain(&c.argv))
            .filter_map(|w| w.literal.as_deref())
            .collect();
        self.notice(&words);
        for c in &commands {
            let what = render(c);
            for r in &c.redirects {
                if r.kind != RedirectKind::HereString
                    && r.kind != RedirectKind::HereDocument
                    && (r.target.literal.as_deref().is_some_and(network_path)
                        || network_path(&r.target.source))
                {
                    return Err(self.deny(
                        &what,
                        format!("`{}` opens a network connection", r.target.source),
                    ));
                }
                if matches!(r.kind, RedirectKind::Output | RedirectKind::Append) {
                    self.write(&r.target, &what)?;
                }
            }
            if !c.argv.is_empty() {
                self.command(&c.argv, &what, depth)?;
            }
        }
        Ok(())
    }

    /// Judges a write to the file `target` names.
    fn write(&self, target: &ShellWord, what: &str) -> Judged {
        let Some(path) = target.literal.as_deref() else {
            return Err(self.deny(
                what,
                format!("it writes to `{}`, known only when it runs", target.source),
            ));
        };
        if is_pattern(path) {
            return Err(self.deny(
                what,
                format!("it writes to `{path}`, a pattern that cannot be judged"),
            ));
        }
        let Some(all) = resolve(path, &self.cwds, self.home) else {
            let why = if path.starts_with('~') {
                format!("it writes to `{path}`, and where `~` is cannot be known")
            } else {
                format!("it writes to `{path}`, and the working directory is not known here")
            };
            return Err(self.deny(what, why));
        };
        match all
            .iter()
            .find(|p| !inside(&self.workspace, p) && !harmless_device(p))
        {
            Some(outside) => Err(self.deny(
                what,
                format!(
                    "it writes outside the workspace {}, to {outside}",
                    self.workspace
                ),
            )),
            None => Ok(()),
        }
    }

    fn command(&mut self, words: &[ShellWord], what: &str, depth: usize) -> Judged {
        if depth > MAX_NESTING {
            return Err(self.deny(what, "it nests commands too deeply to be judged"));
        }
        let Some(first) = words.first() else {
            return Ok(());
        };
        let Some(name) = first.literal.as_deref() else {
            return Err(self.deny(
                what,
                "its command name is known only when it runs, so it cannot be judged",
            ));
        };
        let base = crate::shell::basename(name);
        let args = &words[1..];
        if let Some((_, why)) = DELETERS.iter().find(|(n, _)| *n == base) {
            return Err(self.deny(what, *why));
        }
        match base {
            "cd" => {
                self.cd(args);
                Ok(())
            }
            "pushd" | "popd" => {
                self.cwds.clear();
                Ok(())
            }
            "find" => self.find(args, what, depth),
            "git" => self.git(args, what),
            "xargs" => self.xargs(args, what, depth),
            "eval" => self.joined(args, what, depth),
            "watch" => self.watch(args, what, depth),
            "alias" => self.alias(args, what, depth),
            "trap" => self.trap(args, what, depth),
            "dd" => self.dd(args, what),
            "chmod" | "chown" | "chgrp" => self.change_mode(base, args, what),
            "sed" => self.sed(args, what),
            "tar" => self.tar(args, what, depth),
            "rsync" => self.rsync(args, what, depth),
            _ if SHELLS.contains(&base) => self.shell(args, what, depth),
            _ => {
                if let Some(w) = WRAPPERS.iter().find(|w| w.name == base) {
                    self.wrapper(w, args, what, depth)
                } else if let Some(w) = WRITERS.iter().find(|w| w.name == base) {
                    self.writer(w, args, what)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// `scan`, with its refusal turned into a [`Denied`].
    fn scan(
        &self,
        args: &[ShellWord],
        what: &str,
        (with_arg, long_with_arg): (&str, &[&str]),
        operands: usize,
        assignments: bool,
    ) -> Result<Scanned, Denied> {
        scan(args, with_arg, long_with_arg, operands, assignments)
            .map_err(|why| self.deny(what, why))
    }

    fn write_value(&self, value: Option<&ShellWord>, what: &str) -> Judged {
        match value {
            Some(w) => self.write(w, what),
            None => Ok(()),
        }
    }

    /// A literal script (`sh -c`, `eval`, `su -c`, an alias or trap), judged as one.
    fn nested(&mut self, script: Option<&ShellWord>, what: &str, depth: usize) -> Judged {
        match script.map(|w| w.literal.as_deref()) {
            None => Ok(()),
            Some(Some(text)) => self.script(text, depth + 1),
            Some(None) => Err(self.deny(
                what,
                "it runs a script known only when it runs, so it cannot be judged",
            )),
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
            None => self.home.map(str::to_owned),
            Some(w) => w.literal.clone(),
        };
        let new = match target.as_deref() {
            None | Some("-") => None,
            Some(t) if is_pattern(t) => None,
            Some(t) if self.cd_unknown && !t.starts_with('/') => None,
            Some(t) => resolve(t, &self.cwds, self.home),
        };
        match new {
            Some(places) => {
                for p in places {
                    if !self.cwds.contains(&p) {
                        self.cwds.push(p);
                    }
                }
                if self.cwds.len() > MAX_CWDS {
                    self.cwds.clear();
                }
            }
            None => self.cwds.clear(),
        }
    }

    /// `find`: no `-delete`; `-exec` and friends judged as commands; `-fprint` files judged
    /// as writes. Every argument must be literal: `$X` could be `-delete`.
    fn find(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        let mut i = 0;
        while let Some(w) = args.get(i) {
            i += 1;
            let Some(arg) = w.literal.as_deref() else {
                return Err(self.deny(what, unknown_argument(w)));
            };
            match arg {
                "-delete" => return Err(self.deny(what, "`-delete` deletes files")),
                "-exec" | "-execdir" | "-ok" | "-okdir" => {
                    let end = args[i..]
                        .iter()
                        .position(|w| matches!(w.literal.as_deref(), Some(";" | "+")))
                        .map_or(args.len(), |k| i + k);
                    let inner: Vec<ShellWord> = args[i..end]
                        .iter()
                        .map(|w| match &w.literal {
                            Some(l) if l.contains("{}") => ShellWord {
                                literal: None,
                                source: w.source.clone(),
                            },
                            _ => w.clone(),
                        })
                        .collect();
                    self.command(&inner, what, depth + 1)?;
                    i = end + 1;
                }
                "-fprint" | "-fprint0" | "-fprintf" | "-fls" => {
                    self.write_value(args.get(i), what)?;
                    i += 1;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `git clean` and `git rm` delete; an alias given on the command line can run anything;
    /// `clone`, `init` and `worktree add` write where their operands say; any subcommand but
    /// those that only read writes into the repository `-C`, `--git-dir` or `--work-tree`
    /// names.
    fn git(&self, args: &[ShellWord], what: &str) -> Judged {
        const WITH_ARG: &[&str] = &[
            "-C",
            "-c",
            "--git-dir",
            "--work-tree",
            "--namespace",
            "--config-env",
            "--super-prefix",
            "--attr-source",
            "--list-cmds",
        ];
        let mut i = 0;
        let mut here = self.cwds.clone();
        let mut repositories: Vec<ShellWord> = Vec::new();
        while let Some(w) = args.get(i) {
            let Some(arg) = w.literal.as_deref() else {
                return Err(self.deny(what, unknown_argument(w)));
            };
            if !arg.starts_with('-') {
                break;
            }
            i += 1;
            let value = || match arg.split_once('=') {
                Some((_, v)) => Some(shell_word(v)),
                None => args.get(i).cloned(),
            };
            let config = match arg {
                "-c" => args.get(i).and_then(|w| w.literal.clone()),
                _ => arg.strip_prefix("-c").map(str::to_owned),
            };
            if config.is_some_and(|c| c.to_ascii_lowercase().starts_with("alias.")) {
                return Err(self.deny(what, "a git alias can run any command"));
            }
            if arg == "-C" {
                let Some(dir) = args.get(i).and_then(|w| w.literal.as_deref()) else {
                    return Err(self.deny(what, "its `-C` directory is known only when it runs"));
                };
                here = resolve(dir, &here, self.home).unwrap_or_default();
            } else if ["--git-dir", "--work-tree"]
                .iter()
                .any(|n| arg.split('=').next() == Some(n))
            {
                repositories.push(value().unwrap_or_else(|| shell_word("")));
            }
            if WITH_ARG.contains(&arg) {
                i += 1;
            }
        }
        let Some(sub) = args.get(i) else {
            return Ok(());
        };
        let rest = &args[i + 1..];
        let there = self.elsewhere(&here);
        let Some(sub) = sub.literal.as_deref() else {
            return Err(self.deny(what, "its git subcommand is known only when it runs"));
        };
        match sub {
            "clean" => return Err(self.deny(what, "`git clean` deletes untracked files")),
            "rm" => return Err(self.deny(what, "`git rm` deletes files")),
            _ if GIT_READS.contains(&sub) => return Ok(()),
            _ => {}
        }
        for repository in &repositories {
            there.write(repository, what)?;
        }
        if here != self.cwds {
            there.write(&shell_word("."), what)?;
        }
        let s = there.scan(rest, what, GIT_CLONE_OPTIONS, usize::MAX, false)?;
        for dir in s.values(("", &["separate-git-dir"])) {
            there.write_value(dir, what)?;
        }
        let ops = &s.operands;
        match (sub, ops.as_slice()) {
            ("clone", [_]) | ("init", []) => there.write(&shell_word("."), what),
            ("clone", [.., dest]) | ("init", [dest, ..]) => there.write(dest, what),
            ("worktree", [add, path, ..]) if add.literal.as_deref() == Some("add") => {
                there.write(path, what)
            }
            _ => Ok(()),
        }
    }

    /// The same judge, working in `cwds` (`git -C`, `tar -C`).
    fn elsewhere(&self, cwds: &[String]) -> ReadWrite<'a> {
        ReadWrite {
            workspace: self.workspace.clone(),
            cwds: cwds.to_vec(),
            home: self.home,
            cd_unknown: self.cd_unknown,
        }
    }

    /// `xargs CMD ARGS`: `CMD ARGS` plus words from the input, which are unknown.
    fn xargs(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        let mut i = 0;
        let mut replace: Option<String> = None;
        while let Some(w) = args.get(i) {
            let Some(arg) = w.literal.as_deref() else {
                if maybe_option(w) {
                    return Err(self.deny(what, unknown_option(w)));
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
            return Ok(()); // `echo`
        }
        let input = |source: &str| ShellWord {
            literal: None,
            source: source.to_owned(),
        };
        match replace.filter(|r| !r.is_empty()) {
            Some(r) => {
                for w in inner.iter_mut().skip(1) {
                    if w.literal.as_deref().is_some_and(|l| l.contains(r.as_str())) {
                        *w = input(&w.source);
                    }
                }
            }
            None => inner.push(input("(words read from the input)")),
        }
        self.command(&inner, what, depth + 1)
    }

    /// `eval ARGS`: the arguments joined, judged as a script.
    fn joined(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        if args.is_empty() {
            return Ok(());
        }
        let text: Option<Vec<&str>> = args.iter().map(|w| w.literal.as_deref()).collect();
        let script = match text {
            Some(parts) => shell_word(&parts.join(" ")),
            None => ShellWord {
                literal: None,
                source: render_words(args),
            },
        };
        self.nested(Some(&script), what, depth)
    }

    /// `watch [-n SECS] COMMAND…`: the command words joined and run by `sh -c`.
    fn watch(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        let scanned = self.scan(args, what, ("n", &["interval"]), usize::MAX, false)?;
        if scanned.has("x", &["exec"]) {
            return self.command(&scanned.operands, what, depth + 1);
        }
        self.joined(&scanned.operands, what, depth)
    }

    /// `alias NAME=VALUE`: the value runs wherever the name is used.
    fn alias(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        for w in args {
            match w.literal.as_deref() {
                Some(l) => {
                    if let Some((_, value)) = l.split_once('=') {
                        self.script(value, depth + 1)?;
                    }
                }
                None => self.nested(Some(w), what, depth)?,
            }
        }
        Ok(())
    }

    /// `trap ACTION SIGNALS`: the action runs later.
    fn trap(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        let scanned = self.scan(args, what, ("", &[]), usize::MAX, false)?;
        self.nested(scanned.operands.first(), what, depth)
    }

    /// `dd of=FILE`.
    fn dd(&self, args: &[ShellWord], what: &str) -> Judged {
        for w in args {
            let Some(arg) = w.literal.as_deref() else {
                return Err(self.deny(what, unknown_argument(w)));
            };
            if let Some(file) = arg.strip_prefix("of=") {
                self.write(&shell_word(file), what)?;
            }
        }
        Ok(())
    }

    /// `chmod MODE FILES`, `chown OWNER FILES`, `chgrp GROUP FILES`: the files.
    fn change_mode(&self, name: &str, args: &[ShellWord], what: &str) -> Judged {
        let mut mode_given = false;
        let mut files: Vec<&ShellWord> = Vec::new();
        let mut options_end = false;
        for w in args {
            match w.literal.as_deref() {
                None if maybe_option(w) && !options_end => {
                    return Err(self.deny(what, unknown_option(w)));
                }
                Some("--") if !options_end => options_end = true,
                Some(l) if !options_end && l.starts_with("--reference") => mode_given = true,
                Some(l) if !options_end && l.starts_with('-') && l.len() > 1 => {
                    // `chmod -w FILE`: a mode that looks like an option.
                    if name == "chmod" && l[1..].chars().all(|c| "rwxXst".contains(c)) {
                        mode_given = true;
                    }
                }
                _ if !mode_given => mode_given = true,
                _ => files.push(w),
            }
        }
        files.into_iter().try_for_each(|f| self.write(f, what))
    }

    /// `sed -i`: the files edited in place.
    fn sed(&self, args: &[ShellWord], what: &str) -> Judged {
        let scanned = self.scan(
            args,
            what,
            ("efl", &["expression", "file", "line-length"]),
            usize::MAX,
            false,
        )?;
        // `-i` takes its suffix attached (`-i.bak`), so a cluster like `-ie` holds no `-e`;
        // reading it as `-i -e` still leaves the same operands as files.
        let in_place = scanned.has("i", &["in-place"]);
        if !in_place {
            return Ok(());
        }
        let script_given = scanned.has("ef", &["expression", "file"]);
        let skip = usize::from(!script_given);
        scanned.operands[skip.min(scanned.operands.len())..]
            .iter()
            .try_for_each(|f| self.write(f, what))
    }

    /// `tar`: creating writes the archive; extracting writes into `-C DIR` (or here);
    /// `--remove-files` deletes.
    fn tar(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        const WITH_ARG: &str = "bfgCFHIKLNTVX";
        const LONG_WITH_ARG: &[&str] = &[
            "file",
            "directory",
            "listed-incremental",
            "files-from",
            "exclude-from",
            "exclude",
            "transform",
            "xform",
            "use-compress-program",
            "info-script",
            "new-volume-script",
            "to-command",
            "checkpoint-action",
            "format",
            "owner",
            "group",
            "mode",
            "mtime",
            "label",
            "newer",
            "after-date",
            "starting-file",
            "blocking-factor",
            "record-size",
            "tape-length",
            "suffix",
        ];
        // Old style: `tar xzf a.tar` is `tar -x -z -f a.tar`.
        let mut words: Vec<ShellWord> = args.to_vec();
        if let Some(first) = args.first().and_then(|w| w.literal.as_deref())
            && !first.starts_with('-')
            && !first.is_empty()
        {
            let mut expanded: Vec<ShellWord> = Vec::new();
            let mut rest = args[1..].iter();
            for c in first.chars() {
                expanded.push(shell_word(&format!("-{c}")));
                if WITH_ARG.contains(c)
                    && let Some(value) = rest.next()
                {
                    expanded.push(value.clone());
                }
            }
            expanded.extend(rest.cloned());
            words = expanded;
        }
        let s = self.scan(&words, what, (WITH_ARG, LONG_WITH_ARG), usize::MAX, false)?;
        if s.has("", &["remove-files"]) {
            return Err(self.deny(what, "`--remove-files` deletes files"));
        }
        let programs = (
            "FI",
            &[
                "to-command",
                "use-compress-program",
                "info-script",
                "new-volume-script",
            ][..],
        );
        for program in s.values(programs) {
            self.nested(program, what, depth)?;
        }
        for action in s.values(("", &["checkpoint-action"])) {
            let command = action.and_then(|a| a.literal.as_deref()?.strip_prefix("exec="));
            if let Some(command) = command {
                self.script(command, depth + 1)?;
            }
        }
        let creates = s.has(
            "cruA",
            &[
                "create",
                "append",
                "update",
                "catenate",
                "concatenate",
                "delete",
            ],
        );
        let extracts = s.has("x", &["extract", "get"]);
        if creates {
            for file in s.values(("fg", &["file", "listed-incremental"])) {
                if file.and_then(|f| f.literal.as_deref()) != Some("-") {
                    self.write_value(file, what)?;
                }
            }
        }
        if extracts {
            if s.has("P", &["absolute-names"]) {
                return Err(self.deny(what, "it extracts absolute paths, which cannot be judged"));
            }
            let mut dirs = self.cwds.clone();
            for dir in s.values(("C", &["directory"])) {
                let Some(d) = dir.and_then(|d| d.literal.as_deref()) else {
                    return Err(
                        self.deny(what, "it extracts into a directory known only when it runs")
                    );
                };
                dirs = resolve(d, &dirs, self.home).unwrap_or_default();
            }
            self.elsewhere(&dirs).write(&shell_word("."), what)?;
        }
        Ok(())
    }

    /// `rsync`: `--delete…` and `--remove-source-files` delete; the destination is written.
    fn rsync(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        let s = self.scan(
            args,
            what,
            (
                "eBfTM",
                &["rsh", "filter", "exclude", "include", "rsync-path"],
            ),
            usize::MAX,
            false,
        )?;
        if s.options
            .iter()
            .any(|(name, _)| name.starts_with("--del") || name.starts_with("--remove-s"))
        {
            return Err(self.deny(what, "it deletes files"));
        }
        for shell in s.values(("e", &["rsh"])) {
            self.nested(shell, what, depth)?;
        }
        if s.operands.len() < 2 {
            return Ok(());
        }
        let dest = &s.operands[s.operands.len() - 1];
        if let Some(d) = dest.literal.as_deref()
            && (d.starts_with("rsync://")
                || d.split_once(':')
                    .is_some_and(|(host, _)| !host.contains('/')))
        {
            return Err(self.deny(what, "it writes to another host"));
        }
        self.write(dest, what)
    }

    /// `sh -c SCRIPT`: the script is judged; a script file or stdin cannot be.
    fn shell(&mut self, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        let mut i = 0;
        let mut c_flag = false;
        while let Some(w) = args.get(i) {
            i += 1;
            let Some(arg) = w.literal.as_deref() else {
                if maybe_option(w) && !c_flag {
                    return Err(self.deny(what, unknown_option(w)));
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
            return self.nested(args.get(i), what, depth);
        }
        Ok(())
    }

    /// A wrapper: its own writes and scripts, then the command it runs.
    fn wrapper(&mut self, w: &Wrapper, args: &[ShellWord], what: &str, depth: usize) -> Judged {
        let s = self.scan(
            args,
            what,
            (w.with_arg, w.long_with_arg),
            w.operands,
            w.assignments,
        )?;
        for file in s.values(w.dest) {
            self.write_value(file, what)?;
        }
        for script in s.values(w.script) {
            self.nested(script, what, depth)?;
        }
        if s.has(w.no_command, &[]) {
            return Ok(());
        }
        let Some(start) = s.command else {
            return Ok(());
        };
        // `env -C DIR`, `sudo -D DIR`: the command runs there; `chroot`: somewhere unknown.
        let saved = self.cwds.clone();
        let chroot = w.elsewhere || s.has(w.chroot.0, w.chroot.1);
        if chroot {
            self.cwds.clear();
        }
        for dir in s.values(w.chdir).filter(|_| !chroot) {
            let dir = dir.and_then(|d| d.literal.as_deref());
            self.cwds = dir
                .and_then(|d| resolve(d, &self.cwds, self.home))
                .unwrap_or_default();
        }
        let judged = self.command(&args[start..], what, depth + 1);
        self.cwds = saved;
        judged
    }

    /// A writer: the operands and options it writes.
    fn writer(&self, w: &Writer, args: &[ShellWord], what: &str) -> Judged {
        let s = self.scan(args, what, (w.with_arg, w.long_with_arg), usize::MAX, false)?;
        let mut from_options = false;
        for file in s.values(w.dest) {
            from_options = true;
            self.write_value(file, what)?;
        }
        let ops = &s.operands;
        let written: &[ShellWord] = match w.operands {
            _ if s.has(w.all.0, w.all.1) => ops,
            Dest::All => ops,
            Dest::Last if from_options => &[],
            Dest::Last => &ops[ops.len().saturating_sub(1)..],
            Dest::Second => ops.get(1..2).unwrap_or_default(),
            Dest::Options | Dest::Here => &[],
        };
        let here = (w.operands == Dest::Here && !from_options) || s.has(w.here.0, w.here.1);
        if here {
            self.write(&shell_word("."), what)?;
        }
        written.iter().try_for_each(|f| self.write(f, what))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Permission;
    use super::super::testing::{allowed, refused};

    /// Wrappers and spellings the judge once missed while the guard knew them: both read one
    /// table now.
    #[test]
    fn every_wrapper_in_the_command_table_is_seen_through() {
        refused(
            Permission::ReadWrite,
            &[
                "nsenter -t 1 -m rm x",
                "nsenter --target 1 --mount touch x",
                "systemd-run rm x",
                "systemd-run --unit job touch x",
                "toybox rm x",
                "unbuffer rm x",
                "script -c 'rm x' /dev/null",
                "unshare -m rm x",
                "env X+=1 rm x",
                "sudo X+=1 rm x",
                "sudo -c class rm x",
            ],
        );
        allowed(
            Permission::ReadWrite,
            &["toybox ls", "unbuffer make", "script -c 'ls' /dev/null"],
        );
    }

    #[test]
    fn read_write_allows_edits_inside_the_workspace() {
        allowed(
            Permission::ReadWrite,
            &[
                "echo hi > notes.txt",
                "echo hi >> ./notes.txt",
                "mkdir -p src/a && cp a src/a/",
                "cp -r a b && mv b c",
                "touch x; tee y < x; ln -s x z",
                "cd src && echo x > top.txt",
                "cd /srv/ws/src; touch a",
                "echo x > /srv/ws/a/../b",
                "ls > /dev/null 2>&1; echo x > /dev/stderr; echo y >/dev/fd/3",
                "echo x > ../../dev/null",
                "cargo build && cargo test 2>&1 | tail",
                "git add -A && git commit -m x && git push",
                "git -C sub status",
                "sed -i s/a/b/ f.txt",
                "sed -i.bak -e s/a/b/ -e s/c/d/ f.txt g.txt",
                "sed -e s/a/b/ /etc/x > out.txt",
                "watch -n 5 ls",
                "rsync -e 'ssh -p 2222' host:a b/",
                "sed -n 1p /etc/passwd",
                "sort -o out.txt in.txt",
                "uniq in out",
                "tar -xzf /tmp/a.tgz",
                "tar -xf a.tar -C sub",
                "tar czf out.tgz src",
                "tar -cf - src | gzip > a.tgz",
                "rsync -a src/ backup/",
                "dd if=/dev/zero of=img bs=1M count=1",
                "chmod +x run.sh; chmod -w a; chown me f",
                "find . -name '*.o' -exec ls -l {} +",
                "find /etc -name x",
                "xargs grep foo",
                "sudo -u bob make",
                "env X=1 touch x",
                "env -C sub touch x",
                "timeout 5 cp a b",
                "nice -n 5 mkdir d",
                "sh -c 'echo hi > x'",
                "bash -lc 'cd src && touch y'",
                "bash script.sh",
                "python3 -c 'print(1)'",
                "eval 'touch x'",
                "time make",
                "echo ${X:=1} $((1+2))",
                "for f in a b; do cp -- \"$f\" ./out/; done",
                "cp src/$f ./out/",
                "cat x | sh",
                "install -m 755 bin dist/bin",
                "curl -s https://example.com",
                "curl -sSL -o out.tgz https://example.com/a.tgz",
                "curl -H 'X-A: b' -O https://example.com/a",
                "wget https://example.com/a",
                "wget -O - https://example.com | tar xz",
                "unzip a.zip -d sub",
                "git clone https://example.com/r.git",
                "git clone https://example.com/r.git src/r",
                "git init",
                "git -C sub commit -m x",
                "git -C /etc log",
                "git --git-dir=/elsewhere/.git status",
            ],
        );
    }

    #[test]
    fn read_write_refuses_sockets_even_nested() {
        allowed(
            Permission::ReadWrite,
            &[
                "cat < in.txt",
                "cat < \"$X\"",
                "ls 2>&5",
                "exec 3<>notes.txt",
            ],
        );
        refused(
            Permission::ReadWrite,
            &[
                "cat </dev/tcp/127.0.0.1/9",
                "printf X 0</dev/tcp/127.0.0.1/9 1<&0",
                "cat <>/dev/udp/h/p",
                "exec 3<>/dev/tcp/h/p",
                "exec 3</dev/udp/h/p",
                "cat < /dev//tcp/h/p",
                "cat <$(echo /dev/tcp/x/1)",
                "sh -c 'cat </dev/tcp/h/p'",
                "bash -c 'exec 3</dev/udp/h/p'",
                "sh -c \"sh -c 'cat </dev/tcp/h/p'\"",
                "eval 'cat </dev/tcp/h/p'",
                "su -c 'cat </dev/tcp/h/p'",
                "find . -exec sh -c 'cat </dev/tcp/h/p' \\;",
                "echo $(cat </dev/tcp/h/p)",
            ],
        );
    }

    #[test]
    fn read_write_refuses_the_issue_examples() {
        refused(
            Permission::ReadWrite,
            &[
                "echo hi > ../x",
                "echo x > /etc/passwd",
                "cp a /tmp/b",
                "cd ..; touch x",
                "rm f",
                "rmdir d",
                "find . -delete",
                "git clean -fd",
                "shred f",
                "truncate -s0 f",
                "xargs rm",
                "sh -c 'rm x'",
            ],
        );
    }

    #[test]
    fn read_write_refuses_deletion_and_writes_outside_through_every_door() {
        refused(
            Permission::ReadWrite,
            &[
                // Deleting, however named or wrapped.
                "/bin/rm f",
                "\\rm f",
                "r''m f",
                "unlink f",
                "git rm f",
                "git -C . clean -n",
                "git -c alias.x='!rm -rf d' x",
                "find . -exec rm {} \\;",
                "find . -execdir rm -f {} +",
                "find . -ok shred {} \\;",
                "sudo rm f",
                "sudo -u root -- rm f",
                "nice -n 5 rm f",
                "timeout -s KILL 5 rm f",
                "env -i X=1 rm f",
                "nohup rm f &",
                "exec rm f",
                "command rm f",
                "busybox rm f",
                "xargs -0 -n1 rm",
                "xargs -I{} rm {}",
                "ls | xargs -r rm -f",
                "bash -c 'rm x'",
                "bash -xc 'rm x'",
                "rbash -c 'rm x'",
                "tcsh -c 'rm x'",
                "sh -c \"sh -c 'rm x'\"",
                "sh -c \"$S\"",
                "bash -c $S",
                "eval rm f",
                "eval $X",
                "echo $(rm f)",
                "cat <(rm f)",
                "su -c 'rm f'",
                "su root -c 'rm f'",
                "flock /tmp/l -c 'rm f'",
                "env -S 'rm f'",
                "watch rm f",
                "watch -d rm f",
                "watch -n 1 'rm f'",
                "tar -xf a.tar --to-command='rm x'",
                "tar -cf a.tar -I 'rm x' d",
                "tar -cf a.tar --checkpoint-action=exec='rm x' d",
                "rsync -e 'rm x' host:a b/",
                "alias ls='rm -rf d'",
                "trap 'rm f' EXIT",
                "rsync -a --delete src/ dst/",
                "rsync --remove-source-files a b/",
                "tar --remove-files -cf a.tar d",
                "$CMD f",
                "\"$(echo rm)\" f",
                // Writing outside.
                "echo x >> /etc/hosts",
                "echo x &> /tmp/y",
                "echo x >& /tmp/y",
                "cat 1<>/etc/x",
                "echo x > $F",
                "echo x > ~/x",
                "cp a ~/x",
                "echo x > ~bob/x",
                "echo x > /srv/wsx",
                "echo x > /dev/tty",
                "echo x > /dev/fd/",
                "echo x > /proc/self/fd/1",
                "echo x > /srv/ws/../x",
                "echo x > {a,/etc/x}",
                "echo x > /srv/ws/*",
                "cd /tmp && touch x",
                "cd $D; touch x",
                "cd -; touch x",
                "cd; touch x",
                "(cd sub); touch ../x",
                // A `cd` may fail, so the old place stays possible: this is refused too.
                "cd src && echo x > ../top.txt",
                "cd sub || true; touch ../x",
                "cd src; cd ../..; touch x",
                "pushd /tmp; touch x",
                "CDPATH=/tmp cd src; touch x",
                "HOME=/etc; echo x > ~/passwd",
                "export HOME=/tmp; cp a ~/",
                "cp a b /tmp",
                "cp -t /tmp a",
                "cp --target-directory=/tmp a",
                "cp --target=/tmp a",
                "cp -vt/tmp a",
                "cp $X a b",
                "for f in a b; do cp $f ./out/; done",
                "mv /etc/x here",
                "mv a ../b",
                "install a /usr/local/bin/a",
                "install -d /tmp/a b",
                "ln -s /etc/passwd p",
                "tee /tmp/x",
                "tee -a a /tmp/x",
                "touch /tmp/x",
                "mkdir -p /tmp/x",
                "dd if=a of=/dev/sda",
                "dd $ARGS",
                "chmod 777 /etc/x",
                "chmod -R -w /tmp",
                "chown me:me /etc/x",
                "chgrp g ../x",
                "sed -i s/a/b/ /etc/x",
                "sed -i.bak -e s/a/b/ ../x",
                "sed --in-place s/a/b/ /etc/x",
                "sed -ni p /etc/x",
                "sort -o /tmp/x f",
                "sort -uo/tmp/x f",
                "uniq a /tmp/b",
                "tar -xf a.tar -C /tmp",
                "tar xf a.tar -C /",
                "tar -C sub -C ../.. -xf a.tar",
                "tar -xPf a.tar",
                "tar -czf /tmp/a.tgz src",
                "tar cf /tmp/a.tar src",
                "cd /tmp; tar -xf a.tar",
                "rsync -a src/ /tmp/dst/",
                "rsync -a src/ host:dst/",
                "curl -o /tmp/x https://example.com",
                "curl --output /tmp/x https://example.com",
                "curl -so/tmp/x https://example.com",
                "curl -c /tmp/jar https://example.com",
                "cd /tmp; curl -O https://example.com/a",
                "wget -O /tmp/x https://example.com",
                "wget -P /tmp https://example.com",
                "cd /tmp && wget https://example.com",
                "unzip a.zip -d /tmp",
                "git clone https://example.com/r.git /tmp/r",
                "git -C /tmp clone https://example.com/r.git",
                "git init /tmp/r",
                "git worktree add /tmp/w",
                "git -C /etc commit -m x",
                "git -C sub -C ../.. commit -m x",
                "git --git-dir=/tmp/x/.git commit -m x",
                "git --work-tree /tmp add .",
                "find . -fprint /tmp/x",
                "find . -exec cp {} /tmp \\;",
                "find . $X",
                "xargs cp -t /tmp",
                "xargs cp a",
                "sudo tee /etc/x",
                "sudo -D /tmp touch x",
                "sudo -D $D touch x",
                "sudo -R /srv/ws touch x",
                "sudo -R /x -D /srv/ws touch f",
                "env -C /tmp touch x",
                "env --chdir=/tmp touch x",
                "/usr/bin/time -o /tmp/t ls",
                "command time -o /tmp/t ls",
                "strace -o /tmp/t ls",
                "chroot /x touch f",
                "sh -c 'echo x > /etc/y'",
                "sh -c 'cd /tmp; touch x'",
                "eval 'echo x > /etc/y'",
                "echo x > $(pwd)/y",
                // Fails closed.
                &"$(".repeat(40),
            ],
        );
    }
}
