//! The input line of a shell as typing builds it: what was typed since the last Enter, with the
//! editing keys a line editor gives (Backspace, Ctrl-U, Ctrl-W, Ctrl-C), so that the line an
//! Enter submits can be judged before it is sent. Keys whose effect depends on the shell's
//! state — cursor and history keys (escape sequences), Tab completion, Ctrl-R and the other
//! control keys — mark the line *edited*: what the shell runs may then differ from the text
//! known here, which is still judged as it stands.

/// The longest input line kept; typing beyond it marks the line edited.
const MAX_LINE: usize = 4096;

/// A line that an Enter submits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnteredLine {
    /// The line as typed (without the Enter).
    pub text: String,
    /// Editing keys were used whose effect is not known here.
    pub edited: bool,
    /// Read as a shell line: the first program it starts that runs what is typed into it later
    /// (an editor, a pager, a client with a shell escape, an interpreter's prompt:
    /// [`crate::bash::spec::runs_typed_input`]).
    pub starts: Option<String>,
    /// Read as a shell line: it starts a job in the background (`&`, `coproc`).
    pub backgrounds: bool,
}

/// The line being typed.
#[derive(Debug, Default, Clone)]
pub(super) struct TypedLine {
    text: String,
    edited: bool,
}

impl TypedLine {
    /// Types `data` and returns the lines its Enters submitted.
    pub(super) fn feed(&mut self, data: &[u8]) -> Vec<EnteredLine> {
        let mut entered = Vec::new();
        let text = String::from_utf8_lossy(data);
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\r' | '\n' => {
                    entered.push(EnteredLine {
                        text: std::mem::take(&mut self.text),
                        edited: std::mem::take(&mut self.edited),
                        starts: None,
                        backgrounds: false,
                    });
                }
                '\x7f' | '\x08' => {
                    self.text.pop();
                }
                // Ctrl-C abandons the line, Ctrl-U erases it.
                '\x03' | '\x15' => *self = TypedLine::default(),
                // Ctrl-W erases the word before the cursor.
                '\x17' => {
                    let kept = self.text.trim_end().len();
                    self.text.truncate(kept);
                    let word = self
                        .text
                        .rfind(char::is_whitespace)
                        .map(|i| i + 1)
                        .unwrap_or(0);
                    self.text.truncate(word);
                }
                '\x1b' => {
                    self.edited = true;
                    // A CSI or SS3 sequence ends at its final byte; any other escape is one key.
                    match chars.next() {
                        Some('[') => {
                            for c in chars.by_ref() {
                                if ('\x40'..='\x7e').contains(&c) {
                                    break;
                                }
                            }
                        }
                        Some('O') => {
                            chars.next();
                        }
                        _ => {}
                    }
                }
                c if c.is_control() => self.edited = true,
                c if self.text.len() + c.len_utf8() > MAX_LINE => self.edited = true,
                c => self.text.push(c),
            }
        }
        entered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(line: &mut TypedLine, data: &str) -> Vec<(String, bool)> {
        line.feed(data.as_bytes())
            .into_iter()
            .map(|l| (l.text, l.edited))
            .collect()
    }

    #[test]
    fn enter_submits_what_was_typed_across_writes() {
        let mut l = TypedLine::default();
        assert!(lines(&mut l, "rm -rf ").is_empty());
        assert_eq!(
            lines(&mut l, "/\rls\n"),
            [("rm -rf /".into(), false), ("ls".into(), false)]
        );
        assert_eq!(lines(&mut l, "\r"), [(String::new(), false)]);
    }

    #[test]
    fn editing_keys_change_the_line_as_a_line_editor_does() {
        let mut l = TypedLine::default();
        assert_eq!(lines(&mut l, "lsx\x7f -l\r"), [("ls -l".into(), false)]);
        assert_eq!(
            lines(&mut l, "echo one two\x17three\r"),
            [("echo one three".into(), false)]
        );
        assert_eq!(lines(&mut l, "echo no\x15pwd\r"), [("pwd".into(), false)]);
        assert_eq!(
            lines(&mut l, "sleep 100\x03date\r"),
            [("date".into(), false)]
        );
    }

    #[test]
    fn cursor_history_and_completion_keys_mark_the_line_edited() {
        let mut l = TypedLine::default();
        // Up arrow (history), then Enter: the line run is not known here.
        assert_eq!(lines(&mut l, "\x1b[A\r"), [(String::new(), true)]);
        assert_eq!(
            lines(&mut l, "rm -r\x1bOD\x1bOCf x\r"),
            [("rm -rf x".into(), true)]
        );
        assert_eq!(
            lines(&mut l, "cat /et\tpasswd\r"),
            [("cat /etpasswd".into(), true)]
        );
        assert_eq!(lines(&mut l, "\x12curl\r"), [("curl".into(), true)]);
        // The mark ends with its line.
        assert_eq!(lines(&mut l, "ls\r"), [("ls".into(), false)]);
    }

    #[test]
    fn the_line_is_bounded() {
        let mut l = TypedLine::default();
        let long = "a".repeat(MAX_LINE + 10);
        let got = l.feed(format!("{long}\r").as_bytes());
        assert_eq!(got[0].text.len(), MAX_LINE);
        assert!(got[0].edited);
    }
}
