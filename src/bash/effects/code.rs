//! Programs that run code they are given as data, read the way the programs read it: the
//! program text of `awk` and `sed`, the command lines of `vim`, `ed` and `gdb` (each a
//! [`Effect::Script`] in its own language, for a policy to judge: those languages can run
//! shell commands), and the shell commands some programs take in their configuration or
//! options — `git -c alias.x='!…'` and the other settings that name a command, `git rebase
//! --exec`, `git bisect run`, `git submodule foreach`, recipes of a makefile read from the
//! input, jobs given to `at` and `crontab`, `apt -o …::Pre-Invoke=…`, `zip -TT` — walked as
//! the shell code they are.

use std::sync::Arc;

use super::{Effect, Nesting, Stdin, Walk};
use crate::bash::parse::ShellWord;
use crate::bash::spec::{self, maybe_option, unknown_option};

impl Walk {
    /// The code a program takes as data, when `base` is one that does; false otherwise.
    pub(super) fn code_taker(
        &mut self,
        base: &str,
        args: &[ShellWord],
        what: &Arc<str>,
        depth: usize,
        stdin: &Stdin,
    ) -> bool {
        match base {
            "awk" | "gawk" | "mawk" | "nawk" => self.awk(args, what),
            "sed" | "gsed" => self.sed(args, what),
            "vim" | "vi" | "nvim" | "ex" | "view" | "vimdiff" | "gvim" | "gview" | "evim"
            | "vimx" => self.vim(base, args, what, depth, stdin),
            "ed" => self.reads_input("ed", false, stdin.clone(), what, depth),
            "gdb" => self.gdb(args, what, depth, stdin),
            "git" => self.git(args, what, depth),
            "make" | "gmake" => self.make(args, what, depth, stdin),
            "at" | "batch" => self.at(args, what, depth, stdin),
            "crontab" => self.crontab(args, what, depth, stdin),
            "apt" | "apt-get" | "aptitude" | "apt-cache" => self.apt(args, what, depth),
            "zip" => {
                for (k, w) in args.iter().enumerate() {
                    if matches!(w.literal.as_deref(), Some("-TT" | "--unzip-command")) {
                        self.nested("sh", Nesting::Option, args.get(k + 1), what, depth);
                    }
                }
            }
            _ => return false,
        }
        true
    }

    /// A script in a language other than the shell's, for a policy to judge.
    fn foreign(&mut self, language: &str, how: Nesting, code: Option<&ShellWord>, what: &Arc<str>) {
        self.push(Effect::Script {
            language: language.to_owned(),
            how,
            code: code.and_then(|c| c.literal.clone()),
            what: what.clone(),
        });
    }

    /// `awk [-v …] 'PROGRAM' FILE…`, `awk -f FILE`, `gawk -e PROGRAM`.
    fn awk(&mut self, args: &[ShellWord], what: &Arc<str>) {
        let Some(s) = self.options(
            args,
            "FvfeilE",
            &[
                "field-separator",
                "assign",
                "file",
                "source",
                "include",
                "load",
                "exec",
            ],
            what,
        ) else {
            return;
        };
        let sources: Vec<Option<&ShellWord>> = s.values(("e", &["source"])).collect();
        for code in &sources {
            self.foreign("awk", Nesting::Inline, *code, what);
        }
        if s.has("fE", &["file", "exec"]) {
            return self.foreign("awk", Nesting::File, None, what);
        }
        if sources.is_empty() {
            match s.operands.first() {
                Some(program) => self.foreign("awk", Nesting::Inline, Some(program), what),
                None => self.opaque(what.clone(), "it runs awk with no program it can read"),
            }
        }
    }

    /// `sed [-n] SCRIPT FILE…`, `sed -e SCRIPT…`, `sed -f FILE`; `--sandbox` runs no
    /// command and writes no file.
    fn sed(&mut self, args: &[ShellWord], what: &Arc<str>) {
        let Some(s) = self.options(args, "efl", &["expression", "file", "line-length"], what)
        else {
            return;
        };
        if s.has("", &["sandbox"]) {
            return;
        }
        let expressions: Vec<Option<&ShellWord>> = s.values(("e", &["expression"])).collect();
        if s.has("f", &["file"]) {
            self.foreign("sed", Nesting::File, None, what);
        }
        if expressions.is_empty() {
            if !s.has("f", &["file"]) {
                self.foreign("sed", Nesting::Inline, s.operands.first(), what);
            }
            return;
        }
        let text: Option<Vec<&str>> = expressions
            .iter()
            .map(|e| e.and_then(|w| w.literal.as_deref()))
            .collect();
        let joined = text.map(|t| spec::word(&t.join("\n")));
        let unknown = ShellWord {
            literal: None,
            source: what.to_string(),
            if_empty: None,
        };
        self.foreign(
            "sed",
            Nesting::Inline,
            Some(joined.as_ref().unwrap_or(&unknown)),
            what,
        );
    }

    /// `vim -c CMD`, `vim --cmd CMD`, `vim +CMD`, and ex mode (`vim -es`, `ex`) reading its
    /// commands from the input.
    fn vim(
        &mut self,
        base: &str,
        args: &[ShellWord],
        what: &Arc<str>,
        depth: usize,
        stdin: &Stdin,
    ) {
        let ex = base == "ex"
            || args.iter().any(|w| {
                w.literal.as_deref().is_some_and(|l| {
                    l.starts_with('-') && !l.starts_with("--") && l[1..].contains(['e', 'E'])
                })
            });
        let mut k = 0;
        while let Some(w) = args.get(k) {
            k += 1;
            let Some(l) = w.literal.as_deref() else {
                if maybe_option(w) {
                    return self.opaque(what.clone(), unknown_option(w));
                }
                continue;
            };
            match l {
                "--" => break,
                "-c" | "--cmd" => {
                    let code = args.get(k);
                    k += 1;
                    if let Some(c) = code {
                        self.foreign("vim", Nesting::Inline, Some(c), what);
                    }
                }
                // In ex mode `-s` is silent mode, else it names a script of keystrokes.
                "-s" if ex => {}
                "-S" | "-s" | "-u" | "-U" | "-i" | "-T" | "-w" | "-W" | "-t" | "-q" | "-r"
                | "--servername" | "--remote-send" | "--remote-expr" => {
                    if matches!(l, "--remote-send" | "--remote-expr") {
                        self.foreign("vim", Nesting::Inline, args.get(k), what);
                    } else if matches!(l, "-S" | "-s") {
                        self.foreign("vim", Nesting::File, None, what);
                    }
                    k += 1;
                }
                _ if l.starts_with('+') && l.len() > 1 => {
                    let cmd = spec::word(&l[1..]);
                    self.foreign("vim", Nesting::Inline, Some(&cmd), what);
                }
                _ => {}
            }
        }
        if ex {
            self.reads_input("vim", false, stdin.clone(), what, depth);
        }
    }

    /// `gdb -ex CMD`, `gdb -x FILE`, its commands on the input, and `gdb --args PROG ARGS`,
    /// which runs PROG.
    fn gdb(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let mut k = 0;
        while let Some(w) = args.get(k) {
            k += 1;
            let Some(l) = w.literal.as_deref() else {
                if maybe_option(w) {
                    return self.opaque(what.clone(), unknown_option(w));
                }
                continue;
            };
            let (name, attached) = match l.split_once('=') {
                Some((n, v)) if n.starts_with('-') => (n, Some(v)),
                _ => (l, None),
            };
            let name = name.trim_start_matches('-');
            match name {
                "ex" | "eval-command" | "iex" | "init-eval-command" => {
                    let code = match attached {
                        Some(v) => Some(spec::word(v)),
                        None => {
                            k += 1;
                            args.get(k - 1).cloned()
                        }
                    };
                    self.foreign("gdb", Nesting::Inline, code.as_ref(), what);
                }
                "x" | "command" | "ix" | "init-command" => {
                    self.foreign("gdb", Nesting::File, None, what);
                    k += usize::from(attached.is_none());
                }
                "args" => return self.unwrapped(&args[k..], what, depth, None),
                "p" | "pid" | "c" | "core" | "cd" | "d" | "directory" | "s" | "symbols" | "e"
                | "exec" | "se" | "b" | "l" | "tty" | "D" | "data-directory" | "i"
                | "interpreter" => k += usize::from(attached.is_none()),
                _ => {}
            }
        }
        if stdin.is_some() {
            self.reads_input("gdb", false, stdin.clone(), what, depth);
        }
    }

    /// `git`: configuration given on the command line (`-c KEY=VALUE`) or stored (`git
    /// config KEY VALUE`) that names a command, and the subcommands that run one.
    fn git(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        let mut i = 0;
        while let Some(w) = args.get(i) {
            let Some(l) = w.literal.as_deref() else {
                if maybe_option(w) {
                    return self.opaque(what.clone(), unknown_option(w));
                }
                break;
            };
            match l {
                "-c" => {
                    if let Some(setting) = args.get(i + 1) {
                        let Some(s) = setting.literal.as_deref() else {
                            return self.opaque(
                                what.clone(),
                                format!(
                                    "the setting `{}` is known only when it runs and may name a \
                                     command git runs",
                                    setting.source
                                ),
                            );
                        };
                        let (key, value) = s.split_once('=').unwrap_or((s, "true"));
                        self.git_setting(key, value, what, depth);
                    }
                    i += 2;
                }
                "--config-env" | "-C" | "--git-dir" | "--work-tree" | "--namespace"
                | "--super-prefix" => i += 2,
                _ if l.starts_with("--exec-path=") => {
                    return self.opaque(
                        what.clone(),
                        "`--exec-path` makes git run its commands from another directory",
                    );
                }
                _ if l.starts_with('-') => i += 1,
                _ => break,
            }
        }
        let Some(sub) = args.get(i).and_then(|w| w.literal.as_deref()) else {
            return;
        };
        let rest = &args[(i + 1).min(args.len())..];
        let option_code = |names: &[&str]| -> Vec<Option<ShellWord>> {
            let mut out = Vec::new();
            let mut k = 0;
            while let Some(w) = rest.get(k) {
                k += 1;
                let Some(l) = w.literal.as_deref() else {
                    continue;
                };
                if l == "--" {
                    break;
                }
                for n in names {
                    if l == *n {
                        out.push(rest.get(k).cloned());
                        k += 1;
                    } else if let Some(v) = l.strip_prefix(*n).and_then(|v| v.strip_prefix('=')) {
                        out.push(Some(spec::word(v)));
                    } else if n.len() == 2
                        && !n.starts_with("--")
                        && l.len() > 2
                        && l.starts_with(n)
                    {
                        out.push(Some(spec::word(&l[2..])));
                    }
                }
            }
            out
        };
        let codes = match sub {
            "rebase" => option_code(&["-x", "--exec"]),
            "difftool" | "mergetool" => option_code(&["-x", "--extcmd"]),
            "clone" | "fetch" | "pull" | "ls-remote" => option_code(&["-u", "--upload-pack"]),
            "archive" => option_code(&["--exec"]),
            "push" | "send-pack" => option_code(&["--receive-pack", "--exec"]),
            "filter-branch" => option_code(&[
                "--env-filter",
                "--tree-filter",
                "--index-filter",
                "--msg-filter",
                "--commit-filter",
                "--tag-name-filter",
                "--parent-filter",
            ]),
            "bisect" => {
                if let Some(k) = rest
                    .iter()
                    .position(|w| w.literal.as_deref() == Some("run"))
                {
                    self.unwrapped(&rest[k + 1..], what, depth, None);
                }
                Vec::new()
            }
            "submodule" => {
                if let Some(k) = rest
                    .iter()
                    .position(|w| w.literal.as_deref() == Some("foreach"))
                {
                    let words: Vec<ShellWord> = rest[k + 1..]
                        .iter()
                        .skip_while(|w| {
                            matches!(w.literal.as_deref(), Some("--recursive" | "-q" | "--quiet"))
                        })
                        .cloned()
                        .collect();
                    self.joined(&words, what, depth);
                }
                Vec::new()
            }
            "config" => {
                let values: Vec<&ShellWord> = rest
                    .iter()
                    .filter(|w| !w.literal.as_deref().is_some_and(|l| l.starts_with('-')))
                    .collect();
                if let [key, value, ..] = values.as_slice() {
                    match (key.literal.as_deref(), value.literal.as_deref()) {
                        (Some(k), Some(v)) => self.git_setting(k, v, what, depth),
                        (Some(k), None) if command_setting(k, "") => self.opaque(
                            what.clone(),
                            format!(
                                "it sets {k}, a command git runs, to text known only when it runs"
                            ),
                        ),
                        _ => {}
                    }
                }
                Vec::new()
            }
            _ => Vec::new(),
        };
        for code in codes {
            self.nested("sh", Nesting::Option, code.as_ref(), what, depth);
        }
    }

    /// One git setting: walked as shell code when it names a command git runs.
    fn git_setting(&mut self, key: &str, value: &str, what: &Arc<str>, depth: usize) {
        if !command_setting(key, value) {
            return;
        }
        let code = value.strip_prefix('!').unwrap_or(value);
        self.code("sh", Nesting::Option, code, what, depth);
    }

    /// `make -f -` (a makefile on the input) and `make --eval TEXT`: each recipe line and
    /// `$(shell …)` walked as the shell code it is.
    fn make(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let mut from_input = false;
        let mut texts: Vec<Option<String>> = Vec::new();
        let mut k = 0;
        while let Some(w) = args.get(k) {
            k += 1;
            let Some(l) = w.literal.as_deref() else {
                continue;
            };
            let (name, attached) = match l.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
                _ => (l, None),
            };
            let value = |k: &mut usize| match &attached {
                Some(v) => Some(Some(v.clone())),
                None => {
                    *k += 1;
                    args.get(*k - 1).map(|w| w.literal.clone())
                }
            };
            match name {
                "-f" | "--file" | "--makefile" => {
                    if let Some(Some(f)) = value(&mut k) {
                        from_input |= f == "-" || stdin_file(&f);
                    }
                }
                "-E" | "--eval" => texts.extend(value(&mut k)),
                _ if l.starts_with("-f") && l.len() > 2 => {
                    from_input |= &l[2..] == "-" || stdin_file(&l[2..]);
                }
                _ => {}
            }
        }
        if from_input {
            match stdin {
                Some((how, Some(text))) => {
                    self.foreign("make", *how, Some(&spec::word(text)), what);
                    texts.push(Some(text.clone()));
                }
                Some((how, None)) => self.foreign("make", *how, None, what),
                None => {}
            }
        }
        for text in texts {
            match text {
                Some(t) => {
                    for code in makefile_commands(&t) {
                        self.code("sh", Nesting::Option, &code, what, depth);
                    }
                }
                None => self.opaque(what.clone(), "it gives make text known only when it runs"),
            }
        }
    }

    /// `at TIME`, `batch`: the commands on the input run later, in a shell.
    fn at(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let lits: Vec<&str> = args.iter().filter_map(|w| w.literal.as_deref()).collect();
        if lits.iter().any(|l| {
            l.starts_with('-') && !l.starts_with("--") && l[1..].contains(['l', 'r', 'd', 'c'])
        }) {
            return;
        }
        if lits.iter().any(|l| l.starts_with("-f")) {
            return self.push(Effect::Script {
                language: "sh".into(),
                how: Nesting::File,
                code: None,
                what: what.clone(),
            });
        }
        self.reads_input("sh", true, stdin.clone(), what, depth);
    }

    /// `crontab FILE` or `crontab -` installs jobs: when their text is known (on the input,
    /// or a file the script wrote), each job's command is walked.
    fn crontab(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let mut file = None;
        let mut k = 0;
        while let Some(w) = args.get(k) {
            k += 1;
            match w.literal.as_deref() {
                Some("-u" | "-s") => k += 1,
                Some(l) if l.starts_with('-') && l.len() > 1 => {
                    if l[1..].contains(['l', 'r', 'e']) {
                        return;
                    }
                }
                _ => file = Some(w.clone()),
            }
        }
        let text = match file.as_ref().and_then(|f| f.literal.as_deref()) {
            None | Some("-") => stdin.as_ref().and_then(|(_, t)| t.clone()),
            Some(_) => file.as_ref().and_then(|f| self.written_file(f)).flatten(),
        };
        for job in text.iter().flat_map(|t| cron_commands(t, 5)) {
            self.code("sh", Nesting::Deferred, &job, what, depth);
        }
    }

    /// `apt-get -o KEY=VALUE`: the hooks (`…::Pre-Invoke`, `…::Post-Invoke`,
    /// `…::Pre-Install-Pkgs`) are shell commands apt runs.
    fn apt(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        let mut k = 0;
        while let Some(w) = args.get(k) {
            k += 1;
            let setting = match w.literal.as_deref() {
                Some("-o" | "--option") => {
                    k += 1;
                    args.get(k - 1)
                }
                Some(l) if l.starts_with("-o") && l.len() > 2 => {
                    let v = spec::word(&l[2..]);
                    self.apt_setting(&v, what, depth);
                    continue;
                }
                Some(l) if l.starts_with("--option=") => {
                    let v = spec::word(&l["--option=".len()..]);
                    self.apt_setting(&v, what, depth);
                    continue;
                }
                _ => None,
            };
            if let Some(s) = setting.cloned() {
                self.apt_setting(&s, what, depth);
            }
        }
    }

    fn apt_setting(&mut self, setting: &ShellWord, what: &Arc<str>, depth: usize) {
        let Some(text) = setting.literal.as_deref() else {
            return self.opaque(
                what.clone(),
                format!(
                    "the apt setting `{}` is known only when it runs",
                    setting.source
                ),
            );
        };
        let Some((key, value)) = text.split_once('=') else {
            return;
        };
        let key = key.to_ascii_lowercase();
        if key.contains("invoke") || key.contains("pre-install-pkgs") {
            self.code("sh", Nesting::Option, value, what, depth);
        }
    }
}

/// Whether a git setting names a command git runs (`alias.*` only when its value starts
/// with `!`; a setting that is a boolean there is none).
pub(crate) fn command_setting(key: &str, value: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let boolean = matches!(
        value.to_ascii_lowercase().as_str(),
        "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0" | ""
    );
    let parts: Vec<&str> = key.split('.').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    match (first, last) {
        ("alias", _) | ("credential", "helper") => value.starts_with('!'),
        ("core", "pager" | "editor" | "sshcommand" | "askpass" | "gitproxy") => true,
        ("core", "fsmonitor") | ("pager", _) => !boolean,
        ("sequence", "editor") => true,
        ("diff", "external" | "command" | "textconv") => true,
        ("difftool" | "mergetool" | "browser" | "man", "cmd" | "path") => true,
        ("merge", "driver") => true,
        ("filter", "clean" | "smudge" | "process") => true,
        ("gpg", "program") => true,
        ("remote", "uploadpack" | "receivepack" | "proxy") => true,
        ("uploadpack", "packobjectshook") => true,
        ("interactive", "difffilter") => true,
        _ => false,
    }
}

/// Whether a file name is the standard input.
fn stdin_file(name: &str) -> bool {
    matches!(name, "/dev/stdin" | "/dev/fd/0" | "/proc/self/fd/0")
}

/// The shell commands of a makefile's text: its recipe lines (a tab first, `@`, `-` and
/// `+` prefixes dropped) and the text of each `$(shell …)`.
fn makefile_commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(recipe) = line.strip_prefix('\t') {
            out.push(recipe.trim_start_matches(['@', '-', '+']).to_owned());
        }
        let mut rest = line;
        while let Some(at) = rest.find("$(shell ") {
            let inner = &rest[at + "$(shell ".len()..];
            let mut level = 1;
            let end = inner
                .char_indices()
                .find(|&(_, c)| {
                    level += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    level == 0
                })
                .map_or(inner.len(), |(k, _)| k);
            out.push(inner[..end].to_owned());
            rest = &inner[end..];
        }
    }
    out
}

/// The commands of a crontab's text: each job's command (after its five time fields or its
/// `@reboot`-style schedule, and in the system's tables the user), up to an unescaped `%`.
pub(super) fn cron_commands(text: &str, fields: usize) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let skip = match line.starts_with('@') {
            true => fields - 4,
            false => fields,
        };
        let mut rest = line;
        for _ in 0..skip {
            rest = rest.trim_start();
            rest = rest.find(char::is_whitespace).map_or("", |k| &rest[k..]);
        }
        let first = line.split_whitespace().next().unwrap_or_default();
        if !line.starts_with('@') && first.contains('=') {
            continue;
        }
        let mut command = String::new();
        let mut escaped = false;
        for c in rest.trim().chars() {
            if c == '%' && !escaped {
                break;
            }
            escaped = c == '\\';
            command.push(c);
        }
        if !command.is_empty() {
            out.push(command);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::START;
    use super::super::{Effect, walk};

    fn runs_rm(script: &str) -> bool {
        walk(script, START).iter().any(|e| {
            matches!(e, Effect::Program { argv, .. }
                if argv[0].literal.as_deref() == Some("rm") && argv.get(1).and_then(|w| w.literal.as_deref()) == Some("x"))
        })
    }

    fn scripts(script: &str) -> Vec<(String, Option<String>)> {
        walk(script, START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Script { language, code, .. } => Some((language, code)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn shell_commands_in_settings_and_options_are_walked() {
        for script in [
            "git -c alias.x='!rm x' x",
            "git -c core.pager='rm x' -p log",
            "git -c core.sshCommand='rm x #' fetch",
            "git rebase -x 'rm x' main",
            "git bisect run rm x",
            "git submodule foreach rm x",
            "git config alias.y '!rm x'",
            "make -f - <<< $'all:\\n\\trm x'",
            "at now <<< 'rm x'",
            "echo '* * * * * rm x' | crontab -",
            "apt-get -o APT::Update::Pre-Invoke::='rm x' update",
            "zip -q z.zip f -T -TT 'rm x'",
        ] {
            assert!(runs_rm(script), "{script}: {:?}", walk(script, START));
        }
        // Settings that name no command, and a non-shell alias.
        for script in [
            "git -c user.name=x commit",
            "git -c alias.st=status st",
            "make all",
        ] {
            assert!(!runs_rm(script), "{script}");
        }
    }

    #[test]
    fn programs_given_code_as_data_list_it_in_their_language() {
        assert_eq!(
            scripts("awk -F: 'BEGIN { system(\"id\") }' /etc/passwd"),
            [(
                "awk".to_owned(),
                Some("BEGIN { system(\"id\") }".to_owned())
            )]
        );
        assert_eq!(
            scripts("sed -n -e '1p' -e '1e id' f"),
            [("sed".to_owned(), Some("1p\n1e id".to_owned()))]
        );
        assert_eq!(scripts("vim -c '!id' f")[0].0, "vim");
        assert_eq!(scripts("ex -s -c 'call system(1)' -c 'qa!'").len(), 2);
        assert_eq!(
            scripts("ed -s f <<< '!id'")[0],
            ("ed".into(), Some("!id".into()))
        );
        assert_eq!(scripts("gdb -batch -ex 'shell id'")[0].0, "gdb");
        // `gdb --args PROG`: PROG runs.
        assert!(runs_rm("gdb -q -batch -ex run --args rm x"));
    }
}
