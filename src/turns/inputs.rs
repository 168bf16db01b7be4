//! What a turn request brought besides its text: the messages it quoted (a section quotes a
//! message once) and the images it carried, kept for the turn that answers it so a route whose
//! model sees images gets them as image content. Every query on `quoted_messages` and
//! `message_images` lives here.
//!
//! Never: keeps an image past [`IMAGE_RETENTION_HOURS`] (removed when a new one is stored, and
//! by [`run_image_purge`] in `serve`, at start and hourly); decides what is quoted or where a
//! file goes (that is the chat layer's).

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Images older than this are removed: when a new one is stored, and by the hourly purge.
pub const IMAGE_RETENTION_HOURS: i32 = 48;
/// How often `serve` purges images past their retention (and once at start).
const IMAGE_PURGE_EVERY: Duration = Duration::from_secs(3600);
/// Most images read back for one turn.
const MAX_IMAGES_PER_TURN: i64 = 16;

/// An image a request carried.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Image {
    pub message_id: String,
    /// Where it was placed, as the request's text names it.
    pub path: String,
    pub mime: String,
    pub data: Vec<u8>,
}

/// Whether `message_id` is already in `section`'s conversation: a request of the section, or
/// a message one of its requests quoted.
pub async fn in_conversation(db: &PgPool, section: &str, message_id: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM turn_requests WHERE section_id = $1 AND message_id = $2)
             OR EXISTS (SELECT 1 FROM quoted_messages WHERE section_id = $1 AND message_id = $2)",
    )
    .bind(section)
    .bind(message_id)
    .fetch_one(db)
    .await
}

/// Records that a request of `section` quoted `message_id`.
pub async fn quoted(db: &PgPool, section: &str, message_id: &str) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO quoted_messages (section_id, message_id) VALUES ($1, $2)
         ON CONFLICT DO NOTHING",
    )
    .bind(section)
    .bind(message_id)
    .execute(db)
    .await?;
    Ok(())
}

/// Keeps an image of the request of `image.message_id` (a second store of the same path
/// replaces it), and removes images past their retention.
pub async fn store_image(db: &PgPool, image: &Image) -> sqlx::Result<()> {
    let mut tx = db.begin().await?;
    purge_images(&mut *tx).await?;
    sqlx::query(
        "INSERT INTO message_images (message_id, path, mime, data) VALUES ($1, $2, $3, $4)
         ON CONFLICT (message_id, path) DO UPDATE SET mime = $3, data = $4, created_at = now()",
    )
    .bind(&image.message_id)
    .bind(&image.path)
    .bind(&image.mime)
    .bind(&image.data)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The images of these requests' messages, oldest first (at most a few per turn).
pub async fn images_of(db: &PgPool, message_ids: &[String]) -> sqlx::Result<Vec<Image>> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    sqlx::query_as(
        "SELECT message_id, path, mime, data FROM message_images
         WHERE message_id = ANY($1) ORDER BY created_at, path LIMIT $2",
    )
    .bind(message_ids)
    .bind(MAX_IMAGES_PER_TURN)
    .fetch_all(db)
    .await
}

/// Deletes the images past [`IMAGE_RETENTION_HOURS`]; returns how many. Images are few (a
/// person sends them, and they last two days), so one statement clears them.
pub async fn purge_images<'c>(db: impl sqlx::PgExecutor<'c>) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "DELETE FROM message_images WHERE created_at < now() - make_interval(hours => $1)",
    )
    .bind(IMAGE_RETENTION_HOURS)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// The image purge of `serve`: at start and then hourly, until `shutdown`, so images past their
/// retention go even when no new image comes. A failed purge is logged and retried next run.
pub async fn run_image_purge(db: PgPool, shutdown: CancellationToken) {
    loop {
        match purge_images(&db).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(images.purged = n, "images past retention deleted"),
            Err(e) => tracing::warn!(error = %e, "image purge failed; retrying in an hour"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(IMAGE_PURGE_EVERY) => {}
        }
    }
}
