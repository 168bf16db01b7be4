//! The local control plane: what the agent keeps in the service's own store rather than on a
//! backend — memory (notes per chat, [`memory`]) and skills (runbooks per chat, which an admin
//! may share with every chat, [`skills`], with the built-in SSH Mode skill) — behind the
//! `memory` and `skills` tools, the admin's `sshmode skill …` commands ([`cli`]), and the
//! secret filter both tools go through ([`secrets`]).
//!
//! Everything here is the same whatever a section's backend: no function takes or resolves a
//! [`crate::exec::Backend`] (invariant 3). Never: stores a text the secret filter refuses,
//! echoes a refused secret, lets one chat read another chat's notes, or lets one chat's model
//! see or change another chat's skills (only an admin's promotion shares one).
//!
//! # In detail
//!
//! `memory` and `skills` are control-plane tools. The agent's tool dispatch (`agent::tools`)
//! hands them to `ControlPlane::call(tool, Caller { section, chat_id }, args)` *before* any
//! backend is resolved, so they never see a `Backend` (invariant 3) and behave the same in a
//! local and a bound section.
//!
//! - `control::memory` owns `memory_notes` (`chat_id`, `section_id`, `content`, `created_by`):
//!   every query names the chat, so notes never cross chats (a one-to-one chat's id is unique to
//!   its user). `add` takes a per-chat advisory lock to hold the 50-note bound; `add` and
//!   `remove` write their audit row (`memory.add`, `memory.remove`) in the same transaction.
//!   `agent::prompt` appends `prompt_block`: the notes on one line each inside `<notes>…</notes>`,
//!   introduced as facts and not instructions. `chat::dispatch` answers `/memory list` and
//!   `/memory forget <id>` from the same module (actor: the user's open_id).
//! - `control::skills` owns `skills` (name, description, body, `chat_id`, `promoted_by|at`). A
//!   skill's text goes back to a model, so it is scoped like a note: every query names the
//!   viewer (`Viewer::Chat` for the tool, `Viewer::Operator` for the CLI), and a chat sees its
//!   own skills and promoted ones only; `manage` changes only its chat's unpromoted rows. Names
//!   stay unique in the deployment, so `sshmode skill promote <name>` (`control::cli`) is never
//!   ambiguous. The built-in `ssh-mode` skill is `include_str!("ssh_mode_skill.md")`, never a
//!   row (the table CHECKs the name), listed first and refused by every `manage` op. Changes are
//!   serialised by an advisory lock and audited (`skill.create|update|delete|promote`, refusals
//!   of a promoted skill too) in their transaction.
//! - `control::secrets::SecretFilter` screens every text before it is stored: a private-key
//!   block, the service's own secrets (taken from `Config` at start-up), then target secrets
//!   through `target::holds_secret`, which reads the sealed rows and calls
//!   `Vault::contains_secret`: the records are opened, compared and wiped inside `vault.rs`, and
//!   only a boolean leaves (invariant 4). A refusal names the kind of secret, never its text.

pub mod cli;
pub mod memory;
pub mod secrets;
pub mod skills;

use std::sync::Arc;

use serde_json::{Map, Value, json};
use sqlx::PgPool;

use crate::config::Config;
use crate::llm::Tool;
use crate::llm::args::Args;
use crate::vault::Vault;

pub use secrets::{Leak, SecretFilter};

/// The control plane's handles: the database and the secret filter.
pub struct ControlPlane {
    db: PgPool,
    filter: SecretFilter,
}

/// Where a tool call comes from.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub section: &'a str,
    /// The chat: the scope of notes and skills.
    pub chat_id: &'a str,
}

impl Caller<'_> {
    /// The audit actor of a change the model makes.
    fn actor(&self) -> String {
        format!("model:{}", self.section)
    }
}

impl ControlPlane {
    pub fn new(config: &Config, db: PgPool, vault: Arc<Vault>) -> ControlPlane {
        ControlPlane {
            filter: SecretFilter::new(config, vault),
            db,
        }
    }

    /// The plane, counting the masks of its secret filter in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> ControlPlane {
        self.filter = self.filter.with_metrics(metrics);
        self
    }

    /// Whether this is a control-plane tool.
    pub fn owns(tool: &str) -> bool {
        matches!(tool, "memory" | "skills")
    }

    /// The tool definitions (JSON schemas) of `memory` and `skills`.
    pub fn definitions() -> Vec<Tool> {
        vec![
            Tool::function(
                "memory",
                "Short notes kept for this chat in the service's own store (never on the backend; the same on every backend). add a note (`content`), list them, or remove one (`id`). Notes are shown to you in later turns. Never store passwords, keys or tokens: they are refused.",
                json!({"type": "object", "properties": {
                    "action": {"type": "string", "enum": ["add", "list", "remove"]},
                    "content": {"type": "string", "maxLength": memory::NOTE_MAX_CHARS, "description": "The note, for add."},
                    "id": {"type": "integer", "minimum": 1, "description": "The note's id, for remove."}
                }, "required": ["action"], "additionalProperties": false}),
            ),
            Tool::function(
                "skills",
                "Runbooks in Markdown kept for this chat in the service's own store, plus those an admin shared with every chat. list them, view one (`name`), or manage one of this chat's (`op` create, update or delete; `name`, `description`, `body`). A skill you create is seen only in this chat. The built-in `ssh-mode` skill and shared skills are read-only.",
                json!({"type": "object", "properties": {
                    "action": {"type": "string", "enum": ["list", "view", "manage"]},
                    "name": {"type": "string", "maxLength": skills::NAME_MAX},
                    "op": {"type": "string", "enum": ["create", "update", "delete"]},
                    "description": {"type": "string", "maxLength": skills::DESCRIPTION_MAX},
                    "body": {"type": "string", "maxLength": skills::BODY_MAX}
                }, "required": ["action"], "additionalProperties": false}),
            ),
        ]
    }

    /// Runs a `memory` or `skills` call. `Err` is the failure text for the model.
    pub async fn call(
        &self,
        tool: &str,
        caller: Caller<'_>,
        args: &Map<String, Value>,
    ) -> Result<String, String> {
        let a = Args::new(tool, args);
        match tool {
            "memory" => self.memory(caller, &a).await,
            "skills" => self.skills(caller, &a).await,
            _ => Err(format!("`{tool}` is not a control-plane tool")),
        }
    }

    /// The notes block of the system prompt for `chat_id` (empty when there are none).
    pub async fn prompt_notes(&self, chat_id: &str) -> anyhow::Result<String> {
        Ok(memory::prompt_block(
            &memory::list(&self.db, chat_id).await?,
        ))
    }

    /// The secret filter (the service's own keys, target secrets, private-key blocks).
    pub fn filter(&self) -> &SecretFilter {
        &self.filter
    }

    /// Runs the secret filter on `text`; a refusal or a failure to check is the error text.
    async fn screen(&self, what: &str, text: &str) -> Result<(), String> {
        match self.filter.check(&self.db, text).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(r)) => Err(format!("refused: the {what} was not stored because {r}")),
            Err(e) => Err(format!(
                "the {what} was not stored: the secret check failed ({e:#})"
            )),
        }
    }

    async fn memory(&self, caller: Caller<'_>, a: &Args<'_>) -> Result<String, String> {
        let db = &self.db;
        let failed = |e: anyhow::Error| format!("memory failed: {e:#}");
        match a.str("action")?.as_str() {
            "list" => {
                a.only(&["action"])?;
                let notes = memory::list(db, caller.chat_id).await.map_err(failed)?;
                Ok(memory::render_for_model(&notes))
            }
            "add" => {
                a.only(&["action", "content"])?;
                let content = a.str("content")?;
                let content = memory::check_size(&content).map_err(|e| e.to_string())?;
                self.screen("note", &content).await?;
                let id = memory::add(
                    db,
                    caller.chat_id,
                    caller.section,
                    &caller.actor(),
                    &content,
                )
                .await
                .map_err(failed)?
                .map_err(|e| e.to_string())?;
                Ok(format!("noted as [{id}]"))
            }
            "remove" => {
                a.only(&["action", "id"])?;
                let id = a.id("id")?;
                memory::remove(db, caller.chat_id, caller.section, &caller.actor(), id)
                    .await
                    .map_err(failed)?
                    .map_err(|e| e.to_string())?;
                Ok(format!("removed note [{id}]"))
            }
            _ => Err(a.bad("`action` must be one of add, list, remove".into())),
        }
    }

    async fn skills(&self, caller: Caller<'_>, a: &Args<'_>) -> Result<String, String> {
        let db = &self.db;
        let failed = |e: anyhow::Error| format!("skills failed: {e:#}");
        let viewer = skills::Viewer::Chat(caller.chat_id);
        match a.str("action")?.as_str() {
            "list" => {
                a.only(&["action"])?;
                let all = skills::list(db, viewer).await.map_err(failed)?;
                let mut s = String::from("Skills (view one with action=view, name=…):\n");
                for k in all {
                    s.push_str(&format!(
                        "- {}{}: {}\n",
                        k.name,
                        label(&k.scope, k.builtin),
                        k.description
                    ));
                }
                Ok(s)
            }
            "view" => {
                a.only(&["action", "name"])?;
                let name = a.str("name")?;
                match skills::view(db, viewer, &name).await.map_err(failed)? {
                    Some(k) => Ok(format!(
                        "# skill `{}`{}\n{}\n\n{}",
                        k.name,
                        label(&k.scope, k.builtin),
                        k.description,
                        k.body
                    )),
                    None => Err(format!(
                        "there is no skill `{}`; list them with action=list",
                        name.chars().take(skills::NAME_MAX).collect::<String>()
                    )),
                }
            }
            "manage" => {
                a.only(&["action", "op", "name", "description", "body"])?;
                let op_text = a.str("op")?;
                let op = skills::Op::parse(&op_text)
                    .ok_or_else(|| a.bad("`op` must be one of create, update, delete".into()))?;
                let name = a.str("name")?;
                let description = a.opt_str("description")?;
                let body = a.opt_str("body")?;
                skills::check(op, &name, description.as_deref(), body.as_deref())
                    .map_err(|e| e.to_string())?;
                if op != skills::Op::Delete {
                    let text = format!(
                        "{name}\n{}\n{}",
                        description.as_deref().unwrap_or_default(),
                        body.as_deref().unwrap_or_default()
                    );
                    self.screen("skill", &text).await?;
                }
                skills::manage(
                    db,
                    &caller.actor(),
                    caller.chat_id,
                    caller.section,
                    op,
                    &name,
                    description.as_deref(),
                    body.as_deref(),
                )
                .await
                .map_err(failed)?
                .map_err(|e| e.to_string())?;
                Ok(format!("skill `{name}`: {op_text} done"))
            }
            _ => Err(a.bad("`action` must be one of list, view, manage".into())),
        }
    }
}

/// How the `skills` tool marks a skill the model cannot change.
fn label(scope: &skills::Visibility, builtin: bool) -> &'static str {
    match (builtin, scope) {
        (true, _) => " (built-in, read-only)",
        (false, skills::Visibility::Shared) => " (shared with every chat by an admin, read-only)",
        _ => "",
    }
}
