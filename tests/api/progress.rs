//! The live progress card end to end: agent turns (scripted fake model, local or the real sshd)
//! feed the card on the fake Lark, which enforces CardKit's rules (sequence, streaming TTL,
//! operations per second, size). Covers the remote steps' lines, coalescing, streaming renewal
//! and re-enabling, a resumed turn, the Stop button, transient refusals retried on the same card,
//! both fallbacks (never a second card), the final card, and the card's place above the answer.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sshmode::exec::Place;

use crate::agent::{
    Env, MODEL, accept, add_target, builder, call, rand_u16, remote_pgrep, say, turn_states,
    unique, wait_turns_ended,
};
use crate::fake_lark::{Failure, FakeCard, FakeLark};
use crate::helpers::eventually;
use crate::lark_support::{ENCRYPT_KEY, TOKEN, post, sealed_now};
use crate::sshd::{self, Sshd};

async fn env(vars: &[(&str, &str)]) -> Env {
    Env::builder().progress().vars(vars).spawn().await
}

/// Waits until the test's last card is closed (streaming off after the end, then the whole card
/// replaced by its final form) and returns it.
pub(crate) async fn closed_card(lark: &FakeLark) -> FakeCard {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cards = lark.cards();
        if let Some(c) = cards.last()
            && c.element("steps").contains("---")
            && !c.streaming
            && c.ops.last().is_some_and(|o| o.2 == "card")
        {
            return c.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no closed card: {cards:#?}\nrequests: {:#?}",
            lark.requests()
                .iter()
                .map(|r| format!(
                    "{} {} {}",
                    r.method,
                    r.path,
                    r.body.get("sequence").unwrap_or(&Value::Null)
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Content updates in the busiest one-second window.
pub(crate) fn busiest_second(card: &FakeCard) -> usize {
    let times: Vec<Instant> = card
        .ops
        .iter()
        .filter(|o| o.2 == "content")
        .map(|o| o.0)
        .collect();
    times
        .iter()
        .map(|t| {
            times
                .iter()
                .filter(|u| **u >= *t && u.duration_since(*t) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn strictly_increasing(card: &FakeCard) -> bool {
    card.ops.windows(2).all(|w| w[0].1 < w[1].1)
}

/// Replies to `message_id` by message type.
fn replies(lark: &FakeLark, message_id: &str, msg_type: &str) -> Vec<Value> {
    lark.requests_to(&format!("/messages/{message_id}/reply"))
        .into_iter()
        .filter(|r| r.body["msg_type"] == msg_type)
        .map(|r| r.body)
        .collect()
}

#[tokio::test]
async fn a_remote_turn_streams_one_card_with_every_step_where_it_ran() {
    if !sshd::available() {
        return;
    }
    let env = env(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_below(dir.path());
    add_target(&env.app, &sshd, dir.path(), "web").await;
    let thread = unique("omt_prog");
    env.control.bind(&thread, Place::Target("web".into()));
    env.llm
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(
            MODEL,
            call(
                "terminal",
                json!({"command": "sleep 1.5; curl -H 'Authorization: Bearer sk-live-0123456789abcdef0123' x; exit 3"}),
            ),
        )
        .push(MODEL, call("read_file", json!({"path": "~/.profile"})))
        .push(MODEL, say("all three done"));
    let msg = unique("om_prog");
    accept(&env.app, &thread, &msg, "look around").await;
    assert_eq!(wait_turns_ended(&env.app, &thread, 1).await, vec!["done"]);
    let card = closed_card(&env.lark).await;
    assert_eq!(env.lark.cards().len(), 1);

    // The card is a reply to the message, in its thread, as the answer is.
    let sent = replies(&env.lark, &msg, "interactive");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["reply_in_thread"], true);
    assert!(sent[0]["content"].as_str().unwrap().contains(&card.card_id));
    let header = card.data["header"]["title"]["content"].as_str().unwrap();
    assert!(
        header.contains(&format!("web ({}@127.0.0.1:{})", sshd::USER, sshd.port)),
        "{header}"
    );

    let text = card.element("steps");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(" · web · ")).collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("✅ **terminal**")
            && lines[0].contains("`id -un`")
            && lines[0].contains("exit 0"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("❌ **terminal**") && lines[1].contains("exit 3"),
        "{text}"
    );
    assert!(
        !text.contains("sk-live-0123456789abcdef0123"),
        "secrets are redacted: {text}"
    );
    assert!(
        lines[2].starts_with("✅ **read_file**") && lines[2].contains("~/.profile"),
        "{text}"
    );
    assert!(text.contains("**Done** · 3 steps (1 failed)"), "{text}");
    assert!(
        text.contains("all three done"),
        "the answer's first lines: {text}"
    );

    assert!(strictly_increasing(&card), "{:?}", card.ops);
    assert!(card.refusals.is_empty(), "{:?}", card.refusals);
    assert!(busiest_second(&card) <= 5, "{:?}", card.ops);
    // The running step was shown while it ran (the 1.5 s sleep): some update had it last.
    assert!(
        card.ops.iter().filter(|o| o.2 == "content").count() >= 3,
        "{:?}",
        card.ops
    );
    // The final answer is its own reply.
    assert_eq!(replies(&env.lark, &msg, "post").len(), 1);
    drop(sshd);
}

#[tokio::test]
async fn a_turn_longer_than_the_streaming_ttl_renews_streaming_and_loses_nothing() {
    let env = env(&[("SSHMODE_PROGRESS_STREAMING_TTL_SECS", "2")]).await;
    env.lark.set_cardkit_ttl(Duration::from_secs(2));
    let section = unique("oc_ttl");
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": "sleep 4.5; echo slept"})),
        )
        .push(MODEL, call("terminal", json!({"command": "echo after"})))
        .push(MODEL, say("long one done"));
    let msg = unique("om_ttl");
    accept(&env.app, &section, &msg, "slow").await;
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    let card = closed_card(&env.lark).await;
    assert_eq!(env.lark.cards().len(), 1);
    let renewals = card.ops.iter().filter(|o| o.2 == "settings").count();
    assert!(
        renewals >= 3,
        "renewed at least twice, then closed: {:?}",
        card.ops
    );
    assert!(card.refusals.is_empty(), "{:?}", card.refusals);
    let text = card.element("steps");
    assert!(
        text.contains("`sleep 4.5; echo slept`") && text.contains("`echo after`"),
        "{text}"
    );
    assert!(text.contains("**Done** · 2 steps (0 failed)"), "{text}");
    assert!(strictly_increasing(&card));
}

#[tokio::test]
async fn streaming_closed_by_lark_is_re_enabled_and_the_update_goes_through() {
    // Lark closes streaming after 1 s; the service believes it has 10 minutes.
    let env = env(&[]).await;
    env.lark.set_cardkit_ttl(Duration::from_secs(1));
    let section = unique("oc_closed");
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": "sleep 2.5; echo x"})),
        )
        .push(MODEL, say("fine"));
    let msg = unique("om_closed");
    accept(&env.app, &section, &msg, "q").await;
    wait_turns_ended(&env.app, &section, 1).await;
    let card = closed_card(&env.lark).await;
    let closed = card.refusals.iter().filter(|c| **c == 300309).count();
    assert!(closed >= 1, "{:?}", card.refusals);
    // Every refusal was answered by re-enabling streaming, never by the same call again.
    let settings = card.ops.iter().filter(|o| o.2 == "settings").count();
    assert!(settings > closed, "{:?} {:?}", card.refusals, card.ops);
    assert_eq!(card.refusals.len(), closed, "{:?}", card.refusals);
    let text = card.element("steps");
    assert!(
        text.contains("`sleep 2.5; echo x`") && text.contains("**Done**"),
        "{text}"
    );
}

#[tokio::test]
async fn a_resumed_turn_continues_the_same_card_with_higher_sequences() {
    let env = env(&[("SSHMODE_TURN_LEASE_SECS", "2")]).await;
    let section = unique("oc_resume");
    let msg = unique("om_resume");
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": "sleep 1.5; echo first"})),
        )
        .push(MODEL, say("the answer"));
    accept(&env.app, &section, &msg, "q").await;
    // While the card shows the first step running, Lark starts holding the answer; the runner
    // dies while it is being sent.
    eventually(
        "the first step running on the card",
        Duration::from_secs(20),
        || async {
            env.lark.cards().first().is_some_and(|c| {
                let t = c.element("steps");
                c.sent && t.contains("⏳") && t.contains("`sleep 1.5; echo first`")
            })
        },
    )
    .await;
    env.lark.hold(&format!("/messages/{msg}/reply"));
    eventually("the answer being sent", Duration::from_secs(20), || async {
        replies(&env.lark, &msg, "post").len() == 1
    })
    .await;
    env.app.state.turns.halt_abruptly();
    // The card was created showing the running step: it may have had no update yet.
    let before = env.lark.cards()[0].ops.last().map_or(0, |o| o.1);
    env.lark.release();
    let other = builder(&env.llm, &env.lark, &env.control)
        .var("SSHMODE_PROGRESS", "true")
        .var("SSHMODE_TURN_LEASE_SECS", "2")
        .database(&env.app.db_url)
        .spawn()
        .await;
    assert_eq!(wait_turns_ended(&other, &section, 1).await, vec!["done"]);
    let card = closed_card(&env.lark).await;
    assert_eq!(env.lark.cards().len(), 1, "the same card");
    assert_eq!(replies(&env.lark, &msg, "interactive").len(), 1);
    assert!(strictly_increasing(&card), "{:?}", card.ops);
    assert!(card.refusals.is_empty(), "{:?}", card.refusals);
    let after: Vec<i64> = card
        .ops
        .iter()
        .map(|o| o.1)
        .filter(|s| *s > before)
        .collect();
    assert!(
        after.len() >= 2,
        "the resumed runner wrote on: {:?}",
        card.ops
    );
    let steps = card.element("steps");
    assert!(steps.contains("**Done**"), "{steps}");
    // The step the first runner finished is listed again by the one that resumed.
    assert!(steps.contains("Resumed after an interruption"), "{steps}");
    assert!(
        steps.contains("✅ **terminal** · local · `sleep 1.5; echo first` · exit 0"),
        "{steps}"
    );
}

/// A click on a progress card's Stop button as Lark sends it.
fn stop_click(event_id: &str, operator: &str, chat: &str, value: &Value) -> Value {
    json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "event_type": "card.action.trigger",
            "create_time": chrono::Utc::now().timestamp_millis().to_string(), "token": TOKEN,
            "app_id": crate::fake_lark::APP_ID, "tenant_key": "tk"},
        "event": {
            "operator": {"open_id": operator, "tenant_key": "tk"},
            "token": "c-update-token",
            "action": {"value": value, "tag": "button"},
            "host": "im_message",
            "context": {"open_message_id": "om_card", "open_chat_id": chat}
        }
    })
}

#[tokio::test]
async fn the_stop_button_stops_the_turn_and_the_remote_process() {
    if !sshd::available() {
        return;
    }
    let env = env(&[("LARK_ENCRYPT_KEY", ENCRYPT_KEY)]).await;
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_below(dir.path());
    add_target(&env.app, &sshd, dir.path(), "web").await;
    let thread = unique("omt_btn");
    env.control.bind(&thread, Place::Target("web".into()));
    let secs = 300 + (rand_u16() % 600);
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": format!("sleep {secs}")})),
        )
        .push(MODEL, say("never reached"));
    let msg = unique("om_btn");
    accept(&env.app, &thread, &msg, "wait").await;
    let pattern = format!("sleep {secs}");
    eventually("the remote sleep", Duration::from_secs(20), || {
        remote_pgrep(&env.app, &pattern)
    })
    .await;
    let card = env.lark.cards()[0].clone();
    let value = card.data["body"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["tag"] == "button")
        .expect("a Stop button")["behaviors"][0]["value"]
        .clone();

    // Clicked from another chat (a forwarded card): refused with a toast at once, audited,
    // and the turn runs on.
    let (status, answer) = post(
        &env.app,
        sealed_now(&stop_click(
            "ev_stop_1",
            "ou_stranger",
            "oc_elsewhere",
            &value,
        )),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["toast"]["type"], "error", "{answer}");
    assert!(
        answer["toast"]["content"]
            .as_str()
            .unwrap()
            .contains("Only members"),
        "{answer}"
    );
    eventually(
        "the refusal's audit row",
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM audit_log
             WHERE action = 'turn.stop' AND outcome = 'refused' AND actor = 'ou_stranger'",
            )
            .fetch_one(&env.app.state.db)
            .await
            .unwrap()
                == 1
        },
    )
    .await;
    assert_eq!(turn_states(&env.app, &thread).await, vec!["running"]);

    // Clicked in the card's own chat: answered at once, then the turn stops.
    let (status, answer) = post(
        &env.app,
        sealed_now(&stop_click("ev_stop_2", "ou_clicker", "oc_chat", &value)),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["toast"]["type"], "info", "{answer}");
    eventually("the stopped turn", Duration::from_secs(10), || async {
        turn_states(&env.app, &thread).await == vec!["stopped"]
    })
    .await;
    eventually(
        "the remote sleep to be gone",
        Duration::from_secs(10),
        || async { !remote_pgrep(&env.app, &pattern).await },
    )
    .await;
    let card = closed_card(&env.lark).await;
    let text = card.element("steps");
    assert!(
        text.contains("Stopped by <at id=ou_clicker></at>"),
        "{text}"
    );
    assert!(text.contains("**Stopped**"), "{text}");
    // A click after the end changes nothing.
    let toast = sshmode::progress::on_stop_click(
        &env.app.state.progress,
        &env.app.state.agent,
        &value,
        "ou_clicker",
        true,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(toast.contains("already finished"), "{toast}");
    drop(sshd);
}

#[tokio::test]
async fn cardkit_errors_fall_back_to_a_patched_card_message() {
    let env = env(&[]).await;
    env.lark.cardkit_down(99991672);
    let section = unique("oc_patch");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "echo a"})))
        .push(
            MODEL,
            call("terminal", json!({"command": "sleep 2; echo b"})),
        )
        .push(MODEL, say("patched along"));
    let msg = unique("om_patch");
    accept(&env.app, &section, &msg, "q").await;
    wait_turns_ended(&env.app, &section, 1).await;
    let sent = replies(&env.lark, &msg, "interactive");
    assert_eq!(sent.len(), 1, "{sent:?}");
    let card_msg = final_patch_done(&env.lark).await;
    let patches = env.lark.patched(&card_msg);
    assert!(
        patches
            .windows(2)
            .all(|w| w[1].0.duration_since(w[0].0) >= Duration::from_millis(1400)),
        "at most one PATCH per 1.5 s"
    );
    let last = patches.last().unwrap().1.to_string();
    assert!(
        last.contains("echo a") && last.contains("sleep 2; echo b"),
        "{last}"
    );
    assert!(!last.contains("progress_stop"), "no Stop button once ended");
    // Never a text edit; the answer is its own reply.
    assert!(
        env.lark
            .requests()
            .iter()
            .all(|r| r.method != "PUT" || !r.path.contains("/im/v1/messages/"))
    );
    assert_eq!(replies(&env.lark, &msg, "post").len(), 1);
}

#[tokio::test]
async fn refused_cards_leave_the_final_answer_only() {
    let env = env(&[]).await;
    env.lark.refuse_cards();
    let section = unique("oc_none");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "echo a"})))
        .push(MODEL, say("just the answer"));
    let msg = unique("om_none");
    accept(&env.app, &section, &msg, "q").await;
    wait_turns_ended(&env.app, &section, 1).await;
    let posted = env.lark.posted();
    assert_eq!(posted.len(), 1, "{posted:#?}");
    assert_eq!(posted[0]["msg_type"], "post");
    eventually(
        "the progress mode `none`",
        Duration::from_secs(10),
        || async { progress_mode(&env.app, &section).await.as_deref() == Some("none") },
    )
    .await;
    assert!(
        env.lark
            .requests()
            .iter()
            .all(|r| r.method != "PATCH" && r.method != "PUT")
    );
}

#[tokio::test]
async fn a_turn_of_300_steps_stays_under_the_card_limits() {
    let env = env(&[("SSHMODE_MAX_ITERATIONS", "100")]).await;
    let section = unique("oc_many");
    for batch in 0..30 {
        let list: Vec<(&str, Value)> = (0..10)
            .map(|i| {
                (
                    "terminal",
                    json!({"command": format!("echo step-{batch}-{i}")}),
                )
            })
            .collect();
        env.llm.push(MODEL, crate::agent::calls(&list));
    }
    env.llm.push(MODEL, say("three hundred"));
    let msg = unique("om_many");
    accept(&env.app, &section, &msg, "q").await;
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    let card = closed_card(&env.lark).await;
    assert!(!card.refusals.contains(&230025), "{:?}", card.refusals);
    assert!(card.refusals.is_empty(), "{:?}", card.refusals);
    let text = card.element("steps");
    assert!(text.contains("**Done** · 300 steps"), "{text}");
    assert!(text.contains("… 270 earlier steps"), "{text}");
    assert!(text.contains("step-29-9"), "{text}");
    assert!(card.data.to_string().len() < 15 * 1024);
    assert!(busiest_second(&card) <= 5);
}

#[tokio::test]
async fn a_rate_limited_and_an_out_of_sequence_update_are_retried_and_nothing_is_lost() {
    let env = env(&[]).await;
    // The first content update is refused with 230020 (too many operations on the card), the
    // retry with 300317 (the card has seen a higher sequence, as after a lost reservation).
    env.lark.fail_next(
        "/elements/steps/content",
        vec![Failure::Code(230020), Failure::Code(300317)],
    );
    let section = unique("oc_retry");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "echo first"})))
        .push(
            MODEL,
            call("terminal", json!({"command": "sleep 2; echo second"})),
        )
        .push(MODEL, say("fine"));
    let msg = unique("om_retry");
    accept(&env.app, &section, &msg, "q").await;
    wait_turns_ended(&env.app, &section, 1).await;
    let card = closed_card(&env.lark).await;
    let text = card.element("steps");
    assert!(
        text.contains("`echo first`")
            && text.contains("`sleep 2; echo second`")
            && text.contains("**Done**"),
        "{text}"
    );
    // Both refusals were served (while the second step ran), and the writer neither gave up on the card nor fell back.
    let attempts = env.lark.requests_to("/elements/steps/content").len();
    let accepted = card.ops.iter().filter(|o| o.2 == "content").count();
    assert_eq!(attempts, accepted + 2, "{:?}", card.ops);
    assert_eq!(env.lark.cards().len(), 1);
    assert!(env.lark.patched(&msg).is_empty());
    // 300317 moved the sequence past the card's by a whole block, and it kept increasing.
    assert!(strictly_increasing(&card), "{:?}", card.ops);
    let first = card.ops.iter().find(|o| o.2 == "content").map(|o| o.1);
    assert!(first >= Some(100), "no resync jump: {:?}", card.ops);
}

#[tokio::test]
async fn a_card_whose_streaming_cannot_be_re_enabled_is_replaced_by_a_new_one() {
    // Lark closes streaming after 1 s, and refuses to turn it on again once.
    let env = env(&[]).await;
    env.lark.set_cardkit_ttl(Duration::from_secs(1));
    env.lark.fail_next("/settings", vec![Failure::Code(300309)]);
    let section = unique("oc_rotate");
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": "sleep 2.5; echo rotated"})),
        )
        .push(MODEL, say("fine"));
    let msg = unique("om_rotate");
    accept(&env.app, &section, &msg, "q").await;
    wait_turns_ended(&env.app, &section, 1).await;
    let card = closed_card(&env.lark).await;
    let cards = env.lark.cards();
    assert_eq!(cards.len(), 2, "{cards:#?}");
    assert!(
        cards[0].refusals.contains(&300309),
        "{:?}",
        cards[0].refusals
    );
    // The new card was sent and carries the whole turn, from its own sequence.
    assert!(card.sent && card.card_id == cards[1].card_id);
    let text = card.element("steps");
    assert!(
        text.contains("`sleep 2.5; echo rotated`") && text.contains("**Done**"),
        "{text}"
    );
    assert!(strictly_increasing(&card), "{:?}", card.ops);
    assert!(env.lark.patched(&msg).is_empty());
}

/// What a prompt-injected model writes to ping people: Lark's mention tags in each spelling,
/// inside links, as HTML entities, and inside code.
const MENTIONS: [&str; 10] = [
    "<at id=all></at>",
    "<at user_id=\"all\">everyone</at>",
    "<at id=\"ou_x\"></at>",
    "<AT ID = ALL></AT>",
    "[<at id=all></at>](https://example.com)",
    "[all](<at user_id=\"ou_x\"></at>)",
    "&lt;at id=all&gt;&lt;/at&gt;",
    "&#60;at id=all&#62;&#60;/at&#62;",
    "`<at id=all></at>`",
    "<person id=\"ou_x\"></person>",
];

/// Whether a renderer that decodes entities and ignores case and spacing could read a mention
/// (or a person tag) in `s`.
pub(crate) fn could_mention(s: &str) -> bool {
    let decoded = s
        .replace("&lt;", "<")
        .replace("&#60;", "<")
        .replace("&#x3c;", "<")
        .to_ascii_lowercase();
    decoded.match_indices('<').any(|(i, _)| {
        let t = decoded[i + 1..].trim_start();
        let t = t.strip_prefix('/').map(str::trim_start).unwrap_or(t);
        t.starts_with("at") || t.starts_with("person")
    })
}

#[tokio::test]
async fn an_answer_that_tries_to_mention_everyone_reaches_lark_mentioning_no_one() {
    let env = env(&[("LARK_ENCRYPT_KEY", ENCRYPT_KEY)]).await;
    let answer = format!(
        "{}\n\nDone: **bold**, a [link](https://example.com), `Vec<u8>`.\n```\n{}\n```",
        MENTIONS.join(" "),
        MENTIONS.join("\n")
    );
    env.llm
        .push(
            MODEL,
            call(
                "terminal",
                json!({"command": "echo '<at id=all></at> &lt;at id=all&gt;'"}),
            ),
        )
        .push(MODEL, say(&answer));
    // A signed message from a person in a one-to-one chat starts the turn.
    let chat = unique("oc_at");
    let mut m = crate::lark_support::Msg::new(&unique("ev_at"), "what is up?");
    m.chat_id = chat.clone();
    let (status, body) = post(&env.app, sealed_now(&m.envelope(TOKEN))).await;
    assert_eq!(status, 200, "{body}");
    eventually("the turn", Duration::from_secs(20), || async {
        !turn_states(&env.app, &chat).await.is_empty()
    })
    .await;
    assert_eq!(wait_turns_ended(&env.app, &chat, 1).await, vec!["done"]);

    // The answer post: every mention broken, the Markdown a post renders kept; a code span
    // (which a post's `md` does not render) is its bare text, its tag broken like any other.
    let posts = replies(&env.lark, &m.message_id, "post");
    assert_eq!(posts.len(), 1, "{posts:#?}");
    let content: Value = serde_json::from_str(posts[0]["content"].as_str().unwrap()).unwrap();
    let md = content["zh_cn"]["content"][0][0]["text"].as_str().unwrap();
    assert!(!could_mention(md), "{md}");
    assert!(!could_mention(&posts[0].to_string()));
    for kept in [
        "**bold**",
        "[link](https://example.com)",
        "Vec＜u8>",
        "at id=all",
    ] {
        assert!(md.contains(kept), "{kept}: {md}");
    }
    assert!(!md.contains("`Vec"), "{md}");
    // The progress card: the command's short form and the answer's lines in the summary.
    let card = closed_card(&env.lark).await;
    let steps = card.element("steps");
    assert!(steps.contains("Answer (full text"), "{steps}");
    assert!(steps.contains("at id=all"), "{steps}");
    assert!(!could_mention(&card.data.to_string()), "{:#}", card.data);
    for op in env.lark.requests() {
        assert!(
            !could_mention(&op.body.to_string()),
            "{} {}",
            op.path,
            op.body
        );
    }
}

/// The card's header: its title and colour.
fn header(card: &Value) -> (String, String) {
    (
        card["header"]["title"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        card["header"]["template"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// Whether a card (a CardKit card's data, or a PATCHed card) still has a button.
fn has_button(card: &Value) -> bool {
    card["body"]["elements"]
        .as_array()
        .is_some_and(|a| a.iter().any(|e| e["tag"] == "button"))
}

/// Messages created in the fake, as their types in order.
fn created_types(lark: &FakeLark) -> Vec<String> {
    lark.posted()
        .iter()
        .map(|p| p["msg_type"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn transient_cardkit_refusals_are_retried_on_the_same_card() {
    let env = env(&[]).await;
    // The card is busy in an interaction (200810), then has an internal error (300120), then
    // answers 500 to every attempt the client makes of one call.
    env.lark.fail_card(
        0,
        vec![
            Failure::Code(200810),
            Failure::Code(300120),
            Failure::ServerError,
            Failure::ServerError,
            Failure::ServerError,
            Failure::ServerError,
        ],
    );
    let section = unique("oc_transient");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "echo first"})))
        .push(MODEL, call("terminal", json!({"command": "echo second"})))
        .push(MODEL, say("fine"));
    let msg = unique("om_transient");
    accept(&env.app, &section, &msg, "q").await;
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    let card = closed_card(&env.lark).await;
    assert_eq!(
        card.refusals,
        vec![200810, 300120, 500, 500, 500, 500],
        "{:?}",
        card.ops
    );
    // One card, one card message, never PATCHed: every refused write went to the same card.
    assert_eq!(env.lark.cards().len(), 1);
    assert_eq!(
        created_types(&env.lark),
        vec!["interactive".to_string(), "post".to_string()]
    );
    assert!(
        env.lark
            .requests()
            .iter()
            .all(|r| r.method != "PATCH" || !r.path.contains("/im/v1/messages/"))
    );
    let text = card.element("steps");
    assert!(
        text.contains("`echo first`")
            && text.contains("`echo second`")
            && text.contains("**Done**"),
        "{text}"
    );
    assert!(strictly_increasing(&card), "{:?}", card.ops);
    assert!(!has_button(&card.data), "{:#}", card.data);
}

#[tokio::test]
async fn a_card_cardkit_gives_up_on_mid_turn_is_patched_in_place_never_posted_twice() {
    let env = env(&[]).await;
    let section = unique("oc_inplace");
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": "sleep 2; echo slow"})),
        )
        .push(MODEL, say("patched in place"));
    let msg = unique("om_inplace");
    accept(&env.app, &section, &msg, "q").await;
    eventually("the running step", Duration::from_secs(20), || async {
        env.lark.cards().first().is_some_and(|c| {
            c.sent
                && c.element("steps")
                    .contains("`sleep 2; echo slow` · running")
        })
    })
    .await;
    // The app loses CardKit while the step runs (its scope revoked).
    env.lark.cardkit_down(99991672);
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    let card_msg = final_patch_done(&env.lark).await;
    // The card message that held the CardKit card now holds the whole card; no second one.
    assert_eq!(
        replies(&env.lark, &msg, "interactive").len(),
        1,
        "{:#?}",
        env.lark.posted()
    );
    let last = env.lark.patched(&card_msg).last().unwrap().1.clone();
    assert!(last.to_string().contains("sleep 2; echo slow"), "{last}");
    assert!(!has_button(&last), "no Stop once ended: {last}");
    assert_eq!(header(&last), ("Done · local".into(), "green".into()));
    assert_eq!(replies(&env.lark, &msg, "post").len(), 1);
}

#[tokio::test]
async fn a_finished_card_says_how_the_turn_ended_and_an_old_stop_says_it_finished() {
    let env = env(&[("LARK_ENCRYPT_KEY", ENCRYPT_KEY)]).await;
    // Done: the final card says so, in green, with no Stop button left.
    let section = unique("oc_final");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "echo done"})))
        .push(MODEL, say("all done"));
    accept(&env.app, &section, &unique("om_final"), "q").await;
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    let card = closed_card(&env.lark).await;
    assert_eq!(header(&card.data), ("Done · local".into(), "green".into()));
    assert!(!has_button(&card.data), "{:#}", card.data);
    assert!(card.refusals.is_empty(), "{:?}", card.refusals);
    assert!(strictly_increasing(&card), "{:?}", card.ops);

    // Stopped from its card: the final card says "Stopped", and a later click on the Stop
    // button a client still shows is told the task has finished.
    let section = unique("oc_final_stop");
    let secs = 300 + (rand_u16() % 600);
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": format!("sleep {secs}")})),
        )
        .push(MODEL, say("never reached"));
    accept(&env.app, &section, &unique("om_final_stop"), "wait").await;
    let running = || {
        env.lark
            .cards()
            .into_iter()
            .find(|c| c.element("steps").contains(&format!("`sleep {secs}`")))
    };
    eventually("the running sleep", Duration::from_secs(20), || async {
        running().is_some()
    })
    .await;
    let value = running().unwrap().data["body"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["tag"] == "button")
        .expect("a Stop button while running")["behaviors"][0]["value"]
        .clone();
    let chat = value["chat"].as_str().unwrap().to_string();
    let (status, answer) = post(
        &env.app,
        sealed_now(&stop_click(&unique("ev_stop"), "ou_clicker", &chat, &value)),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["toast"]["content"], "Stopping the task…", "{answer}");
    assert_eq!(
        wait_turns_ended(&env.app, &section, 1).await,
        vec!["stopped"]
    );
    let card = closed_card(&env.lark).await;
    assert!(card.element("steps").contains(&format!("`sleep {secs}`")));
    assert_eq!(
        header(&card.data),
        ("Stopped · local".into(), "grey".into())
    );
    assert!(!has_button(&card.data), "{:#}", card.data);
    let (status, answer) = post(
        &env.app,
        sealed_now(&stop_click(&unique("ev_stop"), "ou_clicker", &chat, &value)),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["toast"]["type"], "info", "{answer}");
    assert_eq!(
        answer["toast"]["content"], "This task has already finished.",
        "{answer}"
    );
}

/// Where the card and the answer landed: the answer is the last message, and a card, if any,
/// came before it.
fn card_above_answer(lark: &FakeLark) {
    let types = created_types(lark);
    let answer = types.iter().position(|t| t == "post").expect("the answer");
    assert!(
        types[answer..].iter().all(|t| t != "interactive"),
        "a card landed below the answer: {types:?}"
    );
}

#[tokio::test]
async fn a_turn_that_answers_before_its_card_is_posted_gets_no_card() {
    // CardKit is slow to create the card: the quick turn's answer is ready first, and waits
    // for the card one second at most.
    let env = env(&[("SSHMODE_PROGRESS_ANSWER_WAIT_MS", "1000")]).await;
    env.lark.hold("/open-apis/cardkit/v1/cards");
    let section = unique("oc_quick");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "echo quick"})))
        .push(MODEL, say("quick answer"));
    let msg = unique("om_quick");
    accept(&env.app, &section, &msg, "q").await;
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    env.lark.release();
    // The writer decides once the card exists: a card, or none.
    eventually(
        "the card's fate stored",
        Duration::from_secs(20),
        || async { progress_mode(&env.app, &section).await.is_some() },
    )
    .await;
    card_above_answer(&env.lark);
    assert_eq!(created_types(&env.lark), vec!["post".to_string()]);
}

#[tokio::test]
async fn a_card_being_posted_is_recorded_before_the_answer_goes_out() {
    let env = env(&[]).await;
    // Lark is slow to take the card message: the answer is ready while the card's reply waits.
    env.lark.hold_cards();
    let section = unique("oc_order");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "echo quick"})))
        .push(MODEL, say("the answer"));
    let msg = unique("om_order");
    accept(&env.app, &section, &msg, "q").await;
    env.lark
        .wait_until("the card's reply", |rs| {
            rs.iter()
                .any(|r| r.path.contains("/reply") && r.body["msg_type"] == "interactive")
        })
        .await;
    eventually("the final model call", Duration::from_secs(20), || async {
        env.llm.count(MODEL) == 2
    })
    .await;
    // The answer waits for the card.
    assert!(replies(&env.lark, &msg, "post").is_empty());
    assert_eq!(turn_states(&env.app, &section).await, vec!["running"]);
    env.lark.release_cards();
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    card_above_answer(&env.lark);
    assert_eq!(
        created_types(&env.lark),
        vec!["interactive".to_string(), "post".to_string()]
    );
    let card = closed_card(&env.lark).await;
    assert!(card.element("steps").contains("`echo quick`"));
}

/// The id of the turn's card message, once its last PATCH shows the turn done.
async fn final_patch_done(lark: &FakeLark) -> String {
    let card_msg = lark
        .posted()
        .into_iter()
        .find(|p| p["msg_type"] == "interactive")
        .unwrap()["message_id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually("the final PATCH", Duration::from_secs(20), || async {
        lark.patched(&card_msg).last().is_some_and(|(_, c)| {
            c["body"]["elements"][0]["content"]
                .as_str()
                .is_some_and(|t| t.contains("**Done**"))
        })
    })
    .await;
    card_msg
}

/// The progress mode stored with the section's turn (`None` while the writer has not decided).
async fn progress_mode(app: &crate::helpers::TestApp, section: &str) -> Option<String> {
    sqlx::query_scalar("SELECT progress_mode FROM turns WHERE section_id = $1")
        .bind(section)
        .fetch_one(&app.state.db)
        .await
        .unwrap()
}
