//! A running `terminal` or `execute_code` call's output, forwarded as
//! [`StepEvent::ToolOutput`] while it runs: the call's commands write into a
//! [`LiveTail`] (see [`crate::exec::live`]), and a sampler beside the call reads it at most
//! every [`SAMPLE_EVERY`], when it changed, and once more when the call ends (so the finished
//! step keeps its last lines).
//!
//! Each tail is masked by the gate's secret scanner ([`crate::gate::Gate::mask_text`]: the
//! detectors, the service's own keys, target secrets from the vault) on its whole lines before
//! it is cut for display; a tail that could not be checked within [`SCREEN_WITHIN`] is replaced
//! by [`HIDDEN`]. Tails are already printable (no escape sequences or control
//! characters); making them inert markup is each front-end's part.
//!
//! Never: delays or queues the command's output (a slow sampler sees a later tail); sends the
//! model anything (the result is the call's, as before).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{AgentDeps, StepEvent};
use crate::exec::live::{LiveTail, Tail};

/// Least time between two samples of a running call's output.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// Longest a secret check of one tail may take; past it the tail is hidden.
const SCREEN_WITHIN: Duration = Duration::from_secs(2);
/// What stands for a tail that could not be checked for secrets.
pub const HIDDEN: &str = "[output hidden: it could not be checked for secrets]";

/// A live tail for the calls that run commands; `None` for the others.
pub(super) fn for_tool(tool: &str) -> Option<Arc<LiveTail>> {
    matches!(tool, "terminal" | "execute_code").then(|| Arc::new(LiveTail::new()))
}

/// Runs `call` while forwarding what it writes into `tail` as step events of the section's turn.
pub(super) async fn watched<F: Future>(
    deps: &AgentDeps,
    section: &str,
    turn_id: i64,
    tail: Option<&LiveTail>,
    call: F,
) -> F::Output {
    let Some(tail) = tail else {
        return call.await;
    };
    let done = CancellationToken::new();
    let (out, ()) = tokio::join!(
        async {
            let out = call.await;
            done.cancel();
            out
        },
        forward(deps, section, turn_id, tail, &done)
    );
    out
}

/// Samples `tail` until `done`, then once more with the command's last line.
async fn forward(
    deps: &AgentDeps,
    section: &str,
    turn_id: i64,
    tail: &LiveTail,
    done: &CancellationToken,
) {
    let mut shown = Tail::default();
    loop {
        tokio::select! {
            biased;
            _ = done.cancelled() => break,
            _ = tail.changed() => {}
        }
        let now = tail.snapshot(false);
        if !now.is_empty() && now != shown {
            emit(deps, section, turn_id, &now).await;
            shown = now;
        }
        tokio::select! {
            _ = done.cancelled() => break,
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
    let last = tail.snapshot(true);
    if !last.is_empty() && last != shown {
        emit(deps, section, turn_id, &last).await;
    }
}

async fn emit(deps: &AgentDeps, section: &str, turn_id: i64, tail: &Tail) {
    let whole = tail.lines.join("\n");
    let gate = deps.gate();
    let text = match tokio::time::timeout(SCREEN_WITHIN, gate.mask_text(&whole)).await {
        Ok(Ok(m)) if m.total() == 0 => tail.text(),
        Ok(Ok(m)) => Tail {
            lines: m.text.split('\n').map(str::to_string).collect(),
        }
        .text(),
        _ => HIDDEN.to_string(),
    };
    deps.steps
        .step(section, turn_id, &StepEvent::ToolOutput { tail: text });
}
