//! Cards (JSON 2.0) the service sends: the admin approval card. Rendering only; what a card
//! says comes from the chat domain.

use serde_json::{Value, json};

use crate::chat::ApprovalView;
use crate::chat::approval::button_value;
use crate::chat::control::Decision;

/// The approval card for a target: pending (with Approve and Reject buttons) or decided.
pub fn approval(v: &ApprovalView) -> Value {
    let mut lines = format!(
        "**{}** → `{}`\nAdded by: {}",
        v.alias, v.destination, v.added_by
    );
    if let Some(fp) = &v.fingerprint {
        lines.push_str(&format!("\nHost key: `{fp}`"));
    }
    let mut elements =
        vec![json!({"tag": "markdown", "element_id": "md_target", "content": lines})];
    let (title, template) = match &v.decided {
        None => {
            for (label, kind, d, id) in [
                ("Approve", "primary", Decision::Approve, "btn_approve"),
                ("Reject", "danger", Decision::Reject, "btn_reject"),
            ] {
                elements.push(json!({
                    "tag": "button", "element_id": id,
                    "text": {"tag": "plain_text", "content": label},
                    "type": kind,
                    "behaviors": [{"type": "callback", "value": button_value(&v.alias, v.generation, d)}],
                }));
            }
            ("Approve SSH target?".to_string(), "orange")
        }
        Some((by, what, when)) => {
            elements.push(json!({
                "tag": "markdown", "element_id": "md_decided",
                "content": format!("**{}** by {by} at {when}", capitalised(what)),
            }));
            (
                format!("SSH target {what}"),
                if what == "approved" { "green" } else { "red" },
            )
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
