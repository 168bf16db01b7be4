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
    #[command(after_help = "Examples:\n  \
        sshmode audit list --since 24h --target prod            # what ran on prod since yesterday\n  \
        sshmode audit list --kind command --actor ou_xxx --json # one person's commands, as JSON")]
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
    #[command(after_help = "Examples:\n  \
        sshmode audit export --since 7d > audit.jsonl\n  \
        sshmode audit export --kind target | head -1")]
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
    /// Only rows by this actor: an open_id, `cli` (every `cli:<user>`) or `cli:<user>`, `model`,
    /// `system`, an MCP token's name.
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
        if let Some(k) = self.kind.as_deref().filter(|k| !super::is_kind(k)) {
            anyhow::bail!(
                "--kind `{}` is no kind of audit row; kinds are an action such as `command.run` \
                 or one of the families: {}",
                printable(k),
                super::families().join(", ")
            );
        }
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
    match result {
        // A reader that has read enough (`audit export | head -1`) is no failure.
        Err(e) if closed_pipe(&e) => Ok(0),
        r => r,
    }
}

/// Whether `e` comes of writing to a pipe whose reader has gone.
fn closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        let kind = c
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| c.downcast_ref::<serde_json::Error>()?.io_error_kind());
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
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
/// (the command of an executed command, else the subject). Every field is made [`printable`]:
/// what a command or a chat put in a row cannot move the operator's cursor, retitle the
/// terminal, split a row or forge one. `--json` and `export` stay exact.
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
                format!("{} ({ms} ms)", printable(c))
            }
            None => printable(&r.subject),
        };
        let field = |f: Option<&str>| f.map_or_else(|| "-".to_string(), printable);
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            r.at.format("%Y-%m-%d %H:%M:%S"),
            printable(&r.actor),
            printable(&r.kind),
            field(r.target.as_deref()),
            field(r.section.as_deref()),
            field(r.outcome.as_deref()),
            what
        )?;
    }
    Ok(())
}

/// `s` on one line of a tab-separated table, every character visible: a newline as `⏎`, tab,
/// carriage return and escape as `\t`, `\r`, `\e`, a backslash doubled, every other control
/// character (C0, DEL, C1) and every bidirectional override or isolate as `\u{…}` — so a row
/// shows what was stored, and nothing in it acts on the terminal.
pub(crate) fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push('⏎'),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control()
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, printable, table};
    use std::time::Duration;

    /// What a command put in a row — escapes that retitle the terminal, erase columns or move
    /// the cursor, a bell, carriage returns and tabs that would forge a row or a column,
    /// bidirectional overrides — is shown, never acted on: each row is one line of seven
    /// columns with no control character in it.
    #[test]
    fn table_rows_are_printable_whatever_a_command_held() {
        let attacks = [
            "ls\u{1b}]0;owned\u{7}",
            "true\u{1b}[2K\u{1b}[1A\r2026-01-01 00:00:00\tcli\tcommand.run\t-\t-\tok\trm -rf /",
            "echo \u{9b}31m red \u{7f} \u{0} \u{202e}txt.exe",
            "a\nb\\e",
        ];
        let rows: Vec<super::Row> = attacks
            .iter()
            .enumerate()
            .map(|(i, c)| super::Row {
                id: i as i64,
                at: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
                actor: "ou_\u{1b}[31mx".into(),
                kind: "command.run".into(),
                subject: (*c).into(),
                section: Some("omt_\t1".into()),
                target: Some("web\r".into()),
                outcome: Some("ok".into()),
                detail: serde_json::json!({"command": c, "duration_ms": 3}),
            })
            .collect();
        let mut out = Vec::new();
        table(&rows, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + attacks.len(), "{text}");
        for line in &lines[1..] {
            assert_eq!(line.split('\t').count(), 7, "{line}");
            assert!(
                !line.chars().any(|c| c.is_control() && c != '\t'),
                "{line:?}"
            );
            assert!(!line.contains('\u{202e}'), "{line:?}");
        }
        // What was stored can still be read off the row.
        assert!(lines[1].contains("ls\\e]0;owned\\u{7}"), "{}", lines[1]);
        assert!(
            lines[2].contains("\\r2026-01-01 00:00:00\\tcli"),
            "{}",
            lines[2]
        );
        assert_eq!(printable("a\\e"), "a\\\\e");
        assert_ne!(printable("\\e"), printable("\u{1b}"));
    }

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
