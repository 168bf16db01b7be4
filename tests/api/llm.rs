//! The model router against fake OpenAI-compatible providers: chain order, failure classes,
//! per-model cooldowns, probes, the forced try, state across restarts, and the HTTP surface.
//! Time is a `ManualClock`; no test sleeps.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};
use sshmode::clock::ManualClock;
use sshmode::llm::wire::{FinishReason, Tool};
use sshmode::llm::{ChatRequest, FailureClass, Message, Router, RouterError};

use crate::fake_llm::{FakeProvider, Reply, completion, error, openai_quota, rate_limited, text};
use crate::helpers::TestApp;

const KEY_A: &str = "sk-test-key-aaaaaaaaaaaa";
const KEY_B: &str = "sk-test-key-bbbbbbbbbbbb";

fn start_time() -> DateTime<Utc> {
    "2026-11-30T00:00:00Z".parse().unwrap()
}

/// A router file with providers `a` and `b` (keys from `KEY_A` / `KEY_B`) and `chains` as
/// `[[models]]` TOML.
fn router_file(a: &FakeProvider, b: &FakeProvider, chains: &str) -> tempfile::NamedTempFile {
    let text = format!(
        r#"
[providers.a]
base_url = "{}"
api_key_env = "KEY_A"
headers = {{ "X-Title" = "sshmode-test" }}

[providers.b]
base_url = "{}"
api_key_env = "KEY_B"

{chains}
"#,
        a.base, b.base
    );
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

const TWO: &str = r#"
[[models]]
name = "coder"
entries = [
  { provider = "a", model = "a1", priority = 1 },
  { provider = "b", model = "b1", priority = 2 },
]
"#;

struct Setup {
    a: FakeProvider,
    b: FakeProvider,
    clock: Arc<ManualClock>,
    file: tempfile::NamedTempFile,
}

async fn setup(chains: &str) -> Setup {
    let a = FakeProvider::start().await;
    let b = FakeProvider::start().await;
    let file = router_file(&a, &b, chains);
    Setup {
        a,
        b,
        clock: Arc::new(ManualClock::new(start_time())),
        file,
    }
}

impl Setup {
    async fn spawn(&self) -> TestApp {
        self.spawn_on(None, KEY_A).await
    }

    async fn spawn_on(&self, db: Option<&str>, key_a: &str) -> TestApp {
        let mut b = TestApp::builder()
            .var(
                "SSHMODE_ROUTER_CONFIG",
                &self.file.path().display().to_string(),
            )
            .var("KEY_A", key_a)
            .var("KEY_B", KEY_B)
            .var("SSHMODE_LLM_TIMEOUT_SECS", "1")
            .clock(self.clock.clone());
        if let Some(url) = db {
            b = b.database(url);
        }
        b.spawn().await
    }
}

fn router(app: &TestApp) -> &Router {
    app.state.llm.as_deref().expect("a router is configured")
}

fn ask(text: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![Message::user(text)],
        ..Default::default()
    }
}

async fn health(app: &TestApp) -> Value {
    app.http
        .get(app.url("/router/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The health entry of `chain`/`model`.
fn entry<'a>(health: &'a Value, chain: &str, model: &str) -> &'a Value {
    health["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["chain"] == chain && e["model"] == model)
        .unwrap_or_else(|| panic!("no entry {chain}/{model} in {health}"))
}

fn at(t: DateTime<Utc>) -> Value {
    json!(t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

#[tokio::test]
async fn tool_calls_travel_in_the_openai_shape() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.push(
        "a1",
        completion(
            "a1-2026",
            json!({
                "content": null,
                "reasoning_content": "let me look",
                "tool_calls": [
                    {"id": 0, "type": "function", "function": {"name": "terminal", "arguments": "{\"command\":\"ls -la\"}"}},
                    {"id": 0, "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/etc/hosts\"}"}}
                ]
            }),
            json!("tool_calls"),
        ),
    );
    let mut req = ask("list files");
    req.tools = Some(vec![Tool::function(
        "terminal",
        "run a command",
        json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
    )]);
    req.tool_choice = Some(json!("auto"));
    let routed = router(&app).chat(None, req.clone()).await.unwrap();

    // What the provider saw.
    let sent = &s.a.requests()[0];
    assert_eq!(sent.model, "a1");
    assert_eq!(sent.body["tools"][0]["function"]["name"], "terminal");
    assert_eq!(sent.body["tool_choice"], "auto");
    assert_eq!(
        sent.headers["authorization"].to_str().unwrap(),
        format!("Bearer {KEY_A}")
    );
    assert_eq!(sent.headers["x-title"], "sshmode-test");

    // What the caller gets: the abstract name, unique ids, parsed arguments, usage, the entry.
    let r = &routed.response;
    assert_eq!(r.model, "coder");
    let msg = r.message().unwrap();
    assert_eq!(msg.content, None);
    assert_eq!(r.choices[0].finish_reason, Some(FinishReason::ToolCalls));
    let calls = &msg.tool_calls;
    assert_eq!(calls.len(), 2);
    assert_ne!(calls[0].id, calls[1].id);
    assert_eq!(calls[0].parsed_arguments().unwrap()["command"], "ls -la");
    assert_eq!(routed.served.provider, "a");
    assert_eq!(routed.served.model, "a1");
    assert_eq!(routed.served.usage.total_tokens, 16);
    assert!(!routed.served.forced && routed.served.failed_attempts.is_empty());

    // The follow-up carries the assistant's calls and the tool answers back.
    let mut next = req;
    next.messages.push(msg.clone());
    for c in calls {
        next.messages.push(Message::tool(c.id.clone(), "ok"));
    }
    router(&app).chat(Some("coder"), next).await.unwrap();
    let sent = &s.a.requests()[1].body;
    let msgs = sent["messages"].as_array().unwrap();
    assert_eq!(msgs[1]["role"], "assistant");
    assert!(msgs[1]["tool_calls"][0]["function"]["arguments"].is_string());
    assert_eq!(msgs[1]["reasoning_content"], "let me look");
    assert_eq!(msgs[2]["role"], "tool");
    assert_eq!(msgs[2]["tool_call_id"], json!(calls[0].id));
    assert_eq!(msgs[3]["tool_call_id"], json!(calls[1].id));
    app.stop().await;
}

#[tokio::test]
async fn invalid_arguments_and_odd_finish_reasons_do_not_break_the_client() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.push(
        "a1",
        completion(
            "a1",
            json!({"role": "assistant", "tool_calls": [
                {"id": "x", "type": "function", "function": {"name": "patch", "arguments": "{\"path\": \"/a\", "}}
            ]}),
            json!("tool_use"),
        ),
    );
    let routed = router(&app).chat(None, ask("fix it")).await.unwrap();
    let call = &routed.response.message().unwrap().tool_calls[0];
    let err = call.parsed_arguments().unwrap_err();
    assert!(err.to_string().contains("`patch`"), "{err}");
    assert_eq!(
        routed.served.provider, "a",
        "a bad argument is not a provider failure"
    );

    for (wire, want) in [
        (json!(""), None),
        (json!("eos"), Some(FinishReason::Stop)),
        (
            json!("weird_stop"),
            Some(FinishReason::Other("weird_stop".into())),
        ),
        (json!(null), None),
    ] {
        s.a.push(
            "a1",
            completion("a1", json!({"role": "assistant", "content": "hi"}), wire),
        );
        let r = router(&app).chat(None, ask("hi")).await.unwrap();
        assert_eq!(r.response.choices[0].finish_reason, want);
        assert_eq!(r.response.message().unwrap().text_content(), "hi");
    }
    // Content missing altogether.
    s.a.push(
        "a1",
        completion("a1", json!({"role": "assistant"}), json!("stop")),
    );
    let r = router(&app).chat(None, ask("hi")).await.unwrap();
    assert_eq!(r.response.message().unwrap().text_content(), "");
    assert_eq!(s.b.requests().len(), 0);
    app.stop().await;
}

#[tokio::test]
async fn rate_limit_cools_for_retry_after_then_the_entry_returns() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.push("a1", rate_limited(120));
    let r = router(&app).chat(None, ask("1")).await.unwrap();
    assert_eq!(r.served.provider, "b");
    assert_eq!(r.served.failed_attempts[0].class, FailureClass::RateLimited);

    let h = health(&app).await;
    let a = entry(&h, "coder", "a1");
    assert_eq!(a["state"], "cooling");
    assert_eq!(a["until"], at(start_time() + Duration::seconds(120)));
    assert_eq!(a["reason"], "rate_limited");
    assert_eq!(a["last_error"]["class"], "rate_limited");

    // While cooling, `a` is skipped without a request.
    router(&app).chat(None, ask("2")).await.unwrap();
    assert_eq!(s.a.count("a1"), 1);
    s.clock.advance(Duration::seconds(121));
    let r = router(&app).chat(None, ask("3")).await.unwrap();
    assert_eq!(r.served.provider, "a");
    assert_eq!(entry(&health(&app).await, "coder", "a1")["state"], "ok");
    app.stop().await;
}

#[tokio::test]
async fn quota_errors_cool_that_model_only_for_the_long_cooldown() {
    // Each case: a chain of two models of provider `a`, then `b`. The first model's quota is
    // gone; the second model of the same provider must still serve.
    let cases: Vec<(&str, Reply)> = vec![
        ("openai", openai_quota()),
        (
            "ark",
            error(
                403,
                json!({"error": {"code": "AccountOverdueError", "message": "The request failed because your account has an overdue balance.", "type": "Forbidden"}}),
            ),
        ),
        (
            "dashscope",
            error(
                400,
                json!({"error": {"code": "Arrearage", "message": "Access denied, please make sure your account is in good standing.", "type": "Arrearage"}}),
            ),
        ),
        (
            "dashscope-free",
            error(
                429,
                json!({"error": {"code": "Throttling.AllocationQuota", "message": "Free allocated quota exceeded."}}),
            ),
        ),
        (
            "openrouter",
            error(
                402,
                json!({"error": {"code": 402, "message": "Insufficient credits"}}),
            ),
        ),
    ];
    let mut chains = String::new();
    for (name, _) in &cases {
        chains.push_str(&format!(
            "[[models]]\nname = \"{name}\"\nentries = [{{ provider = \"a\", model = \"{name}-1\" }}, {{ provider = \"a\", model = \"{name}-2\" }}, {{ provider = \"b\", model = \"b1\" }}]\n"
        ));
    }
    let s = setup(&chains).await;
    let app = s.spawn().await;
    for (name, reply) in &cases {
        s.a.push(&format!("{name}-1"), reply.clone());
        let r = router(&app).chat(Some(name), ask("go")).await.unwrap();
        assert_eq!(r.served.model, format!("{name}-2"), "{name}");
        assert_eq!(
            r.served.failed_attempts[0].class,
            FailureClass::Quota,
            "{name}"
        );
        let h = health(&app).await;
        let first = entry(&h, name, &format!("{name}-1"));
        assert_eq!(first["state"], "cooling", "{name}");
        assert_eq!(first["reason"], "quota", "{name}");
        assert_eq!(
            first["until"],
            at(start_time() + Duration::hours(5)),
            "{name}"
        );
        assert_eq!(
            entry(&h, name, &format!("{name}-2"))["state"],
            "ok",
            "{name}"
        );
        // The cooling model gets no traffic; the provider's other model does.
        router(&app).chat(Some(name), ask("again")).await.unwrap();
        assert_eq!(s.a.count(&format!("{name}-1")), 1, "{name}");
        assert_eq!(s.a.count(&format!("{name}-2")), 2, "{name}");
    }
    assert_eq!(s.b.requests().len(), 0);
    let metrics = app.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sshmode_llm_requests_total") && l.contains("outcome=\"quota\"")),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_rejected_key_disables_the_entry_until_the_key_changes() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.always(
        "a1",
        error(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {KEY_A}."), "type": "invalid_request_error", "code": "invalid_api_key"}}),
        ),
    );
    let r = router(&app).chat(None, ask("1")).await.unwrap();
    assert_eq!(r.served.provider, "b");
    let h = health(&app).await;
    let a = entry(&h, "coder", "a1");
    assert_eq!(a["state"], "disabled");
    assert_eq!(a["last_error"]["class"], "auth");
    assert!(!h.to_string().contains(KEY_A), "the key leaked: {h}");
    assert!(
        !h.to_string().contains("aaaaaaaaaaaa"),
        "the key leaked: {h}"
    );

    // Time does not heal it, and probes leave it alone.
    s.clock.advance(Duration::hours(10));
    assert_eq!(router(&app).probe_now().await.probed, 0);
    router(&app).chat(None, ask("2")).await.unwrap();
    assert_eq!(s.a.count("a1"), 1);
    let db = app.stop().await;

    // The operator fixes the key: the entry starts fresh.
    s.a.heal("a1");
    let app = s.spawn_on(Some(&db), "sk-test-key-corrected").await;
    assert_eq!(entry(&health(&app).await, "coder", "a1")["state"], "ok");
    let r = router(&app).chat(None, ask("3")).await.unwrap();
    assert_eq!(r.served.provider, "a");
    app.stop().await;
}

#[tokio::test]
async fn server_errors_and_timeouts_move_on_at_once_and_cool_after_repeats() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.always("a1", error(500, json!({"error": {"message": "internal"}})));
    for i in 0..3 {
        let r = router(&app).chat(None, ask("x")).await.unwrap();
        assert_eq!(r.served.provider, "b");
        assert_eq!(r.served.failed_attempts[0].class, FailureClass::Transient);
        let state = entry(&health(&app).await, "coder", "a1")["state"].clone();
        assert_eq!(
            state,
            if i < 2 { "ok" } else { "cooling" },
            "after {} failures",
            i + 1
        );
    }
    assert_eq!(s.a.count("a1"), 3);

    // A reply slower than the timeout (1 s here) counts as transient too.
    s.b.push("b1", Reply::Hang);
    let e = router(&app).chat(None, ask("y")).await;
    // `a` is cooling, `b` hangs: the forced try of `a` fails with a 500.
    let Err(RouterError::Unavailable { attempts, .. }) = e else {
        panic!("expected unavailable, got {e:?}")
    };
    assert_eq!(attempts[0].provider, "b");
    assert_eq!(attempts[0].class, FailureClass::Transient);
    assert!(
        attempts[0].message.contains("timeout"),
        "{}",
        attempts[0].message
    );
    assert_eq!(attempts[1].provider, "a");
    app.stop().await;
}

#[tokio::test]
async fn a_bad_request_is_returned_without_retry_or_cooldown() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.push(
        "a1",
        error(
            400,
            json!({"error": {"message": "This model's maximum context length is 8192 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}}),
        ),
    );
    let e = router(&app).chat(None, ask("huge")).await.unwrap_err();
    let RouterError::Rejected(a) = e else {
        panic!("expected a rejection, got {e:?}")
    };
    assert_eq!(a.code.as_deref(), Some("context_length_exceeded"));
    assert_eq!(s.a.count("a1"), 1);
    assert_eq!(s.b.requests().len(), 0);
    let h = health(&app).await;
    assert_eq!(entry(&h, "coder", "a1")["state"], "ok");
    // The next request goes to `a` again.
    let r = router(&app).chat(None, ask("small")).await.unwrap();
    assert_eq!(r.served.provider, "a");
    app.stop().await;
}

#[tokio::test]
async fn a_probe_clears_the_cooldown_when_the_provider_recovers() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.always("a1", openai_quota());
    router(&app).chat(None, ask("1")).await.unwrap();
    assert_eq!(
        entry(&health(&app).await, "coder", "a1")["state"],
        "cooling"
    );

    // Still out of quota: the probe fails and the cooldown is unchanged.
    let report = router(&app).probe_now().await;
    assert_eq!((report.probed, report.recovered), (1, 0));
    let probe = s.a.requests().last().unwrap().body.clone();
    assert!(probe["max_tokens"].as_u64().unwrap() <= 8, "{probe}");
    let h = health(&app).await;
    assert_eq!(
        entry(&h, "coder", "a1")["until"],
        at(start_time() + Duration::hours(5))
    );

    // Recovered: the next probe brings it back long before the cooldown ends.
    s.a.heal("a1");
    s.clock.advance(Duration::minutes(5));
    let report = router(&app).probe_now().await;
    assert_eq!((report.probed, report.recovered), (1, 1));
    assert_eq!(entry(&health(&app).await, "coder", "a1")["state"], "ok");
    let r = router(&app).chat(None, ask("2")).await.unwrap();
    assert_eq!(r.served.provider, "a");
    // Nothing cooling: nothing probed.
    assert_eq!(router(&app).probe_now().await.probed, 0);
    app.stop().await;
}

#[tokio::test]
async fn when_every_entry_cools_the_soonest_is_tried_anyway() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.push("a1", rate_limited(300));
    s.b.push("b1", rate_limited(60));
    let e = router(&app).chat(None, ask("1")).await.unwrap_err();
    assert!(matches!(e, RouterError::Unavailable { ref attempts, .. } if attempts.len() == 2));
    assert!(e.to_string().contains("`coder`"), "{e}");

    // Both cool; `b`'s cooldown ends first, so `b` alone is tried.
    let r = router(&app).chat(None, ask("2")).await.unwrap();
    assert_eq!(r.served.provider, "b");
    assert!(r.served.forced);
    assert_eq!(s.a.count("a1"), 1);
    assert_eq!(s.b.count("b1"), 2);
    let stats: Value = app
        .http
        .get(app.url("/router/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["chains"][0]["forced"], 1);
    assert_eq!(stats["chains"][0]["unavailable"], 1);
    app.stop().await;
}

#[tokio::test]
async fn cooldowns_survive_a_restart() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.push("a1", openai_quota());
    router(&app).chat(None, ask("1")).await.unwrap();
    let db = app.stop().await;

    let app = s.spawn_on(Some(&db), KEY_A).await;
    let h = health(&app).await;
    assert_eq!(entry(&h, "coder", "a1")["state"], "cooling");
    let r = router(&app).chat(None, ask("2")).await.unwrap();
    assert_eq!(r.served.provider, "b");
    assert_eq!(s.a.count("a1"), 1);
    app.stop().await;
}

#[tokio::test]
async fn health_and_stats_report_every_entry() {
    let s = setup(TWO).await;
    let app = s.spawn().await;
    s.a.push(
        "a1",
        error(503, json!({"error": {"message": "overloaded"}})),
    );
    router(&app).chat(None, ask("1")).await.unwrap();
    let h = health(&app).await;
    assert_eq!(h["default_model"], "coder");
    for e in h["entries"].as_array().unwrap() {
        for field in ["chain", "provider", "model", "state", "until", "last_error"] {
            assert!(e.get(field).is_some(), "{field} missing in {e}");
        }
    }
    let a = entry(&h, "coder", "a1");
    assert_eq!(a["last_error"]["class"], "transient");
    assert!(a["last_error"]["message"].as_str().unwrap().contains("503"));
    assert!(entry(&h, "coder", "b1")["last_error"].is_null());

    let stats: Value = app
        .http
        .get(app.url("/router/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entries = stats["entries"].as_array().unwrap();
    let a = entries.iter().find(|e| e["model"] == "a1").unwrap();
    let b = entries.iter().find(|e| e["model"] == "b1").unwrap();
    assert_eq!(
        (a["requests"].as_u64(), a["failed"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(a["failures"]["transient"], 1);
    assert_eq!(
        (b["requests"].as_u64(), b["ok"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(b["latency_ms_avg"].as_f64().unwrap() > 0.0);
    assert_eq!(stats["chains"][0]["requests"], 1);
    app.stop().await;
}

#[tokio::test]
async fn the_router_is_an_openai_compatible_endpoint_behind_a_token() {
    let s = setup(TWO).await;
    // Off while SSHMODE_API_TOKEN is unset.
    let app = s.spawn().await;
    let body = json!({"model": "coder", "messages": [{"role": "user", "content": "hi"}]});
    let r = app
        .http
        .post(app.url("/v1/chat/completions"))
        .bearer_auth("anything")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    app.stop().await;

    let app = TestApp::builder()
        .var(
            "SSHMODE_ROUTER_CONFIG",
            &s.file.path().display().to_string(),
        )
        .var("KEY_A", KEY_A)
        .var("KEY_B", KEY_B)
        .var("SSHMODE_API_TOKEN", "router-token-123")
        .clock(s.clock.clone())
        .spawn()
        .await;
    let post = |token: &str, body: Value| {
        app.http
            .post(app.url("/v1/chat/completions"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    assert_eq!(post("wrong", body.clone()).await.unwrap().status(), 401);
    let r = app
        .http
        .post(app.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // What the OpenAI SDK sends: model, messages, tools; it reads id, choices, usage, model.
    let r = post(
        "router-token-123",
        json!({
            "model": "coder",
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            "temperature": 0.2,
            "seed": 7
        }),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-sshmode-provider"], "a");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "coder");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "hello from a1");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["total_tokens"], 16);
    assert_eq!(v["system_fingerprint"], "fp_fake");
    let sent = &s.a.requests()[0].body;
    assert_eq!(sent["model"], "a1");
    assert_eq!(sent["seed"], 7);
    assert_eq!(sent["temperature"], 0.2);

    // Errors come in OpenAI's shape.
    let r = post("router-token-123", json!({"model": "nope", "messages": []}))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    s.a.push(
        "a1",
        error(
            400,
            json!({"error": {"message": "context too long", "type": "invalid_request_error", "code": "context_length_exceeded"}}),
        ),
    );
    let r = post("router-token-123", body.clone()).await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("context too long")
    );
    let r = post(
        "router-token-123",
        json!({"model": "coder", "stream": true, "messages": []}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400);

    let models: Value = app
        .http
        .get(app.url("/v1/models"))
        .bearer_auth("router-token-123")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "coder");
    app.stop().await;
}

#[tokio::test]
async fn single_provider_variables_and_no_model_at_all() {
    let fake = FakeProvider::start().await;
    fake.push("gpt-x", text("gpt-x", "single"));
    let app = TestApp::builder()
        .var("LLM_BASE_URL", &fake.base)
        .var("LLM_API_KEY", "sk-single-key-value")
        .var("LLM_MODEL", "gpt-x")
        .var("SSHMODE_MODEL", "main")
        .spawn()
        .await;
    let r = router(&app).chat(None, ask("hi")).await.unwrap();
    assert_eq!(r.response.model, "main");
    assert_eq!(r.served.model, "gpt-x");
    assert_eq!(r.response.message().unwrap().text_content(), "single");
    let h = health(&app).await;
    assert_eq!(entry(&h, "main", "gpt-x")["provider"], "default");
    app.stop().await;

    let app = TestApp::spawn().await;
    assert!(app.state.llm.is_none());
    assert_eq!(health(&app).await["entries"], json!([]));
    app.stop().await;
}

#[test]
fn a_router_file_is_checked_when_the_configuration_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("router.toml");
    std::fs::write(
        &path,
        "[providers.p]\nbase_url = \"https://p.example/v1\"\napi_key_env = \"P_KEY\"\n\n[[models]]\nname = \"m\"\nentries = [{ provider = \"p\", model = \"x\" }]\n",
    )
    .unwrap();
    let mut vars: std::collections::HashMap<String, String> = [(
        "SSHMODE_ROUTER_CONFIG".to_string(),
        "router.toml".to_string(),
    )]
    .into_iter()
    .collect();
    let load = |vars: &std::collections::HashMap<String, String>| {
        sshmode::config::Config::from_vars(&|k| vars.get(k).cloned(), dir.path())
    };
    let e = load(&vars).unwrap_err().to_string();
    assert!(
        e.contains("SSHMODE_ROUTER_CONFIG") && e.contains("P_KEY"),
        "{e}"
    );
    vars.insert("P_KEY".into(), "sk-p-secret-value".into());
    let c = load(&vars).unwrap();
    let file = c.router_file.as_ref().unwrap();
    assert_eq!(file.chains[0].name, "m");
    assert!(!format!("{c:?}").contains("sk-p-secret-value"));
    vars.insert("SSHMODE_ROUTER_CONFIG".into(), "missing.toml".into());
    let e = load(&vars).unwrap_err().to_string();
    assert!(e.contains("SSHMODE_ROUTER_CONFIG"), "{e}");
}

/// The app of `s`'s router file with `SSHMODE_API_TOKEN` set, and the given extra variables.
async fn spawn_with_token(s: &Setup, extra: &[(&str, &str)]) -> TestApp {
    let mut b = TestApp::builder()
        .var(
            "SSHMODE_ROUTER_CONFIG",
            &s.file.path().display().to_string(),
        )
        .var("KEY_A", KEY_A)
        .var("KEY_B", KEY_B)
        .var("SSHMODE_API_TOKEN", API_TOKEN)
        .clock(s.clock.clone());
    for (k, v) in extra {
        b = b.var(k, v);
    }
    b.spawn().await
}

const API_TOKEN: &str = "router-token-123";

/// Sends a completion request's head (declaring a large body) and `body_start`, then waits for
/// the answer's status line without sending more.
async fn head_only(app: &TestApp, token: Option<&str>, body_start: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         {auth}Content-Length: 1000000\r\n\r\n{body_start}"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

/// The status code of the answer on `s`, waiting at most `within`.
async fn status_on(s: &mut tokio::net::TcpStream, within: std::time::Duration) -> Option<u16> {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 2048];
    let n = tokio::time::timeout(within, s.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&buf[..n])
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test]
async fn the_bearer_token_is_checked_before_the_body_is_read() {
    let s = setup(TWO).await;
    // A body that never comes would hold the request for a minute.
    let slow_body = [("SSHMODE_HTTP_BODY_TIMEOUT_SECS", "60")];
    let within = std::time::Duration::from_secs(20);
    // Endpoint off: refused at once, body or not.
    let app = s.spawn().await;
    let mut c = head_only(&app, Some("anything"), "{").await;
    assert_eq!(status_on(&mut c, within).await, Some(404));
    app.stop().await;

    let app = spawn_with_token(&s, &slow_body).await;
    let mut c = head_only(&app, Some("wrong"), "{").await;
    assert_eq!(status_on(&mut c, within).await, Some(401));
    let mut c = head_only(&app, None, "{").await;
    assert_eq!(status_on(&mut c, within).await, Some(401));
    // A declared body over the limit is refused without being read.
    let mut c = {
        use tokio::io::AsyncWriteExt;
        let mut c = tokio::net::TcpStream::connect(app.addr).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_TOKEN}\r\n\
             Content-Length: {}\r\n\r\n",
            64 * 1024 * 1024
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c
    };
    assert_eq!(status_on(&mut c, within).await, Some(413));
    app.stop().await;
}

#[tokio::test]
async fn completion_requests_in_progress_are_bounded() {
    let s = setup(TWO).await;
    s.a.always("a1", text("a1", "hello from a1"));
    let app = spawn_with_token(&s, &[("SSHMODE_HTTP_BODY_TIMEOUT_SECS", "120")]).await;
    let body = json!({"model": "coder", "messages": [{"role": "user", "content": "hi"}]});
    let ask = || {
        app.http
            .post(app.url("/v1/chat/completions"))
            .bearer_auth(API_TOKEN)
            .json(&body)
            .send()
    };
    // Authenticated clients that never finish their bodies hold every place …
    let mut holders = Vec::new();
    for _ in 0..sshmode::http::router::MAX_CONCURRENT {
        holders.push(head_only(&app, Some(API_TOKEN), "{\"model\"").await);
    }
    // … so the next request is turned away at once, not queued behind them.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = ask().await.unwrap();
        if r.status() == 503 {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "server_busy");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never refused as busy (last: {})",
            r.status()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Once they go, requests are served again.
    drop(holders);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let status = ask().await.unwrap().status();
        if status == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "last: {status}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    app.stop().await;
}

#[tokio::test]
async fn router_status_needs_the_api_token_when_it_is_set() {
    let s = setup(TWO).await;
    s.a.push(
        "a1",
        error(
            503,
            json!({"error": {"message": "upstream melted near rack-77"}}),
        ),
    );
    let app = spawn_with_token(&s, &[]).await;
    router(&app).chat(None, ask("1")).await.unwrap();
    for path in ["/router/health", "/router/stats"] {
        let r = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
        let r = app
            .http
            .get(app.url(path))
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path}");
        let r = app
            .http
            .get(app.url(path))
            .bearer_auth(API_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    // The provider's message is in the (guarded) health report, never in /metrics.
    let h: Value = app
        .http
        .get(app.url("/router/health"))
        .bearer_auth(API_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let msg = entry(&h, "coder", "a1")["last_error"]["message"].to_string();
    assert!(msg.contains("rack-77"), "{msg}");
    let metrics = app.metrics().await;
    assert!(metrics.contains("sshmode_llm_requests_total"), "{metrics}");
    assert!(
        !metrics.contains("rack-77") && !metrics.contains("melted"),
        "{metrics}"
    );
    app.stop().await;
}
