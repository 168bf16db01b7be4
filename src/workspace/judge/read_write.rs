//! ReadWrite: no deletion, no writes outside the workspace, as far as can be judged. A policy
//! over the effects of [`crate::bash::effects::walk`]: it owns the commands that delete, the
//! writers and which of their operands and options they write, and judges each program, file
//! write and socket the walk lists, in order, where the walk says the script may be. It never
//! walks the script itself.
//!
//! It fails closed: whatever the walk cannot see through (a command name, a script or an
//! option known only when it runs, nesting too deep) is refused, and so is a destination
//! known only when it runs. It is a guard, not a sandbox (see `judge`), never runs anything
//! and never touches the filesystem.

use std::borrow::Cow;

use crate::bash::effects::{self, Effect, Place, Start, is_pattern, normalise, resolve};
use crate::bash::parse::ShellWord;
use crate::bash::spec::{
    self, Scanned, maybe_option, scan, unknown_argument, unknown_option, word,
};

use super::{Denied, Permission, Scope, harmless_device, inside};

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

/// The read-write policy over the effects of `script`: the first effect refused, in the
/// order they happen, is the answer.
pub(super) fn check(scope: &Scope<'_>, script: &str) -> Judged {
    let workspace = normalise("/", scope.workspace);
    let start = Start {
        cwd: Some(scope.cwd),
        home: scope.home,
        env: &[],
    };
    let deny = |what: &str, why: String| Denied::new(Permission::ReadWrite, what, why);
    for effect in effects::walk(script, start) {
        match effect {
            Effect::Opaque { what, why } | Effect::Bound { what, why, .. } => {
                return Err(deny(&what, why));
            }
            Effect::Network { target, what } => {
                return Err(deny(
                    &what,
                    format!("`{target}` opens a network connection"),
                ));
            }
            Effect::Write {
                target, at, what, ..
            } => ReadWrite::at(&workspace, &at).write(&target, &what)?,
            Effect::Program { argv, at, what, .. } => {
                ReadWrite::at(&workspace, &at).program(&argv, &what)?
            }
            Effect::Script { .. } | Effect::Duplicate { .. } | Effect::ForkBomb { .. } => {}
        }
    }
    Ok(())
}

/// The read-write rules at one place of a script: the workspace, and where the script may be.
struct ReadWrite<'a> {
    workspace: &'a str,
    /// Where the script may be; empty when that cannot be known.
    cwds: Cow<'a, [String]>,
    /// The home directory for `~`, unless unknown or reassigned by the script.
    home: Option<&'a str>,
}

type Judged = Result<(), Denied>;

impl<'a> ReadWrite<'a> {
    fn at(workspace: &'a str, place: &'a Place) -> ReadWrite<'a> {
        ReadWrite {
            workspace,
            cwds: Cow::Borrowed(&place.cwds),
            home: place.home.as_deref(),
        }
    }

    fn deny(&self, what: &str, why: impl Into<String>) -> Denied {
        Denied::new(Permission::ReadWrite, what, why)
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
            .find(|p| !inside(self.workspace, p) && !harmless_device(p))
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

    /// One program that runs (the walk has unwrapped wrappers and followed nested scripts,
    /// so each is judged on its own): deleters, and what writers write.
    fn program(&self, words: &[ShellWord], what: &str) -> Judged {
        let Some(name) = words.first().and_then(|w| w.literal.as_deref()) else {
            return Ok(());
        };
        let base = crate::bash::basename(name);
        let args = &words[1..];
        if let Some((_, why)) = DELETERS.iter().find(|(n, _)| *n == base) {
            return Err(self.deny(what, *why));
        }
        match base {
            "find" => self.find(args, what),
            "git" => self.git(args, what),
            "dd" => self.dd(args, what),
            "chmod" | "chown" | "chgrp" => self.change_mode(base, args, what),
            "sed" => self.sed(args, what),
            "tar" => self.tar(args, what),
            "rsync" => self.rsync(args, what),
            _ => match WRITERS.iter().find(|w| w.name == base) {
                Some(w) => self.writer(w, args, what),
                None => Ok(()),
            },
        }
    }

    /// `scan`, with its refusal turned into a [`Denied`].
    fn scan(
        &self,
        args: &[ShellWord],
        what: &str,
        (with_arg, long_with_arg): (&str, &[&str]),
    ) -> Result<Scanned, Denied> {
        scan(args, with_arg, long_with_arg, usize::MAX, false).map_err(|why| self.deny(what, why))
    }

    fn write_value(&self, value: Option<&ShellWord>, what: &str) -> Judged {
        match value {
            Some(w) => self.write(w, what),
            None => Ok(()),
        }
    }

    /// `find`: no `-delete`; `-fprint` files judged as writes (the walk follows `-exec`).
    /// Every argument must be literal: `$X` could be `-delete`.
    fn find(&self, args: &[ShellWord], what: &str) -> Judged {
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
        let mut here = self.cwds.to_vec();
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
                Some((_, v)) => Some(word(v)),
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
                repositories.push(value().unwrap_or_else(|| word("")));
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
        if here[..] != self.cwds[..] {
            there.write(&word("."), what)?;
        }
        let s = there.scan(rest, what, GIT_CLONE_OPTIONS)?;
        for dir in s.values(("", &["separate-git-dir"])) {
            there.write_value(dir, what)?;
        }
        let ops = &s.operands;
        match (sub, ops.as_slice()) {
            ("clone", [_]) | ("init", []) => there.write(&word("."), what),
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
            workspace: self.workspace,
            cwds: Cow::Owned(cwds.to_vec()),
            home: self.home,
        }
    }

    /// `dd of=FILE`.
    fn dd(&self, args: &[ShellWord], what: &str) -> Judged {
        for w in args {
            let Some(arg) = w.literal.as_deref() else {
                return Err(self.deny(what, unknown_argument(w)));
            };
            if let Some(file) = arg.strip_prefix("of=") {
                self.write(&word(file), what)?;
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
        let scanned = self.scan(args, what, ("efl", &["expression", "file", "line-length"]))?;
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
    fn tar(&self, args: &[ShellWord], what: &str) -> Judged {
        // Old style: `tar xzf a.tar` is `tar -x -z -f a.tar`.
        let words = spec::old_style(args, spec::TAR_WITH_ARG);
        let s = self.scan(&words, what, (spec::TAR_WITH_ARG, spec::TAR_LONG_WITH_ARG))?;
        if s.has("", &["remove-files"]) {
            return Err(self.deny(what, "`--remove-files` deletes files"));
        }
        // The programs its options run are the walk's (`spec::RUNNERS`).
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
            let mut dirs = self.cwds.to_vec();
            for dir in s.values(("C", &["directory"])) {
                let Some(d) = dir.and_then(|d| d.literal.as_deref()) else {
                    return Err(
                        self.deny(what, "it extracts into a directory known only when it runs")
                    );
                };
                dirs = resolve(d, &dirs, self.home).unwrap_or_default();
            }
            self.elsewhere(&dirs).write(&word("."), what)?;
        }
        Ok(())
    }

    /// `rsync`: `--delete…` and `--remove-source-files` delete; the destination is written.
    fn rsync(&self, args: &[ShellWord], what: &str) -> Judged {
        let s = self.scan(args, what, spec::RSYNC_OPTIONS)?;
        if s.options
            .iter()
            .any(|(name, _)| name.starts_with("--del") || name.starts_with("--remove-s"))
        {
            return Err(self.deny(what, "it deletes files"));
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

    /// A writer: the operands and options it writes.
    fn writer(&self, w: &Writer, args: &[ShellWord], what: &str) -> Judged {
        let s = self.scan(args, what, (w.with_arg, w.long_with_arg))?;
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
            self.write(&word("."), what)?;
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
                // After `cd src &&`, only src: `..` is the workspace.
                "cd src && echo x > ../top.txt",
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

    /// The walk expands words with the variables the script set: where a value is known
    /// the judge sees through `$X`. Each of these was refused only because the value could
    /// not be seen (a write to `$F`, a `cd $D`, a command `$C`).
    #[test]
    fn read_write_sees_through_known_values() {
        allowed(
            Permission::ReadWrite,
            &[
                "F=notes.txt; echo hi > $F",
                "D=src; cd $D && touch x",
                "C=touch; $C x",
                "export C=mkdir; $C -p d",
                "O=out; O+=.txt; sort -o \"$O\" in.txt",
                "W=sudo; $W -u bob touch x",
                "S='touch x'; sh -c \"$S\"",
                // A command name from `echo` output (the benchmark's mixed commands had it).
                "$(echo touch) x",
                "| $(echo find . -exec echo )",
                // Unclosed, as the guard reads it (bash runs none of it).
                "$(echo cd / rm -r ",
            ],
        );
    }

    /// A known value outside the workspace is refused as such; a value that is unknown
    /// again (`unset`, `read`, a `for` variable after its values, a substitution's
    /// assignment, a prefix assignment) is refused as unknown, as before.
    #[test]
    fn read_write_refuses_what_known_values_reach() {
        refused(
            Permission::ReadWrite,
            &[
                "X=/etc/passwd; echo > $X",
                "D=/etc; cd $D; touch x",
                "C=rm; $C x",
                "$(echo rm) x",
                "C='rm -rf'; $C src",
                "W=sudo; P=rm; $W $P x",
                "S='rm x'; sh -c \"$S\"",
                "X=/etc; for d in src $X; do touch $d/a; done",
                "F=notes.txt; unset F; echo > $F",
                "F=notes.txt; read F; echo > $F",
                "echo $(F=notes.txt) > $F",
                "F=notes.txt true; echo > $F",
                "for f in a b; do echo x > \"$f\"; done",
                "echo x > ${OUT:-/etc/x}",
                "echo {a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}",
            ],
        );
        let denied = super::super::testing::at(Permission::ReadWrite, "X=/etc/passwd; echo > $X")
            .unwrap_err()
            .to_string();
        assert!(denied.contains("outside the workspace"), "{denied}");
        let bound = super::super::testing::at(
            Permission::ReadWrite,
            "echo {a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}",
        )
        .unwrap_err()
        .to_string();
        assert!(bound.contains("brace expansion"), "{bound}");
    }

    /// Known text given to a shell is followed like any script. The refusals through a
    /// pipe, a here-document or a here-string were allowed while the walk read that text
    /// as code it could not see; `$0` of `sh -c` was unknown, so `touch` there was refused.
    #[test]
    fn read_write_follows_known_text_into_a_shell() {
        refused(
            Permission::ReadWrite,
            &[
                "echo 'rm x' | sh",
                "printf 'rm -rf src' | cat | bash",
                "sh <<EOF\nrm x\nEOF",
                "X=rm; sh <<< \"$X x\"",
                "sh <<< \"$X x\"",
                "sh -c '$0 x' rm",
            ],
        );
        allowed(
            Permission::ReadWrite,
            &[
                "echo 'ls' | sh",
                "sh <<EOF\ntouch x\nEOF",
                "sh -c '$0 x' touch",
            ],
        );
    }

    /// Programs the guard's walk saw and the judge's once missed (found by the property that
    /// the judge sees every program the guard sees).
    #[test]
    fn read_write_sees_what_the_guard_sees() {
        refused(
            Permission::ReadWrite,
            &[
                "runuser -u bob -- rm x",
                "runuser -u bob touch /etc/x",
                "runuser bob -c 'rm x'",
                "watch find . -exec rm {} \\;",
                "watch -n 1 touch /etc/x",
            ],
        );
        allowed(
            Permission::ReadWrite,
            &["runuser -u bob -- ls", "watch -n 1 ls -la", "ls | xargs"],
        );
    }

    /// A here-string into a shell is a script the walk reads like `sh -c`.
    #[test]
    fn read_write_follows_here_strings_into_a_shell() {
        refused(
            Permission::ReadWrite,
            &[
                "bash <<< 'rm x'",
                "sh -s <<< 'touch /etc/x'",
                "sudo bash <<< 'echo > /etc/x'",
                "chroot /mnt <<< 'echo x > f'",
            ],
        );
        allowed(
            Permission::ReadWrite,
            &[
                "bash <<< 'ls -la'",
                "python3 <<< 'print(1)'",
                "sh ./build.sh",
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
                "cd src; echo x > ../top.txt",
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
