//! Answers in the chat: the receipt reaction (which stays), `CrossMark` beside it when a turn
//! did not answer normally, and the final answer as markdown chunks, each within what the
//! channel takes as sent ([`ChatOut::answer_size`]: for Lark the serialized reply request,
//! 30 KB) and each with a deterministic `uuid`; a chunk the channel still refuses as too large
//! is cut further, a bounded number of times. The answer is the model's text: the front-end
//! makes it inert before it is posted.
//!
//! [`ChatOut::answer_size`]: super::ChatOut::answer_size

use std::collections::VecDeque;

use super::{ANSWERED, AgentDeps, FAILURE, RECEIPT, TooLarge};
use crate::lark::client::idempotency_key;
use crate::lark::markup::fence_marker;
use crate::turns::{ActiveTurn, Fenced};

/// How many times a chunk the channel refuses as too large is cut again, each time to half of
/// what it cost, before the answer fails.
const MAX_SPLITS: u32 = 3;

/// Splits markdown into chunks, in order, each with `size(chunk) <= limit`: at line breaks
/// where whole lines fit, else inside a line at a character boundary (never inside a UTF-8
/// character). A code block cut by a split is closed, and reopened with its opening line in
/// the next chunk. `size` is what a chunk costs as sent; it is at least the chunk's bytes
/// (escaping only adds), which bounds the search. A character that does not fit even alone is
/// a chunk of its own.
pub fn markdown_chunks(text: &str, size: impl Fn(&str) -> usize, limit: usize) -> Vec<String> {
    let text = if text.trim().is_empty() {
        "(no answer)"
    } else {
        text
    };
    cut(text, &size, limit)
}

/// An open code fence: where its opening line is in the text, and its marker.
#[derive(Debug, Clone, Copy)]
struct Fence {
    line: (usize, usize),
    marker: char,
    len: usize,
}

/// [`markdown_chunks`] without its placeholder for an empty answer; also how a chunk the
/// channel refused is cut further.
fn cut(text: &str, size: &dyn Fn(&str) -> usize, limit: usize) -> Vec<String> {
    // Where each line ends, and the fence open after it (as the inert form reads fences).
    let mut ends: Vec<(usize, Option<Fence>)> = Vec::new();
    let mut fence: Option<Fence> = None;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if let Some((marker, len)) = fence_marker(line) {
            match fence {
                None => {
                    fence = Some(Fence {
                        line: (at, at + line.len()),
                        marker,
                        len,
                    })
                }
                Some(f) if f.marker == marker && len >= f.len => fence = None,
                Some(_) => {}
            }
        }
        at += line.len();
        ends.push((at, fence));
    }
    // The chunk `text[from..to]`, reopening the fence open at `from` and closing the one open
    // at `to` (unless the text ends there).
    let render = |from: usize, to: usize, open: Option<Fence>, open_at_end: Option<Fence>| {
        let mut s = String::new();
        if let Some(f) = open {
            s.push_str(&text[f.line.0..f.line.1]);
            if !s.ends_with('\n') {
                s.push('\n');
            }
        }
        s.push_str(&text[from..to]);
        if let Some(f) = open_at_end
            && to < text.len()
        {
            if !s.ends_with('\n') {
                s.push('\n');
            }
            s.extend(std::iter::repeat_n(f.marker, f.len));
        }
        s
    };
    // The largest `n` in `0..=max` for which `fits(n)` holds (0 when none does), assuming a
    // longer candidate costs more.
    let largest = |max: usize, fits: &dyn Fn(usize) -> bool| {
        let (mut lo, mut hi) = (0, max);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    };
    let mut chunks = Vec::new();
    let (mut pos, mut line, mut open) = (0, 0, None);
    while pos < text.len() {
        // Whole lines from here, as many as fit.
        let lines = ends[line..]
            .iter()
            .take_while(|(end, _)| end - pos <= limit)
            .count();
        let mut n = largest(lines, &|n| {
            let (end, after) = ends[line + n - 1];
            size(&render(pos, end, open, after)) <= limit
        });
        // A chunk does not end on the line that opens a code block, nor just before the line
        // that closes one (either leaves an empty block), unless the text ends there.
        let opens = |n: usize| {
            let (end, after) = ends[line + n - 1];
            end < text.len() && after.is_some_and(|f| f.line.1 == end)
        };
        let closes_next = |n: usize| {
            ends[line + n - 1].1.is_some() && ends.get(line + n).is_some_and(|e| e.1.is_none())
        };
        if n > 1 && (opens(n) || (closes_next(n) && !opens(n - 1))) {
            n -= 1;
        }
        if n > 0 && !opens(n) {
            let (end, after) = ends[line + n - 1];
            chunks.push(render(pos, end, open, after));
            (pos, line, open) = (end, line + n, after);
            continue;
        }
        // The next line does not fit whole (after the line opening a block, if that is where
        // this chunk starts): cut it at a character boundary.
        let (start, state) = if n == 1 { ends[line] } else { (pos, open) };
        let cut_line = line + n;
        let (line_end, after) = ends[cut_line];
        let bounds: Vec<usize> = text[start..line_end]
            .char_indices()
            .map(|(i, c)| start + i + c.len_utf8())
            .take_while(|end| end - pos <= limit)
            .collect();
        let k = largest(bounds.len(), &|k| {
            size(&render(pos, bounds[k - 1], open, state)) <= limit
        });
        if k == 0 && n == 1 {
            // Not a character more fits beside the opening line: it goes alone.
            chunks.push(render(pos, start, open, state));
            (pos, line, open) = (start, line + 1, state);
            continue;
        }
        let end = match k {
            // Not even one character fits: it goes alone.
            0 => text[pos..]
                .chars()
                .next()
                .map_or(text.len(), |c| pos + c.len_utf8()),
            k => bounds[k - 1],
        };
        if end == line_end {
            chunks.push(render(pos, end, open, after));
            (pos, line, open) = (end, cut_line + 1, after);
        } else {
            chunks.push(render(pos, end, open, state));
            (pos, line, open) = (end, cut_line, state);
        }
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
/// it was in one, else in place. The uuids derive from the turn and the chunk's place, so a
/// resend is dropped; a chunk refused as too large is cut in parts (`answer:1.0`, `answer:1.1`
/// …) sent in its place, at most [`MAX_SPLITS`] times over. Returns the replies asked for.
pub(super) async fn send(deps: &AgentDeps, turn: &ActiveTurn, text: &str) -> anyhow::Result<u32> {
    let Some(last) = turn.messages.last() else {
        return Ok(0);
    };
    // The bot left the chat (removed, or the chat disbanded): nothing is posted there.
    if crate::lifecycle::is_departed(&deps.db, &turn.chat_id).await? {
        tracing::info!(section.id = %turn.section, lark.chat_id = %turn.chat_id, "the bot left this chat; the answer is not posted");
        return Ok(0);
    }
    let mut sent = 0;
    let key = format!("turn:{}", turn.id);
    let size = |c: &str| deps.out.answer_size(c);
    // (chunk, its uuid's purpose, times cut so far), in the answer's order.
    let mut queue: VecDeque<(String, String, u32)> =
        markdown_chunks(text, size, deps.out.answer_limit())
            .into_iter()
            .enumerate()
            .map(|(i, c)| (c, format!("answer:{i}"), 0))
            .collect();
    while let Some((chunk, purpose, splits)) = queue.pop_front() {
        let uuid = idempotency_key(&key, &purpose);
        sent += 1;
        let Err(e) = deps
            .out
            .reply_markdown(
                &turn.chat_id,
                &last.message_id,
                &chunk,
                last.in_thread,
                &uuid,
            )
            .await
        else {
            continue;
        };
        let parts = if e.downcast_ref::<TooLarge>().is_some() && splits < MAX_SPLITS {
            cut(&chunk, &size, size(&chunk) / 2)
        } else {
            Vec::new()
        };
        if parts.len() < 2 {
            return Err(e);
        }
        tracing::info!(lark.message_id = %last.message_id, answer.chunk = %purpose, answer.parts = parts.len(), "an answer chunk was refused as too large; sending it in parts");
        for (j, part) in parts.into_iter().enumerate().rev() {
            queue.push_front((part, format!("{purpose}.{j}"), splits + 1));
        }
    }
    turn.fence.mark_answered(turn.id).await?;
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twice the bytes: text whose every character is escaped once more on the way.
    fn double(s: &str) -> usize {
        2 * s.len()
    }

    #[test]
    fn whole_lines_in_order_as_many_as_fit() {
        let text: String = (0..100).map(|i| format!("line {i:03}\n")).collect();
        let chunks = markdown_chunks(&text, double, 200);
        assert!(chunks.iter().all(|c| double(c) <= 200 && c.ends_with('\n')));
        assert_eq!(chunks[0].len(), 99, "eleven lines of nine bytes");
        assert_eq!(chunks.concat(), text);
    }

    #[test]
    fn a_code_block_cut_is_closed_and_reopened_with_its_opening_line() {
        let mut text = String::from("intro\n~~~~rust\n");
        for i in 0..50 {
            text.push_str(&format!("let x{i} = {i};\n"));
        }
        text.push_str("~~~~\nafter\n");
        let chunks = markdown_chunks(&text, str::len, 300);
        assert!(chunks.len() > 2);
        let mut rejoined = String::new();
        for (i, c) in chunks.iter().enumerate() {
            assert!(c.len() <= 300, "{c}");
            let mut c = c.as_str();
            if i > 0 {
                c = c.strip_prefix("~~~~rust\n").expect("reopened");
            }
            if i < chunks.len() - 1 {
                c = c.strip_suffix("~~~~").expect("closed");
            }
            rejoined.push_str(c);
        }
        assert!(chunks.last().unwrap().ends_with("~~~~\nafter\n"));
        assert_eq!(rejoined, text);
    }

    #[test]
    fn a_chunk_never_ends_on_the_line_opening_a_block_nor_before_the_one_closing_it() {
        let (a, b, c) = ("a".repeat(40), "b".repeat(25), "c".repeat(25));
        let text = format!("{a}\n```sh\n{b}\n{c}\n```\n");
        // The opening line would fit in the first chunk, and the block but its closing line in
        // the second: either would leave a chunk with an empty block.
        assert_eq!(
            markdown_chunks(&text, str::len, 61),
            [
                format!("{a}\n"),
                format!("```sh\n{b}\n```"),
                format!("```sh\n{c}\n```\n")
            ]
        );
    }

    #[test]
    fn a_long_line_is_cut_between_characters() {
        let text = "日本語".repeat(100);
        let chunks = markdown_chunks(&text, str::len, 100);
        assert!(chunks.iter().all(|c| c.len() == 99 || c.len() == 900 % 99));
        assert_eq!(chunks.concat(), text);
        // In a code block the line goes on in the reopened block.
        let text = format!("```\n{}\n```\n", "x".repeat(250));
        let chunks = markdown_chunks(&text, str::len, 100);
        assert!(chunks.len() >= 3, "{chunks:?}");
        for c in &chunks {
            assert!(c.len() <= 100 && c.starts_with("```\nx"), "{c}");
            assert_eq!(c.matches("```").count(), 2, "{c}");
        }
        let xs: usize = chunks.iter().map(|c| c.matches('x').count()).sum();
        assert_eq!(xs, 250);
    }

    #[test]
    fn what_never_fits_goes_one_character_at_a_time() {
        assert_eq!(markdown_chunks("ab", |s| s.len() + 10, 5), ["a", "b"]);
        assert_eq!(markdown_chunks(" \n", str::len, 100), ["(no answer)"]);
    }
}
