//! The card of a schedule the model proposed: what would run, when (the next three runs, in
//! the schedule's zone), who asked, and Add / Cancel; once decided, who decided and the
//! schedule's id. A button's value carries only the proposal and the choice; who may decide is
//! judged by the worker (`chat::cron::decide_proposal`, over `authz::schedule`), which needs
//! the thread's owner — so the toast promises nothing.

use serde_json::{Value, json};

use super::call_approval_card::person;
use crate::chat::Toast;
use crate::lark::markup;
use crate::schedule::{ProposalState, ProposalView};

/// The `act` of a button of this card.
const ACT: &str = "schedule_proposal";

/// A click on this card: the proposal and whether it is Add.
pub fn read(value: &Value) -> Option<(i64, bool)> {
    if value.get("act")?.as_str()? != ACT {
        return None;
    }
    let add = match value.get("d")?.as_str()? {
        "add" => true,
        "cancel" => false,
        _ => return None,
    };
    Some((value.get("proposal")?.as_i64()?, add))
}

/// The immediate answer to a click on this card; `None` for other buttons.
pub fn toast(value: &Value) -> Option<Toast> {
    let (_, add) = read(value)?;
    Some(Toast {
        kind: "info",
        text: if add {
            "Taken: the schedule is added if you may add schedules in this thread (its owner or an admin). The card updates shortly.".into()
        } else {
            "Taken: the proposal is cancelled if you may manage this thread's schedules. The card updates shortly.".into()
        },
    })
}

/// The card.
pub fn card(v: &ProposalView) -> Value {
    let body = format!(
        "**Schedule:** `{}` ({})\n**Runs as a turn here:** {}\n**Next runs:** {}\n**Proposed by the model**, asked by {}",
        markup::plain(&v.spec, 100),
        markup::plain(&v.tz, 64),
        markup::plain(&v.prompt, 1000),
        markup::plain(&v.next.join(", "), 300),
        person(&v.asked_by)
    );
    let mut elements =
        vec![json!({"tag": "markdown", "element_id": "md_prop", "content": markup::inert(&body)})];
    let (title, template, note) = match &v.state {
        ProposalState::Open => {
            for (label, kind, d, id) in [
                ("Add", "primary", "add", "btn_add"),
                ("Cancel", "default", "cancel", "btn_cancel"),
            ] {
                elements.push(json!({
                    "tag": "button", "element_id": id,
                    "text": {"tag": "plain_text", "content": label},
                    "type": kind,
                    "behaviors": [{"type": "callback",
                                   "value": {"act": ACT, "proposal": v.id, "d": d}}],
                }));
            }
            (
                "Add this schedule?",
                "blue",
                "A schedule is a standing request: only this thread's owner or an admin can add it, and whoever adds it is its creator.".to_string(),
            )
        }
        ProposalState::Added { by, schedule } => (
            "Schedule added",
            "green",
            format!(
                "**Added** as #{schedule} by {}. /cron list shows it; /cron remove {schedule} removes it.",
                person(by)
            ),
        ),
        ProposalState::Cancelled { by } => (
            "Schedule not added",
            "grey",
            format!("**Cancelled** by {}", person(by)),
        ),
        ProposalState::Failed(why) => (
            "Schedule not added",
            "red",
            format!("**Not added:** {}", markup::plain(why, 300)),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn view(state: ProposalState) -> ProposalView {
        ProposalView {
            id: 4,
            spec: "0 9 * * 1-5".into(),
            tz: "Asia/Shanghai".into(),
            prompt: "check <b>disks</b>".into(),
            next: vec!["Mon 12-07 09:00 CST".into()],
            asked_by: "ou_a".into(),
            state,
        }
    }

    #[test]
    fn buttons_carry_the_proposal_and_decided_cards_have_none() {
        let open = card(&view(ProposalState::Open)).to_string();
        assert!(open.contains("btn_add") && open.contains("btn_cancel"));
        let add = json!({"act": ACT, "proposal": 4, "d": "add"});
        assert_eq!(read(&add), Some((4, true)));
        assert_eq!(
            read(&json!({"act": ACT, "proposal": 4, "d": "cancel"})),
            Some((4, false))
        );
        assert_eq!(read(&json!({"act": "call_approval", "d": "add"})), None);
        assert!(toast(&add).is_some());
        // The prompt is shown inert (no tags a client would render).
        assert!(!open.contains("<b>"), "{open}");
        let added = card(&view(ProposalState::Added {
            by: "ou_b".into(),
            schedule: 9,
        }))
        .to_string();
        assert!(!added.contains("btn_add") && added.contains("#9"));
    }
}
