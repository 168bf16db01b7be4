//! The Open API client against the fake Lark: request shapes, the token cache and its refresh,
//! typed errors, and retries.

use std::sync::Arc;

use secrecy::SecretString;
use serde_json::{Value, json};
use sshmode::lark::client::{Content, LarkClient, LarkError, Sent};
use sshmode::metrics::Metrics;

use crate::fake_lark::{APP_ID, APP_SECRET, Failure, FakeLark};

fn client(fake: &FakeLark) -> LarkClient {
    LarkClient::new(
        &fake.base,
        APP_ID,
        SecretString::from(APP_SECRET),
        Arc::new(Metrics::new()),
    )
    .unwrap()
}

fn calls(fake: &FakeLark) -> Vec<(String, String, Option<String>)> {
    fake.requests()
        .into_iter()
        .map(|r| {
            (
                r.method.clone(),
                r.path.clone(),
                r.bearer().map(str::to_owned),
            )
        })
        .collect()
}

fn c(m: &str, p: &str, t: Option<&str>) -> (String, String, Option<String>) {
    (m.into(), p.into(), t.map(str::to_owned))
}

#[tokio::test]
async fn every_call_has_its_documented_shape() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    let sent = lark
        .send("oc_1", &Content::Text("hi".into()), "uuid-send")
        .await
        .unwrap();
    assert_eq!(sent.chat_id.as_deref(), Some("oc_1"));
    let r = lark
        .reply(
            "om_1",
            &Content::Text("in thread".into()),
            true,
            "uuid-reply",
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        r,
        Sent {
            message_id: r.message_id.clone(),
            chat_id: Some("oc_fake".into()),
            thread_id: Some("omt_1".into())
        }
    );
    lark.edit("om_1", &Content::Text("edited".into()))
        .await
        .unwrap();
    let card = json!({"schema": "2.0", "body": {"elements": []}});
    lark.edit("om_2", &Content::Card(card.clone()))
        .await
        .unwrap();
    let reaction = lark.add_reaction("om_1", "Typing").await.unwrap();
    lark.remove_reaction("om_1", &reaction).await.unwrap();
    assert_eq!(
        lark.bot_open_id().await.unwrap(),
        crate::fake_lark::BOT_OPEN_ID
    );
    assert_eq!(
        lark.bot_open_id().await.unwrap(),
        crate::fake_lark::BOT_OPEN_ID
    );

    let t = Some("t-1");
    assert_eq!(
        calls(&fake),
        vec![
            c(
                "POST",
                "/open-apis/auth/v3/tenant_access_token/internal",
                None
            ),
            c(
                "POST",
                "/open-apis/im/v1/messages?receive_id_type=chat_id",
                t
            ),
            c("POST", "/open-apis/im/v1/messages/om_1/reply", t),
            c("PUT", "/open-apis/im/v1/messages/om_1", t),
            c("PATCH", "/open-apis/im/v1/messages/om_2", t),
            c("POST", "/open-apis/im/v1/messages/om_1/reactions", t),
            c(
                "DELETE",
                &format!("/open-apis/im/v1/messages/om_1/reactions/{reaction}"),
                t
            ),
            c("GET", "/open-apis/bot/v3/info", t),
        ],
        "one token, one bot-info lookup"
    );
    let bodies: Vec<Value> = fake.requests().into_iter().map(|r| r.body).collect();
    let text = |t: &str| json!({"text": t}).to_string();
    assert_eq!(
        bodies[1],
        json!({"receive_id":"oc_1","msg_type":"text","content":text("hi"),"uuid":"uuid-send"})
    );
    assert_eq!(
        bodies[2],
        json!({"msg_type":"text","content":text("in thread"),"reply_in_thread":true,"uuid":"uuid-reply"})
    );
    assert_eq!(
        bodies[3],
        json!({"msg_type":"text","content":text("edited")})
    );
    assert_eq!(bodies[4], json!({"content": card.to_string()}));
    assert_eq!(bodies[5], json!({"reaction_type":{"emoji_type":"Typing"}}));
    assert_eq!(bodies[6], Value::Null);
}

#[tokio::test]
async fn an_invalid_token_is_refreshed_and_the_call_retried_once() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    lark.send("oc_1", &Content::Text("a".into()), "u-a")
        .await
        .unwrap();
    fake.invalidate_tokens();
    lark.send("oc_1", &Content::Text("b".into()), "u-b")
        .await
        .unwrap();
    let send = "/open-apis/im/v1/messages?receive_id_type=chat_id";
    let token = "/open-apis/auth/v3/tenant_access_token/internal";
    assert_eq!(
        calls(&fake),
        vec![
            c("POST", token, None),
            c("POST", send, Some("t-1")),
            c("POST", send, Some("t-1")),
            c("POST", token, None),
            c("POST", send, Some("t-2")),
        ]
    );
    // If the fresh token is refused too, the error surfaces after one retry.
    fake.fail_next(
        "/messages",
        vec![Failure::Code(99991663), Failure::Code(99991663)],
    );
    let e = lark
        .send("oc_1", &Content::Text("c".into()), "u-c")
        .await
        .unwrap_err();
    assert!(matches!(e, LarkError::Api { code: 99991663, .. }), "{e}");
    assert_eq!(fake.requests_to("tenant_access_token").len(), 3);
    assert_eq!(fake.requests_to("receive_id_type").len(), 5);
}

#[tokio::test]
async fn a_token_is_refetched_when_it_expires() {
    let fake = FakeLark::start().await;
    // A token whose lifetime leaves nothing to cache is fetched again for the next call.
    fake.set_token_expire(0);
    let lark = client(&fake);
    lark.add_reaction("om_1", "OK").await.unwrap();
    lark.add_reaction("om_1", "OK").await.unwrap();
    let bearers: Vec<Option<String>> = fake
        .requests_to("/reactions")
        .iter()
        .map(|r| r.bearer().map(str::to_owned))
        .collect();
    assert_eq!(bearers, [Some("t-1".to_string()), Some("t-2".to_string())]);
    // With a normal lifetime the token is reused.
    fake.set_token_expire(7200);
    lark.add_reaction("om_1", "OK").await.unwrap();
    lark.add_reaction("om_1", "OK").await.unwrap();
    assert_eq!(fake.requests_to("tenant_access_token").len(), 3);
}

#[tokio::test]
async fn error_codes_become_typed_errors_and_are_not_retried() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    fake.fail_next("/reply", vec![Failure::Code(230011)]);
    let e = lark
        .reply("om_1", &Content::Text("x".into()), false, "u", None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            LarkError::Api {
                api: "reply",
                code: 230011,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(fake.requests_to("/reply").len(), 1);
    // A thread id is not a valid reply target: Lark's own error comes back typed.
    let e = lark
        .reply("omt_1", &Content::Text("x".into()), false, "u", None)
        .await
        .unwrap_err();
    assert!(matches!(e, LarkError::Api { code: 230001, .. }), "{e}");
    // Bad credentials: a token error that names no secret.
    let bad = LarkClient::new(
        &fake.base,
        APP_ID,
        SecretString::from("wrong"),
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let e = bad.bot_open_id().await.unwrap_err();
    assert!(matches!(e, LarkError::Token(_)), "{e}");
    assert!(!e.to_string().contains("wrong"));
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    fake.fail_next(
        "receive_id_type",
        vec![Failure::RateLimited("0"), Failure::ServerError],
    );
    lark.send("oc_1", &Content::Text("x".into()), "u-x")
        .await
        .unwrap();
    let sends = fake.requests_to("receive_id_type");
    assert_eq!(sends.len(), 3);
    assert!(sends.iter().all(|r| r.body == sends[0].body));
    assert_eq!(fake.posted().len(), 1);
    // Retries are bounded: a limit that never lifts ends in a typed error.
    fake.fail_next("receive_id_type", vec![Failure::RateLimited("0"); 4]);
    let e = lark
        .send("oc_1", &Content::Text("y".into()), "u-y")
        .await
        .unwrap_err();
    assert!(matches!(e, LarkError::RateLimited { .. }), "{e}");
    assert_eq!(fake.requests_to("receive_id_type").len(), 7);
}

#[tokio::test]
async fn transport_errors_are_typed() {
    // Nothing listens on port 9 on this host.
    let lark = LarkClient::new(
        "http://127.0.0.1:9",
        APP_ID,
        SecretString::from(APP_SECRET),
        Arc::new(Metrics::new()),
    )
    .unwrap();
    let e = lark.bot_open_id().await.unwrap_err();
    assert!(matches!(e, LarkError::Token(_)), "{e}");
}

#[tokio::test]
async fn an_oversized_answer_is_not_read() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    let limit = sshmode::lark::client::MAX_RESPONSE;
    fake.fail_next("/messages", vec![Failure::Huge(limit + 1)]);
    let r = lark
        .send("oc_1", &Content::Text("hi".into()), "uuid-huge")
        .await;
    assert!(matches!(r, Err(LarkError::Decode { .. })), "{r:?}");
    // A large answer within the bound is read as usual.
    fake.fail_next("/messages", vec![Failure::Huge(limit / 2)]);
    let sent = lark
        .send("oc_1", &Content::Text("hi".into()), "uuid-big")
        .await
        .unwrap();
    assert_eq!(sent.message_id, "om_huge");
}

/// The most of `times` (sorted) within any span shorter than `span`.
fn busiest(times: &[std::time::Instant], span: std::time::Duration) -> usize {
    let mut most = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end].duration_since(times[start]) >= span {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// Two clients ("replicas") on one database under a burst: what the fake receives never
/// exceeds 50 calls of one API in any second, nor a chat's 5, counted over sliding windows.
/// Each client alone would send a burst of 50 at once. The budgets are the platform's: one per
/// API (reactions and replies each have their own), never one for the whole app.
#[tokio::test]
async fn two_replicas_on_one_database_keep_each_apis_and_each_chats_budget_together() {
    use std::time::Duration;
    let fake = FakeLark::start().await;
    let url = crate::database::fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sshmode::store::MIGRATOR.run(&pool).await.unwrap();
    let replicas = [
        Arc::new(client(&fake).with_shared_budget(pool.clone())),
        Arc::new(client(&fake).with_shared_budget(pool.clone())),
    ];
    let mut tasks = Vec::new();
    for (r, lark) in replicas.iter().enumerate() {
        for i in 0..60 {
            let lark = lark.clone();
            tasks.push(tokio::spawn(async move {
                lark.add_reaction(&format!("om_{r}_{i}"), "OK")
                    .await
                    .map(|_| ())
            }));
        }
        for i in 0..10 {
            let lark = lark.clone();
            tasks.push(tokio::spawn(async move {
                lark.reply(
                    &format!("om_q{r}_{i}"),
                    &Content::Text("answer".into()),
                    true,
                    &format!("u_{r}_{i}"),
                    Some("oc_busy"),
                )
                .await
                .map(|_| ())
            }));
        }
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let requests = fake.requests();
    let times = |suffix: &str| {
        let mut t: Vec<_> = requests
            .iter()
            .filter(|r| r.path.ends_with(suffix))
            .map(|r| r.at)
            .collect();
        t.sort();
        t
    };
    let (reactions, replies) = (times("/reactions"), times("/reply"));
    assert_eq!((reactions.len(), replies.len()), (120, 20));
    let second = Duration::from_secs(1);
    assert_eq!(fake.frequency_refusals(), 0);
    assert!(
        busiest(&reactions, second) <= 50,
        "{}",
        busiest(&reactions, second)
    );
    assert!(
        busiest(&replies, second) <= 5,
        "{}",
        busiest(&replies, second)
    );
    // One bucket per API in the shared budget, and none for the whole app.
    let mut keys: Vec<String> = sqlx::query_scalar("SELECT key FROM lark_budgets ORDER BY key")
        .fetch_all(&pool)
        .await
        .unwrap();
    keys.retain(|k| !k.contains("/chat/") && !k.contains("/om_"));
    assert_eq!(
        keys,
        [
            format!("{APP_ID}/api/add_reaction"),
            format!("{APP_ID}/api/reply"),
        ]
    );
}

/// The per-minute allowance is a window, not a rate: a burst of calls of one API within it is
/// granted at once (only the per-second bucket paces it), the call past the allowance waits
/// until the window's oldest second leaves it, and another API's window is untouched.
#[tokio::test]
async fn the_minute_allowance_allows_a_burst_and_is_kept_per_api() {
    let url = crate::database::fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sshmode::store::MIGRATOR.run(&pool).await.unwrap();
    // No per-second pacing here (a zero step), a window of 950 in 61 s, as the client keeps it.
    let take = |api: &'static str| {
        let pool = pool.clone();
        async move {
            let key = format!("{APP_ID}/api/{api}");
            sqlx::query_scalar::<_, f64>(
                "SELECT lark_budget_take_windowed($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(vec![key.clone()])
            .bind(vec![0.0f64])
            .bind(vec![0.0f64])
            .bind(vec![key])
            .bind(vec![61i32])
            .bind(vec![950i32])
            .bind(0.25f64)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let started = std::time::Instant::now();
    for i in 0..950 {
        let wait = take("add_reaction").await;
        assert!((0.0..0.01).contains(&wait), "call {i} waited {wait}");
    }
    let took = started.elapsed().as_secs_f64();
    // Refused until the first granted second leaves the 61-s window.
    let refused = take("add_reaction").await;
    assert!(
        refused < 0.0 && -refused <= 61.0 && -refused > 61.0 - took - 1.5,
        "{refused} after {took} s"
    );
    // Nothing was taken by the refusal, and replies have their own allowance.
    assert!(take("reply").await >= 0.0);
    let counted: i64 = sqlx::query_scalar(
        "SELECT sum(c) FROM lark_budget_windows, unnest(counts) AS c WHERE key LIKE '%add_reaction'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counted, 950);
}

/// A downloaded file is the body of Lark's 200, whatever its type: a JSON file, served as
/// `application/json` as Lark serves it, lands intact, even one whose top-level `code` looks
/// like a token error (the tenant token is kept: no second token is fetched).
#[tokio::test]
async fn a_json_file_downloads_intact_and_keeps_the_token() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    let config = br#"{"name": "service", "replicas": [1, 2]}"#.to_vec();
    let tokenish =
        br#"{"code": 99991663, "msg": "Invalid access token for authorization"}"#.to_vec();
    fake.add_resource("om_f", "file_config", config.clone());
    fake.add_resource("om_f", "file_tokenish", tokenish.clone());
    // The fake serves it as Lark does (the client's token is the fake's first, `t-1`).
    lark.check_token().await.unwrap();
    let served = reqwest::Client::new()
        .get(format!(
            "{}/open-apis/im/v1/messages/om_f/resources/file_config?type=file",
            fake.base
        ))
        .bearer_auth("t-1")
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.headers()["content-type"], "application/json");

    let limit = 1024 * 1024;
    let got = lark.download("om_f", "file_config", "file", limit).await;
    assert_eq!(got.unwrap(), config);
    let got = lark.download("om_f", "file_tokenish", "file", limit).await;
    assert_eq!(got.unwrap(), tokenish);
    assert_eq!(fake.requests_to("/resources/").len(), 3, "no retries");
    assert_eq!(
        fake.requests_to("tenant_access_token").len(),
        1,
        "the token was kept"
    );
    // A later call still uses it.
    lark.add_reaction("om_f", "OK").await.unwrap();
    assert_eq!(fake.requests_to("tenant_access_token").len(), 1);
}

/// 230020 and 11232 are rate limits (HTTP 400 from the message APIs: a group's limit is
/// shared by every bot in it): a send, a reply, a reaction, a card PATCH and a download that
/// meet one once go through on the retry, each message created once.
#[tokio::test]
async fn the_message_apis_frequency_limits_are_backed_off_and_retried() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    let limited = |code| vec![Failure::FrequencyLimit(code)];
    fake.fail_next("receive_id_type", limited(230020));
    let sent = lark
        .send("oc_1", &Content::Text("hi".into()), "u-send")
        .await
        .unwrap();
    fake.fail_next("/reply", limited(230020));
    let reply = lark
        .reply("om_1", &Content::Text("re".into()), false, "u-reply", None)
        .await
        .unwrap();
    fake.fail_next("/reactions", limited(11232));
    lark.add_reaction("om_1", "OK").await.unwrap();
    let card = json!({"schema": "2.0", "body": {"elements": []}});
    fake.fail_next("/messages/om_card", limited(230020));
    lark.edit("om_card", &Content::Card(card.clone()))
        .await
        .unwrap();
    fake.add_resource("om_f", "file_a", b"data".to_vec());
    fake.fail_next("/resources/file_a", limited(230020));
    let file = lark.download("om_f", "file_a", "file", 1024).await.unwrap();
    assert_eq!(file, b"data");

    for (part, n) in [
        ("receive_id_type", 2),
        ("/reply", 2),
        ("/reactions", 2),
        ("/messages/om_card", 2),
        ("/resources/file_a", 2),
    ] {
        let reqs = fake.requests_to(part);
        assert_eq!(reqs.len(), n, "{part}");
        assert_eq!(reqs[0].body, reqs[1].body, "{part}: the same request again");
    }
    let posted = fake.posted();
    assert_eq!(posted.len(), 2, "{posted:?}");
    assert_eq!(posted[0]["message_id"], json!(sent.message_id));
    assert_eq!(posted[1]["message_id"], json!(reply.message_id));
    assert_eq!(fake.patched("om_card").len(), 1);

    // Bounded: a limit that does not lift ends in the client's rate-limit error.
    fake.fail_next("/reply", vec![Failure::FrequencyLimit(230020); 4]);
    let e = lark
        .reply(
            "om_1",
            &Content::Text("again".into()),
            false,
            "u-again",
            None,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, LarkError::RateLimited { api: "reply" }), "{e}");
    assert_eq!(fake.requests_to("/reply").len(), 6);
    assert_eq!(fake.posted().len(), 2);
}

/// Lark measures a message request as sent: a post or card body over 30 KB is refused with
/// 230025, however small its content is before it is escaped into the body.
#[tokio::test]
async fn the_size_limit_is_on_the_request_as_sent() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    let limit = sshmode::lark::client::MAX_POST_REQUEST;
    // Quotes and backslashes are escaped in `content`, and again in the body: under 30 KB of
    // text, over it as sent.
    let text = "\"\\".repeat(limit / 3);
    assert!(text.len() < limit);
    let post = |t: &str| Content::Post(json!({"zh_cn": {"content": [[{"tag": "md", "text": t}]]}}));
    let e = lark
        .reply("om_1", &post(&text), false, "u-big", None)
        .await
        .unwrap_err();
    assert!(matches!(e, LarkError::Api { code: 230025, .. }), "{e}");
    let refused = fake.requests_to("/reply");
    assert!(refused[0].bytes > limit);
    assert_eq!(
        sshmode::lark::client::reply_request_bytes(&post(&text)),
        refused[0].bytes + 50 - "u-big".len(),
        "the measure is the body as sent (with the longest uuid)"
    );
    // The same content unescaped fits.
    lark.reply("om_1", &post(&"x".repeat(limit / 2)), false, "u-ok", None)
        .await
        .unwrap();
    assert_eq!(fake.posted().len(), 1);
}

/// With only `im:message.history:readonly` a message's files download but the message itself
/// cannot be read (99991672), as on the platform.
#[tokio::test]
async fn the_history_scope_downloads_files_but_does_not_read_messages() {
    let fake = FakeLark::start().await;
    let lark = client(&fake);
    fake.add_message("om_m", "text", json!({"text": "hi"}), "ou_a", None);
    fake.add_resource("om_m", "file_a", b"log".to_vec());
    fake.grant_history_scope_only();
    let e = lark.get_message("om_m").await.unwrap_err();
    assert!(
        matches!(e, LarkError::Api { code: 99991672, ref msg, .. } if !msg.contains("history")),
        "{e}"
    );
    let file = lark.download("om_m", "file_a", "file", 1024).await.unwrap();
    assert_eq!(file, b"log");
}
