//! What "Allow in this thread" covers: a later command is covered exactly when its cover key
//! equals the allowed one's ([`cover`]).
//!
//! An operand may differ only where it is data — a path or a name — and that is decided by
//! an allow-list: the operands of the programs in [`spec::DATA_PROGRAMS`] (`rm`, `cp`,
//! `systemctl` …), read with every option those programs take. Everything else is code and
//! needs its exact text: every argument of every other program (shells and their `-c`,
//! interpreters and their `-c`/`-e`, `awk` programs, `find -exec`, `xargs`, wrappers, a URL
//! piped into a shell), a `sed` script, an option's value. A script is generalised only when
//! every command in it is such a program, written by its bare name, every word literal (none
//! known only when it runs), with no assignment, substitution, loop, function,
//! here-document or here-string; otherwise it is covered only by itself, character for
//! character (so a script piped, redirected or written into a shell never varies).
//!
//! A path is covered only within its class ([`Class`]): inside the workspace, in `/tmp`, in
//! the home directory, or elsewhere outside them. The root, top-level directories, the
//! system directories, the workspace and the home themselves and what holds them, other
//! people's homes, hidden (`.name`) paths and `..` need their exact text; a glob, a brace or
//! a `~` (which the parser reads alike quoted or not) makes the whole command exact. The
//! call's own environment variables are part of the key, and so is the directory whenever a
//! word that needs its exact text could depend on it.
//!
//! Never: decides anything (the caller compares keys); expands or runs anything; touches the
//! filesystem.

use serde_json::{Value, json};

use super::parse::{RedirectKind, ShellWord, parse_script};
use super::spec::{self, DataProgram, Operand};

/// Where a command would run, as its cover reads paths.
#[derive(Debug, Clone, Copy)]
pub struct Places<'a> {
    /// The directory it starts in, absolute on its host (otherwise relative paths need
    /// their exact text).
    pub cwd: &'a str,
    /// The section's workspace there, absolute.
    pub workspace: &'a str,
    /// The home directory there, when known.
    pub home: Option<&'a str>,
    /// The call's own environment variables.
    pub env: &'a [(String, String)],
}

/// What an allowance in a thread covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cover {
    /// Equal keys: an allowance of one covers the other.
    pub key: String,
    /// The command with each operand that may differ shown as its class (`rm -rf
    /// ‹workspace path›`); `None` when only this exact command is covered.
    pub form: Option<String>,
    /// What each class in `form` stands for.
    pub legend: Vec<String>,
    /// Whether it holds only in the same directory.
    pub same_dir: bool,
    /// Whether the call set environment variables, which must then be the same.
    pub same_env: bool,
}

impl Cover {
    /// What it covers, as a person reads it on an approval card (plain text, no markup).
    pub fn says(&self) -> String {
        let mut lines = match &self.form {
            None => vec!["exactly this command".to_string()],
            Some(form) => {
                let mut l = vec![format!("any command of the form: {form}")];
                l.extend(self.legend.iter().cloned());
                l
            }
        };
        let mut tail = Vec::new();
        if self.same_dir {
            tail.push("in this directory");
        }
        if self.same_env {
            tail.push("with the same environment variables");
        }
        if !tail.is_empty() {
            lines.push(format!("(run {})", tail.join(", ")));
        }
        lines.join("\n")
    }
}

/// A path's class: the paths of one class cover each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Inside the workspace (not the workspace itself).
    Workspace,
    /// Inside `/tmp` or `/var/tmp`.
    Tmp,
    /// Inside the home directory (not the home itself), outside the workspace.
    Home,
    /// Anywhere else outside the workspace that is not a system directory.
    Other,
    /// A name (a unit, a service): letters, digits and `._@:+-`.
    Name,
}

impl Class {
    fn key(self) -> &'static str {
        match self {
            Class::Workspace => "@workspace",
            Class::Tmp => "@tmp",
            Class::Home => "@home",
            Class::Other => "@other",
            Class::Name => "@name",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Class::Workspace => "‹workspace path›",
            Class::Tmp => "‹tmp path›",
            Class::Home => "‹home path›",
            Class::Other => "‹other path›",
            Class::Name => "‹name›",
        }
    }

    fn legend(self, p: &Places) -> String {
        let what = match self {
            Class::Workspace => format!(
                "any path inside the workspace {}, no part of it hidden (.name)",
                p.workspace
            ),
            Class::Tmp => "any path inside /tmp or /var/tmp, no part of it hidden (.name)".into(),
            Class::Home => format!(
                "any path inside the home directory {}, outside the workspace, no part of it hidden (.name)",
                p.home.unwrap_or("~")
            ),
            Class::Other => "any path outside the workspace, /tmp, the home directory and the \
                             system directories, no part of it hidden (.name)"
                .into(),
            Class::Name => "any name of letters, digits and ._@:+-".into(),
        };
        format!("{}: {what}", self.label())
    }
}

/// Directories of the system: a path in one needs its exact text.
const SYSTEM: &[&str] = &[
    "bin",
    "boot",
    "dev",
    "efi",
    "etc",
    "lib",
    "lib32",
    "lib64",
    "libx32",
    "lost+found",
    "proc",
    "root",
    "run",
    "sbin",
    "snap",
    "sys",
    "usr",
    "var",
];

/// The cover of `command` run at `places`.
pub fn cover(command: &str, places: &Places) -> Cover {
    generalised(command, places).unwrap_or_else(|| exact_with(command, places.cwd, places.env))
}

/// The cover of `command` when nothing is known of where it runs but `context` (a shell's
/// typed line: its shell): only that command, in that context.
pub fn exact(command: &str, context: &str) -> Cover {
    exact_with(command, context, &[])
}

fn exact_with(command: &str, cwd: &str, env: &[(String, String)]) -> Cover {
    Cover {
        key: key(json!({"exact": command}), Some(cwd), env),
        form: None,
        legend: Vec::new(),
        same_dir: true,
        same_env: !env.is_empty(),
    }
}

/// The key: what was covered, with the directory when it matters and the environment.
fn key(what: Value, cwd: Option<&str>, env: &[(String, String)]) -> String {
    let mut env: Vec<&(String, String)> = env.iter().collect();
    env.sort();
    json!({"v": 1, "what": what, "cwd": cwd, "env": env}).to_string()
}

/// One word of a generalised command.
enum Token {
    /// A word that needs its exact value (`shown` as written); `relative`: its meaning may
    /// depend on the directory.
    Exact {
        value: String,
        shown: String,
        relative: bool,
    },
    Class(Class),
}

impl Token {
    /// A word of ours (a redirection's operator), never relative.
    fn ours(text: String) -> Token {
        Token::Exact {
            value: text.clone(),
            shown: text,
            relative: false,
        }
    }
}

/// The generalised cover, when every command of the script reads as data programs do.
fn generalised(command: &str, places: &Places) -> Option<Cover> {
    let script = parse_script(command).ok()?;
    if !script.constructs.is_empty() || script.commands.is_empty() {
        return None;
    }
    let mut commands: Vec<(bool, Vec<Token>)> = Vec::new();
    for c in &script.commands {
        if c.depth > 0 || !c.assignments.is_empty() {
            return None;
        }
        // The parser keeps no quotes: a glob, a brace or a tilde reads the same quoted or
        // not, so a word with one needs the exact text of the whole command.
        let words = c.argv.iter().chain(c.redirects.iter().map(|r| &r.target));
        if words
            .filter_map(|w| w.literal.as_deref())
            .any(|l| l.contains(['*', '?', '[', ']', '{', '}', '~']))
        {
            return None;
        }
        let (program, args) = c.argv.split_first()?;
        let name = program.literal.as_deref()?;
        let spec = spec::data_program(name)?;
        let mut tokens = vec![Token::Exact {
            value: name.to_string(),
            shown: program.source.clone(),
            relative: false,
        }];
        tokens.extend(arguments(spec, args, places)?);
        for r in &c.redirects {
            let op = match r.kind {
                RedirectKind::Input => "<",
                RedirectKind::Output => ">",
                RedirectKind::Append => ">>",
                RedirectKind::Duplicate => ">&",
                RedirectKind::HereString | RedirectKind::HereDocument => return None,
            };
            let fd = r.fd.as_deref().unwrap_or_default();
            if fd.starts_with('{') {
                return None;
            }
            tokens.push(Token::ours(format!("{fd}{op}")));
            let target = r.target.literal.as_deref()?;
            tokens.push(if r.kind == RedirectKind::Duplicate {
                // A descriptor, or (`>& file`) a file.
                let fd = target == "-" || target.chars().all(|c| c.is_ascii_digit());
                Token::Exact {
                    value: target.to_string(),
                    shown: r.target.source.clone(),
                    relative: !fd,
                }
            } else {
                path(&r.target, places)
            });
        }
        commands.push((c.piped, tokens));
    }
    let relative = commands
        .iter()
        .flat_map(|(_, t)| t)
        .any(|t| matches!(t, Token::Exact { relative: true, .. }));
    let mut what = Vec::new();
    let mut form = String::new();
    let mut classes: Vec<Class> = Vec::new();
    for (i, (piped, tokens)) in commands.iter().enumerate() {
        let mut words = Vec::new();
        if i > 0 {
            form.push_str(if *piped { " | " } else { "; " });
        }
        for (k, t) in tokens.iter().enumerate() {
            if k > 0 {
                form.push(' ');
            }
            match t {
                Token::Exact { value, shown, .. } => {
                    words.push(format!("={value}"));
                    form.push_str(shown);
                }
                Token::Class(c) => {
                    words.push(c.key().to_string());
                    form.push_str(c.label());
                    if !classes.contains(c) {
                        classes.push(*c);
                    }
                }
            }
        }
        what.push(json!({"piped": piped, "words": words}));
    }
    if classes.is_empty() {
        // Nothing may differ: the exact text covers it.
        return None;
    }
    let workspace = classes
        .contains(&Class::Workspace)
        .then_some(places.workspace);
    let home = classes.contains(&Class::Home).then_some(places.home);
    Some(Cover {
        key: key(
            json!({"commands": what, "workspace": workspace, "home": home}),
            relative.then_some(places.cwd),
            places.env,
        ),
        form: Some(form),
        legend: classes.iter().map(|c| c.legend(places)).collect(),
        same_dir: relative,
        same_env: !places.env.is_empty(),
    })
}

/// A literal word that needs its exact value.
fn exact_word(w: &ShellWord) -> Token {
    let value = w.literal.clone().unwrap_or_default();
    Token::Exact {
        relative: !value.starts_with('/'),
        value,
        shown: w.source.clone(),
    }
}

/// A program's arguments read with its spec; `None` when one cannot be read as data (an
/// option it does not take, a word known only when it runs).
fn arguments(spec: &DataProgram, args: &[ShellWord], places: &Places) -> Option<Vec<Token>> {
    /// One argument as the program reads it.
    enum Arg<'w> {
        /// An option word, the names of the options in it, and its value when that is the
        /// next word; `attached`: a value is part of the word itself.
        Option {
            word: &'w ShellWord,
            names: Vec<String>,
            attached: bool,
            value: Option<&'w ShellWord>,
        },
        /// `--`.
        End(&'w ShellWord),
        Operand(&'w ShellWord),
    }
    let mut read = Vec::new();
    let mut options_end = false;
    let mut i = 0;
    while let Some(w) = args.get(i) {
        i += 1;
        // A word known only when it runs: the whole command needs its exact text (the
        // parser keeps no quotes in its source, so `$X` and `"$X"` would read alike).
        let lit = w.literal.as_deref()?;
        if options_end || lit == "-" || !lit.starts_with('-') {
            read.push(Arg::Operand(w));
            continue;
        }
        if lit == "--" {
            options_end = true;
            read.push(Arg::End(w));
            continue;
        }
        let mut names = Vec::new();
        let (attached, takes_next) = if let Some(long) = lit.strip_prefix("--") {
            let (n, value) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            names.push(format!("--{n}"));
            if spec::long_option_is(n, spec.long_with_arg) {
                (value, !value)
            } else if spec::long_option_is(n, spec.long_flags) {
                (value, false)
            } else {
                return None;
            }
        } else {
            let mut read = (false, false);
            for (k, c) in lit.char_indices().skip(1) {
                names.push(format!("-{c}"));
                let rest = k + c.len_utf8() < lit.len();
                if spec.flags.contains(c) {
                    continue;
                }
                if spec.attached.contains(c) {
                    read = (rest, false);
                    break;
                }
                if spec.with_arg.contains(c) {
                    read = (rest, !rest);
                    break;
                }
                return None;
            }
            read
        };
        let value = if takes_next {
            let v = args.get(i).filter(|v| v.literal.is_some())?;
            i += 1;
            Some(v)
        } else {
            None
        };
        read.push(Arg::Option {
            word: w,
            names,
            attached,
            value,
        });
    }
    // Without a script option, the first operand is the script.
    let (script_short, script_long) = spec.script;
    let scripted = !(script_short.is_empty() && script_long.is_empty());
    let script_given = read.iter().any(|a| match a {
        Arg::Option { names, .. } => names
            .iter()
            .any(|n| spec::option_is(n, script_short, script_long)),
        _ => false,
    });
    let mut roles: Vec<Operand> = Vec::new();
    if scripted && !script_given {
        roles.push(Operand::Exact);
    }
    roles.extend(spec.operands);
    let mut tokens = Vec::new();
    let mut operands = 0usize;
    for a in read {
        match a {
            Arg::Operand(w) => {
                let role = roles
                    .get(operands)
                    .or(roles.last())
                    .copied()
                    .unwrap_or(Operand::Exact);
                operands += 1;
                tokens.push(match role {
                    Operand::Path => path(w, places),
                    Operand::Name => name(w),
                    Operand::Exact => exact_word(w),
                });
            }
            Arg::End(w) => tokens.push(Token::ours(w.source.clone())),
            Arg::Option {
                word,
                attached,
                value,
                ..
            } => {
                // An option's value (`-tDIR`, `--target-directory=DIR`) may be a path.
                tokens.push(Token::Exact {
                    value: word.literal.clone().unwrap_or_default(),
                    shown: word.source.clone(),
                    relative: attached,
                });
                if let Some(v) = value {
                    tokens.push(exact_word(v));
                }
            }
        }
    }
    Some(tokens)
}

/// A name operand: its class when it is a plain name.
fn name(w: &ShellWord) -> Token {
    match w.literal.as_deref() {
        Some(l)
            if !l.is_empty()
                && !l.starts_with(['-', '.'])
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._@:+-".contains(c)) =>
        {
            Token::Class(Class::Name)
        }
        _ => exact_word(w),
    }
}

/// A path operand: its class, or its exact text.
fn path(w: &ShellWord, places: &Places) -> Token {
    match w.literal.as_deref().and_then(|l| path_class(l, places)) {
        Some(c) => Token::Class(c),
        None => exact_word(w),
    }
}

/// The class of the path `word` at `places`; `None` when it needs its exact text.
pub fn path_class(word: &str, places: &Places) -> Option<Class> {
    if word.is_empty() || word == "-" || word.contains(['*', '?', '[', ']', '{', '}', '\n', '\0']) {
        return None;
    }
    let joined = if word == "~" || word.starts_with("~/") {
        format!("{}/{}", places.home?, &word[1..])
    } else if word.starts_with('~') {
        return None;
    } else if word.starts_with('/') {
        word.to_string()
    } else if places.cwd.starts_with('/') {
        format!("{}/{word}", places.cwd)
    } else {
        return None;
    };
    let parts = components(&joined)?;
    if parts.len() < 2 {
        return None;
    }
    // A hidden part (`.git`, `.ssh`, `.bashrc`) below where the path's class starts.
    let plain_from = |from: usize| !parts[from..].iter().any(|p| p.starts_with('.'));
    let workspace = absolute(places.workspace);
    let home = places.home.and_then(absolute);
    // What holds the workspace or the home, and they themselves.
    let holds = |place: &Option<Vec<&str>>| {
        place
            .as_ref()
            .is_some_and(|p| p.len() >= parts.len() && p[..parts.len()] == parts[..])
    };
    if holds(&workspace) || holds(&home) {
        return None;
    }
    let inside = |place: &Option<Vec<&str>>| {
        place
            .as_ref()
            .filter(|p| parts.len() > p.len() && parts[..p.len()] == p[..])
            .map(Vec::len)
    };
    // A workspace of `/` or of a system directory holds nothing as a workspace does.
    let usable = workspace.as_ref().is_some_and(|w| match w[..] {
        [] => false,
        [top] => !SYSTEM.contains(&top),
        _ => true,
    });
    if usable && let Some(from) = inside(&workspace) {
        return plain_from(from).then_some(Class::Workspace);
    }
    if let Some(from) = inside(&home) {
        return plain_from(from).then_some(Class::Home);
    }
    if parts[0] == "tmp" {
        return plain_from(1).then_some(Class::Tmp);
    }
    if parts[..2] == ["var", "tmp"] {
        return (parts.len() > 2 && plain_from(2)).then_some(Class::Tmp);
    }
    if SYSTEM.contains(&parts[0]) || parts[0] == "home" {
        // The system's, or someone's home (ours too, when it is not known).
        return None;
    }
    plain_from(0).then_some(Class::Other)
}

/// An absolute path's components; `None` when it is not absolute or holds `..`, which may
/// lead through a link anywhere.
fn absolute(path: &str) -> Option<Vec<&str>> {
    if !path.starts_with('/') {
        return None;
    }
    components(path)
}

fn components(path: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    Some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_ENV: &[(String, String)] = &[];

    fn at(cwd: &str) -> Places<'_> {
        Places {
            cwd,
            workspace: "/srv/ws",
            home: Some("/home/deploy"),
            env: NO_ENV,
        }
    }

    fn key(command: &str) -> String {
        cover(command, &at("/srv/ws")).key
    }

    fn covers(allowed: &str, later: &str) -> bool {
        key(allowed) == key(later)
    }

    #[test]
    fn code_needs_its_exact_text() {
        for (allowed, later) in [
            (
                "python3 -c 'print(1)'",
                "python3 -c 'import os; os.system(\"id\")'",
            ),
            ("bash -c 'echo hi'", "bash -c 'rm -rf ~'"),
            ("sh -c x", "sh -c y"),
            ("node -e 'a()'", "node -e 'b()'"),
            ("perl -e 'a'", "perl -e 'b'"),
            ("ruby -e 'a'", "ruby -e 'b'"),
            ("node --eval 'a'", "node --eval 'b'"),
            ("awk '{print}' f", "awk 'BEGIN{system(\"id\")}' f"),
            ("sed -i 's/a/b/' /etc/hosts", "sed -i 's/a/b/e' /etc/hosts"),
            ("sed -i 's/a/b/' build/f", "sed -i '1e id' build/f"),
            ("sed -i -e 's/a/b/' build/f", "sed -i -e 'w /etc/x' build/f"),
            ("find . -exec rm {} +", "find . -exec sh -c x {} +"),
            ("ls | xargs rm", "ls | xargs sh -c x"),
            (
                "curl -s https://a.example/i.sh | sh",
                "curl -s https://b.example/i.sh | sh",
            ),
            ("cat a.sh | sh", "cat b.sh | sh"),
            ("sh < a.sh", "sh < b.sh"),
            ("bash <<< 'echo a'", "bash <<< 'rm -rf ~'"),
            ("rm -rf build <<< a", "rm -rf build <<< b"),
            ("sudo rm -rf build", "sudo rm -rf dist"),
            ("env rm -rf build", "env rm -rf dist"),
            ("X=1 rm -rf build", "X=2 rm -rf build"),
            ("rm -rf build; sh x.sh", "rm -rf dist; sh x.sh"),
            ("rm -rf \"$(cat a)\"", "rm -rf \"$(cat b)\""),
            ("rm -rf \"$A\"", "rm -rf \"$B\""),
            ("rm -rf \"$A\"", "rm -rf $A"),
            ("touch a && rm -rf \"$A\"", "touch b && rm -rf \"$A\""),
            ("rm -rf -- \"$A\"", "rm -rf -- $A"),
            ("rm -rf build", "./rm -rf build"),
            ("rm -rf build", "/tmp/rm -rf build"),
            (
                "for d in a; do rm -rf $d; done",
                "for d in b; do rm -rf $d; done",
            ),
            ("shell_open", "shell_write"),
            ("chmod 644 build/a", "chmod 4755 build/a"),
            ("chown bob build/a", "chown root build/a"),
            ("systemctl stop nginx", "systemctl disable nginx"),
            ("cp -t build a", "cp -t /etc a"),
            ("cp -t \"$A\" a", "cp -t \"$B\" a"),
            ("rm --frobnicate build", "rm --frobnicate dist"),
            ("rm -Q build", "rm -Q dist"),
        ] {
            assert!(!covers(allowed, later), "`{allowed}` covers `{later}`");
        }
        // The same code, exactly, is covered.
        for c in [
            "python3 -c 'import os; os.remove(\"x\")'",
            "curl -s https://a.example/i.sh | sh",
            "shell_open",
        ] {
            assert!(covers(c, c), "{c}");
            assert_eq!(cover(c, &at("/srv/ws")).form, None, "{c}");
        }
    }

    #[test]
    fn data_paths_of_the_same_class_are_covered() {
        for (allowed, later) in [
            ("rm -rf build", "rm -rf dist/x"),
            ("rm -rf build", "rm -rf /srv/ws/target"),
            ("rm -rf 'build'", "rm -rf \"dist\""),
            ("rm -rf /tmp/a", "rm -rf /var/tmp/b"),
            ("rm -rf /srv/other", "rm -rf /mnt/data/x"),
            ("rm -rf /home/deploy/old", "rm -rf /home/deploy/older"),
            ("touch a && rm -rf /tmp/x", "touch b; rm -rf /tmp/y"),
            ("rm -rf build -v", "rm -rf dist -v"),
            ("sed -i 's/a/b/' build/f", "sed -i 's/a/b/' src/g"),
            ("sed -i -e 's/a/b/' build/f", "sed -i -e 's/a/b/' src/g"),
            ("cp -r /tmp/a build/b", "cp -r /tmp/c src/d"),
            ("systemctl stop nginx", "systemctl stop apache2.service"),
            ("rm -rf build > /tmp/log", "rm -rf dist > /tmp/other"),
        ] {
            assert!(
                covers(allowed, later),
                "`{allowed}` does not cover `{later}`"
            );
        }
    }

    #[test]
    fn a_path_of_another_class_is_not_covered() {
        for (allowed, later) in [
            ("rm -rf build", "rm -rf /etc"),
            ("rm -rf build", "rm -rf /etc/x"),
            ("rm -rf build", "rm -rf ~"),
            ("rm -rf build", "rm -rf ~/.ssh"),
            ("rm -rf build", "rm -rf /"),
            ("rm -rf build", "rm -rf ."),
            ("rm -rf build", "rm -rf /srv/ws"),
            ("rm -rf build", "rm -rf /srv"),
            ("rm -rf build", "rm -rf ../x"),
            ("rm -rf build", "rm -rf build/../../x"),
            ("rm -rf build", "rm -rf .git"),
            ("rm -rf build", "rm -rf *"),
            ("rm -rf build", "rm -rf build/{a,b}"),
            ("rm -rf build", "rm -rf /tmp/x"),
            ("rm -rf build", "rm -rf /home/other/x"),
            ("rm -rf /tmp/a", "rm -rf /tmp"),
            ("rm -rf /tmp/a", "rm -rf /var/tmp"),
            ("rm -rf /etc/a", "rm -rf /etc/b"),
            ("rm -rf /srv/other", "rm -rf /usr/lib/x"),
            ("rm -rf /srv/other", "rm -rf /var/lib/x"),
            ("rm -rf /srv/other", "rm -rf /dev/sda"),
            ("rm -rf /srv/other", "rm -rf /boot/x"),
            ("rm -rf /srv/other", "rm -rf /home/deploy/x"),
            ("rm -rf ~/old", "rm -rf ~/.bashrc"),
            ("rm -rf ~/old", "rm -rf ~/older"),
            ("rm -rf '/tmp/*'", "rm -rf /tmp/*"),
            ("rm -rf '/tmp/a'", "rm -rf /tmp/*"),
            ("rm -rf /home/deploy/old", "rm -rf /home/deploy/.ssh"),
            ("rm -rf build", "rm -rf build dist"),
            ("rm -rf build", "rm -r build"),
            ("systemctl stop nginx", "systemctl stop 'a b'"),
        ] {
            assert!(!covers(allowed, later), "`{allowed}` covers `{later}`");
        }
    }

    #[test]
    fn the_environment_and_the_directory_are_part_of_the_key() {
        let env = vec![("NOPE_DIR".to_string(), "/".to_string())];
        let with_env = Places {
            env: &env,
            ..at("/srv/ws")
        };
        for c in ["rm -rf \"$NOPE_DIR\"", "rm -rf build", "python3 -c x"] {
            assert_ne!(cover(c, &with_env).key, key(c), "{c}");
        }
        // A word that needs its exact text and may be relative: the directory too.
        let (a, b) = (at("/srv/ws"), at("/srv/ws/sub"));
        assert_ne!(cover("rm -rf *", &a).key, cover("rm -rf *", &b).key);
        assert_ne!(
            cover("touch x && rm -rf \"$PWD\"", &a).key,
            cover("touch x && rm -rf \"$PWD\"", &b).key
        );
        // Only classes and flags: the directory does not matter.
        assert_eq!(cover("rm -rf build", &a).key, cover("rm -rf x", &b).key);
        // Another workspace is another class.
        let other = Places {
            workspace: "/srv/other",
            ..a
        };
        assert_ne!(
            cover("rm -rf /srv/ws/x", &a).key,
            cover("rm -rf /srv/other/x", &other).key
        );
        // A workspace of `/` or a system directory holds nothing as a workspace does.
        let root = Places {
            workspace: "/",
            ..a
        };
        assert_eq!(path_class("/etc/x", &root), None);
        let etc = Places {
            workspace: "/etc",
            ..a
        };
        assert_eq!(path_class("/etc/x", &etc), None);
        // Hidden parts count below where a class starts: a workspace under a hidden
        // directory holds plain paths.
        let hidden_ws = Places {
            cwd: "/tmp/.t1/ws",
            workspace: "/tmp/.t1/ws",
            ..a
        };
        assert_eq!(path_class("build", &hidden_ws), Some(Class::Workspace));
        assert_eq!(path_class(".git/hooks", &hidden_ws), None);
        assert_eq!(path_class("/tmp/.t1/other", &hidden_ws), None);
        assert_eq!(path_class("/tmp/x", &hidden_ws), Some(Class::Tmp));
        // Without a home, `~` needs its exact text.
        let homeless = Places { home: None, ..a };
        assert_eq!(path_class("~/x", &homeless), None);
        assert_eq!(path_class("/home/deploy/x", &homeless), None);
    }

    #[test]
    fn the_card_says_what_is_covered() {
        let c = cover("rm -rf build", &at("/srv/ws"));
        assert_eq!(
            c.says(),
            "any command of the form: rm -rf ‹workspace path›\n\
             ‹workspace path›: any path inside the workspace /srv/ws, no part of it hidden (.name)"
        );
        let c = cover("python3 -c 'print(1)'", &at("/srv/ws"));
        assert_eq!(c.says(), "exactly this command\n(run in this directory)");
        let env = vec![("A".to_string(), "1".to_string())];
        let c = cover(
            "touch a && rm -rf /tmp/x",
            &Places {
                env: &env,
                ..at("/srv/ws")
            },
        );
        assert_eq!(
            c.says(),
            "any command of the form: touch ‹workspace path›; rm -rf ‹tmp path›\n\
             ‹workspace path›: any path inside the workspace /srv/ws, no part of it hidden (.name)\n\
             ‹tmp path›: any path inside /tmp or /var/tmp, no part of it hidden (.name)\n\
             (run with the same environment variables)"
        );
        assert_eq!(
            exact("shell_open", "~").says(),
            "exactly this command\n(run in this directory)"
        );
    }
}
