//! The one table of command specs both policies read: the shells, the interpreters that take
//! inline code, and the wrappers that run another command, with their option letters, the
//! long options that take an argument, their operands, and which options change the
//! directory, run a script or write a file. A command added here is seen through by the guard
//! and the workspace judge alike.
//!
//! It owns option syntax too (`getopt_long`: abbreviated long options, `NAME+=value`
//! assignments). It never judges a command.

use super::parse::{ShellWord, is_identifier};

/// Names that run their `-c` argument (or their standard input) as a shell script.
pub const SHELLS: &[&str] = &[
    "sh", "bash", "rbash", "zsh", "dash", "ksh", "mksh", "pdksh", "ash", "yash", "posh", "fish",
    "csh", "tcsh",
];

/// An interpreter that runs code given on its command line or on its standard input.
pub struct Interpreter {
    /// Its name (a versioned name, `python3.12`, counts as its family's).
    pub name: &'static str,
    /// Short options whose argument is the code (`python -c`, `perl -e`).
    pub inline: &'static str,
    /// Long options whose argument is the code (`node --eval`).
    pub long_inline: &'static [&'static str],
}

/// Interpreters whose inline code the guard reads.
pub const INTERPRETERS: &[Interpreter] = &[
    Interpreter {
        name: "python",
        inline: "c",
        long_inline: &[],
    },
    Interpreter {
        name: "perl",
        inline: "eE",
        long_inline: &[],
    },
    Interpreter {
        name: "ruby",
        inline: "e",
        long_inline: &[],
    },
    Interpreter {
        name: "node",
        inline: "ep",
        long_inline: &["eval", "print"],
    },
    Interpreter {
        name: "php",
        inline: "rB",
        long_inline: &[],
    },
    Interpreter {
        name: "lua",
        inline: "e",
        long_inline: &[],
    },
    Interpreter {
        name: "Rscript",
        inline: "e",
        long_inline: &[],
    },
];

/// The interpreter `name` is, ignoring a version suffix (`python3`, `python3.12`, `perl5`).
pub fn interpreter(name: &str) -> Option<&'static Interpreter> {
    let family = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    INTERPRETERS
        .iter()
        .find(|i| i.name == name || i.name == family || (i.name == "node" && name == "nodejs"))
}

/// A command that runs another command: its options, then `operands` words, then the
/// command (`sudo -u bob rm x` runs `rm x`).
pub struct Wrapper {
    pub name: &'static str,
    /// Short options that take an argument.
    pub with_arg: &'static str,
    /// Long options that take an argument as the next word when not given `=`.
    pub long_with_arg: &'static [&'static str],
    /// Words before the command that are not options (`timeout DURATION`); `usize::MAX`: it
    /// runs no command of its own, only its script options (`script -c`).
    pub operands: usize,
    /// Whether `NAME=value` words may come before the command (`env`, `sudo`).
    pub assignments: bool,
    /// Options (short, long) that change the directory the command runs in.
    pub chdir: (&'static str, &'static [&'static str]),
    /// Whether the command always runs elsewhere (`chroot`): relative paths become unknown.
    pub elsewhere: bool,
    /// Options (short, long) that make it run elsewhere (`sudo --chroot`).
    pub chroot: (&'static str, &'static [&'static str]),
    /// Options (short, long) whose argument is a shell script (`su -c`, `env -S`).
    pub script: (&'static str, &'static [&'static str]),
    /// Options (short, long) whose argument is a file written (`time -o`).
    pub dest: (&'static str, &'static [&'static str]),
    /// Short options that mean no command runs (`command -v`).
    pub no_command: &'static str,
    /// Whether, given no command, it starts a shell that reads its input (`chroot DIR`).
    pub bare_shell: bool,
    /// Whether the words of its script options come before the command's (`env -S 'A B' C`
    /// runs `A B C`): the two are read as one script ([`split_command`]).
    pub splits: bool,
}

const WRAPPER: Wrapper = Wrapper {
    name: "",
    with_arg: "",
    long_with_arg: &[],
    operands: 0,
    assignments: false,
    chdir: ("", &[]),
    elsewhere: false,
    chroot: ("", &[]),
    script: ("", &[]),
    dest: ("", &[]),
    no_command: "",
    bare_shell: false,
    splits: false,
};

/// Every wrapper, once.
pub const WRAPPERS: &[Wrapper] = &[
    Wrapper {
        name: "sudo",
        with_arg: "CDcghpRrTtUu",
        long_with_arg: &[
            "chdir",
            "close-from",
            "group",
            "host",
            "login-class",
            "prompt",
            "chroot",
            "role",
            "command-timeout",
            "type",
            "other-user",
            "user",
        ],
        assignments: true,
        chdir: ("D", &["chdir"]),
        chroot: ("R", &["chroot"]),
        ..WRAPPER
    },
    Wrapper {
        name: "doas",
        with_arg: "uC",
        ..WRAPPER
    },
    Wrapper {
        name: "pkexec",
        long_with_arg: &["user"],
        ..WRAPPER
    },
    Wrapper {
        name: "env",
        with_arg: "uCS",
        long_with_arg: &["unset", "chdir", "split-string"],
        assignments: true,
        chdir: ("C", &["chdir"]),
        script: ("S", &["split-string"]),
        splits: true,
        ..WRAPPER
    },
    Wrapper {
        name: "nice",
        with_arg: "n",
        long_with_arg: &["adjustment"],
        ..WRAPPER
    },
    Wrapper {
        name: "nohup",
        ..WRAPPER
    },
    Wrapper {
        name: "setsid",
        ..WRAPPER
    },
    Wrapper {
        name: "unbuffer",
        ..WRAPPER
    },
    Wrapper {
        name: "timeout",
        with_arg: "sk",
        long_with_arg: &["signal", "kill-after"],
        operands: 1,
        ..WRAPPER
    },
    Wrapper {
        name: "stdbuf",
        with_arg: "ioe",
        long_with_arg: &["input", "output", "error"],
        ..WRAPPER
    },
    Wrapper {
        name: "ionice",
        with_arg: "cnpPu",
        long_with_arg: &["class", "classdata", "pid", "pgid", "uid"],
        ..WRAPPER
    },
    Wrapper {
        name: "chrt",
        with_arg: "TPD",
        long_with_arg: &["sched-runtime", "sched-period", "sched-deadline"],
        operands: 1,
        ..WRAPPER
    },
    Wrapper {
        name: "taskset",
        operands: 1,
        ..WRAPPER
    },
    Wrapper {
        name: "chroot",
        long_with_arg: &["userspec", "groups"],
        operands: 1,
        elsewhere: true,
        bare_shell: true,
        ..WRAPPER
    },
    Wrapper {
        name: "unshare",
        with_arg: "SGRw",
        long_with_arg: &[
            "setuid",
            "setgid",
            "root",
            "wd",
            "map-user",
            "map-group",
            "map-users",
            "map-groups",
            "propagation",
            "setgroups",
        ],
        chdir: ("w", &["wd"]),
        chroot: ("R", &["root"]),
        bare_shell: true,
        ..WRAPPER
    },
    Wrapper {
        name: "nsenter",
        with_arg: "tSGW",
        long_with_arg: &["target", "setuid", "setgid", "wdns"],
        // It enters another process's namespaces: where its paths lead is unknown.
        elsewhere: true,
        bare_shell: true,
        ..WRAPPER
    },
    Wrapper {
        name: "systemd-run",
        with_arg: "puEMH",
        long_with_arg: &[
            "property",
            "unit",
            "description",
            "slice",
            "uid",
            "gid",
            "nice",
            "working-directory",
            "setenv",
            "machine",
            "host",
            "on-active",
            "on-boot",
            "on-startup",
            "on-unit-active",
            "on-unit-inactive",
            "on-calendar",
            "timer-property",
            "path-property",
            "socket-property",
            "service-type",
        ],
        // A service starts in `/` unless told otherwise, possibly on another machine.
        elsewhere: true,
        ..WRAPPER
    },
    Wrapper {
        name: "time",
        with_arg: "fo",
        long_with_arg: &["format", "output"],
        dest: ("o", &["output"]),
        ..WRAPPER
    },
    Wrapper {
        name: "strace",
        with_arg: "abeEIoOpPsSuUX",
        long_with_arg: &["output"],
        dest: ("o", &["output"]),
        ..WRAPPER
    },
    Wrapper {
        name: "ltrace",
        with_arg: "aADeFlnopsuwx",
        long_with_arg: &["output", "library", "align", "config"],
        dest: ("o", &["output"]),
        ..WRAPPER
    },
    Wrapper {
        name: "valgrind",
        ..WRAPPER
    },
    Wrapper {
        name: "perf",
        with_arg: "eoxrptCGIDjMFcm",
        long_with_arg: &[
            "event",
            "output",
            "field-separator",
            "repeat",
            "pid",
            "tid",
            "cpu",
        ],
        // Its subcommand (`stat`, `record`, `trace`), then the command it measures.
        operands: 1,
        dest: ("o", &["output"]),
        ..WRAPPER
    },
    Wrapper {
        name: "setpriv",
        long_with_arg: &[
            "reuid",
            "regid",
            "ruid",
            "euid",
            "rgid",
            "egid",
            "groups",
            "inh-caps",
            "ambient-caps",
            "bounding-set",
            "securebits",
            "pdeathsig",
            "selinux-label",
            "apparmor-profile",
            "landlock-access",
            "landlock-rule",
        ],
        ..WRAPPER
    },
    Wrapper {
        name: "firejail",
        ..WRAPPER
    },
    Wrapper {
        name: "fakeroot",
        with_arg: "lsib",
        long_with_arg: &["lib", "faked"],
        ..WRAPPER
    },
    Wrapper {
        name: "fakechroot",
        with_arg: "ecld",
        long_with_arg: &["environment", "config-dir", "lib", "elfloader"],
        ..WRAPPER
    },
    Wrapper {
        name: "proot",
        with_arg: "rbqwkivRSm",
        long_with_arg: &["rootfs", "bind", "qemu", "cwd", "kernel-release"],
        chdir: ("w", &["cwd"]),
        ..WRAPPER
    },
    Wrapper {
        name: "torsocks",
        with_arg: "upaP",
        ..WRAPPER
    },
    Wrapper {
        name: "proxychains",
        with_arg: "f",
        ..WRAPPER
    },
    Wrapper {
        name: "proxychains4",
        with_arg: "f",
        ..WRAPPER
    },
    Wrapper {
        name: "catchsegv",
        ..WRAPPER
    },
    Wrapper {
        name: "xvfb-run",
        with_arg: "efnpsw",
        long_with_arg: &[
            "error-file",
            "auth-file",
            "server-num",
            "xauth-protocol",
            "server-args",
            "wait",
        ],
        ..WRAPPER
    },
    Wrapper {
        name: "dbus-run-session",
        long_with_arg: &["config-file", "dbus-daemon"],
        ..WRAPPER
    },
    Wrapper {
        name: "systemd-inhibit",
        long_with_arg: &["what", "who", "why", "mode"],
        ..WRAPPER
    },
    Wrapper {
        name: "cgexec",
        with_arg: "g",
        ..WRAPPER
    },
    Wrapper {
        name: "numactl",
        with_arg: "impNCoLMSf",
        long_with_arg: &[
            "interleave",
            "preferred",
            "membind",
            "cpunodebind",
            "physcpubind",
            "offset",
            "length",
            "shmmode",
            "shm",
            "file",
            "shmid",
        ],
        ..WRAPPER
    },
    Wrapper {
        name: "faketime",
        operands: 1,
        ..WRAPPER
    },
    Wrapper {
        name: "command",
        no_command: "vV",
        ..WRAPPER
    },
    Wrapper {
        name: "builtin",
        ..WRAPPER
    },
    Wrapper {
        name: "exec",
        with_arg: "a",
        ..WRAPPER
    },
    Wrapper {
        name: "busybox",
        ..WRAPPER
    },
    Wrapper {
        name: "toybox",
        ..WRAPPER
    },
    Wrapper {
        name: "flock",
        with_arg: "wEc",
        long_with_arg: &["timeout", "conflict-exit-code", "command"],
        operands: 1,
        script: ("c", &["command"]),
        ..WRAPPER
    },
    Wrapper {
        name: "script",
        with_arg: "cEIOBTm",
        long_with_arg: &[
            "command",
            "echo",
            "log-in",
            "log-out",
            "log-io",
            "log-timing",
            "logging-format",
            "output-limit",
        ],
        operands: usize::MAX,
        script: ("c", &["command"]),
        ..WRAPPER
    },
    Wrapper {
        name: "su",
        with_arg: "cgGsw",
        long_with_arg: &[
            "command",
            "session-command",
            "group",
            "supp-group",
            "shell",
            "whitelist-environment",
        ],
        operands: usize::MAX,
        script: ("c", &["command", "session-command"]),
        bare_shell: true,
        ..WRAPPER
    },
];

/// Variables whose value is a command another program runs through a shell: the prompt
/// hook, the pagers, editors and ssh commands git, less, man and others run.
pub const CODE_VARIABLES: &[&str] = &[
    "PROMPT_COMMAND",
    "GIT_SSH_COMMAND",
    "GIT_SSH",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_EXTERNAL_DIFF",
    "GIT_ASKPASS",
    "GIT_PROXY_COMMAND",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "PAGER",
    "MANPAGER",
    "SYSTEMD_PAGER",
    "EDITOR",
    "VISUAL",
    "SUDO_EDITOR",
    "FCEDIT",
    "LESSOPEN",
    "LESSCLOSE",
    "BROWSER",
];

/// Files a shell runs when it starts (`~/.bashrc`, `/etc/profile.d/*`, …), by their
/// absolute path: text written to one is code.
pub fn startup_file(path: &str) -> bool {
    const IN_HOME: &[&str] = &[
        ".bashrc",
        ".bash_profile",
        ".bash_login",
        ".bash_logout",
        ".profile",
        ".zshrc",
        ".zshenv",
        ".zprofile",
        ".zlogin",
        ".kshrc",
        ".mkshrc",
        ".cshrc",
        ".tcshrc",
        ".login",
    ];
    const SYSTEM: &[&str] = &[
        "/etc/profile",
        "/etc/bash.bashrc",
        "/etc/bashrc",
        "/etc/zshrc",
        "/etc/zsh/zshrc",
        "/etc/zsh/zshenv",
        "/etc/zsh/zprofile",
        "/etc/environment",
        "/etc/csh.cshrc",
        "/etc/csh.login",
    ];
    let name = super::basename(path);
    IN_HOME.contains(&name)
        || SYSTEM.contains(&path)
        || path
            .strip_prefix("/etc/profile.d/")
            .is_some_and(|r| !r.is_empty())
}

/// A file cron reads jobs from, by its absolute path: `Some(fields)`, the fields before each
/// job's command (6 in the system's tables, which name a user; 5 in a user's), or 0 for a
/// script cron runs whole (`/etc/cron.daily/*`).
pub fn cron_file(path: &str) -> Option<usize> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        ["etc", "crontab"] | ["etc", "cron.d", _] => Some(6),
        [
            "etc",
            "cron.hourly" | "cron.daily" | "cron.weekly" | "cron.monthly",
            _,
        ] => Some(0),
        ["var", "spool", "cron", "crontabs", _] | ["var", "spool", "cron", _] => Some(5),
        _ => None,
    }
}

/// `runuser -u USER [--] CMD …` runs CMD directly; without `-u`, `runuser` reads like `su`.
pub const RUNUSER_AS: Wrapper = Wrapper {
    name: "runuser",
    with_arg: "ugGswc",
    long_with_arg: &[
        "user",
        "group",
        "supp-group",
        "shell",
        "whitelist-environment",
        "command",
        "session-command",
    ],
    script: ("c", &["command", "session-command"]),
    ..WRAPPER
};

/// The script `env -S 'A B' C` runs: the split strings, then the command's words (each
/// quoted when literal, a variable that is never set when known only at run time). It is
/// read as a shell script, which can only find more than `env` would run.
pub fn split_command<'a>(
    split: &[String],
    command: impl Iterator<Item = Option<&'a str>>,
) -> String {
    let mut text = split.join(" ");
    for literal in command {
        text.push(' ');
        match literal {
            Some(l) => text.push_str(&super::quote(l)),
            None => text.push_str("\"${__unknown_word}\""),
        }
    }
    text
}

/// Where a command given to `su` or `runuser` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuCommand {
    /// Attached to its option (`-cCMD`, `--command=CMD`).
    Attached(String),
    /// The word at this index.
    Word(usize),
}

/// The commands `su [opts] [-] [user] [args]` runs (`args` by their literal values, `None`
/// when known only at run time): every `-c CMD`, `-lc CMD`, `-cCMD`, `--command=CMD`,
/// `--comm CMD` and `--session-command CMD`; none means a login shell. Which one runs when
/// several are given depends on the version, so all are returned. The arguments after the
/// user go to the shell, so a `-c` there counts too — as does one inside any word that looks
/// like clustered options.
pub fn su_commands(args: &[Option<&str>]) -> Vec<SuCommand> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let Some(v) = args[i] else {
            i += 1;
            continue;
        };
        if let Some(long) = v.strip_prefix("--").filter(|l| !l.is_empty()) {
            let (name, inline) = match long.split_once('=') {
                Some((n, a)) => (n, Some(a)),
                None => (long, None),
            };
            if name.len() >= 2
                && ("command".starts_with(name) || "session-command".starts_with(name))
            {
                match inline {
                    Some(a) => out.push(SuCommand::Attached(a.to_owned())),
                    None => {
                        if i + 1 < args.len() {
                            out.push(SuCommand::Word(i + 1));
                        }
                        i += 1;
                    }
                }
            } else if inline.is_none()
                && [
                    "group",
                    "supp-group",
                    "shell",
                    "whitelist-environment",
                    "user",
                ]
                .contains(&name)
            {
                i += 1;
            }
            i += 1;
            continue;
        }
        if v.starts_with('-') && v.len() > 1 && v != "--" {
            for (k, c) in v.char_indices().skip(1) {
                let attached = &v[k + c.len_utf8()..];
                match c {
                    'c' => {
                        if attached.is_empty() {
                            if i + 1 < args.len() {
                                out.push(SuCommand::Word(i + 1));
                            }
                            i += 1;
                        } else {
                            out.push(SuCommand::Attached(attached.to_owned()));
                        }
                        break;
                    }
                    'g' | 'G' | 's' | 'w' | 'u' => {
                        if attached.is_empty() {
                            i += 1;
                        }
                        break;
                    }
                    _ => {}
                }
            }
        }
        i += 1;
    }
    out
}

/// The wrapper named `name` (a basename), if it is one.
pub fn wrapper(name: &str) -> Option<&'static Wrapper> {
    WRAPPERS.iter().find(|w| w.name == name)
}

/// Whether the long option `given` (without `--` and `=value`) names one of `names`, as
/// `getopt_long` reads it: exactly, or as an abbreviation (`--chd` for `--chdir`). An
/// abbreviation that fits several is taken as every one of them, so a caller errs on the side
/// of seeing an option's argument.
pub fn long_option_is(given: &str, names: &[&str]) -> bool {
    !given.is_empty() && names.iter().any(|n| n.starts_with(given))
}

/// Whether `word` is a shell assignment, `NAME=value` or `NAME+=value`.
pub fn is_assignment(word: &str) -> bool {
    word.split_once('=')
        .is_some_and(|(n, _)| is_identifier(n.strip_suffix('+').unwrap_or(n)))
}

/// A program, neither a shell nor a wrapper, with options whose argument is a shell command
/// it runs (`tar --to-command=CMD`, `rsync -e CMD`).
pub struct Runner {
    pub name: &'static str,
    /// Short options that take an argument.
    pub with_arg: &'static str,
    /// Long options that take an argument as the next word when not given `=`.
    pub long_with_arg: &'static [&'static str],
    /// Options (short, long) whose argument is a shell command.
    pub script: (&'static str, &'static [&'static str]),
    /// Long options whose argument, after `exec=`, is a shell command
    /// (`--checkpoint-action=exec=CMD`).
    pub exec_action: &'static [&'static str],
    /// Whether it takes old-style clustered options first (`tar xzf a.tar`).
    pub old_style: bool,
}

/// `tar`'s short options that take an argument.
pub const TAR_WITH_ARG: &str = "bfgCFHIKLNTVX";
/// `tar`'s long options that take an argument as the next word.
pub const TAR_LONG_WITH_ARG: &[&str] = &[
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
/// `rsync`'s options that take an argument.
pub const RSYNC_OPTIONS: (&str, &[&str]) = (
    "eBfTM",
    &["rsh", "filter", "exclude", "include", "rsync-path"],
);

/// Every program whose options run a shell command.
pub const RUNNERS: &[Runner] = &[
    Runner {
        name: "tar",
        with_arg: TAR_WITH_ARG,
        long_with_arg: TAR_LONG_WITH_ARG,
        script: (
            "FI",
            &[
                "to-command",
                "use-compress-program",
                "info-script",
                "new-volume-script",
            ],
        ),
        exec_action: &["checkpoint-action"],
        old_style: true,
    },
    Runner {
        name: "rsync",
        with_arg: RSYNC_OPTIONS.0,
        long_with_arg: RSYNC_OPTIONS.1,
        script: ("e", &["rsh"]),
        exec_action: &[],
        old_style: false,
    },
];

/// The runner named `name` (a basename), if it is one.
pub fn runner(name: &str) -> Option<&'static Runner> {
    RUNNERS.iter().find(|r| r.name == name)
}

/// Old-style clustered options (`tar xzf a.tar` is `tar -x -z -f a.tar`): the first word,
/// when it does not start with `-`, split into options, each of `with_arg` taking the next
/// word.
pub fn old_style(args: &[ShellWord], with_arg: &str) -> Vec<ShellWord> {
    let Some(first) = args.first().and_then(|w| w.literal.as_deref()) else {
        return args.to_vec();
    };
    if first.starts_with('-') || first.is_empty() {
        return args.to_vec();
    }
    let mut expanded: Vec<ShellWord> = Vec::new();
    let mut rest = args[1..].iter();
    for c in first.chars() {
        expanded.push(word(&format!("-{c}")));
        if with_arg.contains(c)
            && let Some(value) = rest.next()
        {
            expanded.push(value.clone());
        }
    }
    expanded.extend(rest.cloned());
    expanded
}

/// A literal word.
pub fn word(text: &str) -> ShellWord {
    ShellWord {
        literal: Some(text.to_owned()),
        source: text.to_owned(),
        if_empty: None,
    }
}

/// A command's arguments read the getopt way.
#[derive(Debug, Default)]
pub struct Scanned {
    /// Options as written (`-t`, `--target`), with their argument.
    pub options: Vec<(String, Option<ShellWord>)>,
    pub operands: Vec<ShellWord>,
    /// Where the wrapped command starts, for a wrapper.
    pub command: Option<usize>,
}

impl Scanned {
    /// Arguments of the options named (short letters, long names or their abbreviations).
    pub fn values<'s>(
        &'s self,
        (short, long): (&'s str, &'s [&'s str]),
    ) -> impl Iterator<Item = Option<&'s ShellWord>> + 's {
        self.options
            .iter()
            .filter(move |(name, _)| option_is(name, short, long))
            .map(|(_, value)| value.as_ref())
    }

    pub fn has(&self, short: &str, long: &[&str]) -> bool {
        self.options
            .iter()
            .any(|(name, _)| option_is(name, short, long))
    }
}

/// Whether `name` (`-x` or `--long`, possibly abbreviated) is one of these options.
pub fn option_is(name: &str, short: &str, long: &[&str]) -> bool {
    if let Some(l) = name.strip_prefix("--") {
        long_option_is(l, long)
    } else {
        name.strip_prefix('-')
            .is_some_and(|c| !c.is_empty() && short.contains(c))
    }
}

/// Whether a word whose value is known only at run time may start with `-`.
pub fn maybe_option(w: &ShellWord) -> bool {
    w.literal.is_none() && w.source.starts_with(['$', '`', '-', '<', '>', '~'])
}

/// Reads `args` as options and operands. `operands` is how many operands come before a
/// wrapped command (`usize::MAX`: there is none); `assignments` skips `NAME=value` words.
/// A word known only at run time where an option may stand is an error: it could be any
/// option.
pub fn scan(
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
                Some((n, v)) => (n, Some(word(v))),
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
                    Some(word(rest))
                };
                out.options.push((format!("-{c}"), value));
                break;
            }
            out.options.push((format!("-{c}"), None));
        }
    }
    Ok(out)
}

/// Why a word known only at run time cannot stand where an option may.
pub fn unknown_option(w: &ShellWord) -> String {
    format!(
        "`{}` is known only when it runs and could be an option, so it cannot be judged \
         (put `--` before the operands)",
        w.source
    )
}

/// Why a word known only at run time cannot stand where a refused option may.
pub fn unknown_argument(w: &ShellWord) -> String {
    format!(
        "`{}` is known only when it runs and could be a refused option",
        w.source
    )
}

/// Whether `s` holds a glob character (`*`, `?`, `[`).
pub fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// A command name that is a glob (`/bin/r?`): the shell runs whatever file it matches.
pub fn is_glob_name(name: &str) -> bool {
    !matches!(name, "[" | "[[") && has_glob(name)
}

/// Shell glob matching (`*`, `?`, `[…]`, `[!…]`) of a short name; dynamic programming, so no
/// pattern can make it backtrack exponentially.
pub fn glob_match(pattern: &str, name: &str) -> bool {
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

/// Programs a policy judges by name that are in none of the tables above. A command name
/// that is a pattern is walked as each name these and the tables hold that it can match.
const NAMED: &[&str] = &[
    "rm",
    "rmdir",
    "unlink",
    "shred",
    "truncate",
    "srm",
    "wipe",
    "chmod",
    "chown",
    "chgrp",
    "dd",
    "mkfs",
    "mkfs.ext4",
    "mkfs.ext3",
    "mkfs.ext2",
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
    "service",
    "tee",
    "cp",
    "mv",
    "install",
    "ln",
    "touch",
    "mkdir",
    "sed",
    "git",
    "kill",
    "killall",
    "pkill",
    "find",
    "xargs",
    "eval",
    "trap",
    "alias",
    "watch",
    "su",
    "runuser",
    "cd",
    "source",
    "crontab",
    "passwd",
    "useradd",
    "userdel",
    "usermod",
    "iptables",
    "nft",
    "ufw",
    "fdisk",
    "sfdisk",
    "parted",
    "gdisk",
];

/// Programs that run what is typed into them later, so that it cannot be judged line by line:
/// a shell escape (`:!` in vi and ex, `!` in less, more, ftp and sftp, `\!` in psql and mysql,
/// `shell` in gdb, `.shell` in sqlite3, `~!` in mail), an editor, pager or file manager that
/// starts a command or another program that does, a prompt whose input is code, and programs
/// that start an editor on a file (`crontab`, `visudo`). In that order: editors, pagers and
/// what shows its output through one, file managers and terminal front-ends, database,
/// debugger, transfer and mail clients, prompts. (Shells are not among them: what is typed into
/// a shell is a shell line, judged as such.)
#[rustfmt::skip]
pub const SHELL_ESCAPES: &[&str] = &[
    "vi", "vim", "nvim", "view", "vimdiff", "gvim", "ex", "edit", "vedit", "emacs", "emacs-nox",
    "nano", "pico", "mcedit", "joe", "jed", "ne", "micro", "ed", "kak", "helix", "hx", "less",
    "more", "most", "pg", "man", "info", "pinfo", "perldoc", "pydoc", "ri", "mc", "ranger",
    "nnn", "vifm", "lf", "tig", "fzf", "psql", "mysql", "mariadb", "sqlite3", "mongo",
    "mongosh", "cqlsh", "gdb", "lldb", "pdb", "ftp", "sftp", "lftp", "tftp", "ncftp", "mail",
    "mailx", "s-nail", "mutt", "neomutt", "ipython", "bpython", "irb", "pry", "ghci", "erl",
    "iex", "jshell", "groovysh", "scala", "julia", "R", "tclsh", "wish", "expect", "guile",
    "racket", "sbcl", "clisp", "ocaml", "swipl", "dc", "crontab", "visudo", "vipw", "vigr",
    "sudoedit",
];

/// Options after which an interpreter reads code from what is typed (`python -i`, `python -m
/// pdb`, `perl -d`, `php -a`, a script on standard input `-`).
const PROMPT_OPTIONS: &[&str] = &["-", "-i", "--interactive", "-m", "-d", "-a"];

/// Whether `name` (a basename) with `args` runs what is typed into it: one of
/// [`SHELL_ESCAPES`], or an interpreter given neither inline code nor a script (its prompt,
/// or its standard input read as a script). A word known only when it runs counts as an
/// option that could start a prompt.
pub fn runs_typed_input(name: &str, args: &[ShellWord]) -> bool {
    if SHELL_ESCAPES.contains(&name) {
        return true;
    }
    let Some(interpreter) = interpreter(name) else {
        return false;
    };
    let mut operand = false;
    for a in args {
        let Some(a) = a.literal.as_deref() else {
            return true;
        };
        if PROMPT_OPTIONS.contains(&a) {
            return true;
        }
        if let Some(long) = a.strip_prefix("--") {
            let given = long.split('=').next().unwrap_or_default();
            if long_option_is(given, interpreter.long_inline) {
                return false;
            }
        } else if let Some(short) = a.strip_prefix('-') {
            if short.chars().any(|c| interpreter.inline.contains(c)) {
                return false;
            }
        } else {
            operand = true;
        }
    }
    !operand
}

/// Whether a running program named `name` (the kernel's name for it) is one that runs what is
/// typed into it: one of [`SHELL_ESCAPES`], or an interpreter.
pub fn typed_input_program(name: &str) -> bool {
    SHELL_ESCAPES.contains(&name) || interpreter(name).is_some()
}

/// Every program name the table knows: [`NAMED`], the shells, interpreters, wrappers and
/// runners.
pub fn known_names() -> impl Iterator<Item = &'static str> {
    NAMED
        .iter()
        .copied()
        .chain(SHELLS.iter().copied())
        .chain(INTERPRETERS.iter().map(|i| i.name))
        .chain(WRAPPERS.iter().map(|w| w.name))
        .chain(RUNNERS.iter().map(|r| r.name))
}

/// `find`'s arguments (after its name): its start paths, and the expression's words.
pub fn find_parts(args: &[ShellWord]) -> (&[ShellWord], &[ShellWord]) {
    let lit = |w: &ShellWord| w.literal.clone();
    let mut i = 0;
    while let Some(v) = args.get(i).and_then(lit) {
        if matches!(v.as_str(), "-H" | "-L" | "-P") || v.starts_with("-D") || v.starts_with("-O") {
            i += 1;
        } else {
            break;
        }
    }
    let starts = args[i..]
        .iter()
        .take_while(|w| {
            w.literal
                .as_deref()
                .is_some_and(|v| !v.starts_with('-') && v != "(" && v != "!")
        })
        .count();
    (&args[i..i + starts], &args[i + starts..])
}

/// `find`'s first start path when nothing in its expression filters what it visits (only
/// actions and options that do not), so that `-exec`'s `{}` is first that path itself.
pub fn find_unfiltered(args: &[ShellWord]) -> Option<&ShellWord> {
    let (starts, expr) = find_parts(args);
    let mut k = 0;
    while let Some(w) = expr.get(k) {
        match w.literal.as_deref() {
            Some("-exec" | "-execdir" | "-ok" | "-okdir") => {
                k += 1;
                while let Some(w) = expr.get(k) {
                    k += 1;
                    if matches!(w.literal.as_deref(), Some(";" | "+")) {
                        break;
                    }
                }
                continue;
            }
            Some(
                "-delete"
                | "-depth"
                | "-xdev"
                | "-mount"
                | "-follow"
                | "-noleaf"
                | "-print"
                | "-print0"
                | "-ignore_readdir_race",
            ) => {}
            Some("-maxdepth" | "-mindepth") => k += 1,
            _ => return None,
        }
        k += 1;
    }
    starts.first()
}

/// What an operand of a [`DataProgram`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// A file's path.
    Path,
    /// A name: a unit, a service.
    Name,
    /// Anything else (a mode, an owner, a verb, a script): only its exact text is the same.
    Exact,
}

/// A program whose operands are data — paths and names, never code — with every option it
/// takes (an option not listed makes the whole command count as code). "Allow in this
/// thread" lets such operands differ ([`super::cover`]); every argument of every program
/// not listed here (a shell, an interpreter, a wrapper, a runner, `awk`, `find`, `xargs`, …)
/// is taken as code.
pub struct DataProgram {
    pub name: &'static str,
    /// Short options without an argument.
    pub flags: &'static str,
    /// Short options with an argument, attached or the next word.
    pub with_arg: &'static str,
    /// Short options whose argument, if any, is the rest of their word (`sed -i.bak`).
    pub attached: &'static str,
    /// Long options without an argument (an optional `=value` is allowed).
    pub long_flags: &'static [&'static str],
    /// Long options with an argument, after `=` or as the next word.
    pub long_with_arg: &'static [&'static str],
    /// Its operands in order; the last one repeats.
    pub operands: &'static [Operand],
    /// Options (short, long) that hold its script; without any of them its first operand is
    /// the script (`sed 's/a/b/' f`, `sed -e 's/a/b/' f`).
    pub script: (&'static str, &'static [&'static str]),
}

const DATA: DataProgram = DataProgram {
    name: "",
    flags: "",
    with_arg: "",
    attached: "",
    long_flags: &[],
    long_with_arg: &[],
    operands: &[Operand::Path],
    script: ("", &[]),
};

/// Options every GNU tool takes.
const COMMON_LONG: &[&str] = &["help", "version"];

/// `chown`'s and `chgrp`'s options.
const CHOWN_LONG: &[&str] = &[
    "changes",
    "silent",
    "quiet",
    "verbose",
    "dereference",
    "no-dereference",
    "no-preserve-root",
    "preserve-root",
    "recursive",
    "help",
    "version",
];

/// `cp`'s, `mv`'s and `ln`'s options without an argument.
const COPY_LONG: &[&str] = &[
    "archive",
    "attributes-only",
    "backup",
    "copy-contents",
    "dereference",
    "force",
    "interactive",
    "link",
    "no-clobber",
    "no-dereference",
    "parents",
    "preserve",
    "recursive",
    "reflink",
    "remove-destination",
    "strip-trailing-slashes",
    "symbolic-link",
    "no-target-directory",
    "update",
    "verbose",
    "one-file-system",
    "context",
    "debug",
    "exchange",
    "no-copy",
    "directory",
    "logical",
    "physical",
    "relative",
    "symbolic",
    "help",
    "version",
];

/// `systemctl`'s options without an argument.
const SYSTEMCTL_LONG: &[&str] = &[
    "all",
    "recursive",
    "reverse",
    "after",
    "before",
    "with-dependencies",
    "failed",
    "show-types",
    "ignore-inhibitors",
    "dry-run",
    "quiet",
    "no-warn",
    "wait",
    "no-block",
    "no-wall",
    "no-reload",
    "no-ask-password",
    "global",
    "runtime",
    "force",
    "now",
    "plain",
    "full",
    "no-pager",
    "no-legend",
    "user",
    "system",
    "firmware-setup",
    "help",
    "version",
];

/// Every program whose operands are data, once.
pub const DATA_PROGRAMS: &[DataProgram] = &[
    DataProgram {
        name: "rm",
        flags: "fiIrRdv",
        long_flags: &[
            "force",
            "interactive",
            "one-file-system",
            "no-preserve-root",
            "preserve-root",
            "recursive",
            "dir",
            "verbose",
            "help",
            "version",
        ],
        ..DATA
    },
    DataProgram {
        name: "rmdir",
        flags: "pv",
        long_flags: &[
            "ignore-fail-on-non-empty",
            "parents",
            "verbose",
            "help",
            "version",
        ],
        ..DATA
    },
    DataProgram {
        name: "unlink",
        long_flags: COMMON_LONG,
        ..DATA
    },
    DataProgram {
        name: "shred",
        flags: "fuvxz",
        with_arg: "ns",
        long_flags: &[
            "force", "remove", "verbose", "exact", "zero", "help", "version",
        ],
        long_with_arg: &["iterations", "size", "random-source"],
        ..DATA
    },
    DataProgram {
        name: "truncate",
        flags: "co",
        with_arg: "rs",
        long_flags: &["no-create", "io-blocks", "help", "version"],
        long_with_arg: &["reference", "size"],
        ..DATA
    },
    DataProgram {
        name: "mkdir",
        flags: "pvZ",
        with_arg: "m",
        long_flags: &["parents", "verbose", "context", "help", "version"],
        long_with_arg: &["mode"],
        ..DATA
    },
    DataProgram {
        name: "touch",
        flags: "acfhm",
        with_arg: "drt",
        long_flags: &["no-create", "no-dereference", "help", "version"],
        long_with_arg: &["date", "reference", "time"],
        ..DATA
    },
    DataProgram {
        name: "cp",
        flags: "abdfHiLlnPprsuvxRTZ",
        with_arg: "St",
        long_flags: COPY_LONG,
        long_with_arg: &["suffix", "target-directory", "no-preserve", "sparse"],
        ..DATA
    },
    DataProgram {
        name: "mv",
        flags: "bfinTuvZ",
        with_arg: "St",
        long_flags: COPY_LONG,
        long_with_arg: &["suffix", "target-directory"],
        ..DATA
    },
    DataProgram {
        name: "ln",
        flags: "bdFfinLPrsTv",
        with_arg: "St",
        long_flags: COPY_LONG,
        long_with_arg: &["suffix", "target-directory"],
        ..DATA
    },
    DataProgram {
        name: "chmod",
        flags: "cfvR",
        long_flags: &[
            "changes",
            "silent",
            "quiet",
            "verbose",
            "no-preserve-root",
            "preserve-root",
            "recursive",
            "help",
            "version",
        ],
        long_with_arg: &["reference"],
        operands: &[Operand::Exact, Operand::Path],
        ..DATA
    },
    DataProgram {
        name: "chown",
        flags: "cfvRhHLP",
        long_flags: CHOWN_LONG,
        long_with_arg: &["reference", "from"],
        operands: &[Operand::Exact, Operand::Path],
        ..DATA
    },
    DataProgram {
        name: "chgrp",
        flags: "cfvRhHLP",
        long_flags: CHOWN_LONG,
        long_with_arg: &["reference"],
        operands: &[Operand::Exact, Operand::Path],
        ..DATA
    },
    DataProgram {
        name: "sed",
        flags: "nrEsuz",
        with_arg: "efl",
        attached: "i",
        long_flags: &[
            "quiet",
            "silent",
            "debug",
            "posix",
            "regexp-extended",
            "separate",
            "sandbox",
            "unbuffered",
            "null-data",
            "follow-symlinks",
            "in-place",
            "help",
            "version",
        ],
        long_with_arg: &["expression", "file", "line-length"],
        script: ("ef", &["expression", "file"]),
        ..DATA
    },
    DataProgram {
        name: "systemctl",
        flags: "arqfil",
        with_arg: "tpPHMnos",
        long_flags: SYSTEMCTL_LONG,
        long_with_arg: &[
            "type",
            "property",
            "state",
            "job-mode",
            "kill-whom",
            "kill-value",
            "signal",
            "what",
            "root",
            "image",
            "host",
            "machine",
            "lines",
            "output",
            "timestamp",
            "message",
            "preset-mode",
            "check-inhibitors",
            "when",
            "drop-in",
            "reboot-argument",
            "boot-loader-menu",
            "boot-loader-entry",
        ],
        operands: &[Operand::Exact, Operand::Name],
        ..DATA
    },
    DataProgram {
        name: "service",
        long_flags: &["status-all", "help", "version"],
        operands: &[Operand::Name, Operand::Exact],
        ..DATA
    },
];

/// The program named `name` (as written, not a path) whose operands are data, if it is one.
pub fn data_program(name: &str) -> Option<&'static DataProgram> {
    DATA_PROGRAMS.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_in_the_table_once() {
        let mut names: Vec<&str> = WRAPPERS.iter().map(|w| w.name).collect();
        names.extend(SHELLS);
        names.extend(INTERPRETERS.iter().map(|i| i.name));
        names.extend(RUNNERS.iter().map(|r| r.name));
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a name appears twice");
    }

    /// A program whose operands are data is none that runs code: no shell, interpreter,
    /// wrapper or runner, and no program the walk follows into a command (`find`, `xargs`).
    #[test]
    fn data_programs_run_no_code() {
        let mut names: Vec<&str> = DATA_PROGRAMS.iter().map(|p| p.name).collect();
        for p in DATA_PROGRAMS {
            assert!(
                !SHELLS.contains(&p.name)
                    && interpreter(p.name).is_none()
                    && wrapper(p.name).is_none()
                    && runner(p.name).is_none()
                    && ![
                        "find", "xargs", "eval", "source", ".", "watch", "su", "runuser"
                    ]
                    .contains(&p.name),
                "{} runs code",
                p.name
            );
            let shorts: String = [p.flags, p.with_arg, p.attached].concat();
            let mut letters: Vec<char> = shorts.chars().collect();
            letters.sort_unstable();
            letters.dedup();
            assert_eq!(letters.len(), shorts.len(), "{}: a letter twice", p.name);
        }
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a data program appears twice");
    }

    #[test]
    fn option_syntax() {
        assert!(long_option_is("chd", &["chdir"]));
        assert!(long_option_is("chdir", &["chdir"]));
        assert!(!long_option_is("", &["chdir"]));
        assert!(!long_option_is("chdirx", &["chdir"]));
        assert!(is_assignment("X=1"));
        assert!(is_assignment("X+=1"));
        assert!(!is_assignment("1X=1"));
        assert!(!is_assignment("--x=1"));
        assert!(interpreter("python3.12").is_some());
        assert!(interpreter("perl5").is_some());
        assert!(interpreter("nodejs").is_some());
        assert!(interpreter("pythonista").is_none());
    }

    #[test]
    fn programs_that_run_what_is_typed_into_them() {
        let runs = |line: &str| {
            let mut words = line.split_whitespace().map(word);
            let name = words.next().unwrap();
            runs_typed_input(name.literal.as_deref().unwrap(), &words.collect::<Vec<_>>())
        };
        for yes in [
            "vim f",
            "less f",
            "man ls",
            "psql",
            "mysql -u x",
            "gdb ./a",
            "ftp host",
            "python3",
            "python3 -q",
            "python3 -i s.py",
            "python3 -m pdb s.py",
            "perl",
            "node",
            "irb",
            "php -a",
            "sqlite3 db",
        ] {
            assert!(runs(yes), "{yes}");
        }
        for no in [
            "ls",
            "cat f",
            "bash",
            "sh -c x",
            "python3 s.py",
            "python3 -c print(1)",
            "perl -e 1",
            "node --eval 1",
            "node s.js",
            "ruby s.rb",
            "grep x",
        ] {
            assert!(!runs(no), "{no}");
        }
        // A word known only when it runs could be the option that starts a prompt.
        let unknown = ShellWord {
            literal: None,
            ..word("$X")
        };
        assert!(runs_typed_input("python3", &[unknown]));
        assert!(typed_input_program("vim") && typed_input_program("python3.12"));
        assert!(!typed_input_program("bash") && !typed_input_program("sleep"));
    }
}
