//! A card message (`interactive`) read as text, so that a reply to a card (an alert, a bot's
//! report) brings what the card says. Lark's message API returns a card by default in a
//! 1.0-style form, `{"title", "elements": [[{"tag": "text"|"a"|"at"|"img"|"button"|…}, …], …]}`:
//! rows of post-like elements, each row read as one line. With
//! `card_msg_content_type=raw_card_content` it returns a card's own JSON instead — a 2.0 card's
//! `header` and `body.elements`, a 1.0 card's `header` and `elements` of objects — whose text
//! is read out of its elements: markdown and plain text, a `div`'s text and fields, the header's
//! title and subtitle, a collapsible panel's title, buttons' labels, images' alt text, table
//! rows, inputs' placeholders, and what columns, panels, forms and notes hold. [`text`] reads
//! either form; the service asks for the default one.
//!
//! Bounded whatever the card: containers are followed at most [`MAX_DEPTH`] deep, at most
//! [`MAX_ELEMENTS`] elements are read and at most [`MAX_BYTES`] of text made (each cut is
//! named in the text). A card's markup (`<at id=all></at>`, `<font>`…) stays text: what the
//! model writes back is made inert before it is posted ([`super::markup`]).
//!
//! Never: names a card's image as a file to download (Lark refuses resources inside cards,
//! 234043); leaves an element it does not know silent; does I/O.

use serde_json::Value;

/// Deepest nesting of containers read (a column in a column set in a panel…); what lies deeper
/// is named, not read.
pub const MAX_DEPTH: usize = 12;
/// Most elements read from one card.
pub const MAX_ELEMENTS: usize = 2_000;
/// Most bytes of text made from one card: well above what a quoted message keeps, so the
/// quote's own cut shows where it cut.
pub const MAX_BYTES: usize = 32 * 1024;

/// Where the text stops because a bound was reached.
pub const LEFT_OUT: &str = "[…the rest of the card is left out]";
/// What stands for containers nested deeper than [`MAX_DEPTH`].
pub const TOO_DEEP: &str = "[…nested too deep to read]";

/// The text of a card in either form: its title first, then one line per row or element.
/// Empty when nothing in it reads as text.
pub fn text(card: &Value) -> String {
    let mut r = Reader::default();
    let card = unwrap_locale(card);
    let header = card.get("header");
    let title = card
        .get("title")
        .and_then(Value::as_str)
        .or_else(|| header.and_then(|h| h.get("title")).and_then(text_of));
    if let Some(t) = title {
        r.line(t.to_string());
    }
    if let Some(sub) = header.and_then(|h| h.get("subtitle")).and_then(text_of) {
        r.line(sub.to_string());
    }
    let elements = card
        .pointer("/body/elements")
        .or_else(|| card.get("elements"))
        .or_else(|| {
            card.get("i18n_elements")
                .and_then(Value::as_object)
                .and_then(|m| m.values().next())
        });
    for item in elements.and_then(Value::as_array).into_iter().flatten() {
        if !r.room() {
            break;
        }
        match item {
            // The default form: a row of post-like elements, one line.
            Value::Array(row) => {
                let mut line = String::new();
                for el in row {
                    if !r.room() {
                        break;
                    }
                    r.inline(el, &mut line, 0);
                }
                r.line(line);
            }
            el => r.block(el, 0),
        }
    }
    r.finish()
}

/// A card as sent is sometimes wrapped in its locale (`{"zh_cn": {…}}`), as a post is.
fn unwrap_locale(card: &Value) -> &Value {
    let known = [
        "title",
        "elements",
        "header",
        "body",
        "schema",
        "i18n_elements",
    ];
    match card.as_object() {
        Some(m) if !known.iter().any(|k| m.contains_key(*k)) => m
            .values()
            .find(|v| v.get("elements").is_some() || v.get("title").is_some())
            .unwrap_or(card),
        _ => card,
    }
}

/// The text of a text object (`{"tag": "plain_text"|"lark_md", "content"}`), or of a string.
fn text_of(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s.as_str()),
        Value::Object(m) => m
            .get("content")
            .and_then(Value::as_str)
            .or_else(|| m.get("text").and_then(text_of)),
        _ => None,
    }
    .filter(|s| !s.is_empty())
}

/// A table cell or an option as text.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => String::new(),
        Value::Array(a) => a.iter().map(scalar).collect::<Vec<_>>().join(", "),
        Value::Object(_) => text_of(v)
            .map(str::to_string)
            .or_else(|| v.get("name").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| "…".into()),
    }
}

/// The text made so far, and what is left of the bounds.
#[derive(Default)]
struct Reader {
    lines: Vec<String>,
    bytes: usize,
    elements: usize,
    /// A bound was reached: nothing more is read.
    full: bool,
    /// Something was nested too deep (named once).
    deep: bool,
}

impl Reader {
    /// Counts one element; false once a bound is reached.
    fn room(&mut self) -> bool {
        self.elements += 1;
        if self.elements > MAX_ELEMENTS || self.bytes > MAX_BYTES {
            self.full = true;
        }
        !self.full
    }

    /// Adds a line (an empty one adds nothing), cut to what is left of [`MAX_BYTES`].
    fn line(&mut self, mut s: String) {
        let end = s.trim_end().len();
        s.truncate(end);
        if s.trim().is_empty() {
            return;
        }
        let left = MAX_BYTES.saturating_sub(self.bytes);
        if s.len() > left {
            s.truncate(floor_char_boundary(&s, left));
            self.full = true;
        }
        self.bytes += s.len() + 1;
        self.lines.push(s);
    }

    /// Appends to a line being made, within what is left of [`MAX_BYTES`].
    fn push(&mut self, line: &mut String, s: &str) {
        let left = MAX_BYTES.saturating_sub(self.bytes + line.len());
        if s.len() > left {
            line.push_str(&s[..floor_char_boundary(s, left)]);
            self.full = true;
        } else {
            line.push_str(s);
        }
    }

    fn too_deep(&mut self) {
        if !self.deep {
            self.deep = true;
            self.line(TOO_DEEP.into());
        }
    }

    fn finish(mut self) -> String {
        if self.full {
            self.lines.push(LEFT_OUT.into());
        }
        self.lines.join("\n")
    }

    /// One element of the default form's rows, appended to `line`.
    fn inline(&mut self, el: &Value, line: &mut String, depth: usize) {
        let s = |k: &str| el.get(k).and_then(Value::as_str).unwrap_or("");
        let piece = match s("tag") {
            "button" => match text_of(el.get("text").unwrap_or(&Value::Null)) {
                Some(label) => format!("[button: {label}]"),
                None => "[a button]".into(),
            },
            "note" => {
                if depth >= MAX_DEPTH {
                    if !self.deep {
                        self.deep = true;
                        self.push(line, TOO_DEEP);
                    }
                    return;
                }
                // A note holds elements of its own, as rows or as one row.
                for item in el
                    .get("elements")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let row = match item {
                        Value::Array(row) => row.as_slice(),
                        one => std::slice::from_ref(one),
                    };
                    for nested in row {
                        if !self.room() {
                            return;
                        }
                        self.inline(nested, line, depth + 1);
                    }
                }
                return;
            }
            "hr" => "---".into(),
            // The post's own elements read as a post's do; a card's images are never
            // downloadable, so what `element` would list for download is dropped.
            "text" | "md" | "a" | "at" | "emotion" | "code_block" | "img" | "media" => {
                let mut piece = String::new();
                super::event::element(el, &mut piece, &mut Vec::new());
                piece
            }
            tag => match widget(el) {
                Some(w) => w,
                None if !s("text").is_empty() => s("text").to_string(),
                None => format!("[unsupported element `{tag}`]"),
            },
        };
        self.push(line, &piece);
    }

    /// One element of a card's own JSON, as lines.
    fn block(&mut self, el: &Value, depth: usize) {
        if depth >= MAX_DEPTH {
            self.too_deep();
            return;
        }
        let tag = el.get("tag").and_then(Value::as_str).unwrap_or("");
        let children = |k: &str| el.get(k).and_then(Value::as_array).into_iter().flatten();
        match tag {
            "markdown" | "lark_md" | "plain_text" | "text" => {
                if let Some(t) = text_of(el) {
                    self.line(t.to_string());
                }
            }
            "div" => {
                if let Some(t) = el.get("text").and_then(text_of) {
                    self.line(t.to_string());
                }
                for field in children("fields") {
                    if !self.room() {
                        return;
                    }
                    if let Some(t) = field.get("text").and_then(text_of) {
                        self.line(t.to_string());
                    }
                }
                if let Some(extra) = el.get("extra")
                    && self.room()
                {
                    self.block(extra, depth + 1);
                }
            }
            "hr" => self.line("---".into()),
            "img" | "image" => {
                let alt = el
                    .get("alt")
                    .and_then(text_of)
                    .or_else(|| el.get("title").and_then(text_of));
                self.line(match alt {
                    Some(a) => format!("[image: {a}]"),
                    None => "[image]".into(),
                });
            }
            "button" => self.line(match el.get("text").and_then(text_of) {
                Some(label) => format!("[button: {label}]"),
                None => "[a button]".into(),
            }),
            "table" => self.table(el),
            _ => {
                // A panel's title, then what any container holds: `elements`, a column set's
                // `columns`, a 1.0 action's `actions`.
                if tag == "collapsible_panel"
                    && let Some(t) = el.pointer("/header/title").and_then(text_of)
                {
                    self.line(t.to_string());
                }
                let mut contained = false;
                for key in ["elements", "columns", "actions"] {
                    for child in children(key) {
                        contained = true;
                        if !self.room() {
                            return;
                        }
                        self.block(child, depth + 1);
                    }
                }
                if contained || tag == "collapsible_panel" {
                    return;
                }
                let line = widget(el)
                    .or_else(|| text_of(el).map(str::to_string))
                    .unwrap_or_else(|| format!("[unsupported element `{tag}`]"));
                self.line(line);
            }
        }
    }

    /// A 2.0 table: its column names, then one line per row, cells in column order.
    fn table(&mut self, el: &Value) {
        let columns: Vec<(&str, String)> = el
            .get("columns")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| {
                let name = c.get("name").and_then(Value::as_str)?;
                let shown = c
                    .get("display_name")
                    .and_then(text_of)
                    .unwrap_or(name)
                    .to_string();
                Some((name, shown))
            })
            .collect();
        if columns.is_empty() {
            self.line("[a table]".into());
            return;
        }
        self.line(
            columns
                .iter()
                .map(|(_, s)| s.as_str())
                .collect::<Vec<_>>()
                .join(" | "),
        );
        for row in el
            .get("rows")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !self.room() {
                return;
            }
            let cells: Vec<String> = columns
                .iter()
                .map(|(name, _)| row.get(*name).map(scalar).unwrap_or_default())
                .collect();
            self.line(cells.join(" | "));
        }
    }
}

/// An input, a menu or a picker: what it asks for, and its options when it lists them.
fn widget(el: &Value) -> Option<String> {
    let tag = el.get("tag").and_then(Value::as_str)?;
    let asks = matches!(
        tag,
        "input"
            | "select_static"
            | "multi_select_static"
            | "select_person"
            | "multi_select_person"
            | "overflow"
            | "date_picker"
            | "picker_time"
            | "picker_datetime"
            | "select_img"
            | "checker"
            | "person"
            | "person_list"
            | "chart"
    );
    if !asks {
        return None;
    }
    let mut s = format!("[{tag}");
    if let Some(p) = el
        .get("placeholder")
        .and_then(text_of)
        .or_else(|| el.get("text").and_then(text_of))
        .or_else(|| el.get("label").and_then(text_of))
    {
        s.push_str(&format!(": {p}"));
    }
    let options: Vec<String> = el
        .get("options")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .take(20)
        .map(scalar)
        .filter(|o| !o.is_empty())
        .collect();
    if !options.is_empty() {
        s.push_str(&format!(" (options: {})", options.join(", ")));
    }
    s.push(']');
    Some(s)
}

/// The largest index ≤ `at` on a character boundary of `s`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_default_form_reads_row_by_row() {
        let card = json!({"title": "CPU high on web-1", "elements": [
            [{"tag": "text", "text": "usage 97% for 10 min, "},
             {"tag": "a", "text": "dashboard", "href": "https://grafana.example/d/1"}],
            [{"tag": "at", "user_id": "ou_oncall", "user_name": "Ann"},
             {"tag": "text", "text": " please look"}],
            [{"tag": "img", "image_key": "img_v3_chart"}],
            [{"tag": "button", "text": "Silence"}, {"tag": "button", "text": {"tag": "plain_text", "content": "Ack"}}],
            [{"tag": "hr"}],
            [{"tag": "note", "elements": [{"tag": "text", "text": "sent by alertmanager"}]}],
            [{"tag": "select_static", "placeholder": "snooze for", "options": ["1h", "1d"]},
             {"tag": "sparkle"}, {"tag": "newthing", "text": "still read"}]
        ]});
        assert_eq!(
            text(&card),
            "CPU high on web-1\n\
             usage 97% for 10 min, [dashboard](https://grafana.example/d/1)\n\
             @Ann please look\n\
             [image]\n\
             [button: Silence][button: Ack]\n\
             ---\n\
             sent by alertmanager\n\
             [select_static: snooze for (options: 1h, 1d)][unsupported element `sparkle`]still read"
        );
    }

    #[test]
    fn a_2_0_cards_own_json_reads_its_text_elements() {
        let card = json!({"schema": "2.0",
        "header": {"title": {"tag": "plain_text", "content": "Deploy failed"},
                   "subtitle": {"tag": "plain_text", "content": "api · prod"}},
        "body": {"elements": [
            {"tag": "markdown", "content": "**ENOSPC** writing `/var/lib/app`"},
            {"tag": "div", "text": {"tag": "lark_md", "content": "host: web-1"},
             "fields": [{"is_short": true, "text": {"tag": "lark_md", "content": "since 12:00"}}]},
            {"tag": "column_set", "columns": [
                {"tag": "column", "elements": [{"tag": "plain_text", "content": "left"}]},
                {"tag": "column", "elements": [{"tag": "markdown", "content": "right"}]}]},
            {"tag": "collapsible_panel", "header": {"title": {"tag": "markdown", "content": "Logs"}},
             "elements": [{"tag": "markdown", "content": "line 1"}]},
            {"tag": "img", "img_key": "img_1", "alt": {"tag": "plain_text", "content": "disk graph"}},
            {"tag": "table", "columns": [{"name": "host", "display_name": "Host"}, {"name": "free"}],
             "rows": [{"host": "web-1", "free": 0}, {"host": "web-2", "free": "12 GB"}]},
            {"tag": "form", "elements": [
                {"tag": "input", "placeholder": {"tag": "plain_text", "content": "reason"}},
                {"tag": "button", "text": {"tag": "plain_text", "content": "Retry"},
                 "behaviors": [{"type": "callback", "value": {"act": "retry"}}]}]},
            {"tag": "hr"},
            {"tag": "mystery"}
        ]}});
        assert_eq!(
            text(&card),
            "Deploy failed\napi · prod\n**ENOSPC** writing `/var/lib/app`\nhost: web-1\nsince 12:00\n\
             left\nright\nLogs\nline 1\n[image: disk graph]\nHost | free\nweb-1 | 0\nweb-2 | 12 GB\n\
             [input: reason]\n[button: Retry]\n---\n[unsupported element `mystery`]"
        );
    }

    #[test]
    fn a_1_0_cards_own_json_and_a_locale_wrapped_one_read_too() {
        let card = json!({"header": {"title": {"tag": "plain_text", "content": "Build #12"}},
            "elements": [
                {"tag": "div", "text": {"tag": "lark_md", "content": "status: passed"}},
                {"tag": "action", "actions": [{"tag": "button", "text": {"tag": "lark_md", "content": "Open"}}]},
                {"tag": "note", "elements": [{"tag": "plain_text", "content": "by CI"}]}]});
        assert_eq!(
            text(&card),
            "Build #12\nstatus: passed\n[button: Open]\nby CI"
        );
        let wrapped =
            json!({"zh_cn": {"title": "T", "elements": [[{"tag": "text", "text": "x"}]]}});
        assert_eq!(text(&wrapped), "T\nx");
        assert_eq!(text(&json!("not a card")), "");
        assert_eq!(text(&Value::Null), "");
    }

    /// Nesting, size and element count are bounded, and each cut is named; markup stays text.
    #[test]
    fn a_hostile_card_is_bounded_and_its_markup_stays_text() {
        // Containers nested far deeper than anything real.
        let mut inner = json!({"tag": "markdown", "content": "the bottom"});
        for _ in 0..60 {
            inner =
                json!({"tag": "column_set", "columns": [{"tag": "column", "elements": [inner]}]});
        }
        let deep = json!({"schema": "2.0", "body": {"elements": [
            {"tag": "markdown", "content": "top"}, inner]}});
        let t = text(&deep);
        assert_eq!(t, format!("top\n{TOO_DEEP}"));
        // Notes in notes, in the default form.
        let mut note = json!({"tag": "text", "text": "deepest"});
        for _ in 0..60 {
            note = json!({"tag": "note", "elements": [note]});
        }
        let t = text(&json!({"title": "", "elements": [[{"tag": "text", "text": "a"}, note]]}));
        assert_eq!(t, format!("a{TOO_DEEP}"));

        // Huge: many long rows, one huge string, many elements.
        let rows: Vec<Value> = (0..5_000)
            .map(|i| json!([{"tag": "text", "text": format!("row {i} <at id=all></at> {}", "é".repeat(100))}]))
            .collect();
        let t = text(&json!({"title": "flood", "elements": rows}));
        assert!(t.len() <= MAX_BYTES + LEFT_OUT.len() + 1, "{}", t.len());
        assert!(t.ends_with(LEFT_OUT));
        assert!(
            t.contains("row 0 <at id=all></at> é"),
            "markup is kept as text"
        );
        let one = "x".repeat(10 * MAX_BYTES);
        let t = text(
            &json!({"schema": "2.0", "body": {"elements": [{"tag": "markdown", "content": one}]}}),
        );
        assert!(t.len() <= MAX_BYTES + LEFT_OUT.len() + 1);
        assert!(t.ends_with(LEFT_OUT));
        let many: Vec<Value> = (0..3 * MAX_ELEMENTS)
            .map(|_| json!({"tag": "hr"}))
            .collect();
        let t = text(&json!({"schema": "2.0", "body": {"elements": many}}));
        assert_eq!(t.lines().count(), MAX_ELEMENTS + 1);
        assert!(t.ends_with(LEFT_OUT));
    }
}
