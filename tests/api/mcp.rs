//! The MCP endpoint, driven by the official MCP Python client (both protocol eras: the 2025
//! handshake with its session, and the stateless 2026-07-28 revision) and, for the 2025-03-26
//! revision that client does not speak, by rmcp's own client, against a real sshd: tools
//! listed, `exec` with its exit code and progress, a file round trip, interactive shells, the
//! audit trail; tokens limited to their targets, revoked or expired tokens, bad origins and a
//! missing token refused; the token CLI of the binary.
//!
//! The client runs from the virtualenv `scripts/test.sh` makes (`SSHMODE_TEST_MCP_PYTHON`); a
//! test fails, never skips, when it is missing.

use std::time::Duration;

use serde_json::{Value, json};
use sshmode::mcp::token::{self, NewToken};
use sshmode::target::cli::TargetCmd;
use sshmode::workspace::Permission;

use crate::exec_ssh::{self, Env};

/// The SDK pin (also in scripts/test.sh).
const PY_MCP: &str = "mcp==2.3.0";

/// The tools the endpoint lists, by name.
const TOOLS: [&str; 10] = [
    "exec",
    "host_list",
    "read_file",
    "search_files",
    "shell_close",
    "shell_list",
    "shell_open",
    "shell_read",
    "shell_write",
    "write_file",
];

fn python() -> String {
    std::env::var("SSHMODE_TEST_MCP_PYTHON").unwrap_or_else(|_| {
        panic!(
            "SSHMODE_TEST_MCP_PYTHON is unset: it names the python of a virtualenv with `{PY_MCP}` \
             (scripts/test.sh makes it)"
        )
    })
}

/// Runs the Python client with `plan`; its JSON answer.
pub(crate) async fn client(plan: Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/api/mcp_client.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting the MCP Python client");
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(plan.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("the MCP client finished within 90 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "the MCP client printed no JSON: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

async fn mcp_env() -> Env {
    let env = exec_ssh::env_with(&[
        ("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3"),
        ("SSHMODE_MCP_LISTEN", "127.0.0.1:0"),
    ])
    .await
    .expect("sshd is needed for the MCP tests");
    env.add_key_target("web").await;
    env
}

fn url(env: &Env) -> String {
    format!(
        "http://{}/mcp",
        env.app.state.mcp_addr.expect("the MCP endpoint listens")
    )
}

async fn new_token(env: &Env, name: &str, targets: &[&str]) -> String {
    token_at(env, name, targets, Permission::ReadWrite).await
}

async fn token_at(env: &Env, name: &str, targets: &[&str], permission: Permission) -> String {
    token::create(
        &env.app.state.db,
        &NewToken {
            name: name.into(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
            all_targets: false,
            local: false,
            permission,
            expires_at: None,
        },
        "operator",
    )
    .await
    .unwrap()
}

/// Raises the workspace maximum of `web` to `full` (as `sshmode target set web --permission
/// full` does), and sets its `risky` policy when given.
async fn web_max_full(env: &Env, risky: Option<sshmode::config::Risky>) {
    use sshmode::target::cli::{SetArgs, TargetCmd};
    let set = SetArgs {
        permission: Some(Permission::Full),
        risky,
        ..exec_ssh::set_args("web")
    };
    exec_ssh::cli_ok(&env.app, TargetCmd::Set(set)).await;
}

#[tokio::test]
async fn a_shell_answers_a_prompt_and_is_only_its_tokens() {
    let env = mcp_env().await;
    web_max_full(&env, None).await;
    let mine = token_at(&env, "term", &["web"], Permission::Full).await;
    let theirs = token_at(&env, "nosy", &["web"], Permission::Full).await;
    let limited = new_token(&env, "rw", &["web"]).await;
    let out = client(json!({
        "url": url(&env),
        "token": mine,
        "mode": "2026-07-28",
        "steps": [
            {"tool": "shell_open", "args": {"target": "web", "rows": 30, "cols": 100}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "read -p 'name? ' n; echo hi $n\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "raw", "wait_ms": 10000, "expect": "name\\? $"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "sshmode\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "raw", "wait_ms": 10000, "expect": "hi sshmode"}},
            {"tool": "shell_list", "args": {}},
        ],
    }))
    .await;
    assert!(out.get("error").is_none(), "{out}");
    let r = &out["results"];
    for (i, step) in r.as_array().unwrap().iter().enumerate() {
        assert_eq!(step["is_error"], false, "step {i}: {out}");
    }
    let id = r[0]["structured"]["shell_id"].as_str().unwrap().to_string();
    assert!(
        r[0]["structured"]["host"]
            .as_str()
            .unwrap()
            .starts_with("web"),
        "{out}"
    );
    assert_eq!(r[0]["structured"]["screen"]["rows"], 30, "{out}");
    assert_eq!(r[2]["structured"]["matched"], true, "the prompt: {out}");
    assert_eq!(r[4]["structured"]["matched"], true, "the answer: {out}");
    assert!(
        r[4]["structured"]["raw"]["text"]
            .as_str()
            .unwrap()
            .contains("hi sshmode"),
        "{out}"
    );
    assert_eq!(
        r[5]["structured"]["shells"][0]["shell_id"],
        id.as_str(),
        "{out}"
    );
    // Another token cannot read, type into, or close it, nor see it; a read-write token opens
    // none on a target.
    let other = client(json!({
        "url": url(&env),
        "token": theirs,
        "mode": "legacy",
        "steps": [
            {"tool": "shell_read", "args": {"shell_id": id}},
            {"tool": "shell_write", "args": {"shell_id": id, "data": "echo intruder\r"}},
            {"tool": "shell_close", "args": {"shell_id": id}},
            {"tool": "shell_list", "args": {}},
        ],
    }))
    .await;
    let o = &other["results"];
    for step in &o.as_array().unwrap()[..3] {
        assert_eq!(step["is_error"], true, "{other}");
        assert!(
            step["text"].as_str().unwrap().starts_with("shell closed"),
            "{other}"
        );
    }
    assert_eq!(o[3]["structured"]["shells"], json!([]), "{other}");
    let refused = client(json!({
        "url": url(&env), "token": limited, "mode": "legacy",
        "steps": [{"tool": "shell_open", "args": {"target": "web"}}],
    }))
    .await;
    let f = &refused["results"][0];
    assert_eq!(f["is_error"], true, "{refused}");
    assert!(
        f["text"].as_str().unwrap().contains("permission `full`"),
        "{refused}"
    );
    // Its own token closes it; then it is gone.
    let closed = client(json!({
        "url": url(&env),
        "token": mine,
        "mode": "legacy",
        "steps": [
            {"tool": "shell_read", "args": {"shell_id": id, "mode": "raw", "since": 0}},
            {"tool": "shell_close", "args": {"shell_id": id}},
            {"tool": "shell_list", "args": {}},
            {"tool": "shell_read", "args": {"shell_id": id}},
        ],
    }))
    .await;
    let c = &closed["results"];
    let seen = c[0]["structured"]["raw"]["text"].as_str().unwrap();
    assert!(!seen.contains("intruder"), "{closed}");
    assert_eq!(c[1]["is_error"], false, "{closed}");
    assert_eq!(c[2]["structured"]["shells"], json!([]), "{closed}");
    assert_eq!(c[3]["is_error"], true, "{closed}");
    assert!(
        c[3]["text"].as_str().unwrap().starts_with("shell closed"),
        "{closed}"
    );
    // Audited with the token's name as actor; the refusal too.
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, action, outcome FROM audit_log WHERE action LIKE 'shell.%' OR action = 'tool.refused' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    let rows: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            ("term", "shell.open", "ok"),
            ("term", "shell.input", "ok"),
            ("term", "shell.input", "ok"),
            ("rw", "tool.refused", "refused"),
            ("term", "shell.close", "ok"),
        ]
    );
}

#[tokio::test]
async fn both_protocol_eras_list_tools_run_commands_and_round_trip_files() {
    let env = mcp_env().await;
    let token = new_token(&env, "ide", &["web"]).await;
    for mode in ["legacy", "2026-07-28"] {
        let file = format!("mcp-notes/{}.txt", mode.replace('-', ""));
        let out = client(json!({
            "url": url(&env),
            "token": token,
            "mode": mode,
            "steps": [
                {"tool": "host_list", "args": {}},
                {"tool": "exec", "args": {"target": "web", "command": "echo out; echo err >&2; exit 3"}},
                {"tool": "write_file", "args": {"target": "web", "path": file, "content": "line one\nline two\n"}},
                {"tool": "read_file", "args": {"target": "web", "path": file}},
                {"tool": "exec", "args": {"target": "web", "command": "sleep 2.5; echo slept"}, "progress": true},
            ],
        }))
        .await;
        assert!(out.get("error").is_none(), "{mode}: {out}");
        assert_eq!(out["tools"], json!(TOOLS), "{mode}");
        let r = &out["results"];
        assert_eq!(
            r[0]["structured"]["hosts"][0]["target"], "web",
            "{mode}: {r}"
        );
        let ran = &r[1]["structured"];
        assert_eq!(r[1]["is_error"], false, "{mode}: {r}");
        assert_eq!(ran["exit_code"], 3, "{mode}: {ran}");
        assert_eq!(ran["stdout"], "out\n");
        assert_eq!(ran["stderr"], "err\n");
        assert!(ran["host"].as_str().unwrap().starts_with("web"), "{ran}");
        assert_eq!(r[2]["is_error"], false, "{mode}: {r}");
        assert_eq!(
            r[3]["structured"]["text"], "line one\nline two\n",
            "{mode}: {r}"
        );
        let slept = &r[4];
        assert_eq!(slept["structured"]["stdout"], "slept\n", "{mode}: {slept}");
        assert!(
            !slept["progress"].as_array().unwrap().is_empty(),
            "{mode}: no progress notification during a 2.5 s exec: {slept}"
        );
    }
    // Each command is audited with the token's name as actor, in the token's section.
    let rows: Vec<(String, String, Option<String>, String)> = sqlx::query_as(
        "SELECT actor, section, target, outcome FROM audit_log WHERE action = 'command.run' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(
        rows[0],
        (
            "ide".into(),
            "mcp:ide".into(),
            Some("web".into()),
            "exit 3".into()
        )
    );
}

#[tokio::test]
async fn a_token_limited_to_another_target_and_local_without_its_flag_are_refused() {
    let env = mcp_env().await;
    env.add_key_target("db").await;
    let token = new_token(&env, "dbonly", &["db"]).await;
    let out = client(json!({
        "url": url(&env),
        "token": token,
        "mode": "legacy",
        "steps": [
            {"tool": "host_list", "args": {}},
            {"tool": "exec", "args": {"target": "web", "command": "echo should-not-run"}},
            {"tool": "exec", "args": {"target": "local", "command": "true"}},
            {"tool": "exec", "args": {"target": "db", "command": "echo fine"}},
        ],
    }))
    .await;
    let r = &out["results"];
    assert_eq!(
        r[0]["structured"]["hosts"].as_array().unwrap().len(),
        1,
        "{out}"
    );
    assert_eq!(r[0]["structured"]["hosts"][0]["target"], "db");
    for refused in [&r[1], &r[2]] {
        assert_eq!(refused["is_error"], true, "{out}");
        assert!(
            refused["text"].as_str().unwrap().contains("may not use"),
            "{refused}"
        );
    }
    assert_eq!(r[3]["structured"]["stdout"], "fine\n", "{out}");
    let ran: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'command.run'")
            .fetch_one(&env.app.state.db)
            .await
            .unwrap();
    assert_eq!(ran, 1);
}

#[tokio::test]
async fn revoked_expired_missing_tokens_and_bad_origins_are_refused() {
    let env = mcp_env().await;
    let good = new_token(&env, "good", &["web"]).await;
    let revoked = new_token(&env, "gone", &["web"]).await;
    assert!(
        token::revoke(&env.app.state.db, "gone", "operator")
            .await
            .unwrap()
    );
    let expired = token::create(
        &env.app.state.db,
        &NewToken {
            name: "old".into(),
            targets: vec!["web".into()],
            all_targets: false,
            local: false,
            permission: Permission::ReadWrite,
            expires_at: Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
        },
        "operator",
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    for (what, token, origin, status) in [
        ("revoked", revoked.as_str(), None, 401),
        ("expired", expired.as_str(), None, 401),
        (
            "bad origin",
            good.as_str(),
            Some("http://evil.example"),
            403,
        ),
    ] {
        // The official client cannot connect…
        let out = client(json!({
            "url": url(&env), "token": token, "mode": "legacy", "origin": origin, "steps": [],
        }))
        .await;
        assert!(out["error"].is_string(), "{what}: {out}");
        // …because the endpoint answers its first request with this status.
        let mut req = http
            .post(url(&env))
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(token)
            .json(&initialize);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        assert_eq!(req.send().await.unwrap().status(), status, "{what}");
    }
    // A token revoked while its client is calling is refused within the bound its verified
    // row is reused for.
    let soon = new_token(&env, "soon-gone", &["web"]).await;
    // A GET without a session passes the gate and is then refused by the service (never 401).
    let probe = |token: String| {
        http.get(url(&env))
            .header("accept", "text/event-stream")
            .bearer_auth(token)
            .send()
    };
    assert_ne!(probe(soon.clone()).await.unwrap().status(), 401);
    assert!(
        token::revoke(&env.app.state.db, "soon-gone", "operator")
            .await
            .unwrap()
    );
    crate::helpers::eventually(
        "the revoked token refused",
        sshmode::mcp::fresh::FRESH + Duration::from_secs(3),
        async || probe(soon.clone()).await.unwrap().status() == 401,
    )
    .await;
    // The public listener (Lark's) has no `/mcp`, whatever the token.
    let public = http
        .post(env.app.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .bearer_auth(&good)
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(public.status(), 404);
    // A `Host` outside the allowed ones (DNS rebinding) is refused, even with a good token.
    let rebound = http
        .post(url(&env))
        .header("host", "attacker.example")
        .header("accept", "application/json, text/event-stream")
        .bearer_auth(&good)
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 403);
    // The good token works, in both eras.
    for mode in ["legacy", "2026-07-28"] {
        let out = client(json!({"url": url(&env), "token": good, "mode": mode, "steps": []})).await;
        assert!(out.get("error").is_none(), "{mode}: {out}");
    }
    // No token: refused from the head alone, whatever the body (it is never parsed).
    for auth in [
        None,
        Some("Bearer smcp_0000000000000000_".to_string() + &"0".repeat(64)),
    ] {
        let mut req = http
            .post(url(&env))
            .header("content-type", "application/json")
            .body("{not json");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        assert!(r.headers().get("www-authenticate").is_some());
    }
}

#[tokio::test]
async fn a_command_the_guard_asks_about_is_an_error_naming_the_approval() {
    let env = mcp_env().await;
    let token = new_token(&env, "careful", &["web"]).await;
    let out = client(json!({
        "url": url(&env),
        "token": token,
        "mode": "2026-07-28",
        "steps": [
            {"tool": "exec", "args": {"target": "web", "command": "systemctl stop sshmode-mcp-test"}},
        ],
    }))
    .await;
    let r = &out["results"][0];
    assert_eq!(r["is_error"], true, "{out}");
    assert!(
        r["text"].as_str().unwrap().starts_with("approval needed"),
        "{r}"
    );
    let refused: Vec<(String, Value)> = sqlx::query_as(
        "SELECT actor, detail FROM audit_log WHERE action = 'tool.refused' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, "careful");
    assert_eq!(refused[0].1["verdict"], "ask");
}

/// Runs the real `sshmode` binary: (exit code, stdout).
fn sshmode_bin(db_url: &str, data: &std::path::Path, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
        .args(args)
        .current_dir(data)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", db_url)
        .env("SSHMODE_DATA_DIR", data)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn the_token_commands_print_a_token_once_and_keep_only_its_hash() {
    let db = crate::helpers::fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let (code, out) = sshmode_bin(
        &db,
        data.path(),
        &[
            "mcp",
            "token",
            "create",
            "--name",
            "laptop",
            "--local",
            "--permission",
            "read",
            "--expires",
            "30d",
        ],
    );
    assert_eq!(code, 0, "{out}");
    let token = out.lines().next().unwrap().to_string();
    assert!(token.starts_with("smcp_"), "{out}");
    let (code, listed) = sshmode_bin(&db, data.path(), &["mcp", "token", "list"]);
    assert_eq!(code, 0);
    assert!(
        listed.contains("laptop") && listed.contains("local") && listed.contains("read"),
        "{listed}"
    );
    assert!(listed.contains("expires"), "{listed}");
    assert!(!listed.contains(&token));
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    let stored: String = sqlx::query_scalar("SELECT row_to_json(t)::text FROM mcp_tokens t")
        .fetch_one(&pool)
        .await
        .unwrap();
    let secret = token.rsplit('_').next().unwrap();
    assert!(
        !stored.contains(secret),
        "the token's secret is stored: {stored}"
    );
    // A second token of the same name is refused; revoking twice says there is none.
    let (code, _) = sshmode_bin(
        &db,
        data.path(),
        &["mcp", "token", "create", "--name", "laptop"],
    );
    assert_ne!(code, 0);
    assert_eq!(
        sshmode_bin(&db, data.path(), &["mcp", "token", "revoke", "laptop"]).0,
        0
    );
    assert_eq!(
        sshmode_bin(&db, data.path(), &["mcp", "token", "revoke", "laptop"]).0,
        1
    );
    let actions: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM audit_log WHERE action LIKE 'mcp.token.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(actions, ["mcp.token.create", "mcp.token.revoke"]);
}

#[tokio::test]
async fn a_result_holding_a_private_key_is_masked() {
    let env = mcp_env().await;
    let token = new_token(&env, "keys", &["web"]).await;
    let key = "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAA\\n-----END OPENSSH PRIVATE KEY-----\\n";
    let out = client(json!({
        "url": url(&env),
        "token": token,
        "mode": "legacy",
        "steps": [
            {"tool": "exec", "args": {"target": "web", "command": format!("printf '%b' '{key}' > leaked.pem; echo written")}},
            {"tool": "exec", "args": {"target": "web", "command": "cat leaked.pem"}},
            {"tool": "read_file", "args": {"target": "web", "path": "leaked.pem"}},
        ],
    }))
    .await;
    let r = &out["results"];
    assert_eq!(r[0]["structured"]["stdout"], "written\n", "{out}");
    assert_eq!(r[0]["structured"]["stderr"], "", "{out}");
    // The calls run; the key's body is masked in what comes back, with the same tag in both.
    let mut tags = Vec::new();
    for masked in [&r[1], &r[2]] {
        assert_eq!(masked["is_error"], false, "{out}");
        let whole = masked.to_string();
        assert!(!whole.contains("b3BlbnNzaC1rZXktdjEAAAAA"), "{whole}");
        let at = whole
            .find("[secret: private-key #")
            .unwrap_or_else(|| panic!("no mask: {whole}"));
        tags.push(whole[at..at + 27].to_string());
    }
    assert_eq!(tags[0], tags[1], "{out}");
}

#[tokio::test]
async fn a_cancelled_call_stops_its_command_in_both_eras() {
    let env = mcp_env().await;
    let token = new_token(&env, "impatient", &["web"]).await;
    for (n, mode) in ["legacy", "2026-07-28"].into_iter().enumerate() {
        let out = client(json!({
            "url": url(&env),
            "token": token,
            "mode": mode,
            "steps": [
                {"tool": "exec", "args": {"target": "web", "command": format!("sleep 20; echo {mode}")}, "cancel_after": 1.5},
            ],
        }))
        .await;
        assert_eq!(out["results"][0]["cancelled"], true, "{mode}: {out}");
        // The command was stopped (not left to run out its 20 s) and audited so.
        crate::helpers::eventually(
            &format!("{mode}: the cancelled command's audit row"),
            Duration::from_secs(10),
            async || {
                let outcomes: Vec<String> = sqlx::query_scalar(
                    "SELECT outcome FROM audit_log WHERE action = 'command.run' ORDER BY id",
                )
                .fetch_all(&env.app.state.db)
                .await
                .unwrap();
                outcomes.len() == n + 1 && outcomes[n] == "cancelled"
            },
        )
        .await;
    }
}

#[tokio::test]
async fn sessions_and_calls_running_at_once_are_bounded() {
    let env = exec_ssh::env_with(&[
        ("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3"),
        ("SSHMODE_MCP_LISTEN", "127.0.0.1:0"),
        ("SSHMODE_MCP_MAX_SESSIONS", "1"),
        ("SSHMODE_MCP_MAX_CALLS", "1"),
    ])
    .await
    .expect("sshd is needed for the MCP tests");
    env.add_key_target("web").await;
    let token = new_token(&env, "busy", &["web"]).await;
    // Past the session bound, a new session is refused until one closes.
    let http = reqwest::Client::new();
    let initialize = || {
        http.post(url(&env))
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(&token)
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}}),
            )
            .send()
    };
    let first = initialize().await.unwrap();
    assert_eq!(first.status(), 200);
    let session = first.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(initialize().await.unwrap().status(), 503);
    let closed = http
        .delete(url(&env))
        .bearer_auth(&token)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    // Past the call bound, a call is refused while another runs (the first runs until the test
    // removes its marker, at most 60 s).
    let marker = format!("/home/{}/mcp-busy-started", crate::sshd::USER);
    let _ = std::fs::remove_file(&marker);
    let long = tokio::spawn(client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28",
        "steps": [{"tool": "exec", "args": {"target": "web", "command": format!("touch {marker}; for i in $(seq 600); do [ -e {marker} ] || break; sleep 0.1; done")}}],
    })));
    crate::helpers::eventually(
        "the long call started",
        Duration::from_secs(30),
        async || std::path::Path::new(&marker).exists(),
    )
    .await;
    let out = client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28",
        "steps": [{"tool": "exec", "args": {"target": "web", "command": "true"}}],
    }))
    .await;
    let r = &out["results"][0];
    assert_eq!(r["is_error"], true, "{out}");
    assert!(
        r["text"].as_str().unwrap().contains("try again shortly"),
        "{r}"
    );
    std::fs::remove_file(&marker).unwrap();
    let long = long.await.unwrap();
    assert_eq!(long["results"][0]["structured"]["exit_code"], 0, "{long}");
}

/// The revision the Python client cannot be made to speak (it always asks for the latest
/// handshake, 2025-11-25, or the stateless 2026-07-28): 2025-03-26, the first Streamable HTTP
/// revision, which desktop clients still send — spoken by rmcp's own client.
#[tokio::test]
async fn rmcps_client_at_the_2025_03_26_revision_lists_tools_runs_and_round_trips() {
    use rmcp::ServiceExt;
    use rmcp::model::{
        CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
    };
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let env = mcp_env().await;
    let token = new_token(&env, "rusty", &["web"]).await;
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url(&env)).auth_header(token),
    );
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("sshmode-test", "1"),
    )
    .with_protocol_version(ProtocolVersion::V_2025_03_26);
    let client = info.serve(transport).await.expect("rmcp's client connects");
    assert_eq!(
        client
            .peer_info()
            .expect("the server answered initialize")
            .protocol_version,
        ProtocolVersion::V_2025_03_26
    );
    let mut tools: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    tools.sort();
    assert_eq!(tools, TOOLS);
    let call = |tool: &str, args: Value| {
        CallToolRequestParams::new(tool.to_string())
            .with_arguments(args.as_object().unwrap().clone())
    };
    let ran = client
        .call_tool(call(
            "exec",
            json!({"target": "web", "command": "echo rust; exit 4"}),
        ))
        .await
        .unwrap();
    let ran = ran.structured_content.expect("a structured result");
    assert_eq!(ran["exit_code"], 4, "{ran}");
    assert_eq!(ran["stdout"], "rust\n", "{ran}");
    let wrote = client
        .call_tool(call(
            "write_file",
            json!({"target": "web", "path": "rmcp/round.txt", "content": "über\ntrip\n"}),
        ))
        .await
        .unwrap();
    assert_ne!(wrote.is_error, Some(true), "{wrote:?}");
    let read = client
        .call_tool(call(
            "read_file",
            json!({"target": "web", "path": "rmcp/round.txt"}),
        ))
        .await
        .unwrap();
    let read = read.structured_content.expect("a structured result");
    assert_eq!(read["text"], "über\ntrip\n", "{read}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn no_shell_opens_on_a_target_whose_policy_refuses_risky_commands() {
    let env = mcp_env().await;
    web_max_full(&env, Some(sshmode::config::Risky::Refuse)).await;
    let token = token_at(&env, "strict", &["web"], Permission::Full).await;
    let out = client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28",
        "steps": [
            {"tool": "shell_open", "args": {"target": "web"}},
            {"tool": "shell_list", "args": {}},
        ],
    }))
    .await;
    let r = &out["results"];
    assert_eq!(r[0]["is_error"], true, "{out}");
    assert!(
        r[0]["text"]
            .as_str()
            .unwrap()
            .contains("interactive shells are disabled on `web`"),
        "{out}"
    );
    assert_eq!(r[1]["structured"]["shells"], json!([]), "{out}");
    let refused: Vec<String> = sqlx::query_scalar(
        "SELECT actor FROM audit_log WHERE action = 'tool.refused' AND detail->>'tool' = 'shell_open'",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(refused, ["strict"]);
}

/// A line typed into a shell is judged as `exec` judges a command: one the guard refuses is
/// never sent, one it asks about needs an approval unless the target's policy allows such
/// commands — and where it does, `exec` runs them too.
#[tokio::test]
async fn shell_lines_are_judged_and_a_policy_that_allows_lets_asked_commands_run() {
    let env = mcp_env().await;
    web_max_full(&env, None).await;
    let token = token_at(&env, "typist", &["web"], Permission::Full).await;
    let piped = "curl -s http://127.0.0.1:9/x | sh; echo piped-$((6*7))";
    let steps = |read_for: &str| {
        json!([
            {"tool": "shell_open", "args": {"target": "web"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "echo refused-$((6*7)); mkfs.ext4 /dev/sdz\r"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": format!("{piped}\r")}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "echo fine-$((6*7))\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "raw", "since": 0, "wait_ms": 10000, "expect": read_for}},
            {"tool": "exec", "args": {"target": "web", "command": piped}},
        ])
    };
    let out = client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28", "steps": steps("fine-42"),
    }))
    .await;
    let r = &out["results"];
    let text = |i: usize| r[i]["text"].as_str().unwrap_or_default().to_string();
    assert_eq!(r[1]["is_error"], true, "{out}");
    assert!(text(1).starts_with("nothing was sent"), "{out}");
    assert!(text(1).contains("erase a filesystem"), "{out}");
    assert_eq!(r[2]["is_error"], true, "{out}");
    assert!(text(2).contains("approval needed"), "{out}");
    assert_eq!(r[3]["is_error"], false, "{out}");
    let raw = r[4]["structured"]["raw"]["text"].as_str().unwrap();
    assert!(raw.contains("fine-42"), "{out}");
    assert!(
        !raw.contains("refused-42") && !raw.contains("piped-42"),
        "{out}"
    );
    assert!(text(5).starts_with("approval needed"), "{out}");
    let refused: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'tool' FROM audit_log WHERE action = 'tool.refused' AND actor = 'typist' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(refused, ["shell_write", "shell_write", "exec"]);

    // Where the policy allows what the guard asks about, the asked line and command run; the
    // refused line still never does.
    web_max_full(&env, Some(sshmode::config::Risky::Allow)).await;
    let out = client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28", "steps": steps("piped-42[\\s\\S]*fine-42"),
    }))
    .await;
    let r = &out["results"];
    assert!(
        r[1]["text"]
            .as_str()
            .unwrap()
            .starts_with("nothing was sent"),
        "{out}"
    );
    assert_eq!(r[2]["is_error"], false, "{out}");
    assert_eq!(r[4]["structured"]["matched"], true, "{out}");
    assert!(
        !r[4]["structured"]["raw"]["text"]
            .as_str()
            .unwrap()
            .contains("refused-42"),
        "{out}"
    );
    assert_eq!(r[5]["is_error"], false, "{out}");
    assert_eq!(r[5]["structured"]["exit_code"], 0, "{out}");
    assert!(
        r[5]["structured"]["stdout"]
            .as_str()
            .unwrap()
            .contains("piped-42"),
        "{out}"
    );
}

/// `exec`'s `env` runs no code below `full`: `LD_PRELOAD` naming a library in the target
/// user's home loads it into `ls` with a `full` token (the control); with a `read` or a
/// `read-write` token it is refused before anything runs, naming the variable, and audited
/// with the token as actor; an inert variable still passes.
#[tokio::test]
async fn exec_env_runs_no_code_below_full() {
    let env = mcp_env().await;
    web_max_full(&env, None).await;
    let dir = std::path::Path::new("/home")
        .join(crate::sshd::USER)
        .join(crate::agent::unique("mcp_env"));
    std::fs::create_dir_all(&dir).unwrap();
    let chown = std::process::Command::new("chown")
        .arg(crate::sshd::USER)
        .arg(&dir)
        .status()
        .unwrap();
    assert!(chown.success());
    let marker = dir.join("constructor-ran");
    let library = crate::workspaces::constructor_library(&dir, &marker, crate::sshd::USER);
    let ls = format!("ls {}", dir.display());
    let preload = json!({"target": "web", "command": ls, "env": {"LD_PRELOAD": library.display().to_string()}});

    let full = token_at(&env, "envfull", &["web"], Permission::Full).await;
    let out = client(json!({
        "url": url(&env), "token": full, "mode": "legacy",
        "steps": [{"tool": "exec", "args": preload}],
    }))
    .await;
    assert_eq!(out["results"][0]["structured"]["exit_code"], 0, "{out}");
    assert!(
        marker.exists(),
        "the constructor ran at full, so this test can fail: {out}"
    );
    std::fs::remove_file(&marker).unwrap();

    for (name, permission) in [
        ("envread", Permission::Read),
        ("envrw", Permission::ReadWrite),
    ] {
        let token = token_at(&env, name, &["web"], permission).await;
        let out = client(json!({
            "url": url(&env), "token": token, "mode": "2026-07-28",
            "steps": [
                {"tool": "exec", "args": preload},
                {"tool": "exec", "args": {"target": "web", "command": ls, "env": {"LC_ALL": "C", "TZ": "UTC"}}},
            ],
        }))
        .await;
        let r = &out["results"];
        assert_eq!(r[0]["is_error"], true, "{name}: {out}");
        let text = r[0]["text"].as_str().unwrap();
        assert!(
            text.contains("LD_PRELOAD")
                && text.contains(&format!("`{permission}`"))
                && text.contains("LC_*"),
            "{name}: {text}"
        );
        assert_eq!(r[1]["structured"]["exit_code"], 0, "{name}: {out}");
        assert!(
            r[1]["structured"]["stdout"]
                .as_str()
                .unwrap()
                .contains("libctor.so"),
            "{name}: {out}"
        );
        assert!(
            !marker.exists(),
            "the constructor ran with the {name} token: {out}"
        );
    }
    let refused: Vec<(String, Value)> = sqlx::query_as(
        "SELECT actor, detail FROM audit_log WHERE action = 'tool.refused' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    let refused: Vec<(&str, &str, &str)> = refused
        .iter()
        .map(|(actor, d)| {
            (
                actor.as_str(),
                d["tool"].as_str().unwrap(),
                d["by"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        refused,
        [
            ("envread", "exec", "permission"),
            ("envrw", "exec", "permission")
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The steps' results of a client run, each asserted to be no error.
fn all_ok(out: &Value) -> &Vec<Value> {
    assert!(out.get("error").is_none(), "{out}");
    let r = out["results"].as_array().unwrap();
    for (i, step) in r.iter().enumerate() {
        assert_eq!(step["is_error"], false, "step {i}: {out}");
    }
    r
}

/// Whether a test sshd user's process matches `pattern` (the target runs on this machine).
async fn running_on_web(env: &Env, pattern: &str) -> bool {
    crate::agent::remote_pgrep(&env.app, pattern).await
}

/// A token revoked by the CLI (another process than the one holding its shells) has its shells
/// closed by the serving process, audited; a token given the same name afterwards never sees
/// them, not even before they are closed.
#[tokio::test]
async fn a_revoked_tokens_shells_close_and_a_new_token_of_its_name_sees_none() {
    let env = mcp_env().await;
    web_max_full(&env, None).await;
    let old = token_at(&env, "laptop", &["web"], Permission::Full).await;
    let secs = 4000 + crate::agent::rand_u16() as u32;
    let out = client(json!({
        "url": url(&env), "token": old, "mode": "2026-07-28",
        "steps": [
            {"tool": "shell_open", "args": {"target": "web"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": format!("sleep {secs}\r")}},
        ],
    }))
    .await;
    let id = all_ok(&out)[0]["structured"]["shell_id"]
        .as_str()
        .unwrap()
        .to_string();
    let pattern = format!("sleep {secs}");
    crate::helpers::eventually("the sleep", Duration::from_secs(10), async || {
        running_on_web(&env, &pattern).await
    })
    .await;

    let mut said = Vec::new();
    let revoke = sshmode::mcp::cli::McpCmd::Token(sshmode::mcp::cli::TokenCmd::Revoke {
        name: "laptop".into(),
    });
    let code = sshmode::mcp::cli::run_with(revoke, &env.app.state.db, "cli:tester", &mut said)
        .await
        .unwrap();
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&said));
    let new = token_at(&env, "laptop", &["web"], Permission::Full).await;
    let seen = client(json!({
        "url": url(&env), "token": new, "mode": "2026-07-28",
        "steps": [
            {"tool": "shell_list", "args": {}},
            {"tool": "shell_read", "args": {"shell_id": id}},
            {"tool": "shell_write", "args": {"shell_id": id, "data": "echo inherited\r"}},
            {"tool": "shell_close", "args": {"shell_id": id}},
        ],
    }))
    .await;
    let r = &seen["results"];
    assert_eq!(r[0]["structured"]["shells"], json!([]), "{seen}");
    for step in &r.as_array().unwrap()[1..] {
        assert_eq!(step["is_error"], true, "{seen}");
        assert!(
            step["text"].as_str().unwrap().starts_with("shell closed"),
            "{seen}"
        );
    }
    // The old token's shell is closed (its program gets a hangup), without any call of it.
    crate::helpers::eventually(
        "the revoked token's shell closed",
        sshmode::mcp::fresh::FRESH + Duration::from_secs(15),
        async || !running_on_web(&env, &pattern).await,
    )
    .await;
    let closed: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT actor, detail->>'shell_id', detail->>'token' FROM audit_log
         WHERE action = 'shell.close' AND section = 'mcp:laptop' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(closed, [("system".into(), id.clone(), "laptop".into())]);
}

/// `sshmode target disable` stops the next write to, read of, and look at an open shell, as it
/// stops the next command (audited); approved again, the shell is usable again.
#[tokio::test]
async fn a_target_disabled_stops_the_next_shell_write_and_read() {
    let env = mcp_env().await;
    web_max_full(&env, None).await;
    let token = token_at(&env, "ops", &["web"], Permission::Full).await;
    let out = client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28",
        "steps": [
            {"tool": "shell_open", "args": {"target": "web"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "echo one-$((6*7))\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "raw", "wait_ms": 10000, "expect": "one-42"}},
        ],
    }))
    .await;
    let r = all_ok(&out);
    let id = r[0]["structured"]["shell_id"].as_str().unwrap().to_string();
    assert_eq!(r[2]["structured"]["matched"], true, "{out}");

    exec_ssh::cli_ok(
        &env.app,
        TargetCmd::Disable {
            alias: "web".into(),
        },
    )
    .await;
    let after = client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28",
        "steps": [
            {"tool": "shell_write", "args": {"shell_id": id, "data": "echo two-$((6*7))\r"}},
            {"tool": "shell_read", "args": {"shell_id": id, "mode": "raw", "since": 0}},
            {"tool": "shell_list", "args": {}},
        ],
    }))
    .await;
    let r = &after["results"];
    for step in [&r[0], &r[1]] {
        assert_eq!(step["is_error"], true, "{after}");
        assert!(
            step["text"].as_str().unwrap().contains("`web` is disabled"),
            "{after}"
        );
    }
    let listed = &r[2]["structured"]["shells"][0];
    assert_eq!(listed["shell_id"], id.as_str(), "{after}");
    assert!(listed.get("prompt").is_none(), "{after}");
    assert!(
        listed["refused"].as_str().unwrap().contains("disabled"),
        "{after}"
    );
    let refused: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'tool' FROM audit_log
         WHERE action = 'tool.refused' AND actor = 'ops' AND detail->>'by' = 'target' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(refused, ["shell_write", "shell_read", "shell_list"]);

    exec_ssh::cli_ok(
        &env.app,
        TargetCmd::Approve {
            alias: "web".into(),
        },
    )
    .await;
    let again = client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28",
        "steps": [
            {"tool": "shell_write", "args": {"shell_id": id, "data": "echo three-$((6*7))\r"}},
            {"tool": "shell_read", "args": {"shell_id": id, "mode": "raw", "since": 0, "wait_ms": 10000, "expect": "three-42"}},
        ],
    }))
    .await;
    let r = all_ok(&again);
    let raw = r[1]["structured"]["raw"]["text"].as_str().unwrap();
    assert!(
        raw.contains("three-42") && !raw.contains("two-42"),
        "{again}"
    );
}

/// A target behind a jump host is the token's only where the jump host is too: a token
/// limited to the target alone is refused there (audited), whatever the tool; one that may use
/// both reaches it through the jump host.
#[tokio::test]
async fn a_token_reaches_a_target_only_through_jump_hosts_it_may_use() {
    let env = mcp_env().await;
    web_max_full(&env, None).await;
    // `inner` is the same sshd, reached through `web`.
    let key = env.key("inner_key", "ed25519", "");
    let mut a = exec_ssh::add_args("inner", env.sshd.port);
    a.key = Some(key);
    a.jump = Some("web".into());
    exec_ssh::cli_ok(&env.app, TargetCmd::Add(a)).await;
    let narrow = token_at(&env, "narrow", &["inner"], Permission::Full).await;
    let wide = new_token(&env, "wide", &["inner", "web"]).await;
    let out = client(json!({
        "url": url(&env), "token": narrow, "mode": "2026-07-28",
        "steps": [
            {"tool": "host_list", "args": {}},
            {"tool": "exec", "args": {"target": "inner", "command": "echo should-not-run"}},
            {"tool": "read_file", "args": {"target": "inner", "path": "/etc/hostname"}},
            {"tool": "shell_open", "args": {"target": "inner"}},
        ],
    }))
    .await;
    let r = &out["results"];
    assert_eq!(
        r[0]["structured"]["hosts"],
        json!([{"target": "inner", "location": format!("inner · {}@127.0.0.1:{} via web", crate::sshd::USER, env.sshd.port), "description": "test target", "usable": false}]),
        "{out}"
    );
    for step in &r.as_array().unwrap()[1..] {
        assert_eq!(step["is_error"], true, "{out}");
        assert!(
            step["text"].as_str().unwrap().contains(
                "reached through the jump host `web`, which the token `narrow` may not use"
            ),
            "{out}"
        );
    }
    let refused: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'tool' FROM audit_log
         WHERE action = 'tool.refused' AND actor = 'narrow' AND target = 'inner' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(refused, ["terminal", "read_file", "shell_open"]);
    let ran: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'command.run'")
            .fetch_one(&env.app.state.db)
            .await
            .unwrap();
    assert_eq!(ran, 0);

    let out = client(json!({
        "url": url(&env), "token": wide, "mode": "2026-07-28",
        "steps": [
            {"tool": "host_list", "args": {}},
            {"tool": "exec", "args": {"target": "inner", "command": "echo through-$((6*7))"}},
        ],
    }))
    .await;
    let r = all_ok(&out);
    let hosts = r[0]["structured"]["hosts"].as_array().unwrap();
    assert!(hosts.iter().all(|h| h["usable"] == true), "{out}");
    assert_eq!(r[1]["structured"]["stdout"], "through-42\n", "{out}");
}

/// One token at its own bounds — the sessions it may hold, the calls it may run at once —
/// is refused with a sentence naming it, while another token still opens sessions and runs
/// calls; a session belongs to the token that opened it.
#[tokio::test]
async fn one_token_at_its_session_and_call_bounds_does_not_block_another() {
    let env = exec_ssh::env_with(&[
        ("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3"),
        ("SSHMODE_MCP_LISTEN", "127.0.0.1:0"),
        ("SSHMODE_MCP_MAX_SESSIONS", "8"),
        ("SSHMODE_MCP_MAX_CALLS", "8"),
        ("SSHMODE_MCP_MAX_SESSIONS_PER_TOKEN", "1"),
        ("SSHMODE_MCP_MAX_CALLS_PER_TOKEN", "1"),
    ])
    .await
    .expect("sshd is needed for the MCP tests");
    env.add_key_target("web").await;
    let hog = new_token(&env, "hog", &["web"]).await;
    let other = new_token(&env, "other", &["web"]).await;
    let http = reqwest::Client::new();
    let initialize = |token: &str| {
        http.post(url(&env))
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(token)
            .json(
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}}),
            )
            .send()
    };
    let first = initialize(&hog).await.unwrap();
    assert_eq!(first.status(), 200);
    let session = first.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let refused = initialize(&hog).await.unwrap();
    assert_eq!(refused.status(), 503);
    let why = refused.text().await.unwrap();
    assert!(
        why.contains("the token `hog` holds 1 MCP sessions already"),
        "{why}"
    );
    assert_eq!(initialize(&other).await.unwrap().status(), 200);
    // Another token cannot use, nor close, the hog's session.
    let closed_by_other = http
        .delete(url(&env))
        .bearer_auth(&other)
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(closed_by_other.status(), 404);
    assert_eq!(initialize(&hog).await.unwrap().status(), 503);

    // The hog's one call runs (until the test removes its marker, at most 60 s): its next is
    // refused, another token's runs.
    let marker = format!("/home/{}/mcp-hog-started", crate::sshd::USER);
    let _ = std::fs::remove_file(&marker);
    let long = tokio::spawn(client(json!({
        "url": url(&env), "token": hog, "mode": "2026-07-28",
        "steps": [{"tool": "exec", "args": {"target": "web", "command": format!("touch {marker}; for i in $(seq 600); do [ -e {marker} ] || break; sleep 0.1; done")}}],
    })));
    crate::helpers::eventually(
        "the long call started",
        Duration::from_secs(30),
        async || std::path::Path::new(&marker).exists(),
    )
    .await;
    let busy = client(json!({
        "url": url(&env), "token": hog, "mode": "2026-07-28",
        "steps": [{"tool": "exec", "args": {"target": "web", "command": "true"}}],
    }))
    .await;
    let r = &busy["results"][0];
    assert_eq!(r["is_error"], true, "{busy}");
    assert!(
        r["text"]
            .as_str()
            .unwrap()
            .contains("the token `hog` is running 1 MCP calls already"),
        "{busy}"
    );
    let free = client(json!({
        "url": url(&env), "token": other, "mode": "2026-07-28",
        "steps": [{"tool": "exec", "args": {"target": "web", "command": "echo free"}}],
    }))
    .await;
    assert_eq!(all_ok(&free)[0]["structured"]["stdout"], "free\n", "{free}");
    std::fs::remove_file(&marker).unwrap();
    let long = long.await.unwrap();
    assert_eq!(long["results"][0]["structured"]["exit_code"], 0, "{long}");
}

async fn local_token(env: &Env, name: &str, permission: Permission) -> String {
    token::create(
        &env.app.state.db,
        &NewToken {
            name: name.into(),
            targets: Vec::new(),
            all_targets: false,
            local: true,
            permission,
            expires_at: None,
        },
        "operator",
    )
    .await
    .unwrap()
}

/// What is typed with echo off is audited hidden; the screen's state lets no line past the
/// guard; a relative path is judged in the shell's directory.
#[tokio::test]
async fn shell_lines_are_judged_by_the_terminal_not_the_screen_and_hidden_input_is_not_recorded() {
    let env = mcp_env().await;
    web_max_full(&env, None).await;
    let token = token_at(&env, "keys", &["web"], Permission::Full).await;
    let out = client(json!({
        "url": url(&env), "token": token, "mode": "2026-07-28",
        "steps": [
            {"tool": "shell_open", "args": {"target": "web"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "read -rs -p 'Token: ' t; echo \"got-${#t}-chars\"\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "raw", "wait_ms": 10000, "expect": "Token: $"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "s3cret-tok3n-42\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "raw", "wait_ms": 10000, "expect": "got-15-chars"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "printf '\\033[?1049h'\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "screen", "wait_ms": 1000}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "false && mkfs.ext4 /dev/sdz; echo bypassed-$((6*7))\r"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "cd /\r"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "false && rm -rf *; echo deleted-$((6*7))\r"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "echo \"done in $PWD\"\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "raw", "since": 0, "wait_ms": 10000, "expect": "done in /"}},
        ],
    }))
    .await;
    assert!(out.get("error").is_none(), "{out}");
    let r = &out["results"];
    let text = |i: usize| r[i]["text"].as_str().unwrap_or_default().to_string();
    for i in [1, 3, 5, 8, 10] {
        assert_eq!(r[i]["is_error"], false, "step {i}: {out}");
    }
    assert_eq!(r[4]["structured"]["matched"], true, "{out}");
    assert_eq!(r[6]["structured"]["screen"]["alternate"], true, "{out}");
    assert_eq!(r[7]["is_error"], true, "{out}");
    assert!(
        text(7).starts_with("nothing was sent") && text(7).contains("erase a filesystem"),
        "{out}"
    );
    assert_eq!(r[9]["is_error"], true, "{out}");
    assert!(text(9).contains("everything under /"), "{out}");
    let raw = r[11]["structured"]["raw"]["text"].as_str().unwrap();
    assert!(
        !raw.contains("bypassed-42") && !raw.contains("deleted-42"),
        "{out}"
    );
    let typed: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'text' FROM audit_log WHERE action = 'shell.input' AND actor = 'keys' ORDER BY id",
    )
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(typed.len(), 5, "{typed:?}");
    assert_eq!(typed[1], "[input hidden]", "{typed:?}");
    assert_eq!(
        crate::helpers::audit_rows_mentioning(&env.app.state.db, "s3cret-tok3n").await,
        0,
        "the hidden line is in the audit trail"
    );
}

/// A local shell takes only the lines the token's permission allows: at `read` no
/// interpreter; below `full` a program that runs what is typed into it needs an approval.
#[tokio::test]
async fn a_local_shell_is_held_to_the_tokens_permission() {
    let env = mcp_env().await;
    let reader = local_token(&env, "reader", Permission::Read).await;
    let writer = local_token(&env, "writer", Permission::ReadWrite).await;
    let steps = |line: &str| {
        json!([
            {"tool": "shell_open", "args": {"target": "local"}},
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": format!("{line}\r")}},
            // What `read` allows too, echoing nothing it prints.
            {"tool": "shell_write", "args": {"shell_id": "{{0.shell_id}}", "data": "printf 'fine-%s\\n' 42\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{0.shell_id}}", "mode": "raw", "since": 0, "wait_ms": 10000, "expect": "fine-42"}},
        ])
    };
    for (token, line, why) in [
        (
            &reader,
            "python3 -c 'print(6*7, \"ran\")'",
            "permission `read`",
        ),
        (&writer, "less /etc/hostname", "approval needed"),
    ] {
        let out = client(json!({
            "url": url(&env), "token": token, "mode": "2026-07-28", "steps": steps(line),
        }))
        .await;
        let r = &out["results"];
        assert_eq!(r[0]["is_error"], false, "{out}");
        assert_eq!(r[1]["is_error"], true, "{out}");
        let text = r[1]["text"].as_str().unwrap();
        assert!(
            text.starts_with("nothing was sent") && text.contains(why),
            "{out}"
        );
        assert_eq!(r[3]["structured"]["matched"], true, "{out}");
        assert!(
            !r[3]["structured"]["raw"]["text"]
                .as_str()
                .unwrap()
                .contains("42 ran"),
            "{out}"
        );
    }
}
