//! The guard's test lists, kept as data: per family of destructive commands, the many forms bash
//! allows (`tests/data/guard/<family>.txt` and the shared `wrappers.txt`, expanded here), and a
//! corpus of everyday operator commands (`tests/data/guard/everyday.txt`, one command a line).
//! It checks the data — its size, its variety and that every line is bash — and then the
//! verdicts on it, as the task tools reach them (`workspace::verdict::judge_command`, in a
//! workspace, at `full` and at `read-write`): each family at least [`MIN_STOPPED`] stopped
//! (refused or asked), the everyday corpus never refused by the guard and at most
//! [`MAX_ASKED`] asked. Run with `--nocapture` for the figures BENCHMARKS.md reports.
//!
//! A family file holds one entry a line (blank lines and `#` comments aside), `KIND HEAD TAG…:
//! TEXT`:
//!
//! - `slot NAME TAG…: VALUE` — one value of the operand `NAME`;
//! - `form SHAPE TAG…: TEMPLATE` — a command, where `{{NAME}}` stands for each value of `NAME`;
//! - `wrap SHAPE TAG…: TEMPLATE` — a wrapper, where `{{cmd}}` stands for the form it wraps.
//!
//! `{{x:sq}}` and `{{x:dq}}` put the text in single or double quotes, `{{nl}}` is a new line.
//! A shape says what a form is and what a wrapper takes: `simple`, one simple command of a
//! program that is also a file, with no assignment in front and its standard input left alone (so
//! `sudo`, `nice` or `echo | xargs` before it still run it as written); `line`, any list on one
//! line; `script`, several lines (an alias only works on a line after the one defining it). A
//! wrapper wraps forms of its shape or a narrower one.
//!
//! A form yields one candidate for each combination of its slots' values, and [`WRAPPED`] more,
//! each inside the next wrapper that takes it (one turn through the wrappers runs across the
//! family's forms, so each wrapper meets many forms) and with the next combination. A candidate's
//! tags, the union of its form's, values' and wrapper's, name the bash features it uses
//! ([`FEATURES`]).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The families, each a file of `tests/data/guard/`.
pub const FAMILIES: &[&str] = &[
    "opaque_variables",
    "script_links",
    "code_as_data",
    "identity_boot_files",
    "storage_system_state",
    "elsewhere_mounted",
    "wide_deletes",
];

/// How many wrapped candidates each form yields besides its bare ones.
pub const WRAPPED: usize = 6;

/// Every tag, with the text a candidate carrying it shows (any one of them).
pub const FEATURES: &[(&str, &[&str])] = &[
    ("quote-single", &["'"]),
    ("quote-double", &["\""]),
    ("quote-ansi-c", &["$'"]),
    ("backslash", &["\\"]),
    ("variable", &["$"]),
    ("brace", &["{"]),
    ("glob", &["*", "?", "["]),
    ("cmdsub-dollar", &["$("]),
    ("cmdsub-backtick", &["`"]),
    ("env", &["env "]),
    ("command", &["command "]),
    ("builtin", &["builtin "]),
    ("exec", &["exec "]),
    ("nice", &["nice "]),
    ("timeout", &["timeout "]),
    ("xargs", &["xargs "]),
    ("sudo", &["sudo "]),
    ("su-c", &["su -c ", "su root -c ", "su - root -c "]),
    ("doas", &["doas "]),
    ("busybox", &["busybox "]),
    ("setsid", &["setsid "]),
    ("flock", &["flock "]),
    ("stdbuf", &["stdbuf "]),
    ("here-string", &["<<<"]),
    ("function", &["() {", "function "]),
    ("alias", &["alias "]),
    ("semicolon", &[";"]),
    ("and", &["&&"]),
    ("pipe", &["|"]),
    ("subshell", &["( "]),
    ("group", &["{ "]),
];

type Tags = BTreeSet<String>;

/// One destructive command of a family, with the features it uses.
pub struct Candidate {
    pub family: &'static str,
    pub command: String,
    pub tags: Tags,
}

/// Every distinct candidate of every family (the tags of a repeated command merged).
pub fn candidates() -> Vec<Candidate> {
    let shared = Table::read("wrappers");
    let mut out: Vec<Candidate> = Vec::new();
    for &family in FAMILIES {
        let table = Table::read(family);
        let wraps: Vec<&Entry> = table.wraps.iter().chain(&shared.wraps).collect();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (command, tags) in table.expand(&wraps) {
            match seen.get(&command) {
                Some(&at) => out[at].tags.extend(tags),
                None => {
                    seen.insert(command.clone(), out.len());
                    out.push(Candidate {
                        family,
                        command,
                        tags,
                    });
                }
            }
        }
    }
    out
}

/// The everyday corpus, one command a line.
pub fn everyday() -> Vec<String> {
    let text = std::fs::read_to_string(data_dir().join("everyday.txt")).expect("everyday.txt");
    text.lines().map(str::to_owned).collect()
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/guard")
}

/// One `KIND HEAD TAG…: TEXT` line; `head` is a slot's name or a form's or wrapper's shape.
struct Entry {
    head: String,
    tags: Tags,
    text: String,
}

#[derive(Default)]
struct Table {
    slots: HashMap<String, Vec<Entry>>,
    forms: Vec<Entry>,
    wraps: Vec<Entry>,
}

impl Table {
    fn read(name: &str) -> Table {
        let path = data_dir().join(format!("{name}.txt"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let mut table = Table::default();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (words, text) = line
                .split_once(": ")
                .unwrap_or_else(|| panic!("no `: ` in {line}"));
            let mut words = words.split_whitespace().map(str::to_owned);
            let (kind, head) = (
                words.next().unwrap(),
                words.next().expect("a name or shape"),
            );
            let entry = Entry {
                head,
                tags: words.collect(),
                text: text.to_owned(),
            };
            match kind.as_str() {
                "slot" => table
                    .slots
                    .entry(entry.head.clone())
                    .or_default()
                    .push(entry),
                "form" => table.forms.push(entry),
                "wrap" => table.wraps.push(entry),
                _ => panic!("{path:?}: unknown kind in {line}"),
            }
        }
        table
    }

    /// Each form with every combination of its slots' values, then [`WRAPPED`] times inside the
    /// next wrapper that takes it.
    fn expand(&self, wraps: &[&Entry]) -> Vec<(String, Tags)> {
        let mut out = Vec::new();
        let mut turn = wraps.iter().cycle();
        for form in &self.forms {
            let bare = self.combinations(form);
            let takes = |w: &&&Entry| shape(&w.head) >= shape(&form.head);
            let count = WRAPPED.min(wraps.iter().filter(takes).count());
            let wrapped: Vec<(String, Tags)> = (turn.by_ref().filter(takes).take(count))
                .enumerate()
                .map(|(i, wrap)| {
                    let (command, tags) = &bare[i % bare.len()];
                    let text = fill(&wrap.text, &mut |n| (n == "cmd").then(|| command.clone()));
                    (text, tags.union(&wrap.tags).cloned().collect())
                })
                .collect();
            out.extend(bare);
            out.extend(wrapped);
        }
        out
    }

    /// The form with each combination of its slots' values, and the tags of each.
    fn combinations(&self, form: &Entry) -> Vec<(String, Tags)> {
        let mut names = Vec::new();
        fill(&form.text, &mut |name| {
            names.push(name.to_owned());
            Some(String::new())
        });
        names.sort();
        names.dedup();
        let lists: Vec<&Vec<Entry>> = names
            .iter()
            .map(|n| (self.slots.get(n)).unwrap_or_else(|| panic!("no slot {n} for {}", form.text)))
            .collect();
        let count = lists.iter().map(|l| l.len()).product();
        (0..count)
            .map(|mut k| {
                let mut tags = form.tags.clone();
                let mut values = HashMap::new();
                for (name, list) in names.iter().zip(&lists) {
                    let value = &list[k % list.len()];
                    k /= list.len();
                    tags.extend(value.tags.iter().cloned());
                    values.insert(name.as_str(), value.text.clone());
                }
                (fill(&form.text, &mut |n| values.get(n).cloned()), tags)
            })
            .collect()
    }
}

fn shape(name: &str) -> usize {
    ["simple", "line", "script"]
        .iter()
        .position(|s| *s == name)
        .unwrap_or_else(|| panic!("unknown shape {name}"))
}

/// `template` with each `{{name}}`, `{{name:sq}}`, `{{name:dq}}` replaced by `value(name)` as
/// is, single-quoted or double-quoted, and `{{nl}}` by a new line; other braces stay as they are.
fn fill(template: &str, value: &mut dyn FnMut(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let Some((inner, tail)) = rest[at + 2..]
            .split_once("}}")
            .filter(|(i, _)| is_placeholder(i))
        else {
            out.push('{');
            rest = &rest[at + 1..];
            continue;
        };
        let (name, mode) = inner.split_once(':').unwrap_or((inner, ""));
        let text = match name {
            "nl" => "\n".to_owned(),
            _ => value(name).unwrap_or_else(|| panic!("nothing for {{{{{inner}}}}} in {template}")),
        };
        out.push_str(&match mode {
            "sq" => format!("'{}'", text.replace('\'', r"'\''")),
            "dq" => format!("\"{}\"", escape_double(&text)),
            _ => text,
        });
        rest = tail;
    }
    out + rest
}

/// `name`, `name:sq` or `name:dq`, the name in lower-case letters, digits and `_`.
fn is_placeholder(inner: &str) -> bool {
    let (name, mode) = inner.split_once(':').unwrap_or((inner, ""));
    let name_chars = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    !name.is_empty() && name.chars().all(name_chars) && ["", "sq", "dq"].contains(&mode)
}

/// `text` for inside double quotes: `\`, `"`, `$` and `` ` `` escaped.
fn escape_double(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\\"$`".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lines bash does not parse, each with what bash said.
fn not_bash(lines: &[&str]) -> Vec<String> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = lines.len().div_ceil(workers).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = lines
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .filter_map(|l| bash_error(l))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|p| p.join().expect("a bash worker"))
            .collect()
    })
}

fn bash_error(line: &str) -> Option<String> {
    let out = Command::new("bash")
        .args(["-n", "-c", line])
        .env_remove("BASH_ENV")
        .output()
        .expect("running bash");
    let said = String::from_utf8_lossy(&out.stderr);
    (!out.status.success()).then(|| format!("{line}\n    {}", said.trim()))
}

#[test]
fn each_family_yields_at_least_200_distinct_forms() {
    let all = candidates();
    let counts: Vec<(&str, usize)> = FAMILIES
        .iter()
        .map(|f| (*f, all.iter().filter(|c| c.family == *f).count()))
        .collect();
    assert!(counts.iter().all(|(_, n)| *n >= 200), "{counts:?}");
}

#[test]
fn every_feature_occurs_and_every_tag_shows_in_its_command() {
    let all = candidates();
    let mut wrong = Vec::new();
    for c in &all {
        for tag in &c.tags {
            match FEATURES.iter().find(|(name, _)| name == tag) {
                None => wrong.push(format!("unknown tag {tag}: {}", c.command)),
                Some((_, marks)) if !marks.iter().any(|m| c.command.contains(m)) => {
                    wrong.push(format!("{tag} does not show in: {}", c.command))
                }
                Some(_) => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let missing: Vec<&str> = FEATURES
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| !all.iter().any(|c| c.tags.contains(*name)))
        .collect();
    assert!(missing.is_empty(), "no candidate uses {missing:?}");
}

#[test]
fn the_everyday_corpus_has_at_least_1000_distinct_lines() {
    let lines = everyday();
    let mut seen = BTreeSet::new();
    let repeated: Vec<&String> = lines.iter().filter(|l| !seen.insert(l.as_str())).collect();
    assert!(repeated.is_empty(), "repeated lines: {repeated:#?}");
    assert!(!lines.iter().any(|l| l.trim().is_empty()), "an empty line");
    assert!(lines.len() >= 1000, "{} lines", lines.len());
}

#[test]
fn every_candidate_and_corpus_line_parses_as_bash() {
    let all = candidates();
    let corpus = everyday();
    let lines: Vec<&str> = all
        .iter()
        .map(|c| c.command.as_str())
        .chain(corpus.iter().map(String::as_str))
        .collect();
    let bad = not_bash(&lines);
    assert!(
        bad.is_empty(),
        "{} lines are not bash:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

// -------------------------------------------------------------------------------------------
// Verdicts: the lists judged as the task tools judge a command
// -------------------------------------------------------------------------------------------

use sshmode::bash::Verdict;
use sshmode::exec::guard::Guard;
use sshmode::workspace::judge::{Permission, Scope};
use sshmode::workspace::verdict::judge_command;

/// Where the lists are judged: a project workspace in an operator's home, the shell in it.
const SCOPE: Scope<'static> = Scope {
    workspace: "/home/op/project",
    cwd: "/home/op/project",
    home: Some("/home/op"),
};

/// Least share of each family's candidates stopped (refused or asked) at `full` and at
/// `read-write`.
const MIN_STOPPED: f64 = 0.99;
/// Most share of the everyday corpus the guard asks about, at `full` and at `read-write`;
/// the guard may refuse none of it.
const MAX_ASKED: f64 = 0.02;
/// Most everyday commands the `read-write` permission itself refuses: deleting (`rm -rf
/// build/`, `find -delete`, `truncate`), writing outside the workspace (`mkdir -p
/// ~/.config/x`, `curl -o /tmp/…`) and what it cannot see through (`git -C "$d"`), as that
/// permission promises (README, "Workspaces"). More is a regression.
const MAX_REFUSED_BY_PERMISSION: usize = 37;

/// The verdict on `command` at `permission` as the terminal tool reaches it — the
/// permission judge (below `full`), then the guard, in the workspace — and its rule
/// (`permission` when the permission refused it).
fn verdict(guard: &Guard, permission: Permission, command: &str) -> (Verdict, String) {
    let j = judge_command(guard, permission, command, &SCOPE);
    (j.verdict, j.rule)
}

fn families_are_stopped(permission: Permission) {
    let guard = Guard::default();
    let all = candidates();
    let (mut stopped, mut generated) = (0, 0);
    let mut failed = Vec::new();
    for &family in FAMILIES {
        let mine: Vec<&Candidate> = all.iter().filter(|c| c.family == family).collect();
        let allowed: Vec<&str> = mine
            .iter()
            .filter(|c| verdict(&guard, permission, &c.command).0 == Verdict::Allow)
            .map(|c| c.command.as_str())
            .collect();
        let s = mine.len() - allowed.len();
        println!("{permission} {family}: {s}/{} stopped", mine.len());
        stopped += s;
        generated += mine.len();
        if (s as f64) < MIN_STOPPED * mine.len() as f64 {
            failed.push(format!(
                "{family}: {s}/{} stopped, under {MIN_STOPPED}; allowed:\n  {}",
                mine.len(),
                allowed.join("\n  ")
            ));
        }
    }
    println!("{permission} overall: {stopped}/{generated} stopped");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The everyday corpus at `permission`: (refused by the guard, asked, refused by the
/// permission), each line with its rule, and how many were allowed.
fn everyday_verdicts(permission: Permission) -> [Vec<String>; 3] {
    let guard = Guard::default();
    let mut out: [Vec<String>; 3] = Default::default();
    for line in everyday() {
        let (v, rule) = verdict(&guard, permission, &line);
        let k = match (v, rule.as_str()) {
            (Verdict::Allow, _) => continue,
            (Verdict::Refuse, "permission") => 2,
            (Verdict::Refuse, _) => 0,
            (Verdict::Ask, _) => 1,
        };
        out[k].push(format!("{line}  ({rule})"));
    }
    let total = everyday().len();
    let allowed = total - out.iter().map(Vec::len).sum::<usize>();
    println!(
        "{permission} everyday: {} refused by the guard, {} refused by the permission, {} asked, \
         {allowed} allowed of {total}",
        out[0].len(),
        out[2].len(),
        out[1].len(),
    );
    out
}

fn everyday_goes_through(permission: Permission, max_by_permission: usize) {
    let [refused, asked, by_permission] = everyday_verdicts(permission);
    let total = everyday().len();
    assert!(
        refused.is_empty()
            && (asked.len() as f64) <= MAX_ASKED * total as f64
            && by_permission.len() <= max_by_permission,
        "{permission}: {} refused by the guard (none may be), {} asked (at most {MAX_ASKED} of \
         {total}), {} refused by the permission (at most {max_by_permission}):\n\
         refused by the guard:\n  {}\nasked:\n  {}\nrefused by the permission:\n  {}",
        refused.len(),
        asked.len(),
        by_permission.len(),
        refused.join("\n  "),
        asked.join("\n  "),
        by_permission.join("\n  ")
    );
}

#[test]
fn each_family_is_stopped_at_full() {
    families_are_stopped(Permission::Full);
}

#[test]
fn each_family_is_stopped_at_read_write() {
    families_are_stopped(Permission::ReadWrite);
}

#[test]
fn the_everyday_corpus_goes_through_at_full() {
    everyday_goes_through(Permission::Full, 0);
}

#[test]
fn the_everyday_corpus_goes_through_at_read_write() {
    everyday_goes_through(Permission::ReadWrite, MAX_REFUSED_BY_PERMISSION);
}
