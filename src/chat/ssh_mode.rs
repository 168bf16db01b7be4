//! Where chat control meets the agent, in both directions: [`ChatBindings`] is the agent's
//! [`Bindings`] (the section's binding and the model's side of SSH Mode, from
//! [`super::binding`] and [`super::model_api`]), and [`Agent`] is the dispatcher's
//! [`AgentPort`]. Translation only: no decisions are made here, so authorisation stays in
//! [`crate::authz`] and turn order in `turns`.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::PgPool;

use super::model_api::{self, Here};
use super::{AgentPort, AgentRequest, binding};
use crate::agent::{Agent, BindingFails, Bindings, SshModeAction};
use crate::clock::Clock;
use crate::exec::Place;

/// Chat control as the agent sees it: bindings read from Postgres at every call.
pub struct ChatBindings {
    pub db: PgPool,
    pub clock: Arc<dyn Clock>,
    /// `SSHMODE_YOLO_TTL_HOURS`: how long a model-made binding may outlive nothing.
    pub yolo_ttl: std::time::Duration,
    /// What the model's `cron` proposals are held to.
    pub schedules: super::cron::Rules,
}

impl ChatBindings {
    /// Chat control for the agent, held to `config`'s grant lifetime and schedule rules.
    pub fn new(db: PgPool, clock: Arc<dyn Clock>, config: &crate::config::Config) -> Self {
        ChatBindings {
            db,
            clock,
            yolo_ttl: config.chat.yolo_ttl,
            schedules: super::cron::Rules {
                timezone: config.chat.timezone.clone(),
                min: config.chat.schedule_min,
                max_per_chat: config.chat.schedule_max_per_chat,
            },
        }
    }
}

#[async_trait]
impl Bindings for ChatBindings {
    async fn place(&self, section: &str) -> anyhow::Result<Place> {
        match binding::resolve_use(&self.db, section, self.clock.now()).await? {
            Ok(place) => Ok(place),
            Err(fails) => Err(anyhow::Error::new(fails)),
        }
    }

    async fn refused_call(
        &self,
        section: &str,
        fails: &BindingFails,
        tool: &str,
    ) -> anyhow::Result<bool> {
        binding::refused_call(&self.db, section, fails, tool).await
    }

    async fn told(&self, section: &str, fails: &BindingFails) -> anyhow::Result<()> {
        Ok(binding::told(&self.db, section, fails, self.clock.now()).await?)
    }

    async fn ssh_mode(
        &self,
        section: &str,
        chat_id: &str,
        action: SshModeAction,
        target: Option<&str>,
    ) -> anyhow::Result<String> {
        let here = Here { section, chat_id };
        let now = self.clock.now();
        match action {
            SshModeAction::Status => model_api::status(&self.db, now, here).await,
            SshModeAction::ListTargets => model_api::list_targets(&self.db, here).await,
            SshModeAction::RequestUse => match target {
                Some(alias) => {
                    model_api::request_use(&self.db, now, self.yolo_ttl, here, alias).await
                }
                None => Ok(
                    "request_use needs `target`: the alias of the target to enter \
                            (list_targets shows them)."
                        .to_string(),
                ),
            },
            SshModeAction::RequestLocal => model_api::request_local(&self.db, now, here).await,
        }
    }

    async fn cron_list(&self, chat_id: &str) -> anyhow::Result<String> {
        super::cron::list_for_model(&self.db, chat_id, self.clock.now()).await
    }

    async fn cron_propose(
        &self,
        asked: &crate::agent::ProposalAsk<'_>,
        schedule: &str,
        prompt: &str,
    ) -> anyhow::Result<Result<crate::schedule::ProposalView, String>> {
        super::cron::propose(
            &self.db,
            &self.schedules,
            self.clock.now(),
            asked,
            schedule,
            prompt,
        )
        .await
    }

    async fn cron_card(&self, proposal: i64, message_id: &str) -> anyhow::Result<()> {
        Ok(crate::schedule::set_proposal_card(&self.db, proposal, message_id).await?)
    }
}

fn turn_request(req: &AgentRequest) -> crate::turns::TurnRequest {
    crate::turns::TurnRequest {
        section: req.section.clone(),
        chat_id: req.chat_id.clone(),
        message_id: req.message_id.clone(),
        sender: req.sender_open_id.clone(),
        text: req.text.clone(),
        in_thread: req.in_thread,
    }
}

#[async_trait]
impl AgentPort for Agent {
    async fn enqueue(&self, req: &AgentRequest) -> anyhow::Result<Option<String>> {
        if !self.has_model() {
            return Ok(Some(crate::agent::NO_MODEL.to_string()));
        }
        self.accept(&turn_request(req)).await?;
        Ok(None)
    }

    async fn enqueue_scheduled(
        &self,
        req: &AgentRequest,
        schedule_id: i64,
    ) -> anyhow::Result<Option<String>> {
        if !self.has_model() {
            return Ok(Some(crate::agent::NO_MODEL.to_string()));
        }
        self.accept_scheduled(&turn_request(req), schedule_id)
            .await?;
        Ok(None)
    }

    async fn stop(&self, section: &str, by: &str) -> anyhow::Result<String> {
        Agent::stop(self, section, by).await
    }

    async fn status_line(&self, section: &str) -> Option<String> {
        match Agent::status_line(self, section).await {
            Ok(line) => line,
            Err(e) => {
                tracing::warn!(section.id = %section, error = %format!("{e:#}"), "reading the task's state for /ssh status failed");
                None
            }
        }
    }
}
