//! The agent through chat control, end to end: signed webhook events into the running app, the
//! real dispatcher and bindings, the scripted fake model, the fake Lark and the real sshd.
//! What starts a turn (a mention, a thread the bot opened or answered in, never a command), a
//! thread opened by `/ssh use` acting remotely while its parent acts locally, the model's own
//! `ssh_mode` under the real authorisation, `/stop` sent as a chat message, and a bound thread
//! whose target its chat may no longer use (allow-list, re-added alias): it stays bound, every
//! call fails, the thread is told once, and `/ssh local` frees it.

use std::io::Cursor;
use std::time::Duration;

use serde_json::json;
use sshmode::exec::Place;
use sshmode::target::cli::{AddArgs, AllowArgs, HostKeyPolicyArg, TargetCmd, run_with};

use crate::agent::{
    Env, MODEL, call, calls, rand_u16, reactions, remote_pgrep, replies_to, say, tool_results,
    turn_states, unique, wait_turns_ended,
};
use crate::fake_lark::FakeLark;
use crate::helpers::{TestApp, eventually};
use crate::lark_support::*;
use crate::sshd;

/// The app with the real chat control, and a target `web` on a fresh sshd.
async fn env() -> Env {
    Env::builder().chat_control().target("web").spawn().await
}

async fn send(app: &TestApp, m: &Msg) {
    let (status, body) = post(app, sealed(&m.envelope(TOKEN), ENCRYPT_KEY, now_secs())).await;
    assert_eq!(status, 200, "{body}");
}

/// A group message; `mention` puts the bot's @mention first.
fn group(id: &str, text: &str, mention: bool) -> Msg {
    let mut m = if mention {
        Msg::new(id, &format!("@_user_1 {text}"))
    } else {
        Msg::new(id, text)
    };
    m.chat_type = "group";
    m.mention_bot = mention;
    m
}

/// The same in a thread whose root is `root`.
fn in_thread(id: &str, text: &str, mention: bool, thread: &str, root: &str) -> Msg {
    let mut m = group(id, text, mention);
    m.thread_id = Some(thread.into());
    m.root_id = Some(root.into());
    m
}

async fn place(app: &TestApp, section: &str) -> Place {
    sshmode::chat::binding::resolve_place(&app.state.db, section, app.state.clock.now())
        .await
        .unwrap()
}

fn remote_home() -> String {
    format!("/home/{}", sshd::USER)
}

/// Texts of the plain-text (command) replies to `om`.
fn command_replies(lark: &FakeLark, om: &str) -> Vec<String> {
    lark.requests_to(&format!("/messages/{om}/reply"))
        .iter()
        .map(|r| crate::fake_lark::message_text(r.body["content"].as_str().unwrap()))
        .collect()
}

#[tokio::test]
async fn a_thread_opened_by_ssh_use_runs_remotely_and_its_parent_locally() {
    let env = env().await;
    let app = &env.app;
    let name = unique("f");

    // `/ssh use web` in the parent chat opens a thread bound to the target. A command is never
    // a turn.
    send(app, &group("use", "/ssh use web", true)).await;
    wait_state(app, "use", "done").await;
    assert_eq!(place(app, "omt_use").await, Place::Target("web".into()));
    assert!(turn_states(app, "oc_chat").await.is_empty());
    assert!(turn_states(app, "omt_use").await.is_empty());

    // A message in that thread, without any @mention, is a turn; its tools act on the target.
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": "id -un; cd ~ && pwd"})),
        )
        .push(
            MODEL,
            call(
                "write_file",
                json!({"path": format!("~/{name}.txt"), "content": "remote\n"}),
            ),
        )
        .push(
            MODEL,
            call("read_file", json!({"path": format!("~/{name}.txt")})),
        )
        .push(MODEL, say("remote done"));
    send(
        app,
        &in_thread("t1", "who are you here?", false, "omt_use", "om_use"),
    )
    .await;
    assert_eq!(wait_turns_ended(app, "omt_use", 1).await, vec!["done"]);
    let r = tool_results(&env.llm);
    let home = remote_home();
    assert!(r[0].contains(&format!("{}\n{home}", sshd::USER)), "{r:?}");
    assert!(r[1].contains(&format!("{home}/{name}.txt")), "{r:?}");
    assert!(r[2].contains("remote"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(format!("{home}/{name}.txt")).unwrap(),
        "remote\n"
    );
    assert_eq!(
        replies_to(&env.lark, "om_t1"),
        vec![(true, "remote done".to_string())]
    );
    assert_eq!(reactions(&env.lark, "om_t1"), vec!["OnIt"]);

    // The model cannot clear the user's (sticky) binding.
    env.llm
        .push(MODEL, call("ssh_mode", json!({"action": "request_local"})))
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("still there"));
    send(
        app,
        &in_thread("t2", "go back to local", false, "omt_use", "om_use"),
    )
    .await;
    wait_turns_ended(app, "omt_use", 2).await;
    let r = tool_results(&env.llm);
    let n = r.len();
    assert!(r[n - 2].contains("bound to `web` by a user"), "{r:?}");
    assert!(r[n - 1].contains(sshd::USER), "{r:?}");
    assert_eq!(place(app, "omt_use").await, Place::Target("web".into()));

    // In the parent, a message that does not mention the bot is not for it …
    send(app, &group("quiet", "just chatting", false)).await;
    wait_state(app, "quiet", "done").await;
    assert!(turn_states(app, "oc_chat").await.is_empty());
    assert!(env.lark.requests_to("/messages/om_quiet/").is_empty());

    // … and one that does runs locally, answered in place.
    env.llm
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(
            MODEL,
            call(
                "write_file",
                json!({"path": format!("{name}.local"), "content": "here\n"}),
            ),
        )
        .push(MODEL, say("local done"));
    send(app, &group("p1", "who are you?", true)).await;
    assert_eq!(wait_turns_ended(app, "oc_chat", 1).await, vec!["done"]);
    let r = tool_results(&env.llm);
    assert!(!r[0].contains(sshd::USER), "{r:?}");
    assert!(
        r[1].contains(&format!("{name}.local")) && !r[1].contains(&home),
        "{r:?}"
    );
    assert!(!std::path::Path::new(&format!("{home}/{name}.local")).exists());
    assert_eq!(
        replies_to(&env.lark, "om_p1"),
        vec![(false, "local done".to_string())]
    );
    assert_eq!(reactions(&env.lark, "om_p1"), vec!["OnIt"]);
}

#[tokio::test]
async fn the_model_enters_a_target_only_under_a_grant_made_in_the_chat() {
    let env = env().await;
    let app = &env.app;
    // A thread the bot did not open: the first message mentions it; after the bot answered
    // there, messages without a mention are turns too.
    let thread = "omt_free";
    env.llm
        .push(
            MODEL,
            call(
                "ssh_mode",
                json!({"action": "request_use", "target": "web"}),
            ),
        )
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("stayed local"));
    send(app, &in_thread("y1", "go to web", true, thread, "om_root")).await;
    assert_eq!(wait_turns_ended(app, thread, 1).await, vec!["done"]);
    let r = tool_results(&env.llm);
    assert!(r[0].contains("I may not enter `web` by myself"), "{r:?}");
    assert!(!r[1].contains(sshd::USER), "{r:?}");
    assert_eq!(place(app, thread).await, Place::Local);

    // A user grants it in the thread (a command, not a turn).
    send(
        app,
        &in_thread("grant", "/ssh yolo on web", false, thread, "om_root"),
    )
    .await;
    wait_state(app, "grant", "done").await;
    let said = command_replies(&env.lark, "om_grant").join("");
    assert!(said.contains("may now enter web"), "{said}");
    assert_eq!(turn_states(app, thread).await.len(), 1);

    env.llm
        .push(
            MODEL,
            call(
                "ssh_mode",
                json!({"action": "request_use", "target": "web"}),
            ),
        )
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, call("ssh_mode", json!({"action": "request_local"})))
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("in and out"));
    send(
        app,
        &in_thread("y2", "now go to web", false, thread, "om_root"),
    )
    .await;
    assert_eq!(wait_turns_ended(app, thread, 2).await, vec!["done", "done"]);
    let r = tool_results(&env.llm);
    let n = r.len();
    assert!(r[n - 4].contains("now runs on `web`"), "{r:?}");
    assert!(r[n - 3].contains(sshd::USER), "{r:?}");
    assert!(r[n - 2].contains("runs locally again"), "{r:?}");
    assert!(!r[n - 1].contains(sshd::USER), "{r:?}");
    assert_eq!(place(app, thread).await, Place::Local);
    assert_eq!(
        replies_to(&env.lark, "om_y2"),
        vec![(true, "in and out".to_string())]
    );

    // A mention-free message without text in the bot's thread asks nothing.
    send(app, &in_thread("blank", "", false, thread, "om_root")).await;
    wait_state(app, "blank", "done").await;
    assert_eq!(turn_states(app, thread).await.len(), 2);

    // A thread message that mentions nobody, in a thread the bot has never been in: no turn.
    send(
        app,
        &in_thread("other", "not for you", false, "omt_other", "om_r2"),
    )
    .await;
    wait_state(app, "other", "done").await;
    assert!(turn_states(app, "omt_other").await.is_empty());
}

/// Calls of one reply each resolve the backend and the working directory after the call before
/// them has ended (the runner reads them while the previous result commits, never earlier).
#[tokio::test]
async fn each_call_of_one_reply_sees_what_the_call_before_it_changed() {
    let env = env().await;
    let app = &env.app;
    let thread = "omt_batch";
    send(
        app,
        &in_thread("g", "/ssh yolo on web", true, thread, "om_broot"),
    )
    .await;
    wait_state(app, "g", "done").await;
    env.llm
        .push(
            MODEL,
            calls(&[
                ("terminal", json!({"command": "id -un"})),
                (
                    "ssh_mode",
                    json!({"action": "request_use", "target": "web"}),
                ),
                ("terminal", json!({"command": "id -un"})),
                ("terminal", json!({"command": "cd /tmp"})),
                ("terminal", json!({"command": "pwd"})),
                ("ssh_mode", json!({"action": "request_local"})),
                ("terminal", json!({"command": "id -un"})),
            ]),
        )
        .push(MODEL, say("batch done"));
    send(app, &in_thread("b1", "do all", true, thread, "om_broot")).await;
    assert_eq!(wait_turns_ended(app, thread, 1).await, vec!["done"]);
    let r = tool_results(&env.llm);
    assert_eq!(r.len(), 7, "{r:?}");
    assert!(!r[0].contains(sshd::USER), "{r:?}");
    assert!(r[1].contains("now runs on `web`"), "{r:?}");
    assert!(r[2].contains(sshd::USER), "{r:?}");
    assert!(r[4].contains("stdout:\n/tmp\n"), "{r:?}");
    assert!(r[5].contains("runs locally again"), "{r:?}");
    assert!(!r[6].contains(sshd::USER), "{r:?}");
    assert_eq!(place(app, thread).await, Place::Local);
}

#[tokio::test]
async fn stop_sent_in_the_chat_kills_the_remote_command_and_tells_the_user() {
    let env = env().await;
    let app = &env.app;
    send(app, &group("use", "/ssh use web", true)).await;
    wait_state(app, "use", "done").await;

    let secs = 300 + (rand_u16() % 600);
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": format!("sleep {secs}")})),
        )
        .push(MODEL, say("never reached"));
    send(
        app,
        &in_thread("long", "wait a while", false, "omt_use", "om_use"),
    )
    .await;
    let pattern = format!("sleep {secs}");
    eventually("the remote sleep", Duration::from_secs(20), || {
        remote_pgrep(app, &pattern)
    })
    .await;

    send(app, &in_thread("stop", "/stop", false, "omt_use", "om_use")).await;
    eventually("the stopped turn", Duration::from_secs(10), || async {
        turn_states(app, "omt_use")
            .await
            .first()
            .map(String::as_str)
            == Some("stopped")
    })
    .await;
    eventually(
        "the remote sleep to be gone",
        Duration::from_secs(10),
        || async { !remote_pgrep(app, &pattern).await },
    )
    .await;
    let told = replies_to(&env.lark, "om_long");
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].0, "the answer stays in the thread");
    assert!(told[0].1.starts_with("Stopped by /stop"), "{told:?}");
    assert!(told[0].1.contains(&pattern), "{told:?}");
    assert_eq!(reactions(&env.lark, "om_long"), vec!["OnIt", "CrossMark"]);
    wait_state(app, "stop", "done").await;
    let said = command_replies(&env.lark, "om_stop").join("");
    assert!(said.contains("Stopping"), "{said}");
}

/// Runs `sshmode target …` against the app's database, as an operator would.
async fn target_cli(app: &TestApp, cmd: TargetCmd) {
    let mut out = Vec::new();
    let r = run_with(
        cmd,
        &app.state.config,
        &app.state.db,
        &mut Cursor::new(Vec::new()),
        &mut out,
    )
    .await
    .map_err(|e| format!("{e:#}"));
    assert_eq!(r, Ok(0), "{}", String::from_utf8_lossy(&out));
}

/// The replies to `om` that tell the thread its binding fails.
fn binding_notices(lark: &FakeLark, om: &str) -> Vec<(bool, String)> {
    replies_to(lark, om)
        .into_iter()
        .filter(|(_, t)| t.starts_with("This thread is bound to web"))
        .collect()
}

async fn refused_uses(app: &TestApp, section: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT detail->>'reason', detail->>'tool' FROM audit_log
         WHERE section = $1 AND action = 'binding.use' AND outcome = 'refused' ORDER BY id",
    )
    .bind(section)
    .fetch_all(&app.state.db)
    .await
    .unwrap()
}

/// A thread bound with `/ssh use web` and one turn that ran there.
async fn bound_and_used(env: &Env) {
    let app = &env.app;
    send(app, &group("use", "/ssh use web", true)).await;
    wait_state(app, "use", "done").await;
    env.llm
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("on web"));
    send(app, &in_thread("t1", "who?", false, "omt_use", "om_use")).await;
    assert_eq!(wait_turns_ended(app, "omt_use", 1).await, vec!["done"]);
    assert!(tool_results(&env.llm)[0].contains(sshd::USER));
}

/// The next turn's two calls fail with `why`; the thread stays bound and is told once; a
/// later turn fails too without telling again; `/ssh local` frees it and a call runs locally.
async fn fails_until_released(env: &Env, why: &str, reason: &str) {
    let app = &env.app;
    env.llm
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(
            MODEL,
            call("write_file", json!({"path": "x.txt", "content": "x"})),
        )
        .push(MODEL, say("it failed"));
    send(app, &in_thread("t2", "again", false, "omt_use", "om_use")).await;
    assert_eq!(wait_turns_ended(app, "omt_use", 2).await.len(), 2);
    let r = tool_results(&env.llm);
    let n = r.len();
    let want = format!("error: This thread is bound to `web`, which {why}");
    for got in &r[n - 2..] {
        assert!(got.starts_with(&want), "{r:?}");
        assert!(got.contains("/ssh local"), "{r:?}");
    }
    assert_eq!(place(app, "omt_use").await, Place::Target("web".into()));
    let told = binding_notices(&env.lark, "om_t2");
    assert_eq!(told.len(), 1, "told once: {told:?}");
    assert!(told[0].0, "in the thread");
    assert!(told[0].1.contains(why), "{told:?}");

    env.llm
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("still failing"));
    send(
        app,
        &in_thread("t3", "and now?", false, "omt_use", "om_use"),
    )
    .await;
    assert_eq!(wait_turns_ended(app, "omt_use", 3).await.len(), 3);
    assert!(
        tool_results(&env.llm).last().unwrap().starts_with(&want),
        "{:?}",
        tool_results(&env.llm)
    );
    assert!(binding_notices(&env.lark, "om_t3").is_empty());
    let refused = refused_uses(app, "omt_use").await;
    assert_eq!(
        refused,
        [
            (reason.into(), "terminal".into()),
            (reason.into(), "write_file".into()),
            (reason.into(), "terminal".into()),
        ]
    );

    send(
        app,
        &in_thread("off", "/ssh local", false, "omt_use", "om_use"),
    )
    .await;
    wait_state(app, "off", "done").await;
    assert_eq!(place(app, "omt_use").await, Place::Local);
    env.llm
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("local now"));
    send(
        app,
        &in_thread("t4", "and now?", false, "omt_use", "om_use"),
    )
    .await;
    assert_eq!(wait_turns_ended(app, "omt_use", 4).await.len(), 4);
    let last = tool_results(&env.llm).last().cloned().unwrap();
    assert!(
        !last.starts_with("error") && !last.contains(sshd::USER),
        "{last}"
    );
}

#[tokio::test]
async fn a_chat_taken_off_the_allow_list_stays_bound_and_fails_until_released() {
    let env = env().await;
    bound_and_used(&env).await;
    target_cli(
        &env.app,
        TargetCmd::Allow(AllowArgs {
            alias: "web".into(),
            chats: vec!["oc_other".into()],
            all_chats: false,
        }),
    )
    .await;
    fails_until_released(
        &env,
        "is no longer allowed in this chat",
        "not_allowed_here",
    )
    .await;
}

#[tokio::test]
async fn a_re_added_alias_is_not_the_target_its_old_bindings_were_made_for() {
    let env = env().await;
    bound_and_used(&env).await;
    // Removed and added again, approved, on another host: a new generation.
    target_cli(
        &env.app,
        TargetCmd::Remove {
            alias: "web".into(),
        },
    )
    .await;
    target_cli(
        &env.app,
        TargetCmd::Add(AddArgs {
            alias: "web".into(),
            host: "elsewhere.invalid".into(),
            port: 22,
            user: "ops".into(),
            key: None,
            passphrase_stdin: false,
            password_stdin: false,
            agent: true,
            cert: None,
            description: None,
            host_key_policy: HostKeyPolicyArg::Tofu,
            host_key: None,
            approve: true,
            offline: true,
            jump: None,
        }),
    )
    .await;
    fails_until_released(&env, "has been removed and added again", "replaced").await;
}

/// The calls the fake Lark received, but for those an app makes once (its token, its bot's
/// identity).
fn lark_calls(lark: &FakeLark) -> Vec<String> {
    lark.requests()
        .into_iter()
        .filter(|r| !r.path.contains("/auth/") && !r.path.ends_with("/bot/v3/info"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

/// `sshmode_lark_calls_per_turn`'s count and sum, once `turns` turns were observed.
async fn calls_per_turn(app: &TestApp, turns: u64) -> (u64, f64) {
    let read = || {
        let text = app.state.metrics.render();
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (
            value("sshmode_lark_calls_per_turn_count") as u64,
            value("sshmode_lark_calls_per_turn_sum"),
        )
    };
    eventually(
        "the turn's calls observed",
        Duration::from_secs(10),
        || async { read().0 >= turns },
    )
    .await;
    read()
}

/// A plain question (no tools) costs the receipt and the answer: no progress card, no
/// reaction swap, at most three calls to Lark, and the histogram says so.
#[tokio::test]
async fn a_plain_question_costs_at_most_three_lark_calls_and_makes_no_card() {
    let env = Env::builder().chat_control().progress().spawn().await;
    let app = &env.app;
    env.llm.push(MODEL, say("Paris."));
    send(app, &group("q1", "capital of France?", true)).await;
    assert_eq!(wait_turns_ended(app, "oc_chat", 1).await, vec!["done"]);
    let (count, sum) = calls_per_turn(app, 1).await;
    let calls = lark_calls(&env.lark);
    assert!(calls.len() <= 3, "{calls:?}");
    assert!(env.lark.cards().is_empty(), "{calls:?}");
    assert!(!calls.iter().any(|c| c.contains("cardkit")), "{calls:?}");
    assert_eq!(reactions(&env.lark, "om_q1"), vec!["OnIt"]);
    assert_eq!(
        replies_to(&env.lark, "om_q1"),
        vec![(false, "Paris.".to_string())]
    );
    assert_eq!((count, sum), (1, calls.len() as f64), "{calls:?}");
}

/// A question whose answer needs a tool gets its progress card, made at the first call, and
/// the card's calls count in the turn's.
#[tokio::test]
async fn a_question_with_a_tool_makes_a_progress_card() {
    let env = Env::builder().chat_control().progress().spawn().await;
    let app = &env.app;
    env.llm
        .push(MODEL, call("terminal", json!({"command": "echo hi"})))
        .push(MODEL, say("It said hi."));
    send(app, &group("q2", "run echo hi", true)).await;
    assert_eq!(wait_turns_ended(app, "oc_chat", 1).await, vec!["done"]);
    let (count, sum) = calls_per_turn(app, 1).await;
    assert_eq!(env.lark.cards().len(), 1);
    let calls = lark_calls(&env.lark);
    assert!(calls.iter().any(|c| c.contains("cardkit")), "{calls:?}");
    assert_eq!(count, 1);
    assert!(sum > 3.0 && sum <= calls.len() as f64, "{sum} of {calls:?}");
    assert_eq!(reactions(&env.lark, "om_q2"), vec!["OnIt"]);
}

/// A turn that fails keeps its receipt and adds `CrossMark` beside it; nothing is removed.
#[tokio::test]
async fn a_failed_turn_adds_crossmark_beside_the_receipt() {
    let env = Env::builder().chat_control().spawn().await;
    let app = &env.app;
    env.llm.always(
        MODEL,
        crate::fake_llm::error(400, json!({"error": {"message": "bad request"}})),
    );
    send(app, &group("q3", "anything", true)).await;
    assert_eq!(wait_turns_ended(app, "oc_chat", 1).await, vec!["failed"]);
    eventually("the failure reaction", Duration::from_secs(10), || async {
        reactions(&env.lark, "om_q3").len() == 2
    })
    .await;
    assert_eq!(reactions(&env.lark, "om_q3"), vec!["OnIt", "CrossMark"]);
    let calls = lark_calls(&env.lark);
    assert!(!calls.iter().any(|c| c.starts_with("DELETE")), "{calls:?}");
}

/// An answer of escaped JSON in a code block (log events whose payload is a JSON request
/// with JSON in it): its reply requests are about two and a half times its bytes (`content`
/// is JSON inside the request's JSON), so chunks are sized on the request as sent. Returns
/// the answer and the block's opening line.
fn escaped_json_answer() -> (String, &'static str) {
    let inner = json!({"cmd": "grep \"error\" /var/log/app.log", "path": "C:\\logs\\app"});
    let request = json!({"request": inner.to_string(), "ok": false});
    let line = json!({"event": request.to_string()}).to_string();
    let mut text = String::from("Here is the payload:\n```json\n");
    for i in 0.. {
        if text.len() > 40_000 {
            break;
        }
        text.push_str(&format!("{line} // {i}\n"));
    }
    text.push_str("```\nThat is all.");
    (text, "```json\n")
}

/// The chunks of an answer put back together: a block closed at a chunk's end and reopened
/// at the next one's start is one block again.
fn rejoin(chunks: &[String], reopen: &str) -> String {
    let mut out = String::new();
    for c in chunks {
        let c = match out.strip_suffix("\n```") {
            Some(kept) => {
                out = format!("{kept}\n");
                c.strip_prefix(reopen).expect("the block reopened")
            }
            None => c,
        };
        out.push_str(c);
    }
    out
}

/// The markdown of the posts Lark accepted, in order.
fn posted_markdown(lark: &FakeLark) -> Vec<String> {
    lark.posted()
        .iter()
        .map(|p| {
            let c: serde_json::Value =
                serde_json::from_str(p["body"]["content"].as_str().unwrap()).unwrap();
            c["zh_cn"]["content"][0][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// A long answer of escaped JSON in a code block reaches the chat whole: every reply request
/// is within Lark's 30 KB as sent, the block is closed and reopened at each cut, in order.
#[tokio::test]
async fn an_answer_of_escaped_json_is_cut_to_the_request_limit_and_arrives_whole() {
    let env = Env::builder().chat_control().spawn().await;
    let app = &env.app;
    let (answer, reopen) = escaped_json_answer();
    env.llm.push(MODEL, say(&answer));
    send(app, &group("j1", "show me the payload", true)).await;
    assert_eq!(wait_turns_ended(app, "oc_chat", 1).await, vec!["done"]);
    let requests = env.lark.requests_to("/messages/om_j1/reply");
    assert!(requests.len() >= 3, "{}", requests.len());
    for r in &requests {
        assert!(r.bytes <= 30 * 1024, "{} bytes", r.bytes);
    }
    let chunks = posted_markdown(&env.lark);
    assert_eq!(chunks.len(), requests.len(), "none refused");
    assert_eq!(rejoin(&chunks, reopen), answer);
    let uuids: std::collections::HashSet<_> =
        requests.iter().map(|r| r.body["uuid"].clone()).collect();
    assert_eq!(uuids.len(), requests.len());
}

/// A chunk Lark still refuses as too large (230025: its stored form is larger than what was
/// sent) is cut in two and sent in its place, not sent again as it was; the answer arrives
/// whole and in order.
#[tokio::test]
async fn a_chunk_refused_as_too_large_is_cut_further() {
    let env = Env::builder().chat_control().spawn().await;
    let app = &env.app;
    let (answer, reopen) = escaped_json_answer();
    env.llm.push(MODEL, say(&answer));
    env.lark.fail_next(
        "/messages/om_j2/reply",
        vec![crate::fake_lark::Failure::TooLarge],
    );
    send(app, &group("j2", "show me the payload", true)).await;
    assert_eq!(wait_turns_ended(app, "oc_chat", 1).await, vec!["done"]);
    let requests = env.lark.requests_to("/messages/om_j2/reply");
    let refused = &requests[0];
    let chunks = posted_markdown(&env.lark);
    assert_eq!(chunks.len(), requests.len() - 1);
    // The refused chunk came again as two smaller ones, first of all.
    assert!(requests[1].bytes < refused.bytes && requests[2].bytes < refused.bytes);
    assert_ne!(requests[1].body, refused.body);
    assert_eq!(rejoin(&chunks, reopen), answer);
}

/// A target behind a jump host is usable in a chat only while the jump host is too. With the
/// jump host limited to another chat, a thread bound through it fails its next command and
/// its next shell write (nothing reaches the shell; the thread stays bound and is told once),
/// and `/ssh use`, `/ssh yolo on` and the model's `request_use` of the target are refused with
/// the jump host named — each refusal audited.
#[tokio::test]
async fn a_jump_host_limited_to_another_chat_keeps_the_targets_behind_it_out() {
    use sshmode::target::cli::SetArgs;
    use sshmode::workspace::{self, Choice, LocalRules, Permission};
    let env = env().await;
    let app = &env.app;
    // `inner` is the sshd of `web` again, reached through `web`.
    let dir = tempfile::tempdir().unwrap();
    crate::agent::add_target(app, env.sshd().unwrap(), dir.path(), "inner").await;
    target_cli(
        app,
        TargetCmd::Set(SetArgs {
            jump: Some("web".into()),
            permission: Some(Permission::Full),
            risky: Some(sshmode::config::Risky::Allow),
            ..crate::exec_ssh::set_args("inner")
        }),
    )
    .await;
    send(app, &group("use", "/ssh use inner", true)).await;
    wait_state(app, "use", "done").await;
    let inner = Place::Target("inner".into());
    assert_eq!(place(app, "omt_use").await, inner);
    let choice = Choice {
        dir: "~".into(),
        permission: Some(Permission::Full),
        mode: None,
    };
    let rules = LocalRules::from_config(&app.state.config.exec);
    workspace::set(&app.state.db, &rules, "ou_user", "omt_use", &inner, &choice)
        .await
        .unwrap()
        .unwrap_or_else(|why| panic!("workspace refused: {why}"));
    env.llm
        .push(MODEL, call("shell_open", json!({})))
        .push(
            MODEL,
            call("terminal", json!({"command": "echo through-$((6*7))"})),
        )
        .push(MODEL, say("in"));
    send(
        app,
        &in_thread("t1", "open a shell", false, "omt_use", "om_use"),
    )
    .await;
    assert_eq!(wait_turns_ended(app, "omt_use", 1).await, vec!["done"]);
    let r = tool_results(&env.llm);
    assert!(r[1].contains("through-42"), "{r:?}");
    let id = r[0]
        .split("opened shell ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no shell opened: {r:?}"))
        .to_string();

    // The jump host is limited to another chat: the thread's calls fail, naming it.
    target_cli(
        app,
        TargetCmd::Allow(AllowArgs {
            alias: "web".into(),
            chats: vec!["oc_other".into()],
            all_chats: false,
        }),
    )
    .await;
    env.llm
        .push(
            MODEL,
            call(
                "shell_write",
                json!({"shell_id": id, "data": "echo after-$((6*7))\r"}),
            ),
        )
        .push(MODEL, call("terminal", json!({"command": "echo after"})))
        .push(MODEL, say("refused"));
    send(app, &in_thread("t2", "again", false, "omt_use", "om_use")).await;
    assert_eq!(wait_turns_ended(app, "omt_use", 2).await.len(), 2);
    let r = tool_results(&env.llm);
    let want = "error: This thread is bound to `inner`, which is reached through the jump host `web`, and that is no longer allowed in this chat";
    for got in &r[r.len() - 2..] {
        assert!(got.starts_with(want), "{r:?}");
    }
    assert_eq!(place(app, "omt_use").await, inner);
    let told: Vec<_> = replies_to(&env.lark, "om_t2")
        .into_iter()
        .filter(|(_, t)| t.starts_with("This thread is bound to inner"))
        .collect();
    assert_eq!(told.len(), 1, "told once: {told:?}");
    let refused: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT detail->>'reason', detail->>'tool', detail->>'jump' FROM audit_log
         WHERE section = 'omt_use' AND action = 'binding.use' AND outcome = 'refused' ORDER BY id",
    )
    .fetch_all(&app.state.db)
    .await
    .unwrap();
    let why = |tool: &str| ("jump_not_allowed_here".into(), tool.into(), "web".into());
    assert_eq!(refused, [why("shell_write"), why("terminal")]);
    let raw = app
        .state
        .exec
        .shells
        .read(
            "omt_use",
            &id,
            sshmode::exec::pty::ReadOpts {
                mode: sshmode::exec::pty::ReadMode::Raw,
                since: Some(0),
                wait: Duration::from_millis(300),
                expect: None,
            },
            &tokio_util::sync::CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(!raw.raw.unwrap().text.contains("after-42"));

    // Nobody in this chat may enter it: `/ssh use`, `/ssh yolo on` and the model are refused.
    send(app, &group("use2", "/ssh use inner", true)).await;
    wait_state(app, "use2", "done").await;
    let refusal =
        "Target `inner` is reached through the jump host `web`, which is not allowed in this chat.";
    // A reply shows the refusal's code spans as plain text.
    let plain = refusal.replace('`', "");
    let said = command_replies(&env.lark, "om_use2").join("");
    assert!(said.contains(&plain), "{said}");
    let thread = "omt_free";
    send(
        app,
        &in_thread("y1", "/ssh yolo on inner", true, thread, "om_root"),
    )
    .await;
    wait_state(app, "y1", "done").await;
    let said = command_replies(&env.lark, "om_y1").join("");
    assert!(said.contains(&plain), "{said}");
    send(
        app,
        &in_thread("y2", "/ssh yolo on all", true, thread, "om_root"),
    )
    .await;
    wait_state(app, "y2", "done").await;
    env.llm
        .push(
            MODEL,
            call(
                "ssh_mode",
                json!({"action": "request_use", "target": "inner"}),
            ),
        )
        .push(MODEL, call("ssh_mode", json!({"action": "list_targets"})))
        .push(MODEL, say("stayed"));
    send(
        app,
        &in_thread("y3", "go to inner", true, thread, "om_root"),
    )
    .await;
    assert_eq!(wait_turns_ended(app, thread, 1).await, vec!["done"]);
    let r = tool_results(&env.llm);
    assert!(r[0].contains(refusal), "{r:?}");
    assert!(!r[1].contains("inner"), "{r:?}");
    assert_eq!(place(app, thread).await, Place::Local);
    let bound: i64 = sqlx::query_scalar("SELECT count(*) FROM bindings WHERE alias = 'inner'")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert_eq!(bound, 1, "only the thread bound before");
    let refused: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT action, detail->>'reason', detail->>'jump' FROM audit_log
         WHERE target = 'inner' AND outcome = 'refused' AND action <> 'binding.use' ORDER BY id",
    )
    .fetch_all(&app.state.db)
    .await
    .unwrap();
    let why = |action: &str| (action.into(), "jump_not_allowed_here".into(), "web".into());
    assert_eq!(
        refused,
        [why("binding.set"), why("grant.add"), why("binding.set")]
    );
}
