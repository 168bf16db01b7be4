//! `sshmode target …`: add, list, show, approve, disable, remove, test.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use crate::config::Config;

/// `sshmode target …`
#[derive(Debug, Subcommand)]
pub enum TargetCmd {
    /// Register an SSH target; key, certificate and password are imported into the vault now.
    Add(AddArgs),
    /// List targets (never secrets or key paths).
    List,
    /// Show one target (never secrets or key paths).
    Show { alias: String },
    /// Approve a pending target so chats may use it.
    Approve { alias: String },
    /// Disable a target: no new commands run on it.
    Disable { alias: String },
    /// Remove a target and its vaulted secrets.
    Remove { alias: String },
    /// Connect, check the host key, run `true`; print the host key fingerprint.
    Test {
        alias: String,
        /// Pin the presented host key (for `strict` targets).
        #[arg(long)]
        trust: bool,
    },
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
    #[arg(long)]
    pub host: String,
    #[arg(long, default_value_t = 22)]
    pub port: u16,
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
    #[arg(long)]
    pub description: Option<String>,
    #[arg(long, value_enum, default_value_t = HostKeyPolicyArg::Tofu)]
    pub host_key_policy: HostKeyPolicyArg,
    /// Pin this host key: a `known_hosts`-style key line or a `SHA256:…` fingerprint.
    #[arg(long)]
    pub host_key: Option<String>,
    /// Added by an operator: usable at once.
    #[arg(long)]
    pub approve: bool,
}

/// Runs a target command; returns the process exit code.
pub async fn run(cmd: TargetCmd, config: &Config) -> anyhow::Result<i32> {
    let _ = (cmd, config);
    anyhow::bail!("target commands are not available in this build yet")
}
