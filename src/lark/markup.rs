//! Lark markup made inert. Owns the one escaping of text the model wrote (an answer, the
//! answer's first lines and a command's short form on a progress card, a note shown by
//! `/memory list`) before it reaches one of Lark's renderers: a post's `md` element, a card's
//! `markdown` element or a text message. Those renderers turn `<at id=all></at>`,
//! `<at user_id="…">`, `<at id="ou_…">` (and the same written as HTML entities) into mentions,
//! and `<font>`, `<link>`, `<text_tag>`… into markup.
//!
//! [`inert`] keeps Markdown (emphasis, lists, links, code) and breaks every tag: outside code
//! a `<` that opens a tag and an `&` that starts an entity become the full-width `＜` and `＆`,
//! which no renderer reads as markup. Inside a code span or block only the mention tags
//! (`at`, `person`) and the entities of `<` and `>` are broken, so code stays as written.
//! [`plain`] is for a short name on one line (a tool name): no markup at all.
//!
//! Never: lets a mention tag through, in or out of code, whatever its case or spacing; depends
//! on Lark decoding entities (the replacement characters are not entities); does I/O.

/// What replaces a `<` that would open a tag.
const LT: char = '＜';
/// What replaces an `&` that would start an entity.
const AMP: char = '＆';
/// The tags that mention someone or show a person; broken even inside code.
const MENTION_TAGS: [&str; 2] = ["at", "person"];

/// `text` with every mention and Lark tag broken; Markdown otherwise unchanged.
pub fn inert(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let mut fence: Option<(char, usize)> = None;
    for line in text.split_inclusive('\n') {
        if let Some(marker) = fence_marker(line) {
            match fence {
                None => fence = Some(marker),
                Some((c, n)) if c == marker.0 && marker.1 >= n => fence = None,
                Some(_) => {}
            }
            escape(line, true, &mut out);
            continue;
        }
        if fence.is_some() {
            escape(line, true, &mut out);
        } else {
            inline(line, &mut out);
        }
    }
    out
}

/// A short name made markup-free on one line: at most `max_chars` characters, without
/// emphasis, code, link or tag characters.
pub fn plain(text: &str, max_chars: usize) -> String {
    let clipped: String = if text.chars().count() > max_chars {
        let mut s: String = text.chars().take(max_chars.saturating_sub(1)).collect();
        s.push('…');
        s
    } else {
        text.to_string()
    };
    clipped
        .chars()
        .filter(|c| !matches!(c, '*' | '`' | '<' | '>' | '[' | ']' | '&' | '\n' | '\r'))
        .collect()
}

/// The fence a line opens or closes (up to three spaces, then three or more backticks or
/// tildes): its character and length.
pub(crate) fn fence_marker(line: &str) -> Option<(char, usize)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let c = rest.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = rest.chars().take_while(|x| *x == c).count();
    (n >= 3).then_some((c, n))
}

/// One line outside a fenced block: code spans (a run of backticks up to the next run of the
/// same length) are escaped as code, the rest as prose.
fn inline(line: &str, out: &mut String) {
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        escape(&rest[..start], false, out);
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + ticks..];
        match closing(after, ticks) {
            Some(end) => {
                out.push_str(&rest[start..start + ticks]);
                escape(&after[..end], true, out);
                out.push_str(&after[end..end + ticks]);
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    escape(rest, false, out);
}

/// Where the run of exactly `ticks` backticks that closes a code span starts in `s`.
fn closing(s: &str, ticks: usize) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'`' {
            let n = b[i..].iter().take_while(|c| **c == b'`').count();
            if n == ticks {
                return Some(i);
            }
            i += n;
        } else {
            i += 1;
        }
    }
    None
}

/// Copies `s` to `out`, breaking tags and entities (`code`: only the mention tags and the
/// entities of `<` and `>`).
fn escape(s: &str, code: bool, out: &mut String) {
    for (i, c) in s.char_indices() {
        let after = &s[i + c.len_utf8()..];
        match c {
            '<' if opens_tag(after, code) => out.push(LT),
            '&' if starts_entity(after, code) => out.push(AMP),
            _ => out.push(c),
        }
    }
}

/// Whether the text after a `<` makes it a tag: after optional white space, a letter, `/`, `!`
/// or `?` (in code: a mention tag's name, with an optional `/`).
fn opens_tag(after: &str, code: bool) -> bool {
    let t = after.trim_start();
    if !code {
        return t
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '/' | '!' | '?'));
    }
    let t = t.strip_prefix('/').map(str::trim_start).unwrap_or(t);
    MENTION_TAGS.iter().any(|tag| {
        t.get(..tag.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(tag))
            && !t[tag.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    })
}

/// Whether the text after an `&` makes it an entity: `#` (a numeric one), `lt` or `gt`, or (in
/// prose) a name closed by `;`.
fn starts_entity(after: &str, code: bool) -> bool {
    let lower = after.get(..2).map(str::to_ascii_lowercase);
    if after.starts_with('#') || matches!(lower.as_deref(), Some("lt" | "gt")) {
        return true;
    }
    if code {
        return false;
    }
    let name = after
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .count();
    name > 0 && after[name..].starts_with(';')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a renderer that decodes entities and ignores case and spacing could still read
    /// a mention in `s`.
    fn could_mention(s: &str) -> bool {
        let decoded = s
            .replace("&lt;", "<")
            .replace("&#60;", "<")
            .replace("&#x3c;", "<")
            .to_ascii_lowercase();
        decoded.match_indices('<').any(|(i, _)| {
            let t = decoded[i + 1..].trim_start();
            let t = t.strip_prefix('/').map(str::trim_start).unwrap_or(t);
            t.starts_with("at") || t.starts_with("person")
        })
    }

    #[test]
    fn mentions_are_broken_everywhere() {
        for attack in [
            "<at id=all></at>",
            "<at user_id=\"all\">everyone</at>",
            "<at id=\"ou_x\"></at>",
            "<AT ID=ALL></AT>",
            "< at id=all>",
            "<\tat\nid=all>",
            "[<at id=all></at>](https://example.com)",
            "[all](<at id=all></at>)",
            "&lt;at id=all&gt;&lt;/at&gt;",
            "&#60;at id=all&#62;",
            "&#x3c;at id=all>",
            "`<at id=all></at>`",
            "``a ` <at id=all> ``",
            "```\n<at id=all></at>\n```",
            "~~~sh\necho '<person id=ou_x>'\n~~~",
            "`unclosed <at id=all>",
            "```\nnever closed\n<at id=all>",
        ] {
            let out = inert(attack);
            assert!(!could_mention(&out), "{attack:?} -> {out:?}");
            let lower = out.to_ascii_lowercase();
            assert!(lower.contains("at") || lower.contains("person"), "{out}");
        }
    }

    #[test]
    fn markdown_and_code_stay_as_written() {
        let md = "**Done.** See [the docs](https://example.com/a?b=1&c=2).\n\
                  - `Vec<String>` and `a && b`\n\n```rust\nlet x: Vec<u8> = &y;\nif a < b && c > d {}\n```\n\
                  R&D: 3 < 4 > 2";
        assert_eq!(inert(md), md);
    }

    #[test]
    fn other_tags_are_broken_in_prose() {
        assert_eq!(
            inert("<font color='red'>x</font> <link url='u'>"),
            "＜font color='red'>x＜/font> ＜link url='u'>"
        );
        assert_eq!(inert("&amp;lt;"), "＆amp;lt;");
    }

    #[test]
    fn plain_names_have_no_markup() {
        assert_eq!(plain("t**<at id=all>", 60), "tat id=all");
        assert_eq!(plain(&"x".repeat(100), 10).chars().count(), 10);
    }
}
