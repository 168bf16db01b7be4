//! Answers in the chat: the receipt reaction (which stays), `CrossMark` beside it when a turn
//! did not answer normally, and the final answer as
//! markdown chunks under Lark's 30 KB post limit, each with a deterministic `uuid`. The
//! answer is the model's text: the front-end makes it inert before it is posted.

use super::{ANSWERED, AgentDeps, FAILURE, RECEIPT};
use crate::lark::client::idempotency_key;
use crate::turns::{ActiveTurn, Fenced};

/// Most bytes of markdown in one post. Making it inert, then JSON escaping, at most doubles
/// it (a replaced `<` or `&` is followed by a character kept as is), which stays under Lark's
/// 30 KB post limit with room for the envelope.
const CHUNK_BYTES: usize = 14_000;

/// Splits markdown into chunks of at most [`CHUNK_BYTES`] (plus a fence line), at line breaks
/// where possible; a code block cut by a split is closed and reopened.
pub fn markdown_chunks(text: &str) -> Vec<String> {
    let text = if text.trim().is_empty() {
        "(no answer)"
    } else {
        text
    };
    let mut chunks = Vec::new();
    let mut cur = String::new();
    let mut in_code = false;
    let push_piece =
        |cur: &mut String, piece: &str, in_code: &mut bool, chunks: &mut Vec<String>| {
            if !cur.is_empty() && cur.len() + piece.len() > CHUNK_BYTES {
                let mut done = std::mem::take(cur);
                if *in_code {
                    if !done.ends_with('\n') {
                        done.push('\n');
                    }
                    done.push_str("```");
                    cur.push_str("```\n");
                }
                chunks.push(done);
            }
            cur.push_str(piece);
            if piece.trim_start().starts_with("```") {
                *in_code = !*in_code;
            }
        };
    for line in text.split_inclusive('\n') {
        if line.len() <= CHUNK_BYTES {
            push_piece(&mut cur, line, &mut in_code, &mut chunks);
            continue;
        }
        // A single huge line: cut at character boundaries.
        let mut rest = line;
        while !rest.is_empty() {
            let mut end = rest.len().min(CHUNK_BYTES);
            while !rest.is_char_boundary(end) {
                end -= 1;
            }
            push_piece(&mut cur, &rest[..end], &mut in_code, &mut chunks);
            rest = &rest[end..];
        }
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
}

/// Puts the receipt reaction on a queued message, once; not once its turn has finished (the
/// answer is there already). If the turn finished while the reaction was on its way, it is
/// taken off again, so a message's reactions never depend on that race.
pub(super) async fn receipt(deps: &AgentDeps, message_id: &str) {
    let state: Option<(Option<String>, Option<String>)> = match sqlx::query_as(
        "SELECT receipt_reaction, final_reaction FROM turn_requests WHERE message_id = $1",
    )
    .bind(message_id)
    .fetch_optional(&deps.db)
    .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(lark.message_id = %message_id, error = %e, "reading the receipt state failed");
            return;
        }
    };
    if !matches!(state, Some((None, None))) {
        return;
    }
    let reaction = match deps.out.add_receipt(message_id, RECEIPT).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(lark.message_id = %message_id, error = %format!("{e:#}"), "receipt reaction failed");
            return;
        }
    };
    let kept: Option<i64> = sqlx::query_scalar(
        "UPDATE turn_requests SET receipt_reaction = $2
          WHERE message_id = $1 AND receipt_reaction IS NULL AND final_reaction IS NULL
         RETURNING id",
    )
    .bind(message_id)
    .bind(&reaction)
    .fetch_optional(&deps.db)
    .await
    .unwrap_or(None);
    if kept.is_none()
        && let Err(e) = deps.out.remove_reaction(message_id, &reaction).await
    {
        tracing::warn!(lark.message_id = %message_id, error = %format!("{e:#}"), "removing a late receipt reaction failed");
    }
}

/// A dropped request gets the failure reaction beside its receipt (best effort).
pub(super) async fn dropped(deps: &AgentDeps, d: &crate::turns::DroppedRequest) {
    if let Err(e) = deps.out.add_reaction(&d.message_id, FAILURE).await {
        tracing::warn!(lark.message_id = %d.message_id, error = %format!("{e:#}"), "final reaction failed");
    }
}

/// Records each message's end (once per message) and, unless the turn answered normally, adds
/// the failure reaction beside its receipt. Returns the Lark calls this turn's messages cost
/// here: their receipts and the reactions added.
pub(super) async fn finish_reactions(
    deps: &AgentDeps,
    turn: &ActiveTurn,
    success: bool,
) -> Result<u32, Fenced> {
    let emoji = if success { ANSWERED } else { FAILURE };
    let mut calls = 0;
    for m in &turn.messages {
        let mut tx = turn.fence.begin().await?;
        let receipt: Option<Option<String>> = sqlx::query_scalar(
            "UPDATE turn_requests SET final_reaction = $2
              WHERE id = $1 AND final_reaction IS NULL RETURNING receipt_reaction",
        )
        .bind(m.request_id)
        .bind(emoji)
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        let Some(receipt) = receipt else { continue };
        calls += u32::from(receipt.is_some());
        if success {
            continue;
        }
        calls += 1;
        if let Err(e) = deps.out.add_reaction(&m.message_id, emoji).await {
            tracing::warn!(lark.message_id = %m.message_id, error = %format!("{e:#}"), "final reaction failed");
        }
    }
    Ok(calls)
}

/// Sends `text` as the turn's answer: a reply to the turn's last message, in its thread when
/// it was in one, else in place. The uuids derive from the turn, so a resend is dropped.
/// Returns the replies sent.
pub(super) async fn send(deps: &AgentDeps, turn: &ActiveTurn, text: &str) -> anyhow::Result<u32> {
    let Some(last) = turn.messages.last() else {
        return Ok(0);
    };
    let mut sent = 0;
    let key = format!("turn:{}", turn.id);
    for (i, chunk) in markdown_chunks(text).iter().enumerate() {
        let uuid = idempotency_key(&key, &format!("answer:{i}"));
        deps.out
            .reply_markdown(
                &turn.chat_id,
                &last.message_id,
                chunk,
                last.in_thread,
                &uuid,
            )
            .await?;
        sent += 1;
    }
    turn.fence.mark_answered(turn.id).await?;
    Ok(sent)
}
