//! Rules: what the guard refuses, judged on one normalised simple command (its name without
//! directory, its expanded arguments) or one write target.
//!
//! It owns the lists — system directories (top level and the second level that matters,
//! `/usr/lib`, `/proc/*/root`), system files, harmless device nodes, power verbs — and the
//! messages, each saying what was refused and what to do instead. Paths are judged after
//! `..` is resolved and against globs (`/u*/b*`). An argument whose value is unknown is
//! judged as if its unknown parts were empty. Rules never expand, parse or run anything.

use super::host::{identity_file, identity_refusal, identity_rules, storage_rules};
use super::{Objection, abbreviate};
use crate::bash::expand::{Env, Field};
use crate::bash::spec;

/// Top-level directories whose recursive deletion or re-permissioning breaks the system.
const SYSTEM_DIRS: &[&str] = &[
    "bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "opt", "proc", "root",
    "sbin", "srv", "sys", "usr", "var",
];

/// Second-level directories that are as vital as their parents.
const SYSTEM_SUBDIRS: &[(&str, &[&str])] = &[
    (
        "usr",
        &[
            "bin", "sbin", "lib", "lib32", "lib64", "libx32", "libexec", "include", "share",
        ],
    ),
    ("var", &["lib", "log", "spool"]),
    ("boot", &["efi", "grub", "grub2", "loader"]),
    ("lib", &["modules", "firmware", "systemd"]),
    ("etc", &["pam.d", "security", "systemd", "ssh"]),
];

/// `systemctl`/`loginctl` verbs that stop or cut off the machine.
const POWER_VERBS: &[&str] = &[
    "poweroff",
    "reboot",
    "halt",
    "kexec",
    "soft-reboot",
    "rescue",
    "emergency",
    "suspend",
    "hibernate",
    "hybrid-sleep",
    "suspend-then-hibernate",
];

/// The command as the rules see it: the name without its directory, then the arguments.
pub(super) fn shown(args: &[Field], max: usize) -> String {
    let mut words: Vec<&str> = args.iter().map(|f| f.display.as_str()).collect();
    if let Some(name) = args.first().and_then(Field::val) {
        words[0] = crate::bash::basename(name);
    }
    abbreviate(&words.join(" "), max)
}

pub(super) fn device_write(cmd: &str, dev: &str) -> Objection {
    Objection::new(
        "device-write",
        format!(
            "refused: `{}` would write onto the device {dev}, destroying what is on it; write \
             to a regular file instead, or to /dev/null to discard output",
            abbreviate(cmd, 160)
        ),
    )
}

/// A write onto `path` (already resolved against the working directory): refused onto
/// block devices, `/proc/sysrq-trigger` and the host's identity and boot files, and — when
/// it truncates — onto system files.
pub(super) fn write_target(
    path: &str,
    append: bool,
    cmd: &dyn Fn() -> String,
) -> Result<(), Objection> {
    if let Some(dev) = block_device(path) {
        return Err(device_write(&cmd(), &dev));
    }
    if normalize(path).as_deref() == Some(&["proc", "sysrq-trigger"][..]) {
        return Err(Objection::new(
            "sysrq",
            format!(
                "refused: `{}` writes to /proc/sysrq-trigger, which can crash, reboot or \
                 power off the machine at once; ask an operator",
                abbreviate(&cmd(), 160)
            ),
        ));
    }
    if let Some(file) = identity_file(path) {
        return Err(match append {
            true => identity_refusal(&cmd(), &file, "append to"),
            false => truncation(&cmd(), &file),
        });
    }
    if !append && let Some(file) = system_file(path) {
        return Err(truncation(&cmd(), &file));
    }
    Ok(())
}

pub(super) fn truncation(cmd: &str, file: &str) -> Objection {
    Objection::new(
        "system-file",
        format!(
            "refused: `{}` would overwrite the system file {file}, which can stop logins or \
             booting; change it with an editor or a tool that keeps a backup, or ask an operator",
            abbreviate(cmd, 160)
        ),
    )
}

/// Options (`-x`, `--long`) and operands of a command's arguments. An operand whose value
/// is unknown is given as its value with the unknown parts empty.
fn split_args(args: &[Field]) -> (Vec<&str>, Vec<&Field>) {
    let (mut opts, mut operands) = (Vec::new(), Vec::new());
    let mut done = false;
    for f in args {
        match f.val() {
            Some("--") if !done => done = true,
            Some(v) if !done && v.starts_with('-') && v.len() > 1 => opts.push(v),
            _ => operands.push(f),
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

/// " (if `${X}` is empty)" when the operand was judged with unknown parts left empty.
fn if_empty(f: &Field) -> String {
    if f.value.is_none() {
        format!(" (if `{}` is empty, as an unset variable is)", f.display)
    } else {
        String::new()
    }
}

/// Every refusal rule on one normalised simple command: those of the programs named here,
/// then the host's identity files and storage (`host`).
pub(super) fn builtin_rules(args: &[Field], env: &Env) -> Result<(), Objection> {
    named_rules(args, env)?;
    identity_rules(args, env)?;
    storage_rules(args)
}

fn named_rules(args: &[Field], env: &Env) -> Result<(), Objection> {
    let Some(name) = args.first().and_then(Field::val).map(crate::bash::basename) else {
        return Ok(());
    };
    let cmd = shown(args, 160);
    let (opts, operands) = split_args(&args[1..]);
    let path = |f: &Field| env.resolve(f.judged()).into_owned();
    match name {
        "rm" | "chmod" | "chown" | "chgrp" => {
            if opts
                .iter()
                .any(|o| o.len() >= 4 && long_is(o, "no-preserve-root"))
            {
                return Err(Objection::new(
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
                // `rm -f /usr/bin/*`: every file of a system tree.
                for p in operands.iter().filter(|_| name == "rm") {
                    let target = path(p);
                    let last = target.rsplit('/').next().unwrap_or_default();
                    if broad_glob(last)
                        && let Some(what) = danger(&target, true)
                    {
                        return Err(Objection::new(
                            "recursive-delete",
                            format!(
                                "refused: `{cmd}` would delete {what}{}; name the exact files \
                                 instead",
                                if_empty(p)
                            ),
                        ));
                    }
                }
                return Ok(());
            }
            // chmod's mode and chown's owner are operands too; they never look like paths
            // the rules care about, so every operand is classified.
            for p in &operands {
                if let Some(what) = danger(&path(p), name == "rm") {
                    let unknown = if_empty(p);
                    return Err(if name == "rm" {
                        Objection::new(
                            "recursive-delete",
                            format!(
                                "refused: `{cmd}` would recursively delete {what}{unknown}; \
                                 name the exact directory to remove instead"
                            ),
                        )
                    } else {
                        Objection::new(
                            "recursive-permissions",
                            format!(
                                "refused: `{cmd}` would recursively change the ownership or \
                                 permissions of {what}{unknown}, which can leave the system \
                                 unusable; name the exact directory instead"
                            ),
                        )
                    });
                }
            }
            Ok(())
        }
        n if n == "mkfs"
            || n.starts_with("mkfs.")
            || matches!(n, "mke2fs" | "wipefs" | "blkdiscard" | "mkswap") =>
        {
            Err(Objection::new(
                "format-disk",
                format!(
                    "refused: `{cmd}` would erase a filesystem, a disk's blocks or the \
                     signatures on a disk, destroying its data; formatting devices is not \
                     allowed through this tool, ask an operator"
                ),
            ))
        }
        "dd" => {
            for f in &operands {
                let Some(target) = f.judged().strip_prefix("of=") else {
                    continue;
                };
                let target = env.resolve(target);
                if let Some(dev) = block_device(&target) {
                    return Err(Objection::new(
                        "dd-device",
                        format!(
                            "refused: `{cmd}` would write raw data onto the device {dev}, \
                             destroying what is on it; write to a regular file instead (for \
                             example of=./disk.img)"
                        ),
                    ));
                }
                write_target(&target, false, &|| cmd.clone())?;
            }
            Ok(())
        }
        "tee" => {
            let append = opts
                .iter()
                .any(|o| long_is(o, "append") || (!o.starts_with("--") && o.contains('a')));
            for f in &operands {
                write_target(&path(f), append, &|| cmd.clone())?;
            }
            Ok(())
        }
        "shred" => {
            for f in &operands {
                let p = path(f);
                if let Some(dev) = block_device(&p) {
                    return Err(device_write(&cmd, &dev));
                }
                if let Some(file) = system_file(&p) {
                    return Err(truncation(&cmd, &file));
                }
            }
            Ok(())
        }
        "truncate" => {
            // `-s SIZE` / `-r FILE` take the next word; the rest are the files.
            let mut skip = false;
            for f in &args[1..] {
                let v = f.judged();
                if skip {
                    skip = false;
                    continue;
                }
                if matches!(v, "-s" | "-r" | "--size" | "--reference") {
                    skip = true;
                    continue;
                }
                if v.starts_with('-') {
                    continue;
                }
                write_target(&env.resolve(v), false, &|| cmd.clone())?;
            }
            Ok(())
        }
        "cp" | "mv" | "install" => {
            if name == "mv" {
                for f in operands.iter().rev().skip(1) {
                    if let Some(what) = danger(&path(f), true) {
                        return Err(Objection::new(
                            "recursive-delete",
                            format!(
                                "refused: `{cmd}` would move away {what}{}; name the exact \
                                 directory instead",
                                if_empty(f)
                            ),
                        ));
                    }
                }
            }
            match operands.last() {
                Some(dest) if operands.len() > 1 => {
                    write_target(&path(dest), false, &|| cmd.clone())
                }
                _ => Ok(()),
            }
        }
        "rsync" => {
            let deletes = opts
                .iter()
                .any(|o| *o == "--del" || o.starts_with("--delete"));
            let dest = operands.last().filter(|_| operands.len() > 1);
            if let Some(dest) = dest.filter(|_| deletes) {
                // `host:/path` is another machine's; this rule is about this one.
                let p = path(dest);
                let remote = p.split('/').next().is_some_and(|h| h.contains(':'));
                if let Some(what) = danger(&p, true).filter(|_| !remote) {
                    return Err(Objection::new(
                        "rsync-delete",
                        format!(
                            "refused: `{cmd}` would delete from {what}{} whatever the source \
                             lacks; sync into a specific directory instead",
                            if_empty(dest)
                        ),
                    ));
                }
            }
            Ok(())
        }
        "kill" => kill(args, &cmd),
        "git" => git_clean(args, env, &cmd),
        "tar" => tar_remove(args, env, &cmd),
        "shutdown" | "reboot" | "halt" | "poweroff" => Err(power(&cmd)),
        "init" | "telinit"
            if operands
                .iter()
                .any(|f| matches!(f.judged(), "0" | "6" | "1" | "s" | "S")) =>
        {
            Err(power(&cmd))
        }
        "systemctl" | "loginctl"
            if !operands.first().is_some_and(|f| {
                matches!(
                    f.judged(),
                    "status"
                        | "show"
                        | "cat"
                        | "help"
                        | "is-active"
                        | "is-enabled"
                        | "list-units"
                        | "list-dependencies"
                )
            }) && operands.iter().any(|f| {
                let v = f.judged();
                POWER_VERBS.contains(&v)
                    || v.strip_suffix(".target").is_some_and(|t| {
                        POWER_VERBS.contains(&t) || t == "ctrl-alt-del" || t == "sleep"
                    })
            }) =>
        {
            Err(power(&cmd))
        }
        _ => Ok(()),
    }
}

/// `git clean -f` where the work tree is the root, a system tree or the home: it deletes
/// every file git does not track there — in a directory that is not a repository, all of
/// them.
fn git_clean(args: &[Field], env: &Env, cmd: &str) -> Result<(), Objection> {
    if let Some(place) = git_clean_place(args)
        && let Some(what) = danger(&env.resolve(&place), true)
    {
        return Err(Objection::new(
            "git-clean",
            format!(
                "refused: `{cmd}` would delete every file git does not track in {what}; run it \
                 inside a repository's own directory"
            ),
        ));
    }
    Ok(())
}

/// The work tree a forced `git clean` (not a dry run) deletes in, as written (`.` for the
/// working directory); `None` for any other git command.
pub(super) fn git_clean_place(args: &[Field]) -> Option<String> {
    if args.first().and_then(Field::val).map(crate::bash::basename) != Some("git") {
        return None;
    }
    let mut place = String::from(".");
    let mut k = 1;
    while let Some(f) = args.get(k) {
        k += 1;
        let v = f.judged();
        match v {
            "-C" => {
                let dir = args.get(k).map(Field::judged).unwrap_or_default();
                k += 1;
                place = match dir.starts_with('/') || dir.starts_with('~') {
                    true => dir.to_owned(),
                    false => format!("{place}/{dir}"),
                };
            }
            _ if v.starts_with("--work-tree=") => place = v["--work-tree=".len()..].to_owned(),
            "--work-tree" | "--git-dir" | "-c" | "--namespace" => k += 1,
            _ if v.starts_with('-') => {}
            "clean" => {
                let opts = || args[k..].iter().map(Field::judged);
                let short =
                    |o: &str, c: char| o.starts_with('-') && !o.starts_with("--") && o.contains(c);
                let force = opts().any(|o| o == "--force" || short(o, 'f'));
                let dry = opts().any(|o| o == "--dry-run" || short(o, 'n'));
                return (force && !dry).then_some(place);
            }
            _ => return None,
        }
    }
    None
}

/// `tar --remove-files`: the files it archives are deleted afterwards, so each is judged as
/// a recursive delete.
fn tar_remove(args: &[Field], env: &Env, cmd: &str) -> Result<(), Objection> {
    let removes = args[1..].iter().any(|f| {
        f.val()
            .is_some_and(|v| v.len() >= 9 && long_is(v, "remove-files"))
    });
    if !removes {
        return Ok(());
    }
    // Old-style first word (`tar cf a.tar x`): its letters are options.
    let mut rest = args[1..].iter().map(Field::judged);
    let mut pending = 0;
    if let Some(first) = args.get(1).map(Field::judged)
        && !first.starts_with('-')
    {
        rest.next();
        pending = first
            .chars()
            .filter(|c| spec::TAR_WITH_ARG.contains(*c))
            .count();
    }
    let mut dir = String::from(".");
    let mut rest = rest.peekable();
    while pending > 0 && rest.next().is_some() {
        pending -= 1;
    }
    while let Some(v) = rest.next() {
        if let Some(long) = v.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or(long);
            if !long.contains('=') && spec::long_option_is(name, spec::TAR_LONG_WITH_ARG) {
                let value = rest.next().unwrap_or_default();
                if spec::long_option_is(name, &["directory"]) {
                    dir = value.to_owned();
                }
            } else if let Some(d) = long.strip_prefix("directory=") {
                dir = d.to_owned();
            }
            continue;
        }
        if v.starts_with('-') && v.len() > 1 {
            for (at, c) in v.char_indices().skip(1) {
                if spec::TAR_WITH_ARG.contains(c) {
                    let value = match v[at + 1..].is_empty() {
                        true => rest.next().unwrap_or_default().to_owned(),
                        false => v[at + 1..].to_owned(),
                    };
                    if c == 'C' {
                        dir = value;
                    }
                    break;
                }
            }
            continue;
        }
        let target = match v.starts_with('/') || v.starts_with('~') {
            true => v.to_owned(),
            false => format!("{dir}/{v}"),
        };
        if let Some(what) = danger(&env.resolve(&target), true) {
            return Err(Objection::new(
                "recursive-delete",
                format!(
                    "refused: `{cmd}` would archive and then delete {what}; archive without \
                     --remove-files, or name the exact directory"
                ),
            ));
        }
    }
    Ok(())
}

/// `kill` aimed at every process (`-1`) or at init (`1`).
fn kill(args: &[Field], cmd: &str) -> Result<(), Objection> {
    let mut rest = &args[1..];
    // The signal: `-9`, `-KILL`, `-s KILL`, `-n 9`, `--signal KILL`; `-l` only lists.
    if let Some(first) = rest.first().map(Field::judged) {
        match first {
            "-l" | "-L" | "--list" | "--table" => return Ok(()),
            "-s" | "-n" | "--signal" => {
                rest = rest.get(2..).unwrap_or_default();
            }
            // `kill -1` alone: as a signal it lacks a target, as a target it is every
            // process; it stays a target, so it is refused rather than guessed at.
            v if v.starts_with('-') && v.len() > 1 && v != "--" && rest.len() > 1 => {
                rest = &rest[1..];
            }
            _ => {}
        }
    }
    let everyone = rest
        .iter()
        .map(Field::judged)
        .filter(|v| *v != "--")
        .any(|v| matches!(v.trim_start_matches('+'), "-1" | "1"));
    if everyone {
        return Err(Objection::new(
            "kill-all",
            format!(
                "refused: `{}` would signal every process you can reach (-1) or init (1), \
                 which ends your session and the services; name the exact process IDs",
                abbreviate(cmd, 160)
            ),
        ));
    }
    Ok(())
}

fn power(cmd: &str) -> Objection {
    Objection::new(
        "power",
        format!(
            "refused: `{cmd}` would shut down, restart or cut off the machine, stopping \
             everything running on it; ask an operator if a restart is really needed"
        ),
    )
}

/// Components of an absolute or `~`-relative path after removing `.`, `..` and empty parts;
/// `None` when `..` climbs above the start.
pub(super) fn normalize(path: &str) -> Option<Vec<&str>> {
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
pub(super) fn danger(path: &str, home: bool) -> Option<String> {
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
        // `/proc/PID/root` is that process's view of `/`.
        [p, pid, r, rest @ ..] if comp_matches(p, "proc") && comp_matches(r, "root") => {
            danger(&format!("/{}", rest.join("/")), home)
                .map(|what| format!("{what} (through /proc/{pid}/root)"))
        }
        [d, s] => system_subdir(d, s).map(|s| format!("the system directory {s}")),
        [d, s, g] if broad_glob(g) => system_subdir(d, s).map(|s| format!("everything under {s}")),
        _ => None,
    }
}

/// `component` is `name`, or a glob that matches it.
pub(super) fn comp_matches(component: &str, name: &str) -> bool {
    component == name || (has_glob(component) && glob_match(component, name))
}

/// The system directory a top-level component names or (as a glob) matches.
fn system_dir(component: &str) -> Option<&'static str> {
    SYSTEM_DIRS
        .iter()
        .copied()
        .find(|d| comp_matches(component, d))
}

/// The vital second-level directory (`/usr/lib`) two components name or match.
fn system_subdir(first: &str, second: &str) -> Option<String> {
    SYSTEM_SUBDIRS.iter().find_map(|(d, subs)| {
        if !comp_matches(first, d) {
            return None;
        }
        subs.iter()
            .find(|s| comp_matches(second, s))
            .map(|s| format!("/{d}/{s}"))
    })
}

/// The system file a truncating write onto `path` would destroy: the host's identity and boot
/// files ([`identity_file`]), and anything among the system's programs and libraries.
fn system_file(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let comps = normalize(path).unwrap_or_default();
    let hit = match comps.as_slice() {
        _ if identity_file(path).is_some() => true,
        [d, _, ..]
            if ["bin", "sbin", "lib", "lib32", "lib64", "libx32"]
                .iter()
                .any(|n| comp_matches(d, n)) =>
        {
            true
        }
        [u, d, _, ..] if comp_matches(u, "usr") => {
            ["bin", "sbin", "lib", "lib32", "lib64", "libx32", "libexec"]
                .iter()
                .any(|n| comp_matches(d, n))
        }
        _ => false,
    };
    hit.then(|| format!("/{}", comps.join("/")))
}

pub(super) use crate::bash::spec::{glob_match, has_glob};

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

/// Names of files the host needs to run: a `find -name` pattern matching one of them does
/// not narrow a delete throughout a system tree.
const VITAL_NAMES: &[&str] = &[
    "libc.so.6",
    "ld-linux-x86-64.so.2",
    "libssl.so.3",
    "libsystemd.so.0",
    "libpam.so.0",
    "ld.so.cache",
    "passwd",
    "shadow",
    "group",
    "sudoers",
    "fstab",
    "nsswitch.conf",
    "resolv.conf",
    "sshd_config",
    "vmlinuz",
    "vmlinuz-6.1.0-18-amd64",
    "initrd.img-6.1.0-18-amd64",
    "grub.cfg",
    "init",
    "systemd",
    "bash",
    "sh",
    "sshd",
    "python3",
    "modules.dep",
    "ext4.ko",
];

/// Whether a `find -name` pattern matches the name of a file the host needs.
pub(super) fn vital_pattern(pattern: &str) -> bool {
    VITAL_NAMES.iter().any(|n| glob_match(pattern, n))
}

/// A `find -name`/`-path`/`-regex` pattern that matches (nearly) everything.
pub(super) fn broad_pattern(p: &str) -> bool {
    p.is_empty()
        || broad_glob(p)
        || p.chars().all(|c| matches!(c, '*' | '?' | '.' | '/'))
        || matches!(p, ".*" | ".+" | "^.*$" | "^.*")
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
    use super::super::testing::{DELETE, assert_allowed, assert_refused};
    use super::*;

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
        // A command name known only when it runs could be anything: a person decides.
        for cmd in ["$EDITOR file.txt", "\"$CC\" -o out main.c"] {
            super::super::testing::assert_asked(cmd, "opaque");
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

#[cfg(test)]
mod new_rules {
    use super::super::testing::{DELETE, assert_allowed, assert_refused};

    #[test]
    fn system_directories_two_levels_deep() {
        for t in [
            "/usr/lib",
            "/usr/bin",
            "/usr/lib/",
            "/usr/lib/*",
            "/usr/share",
            "/var/lib",
            "/boot/efi",
            "/proc/1/root",
            "/proc/self/root/",
            "/proc/*/root",
            "/proc/1/root/etc",
            "/u*/b*",
            "/u*/l?b",
            "/usr/../usr/bin",
        ] {
            assert_refused(&format!("rm -rf {t}"), DELETE);
        }
        assert_refused("chmod -R 777 /usr/lib", "recursive-permissions");
        for t in [
            "/usr/local/lib/old",
            "/usr/local",
            "/var/tmp/x",
            "/proc/1/root/tmp/x",
            "/u*/local/x",
        ] {
            assert_allowed(&format!("rm -rf {t}"));
        }
    }

    #[test]
    fn find_that_deletes_throughout_system_paths() {
        for cmd in [
            "find /etc -type f -delete",
            "find /usr -name '*' -delete",
            "find / -type f -exec rm {} +",
            "find /usr/lib -exec rm -f {} \\;",
            "find /var -mtime +1 -delete",
            "find /etc ! -name x -delete",
            "find /etc -name x -o -type f -delete",
            "sudo find /boot -type f -delete",
        ] {
            assert_refused(cmd, "find-delete");
        }
        for cmd in [
            "find . -name '*.o' -delete",
            "find /tmp/x -delete",
            "find / -name '*.log' -exec rm -f {} +",
            "find /var/log -name '*.gz' -mtime +30 -delete",
            "find /etc -type f",
            "find ~ -name '*.pyc' -delete",
        ] {
            assert_allowed(cmd);
        }
    }

    #[test]
    fn overwriting_system_files() {
        for cmd in [
            "> /etc/passwd",
            "echo x > /etc/shadow",
            ": > /etc/sudoers",
            "echo x &> /etc/group",
            "cat x >| /bin/sh",
            "truncate -s0 /etc/passwd",
            "truncate -s 0 /etc/fstab",
            "truncate --size=0 /boot/vmlinuz",
            "echo x | tee /etc/passwd",
            "cp /tmp/x /etc/passwd",
            "mv x /usr/bin/ls",
            "dd if=/dev/zero of=/etc/passwd",
            "echo x > /etc/pam.d/sshd",
            "shred /etc/shadow",
            "cd /etc && echo > passwd",
            "echo x > /etc/pass*",
        ] {
            assert_refused(cmd, "system-file");
        }
        for cmd in [
            "echo x >> /etc/hosts",
            "echo x | tee -a /etc/hosts",
            "echo 'server {}' > /etc/nginx/conf.d/app.conf",
            "cp tool /usr/local/bin/",
            "truncate -s0 ./log.txt",
            "cat /etc/passwd",
            "cp /etc/passwd ./passwd.bak",
        ] {
            assert_allowed(cmd);
        }
    }

    #[test]
    fn sysrq_trigger() {
        for cmd in [
            "echo b > /proc/sysrq-trigger",
            "echo b >> /proc/sysrq-trigger",
            "echo b | tee /proc/sysrq-trigger",
            "sh -c 'echo c > /proc/sysrq-trigger'",
        ] {
            assert_refused(cmd, "sysrq");
        }
        assert_allowed("cat /proc/sys/kernel/sysrq");
    }

    #[test]
    fn rsync_delete_onto_system_directories() {
        for cmd in [
            "rsync -a --delete ./empty/ /usr/",
            "rsync -av --delete-after src/ /etc",
            "rsync --del x/ /",
            "rsync -a --delete /tmp/x/ ~",
        ] {
            assert_refused(cmd, "rsync-delete");
        }
        for cmd in [
            "rsync -a --delete ./site/ /var/www/site/",
            "rsync -a ./x/ /usr/",
            "rsync -a --delete ./x/ host:/usr/",
        ] {
            assert_allowed(cmd);
        }
    }

    #[test]
    fn discarding_and_swap_formatting() {
        for cmd in [
            "blkdiscard /dev/nvme0n1",
            "mkswap /dev/sdb2",
            "wipefs -a /dev/sda",
        ] {
            assert_refused(cmd, "format-disk");
        }
    }

    #[test]
    fn power_targets() {
        for cmd in [
            "systemctl isolate reboot.target",
            "systemctl start poweroff.target",
            "systemctl isolate rescue.target",
            "sudo systemctl start halt.target",
            "systemctl kexec",
            "systemctl suspend",
        ] {
            assert_refused(cmd, "power");
        }
        assert_allowed("systemctl status reboot.target");
        assert_allowed("systemctl restart nginx");
    }

    #[test]
    fn killing_every_process() {
        for cmd in [
            "kill -1",
            "kill -9 -1",
            "kill -- -1",
            "kill -s KILL -1",
            "kill -KILL -1",
            "kill 1",
            "kill -9 1",
            "sudo kill -TERM -1",
        ] {
            assert_refused(cmd, "kill-all");
        }
        for cmd in [
            "kill -9 1234",
            "kill -l",
            "kill -HUP 4321",
            "kill -- -4321",
            "kill %1",
        ] {
            assert_allowed(cmd);
        }
    }
}
