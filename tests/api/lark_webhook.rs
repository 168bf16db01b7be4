//! `POST /lark/events`: the known-answer vectors, url_verification, v1/v2 envelopes, card
//! callbacks (a click that cannot be recorded answered 200 with a busy toast), de-duplication,
//! and every class of bad input mapped to its status with nothing stored. Workers are off here: these tests are about the request path only.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sshmode::clock::ManualClock;
use sshmode::lark::webhook;

use crate::helpers::TestApp;
use crate::lark_support::*;

fn no_workers() -> crate::helpers::TestAppBuilder {
    TestApp::builder().var("SSHMODE_WORKERS_ENABLED", "false")
}

/// No Encrypt Key, and unsigned events explicitly allowed: for the checks of unsigned bodies.
fn unsigned_allowed() -> crate::helpers::TestAppBuilder {
    no_workers().var("SSHMODE_ALLOW_UNSIGNED_EVENTS", "true")
}

async fn metric(app: &TestApp, name: &str) -> String {
    let body = app.metrics().await;
    body.lines()
        .filter(|l| l.starts_with(name))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn known_answer_vectors() {
    let v = vectors();
    for case in v["decrypt"].as_array().unwrap() {
        let key = case["encrypt_key"].as_str().unwrap();
        let plain = webhook::decrypt(key, case["encrypt"].as_str().unwrap()).unwrap();
        assert_eq!(plain, case["plaintext"].as_str().unwrap().as_bytes());
        // Our encryption with the vector's own IV reproduces the vector byte for byte.
        let raw = base64_decode(case["encrypt"].as_str().unwrap());
        let iv: [u8; 16] = raw[..16].try_into().unwrap();
        assert_eq!(
            webhook::encrypt(key, iv, &plain),
            case["encrypt"].as_str().unwrap()
        );
        let wrong = webhook::decrypt("wrong key", case["encrypt"].as_str().unwrap());
        assert_ne!(wrong.ok(), Some(plain));
    }
    for case in v["signature"].as_array().unwrap() {
        let s = webhook::signature(
            case["timestamp"].as_str().unwrap(),
            case["nonce"].as_str().unwrap(),
            case["encrypt_key"].as_str().unwrap(),
            case["body"].as_str().unwrap().as_bytes(),
        );
        assert_eq!(s, case["signature"].as_str().unwrap());
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

#[tokio::test]
async fn url_verification_from_the_vectors_plain_signed_and_unsigned() {
    let v = vectors();
    let dec = &v["decrypt"][0];
    let sig = &v["signature"][0];
    let plaintext: Value = serde_json::from_str(dec["plaintext"].as_str().unwrap()).unwrap();
    let ts: i64 = sig["timestamp"].as_str().unwrap().parse().unwrap();
    let clock = Arc::new(ManualClock::new(
        DateTime::<Utc>::from_timestamp(ts + 30, 0).unwrap(),
    ));
    let app = no_workers()
        .var("LARK_ENCRYPT_KEY", dec["encrypt_key"].as_str().unwrap())
        .var(
            "LARK_VERIFICATION_TOKEN",
            plaintext["token"].as_str().unwrap(),
        )
        .clock(clock)
        .spawn()
        .await;
    let challenge = json!({"challenge": plaintext["challenge"]});

    // Signed exactly as in the vector.
    let body = sig["body"].as_str().unwrap().as_bytes().to_vec();
    let req = Req {
        body: body.clone(),
        headers: vec![
            (
                "X-Lark-Request-Timestamp",
                sig["timestamp"].as_str().unwrap().into(),
            ),
            (
                "X-Lark-Request-Nonce",
                sig["nonce"].as_str().unwrap().into(),
            ),
            (
                "X-Lark-Signature",
                sig["signature"].as_str().unwrap().into(),
            ),
        ],
    };
    assert_eq!(post(&app, req).await, (200, challenge.clone()));
    // Without signature headers a url_verification is still answered (checked by token).
    assert_eq!(
        post(
            &app,
            Req {
                body: body.clone(),
                headers: vec![]
            }
        )
        .await,
        (200, challenge)
    );
    // A wrong signature is refused even for url_verification.
    let req = Req {
        body,
        headers: vec![
            (
                "X-Lark-Request-Timestamp",
                sig["timestamp"].as_str().unwrap().into(),
            ),
            ("X-Lark-Request-Nonce", "other-nonce".into()),
            (
                "X-Lark-Signature",
                sig["signature"].as_str().unwrap().into(),
            ),
        ],
    };
    assert_eq!(post(&app, req).await.0, 401);
    assert!(inbox(&app).await.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn plain_url_verification_checks_the_token() {
    let app = unsigned_allowed().spawn().await;
    let ok = json!({"challenge":"c-1","token":TOKEN,"type":"url_verification"});
    assert_eq!(
        post(&app, plain(&ok)).await,
        (200, json!({"challenge":"c-1"}))
    );
    let bad = json!({"challenge":"c-1","token":"nope","type":"url_verification"});
    assert_eq!(post(&app, plain(&bad)).await.0, 401);
    assert!(
        metric(&app, "sshmode_events_rejected_total")
            .await
            .contains("reason=\"token\"} 1")
    );
    app.stop().await;
}

#[tokio::test]
async fn events_are_recorded_once_without_their_token() {
    let app = no_workers()
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .spawn()
        .await;
    let env = Msg::new("ev_rec", "/help").envelope(TOKEN);
    for _ in 0..3 {
        let r = post(&app, sealed(&env, ENCRYPT_KEY, now_secs())).await;
        assert_eq!(r, (200, json!({"msg":"success"})));
    }
    assert_eq!(
        inbox(&app).await,
        vec![("ev_rec".into(), "pending".into(), 0)]
    );
    let payload: Value = sqlx::query_scalar("SELECT payload FROM inbox_events")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert!(payload.pointer("/header/token").is_none());
    assert!(!payload.to_string().contains(TOKEN));
    assert_eq!(payload["event"]["message"]["message_id"], "om_ev_rec");
    assert!(
        metric(&app, "sshmode_events_received_total")
            .await
            .ends_with(" 1")
    );
    assert!(
        metric(&app, "sshmode_events_duplicate_total")
            .await
            .ends_with(" 2")
    );
    assert!(metric(&app, "sshmode_inbox_depth").await.ends_with(" 1"));
    app.stop().await;
}

#[tokio::test]
async fn v1_events_and_card_actions_are_recorded() {
    let app = no_workers()
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .spawn()
        .await;
    let v1 = json!({"uuid":"v1-uuid-1","token":TOKEN,"ts":format!("{}.5", now_secs()),
        "type":"event_callback","event":{"type":"message","text":"hi"}});
    assert_eq!(post(&app, sealed_now(&v1)).await.0, 200);
    let card = json!({"schema":"2.0","header":{"event_id":"ev_card","event_type":"card.action.trigger",
        "create_time": (Utc::now().timestamp_micros()).to_string(),"token":TOKEN,"app_id":"cli_test_app"},
        "event":{"operator":{"open_id":"ou_user"},"action":{"value":{"k":"v"},"tag":"button"},
            "context":{"open_message_id":"om_1","open_chat_id":"oc_chat"}}});
    assert_eq!(post(&app, sealed_now(&card)).await, (200, json!({})));
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT event_id, event_type FROM inbox_events ORDER BY event_id")
            .fetch_all(&app.state.db)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![
            ("ev_card".into(), "card.action.trigger".into()),
            ("v1-uuid-1".into(), "message".into())
        ]
    );
    app.stop().await;
}

#[tokio::test]
async fn bad_input_with_an_encrypt_key() {
    let app = no_workers()
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .spawn()
        .await;
    let now = now_secs();
    let good = Msg::new("ev_bad", "/help").envelope(TOKEN);
    let seal_raw = |plaintext: &[u8]| {
        signed(
            json!({"encrypt": webhook::encrypt(ENCRYPT_KEY, [3; 16], plaintext)})
                .to_string()
                .into_bytes(),
            ENCRYPT_KEY,
            now,
        )
    };
    // A last block with inconsistent padding: encrypt 16 bytes ending in 0x02 0x03 without
    // padding by sealing 16 bytes and dropping the padding block.
    let bad_padding = {
        let full = base64_decode(&webhook::encrypt(
            ENCRYPT_KEY,
            [4; 16],
            &[b'{'; 15].iter().copied().chain([3u8]).collect::<Vec<_>>(),
        ));
        let truncated = &full[..32];
        use base64::Engine;
        signed(
            json!({"encrypt": base64::engine::general_purpose::STANDARD.encode(truncated)})
                .to_string()
                .into_bytes(),
            ENCRYPT_KEY,
            now,
        )
    };
    let mut wrong_sig = sealed(&good, ENCRYPT_KEY, now);
    wrong_sig.headers[2].1 = "0".repeat(64);
    let mut missing_field = good.clone();
    missing_field["header"]
        .as_object_mut()
        .unwrap()
        .remove("event_id");
    let huge = Req {
        body: vec![b' '; 1024 * 1024 + 1],
        headers: vec![],
    };

    let cases: Vec<(&str, Req, u16)> = vec![
        ("too large", huge, 413),
        ("wrong signature", wrong_sig, 401),
        (
            "signature by another key",
            sealed(&good, "other key", now),
            401,
        ),
        (
            "unsigned event",
            Req {
                body: sealed(&good, ENCRYPT_KEY, now).body,
                headers: vec![],
            },
            401,
        ),
        (
            "not json",
            signed(b"{not json".to_vec(), ENCRYPT_KEY, now),
            400,
        ),
        (
            "bad base64",
            signed(br#"{"encrypt":"***"}"#.to_vec(), ENCRYPT_KEY, now),
            400,
        ),
        ("bad padding", bad_padding, 400),
        ("decrypts to non-json", seal_raw(b"hello world"), 400),
        (
            "missing event_id",
            sealed(&missing_field, ENCRYPT_KEY, now),
            400,
        ),
        (
            "plain body with a key",
            signed(good.to_string().into_bytes(), ENCRYPT_KEY, now),
            401,
        ),
        (
            "wrong token",
            sealed(&Msg::new("ev_bad", "x").envelope("nope"), ENCRYPT_KEY, now),
            401,
        ),
        (
            "stale timestamp",
            sealed(&good, ENCRYPT_KEY, now - 8 * 24 * 3600),
            401,
        ),
    ];
    for (what, req, status) in cases {
        let (got, body) = post(&app, req).await;
        assert_eq!(got, status, "{what}: {body}");
        assert!(body.get("error").is_some(), "{what}: {body}");
    }
    assert!(
        inbox(&app).await.is_empty(),
        "a rejected request stored something"
    );
    let rejected = metric(&app, "sshmode_events_rejected_total").await;
    for reason in [
        "too_large",
        "signature",
        "not_json",
        "ciphertext",
        "missing_fields",
        "missing_encryption",
        "token",
        "stale",
    ] {
        assert!(
            rejected.contains(&format!("reason=\"{reason}\"")),
            "{reason}: {rejected}"
        );
    }
    // The same event, correctly sealed, goes through.
    assert_eq!(post(&app, sealed(&good, ENCRYPT_KEY, now)).await.0, 200);
    assert_eq!(inbox(&app).await.len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn bad_input_without_an_encrypt_key() {
    let app = unsigned_allowed().spawn().await;
    let mut stale = Msg::new("ev_old", "/help");
    stale.create_ms = (Utc::now() - chrono::Duration::days(8)).timestamp_millis();
    let cases: Vec<(&str, Req, u16)> = vec![
        (
            "encrypted while no key",
            sealed(&Msg::new("e1", "x").envelope(TOKEN), "k", now_secs()),
            400,
        ),
        ("not json", plain(&json!("just a string")), 400),
        ("no envelope", plain(&json!({"hello": "world"})), 400),
        (
            "bad create_time",
            plain(&{
                let mut e = Msg::new("e2", "x").envelope(TOKEN);
                e["header"]["create_time"] = json!("yesterday");
                e
            }),
            400,
        ),
        (
            "wrong token",
            plain(&Msg::new("e3", "x").envelope("nope")),
            401,
        ),
        ("stale create_time", plain(&stale.envelope(TOKEN)), 401),
        (
            "stale v1 ts",
            plain(&json!({"uuid":"u-old","token":TOKEN,"ts":"1500000000.1",
            "type":"event_callback","event":{"type":"message"}})),
            401,
        ),
    ];
    for (what, req, status) in cases {
        assert_eq!(post(&app, req).await.0, status, "{what}");
    }
    // Raw garbage bytes and a chunked oversize body.
    let r = app
        .http
        .post(app.url("/lark/events"))
        .body(vec![0xffu8, 0xfe, 0x00])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A chunked body (no Content-Length) that grows past the limit.
    assert_eq!(chunked_oversize(&app).await, 413);
    assert!(inbox(&app).await.is_empty());
    app.stop().await;
}

/// Sends a chunked request of 1.25 MiB over a raw connection; returns the status code.
async fn chunked_oversize(app: &TestApp) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let head = "POST /lark/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 64 * 1024];
    for _ in 0..20 {
        let r = async {
            s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            s.write_all(&chunk).await?;
            s.write_all(b"\r\n").await
        }
        .await;
        if r.is_err() {
            break; // the server answered and closed early
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut buf = vec![0u8; 1024];
    let n = s.read(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn concurrent_deliveries_are_each_recorded_once() {
    let app = no_workers()
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .spawn()
        .await;
    let mut sends = Vec::new();
    for i in 0..30 {
        for _ in 0..2 {
            let env = Msg::new(&format!("ev_c{i}"), "/help").envelope(TOKEN);
            let req = sealed(&env, ENCRYPT_KEY, now_secs());
            let (http, url) = (app.http.clone(), app.url("/lark/events"));
            sends.push(tokio::spawn(async move {
                let mut b = http.post(url).body(req.body);
                for (k, v) in req.headers {
                    b = b.header(k, v);
                }
                b.send().await.unwrap().status().as_u16()
            }));
        }
    }
    for s in sends {
        assert_eq!(s.await.unwrap(), 200);
    }
    assert_eq!(inbox(&app).await.len(), 30);
    assert!(
        metric(&app, "sshmode_events_received_total")
            .await
            .ends_with(" 30")
    );
    assert!(
        metric(&app, "sshmode_events_duplicate_total")
            .await
            .ends_with(" 30")
    );
    app.stop().await;
}

/// A click on a card button, as Lark sends it (`create_time` in microseconds).
fn click(event_id: &str) -> Value {
    json!({"schema":"2.0","header":{"event_id":event_id,"event_type":"card.action.trigger",
        "create_time": (Utc::now().timestamp_micros()).to_string(),"token":TOKEN,"app_id":"cli_test_app"},
        "event":{"operator":{"open_id":"ou_user"},"action":{"value":{"k":"v"},"tag":"button"},
            "context":{"open_message_id":"om_1","open_chat_id":"oc_chat"}}})
}

/// Lark never delivers a click again, and shows any status but 200 as error 200671: a click
/// that cannot be recorded — no admission left, or the database refusing the write — is
/// answered 200 with an error toast asking for another click, and counted. A message in the
/// same state is still answered 503, so that Lark delivers it again.
#[tokio::test]
async fn a_click_that_cannot_be_recorded_is_answered_200_with_a_busy_toast() {
    let app = no_workers()
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .spawn()
        .await;
    let busy = |(status, body): (u16, Value)| {
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["toast"]["type"], "error", "{body}");
        let said = body["toast"]["content"].as_str().unwrap();
        assert!(said.contains("try again"), "{said}");
    };
    let message = Msg::new("ev_msg_busy", "/help").envelope(TOKEN);

    // Every admission taken, as that many requests in flight would.
    let held: Vec<_> = std::iter::from_fn(|| app.state.inbox.admit())
        .take(sshmode::inbox::ADMITTED_MAX)
        .collect();
    busy(post(&app, sealed_now(&click("ev_click_full"))).await);
    assert_eq!(post(&app, sealed_now(&message)).await.0, 503);
    drop(held);
    assert!(inbox(&app).await.is_empty());

    // The database refuses the write.
    let db = &app.state.db;
    sqlx::query("ALTER TABLE inbox_events RENAME TO inbox_events_away")
        .execute(db)
        .await
        .unwrap();
    busy(post(&app, sealed_now(&click("ev_click_nodb"))).await);
    assert_eq!(post(&app, sealed_now(&message)).await.0, 503);
    sqlx::query("ALTER TABLE inbox_events_away RENAME TO inbox_events")
        .execute(db)
        .await
        .unwrap();
    assert!(inbox(&app).await.is_empty());

    let rejected = metric(&app, "sshmode_events_rejected_total").await;
    assert!(
        rejected.contains("sshmode_events_rejected_total{reason=\"click_busy\"} 2"),
        "{rejected}"
    );
    assert!(
        rejected.contains("sshmode_events_rejected_total{reason=\"saturated\"} 1"),
        "{rejected}"
    );
    // Once it can be recorded, a click is answered and recorded as ever.
    assert_eq!(
        post(&app, sealed_now(&click("ev_click_again"))).await,
        (200, json!({}))
    );
    assert_eq!(inbox(&app).await.len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn a_saturated_inbox_answers_503_and_stores_nothing() {
    let app = no_workers()
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .spawn()
        .await;
    // Take every admission, as that many requests in flight would.
    let held: Vec<_> = std::iter::from_fn(|| app.state.inbox.admit())
        .take(sshmode::inbox::ADMITTED_MAX + 1)
        .collect();
    assert_eq!(held.len(), sshmode::inbox::ADMITTED_MAX);
    let env = Msg::new("ev_full", "/help").envelope(TOKEN);
    let (status, _) = post(&app, sealed(&env, ENCRYPT_KEY, now_secs())).await;
    assert_eq!(status, 503);
    assert!(inbox(&app).await.is_empty());
    assert!(
        metric(&app, "sshmode_events_rejected_total")
            .await
            .contains("reason=\"saturated\"")
    );
    // Once the requests in flight are answered, the platform's retry is recorded.
    drop(held);
    let r = post(&app, sealed(&env, ENCRYPT_KEY, now_secs())).await;
    assert_eq!(r, (200, json!({"msg":"success"})));
    assert_eq!(
        inbox(&app).await,
        vec![("ev_full".into(), "pending".into(), 0)]
    );
    app.stop().await;
}
