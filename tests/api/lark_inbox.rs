//! The inbox's storage operations directly: claim order and leases, backoff, dead letter,
//! and the bounded retention cleanup.

use std::sync::Arc;
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
        inert: false,
    }
}

#[tokio::test]
async fn claim_lease_backoff_dead_letter_and_cleanup() {
    let app = without_workers().await;
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

/// An app whose inbox workers are off, so the test claims and finishes events itself.
async fn without_workers() -> TestApp {
    TestApp::builder()
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .spawn()
        .await
}
/// A payload PostgreSQL's jsonb refuses (`\u0000`, a lone surrogate) is stored with U+FFFD in
/// its place, and neither it nor the events written in the same batch fail.
#[tokio::test]
async fn an_event_with_a_nul_character_does_not_fail_its_batch() {
    let app = without_workers().await;
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
    let app = without_workers().await;
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

fn in_section(id: &str, section: &str, express: bool) -> NewEvent {
    NewEvent {
        section: Some(section.into()),
        message_id: Some(format!("om_{id}")),
        express,
        ..env(id)
    }
}

/// Rows the claim's plan read from `inbox_events` and `inbox_sections` (returned or filtered
/// out, over all loops), from `EXPLAIN ANALYZE` in a transaction that is rolled back.
async fn rows_read_by_claim(db: &sqlx::PgPool, now: chrono::DateTime<Utc>) -> (f64, String) {
    let mut tx = db.begin().await.unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) {}",
        inbox::claim_sql()
    ))
    .bind(now)
    .bind(now + chrono::Duration::minutes(1))
    .bind(inbox::RUN_MAX as i64 - 1)
    .bind(inbox::SECTIONS_MAX as i64)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    fn walk(node: &serde_json::Value) -> f64 {
        let n = |k: &str| node.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        let relation = node.get("Relation Name").and_then(|v| v.as_str());
        let own = if matches!(relation, Some("inbox_events" | "inbox_sections")) {
            (n("Actual Rows") + n("Rows Removed by Filter") + n("Rows Removed by Index Recheck"))
                * n("Actual Loops")
        } else {
            0.0
        };
        let children: f64 = node
            .get("Plans")
            .and_then(|p| p.as_array())
            .map(|a| a.iter().map(walk).sum())
            .unwrap_or(0.0);
        own + children
    }
    (walk(&plan[0]["Plan"]), plan.to_string())
}

/// A busy chat's backlog behind its leased head costs another section's claim nothing: the
/// other section's event is claimed, and the claim reads as many rows with 3 000 events queued
/// as with 10.
#[tokio::test]
async fn a_backlog_behind_a_leased_head_does_not_grow_the_claim() {
    let app = without_workers().await;
    let db = &app.state.db;
    let t0 = Utc::now() - chrono::Duration::minutes(10);
    let lease = Duration::from_secs(3600);
    let backlog = |from: i64, to: i64| {
        sqlx::query(
            "INSERT INTO inbox_events (event_id, event_type, payload, received_at, available_at, section, message_id)
             SELECT 'big' || g, 'im.message.receive_v1', '{}'::jsonb, $1 + g * interval '1 ms',
                    $1 + g * interval '1 ms', 'oc_big', 'om_big' || g
             FROM generate_series($2::bigint, $3::bigint) g ORDER BY g",
        )
        .bind(t0)
        .bind(from)
        .bind(to)
    };
    backlog(1, 10).execute(db).await.unwrap();
    inbox::index_sections(db).await.unwrap();
    // The chat's head is in progress; another section has one event, newer than the backlog.
    let head = inbox::claim(db, Utc::now(), lease).await.unwrap().unwrap();
    assert_eq!(head.event_id, "big1");
    assert!(
        app.state
            .inbox
            .record(in_section("other", "omt_other", false))
            .await
            .unwrap()
    );
    let (small, _) = rows_read_by_claim(db, Utc::now()).await;

    backlog(11, 3000).execute(db).await.unwrap();
    inbox::index_sections(db).await.unwrap();
    sqlx::query("ANALYZE inbox_events")
        .execute(db)
        .await
        .unwrap();
    let (big, plan) = rows_read_by_claim(db, Utc::now()).await;
    assert!(
        big < 50.0 && big <= small + 5.0,
        "rows read: {small} with 10 queued, {big} with 3000: {plan}"
    );
    let got = inbox::claim(db, Utc::now(), lease).await.unwrap().unwrap();
    assert_eq!(got.event_id, "other");
    assert!(inbox::claim(db, Utc::now(), lease).await.unwrap().is_none());
    app.stop().await;
}

/// Many busy sections (each with its head leased) cost a claim nothing: it reads the rows of
/// `inbox_sections` that are due, never the held ones, so it reads as many rows with 2 000
/// busy sections as with 10, and takes the one section that is free.
#[tokio::test]
async fn busy_sections_do_not_grow_the_claim() {
    let app = without_workers().await;
    let db = &app.state.db;
    let t0 = Utc::now() - chrono::Duration::minutes(10);
    // `n` sections with two events each, their heads leased for an hour (as a claim leaves them).
    let busy = |from: i64, to: i64| async move {
        sqlx::query(
            "INSERT INTO inbox_events (event_id, event_type, payload, received_at, available_at, section, message_id)
             SELECT 'b' || g || '_' || k, 'im.message.receive_v1', '{}'::jsonb, $1, $1,
                    'oc_b' || g, 'om_b' || g || '_' || k
             FROM generate_series($2::bigint, $3::bigint) g, generate_series(1, 2) k ORDER BY g, k",
        )
        .bind(t0)
        .bind(from)
        .bind(to)
        .execute(db)
        .await
        .unwrap();
        inbox::index_sections(db).await.unwrap();
        let held = Utc::now() + chrono::Duration::hours(1);
        sqlx::query("UPDATE inbox_sections SET available_at = $1 WHERE section LIKE 'oc_b%'")
            .bind(held)
            .execute(db)
            .await
            .unwrap();
        sqlx::query(
            "UPDATE inbox_events SET available_at = $1, attempts = 1 WHERE event_id LIKE 'b%\\_1'",
        )
        .bind(held)
        .execute(db)
        .await
        .unwrap();
        sqlx::query("ANALYZE inbox_events")
            .execute(db)
            .await
            .unwrap();
        sqlx::query("ANALYZE inbox_sections")
            .execute(db)
            .await
            .unwrap();
    };
    busy(1, 10).await;
    assert!(
        app.state
            .inbox
            .record(in_section("free1", "omt_free", false))
            .await
            .unwrap()
    );
    let (small, _) = rows_read_by_claim(db, Utc::now()).await;
    busy(11, 2000).await;
    let (big, plan) = rows_read_by_claim(db, Utc::now()).await;
    assert!(
        big < 20.0 && big <= small + 5.0,
        "rows read: {small} with 10 busy sections, {big} with 2000: {plan}"
    );
    let got = inbox::claim_batch(db, Utc::now(), Duration::from_secs(60), 64, 16)
        .await
        .unwrap();
    let ids: Vec<&str> = got.events.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(
        (ids, got.sections),
        (vec!["free1"], vec!["omt_free".to_string()])
    );
    app.stop().await;
}

/// `rounds` claims of a run each (up to 64 events), every run marked done at once; the ids
/// claimed, in order.
async fn claim_and_finish(db: &sqlx::PgPool, lease: Duration, rounds: usize) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..rounds {
        let run = inbox::claim_run(db, Utc::now(), lease, 64).await.unwrap();
        got.extend(run.iter().map(|e| e.event_id.clone()));
        let handled: Vec<(String, i32)> = run
            .iter()
            .map(|e| (e.event_id.clone(), e.attempts))
            .collect();
        inbox::complete_run(db, &handled, Utc::now()).await.unwrap();
    }
    got
}

/// Batches commit in any order, so an event can be recorded below its section's floor (the
/// hand-over of the run before it could not see it yet): the write lowers the floor, and the
/// event is claimed after the run, not lost.
#[tokio::test]
async fn an_event_recorded_below_its_sections_floor_is_still_claimed() {
    let app = without_workers().await;
    let db = &app.state.db;
    let inbox = &app.state.inbox;
    let lease = Duration::from_secs(60);
    let seq = |sql: &'static str| sqlx::query(sql).execute(db);
    // Seqs 1 to 3 are used up: f1 and f2 get 4 and 5.
    seq("SELECT nextval(pg_get_serial_sequence('inbox_events', 'seq')) FROM generate_series(1, 3)")
        .await
        .unwrap();
    for id in ["f1", "f2"] {
        assert!(inbox.record(in_section(id, "omt_f", false)).await.unwrap());
    }
    let run = inbox::claim_run(db, Utc::now(), lease, 1).await.unwrap();
    assert_eq!(run[0].event_id, "f1");
    // f1 is done: the section's floor moves to f2 (5). The next event gets seq 2, below it,
    // as one of a batch that committed late would.
    inbox::complete(db, "f1", Utc::now()).await.unwrap();
    seq("SELECT setval(pg_get_serial_sequence('inbox_events', 'seq'), 2, false)")
        .await
        .unwrap();
    assert!(
        inbox
            .record(in_section("f0", "omt_f", false))
            .await
            .unwrap()
    );
    let got = claim_and_finish(db, lease, 3).await;
    assert_eq!(
        got,
        ["f0", "f2"],
        "both claimed, the one with the lower seq first"
    );
    app.stop().await;
}

/// A hand-over that runs between a write's INSERT and its lock on the section's row moves the
/// floor past the write's event, which it cannot see yet: the write compares the floor of the
/// row it locked (the latest), not the one of its snapshot, and lowers it, so the event is
/// claimed and not lost. A trigger holds the slow write between the two.
#[tokio::test]
async fn a_hand_over_between_a_writes_insert_and_its_lock_does_not_lose_the_event() {
    let app = without_workers().await;
    let db = &app.state.db;
    let inbox = app.state.inbox.clone();
    let lease = Duration::from_secs(60);
    for sql in [
        "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF NEW.event_id = 'slow' THEN PERFORM pg_sleep(1.5); END IF; RETURN NEW; END $$",
        "CREATE TRIGGER slow_insert BEFORE INSERT ON inbox_events
         FOR EACH ROW EXECUTE FUNCTION slow_insert()",
    ] {
        sqlx::query(sql).execute(db).await.unwrap();
    }
    assert!(
        inbox
            .record(in_section("h1", "omt_h", false))
            .await
            .unwrap()
    );
    let run = inbox::claim_run(db, Utc::now(), lease, 64).await.unwrap();
    assert_eq!(run[0].event_id, "h1");
    // `slow` takes its seq, then waits in the trigger; `fast`, newer, is recorded meanwhile.
    let slow = tokio::spawn({
        let inbox = inbox.clone();
        async move { inbox.record(in_section("slow", "omt_h", false)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        inbox
            .record(in_section("fast", "omt_h", false))
            .await
            .unwrap()
    );
    // h1's hand-over sees `fast` only: the floor moves to it, past `slow`.
    inbox::complete(db, "h1", Utc::now()).await.unwrap();
    assert!(slow.await.unwrap().unwrap());
    let got = claim_and_finish(db, lease, 3).await;
    assert_eq!(got, ["slow", "fast"]);
    app.stop().await;
}

/// A write wakes a worker only for an event a claim could take at once: its section's new
/// head (once per section, however many of its events one batch holds), an express or an
/// unsectioned event; never for an event queued behind an unfinished head.
#[tokio::test]
async fn a_write_wakes_a_worker_only_when_it_made_an_event_claimable() {
    let app = without_workers().await;
    let inbox = &app.state.inbox;
    let wakeups = || app.state.metrics.inbox_wakeups.get();
    assert!(
        inbox
            .record(in_section("s1", "omt_s", false))
            .await
            .unwrap()
    );
    assert_eq!(wakeups(), 1, "a section's first event is its head");
    assert!(
        inbox
            .record(in_section("s2", "omt_s", false))
            .await
            .unwrap()
    );
    assert_eq!(wakeups(), 1, "queued behind s1");
    let head = inbox::claim(&app.state.db, Utc::now(), Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head.event_id, "s1");
    assert!(
        inbox
            .record(in_section("s3", "omt_s", false))
            .await
            .unwrap()
    );
    assert_eq!(wakeups(), 1, "queued behind the leased head");
    assert!(
        inbox
            .record(in_section("t1", "omt_t", false))
            .await
            .unwrap()
    );
    assert_eq!(wakeups(), 2, "another section's head");
    assert!(inbox.record(in_section("x1", "omt_s", true)).await.unwrap());
    assert_eq!(wakeups(), 3, "express never waits");
    assert!(inbox.record(env("free")).await.unwrap());
    assert_eq!(wakeups(), 4, "no section");
    let (u1, u2) = tokio::join!(
        inbox.record(in_section("u1", "omt_u", false)),
        inbox.record(in_section("u2", "omt_u", false))
    );
    assert!(u1.unwrap() && u2.unwrap());
    assert_eq!(wakeups(), 5, "one head for a section written at once");
    assert!(
        !inbox
            .record(in_section("t1", "omt_t", false))
            .await
            .unwrap()
    );
    assert_eq!(wakeups(), 5, "a redelivery");
    app.stop().await;
}

/// Acknowledged events are durable before the answer; the workers' own writes (claims, done
/// marks) commit without waiting for the WAL flush, on connections of their own.
#[tokio::test]
async fn recording_waits_for_the_flush_and_the_workers_do_not() {
    let app = without_workers().await;
    let show = |pool: &sqlx::PgPool| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SHOW synchronous_commit")
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(show(&app.state.db).await, "on");
    assert_eq!(show(app.state.inbox.worker_pool()).await, "off");
    app.stop().await;
}

/// The transaction that last wrote each of `ids` (`xmin`), in order.
async fn writers(db: &sqlx::PgPool, ids: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        let x: String =
            sqlx::query_scalar("SELECT xmin::text FROM inbox_events WHERE event_id = $1")
                .bind(id)
                .fetch_one(db)
                .await
                .unwrap();
        out.push(x);
    }
    out
}

/// A claim takes a section's head and the events queued behind it, in order (at most `max`,
/// stopping before one that is not due), and writes only the head: the others are held by
/// it. `complete_run` marks a run done in one statement.
#[tokio::test]
async fn a_claim_takes_a_run_and_writes_only_its_head() {
    let app = without_workers().await;
    let db = &app.state.db;
    let inbox = &app.state.inbox;
    for id in ["r1", "r2", "r3", "r4", "r5", "r6"] {
        assert!(inbox.record(in_section(id, "omt_r", false)).await.unwrap());
    }
    assert!(
        inbox
            .record(in_section("o1", "omt_o", false))
            .await
            .unwrap()
    );
    // r5 waits for a retry: the run stops before it.
    sqlx::query(
        "UPDATE inbox_events SET available_at = now() + interval '1 hour' WHERE event_id = 'r5'",
    )
    .execute(db)
    .await
    .unwrap();
    let ids = ["r1", "r2", "r3", "r4"];
    let before = writers(db, &ids).await;
    let lease = Duration::from_secs(60);
    let run = inbox::claim_run(db, Utc::now(), lease, 3).await.unwrap();
    let got: Vec<(&str, i32)> = run
        .iter()
        .map(|e| (e.event_id.as_str(), e.attempts))
        .collect();
    assert_eq!(
        got,
        [("r1", 1), ("r2", 1), ("r3", 1)],
        "at most 3, in order"
    );
    let after = writers(db, &ids).await;
    assert_ne!(before[0], after[0], "the head is leased");
    assert_eq!(
        before[1..],
        after[1..],
        "the events behind it are not written"
    );
    // The section is held by its head: another claim takes the other section only.
    let other = inbox::claim_run(db, Utc::now(), lease, 64).await.unwrap();
    let other: Vec<&str> = other.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(other, ["o1"]);
    assert!(
        inbox::claim_run(db, Utc::now(), lease, 64)
            .await
            .unwrap()
            .is_empty()
    );

    let handled: Vec<(String, i32)> = run
        .iter()
        .map(|e| (e.event_id.clone(), e.attempts))
        .collect();
    inbox::complete_run(db, &handled, Utc::now()).await.unwrap();
    let done = writers(db, &["r1", "r2", "r3"]).await;
    assert!(
        done[0] == done[1] && done[1] == done[2],
        "one statement: {done:?}"
    );
    let rows: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT event_id, state, attempts FROM inbox_events WHERE section = 'omt_r' ORDER BY seq",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let rows: Vec<(&str, &str, i32)> = rows
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), *c))
        .collect();
    assert_eq!(
        rows,
        [
            ("r1", "done", 1),
            ("r2", "done", 1),
            ("r3", "done", 1),
            ("r4", "pending", 0),
            ("r5", "pending", 0),
            ("r6", "pending", 0)
        ]
    );
    // r4 is the head now; the run stops before r5, which is not due.
    let run = inbox::claim_run(db, Utc::now(), lease, 64).await.unwrap();
    let got: Vec<&str> = run.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(got, ["r4"]);
    app.stop().await;
}

/// A handler that records what it was given, fails each event named in `fail_once` the first
/// time, and takes `pause` per event.
struct Recorder {
    seen: std::sync::Mutex<Vec<(String, i32)>>,
    fail_once: std::sync::Mutex<Vec<String>>,
    pause: Duration,
}

#[async_trait::async_trait]
impl inbox::Handler for Recorder {
    async fn handle(&self, e: &inbox::InboxEvent) -> anyhow::Result<()> {
        self.seen
            .lock()
            .unwrap()
            .push((e.event_id.clone(), e.attempts));
        tokio::time::sleep(self.pause).await;
        let mut fail = self.fail_once.lock().unwrap();
        if let Some(i) = fail.iter().position(|f| *f == e.event_id) {
            fail.remove(i);
            anyhow::bail!("failing {} once", e.event_id);
        }
        Ok(())
    }
    async fn dead_lettered(&self, _: &inbox::InboxEvent, _: &str) {}
}

/// Runs the inbox's workers (two) over `ids`, all in one section, with `handler`, until every
/// one is done; returns the transactions that marked them done. Checks on the way that the
/// section's row of claimable heads is then gone, and that a new event, with nothing
/// unfinished before it, makes it again and wakes a worker.
async fn run_workers(ids: &[&str], handler: Arc<Recorder>) -> Vec<String> {
    let app = without_workers().await;
    let mut config = app.state.config.inbox.clone();
    config.workers_enabled = true;
    config.workers = 2;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let tracker = tokio_util::task::TaskTracker::new();
    let inbox = inbox::Inbox::new(
        inbox::InboxDeps {
            db: app.state.db.clone(),
            clock: app.state.clock.clone(),
            metrics: app.state.metrics.clone(),
            config,
            shutdown: shutdown.clone(),
        },
        64,
        tracker.clone(),
    );
    // Recorded before any worker runs, so that each claim sees them all.
    for id in ids {
        assert!(inbox.record(in_section(id, "omt_w", false)).await.unwrap());
    }
    inbox.spawn_workers(handler);
    let db = app.state.db.clone();
    eventually("every event done", Duration::from_secs(30), || async {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM inbox_events WHERE state <> 'done'")
                .fetch_one(&db)
                .await
                .unwrap();
        left == 0
    })
    .await;
    eventually("the section let go of", Duration::from_secs(10), || async {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_sections")
            .fetch_one(&db)
            .await
            .unwrap();
        rows == 0
    })
    .await;
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    let wakeups = app.state.metrics.inbox_wakeups.get();
    assert!(
        inbox
            .record(in_section("next", "omt_w", false))
            .await
            .unwrap()
    );
    assert_eq!(
        app.state.metrics.inbox_wakeups.get(),
        wakeups + 1,
        "the new head"
    );
    assert!(
        inbox
            .record(in_section("next2", "omt_w", false))
            .await
            .unwrap()
    );
    assert_eq!(
        app.state.metrics.inbox_wakeups.get(),
        wakeups + 1,
        "behind it"
    );
    let done = writers(&db, ids).await;
    app.stop().await;
    done
}

/// The workers handle a run in order and mark it done in one statement; a failure ends the run
/// there: what was handled before it is done, it is retried as its section's head, and the
/// events behind it wait for it.
#[tokio::test]
async fn workers_handle_a_run_in_order_and_mark_it_done_at_once() {
    let handler = Arc::new(Recorder {
        seen: Default::default(),
        fail_once: std::sync::Mutex::new(vec!["w3".into()]),
        pause: Duration::ZERO,
    });
    let ids = ["w1", "w2", "w3", "w4", "w5"];
    let done = run_workers(&ids, handler.clone()).await;
    let seen = handler.seen.lock().unwrap().clone();
    let seen: Vec<(&str, i32)> = seen.iter().map(|(a, n)| (a.as_str(), *n)).collect();
    assert_eq!(
        seen,
        [
            ("w1", 1),
            ("w2", 1),
            ("w3", 1),
            ("w3", 2),
            ("w4", 2),
            ("w5", 2)
        ],
        "in order; the run behind a retried head is told it may be a retry"
    );
    assert_eq!(done[0], done[1], "w1 and w2 done together: {done:?}");
    assert!(
        done[2] == done[3] && done[3] == done[4],
        "w3..w5 together: {done:?}"
    );
    assert_ne!(done[1], done[2]);
}

/// A run starts no further event once half a second has passed: the slow events are marked
/// done a few at a time, not held until the whole run is over.
#[tokio::test]
async fn a_slow_run_is_marked_done_a_part_at_a_time() {
    let handler = Arc::new(Recorder {
        seen: Default::default(),
        fail_once: Default::default(),
        pause: Duration::from_millis(300),
    });
    let ids = ["v1", "v2", "v3", "v4"];
    let done = run_workers(&ids, handler.clone()).await;
    let seen: Vec<String> = handler
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.0.clone())
        .collect();
    assert_eq!(seen, ids);
    assert_eq!(done[0], done[1], "{done:?}");
    assert_eq!(done[2], done[3], "{done:?}");
    assert_ne!(done[1], done[2], "the run stopped after 0.6 s: {done:?}");
}
