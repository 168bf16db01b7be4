//! SSH Mode in chats, end to end: signed webhook events into the running app, the fake Lark
//! API, real Postgres. `/ssh use` from a parent chat and in threads, the authorisation table
//! (users, the model, admins), grants and their expiry on the clock seam, approval by card and
//! by command, and the order of events per section across two app instances.

use std::sync::Arc;

use chrono::Utc;
use serde_json::{Value, json};
use sshmode::chat::model_api::{self, Here};
use sshmode::clock::ManualClock;
use sshmode::exec::Place;
use sshmode::target::{self, HostKeyPolicy, NewSecrets, NewTarget, Status};

use crate::fake_lark::{Failure, FakeLark, Recorded};
use crate::helpers::TestApp;
use crate::lark_support::*;

async fn spawn(fake: &FakeLark) -> TestApp {
    app_with(fake)
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .spawn()
        .await
}

async fn send(app: &TestApp, m: &Msg) {
    let (status, body) = post(app, sealed(&m.envelope(TOKEN), ENCRYPT_KEY, now_secs())).await;
    assert_eq!(status, 200, "{body}");
}

/// A group message addressed to the bot.
fn group(id: &str, text: &str) -> Msg {
    let mut m = Msg::new(id, &format!("@_user_1 {text}"));
    m.chat_type = "group";
    m.mention_bot = true;
    m
}

/// The same in a thread whose root is `root`.
fn in_thread(id: &str, text: &str, thread: &str, root: &str) -> Msg {
    let mut m = group(id, text);
    m.thread_id = Some(thread.into());
    m.root_id = Some(root.into());
    m
}

async fn add_target(app: &TestApp, alias: &str, approve: bool) {
    add_target_on(app, alias, &format!("{alias}.example"), approve).await;
}

async fn add_target_on(app: &TestApp, alias: &str, host: &str, approve: bool) {
    let vault =
        sshmode::vault::Vault::open_or_create(&app.data_dir.path().join("master.key")).unwrap();
    target::add(
        &app.state.db,
        &vault,
        NewTarget {
            alias: alias.into(),
            host: host.into(),
            port: 22,
            user: "ops".into(),
            description: Some(format!("the {alias} box")),
            secrets: NewSecrets::Agent,
            host_key_policy: HostKeyPolicy::Tofu,
            host_key: None,
            approve,
            jump: None,
        },
        "cli",
    )
    .await
    .unwrap();
}

async fn place(app: &TestApp, section: &str) -> Place {
    sshmode::chat::binding::resolve_place(&app.state.db, section, app.state.clock.now())
        .await
        .unwrap()
}

fn text_of(r: &Recorded) -> String {
    crate::fake_lark::message_text(r.body["content"].as_str().unwrap())
}

/// Texts of the replies to message `om`.
fn replies(fake: &FakeLark, om: &str) -> Vec<String> {
    fake.requests_to(&format!("/messages/{om}/reply"))
        .iter()
        .map(text_of)
        .collect()
}

async fn audit_actions(app: &TestApp, section: &str) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT actor, action, outcome FROM audit_log WHERE section = $1 ORDER BY id")
        .bind(section)
        .fetch_all(&app.state.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn ssh_use_in_a_parent_chat_opens_a_bound_thread() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "web", true).await;

    send(&app, &group("ev_use", "/ssh use web")).await;
    wait_state(&app, "ev_use", "done").await;
    let reqs = fake.requests_to("/messages/om_ev_use/reply");
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].body["reply_in_thread"], true);
    let text = text_of(&reqs[0]);
    assert!(text.contains("web (ops@web.example)"), "{text}");
    assert!(text.contains("/ssh local"), "{text}");
    // The fake names the new thread after the replied-to message.
    assert_eq!(place(&app, "omt_ev_use").await, Place::Target("web".into()));
    assert_eq!(place(&app, "oc_chat").await, Place::Local);

    // A message in that thread sees the binding; who bound it and how.
    send(
        &app,
        &in_thread("ev_st", "/ssh status", "omt_ev_use", "om_ev_use"),
    )
    .await;
    wait_state(&app, "ev_st", "done").await;
    let status = replies(&fake, "om_ev_st").join("");
    assert!(
        status.contains("Backend: web (ops@web.example:22)"),
        "{status}"
    );
    assert!(status.contains("sticky, bound by ou_user"), "{status}");
    assert_eq!(
        audit_actions(&app, "omt_ev_use").await,
        [("ou_user".into(), "binding.set".into(), "ok".into())]
    );
    app.stop().await;
}

#[tokio::test]
async fn a_thread_message_before_the_reply_answer_still_finds_its_binding() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "web", true).await;
    fake.hold("om_early/reply");
    send(&app, &group("early", "/ssh use web")).await;
    fake.wait_until("the thread-opening reply", |r| {
        r.iter().any(|r| r.path.contains("om_early/reply"))
    })
    .await;
    // The reply's answer is still outstanding when the thread's first message is handled.
    send(
        &app,
        &in_thread("ev_first", "/ssh status", "omt_early", "om_early"),
    )
    .await;
    wait_state(&app, "ev_first", "done").await;
    assert_eq!(place(&app, "omt_early").await, Place::Target("web".into()));
    assert!(replies(&fake, "om_ev_first")[0].contains("Backend: web"));
    fake.release();
    wait_state(&app, "early", "done").await;
    assert_eq!(place(&app, "omt_early").await, Place::Target("web".into()));
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_bindings")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert_eq!(pending, 0);
    app.stop().await;
}

#[tokio::test]
async fn without_a_thread_id_in_the_answer_the_first_thread_event_completes_the_binding() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "web", true).await;
    fake.fail_next("om_nothread/reply", vec![Failure::NoThread]);
    send(&app, &group("nothread", "/ssh use web")).await;
    wait_state(&app, "nothread", "done").await;
    assert_eq!(place(&app, "omt_later").await, Place::Local);
    send(
        &app,
        &in_thread("ev_in", "hello there", "omt_later", "om_nothread"),
    )
    .await;
    wait_state(&app, "ev_in", "done").await;
    assert_eq!(place(&app, "omt_later").await, Place::Target("web".into()));
    app.stop().await;
}

#[tokio::test]
async fn topic_groups_bind_in_place_and_threadless_chats_suggest_here() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "web", true).await;

    // Topic mode: the message is already a topic; it is bound where it is.
    let mut topic = group("topic", "/ssh use web");
    topic.thread_id = Some("omt_topic".into());
    send(&app, &topic).await;
    wait_state(&app, "topic", "done").await;
    assert_eq!(place(&app, "omt_topic").await, Place::Target("web".into()));
    let r = fake.requests_to("/messages/om_topic/reply");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].body["reply_in_thread"], true);

    // A chat that refuses threads (230071).
    fake.fail_next("om_flat/reply", vec![Failure::Code(230071)]);
    send(&app, &group("flat", "/ssh use web")).await;
    wait_state(&app, "flat", "done").await;
    let texts = replies(&fake, "om_flat");
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts[1].contains("/ssh use web --here"), "{texts:?}");
    assert_eq!(place(&app, "oc_chat").await, Place::Local);

    // A group chat itself has no owner: only an admin binds it in place (refusal audited).
    send(&app, &group("here0", "/ssh use web --here")).await;
    wait_state(&app, "here0", "done").await;
    assert!(
        replies(&fake, "om_here0")[0].starts_with("Only an admin can bind this group chat"),
        "{:?}",
        replies(&fake, "om_here0")
    );
    assert_eq!(place(&app, "oc_chat").await, Place::Local);
    assert_eq!(
        audit_actions(&app, "oc_chat").await,
        [("ou_user".into(), "binding.set".into(), "refused".into())]
    );
    let mut here = group("here", "/ssh use web --here");
    here.sender = "ou_admin".into();
    send(&app, &here).await;
    wait_state(&app, "here", "done").await;
    assert_eq!(place(&app, "oc_chat").await, Place::Target("web".into()));
    let r = fake.requests_to("/messages/om_here/reply");
    assert_eq!(r[0].body["reply_in_thread"], false);

    // /ssh local (and its alias /ssh off) clears it; anyone may.
    let mut off = group("off", "/ssh off");
    off.sender = "ou_other".into();
    send(&app, &off).await;
    wait_state(&app, "off", "done").await;
    assert_eq!(place(&app, "oc_chat").await, Place::Local);

    // A one-to-one chat is its user's to bind in place.
    let mut p2p = Msg::new("p2p", "/ssh use web --here");
    p2p.chat_id = "oc_p2p".into();
    send(&app, &p2p).await;
    wait_state(&app, "p2p", "done").await;
    assert_eq!(place(&app, "oc_p2p").await, Place::Target("web".into()));
    app.stop().await;
}

/// Anyone may return a thread to local, but that does not make the thread theirs: only its
/// owner (who opened it) or an admin binds it again.
#[tokio::test]
async fn a_stranger_who_releases_a_thread_may_not_bind_it_elsewhere() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "web", true).await;
    add_target(&app, "db", true).await;
    send(&app, &group("open", "/ssh use web")).await;
    wait_state(&app, "open", "done").await;
    let thread = "omt_open";
    assert_eq!(place(&app, thread).await, Place::Target("web".into()));
    let say = |id: &str, text: &str, who: &str| {
        let mut m = in_thread(id, text, thread, "om_open");
        m.sender = who.into();
        m
    };

    send(&app, &say("s1", "/ssh local", "ou_other")).await;
    wait_state(&app, "s1", "done").await;
    assert_eq!(place(&app, thread).await, Place::Local);
    send(&app, &say("s2", "/ssh use db", "ou_other")).await;
    wait_state(&app, "s2", "done").await;
    let said = replies(&fake, "om_s2").join("");
    assert!(
        said.contains("belongs to ou_user") && said.contains("only they or an admin"),
        "{said}"
    );
    assert_eq!(place(&app, thread).await, Place::Local);
    // Nor may the stranger let the model in.
    send(&app, &say("s3", "/ssh yolo on db", "ou_other")).await;
    wait_state(&app, "s3", "done").await;
    assert!(replies(&fake, "om_s3")[0].contains("belongs to ou_user"));
    let refused: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, action, detail->>'reason' FROM audit_log
         WHERE section = $1 AND outcome = 'refused' ORDER BY id",
    )
    .bind(thread)
    .fetch_all(&app.state.db)
    .await
    .unwrap();
    assert_eq!(
        refused,
        [
            ("ou_other".into(), "binding.set".into(), "not_owner".into()),
            ("ou_other".into(), "grant.add".into(), "not_owner".into()),
        ]
    );

    // The owner may; so may an admin, after which the thread is still the owner's.
    send(&app, &say("s4", "/ssh use db", "ou_user")).await;
    wait_state(&app, "s4", "done").await;
    assert_eq!(place(&app, thread).await, Place::Target("db".into()));
    send(&app, &say("s5", "/ssh use web", "ou_admin")).await;
    wait_state(&app, "s5", "done").await;
    assert_eq!(place(&app, thread).await, Place::Target("web".into()));
    send(&app, &say("s6", "/ssh use db", "ou_other")).await;
    wait_state(&app, "s6", "done").await;
    assert_eq!(place(&app, thread).await, Place::Target("web".into()));

    // A thread nobody opened belongs to who binds it first.
    let free = |id: &str, text: &str, who: &str| {
        let mut m = in_thread(id, text, "omt_free", "om_free");
        m.sender = who.into();
        m
    };
    send(&app, &free("f1", "/ssh use web", "ou_other")).await;
    wait_state(&app, "f1", "done").await;
    send(&app, &free("f2", "/ssh local", "ou_user")).await;
    wait_state(&app, "f2", "done").await;
    send(&app, &free("f3", "/ssh use db", "ou_user")).await;
    wait_state(&app, "f3", "done").await;
    assert!(replies(&fake, "om_f3")[0].contains("belongs to ou_other"));
    assert_eq!(place(&app, "omt_free").await, Place::Local);
    app.stop().await;
}

#[tokio::test]
async fn refusals_say_why_and_list_what_is_available() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "web", true).await;
    add_target(&app, "db", false).await;
    add_target(&app, "lab", true).await;
    target::allow::set_allowed(&app.state.db, "lab", Some(&["oc_elsewhere".into()]), "cli")
        .await
        .unwrap();
    for (id, text, want) in [
        ("u1", "/ssh use nope", "There is no target named nope."),
        (
            "u2",
            "/ssh use db",
            "Target db is waiting for an admin's approval.",
        ),
        (
            "u3",
            "/ssh use lab",
            "Target lab is not allowed in this chat.",
        ),
    ] {
        send(&app, &group(id, text)).await;
        wait_state(&app, id, "done").await;
        let got = replies(&fake, &format!("om_{id}")).join("");
        assert!(got.starts_with(want), "{got}");
        assert!(got.contains("Available here: web."), "{got}");
    }
    send(&app, &group("l", "/ssh list")).await;
    wait_state(&app, "l", "done").await;
    let list = replies(&fake, "om_l").join("");
    assert!(
        list.contains("web ops@web.example — approved — the web box"),
        "{list}"
    );
    assert!(list.contains("db ops@db.example — pending"), "{list}");
    assert!(!list.contains("lab"), "{list}");
    assert!(!list.to_lowercase().contains("key"), "{list}");
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'binding.set' AND outcome = 'refused'",
    )
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    assert_eq!(refused, 3);
    app.stop().await;
}

#[tokio::test]
async fn the_authorisation_table() {
    let fake = FakeLark::start().await;
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = app_with(&fake)
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .clock(clock.clone())
        .spawn()
        .await;
    add_target(&app, "web", true).await;
    add_target(&app, "db", true).await;
    add_target(&app, "lab", true).await;
    add_target(&app, "new", false).await;
    target::allow::set_allowed(&app.state.db, "lab", Some(&["oc_elsewhere".into()]), "cli")
        .await
        .unwrap();
    let db = &app.state.db;
    let ttl = app.state.config.chat.yolo_ttl;
    let here = Here {
        section: "omt_t",
        chat_id: "oc_chat",
    };
    let now = || app.state.clock.now();
    let say = |id: &str, text: &str| in_thread(id, text, "omt_t", "om_root");

    // No grant: refused, naming the commands.
    let r = model_api::request_use(db, now(), ttl, here, "web")
        .await
        .unwrap();
    assert!(
        r.contains("/ssh use web") && r.contains("/ssh yolo on web"),
        "{r}"
    );
    assert_eq!(place(&app, "omt_t").await, Place::Local);

    // `yolo on web`: web only.
    send(&app, &say("g1", "/ssh yolo on web")).await;
    wait_state(&app, "g1", "done").await;
    let r = model_api::request_use(db, now(), ttl, here, "db")
        .await
        .unwrap();
    assert!(r.contains("/ssh yolo on db"), "{r}");
    let r = model_api::request_use(db, now(), ttl, here, "web")
        .await
        .unwrap();
    assert!(r.contains("now runs on `web`"), "{r}");
    assert_eq!(place(&app, "omt_t").await, Place::Target("web".into()));
    let status = model_api::status(db, now(), here).await.unwrap();
    assert!(status.contains("model-made"), "{status}");
    // request_local clears the model's own binding.
    let r = model_api::request_local(db, now(), here).await.unwrap();
    assert!(r.contains("Left `web`"), "{r}");
    assert_eq!(place(&app, "omt_t").await, Place::Local);

    // `yolo on all`: any target approved and allowed for this chat, not others.
    send(&app, &say("g2", "/ssh yolo on all")).await;
    wait_state(&app, "g2", "done").await;
    let r = model_api::request_use(db, now(), ttl, here, "db")
        .await
        .unwrap();
    assert!(r.contains("now runs on `db`"), "{r}");
    let r = model_api::request_use(db, now(), ttl, here, "lab")
        .await
        .unwrap();
    assert!(r.contains("not allowed in this chat"), "{r}");
    let r = model_api::request_use(db, now(), ttl, here, "new")
        .await
        .unwrap();
    assert!(r.contains("waiting for an admin"), "{r}");
    let listed = model_api::list_targets(db, here).await.unwrap();
    assert!(
        listed.contains("`web`") && !listed.contains("lab"),
        "{listed}"
    );

    // Grant expiry (the clock seam) returns the model-made binding to local, audited.
    clock.advance(chrono::Duration::from_std(ttl).unwrap() + chrono::Duration::seconds(1));
    assert_eq!(place(&app, "omt_t").await, Place::Local);
    let r = model_api::request_use(db, now(), ttl, here, "db")
        .await
        .unwrap();
    assert!(r.contains("/ssh yolo on db"), "{r}");
    let actions: Vec<String> = audit_actions(&app, "omt_t")
        .await
        .into_iter()
        .map(|(_, a, _)| a)
        .collect();
    assert!(actions.contains(&"grant.expire".to_string()), "{actions:?}");
    assert!(
        actions.contains(&"binding.expire".to_string()),
        "{actions:?}"
    );

    // `yolo off` takes the right back and releases what the model entered.
    send(&app, &say("g3", "/ssh yolo on db")).await;
    wait_state(&app, "g3", "done").await;
    let r = model_api::request_use(db, now(), ttl, here, "db")
        .await
        .unwrap();
    assert!(r.contains("now runs on `db`"), "{r}");
    send(&app, &say("g4", "/ssh yolo off")).await;
    wait_state(&app, "g4", "done").await;
    assert_eq!(place(&app, "omt_t").await, Place::Local);
    assert!(replies(&fake, "om_g4")[0].contains("It had entered db"));
    let r = model_api::request_use(db, now(), ttl, here, "db")
        .await
        .unwrap();
    assert!(r.contains("/ssh yolo on db"), "{r}");

    // A user's sticky binding: the model neither replaces nor clears it.
    send(&app, &say("s1", "/ssh use web")).await;
    wait_state(&app, "s1", "done").await;
    send(&app, &say("g5", "/ssh yolo on all")).await;
    wait_state(&app, "g5", "done").await;
    let r = model_api::request_use(db, now(), ttl, here, "db")
        .await
        .unwrap();
    assert!(r.contains("bound to `web` by a user"), "{r}");
    let r = model_api::request_local(db, now(), here).await.unwrap();
    assert!(r.contains("bound to `web` by a user"), "{r}");
    assert_eq!(place(&app, "omt_t").await, Place::Target("web".into()));

    // Another user may not switch it; an admin may.
    let mut other = say("s2", "/ssh use db");
    other.sender = "ou_other".into();
    send(&app, &other).await;
    wait_state(&app, "s2", "done").await;
    assert!(replies(&fake, "om_s2")[0].contains("only they or an admin"));
    assert_eq!(place(&app, "omt_t").await, Place::Target("web".into()));
    let mut admin = say("s3", "/ssh use db");
    admin.sender = "ou_admin".into();
    send(&app, &admin).await;
    wait_state(&app, "s3", "done").await;
    assert_eq!(place(&app, "omt_t").await, Place::Target("db".into()));
    let grants: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM grants WHERE section = 'omt_t' AND closed_at IS NULL",
    )
    .fetch_one(db)
    .await
    .unwrap();
    assert_eq!(grants, 1, "one live grant per scope");
    app.stop().await;
}

/// A card click as Lark sends it.
fn click(event_id: &str, operator: &str, card_message: &str, value: Value) -> Value {
    json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "event_type": "card.action.trigger",
            "create_time": Utc::now().timestamp_millis().to_string(), "token": TOKEN,
            "app_id": crate::fake_lark::APP_ID, "tenant_key": "tk"},
        "event": {
            "operator": {"open_id": operator, "tenant_key": "tk"},
            "token": "c-update-token",
            "action": {"value": value, "tag": "button"},
            "host": "im_message",
            "context": {"open_message_id": card_message, "open_chat_id": "oc_p2p_admin"}
        }
    })
}

async fn status_of(app: &TestApp, alias: &str) -> Status {
    target::get(&app.state.db, alias).await.unwrap().status
}

#[tokio::test]
async fn approval_by_card_and_by_command() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "prod", false).await;

    // The admin receives a card 2.0, one-to-one.
    fake.wait_until("the approval card", |r| {
        r.iter()
            .any(|r| r.path.ends_with("receive_id_type=open_id"))
    })
    .await;
    let cards = fake.requests_to("receive_id_type=open_id");
    assert_eq!(cards.len(), 1);
    assert_eq!(cards[0].body["receive_id"], "ou_admin");
    assert_eq!(cards[0].body["msg_type"], "interactive");
    let card: Value = serde_json::from_str(cards[0].body["content"].as_str().unwrap()).unwrap();
    assert_eq!(card["schema"], "2.0");
    let body = card.to_string();
    assert!(
        body.contains("ops@prod.example:22") && body.contains("cli"),
        "{body}"
    );
    let approve = card["body"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["element_id"] == "btn_approve")
        .unwrap()["behaviors"][0]["value"]
        .clone();
    let card_msg = fake.posted()[0]["message_id"].as_str().unwrap().to_string();

    // A non-admin's click: refused at once with a toast, audited, nothing changes.
    let (s, answer) = post(
        &app,
        sealed(
            &click("c1", "ou_user", &card_msg, approve.clone()),
            ENCRYPT_KEY,
            now_secs(),
        ),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(answer["toast"]["type"], "error");
    wait_state(&app, "c1", "done").await;
    assert_eq!(status_of(&app, "prod").await, Status::Pending);

    // The admin's click is answered while every outbound call would hang: the answer makes
    // none. The card is PATCHed afterwards.
    let before = fake.requests().len();
    fake.hold("/open-apis");
    let (s, answer) = post(
        &app,
        sealed(
            &click("c2", "ou_admin", &card_msg, approve.clone()),
            ENCRYPT_KEY,
            now_secs(),
        ),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(answer["toast"]["type"], "info");
    fake.release();
    wait_state(&app, "c2", "done").await;
    assert!(fake.requests().len() > before);
    assert_eq!(status_of(&app, "prod").await, Status::Approved);
    let patches = fake.requests_to(&format!("/messages/{card_msg}"));
    let patches: Vec<_> = patches.iter().filter(|r| r.method == "PATCH").collect();
    assert_eq!(patches.len(), 1);
    let patched = patches[0].body["content"].as_str().unwrap();
    assert!(
        patched.contains("Approved") && patched.contains("ou_admin"),
        "{patched}"
    );
    assert!(!patched.contains("btn_approve"), "{patched}");

    // A duplicate click (redelivered under a new event id) acts once.
    post(
        &app,
        sealed(
            &click("c3", "ou_admin", &card_msg, approve),
            ENCRYPT_KEY,
            now_secs(),
        ),
    )
    .await;
    wait_state(&app, "c3", "done").await;
    let decided: Vec<(String, String)> = sqlx::query_as(
        "SELECT actor, outcome FROM audit_log WHERE action = 'target.decide' ORDER BY id",
    )
    .fetch_all(&app.state.db)
    .await
    .unwrap();
    assert_eq!(
        decided,
        [
            ("ou_user".into(), "refused".into()),
            ("ou_admin".into(), "approved".into())
        ]
    );

    // By command: a non-admin is refused; an admin rejects (the target becomes disabled).
    send(&app, &group("r1", "/ssh reject prod")).await;
    wait_state(&app, "r1", "done").await;
    assert!(replies(&fake, "om_r1")[0].contains("Only an admin"));
    assert_eq!(status_of(&app, "prod").await, Status::Approved);
    let mut admin = group("r2", "/ssh reject prod");
    admin.sender = "ou_admin".into();
    send(&app, &admin).await;
    wait_state(&app, "r2", "done").await;
    assert_eq!(status_of(&app, "prod").await, Status::Disabled);
    assert!(replies(&fake, "om_r2")[0].contains("prod is rejected"));
    app.stop().await;
}

/// A binding the migration could not complete (no chat, no generation) cannot be checked: it
/// stays bound and fails, `/ssh status` says so, and binding the same target again is a real
/// bind (for today's generation), not "already on".
#[tokio::test]
async fn a_binding_from_before_the_checks_fails_until_bound_again() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "web", true).await;
    sqlx::query(
        "INSERT INTO bindings (section, alias, kind, owner, bound_at)
         VALUES ('omt_old', 'web', 'sticky', 'ou_user', now())",
    )
    .execute(&app.state.db)
    .await
    .unwrap();
    let say = |id: &str, text: &str| in_thread(id, text, "omt_old", "om_old");
    send(&app, &say("st", "/ssh status")).await;
    wait_state(&app, "st", "done").await;
    let status = replies(&fake, "om_st").join("");
    assert!(status.contains("cannot be checked"), "{status}");
    assert!(status.contains("/ssh local"), "{status}");
    assert_eq!(place(&app, "omt_old").await, Place::Target("web".into()));

    send(&app, &say("re", "/ssh use web")).await;
    wait_state(&app, "re", "done").await;
    let said = replies(&fake, "om_re").join("");
    assert!(said.starts_with("This thread now runs on web"), "{said}");
    send(&app, &say("st2", "/ssh status")).await;
    wait_state(&app, "st2", "done").await;
    let status = replies(&fake, "om_st2").join("");
    assert!(!status.contains("cannot be checked"), "{status}");
    app.stop().await;
}

/// The `n`-th approval card sent (from 1): its message id and its Approve button's value.
async fn nth_card(fake: &FakeLark, n: usize) -> (String, Value) {
    fake.wait_until("the approval cards", |r| {
        r.iter()
            .filter(|r| r.path.ends_with("receive_id_type=open_id"))
            .count()
            >= n
    })
    .await;
    let cards = fake.requests_to("receive_id_type=open_id");
    let card: Value = serde_json::from_str(cards[n - 1].body["content"].as_str().unwrap()).unwrap();
    let approve = card["body"]["elements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["element_id"] == "btn_approve")
        .unwrap()["behaviors"][0]["value"]
        .clone();
    let message_id = fake.posted()[n - 1]["message_id"]
        .as_str()
        .unwrap()
        .to_string();
    (message_id, approve)
}

/// The PATCHed contents of card message `om`.
fn card_patches(fake: &FakeLark, om: &str) -> Vec<String> {
    fake.requests_to(&format!("/messages/{om}"))
        .iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| r.body["content"].as_str().unwrap().to_string())
        .collect()
}

/// A click on a card that no longer shows the target as it is decides nothing: the click is
/// audited and the card is rewritten to say it expired (the toast, answered without I/O, still
/// says "received").
#[tokio::test]
async fn a_stale_approval_card_decides_nothing_and_says_it_expired() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    let db = &app.state.db;
    add_target(&app, "prod", false).await;
    let (first, first_approve) = nth_card(&fake, 1).await;
    // Removed and added again on another host: a new generation, pending, with a card of its own.
    target::remove(db, "prod", "cli").await.unwrap();
    add_target_on(&app, "prod", "elsewhere.example", false).await;
    let (second, second_approve) = nth_card(&fake, 2).await;
    assert_ne!(first, second);

    let clicked = |id: &str, card: &str, value: &Value| {
        sealed(
            &click(id, "ou_admin", card, value.clone()),
            ENCRYPT_KEY,
            now_secs(),
        )
    };
    let (s, answer) = post(&app, clicked("k1", &first, &first_approve)).await;
    assert_eq!(s, 200);
    assert_eq!(answer["toast"]["type"], "info");
    assert!(
        answer["toast"]["content"]
            .as_str()
            .unwrap()
            .starts_with("Received"),
        "{answer}"
    );
    wait_state(&app, "k1", "done").await;
    assert_eq!(status_of(&app, "prod").await, Status::Pending);
    let patched = card_patches(&fake, &first);
    assert_eq!(patched.len(), 1, "{patched:?}");
    assert!(patched[0].contains("expired"), "{patched:?}");
    assert!(!patched[0].contains("btn_approve"), "{patched:?}");
    assert!(card_patches(&fake, &second).is_empty());

    // Same generation, but the host key is not the one the card showed (none): approving it
    // would pin a key no admin saw.
    let key = target::HostKey {
        fingerprint: "SHA256:c2VlbiBieSBub2JvZHkgb24gYW55IGNhcmQgYXQgYWxsIQ".into(),
        algorithm: Some("ssh-ed25519".into()),
        source: "pinned".into(),
        at: None,
    };
    target::rekey(db, "prod", &key, "cli").await.unwrap();
    post(&app, clicked("k2", &second, &second_approve)).await;
    wait_state(&app, "k2", "done").await;
    assert_eq!(status_of(&app, "prod").await, Status::Pending);
    assert!(card_patches(&fake, &second)[0].contains("expired"));

    let decided: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, outcome, detail->>'reason' FROM audit_log
         WHERE action = 'target.decide' ORDER BY id",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let expired = (
        "ou_admin".to_string(),
        "refused".to_string(),
        "expired".to_string(),
    );
    assert_eq!(decided, [expired.clone(), expired]);
    app.stop().await;
}

#[tokio::test]
async fn a_message_redelivered_under_a_new_event_id_acts_once() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    let m = Msg::new("ev_a", "/help");
    send(&app, &m).await;
    let mut again = m.clone();
    again.event_id = "ev_b".into();
    send(&app, &again).await;
    wait_state(&app, "ev_a", "done").await;
    assert_eq!(inbox(&app).await.len(), 1);
    assert_eq!(replies(&fake, "om_ev_a").len(), 1);
    app.stop().await;
}

/// Two app instances on one database, four workers each.
async fn pair(fake: &FakeLark) -> (TestApp, TestApp) {
    let a = app_with(fake)
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .var("SSHMODE_INBOX_WORKERS", "4")
        .spawn()
        .await;
    let b = app_with(fake)
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .var("SSHMODE_INBOX_WORKERS", "4")
        .database(&a.db_url)
        .spawn()
        .await;
    (a, b)
}

#[tokio::test]
async fn one_section_in_order_across_two_instances() {
    let fake = FakeLark::start().await;
    let (a, b) = pair(&fake).await;
    for alias in ["t0", "t1", "t2", "t3", "t4"] {
        add_target(&a, alias, true).await;
    }
    // Ten switches of one thread, sent one after another to alternating instances.
    let ids: Vec<String> = (0..10).map(|i| format!("o{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let m = in_thread(id, &format!("/ssh use t{}", i % 5), "omt_o", "om_root");
        send(if i % 2 == 0 { &a } else { &b }, &m).await;
    }
    for id in &ids {
        wait_state(&a, id, "done").await;
    }
    // Applied in order: the audit trail of the section lists them as sent, and the last wins.
    let applied: Vec<String> = sqlx::query_scalar(
        "SELECT target FROM audit_log WHERE section = 'omt_o' AND action IN ('binding.set', 'binding.switch') ORDER BY id",
    )
    .fetch_all(&a.state.db)
    .await
    .unwrap();
    let want: Vec<String> = (0..10).map(|i| format!("t{}", i % 5)).collect();
    assert_eq!(applied, want);
    let received: Vec<String> = sqlx::query_scalar(
        "SELECT payload->>'event_id' FROM session_events WHERE section_id = 'omt_o' AND kind = 'message.received' ORDER BY seq",
    )
    .fetch_all(&a.state.db)
    .await
    .unwrap();
    assert_eq!(received, ids);
    assert_eq!(place(&a, "omt_o").await, Place::Target("t4".into()));
    b.stop().await;
    a.stop().await;
}

#[tokio::test]
async fn sections_overlap_and_stop_is_not_held_behind_its_section() {
    let fake = FakeLark::start().await;
    let (a, b) = pair(&fake).await;
    // The first event of section X hangs in its reply.
    fake.hold("om_slow/reply");
    send(&a, &in_thread("slow", "/ssh status", "omt_x", "om_rx")).await;
    fake.wait_until("the slow reply", |r| {
        r.iter().any(|r| r.path.contains("om_slow/reply"))
    })
    .await;
    // A later event of X waits behind it...
    send(&b, &in_thread("later", "/ssh status", "omt_x", "om_rx")).await;
    // ...while another section is handled meanwhile, and /stop in X passes.
    send(&b, &in_thread("other", "/ssh status", "omt_y", "om_ry")).await;
    send(&a, &in_thread("stop", "/stop", "omt_x", "om_rx")).await;
    wait_state(&a, "other", "done").await;
    wait_state(&a, "stop", "done").await;
    assert_eq!(
        replies(&fake, "om_stop"),
        [sshmode::chat::NOTHING_RUNNING.to_string()]
    );
    let states: Vec<(String, String)> = sqlx::query_as(
        "SELECT event_id, state FROM inbox_events WHERE event_id IN ('slow', 'later') ORDER BY event_id",
    )
    .fetch_all(&a.state.db)
    .await
    .unwrap();
    assert_eq!(
        states,
        [
            ("later".into(), "pending".into()),
            ("slow".into(), "pending".into())
        ]
    );
    assert!(replies(&fake, "om_later").is_empty());
    fake.release();
    wait_state(&a, "slow", "done").await;
    wait_state(&a, "later", "done").await;
    b.stop().await;
    a.stop().await;
}

#[tokio::test]
async fn a_dead_lettered_message_is_told_to_its_sender() {
    let fake = FakeLark::start().await;
    fake.fail_next("om_ev_gone/reply", vec![Failure::Code(230002)]);
    let app = app_with(&fake)
        .var("SSHMODE_INBOX_MAX_ATTEMPTS", "1")
        .spawn()
        .await;
    send(&app, &Msg::new("ev_gone", "/help")).await;
    wait_state(&app, "ev_gone", "dead").await;
    fake.wait_until("the dead-letter notice", |r| {
        r.iter()
            .filter(|r| r.path.contains("om_ev_gone/reply"))
            .count()
            == 2
    })
    .await;
    let texts = replies(&fake, "om_ev_gone");
    assert!(texts[1].contains("Please send it again"), "{texts:?}");
    app.stop().await;
}

#[tokio::test]
async fn target_allow_limits_chats_and_is_shown() {
    use clap::Parser;
    use sshmode::target::cli::{TargetCmd, run_with};

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: TargetCmd,
    }
    let app = TestApp::spawn().await;
    add_target(&app, "web", true).await;
    let run = |args: &[&str]| {
        let cmd = Cli::try_parse_from(std::iter::once("target").chain(args.iter().copied()))
            .map(|c| c.cmd);
        let app = &app;
        async move {
            let mut out = Vec::new();
            let mut input = std::io::empty();
            let r = match cmd {
                Ok(cmd) => run_with(cmd, &app.state.config, &app.state.db, &mut input, &mut out)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            (r, String::from_utf8(out).unwrap())
        }
    };
    assert!(
        run(&["allow", "web"]).await.0.is_err(),
        "a list or --all-chats is required"
    );
    assert!(
        run(&["allow", "web", "oc_a", "--all-chats"])
            .await
            .0
            .is_err()
    );
    assert_eq!(run(&["allow", "web", "oc_a", "oc_b"]).await.0, Ok(0));
    let (_, shown) = run(&["show", "web"]).await;
    assert!(shown.contains("chats:           oc_a oc_b"), "{shown}");
    let visible = |chat: &'static str| {
        let db = app.state.db.clone();
        async move {
            sshmode::target::allow::visible_in(&db, chat)
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(visible("oc_a").await, 1);
    assert_eq!(visible("oc_z").await, 0);
    assert_eq!(run(&["allow", "web", "--all-chats"]).await.0, Ok(0));
    let (_, shown) = run(&["show", "web"]).await;
    assert!(shown.contains("chats:           all"), "{shown}");
    assert_eq!(visible("oc_z").await, 1);
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'target.allow' AND actor = $1 AND target = 'web'",
    )
    .bind(&app.state.config.operator)
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    assert_eq!(audited, 2);
    app.stop().await;
}

#[tokio::test]
async fn workspace_commands_choose_show_and_stay_under_the_maximum() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "web", true).await;
    send(&app, &group("ev_wuse", "/ssh use web")).await;
    wait_state(&app, "ev_wuse", "done").await;
    let thread = "omt_ev_wuse";
    let say = |id: &'static str, text: &'static str| in_thread(id, text, thread, "om_ev_wuse");

    send(
        &app,
        &say("ev_ws1", "/workspace set /srv/app/../app READ office"),
    )
    .await;
    wait_state(&app, "ev_ws1", "done").await;
    let r = replies(&fake, "om_ev_ws1").join("");
    assert!(r.contains("Workspace set."), "{r}");
    assert!(r.contains("Workspace on web: /srv/app"), "{r}");
    assert!(r.contains("Permission: read"), "{r}");
    assert!(r.contains("Mode: office"), "{r}");

    // Above the target's maximum (read-write by default), and a relative remote directory.
    send(&app, &say("ev_ws2", "/workspace set /srv/app full")).await;
    send(&app, &say("ev_ws3", "/workspace set srv/app")).await;
    wait_state(&app, "ev_ws3", "done").await;
    let r = replies(&fake, "om_ev_ws2").join("");
    assert!(
        r.contains("Workspace not changed") && r.contains("maximum"),
        "{r}"
    );
    assert!(
        r.contains("sshmode target set web --permission full"),
        "{r}"
    );
    let r = replies(&fake, "om_ev_ws3").join("");
    assert!(
        r.contains("Workspace not changed") && r.contains("absolute"),
        "{r}"
    );

    // The status shows the workspace, its permission and its mode; nothing changed them.
    send(&app, &say("ev_ws4", "/ssh status")).await;
    wait_state(&app, "ev_ws4", "done").await;
    let r = replies(&fake, "om_ev_ws4").join("");
    assert!(
        r.contains("/srv/app") && r.contains("Permission: read"),
        "{r}"
    );
    assert!(r.contains("Mode: office"), "{r}");
    let audit = audit_actions(&app, thread).await;
    let ws: Vec<_> = audit
        .iter()
        .filter(|(_, a, _)| a == "workspace.set")
        .map(|(actor, _, outcome)| (actor.as_str(), outcome.as_str()))
        .collect();
    assert_eq!(
        ws,
        [
            ("ou_user", "ok"),
            ("ou_user", "refused"),
            ("ou_user", "refused")
        ]
    );

    // The parent chat is local: full by default, and never outside the workspace root.
    send(&app, &group("ev_ws5", "/workspace show")).await;
    send(&app, &group("ev_ws6", "/workspace set /etc")).await;
    wait_state(&app, "ev_ws6", "done").await;
    let r = replies(&fake, "om_ev_ws5").join("");
    assert!(
        r.contains("Workspace on local:") && r.contains("Permission: full"),
        "{r}"
    );
    let r = replies(&fake, "om_ev_ws6").join("");
    assert!(
        r.contains("Workspace not changed") && r.contains("cannot be a local workspace"),
        "{r}"
    );
}

/// A target behind a jump host: `/ssh use`, `/ssh status` and `/ssh list` name the path.
#[tokio::test]
async fn the_chat_shows_the_path_to_a_target_behind_a_jump_host() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "gw", true).await;
    let vault =
        sshmode::vault::Vault::open_or_create(&app.data_dir.path().join("master.key")).unwrap();
    target::add(
        &app.state.db,
        &vault,
        NewTarget {
            alias: "deep".into(),
            host: "10.0.0.5".into(),
            port: 22,
            user: "deploy".into(),
            description: None,
            secrets: NewSecrets::Agent,
            host_key_policy: HostKeyPolicy::Tofu,
            host_key: None,
            approve: true,
            jump: Some("gw".into()),
        },
        "cli",
    )
    .await
    .unwrap();

    send(&app, &group("ev_deep", "/ssh use deep")).await;
    wait_state(&app, "ev_deep", "done").await;
    let text = replies(&fake, "om_ev_deep").join("");
    assert!(text.contains("deep (deploy@10.0.0.5 via gw)"), "{text}");
    send(
        &app,
        &in_thread("ev_deep_st", "/ssh status", "omt_ev_deep", "om_ev_deep"),
    )
    .await;
    wait_state(&app, "ev_deep_st", "done").await;
    let status = replies(&fake, "om_ev_deep_st").join("");
    assert!(
        status.contains("Backend: deep (deploy@10.0.0.5:22 via gw)"),
        "{status}"
    );
    send(&app, &group("ev_deep_l", "/ssh list")).await;
    wait_state(&app, "ev_deep_l", "done").await;
    let list = replies(&fake, "om_ev_deep_l").join("");
    assert!(
        list.contains("deep deploy@10.0.0.5 via gw — approved"),
        "{list}"
    );
}

/// Every command's reply renders as Lark renders it: no raw backticks, headings or table pipes
/// in what a person sees (a `text` message shows them as typed, and a post's `md` has no inline
/// code, headings or tables).
#[tokio::test]
async fn every_command_reply_renders_in_lark() {
    let fake = FakeLark::start().await;
    let app = spawn(&fake).await;
    add_target(&app, "prod-db", true).await;
    add_target(&app, "staging", false).await;
    let commands = [
        "/help",
        "/ssh help",
        "/ssh status",
        "/ssh list",
        "/ssh yolo on all",
        "/ssh yolo off",
        "/ssh use nowhere",
        "/ssh approve staging",
        "/memory list",
        "/memory forget 99",
        "/workspace show",
        "/workspace set",
        "/ssh frobnicate",
    ];
    for (i, text) in commands.iter().enumerate() {
        let m = group(&format!("ev_render_{i}"), text);
        send(&app, &m).await;
        wait_state(&app, &m.event_id, "done").await;
        let sent = fake.requests_to(&format!("/messages/{}/reply", m.message_id));
        assert!(!sent.is_empty(), "{text}: no reply");
        for r in sent {
            let kind = r.body["msg_type"].as_str().unwrap();
            let content = r.body["content"].as_str().unwrap();
            let raw = crate::fake_lark::unrendered_markdown(kind, content);
            assert!(
                raw.is_empty(),
                "{text}: shows raw Markdown {raw:?} in {}",
                crate::fake_lark::message_text(content)
            );
        }
    }
    app.stop().await;
}
