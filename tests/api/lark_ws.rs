//! The long connection (`SSHMODE_LARK_MODE=websocket|both`) against a fake of Lark's
//! long-connection server: events and card callbacks recorded in the inbox before they are
//! acknowledged, once each whatever the transport or the connection (a click that cannot be
//! recorded acknowledged with code 200 and a busy toast, an event failed so it comes again); fragments joined; pings,
//! the client configuration from pongs, reconnection after a drop or a stall, refused upgrades.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::fake_lark::FakeLark;
use crate::fake_ws::{FakeWs, TICKET, data_frame, platform_form};
use crate::helpers::{TestApp, TestAppBuilder, eventually};
use crate::lark_support::{Msg, TOKEN, post, sealed_now};

/// Reconnect at once, ping every second.
fn quick() -> Value {
    json!({"ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 1})
}

async fn lark_and_ws() -> (FakeLark, FakeWs) {
    let lark = FakeLark::start().await;
    let ws = FakeWs::start().await;
    lark.set_ws_endpoint(&ws.url, quick());
    (lark, ws)
}

fn service(lark: &FakeLark, mode: &str) -> TestAppBuilder {
    TestApp::builder()
        .var("LARK_BASE_URL", &lark.base)
        .var("SSHMODE_LARK_MODE", mode)
}

async fn ready(app: &TestApp) -> String {
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    r.text().await.unwrap()
}

async fn rows(app: &TestApp, event_id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM inbox_events WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(&app.state.db)
        .await
        .unwrap()
}

fn ack_code(ack: &sshmode::lark::frame::Frame) -> Value {
    serde_json::from_slice(ack.payload.as_deref().unwrap_or_default()).unwrap()
}

fn card_click(event_id: &str) -> Value {
    json!({
        "schema": "2.0",
        "header": {"event_id": event_id, "event_type": "card.action.trigger",
            "create_time": (chrono::Utc::now().timestamp_millis()).to_string(),
            "token": "", "app_id": crate::fake_lark::APP_ID, "tenant_key": "tk"},
        "event": {
            "operator": {"open_id": "ou_stranger"},
            "action": {"tag": "button", "value": {"kind": "unknown"}},
            "context": {"open_message_id": "om_card", "open_chat_id": "oc_chat"}
        }
    })
}

#[tokio::test]
async fn events_are_recorded_once_before_they_are_acknowledged() {
    let (lark, ws) = lark_and_ws().await;
    let app = service(&lark, "websocket").spawn().await;
    ws.wait_connections(1).await;
    // The client pings at once.
    ws.wait_pings(1).await;

    let msg = Msg::new("ev_ws_1", "hello over the long connection");
    let body = platform_form(msg.envelope(TOKEN));
    ws.send(data_frame("event", "m1", 1, 0, &body));
    let ack = ws.ack("m1").await;
    // Acknowledged only once stored.
    assert_eq!(rows(&app, "ev_ws_1").await, 1);
    assert_eq!(ack_code(&ack)["code"], 200);
    assert_eq!(ack.header("type"), Some("event"));
    assert!(ack.header("biz_rt").is_some());
    assert_eq!((ack.seq_id, ack.log_id), (1, 42));

    // Redelivered (another message id of the platform's): acknowledged, not stored twice.
    ws.send(data_frame("event", "m1-again", 1, 0, &body));
    assert_eq!(ack_code(&ws.ack("m1-again").await)["code"], 200);
    assert_eq!(rows(&app, "ev_ws_1").await, 1);

    // Fragments, out of order: recorded whole, acknowledged once, echoing the last fragment.
    let msg = Msg::new("ev_ws_2", &"x".repeat(3000));
    let body = platform_form(msg.envelope(TOKEN));
    let third = body.len() / 3;
    let parts = [&body[..third], &body[third..2 * third], &body[2 * third..]];
    for seq in [2, 0, 1] {
        ws.send(data_frame("event", "m2", 3, seq, parts[seq]));
    }
    let ack = ws.ack("m2").await;
    assert_eq!(ack.header("seq"), Some("1"));
    assert_eq!(rows(&app, "ev_ws_2").await, 1);
    let stored: String =
        sqlx::query_scalar("SELECT payload::text FROM inbox_events WHERE event_id = 'ev_ws_2'")
            .fetch_one(&app.state.db)
            .await
            .unwrap();
    assert!(stored.contains(&"x".repeat(3000)));
    assert_eq!(
        ws.acks()
            .iter()
            .filter(|a| a.header("message_id") == Some("m2"))
            .count(),
        1
    );

    // The platform's empty token is accepted and the event handled; so is an envelope whose
    // header has no token at all.
    crate::lark_support::wait_state(&app, "ev_ws_1", "done").await;
    let mut tokenless = Msg::new("ev_ws_tokenless", "no token at all").envelope(TOKEN);
    tokenless["header"].as_object_mut().unwrap().remove("token");
    ws.send(data_frame(
        "event",
        "m4",
        1,
        0,
        tokenless.to_string().as_bytes(),
    ));
    assert_eq!(ack_code(&ws.ack("m4").await)["code"], 200);
    assert_eq!(rows(&app, "ev_ws_tokenless").await, 1);

    // A token that is there and wrong is acknowledged (redelivery would not fix it), counted,
    // and never stored.
    let forged = Msg::new("ev_forged", "hi")
        .envelope("not-the-token")
        .to_string();
    ws.send(data_frame("event", "m3", 1, 0, forged.as_bytes()));
    ws.ack("m3").await;
    assert_eq!(rows(&app, "ev_forged").await, 0);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sshmode_events_rejected_total{reason=\"token\"} 1"),
        "{metrics}"
    );

    // The webhook is off in this mode.
    let (status, _) = post(&app, sealed_now(&Msg::new("ev_hook", "x").envelope(TOKEN))).await;
    assert_eq!(status, 404);

    // Readiness names the connection; metrics count frames; the ticket is nowhere to be seen.
    let status = ready(&app).await;
    assert!(
        status.contains("lark-long-connection: connected"),
        "{status}"
    );
    let metrics = app.metrics().await;
    assert!(metrics.contains("sshmode_lark_ws_connected 1"), "{metrics}");
    assert!(metrics.contains("reason=\"event\""), "{metrics}");
    assert!(!metrics.contains(TICKET));
}

/// An event that cannot be recorded is acknowledged as a failure (so the platform delivers
/// it again), and is recorded when it comes again.
#[tokio::test]
async fn an_event_that_cannot_be_stored_is_not_acknowledged_as_received() {
    let (lark, ws) = lark_and_ws().await;
    let app = service(&lark, "websocket").spawn().await;
    ws.wait_connections(1).await;
    let db = &app.state.db;
    sqlx::query("ALTER TABLE inbox_events RENAME TO inbox_events_away")
        .execute(db)
        .await
        .unwrap();
    let body = platform_form(Msg::new("ev_unstored", "keep me").envelope(TOKEN));
    ws.send(data_frame("event", "u1", 1, 0, &body));
    assert_eq!(ack_code(&ws.ack("u1").await)["code"], 500);
    sqlx::query("ALTER TABLE inbox_events_away RENAME TO inbox_events")
        .execute(db)
        .await
        .unwrap();
    ws.send(data_frame("event", "u2", 1, 0, &body));
    assert_eq!(ack_code(&ws.ack("u2").await)["code"], 200);
    assert_eq!(rows(&app, "ev_unstored").await, 1);
}

/// The callback response an acknowledgement carries (its base64 `data`), after checking that
/// it acknowledges with code 200.
fn ack_answer(ack: &sshmode::lark::frame::Frame) -> Value {
    let payload = ack_code(ack);
    assert_eq!(payload["code"], 200, "{payload}");
    let data = base64::engine::general_purpose::STANDARD
        .decode(payload["data"].as_str().expect("a callback response"))
        .unwrap();
    serde_json::from_slice(&data).unwrap()
}

/// A click that cannot be recorded — no admission left, or the database refusing the write —
/// is acknowledged with code 200 and a busy toast, as an `event` frame or a `card` frame: the
/// platform never delivers a click again, and a failed acknowledgement shows the user error
/// 200671. An event in the same state is failed (500), so it comes again.
#[tokio::test]
async fn a_click_that_cannot_be_recorded_is_acknowledged_200_with_a_busy_toast() {
    let (lark, ws) = lark_and_ws().await;
    let app = service(&lark, "websocket").spawn().await;
    ws.wait_connections(1).await;
    let busy = |answer: Value| {
        assert_eq!(answer["toast"]["type"], "error", "{answer}");
        let said = answer["toast"]["content"].as_str().unwrap();
        assert!(said.contains("try again"), "{said}");
    };
    let message = platform_form(Msg::new("ev_ws_busy", "keep me").envelope(TOKEN));

    let held: Vec<_> = std::iter::from_fn(|| app.state.inbox.admit())
        .take(sshmode::inbox::ADMITTED_MAX)
        .collect();
    for (kind, id) in [("event", "ev_full_1"), ("card", "ev_full_2")] {
        let body = card_click(id).to_string();
        ws.send(data_frame(kind, id, 1, 0, body.as_bytes()));
        busy(ack_answer(&ws.ack(id).await));
    }
    ws.send(data_frame("event", "full_msg", 1, 0, &message));
    assert_eq!(ack_code(&ws.ack("full_msg").await)["code"], 500);
    drop(held);

    let db = &app.state.db;
    sqlx::query("ALTER TABLE inbox_events RENAME TO inbox_events_away")
        .execute(db)
        .await
        .unwrap();
    for (kind, id) in [("event", "ev_nodb_1"), ("card", "ev_nodb_2")] {
        let body = card_click(id).to_string();
        ws.send(data_frame(kind, id, 1, 0, body.as_bytes()));
        busy(ack_answer(&ws.ack(id).await));
    }
    ws.send(data_frame("event", "nodb_msg", 1, 0, &message));
    assert_eq!(ack_code(&ws.ack("nodb_msg").await)["code"], 500);
    sqlx::query("ALTER TABLE inbox_events_away RENAME TO inbox_events")
        .execute(db)
        .await
        .unwrap();

    for id in [
        "ev_full_1",
        "ev_full_2",
        "ev_nodb_1",
        "ev_nodb_2",
        "ev_ws_busy",
    ] {
        assert_eq!(rows(&app, id).await, 0, "{id}");
    }
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("sshmode_events_rejected_total{reason=\"click_busy\"} 4"),
        "{metrics}"
    );
    // The event comes again and is recorded.
    ws.send(data_frame("event", "again_msg", 1, 0, &message));
    assert_eq!(ack_code(&ws.ack("again_msg").await)["code"], 200);
    assert_eq!(rows(&app, "ev_ws_busy").await, 1);
}

#[tokio::test]
async fn card_clicks_are_answered_in_the_acknowledgement_as_event_or_card_frames() {
    let (lark, ws) = lark_and_ws().await;
    let app = service(&lark, "websocket").spawn().await;
    ws.wait_connections(1).await;
    for (kind, id) in [("event", "ev_click_1"), ("card", "ev_click_2")] {
        let body = card_click(id).to_string();
        ws.send(data_frame(kind, id, 1, 0, body.as_bytes()));
        let ack = ws.ack(id).await;
        assert_eq!(rows(&app, id).await, 1, "{kind}");
        let payload = ack_code(&ack);
        assert_eq!(payload["code"], 200);
        let data = base64::engine::general_purpose::STANDARD
            .decode(payload["data"].as_str().expect("a callback response"))
            .unwrap();
        let answer: Value = serde_json::from_slice(&data).unwrap();
        assert!(answer.is_object(), "{answer}");
        // The same answer the webhook gives for this click.
        let env = sshmode::lark::webhook::verify_plain(
            app.state.config.lark.as_ref().unwrap(),
            body.as_bytes(),
            chrono::Utc::now(),
            Duration::from_secs(3600),
        )
        .unwrap();
        let expected = sshmode::frontend::LarkTriage {
            config: app.state.config.clone(),
            db: app.state.db.clone(),
        }
        .card_answer(&env)
        .await;
        assert_eq!(answer, expected, "{kind}");
    }
}

#[tokio::test]
async fn the_connection_comes_back_after_a_drop_and_after_a_stall() {
    let (lark, ws) = lark_and_ws().await;
    let app = service(&lark, "websocket").spawn().await;
    ws.wait_connections(1).await;

    ws.drop_connection();
    ws.wait_connections(2).await;
    let body = platform_form(Msg::new("ev_after_drop", "back").envelope(TOKEN));
    ws.send(data_frame("event", "d1", 1, 0, &body));
    ws.ack("d1").await;
    assert_eq!(rows(&app, "ev_after_drop").await, 1);
    // Each attempt fetched the endpoint anew.
    assert!(lark.requests_to("/callback/ws/endpoint").len() >= 2);

    // A connection that stays open but goes silent is taken for dead after PingInterval + 30 s.
    ws.stall(true);
    tokio::time::timeout(Duration::from_secs(60), ws.wait_connections(3))
        .await
        .expect("a silent connection is replaced");
    ws.stall(false);
    let body = platform_form(Msg::new("ev_after_stall", "back again").envelope(TOKEN));
    ws.send(data_frame("event", "d2", 1, 0, &body));
    ws.ack("d2").await;
    assert_eq!(rows(&app, "ev_after_stall").await, 1);
}

#[tokio::test]
async fn a_refused_upgrade_is_reported_and_a_retryable_one_retried() {
    let (lark, ws) = lark_and_ws().await;
    // Retryable first: 514 without the too-many-connections code.
    ws.refuse("514", "1");
    let app = service(&lark, "websocket").spawn().await;
    eventually(
        "the endpoint to be fetched again after a refused upgrade",
        Duration::from_secs(20),
        async || lark.requests_to("/callback/ws/endpoint").len() >= 2,
    )
    .await;
    ws.accept();
    ws.wait_connections(1).await;
    let status = ready(&app).await;
    assert!(
        status.contains("lark-long-connection: connected"),
        "{status}"
    );

    // Forbidden is final: the service says so and waits long before trying again.
    let (lark2, ws2) = lark_and_ws().await;
    ws2.refuse("403", "");
    let app2 = service(&lark2, "websocket").spawn().await;
    eventually(
        "the refusal to show in /readyz",
        Duration::from_secs(20),
        async || {
            let r = ready(&app2).await;
            r.contains("lark-long-connection: refused")
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        lark2.requests_to("/callback/ws/endpoint").len(),
        1,
        "retried too soon"
    );
    assert_eq!(ws2.connections(), 0);
}

#[tokio::test]
async fn one_event_over_both_transports_and_two_replicas_is_handled_once() {
    let (lark, ws) = lark_and_ws().await;
    let first = service(&lark, "both")
        .var("LARK_ENCRYPT_KEY", crate::lark_support::ENCRYPT_KEY)
        .spawn()
        .await;
    let second = service(&lark, "both")
        .var("LARK_ENCRYPT_KEY", crate::lark_support::ENCRYPT_KEY)
        .database(&first.db_url)
        .spawn()
        .await;
    // Both replicas hold a connection at once.
    ws.wait_connections(2).await;
    eventually(
        "both replicas connected",
        Duration::from_secs(20),
        async || {
            let mut all = true;
            for a in [&first, &second] {
                let r = ready(a).await;
                all &= r.contains("lark-long-connection: connected");
            }
            all
        },
    )
    .await;

    let msg = Msg::new("ev_both", "once");
    let (status, _) = post(&first, sealed_now(&msg.envelope(TOKEN))).await;
    assert_eq!(status, 200);
    let body = platform_form(msg.envelope(TOKEN));
    ws.send(data_frame("event", "b1", 1, 0, &body));
    assert_eq!(ack_code(&ws.ack("b1").await)["code"], 200);
    assert_eq!(rows(&first, "ev_both").await, 1);
    crate::lark_support::wait_state(&first, "ev_both", "done").await;
    // Handled once: one row, taken by one worker once.
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM inbox_events WHERE event_id = 'ev_both'")
            .fetch_one(&first.state.db)
            .await
            .unwrap();
    assert_eq!(attempts, 1);
}

#[tokio::test]
async fn a_pong_changes_the_client_configuration() {
    let (lark, ws) = lark_and_ws().await;
    // Pings every 120 s by the endpoint's configuration, then every second once a pong says so.
    lark.set_ws_endpoint(
        &ws.url,
        json!({"ReconnectCount": 1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 120}),
    );
    ws.set_pong_config(quick());
    let _app = service(&lark, "websocket").spawn().await;
    ws.wait_connections(1).await;
    // The first ping's pong carries the quick configuration: more pings follow within seconds.
    tokio::time::timeout(Duration::from_secs(10), ws.wait_pings(3))
        .await
        .expect("pings at the pong's interval");
    // ReconnectCount 1 does not stop reconnection.
    for n in 2..=3 {
        ws.drop_connection();
        ws.wait_connections(n).await;
    }
}

/// A deliverer that holds each message until the test lets it go.
struct Held {
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    release: tokio::sync::Semaphore,
    done: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl sshmode::lark::ws::Deliver for Held {
    async fn deliver(
        &self,
        _kind: sshmode::lark::ws::Kind,
        _payload: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, ()> {
        let _ = self.entered.send(());
        self.release.acquire().await.expect("never closed").forget();
        self.done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(None)
    }
}

#[tokio::test]
async fn a_message_being_delivered_at_shutdown_is_waited_for_on_the_apps_tracker() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    let (lark, ws) = lark_and_ws().await;
    sshmode::install_crypto_provider();
    let client = Arc::new(
        sshmode::lark::ws::LongConnection::new(
            &lark.base,
            crate::fake_lark::APP_ID,
            secrecy::SecretString::from(crate::fake_lark::APP_SECRET),
            Arc::new(sshmode::metrics::Metrics::new()),
        )
        .unwrap(),
    );
    let (entered, mut delivering) = tokio::sync::mpsc::unbounded_channel();
    let held = Arc::new(Held {
        entered,
        release: tokio::sync::Semaphore::new(0),
        done: Default::default(),
    });
    let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
    let run = tokio::spawn(client.run(held.clone(), stop.clone(), tasks.clone()));
    ws.wait_connections(1).await;
    ws.send(data_frame("event", "m1", 1, 0, b"{}"));
    tokio::time::timeout(Duration::from_secs(20), delivering.recv())
        .await
        .expect("the message reaches the deliverer");

    // Shutdown: the connection ends while the message is still being delivered.
    stop.cancel();
    run.await.unwrap();
    tasks.close();
    assert_eq!(tasks.len(), 1, "the delivery runs on the tracker");
    assert_eq!(held.done.load(Ordering::SeqCst), 0);

    // The tracker is done once the delivery is, and not before.
    held.release.add_permits(1);
    tokio::time::timeout(Duration::from_secs(20), tasks.wait())
        .await
        .expect("the delivery ends once let go");
    assert_eq!(held.done.load(Ordering::SeqCst), 1);
}
