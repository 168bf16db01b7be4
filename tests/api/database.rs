//! A fresh PostgreSQL database per test or benchmark, on the server in `TEST_DATABASE_URL`
//! (which `scripts/test.sh` and `scripts/bench.sh` start). Shared with the benchmarks through
//! `#[path]`, so it needs nothing but sqlx and uuid.

use sqlx::Connection;

/// The server the tests create their databases on.
fn server_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .expect("TEST_DATABASE_URL is not set: run the tests through scripts/test.sh, or point it at a PostgreSQL server")
}

/// Creates an empty database for one test and returns its URL.
pub async fn fresh_database() -> String {
    let server = server_url();
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&server)
        .await
        .expect("connect to TEST_DATABASE_URL");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create test database");
    conn.close().await.ok();
    with_database(&server, &name)
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
