//! Schedules: `/cron` in chats, firings as turns in their threads, exactly once across
//! replicas (a manual clock shared by two replicas on one database), a replica killed between
//! claim and post, downtime collapsed into one late firing, the binding at fire time, an
//! unattended approval that times out, the model's proposal confirmed on a card, the CLI, and
//! one short real-time run.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::{Value, json};
use sshmode::clock::{Clock, ManualClock};

use crate::agent::{MODEL, call, say, tool_results, wait_turns_ended};
use crate::fake_lark::{Failure, FakeLark, message_text};
use crate::fake_llm::FakeProvider;
use crate::helpers::{TestApp, TestAppBuilder, eventually, fresh_database};
use crate::lark_support::{ENCRYPT_KEY, Msg, TOKEN, post, sealed, wait_state};

const WAIT: Duration = Duration::from_secs(30);

fn app(lark: &FakeLark, llm: &FakeProvider, clock: &Arc<ManualClock>) -> TestAppBuilder {
    crate::lark_support::app_with(lark)
        .var("LLM_BASE_URL", &llm.base)
        .var("LLM_MODEL", MODEL)
        .var("SSHMODE_PROGRESS", "false")
        .var("SSHMODE_ADMINS", "ou_admin")
        .clock(clock.clone())
}

/// A manual clock at the current minute (events are signed with its time).
fn clock() -> Arc<ManualClock> {
    let now = Utc::now();
    let minute = Utc
        .timestamp_opt(now.timestamp() - now.timestamp() % 60, 0)
        .unwrap();
    Arc::new(ManualClock::new(minute))
}

/// Sends `m`, signed at the clock's time, and waits until it is handled.
async fn send(app: &TestApp, clock: &ManualClock, m: &Msg) {
    let (status, body) = post(
        app,
        sealed(&m.envelope(TOKEN), ENCRYPT_KEY, clock.now().timestamp()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    wait_state(app, &m.event_id, "done").await;
}

/// A one-to-one message from `ou_user`.
fn p2p(id: &str, text: &str) -> Msg {
    Msg::new(id, text)
}

/// A group message from `sender`, mentioning the bot, in the parent chat or a thread.
fn group(id: &str, text: &str, sender: &str, thread: Option<(&str, &str)>) -> Msg {
    let mut m = Msg::new(id, &format!("@_user_1 {text}"));
    m.chat_type = "group";
    m.mention_bot = true;
    m.sender = sender.into();
    if let Some((t, root)) = thread {
        m.thread_id = Some(t.into());
        m.root_id = Some(root.into());
    }
    m
}

/// Texts of the messages the bot created (after Lark's uuid de-duplication).
fn posted_texts(lark: &FakeLark) -> Vec<String> {
    lark.posted()
        .iter()
        .filter(|p| p["msg_type"] == "post")
        .map(|p| message_text(p["body"]["content"].as_str().unwrap()))
        .collect()
}

fn anchors(lark: &FakeLark, id: i64) -> Vec<String> {
    posted_texts(lark)
        .into_iter()
        .filter(|t| t.starts_with(&format!("⏰ scheduled #{id}:")))
        .collect()
}

/// The replies to message `om` (their texts).
fn reply_texts(lark: &FakeLark, om: &str) -> Vec<String> {
    lark.requests_to(&format!("/messages/{om}/reply"))
        .iter()
        .map(|r| message_text(r.body["content"].as_str().unwrap()))
        .collect()
}

/// The only schedule's id.
async fn only_schedule(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT id FROM schedules")
        .fetch_one(&app.state.db)
        .await
        .unwrap()
}

/// The firings of `id`: (due, state), by due time.
async fn firings(app: &TestApp, id: i64) -> Vec<(DateTime<Utc>, String)> {
    sqlx::query_as(
        "SELECT due_at, state FROM schedule_firings WHERE schedule_id = $1 ORDER BY due_at",
    )
    .bind(id)
    .fetch_all(&app.state.db)
    .await
    .unwrap()
}

/// The ended turns the schedule's firings ran (waits until `n` have ended).
async fn wait_runs(app: &TestApp, id: i64, n: usize) -> Vec<String> {
    let mut states = Vec::new();
    eventually(&format!("{n} finished runs of #{id}"), WAIT, async || {
        states = sqlx::query_scalar(
            "SELECT t.state FROM turn_requests r JOIN turns t ON t.id = r.turn_id
              WHERE r.schedule_id = $1 ORDER BY r.id",
        )
        .bind(id)
        .fetch_all(&app.state.db)
        .await
        .unwrap();
        states.len() >= n
            && states
                .iter()
                .all(|s: &String| s != "running" && s != "awaiting_approval")
    })
    .await;
    states
}

#[tokio::test]
async fn cron_commands_add_list_pause_resume_remove_and_refuse_strangers() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let clock = clock();
    let a = app(&lark, &llm, &clock)
        .var("SSHMODE_SCHEDULE_MAX_PER_CHAT", "2")
        .var("SSHMODE_TIMEZONE", "Asia/Shanghai")
        .spawn()
        .await;

    // In a group's main chat, /cron add opens a thread for the schedule, owned by its author.
    send(
        &a,
        &clock,
        &group(
            "c1",
            "/cron add \"0 9 * * 1-5\" check the disks on prod",
            "ou_owner",
            None,
        ),
    )
    .await;
    let id = only_schedule(&a).await;
    let said = reply_texts(&lark, "om_c1");
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains(&format!("Scheduled #{id}")), "{said:?}");
    assert!(said[0].contains("Asia/Shanghai"), "{said:?}");
    // Three next runs, at 09:00 Shanghai time.
    assert_eq!(said[0].matches("09:00 CST").count(), 3, "{said:?}");
    let (section, creator, root): (String, String, Option<String>) =
        sqlx::query_as("SELECT section_id, creator, root_message_id FROM schedules WHERE id = $1")
            .bind(id)
            .fetch_one(&a.state.db)
            .await
            .unwrap();
    assert_eq!(
        (section.as_str(), creator.as_str(), root.as_deref()),
        ("omt_c1", "ou_owner", Some("om_c1"))
    );

    // Anyone lists; a stranger may not pause it, and the refusal is audited.
    send(&a, &clock, &group("c2", "/cron list", "ou_other", None)).await;
    let listed = reply_texts(&lark, "om_c2").join("\n");
    // Code spans render bare in a post.
    assert!(
        listed.contains(&format!("#{id} 0 9 * * 1-5 (Asia/Shanghai)")),
        "{listed}"
    );
    assert!(
        listed.contains("last: never") && listed.contains("ou_owner"),
        "{listed}"
    );
    let thread = Some(("omt_c1", "om_c1"));
    send(
        &a,
        &clock,
        &group("c3", &format!("/cron pause {id}"), "ou_other", thread),
    )
    .await;
    assert!(
        reply_texts(&lark, "om_c3")[0].contains("belongs to ou_owner"),
        "{:?}",
        reply_texts(&lark, "om_c3")
    );
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'schedule.pause' AND outcome = 'refused' AND actor = 'ou_other'",
    )
    .fetch_one(&a.state.db)
    .await
    .unwrap();
    assert_eq!(refused, 1);

    // The owner pauses and resumes; an admin removes. Each audited.
    send(
        &a,
        &clock,
        &group("c4", &format!("/cron pause {id}"), "ou_owner", thread),
    )
    .await;
    assert!(reply_texts(&lark, "om_c4")[0].starts_with(&format!("Paused schedule #{id}")));
    send(&a, &clock, &group("c5", "/cron list", "ou_other", thread)).await;
    assert!(reply_texts(&lark, "om_c5")[0].contains("paused"));
    send(
        &a,
        &clock,
        &group("c6", &format!("/cron resume {id}"), "ou_owner", thread),
    )
    .await;
    assert!(
        reply_texts(&lark, "om_c6")[0].contains("next run"),
        "{:?}",
        reply_texts(&lark, "om_c6")
    );
    send(
        &a,
        &clock,
        &group("c7", &format!("/cron remove {id}"), "ou_admin", thread),
    )
    .await;
    assert_eq!(
        reply_texts(&lark, "om_c7"),
        vec![format!("Removed schedule #{id}.")]
    );
    let actions: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, actor FROM audit_log WHERE action LIKE 'schedule.%' AND outcome = 'ok' ORDER BY id",
    )
    .fetch_all(&a.state.db)
    .await
    .unwrap();
    let want: Vec<(String, String)> = [
        ("schedule.add", "ou_owner"),
        ("schedule.pause", "ou_owner"),
        ("schedule.resume", "ou_owner"),
        ("schedule.remove", "ou_admin"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(actions, want);

    // Bad input: too often, unreadable, a zone that is not one; the group's zone is an admin's.
    for (n, text, says) in [
        (
            "b1",
            "/cron add \"every 10s\" ping",
            "shortest interval allowed here is 1 min",
        ),
        ("b2", "/cron add \"0 9 * *\" x", "is not a schedule"),
        (
            "b3",
            "/cron add \"61 * * * *\" x",
            "not a valid cron expression",
        ),
        ("b4", "/cron tz Mars/Olympus", "is not a time zone"),
        ("b5", "/cron tz Europe/Berlin", "Only an admin"),
        ("b6", "/cron pause 999", "There is no schedule #999"),
    ] {
        send(&a, &clock, &group(n, text, "ou_owner", thread)).await;
        let r = reply_texts(&lark, &format!("om_{n}"));
        assert!(r.len() == 1 && r[0].contains(says), "{text}: {r:?}");
    }
    send(
        &a,
        &clock,
        &group("tz", "/cron tz Europe/Berlin", "ou_admin", thread),
    )
    .await;
    assert!(reply_texts(&lark, "om_tz")[0].contains("use Europe/Berlin"));

    // A message handled again after its schedule was added (its answer failed once) adds
    // nothing twice.
    lark.fail_next("om_r1/reply", vec![Failure::Code(230001)]);
    let r1 = group("r1", "/cron add \"every 2h\" once only", "ou_owner", thread);
    let (status, _) = post(
        &a,
        sealed(&r1.envelope(TOKEN), ENCRYPT_KEY, clock.now().timestamp()),
    )
    .await;
    assert_eq!(status, 200);
    lark.wait_until("the failed answer", |reqs| {
        reqs.iter().any(|r| r.path.contains("om_r1/reply"))
    })
    .await;
    // The retry is due after its backoff, on the service's clock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    clock.advance(chrono::Duration::seconds(30));
    wait_state(&a, "r1", "done").await;
    let added: i64 =
        sqlx::query_scalar("SELECT count(*) FROM schedules WHERE prompt = 'once only'")
            .fetch_one(&a.state.db)
            .await
            .unwrap();
    assert_eq!(added, 1);
    assert!(
        reply_texts(&lark, "om_r1")
            .iter()
            .all(|t| t.contains("Scheduled #"))
    );

    // At most SSHMODE_SCHEDULE_MAX_PER_CHAT (2) in a chat: the third is refused, in words.
    for n in ["m1", "m2"] {
        send(
            &a,
            &clock,
            &group(n, "/cron add \"every 1h\" report", "ou_owner", thread),
        )
        .await;
    }
    assert!(reply_texts(&lark, "om_m1")[0].contains("Europe/Berlin"));
    assert!(
        reply_texts(&lark, "om_m2")[0].contains("already holds 2 schedules"),
        "{:?}",
        reply_texts(&lark, "om_m2")
    );
    a.stop().await;
}

/// Two replicas, one database, one manual clock: five due times give five firings, each
/// once — one anchor, one turn — whichever replica claims it.
#[tokio::test]
async fn five_due_times_fire_exactly_once_across_two_replicas() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let clock = clock();
    let a = app(&lark, &llm, &clock).spawn().await;
    let b = app(&lark, &llm, &clock).database(&a.db_url).spawn().await;
    send(
        &a,
        &clock,
        &p2p("add", "/cron add \"every 1m\" check the disks"),
    )
    .await;
    let id = only_schedule(&a).await;
    let start = clock.now();
    for n in 1..=5 {
        clock.advance(chrono::Duration::seconds(60));
        let runs = wait_runs(&a, id, n).await;
        assert_eq!(runs.len(), n, "{runs:?}");
    }
    // Both replicas keep ticking a while longer: nothing more is due, nothing more fires.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let f = firings(&a, id).await;
    let due: Vec<DateTime<Utc>> = (1..=5)
        .map(|n| start + chrono::Duration::seconds(60 * n))
        .collect();
    assert_eq!(f.iter().map(|(d, _)| *d).collect::<Vec<_>>(), due);
    assert!(f.iter().all(|(_, s)| s == "fired"), "{f:?}");
    assert_eq!(anchors(&lark, id).len(), 5, "{:?}", posted_texts(&lark));
    let requests: i64 =
        sqlx::query_scalar("SELECT count(*) FROM turn_requests WHERE schedule_id = $1")
            .bind(id)
            .fetch_one(&a.state.db)
            .await
            .unwrap();
    assert_eq!(requests, 5);
    // Each run's turn had the schedule's creator as its actor and the prompt as its request.
    let asked = llm
        .requests()
        .iter()
        .filter(|r| r.body.to_string().contains("check the disks"))
        .count();
    assert!(asked >= 5, "{asked}");
    let fired: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'schedule.fire' AND outcome = 'ok'",
    )
    .fetch_one(&a.state.db)
    .await
    .unwrap();
    assert_eq!(fired, 5);
    let metrics = format!("{}{}", a.metrics().await, b.metrics().await);
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("sshmode_schedule_firings_total{result=\"fired\"}"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, 5.0, "{metrics}");
    b.stop().await;
    a.stop().await;
}

/// The service down while due times pass: one late firing when it is back, marked late, not
/// one per missed due time; the next due time is the first after now.
#[tokio::test]
async fn downtime_fires_once_late_not_once_per_missed_due_time() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let clock = clock();
    let a = app(&lark, &llm, &clock).spawn().await;
    send(
        &a,
        &clock,
        &p2p("add", "/cron add \"every 1m\" look at the load"),
    )
    .await;
    let id = only_schedule(&a).await;
    let start = clock.now();
    let db = a.stop().await;
    // 30 s past the first due time, and then ten minutes more with nothing running.
    clock.advance(chrono::Duration::seconds(90));
    let b = app(&lark, &llm, &clock).database(&db).spawn().await;
    wait_runs(&b, id, 1).await;
    let f = firings(&b, id).await;
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, start + chrono::Duration::seconds(60));
    let a1 = anchors(&lark, id);
    assert_eq!(a1.len(), 1);
    assert!(a1[0].contains("late by 30 s"), "{a1:?}");
    let db = b.stop().await;
    clock.advance(chrono::Duration::minutes(10));
    let c = app(&lark, &llm, &clock).database(&db).spawn().await;
    wait_runs(&c, id, 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let f = firings(&c, id).await;
    assert_eq!(f.len(), 2, "ten missed due times fire once: {f:?}");
    let next: DateTime<Utc> = sqlx::query_scalar("SELECT next_due FROM schedules WHERE id = $1")
        .bind(id)
        .fetch_one(&c.state.db)
        .await
        .unwrap();
    assert!(next > clock.now() && next <= clock.now() + chrono::Duration::seconds(60));
    let late: i64 = sqlx::query_scalar(
        "SELECT late_ms FROM schedule_firings WHERE schedule_id = $1 ORDER BY due_at DESC LIMIT 1",
    )
    .bind(id)
    .fetch_one(&c.state.db)
    .await
    .unwrap();
    assert!(late >= 9 * 60_000, "{late}");
    c.stop().await;
}

/// Pause, resume and remove hold across the clock: a paused schedule does not fire, a
/// resumed one fires from now on (not what it missed), a removed one never again.
#[tokio::test]
async fn paused_and_removed_schedules_do_not_fire_and_resumed_ones_do_not_catch_up() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let clock = clock();
    let a = app(&lark, &llm, &clock).spawn().await;
    send(&a, &clock, &p2p("add", "/cron add \"every 1m\" tick")).await;
    let id = only_schedule(&a).await;
    send(&a, &clock, &p2p("pause", &format!("/cron pause {id}"))).await;
    clock.advance(chrono::Duration::minutes(5));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(firings(&a, id).await.is_empty());
    send(&a, &clock, &p2p("resume", &format!("/cron resume {id}"))).await;
    assert!(firings(&a, id).await.is_empty(), "nothing missed is run");
    clock.advance(chrono::Duration::seconds(60));
    wait_runs(&a, id, 1).await;
    send(&a, &clock, &p2p("remove", &format!("/cron remove {id}"))).await;
    clock.advance(chrono::Duration::minutes(5));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(firings(&a, id).await.len(), 1);
    a.stop().await;
}

/// A call the guard asks about in an unattended run parks with a card naming the schedule's
/// creator; nobody answers, and the run ends, saying so in the thread.
#[tokio::test]
async fn an_ask_in_an_unattended_run_parks_and_ends_the_run_when_nobody_answers() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let clock = clock();
    let a = app(&lark, &llm, &clock)
        .var("SSHMODE_APPROVAL_TIMEOUT_SECS", "2")
        .spawn()
        .await;
    send(&a, &clock, &p2p("add", "/cron add \"every 1m\" clean up")).await;
    let id = only_schedule(&a).await;
    llm.push(
        MODEL,
        call(
            "terminal",
            json!({"command": "touch ran_marker && rm -rf \"$NOPE_DIR\""}),
        ),
    )
    .push(MODEL, say("should not be asked again"));
    clock.advance(chrono::Duration::seconds(60));
    // The card mentions the creator (the requester of this run).
    lark.wait_until("the approval card", |reqs| {
        reqs.iter().any(|r| {
            r.body["msg_type"] == "interactive"
                && r.body["content"]
                    .as_str()
                    .is_some_and(|c| c.contains("<at id=ou_user>"))
        })
    })
    .await;
    let states = wait_runs(&a, id, 1).await;
    assert_eq!(states, vec!["stopped"]);
    let said = posted_texts(&lark).join("\n");
    assert!(
        said.contains(&format!(
            "Scheduled run #{id} ended: nobody answered the approval"
        )),
        "{said}"
    );
    // The model was not asked to go on after the wait ran out.
    assert_eq!(
        llm.requests()
            .iter()
            .filter(|r| r.body.to_string().contains("clean up"))
            .count(),
        1
    );
    a.stop().await;
}

/// The model proposes; a stranger's Add changes nothing; the owner's Add adds it with the
/// owner as its creator, and the card says so.
#[tokio::test]
async fn the_models_proposal_is_added_only_by_someone_who_may() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let clock = clock();
    let a = app(&lark, &llm, &clock).spawn().await;
    // A thread the owner opened (its first schedule makes them its owner).
    let thread = Some(("omt_root", "om_root"));
    send(
        &a,
        &clock,
        &group("own", "/cron add \"every 1h\" first", "ou_owner", thread),
    )
    .await;
    llm.push(
        MODEL,
        call(
            "cron",
            json!({"action": "propose", "schedule": "0 8 * * *", "prompt": "report the backups"}),
        ),
    )
    .push(MODEL, say("proposed"));
    send(
        &a,
        &clock,
        &group("ask", "watch the backups every morning", "ou_other", thread),
    )
    .await;
    wait_turns_ended(&a, "omt_root", 1).await;
    let results = tool_results(&llm);
    assert!(
        results[0].contains("Nothing is scheduled until"),
        "{results:?}"
    );
    let card_id = lark
        .posted()
        .iter()
        .find(|p| p["msg_type"] == "interactive")
        .map(|p| p["message_id"].as_str().unwrap().to_string())
        .expect("the proposal card");
    let proposal: i64 = sqlx::query_scalar("SELECT id FROM schedule_proposals")
        .fetch_one(&a.state.db)
        .await
        .unwrap();
    let click = |ev: &str, who: &str, chat: &str| {
        json!({
            "schema": "2.0",
            "header": {"event_id": ev, "event_type": "card.action.trigger",
                "create_time": clock.now().timestamp_millis().to_string(), "token": TOKEN,
                "app_id": crate::fake_lark::APP_ID, "tenant_key": "tk"},
            "event": {"operator": {"open_id": who, "tenant_key": "tk"}, "token": "c-t",
                "action": {"value": {"act": "schedule_proposal", "proposal": proposal, "d": "add"}, "tag": "button"},
                "host": "im_message",
                "context": {"open_message_id": card_id, "open_chat_id": chat}}
        })
    };
    // The card forwarded to another chat: a click there does not count, whoever makes it.
    for (ev, who, chat) in [
        ("k0", "ou_owner", "oc_elsewhere"),
        ("k1", "ou_other", "oc_chat"),
        ("k2", "ou_owner", "oc_chat"),
    ] {
        let (status, body) = post(
            &a,
            sealed(&click(ev, who, chat), ENCRYPT_KEY, clock.now().timestamp()),
        )
        .await;
        assert_eq!(status, 200);
        assert!(body["toast"].is_object(), "{body}");
        wait_state(&a, ev, "done").await;
    }
    let added: Vec<(String, String)> =
        sqlx::query_as("SELECT spec, creator FROM schedules WHERE prompt = 'report the backups'")
            .fetch_all(&a.state.db)
            .await
            .unwrap();
    assert_eq!(
        added,
        vec![("0 8 * * *".to_string(), "ou_owner".to_string())]
    );
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'schedule.add' AND outcome = 'refused' AND actor = 'ou_other'",
    )
    .fetch_one(&a.state.db)
    .await
    .unwrap();
    assert_eq!(refused, 1);
    let elsewhere: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'schedule.add' AND outcome = 'refused'
            AND actor = 'ou_owner' AND detail->>'reason' = 'another_chat'",
    )
    .fetch_one(&a.state.db)
    .await
    .unwrap();
    assert_eq!(elsewhere, 1);
    let patched = lark.patched(&card_id);
    assert_eq!(patched.len(), 1, "only the owner's click rewrote the card");
    assert!(patched[0].1.to_string().contains("Schedule added"));
    a.stop().await;
}

/// `sshmode schedule list|pause|resume|remove` on the same rows, audited as the operator.
#[tokio::test]
async fn the_cli_lists_pauses_resumes_and_removes() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let clock = clock();
    let a = app(&lark, &llm, &clock).spawn().await;
    send(&a, &clock, &p2p("add", "/cron add \"30 2 * * *\" nightly")).await;
    let id = only_schedule(&a).await;
    let run = async |cmd: sshmode::schedule::cli::ScheduleCmd| {
        let mut out = Vec::new();
        let code =
            sshmode::schedule::cli::run_with(cmd, &a.state.db, "cli:ops", clock.now(), &mut out)
                .await
                .unwrap();
        (code, String::from_utf8(out).unwrap())
    };
    use sshmode::schedule::cli::ScheduleCmd;
    let (code, out) = run(ScheduleCmd::List {
        chat: None,
        json: false,
    })
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!("#{id} `30 2 * * *` (UTC)")) && out.contains("chat oc_chat"),
        "{out}"
    );
    let (_, json_out) = run(ScheduleCmd::List {
        chat: Some("oc_chat".into()),
        json: true,
    })
    .await;
    let v: Value = serde_json::from_str(json_out.trim()).unwrap();
    assert_eq!(v["id"], id);
    assert_eq!(v["creator"], "ou_user");
    assert_eq!(run(ScheduleCmd::Pause { id }).await.0, 0);
    assert!(
        run(ScheduleCmd::List {
            chat: None,
            json: false
        })
        .await
        .1
        .contains("paused")
    );
    assert!(run(ScheduleCmd::Resume { id }).await.1.contains("next run"));
    assert_eq!(run(ScheduleCmd::Remove { id }).await.0, 0);
    assert_eq!(run(ScheduleCmd::Remove { id }).await.0, 2);
    let by_cli: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE actor = 'cli:ops' AND action LIKE 'schedule.%'",
    )
    .fetch_one(&a.state.db)
    .await
    .unwrap();
    assert_eq!(by_cli, 3);
    a.stop().await;
}

/// The wiring in real time: a schedule every 2 s (the minimum lowered) fires twice, each a
/// turn answered in the chat.
#[tokio::test]
async fn a_schedule_every_two_seconds_fires_in_real_time() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let a = crate::lark_support::app_with(&lark)
        .var("LLM_BASE_URL", &llm.base)
        .var("LLM_MODEL", MODEL)
        .var("SSHMODE_PROGRESS", "false")
        .var("SSHMODE_SCHEDULE_MIN_SECS", "1")
        .spawn()
        .await;
    let m = p2p("add", "/cron add \"every 2s\" say hi");
    let (status, _) = post(
        &a,
        sealed(&m.envelope(TOKEN), ENCRYPT_KEY, Utc::now().timestamp()),
    )
    .await;
    assert_eq!(status, 200);
    wait_state(&a, "add", "done").await;
    let id = only_schedule(&a).await;
    let runs = wait_runs(&a, id, 2).await;
    assert!(runs.iter().all(|s| s == "done"), "{runs:?}");
    assert!(anchors(&lark, id).len() >= 2);
    a.stop().await;
}

/// `kill -9` of the replica that claimed a firing, while its anchor post hangs: another
/// replica takes the firing over once its lease runs out; one anchor, one turn, and the next
/// due time a day on (no double, no gap).
#[tokio::test]
async fn a_replica_killed_between_claim_and_post_loses_nothing_and_doubles_nothing() {
    sshmode::install_crypto_provider();
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let port = crate::sshd::free_port();
    let bin = env!("CARGO_BIN_EXE_sshmode");
    let mut child = crate::helpers::serve_child(
        &[bin, "serve"],
        bin,
        &db,
        data.path(),
        port,
        &[
            ("SSHMODE_INBOX_LEASE_SECS", "3"),
            ("LARK_APP_ID", crate::fake_lark::APP_ID),
            ("LARK_APP_SECRET", crate::fake_lark::APP_SECRET),
            ("LARK_VERIFICATION_TOKEN", TOKEN),
            ("LARK_ENCRYPT_KEY", ENCRYPT_KEY),
            ("LARK_BASE_URL", &lark.base),
            ("LLM_BASE_URL", &llm.base),
            ("LLM_MODEL", MODEL),
        ],
    );
    let http = reqwest::Client::new();
    let ready = format!("http://127.0.0.1:{port}/readyz");
    eventually(
        "the first replica to be ready",
        Duration::from_secs(60),
        async || matches!(http.get(&ready).send().await, Ok(r) if r.status() == 200),
    )
    .await;
    // A schedule due now, once a day, in a one-to-one chat.
    lark.hold("/open-apis/im/v1/messages?receive_id_type=chat_id");
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO schedules (chat_id, section_id, in_thread, direct, spec, tz, prompt, creator,
             created_at, next_due)
         VALUES ('oc_chat', 'oc_chat', false, true, 'every 1d', 'UTC', 'daily report', 'ou_user',
             now() - interval '1 day', now()) RETURNING id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    lark.wait_until("the anchor post to hang", |reqs| {
        reqs.iter()
            .any(|r| r.body.to_string().contains(&format!("scheduled #{id}")))
    })
    .await;
    child.kill().await.unwrap();
    let (due, state): (DateTime<Utc>, String) =
        sqlx::query_as("SELECT due_at, state FROM schedule_firings WHERE schedule_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(state, "queued", "claimed, not posted");
    lark.release();
    let b = crate::lark_support::app_with(&lark)
        .var("LLM_BASE_URL", &llm.base)
        .var("LLM_MODEL", MODEL)
        .var("SSHMODE_PROGRESS", "false")
        .database(&db)
        .spawn()
        .await;
    let runs = wait_runs(&b, id, 1).await;
    assert_eq!(runs, vec!["done"]);
    let f = firings(&b, id).await;
    assert_eq!(f, vec![(due, "fired".to_string())]);
    assert_eq!(anchors(&lark, id).len(), 1, "{:?}", posted_texts(&lark));
    let next: DateTime<Utc> = sqlx::query_scalar("SELECT next_due FROM schedules WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let day = chrono::Duration::days(1);
    assert!(next > due && next <= due + day, "{next} after {due}");
    b.stop().await;
}

/// Makes schedule `id` due now (the app runs on the system clock here).
async fn make_due(app: &TestApp, id: i64) {
    sqlx::query("UPDATE schedules SET next_due = $2 WHERE id = $1")
        .bind(id)
        .bind(Utc::now() - chrono::Duration::seconds(1))
        .execute(&app.state.db)
        .await
        .unwrap();
}

/// Each run takes the thread's binding when it fires: local, then the target the thread was
/// bound to since, then — once the target no longer allows the chat — a failure that says so
/// (never local).
#[tokio::test]
async fn each_run_uses_the_threads_binding_at_fire_time() {
    let env = crate::agent::Env::builder()
        .chat_control()
        .target("web")
        .spawn()
        .await;
    let app = &env.app;
    let real = Arc::new(ManualClock::new(Utc::now()));
    let thread = Some(("omt_bind", "om_bind"));
    let say_in = async |id: &str, text: &str| {
        real.set(Utc::now());
        send(app, &real, &group(id, text, "ou_user", thread)).await;
    };
    say_in("add", "/cron add \"every 1h\" who runs this?").await;
    let id = only_schedule(app).await;
    let whoami = || call("terminal", json!({"command": "id -un"}));
    env.llm.push(MODEL, whoami()).push(MODEL, say("ran"));
    make_due(app, id).await;
    wait_runs(app, id, 1).await;
    say_in("use", "/ssh use web").await;
    env.llm.push(MODEL, whoami()).push(MODEL, say("ran"));
    make_due(app, id).await;
    wait_runs(app, id, 2).await;
    let mut out = Vec::new();
    let r = sshmode::target::cli::run_with(
        sshmode::target::cli::TargetCmd::Allow(sshmode::target::cli::AllowArgs {
            alias: "web".into(),
            chats: vec!["oc_other".into()],
            all_chats: false,
        }),
        &app.state.config,
        &app.state.db,
        &mut std::io::Cursor::new(Vec::new()),
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(r, 0);
    env.llm.push(MODEL, whoami()).push(MODEL, say("ran"));
    make_due(app, id).await;
    wait_runs(app, id, 3).await;
    let r = tool_results(&env.llm);
    assert_eq!(r.len(), 3, "{r:?}");
    assert!(!r[0].contains(crate::sshd::USER), "local first: {r:?}");
    assert!(r[1].contains(crate::sshd::USER), "then the target: {r:?}");
    assert!(
        r[2].contains("no longer allowed in this chat") && !r[2].contains(crate::sshd::USER),
        "then refused, never local: {r:?}"
    );
}

/// An admin's schedule in someone else's thread: once they are no longer an admin, its next
/// firing pauses it and says why in the thread; nothing runs.
#[tokio::test]
async fn a_schedule_whose_creator_may_no_longer_run_it_pauses_and_says_why() {
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let clock = clock();
    let a = app(&lark, &llm, &clock).spawn().await;
    let thread = Some(("omt_p", "om_p"));
    send(
        &a,
        &clock,
        &group("o1", "/cron add \"every 1h\" mine", "ou_owner", thread),
    )
    .await;
    send(
        &a,
        &clock,
        &group(
            "o2",
            "/cron add \"every 1m\" the admin's",
            "ou_admin",
            thread,
        ),
    )
    .await;
    let id: i64 = sqlx::query_scalar("SELECT id FROM schedules WHERE creator = 'ou_admin'")
        .fetch_one(&a.state.db)
        .await
        .unwrap();
    let db = a.stop().await;
    let b = app(&lark, &llm, &clock)
        .var("SSHMODE_ADMINS", "ou_someone_else")
        .database(&db)
        .spawn()
        .await;
    clock.advance(chrono::Duration::seconds(60));
    eventually("the schedule to pause", WAIT, async || {
        firings(&b, id).await.iter().any(|(_, s)| s == "paused")
    })
    .await;
    let reason: Option<String> =
        sqlx::query_scalar("SELECT paused_reason FROM schedules WHERE id = $1")
            .bind(id)
            .fetch_one(&b.state.db)
            .await
            .unwrap();
    assert_eq!(
        reason.as_deref(),
        Some("its creator ou_admin may no longer run it here")
    );
    let told = posted_texts(&lark);
    assert!(
        told.iter().any(|t| t.starts_with(&format!(
            "⏰ Schedule #{id} is paused: its creator ou_admin"
        ))),
        "{told:?}"
    );
    assert!(anchors(&lark, id).is_empty());
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM turn_requests WHERE schedule_id = $1")
        .bind(id)
        .fetch_one(&b.state.db)
        .await
        .unwrap();
    assert_eq!(runs, 0);
    b.stop().await;
}
