//! Black-box tests of sshmode against a real PostgreSQL (TEST_DATABASE_URL, which
//! `scripts/test.sh` provides) and fakes of the services that cannot run here.

mod agent;
mod agent_chat;
mod approvals;
mod audit;
mod chat_control;
mod console;
mod control_plane;
mod database;
mod deploy;
mod doctor;
#[allow(dead_code)]
mod dropbear;
mod embedded_cluster;
mod exec;
mod exec_ssh;
#[allow(dead_code)]
mod fake_lark;
#[allow(dead_code)]
mod fake_llm;
mod fake_ws;
mod foundation;
mod gate_parity;
#[allow(dead_code)]
mod helpers;
mod isolation;
mod jump;
mod lark_client;
mod lark_flow;
mod lark_http;
mod lark_inbox;
mod lark_support;
mod lark_webhook;
mod lark_ws;
mod lifecycle;
mod live_output;
mod llm;
mod local_sandbox;
mod mcp;
mod ops_cli;
mod progress;
mod rich_input;
mod schedules;
mod secrets_masked;
mod ssh_files;
mod ssh_kill;
mod ssh_trust;
#[allow(dead_code)]
mod sshd;
mod target_import;
mod terminals;
mod upgrade;
mod vault;
mod workspaces;
