//! `sshmode audit …`: `list` (the latest rows, a table or `--json`) and `export` (every
//! matching row as JSONL), both filtered by age, target, section, actor and kind.

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use sqlx::PgPool;

use super::{Filter, Row};
use crate::config::Config;

/// `sshmode audit …`
#[derive(Debug, Subcommand)]
pub enum AuditCmd {
    /// The latest audit rows, oldest first: executed commands, bindings, grants, refusals,
    /// target changes.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many rows (the latest).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        limit: i64,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Every matching audit row as JSONL on standard output, oldest first.
    Export {
        #[command(flatten)]
        filter: FilterArgs,
    },
}

/// The filters both subcommands take.
#[derive(Debug, Args)]
pub struct FilterArgs {
    /// Only rows of the last DUR: `90s`, `30m`, `24h`, `7d`.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// Only rows about this target alias.
    #[arg(long, value_name = "T")]
    pub target: Option<String>,
    /// Only rows of this section (a thread id `omt_…`, a chat id `oc_…`, `console:…`).
    #[arg(long, value_name = "S")]
    pub section: Option<String>,
    /// Only rows by this actor (an open_id, `cli`, `model`, `system`).
    #[arg(long, value_name = "A")]
    pub actor: Option<String>,
    /// Only this kind of row: an action (`command.run`) or its family (`binding`).
    #[arg(long, value_name = "K")]
    pub kind: Option<String>,
}

impl FilterArgs {
    fn filter(self) -> anyhow::Result<Filter> {
        let since = match self.since {
            None => None,
            Some(d) => {
                let d = chrono::Duration::from_std(d).context("--since is too long")?;
                Some(chrono::Utc::now() - d)
            }
        };
        Ok(Filter {
            since,
            target: self.target,
            section: self.section,
            actor: self.actor,
            kind: self.kind,
        })
    }
}

/// Parses `90s`, `30m`, `24h`, `7d` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 30m, 24h or 7d"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("`{s}`: the unit is one of s, m, h, d, w")),
    };
    n.checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{s}` is too long"))
}

/// Runs an `audit` subcommand on the configured database.
pub async fn run(cmd: AuditCmd, config: &Config) -> anyhow::Result<i32> {
    let store = crate::store::Store::open(config).await?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = run_with(cmd, &store.pool, &mut out).await;
    drop(out);
    store.close().await;
    result
}

/// [`run`] on a given database and output.
pub async fn run_with(cmd: AuditCmd, db: &PgPool, out: &mut dyn Write) -> anyhow::Result<i32> {
    match cmd {
        AuditCmd::List {
            filter,
            limit,
            json,
        } => {
            let rows = super::list(db, &filter.filter()?, limit).await?;
            if json {
                serde_json::to_writer_pretty(&mut *out, &rows)?;
                writeln!(out)?;
            } else {
                table(&rows, out)?;
            }
        }
        AuditCmd::Export { filter } => {
            super::export_jsonl(db, &filter.filter()?, out).await?;
        }
    }
    out.flush()?;
    Ok(0)
}

/// One line per row under a header: when, who, what kind, where, how it ended, and what
/// (the command of an executed command, else the subject).
fn table(rows: &[Row], out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "AT\tACTOR\tKIND\tTARGET\tSECTION\tOUTCOME\tWHAT")?;
    for r in rows {
        let what = match r.detail.get("command").and_then(|c| c.as_str()) {
            Some(c) => {
                let ms = r
                    .detail
                    .get("duration_ms")
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0);
                format!("{} ({ms} ms)", c.replace('\n', "⏎"))
            }
            None => r.subject.clone(),
        };
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            r.at.format("%Y-%m-%d %H:%M:%S"),
            r.actor,
            r.kind,
            r.target.as_deref().unwrap_or("-"),
            r.section.as_deref().unwrap_or("-"),
            r.outcome.as_deref().unwrap_or("-"),
            what
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_read_as_an_operator_writes_them() {
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("3y").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
