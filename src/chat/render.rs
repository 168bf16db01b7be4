//! Words for the chat: status reports, target lists, refusals with what is available. Plain
//! text, never a secret, a key path or a vault record (a [`Target`] carries none).

use chrono::{DateTime, Utc};

use super::change::Report;
use crate::authz::Kind;
use crate::target::{Status, Target};

fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// `/ssh status` (and the model's `status`).
pub fn status(r: &Report, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    match (&r.binding, &r.target) {
        (None, _) => out.push_str("Backend: local (this service's machine).\n"),
        (Some(b), t) => {
            let dest = t
                .as_ref()
                .map(|t| t.destination())
                .unwrap_or_else(|| "target no longer registered".into());
            out.push_str(&format!("Backend: `{}` ({dest})\n", b.alias));
            if let Some(k) = t.as_ref().and_then(|t| t.host_key.as_ref()) {
                out.push_str(&format!("Host key: {}\n", k.fingerprint));
            }
            let how = match b.kind {
                Kind::Sticky => format!("sticky, bound by {}", b.owner),
                Kind::Model => "model-made (under a grant; ends with it)".to_string(),
            };
            out.push_str(&format!("Bound: {how}, {}\n", when(b.bound_at)));
        }
    }
    if r.grants.is_empty() {
        out.push_str("Grants: none (the model may not enter a target by itself).");
    } else {
        out.push_str("Grants:");
        for g in &r.grants {
            let left = (g.expires_at - now).num_minutes().max(0);
            out.push_str(&format!(
                "\n- {} by {} until {} ({}h{:02}m left)",
                g.alias.as_deref().unwrap_or("all targets"),
                g.granted_by,
                when(g.expires_at),
                left / 60,
                left % 60
            ));
        }
    }
    out
}

/// One line per target: alias, `user@host`, status, description.
pub fn list(targets: &[Target]) -> String {
    if targets.is_empty() {
        return "No targets are available in this chat.".into();
    }
    let mut out = String::from("Targets for this chat:");
    for t in targets {
        out.push_str(&format!(
            "\n- `{}` {}@{}{} — {}",
            t.alias,
            t.user,
            t.host,
            t.via(),
            t.status.as_str()
        ));
        if let Some(d) = t.description.as_deref().filter(|d| !d.is_empty()) {
            out.push_str(&format!(" — {}", d.chars().take(120).collect::<String>()));
        }
    }
    out
}

/// "Available here: …" after a refusal: the approved targets the chat may use.
pub fn available(targets: &[Target]) -> String {
    let names: Vec<String> = targets
        .iter()
        .filter(|t| t.status == Status::Approved)
        .map(|t| format!("`{}`", t.alias))
        .collect();
    if names.is_empty() {
        "No target is available in this chat.".into()
    } else {
        format!("Available here: {}.", names.join(", "))
    }
}
