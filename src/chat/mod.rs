//! The domain of SSH Mode in chats: the typed commands ([`command`]), the dispatcher
//! ([`dispatch`]), bindings of sections to targets ([`binding`]), the model's grants
//! ([`grant`]), the one authorisation function ([`authz`]), the operations that combine them
//! with their audit rows ([`control`]), admin approval of targets ([`approval`]) and the
//! model's side of SSH Mode ([`model_api`]).
//!
//! A section is a thread (`omt_…`) or, for messages outside threads, a chat (`oc_…`).
//! Never: imports the platform. It answers through [`Reply`] and reaches admins through
//! [`AdminChannel`]; `lark` implements both, and a terminal console can too.

pub mod approval;
pub mod authz;
pub mod binding;
pub mod command;
pub mod control;
pub mod dispatch;
pub mod grant;
pub mod model_api;
pub mod port;
pub mod render;
pub mod section_control;
pub mod threads;

pub use crate::agent::{NO_MODEL, NOTHING_RUNNING};
pub use dispatch::{Deps, dispatch};
pub use port::{
    AdminChannel, AgentPort, ApprovalView, CardState, Incoming, Reply, ThreadError, TurnRequest,
};
pub use section_control::ChatControl;
