//! The domain of SSH Mode in chats: the typed commands ([`command`]), the dispatcher
//! ([`dispatch`]), bindings of sections to targets ([`binding`]), the model's grants
//! ([`grant`]), the operations that combine them with their audit rows, each decided by
//! [`crate::authz`] ([`change`]), admin approval of targets ([`target_approval`]) and the
//! model's side of SSH Mode ([`model_api`]).
//!
//! A section is a thread (`omt_…`) or, for messages outside threads, a chat (`oc_…`).
//! Never: imports the platform. It answers through [`Reply`] and reaches admins through
//! [`AdminChannel`]; `lark` implements both, and a terminal console can too.
//!
//! # In detail
//!
//! | path | owns | never |
//! |---|---|---|
//! | `command.rs` | the typed `Command` enum; the `commands!` macro makes the enum, the help table and each usage line from one declaration; NFKC + lower-cased keywords; aliases by `target::valid_alias` (the one alias rule, also a database CHECK, reserved words included) | effects |
//! | `port.rs` | the domain's edges: `Incoming`, `Reply`, `AdminChannel`, `AgentPort` + `AgentRequest`  | platform types |
//! | `dispatch.rs` | one message → its effects and answer; `/ssh use` from a parent chat (pending binding keyed by the message id = the thread's `root_id`, with the generation checked; reply opening the thread, then the sticky binding and the thread's owner; 230071 → suggest `--here`); **what starts a turn**: a message that is not a command and is addressed (an @mention of the bot, or a p2p chat) or is in a thread the bot is in | knowing the platform |
//! | `input.rs` | what a message quotes, forwards and carries, made whole before its turn is queued: the parent (once per section; not a thread's root) and a bundle's messages read through `Source` and bounded; files downloaded under `SSHMODE_ATTACHMENT_MAX_MB` and placed in `attachments/` of the section's workspace on its backend (at `read`: its tmp), the model told path, size and type; images kept for the turn | keeping anything over the cap; retrying 234043; falling back to local |
//! | `threads.rs` | `bot_threads`: the threads the bot opened (recorded with the completed pending binding, in its transaction) or answered in (recorded when the dispatcher answers or queues a turn there) | deciding what a message means |
//! | `change.rs` | the operations (bind, release, grant on/off, decide, report, complete pending): facts + state loaded in one transaction, the act's decision in `crate::authz` (`bind`, `release`, `grant`, `revoke_grants`, `decide_target`), change, audit row (refusals too) in that transaction | wording answers; deciding who may |
//! | `binding.rs` | `bindings` (one per section, the primary key; each records its chat and target generation), `pending_bindings` and `section_owners`; `resolve_use(db, section, now)` — the backend at call time, an expired model-made binding released first, and in the same read the check that the target still exists in the bound generation and allows the bound chat (`BindingFails` otherwise) | falling back to local when a target fails or a binding no longer passes |
//! | `grant.rs` | `grants` (one open grant per section and scope, a unique partial index); expiry closes them lazily with audit rows | deciding who may grant |
//! | `target_approval.rs` | approval cards to each admin for pending targets (a notifier loop, one card per target generation and admin), clicks applied once per (message, operator, value) and only to what the card showed (pending, its generation, its host key), cards PATCHed with the decision or as expired | answering a click with more than a toast |
//! | `model_api.rs` | the model's side: `status`, `list_targets`, `request_use`, `request_local` → short texts | secrets, key paths |
//! | `render.rs` | status and list texts | secrets |
//!
//! **Bindings and grants live in Postgres** and are read on every use, so another replica or a
//! restart sees a change at once. Changes to one section are serialised by a transaction-scoped
//! advisory lock on the section. A sticky binding is a user's (`/ssh use`). A thread has an
//! **owner** (`section_owners`): who opened it with `/ssh use` from its chat, else the first user
//! to bind it; only the owner or an admin binds, switches or opens it to the model (`/ssh yolo
//! on`), bound or not, while anyone may return it to local. A chat's own section has no owner: a
//! group chat is bound in place by admins only, a one-to-one chat by its user. A model-made
//! binding names the grant that allowed it and lives no longer: `binding::current` releases it
//! when the grant expired or was revoked (`binding.expire`, actor `system`). A binding has no
//! foreign key to its target, and records the chat it was made in and the target generation it
//! was made for: every tool call's read (`resolve_use`) checks both against the registry and the
//! allow-list in the query that finds the binding. A removed target, a re-added alias (another
//! generation) or a chat taken off the allow-list leaves the thread bound to a target that fails —
//! never quietly local: each call fails with the reason (`binding.use` refused, actor `model`), the
//! thread is told once (`bindings.told_at`, a reply whose uuid names the binding), and `/ssh
//! local` or a new `/ssh use` frees it.
//!
//! **Target approval.** A target added without `--approve` is pending; the notifier sends each
//! admin a card 2.0 (`receive_id_type=open_id`). A click arrives as `card.action.trigger`: the
//! callback answers at once with a toast (computed from `SSHMODE_ADMINS` without I/O) and
//! records the event as express; the worker applies the decision through
//! `authz::decide_target` and `target::decide_shown`: only to a target still `pending` in the
//! generation the card's button names, and an approval only while the host key is the one the
//! card showed (the key it pins). Then it PATCHes every admin's card by message id; a click
//! that no longer applies is audited (`target.decide` refused, `expired`) and its card PATCHed
//! to say it expired. `/ssh approve|reject` decide by text (`target::set_status`). Targets may
//! be limited to chats with `sshmode target allow` (`target_chats`; none = every chat).
//!
//! **Audit.** `audit::record_chat` writes actor (open_id, `model`, `system`, `operator`), section,
//! target, action and outcome (`ok`, `refused`, `approved`, `rejected`) in the transaction of the
//! change; target status changes keep their own `target.*` rows from the registry.

pub mod binding;
pub mod change;
pub mod command;
pub mod cron;
pub mod dispatch;
pub mod grant;
pub mod input;
pub mod leave;
pub mod model_api;
pub mod port;
pub mod render;
pub mod ssh_mode;
pub mod target_approval;
pub mod threads;

pub use crate::agent::{NO_MODEL, NOTHING_RUNNING};
pub use dispatch::{Deps, dispatch};
pub use port::{
    AdminChannel, AgentPort, AgentRequest, AnchorPlace, Anchors, FileRef, Incoming, Quoted, Reply,
    Source, TargetApprovalView, TargetCardState, ThreadError, Toast, Unavailable,
};
pub use ssh_mode::ChatBindings;
