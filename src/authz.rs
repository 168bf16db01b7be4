//! Who may do what: every "who may" decision of the service, one function per act —
//! bind a section to a target ([`bind`]), return it to local ([`release`]), open it to the
//! model ([`grant`]) or close that again ([`revoke_grants`]), bind a section at all
//! ([`bind_section`]), approve or reject a target ([`decide_target`]), answer a parked call
//! ([`decide_call`]), press a progress card's Stop ([`press_stop`]), manage a section's
//! schedules ([`schedule`]). Pure: each reads facts
//! its caller loaded (in the same transaction as the change, where there is one) and returns a
//! permit or a [`Denial`] worded for the asker — a user, the model or an admin. The facts no
//! lower module defines (who asks, a section's binding and grants, who may answer a parked
//! call) are defined here; their owners (`chat::binding`, `chat::grant`, `turns`) store them.
//! Never: touches the database, or is bypassed by any caller.

use chrono::{DateTime, Utc};

use crate::target::Status;
use crate::target::allow::Facts;

/// Who asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor<'a> {
    /// A chat user; `admin` when listed in `SSHMODE_ADMINS`.
    User { open_id: &'a str, admin: bool },
    /// The agent's model, through its `ssh_mode` tool.
    Model,
}

impl Actor<'_> {
    /// The audit log's name for the actor.
    pub fn name(&self) -> &str {
        match self {
            Actor::User { open_id, .. } => open_id,
            Actor::Model => "model",
        }
    }
}

/// How a section is bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A user's `/ssh use`: stays until a user changes it.
    Sticky,
    /// The model's `request_use` under a grant: lives no longer than the grant.
    Model,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sticky => "sticky",
            Kind::Model => "model",
        }
    }
}

/// A section's binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub section: String,
    pub alias: String,
    pub kind: Kind,
    /// The user's open_id, or `model`.
    pub owner: String,
    pub bound_at: DateTime<Utc>,
    /// The grant a model-made binding lives under.
    pub grant_id: Option<i64>,
    /// The chat it was made in (`None` only for a binding from before chats were recorded).
    pub chat_id: Option<String>,
    /// The target generation it was made for (`None` when that is not known: a binding from
    /// before generations were recorded).
    pub generation: Option<i64>,
}

impl Binding {
    /// Whether it was made for this very target (the same generation of the alias).
    pub fn is_for(&self, target: &Facts) -> bool {
        self.alias == target.alias && self.generation == Some(target.generation)
    }
}

/// The section asked about, as far as who may bind it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section<'a> {
    /// A thread. `owner` opened it with `/ssh use`, else bound it first; `None` until someone
    /// has.
    Thread { owner: Option<&'a str> },
    /// A group chat itself (its parent section): no owner, only admins bind it.
    Group,
    /// A one-to-one chat itself: its one user binds it.
    Direct,
}

/// A live grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: i64,
    pub section: String,
    /// `None` covers every target approved and allowed for the chat.
    pub alias: Option<String>,
    pub granted_by: String,
    pub granted_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl Grant {
    pub fn covers(&self, alias: &str) -> bool {
        self.alias.as_deref().is_none_or(|a| a == alias)
    }
}

/// Who may answer a parked call (a target's policy, stored with the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approvers {
    /// Any admin (`SSHMODE_ADMINS`).
    Admins,
    /// The sender of the turn's latest message.
    Requester,
}

impl Approvers {
    pub fn as_str(self) -> &'static str {
        match self {
            Approvers::Admins => "admins",
            Approvers::Requester => "requester",
        }
    }

    /// Who may answer, as a card or a status line says it.
    pub fn who(self) -> &'static str {
        match self {
            Approvers::Admins => "an admin",
            Approvers::Requester => "the requester",
        }
    }

    pub fn parse(s: &str) -> Option<Approvers> {
        match s {
            "admins" => Some(Approvers::Admins),
            "requester" => Some(Approvers::Requester),
            _ => None,
        }
    }
}

/// A bind asked for: bind (or switch) `section` to `alias`. `target` is `None` when no such
/// target exists.
#[derive(Debug, Clone, Copy)]
pub struct Bind<'a> {
    pub alias: &'a str,
    pub target: Option<&'a Facts>,
    pub section: Section<'a>,
    pub current: Option<&'a Binding>,
    pub grants: &'a [Grant],
}

/// A bind allowed, carrying the facts it was granted on: the caller acts on what the permit
/// names, never on a fact it must assume the decision checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit<'a> {
    /// Bind to `target` with this kind (and, for the model, under this grant).
    Bind {
        target: &'a Facts,
        kind: Kind,
        grant_id: Option<i64>,
    },
    /// Already bound to `target` this way: nothing to change.
    AlreadyBound { target: &'a Facts },
}

impl<'a> Permit<'a> {
    /// The target the bind is for.
    pub fn target(&self) -> &'a Facts {
        match *self {
            Permit::Bind { target, .. } | Permit::AlreadyBound { target } => target,
        }
    }
}

/// Why not, in words the asker can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    #[error("There is no target named `{0}`.")]
    UnknownTarget(String),
    #[error("Target `{0}` is waiting for an admin's approval.")]
    Pending(String),
    #[error("Target `{0}` is disabled.")]
    Disabled(String),
    #[error("Target `{0}` is not allowed in this chat.")]
    NotAllowedHere(String),
    /// A jump host on the way to the target is not usable here: each hop must be approved
    /// and allowed in the chat, as the target itself.
    #[error("Target `{alias}` is reached through the jump host `{jump}`, which {why}.")]
    Jump {
        alias: String,
        jump: String,
        why: HopRefusal,
    },
    #[error(
        "I may not enter `{0}` by myself here: ask a user to run `/ssh use {0}` or `/ssh yolo on {0}`."
    )]
    NoGrant(String),
    #[error(
        "This thread was bound to `{alias}` by a user; only a user can change that (`/ssh use <alias>` or `/ssh local`)."
    )]
    StickyHeld { alias: String },
    #[error(
        "This thread belongs to {owner}, who opened it or bound it first; only they or an admin can bind or switch it. Anyone can return it to local with `/ssh local`; `/ssh use <alias>` in the chat opens a thread of your own."
    )]
    NotOwner { owner: String },
    #[error(
        "Only an admin can bind this group chat itself. Send `/ssh use <alias>` without `--here` to open a thread of your own."
    )]
    GroupAdminsOnly,
    #[error(
        "This thread belongs to {owner}; only they or an admin can add or change its schedules. `/cron add` in the chat opens a thread of your own."
    )]
    ScheduleNotOwner { owner: String },
    #[error("Only an admin can add or change the schedules of this group chat itself.")]
    ScheduleAdminsOnly,
    #[error("Only a user can do that, with `/ssh yolo on <alias>` or `/ssh yolo off`.")]
    UsersOnly,
    #[error("Only an admin can approve or reject targets.")]
    NotAdmin,
    #[error("Only an admin can answer this approval.")]
    AdminsAnswer,
    #[error("Only the person who asked, or an admin, can answer this approval.")]
    RequesterOrAdminsAnswer,
    #[error("Only members of this conversation can stop its task.")]
    NotMember,
    #[error(
        "This approval card has expired: `{0}` was decided, removed, added again or given another host key since it was sent. Nothing was decided."
    )]
    Expired(String),
}

impl Denial {
    /// A short word for the audit log.
    pub fn code(&self) -> &'static str {
        match self {
            Denial::UnknownTarget(_) => "unknown_target",
            Denial::Pending(_) => "pending",
            Denial::Disabled(_) => "disabled",
            Denial::NotAllowedHere(_) => "not_allowed_here",
            Denial::Jump { why, .. } => why.code(),
            Denial::NoGrant(_) => "no_grant",
            Denial::StickyHeld { .. } => "sticky",
            Denial::NotOwner { .. } => "not_owner",
            Denial::GroupAdminsOnly => "group_admins_only",
            Denial::ScheduleNotOwner { .. } => "not_owner",
            Denial::ScheduleAdminsOnly => "group_admins_only",
            Denial::UsersOnly => "users_only",
            Denial::NotAdmin => "not_admin",
            Denial::AdminsAnswer => "admins_answer",
            Denial::RequesterOrAdminsAnswer => "requester_or_admins_answer",
            Denial::NotMember => "not_member",
            Denial::Expired(_) => "expired",
        }
    }
}

/// Why a jump host keeps the targets behind it from a chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HopRefusal {
    Pending,
    Disabled,
    NotAllowedHere,
}

impl HopRefusal {
    fn code(self) -> &'static str {
        match self {
            HopRefusal::Pending => "jump_pending",
            HopRefusal::Disabled => "jump_disabled",
            HopRefusal::NotAllowedHere => "jump_not_allowed_here",
        }
    }
}

impl std::fmt::Display for HopRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HopRefusal::Pending => "is waiting for an admin's approval",
            HopRefusal::Disabled => "is disabled",
            HopRefusal::NotAllowedHere => "is not allowed in this chat",
        })
    }
}

/// The target, when `alias` is usable in this chat at all: it and every jump host on its way
/// are approved and allowed here.
fn usable<'a>(alias: &str, target: Option<&'a Facts>) -> Result<&'a Facts, Denial> {
    let t = target.ok_or_else(|| Denial::UnknownTarget(alias.to_string()))?;
    match t.status {
        Status::Pending => return Err(Denial::Pending(alias.to_string())),
        Status::Disabled => return Err(Denial::Disabled(alias.to_string())),
        Status::Approved => {}
    }
    if !t.allowed_here {
        return Err(Denial::NotAllowedHere(alias.to_string()));
    }
    for hop in &t.jumps {
        let why = match (hop.status, hop.allowed_here) {
            (Status::Pending, _) => HopRefusal::Pending,
            (Status::Disabled, _) => HopRefusal::Disabled,
            (Status::Approved, false) => HopRefusal::NotAllowedHere,
            (Status::Approved, true) => continue,
        };
        return Err(Denial::Jump {
            alias: alias.to_string(),
            jump: hop.alias.clone(),
            why,
        });
    }
    Ok(t)
}

/// Whether a user may bind (or switch, or open to the model) `section`, whatever the target:
/// a thread's owner or an admin, anyone in a thread nobody owns yet or in a one-to-one chat,
/// only an admin in a group chat itself. Bound or not makes no difference.
pub fn bind_section(open_id: &str, admin: bool, section: Section<'_>) -> Result<(), Denial> {
    match section {
        Section::Thread { owner: Some(o) } if o != open_id && !admin => Err(Denial::NotOwner {
            owner: o.to_string(),
        }),
        Section::Group if !admin => Err(Denial::GroupAdminsOnly),
        _ => Ok(()),
    }
}

/// Whether a user may add, pause, resume, remove or run a schedule of `section` (or confirm
/// the model's proposal of one): the same people who may bind it — a thread's owner or an
/// admin, anyone in a thread nobody owns yet (they become its owner) or in their one-to-one
/// chat, only an admin in a group chat itself. Anyone may list schedules.
pub fn schedule(open_id: &str, admin: bool, section: Section<'_>) -> Result<(), Denial> {
    bind_section(open_id, admin, section).map_err(|d| match d {
        Denial::NotOwner { owner } => Denial::ScheduleNotOwner { owner },
        _ => Denial::ScheduleAdminsOnly,
    })
}

/// Whether `actor` may bind the section as `asked`: a user where they may bind the section
/// ([`bind_section`]), sticky; the model under a live grant, never over a user's binding.
pub fn bind<'a>(actor: Actor<'_>, asked: Bind<'a>) -> Result<Permit<'a>, Denial> {
    let Bind {
        alias,
        target,
        section,
        current,
        grants,
    } = asked;
    let t = usable(alias, target)?;
    match actor {
        Actor::User { open_id, admin } => match current {
            // A binding made for an earlier generation of the alias is not this target.
            Some(b) if b.kind == Kind::Sticky && b.is_for(t) => {
                Ok(Permit::AlreadyBound { target: t })
            }
            _ => {
                bind_section(open_id, admin, section)?;
                Ok(Permit::Bind {
                    target: t,
                    kind: Kind::Sticky,
                    grant_id: None,
                })
            }
        },
        Actor::Model => {
            if let Some(b) = current {
                if b.kind == Kind::Sticky {
                    return if b.is_for(t) {
                        Ok(Permit::AlreadyBound { target: t })
                    } else {
                        Err(Denial::StickyHeld {
                            alias: b.alias.clone(),
                        })
                    };
                }
                if b.is_for(t) {
                    return Ok(Permit::AlreadyBound { target: t });
                }
            }
            // A grant for this very target is preferred over `all`.
            let grant = grants
                .iter()
                .find(|g| g.alias.as_deref() == Some(alias))
                .or_else(|| grants.iter().find(|g| g.covers(alias)))
                .ok_or_else(|| Denial::NoGrant(alias.to_string()))?;
            Ok(Permit::Bind {
                target: t,
                kind: Kind::Model,
                grant_id: Some(grant.id),
            })
        }
    }
}

/// Whether `actor` may return the section to local: the binding to release, or `None` when
/// nothing is bound. Any user may; the model only its own binding.
pub fn release<'a>(
    actor: Actor<'_>,
    current: Option<&'a Binding>,
) -> Result<Option<&'a Binding>, Denial> {
    let Some(b) = current else {
        return Ok(None);
    };
    match (actor, b.kind) {
        (Actor::User { .. }, _) | (Actor::Model, Kind::Model) => Ok(Some(b)),
        (Actor::Model, Kind::Sticky) => Err(Denial::StickyHeld {
            alias: b.alias.clone(),
        }),
    }
}

/// Whether `actor` may grant the model the right to enter `alias` (or any target, with
/// `None`) in `section`: a right to bind, so only a user who may bind the section may grant
/// it, and only a target usable here.
pub fn grant(
    actor: Actor<'_>,
    alias: Option<&str>,
    target: Option<&Facts>,
    section: Section<'_>,
) -> Result<(), Denial> {
    let Actor::User { open_id, admin } = actor else {
        return Err(Denial::UsersOnly);
    };
    if let Some(alias) = alias {
        usable(alias, target)?;
    }
    bind_section(open_id, admin, section)
}

/// Whether `actor` may revoke a section's grants: any user, never the model.
pub fn revoke_grants(actor: Actor<'_>) -> Result<(), Denial> {
    match actor {
        Actor::User { .. } => Ok(()),
        Actor::Model => Err(Denial::UsersOnly),
    }
}

/// Whether `actor` may approve or reject a target: admins only.
pub fn decide_target(actor: Actor<'_>) -> Result<(), Denial> {
    match actor {
        Actor::User { admin: true, .. } => Ok(()),
        _ => Err(Denial::NotAdmin),
    }
}

/// Whether `actor` may answer a parked call that `requester` asked for: an admin, or (for a
/// call its `approvers` leave to the requester) the requester too.
pub fn decide_call(actor: Actor<'_>, requester: &str, approvers: Approvers) -> Result<(), Denial> {
    match actor {
        Actor::User { admin: true, .. } => Ok(()),
        Actor::User { open_id, .. }
            if approvers == Approvers::Requester && open_id == requester =>
        {
            Ok(())
        }
        _ => Err(match approvers {
            Approvers::Admins => Denial::AdminsAnswer,
            Approvers::Requester => Denial::RequesterOrAdminsAnswer,
        }),
    }
}

/// What an MCP token was issued for, as far as where it may work goes.
#[derive(Debug, Clone, Copy)]
pub struct TokenScope<'a> {
    /// The service's own machine.
    pub local: bool,
    /// Every target.
    pub all_targets: bool,
    /// The targets named at issue.
    pub targets: &'a [String],
}

/// Whether a token issued for `scope` may use `target` (`local` for the service's own
/// machine). A target must also be approved, with every jump host on its way among the
/// token's targets; that is checked when it is used.
pub fn use_target(scope: TokenScope<'_>, target: &str) -> bool {
    if target == "local" {
        return scope.local;
    }
    scope.all_targets || scope.targets.iter().any(|t| t == target)
}

/// Whether a click on a progress card's Stop button, sent to `card_chat`, may stop its task:
/// it must come from that chat (`click_chat`). Lark delivers a click only from someone who
/// sees the card, so a click from that chat is a member's; a card forwarded into another chat
/// does not carry the right to stop.
pub fn press_stop(card_chat: Option<&str>, click_chat: &str) -> Result<(), Denial> {
    match card_chat {
        Some(chat) if !chat.is_empty() && chat == click_chat => Ok(()),
        _ => Err(Denial::NotMember),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(alias: &str, status: Status, allowed: bool) -> Facts {
        Facts {
            alias: alias.into(),
            status,
            allowed_here: allowed,
            destination: "u@h".into(),
            generation: 1,
            jumps: Vec::new(),
        }
    }
    fn binding(alias: &str, kind: Kind, owner: &str) -> Binding {
        Binding {
            section: "omt_1".into(),
            alias: alias.into(),
            kind,
            owner: owner.into(),
            bound_at: Utc::now(),
            grant_id: (kind == Kind::Model).then_some(7),
            chat_id: Some("oc_1".into()),
            generation: Some(1),
        }
    }
    fn live_grant(id: i64, alias: Option<&str>) -> Grant {
        Grant {
            id,
            section: "omt_1".into(),
            alias: alias.map(Into::into),
            granted_by: "ou_a".into(),
            granted_at: Utc::now(),
            expires_at: Utc::now(),
        }
    }
    const ANN: Actor = Actor::User {
        open_id: "ou_ann",
        admin: false,
    };
    const BOB: Actor = Actor::User {
        open_id: "ou_bob",
        admin: false,
    };
    const ADMIN: Actor = Actor::User {
        open_id: "ou_admin",
        admin: true,
    };

    /// A thread owned by ann (her binding, if any, is `current`).
    const ANNS: Section = Section::Thread {
        owner: Some("ou_ann"),
    };

    fn asked<'a>(
        alias: &'a str,
        t: Option<&'a Facts>,
        current: Option<&'a Binding>,
        grants: &'a [Grant],
    ) -> Bind<'a> {
        in_section(alias, t, ANNS, current, grants)
    }

    fn in_section<'a>(
        alias: &'a str,
        t: Option<&'a Facts>,
        section: Section<'a>,
        current: Option<&'a Binding>,
        grants: &'a [Grant],
    ) -> Bind<'a> {
        Bind {
            alias,
            target: t,
            section,
            current,
            grants,
        }
    }

    #[test]
    fn target_state_refusals_apply_to_everyone() {
        let p = facts("web", Status::Pending, true);
        let d = facts("web", Status::Disabled, true);
        let n = facts("web", Status::Approved, false);
        for who in [ANN, ADMIN, Actor::Model] {
            let g = [live_grant(1, None)];
            assert_eq!(
                bind(who, asked("web", None, None, &g)),
                Err(Denial::UnknownTarget("web".into()))
            );
            assert_eq!(
                bind(who, asked("web", Some(&p), None, &g)),
                Err(Denial::Pending("web".into()))
            );
            assert_eq!(
                bind(who, asked("web", Some(&d), None, &g)),
                Err(Denial::Disabled("web".into()))
            );
            assert_eq!(
                bind(who, asked("web", Some(&n), None, &g)),
                Err(Denial::NotAllowedHere("web".into()))
            );
        }
    }

    #[test]
    fn every_jump_host_on_the_way_must_be_usable_here_too() {
        use crate::target::allow::Hop;
        let hop = |alias: &str, status, allowed_here| Hop {
            alias: alias.into(),
            status,
            allowed_here,
        };
        let behind = |jumps: Vec<Hop>| Facts {
            jumps,
            ..facts("web2", Status::Approved, true)
        };
        let ok = behind(vec![hop("edge", Status::Approved, true)]);
        let g = [live_grant(1, None)];
        for who in [ANN, ADMIN, Actor::Model] {
            assert!(matches!(
                bind(who, asked("web2", Some(&ok), None, &g)),
                Ok(Permit::Bind { .. })
            ));
            for (status, allowed, why) in [
                (Status::Approved, false, HopRefusal::NotAllowedHere),
                (Status::Disabled, true, HopRefusal::Disabled),
                (Status::Pending, true, HopRefusal::Pending),
            ] {
                // The refused hop is named, however far out it is.
                let t = behind(vec![
                    hop("bastion", Status::Approved, true),
                    hop("edge", status, allowed),
                ]);
                let want = Denial::Jump {
                    alias: "web2".into(),
                    jump: "edge".into(),
                    why,
                };
                assert_eq!(
                    bind(who, asked("web2", Some(&t), None, &g)),
                    Err(want.clone())
                );
                if who != Actor::Model {
                    assert_eq!(grant(who, Some("web2"), Some(&t), ANNS), Err(want));
                }
            }
        }
        let d = Denial::Jump {
            alias: "web2".into(),
            jump: "bastion".into(),
            why: HopRefusal::NotAllowedHere,
        };
        assert_eq!(
            d.to_string(),
            "Target `web2` is reached through the jump host `bastion`, which is not allowed in this chat."
        );
        assert_eq!(d.code(), "jump_not_allowed_here");
    }

    #[test]
    fn users_bind_sticky_and_only_owner_or_admin_switch() {
        let web = facts("web", Status::Approved, true);
        let db = facts("db", Status::Approved, true);
        let sticky = |target| Permit::Bind {
            target,
            kind: Kind::Sticky,
            grant_id: None,
        };
        assert_eq!(
            bind(ANN, asked("web", Some(&web), None, &[])),
            Ok(sticky(&web))
        );
        let anns = binding("web", Kind::Sticky, "ou_ann");
        assert_eq!(
            bind(ANN, asked("db", Some(&db), Some(&anns), &[])),
            Ok(sticky(&db))
        );
        assert!(matches!(
            bind(BOB, asked("db", Some(&db), Some(&anns), &[])),
            Err(Denial::NotOwner { .. })
        ));
        assert_eq!(
            bind(ADMIN, asked("db", Some(&db), Some(&anns), &[])),
            Ok(sticky(&db))
        );
        // In a thread nobody owns yet, a model-made binding is anyone's to replace.
        let model = binding("web", Kind::Model, "model");
        let unowned = Section::Thread { owner: None };
        assert_eq!(
            bind(BOB, in_section("db", Some(&db), unowned, Some(&model), &[])),
            Ok(sticky(&db))
        );
        // Anyone may return to local.
        assert_eq!(release(BOB, Some(&anns)), Ok(Some(&anns)));
    }

    #[test]
    fn only_the_owner_or_an_admin_binds_a_thread_bound_or_not() {
        let db = facts("db", Status::Approved, true);
        let sticky = Ok(Permit::Bind {
            target: &db,
            kind: Kind::Sticky,
            grant_id: None,
        });
        let model = binding("web", Kind::Model, "model");
        // Released (no binding) or model-made: ann's thread is still ann's.
        for current in [None, Some(&model)] {
            assert_eq!(
                bind(BOB, asked("db", Some(&db), current, &[])),
                Err(Denial::NotOwner {
                    owner: "ou_ann".into()
                })
            );
            assert_eq!(bind(ANN, asked("db", Some(&db), current, &[])), sticky);
            assert_eq!(bind(ADMIN, asked("db", Some(&db), current, &[])), sticky);
        }
        // A group chat itself: admins only. A one-to-one chat: its user.
        for (who, want) in [(BOB, Err(Denial::GroupAdminsOnly)), (ADMIN, sticky.clone())] {
            assert_eq!(
                bind(who, in_section("db", Some(&db), Section::Group, None, &[])),
                want
            );
        }
        assert_eq!(
            bind(BOB, in_section("db", Some(&db), Section::Direct, None, &[])),
            sticky
        );
        // Opening the model to a target is binding by proxy: the same rule.
        let grant_on = |who, section| grant(who, Some("db"), Some(&db), section);
        assert_eq!(
            grant_on(BOB, ANNS),
            Err(Denial::NotOwner {
                owner: "ou_ann".into()
            })
        );
        assert_eq!(grant_on(BOB, Section::Group), Err(Denial::GroupAdminsOnly));
        assert_eq!(grant_on(ANN, ANNS), Ok(()));
    }

    #[test]
    fn a_binding_for_another_generation_is_not_unchanged() {
        let mut web = facts("web", Status::Approved, true);
        let anns = binding("web", Kind::Sticky, "ou_ann");
        assert_eq!(
            bind(ANN, asked("web", Some(&web), Some(&anns), &[])),
            Ok(Permit::AlreadyBound { target: &web })
        );
        web.generation = 2;
        assert_eq!(
            bind(ANN, asked("web", Some(&web), Some(&anns), &[])),
            Ok(Permit::Bind {
                target: &web,
                kind: Kind::Sticky,
                grant_id: None
            })
        );
        // The model neither takes it for its own nor replaces it.
        let all = [live_grant(4, None)];
        assert!(matches!(
            bind(Actor::Model, asked("web", Some(&web), Some(&anns), &all)),
            Err(Denial::StickyHeld { .. })
        ));
    }

    #[test]
    fn the_model_needs_a_live_grant_and_never_touches_sticky() {
        let web = facts("web", Status::Approved, true);
        let db = facts("db", Status::Approved, true);
        let m = Actor::Model;
        assert_eq!(
            bind(m, asked("web", Some(&web), None, &[])),
            Err(Denial::NoGrant("web".into()))
        );
        let only_web = [live_grant(3, Some("web"))];
        assert_eq!(
            bind(m, asked("web", Some(&web), None, &only_web)),
            Ok(Permit::Bind {
                target: &web,
                kind: Kind::Model,
                grant_id: Some(3)
            })
        );
        assert_eq!(
            bind(m, asked("db", Some(&db), None, &only_web)),
            Err(Denial::NoGrant("db".into()))
        );
        let all = [live_grant(4, None)];
        assert_eq!(
            bind(m, asked("db", Some(&db), None, &all)),
            Ok(Permit::Bind {
                target: &db,
                kind: Kind::Model,
                grant_id: Some(4)
            })
        );
        let sticky = binding("web", Kind::Sticky, "ou_ann");
        assert!(matches!(
            bind(m, asked("db", Some(&db), Some(&sticky), &all)),
            Err(Denial::StickyHeld { .. })
        ));
        assert!(matches!(
            release(m, Some(&sticky)),
            Err(Denial::StickyHeld { .. })
        ));
        let model = binding("web", Kind::Model, "model");
        assert_eq!(release(m, Some(&model)), Ok(Some(&model)));
        assert_eq!(grant(m, None, None, ANNS), Err(Denial::UsersOnly));
        let refusal = Denial::NoGrant("web".into()).to_string();
        assert!(refusal.contains("/ssh use web") && refusal.contains("/ssh yolo on web"));
    }

    #[test]
    fn only_admins_decide() {
        assert_eq!(decide_target(ADMIN), Ok(()));
        assert_eq!(decide_target(ANN), Err(Denial::NotAdmin));
        assert_eq!(decide_target(Actor::Model), Err(Denial::NotAdmin));
    }
}
