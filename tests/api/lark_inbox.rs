//! The inbox's storage operations directly: claim order and leases, backoff, dead letter,
//! and the bounded retention cleanup.

use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::json;
use sshmode::inbox::{self, Failed};
use sshmode::lark::webhook::Envelope;

use crate::helpers::TestApp;

fn env(id: &str) -> Envelope {
    Envelope {
        event_id: id.into(),
        event_type: "im.message.receive_v1".into(),
        payload: json!({"header": {"event_id": id}}),
        section: None,
        message_id: None,
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
        assert!(inbox::record(&app.state, env(id)).await.unwrap());
    }
    assert!(!inbox::record(&app.state, env("a")).await.unwrap());

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
    let c2 = inbox::claim(db, t0, lease).await.unwrap().unwrap();
    assert_eq!((c2.event_id.as_str(), c2.attempts), ("c", 1));
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

    // Cleanup removes only done rows finished before the cut-off, at most `limit` at a time.
    let old = Utc.with_ymd_and_hms(2020, 1, 1, 0, 0, 0).unwrap();
    for id in ["d", "e", "f"] {
        inbox::record(&app.state, env(id)).await.unwrap();
        inbox::complete(db, id, old).await.unwrap();
    }
    let cut = old + chrono::Duration::days(1);
    assert_eq!(inbox::cleanup(db, cut, 2).await.unwrap(), 2);
    assert_eq!(inbox::cleanup(db, cut, 2).await.unwrap(), 1);
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
