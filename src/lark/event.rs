//! Event bodies as Lark sends them, and their translation into the one domain message the
//! chat layer reads. Pure parsing: no I/O, no decisions about what a message asks for.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::json::Members;

/// The event type of a received chat message.
pub const MESSAGE_RECEIVE: &str = "im.message.receive_v1";
/// The event type of a card button click.
pub const CARD_ACTION: &str = "card.action.trigger";
/// The event type of a message its sender (or a chat's owner or manager) recalled.
pub const MESSAGE_RECALLED: &str = "im.message.recalled_v1";
/// The event type of the bot removed from a group chat.
pub const BOT_REMOVED: &str = "im.chat.member.bot.deleted_v1";
/// The event type of the bot added to a group chat.
pub const BOT_ADDED: &str = "im.chat.member.bot.added_v1";
/// The event type of a group chat disbanded.
pub const CHAT_DISBANDED: &str = "im.chat.disbanded_v1";
/// The event type of people removed from (or leaving) a group chat.
pub const USERS_REMOVED: &str = "im.chat.member.user.deleted_v1";

/// Where an event belongs, read from its envelope when it is verified: the inbox stores it
/// beside the event so it never parses bodies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    /// `thread_id` when the message is in a thread, else `chat_id`; for a card action the chat
    /// the card is in.
    pub section: Option<String>,
    /// The message id of a received message.
    pub message_id: Option<String>,
}

/// The routing of a verified envelope (v2 or v1), read from its raw `event` member; empty for
/// events that name no section.
pub fn route(event_type: &str, event: Option<&RawValue>) -> Routing {
    let Some(event) = event else {
        return Routing::default();
    };
    let s = |m: &Members<'_>, name: &str| {
        m.str(name)
            .filter(|s| !s.is_empty())
            .map(std::borrow::Cow::into_owned)
    };
    let member = |name: &str| {
        Members::of(event)
            .get(name)
            .map(Members::of)
            .unwrap_or_default()
    };
    match event_type {
        MESSAGE_RECEIVE => {
            let message = member("message");
            Routing {
                section: s(&message, "thread_id").or_else(|| s(&message, "chat_id")),
                message_id: s(&message, "message_id"),
            }
        }
        CARD_ACTION => Routing {
            section: s(&member("context"), "open_chat_id"),
            message_id: None,
        },
        _ => Routing::default(),
    }
}

/// Reads `event` out of an envelope given as JSON text (as the callback path holds it).
fn event_of<'a, T: Deserialize<'a>>(payload: &'a str, kind: &'static str) -> Result<T, EventError> {
    #[derive(Deserialize)]
    struct Envelope<T> {
        event: T,
    }
    serde_json::from_str::<Envelope<T>>(payload)
        .map(|e| e.event)
        .map_err(|e| EventError::Shape(kind, e.to_string()))
}

/// `event` of `card.action.trigger`, as sent.
#[derive(Debug, Clone, Deserialize)]
pub struct CardAction {
    pub operator: CardOperator,
    pub action: CardActionValue,
    #[serde(default)]
    pub context: CardContext,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CardOperator {
    #[serde(default)]
    pub open_id: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CardActionValue {
    /// The button's `behaviors[].value` object.
    #[serde(default)]
    pub value: Value,
    #[serde(default)]
    pub tag: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct CardContext {
    #[serde(default)]
    pub open_message_id: String,
    #[serde(default)]
    pub open_chat_id: String,
}

impl CardAction {
    /// Reads `event` out of a v2 envelope given as JSON text.
    pub fn from_envelope_text(payload: &str) -> Result<Self, EventError> {
        event_of(payload, CARD_ACTION)
    }

    /// Reads `event` out of a stored v2 envelope.
    pub fn from_envelope(payload: &Value) -> Result<Self, EventError> {
        let event = payload
            .get("event")
            .ok_or_else(|| EventError::Shape(CARD_ACTION, "no `event`".into()))?;
        CardAction::deserialize(event).map_err(|e| EventError::Shape(CARD_ACTION, e.to_string()))
    }
}

/// Reads `event` of a stored v2 envelope as `T` (`kind` names the event type in errors).
fn stored_event<T: serde::de::DeserializeOwned>(
    payload: &Value,
    kind: &'static str,
) -> Result<T, EventError> {
    let event = payload
        .get("event")
        .ok_or_else(|| EventError::Shape(kind, "no `event`".into()))?;
    T::deserialize(event).map_err(|e| EventError::Shape(kind, e.to_string()))
}

/// `event` of `im.message.recalled_v1`, as sent: `message_id`, `chat_id`, `recall_time`
/// (milliseconds, a string) and `recall_type` (`message_owner`, `group_owner`,
/// `group_manager`, `enterprise_manager`). It names neither the thread nor who recalled.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageRecalled {
    pub message_id: String,
    #[serde(default)]
    pub chat_id: String,
    #[serde(default)]
    pub recall_time: String,
    #[serde(default)]
    pub recall_type: String,
}

impl MessageRecalled {
    /// Reads `event` out of a stored v2 envelope.
    pub fn from_envelope(payload: &Value) -> Result<Self, EventError> {
        let r: MessageRecalled = stored_event(payload, MESSAGE_RECALLED)?;
        if r.message_id.is_empty() {
            return Err(EventError::Shape(
                MESSAGE_RECALLED,
                "empty `message_id`".into(),
            ));
        }
        Ok(r)
    }
}

/// `event` of the chat member and chat events (`im.chat.member.bot.deleted_v1`,
/// `im.chat.member.bot.added_v1`, `im.chat.disbanded_v1`, `im.chat.member.user.deleted_v1`), as
/// sent: `chat_id`, `operator_id{open_id,user_id,union_id}`, `external`, `operator_tenant_key`,
/// `name`, `i18n_names`; the user event also `users[]{name,tenant_key,user_id{open_id,…}}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMembers {
    pub chat_id: String,
    #[serde(default)]
    pub operator_id: Option<UserIds>,
    #[serde(default)]
    pub users: Vec<ChatMember>,
}

/// One person of `users` in a chat member event.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMember {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub user_id: Option<UserIds>,
}

impl ChatMembers {
    /// Reads `event` of `kind` out of a stored v2 envelope.
    pub fn from_envelope(payload: &Value, kind: &'static str) -> Result<Self, EventError> {
        let m: ChatMembers = stored_event(payload, kind)?;
        if m.chat_id.is_empty() {
            return Err(EventError::Shape(kind, "empty `chat_id`".into()));
        }
        Ok(m)
    }

    /// The open_ids of the people the event names.
    pub fn open_ids(&self) -> Vec<String> {
        self.users
            .iter()
            .filter_map(|u| u.user_id.as_ref().and_then(|i| i.open_id.clone()))
            .filter(|id| !id.is_empty())
            .collect()
    }
}

/// Why an event body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("event body does not match {0}: {1}")]
    Shape(&'static str, String),
}

/// `event` of `im.message.receive_v1`, as sent.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageReceive {
    pub sender: Sender,
    pub message: WireMessage,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Sender {
    #[serde(default)]
    pub sender_id: UserIds,
    /// `user`, or `app` for bots.
    #[serde(default)]
    pub sender_type: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct UserIds {
    #[serde(default)]
    pub open_id: Option<String>,
    #[serde(default)]
    pub user_id: Option<String>,
    #[serde(default)]
    pub union_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WireMessage {
    pub message_id: String,
    #[serde(default)]
    pub root_id: Option<String>,
    #[serde(default)]
    pub parent_id: Option<String>,
    #[serde(default)]
    pub thread_id: Option<String>,
    pub chat_id: String,
    #[serde(default)]
    pub chat_type: String,
    #[serde(default)]
    pub message_type: String,
    /// A JSON *string*; for text messages `{"text": "…"}`.
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub mentions: Vec<Mention>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Mention {
    /// The placeholder in the text, `@_user_N`.
    pub key: String,
    #[serde(default)]
    pub id: UserIds,
    #[serde(default)]
    pub name: String,
}

/// A received chat message, as the chat layer sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The inbox event it came from; replies derive their idempotency key from it.
    pub event_id: String,
    pub message_id: String,
    pub chat_id: String,
    /// `p2p` or `group` (or another chat kind Lark adds).
    pub chat_type: String,
    /// Present exactly when the message is in a thread.
    pub thread_id: Option<String>,
    /// The thread's root message (in a thread) or the quoted message (a reply).
    pub root_id: Option<String>,
    /// The message this one replies to (in a thread without a quote: the thread's root).
    pub parent_id: Option<String>,
    pub sender_open_id: String,
    /// Text with every `@_user_N` placeholder replaced by `@Name`.
    pub text: String,
    /// Text with a leading @mention of the bot removed (what commands are parsed from).
    pub addressed_text: String,
    pub mentions_bot: bool,
    /// The files and images it carries (downloaded later, in the worker).
    pub resources: Vec<Resource>,
    /// A forwarded bundle (`merge_forward`), expanded later, in the worker.
    pub forwarded: bool,
    /// A sticker: `text` is empty, the chat layer decides what it says.
    pub sticker: bool,
}

impl Message {
    /// The section this message belongs to: its thread, else its chat.
    pub fn section(&self) -> &str {
        self.thread_id.as_deref().unwrap_or(&self.chat_id)
    }

    pub fn is_p2p(&self) -> bool {
        self.chat_type == "p2p"
    }
}

impl MessageReceive {
    /// Reads `event` out of a v2 envelope given as JSON text.
    pub fn from_envelope_text(payload: &str) -> Result<Self, EventError> {
        event_of(payload, MESSAGE_RECEIVE)
    }

    /// Reads `event` out of a stored v2 envelope.
    pub fn from_envelope(payload: &Value) -> Result<Self, EventError> {
        let event = payload
            .get("event")
            .ok_or_else(|| EventError::Shape(MESSAGE_RECEIVE, "no `event`".into()))?;
        MessageReceive::deserialize(event)
            .map_err(|e| EventError::Shape(MESSAGE_RECEIVE, e.to_string()))
    }

    /// The text with any leading mentions removed (no bot id needed: used on the request path
    /// to recognise `/stop`).
    pub fn text_after_mentions(&self) -> String {
        let raw = plain_text(&self.message.message_type, &self.message.content);
        let mut rest = raw.trim_start();
        while let Some(m) = self
            .message
            .mentions
            .iter()
            .find(|m| !m.key.is_empty() && starts_with_placeholder(rest, &m.key))
        {
            rest = rest[m.key.len()..].trim_start();
        }
        rest.to_string()
    }

    /// Whether another bot (or this one) sent it.
    pub fn from_bot(&self) -> bool {
        self.sender.sender_type != "user"
    }

    /// The domain message; `bot_open_id` identifies mentions of this bot.
    pub fn into_message(self, event_id: &str, bot_open_id: &str) -> Message {
        let m = self.message;
        let Body {
            text: raw,
            resources,
            forwarded,
            sticker,
        } = body(&m.message_type, &m.content);
        let raw = if sticker { String::new() } else { raw };
        let is_bot = |mention: &Mention| mention.id.open_id.as_deref() == Some(bot_open_id);
        let mentions_bot = m.mentions.iter().any(is_bot);

        // A leading mention of the bot addresses it; drop it before parsing commands.
        let trimmed = raw.trim_start();
        let leading_bot = m
            .mentions
            .iter()
            .filter(|x| is_bot(x))
            .find(|x| starts_with_placeholder(trimmed, &x.key));
        let addressed_raw = match leading_bot {
            Some(x) => trimmed[x.key.len()..].trim_start(),
            None => trimmed,
        };
        Message {
            event_id: event_id.to_string(),
            message_id: m.message_id,
            chat_id: m.chat_id,
            chat_type: m.chat_type,
            thread_id: m.thread_id.filter(|t| !t.is_empty()),
            root_id: m.root_id.filter(|t| !t.is_empty()),
            parent_id: m.parent_id.filter(|t| !t.is_empty()),
            sender_open_id: self.sender.sender_id.open_id.unwrap_or_default(),
            text: resolve(&raw, &m.mentions).trim().to_string(),
            addressed_text: resolve(addressed_raw, &m.mentions).trim().to_string(),
            mentions_bot,
            resources,
            forwarded,
            sticker,
        }
    }
}

/// A file a message carries, named as the resource download needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// The `image_key` or `file_key`.
    pub key: String,
    /// What it is: `image`, `file`, `audio` or `media` (an image inside a post is an `image`).
    pub kind: String,
    /// The file name the sender's client gave it, when it gave one.
    pub name: Option<String>,
}

impl Resource {
    /// The `type` the resource download takes: `image` for images, `file` for the rest.
    pub fn download_type(&self) -> &'static str {
        if self.kind == "image" {
            "image"
        } else {
            "file"
        }
    }
}

/// What a sticker reads as.
pub const STICKER: &str = "[a sticker]";
/// What a card with nothing that reads as text says.
pub const CARD_WITHOUT_TEXT: &str = "[a card with no text that can be read here]";

/// What a message's content says: its text (every element made readable), the files it
/// carries, and whether it is a forwarded bundle whose messages must be fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Body {
    pub text: String,
    pub resources: Vec<Resource>,
    /// A `merge_forward` bundle: its content names nothing; its messages are read by id.
    pub forwarded: bool,
    /// A sticker (its text is a placeholder: stickers cannot be downloaded).
    pub sticker: bool,
}

/// Reads a message's `content` (a JSON string) by its type; a card (`interactive`) is read by
/// [`super::card_text`]. Nothing a person can send is silent: a type or a post element this
/// does not know becomes a visible placeholder.
pub fn body(message_type: &str, content: &str) -> Body {
    let v = serde_json::from_str::<Value>(content).unwrap_or(Value::Null);
    let str_of = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let resource = |kind: &str, key: &str| {
        let key = str_of(key);
        (!key.is_empty()).then(|| Resource {
            key,
            kind: kind.to_string(),
            name: Some(str_of("file_name")).filter(|n| !n.is_empty()),
        })
    };
    match message_type {
        "text" => Body {
            text: str_of("text"),
            ..Body::default()
        },
        "post" => post(&v),
        "image" => Body {
            resources: resource("image", "image_key").into_iter().collect(),
            ..Body::default()
        },
        "file" | "audio" | "media" => Body {
            resources: resource(message_type, "file_key").into_iter().collect(),
            ..Body::default()
        },
        "sticker" => Body {
            text: STICKER.into(),
            sticker: true,
            ..Body::default()
        },
        "merge_forward" => Body {
            forwarded: true,
            ..Body::default()
        },
        // A card's images are not listed: Lark refuses to let bots download them (234043).
        "interactive" => Body {
            text: match super::card_text::text(&v) {
                t if t.trim().is_empty() => CARD_WITHOUT_TEXT.into(),
                t => t,
            },
            ..Body::default()
        },
        other => Body {
            text: format!("[a message of type `{other}`, which cannot be read here]"),
            ..Body::default()
        },
    }
}

/// A `post` (rich text): its title, then one line per paragraph, every element as text.
fn post(v: &Value) -> Body {
    // Received posts are `{"title", "content"}`; a post as sent is wrapped in a locale.
    let post = if v.get("content").is_some() {
        v
    } else {
        v.as_object()
            .and_then(|m| m.values().find(|x| x.get("content").is_some()))
            .unwrap_or(v)
    };
    let mut out = Body::default();
    let mut lines: Vec<String> = Vec::new();
    if let Some(title) = post
        .get("title")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        lines.push(title.to_string());
    }
    let paragraphs = post
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for p in paragraphs {
        let mut line = String::new();
        for el in p.as_array().map(Vec::as_slice).unwrap_or(&[]) {
            element(el, &mut line, &mut out.resources);
        }
        lines.push(line);
    }
    out.text = lines.join("\n");
    out
}

/// One post element as text (and, for images and videos, a resource).
pub(super) fn element(el: &Value, line: &mut String, resources: &mut Vec<Resource>) {
    let s = |k: &str| el.get(k).and_then(Value::as_str).unwrap_or("");
    match s("tag") {
        "text" => line.push_str(s("text")),
        "md" => line.push_str(s("text")),
        "a" => match (s("text"), s("href")) {
            ("", href) => line.push_str(href),
            (text, "") => line.push_str(text),
            (text, href) if text == href => line.push_str(href),
            (text, href) => line.push_str(&format!("[{text}]({href})")),
        },
        // Received posts name a mention by its `@_user_N` placeholder, resolved with the
        // message's mentions like a text message's.
        "at" => match (s("user_id"), s("user_name")) {
            (id, _) if id.starts_with("@_") => line.push_str(id),
            (_, name) if !name.is_empty() => line.push_str(&format!("@{name}")),
            (id, _) => line.push_str(&format!("@{id}")),
        },
        "emotion" => line.push_str(&format!(":{}:", s("emoji_type"))),
        "hr" => line.push_str("\n---\n"),
        "code_block" => {
            if !line.is_empty() && !line.ends_with('\n') {
                line.push('\n');
            }
            let code = s("text");
            line.push_str(&format!(
                "```{}\n{}{}```\n",
                s("language").to_lowercase(),
                code,
                if code.ends_with('\n') { "" } else { "\n" }
            ));
        }
        "img" => {
            line.push_str("[image]");
            if !s("image_key").is_empty() {
                resources.push(Resource {
                    key: s("image_key").to_string(),
                    kind: "image".into(),
                    name: None,
                });
            }
        }
        "media" => {
            line.push_str("[video]");
            if !s("file_key").is_empty() {
                resources.push(Resource {
                    key: s("file_key").to_string(),
                    kind: "media".into(),
                    name: Some(s("file_name").to_string()).filter(|n| !n.is_empty()),
                });
            }
        }
        other => line.push_str(&format!("[unsupported element `{other}`]")),
    }
}

/// [`body`] with `@_user_N` placeholders replaced by `@Name` from `mentions` (a fetched
/// message's mentions, for example).
pub fn readable(message_type: &str, content: &str, mentions: &[Mention]) -> Body {
    let mut b = body(message_type, content);
    b.text = resolve(&b.text, mentions);
    b
}

/// The text of a message (see [`body`]).
fn plain_text(message_type: &str, content: &str) -> String {
    body(message_type, content).text
}

/// `text` starts with `key` as a whole placeholder (`@_user_1` is not a prefix of `@_user_10`).
fn starts_with_placeholder(text: &str, key: &str) -> bool {
    text.starts_with(key)
        && !text[key.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Replaces `@_user_N` placeholders by `@Name`, longest key first so `@_user_10` is never
/// read as `@_user_1` followed by `0`.
fn resolve(text: &str, mentions: &[Mention]) -> String {
    let mut keys: Vec<&Mention> = mentions.iter().filter(|m| !m.key.is_empty()).collect();
    keys.sort_by_key(|m| std::cmp::Reverse(m.key.len()));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'outer: while !rest.is_empty() {
        if rest.starts_with('@') {
            for m in &keys {
                if rest.starts_with(m.key.as_str()) {
                    out.push('@');
                    out.push_str(&m.name);
                    rest = &rest[m.key.len()..];
                    continue 'outer;
                }
            }
        }
        let c = rest.chars().next().expect("rest is not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn envelope(text: &str, thread: Option<&str>, sender_type: &str) -> Value {
        let mut message = json!({
            "message_id":"om_1","chat_id":"oc_1","chat_type":"group","message_type":"text",
            "content": json!({"text": text}).to_string(),
            "mentions":[
                {"key":"@_user_1","id":{"open_id":"ou_bot"},"name":"Bot"},
                {"key":"@_user_10","id":{"open_id":"ou_ten"},"name":"Ten"},
                {"key":"@_user_2","id":{"open_id":"ou_ann"},"name":"Ann"}]
        });
        if let Some(t) = thread {
            message["thread_id"] = json!(t);
        }
        json!({"schema":"2.0","header":{},"event":{
            "sender":{"sender_id":{"open_id":"ou_sender"},"sender_type":sender_type},
            "message": message}})
    }

    #[test]
    fn mentions_are_resolved_and_the_leading_bot_mention_dropped() {
        let e = MessageReceive::from_envelope(&envelope(
            "@_user_1 /ssh use web @_user_10 @_user_2",
            None,
            "user",
        ))
        .unwrap();
        assert!(!e.from_bot());
        let m = e.into_message("ev", "ou_bot");
        assert_eq!(m.text, "@Bot /ssh use web @Ten @Ann");
        assert_eq!(m.addressed_text, "/ssh use web @Ten @Ann");
        assert!(m.mentions_bot);
        assert_eq!(m.section(), "oc_1");
        assert_eq!(m.sender_open_id, "ou_sender");
    }

    #[test]
    fn post_messages_have_text_too() {
        let mut env = envelope("", None, "user");
        env["event"]["message"]["message_type"] = json!("post");
        env["event"]["message"]["content"] = json!(
            json!({"title": "", "content": [
                [{"tag": "at", "user_id": "@_user_1"}, {"tag": "text", "text": " /ssh status"}],
                [{"tag": "img", "image_key": "k"}, {"tag": "text", "text": "second"}]
            ]})
            .to_string()
        );
        let m = MessageReceive::from_envelope(&env)
            .unwrap()
            .into_message("ev", "ou_bot");
        assert_eq!(m.text, "@Bot /ssh status\n[image]second");
        assert_eq!(m.addressed_text, "/ssh status\n[image]second");
        assert_eq!(m.resources.len(), 1);
    }

    #[test]
    fn every_post_element_becomes_text() {
        let mut env = envelope("", None, "user");
        env["event"]["message"]["message_type"] = json!("post");
        env["event"]["message"]["content"] = json!(
            json!({"title": "Help", "content": [
                [{"tag": "at", "user_id": "@_user_1"}, {"tag": "text", "text": " what is"},
                 {"tag": "code_block", "language": "SHELL", "text": "ls -la\n"}],
                [{"tag": "a", "text": "the docs", "href": "https://example.com/d"},
                 {"tag": "text", "text": " cc "}, {"tag": "at", "user_id": "@_user_2"},
                 {"tag": "emotion", "emoji_type": "SMILE"}],
                [{"tag": "hr"}],
                [{"tag": "md", "text": "**bold** `x`"}, {"tag": "media", "file_key": "file_v",
                  "image_key": "img_c"}, {"tag": "sparkle"}]
            ]})
            .to_string()
        );
        let m = MessageReceive::from_envelope(&env)
            .unwrap()
            .into_message("ev", "ou_bot");
        assert_eq!(
            m.text,
            "Help\n@Bot what is\n```shell\nls -la\n```\n\n[the docs](https://example.com/d) cc @Ann:SMILE:\n\n---\n\n**bold** `x`[video][unsupported element `sparkle`]"
        );
        // The bot is mentioned after the title, so nothing leads: the text stays whole.
        assert!(m.mentions_bot);
        assert_eq!(
            m.resources,
            vec![Resource {
                key: "file_v".into(),
                kind: "media".into(),
                name: None
            }]
        );
    }

    #[test]
    fn files_stickers_bundles_and_unknown_types_are_never_silent() {
        let b = body("file", r#"{"file_key":"file_1","file_name":"app.log"}"#);
        assert_eq!(b.resources[0].name.as_deref(), Some("app.log"));
        assert_eq!(b.resources[0].download_type(), "file");
        let b = body("image", r#"{"image_key":"img_1"}"#);
        assert_eq!(b.resources[0].download_type(), "image");
        assert_eq!(
            body("audio", r#"{"file_key":"file_a"}"#).resources[0].kind,
            "audio"
        );
        assert_eq!(
            body("sticker", r#"{"file_key":"file_s"}"#).text,
            "[a sticker]"
        );
        assert!(
            body("sticker", r#"{"file_key":"file_s"}"#)
                .resources
                .is_empty()
        );
        assert!(body("merge_forward", r#""Merged and Forwarded Message""#).forwarded);
        assert!(body("location", "{}").text.contains("`location`"));
        let mentions = vec![Mention {
            key: "@_user_1".into(),
            id: UserIds::default(),
            name: "Ann".into(),
        }];
        assert_eq!(
            readable("text", r#"{"text":"hi @_user_1"}"#, &mentions).text,
            "hi @Ann"
        );
    }

    #[test]
    fn a_card_reads_as_its_text_and_lists_no_files() {
        let card = json!({"title": "Disk full", "elements": [
            [{"tag": "text", "text": "web-1: "}, {"tag": "at", "user_id": "@_user_1"}],
            [{"tag": "img", "image_key": "img_v3_graph"}]]});
        let mentions = vec![Mention {
            key: "@_user_1".into(),
            id: UserIds::default(),
            name: "Ann".into(),
        }];
        let b = readable("interactive", &card.to_string(), &mentions);
        assert_eq!(b.text, "Disk full\nweb-1: @Ann\n[image]");
        assert!(
            b.resources.is_empty(),
            "a card's images cannot be downloaded"
        );
        // Nesting past what the JSON reader takes, or nothing readable: named, never empty.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(body("interactive", &deep).text, CARD_WITHOUT_TEXT);
        assert_eq!(body("interactive", "{}").text, CARD_WITHOUT_TEXT);
    }

    /// The routing of an envelope given as a `Value`, through its raw `event` member.
    fn route_of(event_type: &str, envelope: &Value) -> Routing {
        let raw = envelope
            .get("event")
            .map(|e| RawValue::from_string(e.to_string()).unwrap());
        route(event_type, raw.as_deref())
    }

    #[test]
    fn routing_names_the_section_and_message() {
        let plain = envelope("hi", None, "user");
        assert_eq!(
            route_of(MESSAGE_RECEIVE, &plain),
            Routing {
                section: Some("oc_1".into()),
                message_id: Some("om_1".into())
            }
        );
        let threaded = envelope("hi", Some("omt_9"), "user");
        assert_eq!(
            route_of(MESSAGE_RECEIVE, &threaded).section.as_deref(),
            Some("omt_9")
        );
        let click = json!({"event": {"operator": {"open_id": "ou_a"},
            "action": {"value": {"act": "approve"}, "tag": "button"},
            "context": {"open_message_id": "om_card", "open_chat_id": "oc_p2p"}}});
        assert_eq!(
            route_of(CARD_ACTION, &click),
            Routing {
                section: Some("oc_p2p".into()),
                message_id: None
            }
        );
        let a = CardAction::from_envelope(&click).unwrap();
        assert_eq!(a.operator.open_id, "ou_a");
        let b = CardAction::from_envelope_text(&click.to_string()).unwrap();
        assert_eq!(b.context.open_chat_id, "oc_p2p");
        // Members of another type, or no `event` at all, name nothing.
        let odd =
            json!({"event": {"message": {"thread_id": 7, "chat_id": "oc_2", "message_id": ""}}});
        assert_eq!(
            route_of(MESSAGE_RECEIVE, &odd),
            Routing {
                section: Some("oc_2".into()),
                message_id: None
            }
        );
        assert_eq!(route(MESSAGE_RECEIVE, None), Routing::default());
        assert_eq!(a.context.open_message_id, "om_card");
        assert_eq!(route_of("other.event", &plain), Routing::default());
        // Leading mentions are skipped without knowing the bot's id.
        let stop = envelope("@_user_1 @_user_2 /stop", None, "user");
        let m = MessageReceive::from_envelope(&stop).unwrap();
        assert_eq!(m.text_after_mentions(), "/stop");
        let m = MessageReceive::from_envelope_text(&stop.to_string()).unwrap();
        assert_eq!(m.text_after_mentions(), "/stop");
    }

    #[test]
    fn thread_and_bot_sender() {
        let mut env = envelope("hi @_user_2", Some("omt_9"), "app");
        // Lark lists only the mentions that occur in the text.
        env["event"]["message"]["mentions"]
            .as_array_mut()
            .unwrap()
            .remove(0);
        let e = MessageReceive::from_envelope(&env).unwrap();
        assert!(e.from_bot());
        let m = e.into_message("ev", "ou_bot");
        assert_eq!(m.section(), "omt_9");
        assert!(!m.mentions_bot);
        assert_eq!(m.addressed_text, "hi @Ann");
    }
}
