//! Read: a strict allow-list. Owns the commands allowed at `read` and the options of each
//! that are refused (as tables), the `git` subcommands and options allowed, and the shell
//! preamble that disarms a repository's own configuration for `git`.
//!
//! It allows only commands that cannot write, nor reach the network through the shell: a
//! redirection to `/dev/tcp/…` or `/dev/udp/…`, a descriptor beyond 0–2, or a redirection
//! target known only when it runs is refused. It fails closed: a script it cannot parse, a
//! construct that assigns a variable, or an argument a rule depends on that is known only when
//! it runs, is refused. It never runs anything and never touches the filesystem. `git` runs
//! under [`read_preamble`], which disarms every program a repository's configuration can name
//! for `status`, `log`, `diff` and `show`; the options that would still run one are refused
//! here.

use crate::bash::parse::{self, Construct, RedirectKind, Redirection, ShellWord, SimpleCommand};

use super::{Denied, Permission};
use crate::bash::effects::network_path;

/// How a command on the read-only allow-list is judged.
enum ReadRule {
    /// No option of it writes or runs anything: any arguments, even ones known only at run
    /// time.
    Free,
    /// Some options write or run programs: every argument must be literal, and those options
    /// are refused.
    Policed(&'static Options),
    /// Only these exact argument lists (`hostname -f`).
    Exactly(&'static [&'static str]),
    /// `git status|log|diff|show`, under [`read_preamble`].
    Git,
    /// `printf`, whose `-v` assigns a variable.
    Printf,
}

/// The options of a policed command.
struct Options {
    /// Whether short options combine (`-uo f` is `-u -o f`); `find`'s primaries do not.
    clusters: bool,
    /// Short options that take an argument: the rest of the word, or the next word.
    with_arg: &'static str,
    /// Short options refused.
    refused_short: &'static str,
    /// Long options refused: `--name`, `--name=…`, and any abbreviation when `abbreviations`.
    refused_long: &'static [&'static str],
    /// Whether the command accepts abbreviated long options (GNU getopt, git).
    abbreviations: bool,
    /// Whole words refused (`find -delete`).
    refused_words: &'static [&'static str],
    /// Most operands (`uniq IN OUT` writes OUT).
    max_operands: Option<usize>,
    /// Why the refused options are refused.
    why: &'static str,
}

const NO_OPTIONS: Options = Options {
    clusters: true,
    with_arg: "",
    refused_short: "",
    refused_long: &[],
    abbreviations: true,
    refused_words: &[],
    max_operands: None,
    why: "",
};

const FIND: Options = Options {
    clusters: false,
    refused_words: &[
        "-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls",
    ],
    why: "deletes, writes files or runs commands",
    ..NO_OPTIONS
};

/// ripgrep: `--pre` and `--hostname-bin` run programs; `--search-zip` runs decompressors.
/// ripgrep takes no abbreviations.
const RG: Options = Options {
    with_arg: "ABCdEefgjmMrtT",
    refused_short: "z",
    refused_long: &["pre", "search-zip", "hostname-bin"],
    abbreviations: false,
    why: "runs other programs",
    ..NO_OPTIONS
};

const SORT: Options = Options {
    with_arg: "kotST",
    refused_short: "o",
    refused_long: &["output", "compress-program"],
    why: "writes a file or runs a program",
    ..NO_OPTIONS
};

const UNIQ: Options = Options {
    with_arg: "fsw",
    max_operands: Some(1),
    why: "its second operand is a file it writes",
    ..NO_OPTIONS
};

const TREE: Options = Options {
    with_arg: "LPIoHT",
    refused_short: "oR",
    abbreviations: false,
    why: "writes files (`-R` writes one in every directory)",
    ..NO_OPTIONS
};

const FILE: Options = Options {
    with_arg: "efFmP",
    refused_short: "CzZ",
    refused_long: &["compile", "uncompress", "uncompress-noreport"],
    why: "writes a compiled magic file or runs decompressors",
    ..NO_OPTIONS
};

const DATE: Options = Options {
    with_arg: "dfrs",
    refused_short: "s",
    refused_long: &["set"],
    why: "sets the clock",
    ..NO_OPTIONS
};

const HOSTNAME: &[&str] = &[
    "-f",
    "-s",
    "-d",
    "-i",
    "-I",
    "-A",
    "-a",
    "--fqdn",
    "--long",
    "--short",
    "--domain",
    "--ip-address",
    "--all-ip-addresses",
    "--all-fqdns",
    "--alias",
];

/// The read-only allow-list. Not on it, among others: interpreters and shells, `xargs`,
/// `env`, `make`, `awk`, `sed`, `tee`, `exec`, `eval`, `command`, `builtin`, `source`, `.`,
/// `sudo`, `nice`, `timeout`, `nohup`, `read`, `[[` (its arithmetic evaluates operands).
const READ_COMMANDS: &[(&str, ReadRule)] = &[
    ("ls", ReadRule::Free),
    ("cat", ReadRule::Free),
    ("head", ReadRule::Free),
    ("tail", ReadRule::Free),
    ("wc", ReadRule::Free),
    ("grep", ReadRule::Free),
    ("egrep", ReadRule::Free),
    ("fgrep", ReadRule::Free),
    ("rg", ReadRule::Policed(&RG)),
    ("find", ReadRule::Policed(&FIND)),
    ("stat", ReadRule::Free),
    ("du", ReadRule::Free),
    ("df", ReadRule::Free),
    ("ps", ReadRule::Free),
    ("sort", ReadRule::Policed(&SORT)),
    ("uniq", ReadRule::Policed(&UNIQ)),
    ("git", ReadRule::Git),
    ("cd", ReadRule::Free),
    ("pwd", ReadRule::Free),
    ("echo", ReadRule::Free),
    ("printf", ReadRule::Printf),
    ("true", ReadRule::Free),
    ("false", ReadRule::Free),
    (":", ReadRule::Free),
    ("test", ReadRule::Free),
    ("[", ReadRule::Free),
    ("id", ReadRule::Free),
    ("whoami", ReadRule::Free),
    ("groups", ReadRule::Free),
    ("hostname", ReadRule::Exactly(HOSTNAME)),
    ("uname", ReadRule::Free),
    ("date", ReadRule::Policed(&DATE)),
    ("basename", ReadRule::Free),
    ("dirname", ReadRule::Free),
    ("realpath", ReadRule::Free),
    ("readlink", ReadRule::Free),
    ("file", ReadRule::Policed(&FILE)),
    ("cut", ReadRule::Free),
    ("tr", ReadRule::Free),
    ("diff", ReadRule::Free),
    ("cmp", ReadRule::Free),
    ("comm", ReadRule::Free),
    ("md5sum", ReadRule::Free),
    ("sha1sum", ReadRule::Free),
    ("sha256sum", ReadRule::Free),
    ("sha512sum", ReadRule::Free),
    ("cksum", ReadRule::Free),
    ("nproc", ReadRule::Free),
    ("uptime", ReadRule::Free),
    ("free", ReadRule::Free),
    ("tree", ReadRule::Policed(&TREE)),
    ("tac", ReadRule::Free),
    ("nl", ReadRule::Free),
    ("od", ReadRule::Free),
    ("strings", ReadRule::Free),
    ("column", ReadRule::Free),
    ("paste", ReadRule::Free),
    ("join", ReadRule::Free),
    ("fold", ReadRule::Free),
    ("rev", ReadRule::Free),
    ("seq", ReadRule::Free),
    ("jq", ReadRule::Free),
    ("type", ReadRule::Free),
    ("which", ReadRule::Free),
    ("lscpu", ReadRule::Free),
    ("lsblk", ReadRule::Free),
];

/// The `git` subcommands allowed at `read`.
const GIT_READ_SUBCOMMANDS: &[&str] = &["status", "log", "diff", "show"];

/// `git` options refused at `read` (after the subcommand; none is allowed before it): they
/// write a file, run a program the repository's configuration names (`--alternate-refs` runs
/// `core.alternateRefsCommand`; `--remerge-diff` and `--diff-merges=remerge` redo merges,
/// which runs a `merge.<driver>.driver`), or undo the preamble's `--ignore-submodules=all` (a
/// submodule's own configuration would apply).
const GIT_READ: Options = Options {
    refused_long: &[
        "output",
        "ext-diff",
        "textconv",
        "open-files-in-pager",
        "ignore-submodules",
        "submodule",
        "alternate-refs",
        "remerge-diff",
        "diff-merges",
    ],
    why: "writes a file or runs a program the repository configures",
    ..NO_OPTIONS
};

/// `--text` is a whole `git diff` option, not an abbreviation of `--textconv`.
const GIT_WHOLE_OPTIONS: &[&str] = &["text"];

pub(super) fn check_read(script: &str) -> Result<(), Denied> {
    let deny = |what: &str, why: &str| Denied::new(Permission::Read, what, why);
    let parsed = parse::parse_script(script)
        .map_err(|e| deny("the script", &format!("it cannot be judged: {e}")))?;
    if let Some(construct) = parsed.constructs.first() {
        let (what, why) = match construct {
            Construct::Loop { keyword } => (keyword.clone(), "a loop assigns a variable"),
            Construct::Coprocess => ("coproc".to_owned(), "it assigns a variable"),
            Construct::Function { name } => (format!("{name}()"), "it defines a command"),
            Construct::Arithmetic { source } => (source.clone(), "arithmetic can assign variables"),
            Construct::Expansion { source } => {
                (source.clone(), "this expansion can assign variables")
            }
        };
        return Err(deny(&what, why));
    }
    for c in &parsed.commands {
        read_command(c).map_err(|why| deny(&c.render(), &why))?;
    }
    Ok(())
}

/// Why one simple command is refused at `read`, if it is.
fn read_command(c: &SimpleCommand) -> Result<(), String> {
    if !c.assignments.is_empty() {
        return Err("it sets variables".into());
    }
    for r in &c.redirects {
        read_redirect(r)?;
    }
    let Some(first) = c.argv.first() else {
        return Ok(());
    };
    let Some(name) = first.literal.as_deref() else {
        return Err("its command name is known only when it runs".into());
    };
    if name.contains('/') {
        return Err("only commands found by name are allowed".into());
    }
    let Some((_, rule)) = READ_COMMANDS.iter().find(|(n, _)| *n == name) else {
        return Err(format!("`{name}` is not on the read-only list"));
    };
    let args = &c.argv[1..];
    match rule {
        ReadRule::Free => Ok(()),
        ReadRule::Policed(options) => policed(args, options),
        ReadRule::Exactly(allowed) => match literal_args(args)?.as_slice() {
            [] => Ok(()),
            [one] if allowed.contains(&one.as_str()) => Ok(()),
            _ => Err(format!(
                "`{name}` is allowed only with {}",
                allowed.join(", ")
            )),
        },
        ReadRule::Printf => match args.first().map(|w| w.literal.as_deref()) {
            None => Ok(()),
            Some(None) => Err("its format is known only when it runs".into()),
            Some(Some(f)) if f.starts_with("-v") => Err("`printf -v` assigns a variable".into()),
            Some(Some(_)) => Ok(()),
        },
        ReadRule::Git => read_git(args),
    }
}

/// Why a redirection is refused at `read`, if it is. Only these pass: output to `/dev/null`;
/// input from a literal file that is no pattern and no socket; duplicating or closing one of
/// the descriptors 0–2 onto another of them; here-documents and here-strings (their text is
/// data, and the commands inside them are judged on their own).
fn read_redirect(r: &Redirection) -> Result<(), String> {
    if let Some(fd) = r.fd.as_deref().filter(|fd| fd.starts_with('{')) {
        return Err(format!("`{fd}` opens a descriptor and assigns a variable"));
    }
    let target = r.target.literal.as_deref();
    match r.kind {
        RedirectKind::HereString | RedirectKind::HereDocument => return Ok(()),
        _ if target.is_some_and(network_path) || network_path(&r.target.source) => {
            return Err(format!("`{}` opens a network connection", r.target.source));
        }
        RedirectKind::Output | RedirectKind::Append => {
            if target != Some("/dev/null") {
                return Err(format!("it redirects output to `{}`", r.target.source));
            }
        }
        RedirectKind::Input => match target {
            None => {
                return Err(format!(
                    "it reads from `{}`, known only when it runs",
                    r.target.source
                ));
            }
            Some(path) if path.contains(['*', '?', '[', '{']) => {
                return Err(format!(
                    "it reads from `{path}`, a pattern that cannot be judged"
                ));
            }
            Some(_) => {}
        },
        RedirectKind::Duplicate => {
            let standard = |fd: &str| matches!(fd, "0" | "1" | "2");
            let from_ok = r.fd.as_deref().is_none_or(standard);
            let to_ok = target.is_some_and(|t| standard(t) || t == "-");
            if !(from_ok && to_ok) {
                return Err(format!(
                    "it duplicates a descriptor other than 0, 1 or 2 (`{}>&{}`)",
                    r.fd.as_deref().unwrap_or_default(),
                    r.target.source
                ));
            }
        }
    }
    Ok(())
}

/// The literal text of every argument, or why not.
fn literal_args(args: &[ShellWord]) -> Result<Vec<String>, String> {
    args.iter()
        .map(|w| {
            w.literal.clone().ok_or_else(|| {
                format!(
                    "`{}` is known only when it runs, and could be a refused option",
                    w.source
                )
            })
        })
        .collect()
}

fn read_git(args: &[ShellWord]) -> Result<(), String> {
    let args = literal_args(args)?;
    let sub = match args.first() {
        Some(sub) if GIT_READ_SUBCOMMANDS.contains(&sub.as_str()) => sub.as_str(),
        Some(other) if other.starts_with('-') => {
            return Err("git options before the subcommand are not allowed".into());
        }
        _ => return Err("only `git status`, `log`, `diff` and `show` are allowed".into()),
    };
    for arg in &args[1..] {
        if arg == "--" {
            break;
        }
        if sub == "status" && status_verbose(arg) {
            return Err(
                "`git status -v` shows a diff that runs the repository's text \
                        converters, and it takes no `--no-textconv`: use `git diff --cached`"
                    .into(),
            );
        }
        if let Some(long) = arg.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or_default();
            if name.starts_with("no-no-")
                || (!GIT_WHOLE_OPTIONS.contains(&name) && refused_long(name, &GIT_READ))
            {
                return Err(format!("`--{name}` {}", GIT_READ.why));
            }
        } else if arg.starts_with("-O") {
            return Err("`-O` opens files in a pager".into());
        }
    }
    Ok(())
}

/// Whether a `git status` argument asks for `-v`/`--verbose` (alone, in a cluster such as
/// `-sv`, or abbreviated).
fn status_verbose(arg: &str) -> bool {
    match arg.strip_prefix("--") {
        Some(long) => {
            let name = long.split('=').next().unwrap_or_default();
            !name.is_empty() && "verbose".starts_with(name)
        }
        None => arg.starts_with('-') && arg[1..].contains('v'),
    }
}

fn refused_long(name: &str, options: &Options) -> bool {
    options
        .refused_long
        .iter()
        .any(|r| *r == name || (options.abbreviations && !name.is_empty() && r.starts_with(name)))
}

/// Judges a policed command's arguments against its options.
fn policed(args: &[ShellWord], options: &Options) -> Result<(), String> {
    let args = literal_args(args)?;
    let refused = |what: &str| Err(format!("`{what}` {}", options.why));
    let mut operands = 0;
    let mut i = 0;
    let mut options_end = false;
    while let Some(arg) = args.get(i) {
        i += 1;
        if options.refused_words.contains(&arg.as_str()) {
            return refused(arg);
        }
        if options_end || arg == "-" || !arg.starts_with('-') {
            operands += 1;
            continue;
        }
        if arg == "--" {
            options_end = true;
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or_default();
            if refused_long(name, options) {
                return refused(arg);
            }
            continue;
        }
        if !options.clusters {
            continue;
        }
        for (k, c) in arg.char_indices().skip(1) {
            if options.refused_short.contains(c) {
                return refused(&format!("-{c}"));
            }
            if options.with_arg.contains(c) {
                if k + c.len_utf8() == arg.len() {
                    i += 1;
                }
                break;
            }
        }
    }
    match options.max_operands {
        Some(max) if operands > max => Err(options.why.to_owned()),
        _ => Ok(()),
    }
}

/// Shell text the caller prepends to every terminal script at Read: defines a `git` function
/// so that `git status|log|diff|show` cannot run a program the repository's configuration
/// names, nor write the index. It runs `command git` with:
/// - `--no-pager` and `-c core.pager=cat`: no pager (`pager.<cmd>` included);
/// - `--no-optional-locks` and `-c diff.autoRefreshIndex=false`: neither `status` nor `diff`
///   rewrites the index;
/// - `-c core.hooksPath=/dev/null`: no hook (`post-index-change` runs whenever the index is
///   written). Not empty: an empty hooks path is the working directory;
/// - `-c core.fsmonitor=`: no file-system monitor hook;
/// - `-c diff.external=` and, after `log`/`diff`/`show`, `--no-ext-diff --no-textconv`: no
///   external diff or text conversion (`status` accepts neither flag, so the judge refuses
///   `status -v`, the only `status` that diffs);
/// - `-c <key>=` for every `filter.<driver>.clean|smudge|process`,
///   `diff.<driver>.textconv|command` and `merge.<driver>.driver` the repository configures:
///   an empty command runs nothing (`git` fails to start it, or skips it). A driver whose name
///   holds `=` cannot be named in `-c` (git splits at the first `=`), so `git` refuses to run
///   at all in such a repository;
/// - `-c log.diffMerges=separate` and `-c core.alternateRefsCommand=`: `-m` does not redo
///   merges (which runs merge drivers), and no alternate-refs command runs (the judge also
///   refuses `--remerge-diff`, `--diff-merges` and `--alternate-refs`);
/// - `-c log.showSignature=false` and the stock `gpg.*program`s: no configured signature
///   program;
/// - `-c protocol.allow=never`: no transport at all, so no lazy fetch of a partial clone's
///   missing objects — and so no `core.sshCommand`, `remote.*.uploadpack`, credential helper
///   or askpass; `-c credential.helper=` (an empty value clears the helper list),
///   `-c core.sshCommand=` and `-c core.askPass=` disarm them again;
/// - `--ignore-submodules=all`: no descent into submodules, whose own configuration would
///   apply.
///
/// Each empty value above was checked to run nothing on git 2.20 (the oldest the targets are
/// taken to have: Debian 10), 2.39 and 2.47; keys an older git does not know are ignored by
/// it. Any other subcommand is refused by the function too. POSIX sh: it runs under dash, bash
/// and zsh in sh mode. The script is judged ([`check_command`](super::check_command)) without
/// it: the preamble uses what `read` refuses (`command`, `set`, `read`, a loop).
pub fn read_preamble() -> &'static str {
    READ_PREAMBLE
}

const READ_PREAMBLE: &str = r#"git() {
  case "${1-}" in
    status) shift; set -- status --ignore-submodules=all "$@" ;;
    log|diff|show)
      _sshmode_sub=$1; shift
      set -- "$_sshmode_sub" --no-ext-diff --no-textconv --ignore-submodules=all "$@"
      unset _sshmode_sub ;;
    *) echo "git: only status, log, diff and show run at the read permission" >&2; return 2 ;;
  esac
  _sshmode_keys=$(command git --no-pager config --name-only \
    --get-regexp '^(filter|diff|merge)\.' 2>/dev/null || :)
  while IFS= read -r _sshmode_key; do
    case $_sshmode_key in
      *=*)
        echo "git: the repository configures \`$_sshmode_key\`, a driver that cannot be disarmed, so git does not run at the read permission" >&2
        unset _sshmode_keys _sshmode_key; return 2 ;;
      filter.*.clean|filter.*.smudge|filter.*.process|diff.*.textconv|diff.*.command|merge.*.driver)
        set -- -c "$_sshmode_key=" "$@" ;;
    esac
  done <<_SSHMODE_KEYS_
$_sshmode_keys
_SSHMODE_KEYS_
  unset _sshmode_keys _sshmode_key
  command git --no-pager --no-optional-locks -c core.pager=cat -c core.hooksPath=/dev/null \
    -c core.fsmonitor= -c diff.autoRefreshIndex=false -c diff.external= \
    -c log.diffMerges=separate -c core.alternateRefsCommand= \
    -c log.showSignature=false -c gpg.program=gpg -c gpg.openpgp.program=gpg \
    -c gpg.x509.program=gpgsm -c gpg.ssh.program=ssh-keygen -c protocol.allow=never \
    -c credential.helper= -c core.sshCommand= -c core.askPass= "$@"
}
"#;

#[cfg(test)]
mod tests {
    use super::super::testing::{SCOPE, allowed, refused};
    use super::super::{Permission, check_command};

    #[test]
    fn read_allows_looking() {
        allowed(
            Permission::Read,
            &[
                "cat x",
                "ls -la | grep foo | head",
                "git status",
                "git log --oneline -5",
                "find . -name '*.rs'",
                "ls > /dev/null",
                "ls 2>&1",
                "ls 2>/dev/null | wc -l",
                "cat < in.txt",
                "grep -r foo . <<< bar",
                "cat <<EOF\nhello $HOME\nEOF",
                "cd src && ls && pwd",
                "rg -n 'fn main' src",
                "rg -A3 -tRust foo",
                "sort -u -k2 file | uniq -c",
                "git diff HEAD~1 -- src",
                "git diff --stat --summary --ignore-all-space",
                "git show --stat HEAD",
                "git log --no-ext-diff --text -p",
                "git diff --output-indicator-new=+ x",
                "du -sh . ; df -h ; ps aux | head",
                "stat -c %s f && wc -l f",
                "echo $HOME; printf '%s\\n' a b",
                "test -f x && echo yes || echo no",
                "[ -d src ] && tree -L 2 src",
                "if true; then ls; fi",
                "(cd src; ls)",
                "echo \"$(ls)\" `pwd`",
                "cat <(ls)",
                "hostname; hostname -f; uname -a; date; date +%s; id -un; whoami",
                "file README.md; sha256sum x; diff a b; cmp a b",
                "uniq f",
                "find . -type f -newer x -print0 | head",
                "jq .name package.json",
            ],
        );
    }

    #[test]
    fn read_refuses_the_issue_examples() {
        refused(
            Permission::Read,
            &[
                "cat x > y",
                "ls; rm -rf d",
                "sh -c 'rm d'",
                "find . -delete",
                "rg --pre sh x",
                "sort -o f x",
                "xargs rm",
            ],
        );
    }

    #[test]
    fn read_refuses_bypass_attempts() {
        refused(
            Permission::Read,
            &[
                // Names.
                "/bin/rm x",
                "./ls",
                "\\rm x",
                "r''m x",
                "$CMD x",
                "\"$(echo rm)\" x",
                // Substitutions and nested commands run too.
                "echo $(rm x)",
                "echo `rm x`",
                "cat <(rm x)",
                "echo \"$(touch y)\"",
                "cat <<EOF\n$(rm x)\nEOF",
                "ls && { rm x; }",
                "ls | xargs rm",
                "(rm x)",
                "! rm x",
                "if rm x; then :; fi",
                // Variables: prefixes, bare assignments, loops, functions, arithmetic.
                "X=1 cat x",
                "PATH=/tmp ls",
                "LD_PRELOAD=/tmp/x.so ls",
                "GIT_DIR=/tmp git status",
                "PATH=/tmp; ls",
                "for PATH in /tmp; do ls; done",
                "select x in a; do ls; done",
                "git() { cat; }; git status",
                "function ls { cat; }",
                "((PATH=1)); ls",
                "echo $((PATH=1))",
                "cat <<EOF\n$((X=1))\nEOF",
                "echo ${PATH:=/tmp}",
                "echo ${X:0:1}",
                "coproc cat",
                "printf -v PATH /tmp",
                "printf $F x",
                "[[ 1 -eq x ]]",
                "read PATH",
                "export PATH=/tmp",
                // Redirections.
                "ls >> y",
                "ls >| y",
                "ls &> y",
                "ls >& y",
                "cat 1<>y",
                "ls > $F",
                "ls > /dev/null2",
                "> y",
                // Options.
                "find . -exec rm {} ;",
                "find . -execdir ls ;",
                "find . -ok rm {} ;",
                "find . -fprint f",
                "find . -fprintf f %p",
                "find . -fls f",
                "find . $X",
                "rg --pre=sh x",
                "rg --hostname-bin=sh x",
                "rg -z x",
                "rg -nz x",
                "rg --search-zip x",
                "sort -uo f x",
                "sort --output=f x",
                "sort --out=f x",
                "sort --compress-program=sh x",
                "sort $X",
                "uniq a b",
                "tree -o f",
                "tree -R -H . x",
                "tree -ao f",
                "file -C -m x",
                "file -z x.gz",
                "date -s now",
                "date --set=now",
                "hostname evil",
                "hostname -F f",
                // git.
                "git -c core.pager=sh log",
                "git --output=f diff",
                "git -C /tmp status",
                "git --git-dir=/tmp/x status",
                "git diff --output=f",
                "git diff --out=f",
                "git log --ext-diff -p",
                "git log --ext -p",
                "git show --textconv",
                "git status --ignore-submodules=none",
                "git diff --submodule=diff",
                "git diff --no-no-ext-diff",
                "git grep -O x",
                "git diff -Opager",
                "git commit -m x",
                "git checkout .",
                "git stash",
                "git $SUB",
                "git log $X",
                "git",
                // Not on the list.
                "bash x.sh",
                "python3 -c 'print(1)'",
                "env ls",
                "make",
                "awk '{print}' f",
                "sed -n 1p f",
                "tee f",
                "exec ls",
                "eval ls",
                "command ls",
                "builtin echo",
                "source x",
                ". x",
                "sudo ls",
                "nice ls",
                "timeout 5 ls",
                "nohup ls",
                "cp a b",
                "touch x",
                "less f",
                "trap 'rm x' EXIT",
                "alias ls=rm",
                "unset -f git",
                // Fails closed.
                &"$(".repeat(40),
            ],
        );
    }

    #[test]
    fn read_refuses_sockets_and_redirections_it_cannot_see() {
        allowed(
            Permission::Read,
            &[
                "ls 2>&1",
                "ls >&2",
                "ls 1>&2 2>/dev/null",
                "cat <&0",
                "cat 0<&- ; ls 2>&-",
                "cat 3< in.txt",
                "grep x <<< \"$HOME\"",
                "cat /dev/tcp/h/p",
            ],
        );
        refused(
            Permission::Read,
            &[
                // Sockets, either way, however spelt.
                "printf X 0</dev/tcp/127.0.0.1/9 1<&0",
                "cat </dev/tcp/127.0.0.1/9",
                "cat 0</dev/tcp/h/p",
                "echo x >/dev/tcp/h/p",
                "echo x >>/dev/udp/h/p",
                "cat <>/dev/udp/h/p",
                "cat 3<>/dev/tcp/h/p",
                "0</dev/tcp/h/p",
                "cat < /DEV/TCP/h/p",
                "cat < /dev//tcp/h/p",
                "cat < /dev/./udp/h/p",
                "cat < /x/../dev/tcp/h/p",
                "cat < '/dev/t''cp/h/p'",
                "cat < \\/dev/tcp/h/p",
                "cat < $'\\x2fdev/tcp/h/p'",
                "cat < {/dev/tcp/h/p,}",
                // Inside substitutions and here-documents, which run too.
                "echo $(cat </dev/tcp/h/p)",
                "cat <(cat </dev/tcp/h/p)",
                "cat <<EOF\n$(cat </dev/udp/h/p)\nEOF",
                "echo `cat </dev/tcp/h/p`",
                // Descriptors beyond 0-2.
                "ls 2>&5",
                "ls >&5",
                "cat <&3",
                "cat 3<&0",
                "ls 5>&1",
                "cat 3<&-",
                "ls 2>&1-",
                "cat 0<&1-",
                "cat {fd}<in.txt",
                "ls {x}>/dev/null",
                "exec 3<>file",
                "exec 3<file",
                "exec >&-",
                // Targets known only when it runs.
                "cat < \"$X\"",
                "cat < $X",
                "cat <$(echo /dev/tcp/x/1)",
                "cat < `echo x`",
                "cat <&$fd",
                "ls >&$fd",
                "cat < *.txt",
                "$CMD file",
                "${CMD} file",
                // Shells and eval are not on the list, whatever they run.
                "sh -c 'cat </dev/tcp/h/p'",
                "bash -c 'printf X >/dev/tcp/h/p'",
                "eval 'cat </dev/tcp/h/p'",
            ],
        );
        let d = check_command(
            Permission::Read,
            "printf X 0</dev/tcp/127.0.0.1/9 1<&0",
            &SCOPE,
        )
        .unwrap_err();
        assert!(
            d.why
                .contains("`/dev/tcp/127.0.0.1/9` opens a network connection"),
            "{d}"
        );
        let d = check_command(Permission::Read, "ls 2>&5", &SCOPE).unwrap_err();
        assert!(d.why.contains("other than 0, 1 or 2"), "{d}");
    }

    #[test]
    fn read_refuses_git_options_that_run_the_repositorys_programs() {
        allowed(
            Permission::Read,
            &[
                "git status -s",
                "git status --short --branch --porcelain=v2",
                "git status -uno",
                "git status --no-verbose",
                "git status -- -v",
                "git log -p -m -1",
                "git log --all --abbrev-commit",
                "git diff --raw --relative",
            ],
        );
        refused(
            Permission::Read,
            &[
                "git status -v",
                "git status -vv",
                "git status -sv",
                "git status --verbose",
                "git status --verb",
                "git log --alternate-refs",
                "git log --alt",
                "git show --remerge-diff HEAD",
                "git log -p --diff-merges=remerge",
                "git log -p --diff-merges r",
                "git show --diff-merges=r",
            ],
        );
    }
}
