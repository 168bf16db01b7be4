//! Parsing: reads a command line the way a POSIX shell (bash) would and turns it into tokens —
//! words made of parts (literal text, parameters, substitutions, arithmetic), operators and
//! redirections with their here-document bodies — and, for callers outside the guard, into
//! [`SimpleCommand`]s ([`simple_commands`]).
//!
//! It owns quoting (`'…'`, `"…"`, `\`, `$'…'`), substitution nesting (`$(…)`, backticks,
//! `<(…)`, `${…}`), arithmetic (`((…))`, `$((…))`, `$[…]`: text inside them is never an
//! operator or a here-document), operators, redirections and here-documents. It never expands
//! anything (that is `expand`), never judges anything (that is `check` and `rules`), and never
//! recurses deeper than [`MAX_DEPTH`]: past it, it answers [`ParseError::TooDeep`].

use super::{MAX_DEPTH, MAX_INPUT};

/// A piece of a word, after quote removal.
#[derive(Debug, Clone)]
pub(crate) enum Part {
    /// Literal text; `quoted` when it came from quotes or a backslash escape.
    Lit { text: String, quoted: bool },
    /// `$NAME` / `${NAME}`.
    Param { name: String, quoted: bool },
    /// `$(…)`, backticks, `$((…))` (`output`: its value is the command's output) or a process
    /// substitution `<(…)` (`output == false`: its value is a path).
    Subst {
        toks: Vec<Tok>,
        source: String,
        quoted: bool,
        output: bool,
    },
    /// `${…}` with operators: value unknown, except `${NAME:-word}` (`fallback`) when NAME
    /// is known; `inner` holds any substitutions inside it.
    Opaque {
        source: String,
        inner: Vec<Part>,
        fallback: Option<(String, Vec<Part>)>,
    },
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Word {
    pub(crate) parts: Vec<Part>,
}

impl Word {
    pub(crate) fn push_str(&mut self, s: &str, quoted: bool) {
        if let Some(Part::Lit { text, quoted: q }) = self.parts.last_mut()
            && *q == quoted
        {
            text.push_str(s);
            return;
        }
        self.parts.push(Part::Lit {
            text: s.to_owned(),
            quoted,
        });
    }

    pub(crate) fn push(&mut self, c: char, quoted: bool) {
        self.push_str(c.encode_utf8(&mut [0; 4]), quoted);
    }

    /// The text when the word is entirely literal.
    pub(crate) fn literal(&self) -> Option<String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit { text, .. } => out.push_str(text),
                _ => return None,
            }
        }
        Some(out)
    }

    /// The text when the word is a single unquoted literal (reserved words, brace expansion).
    pub(crate) fn bare(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [
                Part::Lit {
                    text,
                    quoted: false,
                },
            ] => Some(text),
            _ => None,
        }
    }

    pub(crate) fn is_quoted(&self) -> bool {
        self.parts.iter().any(|p| match p {
            Part::Lit { quoted, .. } | Part::Param { quoted, .. } | Part::Subst { quoted, .. } => {
                *quoted
            }
            Part::Opaque { .. } => false,
        })
    }

    /// `NAME=value` / `NAME+=value`: the name, the value's parts and whether it appends.
    pub(crate) fn assignment(&self) -> Option<(String, Vec<Part>, bool)> {
        let Some(Part::Lit {
            text,
            quoted: false,
        }) = self.parts.first()
        else {
            return None;
        };
        let eq = text.find('=')?;
        let append = text[..eq].ends_with('+');
        let name = text[..eq].strip_suffix('+').unwrap_or(&text[..eq]);
        if !is_identifier(name) {
            return None;
        }
        let mut value = vec![Part::Lit {
            text: text[eq + 1..].to_owned(),
            quoted: false,
        }];
        value.extend(self.parts[1..].iter().cloned());
        Some((name.to_owned(), value, append))
    }
}

/// Whether `s` is a shell variable name.
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `;`, newline, `;;` and friends.
    Semi,
    /// `&` (background).
    Amp,
    And,
    Or,
    /// `|` and `|&`.
    Pipe,
    LParen,
    RParen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RedirKind {
    Input,
    /// `>`, `>|`, `&>`: truncates the file first.
    Output,
    /// `>>`, `&>>`, `<>`: writes without truncating.
    Append,
    /// `2>&1`, `<&-`: duplicates a descriptor, names no file.
    Dup,
    HereString,
    HereDoc,
}

#[derive(Debug, Clone)]
pub(crate) struct Redir {
    pub(crate) kind: RedirKind,
    /// The descriptor written before the operator: digits (`2` in `2>&1`) or bash's
    /// `{name}` (`{fd}>f`, which also stays a word of the command); `None` for the default.
    pub(crate) fd: Option<String>,
    pub(crate) target: Word,
    /// Here-document body (unquoted delimiter: expansions inside are live).
    pub(crate) body: Option<Word>,
}

#[derive(Debug, Clone)]
pub(crate) enum Tok {
    Word(Word),
    Op(Op),
    Redir(Redir),
    /// `((…))`: an arithmetic command. Its value is never known; substitutions inside run.
    Arith(Word),
}

/// Nesting went past [`MAX_DEPTH`].
pub(crate) struct TooDeep;

pub(crate) struct PendingHeredoc {
    tok: usize,
    delimiter: String,
    strip_tabs: bool,
    quoted: bool,
}

pub(crate) struct Lexer {
    s: Vec<char>,
    i: usize,
    /// Nesting level of this text (0 = the command as given).
    depth: usize,
    /// Characters the search for the end of arithmetic may still look at. Each `((` looks
    /// ahead, so a text of many unclosed ones would cost quadratic time without it; spent,
    /// the text is refused as too intricate (never read as parentheses instead, which
    /// could turn a `<<` inside arithmetic into a here-document).
    lookahead: usize,
}

impl Lexer {
    pub(crate) fn new(src: &str, depth: usize) -> Lexer {
        let s: Vec<char> = src.chars().collect();
        Lexer {
            lookahead: 8 * s.len() + 1024,
            s,
            i: 0,
            depth,
        }
    }

    fn peek(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    fn starts_with(&self, p: &str) -> bool {
        p.chars().enumerate().all(|(k, c)| self.peek(k) == Some(c))
    }

    pub(crate) fn lex(mut self) -> Result<Vec<Tok>, TooDeep> {
        Ok(self.tokens(false)?.0)
    }

    /// Tokens up to the end, or (when `nested`) up to the `)` closing a substitution; returns
    /// them with the index where the text ended (the `)` or the end of input).
    pub(crate) fn tokens(&mut self, nested: bool) -> Result<(Vec<Tok>, usize), TooDeep> {
        let mut toks = Vec::new();
        let mut parens = 0usize;
        let mut heredocs: Vec<PendingHeredoc> = Vec::new();
        while let Some(c) = self.peek(0) {
            match c {
                ' ' | '\t' | '\r' => self.i += 1,
                '\\' if self.peek(1) == Some('\n') => self.i += 2,
                '#' => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                '\n' => {
                    self.i += 1;
                    toks.push(Tok::Op(Op::Semi));
                    self.heredoc_bodies(&mut toks, &mut heredocs)?;
                }
                ';' => {
                    self.i += 1;
                    while matches!(self.peek(0), Some(';' | '&')) {
                        self.i += 1;
                    }
                    toks.push(Tok::Op(Op::Semi));
                }
                '&' if self.peek(1) == Some('&') => {
                    self.i += 2;
                    toks.push(Tok::Op(Op::And));
                }
                '&' if self.peek(1) == Some('>') => self.redirect(&mut toks, &mut heredocs)?,
                '&' => {
                    self.i += 1;
                    toks.push(Tok::Op(Op::Amp));
                }
                '|' => {
                    let op = if self.peek(1) == Some('|') {
                        Op::Or
                    } else {
                        Op::Pipe
                    };
                    self.i += if matches!(self.peek(1), Some('|' | '&')) {
                        2
                    } else {
                        1
                    };
                    toks.push(Tok::Op(op));
                }
                '(' if self.peek(1) == Some('(')
                    && let Some(end) = self.arith_end(self.i + 2, ')')? =>
                {
                    let part = self.arithmetic(self.i + 2, end, "((", "))")?;
                    self.i = (end + 2).min(self.s.len());
                    toks.push(Tok::Arith(Word { parts: vec![part] }));
                }
                '(' => {
                    parens += 1;
                    self.i += 1;
                    toks.push(Tok::Op(Op::LParen));
                }
                ')' => {
                    if nested && parens == 0 {
                        let end = self.i;
                        self.i += 1;
                        return Ok((toks, end));
                    }
                    parens = parens.saturating_sub(1);
                    self.i += 1;
                    toks.push(Tok::Op(Op::RParen));
                }
                '<' | '>' if self.peek(1) != Some('(') => {
                    self.redirect(&mut toks, &mut heredocs)?
                }
                c if c.is_ascii_digit() && self.fd_redirect_ahead() => {
                    self.redirect(&mut toks, &mut heredocs)?
                }
                _ => {
                    let w = self.word()?;
                    toks.push(Tok::Word(w));
                }
            }
        }
        Ok((toks, self.s.len()))
    }

    /// `2>file`, `10<&3`: digits directly followed by a redirection operator.
    fn fd_redirect_ahead(&self) -> bool {
        let mut k = 0;
        while self.peek(k).is_some_and(|c| c.is_ascii_digit()) {
            k += 1;
        }
        matches!(self.peek(k), Some('<' | '>'))
    }

    fn redirect(
        &mut self,
        toks: &mut Vec<Tok>,
        heredocs: &mut Vec<PendingHeredoc>,
    ) -> Result<(), TooDeep> {
        let start = self.i;
        while self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let fd = if self.i > start {
            Some(self.s[start..self.i].iter().collect())
        } else {
            self.named_fd(toks)
        };
        // Longest operators first.
        const OPS: &[(&str, RedirKind, bool)] = &[
            ("&>>", RedirKind::Append, false),
            ("&>", RedirKind::Output, false),
            ("<<<", RedirKind::HereString, false),
            ("<<-", RedirKind::HereDoc, true),
            ("<<", RedirKind::HereDoc, false),
            ("<>", RedirKind::Append, false),
            ("<&", RedirKind::Dup, false),
            ("<", RedirKind::Input, false),
            (">>", RedirKind::Append, false),
            (">|", RedirKind::Output, false),
            (">&", RedirKind::Dup, false),
            (">", RedirKind::Output, false),
        ];
        let (op, mut kind, strip_tabs) = OPS
            .iter()
            .copied()
            .find(|(op, _, _)| self.starts_with(op))
            .unwrap_or((">", RedirKind::Output, false));
        self.i += op.chars().count();
        while matches!(self.peek(0), Some(' ' | '\t')) {
            self.i += 1;
        }
        let target = match self.peek(0) {
            None | Some('\n' | ';' | '&' | '|' | '(' | ')' | '<' | '>') => Word::default(),
            _ => self.word()?,
        };
        if kind == RedirKind::Dup {
            let lit = target.literal().unwrap_or_default();
            let is_fd = lit == "-" || (!lit.is_empty() && lit.chars().all(|c| c.is_ascii_digit()));
            if !is_fd && op == ">&" {
                // `>& file` is `&> file`.
                kind = RedirKind::Output;
            }
        }
        if kind == RedirKind::HereDoc {
            heredocs.push(PendingHeredoc {
                tok: toks.len(),
                delimiter: target.literal().unwrap_or_else(|| render_source(&target)),
                strip_tabs,
                quoted: target.is_quoted(),
            });
        }
        toks.push(Tok::Redir(Redir {
            kind,
            fd,
            target,
            body: None,
        }));
        Ok(())
    }

    /// bash's `{name}>f`: the word just read is `{name}` and ends right here, at the operator.
    fn named_fd(&self, toks: &[Tok]) -> Option<String> {
        if self.i == 0 || self.s[self.i - 1] != '}' {
            return None;
        }
        let Some(Tok::Word(w)) = toks.last() else {
            return None;
        };
        let text = w.bare()?;
        let name = text.strip_prefix('{')?.strip_suffix('}')?;
        is_identifier(name).then(|| text.to_owned())
    }

    /// Reads the bodies of here-documents announced on the line just ended.
    fn heredoc_bodies(
        &mut self,
        toks: &mut [Tok],
        heredocs: &mut Vec<PendingHeredoc>,
    ) -> Result<(), TooDeep> {
        for h in heredocs.drain(..) {
            let mut body = String::new();
            while self.i < self.s.len() {
                let end = (self.i..self.s.len())
                    .find(|&k| self.s[k] == '\n')
                    .unwrap_or(self.s.len());
                let line: String = self.s[self.i..end].iter().collect();
                self.i = (end + 1).min(self.s.len());
                let line = if h.strip_tabs {
                    line.trim_start_matches('\t')
                } else {
                    &line
                };
                if line == h.delimiter {
                    break;
                }
                body.push_str(line);
                body.push('\n');
            }
            let word = if h.quoted {
                Word {
                    parts: vec![Part::Lit {
                        text: body,
                        quoted: true,
                    }],
                }
            } else {
                let mut sub = Lexer::new(&body, self.depth);
                let mut w = Word::default();
                sub.double_quoted(&mut w, None)?;
                w
            };
            if let Some(Tok::Redir(r)) = toks.get_mut(h.tok) {
                r.body = Some(word);
            }
        }
        Ok(())
    }

    fn word(&mut self) -> Result<Word, TooDeep> {
        let mut w = Word::default();
        if matches!(self.peek(0), Some('<' | '>')) && self.peek(1) == Some('(') {
            self.i += 2;
            let part = self.substitution(false, false)?;
            w.parts.push(part);
        }
        while let Some(c) = self.peek(0) {
            match c {
                ' ' | '\t' | '\r' | '\n' | ';' | '&' | '|' | '(' | ')' | '<' | '>' => break,
                '\\' => {
                    self.i += 1;
                    match self.peek(0) {
                        Some('\n') => self.i += 1,
                        Some(c) => {
                            self.i += 1;
                            w.push(c, true);
                        }
                        None => {}
                    }
                }
                '\'' => {
                    self.i += 1;
                    let start = self.i;
                    while self.peek(0).is_some_and(|c| c != '\'') {
                        self.i += 1;
                    }
                    let text: String = self.s[start..self.i].iter().collect();
                    self.i = (self.i + 1).min(self.s.len());
                    w.push_str(&text, true);
                }
                '"' => {
                    self.i += 1;
                    self.double_quoted(&mut w, Some('"'))?;
                }
                '$' => self.dollar(&mut w, false)?,
                '`' => self.backtick(&mut w, false)?,
                _ => {
                    self.i += 1;
                    w.push(c, false);
                }
            }
        }
        Ok(w)
    }

    /// The inside of `"…"` (up to `terminator`), or of a here-document body (`None`).
    pub(crate) fn double_quoted(
        &mut self,
        w: &mut Word,
        terminator: Option<char>,
    ) -> Result<(), TooDeep> {
        // An empty "" is still an argument.
        w.push_str("", true);
        while let Some(c) = self.peek(0) {
            if Some(c) == terminator {
                self.i += 1;
                return Ok(());
            }
            match c {
                '\\' => match self.peek(1) {
                    Some(n @ ('$' | '`' | '"' | '\\')) => {
                        self.i += 2;
                        w.push(n, true);
                    }
                    Some('\n') => self.i += 2,
                    _ => {
                        self.i += 1;
                        w.push('\\', true);
                    }
                },
                '$' => self.dollar(w, true)?,
                '`' => self.backtick(w, true)?,
                _ => {
                    self.i += 1;
                    w.push(c, true);
                }
            }
        }
        Ok(())
    }

    fn dollar(&mut self, w: &mut Word, quoted: bool) -> Result<(), TooDeep> {
        match self.peek(1) {
            Some('\'') if !quoted => {
                self.i += 2;
                let text = self.ansi_c();
                w.push_str(&text, true);
            }
            Some('"') if !quoted => {
                self.i += 2;
                self.double_quoted(w, Some('"'))?;
            }
            Some('(')
                if self.peek(2) == Some('(')
                    && let Some(end) = self.arith_end(self.i + 3, ')')? =>
            {
                let part = self.arithmetic(self.i + 3, end, "$((", "))")?;
                self.i = (end + 2).min(self.s.len());
                w.parts.push(part);
            }
            Some('[') => {
                // `$[…]` (old bash arithmetic); unclosed, it runs to the end of the text.
                let end = self.arith_end(self.i + 2, ']')?.unwrap_or(self.s.len());
                let part = self.arithmetic(self.i + 2, end, "$[", "]")?;
                self.i = (end + 1).min(self.s.len());
                w.parts.push(part);
            }
            Some('(') => {
                self.i += 2;
                let part = self.substitution(quoted, true)?;
                w.parts.push(part);
            }
            Some('{') => {
                self.i += 2;
                let part = self.braced(quoted)?;
                w.parts.push(part);
            }
            Some(c) if c == '_' || c.is_ascii_alphabetic() => {
                self.i += 1;
                let start = self.i;
                while self
                    .peek(0)
                    .is_some_and(|c| c == '_' || c.is_ascii_alphanumeric())
                {
                    self.i += 1;
                }
                let name = self.s[start..self.i].iter().collect();
                w.parts.push(Part::Param { name, quoted });
            }
            Some(c) if c.is_ascii_digit() || "@*#?$!-".contains(c) => {
                self.i += 2;
                w.parts.push(Part::Param {
                    name: c.to_string(),
                    quoted,
                });
            }
            _ => {
                self.i += 1;
                w.push('$', quoted);
            }
        }
        Ok(())
    }

    /// After `$(` or `<(`: the nested command up to its closing `)`.
    fn substitution(&mut self, quoted: bool, output: bool) -> Result<Part, TooDeep> {
        if self.depth + 1 > MAX_DEPTH {
            return Err(TooDeep);
        }
        let start = self.i;
        self.depth += 1;
        let (toks, end) = self.tokens(true)?;
        self.depth -= 1;
        Ok(Part::Subst {
            toks,
            source: self.s[start..end].iter().collect(),
            quoted,
            output,
        })
    }

    /// Where an arithmetic expression that starts at `from` ends: the index of its closing
    /// `))` (`close == ')'`) or `]`, at nesting level zero and outside quotes. `None` when it
    /// does not close — or, for `((`, when a single `)` closes it first, which makes it two
    /// nested subshells rather than arithmetic. One pass: linear in the text.
    fn arith_end(&mut self, from: usize, close: char) -> Result<Option<usize>, TooDeep> {
        let open = if close == ')' { '(' } else { '[' };
        let mut depth = 0usize;
        let mut k = from;
        while let Some(&c) = self.s.get(k) {
            match c {
                '\\' => k += 1,
                '\'' => {
                    k += 1;
                    while self.s.get(k).is_some_and(|&c| c != '\'') {
                        k += 1;
                    }
                }
                '"' => {
                    k += 1;
                    while let Some(&c) = self.s.get(k) {
                        match c {
                            '\\' => k += 1,
                            '"' => break,
                            _ => {}
                        }
                        k += 1;
                    }
                }
                c if c == open => depth += 1,
                c if c == close && depth > 0 => depth -= 1,
                c if c == close => {
                    self.charge(k - from)?;
                    return Ok(if close == ']' || self.s.get(k + 1) == Some(&')') {
                        Some(k)
                    } else {
                        None
                    });
                }
                _ => {}
            }
            k += 1;
        }
        self.charge(k.saturating_sub(from))?;
        Ok(None)
    }

    fn charge(&mut self, n: usize) -> Result<(), TooDeep> {
        self.lookahead = self.lookahead.checked_sub(n).ok_or(TooDeep)?;
        Ok(())
    }

    /// The arithmetic text `s[start..end]` as an opaque part: its value is unknown, the
    /// substitutions and parameters inside it are kept (they run). `<<` in it is a shift.
    fn arithmetic(
        &mut self,
        start: usize,
        end: usize,
        open: &str,
        close: &str,
    ) -> Result<Part, TooDeep> {
        if self.depth + 1 > MAX_DEPTH {
            return Err(TooDeep);
        }
        let end = end.min(self.s.len());
        let text: String = self.s[start.min(end)..end].iter().collect();
        let mut sub = Lexer::new(&text, self.depth + 1);
        let mut w = Word::default();
        sub.double_quoted(&mut w, None)?;
        Ok(Part::Opaque {
            source: format!("{open}{text}{close}"),
            inner: w.parts,
            fallback: None,
        })
    }

    /// After `${`: a plain parameter, or an opaque expression whose value is unknown.
    fn braced(&mut self, quoted: bool) -> Result<Part, TooDeep> {
        let start = self.i;
        let mut depth = 1usize;
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '\\' => self.i = (self.i + 1).min(self.s.len()),
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = if depth == 0 { self.i - 1 } else { self.i };
        let inner: String = self.s[start..end].iter().collect();
        if is_identifier(&inner)
            || (inner.chars().count() == 1
                && inner.chars().all(|c| "@*#?$!-0123456789".contains(c)))
        {
            return Ok(Part::Param {
                name: inner,
                quoted,
            });
        }
        if self.depth + 1 > MAX_DEPTH {
            return Err(TooDeep);
        }
        let mut sub = Lexer::new(&inner, self.depth + 1);
        let mut w = Word::default();
        sub.double_quoted(&mut w, None)?;
        // `${NAME:-word}`, `${NAME-word}`, `${NAME:=word}`, `${NAME=word}`.
        let name_len = inner
            .find(|c: char| c != '_' && !c.is_ascii_alphanumeric())
            .unwrap_or(inner.len());
        let name = &inner[..name_len];
        let op = &inner[name_len..];
        let fallback =
            if is_identifier(name) && [":-", ":=", "-", "="].iter().any(|o| op.starts_with(o)) {
                let skip = if op.starts_with(':') { 2 } else { 1 };
                let mut sub = Lexer::new(&op[skip..], self.depth + 1);
                let mut d = Word::default();
                sub.double_quoted(&mut d, None)?;
                Some((name.to_owned(), d.parts))
            } else {
                None
            };
        Ok(Part::Opaque {
            source: format!("${{{inner}}}"),
            inner: w.parts,
            fallback,
        })
    }

    fn backtick(&mut self, w: &mut Word, quoted: bool) -> Result<(), TooDeep> {
        self.i += 1;
        let mut inner = String::new();
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '`' => break,
                '\\' => match self.peek(0) {
                    Some(n @ ('$' | '`' | '\\')) => {
                        self.i += 1;
                        inner.push(n);
                    }
                    _ => inner.push('\\'),
                },
                _ => inner.push(c),
            }
        }
        if self.depth + 1 > MAX_DEPTH {
            return Err(TooDeep);
        }
        let (toks, _) = Lexer::new(&inner, self.depth + 1).tokens(false)?;
        w.parts.push(Part::Subst {
            toks,
            source: inner,
            quoted,
            output: true,
        });
        Ok(())
    }

    /// After `$'`: ANSI-C quoting (`$'\x72\x6d'` is `rm`).
    fn ansi_c(&mut self) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '\'' => break,
                '\\' => {
                    let Some(e) = self.peek(0) else { break };
                    self.i += 1;
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'a' => out.push('\x07'),
                        'b' => out.push('\x08'),
                        'e' | 'E' => out.push('\x1b'),
                        'f' => out.push('\x0c'),
                        'v' => out.push('\x0b'),
                        'x' => out.push(self.radix_char(16, 2)),
                        'u' => out.push(self.radix_char(16, 4)),
                        'U' => out.push(self.radix_char(16, 8)),
                        '0'..='7' => {
                            self.i -= 1;
                            out.push(self.radix_char(8, 3));
                        }
                        'c' => {
                            if let Some(x) = self.peek(0) {
                                self.i += 1;
                                out.push(char::from((x as u8) & 0x1f));
                            }
                        }
                        other => out.push(other),
                    }
                }
                _ => out.push(c),
            }
        }
        out
    }

    fn radix_char(&mut self, radix: u32, max: usize) -> char {
        let mut v = 0u32;
        let mut n = 0;
        while n < max {
            match self.peek(0).and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    v = v * radix + d;
                    self.i += 1;
                    n += 1;
                }
                None => break,
            }
        }
        char::from_u32(v).unwrap_or('\u{FFFD}')
    }
}

/// Shell-ish text of a word with its unknown parts kept as expressions (`${X}`, `$(…)`).
pub(crate) fn render_source(w: &Word) -> String {
    let mut out = String::new();
    for p in &w.parts {
        match p {
            Part::Lit { text, .. } => out.push_str(text),
            Part::Param { name, .. } => out.push_str(&format!("${{{name}}}")),
            Part::Subst { source, output, .. } => {
                out.push_str(if *output { "$(" } else { "<(" });
                out.push_str(source);
                out.push(')');
            }
            Part::Opaque { source, .. } => out.push_str(source),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Simple commands, for callers outside the guard
// ---------------------------------------------------------------------------------------------

/// Why a script could not be split into simple commands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("the script is {len} bytes, over the limit of {MAX_INPUT}")]
    TooLong { len: usize },
    #[error("the script nests substitutions or arithmetic more than {MAX_DEPTH} levels deep")]
    TooDeep,
}

/// One word of a simple command (or, after expansion, one argument).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShellWord {
    /// The word after quote removal, when it is literal text (no parameter, substitution or
    /// arithmetic in it) or, once expanded, its value when known. `None` means its value is
    /// only known when it runs.
    pub literal: Option<String>,
    /// The word as written, with unknown parts shown as `${X}`, `$(…)`, `$((…))`.
    pub source: String,
    /// For an expanded word whose value is unknown: its value if every unknown part is
    /// empty (an unset variable, an empty output). `None` otherwise.
    pub if_empty: Option<String>,
}

/// What a redirection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirectKind {
    /// `<`: reads a file.
    Input,
    /// `>`, `>|`, `&>`: truncates and writes a file.
    Output,
    /// `>>`, `&>>`, `<>`: writes a file without truncating it.
    Append,
    /// `2>&1`, `<&-`: duplicates or closes a descriptor.
    Duplicate,
    /// `<<<`: a here-string.
    HereString,
    /// `<<`, `<<-`: a here-document.
    HereDocument,
}

/// One redirection of a simple command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirection {
    pub kind: RedirectKind,
    /// The descriptor written before the operator: digits (`2` in `2>&1`) or bash's `{name}`
    /// (`{fd}>f`, which assigns the variable; the word stays in `argv` too, as a shell
    /// without that syntax reads it). `None` for the operator's default.
    pub fd: Option<String>,
    /// The file (or descriptor, here-string, here-document delimiter).
    pub target: ShellWord,
}

/// A simple command as written: assignments, then the command name and its arguments, and
/// its redirections. Reserved words (`if`, `then`, `{`, `!`, …) are not part of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleCommand {
    /// `NAME=value` words before the name.
    pub assignments: Vec<ShellWord>,
    /// The command name and its arguments (`argv`); empty for a bare assignment or
    /// redirection.
    pub argv: Vec<ShellWord>,
    pub redirects: Vec<Redirection>,
    /// 0 for the script's own commands; 1 and more for commands inside command or process
    /// substitutions, arithmetic and here-documents, which run as well.
    pub depth: usize,
    /// Whether its standard input is the output of the command before it (`… | this`).
    pub piped: bool,
}

impl SimpleCommand {
    /// The command name when it is literal text.
    pub fn name(&self) -> Option<&str> {
        self.argv.first().and_then(|w| w.literal.as_deref())
    }

    /// The command as written: assignments, words, then redirections.
    pub fn render(&self) -> String {
        let mut out: Vec<String> = self.assignments.iter().map(|w| w.source.clone()).collect();
        out.extend(self.argv.iter().map(|w| w.source.clone()));
        out.extend(self.redirects.iter().map(Redirection::render));
        out.join(" ")
    }
}

impl Redirection {
    /// The redirection as written (`2>&1` as `2>& 1`).
    pub fn render(&self) -> String {
        let op = match self.kind {
            RedirectKind::Input => "<",
            RedirectKind::Output => ">",
            RedirectKind::Append => ">>",
            RedirectKind::Duplicate => ">&",
            RedirectKind::HereString => "<<<",
            RedirectKind::HereDocument => "<<",
        };
        let fd = self.fd.as_deref().unwrap_or_default();
        format!("{fd}{op} {}", self.target.source)
    }
}

/// A shell construct that is not a simple command but changes what later commands mean. A
/// caller judging a script strictly (the read-only workspace permission) refuses them; the
/// guard itself has no use for this list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Construct {
    /// A `for` or `select` header (including `for ((…))`), which assigns its variable.
    Loop { keyword: String },
    /// `coproc`, which assigns the coprocess's array variable.
    Coprocess,
    /// `NAME() …` or `function NAME …`: defines (or redefines) a command.
    Function { name: String },
    /// `((…))`, `$((…))` or `$[…]`: arithmetic, which can assign variables.
    Arithmetic { source: String },
    /// `${…}` with an operator (`${X:=v}`, `${X:offset}`, `${a[i]}`, …): it can assign a
    /// variable or evaluate arithmetic. A plain `$X` / `${X}` is not one.
    Expansion { source: String },
}

/// A script as [`parse_script`] reads it: every simple command it would run, and the
/// [`Construct`]s around them, each in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    pub commands: Vec<SimpleCommand>,
    pub constructs: Vec<Construct>,
}

/// Splits `script` into every simple command it would run — its own, and those inside
/// substitutions, arithmetic and here-documents (with a `depth` above 0) — using the same
/// parser as the guard. Control structures are looked through: `if a; then b; fi` gives `a`
/// and `b`; a `for` or `case` header gives no command of its own. Nothing is expanded: a
/// word that depends on a value at run time has no `literal`.
pub fn simple_commands(script: &str) -> Result<Vec<SimpleCommand>, ParseError> {
    parse_script(script).map(|s| s.commands)
}

/// Whether `script` starts a job of the shell in the background (`cmd &`, `coproc`): a
/// process of the shell's own that runs while the shell reads on. One that cannot be read
/// counts as one.
pub fn backgrounds(script: &str) -> bool {
    let amp = match Lexer::new(script, 0).lex() {
        Ok(toks) => toks.iter().any(|t| matches!(t, Tok::Op(Op::Amp))),
        Err(TooDeep) => return true,
    };
    amp || parse_script(script).map_or(true, |s| s.constructs.contains(&Construct::Coprocess))
}

/// [`simple_commands`], together with the loops, function definitions, arithmetic and
/// parameter operations the script contains.
pub fn parse_script(script: &str) -> Result<Script, ParseError> {
    if script.len() > MAX_INPUT {
        return Err(ParseError::TooLong { len: script.len() });
    }
    let toks = Lexer::new(script, 0)
        .lex()
        .map_err(|TooDeep| ParseError::TooDeep)?;
    let mut out = Script::default();
    collect(&toks, 0, &mut out);
    Ok(out)
}

/// A word as written, unexpanded.
pub(crate) fn shell_word(w: &Word) -> ShellWord {
    ShellWord {
        literal: w.literal(),
        source: render_source(w),
        if_empty: None,
    }
}

/// A redirection as written, unexpanded.
pub(crate) fn redirection(r: &Redir) -> Redirection {
    Redirection {
        kind: match r.kind {
            RedirKind::Input => RedirectKind::Input,
            RedirKind::Output => RedirectKind::Output,
            RedirKind::Append => RedirectKind::Append,
            RedirKind::Dup => RedirectKind::Duplicate,
            RedirKind::HereString => RedirectKind::HereString,
            RedirKind::HereDoc => RedirectKind::HereDocument,
        },
        fd: r.fd.clone(),
        target: shell_word(&r.target),
    }
}

fn collect(toks: &[Tok], depth: usize, out: &mut Script) {
    let mut words: Vec<&Word> = Vec::new();
    let mut redirs: Vec<&Redir> = Vec::new();
    // Whether the next simple command reads the output of a pipe.
    let mut piped = false;
    for (k, tok) in toks.iter().map(Some).chain([None]).enumerate() {
        match tok {
            Some(Tok::Word(w)) => words.push(w),
            Some(Tok::Redir(r)) => redirs.push(r),
            _ => {
                if let Some(Tok::Arith(w)) = tok {
                    collect_parts(&w.parts, depth + 1, out);
                }
                // `NAME ( )`: a function definition.
                if let (Some(Tok::Op(Op::LParen)), Some(Tok::Op(Op::RParen)), [name]) =
                    (tok, toks.get(k + 1), words.as_slice())
                {
                    out.constructs.push(Construct::Function {
                        name: render_source(name),
                    });
                }
                if !words.is_empty() || !redirs.is_empty() {
                    simple(&words, &redirs, depth, piped, out);
                    piped = matches!(tok, Some(Tok::Op(Op::Pipe)));
                } else if !matches!(tok, Some(Tok::Op(Op::LParen | Op::RParen))) {
                    // `( a ) | b`: the pipe after a subshell feeds the next command too.
                    piped = matches!(tok, Some(Tok::Op(Op::Pipe)));
                }
                words.clear();
                redirs.clear();
            }
        }
    }
}

fn simple(words: &[&Word], redirs: &[&Redir], depth: usize, piped: bool, out: &mut Script) {
    for w in words {
        collect_parts(&w.parts, depth + 1, out);
    }
    for r in redirs {
        collect_parts(&r.target.parts, depth + 1, out);
        if let Some(body) = &r.body {
            collect_parts(&body.parts, depth + 1, out);
        }
    }
    let mut i = 0;
    while let Some(w) = words.get(i) {
        match w.bare() {
            Some(
                "{" | "}" | "!" | "if" | "then" | "else" | "elif" | "fi" | "do" | "done" | "while"
                | "until" | "esac" | "in" | "time",
            ) => i += 1,
            Some("coproc") => {
                out.constructs.push(Construct::Coprocess);
                i += 1;
            }
            // Headers, not commands: `for x in …`, `case x in`.
            Some(keyword @ ("for" | "select")) => {
                out.constructs.push(Construct::Loop {
                    keyword: keyword.to_owned(),
                });
                return;
            }
            Some("case") => return,
            Some("function") => {
                if let Some(name) = words.get(i + 1) {
                    out.constructs.push(Construct::Function {
                        name: render_source(name),
                    });
                }
                i += 2;
            }
            _ => break,
        }
    }
    let rest = &words[i.min(words.len())..];
    if rest.is_empty() && redirs.is_empty() {
        return;
    }
    let assignments = rest.iter().take_while(|w| w.assignment().is_some()).count();
    out.commands.push(SimpleCommand {
        assignments: rest[..assignments].iter().map(|w| shell_word(w)).collect(),
        argv: rest[assignments..].iter().map(|w| shell_word(w)).collect(),
        redirects: redirs.iter().map(|r| redirection(r)).collect(),
        depth,
        piped,
    });
}

/// Commands inside a word's substitutions and arithmetic, and the arithmetic and parameter
/// operations themselves.
fn collect_parts(parts: &[Part], depth: usize, out: &mut Script) {
    for p in parts {
        match p {
            Part::Subst { toks, .. } => collect(toks, depth, out),
            Part::Opaque { inner, source, .. } => {
                let source = source.clone();
                out.constructs.push(if source.starts_with("${") {
                    Construct::Expansion { source }
                } else {
                    Construct::Arithmetic { source }
                });
                collect_parts(inner, depth, out)
            }
            Part::Lit { .. } | Part::Param { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(c: &SimpleCommand) -> Vec<String> {
        c.argv.iter().map(|w| w.source.clone()).collect()
    }

    fn top_level(script: &str) -> Vec<Vec<String>> {
        simple_commands(script)
            .unwrap()
            .iter()
            .filter(|c| c.depth == 0)
            .map(argv)
            .collect()
    }

    #[test]
    fn arithmetic_is_one_token_and_never_starts_a_here_document() {
        // `<<` inside arithmetic is a shift: the next line is a command, not a body.
        for script in [
            "((x=1<<2)); rm -rf /etc",
            "((x=1<<2))\nrm -rf /etc",
            "echo $((1<<2))\nrm -rf /etc",
            "echo $[1<<2]\nrm -rf /etc",
            "for ((i=0; i<<1; i++)); do :; done\nrm -rf /etc",
        ] {
            let cmds = top_level(script);
            assert_eq!(
                cmds.last().unwrap(),
                &["rm", "-rf", "/etc"],
                "{script}: {cmds:?}"
            );
        }
        // `((a) )` is two subshells, not arithmetic.
        assert_eq!(top_level("((cd /tmp) && rm -rf x)")[1], ["rm", "-rf", "x"]);
        // Substitutions inside arithmetic run.
        let cmds = simple_commands("echo $(( $(rm -rf /) + 1 ))").unwrap();
        assert!(
            cmds.iter()
                .any(|c| c.depth > 0 && argv(c) == ["rm", "-rf", "/"]),
            "{cmds:?}"
        );
    }

    #[test]
    fn simple_commands_with_names_arguments_and_redirections() {
        let cmds = simple_commands(
            "X=1 ls -la 'my dir' > out.txt 2>&1 && if true; then cat <<EOF | grep $Y\nbody $(date)\nEOF\nfi",
        )
        .unwrap();
        let top: Vec<_> = cmds.iter().filter(|c| c.depth == 0).collect();
        assert_eq!(top.len(), 4, "{cmds:?}");
        assert_eq!(top[0].name(), Some("ls"));
        assert_eq!(top[0].assignments[0].literal.as_deref(), Some("X=1"));
        assert_eq!(
            top[0].argv[2].literal.as_deref(),
            Some("my dir"),
            "quotes removed"
        );
        assert_eq!(top[0].redirects.len(), 2);
        assert_eq!(top[0].redirects[0].kind, RedirectKind::Output);
        assert_eq!(top[0].redirects[1].kind, RedirectKind::Duplicate);
        assert_eq!(top[1].name(), Some("true"));
        assert_eq!(top[2].name(), Some("cat"));
        assert_eq!(top[2].redirects[0].kind, RedirectKind::HereDocument);
        assert_eq!(top[3].name(), Some("grep"));
        assert_eq!(top[3].argv[1].literal, None);
        assert_eq!(top[3].argv[1].source, "${Y}");
        // The here-document's substitution is a command too.
        assert!(
            cmds.iter()
                .any(|c| c.depth == 1 && c.name() == Some("date"))
        );

        assert!(
            simple_commands("for f in a b; do rm $f; done")
                .unwrap()
                .iter()
                .any(|c| c.name() == Some("rm"))
        );
        assert_eq!(
            simple_commands(&"x".repeat(MAX_INPUT + 1)),
            Err(ParseError::TooLong { len: MAX_INPUT + 1 })
        );
        assert_eq!(
            simple_commands(&"$(".repeat(MAX_DEPTH + 2)),
            Err(ParseError::TooDeep)
        );
    }

    #[test]
    fn redirections_keep_their_descriptor() {
        let cmds = simple_commands("cat 2>&1 <in 10>out {fd}<>sock >&- {a,b}>x '{q}'>y").unwrap();
        let fds: Vec<Option<&str>> = cmds[0].redirects.iter().map(|r| r.fd.as_deref()).collect();
        assert_eq!(
            fds,
            [Some("2"), None, Some("10"), Some("{fd}"), None, None, None]
        );
        // `{fd}` stays a word too, as a shell without that syntax reads it.
        assert_eq!(argv(&cmds[0]), ["cat", "{fd}", "{a,b}", "{q}"]);
    }

    #[test]
    fn a_job_in_the_background_is_seen() {
        for yes in ["sleep 9 &", "a & b", "(x &)", "coproc cat", "a &\nb"] {
            assert!(backgrounds(yes), "{yes}");
        }
        for no in [
            "a && b", "a 2>&1", "a &> f", "echo '&'", "echo \\&", "vim f", "a; b",
        ] {
            assert!(!backgrounds(no), "{no}");
        }
    }

    #[test]
    fn constructs_that_change_later_commands_are_reported() {
        let constructs = |script: &str| parse_script(script).unwrap().constructs;
        assert_eq!(
            constructs("for PATH in /tmp; do ls; done"),
            [Construct::Loop {
                keyword: "for".into()
            }]
        );
        assert_eq!(
            constructs("select x in a; do :; done"),
            [Construct::Loop {
                keyword: "select".into()
            }]
        );
        assert_eq!(
            constructs("git() { cat; }; git status"),
            [Construct::Function { name: "git".into() }]
        );
        assert_eq!(
            constructs("function git { cat; }"),
            [Construct::Function { name: "git".into() }]
        );
        assert_eq!(constructs("coproc cat"), [Construct::Coprocess]);
        assert!(matches!(
            constructs("((PATH=1)); ls").as_slice(),
            [Construct::Arithmetic { .. }]
        ));
        assert!(matches!(
            constructs("cat <<EOF\n$((PATH=1))\nEOF\n").as_slice(),
            [Construct::Arithmetic { .. }]
        ));
        assert!(matches!(
            constructs("echo \"${X:=1}\" $[1]").as_slice(),
            [Construct::Expansion { .. }, Construct::Arithmetic { .. }]
        ));
        assert!(matches!(
            constructs("for ((i=0; i<2; i++)); do :; done").as_slice(),
            [Construct::Arithmetic { .. }, Construct::Loop { .. }]
        ));
        // Plain parameters, subshells and `case` are not constructs.
        assert_eq!(
            constructs("echo $X ${Y} \"$@\"; (cd /tmp; ls); case $x in a) ls;; esac"),
            []
        );
        // The function body is still read as commands.
        let script = parse_script("f() { rm -rf d; }").unwrap();
        assert!(script.commands.iter().any(|c| c.name() == Some("rm")));
    }
}
