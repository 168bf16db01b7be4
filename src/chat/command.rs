//! The chat commands of CONTRACT as one typed enum. Each variant's doc comment *is* its line in
//! the help text: the `commands!` macro below declares the enum and builds [`HELP`] from the
//! same doc strings, so the two cannot drift apart. Parsing only; no effects.

/// Declares [`Command`] and, from the same doc comments, the help table.
macro_rules! commands {
    ($(
        $(#[doc = $doc:literal])+
        usage $usage:literal
        $variant:ident $({ $($field:ident : $ty:ty),* $(,)? })?
    ),* $(,)?) => {
        /// A parsed chat command.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Command {
            $( $(#[doc = $doc])+ $variant $({ $($field: $ty),* })? ),*
        }

        /// `(usage, description)` per command, in the order of the enum.
        pub const HELP: &[(&str, &str)] = &[ $( ($usage, concat!($($doc),+)) ),* ];
    };
}

commands! {
    /// In the main chat: open a thread bound to the target. In a thread: bind or switch this thread.
    usage "/ssh use <alias>"
    Use { alias: String },
    /// Return this thread to the local backend (`/ssh off` does the same).
    usage "/ssh local"
    Local,
    /// Show this thread's backend, who bound it and when, and its active grants.
    usage "/ssh status"
    Status,
    /// List the targets this chat may use.
    usage "/ssh list"
    List,
    /// Let the model enter a target (or any target) by itself, in this thread only.
    usage "/ssh yolo on <alias|all>"
    YoloOn { scope: YoloScope },
    /// Take that right back.
    usage "/ssh yolo off"
    YoloOff,
    /// Admins only: approve a pending target.
    usage "/ssh approve <alias>"
    Approve { alias: String },
    /// Show this help.
    usage "/ssh help"
    Help,
    /// Cancel the agent's running turn in this thread.
    usage "/stop"
    Stop,
}

/// What a `/ssh yolo on` grant covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum YoloScope {
    Target(String),
    All,
}

/// A message that looks like a command but is not a valid one. Its text is shown to the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The help text, as sent to the chat.
pub fn help_text() -> String {
    let mut out = String::from("SSH Mode commands:\n");
    for (usage, doc) in HELP {
        out.push_str(usage);
        out.push_str(" — ");
        out.push_str(doc.trim());
        out.push('\n');
    }
    out.push_str("/help — Show this help.");
    out
}

/// Parses a message's text (a leading mention of the bot already removed). `None` when the
/// text is not addressed to the command parser at all (it is for the agent).
pub fn parse(text: &str) -> Option<Result<Command, UsageError>> {
    let mut words = text.split_whitespace();
    let first = words.next()?;
    match first {
        "/help" => return Some(Ok(Command::Help)),
        "/stop" => return Some(Ok(Command::Stop)),
        "/ssh" => {}
        _ => return None,
    }
    let rest: Vec<&str> = words.collect();
    let usage = |u: &str| {
        Err(UsageError(format!(
            "Usage: {u} (send /ssh help for all commands)"
        )))
    };
    let alias = |w: &str| {
        let ok = !w.is_empty()
            && w.len() <= 64
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        ok.then(|| w.to_string())
    };
    Some(match rest.as_slice() {
        [] | ["help"] => Ok(Command::Help),
        ["use", a] => alias(a)
            .map(|alias| Command::Use { alias })
            .map_or_else(|| usage("/ssh use <alias>"), Ok),
        ["use", ..] => usage("/ssh use <alias>"),
        ["local"] | ["off"] => Ok(Command::Local),
        ["status"] => Ok(Command::Status),
        ["list"] => Ok(Command::List),
        ["yolo", "off"] => Ok(Command::YoloOff),
        ["yolo", "on", "all"] => Ok(Command::YoloOn {
            scope: YoloScope::All,
        }),
        ["yolo", "on", a] => alias(a)
            .map(|a| Command::YoloOn {
                scope: YoloScope::Target(a),
            })
            .map_or_else(|| usage("/ssh yolo on <alias|all>"), Ok),
        ["yolo", ..] => usage("/ssh yolo on <alias|all> or /ssh yolo off"),
        ["approve", a] => alias(a)
            .map(|alias| Command::Approve { alias })
            .map_or_else(|| usage("/ssh approve <alias>"), Ok),
        ["approve", ..] => usage("/ssh approve <alias>"),
        [other, ..] => Err(UsageError(format!(
            "Unknown command `/ssh {}`. Send /ssh help for the list.",
            other.chars().take(32).collect::<String>()
        ))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_command_parses() {
        let cases = [
            (
                "/ssh use web-1",
                Command::Use {
                    alias: "web-1".into(),
                },
            ),
            ("/ssh local", Command::Local),
            ("/ssh off", Command::Local),
            ("/ssh status", Command::Status),
            ("/ssh list", Command::List),
            (
                "/ssh yolo on db",
                Command::YoloOn {
                    scope: YoloScope::Target("db".into()),
                },
            ),
            (
                "/ssh yolo on all",
                Command::YoloOn {
                    scope: YoloScope::All,
                },
            ),
            ("/ssh yolo off", Command::YoloOff),
            ("/ssh approve db", Command::Approve { alias: "db".into() }),
            ("/ssh help", Command::Help),
            ("/help", Command::Help),
            ("  /stop ", Command::Stop),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Some(Ok(want)), "{text}");
        }
    }

    #[test]
    fn non_commands_and_bad_usage() {
        assert_eq!(parse("hello /ssh list"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("/sshx"), None);
        assert!(matches!(parse("/ssh use"), Some(Err(_))));
        assert!(matches!(parse("/ssh use a b"), Some(Err(_))));
        assert!(matches!(parse("/ssh use ../x;rm"), Some(Err(_))));
        assert!(matches!(parse("/ssh frobnicate"), Some(Err(_))));
    }

    #[test]
    fn help_lists_every_command_from_the_doc_comments() {
        let h = help_text();
        for u in [
            "/ssh use",
            "/ssh local",
            "/ssh status",
            "/ssh list",
            "/ssh yolo on",
            "/ssh yolo off",
            "/ssh approve",
            "/ssh help",
            "/stop",
            "/help",
        ] {
            assert!(h.contains(u), "{u} missing from help");
        }
        assert!(h.contains("Admins only: approve a pending target."));
        assert_eq!(HELP.len(), 9);
    }
}
