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

/// The embedded migrations (timestamp-named, append-only).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

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

/// Readiness: the database answers and every embedded migration is applied.
pub async fn is_ready(pool: &PgPool) -> bool {
    let Ok(applied) =
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await
    else {
        return false;
    };
    applied >= MIGRATOR.iter().count() as i64
}
