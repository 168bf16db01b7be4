//! The Lark/Feishu platform, as a library: callback verification and decryption
//! ([`webhook`]), event types ([`event`]) and a card message read as text ([`card_text`]),
//! the Open API client with its token cache, rate lanes and the deployment's shared budgets
//! ([`client`], [`lane`], [`budget`]), and the markup rules that keep text inert ([`markup`]).
//!
//! Never: decides what a message means or imports the layers that do (the Lark front-end,
//! [`crate::frontend`], turns events into chat calls; `POST /lark/events` lives in
//! [`crate::http`]).

pub mod budget;
pub mod card_text;
pub mod client;
pub mod event;
pub mod frame;
pub mod json;
pub mod lane;
pub mod markup;
pub mod webhook;
pub mod ws;
