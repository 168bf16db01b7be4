//! The OpenAI chat-completions wire format, as real providers speak it rather than as the
//! reference says they should: unknown fields are kept (and passed through), `content` may be
//! null, missing or a list of parts, tool-call ids may be integers or repeat, `arguments` may
//! not be valid JSON, and finish reasons come in dialects. Parsing never fails on those; the
//! oddities are normalised once, in [`ChatResponse::normalize`], so callers see one shape.
//!
//! Hand-written because no maintained crate accepts this much provider variance without
//! rejecting whole responses (the typed OpenAI SDK crates refuse integer ids and odd reasons).

use serde::de::Deserializer;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A chat-completions request. `model` is overwritten by the router with each entry's
/// provider model; unknown fields in `extra` travel to the provider unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Abstract model name on the way in (the router's chain), provider model on the way out.
    #[serde(default)]
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Tool>>,
    /// `"auto"`, `"none"`, `"required"` or `{"type":"function","function":{"name":…}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Anything else the caller set (`top_p`, `stop`, `response_format`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One message in either direction.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`; a reply without a role is the assistant's.
    #[serde(default = "assistant")]
    pub role: String,
    /// Null, missing, a string, or a list of content parts.
    #[serde(default, deserialize_with = "content_opt")]
    pub content: Option<Content>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tool_calls: Vec<ToolCall>,
    /// On `role: tool` messages: the id of the call this answers.
    #[serde(
        default,
        deserialize_with = "id_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_call_id: Option<String>,
    /// Provider extras such as `reasoning_content`, kept so the proxy passes them through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn assistant() -> String {
    "assistant".into()
}

impl Message {
    pub fn system(text: impl Into<String>) -> Self {
        Self::text("system", text)
    }

    pub fn user(text: impl Into<String>) -> Self {
        Self::text("user", text)
    }

    /// The answer to tool call `id`.
    pub fn tool(id: impl Into<String>, text: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(id.into()),
            ..Self::text("tool", text)
        }
    }

    fn text(role: &str, text: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: Some(Content::Text(text.into())),
            ..Default::default()
        }
    }

    /// The text of the message (parts of type `text` joined), or `""`.
    pub fn text_content(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        }
    }
}

/// Whether any message of `request` carries an image part.
pub fn has_images(request: &ChatRequest) -> bool {
    request.messages.iter().any(|m| match &m.content {
        Some(Content::Parts(parts)) => parts.iter().any(is_image_part),
        _ => false,
    })
}

/// `request` for a model that reads no images: each message with image parts keeps only its
/// text (which names where each image is), as a plain string.
pub fn images_as_text(request: &ChatRequest) -> ChatRequest {
    let mut out = request.clone();
    for m in &mut out.messages {
        if let Some(Content::Parts(parts)) = &m.content
            && parts.iter().any(is_image_part)
        {
            m.content = Some(Content::Text(m.text_content()));
        }
    }
    out
}

fn is_image_part(p: &Value) -> bool {
    p.get("type").and_then(Value::as_str) == Some("image_url")
}

impl Message {
    /// Adds an image (`data:<mime>;base64,…`) to the message, after its text.
    pub fn add_image(&mut self, mime: &str, data: &[u8]) {
        use base64::Engine;
        let url = format!(
            "data:{mime};base64,{}",
            base64::engine::general_purpose::STANDARD.encode(data)
        );
        let mut parts = match self.content.take() {
            Some(Content::Parts(p)) => p,
            Some(Content::Text(t)) => vec![serde_json::json!({"type": "text", "text": t})],
            None => Vec::new(),
        };
        parts.push(serde_json::json!({"type": "image_url", "image_url": {"url": url}}));
        self.content = Some(Content::Parts(parts));
    }
}

/// Message content.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    /// Content parts (`{"type":"text","text":…}`, images, …), passed through as they came.
    Parts(Vec<Value>),
}

/// A function the model may call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Tool {
    #[serde(rename = "type", default = "function")]
    pub kind: String,
    pub function: FunctionDef,
}

fn function() -> String {
    "function".into()
}

impl Tool {
    pub fn function(name: &str, description: &str, parameters: Value) -> Self {
        Tool {
            kind: function(),
            function: FunctionDef {
                name: name.into(),
                description: Some(description.into()),
                parameters,
                extra: Map::new(),
            },
        }
    }
}

/// A function's name, description and JSON-Schema parameters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Value,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A call the model asked for.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    /// Made unique within its message by [`ChatResponse::normalize`]; providers send
    /// integers, empty strings or repeats.
    #[serde(default, deserialize_with = "id_string")]
    pub id: String,
    #[serde(rename = "type", default = "function")]
    pub kind: String,
    #[serde(default)]
    pub function: FunctionCall,
}

/// The called function's name and its arguments, a JSON document *as text*.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FunctionCall {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub name: String,
    /// Kept as the provider sent it (a non-string value is re-encoded as JSON text), because it
    /// may be invalid JSON: [`ToolCall::parsed_arguments`] reports that as a tool error.
    #[serde(default, deserialize_with = "arguments_text")]
    pub arguments: String,
}

/// The model produced arguments that are not a JSON object; the text is meant to be sent back
/// to the model as the tool's result so it can correct itself.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error(
    "the arguments of `{tool}` are not a valid JSON object ({reason}); send them again as one JSON object"
)]
pub struct ArgumentsError {
    pub tool: String,
    pub reason: String,
}

impl ToolCall {
    /// The arguments as a JSON object. Empty arguments count as `{}`.
    pub fn parsed_arguments(&self) -> Result<Map<String, Value>, ArgumentsError> {
        let text = self.function.arguments.trim();
        if text.is_empty() {
            return Ok(Map::new());
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(other) => Err(ArgumentsError {
                tool: self.function.name.clone(),
                reason: format!("got a JSON {}", json_kind(&other)),
            }),
            Err(e) => Err(ArgumentsError {
                tool: self.function.name.clone(),
                reason: e.to_string(),
            }),
        }
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Why generation stopped, with provider dialects folded into the standard values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    /// Anything else, as sent.
    Other(String),
}

impl FinishReason {
    fn from_wire(s: &str) -> Option<Self> {
        Some(match s {
            "" => return None,
            "stop" | "eos" | "end_turn" | "stop_sequence" | "eos_token" => FinishReason::Stop,
            "length" | "max_tokens" => FinishReason::Length,
            "tool_calls" | "tool_use" | "function_call" => FinishReason::ToolCalls,
            "content_filter" | "sensitive" => FinishReason::ContentFilter,
            other => FinishReason::Other(other.into()),
        })
    }

    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(s) => s,
        }
    }
}

impl Serialize for FinishReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

fn finish_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<FinishReason>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => FinishReason::from_wire(&s),
        _ => None,
    })
}

/// A chat-completions response.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatResponse {
    #[serde(default, deserialize_with = "id_string")]
    pub id: String,
    #[serde(default = "chat_completion")]
    pub object: String,
    #[serde(default)]
    pub created: i64,
    /// The router replaces the provider's model with the abstract name that was asked for.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub model: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub choices: Vec<Choice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn chat_completion() -> String {
    "chat.completion".into()
}

/// One completion choice.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub message: Message,
    #[serde(default, deserialize_with = "finish_opt")]
    pub finish_reason: Option<FinishReason>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Token usage as the provider reported it (zeros when it did not).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    #[serde(default, deserialize_with = "count")]
    pub prompt_tokens: u64,
    #[serde(default, deserialize_with = "count")]
    pub completion_tokens: u64,
    #[serde(default, deserialize_with = "count")]
    pub total_tokens: u64,
}

impl ChatResponse {
    /// Folds provider quirks into one shape: every tool call gets an id unique within the
    /// response (so each `role: tool` answer refers to exactly one call) and the `function`
    /// type; a missing finish reason on a message with tool calls becomes `tool_calls`.
    pub fn normalize(&mut self) {
        let mut seen = std::collections::HashSet::new();
        for (ci, choice) in self.choices.iter_mut().enumerate() {
            let msg = &mut choice.message;
            if msg.role.is_empty() {
                msg.role = assistant();
            }
            for (ti, call) in msg.tool_calls.iter_mut().enumerate() {
                if call.id.is_empty() || !seen.insert(call.id.clone()) {
                    let mut n = 0;
                    call.id = loop {
                        let candidate = format!("call_{ci}_{ti}_{n}");
                        if seen.insert(candidate.clone()) {
                            break candidate;
                        }
                        n += 1;
                    };
                }
                if call.kind.is_empty() {
                    call.kind = function();
                }
            }
            if choice.finish_reason.is_none() && !msg.tool_calls.is_empty() {
                choice.finish_reason = Some(FinishReason::ToolCalls);
            }
        }
    }

    /// The first choice's message, if any.
    pub fn message(&self) -> Option<&Message> {
        self.choices.first().map(|c| &c.message)
    }
}

// ---- tolerant field parsers ----------------------------------------------------------------

fn null_as_empty<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn content_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Content>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Null => None,
        Value::String(s) => Some(Content::Text(s)),
        Value::Array(parts) => Some(Content::Parts(parts)),
        other => Some(Content::Text(other.to_string())),
    })
}

fn id_text(v: Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s),
        other => Some(other.to_string()),
    }
}

fn id_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(id_text(Value::deserialize(d)?).unwrap_or_default())
}

fn id_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(id_text(Value::deserialize(d)?))
}

fn arguments_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Null => String::new(),
        Value::String(s) => s,
        other => other.to_string(),
    })
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::Number(n) => n.as_u64().unwrap_or(0),
        Value::String(s) => s.parse().unwrap_or(0),
        _ => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tolerates_provider_quirks() {
        let body = json!({
            "id": 7, "model": "m", "object": "chat.completion",
            "choices": [{
                "message": {
                    "content": null, "reasoning_content": "thinking",
                    "tool_calls": [
                        {"id": 1, "function": {"name": "terminal", "arguments": "{\"command\":\"ls\"}"}},
                        {"id": 1, "type": "function", "function": {"name": "read_file", "arguments": {"path": "/x"}}},
                        {"function": {"name": "patch", "arguments": "{not json"}}
                    ]
                },
                "finish_reason": "tool_use"
            }],
            "usage": {"prompt_tokens": 3, "completion_tokens": "4", "total_tokens": 7, "cached": 1}
        });
        let mut r: ChatResponse = serde_json::from_value(body).unwrap();
        r.normalize();
        let m = r.message().unwrap();
        assert_eq!(m.role, "assistant");
        assert_eq!(m.content, None);
        assert_eq!(m.extra["reasoning_content"], "thinking");
        let ids: Vec<&str> = m.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids[0], "1");
        assert!(ids[1] != "1" && !ids[1].is_empty() && ids[2] != ids[1] && !ids[2].is_empty());
        assert_eq!(m.tool_calls[0].parsed_arguments().unwrap()["command"], "ls");
        assert_eq!(m.tool_calls[1].parsed_arguments().unwrap()["path"], "/x");
        let e = m.tool_calls[2].parsed_arguments().unwrap_err();
        assert!(e.to_string().contains("`patch`"), "{e}");
        assert_eq!(r.choices[0].finish_reason, Some(FinishReason::ToolCalls));
        assert_eq!(r.usage.unwrap().completion_tokens, 4);
        assert_eq!(r.id, "7");
    }

    #[test]
    fn finish_reasons_and_missing_fields() {
        for (wire, want) in [
            (json!("eos"), Some(FinishReason::Stop)),
            (json!(""), None),
            (json!(null), None),
            (json!("max_tokens"), Some(FinishReason::Length)),
            (json!("weird"), Some(FinishReason::Other("weird".into()))),
        ] {
            let c: Choice = serde_json::from_value(json!({"finish_reason": wire})).unwrap();
            assert_eq!(c.finish_reason, want);
        }
        let r: ChatResponse = serde_json::from_value(json!({"choices": [{}]})).unwrap();
        assert_eq!(r.message().unwrap().text_content(), "");
        let s = serde_json::to_value(&r).unwrap();
        assert_eq!(s["object"], "chat.completion");
    }

    #[test]
    fn request_round_trips_unknown_fields_and_tool_messages() {
        let body = json!({
            "model": "coder", "top_p": 0.5,
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": null,
                 "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": 5, "content": "done"}
            ]
        });
        let r: ChatRequest = serde_json::from_value(body).unwrap();
        assert_eq!(r.messages[0].text_content(), "hi");
        assert_eq!(r.messages[2].tool_call_id.as_deref(), Some("5"));
        let out = serde_json::to_value(&r).unwrap();
        assert_eq!(out["top_p"], 0.5);
        assert_eq!(
            out["messages"][1]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert!(out.get("tools").is_none());
    }

    #[test]
    fn images_are_parts_for_vision_and_text_otherwise() {
        let mut m = Message::user("look at /w/attachments/a.png");
        m.add_image("image/png", b"\x89PNG");
        let req = ChatRequest {
            messages: vec![Message::system("s"), m],
            ..Default::default()
        };
        assert!(has_images(&req));
        let v = serde_json::to_value(&req.messages[1]).unwrap();
        assert_eq!(v["content"][0]["text"], "look at /w/attachments/a.png");
        assert_eq!(v["content"][1]["type"], "image_url");
        assert_eq!(
            v["content"][1]["image_url"]["url"],
            "data:image/png;base64,iVBORw=="
        );
        let plain = images_as_text(&req);
        assert!(!has_images(&plain));
        assert_eq!(
            plain.messages[1].content,
            Some(Content::Text("look at /w/attachments/a.png".into()))
        );
    }
}
