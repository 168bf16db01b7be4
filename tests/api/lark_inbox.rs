//! The inbox's storage operations directly: claim order and leases, backoff, dead letter,
//! and the bounded retention cleanup.

use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::json;
use sshmode::inbox::NewEvent;
use sshmode::inbox::{self, Failed};

use crate::helpers::{TestApp, eventually};

fn env(id: &str) -> NewEvent {
    NewEvent {
        event_id: id.into(),
        event_type: "im.message.receive_v1".into(),
        payload: json!({"header": {"event_id": id}}).to_string(),
        section: None,
        message_id: None,
        express: false,
    }
}

#[tokio::test]
async fn claim_lease_backoff_dead_letter_and_cleanup() {
    let app = TestApp::builder()
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .spawn()
        .await;
    let db = &app.state.db;
    for id in ["a", "b", "c"] {
        assert!(app.state.inbox.record(env(id)).await.unwrap());
    }
    assert!(!app.state.inbox.record(env("a")).await.unwrap());

    let t0 = Utc::now() + chrono::Duration::seconds(1);
    let lease = Duration::from_secs(60);
    let a = inbox::claim(db, t0, lease).await.unwrap().unwrap();
    let b = inbox::claim(db, t0, lease).await.unwrap().unwrap();
    let c = inbox::claim(db, t0, lease).await.unwrap().unwrap();
    assert_eq!([&a.event_id, &b.event_id, &c.event_id], ["a", "b", "c"]);
    // Everything is leased: nothing to claim until a lease runs out.
    assert!(inbox::claim(db, t0, lease).await.unwrap().is_none());

    // a: done. b: failed once (retry after the first backoff step). c: handed back.
    inbox::complete(db, "a", t0).await.unwrap();
    let f = inbox::fail(db, &b, "boom", t0, 2).await.unwrap();
    assert_eq!(f, Failed::Retry(t0 + chrono::Duration::seconds(2)));
    inbox::hand_back(db, "c", t0).await.unwrap();
    // Handed back: due at once, and its next run knows it is a retry (the handler may have
    // done part of its work).
    let c2 = inbox::claim(db, t0, lease).await.unwrap().unwrap();
    assert_eq!((c2.event_id.as_str(), c2.attempts), ("c", 2));
    assert!(inbox::claim(db, t0, lease).await.unwrap().is_none());
    let b2 = inbox::claim(db, t0 + chrono::Duration::seconds(2), lease)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b2.event_id.as_str(), b2.attempts), ("b", 2));
    // Out of attempts: dead, and never claimed again.
    assert_eq!(
        inbox::fail(db, &b2, "boom", t0, 2).await.unwrap(),
        Failed::Dead
    );
    inbox::complete(db, "c", t0).await.unwrap();
    assert!(
        inbox::claim(db, t0 + chrono::Duration::days(1), lease)
            .await
            .unwrap()
            .is_none()
    );

    // Cleanup removes finished rows — done or dead — finished before the cut-off, at most
    // `limit` at a time.
    let old = Utc.with_ymd_and_hms(2020, 1, 1, 0, 0, 0).unwrap();
    for id in ["d", "e", "f"] {
        app.state.inbox.record(env(id)).await.unwrap();
        inbox::complete(db, id, old).await.unwrap();
    }
    app.state.inbox.record(env("g")).await.unwrap();
    let g = inbox::claim(db, t0 + chrono::Duration::days(1), lease)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(g.event_id, "g");
    assert_eq!(
        inbox::fail(db, &g, "boom", old, 1).await.unwrap(),
        Failed::Dead
    );
    let cut = old + chrono::Duration::days(1);
    assert_eq!(inbox::cleanup(db, cut, 2).await.unwrap(), 2);
    assert_eq!(inbox::cleanup(db, cut, 2).await.unwrap(), 2);
    assert_eq!(inbox::cleanup(db, cut, 2).await.unwrap(), 0);
    let left: Vec<(String, String)> =
        sqlx::query_as("SELECT event_id, state FROM inbox_events ORDER BY event_id")
            .fetch_all(db)
            .await
            .unwrap();
    assert_eq!(
        left,
        vec![
            ("a".into(), "done".into()),
            ("b".into(), "dead".into()),
            ("c".into(), "done".into())
        ]
    );
    app.stop().await;
}

/// A payload PostgreSQL's jsonb refuses (`\u0000`, a lone surrogate) is stored with U+FFFD in
/// its place, and neither it nor the events written in the same batch fail.
#[tokio::test]
async fn an_event_with_a_nul_character_does_not_fail_its_batch() {
    let app = TestApp::builder()
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .spawn()
        .await;
    let mut writes = Vec::new();
    for i in 0..40 {
        let state = app.state.clone();
        let mut e = env(&format!("n{i}"));
        if i % 10 == 3 {
            let event = json!({"text": "before\u{0}after", "k\u{0}ey": ["\u{0}"]});
            e.payload = json!({"header": {"event_id": e.event_id}, "event": event}).to_string();
        }
        if i == 24 {
            // Escapes jsonb refuses, as the callback passes them on (it checks the JSON
            // without decoding strings): lone surrogates. Beside them, text that only looks
            // like an escape, and a real pair, which must stay as they are.
            e.payload =
                r#"{"event":{"a":"x\ud800y","b":"\udc00","c":"\\u0000","d":"\ud83d\ude00"}}"#
                    .to_string();
        }
        if i == 17 {
            e.event_id = "n\u{0}17".into();
        }
        writes.push(tokio::spawn(async move { state.inbox.record(e).await }));
    }
    for w in writes {
        assert!(w.await.unwrap().expect("recorded"));
    }
    let db = &app.state.db;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_events")
        .fetch_one(db)
        .await
        .unwrap();
    assert_eq!(n, 40);
    let p: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM inbox_events WHERE event_id = 'n3'")
            .fetch_one(db)
            .await
            .unwrap();
    assert_eq!(
        p["event"],
        json!({"text": "before\u{FFFD}after", "k\u{FFFD}ey": ["\u{FFFD}"]})
    );
    let p: serde_json::Value =
        sqlx::query_scalar("SELECT payload FROM inbox_events WHERE event_id = 'n24'")
            .fetch_one(db)
            .await
            .unwrap();
    assert_eq!(
        p["event"],
        json!({"a": "x\u{FFFD}y", "b": "\u{FFFD}", "c": "\\u0000", "d": "\u{1F600}"})
    );
    let odd: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_events WHERE event_id = 'n\u{FFFD}17'")
            .fetch_one(db)
            .await
            .unwrap();
    assert_eq!(odd, 1);
    app.stop().await;
}

/// A flush runs on the task tracker the inbox was given (the app's), so shutdown waits for a
/// write in progress even when the request that started it has gone away.
#[tokio::test]
async fn a_flush_runs_on_the_apps_task_tracker() {
    use sqlx::Connection;
    let app = TestApp::builder()
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .spawn()
        .await;
    let tracker = tokio_util::task::TaskTracker::new();
    let mut state = app.state.clone();
    state.inbox = inbox::Inbox::new(
        inbox::InboxDeps {
            db: state.db.clone(),
            clock: state.clock.clone(),
            metrics: state.metrics.clone(),
            config: state.config.inbox.clone(),
            shutdown: state.shutdown.clone(),
        },
        8,
        tracker.clone(),
    );
    // Hold the table so the write cannot finish yet.
    let mut lock = sqlx::PgConnection::connect(&app.db_url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut lock).await.unwrap();
    sqlx::query("LOCK TABLE inbox_events IN ACCESS EXCLUSIVE MODE")
        .execute(&mut lock)
        .await
        .unwrap();
    let request = tokio::spawn(async move { state.inbox.record(env("t1")).await });
    eventually(
        "a flush task on the tracker",
        Duration::from_secs(20),
        || async { !tracker.is_empty() },
    )
    .await;
    // The request goes away; shutdown begins; the write goes through and is waited for.
    request.abort();
    tracker.close();
    sqlx::query("COMMIT").execute(&mut lock).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), tracker.wait())
        .await
        .expect("the flush finished");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_events WHERE event_id = 't1'")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert_eq!(n, 1);
    app.stop().await;
}
