//! Benchmark: the inbox claim with per-section order against the claim it replaced (see
//! BENCHMARKS.md).
//!
//! Data: a backlog of 10 000 unfinished events in one chat, older than one event in each of
//! 1 000 other sections. The chat's oldest event is claimed and left in progress, so every
//! ordered claim must pass the chat's 9 999 held events to reach the other sections: the worst
//! case of head-of-line order. Then, in one run, each variant claims and completes events
//! until `n` are done (default 1000), and the data is reset between variants. Variants: the
//! claim in use (section heads by a loose index scan), the same rule as a `NOT EXISTS` probe
//! per candidate, and the claim from before sections (no order).
//!
//! Needs a PostgreSQL server in `TEST_DATABASE_URL`: `bash scripts/bench.sh claim`.

use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::Connection;

const BIG: i64 = 10_000;
const OTHERS: i64 = 1_000;

fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(n))
}

async fn reset(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::query("TRUNCATE inbox_events, inbox_sections")
        .execute(pool)
        .await?;
    let t0 = Utc::now() - chrono::Duration::hours(1);
    // The chat's backlog first (older), then one event per other section.
    sqlx::query(
        "INSERT INTO inbox_events (event_id, event_type, payload, received_at, available_at, section, message_id)
         SELECT 'big' || g, 'im.message.receive_v1', '{}'::jsonb, $1 + g * interval '1 ms',
                $1 + g * interval '1 ms', 'oc_big', 'om_big' || g
         FROM generate_series(1, $2) g ORDER BY g",
    )
    .bind(t0)
    .bind(BIG)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO inbox_events (event_id, event_type, payload, received_at, available_at, section, message_id)
         SELECT 'o' || g, 'im.message.receive_v1', '{}'::jsonb, $1 + g * interval '1 ms',
                $1 + g * interval '1 ms', 'omt_' || g, 'om_o' || g
         FROM generate_series(1, $2) g ORDER BY g",
    )
    .bind(t0 + chrono::Duration::minutes(30))
    .bind(OTHERS)
    .execute(pool)
    .await?;
    sshmode::inbox::index_sections(pool).await?;
    sqlx::query("ANALYZE inbox_events").execute(pool).await?;
    // The chat's head is in progress (leased far into the future).
    let lease = Duration::from_secs(3600);
    sshmode::inbox::claim(pool, Utc::now(), lease).await?;
    Ok(())
}

async fn run(n: usize) -> anyhow::Result<()> {
    let server = std::env::var("TEST_DATABASE_URL").map_err(|_| {
        anyhow::anyhow!("TEST_DATABASE_URL is not set: run `bash scripts/bench.sh claim`")
    })?;
    let db_name = format!("bench_claim_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&server).await?;
    sqlx::query(&format!("CREATE DATABASE {db_name}"))
        .execute(&mut admin)
        .await?;
    let db_url = match server.rsplit_once('/') {
        Some((prefix, _)) => format!("{prefix}/{db_name}"),
        None => anyhow::bail!("TEST_DATABASE_URL has no database path"),
    };
    let pool = sqlx::PgPool::connect(&db_url).await?;
    sshmode::store::MIGRATOR.run(&pool).await?;
    let lease = Duration::from_secs(300);
    let n = n.min(OTHERS as usize);

    println!(
        "backlog: {BIG} events in one chat (its head in progress) + {OTHERS} other sections; {n} claims each"
    );
    for round in 0..2 {
        reset(&pool).await?;
        let start = Instant::now();
        let mut sections = std::collections::HashSet::new();
        for _ in 0..n {
            let e = sshmode::inbox::claim(&pool, Utc::now(), lease)
                .await?
                .expect("an event is due");
            sections.insert(e.section.clone());
            sshmode::inbox::complete(&pool, &e.event_id, Utc::now()).await?;
        }
        let ordered = start.elapsed();
        assert!(!sections.contains(&Some("oc_big".into())), "order broken");

        reset(&pool).await?;
        let start = Instant::now();
        for _ in 0..n {
            let id = sshmode::inbox::claim_not_exists(&pool, Utc::now(), lease)
                .await?
                .expect("an event is due");
            assert!(id.starts_with('o'), "order broken");
            sshmode::inbox::complete(&pool, &id, Utc::now()).await?;
        }
        let not_exists = start.elapsed();

        reset(&pool).await?;
        let start = Instant::now();
        for _ in 0..n {
            let id = sshmode::inbox::claim_unordered(&pool, Utc::now(), lease)
                .await?
                .expect("an event is due");
            sshmode::inbox::complete(&pool, &id, Utc::now()).await?;
        }
        let unordered = start.elapsed();
        let rate = |d: Duration| n as f64 / d.as_secs_f64();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0 / n as f64;
        println!(
            "round {round}: section heads (used) {:.0} claims/s ({:.2} ms each); NOT EXISTS per candidate {:.0} claims/s ({:.2} ms); previous unordered claim {:.0} claims/s ({:.2} ms)",
            rate(ordered),
            ms(ordered),
            rate(not_exists),
            ms(not_exists),
            rate(unordered),
            ms(unordered),
        );
    }
    pool.close().await;
    sqlx::query(&format!("DROP DATABASE {db_name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    Ok(())
}
