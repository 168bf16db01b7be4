//! The router: turns a request for an abstract model into a call to the first usable
//! provider/model entry of its chain, reacts to each failure class, and brings cooling entries
//! back through probes. Entry state lives in Postgres ([`super::state`]); request counts and
//! latency are per process, in memory.
//!
//! Bounded by construction: a request tries each entry of its chain at most once (chains are at
//! most 16 long), every call has the client's timeout, and a probe round sends one small
//! request per cooling entry.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::classify::{CallFailure, FailureClass, classify, scrub};
use super::client::{Client, Endpoint};
use super::state::{self, Condition, EntryLabel, EntryState};
use super::wire::{ChatRequest, ChatResponse, Message, Usage};
use crate::clock::Clock;
use crate::config::router_file::RouterFile;
use crate::config::{Config, LlmConfig, RouterTunables};
use crate::metrics::{LlmLabels, Metrics};

/// `max_tokens` of a probe: enough for any provider to accept, small enough to cost nothing.
const PROBE_MAX_TOKENS: u32 = 8;

/// Why the router could not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RouterError {
    #[error("there is no model called `{0}`")]
    UnknownModel(String),
    /// The provider refused the request itself (bad request, context too long): no other
    /// entry would do better, so it is handed back unchanged.
    #[error("the model provider refused the request: {}", .0.message)]
    Rejected(Attempt),
    /// Every entry failed, is cooling (and the forced try failed too) or is disabled.
    #[error("{}", unavailable_text(.chain, .attempts, *.disabled))]
    Unavailable {
        chain: String,
        attempts: Vec<Attempt>,
        /// Entries skipped because their key was rejected earlier.
        disabled: usize,
    },
}

fn unavailable_text(chain: &str, attempts: &[Attempt], disabled: usize) -> String {
    let mut s = format!("no model provider for `{chain}` is available right now");
    let tried: Vec<String> = attempts
        .iter()
        .map(|a| format!("{}/{}: {}", a.provider, a.model, a.class.describe()))
        .collect();
    if !tried.is_empty() {
        s.push_str(&format!(" ({})", tried.join("; ")));
    }
    if disabled > 0 {
        s.push_str(&format!(
            "; {disabled} entr{} disabled because the provider rejected the API key",
            if disabled == 1 { "y is" } else { "ies are" },
        ));
    }
    if disabled > 0 || attempts.iter().any(|a| a.class == FailureClass::Auth) {
        s.push_str(
            "; an entry whose key was rejected stays disabled until an operator fixes the key \
             or runs `sshmode router enable`",
        );
    }
    s
}

/// What to do about an entry disabled after its key was rejected.
pub fn enable_advice(entry: &str) -> String {
    format!(
        "fix its API key in the configuration (a changed key starts clean), or once the \
         provider accepts it again run `sshmode router enable {entry}`"
    )
}

impl RouterError {
    /// Whether waiting will not help: nothing answered, and some entry of the chain is
    /// disabled, or was just now, for a rejected key (that needs a person).
    pub fn needs_operator(&self) -> bool {
        match self {
            RouterError::Unavailable {
                disabled, attempts, ..
            } => *disabled > 0 || attempts.iter().any(|a| a.class == FailureClass::Auth),
            _ => false,
        }
    }
}

/// One failed try of one entry, safe to show.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    pub provider: String,
    pub model: String,
    pub class: FailureClass,
    /// The provider's status, when it answered.
    pub status: Option<u16>,
    /// The provider's error code, when it gave one.
    pub code: Option<String>,
    /// Scrubbed of secrets.
    pub message: String,
}

/// A routed reply and the record of how it was obtained (for the event log and metrics).
#[derive(Debug, Clone)]
pub struct Routed {
    /// `model` is the abstract name that was asked for.
    pub response: ChatResponse,
    pub served: Served,
}

/// Which entry answered, how fast, at what cost, after which failures.
#[derive(Debug, Clone, Serialize)]
pub struct Served {
    pub chain: String,
    pub provider: String,
    pub model: String,
    /// Time of the successful call alone (serialised as `latency_ms`).
    #[serde(rename = "latency_ms", serialize_with = "as_millis")]
    pub latency: Duration,
    pub usage: Usage,
    /// True when every entry was cooling and this one was tried anyway.
    pub forced: bool,
    /// Entries tried before this one, in order.
    pub failed_attempts: Vec<Attempt>,
}

/// One provider/model pair, shared by every chain that lists it (state is per pair).
struct Entry {
    /// Digest of base URL, model and a fingerprint of the key: the state row's key.
    key: String,
    provider: String,
    model: String,
    endpoint: Endpoint,
    /// The model reads images (the router file's `vision`); without it a request's image
    /// parts are sent as their text descriptions.
    vision: bool,
}

/// In-memory counters of one chain entry (this process only).
#[derive(Default)]
struct EntryStats {
    requests: AtomicU64,
    ok: AtomicU64,
    failed: [AtomicU64; 5],
    latency_us_total: AtomicU64,
    latency_us_max: AtomicU64,
    latency_us_last: AtomicU64,
}

struct Chain {
    name: String,
    /// Indices into `Router::entries`, in the order they are tried.
    entries: Vec<usize>,
    /// Aligned with `entries`.
    stats: Vec<EntryStats>,
    requests: AtomicU64,
    forced: AtomicU64,
    unavailable: AtomicU64,
}

/// The model router. Cheap to share as `Arc<Router>`.
pub struct Router {
    chains: Vec<Chain>,
    /// Index of the chain used when no model is named (`SSHMODE_MODEL` or the first).
    default_chain: usize,
    entries: Vec<Entry>,
    client: Client,
    db: PgPool,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    tunables: RouterTunables,
}

/// One entry's answer to [`Router::check_each`]: nothing, or the failure's class and its
/// message (scrubbed of the key).
#[derive(Debug, Clone)]
pub struct EntryCheck {
    pub provider: String,
    pub model: String,
    pub result: Result<(), (FailureClass, String)>,
}

/// Health of one chain entry (`GET /router/health`).
#[derive(Debug, Clone, Serialize)]
pub struct EntryHealth {
    pub chain: String,
    pub provider: String,
    pub model: String,
    /// `ok`, `cooling` or `disabled`.
    pub state: &'static str,
    /// End of the cooldown while cooling.
    pub until: Option<DateTime<Utc>>,
    /// The failure class that caused the cooldown or the disabling.
    pub reason: Option<FailureClass>,
    /// Since when the entry is disabled, while it is.
    pub since: Option<DateTime<Utc>>,
    pub last_error: Option<LastErrorView>,
}

impl EntryHealth {
    /// The entry's name as `sshmode router enable` takes it: `<provider>/<model>`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }
}

/// Why `sshmode router enable` did nothing.
#[derive(Debug, thiserror::Error)]
pub enum EnableError {
    #[error("no model entry is called `{name}`; the entries are: {}", .known.join(", "))]
    Unknown { name: String, known: Vec<String> },
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[derive(Debug, Clone, Serialize)]
pub struct LastErrorView {
    pub class: FailureClass,
    pub message: String,
    pub at: DateTime<Utc>,
}

/// Counters of one chain entry (`GET /router/stats`).
#[derive(Debug, Clone, Serialize)]
pub struct EntryStatsView {
    pub chain: String,
    pub provider: String,
    pub model: String,
    pub requests: u64,
    pub ok: u64,
    pub failed: u64,
    pub failures: HashMap<&'static str, u64>,
    pub latency_ms_avg: f64,
    pub latency_ms_max: f64,
    pub latency_ms_last: f64,
}

/// Counters of one chain.
#[derive(Debug, Clone, Serialize)]
pub struct ChainStatsView {
    pub name: String,
    pub requests: u64,
    /// Requests answered by a forced try of a cooling entry.
    pub forced: u64,
    /// Requests no entry could answer.
    pub unavailable: u64,
}

/// Outcome of one probe round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeReport {
    pub probed: usize,
    pub recovered: usize,
}

const CLASSES: [FailureClass; 5] = [
    FailureClass::RateLimited,
    FailureClass::Quota,
    FailureClass::Auth,
    FailureClass::Transient,
    FailureClass::BadRequest,
];

fn class_index(c: FailureClass) -> usize {
    CLASSES.iter().position(|x| *x == c).unwrap_or(0)
}

fn entry_key(base_url: &str, model: &str, key: Option<&str>) -> String {
    let fingerprint = key
        .map(|k| hex::encode(&Sha256::digest(k.as_bytes())[..8]))
        .unwrap_or_default();
    let mut h = Sha256::new();
    for part in [base_url, model, &fingerprint] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    hex::encode(h.finalize())
}

impl Router {
    /// Builds the router the configuration asks for; `None` when no model is configured.
    pub fn from_config(
        config: &Config,
        db: PgPool,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Option<Router>> {
        let file = match (&config.llm, &config.router_file) {
            (LlmConfig::None, _) => return Ok(None),
            (
                LlmConfig::Single {
                    base_url,
                    api_key,
                    model,
                },
                _,
            ) => {
                let mut f = RouterFile::single(base_url, api_key.clone(), model);
                if let Some(name) = &config.model {
                    f.chains[0].name = name.clone();
                }
                f
            }
            (LlmConfig::RouterFile(_), Some(file)) => file.clone(),
            (LlmConfig::RouterFile(path), None) => {
                anyhow::bail!("the router file {} was not loaded", path.display())
            }
        };
        Self::new(
            file,
            config.model.as_deref(),
            &config.router,
            db,
            clock,
            metrics,
        )
        .map(Some)
    }

    /// Builds a router from a parsed file. `default_model` must name one of its chains.
    pub fn new(
        file: RouterFile,
        default_model: Option<&str>,
        tunables: &RouterTunables,
        db: PgPool,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Router> {
        anyhow::ensure!(!file.chains.is_empty(), "the router has no model chain");
        let mut entries: Vec<Entry> = Vec::new();
        let mut chains = Vec::new();
        for c in &file.chains {
            let mut idx = Vec::new();
            for e in &c.entries {
                let p = file
                    .providers
                    .get(&e.provider)
                    .ok_or_else(|| anyhow::anyhow!("provider `{}` is not defined", e.provider))?;
                let key = entry_key(
                    &p.base_url,
                    &e.model,
                    p.api_key.as_ref().map(secrecy::ExposeSecret::expose_secret),
                );
                let i = match entries.iter().position(|x| x.key == key) {
                    Some(i) => {
                        entries[i].vision |= e.vision;
                        i
                    }
                    None => {
                        entries.push(Entry {
                            key,
                            vision: e.vision,
                            provider: p.name.clone(),
                            model: e.model.clone(),
                            endpoint: Endpoint::new(&p.base_url, p.api_key.clone(), &p.headers)
                                .map_err(|e| anyhow::anyhow!("provider `{}`: {e}", p.name))?,
                        });
                        entries.len() - 1
                    }
                };
                idx.push(i);
            }
            chains.push(Chain {
                name: c.name.clone(),
                stats: idx.iter().map(|_| EntryStats::default()).collect(),
                entries: idx,
                requests: AtomicU64::new(0),
                forced: AtomicU64::new(0),
                unavailable: AtomicU64::new(0),
            });
        }
        let default_chain = match default_model {
            None => 0,
            Some(name) => chains.iter().position(|c| c.name == name).ok_or_else(|| {
                anyhow::anyhow!(
                    "SSHMODE_MODEL is `{name}`, but no model of that name is configured"
                )
            })?,
        };
        Ok(Router {
            chains,
            default_chain,
            entries,
            client: Client::new(tunables.request_timeout)?,
            db,
            clock,
            metrics,
            tunables: tunables.clone(),
        })
    }

    /// The abstract model used when none is named.
    pub fn default_model(&self) -> &str {
        &self.chains[self.default_chain].name
    }

    /// The abstract model names, in configuration order.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.chains.iter().map(|c| c.name.as_str())
    }

    /// Answers `request` with the chain of `model` (the default chain when `None`). The
    /// response's `model` is the abstract name; [`Served`] records the entry that answered.
    pub async fn chat(
        &self,
        model: Option<&str>,
        mut request: ChatRequest,
    ) -> Result<Routed, RouterError> {
        let ci = match model.filter(|m| !m.is_empty()) {
            None => self.default_chain,
            Some(name) => self
                .chains
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| RouterError::UnknownModel(name.to_string()))?,
        };
        let chain = &self.chains[ci];
        chain.requests.fetch_add(1, Ordering::Relaxed);
        let states = self.load_states(chain.entries.iter().copied()).await;
        let now = self.clock.now();
        let mut ready = Vec::new();
        let mut cooling = Vec::new();
        let mut disabled = 0;
        for (pos, &e) in chain.entries.iter().enumerate() {
            match state_of(&states, &self.entries[e]).condition(now) {
                Condition::Ok => ready.push(pos),
                Condition::Cooling(until) => cooling.push((until, pos)),
                Condition::Disabled => disabled += 1,
            }
        }
        // Soonest-ending cooldown first; ties keep chain order.
        cooling.sort_by_key(|(until, _)| *until);

        let mut attempts = Vec::new();
        let forced = cooling.first().map(|(_, pos)| *pos);
        for (pos, is_forced) in ready
            .into_iter()
            .map(|p| (p, false))
            .chain(forced.map(|p| (p, true)))
        {
            let e = chain.entries[pos];
            let entry_state = state_of(&states, &self.entries[e]);
            match self
                .attempt(chain, pos, &mut request, &entry_state, is_forced)
                .await
            {
                Ok((mut response, latency)) => {
                    if is_forced {
                        chain.forced.fetch_add(1, Ordering::Relaxed);
                    }
                    response.model = chain.name.clone();
                    let entry = &self.entries[e];
                    let served = Served {
                        chain: chain.name.clone(),
                        provider: entry.provider.clone(),
                        model: entry.model.clone(),
                        latency,
                        usage: response.usage.unwrap_or_default(),
                        forced: is_forced,
                        failed_attempts: attempts,
                    };
                    return Ok(Routed { response, served });
                }
                Err(a) if a.class == FailureClass::BadRequest => {
                    return Err(RouterError::Rejected(a));
                }
                Err(a) => attempts.push(a),
            }
        }
        chain.unavailable.fetch_add(1, Ordering::Relaxed);
        Err(RouterError::Unavailable {
            chain: chain.name.clone(),
            attempts,
            disabled,
        })
    }

    /// One call to one chain entry, with its bookkeeping (state, stats, metrics, logs).
    async fn attempt(
        &self,
        chain: &Chain,
        pos: usize,
        request: &mut ChatRequest,
        prior: &EntryState,
        forced: bool,
    ) -> Result<(ChatResponse, Duration), Attempt> {
        let entry = &self.entries[chain.entries[pos]];
        let stats = &chain.stats[pos];
        request.model.clone_from(&entry.model);
        let started = Instant::now();
        let without_images;
        let sent = if entry.vision || !crate::llm::wire::has_images(request) {
            &*request
        } else {
            without_images = crate::llm::wire::images_as_text(request);
            &without_images
        };
        let result = self
            .client
            .send(&entry.endpoint, sent, self.clock.now())
            .await;
        let latency = started.elapsed();
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let us = latency.as_micros().min(u64::MAX as u128) as u64;
        stats.latency_us_total.fetch_add(us, Ordering::Relaxed);
        stats.latency_us_max.fetch_max(us, Ordering::Relaxed);
        stats.latency_us_last.store(us, Ordering::Relaxed);
        self.metrics
            .llm_latency_seconds
            .observe(latency.as_secs_f64());
        let outcome = match &result {
            Ok(_) => "ok",
            Err(f) => classify(f).as_str(),
        };
        self.metrics
            .llm_requests
            .get_or_create(&LlmLabels {
                chain: chain.name.clone(),
                provider: entry.provider.clone(),
                model: entry.model.clone(),
                outcome: outcome.into(),
            })
            .inc();
        match result {
            Ok(response) => {
                stats.ok.fetch_add(1, Ordering::Relaxed);
                if !prior.is_clean()
                    && let Err(e) =
                        state::record_success(&self.db, &entry.key, self.clock.now()).await
                {
                    tracing::warn!(error = %e, llm.provider = %entry.provider, llm.model = %entry.model, "could not clear the entry's cooldown");
                }
                tracing::debug!(llm.chain = %chain.name, llm.provider = %entry.provider, llm.model = %entry.model, llm.forced = forced, latency_ms = latency.as_millis() as u64, "model request served");
                Ok((response, latency))
            }
            Err(failure) => {
                let class = classify(&failure);
                stats.failed[class_index(class)].fetch_add(1, Ordering::Relaxed);
                let attempt = self.describe(entry, class, &failure);
                let cooldown = match (&failure, class) {
                    (CallFailure::Status { retry_after, .. }, FailureClass::RateLimited) => {
                        Some(retry_after.unwrap_or(self.tunables.rate_cooldown))
                    }
                    (_, FailureClass::RateLimited) => Some(self.tunables.rate_cooldown),
                    (_, FailureClass::Quota) => Some(self.tunables.quota_cooldown),
                    _ => None,
                };
                // A refused request says nothing about the entry: its state is left alone.
                if class != FailureClass::BadRequest {
                    let label = EntryLabel {
                        key: &entry.key,
                        provider: &entry.provider,
                        model: &entry.model,
                    };
                    if let Err(e) = state::record_failure(
                        &self.db,
                        &label,
                        class,
                        &attempt.message,
                        cooldown,
                        self.clock.now(),
                    )
                    .await
                    {
                        tracing::warn!(error = %e, llm.provider = %entry.provider, llm.model = %entry.model, "could not record the entry's failure");
                    }
                }
                tracing::warn!(
                    llm.chain = %chain.name,
                    llm.provider = %entry.provider,
                    llm.model = %entry.model,
                    llm.class = class.as_str(),
                    llm.forced = forced,
                    llm.status = attempt.status,
                    cooldown_secs = cooldown.map(|d| d.as_secs()),
                    error = %attempt.message,
                    "model request failed"
                );
                Err(attempt)
            }
        }
    }

    fn describe(&self, entry: &Entry, class: FailureClass, f: &CallFailure) -> Attempt {
        let key = entry.endpoint.key_text();
        let (status, code, message) = match f {
            CallFailure::Status {
                status,
                code,
                message,
                ..
            } => (
                Some(*status),
                code.as_deref().map(|c| scrub(c, key)),
                format!("HTTP {status}: {}", scrub(message, key)),
            ),
            CallFailure::Timeout => (None, None, "no reply within the request timeout".into()),
            CallFailure::Connection(m) => (None, None, scrub(m, key)),
            CallFailure::BadReply(m) => (None, None, scrub(m, key)),
        };
        Attempt {
            provider: entry.provider.clone(),
            model: entry.model.clone(),
            class,
            status,
            code,
            message,
        }
    }

    /// Loads the stored state of some entries. A database outage must not stop the agent:
    /// the entries are then treated as clean (and the failure is logged).
    async fn load_states(
        &self,
        entries: impl Iterator<Item = usize>,
    ) -> HashMap<String, EntryState> {
        let keys: Vec<String> = entries.map(|e| self.entries[e].key.clone()).collect();
        match state::load(&self.db, &keys).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "router state unavailable; treating entries as ok");
                HashMap::new()
            }
        }
    }

    /// Probes every cooling entry once with a minimal request; a success clears its cooldown.
    /// Disabled entries are not probed: a rejected key does not heal by itself.
    pub async fn probe_now(&self) -> ProbeReport {
        let states = self.load_states(0..self.entries.len()).await;
        let now = self.clock.now();
        let cooling: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| matches!(state_of(&states, e).condition(now), Condition::Cooling(_)))
            .collect();
        let results = futures_util::future::join_all(cooling.iter().map(|e| self.probe(e))).await;
        ProbeReport {
            probed: results.len(),
            recovered: results.into_iter().filter(|ok| *ok).count(),
        }
    }

    /// Sends every entry one `max_tokens = 1` request, at once, and reports each answer
    /// (`sshmode doctor`). Records nothing: an entry's state is the router's own business.
    pub async fn check_each(&self) -> Vec<EntryCheck> {
        let checks = self.entries.iter().map(|entry| async move {
            let request = ChatRequest {
                model: entry.model.clone(),
                messages: vec![Message::user("ping")],
                max_tokens: Some(1),
                ..Default::default()
            };
            let result = match self
                .client
                .send(&entry.endpoint, &request, self.clock.now())
                .await
            {
                Ok(_) => Ok(()),
                Err(f) => {
                    let class = classify(&f);
                    Err((class, self.describe(entry, class, &f).message))
                }
            };
            EntryCheck {
                provider: entry.provider.clone(),
                model: entry.model.clone(),
                result,
            }
        });
        futures_util::future::join_all(checks).await
    }

    async fn probe(&self, entry: &Entry) -> bool {
        let request = ChatRequest {
            model: entry.model.clone(),
            messages: vec![Message::user("ping")],
            max_tokens: Some(PROBE_MAX_TOKENS),
            ..Default::default()
        };
        match self
            .client
            .send(&entry.endpoint, &request, self.clock.now())
            .await
        {
            Ok(_) => {
                if let Err(e) = state::record_success(&self.db, &entry.key, self.clock.now()).await
                {
                    tracing::warn!(error = %e, "could not clear a probed entry's cooldown");
                    return false;
                }
                tracing::info!(llm.provider = %entry.provider, llm.model = %entry.model, "probe succeeded; entry back in use");
                true
            }
            Err(f) => {
                let class = classify(&f);
                let attempt = self.describe(entry, class, &f);
                if let Err(e) = state::record_probe_failure(
                    &self.db,
                    &entry.key,
                    class,
                    &attempt.message,
                    self.clock.now(),
                )
                .await
                {
                    tracing::warn!(error = %e, "could not record a probe failure");
                }
                tracing::info!(llm.provider = %entry.provider, llm.model = %entry.model, llm.class = class.as_str(), "probe failed; entry still cooling");
                false
            }
        }
    }

    /// Probes on `probe_interval` until `shutdown`; the first round comes one interval after
    /// start.
    pub async fn probe_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let period = self.tunables.probe_interval;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticks.tick() => {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        report = self.probe_now() => {
                            if report.probed > 0 {
                                tracing::debug!(probed = report.probed, recovered = report.recovered, "probe round done");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every chain entry's state, in configuration order.
    pub async fn health(&self) -> Vec<EntryHealth> {
        let states = self.load_states(0..self.entries.len()).await;
        let now = self.clock.now();
        let mut out = Vec::new();
        for c in &self.chains {
            for &e in &c.entries {
                let entry = &self.entries[e];
                let s = state_of(&states, entry);
                let (label, until) = match s.condition(now) {
                    Condition::Ok => ("ok", None),
                    Condition::Cooling(t) => ("cooling", Some(t)),
                    Condition::Disabled => ("disabled", None),
                };
                out.push(EntryHealth {
                    chain: c.name.clone(),
                    provider: entry.provider.clone(),
                    model: entry.model.clone(),
                    state: label,
                    until,
                    reason: if label == "ok" { None } else { s.reason },
                    since: s.disabled_at.filter(|_| label == "disabled"),
                    last_error: s.last_error.map(|l| LastErrorView {
                        class: l.class,
                        message: l.message,
                        at: l.at,
                    }),
                });
            }
        }
        out
    }

    /// The entries that are disabled, once each (an entry in two chains is listed with the
    /// first), in configuration order.
    pub async fn disabled(&self) -> Vec<EntryHealth> {
        let mut seen = std::collections::HashSet::new();
        self.health()
            .await
            .into_iter()
            .filter(|h| h.state == "disabled" && seen.insert(h.name()))
            .collect()
    }

    /// Re-enables the entry `name` (`<provider>/<model>`), audited as `router.enable` by
    /// `actor` in the same transaction. Returns whether it was disabled (enabling an entry
    /// that is not is harmless, and audited too).
    pub async fn enable(&self, name: &str, actor: &str) -> Result<bool, EnableError> {
        let Some(entry) = self
            .entries
            .iter()
            .find(|e| format!("{}/{}", e.provider, e.model) == name)
        else {
            return Err(EnableError::Unknown {
                name: name.to_string(),
                known: self
                    .entries
                    .iter()
                    .map(|e| format!("{}/{}", e.provider, e.model))
                    .collect(),
            });
        };
        let now = self.clock.now();
        let before = state::load(&self.db, std::slice::from_ref(&entry.key))
            .await?
            .remove(&entry.key)
            .unwrap_or_default();
        let mut tx = self.db.begin().await?;
        let was = state::enable(&mut tx, &entry.key, now).await?;
        crate::audit::record(
            &mut tx,
            crate::audit::Entry {
                actor,
                action: "router.enable",
                subject: name,
                detail: serde_json::json!({
                    "was_disabled": was,
                    "disabled_at": before.disabled_at,
                    "reason": before.reason.map(FailureClass::as_str),
                }),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(was)
    }

    /// Request counts and latency per chain entry and per chain, since this process started.
    pub fn stats(&self) -> (Vec<EntryStatsView>, Vec<ChainStatsView>) {
        let mut entries = Vec::new();
        let mut chains = Vec::new();
        let ms = |us: u64| us as f64 / 1000.0;
        for c in &self.chains {
            for (pos, &e) in c.entries.iter().enumerate() {
                let s = &c.stats[pos];
                let requests = s.requests.load(Ordering::Relaxed);
                let failures: HashMap<&'static str, u64> = CLASSES
                    .iter()
                    .map(|cl| {
                        (
                            cl.as_str(),
                            s.failed[class_index(*cl)].load(Ordering::Relaxed),
                        )
                    })
                    .collect();
                entries.push(EntryStatsView {
                    chain: c.name.clone(),
                    provider: self.entries[e].provider.clone(),
                    model: self.entries[e].model.clone(),
                    requests,
                    ok: s.ok.load(Ordering::Relaxed),
                    failed: failures.values().sum(),
                    failures,
                    latency_ms_avg: if requests == 0 {
                        0.0
                    } else {
                        ms(s.latency_us_total.load(Ordering::Relaxed)) / requests as f64
                    },
                    latency_ms_max: ms(s.latency_us_max.load(Ordering::Relaxed)),
                    latency_ms_last: ms(s.latency_us_last.load(Ordering::Relaxed)),
                });
            }
            chains.push(ChainStatsView {
                name: c.name.clone(),
                requests: c.requests.load(Ordering::Relaxed),
                forced: c.forced.load(Ordering::Relaxed),
                unavailable: c.unavailable.load(Ordering::Relaxed),
            });
        }
        (entries, chains)
    }
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

fn state_of(states: &HashMap<String, EntryState>, entry: &Entry) -> EntryState {
    states.get(&entry.key).cloned().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_key_changes_with_url_model_and_key_only() {
        let a = entry_key("https://a/v1", "m", Some("k1"));
        assert_eq!(a, entry_key("https://a/v1", "m", Some("k1")));
        assert_ne!(a, entry_key("https://a/v1", "m", Some("k2")));
        assert_ne!(a, entry_key("https://a/v1", "m2", Some("k1")));
        assert_ne!(a, entry_key("https://b/v1", "m", Some("k1")));
        assert!(!a.contains("k1"));
    }

    #[test]
    fn unavailable_message_is_short_and_names_the_entries() {
        let a = Attempt {
            provider: "p".into(),
            model: "m".into(),
            class: FailureClass::Quota,
            status: Some(429),
            code: None,
            message: "x".into(),
        };
        let text = unavailable_text("coder", std::slice::from_ref(&a), 1);
        assert!(
            text.contains("`coder`") && text.contains("p/m: quota"),
            "{text}"
        );
        assert!(text.contains("1 entry is disabled"), "{text}");
        assert!(text.contains("sshmode router enable"), "{text}");
        // Waiting helps when only a quota ran out; a rejected key, now or before, needs a person.
        let quota = RouterError::Unavailable {
            chain: "coder".into(),
            attempts: vec![a.clone()],
            disabled: 0,
        };
        assert!(!quota.needs_operator());
        assert!(!quota.to_string().contains("operator"), "{quota}");
        let auth = Attempt {
            class: FailureClass::Auth,
            ..a.clone()
        };
        for e in [
            RouterError::Unavailable {
                chain: "coder".into(),
                attempts: vec![a.clone()],
                disabled: 1,
            },
            RouterError::Unavailable {
                chain: "coder".into(),
                attempts: vec![auth],
                disabled: 0,
            },
        ] {
            assert!(e.needs_operator(), "{e}");
            assert!(e.to_string().contains("an operator fixes the key"), "{e}");
        }
    }
}
