//! The threads the bot takes part in: the ones it opened with `/ssh use` and the ones it has
//! answered in; and the one-to-one chats it was asked something in. Any message in such a thread starts a turn, mention or not. This only records
//! and answers "is the bot in this thread"; it never decides what a message means.

use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};

/// How the bot came into a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The bot opened it (the answer to `/ssh use` in a parent chat).
    Opened,
    /// The bot answered a message in it.
    Answered,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::Opened => "opened",
            Reason::Answered => "answered",
        }
    }
}

/// Records that the bot is in `thread_id` (idempotent; the first reason is kept).
pub async fn record(
    db: impl PgExecutor<'_>,
    thread_id: &str,
    chat_id: &str,
    reason: Reason,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO bot_threads (thread_id, chat_id, reason, since) VALUES ($1, $2, $3, $4)
         ON CONFLICT (thread_id) DO NOTHING",
    )
    .bind(thread_id)
    .bind(chat_id)
    .bind(reason.as_str())
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

/// Whether the bot opened `thread_id` or has answered in it.
pub async fn joined(db: &PgPool, thread_id: &str) -> anyhow::Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM bot_threads WHERE thread_id = $1)")
            .bind(thread_id)
            .fetch_one(db)
            .await?,
    )
}

/// Records that `chat_id` is a one-to-one chat (idempotent).
pub async fn record_direct(
    db: impl PgExecutor<'_>,
    chat_id: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO direct_chats (chat_id, since) VALUES ($1, $2) ON CONFLICT (chat_id) DO NOTHING",
    )
    .bind(chat_id)
    .bind(now)
    .execute(db)
    .await?;
    Ok(())
}

/// Whether `chat_id` is a one-to-one chat the bot was asked something in.
pub async fn is_direct(db: impl PgExecutor<'_>, chat_id: &str) -> anyhow::Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM direct_chats WHERE chat_id = $1)")
            .bind(chat_id)
            .fetch_one(db)
            .await?,
    )
}
