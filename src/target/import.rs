//! `sshmode target import [PATH] [--apply]`: the hosts an OpenSSH client config describes
//! ([`super::ssh_config`]) as targets. Each concrete `Host` becomes a target with its
//! `HostName`, `User`, `Port`, first existing `IdentityFile` (read into the vault),
//! `CertificateFile` (or the key's `-cert.pub`, as `ssh` loads it), `ProxyJump` (each hop a
//! target of its own, reached as `--jump`) and `StrictHostKeyChecking`; a key `known_hosts`
//! lists for it is pinned. What the service has no counterpart for is listed per host.
//!
//! Without `--apply` nothing changes: the plan is printed. With it each target is added
//! **pending approval** through [`super::add`] (audited as `target.add`), jump hosts before
//! the targets behind them. An alias that already exists is a conflict, never overwritten.
//! Never: connects to a host (a key not in `known_hosts` is left to the first connection),
//! approves, or prints a secret.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use russh::keys::{HashAlg, PublicKey};
use serde::Serialize;
use sqlx::PgPool;
use zeroize::Zeroizing;

use super::cli::{
    ImportArgs, decode_key, key_secrets, open_vault, read_cert, read_secret_line, read_small_file,
    user_error,
};
use super::ssh_config::{self, Config, Given, Hop, Proxy, Resolved, Tokens};
use super::{HostKey, HostKeyPolicy, MAX_HOPS, NewSecrets, NewTarget, TargetError};
use crate::config::Config as ServiceConfig;

/// The identity files `ssh` tries when a host sets none, in its order.
const DEFAULT_IDENTITIES: &[&str] = &[
    "~/.ssh/id_rsa",
    "~/.ssh/id_ecdsa",
    "~/.ssh/id_ecdsa_sk",
    "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk",
    "~/.ssh/id_xmss",
    "~/.ssh/id_dsa",
];

/// Host key algorithms in the order the service's SSH client asks for them (russh's default
/// preference): of several keys `known_hosts` lists, the first here is the one pinned.
const HOST_KEY_PREFERENCE: &[&str] = &[
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
];

/// The account running the import: what `~`, `%d`, `%u`, `%i`, `%l` and a missing `User`
/// mean, as `ssh` takes them (from the password database, not the environment).
#[derive(Debug, Clone)]
pub struct Local {
    pub user: String,
    pub uid: u32,
    pub home: PathBuf,
    pub hostname: String,
}

impl Local {
    /// This process's account.
    pub fn current() -> anyhow::Result<Local> {
        // SAFETY: getuid cannot fail; getpwuid_r writes only into the buffers given, and the
        // strings it points at live in `buf`, copied before `buf` is dropped.
        let uid = unsafe { libc::getuid() };
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; 16384];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        let rc =
            unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
        if rc != 0 || found.is_null() || pwd.pw_name.is_null() || pwd.pw_dir.is_null() {
            anyhow::bail!("the account of uid {uid} is not in the password database: no ~/.ssh");
        }
        // SAFETY: non-null, NUL-terminated strings inside `buf`.
        let (user, home) = unsafe {
            (
                std::ffi::CStr::from_ptr(pwd.pw_name)
                    .to_string_lossy()
                    .into_owned(),
                std::ffi::CStr::from_ptr(pwd.pw_dir)
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        let mut name = [0u8; 256];
        // SAFETY: gethostname writes at most `name.len()` bytes into `name`.
        let hostname = if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
            let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
            String::from_utf8_lossy(&name[..end]).into_owned()
        } else {
            String::new()
        };
        Ok(Local {
            user,
            uid,
            home: PathBuf::from(home),
            hostname,
        })
    }
}

/// What becomes of one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Would be added (dry run).
    Add,
    /// Added, pending approval.
    Added,
    /// The alias exists already: left as it is.
    Conflict,
    /// Not imported; the notes say why.
    Skip,
}

impl Action {
    fn as_str(self, applied: bool) -> &'static str {
        match (self, applied) {
            (Action::Add, _) => "add",
            (Action::Added, _) => "added (pending)",
            (Action::Conflict, _) => "conflict",
            (Action::Skip, false) => "skip",
            (Action::Skip, true) => "skipped",
        }
    }
}

/// A host key from `known_hosts`, to pin.
#[derive(Debug, Clone, Serialize)]
pub struct KnownHostKey {
    /// `SHA256:…`
    pub fingerprint: String,
    pub algorithm: String,
    /// `file:line` of its `known_hosts` entry.
    pub from: String,
}

/// One target of the plan.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub alias: String,
    /// Where it comes from: `Host web (…/config:3)` or `ProxyJump hop ops@edge:2200 of web`.
    pub source: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    /// The private key file read into the vault (its path is not kept by the service).
    pub key: Option<PathBuf>,
    /// The certificate file imported with it.
    pub cert: Option<PathBuf>,
    /// Whether the key has a passphrase.
    pub encrypted: bool,
    /// The target it is reached through.
    pub jump: Option<String>,
    pub host_key_policy: HostKeyPolicy,
    /// The key pinned from `known_hosts`, if any.
    pub host_key: Option<KnownHostKey>,
    pub action: Action,
    /// Why it is skipped, what was defaulted or left out, in a few words each.
    pub notes: Vec<String>,
    /// Options set for the host that the service has no counterpart for.
    pub unsupported: Vec<String>,
    /// The plan entry of its jump host.
    #[serde(skip)]
    jump_entry: Option<usize>,
    /// A conflict with a registered target of the same address (and jump host): the targets
    /// behind it may jump through it.
    #[serde(skip)]
    registered_alike: bool,
}

impl Entry {
    fn skip(&mut self, why: impl Into<String>) {
        self.action = Action::Skip;
        self.notes.push(why.into());
    }
}

/// The plan for a configuration: targets in the order they can be added (each jump host
/// before the targets behind it), and notes on the configuration as a whole.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub config: PathBuf,
    pub applied: bool,
    pub targets: Vec<Entry>,
    pub notes: Vec<String>,
}

/// `sshmode target import`: reads the configuration, prints the plan, and with `--apply`
/// adds what it can.
pub async fn run(
    args: ImportArgs,
    config: &ServiceConfig,
    db: &PgPool,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    if args.passphrase_stdin && !args.apply {
        anyhow::bail!(
            "--passphrase-stdin goes with --apply (a dry run reads no passphrase and imports nothing)"
        );
    }
    let local = Local::current()?;
    let path = args
        .path
        .clone()
        .unwrap_or_else(|| local.home.join(".ssh").join("config"));
    let ssh = ssh_config::load(&path, &local.home).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut plan = plan(&ssh, &path, &local, args.passphrase_stdin);
    conflicts(&mut plan, db).await.map_err(user_error)?;
    if args.apply {
        apply(&mut plan, config, db, input).await?;
    }
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &plan)?;
        writeln!(out)?;
    } else {
        print(&plan, out)?;
    }
    Ok(0)
}

/// What the configuration at `path` would add, before the database is asked.
pub fn plan(ssh: &Config, path: &Path, local: &Local, passphrases: bool) -> Plan {
    let mut p = Planner {
        ssh,
        local,
        passphrases,
        targets: Vec::new(),
        hosts: HashMap::new(),
        derived: HashMap::new(),
        stack: Vec::new(),
    };
    for h in &ssh.hosts {
        match p.host(&h.name) {
            Ok(i) => {
                let e = &mut p.targets[i];
                for again in &h.again {
                    e.notes.push(format!(
                        "Host `{}` is defined again at {again}: there, only options not set \
                         before apply (as ssh does)",
                        h.name
                    ));
                }
            }
            // Not from the top (nothing is being resolved there), but never lost silently.
            Err(why) => {
                let mut e = p.blank(&h.name, format!("Host {} ({})", h.name, h.at));
                e.skip(why);
                p.targets.push(e);
            }
        }
    }
    Plan {
        config: path.to_path_buf(),
        applied: false,
        targets: p.targets,
        notes: ssh.notes.clone(),
    }
}

/// A jump hop as given: host (lowercase), user, port, and the hops before it.
type HopKey = (String, Option<String>, Option<u16>, Option<String>);

struct Planner<'a> {
    ssh: &'a Config,
    local: &'a Local,
    passphrases: bool,
    targets: Vec<Entry>,
    /// Concrete `Host` names (lowercase) already planned.
    hosts: HashMap<String, usize>,
    /// Jump hops that are not `Host` names, by what they resolve to.
    derived: HashMap<HopKey, usize>,
    /// Names being resolved, outermost first: a `ProxyJump` loop shows as a repeat.
    stack: Vec<String>,
}

impl Planner<'_> {
    fn blank(&self, alias: &str, source: String) -> Entry {
        Entry {
            alias: alias.to_string(),
            source,
            host: String::new(),
            port: 22,
            user: String::new(),
            key: None,
            cert: None,
            encrypted: false,
            jump: None,
            host_key_policy: HostKeyPolicy::Tofu,
            host_key: None,
            action: Action::Add,
            notes: Vec::new(),
            unsupported: Vec::new(),
            jump_entry: None,
            registered_alike: false,
        }
    }

    /// The entry of the concrete `Host` name `name`.
    fn host(&mut self, name: &str) -> Result<usize, String> {
        if let Some(i) = self.hosts.get(&name.to_ascii_lowercase()) {
            return Ok(*i);
        }
        let h = self
            .ssh
            .hosts
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .expect("a concrete Host name");
        let source = format!("Host {} ({})", h.name, h.at);
        let i = self.build(&h.name.clone(), &h.name.clone(), &Given::default(), source)?;
        self.hosts.insert(name.to_ascii_lowercase(), i);
        Ok(i)
    }

    /// The entry of a `ProxyJump` hop, reached through `prefix` (the hops before it, or its
    /// own configuration's when it is the first).
    fn hop(&mut self, hop: &Hop, prefix: Option<String>, of: &str) -> Result<usize, String> {
        let given = Given {
            user: hop.user.as_deref(),
            port: hop.port,
            jump: prefix.as_deref(),
        };
        // A hop naming a `Host` it does not change is that host's target.
        if let Some(h) = self
            .ssh
            .hosts
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(&hop.host))
        {
            let plain = self.ssh.resolve(&h.name, &Given::default());
            if self.ssh.resolve(&h.name, &given) == plain {
                return self.host(&h.name.clone());
            }
        }
        let key = (
            hop.host.to_ascii_lowercase(),
            hop.user.clone(),
            hop.port,
            prefix.clone(),
        );
        if let Some(i) = self.derived.get(&key) {
            return Ok(*i);
        }
        let alias = self.derived_alias(hop);
        let source = format!("ProxyJump hop {hop} of {of}");
        let i = self.build(&alias, &hop.host, &given, source)?;
        self.targets[i].notes.push(format!(
            "a jump host that is no Host of the config: named `{alias}` after it"
        ));
        self.derived.insert(key, i);
        Ok(i)
    }

    /// A free alias for a hop: its host name with what an alias may not hold replaced by
    /// `-`, its port when not 22, and `-2`, `-3`… if taken.
    fn derived_alias(&self, hop: &Hop) -> String {
        let mut base: String = hop
            .host
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        base = base
            .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string();
        if let Some(p) = hop.port.filter(|p| *p != 22) {
            base = format!("{base}-{p}");
        }
        if !super::valid_alias(&base) {
            base = format!("jump-{base}");
        }
        base.truncate(60);
        let taken = |a: &str| {
            self.targets.iter().any(|e| e.alias.eq_ignore_ascii_case(a))
                || self
                    .ssh
                    .hosts
                    .iter()
                    .any(|h| h.name.eq_ignore_ascii_case(a))
        };
        if !taken(&base) {
            return base;
        }
        (2..)
            .map(|n| format!("{base}-{n}"))
            .find(|a| !taken(a))
            .expect("a free suffix")
    }

    /// Plans the target `alias` for `name` resolved with `given`: its jump hosts first.
    fn build(
        &mut self,
        alias: &str,
        name: &str,
        given: &Given<'_>,
        source: String,
    ) -> Result<usize, String> {
        let lower = name.to_ascii_lowercase();
        if self.stack.contains(&lower) {
            let mut ring = self.stack.clone();
            ring.push(lower);
            return Err(format!("ProxyJump loop: {}", ring.join(" → ")));
        }
        if self.stack.len() > MAX_HOPS {
            return Err(format!(
                "reached through more than {MAX_HOPS} jump hosts (the service's limit)"
            ));
        }
        let r = self.ssh.resolve(name, given);
        let mut e = self.blank(alias, source);
        e.unsupported = r.unsupported.clone();
        e.host = r.hostname.clone();
        e.port = r.port.unwrap_or(22);
        e.user = match &r.user {
            Some(u) => u.clone(),
            None => {
                e.notes.push(format!(
                    "User not set: `{}`, the local user, as ssh uses",
                    self.local.user
                ));
                self.local.user.clone()
            }
        };
        if !r.hostname_tokens.is_empty() {
            let t: Vec<String> = r.hostname_tokens.iter().map(|c| format!("%{c}")).collect();
            e.skip(format!(
                "HostName uses {}, which ssh does not expand there",
                t.join(", ")
            ));
        }
        for h in &r.honoured {
            e.notes.push(match h.to_ascii_lowercase().as_str() {
                "identitiesonly" => {
                    "IdentitiesOnly: the service offers only the imported key anyway".to_string()
                }
                _ => format!("{h}: the service never prompts anyway"),
            });
        }

        // The jump host, planned before this one.
        self.stack.push(name.to_ascii_lowercase());
        let jump = match &r.proxy {
            None => Ok(None),
            Some(Proxy::Command(c)) => Err(format!(
                "ProxyCommand `{c}` is not supported (only ProxyJump): not imported"
            )),
            Some(Proxy::Jump(v)) => match ssh_config::parse_jump(v) {
                Err(why) => Err(why),
                Ok(hops) => {
                    let (last, before) = hops.split_last().expect("at least one hop");
                    let prefix = (!before.is_empty()).then(|| {
                        before
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    });
                    self.hop(last, prefix, alias).map(Some)
                }
            },
        };
        self.stack.pop();
        match jump {
            Ok(None) => {}
            Ok(Some(j)) => {
                e.jump = Some(self.targets[j].alias.clone());
                e.jump_entry = Some(j);
                if self.targets[j].action == Action::Skip {
                    e.skip(format!(
                        "its jump host `{}` is not imported",
                        self.targets[j].alias
                    ));
                }
            }
            Err(why) => e.skip(why),
        }

        let tokens = Tokens {
            home: self.local.home.clone(),
            local_user: self.local.user.clone(),
            uid: self.local.uid,
            local_host: self.local.hostname.clone(),
            host: e.host.clone(),
            name: name.to_string(),
            port: e.port,
            user: e.user.clone(),
        };
        self.key(&mut e, &r, &tokens);
        self.host_key(&mut e, &r, &tokens);
        // The one validation `target add` applies.
        let probe = NewTarget {
            alias: e.alias.clone(),
            host: e.host.clone(),
            port: e.port,
            user: e.user.clone(),
            description: None,
            secrets: NewSecrets::Agent,
            host_key_policy: e.host_key_policy,
            host_key: None,
            approve: false,
            jump: e.jump.clone(),
        };
        if let Err(why) = super::validate(&probe) {
            e.skip(why.to_string());
        }
        self.targets.push(e);
        Ok(self.targets.len() - 1)
    }

    /// The first `IdentityFile` that exists (ssh's defaults when none is set), read to see it
    /// is a key the service can use; its certificate.
    fn key(&self, e: &mut Entry, r: &Resolved, tokens: &Tokens) {
        let set = !r.identity_files.is_empty();
        let candidates: Vec<String> = if set {
            let mut c: Vec<String> = Vec::new();
            for (v, _) in &r.identity_files {
                if !c.contains(v) {
                    c.push(v.clone());
                }
            }
            c
        } else {
            DEFAULT_IDENTITIES.iter().map(|s| s.to_string()).collect()
        };
        let mut chosen: Option<PathBuf> = None;
        let mut missing = Vec::new();
        let mut others = Vec::new();
        for raw in &candidates {
            let path = match ssh_config::expand_path(raw, tokens) {
                Ok(p) => p,
                Err(why) => {
                    e.notes.push(format!("IdentityFile {why}"));
                    continue;
                }
            };
            if chosen.is_some() {
                if set {
                    others.push(path.display().to_string());
                }
            } else if path.is_file() {
                chosen = Some(path);
            } else if set {
                missing.push(path.display().to_string());
            }
        }
        let Some(path) = chosen else {
            if set {
                e.skip(format!(
                    "no key: IdentityFile {} not found",
                    missing.join(", ")
                ));
            } else {
                e.skip(
                    "no key: no IdentityFile, and none of ssh's default keys (~/.ssh/id_*) \
                     exists; add it by hand with --agent or --password-stdin",
                );
            }
            return;
        };
        if !missing.is_empty() {
            e.notes
                .push(format!("IdentityFile {} not found", missing.join(", ")));
        }
        if !set {
            e.notes.push(format!(
                "IdentityFile not set: {}, the first of ssh's default keys that exists",
                path.display()
            ));
        }
        if !others.is_empty() {
            e.notes.push(format!(
                "IdentityFile {} not imported: a target keeps one key",
                others.join(", ")
            ));
        }
        let public = match read_small_file(&path, "key file") {
            Err(why) => {
                e.skip(format!("{why:#}"));
                return;
            }
            Ok(text) => match russh::keys::decode_secret_key(&text, None) {
                Ok(k) => Some(k.public_key().clone()),
                Err(russh::keys::Error::KeyIsEncrypted) => {
                    e.encrypted = true;
                    if !self.passphrases {
                        e.skip(format!(
                            "the key {} is encrypted: run with --apply --passphrase-stdin to \
                             type its passphrase",
                            path.display()
                        ));
                    } else {
                        e.notes.push(format!(
                            "the key {} is encrypted: its passphrase is read from standard input",
                            path.display()
                        ));
                    }
                    // Its public half, in the clear in an OpenSSH key, for the certificate.
                    russh::keys::PrivateKey::from_openssh(text.as_bytes())
                        .ok()
                        .map(|k| k.public_key().clone())
                }
                Err(_) => {
                    e.skip(format!(
                        "the key {} is not an ed25519, ecdsa or rsa private key the service can read",
                        path.display()
                    ));
                    return;
                }
            },
        };
        e.key = Some(path.clone());
        // CertificateFile, or the key's `-cert.pub` that ssh loads beside it.
        let certs: Vec<PathBuf> = if r.certificate_files.is_empty() {
            let beside = PathBuf::from(format!("{}-cert.pub", path.display()));
            if beside.is_file() {
                vec![beside]
            } else {
                Vec::new()
            }
        } else {
            r.certificate_files
                .iter()
                .filter_map(|(raw, _)| match ssh_config::expand_path(raw, tokens) {
                    Ok(p) => Some(p),
                    Err(why) => {
                        e.notes.push(format!("CertificateFile {why}"));
                        None
                    }
                })
                .collect()
        };
        for cpath in certs {
            if !cpath.is_file() {
                e.notes.push(format!(
                    "CertificateFile {} not found: imported without it",
                    cpath.display()
                ));
                continue;
            }
            let fits = read_small_file(&cpath, "certificate")
                .ok()
                .and_then(|t| russh::keys::Certificate::from_openssh(t.trim()).ok())
                .is_some_and(|c| {
                    public
                        .as_ref()
                        .is_some_and(|p| c.public_key() == p.key_data())
                });
            if fits {
                e.cert = Some(cpath);
                break;
            }
            e.notes.push(format!(
                "the certificate {} is not an OpenSSH certificate of this key: imported without it",
                cpath.display()
            ));
        }
    }

    /// The host-key policy (`StrictHostKeyChecking`) and the key `known_hosts` lists.
    fn host_key(&self, e: &mut Entry, r: &Resolved, tokens: &Tokens) {
        match r
            .strict_host_key_checking
            .as_deref()
            .map(str::to_ascii_lowercase)
        {
            Some(v) if v == "yes" || v == "true" => e.host_key_policy = HostKeyPolicy::Strict,
            Some(v) if v == "no" || v == "off" || v == "false" => e.notes.push(format!(
                "StrictHostKeyChecking {v}: the service still records the first key and refuses \
                 a changed one (tofu)"
            )),
            _ => {}
        }
        let raw: Vec<String> = r
            .user_known_hosts_files
            .clone()
            .unwrap_or_else(|| vec!["~/.ssh/known_hosts".into(), "~/.ssh/known_hosts2".into()]);
        let mut files = Vec::new();
        for f in raw.iter().filter(|f| !f.eq_ignore_ascii_case("none")) {
            match ssh_config::expand_path(f, tokens) {
                Ok(p) => files.push(p),
                Err(why) => e.notes.push(format!("UserKnownHostsFile {why}")),
            }
        }
        let lookup = r.host_key_alias.clone().unwrap_or_else(|| e.host.clone());
        let known = ssh_config::known_host_keys(&files, &lookup, e.port);
        e.notes.extend(
            known
                .unreadable
                .iter()
                .map(|why| format!("known_hosts: {why}")),
        );
        if known.cert_authorities > 0 {
            e.notes.push(
                "known_hosts trusts a @cert-authority for this host: host certificates are not \
                 supported, not imported"
                    .into(),
            );
        }
        let mut keys: Vec<(usize, KnownHostKey)> = known
            .keys
            .iter()
            .filter_map(|k| {
                let rank = HOST_KEY_PREFERENCE.iter().position(|a| *a == k.algorithm)?;
                let key = PublicKey::from_openssh(&k.key).ok()?;
                Some((
                    rank,
                    KnownHostKey {
                        fingerprint: key.fingerprint(HashAlg::Sha256).to_string(),
                        algorithm: k.algorithm.clone(),
                        from: k.at.to_string(),
                    },
                ))
            })
            .collect();
        keys.sort_by_key(|(rank, _)| *rank);
        match keys.first() {
            Some((_, k)) => {
                if keys.len() > 1 {
                    let all: Vec<&str> = keys.iter().map(|(_, k)| k.algorithm.as_str()).collect();
                    e.notes.push(format!(
                        "known_hosts lists {} keys ({}): the {} key is pinned, the one the \
                         service asks for first",
                        keys.len(),
                        all.join(", "),
                        k.algorithm
                    ));
                }
                e.host_key = Some(k.clone());
            }
            None if e.host_key_policy == HostKeyPolicy::Strict => e.notes.push(format!(
                "strict, and no known_hosts key for {lookup}: after approval, check the \
                 fingerprint on the host and run `sshmode target test {} --trust SHA256:…`",
                e.alias
            )),
            None => {}
        }
    }
}

/// Marks aliases that exist already as conflicts, and the targets behind a conflicting jump
/// host that is not the one the config describes as skipped.
async fn conflicts(plan: &mut Plan, db: &PgPool) -> Result<(), TargetError> {
    for i in 0..plan.targets.len() {
        if let Some(j) = plan.targets[i].jump_entry {
            let hop = &plan.targets[j];
            let unusable = match hop.action {
                Action::Skip => Some("is not imported".to_string()),
                Action::Conflict if !hop.registered_alike => {
                    Some("is registered with another address".to_string())
                }
                _ => None,
            };
            if let Some(why) = unusable
                && plan.targets[i].action != Action::Skip
            {
                let alias = hop.alias.clone();
                plan.targets[i].skip(format!("its jump host `{alias}` {why}"));
            }
        }
        let e = &mut plan.targets[i];
        match super::get(db, &e.alias).await {
            Ok(t) => {
                let same =
                    t.host == e.host && t.port == e.port && t.user == e.user && t.jump == e.jump;
                e.action = Action::Conflict;
                e.registered_alike = same;
                e.notes.push(if same {
                    format!(
                        "already registered with this address ({}): left as it is",
                        t.status.as_str()
                    )
                } else {
                    format!("already registered as {}: not changed", t.destination())
                });
            }
            Err(TargetError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Adds every planned target, pending approval, jump hosts first; a target whose jump host
/// could not be added is skipped.
async fn apply(
    plan: &mut Plan,
    config: &ServiceConfig,
    db: &PgPool,
    input: &mut dyn BufRead,
) -> anyhow::Result<()> {
    plan.applied = true;
    if !plan.targets.iter().any(|e| e.action == Action::Add) {
        return Ok(());
    }
    let vault = open_vault(config, db).await?;
    // A key used by several hosts is asked for once.
    let mut keys: HashMap<PathBuf, Option<russh::keys::PrivateKey>> = HashMap::new();
    for i in 0..plan.targets.len() {
        if plan.targets[i].action != Action::Add {
            continue;
        }
        if let Some(j) = plan.targets[i].jump_entry
            && !matches!(plan.targets[j].action, Action::Added | Action::Conflict)
        {
            let alias = plan.targets[j].alias.clone();
            plan.targets[i].skip(format!("its jump host `{alias}` was not added"));
            continue;
        }
        let e = &plan.targets[i];
        let path = e.key.clone().expect("a planned target has a key");
        let key = match keys.get(&path) {
            Some(k) => k.clone(),
            None => {
                // Unreadable now, or no passphrase line left: this host is skipped, the
                // others go on.
                let k = match read_key_for_import(&path, e.encrypted, input) {
                    Ok(k) => k,
                    Err(why) => {
                        plan.targets[i].skip(format!("{why:#}"));
                        continue;
                    }
                };
                keys.insert(path.clone(), k.clone());
                k
            }
        };
        let Some(key) = key else {
            plan.targets[i].skip(format!(
                "the key {} could not be opened (wrong passphrase?)",
                path.display()
            ));
            continue;
        };
        let cert = match e.cert.as_deref().map(|c| read_cert(c, &key)).transpose() {
            Ok(c) => c,
            Err(why) => {
                plan.targets[i].skip(format!("{why:#}"));
                continue;
            }
        };
        let new = NewTarget {
            alias: e.alias.clone(),
            host: e.host.clone(),
            port: e.port,
            user: e.user.clone(),
            description: None,
            secrets: key_secrets(&key, cert)?,
            host_key_policy: e.host_key_policy,
            host_key: e.host_key.as_ref().map(|k| HostKey {
                fingerprint: k.fingerprint.clone(),
                algorithm: Some(k.algorithm.clone()),
                source: "pinned".into(),
                at: None,
            }),
            approve: false,
            jump: e.jump.clone(),
        };
        match super::add(db, &vault, new, &config.operator).await {
            Ok(_) => plan.targets[i].action = Action::Added,
            Err(TargetError::Exists(_)) => {
                let e = &mut plan.targets[i];
                e.action = Action::Conflict;
                e.notes
                    .push("added by someone else meanwhile: not changed".into());
            }
            Err(why) => plan.targets[i].skip(why.to_string()),
        }
    }
    Ok(())
}

/// The key at `path`, decrypted with a passphrase read from `input` when `encrypted`; `None`
/// when the passphrase does not open it.
fn read_key_for_import(
    path: &Path,
    encrypted: bool,
    input: &mut dyn BufRead,
) -> anyhow::Result<Option<russh::keys::PrivateKey>> {
    let text = read_small_file(path, "key file")?;
    let passphrase: Option<Zeroizing<String>> = if encrypted {
        Some(read_secret_line(
            input,
            &format!("passphrase for {}", path.display()),
        )?)
    } else {
        None
    };
    Ok(decode_key(&text, path, passphrase.as_deref().map(|p| p.as_str())).ok())
}

fn print(plan: &Plan, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out, "from {}", plan.config.display())?;
    if plan.targets.is_empty() {
        writeln!(out, "no concrete Host in the config: nothing to import")?;
    } else {
        writeln!(out, "ALIAS\tHOST\tUSER\tPORT\tKEY\tJUMP\tHOST KEY\tACTION")?;
    }
    for e in &plan.targets {
        let key = match (&e.key, &e.cert) {
            (Some(k), Some(c)) => format!("{} (+cert {})", k.display(), c.display()),
            (Some(k), None) => k.display().to_string(),
            _ => "-".into(),
        };
        let host_key = match &e.host_key {
            Some(k) => format!("{} {}", e.host_key_policy.as_str(), k.fingerprint),
            None => format!("{} -", e.host_key_policy.as_str()),
        };
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            e.alias,
            if e.host.is_empty() { "-" } else { &e.host },
            if e.user.is_empty() { "-" } else { &e.user },
            e.port,
            key,
            e.jump.as_deref().unwrap_or("-"),
            host_key,
            e.action.as_str(plan.applied),
        )?;
    }
    let mut first = true;
    for e in &plan.targets {
        let mut lines: Vec<String> = Vec::new();
        lines.push(format!("from {}", e.source));
        if let Some(k) = &e.host_key {
            lines.push(format!(
                "host key {} {} from {}{}",
                k.fingerprint,
                k.algorithm,
                k.from,
                if plan.applied {
                    ": pinned"
                } else {
                    ": pinned with --apply"
                }
            ));
        }
        lines.extend(e.notes.iter().cloned());
        if !e.unsupported.is_empty() {
            lines.push(format!(
                "not supported, not imported: {}",
                e.unsupported.join(", ")
            ));
        }
        if first {
            writeln!(out)?;
            first = false;
        }
        for l in lines {
            writeln!(out, "{}: {l}", e.alias)?;
        }
    }
    if !plan.notes.is_empty() {
        writeln!(out)?;
        for n in &plan.notes {
            writeln!(out, "note: {n}")?;
        }
    }
    let count = |a: Action| plan.targets.iter().filter(|e| e.action == a).count();
    writeln!(out)?;
    if plan.applied {
        writeln!(
            out,
            "added {} (pending: an admin must approve each before chats can use it), {} \
             conflict(s), {} skipped",
            count(Action::Added),
            count(Action::Conflict),
            count(Action::Skip)
        )?;
    } else {
        writeln!(
            out,
            "dry run: {} to add, {} conflict(s), {} skipped; nothing was changed — run again \
             with --apply to add them pending approval",
            count(Action::Add),
            count(Action::Conflict),
            count(Action::Skip)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(home: &Path) -> Local {
        Local {
            user: "me".into(),
            uid: 1000,
            home: home.to_path_buf(),
            hostname: "box".into(),
        }
    }

    /// A throwaway ed25519 key made for these tests (it opens nothing).
    const KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\n\
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n\
QyNTUxOQAAACCLWil5NfamqoYKkZ5ADzNsp7kyKhTFIR2v7JBdXwNjaAAAAIjfopuk36Kb\n\
pAAAAAtzc2gtZWQyNTUxOQAAACCLWil5NfamqoYKkZ5ADzNsp7kyKhTFIR2v7JBdXwNjaA\n\
AAAEB9bCazjqHgF0XnAKQWdsFxFsSem/pheQzO6ba0Yw7JWotaKXk19qaqhgqRnkAPM2yn\n\
uTIqFMUhHa/skF1fA2NoAAAABHRlc3QB\n\
-----END OPENSSH PRIVATE KEY-----\n\
";

    fn key(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, KEY).unwrap();
        p
    }

    fn plan_of(home: &Path, text: &str) -> Plan {
        let path = home.join("config");
        std::fs::write(&path, text).unwrap();
        let c = ssh_config::load(&path, home).unwrap();
        plan(&c, &path, &local(home), false)
    }

    fn entry<'a>(p: &'a Plan, alias: &str) -> &'a Entry {
        p.targets
            .iter()
            .find(|e| e.alias == alias)
            .unwrap_or_else(|| panic!("no {alias} in {p:#?}"))
    }

    #[test]
    fn chained_proxy_jump_hops_become_targets_jump_hosts_first() {
        let d = tempfile::tempdir().unwrap();
        let k = key(d.path(), "k");
        let p = plan_of(
            d.path(),
            &format!(
                "Host web\n  HostName 10.0.0.5\n  User deploy\n  ProxyJump ops@edge.example.com:2200,bastion\n\
                 Host bastion\n  HostName 10.1.0.1\n  User jump\n\
                 Host *\n  IdentityFile {}\n",
                k.display()
            ),
        );
        let aliases: Vec<&str> = p.targets.iter().map(|e| e.alias.as_str()).collect();
        assert_eq!(
            aliases,
            ["edge.example.com-2200", "bastion-2", "web", "bastion"]
        );
        let web = entry(&p, "web");
        assert_eq!(web.jump.as_deref(), Some("bastion-2"));
        assert_eq!(web.action, Action::Add, "{web:#?}");
        // `bastion` reached through the edge is not the config's direct `bastion`: a hop of
        // its own.
        let hop = entry(&p, "bastion-2");
        assert_eq!((hop.host.as_str(), hop.user.as_str()), ("10.1.0.1", "jump"));
        assert_eq!(hop.jump.as_deref(), Some("edge.example.com-2200"));
        let edge = entry(&p, "edge.example.com-2200");
        assert_eq!((edge.user.as_str(), edge.port), ("ops", 2200));
        assert_eq!(edge.key.as_deref(), Some(k.as_path()));
        assert_eq!(entry(&p, "bastion").jump, None);
    }

    #[test]
    fn a_single_hop_naming_a_host_is_that_host_and_loops_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let k = key(d.path(), "k");
        let p = plan_of(
            d.path(),
            &format!(
                "Host app\n  ProxyJump bastion\nHost bastion\n  HostName b.example\n\
                 Host a\n  ProxyJump b\nHost b\n  ProxyJump a\n\
                 Host cmd\n  ProxyCommand nc %h %p\nHost *\n  IdentityFile {}\n",
                k.display()
            ),
        );
        let aliases: Vec<&str> = p.targets.iter().map(|e| e.alias.as_str()).collect();
        assert_eq!(aliases, ["bastion", "app", "b", "a", "cmd"]);
        assert_eq!(entry(&p, "app").jump.as_deref(), Some("bastion"));
        assert_eq!(entry(&p, "app").action, Action::Add);
        let b = entry(&p, "b");
        assert_eq!(b.action, Action::Skip);
        assert!(
            b.notes.iter().any(|n| n.contains("loop: a → b → a")),
            "{b:#?}"
        );
        assert_eq!(entry(&p, "a").action, Action::Skip);
        let cmd = entry(&p, "cmd");
        assert!(
            cmd.notes.iter().any(|n| n.contains("ProxyCommand")),
            "{cmd:#?}"
        );
    }

    #[test]
    fn keys_missing_defaulted_and_several() {
        let d = tempfile::tempdir().unwrap();
        let ssh = d.path().join(".ssh");
        std::fs::create_dir_all(&ssh).unwrap();
        let k = key(&ssh, "id_ed25519");
        let p = plan_of(
            d.path(),
            "Host gone\n  IdentityFile ~/.ssh/nope\n\
             Host two\n  IdentityFile ~/.ssh/nope\n  IdentityFile %d/.ssh/id_ed25519\n  IdentityFile ~/.ssh/x\n\
             Host dflt\n  User u\n\
             Host tok\n  IdentityFile ~/.ssh/%C\n\
             Host bad_alias:1\n",
        );
        let gone = entry(&p, "gone");
        assert_eq!(gone.action, Action::Skip);
        assert!(
            gone.notes.iter().any(|n| n.contains("nope not found")),
            "{gone:#?}"
        );
        let two = entry(&p, "two");
        assert_eq!(
            (two.action, two.key.as_deref()),
            (Action::Add, Some(k.as_path()))
        );
        assert!(
            two.notes
                .iter()
                .any(|n| n.contains("not imported: a target keeps one key"))
        );
        let dflt = entry(&p, "dflt");
        assert_eq!(dflt.key.as_deref(), Some(k.as_path()));
        assert!(dflt.notes.iter().any(|n| n.contains("default keys")));
        assert!(entry(&p, "tok").notes.iter().any(|n| n.contains("%C")));
        let bad = entry(&p, "bad_alias:1");
        assert_eq!(bad.action, Action::Skip);
        assert!(
            bad.notes.iter().any(|n| n.contains("not a valid alias")),
            "{bad:#?}"
        );
        // The local user, as ssh uses, when none is set.
        assert_eq!(entry(&p, "two").user, "me");
    }
}
