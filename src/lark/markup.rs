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
//! [`for_post`] is for a post's `md` element, which renders less than a card: no tables,
//! headings or inline code (they show as raw pipes, hashes and backticks). It rewrites those
//! into what `md` does render — a table becomes a code block with aligned columns, a heading
//! bold text, a code span its bare text — then makes the result inert. A card's `markdown`
//! element renders them all and takes [`inert`] alone.
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

/// Markdown for a post's `md` element: what it does not render rewritten into what it does
/// (a table into a code block, a heading into bold text, a code span into its bare text), fenced
/// blocks kept as written, then made [`inert`].
pub fn for_post(text: &str) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    let mut fence: Option<(char, usize)> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(marker) = fence_marker(line) {
            match fence {
                None => fence = Some(marker),
                Some((c, n)) if c == marker.0 && marker.1 >= n => fence = None,
                Some(_) => {}
            }
            out.push_str(line);
            i += 1;
            continue;
        }
        if fence.is_some() {
            out.push_str(line);
            i += 1;
            continue;
        }
        let rows = table_rows(&lines[i..]);
        if rows > 0 {
            table_as_code(&lines[i..i + rows], &mut out);
            i += rows;
            continue;
        }
        let (body, newline) = split_newline(line);
        match heading(body) {
            Some("") => {}
            Some(title) => {
                out.push_str("**");
                out.push_str(&bare_code(title));
                out.push_str("**");
            }
            None => out.push_str(&bare_code(body)),
        }
        out.push_str(newline);
        i += 1;
    }
    inert(&out)
}

/// A line without its line ending, and the ending.
fn split_newline(line: &str) -> (&str, &str) {
    let body = line.trim_end_matches(['\n', '\r']);
    (body, &line[body.len()..])
}

/// An ATX heading's text (`# Title`, up to three spaces before, closing hashes dropped).
fn heading(line: &str) -> Option<&str> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let hashes = rest.chars().take_while(|c| *c == '#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let after = &rest[hashes..];
    if !(after.is_empty() || after.starts_with([' ', '\t'])) {
        return None;
    }
    // A closing run of hashes counts only after white space (`# a#` keeps its hash).
    let title = after.trim();
    let open = title.trim_end_matches('#');
    Some(if open.is_empty() {
        ""
    } else if open.ends_with([' ', '\t']) {
        open.trim_end()
    } else {
        title
    })
}

/// `line` with every code span replaced by its bare text (an unclosed run of backticks stays).
fn bare_code(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + ticks..];
        match closing(after, ticks) {
            Some(end) => {
                let code = &after[..end];
                // One space each side is padding (`` ` `a` ` ``), not content.
                let code = match code.strip_prefix(' ').and_then(|c| c.strip_suffix(' ')) {
                    Some(inner) if !inner.trim().is_empty() => inner,
                    _ => code,
                };
                out.push_str(code);
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// How many lines at the start of `lines` form a table: a header row with a `|`, a delimiter
/// row (`|---|:--:|`), then every following non-blank row with a `|`. 0 when none starts here.
fn table_rows(lines: &[&str]) -> usize {
    let is_row = |l: &str| l.contains('|') && !l.trim().is_empty();
    let is_delimiter = |l: &str| {
        let t = l.trim();
        t.contains('|')
            && t.contains('-')
            && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' ' | '\t'))
    };
    if lines.len() < 2 || !is_row(lines[0]) || !is_delimiter(lines[1]) {
        return 0;
    }
    2 + lines[2..].iter().take_while(|l| is_row(l)).count()
}

/// A table's cells, the pipes at its edges dropped (`\|` is a pipe inside a cell).
fn cells(row: &str) -> Vec<String> {
    let t = row.trim();
    let t = t.strip_prefix('|').unwrap_or(t);
    let t = t
        .strip_suffix('|')
        .filter(|_| !t.ends_with("\\|"))
        .unwrap_or(t);
    let mut out = vec![String::new()];
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().expect("one cell at least").push('|');
                chars.next();
            }
            '|' => out.push(String::new()),
            _ => out.last_mut().expect("one cell at least").push(c),
        }
    }
    out.into_iter().map(|c| bare_code(c.trim())).collect()
}

/// Columns a character takes in a fixed-width font: East Asian wide characters take two.
fn columns(s: &str) -> usize {
    s.chars()
        .map(|c| match c as u32 {
            0x1100..=0x115F
            | 0x2E80..=0xA4CF
            | 0xAC00..=0xD7A3
            | 0xF900..=0xFAFF
            | 0xFE30..=0xFE4F
            | 0xFF00..=0xFF60
            | 0xFFE0..=0xFFE6
            | 0x1F300..=0x1FAFF
            | 0x20000..=0x3FFFD => 2,
            _ => 1,
        })
        .sum()
}

/// A table as a fenced code block with its columns aligned (the delimiter row redrawn).
fn table_as_code(rows: &[&str], out: &mut String) {
    let header = cells(rows[0]);
    let body: Vec<Vec<String>> = rows[2..].iter().map(|r| cells(r)).collect();
    let n = std::iter::once(&header)
        .chain(&body)
        .map(Vec::len)
        .max()
        .unwrap_or(1);
    let mut widths = vec![0usize; n];
    for row in std::iter::once(&header).chain(&body) {
        for (i, c) in row.iter().enumerate() {
            widths[i] = widths[i].max(columns(c));
        }
    }
    let line = |row: &[String], out: &mut String| {
        let mut text = String::new();
        for (i, w) in widths.iter().enumerate() {
            let cell = row.get(i).map(String::as_str).unwrap_or("");
            if i > 0 {
                text.push_str(" | ");
            }
            text.push_str(cell);
            text.extend(std::iter::repeat_n(' ', w - columns(cell)));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    out.push_str("```\n");
    line(&header, out);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat((*w).max(1))).collect();
    out.push_str(&rule.join("-+-"));
    out.push('\n');
    for row in &body {
        line(row, out);
    }
    out.push_str("```\n");
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

    /// What a post's `md` does not render never reaches it: tables become aligned code
    /// blocks, headings bold text, code spans their text; fenced code stays as written and
    /// nothing becomes a live tag.
    #[test]
    fn a_post_gets_only_the_markdown_it_renders() {
        let md = "# Disk usage\n\nRun `df -h` on **prod**:\n\n\
                  | host | use% | 路径 |\n|------|-----:|:--|\n| `web-1` | 91 | /var |\n| db | 7 | a\\|b |\n\n\
                  ```sh\ndf -h | sort # `x`\n```\n## Next ##\n#notaheading\n";
        let out = for_post(md);
        assert_eq!(
            out,
            "**Disk usage**\n\nRun df -h on **prod**:\n\n\
             ```\nhost  | use% | 路径\n------+------+-----\nweb-1 | 91   | /var\ndb    | 7    | a|b\n```\n\n\
             ```sh\ndf -h | sort # `x`\n```\n**Next**\n#notaheading\n"
        );
        // Inline code that held a tag does not become a live tag once its backticks go.
        let out = for_post("`<font color=red>x</font>` and `<at id=all></at>`");
        assert!(!out.contains("<font") && !out.contains("<at"), "{out}");
        // Pipes outside a table are prose.
        assert_eq!(for_post("a | b\nc"), "a | b\nc");
        assert_eq!(for_post("`` a`b ``"), "a`b");
    }

    #[test]
    fn plain_names_have_no_markup() {
        assert_eq!(plain("t**<at id=all>", 60), "tat id=all");
        assert_eq!(plain(&"x".repeat(100), 10).chars().count(), 10);
    }
}
