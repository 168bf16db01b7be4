//! Expansion: turns a parsed word into the arguments ([`Field`]s) the shell would pass, as far
//! as they can be known before the command runs — brace expansion (bounded, one linear scan
//! per group), parameters from what the line assigned earlier and the caller's environment,
//! `${X:-default}`, the output of `echo`/`printf` substitutions whose output is plain text,
//! and word splitting on `IFS`.
//!
//! What cannot be known stays unknown: a field carries both its value (`None` when unknown)
//! and the text it would have if every unknown part were empty, because an unset variable is
//! empty (`rm -rf "$UNSET"/*` is `rm -rf /*`). Expansion never runs anything and never
//! touches the filesystem; every byte it produces is charged to the [`Expander`]'s budget
//! of text and CPU time, and past either (or past [`MAX_BRACE`] words of one brace
//! expansion, or an `IFS` known only at run time) it stops with a [`Bound`]: the caller
//! refuses, never judges in part.

use std::collections::HashMap;
use std::time::Duration;

use super::abbreviate;
use super::parse::{Part, Tok, Word};

/// Total characters a walk may lex and expand (all nesting levels together).
pub const MAX_TEXT: usize = 1 << 20;
/// Longest variable value tracked; longer values count as unknown.
pub const MAX_VALUE: usize = 64 * 1024;
/// Most words one brace expansion may produce.
pub const MAX_BRACE: usize = 1024;
/// How many spends pass between two readings of the CPU clock.
const CLOCK_EVERY: u32 = 64;

/// Why expansion stopped: a bound was reached, and the command cannot be judged whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// More than the budget's characters were lexed or expanded.
    Text,
    /// More than the budget's CPU time was spent.
    Cpu(Duration),
    /// A brace expansion in this word (abbreviated) makes more than [`MAX_BRACE`] words.
    Braces { word: String },
    /// `IFS` is known only at run time, so how this value (abbreviated) splits is unknown.
    UnknownIfs { value: String },
}

/// What one analysis may still spend: characters lexed or expanded, and CPU time.
pub struct Expander {
    /// Characters still allowed.
    chars: usize,
    /// CPU time this thread may spend, and what it had used when the analysis started.
    cpu_limit: Duration,
    cpu_start: Duration,
    /// Spends since the CPU clock was last read (reading it is a system call).
    since_clock: u32,
    /// The likely output of the substitution [`Expander::part_value`] just read as
    /// unknown, if it has one.
    likely: Option<String>,
}

impl Expander {
    /// An expander that may spend `chars` characters and `cpu_limit` of this thread's CPU
    /// time (zero: every spend fails).
    pub fn new(chars: usize, cpu_limit: Duration) -> Expander {
        Expander {
            chars,
            cpu_limit,
            cpu_start: thread_cpu_time(),
            since_clock: 0,
            likely: None,
        }
    }

    /// Charges `n` units of work; fails once the text budget or the CPU budget is spent.
    pub fn spend(&mut self, n: usize) -> Result<(), Bound> {
        self.chars = self.chars.checked_sub(n).ok_or(Bound::Text)?;
        self.since_clock += 1;
        if self.since_clock >= CLOCK_EVERY || self.cpu_limit.is_zero() {
            self.since_clock = 0;
            if thread_cpu_time().saturating_sub(self.cpu_start) >= self.cpu_limit {
                return Err(Bound::Cpu(self.cpu_limit));
            }
        }
        Ok(())
    }
}

/// CPU time used by this thread so far.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        // No thread clock: count nothing, the text budget still bounds the work.
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Most values of a `for` loop tracked; longer lists make the variable unknown.
pub const MAX_LOOP_VALUES: usize = 16;

/// The default `IFS`: space, tab, newline.
const DEFAULT_IFS: &str = " \t\n";

/// One argument after expansion.
#[derive(Debug, Clone)]
pub struct Field {
    /// The value, or `None` when it depends on something unknown before the command runs.
    pub value: Option<String>,
    /// Shell-ish rendering for messages and for nested scripts (unknown parts as `${X}`).
    pub display: String,
    /// The value if every unknown part is empty (an unset variable, an empty output).
    pub if_empty: String,
}

impl Field {
    pub fn lit(s: &str) -> Field {
        Field {
            value: Some(s.to_owned()),
            display: s.to_owned(),
            if_empty: s.to_owned(),
        }
    }

    pub fn unknown(display: &str) -> Field {
        Field {
            value: None,
            display: display.to_owned(),
            if_empty: String::new(),
        }
    }

    pub fn val(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// The value, or the rendering with unknown parts, as script text.
    pub fn text(&self) -> &str {
        self.value.as_deref().unwrap_or(&self.display)
    }

    /// The values the rules judge: the value when known, else the value with the unknown
    /// parts empty.
    pub fn judged(&self) -> &str {
        self.value.as_deref().unwrap_or(&self.if_empty)
    }
}

/// What the command line has established so far, as far as it can be known statically.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// Shell variables assigned earlier on the line or given by the call's environment;
    /// `None` = assigned something unknown.
    pub vars: HashMap<String, Option<String>>,
    /// The values a `for` loop variable takes, when they are all known: commands using the
    /// variable are judged once per value.
    pub loops: HashMap<String, Vec<String>>,
    /// The working directory: the caller's, then after a `cd` to a known place; `None` =
    /// unknown.
    pub cwd: Option<String>,
    /// The home directory as an absolute path, when the caller knows it.
    pub home: Option<String>,
    /// The positional parameters (`"$@"`), when every one is known: set by a function call
    /// or `set --`. `None`: unknown.
    pub args: Option<Vec<String>>,
    /// Links the script made before this point (link path → target, both absolute): a
    /// path through one is judged where it leads ([`Env::resolve`]).
    pub links: std::sync::Arc<[(String, String)]>,
}

impl Env {
    pub fn set(&mut self, name: String, value: Option<String>) {
        self.loops.remove(&name);
        self.vars.insert(name, value);
    }

    pub fn unset(&mut self, name: &str) {
        self.loops.remove(name);
        self.vars.remove(name);
    }

    /// `path` as seen from the working directory, when that is known; a path inside the
    /// known home directory is written `~/…`.
    pub fn resolve<'a>(&self, path: &'a str) -> std::borrow::Cow<'a, str> {
        // An empty argument names no file (`rm -rf ""` deletes nothing).
        if path.is_empty() {
            return path.into();
        }
        let mut absolute: std::borrow::Cow<'a, str> = match &self.cwd {
            Some(cwd) if !path.starts_with('/') && !path.starts_with('~') => {
                format!("{cwd}/{path}").into()
            }
            _ => path.into(),
        };
        if !self.links.is_empty() {
            let home = self.home.as_deref().map(|h| h.trim_end_matches('/'));
            let full = match (absolute.strip_prefix('~'), home) {
                (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => {
                    format!("{home}{rest}")
                }
                _ => absolute.clone().into_owned(),
            };
            if !full.starts_with('~') {
                let followed = super::effects::follow_links(&full, &self.links);
                if followed != full {
                    absolute = followed.into();
                }
            }
        }
        if let Some(home) = self.home.as_deref().map(|h| h.trim_end_matches('/'))
            && !home.is_empty()
            && let Some(rest) = absolute.strip_prefix(home)
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("~{rest}").into();
        }
        absolute
    }

    /// `IFS` as far as it is known: `Some` text, `None` when assigned something unknown.
    fn ifs(&self) -> Option<&str> {
        match self.vars.get("IFS") {
            Some(v) => v.as_deref(),
            None => Some(DEFAULT_IFS),
        }
    }
}

/// A field under construction during expansion.
struct Building {
    value: Option<String>,
    display: String,
    if_empty: String,
    /// Must be emitted even if empty (quoted or unknown content).
    keep: bool,
}

impl Building {
    fn new() -> Building {
        Building {
            value: Some(String::new()),
            display: String::new(),
            if_empty: String::new(),
            keep: false,
        }
    }

    fn push(&mut self, s: &str) {
        if let Some(v) = &mut self.value {
            v.push_str(s);
        }
        self.display.push_str(s);
        self.if_empty.push_str(s);
    }

    fn unknown(&mut self, display: &str) {
        self.value = None;
        self.display.push_str(display);
        self.keep = true;
    }

    /// An unknown part; `${X:?}` stops the command when X is empty, so it never is.
    fn unknown_part(&mut self, p: &Part, display: &str) {
        self.unknown(display);
        if let Part::Opaque { source, .. } = p
            && let Some(inner) = source.strip_prefix("${")
            && inner
                .find(|c: char| c != '_' && !c.is_ascii_alphanumeric())
                .is_some_and(|n| inner[n..].starts_with(":?"))
        {
            self.if_empty.push('_');
        }
    }

    fn has_content(&self) -> bool {
        self.keep || !self.display.is_empty()
    }

    fn finish(&mut self, out: &mut Vec<Field>) {
        let b = std::mem::replace(self, Building::new());
        if b.keep || !b.display.is_empty() {
            out.push(Field {
                value: b.value,
                display: b.display,
                if_empty: b.if_empty,
            });
        }
    }
}

impl Expander {
    pub fn lookup(&self, name: &str, env: &Env) -> Option<String> {
        match env.vars.get(name) {
            Some(v) => v.clone(),
            None => match name {
                // Classified as the home directory wherever it appears.
                "HOME" => Some("~".into()),
                "IFS" => Some(DEFAULT_IFS.into()),
                _ => None,
            },
        }
    }

    /// The output of a command substitution of one simple command: `Some((text, true))`
    /// when it is known (a plain `echo`/`printf` of known text, `dirname`, `basename`,
    /// `ls -d`), `Some((text, false))` when it is only likely ([`path_output`]).
    fn subst_output(&mut self, toks: &[Tok], env: &Env) -> Result<Option<(String, bool)>, Bound> {
        let mut words = Vec::new();
        for t in toks {
            match t {
                Tok::Word(w) => words.push(w),
                Tok::Op(super::parse::Op::Semi) => {}
                _ => return Ok(None),
            }
        }
        let mut fields = Vec::new();
        for w in words {
            fields.extend(self.expand(w, env)?);
        }
        Ok(echo_output(&fields)
            .map(|t| (t, true))
            .or_else(|| path_output(&fields)))
    }

    /// The value of one part: `Ok(text)`, or `Err(display)` when it is unknown before the
    /// command runs — then, for a substitution whose output is only likely
    /// (`"$(readlink -f /etc/passwd)"`), that output in [`Expander::likely`], to judge the
    /// value by while it stays unknown.
    fn part_value(&mut self, p: &Part, env: &Env) -> Result<Result<String, String>, Bound> {
        self.likely = None;
        Ok(match p {
            Part::Lit { text, .. } => Ok(text.clone()),
            Part::Param { name, .. } => match (name.as_str(), &env.args) {
                ("@" | "*", Some(args)) => Ok(args.join(" ")),
                ("#", Some(args)) => Ok(args.len().to_string()),
                _ => self.lookup(name, env).ok_or_else(|| format!("${{{name}}}")),
            },
            Part::Subst {
                toks,
                source,
                output,
                ..
            } => {
                let value = match *output {
                    true => match self.subst_output(toks, env)? {
                        Some((text, true)) => Some(text),
                        Some((text, false)) => {
                            self.likely = Some(text.trim_end().to_owned());
                            None
                        }
                        None => None,
                    },
                    false => None,
                };
                let open = if *output { "$(" } else { "<(" };
                value
                    .map(|v| v.trim_end().to_owned())
                    .ok_or_else(|| format!("{open}{source})"))
            }
            Part::Opaque {
                fallback: Some((name, default)),
                source,
                ..
            } => match self.lookup(name, env) {
                Some(v) if !v.is_empty() => Ok(v),
                // Known empty or unset on this line: the default applies.
                _ if env.vars.get(name).is_some_and(Option::is_some) => {
                    let d = self.expand_joined(default, env)?;
                    d.value.ok_or_else(|| source.clone())
                }
                _ => Err(source.clone()),
            },
            Part::Opaque { source, .. } => Err(source.clone()),
        })
    }

    /// A word's fields: brace expansion, parameter and substitution values, word splitting.
    pub(crate) fn expand(&mut self, w: &Word, env: &Env) -> Result<Vec<Field>, Bound> {
        let mut out = Vec::new();
        for w in self.brace_expand(w)? {
            let mut cur = Building::new();
            for p in &w.parts {
                if let Part::Lit { text, quoted } = p {
                    cur.push(text);
                    cur.keep |= *quoted;
                    continue;
                }
                let quoted = matches!(
                    p,
                    Part::Param { quoted: true, .. } | Part::Subst { quoted: true, .. }
                );
                // `"$@"`: one field per positional parameter, when they are known.
                if let (Part::Param { name, quoted: true }, Some(args)) = (p, &env.args)
                    && name == "@"
                {
                    for (k, a) in args.iter().enumerate() {
                        if k > 0 {
                            cur.keep = true;
                            cur.finish(&mut out);
                        }
                        self.spend(a.len())?;
                        cur.push(a);
                        cur.keep = true;
                    }
                    continue;
                }
                match self.part_value(p, env)? {
                    Ok(v) => self.push_value(&mut cur, &mut out, &v, quoted, env)?,
                    Err(display) => {
                        cur.unknown_part(p, &display);
                        if let Some(likely) = self.likely.take() {
                            cur.if_empty.push_str(&likely);
                        }
                    }
                }
            }
            cur.finish(&mut out);
        }
        Ok(out)
    }

    /// Appends an expansion's value; unquoted, it is split on `IFS`.
    fn push_value(
        &mut self,
        cur: &mut Building,
        out: &mut Vec<Field>,
        v: &str,
        quoted: bool,
        env: &Env,
    ) -> Result<(), Bound> {
        self.spend(v.len())?;
        if quoted {
            cur.push(v);
            cur.keep = true;
            return Ok(());
        }
        let Some(ifs) = env.ifs() else {
            // IFS is unknown, so are the words this value splits into.
            return Err(Bound::UnknownIfs {
                value: abbreviate(v, 80),
            });
        };
        let white = |c: char| ifs.contains(c) && DEFAULT_IFS.contains(c);
        let delimiter = |c: char| ifs.contains(c) && !DEFAULT_IFS.contains(c);
        // Whitespace seen since the last text: the field ends when more text follows.
        let mut gap = false;
        for c in v.chars() {
            if white(c) {
                gap |= cur.has_content();
            } else if delimiter(c) {
                cur.keep = true;
                cur.finish(out);
                gap = false;
            } else {
                if gap {
                    cur.finish(out);
                    gap = false;
                }
                cur.push(c.encode_utf8(&mut [0; 4]));
            }
        }
        if gap {
            cur.finish(out);
        }
        Ok(())
    }

    /// A word as one string, without splitting (assignment values, here-strings).
    pub(crate) fn expand_joined(&mut self, parts: &[Part], env: &Env) -> Result<Field, Bound> {
        let mut cur = Building::new();
        for p in parts {
            match self.part_value(p, env)? {
                Ok(v) => {
                    self.spend(v.len())?;
                    cur.push(&v);
                }
                Err(display) => {
                    cur.unknown_part(p, &display);
                    if let Some(likely) = self.likely.take() {
                        cur.if_empty.push_str(&likely);
                    }
                }
            }
        }
        let mut f = Field {
            value: cur.value,
            display: cur.display,
            if_empty: cur.if_empty,
        };
        if f.display.len() > MAX_VALUE {
            f = Field::unknown("${…}");
        }
        Ok(f)
    }

    /// Brace expansion (`/{etc,usr}` → `/etc /usr`) over the unquoted literal text of a
    /// word, wherever it stands (`''/{etc,usr}`, `$X{a,b}`). Finding a group is one pass
    /// over the word; each produced word is charged to the budget and at most
    /// [`MAX_BRACE`] are produced.
    fn brace_expand(&mut self, w: &Word) -> Result<Vec<Word>, Bound> {
        let has_brace = w.parts.iter().any(|p| {
            matches!(p, Part::Lit { text, quoted: false } if text.contains('{') && text.contains('}'))
        });
        if !has_brace {
            return Ok(vec![w.clone()]);
        }
        let mut atoms: Vec<Atom> = Vec::new();
        for p in &w.parts {
            match p {
                Part::Lit {
                    text,
                    quoted: false,
                } => atoms.extend(text.chars().map(Atom::Char)),
                other => atoms.push(Atom::Part(other)),
            }
        }
        let mut out = Vec::new();
        let mut pending = vec![atoms];
        while let Some(atoms) = pending.pop() {
            self.spend(atoms.len())?;
            match brace_group(&atoms) {
                Some((open, close, commas)) => {
                    let mut from = open + 1;
                    for end in commas.into_iter().chain([close]) {
                        let mut next = Vec::with_capacity(atoms.len());
                        next.extend_from_slice(&atoms[..open]);
                        next.extend_from_slice(&atoms[from..end]);
                        next.extend_from_slice(&atoms[close + 1..]);
                        pending.push(next);
                        from = end + 1;
                    }
                }
                None => out.push(to_word(&atoms)),
            }
            if out.len() + pending.len() > MAX_BRACE {
                return Err(Bound::Braces {
                    word: abbreviate(&super::parse::render_source(w), 80),
                });
            }
        }
        out.reverse();
        Ok(out)
    }
}

/// A piece of a word for brace expansion: an unquoted literal character (only these can
/// be braces and commas), or any other part, which is kept whole.
#[derive(Clone, Copy)]
enum Atom<'a> {
    Char(char),
    Part(&'a Part),
}

/// The first brace group to close that has a comma at its own level: the indexes of its
/// braces and commas. One pass with a stack, so a word of ten thousand `{` costs ten
/// thousand steps, not a hundred million.
fn brace_group(atoms: &[Atom]) -> Option<(usize, usize, Vec<usize>)> {
    let mut open: Vec<(usize, Vec<usize>)> = Vec::new();
    for (k, a) in atoms.iter().enumerate() {
        match a {
            Atom::Char('{') => open.push((k, Vec::new())),
            Atom::Char(',') => {
                if let Some((_, commas)) = open.last_mut() {
                    commas.push(k);
                }
            }
            Atom::Char('}') => {
                if let Some((start, commas)) = open.pop()
                    && !commas.is_empty()
                {
                    return Some((start, k, commas));
                }
            }
            _ => {}
        }
    }
    None
}

fn to_word(atoms: &[Atom]) -> Word {
    let mut w = Word::default();
    for a in atoms {
        match a {
            Atom::Char(c) => w.push(*c, false),
            Atom::Part(p) => w.parts.push((*p).clone()),
        }
    }
    w
}

/// Names of the parameters a word uses (not looking inside substitutions).
pub(crate) fn param_names(parts: &[Part], out: &mut Vec<String>) {
    for p in parts {
        match p {
            Part::Param { name, .. } => out.push(name.clone()),
            Part::Opaque {
                fallback: Some((name, _)),
                ..
            } => out.push(name.clone()),
            _ => {}
        }
    }
}

/// Names used as `${NAME:-default}` in a word.
pub(crate) fn fallback_names(parts: &[Part], out: &mut Vec<String>) {
    for p in parts {
        if let Part::Opaque {
            fallback: Some((name, _)),
            ..
        } = p
        {
            out.push(name.clone());
        }
    }
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bound::Text => f.write_str("it expands to more text than is examined"),
            Bound::Cpu(limit) => write!(
                f,
                "examining it took more than {} ms of CPU time",
                limit.as_millis()
            ),
            Bound::Braces { word } => write!(
                f,
                "brace expansion in `{word}` makes more than {MAX_BRACE} words"
            ),
            Bound::UnknownIfs { value } => write!(
                f,
                "IFS is known only when it runs, so how `{value}` splits is unknown"
            ),
        }
    }
}

/// Output of `echo`/`printf` when it is exactly their arguments: anything they would
/// interpret (a backslash, a `printf` conversion) makes it unknown.
pub fn echo_output(fields: &[Field]) -> Option<String> {
    let name = super::basename(fields.first()?.val()?);
    let mut args = &fields[1..];
    match name {
        "echo" => {
            while let Some(v) = args.first().and_then(Field::val) {
                if v.len() > 1 && v.starts_with('-') && v[1..].chars().all(|c| "neE".contains(c)) {
                    args = &args[1..];
                } else {
                    break;
                }
            }
            let values: Option<Vec<&str>> = args.iter().map(Field::val).collect();
            let values = values?;
            // `echo -e`, and `echo` in sh (dash), interpret escapes.
            if values.iter().any(|v| v.contains('\\')) {
                return None;
            }
            Some(values.join(" "))
        }
        "printf" => {
            if args.first().and_then(Field::val) == Some("--") {
                args = &args[1..];
            }
            let format = args.first()?.val()?;
            // `-v var` assigns instead of printing; `%` and `\` are interpreted.
            if format.starts_with('-') || format.contains(['%', '\\']) {
                return None;
            }
            Some(format.to_owned())
        }
        _ => None,
    }
}

/// Output of the programs that print the paths they are given, computed lexically, and
/// whether it is certain: `dirname`, `basename` and `ls -d` (certain), `readlink -f` and
/// `realpath` of an absolute path (as normalised: likely, the filesystem's links aside) and
/// `ls` of files (`ls /etc/sudoers` prints its operand; of a directory, its entries:
/// likely). A path the script linked is not followed here; the policies follow links where
/// the path is used.
pub fn path_output(fields: &[Field]) -> Option<(String, bool)> {
    let name = super::basename(fields.first()?.val()?);
    let args: Option<Vec<&str>> = fields[1..].iter().map(Field::val).collect();
    let args = args?;
    let (opts, operands): (Vec<&str>, Vec<&str>) = args
        .iter()
        .partition(|a| a.starts_with('-') && a.len() > 1 && **a != "--");
    let operands: Vec<&str> = operands.into_iter().filter(|a| *a != "--").collect();
    let only = |allowed: &[&str]| opts.iter().all(|o| allowed.contains(o));
    let certain = match name {
        "dirname" | "basename" => true,
        "ls" => opts.contains(&"-d"),
        _ => false,
    };
    let out: Vec<String> = match name {
        "readlink" | "realpath" if !operands.is_empty() => {
            let canonical = name == "realpath"
                || opts.iter().any(|o| {
                    o.len() > 1 && !o.starts_with("--") && o[1..].contains(['f', 'e', 'm'])
                });
            if !canonical
                || !only(&[
                    "-f", "-e", "-m", "-n", "-q", "-s", "-z", "-fn", "-nf", "-en", "-ne",
                ])
                || !operands.iter().all(|p| p.starts_with('/'))
            {
                return None;
            }
            operands
                .iter()
                .map(|p| super::effects::normalise("/", p))
                .collect()
        }
        "dirname" if !operands.is_empty() && opts.is_empty() => {
            operands.iter().map(|p| dirname(p)).collect()
        }
        "basename" if (1..=2).contains(&operands.len()) && opts.is_empty() => {
            let base = operands[0].trim_end_matches('/');
            let base = base.rsplit('/').next().unwrap_or(base);
            let base = match operands.get(1) {
                Some(suffix) if base != *suffix => base.strip_suffix(suffix).unwrap_or(base),
                _ => base,
            };
            vec![base.to_owned()]
        }
        "ls" if !operands.is_empty() && only(&["-d", "-1"]) => {
            operands.iter().map(|p| (*p).to_owned()).collect()
        }
        _ => return None,
    };
    Some((out.join("\n"), certain))
}

/// `dirname PATH`, lexically.
fn dirname(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return if path.is_empty() {
            ".".into()
        } else {
            "/".into()
        };
    }
    match trimmed.rfind('/') {
        None => ".".into(),
        Some(at) => {
            let parent = trimmed[..at].trim_end_matches('/');
            if parent.is_empty() {
                "/".into()
            } else {
                parent.to_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bash::parse::Lexer;

    fn fields(word: &str, env: &Env) -> Result<Vec<Field>, Bound> {
        let toks = Lexer::new(word, 0).lex().ok().unwrap();
        let Some(Tok::Word(w)) = toks.first() else {
            panic!("not a word: {word}");
        };
        Expander::new(MAX_TEXT, Duration::from_secs(60)).expand(w, env)
    }

    fn values(word: &str, env: &Env) -> Vec<Option<String>> {
        fields(word, env)
            .unwrap()
            .into_iter()
            .map(|f| f.value)
            .collect()
    }

    #[test]
    fn known_parts_expand_and_unknown_ones_may_be_empty() {
        let mut env = Env::default();
        env.set("D".into(), Some("/etc".into()));
        env.set("U".into(), None);
        assert_eq!(values("$D/x", &env), [Some("/etc/x".to_owned())]);
        assert_eq!(
            values("{a,b}$D", &env),
            [Some("a/etc".to_owned()), Some("b/etc".to_owned())]
        );
        assert_eq!(values("${N:-/tmp}", &env), [None]);
        let unknown = fields("\"$U\"/*", &env).unwrap();
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].value, None);
        assert_eq!(unknown[0].judged(), "/*");
        assert_eq!(unknown[0].display, "${U}/*");
        // A variable not set on the line may come from the environment.
        assert_eq!(values("$NOPE", &env), [None]);
        assert_eq!(values("$(echo rm)", &env), [Some("rm".to_owned())]);
        assert_eq!(values("$(printf '\\x72')", &env), [None]);
    }

    #[test]
    fn printed_paths_are_known_or_likely() {
        let env = Env::default();
        assert_eq!(
            values("$(dirname /etc/hosts)", &env),
            [Some("/etc".to_owned())]
        );
        assert_eq!(
            values("$(basename /a/b.txt .txt)", &env),
            [Some("b".to_owned())]
        );
        assert_eq!(values("$(ls -d /e*)", &env), [Some("/e*".to_owned())]);
        // What depends on the filesystem stays unknown, judged as its likely value.
        for (word, likely) in [
            ("\"$(readlink -f /etc/../etc/passwd)\"", "/etc/passwd"),
            ("\"$(realpath /boot/x)\"", "/boot/x"),
            ("`ls /etc/sudoers`", "/etc/sudoers"),
        ] {
            let f = fields(word, &env).unwrap();
            assert_eq!(
                (f[0].value.clone(), f[0].judged()),
                (None, likely),
                "{word}"
            );
        }
        assert_eq!(values("$(readlink x)", &env), [None]);
    }

    #[test]
    fn bounds_stop_expansion() {
        let mut env = Env::default();
        let braces = "{a,b}".repeat(11);
        assert!(matches!(fields(&braces, &env), Err(Bound::Braces { .. })));
        env.set("IFS".into(), None);
        env.set("X".into(), Some("a b".into()));
        assert!(matches!(fields("$X", &env), Err(Bound::UnknownIfs { .. })));
        let toks = Lexer::new("$X$X$X", 0).lex().ok().unwrap();
        let Some(Tok::Word(w)) = toks.first() else {
            panic!()
        };
        env.set("IFS".into(), Some(" ".into()));
        assert!(matches!(
            Expander::new(5, Duration::from_secs(60)).expand(w, &env),
            Err(Bound::Text)
        ));
        assert!(matches!(
            Expander::new(MAX_TEXT, Duration::ZERO).spend(1),
            Err(Bound::Cpu(_))
        ));
    }
}
