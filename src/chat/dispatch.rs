//! The dispatcher: one received message in, its effects and its answer out. Commands are
//! short and handled inline; anything for the agent is enqueued through [`AgentPort`]. Answers
//! go through [`Reply`], so this never knows the platform.

use std::sync::Arc;

use sqlx::PgPool;

use super::change::{self, Conversation, Ctl, Decision};
use super::command::{self, Command, YoloScope};
use super::port::{AdminChannel, AgentPort, AgentRequest, Anchors, Incoming, Reply, ThreadError};
use super::target_approval;
use super::{binding, input, render, threads};
use crate::authz::{self, Actor};
use crate::clock::Clock;
use crate::config::Config;
use crate::exec::Place;
use crate::workspace;

/// What the dispatcher works with.
#[derive(Clone)]
pub struct Deps {
    pub db: PgPool,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<Config>,
    pub agent: Arc<dyn AgentPort>,
    pub admins: Arc<dyn AdminChannel>,
    /// Where local workspaces may be (the root resolved once, at start-up).
    pub workspaces: workspace::LocalRules,
    /// The backends, for placing the files a message carries (`input`).
    pub exec: Arc<crate::exec::Executors>,
    /// Where a schedule's firing posts its anchor and notices.
    pub anchors: Arc<dyn Anchors>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The secret scanner, for what the event log keeps of a message.
    pub secrets: Arc<crate::plane::SecretFilter>,
}

impl Deps {
    /// `text` as the event log keeps it: every secret masked (with the detectors alone when the
    /// targets' secrets cannot be searched now).
    pub async fn masked(&self, text: &str) -> String {
        match self.secrets.mask(&self.db, text).await {
            Ok(m) => m.text,
            Err(e) => {
                tracing::warn!(error = %e, "the secret scanner failed; the detectors alone masked a logged text");
                crate::mask::redact(text)
            }
        }
    }

    fn ctl(&self) -> Ctl<'_> {
        Ctl {
            db: &self.db,
            now: self.clock.now(),
            yolo_ttl: self.config.chat.yolo_ttl,
        }
    }

    fn actor<'a>(&self, open_id: &'a str) -> Actor<'a> {
        Actor::User {
            open_id,
            admin: self.config.is_admin(open_id),
        }
    }
}

/// Handles one message. An error means "retry later"; answers are idempotent per purpose.
pub async fn dispatch(deps: &Deps, msg: &Incoming, reply: &dyn Reply) -> anyhow::Result<()> {
    // A message in a thread opened by `/ssh use` may arrive before the reply's answer was
    // processed: its root message names the pending binding.
    if let (Some(thread), Some(root)) = (&msg.thread_id, &msg.root_id) {
        change::complete_pending(&deps.db, deps.clock.now(), thread, root).await?;
    }
    let cmd = match command::parse(&msg.text) {
        None if for_the_agent(deps, msg).await? => {
            // What it quotes, forwards and carries, read and placed here in the worker.
            let input = input::prepare(deps, msg, reply.source()).await?;
            for (i, notice) in input.notices.iter().enumerate() {
                reply.answer(notice, &format!("input-{i}")).await?;
            }
            if input.is_empty() {
                return Ok(());
            }
            let req = AgentRequest {
                section: msg.section().to_string(),
                chat_id: msg.chat_id.clone(),
                message_id: msg.message_id.clone(),
                sender_open_id: msg.sender.clone(),
                text: input.text,
                in_thread: msg.thread_id.is_some(),
            };
            // The bot answers here, so it is in this thread from now on.
            joined_thread(deps, msg).await?;
            if msg.direct && msg.thread_id.is_none() {
                threads::record_direct(&deps.db, &msg.chat_id, deps.clock.now()).await?;
            }
            if let Some(text) = deps.agent.enqueue(&req).await? {
                reply.answer(&text, "agent").await?;
            }
            if let Some(parent) = &input.quoted {
                crate::turns::inputs::quoted(&deps.db, msg.section(), parent).await?;
            }
            return Ok(());
        }
        // A group message neither addressed to the bot nor in a thread it is in.
        None => return Ok(()),
        Some(Err(usage)) => return reply.answer(&usage.0, "usage").await,
        Some(Ok(cmd)) => cmd,
    };
    let section = msg.section();
    let actor = deps.actor(&msg.sender);
    let text = match cmd {
        Command::Help => command::help_text(),
        Command::Stop => deps.agent.stop(section, &msg.sender).await?,
        Command::Use { alias, here } if msg.thread_id.is_none() && !here => {
            return open_bound_thread(deps, msg, reply, &alias).await;
        }
        Command::Use { alias, .. } => {
            let conv = msg.conversation();
            match change::bind(deps.ctl(), actor, section, conv, &msg.chat_id, &alias).await? {
                Ok(b) if b.unchanged => format!(
                    "Already on `{}` ({}). Send /ssh local to return to local.",
                    b.alias, b.destination
                ),
                Ok(b) => format!(
                    "{} `{}` ({}){}. Send /ssh local to return to local.",
                    if msg.thread_id.is_some() {
                        "This thread now runs on"
                    } else {
                        "This chat now runs on"
                    },
                    b.alias,
                    b.destination,
                    b.replaced
                        .map(|r| format!(", instead of `{r}`"))
                        .unwrap_or_default()
                ),
                Err(r) => refusal_with_list(deps, &msg.chat_id, &r.to_string()).await?,
            }
        }
        Command::Local => match change::release(deps.ctl(), actor, section).await? {
            Ok(Some(b)) => format!("Left `{}`. This thread runs locally again.", b.alias),
            Ok(None) => "This thread already runs locally.".into(),
            Err(r) => r.to_string(),
        },
        Command::Status => {
            let now = deps.clock.now();
            let r = change::report(&deps.db, section, now).await?;
            let mut s = render::status(&r, now);
            if let Err(fails) = binding::resolve_use(&deps.db, section, now).await? {
                s.push('\n');
                s.push_str(&fails.message());
            }
            let place = match &r.binding {
                Some(b) => Place::Target(b.alias.clone()),
                None => Place::Local,
            };
            match workspace::current(&deps.db, &deps.workspaces, section, &place).await {
                Ok(ws) => {
                    s.push('\n');
                    s.push_str(&ws.describe());
                }
                Err(e) => s.push_str(&format!("\nWorkspace: unknown ({e})")),
            }
            if let Some(line) = deps.agent.status_line(section).await {
                s.push('\n');
                s.push_str(&line);
            }
            s
        }
        Command::List => render::list(&change::visible(&deps.db, &msg.chat_id).await?),
        Command::YoloOn { scope } => {
            let alias = match &scope {
                YoloScope::Target(a) => Some(a.as_str()),
                YoloScope::All => None,
            };
            let conv = msg.conversation();
            match change::grant_on(deps.ctl(), actor, section, conv, &msg.chat_id, alias).await? {
                Ok(g) => format!(
                    "The model may now enter {} by itself in this thread, until {}. /ssh yolo off takes it back.",
                    alias
                        .map(|a| format!("`{a}`"))
                        .unwrap_or_else(|| "any target approved for this chat".into()),
                    g.expires_at.format("%Y-%m-%d %H:%M UTC")
                ),
                Err(r) => refusal_with_list(deps, &msg.chat_id, &r.to_string()).await?,
            }
        }
        Command::YoloOff => match change::grant_off(deps.ctl(), actor, section).await? {
            Ok(r) => {
                let mut s = format!(
                    "The model may no longer enter targets by itself here ({} grant{} revoked).",
                    r.grants,
                    if r.grants == 1 { "" } else { "s" }
                );
                if let Some(a) = r.released {
                    s.push_str(&format!(
                        " It had entered `{a}`; this thread is local again."
                    ));
                }
                s
            }
            Err(r) => r.to_string(),
        },
        Command::MemoryList => crate::plane::memory::render_for_user(
            &crate::plane::memory::list(&deps.db, &msg.chat_id).await?,
        ),
        Command::MemoryForget { id } => {
            match crate::plane::memory::remove(&deps.db, &msg.chat_id, section, &msg.sender, id)
                .await?
            {
                Ok(()) => format!("Forgot note [{id}]."),
                Err(e) => format!(
                    "{}. Send /memory list to see this chat's notes.",
                    capitalise(&e.to_string())
                ),
            }
        }
        Command::WorkspaceShow => {
            let place = binding::resolve_place(&deps.db, section, deps.clock.now()).await?;
            workspace::current(&deps.db, &deps.workspaces, section, &place)
                .await?
                .describe()
        }
        Command::WorkspaceSet {
            dir,
            permission,
            mode,
        } => {
            let place = binding::resolve_place(&deps.db, section, deps.clock.now()).await?;
            let choice = workspace::Choice {
                dir,
                permission,
                mode,
            };
            match workspace::set(
                &deps.db,
                &deps.workspaces,
                actor.name(),
                section,
                &place,
                &choice,
            )
            .await?
            {
                Ok(ws) => format!("Workspace set.\n{}", ws.describe()),
                Err(why) => format!("Workspace not changed: {why}"),
            }
        }
        Command::Approve { alias } => {
            decide(deps, actor, &alias, Decision::Approve, Some(section)).await?
        }
        cmd @ (Command::CronAdd { .. }
        | Command::CronList
        | Command::CronPause { .. }
        | Command::CronResume { .. }
        | Command::CronRemove { .. }
        | Command::CronRun { .. }
        | Command::CronTz { .. }) => match super::cron::command(deps, msg, reply, cmd).await? {
            Some(text) => text,
            None => {
                joined_thread(deps, msg).await?;
                return Ok(());
            }
        },
        Command::Reject { alias } => {
            decide(deps, actor, &alias, Decision::Reject, Some(section)).await?
        }
    };
    joined_thread(deps, msg).await?;
    reply.answer(&text, "reply").await
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// What starts a turn (a command never does): an @mention of the bot in a group, any p2p
/// message, or any message in a thread the bot opened or has answered in.
async fn for_the_agent(deps: &Deps, msg: &Incoming) -> anyhow::Result<bool> {
    if msg.addressed {
        return Ok(true);
    }
    match &msg.thread_id {
        // A mention-free sticker (or anything else with no text, file or bundle) asks nothing;
        // a file or an image sent into the bot's thread is for the agent.
        Some(_) if msg.text.trim().is_empty() && msg.files.is_empty() && !msg.forwarded => {
            Ok(false)
        }
        Some(thread) => threads::joined(&deps.db, thread).await,
        None => Ok(false),
    }
}

/// Records that the bot answers in the message's thread, if it is in one.
async fn joined_thread(deps: &Deps, msg: &Incoming) -> anyhow::Result<()> {
    match &msg.thread_id {
        Some(thread) => {
            threads::record(
                &deps.db,
                thread,
                &msg.chat_id,
                threads::Reason::Answered,
                deps.clock.now(),
            )
            .await
        }
        None => Ok(()),
    }
}

async fn decide(
    deps: &Deps,
    actor: Actor<'_>,
    alias: &str,
    decision: Decision,
    section: Option<&str>,
) -> anyhow::Result<String> {
    Ok(
        match change::decide(&deps.db, actor, alias, decision, section, None).await? {
            Ok(_) => {
                target_approval::update_cards(deps, alias).await?;
                format!("Target `{alias}` is {}.", decision.word())
            }
            Err(r) => r.to_string(),
        },
    )
}

async fn refusal_with_list(deps: &Deps, chat_id: &str, why: &str) -> anyhow::Result<String> {
    let targets = change::visible(&deps.db, chat_id).await?;
    Ok(format!("{why} {}", render::available(&targets)))
}

/// `/ssh use <alias>` in a parent chat: checks, records a pending binding keyed by the user's
/// message (the new thread's root), opens the thread with the answer, then binds the thread.
async fn open_bound_thread(
    deps: &Deps,
    msg: &Incoming,
    reply: &dyn Reply,
    alias: &str,
) -> anyhow::Result<()> {
    let actor = deps.actor(&msg.sender);
    let facts =
        match change::check_use(deps.ctl(), actor, msg.section(), &msg.chat_id, alias).await? {
            Ok(f) => f,
            Err(r) => {
                let text = refusal_with_list(deps, &msg.chat_id, &r.to_string()).await?;
                return reply.answer(&text, "reply").await;
            }
        };
    let pending = binding::Pending {
        root_message_id: msg.message_id.clone(),
        chat_id: msg.chat_id.clone(),
        alias: alias.to_string(),
        owner: msg.sender.clone(),
        generation: Some(facts.generation),
    };
    binding::put_pending(&deps.db, &pending, deps.clock.now()).await?;
    let text = format!(
        "This thread runs on `{alias}` ({}). Talk to me here; send /ssh local to return to local.",
        facts.destination
    );
    match reply.open_thread(&text, "thread").await {
        Ok(Some(thread)) => {
            change::complete_pending(&deps.db, deps.clock.now(), &thread, &msg.message_id).await?;
            Ok(())
        }
        // The first event from the thread (its root_id) completes the binding.
        Ok(None) => Ok(()),
        Err(ThreadError::NotAllowed) => {
            binding::drop_pending(&deps.db, &msg.message_id).await?;
            // A group chat itself is an admin's to bind.
            let who = if msg.conversation() == Conversation::Group
                && authz::bind_section(
                    &msg.sender,
                    deps.config.is_admin(&msg.sender),
                    authz::Section::Group,
                )
                .is_err()
            {
                "An admin can send"
            } else {
                "Send"
            };
            reply
                .answer(
                    &format!(
                        "This chat does not allow threads. {who} `/ssh use {alias} --here` to bind this chat itself."
                    ),
                    "no-thread",
                )
                .await
        }
        Err(ThreadError::Other(e)) => Err(e),
    }
}
