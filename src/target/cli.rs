//! `sshmode target …`: add (which sees the host key once, unless `--offline`), list, show,
//! approve (which pins the key shown), disable, remove, test (`--trust [SHA256:…]` pins only
//! the key the operator checked), rekey. A target added with `--jump <alias>` is seen, tested
//! and used through that jump host (and its own jump hosts, if any). `import` reads an OpenSSH
//! client config into targets (`super::import`).

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use russh::keys::{Certificate, HashAlg, PublicKey};
use sqlx::PgPool;
use zeroize::Zeroizing;

use super::{HostKey, HostKeyPolicy, NewSecrets, NewTarget, Status, Target, TargetError, Trust};
use crate::config::Config;
use crate::exec::ssh::connect::{self, ConnectOptions};
use crate::vault::Vault;

/// `sshmode target …`
#[derive(Debug, Subcommand)]
pub enum TargetCmd {
    /// Register an SSH target; key, certificate and password are imported into the vault now.
    #[command(after_help = "Examples:\n  \
        sshmode target add web --host web.example.com --user deploy --key ~/.ssh/id_ed25519 --approve\n  \
        sshmode target add db --host 10.0.0.5 --user root --password-stdin < password.txt\n  \
        sshmode target add app --host 10.0.1.7 --user ops --agent --jump bastion\n  \
        sshmode target add hk --host hk.example.com --user ops --key id_ed25519 --host-key-policy strict --host-key SHA256:...")]
    Add(AddArgs),
    /// List targets (never secrets or key paths).
    #[command(after_help = "Examples:\n  sshmode target list\n  sshmode target list --json")]
    List {
        /// A JSON array of the targets instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one target (never secrets or key paths).
    #[command(
        after_help = "Examples:\n  sshmode target show web\n  sshmode target show web --json"
    )]
    Show {
        /// The target's alias.
        alias: String,
        /// The target as one JSON object, with its `path` of jump hosts and its `chats`.
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending target so chats may use it.
    #[command(after_help = "Examples:\n  sshmode target approve web")]
    Approve {
        /// The target's alias.
        alias: String,
    },
    /// Disable a target: no new commands run on it.
    #[command(after_help = "Examples:\n  sshmode target disable web")]
    Disable {
        /// The target's alias.
        alias: String,
    },
    /// Remove a target and its vaulted secrets.
    #[command(after_help = "Examples:\n  sshmode target remove web")]
    Remove {
        /// The target's alias.
        alias: String,
    },
    /// Which chats may use the target: the listed chat ids only, or every chat (the default
    /// for a target without a list).
    #[command(
        after_help = "Examples:\n  sshmode target allow web oc_aaa oc_bbb\n  sshmode target allow web --all-chats"
    )]
    Allow(AllowArgs),
    /// Connect, check the host key, run `true`; print the host key fingerprint.
    #[command(after_help = "Examples:\n  \
        sshmode target test web\n  \
        sshmode target test web --trust SHA256:abc...   # pin it if it has the fingerprint you checked")]
    Test {
        /// The target's alias.
        alias: String,
        /// Pin the presented host key, only if it has the `SHA256:…` fingerprint you checked
        /// on the host (`--trust` alone pins the presented key if no other is recorded).
        #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "SHA256:FP")]
        trust: Option<String>,
    },
    /// The target's default workspace and the highest permission a chat may choose on it
    /// (audited).
    #[command(after_help = "Examples:\n  \
        sshmode target set web --workspace /srv/app --permission read-write\n  \
        sshmode target set web --risky refuse --approvers requester\n  \
        sshmode target set app --jump bastion")]
    Set(SetArgs),
    /// Read the hosts of an OpenSSH client config (`~/.ssh/config` by default) and print what
    /// would be added; `--apply` adds them pending approval (audited), jump hosts first.
    #[command(after_help = "Examples:\n  \
        sshmode target import                          # dry run of ~/.ssh/config\n  \
        sshmode target import ./team_ssh_config --json\n  \
        sshmode target import --apply                  # add them, pending approval\n  \
        sshmode target import --apply --passphrase-stdin   # type each encrypted key's passphrase")]
    Import(ImportArgs),
    /// Replace the recorded or pinned host key after a legitimate change (audited).
    #[command(after_help = "Examples:\n  \
        sshmode target rekey web --host-key SHA256:abc...\n  \
        sshmode target rekey web --host-key 'ssh-ed25519 AAAAC3Nza...'")]
    Rekey {
        /// The target's alias.
        alias: String,
        /// The new key: a `known_hosts`-style key line or a `SHA256:…` fingerprint, checked
        /// on the host.
        #[arg(long)]
        host_key: String,
    },
}

/// `sshmode target import [PATH] [--apply] [--passphrase-stdin] [--json]`
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The OpenSSH client config to read (default: `~/.ssh/config`); its `Include`s are
    /// followed.
    pub path: Option<PathBuf>,
    /// Add the targets (pending approval, audited) and pin the host keys their known_hosts
    /// list; without it nothing is changed.
    #[arg(long)]
    pub apply: bool,
    /// With --apply: read the passphrase of each encrypted key from standard input, one line
    /// each, in the order of the table (without it, hosts with an encrypted key are skipped).
    #[arg(long)]
    pub passphrase_stdin: bool,
    /// The plan (or what was done) as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `sshmode target allow <alias> (<chat_id>… | --all-chats)`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["chats", "all_chats"])))]
pub struct AllowArgs {
    /// The target's alias.
    pub alias: String,
    /// Chat ids (`oc_…`) that may use the target.
    pub chats: Vec<String>,
    /// Every chat may use the target (removes the list).
    #[arg(long)]
    pub all_chats: bool,
}

/// `sshmode target set <alias> [--workspace DIR] [--permission read|read-write|full]
/// [--jump ALIAS | --no-jump]`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["workspace", "permission", "jump", "no_jump", "approvers", "risky"])))]
pub struct SetArgs {
    /// The target's alias.
    pub alias: String,
    /// Where the target's sections start: an absolute directory or `~/…` on the target;
    /// `~` returns it to the remote user's home.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<String>,
    /// The highest permission a chat may choose on this target: read, read-write or full.
    #[arg(long, value_name = "PERMISSION", value_parser = parse_permission)]
    pub permission: Option<crate::workspace::Permission>,
    /// Reach the target through this registered target (its jump host); a loop is refused.
    #[arg(long, value_name = "ALIAS", conflicts_with = "no_jump")]
    pub jump: Option<String>,
    /// Reach the target directly again.
    #[arg(long)]
    pub no_jump: bool,
    /// Who answers the target's approval cards: admins (default), or the requester too.
    #[arg(long, value_name = "WHO", value_parser = ["admins", "requester"])]
    pub approvers: Option<String>,
    /// What a command the guard asks about does on the target: ask (default, an approval
    /// card), refuse, or allow without asking.
    #[arg(long, value_name = "POLICY", value_parser = parse_risky)]
    pub risky: Option<crate::config::Risky>,
}

fn parse_risky(s: &str) -> Result<crate::config::Risky, String> {
    s.parse()
}

fn parse_permission(s: &str) -> Result<crate::workspace::Permission, String> {
    crate::workspace::Permission::parse(s)
        .ok_or_else(|| format!("`{s}` is not a permission: use read, read-write or full"))
}

/// Host-key policy of a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostKeyPolicyArg {
    /// Trust on first use: the first key seen is recorded; a later mismatch is refused.
    Tofu,
    /// Only a pinned key is accepted.
    Strict,
}

/// `sshmode target add`
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("auth").required(true).args(["key", "password_stdin", "agent"]))]
pub struct AddArgs {
    /// Short name the chat uses (`/ssh use <alias>`).
    pub alias: String,
    /// Host name or address (as the jump host sees it, with `--jump`).
    #[arg(long)]
    pub host: String,
    /// SSH port.
    #[arg(long, default_value_t = 22)]
    pub port: u16,
    /// The remote user to log in as.
    #[arg(long)]
    pub user: String,
    /// Private key file to import (ed25519, ecdsa or rsa).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Read the key's passphrase from standard input.
    #[arg(long, requires = "key")]
    pub passphrase_stdin: bool,
    /// Read the password from standard input.
    #[arg(long)]
    pub password_stdin: bool,
    /// Authenticate through the agent at SSH_AUTH_SOCK when connecting.
    #[arg(long)]
    pub agent: bool,
    /// OpenSSH user certificate (`…-cert.pub`) to import with the key.
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// What the target is, in a few words (shown by `target show`, in chats and to MCP clients).
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
    /// How the host key is trusted: tofu (the first key seen) or strict (only a pinned key).
    #[arg(long, value_enum, default_value_t = HostKeyPolicyArg::Tofu)]
    pub host_key_policy: HostKeyPolicyArg,
    /// Pin this host key: a `known_hosts`-style key line or a `SHA256:…` fingerprint.
    #[arg(long)]
    pub host_key: Option<String>,
    /// Added by an operator: usable at once (the host key seen now is pinned).
    #[arg(long)]
    pub approve: bool,
    /// Do not connect now to see the host key; the first connection records it (a strict
    /// target needs `--host-key` or `target test --trust SHA256:…`).
    #[arg(long)]
    pub offline: bool,
    /// Reach the target through this registered target (a bastion): its connection opens a
    /// channel to `--host:--port`, so the address is the one the jump host sees. Chains are
    /// allowed; loops are refused. The jump host must be approved before chats can use this one.
    #[arg(long, value_name = "ALIAS")]
    pub jump: Option<String>,
}

impl TargetCmd {
    /// Whether the command asked for JSON (`list --json`, `show --json`).
    pub fn json(&self) -> bool {
        matches!(
            self,
            TargetCmd::List { json: true } | TargetCmd::Show { json: true, .. }
        )
    }
}

/// Runs a target command; returns the process exit code.
pub async fn run(cmd: TargetCmd, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = run_with(cmd, config, &store.pool, &mut input, &mut out).await;
    store.close().await;
    result
}

/// `target list --json` (an array of targets) and `target show <alias> --json` (the target with
/// its `path` of aliases and its allowed `chats`, empty = every chat). Never secrets or key
/// paths: a [`Target`] holds neither.
pub async fn run_json(cmd: TargetCmd, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let stdout = std::io::stdout();
    let result = json_with(cmd, &store.pool, &mut stdout.lock()).await;
    store.close().await;
    result
}

/// [`run_json`] on a given database and output.
pub async fn json_with(cmd: TargetCmd, db: &PgPool, out: &mut dyn Write) -> anyhow::Result<i32> {
    let value = match cmd {
        TargetCmd::List { .. } => serde_json::to_value(super::list(db).await?)?,
        TargetCmd::Show { alias, .. } => {
            let path = super::path(db, &alias).await.map_err(user_error)?;
            let chats = super::allow::allowed_chats(db, &alias)
                .await
                .map_err(user_error)?;
            let mut v = serde_json::to_value(&path[0])?;
            v["path"] = path.iter().map(|t| t.alias.clone()).collect();
            v["chats"] = serde_json::to_value(chats)?;
            v
        }
        _ => bail!("--json goes with `target list` and `target show`"),
    };
    serde_json::to_writer_pretty(&mut *out, &value)?;
    writeln!(out)?;
    Ok(0)
}

/// [`run`] on a given database, input and output (tests call this directly).
pub async fn run_with(
    cmd: TargetCmd,
    config: &Config,
    db: &PgPool,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    crate::install_crypto_provider();
    match cmd {
        TargetCmd::Add(args) => {
            let vault = open_vault(config, db).await?;
            let offline = args.offline;
            let mut new = new_target(args, input)?;
            super::validate(&new).map_err(user_error)?;
            if super::get(db, &new.alias).await.is_ok() {
                return Err(user_error(TargetError::Exists(new.alias)));
            }
            // The jump path, checked before anything connects: the jump host exists, and the
            // chain through it neither loops nor runs too long (the add checks again).
            let jumps = match &new.jump {
                Some(j) => jump_path(db, &new.alias, j).await?,
                None => Vec::new(),
            };
            if !offline {
                see_host_key(&mut new, config, db, &vault, &jumps).await?;
            }
            let approved = new.approve;
            let t = super::add(db, &vault, new, &config.operator)
                .await
                .map_err(user_error)?;
            writeln!(
                out,
                "target `{}` added ({}){}{}",
                t.alias,
                t.status.as_str(),
                t.via(),
                if approved {
                    ""
                } else {
                    "; an admin must approve it before chats can use it"
                }
            )?;
            match &t.host_key {
                Some(k) => writeln!(out, "host key: {}", k.describe())?,
                None => writeln!(
                    out,
                    "host key: not seen (--offline); the first connection records it"
                )?,
            }
            let pinned = t.host_key.as_ref().is_some_and(|k| k.source == "pinned");
            if t.host_key_policy == HostKeyPolicy::Strict && !pinned {
                writeln!(
                    out,
                    "strict target without a pinned host key: check the fingerprint on the host and run `sshmode target test {} --trust SHA256:…`",
                    t.alias
                )?;
            }
            Ok(0)
        }
        TargetCmd::Import(args) => super::import::run(args, config, db, input, out).await,
        TargetCmd::List { .. } => {
            let targets = super::list(db).await?;
            if targets.is_empty() {
                writeln!(out, "no targets")?;
            } else {
                writeln!(
                    out,
                    "ALIAS\tDESTINATION\tSTATUS\tAUTH\tHOST KEY POLICY\tHOST KEY"
                )?;
            }
            for t in targets {
                writeln!(
                    out,
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    t.alias,
                    t.destination(),
                    t.status.as_str(),
                    auth_label(&t),
                    t.host_key_policy.as_str(),
                    t.host_key
                        .as_ref()
                        .map(|k| k.fingerprint.as_str())
                        .unwrap_or("-"),
                )?;
            }
            Ok(0)
        }
        TargetCmd::Show { alias, .. } => {
            let path = super::path(db, &alias).await.map_err(user_error)?;
            show(&path[0], out)?;
            if path.len() > 1 {
                writeln!(out, "path:            {}", describe_path(&path))?;
            }
            let chats = super::allow::allowed_chats(db, &alias)
                .await
                .map_err(user_error)?;
            if chats.is_empty() {
                writeln!(out, "chats:           all")?;
            } else {
                writeln!(out, "chats:           {}", chats.join(" "))?;
            }
            Ok(0)
        }
        TargetCmd::Allow(a) => {
            let chats = (!a.all_chats).then_some(a.chats.as_slice());
            super::allow::set_allowed(db, &a.alias, chats, &config.operator)
                .await
                .map_err(user_error)?;
            match chats {
                Some(c) => writeln!(out, "target `{}` may be used in: {}", a.alias, c.join(" "))?,
                None => writeln!(out, "target `{}` may be used in every chat", a.alias)?,
            }
            Ok(0)
        }
        TargetCmd::Set(a) => {
            if a.approvers.is_some() || a.risky.is_some() {
                let p = super::policy::set(
                    db,
                    &a.alias,
                    a.approvers.as_deref(),
                    a.risky,
                    &config.operator,
                )
                .await
                .map_err(user_error)?;
                writeln!(
                    out,
                    "target `{}`: approvals answered by {}, risky commands: {}",
                    a.alias,
                    p.approvers,
                    p.risky.as_str()
                )?;
                if a.workspace.is_none() && a.permission.is_none() && a.jump.is_none() && !a.no_jump
                {
                    return Ok(0);
                }
            }
            let settings = super::Settings {
                workspace: a
                    .workspace
                    .map(|w| (w.trim() != "~").then(|| w.trim().to_string())),
                max_permission: a.permission,
                jump: if a.no_jump {
                    Some(None)
                } else {
                    a.jump.map(Some)
                },
            };
            let t = super::set_settings(db, &a.alias, &settings, &config.operator)
                .await
                .map_err(user_error)?;
            writeln!(
                out,
                "target `{}`: workspace {}, highest permission {}, reached {}",
                t.alias,
                t.workspace.as_deref().unwrap_or("~ (the remote home)"),
                t.max_permission,
                match &t.jump {
                    Some(j) => format!("through `{j}`"),
                    None => "directly".into(),
                }
            )?;
            Ok(0)
        }
        TargetCmd::Approve { alias } => {
            let a = super::approve(db, &alias, &config.operator)
                .await
                .map_err(user_error)?;
            writeln!(out, "target `{alias}`: {} -> approved", a.previous.as_str())?;
            match a.pinned {
                Some(k) => writeln!(out, "host key pinned: {}", k.describe())?,
                None => writeln!(
                    out,
                    "no host key seen yet: the first connection records it (a strict target needs `target test {alias} --trust SHA256:…`)"
                )?,
            }
            Ok(0)
        }
        TargetCmd::Disable { alias } => {
            let code = status(db, &alias, Status::Disabled, &config.operator, out).await?;
            let behind = super::dependents(db, &alias).await.map_err(user_error)?;
            if !behind.is_empty() {
                writeln!(
                    out,
                    "targets reached through `{alias}` now fail until it is approved again: {}",
                    behind.join(", ")
                )?;
            }
            Ok(code)
        }
        TargetCmd::Remove { alias } => {
            super::remove(db, &alias, &config.operator)
                .await
                .map_err(user_error)?;
            writeln!(out, "target `{alias}` removed, with its vaulted secrets")?;
            Ok(0)
        }
        TargetCmd::Test { alias, trust } => {
            let trust = match trust.as_deref().map(str::trim) {
                None => None,
                Some("") => Some(Trust::Presented),
                Some(fp) => Some(Trust::Fingerprint(parse_fingerprint(fp)?)),
            };
            let vault = open_vault(config, db).await?;
            let path = super::path(db, &alias).await.map_err(user_error)?;
            if path.len() > super::MAX_HOPS + 1 {
                bail!(
                    "`{alias}` is reached through more than {} jump hosts",
                    super::MAX_HOPS
                );
            }
            test(&path, config, db, &vault, trust, out).await
        }
        TargetCmd::Rekey { alias, host_key } => {
            let key = parse_host_key(&host_key)?;
            let prev = super::rekey(db, &alias, &key, &config.operator)
                .await
                .map_err(user_error)?;
            writeln!(
                out,
                "target `{alias}`: host key {} replaced; now pinned: {}",
                prev.as_deref().unwrap_or("(none)"),
                key.fingerprint
            )?;
            Ok(0)
        }
    }
}

/// `target test <alias>` for `sshmode doctor`: whether it succeeded, and the lines it printed.
pub async fn check(
    alias: &str,
    config: &Config,
    db: &PgPool,
) -> anyhow::Result<(bool, Vec<String>)> {
    crate::install_crypto_provider();
    let vault = open_vault(config, db).await?;
    let path = super::path(db, alias).await.map_err(user_error)?;
    let mut out = Vec::new();
    let code = test(&path, config, db, &vault, None, &mut out).await?;
    let lines = String::from_utf8_lossy(&out)
        .lines()
        .map(str::to_string)
        .collect();
    Ok((code == 0, lines))
}

/// `sshmode vault rotate-key`: a new master key, written beside the current one
/// (`<key>.new`), every target's records and the vault's canary re-sealed with it in one
/// transaction (audited as `vault.rotate`), then the files swapped: the current key becomes
/// `<key>.old` and the new one takes its place. Refused while a replica of the service has a
/// live heartbeat on this database (it holds the old key in memory) unless `force`.
pub async fn rotate_key(config: &Config, force: bool) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let result = rotate_key_with(config, &store.pool, force).await;
    store.close().await;
    let rotated = result?;
    println!(
        "re-sealed the secrets of {} target(s) with a new master key at {}; the previous key is \
         {}: replace the key in your backups, then delete it",
        rotated.targets,
        config.master_key_file.display(),
        rotated.old.display()
    );
    if !rotated.running.is_empty() {
        eprintln!(
            "warning: still running with the previous key: {}; restart it now, until then it \
             cannot open any target's secret",
            rotated.running.join(", ")
        );
    }
    Ok(0)
}

/// What a rotation did.
pub struct Rotated {
    /// Targets whose records were re-sealed.
    pub targets: usize,
    /// Where the previous key now is.
    pub old: PathBuf,
    /// Replicas that were running (with `--force`), as `pid P on HOST (…)`.
    pub running: Vec<String>,
}

/// [`rotate_key`] on a given database.
pub async fn rotate_key_with(config: &Config, db: &PgPool, force: bool) -> anyhow::Result<Rotated> {
    let current = &config.master_key_file;
    if !current.exists() {
        bail!(
            "no master key at {} (SSHMODE_MASTER_KEY_FILE): nothing to rotate",
            current.display()
        );
    }
    let with = |ext: &str| {
        let mut s = current.clone().into_os_string();
        s.push(ext);
        PathBuf::from(s)
    };
    let (next_path, old_path) = (with(".new"), with(".old"));
    if old_path.exists() {
        bail!(
            "{} exists: it holds the key an earlier rotation replaced; once your backups hold \
             the current key {}, delete it and run this again",
            old_path.display(),
            current.display()
        );
    }
    if next_path.exists() {
        // Left by a rotation that stopped: before its commit (nothing changed) or after it,
        // before the key was moved into place. The canary tells which.
        let sealed_with_next = match Vault::open_existing(&next_path) {
            Ok(next) => crate::target::keyring::opens_canary(db, &next)
                .await?
                .unwrap_or(false),
            Err(_) => false,
        };
        if sealed_with_next {
            bail!(
                "{next} holds the key this database is now sealed with (an earlier rotation \
                 stopped before moving it into place): move {cur} to {old}, then {next} to {cur}",
                next = next_path.display(),
                cur = current.display(),
                old = old_path.display()
            );
        }
        bail!(
            "{} is left from an earlier rotation that changed nothing (the database does not \
             use it): delete it and run this again",
            next_path.display()
        );
    }
    let running: Vec<String> = crate::store::replicas::live(db)
        .await?
        .iter()
        .map(ToString::to_string)
        .collect();
    if !running.is_empty() && !force {
        bail!(
            "the service is running on this database ({}): it holds the current key and would \
             fail to open every secret after the rotation; stop every `sshmode serve` and \
             `sshmode chat` first, or pass --force and restart them right after",
            running.join(", ")
        );
    }
    let old = open_vault(config, db).await?;
    let next = Vault::create(&next_path)
        .map_err(|e| anyhow::anyhow!("cannot write the new key {}: {e}", next_path.display()))?;
    let n = match super::reseal_all(db, &old, &next, &config.operator).await {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&next_path);
            return Err(user_error(e).context("nothing was changed"));
        }
    };
    // The database is sealed with the new key from here: swap the files.
    std::fs::rename(current, &old_path)
        .and_then(|()| std::fs::rename(&next_path, current))
        .with_context(|| {
            format!(
                "the records are sealed with {}, but it could not be moved to {}: move it there by hand",
                next_path.display(),
                current.display()
            )
        })?;
    if let Some(dir) = current.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(Rotated {
        targets: n,
        old: old_path,
        running,
    })
}

/// Opens the vault and re-seals any records still in the first format (idempotent).
pub(super) async fn open_vault(config: &Config, db: &PgPool) -> anyhow::Result<Vault> {
    // Only the key that opens this database's vault (never a fresh one over sealed secrets).
    let vault = crate::target::keyring::open(db, &config.master_key_file).await?;
    super::reseal_legacy(db, &vault).await.map_err(user_error)?;
    Ok(vault)
}

/// Connects once to see the host key (`target add` without `--offline`): a key given with
/// `--host-key` must be the one presented; otherwise the presented one is recorded as seen.
async fn see_host_key(
    new: &mut NewTarget,
    config: &Config,
    db: &PgPool,
    vault: &Vault,
    jumps: &[Target],
) -> anyhow::Result<()> {
    let probed = if jumps.is_empty() {
        connect::probe_host_key(&config.exec, new.host.trim(), new.port).await
    } else {
        let registry = super::registry(db.clone());
        let jumps: Vec<_> = jumps.iter().map(Target::endpoint).collect();
        let jumps = &jumps[..];
        let opts = ConnectOptions {
            config: &config.exec,
            registry: &registry,
            vault,
            trust: None,
            actor: &config.operator,
        };
        match connect::open_path(jumps, &opts, new.host.trim(), new.port).await {
            Ok((hops, ch)) => {
                let r = connect::probe_host_key_through(
                    &config.exec,
                    new.host.trim(),
                    new.port,
                    ch.into_stream(),
                )
                .await;
                drop(hops);
                r
            }
            Err(e) => Err(e),
        }
    };
    let (fingerprint, algorithm) =
        probed
            .map_err(|e| {
                anyhow::anyhow!(
                    "could not see the host key of `{}`: {e}; fix the address, or add it with --offline (the first connection then records the key)",
                    new.alias
                )
            })?;
    if let Some(given) = &new.host_key
        && given.fingerprint != fingerprint
    {
        bail!(
            "{}:{} presents host key {fingerprint} ({algorithm}), not the {} given with --host-key; nothing was added",
            new.host,
            new.port,
            given.fingerprint
        );
    }
    let key = new.host_key.get_or_insert_with(|| HostKey {
        fingerprint,
        algorithm: None,
        source: "seen".into(),
        at: None,
    });
    key.algorithm.get_or_insert(algorithm);
    Ok(())
}

/// A `SHA256:…` fingerprint as `--trust` takes it.
fn parse_fingerprint(s: &str) -> anyhow::Result<String> {
    if !s.starts_with("SHA256:") {
        bail!("--trust takes the `SHA256:…` fingerprint you checked on the host");
    }
    Ok(parse_host_key(s)?.fingerprint)
}

/// The jump hosts a new target `alias` would be reached through (`jump` first, outwards), or
/// the reason it cannot: `jump` is unknown, it is `alias`, or the chain is too long.
async fn jump_path(db: &PgPool, alias: &str, jump: &str) -> anyhow::Result<Vec<Target>> {
    if jump == alias {
        bail!("`{alias}` cannot be its own jump host");
    }
    let path = match super::path(db, jump).await {
        Ok(p) => p,
        Err(TargetError::NotFound(_)) => {
            bail!("no target named `{jump}` to jump through; add it first")
        }
        Err(e) => return Err(user_error(e)),
    };
    if path.len() > super::MAX_HOPS {
        bail!(
            "`{alias}` would be reached through more than {} jump hosts",
            super::MAX_HOPS
        );
    }
    Ok(path)
}

/// `sshmode → edge → bastion → web (deploy@10.0.0.5:22)`: the hops from the service to
/// `path[0]`, with each hop's status when it is not approved.
fn describe_path(path: &[Target]) -> String {
    let mut hops = vec!["sshmode".to_string()];
    for t in path.iter().rev() {
        let status = if t.status == Status::Approved {
            String::new()
        } else {
            format!(", {}", t.status.as_str())
        };
        hops.push(format!(
            "{} ({}@{}:{}{status})",
            t.alias, t.user, t.host, t.port
        ));
    }
    hops.join(" → ")
}

pub(super) fn user_error(e: TargetError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

async fn status(
    db: &PgPool,
    alias: &str,
    to: Status,
    actor: &str,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    debug_assert!(to != Status::Approved, "approval goes through `approve`");
    let prev = super::set_status(db, alias, to, actor)
        .await
        .map_err(user_error)?;
    writeln!(
        out,
        "target `{alias}`: {} -> {}",
        prev.as_str(),
        to.as_str()
    )?;
    Ok(0)
}

fn auth_label(t: &Target) -> String {
    match (t.auth, t.has_cert) {
        (super::AuthKind::Key, true) => "key+cert".into(),
        (a, _) => a.as_str().into(),
    }
}

fn show(t: &Target, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out, "alias:           {}", t.alias)?;
    writeln!(out, "host:            {}", t.host)?;
    writeln!(out, "port:            {}", t.port)?;
    writeln!(out, "user:            {}", t.user)?;
    if let Some(j) = &t.jump {
        writeln!(out, "jump host:       {j} (reached as {})", t.destination())?;
    }
    writeln!(out, "status:          {}", t.status.as_str())?;
    writeln!(out, "auth:            {}", auth_label(t))?;
    writeln!(out, "host key policy: {}", t.host_key_policy.as_str())?;
    match &t.host_key {
        Some(k) => writeln!(out, "host key:        {}", k.describe())?,
        None => writeln!(out, "host key:        none recorded yet")?,
    }
    if let Some(d) = &t.description {
        writeln!(out, "description:     {d}")?;
    }
    writeln!(
        out,
        "workspace:       {}",
        t.workspace.as_deref().unwrap_or("~ (the remote home)")
    )?;
    writeln!(out, "max permission:  {}", t.max_permission)?;
    writeln!(out, "added by:        {} at {}", t.added_by, t.created_at)?;
    Ok(())
}

/// Terminal echo switched off on standard input while a secret is typed there; restored on drop.
struct EchoOff(Option<libc::termios>);

impl EchoOff {
    /// Off when standard input is a terminal (with a prompt on stderr); nothing otherwise.
    fn on_terminal_stdin(what: &str) -> EchoOff {
        // SAFETY: isatty, tcgetattr and tcsetattr on fd 0 with a valid termios buffer.
        unsafe {
            if libc::isatty(0) != 1 {
                return EchoOff(None);
            }
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return EchoOff(None);
            }
            let saved = t;
            t.c_lflag &= !libc::ECHO;
            t.c_lflag |= libc::ECHONL;
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                return EchoOff(None);
            }
            eprint!("{what}: ");
            EchoOff(Some(saved))
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            // SAFETY: restores the settings read from fd 0 above.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, saved);
            }
        }
    }
}

/// Largest key, certificate or secret line read: far above any real one (a 16384-bit RSA
/// key is about 12 KiB), and a wrong path such as `/dev/zero` fails instead of filling memory.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Reads a key or certificate file of at most [`MAX_SECRET_BYTES`], as text.
pub(super) fn read_small_file(path: &Path, what: &str) -> anyhow::Result<Zeroizing<String>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    let mut bytes = Zeroizing::new(Vec::new());
    file.take(MAX_SECRET_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    if bytes.len() as u64 > MAX_SECRET_BYTES {
        bail!(
            "the {what} {} is larger than {} KiB: not a key or certificate",
            path.display(),
            MAX_SECRET_BYTES / 1024
        );
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| anyhow::anyhow!("the {what} {} is not text", path.display()))?;
    Ok(Zeroizing::new(text.to_string()))
}

/// Reads one line of standard input without its line ending.
pub(super) fn read_secret_line(
    input: &mut dyn BufRead,
    what: &str,
) -> anyhow::Result<Zeroizing<String>> {
    // Typed at a terminal, the secret is not echoed (restored when `_quiet` drops).
    let _quiet = EchoOff::on_terminal_stdin(what);
    let mut line = Zeroizing::new(String::new());
    (&mut *input)
        .take(MAX_SECRET_BYTES)
        .read_line(&mut line)
        .with_context(|| format!("cannot read the {what} from standard input"))?;
    if line.len() as u64 >= MAX_SECRET_BYTES {
        bail!(
            "the {what} on standard input is longer than {} KiB",
            MAX_SECRET_BYTES / 1024
        );
    }
    let trimmed = Zeroizing::new(line.trim_end_matches(['\n', '\r']).to_string());
    if trimmed.is_empty() {
        bail!("the {what} on standard input is empty");
    }
    Ok(trimmed)
}

fn new_target(args: AddArgs, input: &mut dyn BufRead) -> anyhow::Result<NewTarget> {
    let secrets = if let Some(path) = &args.key {
        let text = read_small_file(path, "key file")?;
        let passphrase = if args.passphrase_stdin {
            Some(read_secret_line(input, "passphrase")?)
        } else {
            None
        };
        let key = decode_key(&text, path, passphrase.as_deref().map(|p| p.as_str()))?;
        let cert = match &args.cert {
            Some(cpath) => Some(read_cert(cpath, &key)?),
            None => None,
        };
        key_secrets(&key, cert)?
    } else if args.password_stdin {
        if args.cert.is_some() {
            bail!("--cert goes with --key");
        }
        NewSecrets::Password(read_secret_line(input, "password")?)
    } else {
        if args.cert.is_some() {
            bail!("--cert goes with --key");
        }
        NewSecrets::Agent
    };
    let pinned = args.host_key.as_deref().map(parse_host_key).transpose()?;
    Ok(NewTarget {
        alias: args.alias,
        host: args.host,
        port: args.port,
        user: args.user,
        description: args.description,
        secrets,
        host_key_policy: match args.host_key_policy {
            HostKeyPolicyArg::Tofu => HostKeyPolicy::Tofu,
            HostKeyPolicyArg::Strict => HostKeyPolicy::Strict,
        },
        host_key: pinned,
        approve: args.approve,
        jump: args.jump,
    })
}

/// A private key (ed25519, ecdsa or rsa) read from `path` as `text`, decrypted with
/// `passphrase` if it is encrypted; an encrypted key without one is an error that says how to
/// give it.
pub(super) fn decode_key(
    text: &str,
    path: &Path,
    passphrase: Option<&str>,
) -> anyhow::Result<russh::keys::PrivateKey> {
    russh::keys::decode_secret_key(text, passphrase).map_err(|e| match e {
        russh::keys::Error::KeyIsEncrypted => anyhow::anyhow!(
            "the key {} is encrypted: pass its passphrase with --passphrase-stdin",
            path.display()
        ),
        _ => anyhow::anyhow!(
            "the key {} could not be read (wrong passphrase, or not an ed25519/ecdsa/rsa private key)",
            path.display()
        ),
    })
}

/// Reads an OpenSSH user certificate and checks it was issued for `key`; its text.
pub(super) fn read_cert(path: &Path, key: &russh::keys::PrivateKey) -> anyhow::Result<String> {
    let ctext = read_small_file(path, "certificate")?;
    let cert = Certificate::from_openssh(ctext.trim())
        .map_err(|_| anyhow::anyhow!("{} is not an OpenSSH certificate", path.display()))?;
    if cert.public_key() != key.public_key().key_data() {
        bail!(
            "the certificate {} was not issued for this key",
            path.display()
        );
    }
    Ok(ctext.trim().to_string())
}

/// A key (and its certificate) as the vault takes it: stored decrypted, then sealed — the
/// passphrase itself is never kept.
pub(super) fn key_secrets(
    key: &russh::keys::PrivateKey,
    cert: Option<String>,
) -> anyhow::Result<NewSecrets> {
    let pem = key
        .to_openssh(russh::keys::ssh_key::LineEnding::LF)
        .map_err(|_| anyhow::anyhow!("the key could not be re-encoded"))?;
    Ok(NewSecrets::Key { key: pem, cert })
}

/// A `SHA256:…` fingerprint, or a key line (`[hosts] type base64 [comment]`, as in
/// `known_hosts` or a `.pub` file).
pub fn parse_host_key(s: &str) -> anyhow::Result<HostKey> {
    let s = s.trim();
    if let Some(b64) = s.strip_prefix("SHA256:") {
        use base64::Engine;
        let ok = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(b64)
            .is_ok_and(|d| d.len() == 32);
        if !ok {
            bail!("`{s}` is not a SHA256 fingerprint as `ssh-keygen -l` prints it");
        }
        return Ok(HostKey {
            fingerprint: s.to_string(),
            algorithm: None,
            source: "pinned".into(),
            at: None,
        });
    }
    let tokens: Vec<&str> = s.split_whitespace().collect();
    for i in 0..tokens.len().min(3) {
        if let Ok(key) = PublicKey::from_openssh(&tokens[i..].join(" ")) {
            return Ok(HostKey {
                fingerprint: key.fingerprint(HashAlg::Sha256).to_string(),
                algorithm: Some(key.algorithm().to_string()),
                source: "pinned".into(),
                at: None,
            });
        }
    }
    bail!("--host-key must be a public key line (`ssh-ed25519 AAAA…`) or a `SHA256:…` fingerprint")
}

async fn test(
    path: &[Target],
    config: &Config,
    db: &PgPool,
    vault: &Vault,
    trust: Option<Trust>,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    let t = &path[0];
    let trusted = trust.is_some();
    if path.len() > 1 {
        writeln!(out, "path: {}", describe_path(path))?;
        for hop in &path[1..] {
            if hop.status != Status::Approved {
                writeln!(
                    out,
                    "note: jump host `{}` is {}: chats cannot use `{}` until it is approved",
                    hop.alias,
                    hop.status.as_str(),
                    t.alias
                )?;
            }
        }
    }
    let endpoints: Vec<_> = path.iter().map(Target::endpoint).collect();
    let (seen, result) = connect::connect_path(
        &endpoints,
        ConnectOptions {
            config: &config.exec,
            registry: &super::registry(db.clone()),
            vault,
            trust,
            actor: &config.operator,
        },
    )
    .await;
    if let Some(fp) = &seen.fingerprint {
        writeln!(
            out,
            "host key: {fp} ({})",
            seen.algorithm.as_deref().unwrap_or("?")
        )?;
    }
    let conn = match result {
        Ok(h) => h,
        Err(e) => {
            writeln!(out, "FAILED: {e}")?;
            return Ok(1);
        }
    };
    let handle = &conn.handle;
    if matches!(
        seen.verdict,
        Some(super::HostKeyVerdict::Recorded | super::HostKeyVerdict::Pinned)
    ) {
        writeln!(
            out,
            "host key {} for `{}`",
            if trusted {
                "pinned"
            } else {
                "recorded (trust on first use)"
            },
            t.alias
        )?;
    }
    match crate::exec::ssh::run_once(handle, &t.alias, "true", config.exec.ssh_connect_timeout)
        .await
    {
        Ok(crate::exec::Exit::Code(0)) => {
            writeln!(
                out,
                "ok: {} authenticated and ran `true`{}",
                t.destination(),
                match path.len() {
                    1 => String::new(),
                    2 => " through its jump host".to_string(),
                    n => format!(" through its {} jump hosts", n - 1),
                }
            )?;
            let files = match crate::exec::ssh::file_path(handle, config.exec.ssh_connect_timeout)
                .await
            {
                crate::exec::ssh::FilePath::Sftp => "files: over SFTP".to_string(),
                crate::exec::ssh::FilePath::Shell => "files: through the shell — the server has no SFTP subsystem (`Subsystem sftp` / sftp-server missing); reads and writes use the exec channel, writes still replace files atomically".to_string(),
            };
            writeln!(out, "{files}")?;
            let _ = handle
                .disconnect(russh::Disconnect::ByApplication, "", "en")
                .await;
            Ok(0)
        }
        Ok(other) => {
            writeln!(out, "FAILED: `true` ended with {other:?}")?;
            Ok(1)
        }
        Err(e) => {
            writeln!(out, "FAILED: {e}")?;
            Ok(1)
        }
    }
}
