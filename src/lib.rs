//! sshmode: an AI agent for Feishu/Lark chats whose work runs on the service's own machine or
//! on an admin-approved SSH target, chosen per conversation thread.
//!
//! Read the modules in the order an event travels: [`http`] receives it, [`lark`] verifies and
//! parses it, [`inbox`] makes it durable and hands it to a worker, [`frontend`] turns it into
//! a chat message, [`chat`] decides what it means, [`turns`] and [`agent`] run the turn, and
//! the task tools act through [`exec`] on the thread's backend. [`llm`] is model access;
//! [`store`], [`vault`], [`target`] and [`audit`] are the control plane's state; [`authz`]
//! decides who may do what; [`schedule`] and [`scheduler`] fire turns at set times; [`lifecycle`] keeps stored content only as long as it should be and takes it back (retention, erasure, recalls); [`mcp`] is a second door to the same tools for MCP clients; [`app`]
//! builds it all. ARCHITECTURE.md has the layers, the map and the invariants.

pub mod agent;
pub mod app;
pub mod audit;
pub mod authz;
pub mod bash;
pub mod chat;
pub mod clock;
pub mod config;
pub mod console;
pub mod eventlog;
pub mod exec;
pub mod frontend;
pub mod gate;
pub mod http;
pub mod inbox;
pub mod lark;
pub mod lifecycle;
pub mod llm;
pub mod mask;
pub mod mcp;
pub mod metrics;
pub mod plane;
pub mod progress;
pub mod schedule;
pub mod scheduler;
pub mod store;
pub mod target;
pub mod telemetry;
pub mod turns;
pub mod vault;
pub mod workspace;

/// Installs ring as rustls' process-wide crypto provider (we build rustls without aws-lc).
/// Idempotent; called by every entry point that may make a TLS connection.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
