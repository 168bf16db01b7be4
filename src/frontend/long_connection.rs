//! The long connection's deliverer: a whole message received over Lark's WebSocket
//! ([`crate::lark::ws`]) is checked as a webhook event is, less what does not apply there
//! (no signature or encryption: the connection itself was opened with the app's secret; the
//! platform leaves `header.token` empty there) — app id, freshness, and the token only where one
//! is sent ([`webhook::verify_plain`]) — and recorded in the same inbox, with
//! the same de-duplication (event id, message id), ordering and express lane, before it is
//! acknowledged. A card click (an `event` frame of `card.action.trigger`, or a `card` frame)
//! is answered with the same toast the webhook returns, in an acknowledgement with `data`
//! (`{}` when there is no toast); one that cannot be recorded (no admission left, the database
//! refused the write) is acknowledged with code 200 and the webhook's busy toast, counted as
//! `reason = "click_busy"`: the platform never delivers a click again, and a failed one shows
//! the user error 200671.
//!
//! Never: handles an event itself (the inbox's workers do), or acknowledges as received an
//! event it could not record (code 500: the platform then redelivers it).

use std::sync::Arc;

use crate::clock::Clock;
use crate::config::Config;
use crate::inbox::Inbox;
use crate::lark::event;
use crate::lark::webhook;
use crate::lark::ws::{Deliver, Kind};
use crate::metrics::Metrics;

use super::LarkTriage;

/// Records what the long connection receives in the inbox.
pub struct InboxDeliver {
    pub config: Arc<Config>,
    pub inbox: Arc<Inbox>,
    pub triage: Arc<LarkTriage>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
}

#[async_trait::async_trait]
impl Deliver for InboxDeliver {
    async fn deliver(&self, kind: Kind, payload: Vec<u8>) -> Result<Option<Vec<u8>>, ()> {
        let Some(lark) = self.config.lark.as_ref() else {
            tracing::error!("a long-connection event arrived without LARK_* credentials");
            return Err(());
        };
        let env = match webhook::verify_plain(
            lark,
            &payload,
            self.clock.now(),
            self.config.inbox.dedup_retention,
        ) {
            Ok(env) => env,
            Err(r) => {
                // Redelivering it would not make it valid: acknowledged, counted, dropped.
                self.metrics.rejected(r.reason());
                tracing::warn!(
                    lark.reject = r.reason(),
                    ?kind,
                    "long-connection event refused"
                );
                return Ok(None);
            }
        };
        // A card callback, whichever frame carried it: never redelivered, so never failed.
        let click = kind == Kind::Card || env.event_type == event::CARD_ACTION;
        let Some(_admitted) = self.inbox.admit() else {
            if click {
                return Ok(Some(self.busy_click(crate::inbox::SATURATED)));
            }
            self.metrics.rejected(crate::inbox::SATURATED);
            return Err(());
        };
        let card = click.then(|| self.triage.card_answer(&env));
        let event_id = env.event_id.clone();
        let fresh = match self.inbox.record(self.triage.inbox_event(env)).await {
            Ok(fresh) => fresh,
            Err(e) => {
                tracing::error!(
                    error = format!("{e:#}"),
                    "recording a long-connection event failed"
                );
                if click {
                    return Ok(Some(self.busy_click("unrecorded")));
                }
                return Err(());
            }
        };
        if fresh {
            self.metrics.events_received.inc();
        } else {
            self.metrics.events_duplicate.inc();
        }
        tracing::debug!(lark.event_id = %event_id, fresh, "long-connection event recorded");
        Ok(card.map(|answer| answer.to_string().into_bytes()))
    }
}

impl InboxDeliver {
    /// A click that could not be recorded: acknowledged with code 200 and an error toast (a
    /// failed acknowledgement shows the user error 200671, and the click never comes again),
    /// counted as `reason = "click_busy"`.
    fn busy_click(&self, why: &str) -> Vec<u8> {
        self.metrics.rejected(super::CLICK_BUSY);
        tracing::warn!(
            lark.reject = super::CLICK_BUSY,
            cause = why,
            "long-connection card click not recorded; answered with a busy toast"
        );
        super::busy_answer().to_string().into_bytes()
    }
}
