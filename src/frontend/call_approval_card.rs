//! The approval card of a parked call, and its clicks. The card (JSON 2.0, in the turn's
//! thread) shows where the command would run, the directory, the command whole in a code
//! block, the reason, what Allow in this thread would cover (exactly this command, or the
//! command's form with the classes its data operands may range over), and the buttons Allow
//! once, Allow in this thread and Deny; once decided, who decided and when. A button's value
//! carries the turn, the call, the requester's open_id and the approver policy, so a click is
//! triaged without I/O ([`toast`]) and applied by an inbox worker ([`apply`]): recorded once (a
//! second click changes nothing), audited, and the card rewritten. Who may answer is
//! [`authz::decide_call`]'s call.

use anyhow::Context as _;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::authz::{self, Actor, Approvers};
use crate::chat::Toast;
use crate::lark::markup;
use crate::turns::call_approval::{self as parked, CallApprovalState, Decided, Parked, Scope};

/// The `act` of a button of this card.
const ACT: &str = "call_approval";

/// A button's value: the decision (`once`, `thread`, `deny`) and everything a click is judged
/// by.
pub fn button_value(p: &Parked, decision: &str) -> Value {
    json!({
        "act": ACT,
        "turn": p.turn_id,
        "call": p.call_key,
        "req": p.ask.requester,
        "who": p.ask.approvers.as_str(),
        "d": decision,
    })
}

/// A click on this card, read from its button value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pressed {
    pub turn_id: i64,
    pub call_key: String,
    pub requester: String,
    pub approvers: Approvers,
    /// `None`: deny.
    pub scope: Option<Scope>,
}

/// Reads a button value of this card; `None` for any other button.
pub fn read(value: &Value) -> Option<Pressed> {
    if value.get("act")?.as_str()? != ACT {
        return None;
    }
    Some(Pressed {
        turn_id: value.get("turn")?.as_i64()?,
        call_key: value.get("call")?.as_str()?.to_string(),
        requester: value.get("req")?.as_str()?.to_string(),
        approvers: Approvers::parse(value.get("who")?.as_str()?)?,
        scope: match value.get("d")?.as_str()? {
            "once" => Some(Scope::Once),
            "thread" => Some(Scope::Thread),
            "deny" => None,
            _ => return None,
        },
    })
}

/// The immediate answer to a click by `actor` on this card, without I/O; `None` for other
/// buttons.
pub fn toast(value: &Value, actor: Actor<'_>) -> Option<Toast> {
    let p = read(value)?;
    Some(match authz::decide_call(actor, &p.requester, p.approvers) {
        Ok(()) => Toast {
            kind: "info",
            text: match p.scope {
                Some(Scope::Once) => "Allowed once. The card updates shortly.".into(),
                Some(Scope::Thread) => "Allowed in this thread. The card updates shortly.".into(),
                None => "Denied. The card updates shortly.".into(),
            },
        },
        Err(refused) => Toast {
            kind: "error",
            text: refused.to_string(),
        },
    })
}

/// What a worker needs to apply a click.
pub struct Applied {
    /// The card to rewrite and its new content, when the click decided it.
    pub rewrite: Option<(String, Value)>,
}

/// Applies a click by `actor`: a stranger's changes nothing (audited as refused); an allowed
/// person's decision is recorded once and audited, and the card is to be rewritten.
pub async fn apply(
    db: &PgPool,
    value: &Value,
    actor: Actor<'_>,
    card_message_id: &str,
    thread_for: std::time::Duration,
) -> anyhow::Result<Applied> {
    let Some(p) = read(value) else {
        return Ok(Applied { rewrite: None });
    };
    let operator = actor.name();
    let may = authz::decide_call(actor, &p.requester, p.approvers).is_ok();
    let decision = match p.scope {
        Some(s) => s.as_str(),
        None => "deny",
    };
    let outcome = if !may {
        "refused"
    } else {
        match parked::decide(db, p.turn_id, &p.call_key, p.scope, operator, thread_for)
            .await
            .context("recording an approval")?
        {
            Decided::Applied(now) => {
                audit(db, operator, &now, decision, "ok").await?;
                let card = card(&now);
                return Ok(Applied {
                    rewrite: Some((
                        now.card_message_id
                            .clone()
                            .unwrap_or_else(|| card_message_id.to_string()),
                        card,
                    )),
                });
            }
            Decided::Already(_) => "already decided",
            Decided::Unknown => "unknown",
        }
    };
    let mut conn = db.acquire().await.context("auditing an approval click")?;
    crate::audit::record_chat(
        &mut conn,
        crate::audit::ChatEntry {
            actor: operator,
            action: "tool.approval",
            section: None,
            target: None,
            outcome,
            detail: json!({"turn": p.turn_id, "call": p.call_key, "decision": decision}),
        },
    )
    .await
    .context("auditing an approval click")?;
    Ok(Applied { rewrite: None })
}

async fn audit(
    db: &PgPool,
    operator: &str,
    p: &Parked,
    decision: &str,
    outcome: &str,
) -> anyhow::Result<()> {
    let mut conn = db.acquire().await.context("auditing an approval")?;
    crate::audit::record_chat(
        &mut conn,
        crate::audit::ChatEntry {
            actor: operator,
            action: "tool.approval",
            section: Some(&p.section),
            target: None,
            outcome,
            detail: json!({"turn": p.turn_id, "call": p.call_key, "decision": decision,
                           "location": p.ask.location, "reason": p.ask.reason}),
        },
    )
    .await
    .context("auditing an approval")?;
    Ok(())
}

/// The card of a parked call in its current state.
pub fn card(p: &Parked) -> Value {
    let fence = "`".repeat(longest_backtick_run(&p.ask.command).max(2) + 1);
    let mut body = format!(
        "**Where:** {}\n**Directory:** {}\n**Why:** {}\n{fence}\n{}\n{fence}",
        markup::plain(&p.ask.location, 200),
        markup::plain(&p.ask.cwd, 500),
        markup::plain(&p.ask.reason, 500),
        p.ask.command
    );
    if p.state == CallApprovalState::Waiting || p.scope == Some(Scope::Thread) {
        // What the allowance covers, as plain text in its own block (it quotes the command).
        let fence = "`".repeat(longest_backtick_run(&p.ask.covers).max(2) + 1);
        body.push_str(&format!(
            "\n**Allow in this thread** covers, in this thread and at this place:\n{fence}\n{}\n{fence}",
            p.ask.covers
        ));
    }
    let mut elements =
        vec![json!({"tag": "markdown", "element_id": "md_call", "content": markup::inert(&body)})];
    let when = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_default()
    };
    let by = person(p.decided_by.as_deref().unwrap_or_default());
    let (title, template, note) = match p.state {
        CallApprovalState::Waiting => {
            for (label, kind, d, id) in [
                ("Allow once", "primary", "once", "btn_once"),
                ("Allow in this thread", "default", "thread", "btn_thread"),
                ("Deny", "danger", "deny", "btn_deny"),
            ] {
                elements.push(json!({
                    "tag": "button", "element_id": id,
                    "text": {"tag": "plain_text", "content": label},
                    "type": kind,
                    "behaviors": [{"type": "callback", "value": button_value(p, d)}],
                }));
            }
            let who = match p.ask.approvers {
                Approvers::Admins => "an admin".to_string(),
                Approvers::Requester => format!(
                    "the person who asked ({}), or an admin",
                    person(&p.ask.requester)
                ),
            };
            (
                "Run this command?",
                "orange",
                format!(
                    "To be answered by {who} before {}; no answer denies it.",
                    when(Some(p.deadline))
                ),
            )
        }
        CallApprovalState::Allowed => (
            "Command allowed",
            "green",
            format!(
                "**Allowed {}** by {by} at {}",
                match p.scope {
                    Some(Scope::Thread) => "in this thread",
                    _ => "once",
                },
                when(p.decided_at)
            ),
        ),
        CallApprovalState::Denied => (
            "Command denied",
            "red",
            format!("**Denied** by {by} at {}", when(p.decided_at)),
        ),
        CallApprovalState::Expired => (
            "Approval expired",
            "grey",
            format!("**No answer** by {}: denied", when(Some(p.deadline))),
        ),
        CallApprovalState::Stopped => (
            "Approval ended",
            "grey",
            format!("**Stopped** by /stop at {}", when(p.decided_at)),
        ),
    };
    elements.push(json!({"tag": "markdown", "element_id": "md_state", "content": note}));
    json!({
        "schema": "2.0",
        "config": {"update_multi": true, "summary": {"content": title}},
        "header": {"title": {"tag": "plain_text", "content": title}, "template": template},
        "body": {"elements": elements},
    })
}

/// A person on the card, by name: a mention of their open_id, which Lark shows as their name;
/// anything that is not an id stays plain text.
pub(super) fn person(open_id: &str) -> String {
    if !open_id.is_empty()
        && open_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        format!("<at id={open_id}></at>")
    } else {
        markup::plain(open_id, 80)
    }
}

fn longest_backtick_run(s: &str) -> usize {
    let (mut best, mut run) = (0, 0);
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        best = best.max(run);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(command: &str) -> Parked {
        Parked {
            turn_id: 7,
            call_key: "12:call_0".into(),
            section: "omt_x".into(),
            state: CallApprovalState::Waiting,
            scope: None,
            ask: parked::Ask {
                command: command.into(),
                reason: "a recursive delete outside the workspace".into(),
                location: "web · deploy@10.0.0.5".into(),
                cwd: "/srv/app".into(),
                requester: "ou_req".into(),
                approvers: Approvers::Admins,
                covers: "exactly this command\n(run in this directory)".into(),
            },
            deadline: chrono::Utc::now(),
            decided_by: None,
            decided_at: None,
            started: false,
            card_message_id: None,
            overdue: false,
            stop_requested: false,
        }
    }

    #[test]
    fn the_card_shows_the_command_whole_and_three_buttons_that_carry_the_call() {
        let cmd = "rm -rf /tmp/x && echo ```done``` <at id=all></at>";
        let c = card(&parked(cmd));
        let elements = c["body"]["elements"].as_array().unwrap();
        let md = elements[0]["content"].as_str().unwrap();
        assert!(
            md.contains("````\nrm -rf /tmp/x && echo ```done```"),
            "{md}"
        );
        assert!(!md.contains("<at"), "{md}");
        assert!(md.contains("deploy@10.0.0.5") && md.contains("/srv/app"));
        let buttons: Vec<&Value> = elements.iter().filter(|e| e["tag"] == "button").collect();
        assert_eq!(buttons.len(), 3);
        let values: Vec<Pressed> = buttons
            .iter()
            .map(|b| read(&b["behaviors"][0]["value"]).unwrap())
            .collect();
        assert_eq!(values[0].scope, Some(Scope::Once));
        assert_eq!(values[1].scope, Some(Scope::Thread));
        assert_eq!(values[2].scope, None);
        assert!(
            values
                .iter()
                .all(|v| v.turn_id == 7 && v.call_key == "12:call_0")
        );
    }

    #[test]
    fn the_decided_card_names_the_approver_by_a_mention_and_never_renders_other_markup() {
        let mut p = parked("rm -rf /x");
        p.state = CallApprovalState::Allowed;
        p.scope = Some(Scope::Once);
        p.decided_by = Some("ou_admin".into());
        let note = |p: &Parked| card(p)["body"]["elements"][1]["content"].to_string();
        assert!(
            note(&p).contains("by <at id=ou_admin></at>"),
            "{}",
            note(&p)
        );
        p.decided_by = Some("<at id=all></at>".into());
        assert!(!note(&p).contains("<at"), "{}", note(&p));
        p.state = CallApprovalState::Waiting;
        p.ask.approvers = Approvers::Requester;
        let waiting = card(&p).to_string();
        assert!(waiting.contains("asked (<at id=ou_req></at>)"), "{waiting}");
    }

    #[test]
    fn the_card_says_what_allow_in_this_thread_covers() {
        let places = crate::bash::cover::Places {
            cwd: "/srv/app",
            workspace: "/srv/app",
            home: Some("/home/deploy"),
            env: &[],
        };
        let text = |p: &Parked| card(p)["body"]["elements"][0]["content"].to_string();
        let mut p = parked("rm -rf build");
        p.ask.covers = crate::bash::cover::cover("rm -rf build", &places).says();
        let waiting = text(&p);
        assert!(
            waiting.contains("**Allow in this thread** covers")
                && waiting.contains(
                    "any command of the form: rm -rf ‹workspace path›\\n‹workspace path›: \
                     any path inside the workspace /srv/app"
                ),
            "{waiting}"
        );
        p.ask.covers = crate::bash::cover::cover("python3 -c 'print(1)'", &places).says();
        assert!(text(&p).contains("exactly this command"), "{}", text(&p));
        // A cover quoting backticks stays inside its block.
        p.ask.covers = "exactly ```this``` command".into();
        assert!(
            text(&p).contains("````\\nexactly ```this``` command\\n````"),
            "{}",
            text(&p)
        );
        // Once decided, only an allowance in the thread still says what it covers.
        p.state = CallApprovalState::Allowed;
        p.scope = Some(Scope::Once);
        assert!(!text(&p).contains("covers"), "{}", text(&p));
        p.scope = Some(Scope::Thread);
        assert!(
            text(&p).contains("exactly ```this``` command"),
            "{}",
            text(&p)
        );
    }

    #[test]
    fn clicks_are_triaged_from_the_value_alone() {
        let mut p = parked("rm -rf /x");
        let user = |open_id, admin| Actor::User { open_id, admin };
        let v = button_value(&p, "once");
        assert_eq!(toast(&v, user("ou_req", false)).unwrap().kind, "error");
        assert_eq!(toast(&v, user("ou_admin", true)).unwrap().kind, "info");
        p.ask.approvers = Approvers::Requester;
        let v = button_value(&p, "deny");
        assert_eq!(toast(&v, user("ou_req", false)).unwrap().kind, "info");
        assert_eq!(toast(&v, user("ou_other", false)).unwrap().kind, "error");
        let other = json!({"act": "approve", "alias": "web"});
        assert!(toast(&other, user("ou_req", true)).is_none());
    }
}
