//! From callback to reply, against the fake Lark: the exact reply request, de-duplication of
//! redeliveries, recovery after a restart, rate-limit retries, the router's answers, and
//! dead-lettering.

use std::sync::Arc;

use serde_json::json;
use sshmode::chat::{NO_MODEL, command};
use sshmode::clock::ManualClock;
use sshmode::lark::client::idempotency_key;

use crate::fake_lark::{Failure, FakeLark};
use crate::lark_support::*;

fn reply_text(r: &crate::fake_lark::Recorded) -> String {
    crate::fake_lark::message_text(r.body["content"].as_str().unwrap())
}

#[tokio::test]
async fn help_is_answered_with_the_exact_reply_request() {
    let fake = FakeLark::start().await;
    let app = app_with(&fake).spawn().await;
    let msg = Msg::new("ev_help", "/help");
    assert_eq!(post(&app, sealed_now(&msg.envelope(TOKEN))).await.0, 200);
    wait_state(&app, "ev_help", "done").await;

    let reqs = fake.requests();
    let summary: Vec<(String, String)> = reqs
        .iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "POST".into(),
                "/open-apis/auth/v3/tenant_access_token/internal".into()
            ),
            ("GET".into(), "/open-apis/bot/v3/info".into()),
            (
                "POST".into(),
                "/open-apis/im/v1/messages/om_ev_help/reply".into()
            ),
        ]
    );
    assert_eq!(
        reqs[0].body,
        json!({"app_id": crate::fake_lark::APP_ID, "app_secret": crate::fake_lark::APP_SECRET})
    );
    assert_eq!(reqs[0].auth, None);
    assert_eq!(reqs[1].bearer(), Some("t-1"));
    assert_eq!(reqs[2].bearer(), Some("t-1"));
    // A post whose `md` renders: the help's Markdown made into what a post shows.
    assert_eq!(
        reqs[2].body,
        json!({
            "msg_type": "post",
            "content": sshmode::frontend::post_content(&command::help_text()).to_string(),
            "reply_in_thread": false,
            "uuid": idempotency_key("ev_help", "reply"),
        })
    );
    let content = reqs[2].body["content"].as_str().unwrap();
    assert!(command::help_text().contains('`'));
    assert_eq!(
        crate::fake_lark::unrendered_markdown("post", content),
        Vec::<String>::new()
    );
    assert!(crate::fake_lark::message_text(content).contains("/ssh use"));
    // The exchange is in the chat's section log.
    let kinds = section_kinds(&app, "oc_chat").await;
    assert_eq!(kinds, ["message.received", "bot.reply"]);
    app.stop().await;
}

#[tokio::test]
async fn ssh_help_in_a_thread_with_a_mention_replies_in_the_thread() {
    let fake = FakeLark::start().await;
    let app = app_with(&fake).spawn().await;
    let mut msg = Msg::new("ev_th", "@_user_1 /ssh help");
    msg.chat_type = "group";
    msg.mention_bot = true;
    msg.thread_id = Some("omt_thread".into());
    assert_eq!(post(&app, sealed_now(&msg.envelope(TOKEN))).await.0, 200);
    wait_state(&app, "ev_th", "done").await;
    let replies = fake.requests_to("/reply");
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].body["reply_in_thread"], true);
    assert_eq!(
        reply_text(&replies[0]),
        sshmode::lark::markup::for_post(&command::help_text())
    );
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM session_events WHERE section_id = 'omt_thread'")
            .fetch_one(&app.state.db)
            .await
            .unwrap();
    assert_eq!(n, 2);
    app.stop().await;
}

/// What no handler acts on — a message a bot sent, an event type nothing handles — is recorded
/// done by the callback itself: acknowledged like any event, never claimed (no attempt), a
/// redelivery still recognised, and a person's message after it in the same chat handled as
/// before.
#[tokio::test]
async fn events_that_need_no_handling_are_recorded_done_and_never_claimed() {
    let fake = FakeLark::start().await;
    let app = app_with(&fake).spawn().await;
    let mut from_bot = Msg::new("ev_bot_said", "/ssh status");
    from_bot.sender_type = "app";
    let mut other = from_bot.envelope(TOKEN);
    other["header"]["event_id"] = json!("ev_other_type");
    other["header"]["event_type"] = json!("im.chat.updated_v1");
    other["event"] = json!({"chat_id": from_bot.chat_id, "operator_id": {"open_id": "ou_x"}});
    assert_eq!(
        post(&app, sealed_now(&from_bot.envelope(TOKEN))).await.0,
        200
    );
    assert_eq!(post(&app, sealed_now(&other)).await.0, 200);
    let rows: Vec<(String, i32, bool)> = sqlx::query_as(
        "SELECT state, attempts, finished_at IS NOT NULL FROM inbox_events
         WHERE event_id IN ('ev_bot_said', 'ev_other_type') ORDER BY event_id",
    )
    .fetch_all(&app.state.db)
    .await
    .unwrap();
    assert_eq!(rows, [("done".into(), 0, true), ("done".into(), 0, true)]);
    assert_eq!(app.state.metrics.events_inert.get(), 2);
    assert_eq!(app.state.metrics.inbox_wakeups.get(), 0);
    let sections: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_sections")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert_eq!(sections, 0, "an inert event is no section's head");

    // A redelivery is recognised as one.
    assert_eq!(
        post(&app, sealed_now(&from_bot.envelope(TOKEN))).await.0,
        200
    );
    assert_eq!(app.state.metrics.events_duplicate.get(), 1);
    assert_eq!(app.state.metrics.events_inert.get(), 2);

    let person = Msg::new("ev_person", "/ssh status");
    assert_eq!(post(&app, sealed_now(&person.envelope(TOKEN))).await.0, 200);
    wait_state(&app, "ev_person", "done").await;
    assert_eq!(fake.requests_to("/messages/om_ev_person/reply").len(), 1);
    assert!(
        fake.requests_to("/messages/om_ev_bot_said/reply")
            .is_empty()
    );
    app.stop().await;
}

#[tokio::test]
async fn the_router_answers_what_it_can_and_ignores_the_rest() {
    let fake = FakeLark::start().await;
    let app = app_with(&fake).spawn().await;
    let mut from_bot = Msg::new("ev_bot", "/help");
    from_bot.sender_type = "app";
    let mut unaddressed = Msg::new("ev_group", "just chatting");
    unaddressed.chat_type = "group";
    let mut mention = Msg::new("ev_mention", "@_user_1 please check the disk");
    mention.chat_type = "group";
    mention.mention_bot = true;
    let status = Msg::new("ev_status", "/ssh status");
    let off = Msg::new("ev_off", "/ssh off");
    let bad = Msg::new("ev_bad", "/ssh use");
    let direct = Msg::new("ev_dm", "hello");
    for m in [
        &from_bot,
        &unaddressed,
        &mention,
        &status,
        &off,
        &bad,
        &direct,
    ] {
        assert_eq!(post(&app, sealed_now(&m.envelope(TOKEN))).await.0, 200);
    }
    for m in [
        &from_bot,
        &unaddressed,
        &mention,
        &status,
        &off,
        &bad,
        &direct,
    ] {
        wait_state(&app, &m.event_id, "done").await;
    }
    let by_target = |id: &str| {
        fake.requests_to(&format!("/messages/om_{id}/reply"))
            .iter()
            .map(reply_text)
            .collect::<Vec<_>>()
    };
    assert!(by_target("ev_bot").is_empty());
    assert!(by_target("ev_group").is_empty());
    assert_eq!(by_target("ev_mention"), [NO_MODEL]);
    assert_eq!(by_target("ev_dm"), [NO_MODEL]);
    assert!(by_target("ev_status")[0].starts_with("Backend: local"));
    assert_eq!(by_target("ev_off"), ["This thread already runs locally."]);
    assert!(by_target("ev_bad")[0].starts_with("Usage: /ssh use ＜alias>"));
    app.stop().await;
}

#[tokio::test]
async fn an_event_delivered_three_times_is_answered_once() {
    let fake = FakeLark::start().await;
    let app = app_with(&fake)
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .spawn()
        .await;
    let env = Msg::new("ev_thrice", "/help").envelope(TOKEN);
    for _ in 0..3 {
        assert_eq!(
            post(&app, sealed(&env, ENCRYPT_KEY, now_secs())).await.0,
            200
        );
    }
    wait_state(&app, "ev_thrice", "done").await;
    // A fourth delivery after processing is also only acknowledged.
    assert_eq!(
        post(&app, sealed(&env, ENCRYPT_KEY, now_secs())).await.0,
        200
    );
    let db = app.stop().await;
    assert_eq!(fake.requests_to("/reply").len(), 1);
    assert_eq!(fake.posted().len(), 1);
    drop(db);
}

#[tokio::test]
async fn an_event_recorded_before_a_stop_is_handled_after_restart() {
    let fake = FakeLark::start().await;
    let app = app_with(&fake)
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .spawn()
        .await;
    let env = Msg::new("ev_restart", "/help").envelope(TOKEN);
    assert_eq!(post(&app, sealed_now(&env)).await.0, 200);
    assert_eq!(
        inbox(&app).await,
        vec![("ev_restart".into(), "pending".into(), 0)]
    );
    let db = app.stop().await;
    assert!(
        fake.requests().is_empty(),
        "nothing may be sent before handling"
    );

    let app = app_with(&fake).database(&db).spawn().await;
    wait_state(&app, "ev_restart", "done").await;
    let replies = fake.requests_to("/reply");
    assert_eq!(replies.len(), 1);
    assert_eq!(
        replies[0].path,
        "/open-apis/im/v1/messages/om_ev_restart/reply"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_claimed_but_unfinished_event_is_retaken_after_its_lease() {
    // A process that died mid-handling leaves the row claimed; after restart the lease
    // (here 1 s) runs out and the event is processed.
    let fake = FakeLark::start().await;
    let app = app_with(&fake)
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .spawn()
        .await;
    let env = Msg::new("ev_lease", "/help").envelope(TOKEN);
    assert_eq!(post(&app, sealed_now(&env)).await.0, 200);
    let claimed = sshmode::inbox::claim(
        &app.state.db,
        chrono::Utc::now(),
        std::time::Duration::from_secs(1),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        (claimed.event_id.as_str(), claimed.attempts),
        ("ev_lease", 1)
    );
    let db = app.stop().await;
    let app = app_with(&fake)
        .var("SSHMODE_INBOX_LEASE_SECS", "1")
        .database(&db)
        .spawn()
        .await;
    wait_state(&app, "ev_lease", "done").await;
    assert_eq!(fake.requests_to("/reply").len(), 1);
    assert_eq!(inbox(&app).await[0].2, 2);
    app.stop().await;
}

#[tokio::test]
async fn a_rate_limited_reply_is_posted_exactly_once() {
    let fake = FakeLark::start().await;
    fake.fail_next("/reply", vec![Failure::RateLimited("0")]);
    let app = app_with(&fake).spawn().await;
    let env = Msg::new("ev_429", "/help").envelope(TOKEN);
    assert_eq!(post(&app, sealed_now(&env)).await.0, 200);
    wait_state(&app, "ev_429", "done").await;
    let replies = fake.requests_to("/reply");
    assert_eq!(replies.len(), 2, "one refused, one accepted");
    assert_eq!(
        replies[0].body, replies[1].body,
        "the retry is the same request, uuid included"
    );
    assert_eq!(fake.posted().len(), 1);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sshmode_lark_api_calls_total{api=\"reply\",outcome=\"rate_limited\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sshmode_lark_api_calls_total{api=\"reply\",outcome=\"ok\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sshmode_events_processed_total 1"),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_event_that_keeps_failing_is_dead_lettered() {
    let fake = FakeLark::start().await;
    // The reply is refused with a permanent error every time.
    fake.fail_next("/reply", vec![Failure::Code(230002), Failure::Code(230002)]);
    let app = app_with(&fake)
        .var("SSHMODE_INBOX_MAX_ATTEMPTS", "1")
        .spawn()
        .await;
    let env = Msg::new("ev_dead", "/help").envelope(TOKEN);
    assert_eq!(post(&app, sealed_now(&env)).await.0, 200);
    wait_state(&app, "ev_dead", "dead").await;
    let err: String =
        sqlx::query_scalar("SELECT last_error FROM inbox_events WHERE event_id = 'ev_dead'")
            .fetch_one(&app.state.db)
            .await
            .unwrap();
    assert!(err.contains("230002"), "{err}");
    assert!(!err.contains("t-1") && !err.contains(crate::fake_lark::APP_SECRET));
    let metrics = app.metrics().await;
    assert!(metrics.contains("sshmode_events_dead_total 1"), "{metrics}");
    assert!(
        metrics.contains("sshmode_events_failed_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("sshmode_inbox_depth 0"), "{metrics}");
    app.stop().await;
}

#[tokio::test]
async fn a_failed_event_is_retried_with_backoff() {
    let fake = FakeLark::start().await;
    fake.fail_next("/reply", vec![Failure::Code(230002)]);
    // The app's clock stands still until the test moves it, so the retry cannot happen
    // before the failure has been looked at.
    // Whole microseconds, as PostgreSQL stores them.
    let t0 =
        chrono::DateTime::from_timestamp_micros(chrono::Utc::now().timestamp_micros()).unwrap();
    let clock = Arc::new(ManualClock::new(t0));
    let app = app_with(&fake).clock(clock.clone()).spawn().await;
    let env = Msg::new("ev_retry", "/help").envelope(TOKEN);
    assert_eq!(post(&app, sealed_now(&env)).await.0, 200);
    // The failure is recorded with a retry two seconds out (first backoff step) …
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let row = loop {
        let row: (String, i32, Option<String>, chrono::DateTime<chrono::Utc>) = sqlx::query_as(
            "SELECT state, attempts, last_error, available_at FROM inbox_events WHERE event_id = 'ev_retry'",
        )
        .fetch_one(&app.state.db)
        .await
        .unwrap();
        if row.2.is_some() {
            break row;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failure was never recorded: {row:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!((row.0.as_str(), row.1), ("pending", 1));
    assert!(row.2.unwrap().contains("230002"));
    assert_eq!(row.3, t0 + chrono::Duration::seconds(2));
    assert_eq!(fake.requests_to("/reply").len(), 1);
    // … and once that time has come, the retry succeeds.
    clock.advance(chrono::Duration::seconds(2));
    wait_state(&app, "ev_retry", "done").await;
    assert_eq!(fake.requests_to("/reply").len(), 2);
    assert_eq!(fake.posted().len(), 1);
    // The retry did not log the received message a second time.
    let kinds = section_kinds(&app, "oc_chat").await;
    assert_eq!(kinds, ["message.received", "bot.reply"]);
    app.stop().await;
}

#[tokio::test]
async fn shutdown_hands_back_an_event_being_handled() {
    let fake = FakeLark::start().await;
    fake.hold("/reply");
    let app = app_with(&fake).spawn().await;
    let env = Msg::new("ev_handback", "/help").envelope(TOKEN);
    assert_eq!(post(&app, sealed_now(&env)).await.0, 200);
    // The worker is inside the reply call when the service stops.
    fake.wait_until("the reply call", |r| {
        r.iter().any(|r| r.path.contains("/reply"))
    })
    .await;
    let db = app.stop().await;
    let conn_app = app_with(&fake)
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .database(&db)
        .spawn()
        .await;
    assert_eq!(
        inbox(&conn_app).await,
        vec![("ev_handback".into(), "pending".into(), 1)],
        "handed back, the attempt counted: the re-run is a retry"
    );
    conn_app.stop().await;

    fake.release();
    let app = app_with(&fake).database(&db).spawn().await;
    wait_state(&app, "ev_handback", "done").await;
    // Both calls carried the same uuid, so Lark posted one message.
    let replies = fake.requests_to("/reply");
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[0].body["uuid"], replies[1].body["uuid"]);
    assert_eq!(fake.posted().len(), 1);
    // The re-run knew it was one: the section log holds the exchange once.
    let kinds = section_kinds(&app, "oc_chat").await;
    assert_eq!(kinds, ["message.received", "bot.reply"]);
    app.stop().await;
}

/// The kinds of a section's event-log entries, in order.
async fn section_kinds(app: &crate::helpers::TestApp, section: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM session_events WHERE section_id = $1 ORDER BY seq")
        .bind(section)
        .fetch_all(&app.state.db)
        .await
        .unwrap()
}
