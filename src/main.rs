//! The `sshmode` command line. Parses arguments and calls into the library; no logic here.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sshmode::config::Config;
use tokio_util::sync::CancellationToken;

#[cfg(test)]
mod ops_cli_help;

#[derive(Debug, Parser)]
#[command(
    name = "sshmode",
    version,
    about = "An AI agent for Feishu/Lark chats whose work runs locally or on approved SSH targets",
    after_help = "Examples:\n  sshmode doctor                 # check the deployment first\n  sshmode chat                   # a terminal chat, no Lark needed\n  sshmode serve                  # the service\n  sshmode target add --help      # every command explains itself"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the service: HTTP server (webhooks, health, metrics, router status) and workers.
    #[command(
        after_help = "Examples:\n  sshmode serve                          # settings from .env and the environment\n  SSHMODE_LISTEN=0.0.0.0:8080 sshmode serve"
    )]
    Serve,
    /// Apply the database migrations and exit.
    #[command(
        after_help = "Examples:\n  sshmode migrate                        # before a rollout of several replicas"
    )]
    Migrate,
    /// Manage SSH targets.
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode target add web --host web.example.com --user deploy --key ~/.ssh/id_ed25519 --approve\n  sshmode target list\n  sshmode target test web"
    )]
    Target(sshmode::target::cli::TargetCmd),
    /// Skills: list them with their scope, show one, promote one to every chat.
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode skill list\n  sshmode skill show deploy-checklist\n  sshmode skill promote deploy-checklist"
    )]
    Skill(sshmode::plane::cli::SkillCmd),
    /// A terminal chat that is one local section, with the slash commands and the agent.
    /// Needs no Lark settings; with piped input it handles each line in order and exits.
    #[command(
        after_help = "Examples:\n  sshmode chat                           # a new section, named after the time\n  sshmode chat --section ops             # resume console:ops\n  echo '/ssh status' | sshmode chat      # one line, then exit"
    )]
    Chat {
        /// Resume the section `console:NAME` (default: a new section named after the time).
        #[arg(long, value_name = "NAME")]
        section: Option<String>,
    },
    /// The audit trail: every executed command, binding, grant, refusal and target change.
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode audit list --since 24h --target prod\n  sshmode audit export --since 7d > audit.jsonl"
    )]
    Audit(sshmode::audit::cli::AuditCmd),
    /// Check the deployment: config, database, isolation, Lark, the model, every target. One
    /// line per check with advice; exits 1 when anything failed.
    #[command(
        after_help = "Examples:\n  sshmode doctor\n  sshmode doctor --url https://bot.example.com/lark/events\n  sshmode doctor --json"
    )]
    Doctor {
        /// The public event URL (`https://…/lark/events`): send it a signed url_verification.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The vault of target secrets.
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode vault rotate-key               # with every `serve` stopped"
    )]
    Vault(VaultCmd),
    /// The model router: each entry's state, and re-enabling one disabled after its key was
    /// rejected.
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode router status\n  sshmode router enable openai/gpt-4o-mini"
    )]
    Router(sshmode::llm::cli::RouterCmd),
    /// Session event logs.
    #[command(
        name = "session-log",
        subcommand,
        after_help = "Examples:\n  sshmode session-log export omt_xxx > section.jsonl"
    )]
    SessionLog(SessionLogCmd),
    /// The command guard: `check` prints the verdict on each command read.
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode guard check --file commands.txt\n  echo 'rm -rf /tmp/x' | sshmode guard check --permission read"
    )]
    Guard(sshmode::workspace::cli::GuardCmd),
    /// Every chat's schedules (`/cron` in a chat adds them): list, pause, resume, remove.
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode schedule list\n  sshmode schedule pause 12"
    )]
    Schedule(sshmode::schedule::cli::ScheduleCmd),
    /// The MCP endpoint (`SSHMODE_MCP_LISTEN`): `token create|list|revoke`.
    #[command(
        subcommand,
        after_help = "Examples:\n  sshmode mcp token create --name laptop --targets web,db\n  sshmode mcp token list"
    )]
    Mcp(sshmode::mcp::cli::McpCmd),
    /// Remove a chat's or a person's content — messages' text, attachments, transcripts, event
    /// logs, notes, workspaces — keeping the audit facts; prints what it removed (audited).
    #[command(
        after_help = "Examples:\n  sshmode erase --chat oc_xxx            # a chat that left, or asked to be forgotten\n  sshmode erase --person ou_xxx          # a person who left the company"
    )]
    Erase(sshmode::lifecycle::cli::EraseArgs),
}

#[derive(Debug, Subcommand)]
enum VaultCmd {
    /// A new master key: every target's secrets and the vault's canary re-sealed with it in
    /// one transaction (audited); the previous key is kept beside it as `<key>.old`. Refused
    /// while `serve` or `chat` runs on the database (a live heartbeat): stop them first.
    #[command(
        after_help = "Examples:\n  sshmode vault rotate-key               # with every `serve` stopped; then back up the new key\n  sshmode vault rotate-key --force       # while it runs; restart every replica right after"
    )]
    RotateKey {
        /// Rotate even while the service runs; restart every replica right after (until then
        /// it cannot open any target's secret).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SessionLogCmd {
    /// Write a section's event log as JSONL to standard output.
    #[command(
        after_help = "Examples:\n  sshmode session-log export omt_xxx > section.jsonl\n  sshmode session-log export console:ops | head"
    )]
    Export {
        /// The section id: a thread id (`omt_…`) or a chat id (`oc_…`).
        section: String,
    },
}

fn main() -> ExitCode {
    // The launcher of local commands: before anything else, while this is one thread.
    sshmode::exec::local::launch::main_if_launcher();
    let cli = Cli::parse();
    // `doctor` reports a broken configuration as one of its checks, and runs the others.
    if let Cmd::Doctor { url, json } = &cli.cmd {
        let (config, errors) = Config::load_lenient();
        let opts = sshmode::app::doctor::Options {
            url: url.clone(),
            config_errors: errors
                .iter()
                .map(|e| (e.variable(), one_line(&e.to_string())))
                .collect(),
        };
        return doctor(config, &opts, *json);
    }
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "sshmode: configuration error: {} (see .env.example for every variable)",
                one_line(&e.to_string())
            );
            return ExitCode::from(2);
        }
    };
    // `serve` logs at `info`; the console is a conversation on the terminal and the one-shot
    // commands print their own result, so for them routine lines (the embedded cluster's start
    // and stop, sqlx notices) would only be noise: `warn`, unless RUST_LOG says otherwise.
    let filter = match &cli.cmd {
        Cmd::Serve => config.log_filter.as_str(),
        _ if config.log_filter_set => config.log_filter.as_str(),
        _ => "warn",
    };
    sshmode::telemetry::init(
        config.log_format,
        filter,
        config.log_file.as_ref(),
        config.no_color,
    );
    tracing::debug!(data_dir = %config.data_dir.display(), master_key_file = %config.master_key_file.display(), "paths resolved");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sshmode: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.cmd, config)) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("sshmode: {}", one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// `sshmode doctor`: every check, on whatever configuration could be loaded.
fn doctor(config: Option<Config>, opts: &sshmode::app::doctor::Options, json: bool) -> ExitCode {
    if let Some(c) = &config {
        sshmode::telemetry::init(
            c.log_format,
            if c.log_filter_set {
                c.log_filter.as_str()
            } else {
                "warn"
            },
            c.log_file.as_ref(),
            c.no_color,
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sshmode: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let checks = runtime.block_on(sshmode::app::doctor::run(config, opts));
    let stdout = std::io::stdout();
    if let Err(e) = sshmode::app::doctor::print(&checks, json, &mut stdout.lock()) {
        eprintln!("sshmode: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::from(sshmode::app::doctor::exit_code(&checks) as u8)
}

/// An error as one line on stderr (its causes joined by `: ` already).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn run(cmd: Cmd, config: Config) -> anyhow::Result<i32> {
    match cmd {
        Cmd::Serve => {
            let lark = config.require_serve()?;
            if lark.encrypt_key.is_none() {
                tracing::warn!(
                    "SSHMODE_ALLOW_UNSIGNED_EVENTS=true and no LARK_ENCRYPT_KEY: callbacks are \
                     not signed, and anyone who sees one callback body can forge events; set \
                     an Encrypt Key in the Lark developer console for any real deployment"
                );
            }
            tracing::info!(
                data_dir = %config.data_dir.display(),
                master_key_file = %config.master_key_file.display(),
                database = if config.database_url.is_some() { "DATABASE_URL" } else { "embedded" },
                "starting"
            );
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("cannot listen on {} (SSHMODE_LISTEN): {e}", config.listen)
                })?;
            let shutdown = CancellationToken::new();
            let app = sshmode::app::App::build(config, listener, shutdown.clone()).await?;
            tokio::spawn(async move {
                sshmode::app::shutdown_signal().await;
                tracing::info!("shutdown requested");
                shutdown.cancel();
            });
            app.run().await?;
            Ok(0)
        }
        Cmd::Migrate => {
            let store = sshmode::store::Store::open(&config).await?;
            store.close().await;
            println!("migrations applied");
            Ok(0)
        }
        Cmd::Target(cmd) if cmd.json() => sshmode::target::cli::run_json(cmd, &config).await,
        Cmd::Target(cmd) => sshmode::target::cli::run(cmd, &config).await,
        Cmd::Skill(cmd) if cmd.json() => sshmode::plane::cli::run_json(cmd, &config).await,
        Cmd::Skill(cmd) => sshmode::plane::cli::run(cmd, &config).await,
        Cmd::Audit(cmd) => sshmode::audit::cli::run(cmd, &config).await,
        Cmd::Router(cmd) => sshmode::llm::cli::run(cmd, &config).await,
        Cmd::Schedule(cmd) => sshmode::schedule::cli::run(cmd, &config).await,
        Cmd::Vault(VaultCmd::RotateKey { force }) => {
            sshmode::target::cli::rotate_key(&config, force).await
        }
        Cmd::Doctor { .. } => unreachable!("doctor runs before the configuration is required"),
        Cmd::Chat { section } => sshmode::app::console::run(config, section).await,
        Cmd::Guard(cmd) => sshmode::workspace::cli::run(cmd, &config),
        Cmd::Mcp(cmd) => sshmode::mcp::cli::run(cmd, &config).await,
        Cmd::Erase(args) => sshmode::lifecycle::cli::run(args, &config).await,
        Cmd::SessionLog(SessionLogCmd::Export { section }) => {
            let store = sshmode::store::Store::open(&config).await?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            let result = sshmode::eventlog::export_jsonl(&store.pool, &section, &mut out).await;
            drop(out);
            store.close().await;
            result?;
            Ok(0)
        }
    }
}
