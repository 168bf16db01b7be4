//! Code given to a program as data, read in its language to see whether it can run
//! commands or write files: an `awk` program (`system()`, a pipe to or from a command), a
//! `sed` script (the `e` command and flag, `w` to a file), `vim`/`ex` commands (`:!`,
//! `:terminal`, `system()`, the scripting languages), `ed` commands (`!`), `gdb` commands
//! (`shell`, `!`, `pipe`, `python`, `call system(…)`), a makefile known only when it runs,
//! and interpreters fed their code on the input (`python3 <<< …`, `… | perl -`). Such code
//! asks a person, as inline interpreter code that acts does; code that cannot be read (a
//! script `sed` cannot parse, a program known only when it runs) asks too.
//!
//! It never refuses (the commands such code runs, when they are shell code the walk can
//! see, are judged as commands) and never runs anything.

use super::{Objection, abbreviate};
use crate::bash::effects::Nesting;
use crate::bash::spec;

/// Whether a person should decide on `code` (`None`: known only when it runs) in
/// `language`, reached `how`.
pub(super) fn code_as_data(language: &str, how: Nesting, code: Option<&str>) -> Option<Objection> {
    if how == Nesting::File {
        return None;
    }
    let ask = |why: String| Some(Objection::ask("code-as-data", why));
    let unknown = |what: &str| {
        ask(format!(
            "it gives {what} known only when it runs, which can run commands, so nobody can see \
             what it will do"
        ))
    };
    let runs = |what: &str, c: &str| {
        ask(format!(
            "it gives {what} that runs commands or writes files: `{}`",
            abbreviate(c, 80)
        ))
    };
    match language {
        "awk" => match code {
            None => unknown("awk a program"),
            Some(c) if awk_runs(c) => runs("awk a program", c),
            Some(_) => None,
        },
        "sed" => match code {
            None => unknown("sed a script"),
            Some(c) if sed_runs(c) => runs("sed a script", c),
            Some(_) => None,
        },
        "vim" => match code {
            None => unknown("the editor commands"),
            Some(c) if c.lines().any(vim_runs) => runs("the editor commands", c),
            Some(_) => None,
        },
        "ed" => match code {
            None => unknown("ed commands"),
            Some(c) if c.contains('!') => runs("ed commands", c),
            Some(_) => None,
        },
        "gdb" => match code {
            None => unknown("the debugger commands"),
            Some(c) if c.lines().any(gdb_runs) => runs("the debugger commands", c),
            Some(_) => None,
        },
        "make" => code.is_none().then(|| {
            Objection::ask(
                "code-as-data",
                "it gives make a makefile known only when it runs, whose recipes are shell \
                 commands, so nobody can see what it will do"
                    .into(),
            )
        }),
        _ if spec::interpreter(language).is_some() => match (how, code) {
            // Inline code that is known is read with its command (`ask::interpreter`).
            (Nesting::Inline, Some(_)) => None,
            (_, None) => unknown(&format!("{language} code")),
            (_, Some(c)) => super::ask::code_that_acts(c).map(|word| {
                Objection::ask(
                    "inline-code",
                    format!(
                        "it feeds {language} code that may delete files or run programs (it \
                         mentions `{word}`) on its input, which the guard cannot follow"
                    ),
                )
            }),
        },
        _ => None,
    }
}

/// An awk program that calls `system()` or pipes to or from a command (`print … | "sh"`,
/// `"cmd" | getline`; `||` is a logical or).
fn awk_runs(program: &str) -> bool {
    let chars: Vec<char> = program.chars().collect();
    let pipe = chars.iter().enumerate().any(|(k, c)| {
        *c == '|' && chars.get(k + 1) != Some(&'|') && (k == 0 || chars[k - 1] != '|')
    });
    pipe || super::ask::mentions(program, "system")
}

/// A sed script that runs a command (`e`, the `e` flag of `s`) or writes a file (`w`, `W`,
/// the `w` flag), or that cannot be read. A small reader of GNU sed's syntax: addresses,
/// commands, their texts, labels and file names.
fn sed_runs(script: &str) -> bool {
    let s: Vec<char> = script.chars().collect();
    let mut i = 0;
    let at = |i: usize| s.get(i).copied();
    // To the end of the line (a file name, a label, a text).
    let line_end = |i: usize| {
        s[i..]
            .iter()
            .position(|c| *c == '\n')
            .map_or(s.len(), |k| i + k)
    };
    let writes = |name: &str| !matches!(name.trim(), "/dev/stdout" | "/dev/stderr");
    loop {
        while at(i).is_some_and(|c| c.is_whitespace() || c == ';') {
            i += 1;
        }
        let Some(_) = at(i) else {
            return false;
        };
        if at(i) == Some('#') {
            i = line_end(i);
            continue;
        }
        // Up to two addresses, then `!`.
        for n in 0..2 {
            match at(i) {
                Some(c) if c.is_ascii_digit() => {
                    while at(i).is_some_and(|c| c.is_ascii_digit() || c == '~') {
                        i += 1;
                    }
                }
                Some('$') => i += 1,
                Some('+' | '~') if n == 1 => {
                    i += 1;
                    while at(i).is_some_and(|c| c.is_ascii_digit()) {
                        i += 1;
                    }
                }
                Some(open @ ('/' | '\\')) => {
                    let delim = match open {
                        '\\' => {
                            i += 1;
                            match at(i) {
                                Some(d) => d,
                                None => return true,
                            }
                        }
                        d => d,
                    };
                    i += 1;
                    match skip_delimited(&s, i, delim) {
                        Some(end) => i = end,
                        None => return true,
                    }
                    while at(i).is_some_and(|c| c == 'I' || c == 'M') {
                        i += 1;
                    }
                }
                _ => break,
            }
            while at(i).is_some_and(|c| c == ' ' || c == '\t') {
                i += 1;
            }
            if n == 0 && at(i) == Some(',') {
                i += 1;
                while at(i).is_some_and(|c| c == ' ' || c == '\t') {
                    i += 1;
                }
                continue;
            }
            break;
        }
        while at(i).is_some_and(|c| c == '!' || c == ' ' || c == '\t') {
            i += 1;
        }
        let Some(command) = at(i) else {
            return false;
        };
        i += 1;
        match command {
            '{' | '}' | '=' | 'd' | 'D' | 'g' | 'G' | 'h' | 'H' | 'n' | 'N' | 'p' | 'P' | 'x'
            | 'z' | 'F' => {}
            'l' | 'q' | 'Q' | 'L' => {
                while at(i).is_some_and(|c| c == ' ' || c.is_ascii_digit()) {
                    i += 1;
                }
            }
            ':' | 'b' | 't' | 'T' | 'v' => {
                while at(i).is_some_and(|c| c != '\n' && c != ';') {
                    i += 1;
                }
            }
            'a' | 'i' | 'c' => {
                // The text, lines continued with a backslash.
                loop {
                    let end = line_end(i);
                    let continued = end > i && s[end - 1] == '\\' && end < s.len();
                    i = end;
                    if !continued {
                        break;
                    }
                    i += 1;
                }
            }
            'r' | 'R' => i = line_end(i),
            'w' | 'W' => {
                let end = line_end(i);
                let name: String = s[i..end].iter().collect();
                if writes(&name) {
                    return true;
                }
                i = end;
            }
            'e' => return true,
            's' | 'y' => {
                let Some(delim) = at(i).filter(|d| *d != '\n' && *d != '\\') else {
                    return true;
                };
                i += 1;
                for _ in 0..2 {
                    match skip_delimited(&s, i, delim) {
                        Some(end) => i = end,
                        None => return true,
                    }
                }
                if command == 's' {
                    while let Some(f) = at(i) {
                        match f {
                            'e' => return true,
                            'w' => {
                                let end = line_end(i + 1);
                                let name: String = s[i + 1..end].iter().collect();
                                if writes(&name) {
                                    return true;
                                }
                                i = end;
                                break;
                            }
                            'g' | 'p' | 'i' | 'I' | 'm' | 'M' => i += 1,
                            c if c.is_ascii_digit() => i += 1,
                            _ => break,
                        }
                    }
                }
            }
            // A command this reader does not know: it may be one that runs something.
            _ => return true,
        }
    }
}

/// The index after the closing `delim` of a part that starts at `from` (backslash escapes
/// skipped); `None` when it is not closed.
fn skip_delimited(s: &[char], from: usize, delim: char) -> Option<usize> {
    let mut i = from;
    while let Some(&c) = s.get(i) {
        if c == '\\' {
            i += 2;
            continue;
        }
        if c == delim {
            return Some(i + 1);
        }
        if c == '\n' && delim != '\n' {
            return None;
        }
        i += 1;
    }
    None
}

/// A vim/ex command line that runs a shell command or code of another language.
fn vim_runs(line: &str) -> bool {
    const CALLS: &[&str] = &[
        "system(",
        "systemlist(",
        "libcall",
        "job_start",
        "jobstart",
        "termopen",
        "term_start",
        "luaeval",
        "pyeval",
        "py3eval",
        "pyxeval",
        "rubyeval",
        "perleval",
    ];
    const COMMANDS: &[&str] = &[
        "sh", "shell", "ter", "term", "terminal", "py", "python", "py3", "python3", "pyx",
        "pythonx", "pyf", "pyfile", "py3f", "py3file", "pyxfile", "lua", "luado", "luafile",
        "perl", "perldo", "perlfile", "rub", "ruby", "rubydo", "rubyfile", "mz", "mzscheme", "tcl",
        "tcldo", "tclfile", "exe", "execute", "so", "source", "mak", "make", "gr", "grep", "lgr",
        "lgrep", "normal", "norm", "redir", "cex", "cexpr",
    ];
    if CALLS.iter().any(|c| line.contains(c)) {
        return true;
    }
    line.split('|').any(|piece| {
        let piece = piece.trim_start_matches(|c: char| {
            c == ':' || c.is_whitespace() || c.is_ascii_digit() || ",;.$%+-'<>".contains(c)
        });
        if piece.starts_with('!') {
            return true;
        }
        let name: String = piece
            .chars()
            .take_while(char::is_ascii_alphabetic)
            .collect();
        let after = piece[name.len()..].trim_start_matches('!').trim_start();
        COMMANDS.contains(&name.as_str())
            || (matches!(
                name.as_str(),
                "r" | "read" | "w" | "write" | "up" | "update" | "e" | "edit"
            ) && after.starts_with('!'))
    })
}

/// A gdb command that runs a shell command or code of another language.
fn gdb_runs(line: &str) -> bool {
    let line = line.trim_start();
    if line.starts_with('!') || line.starts_with('|') {
        return true;
    }
    let name: String = line
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    let args = &line[name.len()..];
    match name.as_str() {
        "shell" | "pipe" | "python" | "py" | "python-interactive" | "pi" | "guile" | "gu"
        | "source" | "eval" | "define" | "make" => true,
        "run" | "r" | "start" | "starti" => args.contains([';', '|', '&', '`', '$', '>', '<']),
        _ => ["system", "execve", "execl", "popen", "fork"]
            .iter()
            .any(|w| super::ask::mentions(line, w)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sed_scripts_that_run_or_write_and_those_that_do_not() {
        for script in [
            "1e rm -rf /etc",
            "s|.*|rm -rf /etc|e",
            "s/x/y/w /etc/passwd",
            "$ w /tmp/out",
            "/x/,/y/{e id\n}",
            "1~2e ls",
            "k",
            "s/unclosed",
        ] {
            assert!(sed_runs(script), "{script}");
        }
        for script in [
            "100,140p",
            "/BEGIN CERTIFICATE/,/END CERTIFICATE/p",
            "s/,/\\t/g",
            "s/version = \"1.8.2\"/version = \"1.8.3\"/",
            "s/\\r$//",
            "/^DEBUG=/d",
            "s/^LOG_LEVEL=.*/LOG_LEVEL=debug/",
            "s|https://api.old.example.com|https://api.example.com|g",
            "1i #!/usr/bin/env bash",
            "s/e/E/2g",
            "/e/!d; s/a/b/",
            "y/abc/xyz/",
            ":a;N;$!ba;s/\\n/ /g",
            "s/x/y/w /dev/stdout",
        ] {
            assert!(!sed_runs(script), "{script}");
        }
    }

    #[test]
    fn awk_vim_and_gdb_commands_that_run() {
        assert!(awk_runs("BEGIN { system(\"id\") }"));
        assert!(awk_runs("{ print | \"sh\" }"));
        assert!(awk_runs("BEGIN { \"date\" | getline d }"));
        assert!(!awk_runs("$1 == 1 || $2 == 2 { print $3 }"));
        assert!(!awk_runs("{ sum += $3 } END { print sum }"));
        for line in [
            "!rm -rf /",
            ":!id",
            "call system(\"id\")",
            "terminal",
            "py3 import os",
            "w !sh",
            "set paste | !id",
        ] {
            assert!(vim_runs(line), "{line}");
        }
        for line in ["set paste", "qa!", "wq!", "%s/a/b/g", "42", "normalize"] {
            assert!(!vim_runs(line), "{line}");
        }
        for line in [
            "shell id",
            "!id",
            "python import os",
            "call system(\"id\")",
            "run; id",
        ] {
            assert!(gdb_runs(line), "{line}");
        }
        for line in [
            "run",
            "bt",
            "info registers",
            "break main",
            "run --config dev.toml",
        ] {
            assert!(!gdb_runs(line), "{line}");
        }
    }
}

#[cfg(test)]
mod asked {
    use super::super::testing::{assert_allowed, assert_asked};

    #[test]
    fn code_given_as_data_that_acts_asks() {
        for cmd in [
            "awk 'BEGIN { system(\"id\") }'",
            "echo | awk '{ print \"id\" | \"sh\" }'",
            "busybox awk 'BEGIN{system(\"id\")}'",
            "awk -- \"$PROG\" f",
            "sed -n '1e id' f",
            "echo x | sed 's|.*|id|e'",
            "vim -es -c '!id' -c 'qa!'",
            "ex -s -c 'call system(\"id\")' -c 'qa!'",
            "ed -s f <<< '!id'",
            "gdb -q -nx -batch -ex 'shell id'",
            "python3 -c \"$CODE\"",
        ] {
            assert_asked(cmd, "code-as-data");
        }
        for cmd in [
            "python3 <<< 'import os; os.system(\"id\")'",
            "echo 'import os; os.system(\"id\")' | python3 -",
            "perl <<< 'exec \"id\"'",
        ] {
            assert_asked(cmd, "inline-code");
        }
        for cmd in [
            "awk '{print $1}' f",
            "awk -F: '$3 >= 1000 {print $1}' /etc/passwd",
            "sed -n '100,140p' f",
            "sed -i 's/a/b/' f",
            "vim src/main.rs",
            "gdb -batch -ex run -ex bt --args ./build/server --config dev.toml",
            "python3 <<< 'print(1)'",
            "python3 script.py",
            "awk -f prog.awk f",
        ] {
            assert_allowed(cmd);
        }
    }
}
