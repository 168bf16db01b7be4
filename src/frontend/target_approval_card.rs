//! The approval card of a target (JSON 2.0), sent to each admin one-to-one. Rendering only;
//! what it says comes from the chat domain ([`crate::chat::target_approval`]).

use serde_json::{Value, json};

use crate::chat::change::Decision;
use crate::chat::target_approval;
use crate::chat::{TargetApprovalView, TargetCardState};

/// The approval card for a target: pending (with Approve and Reject buttons, whose values
/// carry the generation and host key shown), decided, or expired.
pub fn card(v: &TargetApprovalView) -> Value {
    let mut lines = format!("**{}**", v.alias);
    if let Some(d) = &v.destination {
        lines.push_str(&format!(" → `{d}`"));
    }
    if let Some(by) = &v.added_by {
        lines.push_str(&format!("\nAdded by: {by}"));
    }
    if let Some(fp) = &v.fingerprint {
        lines.push_str(&format!("\nHost key: `{fp}`"));
    }
    let mut elements =
        vec![json!({"tag": "markdown", "element_id": "md_target", "content": lines})];
    let (title, template) = match &v.state {
        TargetCardState::Pending => {
            for (label, kind, d, id) in [
                ("Approve", "primary", Decision::Approve, "btn_approve"),
                ("Reject", "danger", Decision::Reject, "btn_reject"),
            ] {
                let value = target_approval::button_value(
                    &v.alias,
                    v.generation,
                    v.fingerprint.as_deref(),
                    d,
                );
                elements.push(json!({
                    "tag": "button", "element_id": id,
                    "text": {"tag": "plain_text", "content": label},
                    "type": kind,
                    "behaviors": [{"type": "callback", "value": value}],
                }));
            }
            ("Approve SSH target?".to_string(), "orange")
        }
        TargetCardState::Decided { by, what, when } => {
            elements.push(json!({
                "tag": "markdown", "element_id": "md_decided",
                "content": format!("**{}** by {by} at {when}", capitalised(what)),
            }));
            (
                format!("SSH target {what}"),
                if what == "approved" { "green" } else { "red" },
            )
        }
        TargetCardState::Expired => {
            elements.push(json!({
                "tag": "markdown", "element_id": "md_expired",
                "content": "**Expired**: this target was decided, removed, added again or given another host key since this card was sent. Nothing was decided; a pending target gets a new card.",
            }));
            ("Approval card expired".to_string(), "grey")
        }
    };
    json!({
        "schema": "2.0",
        "config": {"update_multi": true, "summary": {"content": title}},
        "header": {"title": {"tag": "plain_text", "content": title}, "template": template},
        "body": {"elements": elements},
    })
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}
