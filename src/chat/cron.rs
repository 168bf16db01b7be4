//! Schedules in chats: the `/cron` commands, what a firing does in its thread ([`fire`]), and
//! the model's proposals confirmed by a person ([`decide_proposal`]). Who may is `authz::schedule`;
//! the tables are `crate::schedule`'s.
//!
//! A firing runs as a turn in the schedule's thread, with its creator as the actor, on the
//! thread's binding at fire time (the turn resolves it at every call, as any turn does). It
//! posts an anchor message ("⏰ scheduled #id: …", idempotent per schedule and due time) that
//! the turn answers. It is skipped, and the thread told once, while the schedule's previous
//! run still waits or runs; the schedule pauses, and says why, when its creator may no longer
//! manage schedules there.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde_json::json;

use super::binding::{self, Owned};
use super::command::Command;
use super::port::{AgentRequest, AnchorPlace, Incoming, Reply, ThreadError};
use super::threads;
use super::{Deps, change::Conversation};
use crate::audit::{self, ChatEntry};
use crate::authz::{self, Denial, Section};
use crate::metrics::ResultLabel;
use crate::schedule::{self, Firing, FiringState, NewSchedule, Schedule, Spec, local, short};

/// The longest prompt a schedule keeps.
const PROMPT_MAX: usize = 4000;
/// A firing claimed this late after its due time says so.
const LATE_SAYS: i64 = 10_000;

/// Handles one `/cron …` command; returns the answer, or `None` when it answered itself.
pub async fn command(
    deps: &Deps,
    msg: &Incoming,
    reply: &dyn Reply,
    cmd: Command,
) -> anyhow::Result<Option<String>> {
    let now = deps.clock.now();
    Ok(Some(match cmd {
        Command::CronAdd { schedule, prompt } => {
            return add(deps, msg, reply, &schedule, &prompt).await;
        }
        Command::CronList => list(deps, &msg.chat_id, now).await?,
        Command::CronTz { zone } => tz(deps, msg, zone.as_deref()).await?,
        Command::CronPause { id } => change(deps, msg, id, Act::Pause).await?,
        Command::CronResume { id } => change(deps, msg, id, Act::Resume).await?,
        Command::CronRemove { id } => change(deps, msg, id, Act::Remove).await?,
        Command::CronRun { id } => change(deps, msg, id, Act::Run).await?,
        _ => unreachable!("only /cron commands come here"),
    }))
}

/// The zone new schedules of `chat` are read in.
async fn chat_zone(deps: &Deps, chat_id: &str) -> anyhow::Result<String> {
    Ok(schedule::chat_zone(&deps.db, chat_id)
        .await?
        .unwrap_or_else(|| deps.config.chat.timezone.clone()))
}

fn zone(name: &str) -> Tz {
    schedule::zone_or_utc(name)
}

fn kind<'a>(owner: Option<&'a str>, group_itself: bool, is_chat: bool) -> Section<'a> {
    match (is_chat, group_itself) {
        (true, true) => Section::Group,
        (true, false) => Section::Direct,
        (false, _) => Section::Thread { owner },
    }
}

async fn add(
    deps: &Deps,
    msg: &Incoming,
    reply: &dyn Reply,
    text: &str,
    prompt: &str,
) -> anyhow::Result<Option<String>> {
    let now = deps.clock.now();
    let spec = match Spec::parse(text, deps.config.chat.schedule_min) {
        Ok(s) => s,
        Err(e) => return Ok(Some(format!("Not scheduled: {e}."))),
    };
    if prompt.chars().count() > PROMPT_MAX {
        return Ok(Some(format!(
            "Not scheduled: the prompt is longer than {PROMPT_MAX} characters."
        )));
    }
    // Handled before (a retry after the schedule was added): the same confirmation again,
    // which the platform de-duplicates.
    if let Some(s) = schedule::by_message(&deps.db, &msg.message_id).await? {
        let tz = zone(&s.tz);
        let spec = Spec::parse(&s.spec, std::time::Duration::ZERO)?;
        let next = schedule::upcoming(&spec, tz, s.created_at, now);
        let text = confirm_text(s.id, &spec, &s.tz, &s.prompt, &next, tz);
        if s.in_thread && s.section_id != msg.section() {
            reply.open_thread(&text, "cron-add").await?;
            return Ok(None);
        }
        return Ok(Some(text));
    }
    let tz_name = chat_zone(deps, &msg.chat_id).await?;
    let tz = zone(&tz_name);
    let admin = deps.config.is_admin(&msg.sender);
    let max = deps.config.chat.schedule_max_per_chat;
    {
        let mut conn = deps.db.acquire().await?;
        if schedule::count_in_chat(&mut conn, &msg.chat_id).await? >= max as i64 {
            return Ok(Some(format!(
                "Not scheduled: this chat already holds {max} schedules (SSHMODE_SCHEDULE_MAX_PER_CHAT). Remove one with /cron remove <id>."
            )));
        }
    }
    let id = schedule::reserve_id(&deps.db).await?;
    let next = schedule::upcoming(&spec, tz, now, now);
    let Some(first) = next.first().copied() else {
        return Ok(Some(format!("Not scheduled: `{text}` never fires.")));
    };
    let confirmation = confirm_text(id, &spec, &tz_name, prompt, &next, tz);
    // Where it lives: this thread, this one-to-one chat, or a new thread opened on the message.
    let group_parent = msg.thread_id.is_none() && msg.conversation() == Conversation::Group;
    let (section, root, in_thread, opened) = if group_parent {
        match reply.open_thread(&confirmation, "cron-add").await {
            Ok(Some(thread)) => (thread, Some(msg.message_id.clone()), true, true),
            // The thread opened, but the platform did not name it: say so in it.
            Ok(None) => {
                return answer_in(
                    reply,
                    true,
                    "Not scheduled after all: the platform did not return this thread's id. Send /cron add again here, in the thread.".into(),
                )
                .await;
            }
            Err(ThreadError::NotAllowed) => (msg.chat_id.clone(), None, false, false),
            Err(ThreadError::Other(e)) => return Err(e),
        }
    } else {
        (
            msg.section().to_string(),
            msg.root_id.clone().filter(|_| msg.thread_id.is_some()),
            msg.thread_id.is_some(),
            false,
        )
    };
    let mut tx = deps.db.begin().await?;
    let owner = if opened {
        binding::claim_owner(&mut tx, &section, &msg.sender, Owned::Opened, now).await?;
        threads::record(
            &mut *tx,
            &section,
            &msg.chat_id,
            threads::Reason::Opened,
            now,
        )
        .await?;
        Some(msg.sender.clone())
    } else {
        binding::owner(&mut tx, &section).await?
    };
    let is_chat = section == msg.chat_id;
    let who = authz::schedule(
        &msg.sender,
        admin,
        kind(owner.as_deref(), !msg.direct, is_chat),
    );
    let refused = |d: &Denial| format!("Not scheduled: {d}");
    if let Err(d) = &who {
        audit_refusal(&mut tx, msg, &section, "schedule.add", d).await?;
        tx.commit().await?;
        return answer_in(reply, opened, refused(d)).await;
    }
    if !is_chat && owner.is_none() {
        binding::claim_owner(&mut tx, &section, &msg.sender, Owned::Scheduled, now).await?;
    }
    let new = NewSchedule {
        chat_id: msg.chat_id.clone(),
        section_id: section.clone(),
        root_message_id: root,
        in_thread,
        direct: msg.direct,
        spec: spec.text(),
        tz: tz_name.clone(),
        prompt: prompt.to_string(),
        creator: msg.sender.clone(),
    };
    // The count again, under the chat's lock, so two adds cannot pass the bound together.
    schedule::lock_chat(&mut tx, &msg.chat_id).await?;
    if schedule::count_in_chat(&mut tx, &msg.chat_id).await? >= max as i64 {
        tx.rollback().await?;
        return answer_in(
            reply,
            opened,
            format!("Not scheduled: this chat already holds {max} schedules."),
        )
        .await;
    }
    schedule::add(&mut tx, id, &new, now, first).await?;
    schedule::added_by(&mut tx, id, &msg.message_id).await?;
    audit::record_chat(
        &mut tx,
        ChatEntry {
            actor: &msg.sender,
            action: "schedule.add",
            section: Some(&section),
            target: None,
            outcome: "ok",
            detail: json!({"schedule": id, "spec": new.spec, "tz": tz_name, "chat": msg.chat_id}),
        },
    )
    .await?;
    tx.commit().await?;
    if opened {
        return Ok(None);
    }
    Ok(Some(confirmation))
}

/// A refusal after a thread was opened goes into that thread.
async fn answer_in(
    reply: &dyn Reply,
    opened: bool,
    text: String,
) -> anyhow::Result<Option<String>> {
    if opened {
        reply.open_thread(&text, "cron-add-refused").await?;
        return Ok(None);
    }
    Ok(Some(text))
}

fn confirm_text(
    id: i64,
    spec: &Spec,
    tz_name: &str,
    prompt: &str,
    next: &[DateTime<Utc>],
    tz: Tz,
) -> String {
    let runs: Vec<String> = next.iter().map(|t| local(*t, tz)).collect();
    format!(
        "⏰ Scheduled #{id}: `{}` ({tz_name}) — {}\nNext runs: {}.\nIt runs here as a turn, on this thread's backend at that time. /cron list · /cron pause {id} · /cron remove {id}",
        spec.text(),
        short(prompt, 200),
        runs.join(", ")
    )
}

async fn audit_refusal(
    conn: &mut sqlx::PgConnection,
    msg: &Incoming,
    section: &str,
    action: &str,
    d: &Denial,
) -> anyhow::Result<()> {
    audit::record_chat(
        conn,
        ChatEntry {
            actor: &msg.sender,
            action,
            section: Some(section),
            target: None,
            outcome: "refused",
            detail: json!({"reason": d.code(), "chat": msg.chat_id}),
        },
    )
    .await?;
    Ok(())
}

/// `/cron list`: the chat's schedules.
pub async fn list(deps: &Deps, chat_id: &str, now: DateTime<Utc>) -> anyhow::Result<String> {
    let rows = schedule::list(&deps.db, Some(chat_id)).await?;
    if rows.is_empty() {
        return Ok(
            "No schedules in this chat. Add one with /cron add \"<schedule>\" <prompt>, e.g. /cron add \"0 9 * * 1-5\" check the disks."
                .into(),
        );
    }
    let mut out = format!("Schedules in this chat ({}):\n", rows.len());
    for l in rows {
        out.push_str(&schedule::line(&l, now));
        out.push('\n');
    }
    Ok(out.trim_end().to_string())
}

/// `/cron tz [<zone>]`: shows or sets the zone of the chat's new schedules (an admin, or the
/// person in a one-to-one chat).
async fn tz(deps: &Deps, msg: &Incoming, name: Option<&str>) -> anyhow::Result<String> {
    let current = chat_zone(deps, &msg.chat_id).await?;
    let Some(name) = name else {
        return Ok(format!(
            "New schedules in this chat use the time zone `{current}`. Change it with /cron tz <Area/City>."
        ));
    };
    let tz = match schedule::spec::zone(name) {
        Ok(tz) => tz,
        Err(e) => return Ok(format!("Time zone not changed: {e}.")),
    };
    if !msg.direct && !deps.config.is_admin(&msg.sender) {
        return Ok(
            "Only an admin can set a group chat's time zone for schedules (a one-to-one chat's is its person's)."
                .into(),
        );
    }
    let name = tz.name().to_string();
    let now = deps.clock.now();
    let mut tx = deps.db.begin().await?;
    schedule::set_chat_zone(&mut tx, &msg.chat_id, &name, &msg.sender, now).await?;
    audit::record_chat(
        &mut tx,
        ChatEntry {
            actor: &msg.sender,
            action: "schedule.tz",
            section: Some(msg.section()),
            target: None,
            outcome: "ok",
            detail: json!({"tz": name, "was": current, "chat": msg.chat_id}),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(format!(
        "New schedules in this chat use `{name}` (now {}). Existing ones keep the zone they were added with.",
        local(now, tz)
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Pause,
    Resume,
    Remove,
    Run,
}

impl Act {
    fn action(self) -> &'static str {
        match self {
            Act::Pause => "schedule.pause",
            Act::Resume => "schedule.resume",
            Act::Remove => "schedule.remove",
            Act::Run => "schedule.run",
        }
    }
}

/// `/cron pause|resume|remove|run <id>`, for a schedule of this chat, by the owner of its
/// thread or an admin.
async fn change(deps: &Deps, msg: &Incoming, id: i64, act: Act) -> anyhow::Result<String> {
    let now = deps.clock.now();
    let mut tx = deps.db.begin().await?;
    let s = match schedule::get(&mut tx, id, true).await? {
        Some(s) if s.chat_id == msg.chat_id && !s.removed => s,
        _ => {
            return Ok(format!(
                "There is no schedule #{id} in this chat. /cron list shows them."
            ));
        }
    };
    let owner = binding::owner(&mut tx, &s.section_id).await?;
    let is_chat = s.section_id == s.chat_id;
    let admin = deps.config.is_admin(&msg.sender);
    if let Err(d) = authz::schedule(
        &msg.sender,
        admin,
        kind(owner.as_deref(), !s.direct, is_chat),
    ) {
        audit_refusal(&mut tx, msg, &s.section_id, act.action(), &d).await?;
        tx.commit().await?;
        return Ok(d.to_string());
    }
    let said = match act {
        Act::Pause if s.paused_at.is_some() => format!("Schedule #{id} is already paused."),
        Act::Pause => {
            schedule::pause(&mut tx, id, &msg.sender, None, now).await?;
            format!("Paused schedule #{id}. /cron resume {id} starts it again.")
        }
        Act::Resume if s.paused_at.is_none() => format!("Schedule #{id} is not paused."),
        Act::Resume => {
            let Some(next) = schedule::next_due(&s, now) else {
                return Ok(format!("Schedule #{id} has no further due time."));
            };
            schedule::resume(&mut tx, id, next).await?;
            format!(
                "Resumed schedule #{id}; next run {}.",
                local(next, zone(&s.tz))
            )
        }
        Act::Remove => {
            schedule::remove(&mut tx, id, now).await?;
            format!("Removed schedule #{id}.")
        }
        Act::Run => String::new(),
    };
    audit::record_chat(
        &mut tx,
        ChatEntry {
            actor: &msg.sender,
            action: act.action(),
            section: Some(&s.section_id),
            target: None,
            outcome: "ok",
            detail: json!({"schedule": id, "chat": s.chat_id}),
        },
    )
    .await?;
    let firing = Firing {
        schedule_id: id,
        due_at: now,
        late_ms: 0,
        run_by: Some(msg.sender.clone()),
    };
    if act == Act::Run {
        schedule::record_firing(&mut tx, &firing, now).await?;
    }
    tx.commit().await?;
    if act != Act::Run {
        return Ok(said);
    }
    Ok(match fire(deps, &firing).await? {
        FiringState::Fired => format!("Schedule #{id} runs now."),
        FiringState::Skipped => format!("Schedule #{id}'s previous run is still going."),
        _ => format!("Schedule #{id} did not run; /cron list says why."),
    })
}

/// What a firing does in its thread (the inbox hands it over in the thread's order, or
/// `/cron run` calls it): checks the schedule still stands and its creator still may, skips
/// while its previous run is live, posts the anchor and queues the turn. Idempotent: a retried
/// firing posts nothing new and queues nothing twice.
pub async fn fire(deps: &Deps, f: &Firing) -> anyhow::Result<FiringState> {
    let state = fire_once(deps, f).await?;
    deps.metrics
        .schedule_firings
        .get_or_create(&ResultLabel {
            result: state.as_str().into(),
        })
        .inc();
    Ok(state)
}

async fn fire_once(deps: &Deps, f: &Firing) -> anyhow::Result<FiringState> {
    let db = &deps.db;
    let s = {
        let mut conn = db.acquire().await?;
        schedule::get(&mut conn, f.schedule_id, false).await?
    };
    let Some(s) = s else {
        return Ok(FiringState::Gone);
    };
    let recorded = schedule::firing(db, f).await?;
    if let Some((state, _)) = &recorded
        && state != FiringState::Queued.as_str()
        && state != FiringState::Fired.as_str()
    {
        // Settled before (a retry): nothing more to do.
        return Ok(match state.as_str() {
            "skipped" => FiringState::Skipped,
            "paused" => FiringState::Paused,
            _ => FiringState::Gone,
        });
    }
    let place = AnchorPlace {
        chat_id: s.chat_id.clone(),
        section: s.section_id.clone(),
        root_message_id: s.root_message_id.clone(),
    };
    let already = recorded.and_then(|(_, anchor)| anchor);
    if already.is_none() {
        if s.removed || (s.paused_at.is_some() && f.run_by.is_none()) {
            schedule::settle_firing(db, f, FiringState::Gone, None).await?;
            return Ok(FiringState::Gone);
        }
        // The creator must still be someone who may manage this thread's schedules.
        let owner = {
            let mut conn = db.acquire().await?;
            binding::owner(&mut conn, &s.section_id).await?
        };
        let is_chat = s.section_id == s.chat_id;
        if let Err(d) = authz::schedule(
            &s.creator,
            deps.config.is_admin(&s.creator),
            kind(owner.as_deref(), !s.direct, is_chat),
        ) {
            return pause_for(deps, &s, f, &place, &d).await;
        }
        if f.run_by.is_none() && schedule::previous_run_live(db, s.id).await? {
            // Told first: a retry of a firing settled before would say nothing.
            if !s.skip_told {
                let text = format!(
                    "⏰ Schedule #{} skipped its run due {}: its previous run is still going. (Said once; the next run that starts clears it.)",
                    s.id,
                    local(f.due_at, zone(&s.tz))
                );
                deps.anchors
                    .post(&place, &text, &format!("{}:skipped", f.key()))
                    .await?;
                schedule::set_skip_told(db, s.id, true).await?;
            }
            schedule::settle_firing(db, f, FiringState::Skipped, None).await?;
            audit_fire(deps, &s, f, "skipped", None).await?;
            return Ok(FiringState::Skipped);
        }
    }
    let posted_now = already.is_none();
    let anchor = match already {
        Some(a) => a,
        None => {
            let mut text = format!("⏰ scheduled #{}: {}", s.id, s.prompt);
            if let Some(by) = &f.run_by {
                text.push_str(&format!("\n(run now by {by})"));
            } else if f.late_ms >= LATE_SAYS {
                text.push_str(&format!(
                    "\n(late by {}: the service was not running at {})",
                    late_words(f.late_ms),
                    local(f.due_at, zone(&s.tz))
                ));
            }
            let a = deps.anchors.post(&place, &text, &f.key()).await?;
            schedule::settle_firing(db, f, FiringState::Fired, Some(&a)).await?;
            a
        }
    };
    let preface = format!(
        "[Scheduled run of #{} (`{}`, {}), due {}{}. Nobody asked this just now: do what it says and report here.]\n",
        s.id,
        s.spec,
        s.tz,
        local(f.due_at, zone(&s.tz)),
        if f.late_ms >= LATE_SAYS {
            format!(", late by {}", late_words(f.late_ms))
        } else {
            String::new()
        }
    );
    let req = AgentRequest {
        section: s.section_id.clone(),
        chat_id: s.chat_id.clone(),
        message_id: anchor.clone(),
        sender_open_id: s.creator.clone(),
        text: format!("{preface}{}", s.prompt),
        in_thread: s.in_thread,
    };
    if let Some(text) = deps.agent.enqueue_scheduled(&req, s.id).await? {
        deps.anchors
            .post(&place, &text, &format!("{}:agent", f.key()))
            .await?;
    }
    if s.skip_told {
        schedule::set_skip_told(db, s.id, false).await?;
    }
    if posted_now {
        audit_fire(deps, &s, f, "ok", Some(&anchor)).await?;
    }
    Ok(FiringState::Fired)
}

async fn pause_for(
    deps: &Deps,
    s: &Schedule,
    f: &Firing,
    place: &AnchorPlace,
    d: &Denial,
) -> anyhow::Result<FiringState> {
    let now = deps.clock.now();
    let reason = format!("its creator {} may no longer run it here", s.creator);
    // Told first: a retry after the schedule paused would find it paused and say nothing.
    let text = format!(
        "⏰ Schedule #{} is paused: {reason} ({d}) The thread's owner or an admin can /cron resume {} or /cron remove {}.",
        s.id, s.id, s.id
    );
    deps.anchors
        .post(place, &text, &format!("{}:paused", f.key()))
        .await?;
    let mut tx = deps.db.begin().await?;
    schedule::pause(&mut tx, s.id, "system", Some(&reason), now).await?;
    audit::record_chat(
        &mut tx,
        ChatEntry {
            actor: "system",
            action: "schedule.pause",
            section: Some(&s.section_id),
            target: None,
            outcome: "ok",
            detail: json!({"schedule": s.id, "reason": d.code(), "creator": s.creator}),
        },
    )
    .await?;
    tx.commit().await?;
    schedule::settle_firing(&deps.db, f, FiringState::Paused, None).await?;
    Ok(FiringState::Paused)
}

async fn audit_fire(
    deps: &Deps,
    s: &Schedule,
    f: &Firing,
    outcome: &str,
    anchor: Option<&str>,
) -> anyhow::Result<()> {
    let mut conn = deps.db.acquire().await?;
    audit::record_chat(
        &mut conn,
        ChatEntry {
            actor: f.run_by.as_deref().unwrap_or("system"),
            action: "schedule.fire",
            section: Some(&s.section_id),
            target: None,
            outcome,
            detail: json!({"schedule": s.id, "due": f.due_at, "late_ms": f.late_ms,
                           "creator": s.creator, "anchor": anchor}),
        },
    )
    .await?;
    Ok(())
}

/// `2 min 5 s`, `3 h 10 min`.
fn late_words(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        s if s >= 3600 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{} min {} s", s / 60, s % 60),
        s => format!("{s} s"),
    }
}

/// What chat control knows of schedules when the model asks (`ChatBindings`).
#[derive(Debug, Clone)]
pub struct Rules {
    /// `SSHMODE_TIMEZONE`.
    pub timezone: String,
    /// `SSHMODE_SCHEDULE_MIN_SECS`.
    pub min: std::time::Duration,
    /// `SSHMODE_SCHEDULE_MAX_PER_CHAT`.
    pub max_per_chat: usize,
}

/// The model's `cron list`.
pub async fn list_for_model(
    db: &sqlx::PgPool,
    chat_id: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<String> {
    let rows = schedule::list(db, Some(chat_id)).await?;
    if rows.is_empty() {
        return Ok("This chat has no schedules.".into());
    }
    Ok(rows
        .iter()
        .map(|l| schedule::line(l, now))
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The model's `cron propose`: a proposal stored for a person to confirm, or why not.
pub async fn propose(
    db: &sqlx::PgPool,
    rules: &Rules,
    now: DateTime<Utc>,
    asked: &crate::agent::ProposalAsk<'_>,
    text: &str,
    prompt: &str,
) -> anyhow::Result<Result<schedule::ProposalView, String>> {
    let spec = match Spec::parse(text, rules.min) {
        Ok(s) => s,
        Err(e) => return Ok(Err(format!("not proposed: {e}"))),
    };
    if prompt.trim().is_empty() || prompt.chars().count() > PROMPT_MAX {
        return Ok(Err(format!(
            "not proposed: the prompt must be 1 to {PROMPT_MAX} characters"
        )));
    }
    {
        let mut conn = db.acquire().await?;
        if schedule::count_in_chat(&mut conn, asked.chat_id).await? >= rules.max_per_chat as i64 {
            return Ok(Err(format!(
                "not proposed: this chat already holds {} schedules",
                rules.max_per_chat
            )));
        }
    }
    let tz_name = schedule::chat_zone(db, asked.chat_id)
        .await?
        .unwrap_or_else(|| rules.timezone.clone());
    let tz = zone(&tz_name);
    let next = schedule::upcoming(&spec, tz, now, now);
    if next.is_empty() {
        return Ok(Err(format!("not proposed: `{text}` never fires")));
    }
    let in_thread = asked.section != asked.chat_id;
    let direct = !in_thread && threads::is_direct(db, asked.chat_id).await?;
    let new = NewSchedule {
        chat_id: asked.chat_id.to_string(),
        section_id: asked.section.to_string(),
        // Any message in the thread takes a reply into it.
        root_message_id: in_thread.then(|| asked.message_id.to_string()),
        in_thread,
        direct,
        spec: spec.text(),
        tz: tz_name.clone(),
        prompt: prompt.trim().to_string(),
        creator: asked.sender.to_string(),
    };
    let id = schedule::propose(db, &new, now).await?;
    Ok(Ok(schedule::ProposalView {
        id,
        spec: new.spec,
        tz: tz_name,
        prompt: new.prompt,
        next: next.iter().map(|t| local(*t, tz)).collect(),
        asked_by: new.creator,
        state: schedule::ProposalState::Open,
    }))
}

/// A click on a proposal's card by `operator`: Add (the schedule is added, the clicker its
/// creator) or Cancel, by someone who may manage the thread's schedules — anyone else's click
/// changes nothing (audited). Returns the card's new view and message id, when it changed.
pub async fn decide_proposal(
    deps: &Deps,
    id: i64,
    operator: &str,
    click_chat: &str,
    add: bool,
) -> anyhow::Result<Option<(schedule::ProposalView, Option<String>)>> {
    let now = deps.clock.now();
    let mut tx = deps.db.begin().await?;
    let Some(p) = schedule::proposal(&mut tx, id).await? else {
        return Ok(None);
    };
    if p.decision.is_some() {
        // Decided before: a second click changes nothing.
        return Ok(None);
    }
    let owner = binding::owner(&mut tx, &p.schedule.section_id).await?;
    let is_chat = p.schedule.section_id == p.schedule.chat_id;
    let action = if add {
        "schedule.add"
    } else {
        "schedule.cancel"
    };
    // A card forwarded elsewhere still takes clicks: only one in the proposal's own chat counts.
    let decided = if click_chat != p.schedule.chat_id {
        Err("another_chat")
    } else {
        authz::schedule(
            operator,
            deps.config.is_admin(operator),
            kind(owner.as_deref(), !p.schedule.direct, is_chat),
        )
        .map_err(|d| d.code())
    };
    if let Err(reason) = decided {
        audit::record_chat(
            &mut tx,
            ChatEntry {
                actor: operator,
                action,
                section: Some(&p.schedule.section_id),
                target: None,
                outcome: "refused",
                detail: json!({"proposal": id, "reason": reason, "chat": p.schedule.chat_id, "clicked_in": click_chat}),
            },
        )
        .await?;
        tx.commit().await?;
        return Ok(None);
    }
    let tz = zone(&p.schedule.tz);
    let spec = Spec::parse(&p.schedule.spec, std::time::Duration::ZERO);
    let next = spec
        .as_ref()
        .map(|s| schedule::upcoming(s, tz, now, now))
        .unwrap_or_default();
    let mut view = schedule::ProposalView {
        id,
        spec: p.schedule.spec.clone(),
        tz: p.schedule.tz.clone(),
        prompt: p.schedule.prompt.clone(),
        next: next.iter().map(|t| local(*t, tz)).collect(),
        asked_by: p.schedule.creator.clone(),
        state: schedule::ProposalState::Cancelled {
            by: operator.to_string(),
        },
    };
    let card = schedule::proposal_card(&mut *tx, id).await?;
    if !add {
        schedule::decide_proposal(&mut tx, id, "cancelled", operator, now, None).await?;
        tx.commit().await?;
        return Ok(Some((view, card)));
    }
    let max = deps.config.chat.schedule_max_per_chat as i64;
    schedule::lock_chat(&mut tx, &p.schedule.chat_id).await?;
    let full = schedule::count_in_chat(&mut tx, &p.schedule.chat_id).await? >= max;
    let (Some(first), false) = (next.first().copied(), full) else {
        view.state = schedule::ProposalState::Failed(if full {
            format!("this chat already holds {max} schedules")
        } else {
            "the schedule never fires".into()
        });
        tx.commit().await?;
        return Ok(Some((view, card)));
    };
    if !is_chat && owner.is_none() {
        binding::claim_owner(
            &mut tx,
            &p.schedule.section_id,
            operator,
            Owned::Scheduled,
            now,
        )
        .await?;
    }
    let sid = schedule::reserve_id(&deps.db).await?;
    let new = NewSchedule {
        creator: operator.to_string(),
        ..p.schedule.clone()
    };
    schedule::add(&mut tx, sid, &new, now, first).await?;
    schedule::decide_proposal(&mut tx, id, "added", operator, now, Some(sid)).await?;
    audit::record_chat(
        &mut tx,
        ChatEntry {
            actor: operator,
            action: "schedule.add",
            section: Some(&p.schedule.section_id),
            target: None,
            outcome: "ok",
            detail: json!({"schedule": sid, "proposal": id, "proposed_by": "model",
                           "spec": p.schedule.spec, "tz": p.schedule.tz, "chat": p.schedule.chat_id}),
        },
    )
    .await?;
    tx.commit().await?;
    view.state = schedule::ProposalState::Added {
        by: operator.to_string(),
        schedule: sid,
    };
    Ok(Some((view, card)))
}
