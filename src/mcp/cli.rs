//! `sshmode mcp token create|list|revoke`: the MCP endpoint's bearer tokens, by an operator.

use std::io::Write;
use std::time::Duration;

use clap::{ArgGroup, Subcommand};
use sqlx::PgPool;

use super::token::{self, NewToken};
use crate::config::Config;
use crate::workspace::Permission;

/// `sshmode mcp …`
#[derive(Debug, Subcommand)]
pub enum McpCmd {
    /// Bearer tokens of the MCP endpoint (`SSHMODE_MCP_LISTEN`).
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode mcp token create --name laptop --targets web,db --expires 30d\n  sshmode mcp token list\n  sshmode mcp token revoke laptop"
    )]
    Token(TokenCmd),
}

/// `sshmode mcp token …`
#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Creates a token and prints it once (only its hash is kept).
    #[command(
        group(ArgGroup::new("which").args(["targets", "all"])),
        after_help = "Examples:\n  \
            sshmode mcp token create --name laptop --targets web,db --expires 30d\n  \
            sshmode mcp token create --name ci --all --permission read\n  \
            sshmode mcp token create --name ide --local --permission read-write"
    )]
    Create {
        /// The token's name: the actor in the audit trail; its calls work in section `mcp:NAME`.
        #[arg(long)]
        name: String,
        /// The targets it may use, comma-separated (each must also be approved when used).
        #[arg(long, value_delimiter = ',', value_name = "A,B")]
        targets: Vec<String>,
        /// Every target (approved ones, when used).
        #[arg(long)]
        all: bool,
        /// `local` (the service's own machine) is a target for it too.
        #[arg(long)]
        local: bool,
        /// The workspace permission of its calls (the default where its section chose no
        /// workspace, and the highest where it did): read, read-write or full.
        #[arg(long, default_value = "read-write", value_parser = parse_permission)]
        permission: Permission,
        /// It stops working after DUR: `90s`, `30m`, `24h`, `30d`.
        #[arg(long, value_name = "DUR", value_parser = crate::audit::cli::parse_duration)]
        expires: Option<Duration>,
    },
    /// The tokens: name, targets, permission, expiry (never the token).
    #[command(after_help = "Examples:\n  sshmode mcp token list\n  sshmode mcp token list --json")]
    List {
        /// A JSON array of the tokens (never the token itself) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revokes a token: its next request is refused, and the serving process closes its shells
    /// (both within 2 s). A token created again under the name is a new token: it sees none of
    /// the old one's shells.
    #[command(after_help = "Examples:\n  sshmode mcp token revoke laptop")]
    Revoke {
        /// The token's name, as `sshmode mcp token list` prints it.
        name: String,
    },
}

fn parse_permission(s: &str) -> Result<Permission, String> {
    Permission::parse(s).ok_or_else(|| "use read, read-write or full".into())
}

/// Runs `cmd` against the configured database.
pub async fn run(cmd: McpCmd, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let stdout = std::io::stdout();
    let result = run_with(cmd, &store.pool, &config.operator, &mut stdout.lock()).await;
    store.close().await;
    result
}

/// Runs `cmd` on `db`, writing to `out` and auditing as `actor`; the exit code.
pub async fn run_with(
    cmd: McpCmd,
    db: &PgPool,
    actor: &str,
    out: &mut dyn Write,
) -> anyhow::Result<i32> {
    let McpCmd::Token(cmd) = cmd;
    match cmd {
        TokenCmd::Create {
            name,
            targets,
            all,
            local,
            permission,
            expires,
        } => {
            let expires_at = match expires {
                Some(d) => Some(chrono::Utc::now() + chrono::Duration::from_std(d)?),
                None => None,
            };
            let new = NewToken {
                name,
                targets,
                all_targets: all,
                local,
                permission,
                expires_at,
            };
            let t = token::create(db, &new, actor).await?;
            writeln!(out, "{t}")?;
            writeln!(
                out,
                "# token `{}` created; it is shown only now. Send it as `Authorization: Bearer <token>`.",
                new.name
            )?;
            Ok(0)
        }
        TokenCmd::List { json } => {
            let tokens = token::list(db).await?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&tokens)?)?;
                return Ok(0);
            }
            if tokens.is_empty() {
                writeln!(out, "no MCP tokens (`sshmode mcp token create --name N …`)")?;
            }
            for t in tokens {
                let mut targets = if t.all_targets {
                    vec!["(all)".to_string()]
                } else {
                    t.targets.clone()
                };
                if t.local {
                    targets.push("local".into());
                }
                let expires = match t.expires_at {
                    Some(at) => format!("expires {}", at.format("%Y-%m-%d %H:%M UTC")),
                    None => "no expiry".into(),
                };
                writeln!(
                    out,
                    "{}\ttargets: {}\tpermission: {}\t{expires}",
                    t.name,
                    if targets.is_empty() {
                        "(none)".to_string()
                    } else {
                        targets.join(",")
                    },
                    t.permission
                )?;
            }
            Ok(0)
        }
        TokenCmd::Revoke { name } => {
            if token::revoke(db, &name, actor).await? {
                writeln!(out, "token `{name}` revoked")?;
                Ok(0)
            } else {
                writeln!(out, "no token named `{name}`")?;
                Ok(1)
            }
        }
    }
}
