//! The processes running the service on one database (`serve`, `sshmode chat`): each keeps a
//! row in `replicas` with a heartbeat on the database's clock while it runs, and deletes it
//! when it stops. Commands that must not run beside a live service (`vault rotate-key`) ask
//! [`live`].
//!
//! Never: decides anything itself; a row is a sign of life, not a lock.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// How often a running process renews its heartbeat.
pub const BEAT: Duration = Duration::from_secs(5);
/// A heartbeat younger than this is live: several beats, so a slow database does not make a
/// running process look stopped.
pub const LIVE_FOR: Duration = Duration::from_secs(20);
/// Rows of processes that died without deleting theirs are removed after this long.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// A process with a live heartbeat.
#[derive(Debug, Clone)]
pub struct Live {
    pub host: String,
    pub pid: i32,
    /// Seconds since its last heartbeat.
    pub seen_secs_ago: f64,
    /// What it runs ([`version`]); `None` for a version from before replicas said so.
    pub version: Option<String>,
}

impl std::fmt::Display for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} on {}, {} (heartbeat {:.0} s ago)",
            self.pid,
            self.host,
            self.version.as_deref().unwrap_or("an earlier version"),
            self.seen_secs_ago
        )
    }
}

/// Records this process as running now; returns its row's id for [`run`].
pub async fn register(db: &PgPool) -> Result<String, sqlx::Error> {
    let id = uuid::Uuid::new_v4().to_string();
    sqlx::query("DELETE FROM replicas WHERE seen_at < now() - make_interval(secs => $1)")
        .bind(FORGET_AFTER.as_secs_f64())
        .execute(db)
        .await?;
    sqlx::query("INSERT INTO replicas (id, host, pid, version) VALUES ($1, $2, $3, $4)")
        .bind(&id)
        .bind(hostname())
        .bind(std::process::id() as i32)
        .bind(version())
        .execute(db)
        .await?;
    Ok(id)
}

/// Renews the heartbeat of row `id` every [`BEAT`] until `shutdown`, then deletes the row. A
/// failed renewal is logged and tried again at the next beat (the row is put back if it went).
pub async fn run(db: PgPool, id: String, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(BEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let beat = sqlx::query(
            "INSERT INTO replicas (id, host, pid, version) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (id) DO UPDATE SET seen_at = now()",
        )
        .bind(&id)
        .bind(hostname())
        .bind(std::process::id() as i32)
        .bind(version())
        .execute(&db);
        match tokio::time::timeout(BEAT, beat).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the replica heartbeat could not be written"),
            Err(_) => tracing::warn!("the replica heartbeat timed out"),
        }
    }
    let gone = sqlx::query("DELETE FROM replicas WHERE id = $1")
        .bind(&id)
        .execute(&db);
    match tokio::time::timeout(BEAT, gone).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the replica row could not be removed; it ages out")
        }
        Err(_) => tracing::warn!("removing the replica row timed out; it ages out"),
    }
}

/// The processes whose heartbeat is live, most recent first (at most 100).
pub async fn live(db: &PgPool) -> Result<Vec<Live>, sqlx::Error> {
    let rows: Vec<(String, i32, f64, Option<String>)> = sqlx::query_as(
        "SELECT host, pid, extract(epoch FROM now() - seen_at)::float8, version FROM replicas \
         WHERE seen_at > now() - make_interval(secs => $1) ORDER BY seen_at DESC LIMIT 100",
    )
    .bind(LIVE_FOR.as_secs_f64())
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(host, pid, ago, version)| Live {
            host,
            pid,
            seen_secs_ago: ago.max(0.0),
            version,
        })
        .collect())
}

/// What this process is: its package version and the newest migration it carries (two builds
/// of one version with other schemas tell apart).
pub fn version() -> String {
    let schema = crate::store::MIGRATOR
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    format!("{} (schema {schema})", env!("CARGO_PKG_VERSION"))
}

/// This machine's name, or `?` when it has none.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
