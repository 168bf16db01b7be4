//! The chat domain's edges: what it receives ([`Incoming`]), how it answers ([`Reply`]), how
//! it reaches admins ([`AdminChannel`]) and the agent ([`AgentPort`]), how a click is answered
//! at once ([`Toast`]), and where what a message quotes or carries is read ([`Source`]). Lark
//! implements the first two in `lark::reply`; a terminal console can implement them too.
//! Nothing here knows a platform.

use async_trait::async_trait;

/// A received chat message, as the domain sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Incoming {
    /// The inbox event it came from (idempotency of answers derives from it).
    pub event_id: String,
    pub message_id: String,
    pub chat_id: String,
    /// Present exactly when the message is in a thread.
    pub thread_id: Option<String>,
    /// The thread's root message, when the message is in a thread (or a quoted reply).
    pub root_id: Option<String>,
    pub sender: String,
    /// The text with a leading @mention of the bot removed.
    pub text: String,
    /// Addressed to the bot: it mentions the bot, or the chat is a one-to-one chat.
    pub addressed: bool,
    /// The chat is a one-to-one chat (its parent section is its one user's to bind).
    pub direct: bool,
    /// The message this one replies to (in a thread without a quote: the thread's root).
    pub parent_id: Option<String>,
    /// The files and images it carries.
    pub files: Vec<FileRef>,
    /// A forwarded bundle: its messages are read through [`Source::messages`].
    pub forwarded: bool,
    /// A sticker (no text; it cannot be downloaded).
    pub sticker: bool,
}

/// A file or image a message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    /// The platform's key for it.
    pub key: String,
    /// `image`, `file`, `audio` or `media`.
    pub kind: String,
    /// The name the sender's client gave it, if any.
    pub name: Option<String>,
}

/// A message read back by id: a quoted one, or one inside a forwarded bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted {
    pub message_id: String,
    /// Who sent it (an open_id, or `bot <app id>`).
    pub sender: String,
    /// Its text, every element readable.
    pub text: String,
    pub files: Vec<FileRef>,
    /// Inside a forwarded bundle (whose files the platform does not hand out).
    pub in_bundle: bool,
}

/// Why a message or a file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// Larger than the cap; nothing of it was kept.
    #[error("it is larger than the {limit_mb} MB limit")]
    TooLarge { limit_mb: u64 },
    /// The platform refused or failed; the text says why, in words for the user.
    #[error("{0}")]
    Refused(String),
}

/// Reads what a received message refers to, on demand (in the worker, never on the callback
/// path): the messages it quotes or forwards and the files it carries.
#[async_trait]
pub trait Source: Send + Sync {
    /// The message `message_id`, and for a forwarded bundle the messages inside it (bounded).
    async fn messages(&self, message_id: &str) -> Result<Vec<Quoted>, Unavailable>;
    /// A file of message `message_id`, at most `max` bytes.
    async fn download(
        &self,
        message_id: &str,
        file: &FileRef,
        max: u64,
    ) -> Result<Vec<u8>, Unavailable>;
}

impl Incoming {
    /// The section: the thread, else the chat.
    pub fn section(&self) -> &str {
        self.thread_id.as_deref().unwrap_or(&self.chat_id)
    }

    /// What kind of conversation the section is, for who may bind it.
    pub fn conversation(&self) -> super::change::Conversation {
        use super::change::Conversation;
        match (&self.thread_id, self.direct) {
            (Some(_), _) => Conversation::Thread,
            (None, true) => Conversation::Direct,
            (None, false) => Conversation::Group,
        }
    }
}

/// Why a thread could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    /// The chat does not allow threads (Lark 230071).
    #[error("this chat does not allow threads")]
    NotAllowed,
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Answers one received message.
#[async_trait]
pub trait Reply: Send + Sync {
    /// Answers in the message's place (its thread when it is in one). `purpose` makes the
    /// answer idempotent: the same (message, purpose) is never posted twice.
    async fn answer(&self, text: &str, purpose: &str) -> anyhow::Result<()>;
    /// Answers by opening a thread on the message; returns the new thread's id when the
    /// platform names it.
    async fn open_thread(&self, text: &str, purpose: &str) -> Result<Option<String>, ThreadError>;
    /// Where the message's quoted messages and files are read from; `None` where the channel
    /// has none (a terminal).
    fn source(&self) -> Option<&dyn Source> {
        None
    }
}

/// The immediate answer to a card click (a target's or a parked call's approval card),
/// computed without I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toast {
    /// `success`, `info`, `warning` or `error`.
    pub kind: &'static str,
    pub text: String,
}

/// A target awaiting (or given) an admin's decision, as an approval card shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetApprovalView {
    pub alias: String,
    /// The target's generation (a removed and re-added alias is a new one).
    pub generation: i64,
    /// `user@host:port` (`None` on an expired card: it may be another target's now).
    pub destination: Option<String>,
    pub added_by: Option<String>,
    pub fingerprint: Option<String>,
    pub state: TargetCardState,
}

/// Where a target's approval card stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetCardState {
    /// Awaiting a decision: the card has its buttons.
    Pending,
    /// Decided: who, what (`approved`, `rejected`) and when.
    Decided {
        by: String,
        what: String,
        when: String,
    },
    /// A click came after what the card showed had changed (decided, removed, re-added, or
    /// another host key): it decided nothing, and the card can decide nothing.
    Expired,
}

/// Reaches admins one-to-one.
#[async_trait]
pub trait AdminChannel: Send + Sync {
    /// Sends a target's approval card to an admin; returns the card message's id. `key` makes the
    /// send idempotent.
    async fn send_target_approval(
        &self,
        admin_open_id: &str,
        view: &TargetApprovalView,
        key: &str,
    ) -> anyhow::Result<String>;
    /// Rewrites a sent target approval card in place.
    async fn update_target_approval(
        &self,
        message_id: &str,
        view: &TargetApprovalView,
    ) -> anyhow::Result<()>;
}

/// Where a schedule's firing posts its anchor message: the thread (a reply in it to its root)
/// or the chat itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnchorPlace {
    pub chat_id: String,
    pub section: String,
    /// The thread's root message, when the schedule lives in a thread.
    pub root_message_id: Option<String>,
}

/// Posts what a schedule's firing says in its place ([`AnchorPlace`]) — the anchor its turn
/// answers, and notices (skipped, paused). `key` makes a post idempotent: a retried firing
/// posts nothing new and gets the same message id.
#[async_trait]
pub trait Anchors: Send + Sync {
    async fn post(&self, place: &AnchorPlace, text: &str, key: &str) -> anyhow::Result<String>;
}

/// A request for the agent, made from one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRequest {
    pub section: String,
    pub chat_id: String,
    pub message_id: String,
    pub sender_open_id: String,
    pub text: String,
    pub in_thread: bool,
}

/// The agent, as the dispatcher reaches it: enqueue a turn, stop the running one
/// ([`crate::agent::Agent`] implements it, in [`super::ssh_mode`]).
#[async_trait]
pub trait AgentPort: Send + Sync {
    /// Queues a turn for the message (idempotent on its message id). `Some(text)` is an answer
    /// to send at once (e.g. no model configured); `None` when the agent answers later itself.
    async fn enqueue(&self, req: &AgentRequest) -> anyhow::Result<Option<String>>;
    /// Queues a schedule's firing as a turn of its own (idempotent on the anchor's message id),
    /// with the schedule's creator as its sender.
    async fn enqueue_scheduled(
        &self,
        req: &AgentRequest,
        schedule_id: i64,
    ) -> anyhow::Result<Option<String>>;
    /// Cancels the section's running turn; returns what to tell the user.
    async fn stop(&self, section: &str, by: &str) -> anyhow::Result<String>;
    /// One line on running and queued turns for `/ssh status`, if there is anything to say.
    async fn status_line(&self, _section: &str) -> Option<String> {
        None
    }
}
