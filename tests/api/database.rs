//! A fresh PostgreSQL database per test or benchmark, on the server in `TEST_DATABASE_URL`
//! (which `scripts/test.sh` and `scripts/bench.sh` start). Shared with the benchmarks through
//! `#[path]`, so it needs nothing but sqlx and uuid.

use sqlx::Connection;

/// The server the tests create their databases on.
fn server_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .expect("TEST_DATABASE_URL is not set: run the tests through scripts/test.sh, or point it at a PostgreSQL server")
}

/// Test databases older than this are dropped by the next run on the same server, so a
/// long-lived development server does not fill its disk.
const KEEP_SECS: u64 = 6 * 3600;
/// Most old databases one process drops.
const DROP_MAX: usize = 1000;

/// Creates an empty database for one test and returns its URL. Its name carries its creation
/// time; the first call of a process drops the test databases older than [`KEEP_SECS`].
pub async fn fresh_database() -> String {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let server = server_url();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs();
    let name = format!("t_{now}_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&server)
        .await
        .expect("connect to TEST_DATABASE_URL");
    let mut sweep = false;
    SWEPT.call_once(|| sweep = true);
    if sweep {
        drop_old(&mut conn, now).await;
    }
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create test database");
    conn.close().await.ok();
    with_database(&server, &name)
}

/// Drops (best effort) the test databases created more than [`KEEP_SECS`] ago, and the
/// ones named before names carried their time.
async fn drop_old(conn: &mut sqlx::PgConnection, now: u64) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE datname LIKE 't\\_%' ORDER BY datname LIMIT $1",
    )
    .bind(DROP_MAX as i64)
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_default();
    for name in names {
        let created = name
            .strip_prefix("t_")
            .and_then(|r| r.split_once('_'))
            .and_then(|(secs, _)| secs.parse::<u64>().ok());
        let old = match created {
            Some(secs) => now.saturating_sub(secs) > KEEP_SECS,
            // `t_<uuid>`: from before names carried their time.
            None => true,
        };
        if old && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            // One still in use is left for a later run.
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
                .execute(&mut *conn)
                .await;
        }
    }
}

fn with_database(server: &str, name: &str) -> String {
    let (base, query) = match server.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (server, None),
    };
    let prefix = match base.rfind('/') {
        Some(i) if base[..i].contains("//") && i > base.find("//").unwrap() + 1 => &base[..i],
        _ => base,
    };
    match query {
        Some(q) => format!("{prefix}/{name}?{q}"),
        None => format!("{prefix}/{name}"),
    }
}
