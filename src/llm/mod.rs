//! Model access: the OpenAI-compatible client ([`client`], [`wire`]), failure classification
//! ([`classify`]), entry state in Postgres ([`state`]) and the router that walks fallback
//! chains, cools entries down and probes them back ([`router`]). Its HTTP surface
//! (`/router/health`, `/router/stats`, `POST /v1/chat/completions`) is [`crate::http::router`].
//!
//! Knows nothing of tools' effects: it carries tool definitions and calls, never runs them. It
//! never logs or returns an API key, and never retries underneath the router's own chain.

pub mod args;
pub mod classify;
pub mod client;
pub mod router;
pub mod state;
pub mod wire;

pub use classify::FailureClass;
pub use router::{Attempt, ProbeReport, Routed, Router, RouterError, Served};
pub use wire::{ChatRequest, ChatResponse, Message, Tool, ToolCall};
