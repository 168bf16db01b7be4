//! The HTTP server's bounds as a client meets them: `serve` refuses to run unsigned unless
//! told to; slow senders (that reconnect) cannot starve real deliveries; a request head that
//! never ends is cut off; past the connection bound new connections wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sshmode::metrics::ReasonLabel;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, eventually};
use crate::lark_support::*;

/// Runs `sshmode serve` with only the given variables (and PATH), in an empty directory.
fn serve_command(dir: &std::path::Path, vars: &[(&str, &str)]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sshmode"));
    cmd.arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SSHMODE_DATA_DIR", dir)
        .env("SSHMODE_LISTEN", "127.0.0.1:0")
        .env("LARK_APP_ID", "cli_test_app")
        .env("LARK_APP_SECRET", "test-app-secret")
        .env("LARK_VERIFICATION_TOKEN", TOKEN)
        .current_dir(dir)
        .kill_on_drop(true);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd
}

#[tokio::test]
async fn serve_refuses_to_start_without_an_encrypt_key() {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        serve_command(dir.path(), &[]).output(),
    )
    .await
    .expect("serve should stop at once")
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for part in [
        "LARK_ENCRYPT_KEY",
        "Encrypt Key",
        "forge",
        "SSHMODE_ALLOW_UNSIGNED_EVENTS=true",
    ] {
        assert!(err.contains(part), "{part} missing from: {err}");
    }
    // It stopped before touching anything: no embedded cluster was created.
    assert!(!dir.path().join("pg").exists());
}

#[tokio::test]
async fn serve_with_the_opt_out_warns_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::helpers::fresh_database().await;
    let mut child = serve_command(
        dir.path(),
        &[
            ("SSHMODE_ALLOW_UNSIGNED_EVENTS", "true"),
            ("DATABASE_URL", &db),
            ("SSHMODE_WORKERS_ENABLED", "false"),
            ("RUST_LOG", "info"),
            ("SSHMODE_LOG_FORMAT", "json"),
        ],
    )
    .stderr(std::process::Stdio::piped())
    .stdout(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stderr);
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        loop {
            line.clear();
            if lines.read_line(&mut line).await.unwrap() == 0 {
                return None;
            }
            if line.contains("SSHMODE_ALLOW_UNSIGNED_EVENTS") {
                return Some(line.clone());
            }
        }
    })
    .await
    .expect("no warning within the deadline")
    .expect("serve ended without the warning");
    let v: serde_json::Value = serde_json::from_str(&found).unwrap();
    assert_eq!(v["level"], "WARN", "{found}");
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

#[tokio::test]
async fn without_a_key_or_the_opt_out_every_callback_is_refused() {
    let app = TestApp::builder()
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .spawn()
        .await;
    let challenge = serde_json::json!({"challenge":"c","token":TOKEN,"type":"url_verification"});
    let event = Msg::new("ev_unsigned", "/help").envelope(TOKEN);
    for v in [challenge, event] {
        assert_eq!(post(&app, plain(&v)).await.0, 401);
    }
    assert!(inbox(&app).await.is_empty());
    let m = app.metrics().await;
    assert!(
        m.contains("sshmode_events_rejected_total{reason=\"unsigned\"} 2"),
        "{m}"
    );
    app.stop().await;
}

/// How many callback bodies timed out so far.
fn body_timeouts(app: &TestApp) -> u64 {
    app.state
        .metrics
        .events_rejected
        .get_or_create(&ReasonLabel {
            reason: "body_timeout".into(),
        })
        .get()
}

/// One slow sender: sends a head and the start of a body, then nothing; when the server
/// gives up on it, it connects again, until `stop`.
async fn slow_sender(addr: std::net::SocketAddr, stop: Arc<AtomicBool>) {
    let head = "POST /lark/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Content-Length: 2000\r\n\r\n{\"encrypt\":\"";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if s.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        // Hold on until the server answers or closes (bounded, in case it never does).
        let mut buf = [0u8; 512];
        let _ = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }
}

#[tokio::test]
async fn slow_senders_that_reconnect_do_not_starve_real_deliveries() {
    let app = TestApp::builder()
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .var("LARK_ENCRYPT_KEY", ENCRYPT_KEY)
        .var("SSHMODE_HTTP_BODY_TIMEOUT_SECS", "1")
        .spawn()
        .await;
    // More slow senders than there are admissions.
    let senders = sshmode::inbox::ADMITTED_MAX + 88;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..senders)
        .map(|_| tokio::spawn(slow_sender(app.addr, stop.clone())))
        .collect();
    // Every sender has been cut off once and is back, holding a connection again.
    eventually(
        &format!("{senders} slow bodies to time out"),
        Duration::from_secs(60),
        || async { body_timeouts(&app) >= senders as u64 },
    )
    .await;
    // Real deliveries arrive meanwhile, all at once: every one is recorded.
    let deliveries: Vec<_> = (0..20)
        .map(|i| {
            let env = Msg::new(&format!("ev_real{i}"), "/help").envelope(TOKEN);
            let req = sealed(&env, ENCRYPT_KEY, now_secs());
            let (http, url) = (app.http.clone(), app.url("/lark/events"));
            tokio::spawn(async move {
                let mut b = http.post(url).body(req.body);
                for (k, v) in req.headers {
                    b = b.header(k, v);
                }
                b.send().await.unwrap().status().as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for d in deliveries {
        statuses.push(d.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(inbox(&app).await.len(), 20);
    for t in tasks {
        t.abort();
    }
    app.stop().await;
}

#[tokio::test]
async fn a_request_head_that_never_ends_is_cut_off() {
    let app = TestApp::builder()
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .var("SSHMODE_HTTP_HEADER_TIMEOUT_SECS", "1")
        .spawn()
        .await;
    let mut s = TcpStream::connect(app.addr).await.unwrap();
    s.write_all(b"POST /lark/events HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    // The server closes the connection (possibly after a 408); it never waits for ever.
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection was never closed");
    app.stop().await;
}

#[tokio::test]
async fn past_the_connection_bound_new_connections_wait() {
    let app = TestApp::builder()
        .var("SSHMODE_WORKERS_ENABLED", "false")
        .var("SSHMODE_HTTP_MAX_CONNECTIONS", "2")
        .spawn()
        .await;
    let a = TcpStream::connect(app.addr).await.unwrap();
    let _b = TcpStream::connect(app.addr).await.unwrap();
    eventually(
        "two connections served",
        Duration::from_secs(20),
        || async { app.state.metrics.http_connections.get() >= 2 },
    )
    .await;
    let mut c = TcpStream::connect(app.addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let early = tokio::time::timeout(Duration::from_millis(500), c.read(&mut buf)).await;
    assert!(early.is_err(), "a third connection was served");
    assert_eq!(app.state.metrics.http_connections.get(), 2);
    // One closes: the waiting connection is served.
    drop(a);
    let n = tokio::time::timeout(Duration::from_secs(20), c.read(&mut buf))
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    app.stop().await;
}
