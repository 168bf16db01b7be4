//! An OpenSSH client configuration (`~/.ssh/config`), read the way `ssh` reads it, for
//! `sshmode target import`: [`load`] reads a file and its `Include`s into a tree, and
//! [`Config::resolve`] answers what `ssh -G <host>` would use for one host — the first value
//! obtained wins for each option (a later `Host *` only fills what is still unset), keywords
//! are case-insensitive, `key value`, `key=value` and quoted values, `Host` patterns with `*`,
//! `?` and `!negation`, an `Include` inside a `Host` block applying within it. `Match` blocks
//! are skipped (their options never apply) and said so in [`Config::notes`]. It also reads
//! `known_hosts` files ([`known_host_keys`]: plain, wildcard and hashed `|1|` entries,
//! `[host]:port`, `@revoked`).
//!
//! Never: connects anywhere, reads a key, or reads the environment; it reads only the files it
//! is pointed at, each bounded in size, the `Include` nesting bounded as OpenSSH bounds it.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How deep `Include` may nest (OpenSSH's `READCONF_MAX_DEPTH`).
pub const MAX_INCLUDE_DEPTH: usize = 16;
/// Largest configuration or `known_hosts` file read: far above any real one.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Most files one configuration may read through `Include` (globs included).
const MAX_FILES: usize = 1024;

/// Where a line is: its file and line number (from 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub file: Arc<Path>,
    pub line: usize,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// Why a configuration could not be read at all (as `ssh` would refuse it too).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is larger than 4 MiB: not an ssh configuration")]
    TooLarge(PathBuf),
    #[error("{0} is not text (UTF-8)")]
    NotText(PathBuf),
    #[error("{at}: Include nested more than {MAX_INCLUDE_DEPTH} deep (a file including itself?)")]
    TooDeep { at: At },
    #[error("{at}: Include reads more than {MAX_FILES} files")]
    TooManyFiles { at: At },
    #[error("{at}: {what}")]
    Bad { at: At, what: String },
}

/// One line of a configuration that matters to resolution.
#[derive(Debug, Clone)]
enum Item {
    /// `Host pattern…`: starts a block.
    Host { patterns: Vec<String>, at: At },
    /// `Match …`: starts a block that is skipped.
    Match,
    /// `Include`: the files it read, each with its items, in order.
    Include { files: Vec<Vec<Item>> },
    /// Any other keyword with its arguments.
    Opt {
        key: String,
        args: Vec<String>,
        at: At,
    },
}

/// A concrete `Host` name (no wildcard, no negation): what `target import` makes a target of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostName {
    /// As written on the `Host` line.
    pub name: String,
    /// Its first `Host` line.
    pub at: At,
    /// Later `Host` lines naming it again (their options only fill what the first left unset,
    /// as `ssh` applies them).
    pub again: Vec<At>,
}

/// A configuration read from a file and its `Include`s.
#[derive(Debug, Clone)]
pub struct Config {
    items: Vec<Item>,
    /// What was read but not used, for people: `Match` blocks, `Include`s that matched no
    /// file, `Host` patterns that are not concrete names.
    pub notes: Vec<String>,
    /// Every concrete `Host` name, in the order first seen.
    pub hosts: Vec<HostName>,
}

/// What a host name resolves to. Values are raw (no `~` or `%` expansion) except
/// [`Resolved::hostname`], whose `%h` and `%%` are expanded as `ssh` does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The name resolved (`%n`).
    pub name: String,
    /// `HostName` with `%h` and `%%` expanded; the name itself when unset.
    pub hostname: String,
    /// `User`, when set.
    pub user: Option<String>,
    /// `Port`, when set.
    pub port: Option<u16>,
    /// Every `IdentityFile`, in order (they accumulate, as in `ssh`).
    pub identity_files: Vec<(String, At)>,
    /// Every `CertificateFile`, in order.
    pub certificate_files: Vec<(String, At)>,
    /// `ProxyJump` or `ProxyCommand`, whichever came first; `none` resolves to `None`.
    pub proxy: Option<Proxy>,
    /// `StrictHostKeyChecking`, as written.
    pub strict_host_key_checking: Option<String>,
    /// `UserKnownHostsFile`: its files, raw.
    pub user_known_hosts_files: Option<Vec<String>>,
    /// `HostKeyAlias`: the name `known_hosts` is searched under.
    pub host_key_alias: Option<String>,
    /// Keywords set for this host that the service has no counterpart for, as first written,
    /// once each.
    pub unsupported: Vec<String>,
    /// Keywords set for this host that ask for what the service does anyway
    /// (`IdentitiesOnly`, `BatchMode`).
    pub honoured: Vec<String>,
    /// Tokens `HostName` uses that `ssh` does not expand there (`%p`…); the value is kept.
    pub hostname_tokens: Vec<char>,
}

/// How a host is reached when not directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proxy {
    /// `ProxyJump` hops, outermost first.
    Jump(String),
    /// `ProxyCommand`: not something the service can do.
    Command(String),
}

/// What a command line would set before any configuration: `ssh -l user -p port -J jump host`.
#[derive(Debug, Clone, Default)]
pub struct Given<'a> {
    pub user: Option<&'a str>,
    pub port: Option<u16>,
    /// `-J`: overrides the configuration's `ProxyJump` (`Some("none")` for none).
    pub jump: Option<&'a str>,
}

/// Keywords `target import` maps onto a target.
const SUPPORTED: &[&str] = &[
    "host",
    "match",
    "include",
    "hostname",
    "user",
    "port",
    "identityfile",
    "certificatefile",
    "proxyjump",
    "proxycommand",
    "stricthostkeychecking",
    "userknownhostsfile",
    "hostkeyalias",
];

/// Keywords that ask for what the service does anyway.
const HONOURED: &[&str] = &["identitiesonly", "batchmode"];

/// Reads the configuration at `path` and the files it includes. A relative `Include` is read
/// relative to `home/.ssh` (as `ssh` does for a user's configuration), `~` is `home`.
pub fn load(path: &Path, home: &Path) -> Result<Config, LoadError> {
    let mut notes = Vec::new();
    let mut files = 0usize;
    let items = load_file(path, home, 0, &mut notes, &mut files)?;
    let mut hosts: Vec<HostName> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    collect_hosts(&items, &mut hosts, &mut skipped);
    if !skipped.is_empty() {
        notes.push(format!(
            "Host patterns that are not one host are not imported (their options still apply to \
             the hosts they match): {}",
            skipped.join(", ")
        ));
    }
    Ok(Config {
        items,
        notes,
        hosts,
    })
}

/// Parses `text` as a configuration read from `origin` (a file that does not `Include`).
pub fn parse(text: &str, origin: &Path, home: &Path) -> Result<Config, LoadError> {
    let mut notes = Vec::new();
    let mut files = 0usize;
    let items = parse_text(text, origin, home, 0, &mut notes, &mut files)?;
    let mut hosts = Vec::new();
    let mut skipped = Vec::new();
    collect_hosts(&items, &mut hosts, &mut skipped);
    Ok(Config {
        items,
        notes,
        hosts,
    })
}

fn collect_hosts(items: &[Item], hosts: &mut Vec<HostName>, skipped: &mut Vec<String>) {
    for item in items {
        match item {
            Item::Host { patterns, at } => {
                for p in patterns {
                    if p.starts_with('!') || p.contains(['*', '?']) {
                        if !skipped.contains(p) {
                            skipped.push(p.clone());
                        }
                        continue;
                    }
                    match hosts.iter_mut().find(|h| h.name.eq_ignore_ascii_case(p)) {
                        Some(h) if h.at != *at => h.again.push(at.clone()),
                        Some(_) => {}
                        None => hosts.push(HostName {
                            name: p.clone(),
                            at: at.clone(),
                            again: Vec::new(),
                        }),
                    }
                }
            }
            Item::Include { files } => {
                for f in files {
                    collect_hosts(f, hosts, skipped);
                }
            }
            Item::Match | Item::Opt { .. } => {}
        }
    }
}

fn read_text(path: &Path) -> Result<String, LoadError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(LoadError::TooLarge(path.to_path_buf()));
    }
    String::from_utf8(bytes).map_err(|_| LoadError::NotText(path.to_path_buf()))
}

fn load_file(
    path: &Path,
    home: &Path,
    depth: usize,
    notes: &mut Vec<String>,
    files: &mut usize,
) -> Result<Vec<Item>, LoadError> {
    let text = read_text(path)?;
    parse_text(&text, path, home, depth, notes, files)
}

fn parse_text(
    text: &str,
    origin: &Path,
    home: &Path,
    depth: usize,
    notes: &mut Vec<String>,
    files: &mut usize,
) -> Result<Vec<Item>, LoadError> {
    let file: Arc<Path> = Arc::from(origin);
    let mut items = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = At {
            file: file.clone(),
            line: i + 1,
        };
        let Some((key, rest)) = split_keyword(line) else {
            continue;
        };
        let args = split_args(rest).map_err(|what| LoadError::Bad {
            at: at.clone(),
            what,
        })?;
        let lower = key.to_ascii_lowercase();
        let need_arg = |args: &[String]| {
            if args.is_empty() {
                Err(LoadError::Bad {
                    at: at.clone(),
                    what: format!("`{key}` needs a value"),
                })
            } else {
                Ok(())
            }
        };
        match lower.as_str() {
            "host" => {
                need_arg(&args)?;
                items.push(Item::Host { patterns: args, at });
            }
            "match" => {
                notes.push(format!(
                    "{at}: `Match {}` skipped: Match blocks are not imported, their options do \
                     not apply",
                    args.join(" ")
                ));
                items.push(Item::Match);
            }
            "include" => {
                need_arg(&args)?;
                if depth + 1 > MAX_INCLUDE_DEPTH {
                    return Err(LoadError::TooDeep { at });
                }
                let mut included = Vec::new();
                for arg in &args {
                    let pattern = include_path(arg, home);
                    let matched = glob(&pattern);
                    if matched.is_empty() {
                        notes.push(format!(
                            "{at}: Include {arg} matched no file ({})",
                            pattern.display()
                        ));
                    }
                    for path in matched {
                        *files += 1;
                        if *files > MAX_FILES {
                            return Err(LoadError::TooManyFiles { at });
                        }
                        included.push(load_file(&path, home, depth + 1, notes, files)?);
                    }
                }
                items.push(Item::Include { files: included });
            }
            _ => {
                if SUPPORTED.contains(&lower.as_str()) {
                    need_arg(&args)?;
                }
                if lower == "port" {
                    parse_port(&args[0]).map_err(|what| LoadError::Bad {
                        at: at.clone(),
                        what,
                    })?;
                }
                items.push(Item::Opt {
                    key: key.to_string(),
                    args,
                    at,
                });
            }
        }
    }
    Ok(items)
}

/// A port as `ssh` takes it: 1–65535.
pub fn parse_port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("`{s}` is not a port (1–65535)")),
    }
}

/// The keyword of a line and what follows it, or `None` for a blank or comment line:
/// `Key value`, `Key=value`, `Key = value`.
fn split_keyword(line: &str) -> Option<(&str, &str)> {
    let line = line.trim_matches([' ', '\t', '\r', '\n']);
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let end = line.find([' ', '\t', '=']).unwrap_or(line.len());
    let (key, mut rest) = line.split_at(end);
    rest = rest.trim_start_matches([' ', '\t']);
    if let Some(r) = rest.strip_prefix('=') {
        rest = r.trim_start_matches([' ', '\t']);
    }
    if key.is_empty() {
        return None;
    }
    Some((key, rest))
}

/// Splits arguments as `ssh` does (`argv_split`): on blanks, `"…"` and `'…'` quoting, a
/// backslash escaping a quote, a backslash or a blank, and an unquoted `#` starting a comment.
fn split_args(s: &str) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        match chars.peek() {
            None | Some('#') => break,
            _ => {}
        }
        let mut arg = String::new();
        let mut quote: Option<char> = None;
        while let Some(&c) = chars.peek() {
            match (c, quote) {
                ('\\', _) => {
                    chars.next();
                    match chars.peek() {
                        Some(&n) if matches!(n, '\'' | '"' | '\\' | ' ' | '\t') => {
                            arg.push(n);
                            chars.next();
                        }
                        _ => arg.push('\\'),
                    }
                }
                (' ' | '\t', None) => break,
                ('"' | '\'', None) => {
                    quote = Some(c);
                    chars.next();
                }
                (c, Some(q)) if c == q => {
                    quote = None;
                    chars.next();
                }
                _ => {
                    arg.push(c);
                    chars.next();
                }
            }
        }
        if quote.is_some() {
            return Err("unterminated quote".into());
        }
        args.push(arg);
    }
    Ok(args)
}

/// An `Include` argument as a path: `~` is `home`, a relative path is below `home/.ssh`.
fn include_path(arg: &str, home: &Path) -> PathBuf {
    if arg == "~" {
        return home.to_path_buf();
    }
    if let Some(rest) = arg.strip_prefix("~/") {
        return home.join(rest);
    }
    let p = Path::new(arg);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        home.join(".ssh").join(p)
    }
}

/// The files a path with `*` and `?` in its components names, sorted (as glob(3) sorts);
/// a component starting with `.` is matched only by a pattern starting with `.`. A path
/// without wildcards names itself when it exists.
fn glob(pattern: &Path) -> Vec<PathBuf> {
    let mut found = vec![PathBuf::new()];
    for comp in pattern.components() {
        let part = comp.as_os_str().to_string_lossy();
        if !part.contains(['*', '?']) {
            for f in &mut found {
                f.push(comp);
            }
            continue;
        }
        let mut next = Vec::new();
        for dir in &found {
            let Ok(entries) = std::fs::read_dir(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            }) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| (!n.starts_with('.') || part.starts_with('.')) && wildcard(&part, n))
                .collect();
            names.sort();
            next.extend(names.into_iter().map(|n| dir.join(n)));
        }
        found = next;
        if found.len() > MAX_FILES {
            found.truncate(MAX_FILES + 1);
        }
    }
    found.retain(|p| p.exists());
    found
}

/// `pattern` (with `*` and `?`) matches all of `s`, case-sensitively.
fn wildcard(pattern: &str, s: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = s.chars().collect();
    // Iterative matching with backtracking to the last `*`: linear in practice, never
    // exponential.
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Whether `name` matches a list of patterns as `ssh` matches a `Host` line or a
/// `known_hosts` entry: some pattern matches and no `!pattern` does (ASCII case-insensitive).
pub fn matches_list<'a>(name: &str, patterns: impl IntoIterator<Item = &'a str>) -> bool {
    let name = name.to_ascii_lowercase();
    let mut hit = false;
    for p in patterns {
        let (negated, p) = match p.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, p),
        };
        if wildcard(&p.to_ascii_lowercase(), &name) {
            if negated {
                return false;
            }
            hit = true;
        }
    }
    hit
}

impl Config {
    /// What `ssh -G name` would use, with what a command line gives first (`given`).
    pub fn resolve(&self, name: &str, given: &Given<'_>) -> Resolved {
        let mut st = State {
            name,
            first: BTreeMap::new(),
            r: Resolved {
                name: name.to_string(),
                ..Resolved::default()
            },
        };
        if let Some(u) = given.user {
            st.r.user = Some(u.to_string());
        }
        if let Some(p) = given.port {
            st.r.port = Some(p);
        }
        if let Some(j) = given.jump {
            st.first.insert("proxy".into(), ());
            st.r.proxy = (!j.eq_ignore_ascii_case("none")).then(|| Proxy::Jump(j.to_string()));
        }
        let mut active = true;
        st.walk(&self.items, &mut active);
        let raw = st.r.hostname.clone();
        let (hostname, tokens) = if raw.is_empty() {
            (name.to_string(), Vec::new())
        } else {
            expand_hostname(&raw, name)
        };
        st.r.hostname = hostname;
        st.r.hostname_tokens = tokens;
        st.r
    }
}

/// Resolution in progress.
struct State<'a> {
    name: &'a str,
    /// Single-valued options already obtained (lowercase keyword).
    first: BTreeMap<String, ()>,
    r: Resolved,
}

impl State<'_> {
    fn walk(&mut self, items: &[Item], active: &mut bool) {
        for item in items {
            match item {
                Item::Host { patterns, .. } => {
                    *active = matches_list(self.name, patterns.iter().map(String::as_str));
                }
                Item::Match => *active = false,
                Item::Include { files } => {
                    // An Include in a block that does not apply contributes nothing; after
                    // it, the enclosing block is in force again.
                    if *active {
                        let saved = *active;
                        for f in files {
                            self.walk(f, active);
                        }
                        *active = saved;
                    }
                }
                Item::Opt { key, args, at } if *active => self.apply(key, args, at),
                Item::Opt { .. } => {}
            }
        }
    }

    /// Takes an option's value unless one was obtained before (several for the keywords
    /// that accumulate).
    fn apply(&mut self, key: &str, args: &[String], at: &At) {
        let lower = key.to_ascii_lowercase();
        match lower.as_str() {
            "identityfile" => self.r.identity_files.push((args[0].clone(), at.clone())),
            "certificatefile" => self.r.certificate_files.push((args[0].clone(), at.clone())),
            // ProxyJump and ProxyCommand compete: whichever comes first wins.
            "proxyjump" | "proxycommand" => {
                if self.first.insert("proxy".into(), ()).is_none() {
                    let value = args.join(" ");
                    self.r.proxy = if value.eq_ignore_ascii_case("none") {
                        None
                    } else if lower == "proxyjump" {
                        Some(Proxy::Jump(value))
                    } else {
                        Some(Proxy::Command(value))
                    };
                }
            }
            _ => {
                let known = SUPPORTED.contains(&lower.as_str());
                if !known {
                    let list = if HONOURED.contains(&lower.as_str()) {
                        &mut self.r.honoured
                    } else {
                        &mut self.r.unsupported
                    };
                    if !list.iter().any(|k| k.eq_ignore_ascii_case(key)) {
                        list.push(key.to_string());
                    }
                    return;
                }
                if self.first.insert(lower.clone(), ()).is_some() {
                    return;
                }
                match lower.as_str() {
                    "hostname" => self.r.hostname = args[0].clone(),
                    "user" if self.r.user.is_none() => self.r.user = Some(args[0].clone()),
                    "port" if self.r.port.is_none() => self.r.port = parse_port(&args[0]).ok(),
                    "stricthostkeychecking" => {
                        self.r.strict_host_key_checking = Some(args[0].clone())
                    }
                    "userknownhostsfile" => self.r.user_known_hosts_files = Some(args.to_vec()),
                    "hostkeyalias" => self.r.host_key_alias = Some(args[0].clone()),
                    _ => {}
                }
            }
        }
    }
}

/// `HostName` with `%h` (the name) and `%%` expanded, as `ssh` does; other tokens are kept as
/// written and listed.
fn expand_hostname(raw: &str, name: &str) -> (String, Vec<char>) {
    let mut out = String::new();
    let mut odd = Vec::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(name),
            Some('%') => out.push('%'),
            Some(t) => {
                out.push('%');
                out.push(t);
                odd.push(t);
            }
            None => out.push('%'),
        }
    }
    (out, odd)
}

/// The values of the `%` tokens a path option may use.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// `%d`, and `~`: the local home directory.
    pub home: PathBuf,
    /// `%u`: the local user.
    pub local_user: String,
    /// `%i`: the local user id.
    pub uid: u32,
    /// `%l`: the local host name; `%L` is its first label.
    pub local_host: String,
    /// `%h`: the remote host name (after `HostName`).
    pub host: String,
    /// `%n`: the name as given.
    pub name: String,
    /// `%p`: the port.
    pub port: u16,
    /// `%r`: the remote user.
    pub user: String,
}

/// A path option (`IdentityFile`, `CertificateFile`, `UserKnownHostsFile`) with `~` and the
/// tokens `%%`, `%d`, `%h`, `%i`, `%l`, `%L`, `%n`, `%p`, `%r`, `%u` expanded. A token not
/// among them (`%C`, `%j`, `%k`, …), `~user/` or `${VAR}` is an error naming it.
pub fn expand_path(raw: &str, t: &Tokens) -> Result<PathBuf, String> {
    let mut s = raw.to_string();
    if s.contains("${") {
        return Err(format!(
            "`{raw}` uses an environment variable (${{…}}), which import does not expand"
        ));
    }
    if s == "~" {
        s = t.home.display().to_string();
    } else if let Some(rest) = s.strip_prefix("~/") {
        s = format!("{}/{rest}", t.home.display());
    } else if s.starts_with('~') {
        return Err(format!(
            "`{raw}`: `~user/` paths are not expanded by import"
        ));
    }
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let v = match chars.next() {
            Some('%') => "%".to_string(),
            Some('d') => t.home.display().to_string(),
            Some('h') => t.host.clone(),
            Some('i') => t.uid.to_string(),
            Some('l') => t.local_host.clone(),
            Some('L') => t.local_host.split('.').next().unwrap_or("").to_string(),
            Some('n') => t.name.clone(),
            Some('p') => t.port.to_string(),
            Some('r') => t.user.clone(),
            Some('u') => t.local_user.clone(),
            Some(other) => {
                return Err(format!(
                    "`{raw}` uses the token %{other}, which import does not expand (it expands \
                     %%, %d, %h, %i, %l, %L, %n, %p, %r, %u and ~)"
                ));
            }
            None => return Err(format!("`{raw}` ends with a lone %")),
        };
        out.push_str(&v);
    }
    Ok(PathBuf::from(out))
}

/// One hop of a `ProxyJump`: `[user@]host[:port]` or `ssh://[user@]host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            write!(f, "{}", self.host)?;
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// A `ProxyJump` value's hops, outermost first.
pub fn parse_jump(value: &str) -> Result<Vec<Hop>, String> {
    value
        .split(',')
        .map(|h| parse_hop(h.trim()).map_err(|e| format!("ProxyJump `{value}`: {e}")))
        .collect()
}

fn parse_hop(s: &str) -> Result<Hop, String> {
    let s = s.strip_prefix("ssh://").unwrap_or(s);
    if s.is_empty() {
        return Err("an empty hop".into());
    }
    let (user, hostport) = match s.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() => (Some(u.to_string()), h),
        Some(_) => return Err(format!("`{s}` has an empty user")),
        None => (None, s),
    };
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{s}`: unclosed ["))?;
        match after.strip_prefix(':') {
            Some(p) => (h.to_string(), Some(parse_port(p)?)),
            None if after.is_empty() => (h.to_string(), None),
            None => return Err(format!("`{s}` is not user@host:port")),
        }
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(parse_port(p)?)),
            None => (hostport.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("`{s}` has no host"));
    }
    Ok(Hop { user, host, port })
}

/// A host key listed for a host in a `known_hosts` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownKey {
    /// The key line's key: `type base64`.
    pub key: String,
    /// `ssh-ed25519`, `ecdsa-sha2-nistp256`, `ssh-rsa`, …
    pub algorithm: String,
    pub at: At,
}

/// What `known_hosts` files say of a host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownHosts {
    /// The keys listed for it, in file order (revoked ones left out).
    pub keys: Vec<KnownKey>,
    /// `@cert-authority` lines that match it (not imported).
    pub cert_authorities: usize,
    /// Files that could not be read (other than missing), with why.
    pub unreadable: Vec<String>,
}

/// The keys `files` list for `host` on `port` (as `ssh` looks it up: `host`, or `[host]:port`
/// when the port is not 22), plain, wildcard or hashed (`|1|salt|hmac`) entries; keys marked
/// `@revoked` are left out. A missing file is no entry.
pub fn known_host_keys(files: &[PathBuf], host: &str, port: u16) -> KnownHosts {
    let name = if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    };
    let mut found = KnownHosts::default();
    let mut revoked: Vec<String> = Vec::new();
    for path in files {
        let text = match read_text(path) {
            Ok(t) => t,
            Err(LoadError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                continue;
            }
            Err(e) => {
                found.unreadable.push(e.to_string());
                continue;
            }
        };
        let file: Arc<Path> = Arc::from(path.as_path());
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace();
            let mut first = fields.next().unwrap_or("");
            let marker = if first.starts_with('@') {
                let m = first;
                first = fields.next().unwrap_or("");
                Some(m)
            } else {
                None
            };
            let (Some(kind), Some(b64)) = (fields.next(), fields.next()) else {
                continue;
            };
            if !host_field_matches(first, &name) {
                continue;
            }
            let key = format!("{kind} {b64}");
            match marker {
                Some("@revoked") => revoked.push(key),
                Some("@cert-authority") => found.cert_authorities += 1,
                Some(_) => {}
                None => found.keys.push(KnownKey {
                    key,
                    algorithm: kind.to_string(),
                    at: At {
                        file: file.clone(),
                        line: i + 1,
                    },
                }),
            }
        }
    }
    found.keys.retain(|k| !revoked.contains(&k.key));
    found
}

/// Whether a `known_hosts` host field names `name`: a hashed `|1|salt|hash` entry, or a
/// comma-separated pattern list.
fn host_field_matches(field: &str, name: &str) -> bool {
    if let Some(rest) = field.strip_prefix("|1|") {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let Some((salt, hash)) = rest.split_once('|') else {
            return false;
        };
        let (Ok(salt), Ok(hash)) = (b64.decode(salt), b64.decode(hash)) else {
            return false;
        };
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &salt);
        return ring::hmac::verify(&key, name.as_bytes(), &hash).is_ok();
    }
    matches_list(name, field.split(','))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home() -> PathBuf {
        PathBuf::from("/home/me")
    }

    fn cfg(text: &str) -> Config {
        parse(text, Path::new("/cfg"), &home()).unwrap()
    }

    fn r(c: &Config, name: &str) -> Resolved {
        c.resolve(name, &Given::default())
    }

    #[test]
    fn lines_keywords_and_quoting() {
        assert_eq!(split_keyword("  # c"), None);
        assert_eq!(split_keyword(""), None);
        assert_eq!(split_keyword("Port=22"), Some(("Port", "22")));
        assert_eq!(split_keyword("Port = 22"), Some(("Port", "22")));
        assert_eq!(split_keyword("\tUser\tbob  "), Some(("User", "bob")));
        assert_eq!(
            split_args(r#""/a b/key" x # comment"#).unwrap(),
            vec!["/a b/key", "x"]
        );
        assert_eq!(split_args(r"a\ b 'c d'").unwrap(), vec!["a b", "c d"]);
        assert!(split_args("\"open").is_err());
    }

    #[test]
    fn first_obtained_value_wins_and_host_star_fills_the_rest() {
        let c = cfg("User global\n\
             Host web\n  HOSTNAME web.example.com\n  port=2222\n  IdentityFile ~/.ssh/a\n\
             Host web db\n  User second\n  Port 1\n  IdentityFile ~/.ssh/b\n\
             Host *\n  User star\n  Port 22\n  StrictHostKeyChecking yes\n");
        let w = r(&c, "web");
        assert_eq!(w.hostname, "web.example.com");
        assert_eq!(w.user.as_deref(), Some("global"));
        assert_eq!(w.port, Some(2222));
        let ids: Vec<&str> = w.identity_files.iter().map(|(v, _)| v.as_str()).collect();
        assert_eq!(ids, ["~/.ssh/a", "~/.ssh/b"]);
        assert_eq!(w.strict_host_key_checking.as_deref(), Some("yes"));
        let d = r(&c, "db");
        assert_eq!((d.hostname.as_str(), d.port), ("db", Some(1)));
        // Keywords are case-insensitive; so are host names.
        assert_eq!(r(&c, "WEB").port, Some(2222));
        let names: Vec<&str> = c.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["web", "db"]);
        assert_eq!(c.hosts[0].again.len(), 1, "web is named twice");
    }

    #[test]
    fn wildcards_and_negation() {
        let c =
            cfg("Host *.prod !db.prod\n  User ops\nHost db.prod\n  Port 5\nHost ?x\n  Port 7\n");
        assert_eq!(r(&c, "web.prod").user.as_deref(), Some("ops"));
        assert_eq!(r(&c, "db.prod").user, None);
        assert_eq!(r(&c, "ax").port, Some(7));
        assert_eq!(r(&c, "abx").port, None);
        let names: Vec<&str> = c.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["db.prod"]);
        assert!(wildcard("a*b*c", "aXXbYYc") && !wildcard("a*b", "ab_"));
    }

    #[test]
    fn match_blocks_are_skipped_until_the_next_host() {
        let c = cfg("Host a\n  Port 1\nMatch all\n  User m\nHost a\n  User u\n");
        let a = r(&c, "a");
        assert_eq!((a.user.as_deref(), a.port), (Some("u"), Some(1)));
        assert!(
            c.notes.iter().any(|n| n.contains("Match all")),
            "{:?}",
            c.notes
        );
    }

    #[test]
    fn hostname_tokens_proxy_and_unsupported_options() {
        let c = cfg(
            "Host h1\n  HostName %h.lan%%\n  ProxyCommand nc %h %p\n  ProxyJump j\n  \
             ForwardAgent yes\n  forwardagent no\n  IdentitiesOnly yes\n  LocalForward 1 x:2\n\
             Host h2\n  ProxyJump none\n  ProxyCommand nc\nHost h3\n  HostName %p.x\n",
        );
        let h1 = r(&c, "h1");
        assert_eq!(h1.hostname, "h1.lan%");
        assert_eq!(h1.proxy, Some(Proxy::Command("nc %h %p".into())));
        assert_eq!(h1.unsupported, ["ForwardAgent", "LocalForward"]);
        assert_eq!(h1.honoured, ["IdentitiesOnly"]);
        assert_eq!(r(&c, "h2").proxy, None);
        assert_eq!(r(&c, "h3").hostname_tokens, ['p']);
        // A command line's -J comes first.
        let given = Given {
            jump: Some("x"),
            ..Given::default()
        };
        assert_eq!(c.resolve("h1", &given).proxy, Some(Proxy::Jump("x".into())));
    }

    #[test]
    fn path_tokens() {
        let t = Tokens {
            home: home(),
            local_user: "me".into(),
            uid: 1000,
            local_host: "box.lan".into(),
            host: "10.0.0.5".into(),
            name: "web".into(),
            port: 2222,
            user: "deploy".into(),
        };
        assert_eq!(
            expand_path("~/.ssh/%r@%h:%p-%n-%u-%i-%L-%l-%%", &t).unwrap(),
            PathBuf::from("/home/me/.ssh/deploy@10.0.0.5:2222-web-me-1000-box-box.lan-%")
        );
        assert_eq!(
            expand_path("%d/k", &t).unwrap(),
            PathBuf::from("/home/me/k")
        );
        for bad in ["~/.ssh/%C", "${HOME}/k", "~bob/k", "k%"] {
            assert!(expand_path(bad, &t).is_err(), "{bad}");
        }
        assert!(expand_path("~/%C", &t).unwrap_err().contains("%C"));
    }

    #[test]
    fn jump_specs() {
        assert_eq!(
            parse_jump("ops@bastion:2200, edge ,ssh://u@[fe80::1]:23").unwrap(),
            vec![
                Hop {
                    user: Some("ops".into()),
                    host: "bastion".into(),
                    port: Some(2200)
                },
                Hop {
                    user: None,
                    host: "edge".into(),
                    port: None
                },
                Hop {
                    user: Some("u".into()),
                    host: "fe80::1".into(),
                    port: Some(23)
                },
            ]
        );
        assert!(parse_jump("a:99999").is_err());
        assert!(parse_jump("a,,b").is_err());
    }

    #[test]
    fn includes_are_followed_relative_to_dot_ssh_with_globs_within_their_block() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let ssh = home.join(".ssh");
        std::fs::create_dir_all(ssh.join("conf.d")).unwrap();
        std::fs::write(ssh.join("conf.d/b.conf"), "Host b\n  Port 2\n").unwrap();
        std::fs::write(ssh.join("conf.d/a.conf"), "Host a\n  Port 1\n").unwrap();
        std::fs::write(ssh.join("conf.d/.hidden.conf"), "Host h\n").unwrap();
        std::fs::write(ssh.join("inner"), "User from-include\n").unwrap();
        std::fs::write(
            ssh.join("config"),
            "Include conf.d/*.conf missing/*.conf\n\
             Host web\n  Include inner\n  Port 9\n\
             Host other\n  Include ~/.ssh/inner\n",
        )
        .unwrap();
        let c = load(&ssh.join("config"), home).unwrap();
        let names: Vec<&str> = c.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "web", "other"]);
        let web = r(&c, "web");
        assert_eq!(web.user.as_deref(), Some("from-include"));
        assert_eq!(web.port, Some(9), "the block goes on after its Include");
        assert_eq!(
            r(&c, "a").user,
            None,
            "an Include in web's block is web's only"
        );
        assert!(c.notes.iter().any(|n| n.contains("matched no file")));
    }

    #[test]
    fn include_depth_and_bad_lines_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let me = dir.path().join("loop");
        std::fs::write(&me, format!("Include {}\n", me.display())).unwrap();
        let e = load(&me, dir.path()).unwrap_err();
        assert!(matches!(e, LoadError::TooDeep { .. }), "{e}");
        assert!(e.to_string().contains("16"), "{e}");
        let e = parse("Host x\n  Port eighty\n", Path::new("/c"), &home()).unwrap_err();
        assert_eq!(e.to_string(), "/c:2: `eighty` is not a port (1–65535)");
        assert!(load(&dir.path().join("none"), dir.path()).is_err());
    }

    #[test]
    fn known_hosts_plain_ported_wildcard_hashed_and_revoked() {
        use base64::Engine;
        let dir = tempfile::tempdir().unwrap();
        let kh = dir.path().join("known_hosts");
        let salt = b"0123456789abcdefghij";
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, salt);
        let tag = ring::hmac::sign(&key, b"[hashed.example]:2222");
        let b64 = base64::engine::general_purpose::STANDARD;
        std::fs::write(
            &kh,
            format!(
                "web,10.0.0.5 ssh-ed25519 AAAA1\n\
                 [web]:2222 ssh-ed25519 AAAA2\n\
                 *.lan,!bad.lan ssh-rsa AAAA3\n\
                 |1|{}|{} ssh-ed25519 AAAA4\n\
                 @revoked web ssh-rsa AAAA5\nweb ssh-rsa AAAA5\n\
                 @cert-authority *.lan ssh-ed25519 AAAA6\n",
                b64.encode(salt),
                b64.encode(tag.as_ref())
            ),
        )
        .unwrap();
        let files = [kh, dir.path().join("missing")];
        let keys = |h: &str, p: u16| -> Vec<String> {
            known_host_keys(&files, h, p)
                .keys
                .into_iter()
                .map(|k| k.key)
                .collect()
        };
        assert_eq!(keys("web", 22), ["ssh-ed25519 AAAA1"]);
        assert_eq!(keys("web", 2222), ["ssh-ed25519 AAAA2"]);
        assert_eq!(keys("a.lan", 22), ["ssh-rsa AAAA3"]);
        assert!(keys("bad.lan", 22).is_empty());
        assert_eq!(keys("hashed.example", 2222), ["ssh-ed25519 AAAA4"]);
        assert!(keys("hashed.example", 22).is_empty());
        assert_eq!(known_host_keys(&files, "x.lan", 22).cert_authorities, 1);
    }
}
