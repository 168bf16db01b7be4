//! Prometheus metrics. One [`Metrics`] per app, shared by reference; every name is prefixed
//! `sshmode_`. Counters get the `_total` suffix on the wire.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `reason` label (rejections, failures).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// `result` label (schedule firings).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// `kind` label (secrets masked).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// Lark Open API call labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LarkCallLabels {
    pub api: String,
    pub outcome: String,
}

/// Model router entry labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LlmLabels {
    pub chain: String,
    pub provider: String,
    pub model: String,
    pub outcome: String,
}

/// Execution labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecLabels {
    pub backend: String,
    pub outcome: String,
}

/// Progress card operation labels (`op`: create, send, update, settings, patch).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CardOpLabels {
    pub op: String,
    pub outcome: String,
}

/// Audit rows that could not be written, counted where they are written (`audit`), which
/// knows no app: one count per process, exported by every app's registry.
pub static AUDIT_WRITE_FAILURES: std::sync::LazyLock<Counter> =
    std::sync::LazyLock::new(Counter::default);

/// Every metric the service exports.
pub struct Metrics {
    registry: Registry,
    pub events_received: Counter,
    pub events_duplicate: Counter,
    pub events_rejected: Family<ReasonLabel, Counter>,
    pub events_processed: Counter,
    /// Events recorded as needing no handling (never claimed).
    pub events_inert: Counter,
    pub events_failed: Counter,
    pub events_dead: Counter,
    /// Events recorded but not yet done; refreshed when `/metrics` is scraped.
    pub inbox_depth: Gauge,
    /// Inbox workers woken by a write that made an event claimable.
    pub inbox_wakeups: Counter,
    pub lark_api_calls: Family<LarkCallLabels, Counter>,
    pub llm_requests: Family<LlmLabels, Counter>,
    pub llm_latency_seconds: Histogram,
    pub exec_commands: Family<ExecLabels, Counter>,
    pub ssh_connects: Family<ReasonLabel, Counter>,
    /// HTTP connections open now.
    pub http_connections: Gauge,
    pub progress_card_ops: Family<CardOpLabels, Counter>,
    pub progress_fallbacks: Family<ReasonLabel, Counter>,
    pub progress_updates: Counter,
    /// Lark calls one ended turn cost on the runner that ended it: receipts, replies,
    /// reactions and its progress card's operations.
    pub lark_calls_per_turn: Histogram,
    /// 1 while the long connection to Lark is open, else 0.
    pub lark_ws_connected: Gauge,
    /// Long-connection attempts after the first, by outcome.
    pub lark_ws_reconnects: Family<ReasonLabel, Counter>,
    /// Long-connection frames received, by type (`ping`, `pong`, `event`, `card`, …), and
    /// messages dropped (`dropped:<why>`).
    pub lark_ws_frames: Family<ReasonLabel, Counter>,
    /// From a message's last frame to its acknowledgement.
    pub lark_ws_ack_seconds: Histogram,
    /// 1 while this process holds the long connection (it was configured), else 0.
    pub lark_ws_enabled: Gauge,
    /// A callback's time from its body read to its answer (the platform's acknowledgement).
    pub event_ack_seconds: Histogram,
    /// 1 when this replica is ready (the database reachable and migrated), else 0; refreshed
    /// when `/metrics` is scraped.
    pub ready: Gauge,
    /// 1 when the database answered a ping at the last scrape, else 0.
    pub database_up: Gauge,
    /// Model entries disabled after their key was rejected; refreshed when `/metrics` is
    /// scraped.
    pub llm_entries_disabled: Gauge,
    /// Schedule firings by result (`fired`, `skipped`, `paused`, `gone`).
    pub schedule_firings: Family<ResultLabel, Counter>,
    /// How late a firing was claimed after its due time.
    pub schedule_lateness_seconds: Histogram,
    /// Secret values masked in tool results, by kind (`password`, `private-key`, …).
    pub secrets_masked: Family<KindLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("sshmode");
        let m = Metrics {
            events_received: Counter::default(),
            events_duplicate: Counter::default(),
            events_rejected: Family::default(),
            events_processed: Counter::default(),
            events_inert: Counter::default(),
            events_failed: Counter::default(),
            events_dead: Counter::default(),
            inbox_depth: Gauge::default(),
            inbox_wakeups: Counter::default(),
            lark_api_calls: Family::default(),
            llm_requests: Family::default(),
            llm_latency_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            exec_commands: Family::default(),
            ssh_connects: Family::default(),
            http_connections: Gauge::default(),
            progress_card_ops: Family::default(),
            progress_fallbacks: Family::default(),
            progress_updates: Counter::default(),
            lark_calls_per_turn: Histogram::new([
                1.0, 2.0, 3.0, 4.0, 6.0, 9.0, 15.0, 30.0, 60.0, 120.0,
            ]),
            lark_ws_connected: Gauge::default(),
            lark_ws_reconnects: Family::default(),
            lark_ws_frames: Family::default(),
            lark_ws_ack_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            lark_ws_enabled: Gauge::default(),
            event_ack_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            ready: Gauge::default(),
            database_up: Gauge::default(),
            llm_entries_disabled: Gauge::default(),
            schedule_firings: Family::default(),
            schedule_lateness_seconds: Histogram::new(exponential_buckets(0.25, 4.0, 10)),
            secrets_masked: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "secrets_masked",
            "Secret values masked in tool results, by kind",
            m.secrets_masked.clone(),
        );
        registry.register(
            "schedule_firings",
            "Schedule firings by result",
            m.schedule_firings.clone(),
        );
        registry.register(
            "schedule_lateness_seconds",
            "How late a schedule's firing was claimed after its due time",
            m.schedule_lateness_seconds.clone(),
        );
        registry.register(
            "events_received",
            "Lark events accepted and recorded",
            m.events_received.clone(),
        );
        registry.register(
            "events_duplicate",
            "Lark events already recorded (redeliveries)",
            m.events_duplicate.clone(),
        );
        registry.register(
            "events_rejected",
            "Lark callback requests refused, by reason",
            m.events_rejected.clone(),
        );
        registry.register(
            "events_processed",
            "Inbox events handled successfully",
            m.events_processed.clone(),
        );
        registry.register(
            "events_inert",
            "Lark events recorded as needing no handling (messages bots sent, event types nothing handles), never claimed",
            m.events_inert.clone(),
        );
        registry.register(
            "events_failed",
            "Inbox event handling attempts that failed",
            m.events_failed.clone(),
        );
        registry.register(
            "events_dead",
            "Inbox events moved to the dead-letter state",
            m.events_dead.clone(),
        );
        registry.register(
            "inbox_depth",
            "Inbox events not yet done",
            m.inbox_depth.clone(),
        );
        registry.register(
            "inbox_wakeups",
            "Inbox workers woken by a recorded event that a claim could take at once",
            m.inbox_wakeups.clone(),
        );
        registry.register(
            "lark_api_calls",
            "Lark Open API calls by API and outcome",
            m.lark_api_calls.clone(),
        );
        registry.register(
            "llm_requests",
            "Model requests by router entry and outcome",
            m.llm_requests.clone(),
        );
        registry.register(
            "llm_latency_seconds",
            "Model request latency",
            m.llm_latency_seconds.clone(),
        );
        registry.register(
            "exec_commands",
            "Commands run by backend and outcome",
            m.exec_commands.clone(),
        );
        registry.register(
            "progress_card_ops",
            "Progress card operations by kind and outcome",
            m.progress_card_ops.clone(),
        );
        registry.register(
            "progress_fallbacks",
            "Turns whose progress fell back from CardKit, by the fallback used",
            m.progress_fallbacks.clone(),
        );
        registry.register(
            "progress_updates",
            "Progress card content updates sent (its rate is the update rate)",
            m.progress_updates.clone(),
        );
        registry.register(
            "lark_calls_per_turn",
            "Lark calls per ended turn: receipts, replies, reactions, progress card operations",
            m.lark_calls_per_turn.clone(),
        );
        registry.register(
            "ssh_connects",
            "SSH connection attempts by outcome",
            m.ssh_connects.clone(),
        );
        registry.register(
            "http_connections",
            "HTTP connections open",
            m.http_connections.clone(),
        );
        registry.register(
            "lark_ws_connected",
            "1 while the long connection to Lark is open",
            m.lark_ws_connected.clone(),
        );
        registry.register(
            "lark_ws_reconnects",
            "Long-connection attempts after the first, by outcome",
            m.lark_ws_reconnects.clone(),
        );
        registry.register(
            "lark_ws_frames",
            "Long-connection frames received by type, and messages dropped",
            m.lark_ws_frames.clone(),
        );
        registry.register(
            "lark_ws_ack_seconds",
            "Long connection: a message's last frame to its acknowledgement",
            m.lark_ws_ack_seconds.clone(),
        );
        registry.register(
            "lark_ws_enabled",
            "1 while this process holds the long connection to Lark (configured)",
            m.lark_ws_enabled.clone(),
        );
        registry.register(
            "event_ack_seconds",
            "Callback: from its body read to its answer (the platform's acknowledgement)",
            m.event_ack_seconds.clone(),
        );
        registry.register(
            "ready",
            "1 when this replica is ready (database reachable and migrated)",
            m.ready.clone(),
        );
        registry.register(
            "database_up",
            "1 when the database answered a ping at the last scrape",
            m.database_up.clone(),
        );
        registry.register(
            "llm_entries_disabled",
            "Model entries disabled after their key was rejected",
            m.llm_entries_disabled.clone(),
        );
        registry.register(
            "audit_write_failures",
            "Audit rows that could not be written (process-wide)",
            AUDIT_WRITE_FAILURES.clone(),
        );
        // Series an alert reads with `increase()` exist from the start, at zero: a series
        // that first appears at 1 shows no increase, and its first event would page nobody.
        m.ssh_connects
            .get_or_create(&ReasonLabel {
                reason: "host_key_mismatch".into(),
            })
            .inc_by(0);
        for outcome in ["error", "transport", "ok"] {
            m.lark_api_calls
                .get_or_create(&LarkCallLabels {
                    api: "token".into(),
                    outcome: outcome.into(),
                })
                .inc_by(0);
        }
        Metrics { registry, ..m }
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts a refused callback request.
    pub fn rejected(&self, reason: &str) {
        self.events_rejected
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }
}

impl Metrics {
    /// Counts one long-connection frame (or dropped message) of kind `what`.
    pub fn lark_ws_frame(&self, what: &str) {
        self.lark_ws_frames
            .get_or_create(&ReasonLabel {
                reason: what.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric the alert rules (deploy/prometheus/alerts.yml) read is one this service
    /// exports, and the series they read with `increase()` exist before their first event.
    #[test]
    fn the_alert_rules_read_metrics_that_exist() {
        let rules = include_str!("../deploy/prometheus/alerts.yml");
        let out = Metrics::new().render();
        let mut names: Vec<&str> = rules
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("sshmode_"))
            .collect();
        names.sort();
        names.dedup();
        assert!(names.len() >= 10, "{names:?}");
        for name in names {
            let base = name
                .strip_suffix("_total")
                .or_else(|| name.strip_suffix("_bucket"))
                .unwrap_or(name);
            assert!(
                out.contains(&format!("# TYPE {base} ")),
                "{name} is not exported:\n{out}"
            );
        }
        assert!(
            out.contains("sshmode_ssh_connects_total{reason=\"host_key_mismatch\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("sshmode_lark_api_calls_total{api=\"token\",outcome=\"error\"} 0"),
            "{out}"
        );
    }
}
