//! Model access: the OpenAI-compatible client ([`client`], [`wire`]), failure classification
//! ([`classify`]), entry state in Postgres ([`state`]) and the router that walks fallback
//! chains, cools entries down and probes them back ([`router`]). Its HTTP surface
//! (`/router/health`, `/router/stats`, `POST /v1/chat/completions`) is [`crate::http::router`].
//!
//! Knows nothing of tools' effects: it carries tool definitions and calls, never runs them. It
//! never logs or returns an API key, and never retries underneath the router's own chain.
//!
//! # In detail
//!
//! | path | owns | never |
//! |---|---|---|
//! | `llm/wire.rs` | the chat-completions wire types, tolerant of provider quirks (null/missing/array `content`, integer or repeated tool-call ids, non-JSON `arguments`, odd finish reasons, unknown fields kept and passed through); `ChatResponse::normalize` | deciding anything |
//! | `llm/client.rs` | one `reqwest::Client` (timeout, reqwest retries off), one `Endpoint` per entry (URL, sensitive `Authorization`, extra headers); parses replies and error bodies into `CallFailure` | retrying, logging keys |
//! | `llm/args.rs` | `Args`: a tool call's argument object, checked per accessor, with the error the model receives naming the tool and the argument (used by the task tools and the control-plane tools) | deciding what a tool does |
//! | `llm/classify.rs` | `CallFailure` → `FailureClass` (code, then message, then status); `scrub` for provider messages | I/O |
//! | `llm/state.rs` | entry state rows in `llm_entry_state` (cooling until / why / disabled / failure streak / last error) | reading the clock (times are passed in) |
//! | `llm/cli.rs` | `sshmode router status` and `router enable <provider>/<model>` (audited `router.enable`) | changing an entry's configuration |
//! | `llm/router.rs` | `Router::chat` (walk the chain, react per class, forced try), `probe_now` / `probe_loop`, `health`, `stats`, per-process counters and metrics | tools |
//! | `http/router.rs` | `/router/health`, `/router/stats` (behind `SSHMODE_API_TOKEN` when set), `/v1/chat/completions` (token → one of 32 places → bounded body read), `/v1/models` | internal detail or keys in responses; reading a body before the token is checked |
//!
//! **A request's path.** `Router::chat(model, request)` picks the chain (the default is
//! `SSHMODE_MODEL` or the first), reads the state of its entries in one query, and tries the
//! entries that are ok in order; each failure is classified and stored (one upsert — so concurrent
//! failures count right — that never shortens a longer cooldown another replica set). A bad
//! request ends the walk at once. If nothing answered and some entry is cooling, the one whose
//! cooldown ends soonest gets one forced try. The reply's `model` becomes the abstract name, and
//! `Served` records the entry, latency, usage and the failed attempts before it — the record the
//! agent writes to the event log.
//!
//! **Identity of an entry** is a digest of base URL, model and a fingerprint of the key, so the
//! same provider model in two chains shares one state, and a corrected key or URL starts clean
//! (this is how "disabled until the configuration changes" works by itself). A key the provider
//! rejected disables its entry for every replica until a person acts: a corrected key in the
//! configuration, or `sshmode router enable` once the provider accepts it again. Disabled entries
//! are shown with since when and why by `/readyz` (degraded, still 200: a load balancer must not
//! pull every replica for one bad key), `doctor`, the start-up log and `/router/health`, and the
//! chat's answer says an operator must act.
//!
//! **Decisions.**
//! - Keys never appear in the router file; `Config` reads the file at load and resolves the
//!   variables it names through the same lookup as every other variable — `config.rs` stays the
//!   only reader of the environment, tests inject keys as plain variables, and a bad file fails at
//!   start-up. TOML parse errors are reported by line and reason only (the parser would quote the
//!   line, which might hold a pasted key).
//! - Cooldown state is read from PostgreSQL on every request (one indexed query) rather than
//!   cached, so replicas agree at once; the benchmark shows the cost is well inside the budget. If
//!   the database is unreachable the router treats every entry as ok rather than stopping the
//!   agent.
//! - Time comes from the app's `Clock`; probes run on a tokio interval on the `TaskTracker`
//!   (first round one interval after start), and `probe_now()` lets tests drive them.
//! - A failing probe records its error but leaves the cooldown as it was: a quota still empty at
//!   a probe must not push recovery further away.
//! - Request counts and latency are per process (atomics), not stored: they describe this
//!   replica's traffic; the cooldowns are what must be shared.
//! - No streaming on `/v1/chat/completions`: the agent does not need it, and a half-streamed reply
//!   cannot fall back to the next entry.
//! - `/v1/chat/completions` reads nothing of a body (up to 16 MiB) before the bearer token is
//!   checked — also while the endpoint is off — and a place among 32 is taken; past that the
//!   answer is 503 `server_busy` at once. `/router/health` and `/router/stats` show scrubbed
//!   provider errors, so they need the same token while it is set; `/metrics` carries only
//!   configured names and failure classes, never a provider's message.

pub mod args;
pub mod classify;
pub mod cli;
pub mod client;
pub mod router;
pub mod state;
pub mod wire;

pub use classify::FailureClass;
pub use router::{Attempt, ProbeReport, Routed, Router, RouterError, Served};
pub use wire::{ChatRequest, ChatResponse, Message, Tool, ToolCall};
