//! A section's conversation in Postgres and the context built from it.
//!
//! Every user message, model reply, tool start mark and tool result is appended (through the
//! turn's fence) before the next step. The context sent to the model is the latest summary plus
//! the messages after it, within the token budget: old tool outputs are masked first, then the
//! oldest whole turns are summarised — the summary is stored before they leave the context.
//! Compaction never deletes from the stored log; only retention, a recalled message and an
//! erasure take content out of it, through [`crate::lifecycle`].

use serde_json::Value;
use sqlx::{PgPool, Row};

use crate::llm::Message;
use crate::turns::{Fence, Fenced};

/// Most messages loaded into one context (beyond it the oldest are summarised anyway).
const MAX_LOADED: i64 = 5000;
/// Longest summary kept; older summary text is cut from the front.
const MAX_SUMMARY_BYTES: usize = 8 * 1024;
/// Tool outputs of the latest messages that are never masked.
const KEEP_RECENT_TOOL_OUTPUTS: usize = 2;

/// What a stored row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    User,
    Assistant,
    Tool,
    /// A tool call about to run (not sent to the model; resume uses it).
    ToolStarted,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::User => "user",
            Kind::Assistant => "assistant",
            Kind::Tool => "tool",
            Kind::ToolStarted => "tool_started",
        }
    }

    fn parse(s: &str) -> Kind {
        match s {
            "user" => Kind::User,
            "assistant" => Kind::Assistant,
            "tool" => Kind::Tool,
            _ => Kind::ToolStarted,
        }
    }
}

/// One stored row.
#[derive(Debug, Clone)]
pub struct Stored {
    pub id: i64,
    pub turn_id: i64,
    pub kind: Kind,
    pub call_id: Option<String>,
    pub message: Message,
}

/// Appends a row; refused when the claim is stale.
pub async fn append(
    fence: &Fence,
    turn_id: i64,
    kind: Kind,
    call_id: Option<&str>,
    message: &Message,
) -> Result<i64, Fenced> {
    let value = serde_json::to_value(message).unwrap_or(Value::Null);
    let bytes = value.to_string().len() as i32;
    // One statement: the fence's check (a share lock on the section's row at the claimed
    // generation) and the insert, in one round trip and one commit.
    let id: Option<i64> = sqlx::query_scalar(
        "INSERT INTO agent_messages (section_id, turn_id, kind, call_id, message, bytes)
         SELECT $1, $2, $3, $4, $5, $6
          WHERE EXISTS (SELECT 1 FROM turn_sections
                         WHERE section_id = $1 AND generation = $7 FOR SHARE)
         RETURNING id",
    )
    .bind(fence.section())
    .bind(turn_id)
    .bind(kind.as_str())
    .bind(call_id)
    .bind(&value)
    .bind(bytes)
    .bind(fence.generation())
    .fetch_optional(fence.db())
    .await?;
    id.ok_or(Fenced::Lost)
}

/// A tool call's start mark written in the same commit as another row: the call is about to
/// run, so a resumed turn never runs it again (it is "interrupted, outcome unknown").
#[derive(Debug, Clone, Copy)]
pub enum Mark<'a> {
    /// A call of the row being written (a model reply), by its id in the reply: the mark's key
    /// is `<the reply's row id>:<call id>`, known only once the reply is inserted.
    InThisRow(&'a str),
    /// A call of an earlier reply, by its full key.
    Key(&'a str),
}

/// Whether a commit waits for its WAL flush before returning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// The default: durable when the commit returns.
    Wait,
    /// `synchronous_commit = off` for this transaction only: the commit returns before its WAL
    /// is flushed, so a crash of PostgreSQL itself (not of this service) within about half a
    /// second may lose it. Only for rows whose loss is safe; see `run::store_result`.
    Later,
}

/// The row ids written by [`append_logged`].
#[derive(Debug, Clone, Copy)]
pub struct Appended {
    pub id: i64,
    /// The start mark's row, when one was asked for.
    pub mark: Option<i64>,
}

/// The stored form of a start mark.
pub fn start_mark() -> Message {
    Message {
        role: "tool_started".into(),
        ..Default::default()
    }
}

/// Appends a row, the event-log entry that describes it and optionally a tool call's start
/// mark, in one statement and so one round trip and one commit: the fence's check, the row, the
/// entry and the mark commit together or not at all. Refused, with nothing written, when the
/// claim is stale.
///
/// Entries of one section are ordered by the same advisory lock as
/// [`crate::eventlog::append`], taken inside the statement. The statement's snapshot predates
/// that lock, so when another writer committed an entry while this one waited, the entry's
/// `seq` collides with it (the unique key refuses it and the whole statement rolls back). Then
/// it is written once more the slow way, which cannot collide: a transaction that takes the lock
/// first and runs the statement after it, with a snapshot that sees every earlier entry. A
/// writer that takes the lock first (`eventlog::append`) is never refused by this one.
#[allow(clippy::too_many_arguments)]
pub async fn append_logged(
    fence: &Fence,
    turn_id: i64,
    kind: Kind,
    call_id: Option<&str>,
    message: &Message,
    event: (&str, Value),
    mark: Option<Mark<'_>>,
    flush: Flush,
    audit: Option<&crate::audit::CommandRun>,
) -> Result<Appended, Fenced> {
    let value = serde_json::to_value(message).unwrap_or(Value::Null);
    let bytes = value.to_string().len() as i32;
    let (mark_key, mark_call) = match mark {
        Some(Mark::Key(k)) => (Some(k), None),
        Some(Mark::InThisRow(c)) => (None, Some(c)),
        None => (None, None),
    };
    // The mark's stored form, only when there is a mark.
    let mark_value = mark.map(|_| serde_json::to_value(start_mark()).unwrap_or(Value::Null));
    let mark_bytes = mark_value.as_ref().map(|v| v.to_string().len() as i32);
    let bind = |q: &'static str| {
        sqlx::query_as::<_, (i64, Option<i64>)>(q)
            .bind(fence.section())
            .bind(turn_id)
            .bind(kind.as_str())
            .bind(call_id)
            .bind(&value)
            .bind(bytes)
            .bind(fence.generation())
            .bind(event.0)
            .bind(&event.1)
            .bind(mark_key)
            .bind(mark_call)
            .bind(&mark_value)
            .bind(mark_bytes)
            .bind(flush == Flush::Later)
            .bind(audit.map(|a| a.actor.as_str()))
            .bind(audit.and_then(|a| a.target.as_deref()))
            .bind(audit.map(|a| &a.detail))
            .bind(audit.map(|a| a.outcome.as_str()))
            .bind(audit.map(|a| a.action))
            .bind(audit.and_then(|a| a.at))
    };
    let ids = match bind(APPEND_LOGGED).fetch_optional(fence.db()).await {
        Err(e) if crate::eventlog::seq_taken(&e) => {
            let mut tx = fence.db().begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                .bind(fence.section())
                .execute(&mut *tx)
                .await?;
            let ids = bind(APPEND_LOGGED).fetch_optional(&mut *tx).await?;
            tx.commit().await?;
            ids
        }
        r => r?,
    };
    let (id, mark) = ids.ok_or(Fenced::Lost)?;
    Ok(Appended { id, mark })
}

/// The statement of [`append_logged`]. `l` takes the section's log lock (re-entrant) and, for a
/// `Flush::Later` commit, sets `synchronous_commit` for this transaction only
/// (`set_config(…, true)` is `SET LOCAL`; it is read when the transaction commits). The row is
/// inserted only after `l` and only if the fence holds; the entry, the mark and an executed
/// command's audit row (`a`, when `$15` names an actor; its action `$19`) only if the row was.
const APPEND_LOGGED: &str = "WITH l AS (
       SELECT pg_advisory_xact_lock(hashtextextended($1, 0)),
              CASE WHEN $14 THEN set_config('synchronous_commit', 'off', true) END),
     m AS (
       INSERT INTO agent_messages (section_id, turn_id, kind, call_id, message, bytes)
       SELECT $1, $2, $3, $4, $5, $6 FROM l
        WHERE EXISTS (SELECT 1 FROM turn_sections
                       WHERE section_id = $1 AND generation = $7 FOR SHARE)
       RETURNING id),
     e AS (
       INSERT INTO session_events (section_id, seq, kind, payload)
       SELECT $1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM session_events WHERE section_id = $1),
              $8, $9
         FROM m
       RETURNING seq),
     k AS (
       INSERT INTO agent_messages (section_id, turn_id, kind, call_id, message, bytes)
       SELECT $1, $2, 'tool_started', COALESCE($10, m.id::text || ':' || $11), $12, $13
         FROM m
        WHERE $10::text IS NOT NULL OR $11::text IS NOT NULL
       RETURNING id),
     a AS (
       INSERT INTO audit_log (actor, action, subject, detail, section, target, outcome, at)
       SELECT $15, $19,
              COALESCE($16, CASE WHEN $18 = 'interrupted' THEN 'unknown' ELSE 'local' END),
              $17, $1, $16, $18, COALESCE($20::timestamptz, now())
         FROM m
        WHERE $15::text IS NOT NULL)
     SELECT m.id, (SELECT id FROM k) FROM m, e";

fn row_to_stored(r: sqlx::postgres::PgRow) -> sqlx::Result<Stored> {
    let value: Value = r.try_get("message")?;
    Ok(Stored {
        id: r.try_get("id")?,
        turn_id: r.try_get("turn_id")?,
        kind: Kind::parse(r.try_get::<String, _>("kind")?.as_str()),
        call_id: r.try_get("call_id")?,
        message: serde_json::from_value(value).unwrap_or_default(),
    })
}

/// Every row of one turn, in order (for resume).
pub async fn of_turn(db: &PgPool, turn_id: i64) -> sqlx::Result<Vec<Stored>> {
    sqlx::query(
        "SELECT id, turn_id, kind, call_id, message FROM agent_messages
          WHERE turn_id = $1 ORDER BY id",
    )
    .bind(turn_id)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(row_to_stored)
    .collect()
}

/// Estimated tokens of a text: bytes / 4, scaled by what the provider last reported.
fn tokens(bytes: usize, scale: f64) -> usize {
    ((bytes as f64 / 4.0) * scale).ceil() as usize
}

fn message_bytes(m: &Message) -> usize {
    serde_json::to_string(m).map(|s| s.len()).unwrap_or(0)
}

/// The section's conversation as the context sees it: the latest summary and the rows after it.
/// Loaded from the database once per run of a turn, then extended with the rows this runner
/// stores itself — while it holds the fence nobody else writes the section's rows or summaries.
#[derive(Debug, Default)]
pub struct Loaded {
    state: Option<LoadedState>,
}

#[derive(Debug)]
struct LoadedState {
    summary: String,
    rows: Vec<Stored>,
    /// The highest row id taken in (loaded or added).
    last: i64,
}

impl Loaded {
    async fn refresh(&mut self, fence: &Fence, fresh: &[Stored]) -> Result<(), Fenced> {
        if let Some(st) = &mut self.state {
            for r in fresh
                .iter()
                .filter(|r| r.id > st.last && r.kind != Kind::ToolStarted)
            {
                st.rows.push(r.clone());
            }
            st.last = fresh.iter().map(|r| r.id).max().unwrap_or(0).max(st.last);
            return Ok(());
        }
        let db = fence.db();
        let section = fence.section();
        let (through, summary): (i64, String) = sqlx::query_as(
            "SELECT through_id, summary FROM agent_summaries WHERE section_id = $1
              ORDER BY through_id DESC LIMIT 1",
        )
        .bind(section)
        .fetch_optional(db)
        .await?
        .unwrap_or((0, String::new()));
        let rows: Vec<Stored> = sqlx::query(
            "SELECT * FROM (SELECT id, turn_id, kind, call_id, message FROM agent_messages
                              WHERE section_id = $1 AND id > $2 AND kind <> 'tool_started'
                              ORDER BY id DESC LIMIT $3) r ORDER BY id",
        )
        .bind(section)
        .bind(through)
        .bind(MAX_LOADED)
        .fetch_all(db)
        .await?
        .into_iter()
        .map(row_to_stored)
        .collect::<sqlx::Result<_>>()?;
        // The current turn's rows as this run holds them: a person's message as written, where
        // the stored row keeps it masked.
        let rows: Vec<Stored> = rows
            .into_iter()
            .map(|r| fresh.iter().find(|f| f.id == r.id).cloned().unwrap_or(r))
            .collect();
        let last = rows
            .iter()
            .map(|r| r.id)
            .chain(fresh.iter().map(|r| r.id))
            .max()
            .unwrap_or(through);
        self.state = Some(LoadedState {
            summary,
            rows,
            last,
        });
        Ok(())
    }
}

/// What is sent to the model for one step.
pub struct Context {
    pub messages: Vec<Message>,
    /// Their size as JSON, the basis of the bytes/4 token estimate.
    pub bytes: usize,
}

/// The context: `system`, the stored summary, and the conversation after it, within
/// `budget` tokens. `scale` corrects the bytes/4 estimate when the provider reports usage.
/// `loaded` carries the conversation across the steps of one run; `fresh` are the rows of the
/// current turn stored so far (those not yet in `loaded` are added). Each row is measured once
/// per call, so fitting a long conversation costs time in proportion to its length.
pub async fn context(
    fence: &Fence,
    loaded: &mut Loaded,
    fresh: &[Stored],
    system: &str,
    budget: usize,
    scale: f64,
    current_turn: i64,
) -> Result<Context, Fenced> {
    let section = fence.section();
    loaded.refresh(fence, fresh).await?;
    let st = loaded.state.as_mut().expect("loaded above");
    let mut summary = st.summary.clone();
    // Masking below changes only what is sent this time, never what is kept.
    let mut rows = st.rows.clone();
    // Each row's size in bytes, and the sum of their token estimates, kept up to date as rows
    // are masked or cut.
    let mut sizes: Vec<usize> = rows.iter().map(|r| message_bytes(&r.message)).collect();
    let mut sum: usize = sizes.iter().map(|b| tokens(*b, scale)).sum();
    let fixed = tokens(system.len(), scale) + tokens(summary.len(), scale);

    // 1. Mask old tool outputs, oldest first, keeping the latest few.
    if fixed + sum > budget {
        let tool_idx: Vec<usize> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.kind == Kind::Tool)
            .map(|(i, _)| i)
            .collect();
        let maskable = tool_idx.len().saturating_sub(KEEP_RECENT_TOOL_OUTPUTS);
        for &i in &tool_idx[..maskable] {
            if fixed + sum <= budget {
                break;
            }
            let text = rows[i].message.text_content();
            if text.len() > 200 {
                let id = rows[i].message.tool_call_id.clone().unwrap_or_default();
                rows[i].message = Message::tool(
                    id,
                    format!(
                        "[output of {} bytes masked to save context; run the tool again if you need it]",
                        text.len()
                    ),
                );
                let masked = message_bytes(&rows[i].message);
                sum = sum - tokens(sizes[i], scale) + tokens(masked, scale);
                sizes[i] = masked;
            }
        }
    }

    // 2. Summarise the oldest whole turns (never the current one) until the rest fits.
    if fixed + sum > budget {
        let mut cut = 0;
        let mut rest = sum;
        while cut < rows.len() && rows[cut].turn_id != current_turn && fixed + rest > budget {
            let turn = rows[cut].turn_id;
            while cut < rows.len() && rows[cut].turn_id == turn {
                rest -= tokens(sizes[cut], scale);
                cut += 1;
            }
        }
        if cut > 0 {
            summary = summarise(&summary, &rows[..cut]);
            let through = rows[cut - 1].id;
            let mut tx = fence.begin().await?;
            sqlx::query(
                "INSERT INTO agent_summaries (section_id, through_id, summary) VALUES ($1, $2, $3)",
            )
            .bind(section)
            .bind(through)
            .bind(&summary)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            rows.drain(..cut);
            sizes.drain(..cut);
            st.rows.drain(..cut);
            st.summary = summary.clone();
        }
    }

    let mut messages = Vec::with_capacity(rows.len() + 2);
    messages.push(Message::system(system));
    if !summary.is_empty() {
        messages.push(Message::system(format!(
            "Summary of the earlier conversation in this thread:\n{summary}"
        )));
    }
    let bytes = messages.iter().map(message_bytes).sum::<usize>() + sizes.iter().sum::<usize>();
    messages.extend(rows.into_iter().map(|r| r.message));
    Ok(Context { messages, bytes })
}

/// An extractive summary of `rows` (whole turns) appended to `previous`: what was asked, which
/// tools ran, what was answered. Bounded to [`MAX_SUMMARY_BYTES`], oldest text cut first.
fn summarise(previous: &str, rows: &[Stored]) -> String {
    let mut s = previous.to_string();
    let mut turn = None;
    let mut tools: Vec<String> = Vec::new();
    let flush_tools = |s: &mut String, tools: &mut Vec<String>| {
        if !tools.is_empty() {
            s.push_str(&format!("- tools used: {}\n", tools.join(", ")));
            tools.clear();
        }
    };
    for r in rows {
        if turn != Some(r.turn_id) {
            flush_tools(&mut s, &mut tools);
            turn = Some(r.turn_id);
        }
        match r.kind {
            Kind::User => s.push_str(&format!(
                "- user: {}\n",
                clip(&r.message.text_content(), 300)
            )),
            Kind::Assistant => {
                for c in &r.message.tool_calls {
                    tools.push(format!(
                        "{}({})",
                        c.function.name,
                        clip(&c.function.arguments, 80)
                    ));
                }
                let text = r.message.text_content();
                if r.message.tool_calls.is_empty() && !text.trim().is_empty() {
                    flush_tools(&mut s, &mut tools);
                    s.push_str(&format!("- you answered: {}\n", clip(&text, 400)));
                }
            }
            _ => {}
        }
    }
    flush_tools(&mut s, &mut tools);
    if s.len() > MAX_SUMMARY_BYTES {
        let mut start = s.len() - MAX_SUMMARY_BYTES;
        while !s.is_char_boundary(start) {
            start += 1;
        }
        s = format!("(older part omitted)\n{}", &s[start..]);
    }
    s
}

pub use crate::gate::clip;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_requests_tools_and_answers_and_is_bounded() {
        let mut call = crate::llm::ToolCall::default();
        call.function.name = "terminal".into();
        call.function.arguments = r#"{"command":"ls"}"#.into();
        let rows = vec![
            Stored {
                id: 1,
                turn_id: 7,
                kind: Kind::User,
                call_id: None,
                message: Message::user("list files"),
            },
            Stored {
                id: 2,
                turn_id: 7,
                kind: Kind::Assistant,
                call_id: None,
                message: Message {
                    role: "assistant".into(),
                    tool_calls: vec![call],
                    ..Default::default()
                },
            },
            Stored {
                id: 3,
                turn_id: 7,
                kind: Kind::Assistant,
                call_id: None,
                message: Message {
                    role: "assistant".into(),
                    content: Some(crate::llm::wire::Content::Text("two files".into())),
                    ..Default::default()
                },
            },
        ];
        let s = summarise("", &rows);
        assert!(s.contains("user: list files"), "{s}");
        assert!(s.contains("terminal("), "{s}");
        assert!(s.contains("you answered: two files"), "{s}");
        let long = summarise(&"x".repeat(20_000), &rows);
        assert!(long.len() <= MAX_SUMMARY_BYTES + 40);
        assert!(long.contains("you answered"));
    }
}
