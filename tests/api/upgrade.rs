//! A rolling upgrade: the previous version's binary (built from [`PREVIOUS`] by
//! scripts/test.sh into a cached directory of its own, passed as `SSHMODE_TEST_PREVIOUS_BIN`)
//! serves a database; this version joins on the same database, migrating it further while the
//! previous one keeps running on it; the previous one is stopped with a turn in flight, and
//! this version resumes the turn, which it did not start, and answers it once.

use std::time::Duration;

use serde_json::json;

use crate::agent::{MODEL, call, replies_to, say, wait_turns_ended};
use crate::fake_lark::FakeLark;
use crate::fake_llm::FakeProvider;
use crate::helpers::{eventually, fresh_database};
use crate::lark_support::{ENCRYPT_KEY, Msg, TOKEN, sealed_now};

/// The previous version: the commit rolling upgrades start from.
const PREVIOUS: &str = "c441a53c0c253477f4b828321e02c6262b6017ba";

/// The previous version's binary. Required: without it this test fails, never skips.
fn previous_binary() -> String {
    let bin = std::env::var("SSHMODE_TEST_PREVIOUS_BIN").unwrap_or_else(|_| {
        panic!(
            "SSHMODE_TEST_PREVIOUS_BIN is not set: scripts/test.sh builds the previous version \
             ({PREVIOUS}) and sets it"
        )
    });
    assert!(
        bin.ends_with(&format!("sshmode-{PREVIOUS}")) && std::path::Path::new(&bin).is_file(),
        "SSHMODE_TEST_PREVIOUS_BIN={bin} is not the build of {PREVIOUS}"
    );
    bin
}

#[tokio::test]
async fn a_rolling_upgrade_keeps_a_turn_in_flight() {
    sshmode::install_crypto_provider();
    let previous = previous_binary();
    let lark = FakeLark::start().await;
    let llm = FakeProvider::start().await;
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let go = data.path().join("go");
    let port = crate::sshd::free_port();
    // The previous version migrates the fresh database to its schema and serves it.
    let mut old = crate::helpers::serve_child(
        &[&previous, "serve"],
        &previous,
        &db,
        data.path(),
        port,
        &[
            ("SSHMODE_TURN_LEASE_SECS", "3"),
            ("SSHMODE_INBOX_LEASE_SECS", "3"),
            ("SSHMODE_PROGRESS", "false"),
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
    let base = format!("http://127.0.0.1:{port}");
    let ready = async || matches!(http.get(format!("{base}/readyz")).send().await, Ok(r) if r.status() == 200);
    eventually(
        "the previous version to be ready",
        Duration::from_secs(60),
        ready,
    )
    .await;

    // A turn starts on the previous version and waits in a command.
    llm.push(
        MODEL,
        call(
            "terminal",
            json!({"command": format!("while [ ! -f {} ]; do sleep 0.05; done", go.display())}),
        ),
    )
    .push(MODEL, say("finished across the upgrade"));
    let m = Msg::new("ev_up1", "wait for it");
    let req = sealed_now(&m.envelope(TOKEN));
    let mut b = http
        .post(format!("{base}/lark/events"))
        .header("content-type", "application/json")
        .body(req.body);
    for (k, v) in req.headers {
        b = b.header(k, v);
    }
    assert_eq!(b.send().await.unwrap().status(), 200);
    let pool = sqlx::PgPool::connect(&db).await.unwrap();
    eventually("the turn's command to start", Duration::from_secs(30), async || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM agent_messages WHERE section_id = 'oc_chat' AND kind = 'tool_started'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            > 0
    })
    .await;

    // This version joins, migrating the database further; the previous one keeps serving.
    let new = crate::lark_support::app_with(&lark)
        .var("LLM_BASE_URL", &llm.base)
        .var("LLM_MODEL", MODEL)
        .var("SSHMODE_PROGRESS", "false")
        .var("SSHMODE_TURN_LEASE_SECS", "3")
        .database(&db)
        .spawn()
        .await;
    assert!(
        ready().await,
        "the previous version is ready on the new schema"
    );
    assert!(sshmode::store::is_ready(&new.state.db).await);
    // Both write their heartbeats on the new schema: the previous version's without the
    // version column it does not know (a heartbeat renewed after this version migrated), and
    // this version's with it.
    let joined: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&pool)
        .await
        .unwrap();
    eventually(
        "both versions' heartbeats",
        Duration::from_secs(30),
        async || {
            let rows: Vec<Option<String>> = sqlx::query_scalar(
                "SELECT version FROM replicas WHERE seen_at > $1 ORDER BY version NULLS FIRST",
            )
            .bind(joined)
            .fetch_all(&pool)
            .await
            .unwrap();
            rows == vec![None, Some(sshmode::store::replicas::version())]
        },
    )
    .await;

    // The previous version is stopped (SIGTERM) with its turn in flight.
    let pid = old.id().expect("the previous version runs") as i32;
    // SAFETY: signalling a child this test spawned.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(60), old.wait())
        .await
        .expect("the previous version stops after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");

    // This version resumes the turn and answers it, once.
    assert_eq!(wait_turns_ended(&new, "oc_chat", 1).await, vec!["done"]);
    assert_eq!(
        replies_to(&lark, "om_ev_up1"),
        vec![(false, "finished across the upgrade".to_string())]
    );
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM turns WHERE section_id = 'oc_chat'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(attempts >= 2, "resumed by this version: {attempts}");
    new.stop().await;
}
