//! The service's own PostgreSQL: connection pool, embedded migrations, and the embedded
//! cluster used when no `DATABASE_URL` is set.
//!
//! Owns connecting and migrating; holds no domain rules. Every command that touches the
//! database goes through [`Store::open`], which applies pending migrations first.

pub mod embedded;
pub mod replicas;

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use secrecy::ExposeSecret;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use embedded::EmbeddedCluster;

/// Most connections the pool opens; bounded so that a burst cannot exhaust the server.
const POOL_MAX: u32 = 20;
/// A pooled connection idle for longer than this is pinged before it is handed out (a server
/// restart or a dropped session shows there, not in the caller's query); one in steady use is
/// not: sqlx's default pings on every acquire, a round trip to the server as long as a
/// one-row INSERT's, paid by every inbox batch (BENCHMARKS.md).
const PING_IDLE: Duration = Duration::from_secs(1);

/// The embedded migrations (timestamp-named, append-only), applied at start. Migrations a
/// newer version applied are accepted: in a rolling upgrade the previous version keeps running
/// beside the newer schema, which only ever expands it (README, "Upgrading";
/// `store::tests::migrations_only_expand_unless_marked`).
pub static MIGRATOR: std::sync::LazyLock<sqlx::migrate::Migrator> =
    std::sync::LazyLock::new(|| {
        let mut m = sqlx::migrate!("./migrations");
        m.set_ignore_missing(true);
        m
    });

/// An open, migrated database, plus this process's attachment to the embedded cluster.
pub struct Store {
    pub pool: PgPool,
    /// `Some` when the embedded default is in use; [`Store::close`] leaves it, stopping it
    /// only when no other process is attached.
    embedded: Option<EmbeddedCluster>,
}

impl Store {
    /// Connects (starting or attaching to the embedded cluster when `DATABASE_URL` is unset)
    /// and applies pending migrations.
    pub async fn open(config: &Config) -> anyhow::Result<Self> {
        let (options, embedded) = match &config.database_url {
            Some(url) => {
                let opts = PgConnectOptions::from_str(url.expose_secret())
                    .map_err(|_| anyhow::anyhow!("DATABASE_URL is not a valid PostgreSQL URL"))?;
                (opts, None)
            }
            None => {
                let dir = config.data_dir.join("pg");
                let cluster =
                    tokio::task::spawn_blocking(move || EmbeddedCluster::ensure_running(&dir))
                        .await
                        .context("embedded PostgreSQL start-up task failed")??;
                (cluster.connect_options(), Some(cluster))
            }
        };
        let pool = PgPoolOptions::new()
            .max_connections(POOL_MAX)
            .acquire_timeout(Duration::from_secs(10))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    // A failed ping discards the connection; the pool opens another.
                    Ok(meta.idle_for < PING_IDLE || conn.ping().await.is_ok())
                })
            })
            .connect_with(options)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot connect to PostgreSQL: {e}; check DATABASE_URL (unset: the embedded \
                     cluster) and that the server accepts connections (`sshmode doctor`)"
                )
            })?;
        let store = Store { pool, embedded };
        if let Err(e) = MIGRATOR.run(&store.pool).await {
            store.close().await;
            return Err(anyhow::Error::new(e).context("applying database migrations failed"));
        }
        Ok(store)
    }

    /// With the embedded cluster: a task, for a long-lived process, that starts the cluster
    /// again when it goes away under it (see [`embedded::keep_running`]); ends at `shutdown`.
    pub fn keep_embedded_running(
        &self,
        shutdown: CancellationToken,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let keeper = self.embedded.as_ref()?.keeper();
        Some(embedded::keep_running(keeper, shutdown))
    }

    /// Closes the pool and leaves the embedded cluster, which stops it when no other process
    /// is attached.
    pub async fn close(self) {
        self.pool.close().await;
        if let Some(cluster) = self.embedded {
            let _ = tokio::task::spawn_blocking(move || cluster.release()).await;
        }
    }
}

/// Readiness: the database answers and every embedded migration is applied (newer ones a
/// newer version applied do not count).
pub async fn is_ready(pool: &PgPool) -> bool {
    let versions: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    let Ok(applied) = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM _sqlx_migrations WHERE success AND version = ANY($1)",
    )
    .bind(&versions)
    .fetch_one(pool)
    .await
    else {
        return false;
    };
    applied == versions.len() as i64
}

/// The last migration from before rolling upgrades: later ones only expand the schema (the
/// previous version keeps running on it) unless their file says `-- rolling: no`.
pub const ROLLING_SINCE: i64 = 20261214020000;

/// What in a migration's SQL would break the previous version still running on the schema:
/// a table or column dropped or renamed, a column's type changed or made `NOT NULL`, a
/// constraint added (the previous version's writes may not meet it), a column added
/// `NOT NULL` without a default (its inserts do not name it). Comments are not read.
pub fn contracting(sql: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in sql.lines() {
        let code = line.split("--").next().unwrap_or("").to_ascii_uppercase();
        let code = code.split_whitespace().collect::<Vec<_>>().join(" ");
        let rules: [(&str, bool); 7] = [
            ("DROP COLUMN", code.contains("DROP COLUMN")),
            ("DROP TABLE", code.contains("DROP TABLE")),
            ("RENAME", code.contains(" RENAME ")),
            (
                "a column's type",
                code.contains("ALTER COLUMN") && code.contains(" TYPE "),
            ),
            ("SET NOT NULL", code.contains("SET NOT NULL")),
            ("ADD CONSTRAINT", code.contains("ADD CONSTRAINT")),
            (
                "a NOT NULL column without a default",
                code.contains("ADD COLUMN")
                    && code.contains("NOT NULL")
                    && !code.contains("DEFAULT"),
            ),
        ];
        for (what, hit) in rules {
            if hit {
                found.push(format!("{what}: {}", line.trim()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every migration after [`ROLLING_SINCE`] only expands the schema, or says in its file
    /// that it cannot be rolled (`-- rolling: no — <why>`: every replica stopped first).
    #[test]
    fn migrations_only_expand_unless_marked() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        for m in MIGRATOR.iter().filter(|m| m.version > ROLLING_SINCE) {
            let name = format!("{}_{}.sql", m.version, m.description.replace(' ', "_"));
            let sql =
                std::fs::read_to_string(dir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            if sql
                .lines()
                .any(|l| l.trim_start().starts_with("-- rolling: no"))
            {
                continue;
            }
            let found = contracting(&sql);
            assert!(found.is_empty(), "{name} contracts the schema: {found:?}");
        }
        assert!(MIGRATOR.iter().any(|m| m.version == ROLLING_SINCE));
    }

    #[test]
    fn contracting_statements_are_found_and_comments_and_expansions_pass() {
        for sql in [
            "ALTER TABLE turns DROP COLUMN parked;",
            "DROP TABLE old_things;",
            "ALTER TABLE a RENAME COLUMN b TO c;",
            "ALTER TABLE a ALTER COLUMN b TYPE bigint;",
            "ALTER TABLE a ALTER COLUMN b SET NOT NULL;",
            "ALTER TABLE a ADD CONSTRAINT c CHECK (b > 0);",
            "ALTER TABLE a ADD COLUMN b TEXT NOT NULL;",
            "alter table a\n  drop   column b;",
        ] {
            assert!(!contracting(sql).is_empty(), "{sql}");
        }
        for sql in [
            "-- DROP COLUMN in a comment",
            "ALTER TABLE a ADD COLUMN b TEXT;",
            "ALTER TABLE a ADD COLUMN b BOOLEAN NOT NULL DEFAULT false;",
            "CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT NOT NULL);",
            "CREATE INDEX t_by_name ON t (name);",
        ] {
            assert_eq!(contracting(sql), Vec::<String>::new(), "{sql}");
        }
    }
}
