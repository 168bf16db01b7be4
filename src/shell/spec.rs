//! The one table of command specs both policies read: the shells, the interpreters that take
//! inline code, and the wrappers that run another command, with their option letters, the
//! long options that take an argument, their operands, and which options change the
//! directory, run a script or write a file. A command added here is seen through by the guard
//! and the workspace judge alike.
//!
//! It owns option syntax too (`getopt_long`: abbreviated long options, `NAME+=value`
//! assignments). It never judges a command.

use super::parse::is_identifier;

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
            "group",
            "supp-group",
            "shell",
            "whitelist-environment",
        ],
        operands: usize::MAX,
        script: ("c", &["command"]),
        bare_shell: true,
        ..WRAPPER
    },
];

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_in_the_table_once() {
        let mut names: Vec<&str> = WRAPPERS.iter().map(|w| w.name).collect();
        names.extend(SHELLS);
        names.extend(INTERPRETERS.iter().map(|i| i.name));
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a name appears twice");
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
}
