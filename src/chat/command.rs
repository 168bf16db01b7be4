//! The chat commands of CONTRACT as one typed enum. Each variant's doc comment *is* its line in
//! the help text and its `usage` literal is the usage line shown on a malformed command: the
//! `commands!` macro below declares the enum, [`HELP`] and [`Command::usage`] from the same
//! declaration, so none can drift from the others. Parsing only; no effects.
//!
//! Normalisation: the text is NFKC-normalised (full-width `／ｓｓｈ` and full-width spaces
//! become ASCII) and keywords are lower-cased; aliases are then matched exactly. The alias rule
//! is the registry's ([`crate::target::valid_alias`]), which the database CHECKs as well.

use unicode_normalization::UnicodeNormalization;

use crate::workspace::{Mode, Permission};

/// Declares [`Command`], the help table and each variant's usage line.
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

        /// `(variant, usage, description)` per command, in the order of the enum.
        pub const HELP: &[(&str, &str, &str)] =
            &[ $( (stringify!($variant), $usage, concat!($($doc),+)) ),* ];

        impl Command {
            /// This command's usage line.
            pub fn usage(&self) -> &'static str {
                match self { $( Command::$variant { .. } => $usage ),* }
            }
        }
    };
}

commands! {
    /// In the main chat: open a thread of your own bound to the target. In a thread: bind or switch it (its owner or an admin). `--here` binds the current place without a new thread (a group chat itself: admins only).
    usage "/ssh use <alias> [--here]"
    Use { alias: String, here: bool },
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
    /// Take that right back (also returns a thread the model bound to local).
    usage "/ssh yolo off"
    YoloOff,
    /// Admins only: approve a pending target.
    usage "/ssh approve <alias>"
    Approve { alias: String },
    /// Admins only: reject a target (it becomes disabled).
    usage "/ssh reject <alias>"
    Reject { alias: String },
    /// Show this help.
    usage "/ssh help"
    Help,
    /// Cancel the agent's running turn in this thread.
    usage "/stop"
    Stop,
    /// List the notes the agent keeps for this chat.
    usage "/memory list"
    MemoryList,
    /// Delete one of this chat's notes.
    usage "/memory forget <id>"
    MemoryForget { id: i64 },
    /// Choose this thread's workspace on its current backend: a directory, a permission (up to the target's maximum) and a mode. Omitted parts stay as they are.
    usage "/workspace set <dir> [read|read-write|full] [office|dev|design]"
    WorkspaceSet { dir: String, permission: Option<Permission>, mode: Option<Mode> },
    /// Show this thread's workspace: directory, permission and mode.
    usage "/workspace show"
    WorkspaceShow,
    /// Run the prompt as a turn in this thread at set times, in the chat's time zone: a 5-field cron expression (minute hour day month weekday) or `every <n>s|m|h|d`. In a group's main chat it opens a thread for the schedule. The thread's owner or an admin.
    usage "/cron add \"<schedule>\" <prompt>"
    CronAdd { schedule: String, prompt: String },
    /// List this chat's schedules: id, schedule, next run, last result, creator, paused.
    usage "/cron list"
    CronList,
    /// Pause a schedule (the owner of its thread or an admin).
    usage "/cron pause <id>"
    CronPause { id: i64 },
    /// Resume a paused schedule (what it missed is not run).
    usage "/cron resume <id>"
    CronResume { id: i64 },
    /// Remove a schedule.
    usage "/cron remove <id>"
    CronRemove { id: i64 },
    /// Run a schedule once, now, in its thread.
    usage "/cron run <id>"
    CronRun { id: i64 },
    /// Set the time zone of this chat's new schedules (`Area/City`); without one, show it.
    usage "/cron tz <Area/City>"
    CronTz { zone: Option<String> },
}

/// Words that can never be an alias.
pub const RESERVED: [&str; 4] = crate::target::RESERVED_ALIASES;

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

/// The usage line of the variant named `variant` (from [`HELP`]).
fn usage_of(variant: &str) -> &'static str {
    HELP.iter()
        .find(|(v, _, _)| *v == variant)
        .map(|(_, u, _)| *u)
        .unwrap_or("/ssh help")
}

/// The help text, as sent to the chat.
pub fn help_text() -> String {
    let mut out = String::from("SSH Mode commands:\n");
    for (_, usage, doc) in HELP {
        out.push_str(usage);
        out.push_str(" — ");
        out.push_str(doc.trim());
        out.push('\n');
    }
    out.push_str("/help — Show this help.\n");
    out.push_str("Examples: /ssh use web · /ssh status · /ssh yolo on web · /ssh local");
    out
}

/// The text as the parser reads it: NFKC-normalised, trimmed.
pub fn normalize(text: &str) -> String {
    text.nfkc().collect::<String>().trim().to_string()
}

/// Whether the text is `/stop` (checked on the request path to let it pass its section).
pub fn is_stop(text: &str) -> bool {
    matches!(parse(text), Some(Ok(Command::Stop)))
}

/// Parses a message's text (a leading mention of the bot already removed). `None` when the
/// text is not addressed to the command parser at all (it is for the agent).
pub fn parse(text: &str) -> Option<Result<Command, UsageError>> {
    let text = normalize(text);
    let mut words = text.split_whitespace();
    let first = words.next()?.to_lowercase();
    let rest: Vec<&str> = words.collect();
    match first.as_str() {
        "/help" => return Some(Ok(Command::Help)),
        "/stop" if rest.is_empty() => return Some(Ok(Command::Stop)),
        "/stop" => return Some(usage("Stop")),
        "/ssh" => {}
        "/memory" => return Some(parse_memory(&rest)),
        "/workspace" => return Some(parse_workspace(&rest)),
        "/cron" => {
            let raw = text[text.find(char::is_whitespace).unwrap_or(text.len())..].trim();
            return Some(parse_cron(raw));
        }
        _ => return None,
    }
    // Keywords lower-cased; aliases kept exactly as written.
    let kw: Vec<String> = rest.iter().map(|w| w.to_lowercase()).collect();
    let kw: Vec<&str> = kw.iter().map(String::as_str).collect();
    let alias = |w: &str| crate::target::valid_alias(w).then(|| w.to_string());
    Some(match kw.as_slice() {
        [] | ["help"] => Ok(Command::Help),
        ["use", ..] => {
            let here = kw[1..].contains(&"--here");
            let names: Vec<&str> = rest[1..]
                .iter()
                .copied()
                .filter(|w| !w.eq_ignore_ascii_case("--here"))
                .collect();
            match (
                names.as_slice(),
                kw[1..].iter().filter(|w| **w == "--here").count(),
            ) {
                ([a], 0 | 1) => alias(a)
                    .map(|alias| Command::Use { alias, here })
                    .map_or_else(|| usage("Use"), Ok),
                _ => usage("Use"),
            }
        }
        ["local"] | ["off"] => Ok(Command::Local),
        ["local" | "off", ..] => usage("Local"),
        ["status"] => Ok(Command::Status),
        ["status", ..] => usage("Status"),
        ["list"] => Ok(Command::List),
        ["list", ..] => usage("List"),
        ["yolo", "off"] => Ok(Command::YoloOff),
        ["yolo", "on", "all"] => Ok(Command::YoloOn {
            scope: YoloScope::All,
        }),
        ["yolo", "on", _] => alias(rest[2])
            .map(|a| Command::YoloOn {
                scope: YoloScope::Target(a),
            })
            .map_or_else(|| usage("YoloOn"), Ok),
        ["yolo", "off", ..] => usage("YoloOff"),
        ["yolo", ..] => usage("YoloOn"),
        ["approve", _] => alias(rest[1])
            .map(|alias| Command::Approve { alias })
            .map_or_else(|| usage("Approve"), Ok),
        ["approve", ..] => usage("Approve"),
        ["reject", _] => alias(rest[1])
            .map(|alias| Command::Reject { alias })
            .map_or_else(|| usage("Reject"), Ok),
        ["reject", ..] => usage("Reject"),
        [other, ..] => Err(UsageError(format!(
            "Unknown command `/ssh {}`. Send /ssh help for the list.",
            other.chars().take(32).collect::<String>()
        ))),
    })
}

/// The usage error of a command, by its variant's name.
fn usage<T>(variant: &str) -> Result<T, UsageError> {
    Err(UsageError(format!(
        "Usage: {} (send /ssh help for all commands)",
        usage_of(variant)
    )))
}

/// `/memory list` and `/memory forget <id>`.
fn parse_memory(rest: &[&str]) -> Result<Command, UsageError> {
    let kw: Vec<String> = rest.iter().map(|w| w.to_lowercase()).collect();
    match kw.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] | ["list"] => Ok(Command::MemoryList),
        ["list", ..] => usage("MemoryList"),
        ["forget", id] => match id.trim_start_matches('#').parse::<i64>() {
            Ok(id) if id > 0 => Ok(Command::MemoryForget { id }),
            _ => usage("MemoryForget"),
        },
        ["forget", ..] => usage("MemoryForget"),
        _ => usage("MemoryList"),
    }
}

/// The quotes a schedule may be written in (clients turn straight quotes into curly ones).
const QUOTES: [(char, char); 4] = [('"', '"'), ('“', '”'), ('「', '」'), ('\'', '\'')];

/// `/cron add "<schedule>" <prompt>` (the schedule quoted; `every <n><unit>` also unquoted),
/// `/cron list`, `/cron pause|resume|remove|run <id>`, `/cron tz [<Area/City>]`. The prompt
/// keeps its case and spacing.
fn parse_cron(rest: &str) -> Result<Command, UsageError> {
    let mut words = rest.split_whitespace();
    let kw = words.next().map(str::to_lowercase);
    let args: Vec<&str> = words.collect();
    let id = |variant: &str| match args.as_slice() {
        [id] => match id.trim_start_matches('#').parse::<i64>() {
            Ok(id) if id > 0 => Ok(id),
            _ => usage(variant),
        },
        _ => usage(variant),
    };
    match kw.as_deref() {
        None | Some("list") if args.is_empty() => Ok(Command::CronList),
        None | Some("list") => usage("CronList"),
        Some("pause") => id("CronPause").map(|id| Command::CronPause { id }),
        Some("resume") => id("CronResume").map(|id| Command::CronResume { id }),
        Some("remove") | Some("rm") | Some("delete") => {
            id("CronRemove").map(|id| Command::CronRemove { id })
        }
        Some("run") => id("CronRun").map(|id| Command::CronRun { id }),
        Some("tz") => match args.as_slice() {
            [] => Ok(Command::CronTz { zone: None }),
            [z] => Ok(Command::CronTz {
                zone: Some(z.to_string()),
            }),
            _ => usage("CronTz"),
        },
        Some("add") => {
            let after = rest.trim_start()[3..].trim_start();
            let (schedule, prompt) =
                split_schedule(after).ok_or_else(|| usage::<()>("CronAdd").unwrap_err())?;
            if schedule.trim().is_empty() || prompt.trim().is_empty() {
                return usage("CronAdd");
            }
            Ok(Command::CronAdd {
                schedule: schedule.trim().to_string(),
                prompt: prompt.trim().to_string(),
            })
        }
        Some(other) => Err(UsageError(format!(
            "Unknown command `/cron {}`. Send /ssh help for the list.",
            other.chars().take(32).collect::<String>()
        ))),
    }
}

/// The schedule (quoted, or an unquoted `every <n><unit>`) and the prompt after it.
fn split_schedule(text: &str) -> Option<(&str, &str)> {
    let first = text.chars().next()?;
    if let Some((_, close)) = QUOTES.iter().find(|(open, _)| *open == first) {
        let inner = &text[first.len_utf8()..];
        let end = inner.find(*close)?;
        return Some((&inner[..end], &inner[end + close.len_utf8()..]));
    }
    let mut parts = text.splitn(3, char::is_whitespace);
    let (every, n) = (parts.next()?, parts.next()?);
    if !every.eq_ignore_ascii_case("every") {
        return None;
    }
    let prompt = parts.next().unwrap_or("");
    Some((&text[..every.len() + 1 + n.len()], prompt))
}

/// `/workspace set <dir> [permission] [mode]` (the last two in either order) and
/// `/workspace show`. The directory keeps its case; keywords do not.
fn parse_workspace(rest: &[&str]) -> Result<Command, UsageError> {
    let first = rest.first().map(|w| w.to_lowercase());
    match first.as_deref() {
        None | Some("show") if rest.len() <= 1 => Ok(Command::WorkspaceShow),
        Some("set") if rest.len() >= 2 && rest.len() <= 4 => {
            let (mut permission, mut mode) = (None, None);
            for w in &rest[2..] {
                let w = w.to_lowercase();
                match (Permission::parse(&w), Mode::parse(&w)) {
                    (Some(p), _) if permission.is_none() => permission = Some(p),
                    (_, Some(m)) if mode.is_none() => mode = Some(m),
                    _ => return usage("WorkspaceSet"),
                }
            }
            Ok(Command::WorkspaceSet {
                dir: rest[1].to_string(),
                permission,
                mode,
            })
        }
        Some("show") => usage("WorkspaceShow"),
        _ => usage("WorkspaceSet"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn use_(alias: &str, here: bool) -> Command {
        Command::Use {
            alias: alias.into(),
            here,
        }
    }

    #[test]
    fn every_contract_command_parses() {
        let cases = [
            ("/ssh use web-1", use_("web-1", false)),
            ("/ssh use web-1 --here", use_("web-1", true)),
            ("/ssh use --here web-1", use_("web-1", true)),
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
            ("/ssh reject db", Command::Reject { alias: "db".into() }),
            ("/ssh help", Command::Help),
            ("/ssh", Command::Help),
            ("/help", Command::Help),
            ("  /stop ", Command::Stop),
            ("/memory list", Command::MemoryList),
            ("/memory", Command::MemoryList),
            ("/MEMORY forget 12", Command::MemoryForget { id: 12 }),
            ("/memory forget #3", Command::MemoryForget { id: 3 }),
            ("/workspace show", Command::WorkspaceShow),
            ("/workspace", Command::WorkspaceShow),
            (
                "/workspace set /srv/App",
                Command::WorkspaceSet {
                    dir: "/srv/App".into(),
                    permission: None,
                    mode: None,
                },
            ),
            (
                "/workspace set ~/app READ office",
                Command::WorkspaceSet {
                    dir: "~/app".into(),
                    permission: Some(Permission::Read),
                    mode: Some(Mode::Office),
                },
            ),
            (
                "/workspace set projects/app design read-write",
                Command::WorkspaceSet {
                    dir: "projects/app".into(),
                    permission: Some(Permission::ReadWrite),
                    mode: Some(Mode::Design),
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Some(Ok(want)), "{text}");
        }
    }

    #[test]
    fn tolerated_spellings() {
        // Full-width slash, letters and spaces; upper case keywords; aliases kept exactly.
        assert_eq!(parse("／ｓｓｈ　ｓｔａｔｕｓ"), Some(Ok(Command::Status)));
        assert_eq!(parse("/SSH Status"), Some(Ok(Command::Status)));
        assert_eq!(parse("/Ssh USE Web"), Some(Ok(use_("Web", false))));
        assert_eq!(parse("/ssh use web --HERE"), Some(Ok(use_("web", true))));
        assert_eq!(
            parse("/ssh YOLO ON ALL"),
            Some(Ok(Command::YoloOn {
                scope: YoloScope::All
            }))
        );
        assert_eq!(parse("／ｓｔｏｐ"), Some(Ok(Command::Stop)));
        assert!(is_stop(" /STOP "));
        assert!(!is_stop("/stop now please"));
    }

    #[test]
    fn reserved_words_are_not_aliases() {
        for w in ["all", "local", "off", "help", "ALL", "Local"] {
            assert!(
                matches!(parse(&format!("/ssh use {w}")), Some(Err(_))),
                "{w}"
            );
            assert!(
                matches!(parse(&format!("/ssh approve {w}")), Some(Err(_))),
                "{w}"
            );
        }
    }

    #[test]
    fn non_commands_and_malformed_inputs() {
        assert_eq!(parse("hello /ssh list"), None);
        assert_eq!(parse(""), None);
        assert_eq!(parse("/sshx"), None);
        for bad in [
            "/ssh use",
            "/ssh use a b",
            "/ssh use ../x;rm",
            "/ssh use -x",
            "/ssh use --here",
            "/ssh use a --here --here",
            "/ssh frobnicate",
            "/ssh yolo",
            "/ssh yolo on",
            "/ssh yolo maybe",
            "/ssh approve",
            "/ssh reject a b",
            "/ssh status now",
            "/memory forget",
            "/memory forget x",
            "/memory forget -1",
            "/memory forget 1 2",
            "/memory list all",
            "/memory wipe",
            "/workspace set",
            "/workspace set d read full",
            "/workspace set d dev office",
            "/workspace set d writable",
            "/workspace set d read dev x",
            "/workspace show all",
            "/workspace wipe",
        ] {
            let r = parse(bad);
            assert!(matches!(r, Some(Err(_))), "{bad}: {r:?}");
        }
        let long = format!("/ssh use {}", "x".repeat(64));
        assert!(matches!(parse(&long), Some(Err(_))));
        let ok = format!("/ssh use {}", "x".repeat(63));
        assert!(matches!(parse(&ok), Some(Ok(_))));
        // The usage text names the command's own usage line.
        let Some(Err(UsageError(u))) = parse("/ssh use") else {
            panic!()
        };
        assert!(u.contains("/ssh use <alias> [--here]"), "{u}");
    }

    #[test]
    fn help_and_usage_come_from_the_declaration() {
        let h = help_text();
        for (_, usage, doc) in HELP {
            assert!(h.contains(usage), "{usage} missing from help");
            assert!(h.contains(doc.trim()));
        }
        assert!(h.contains("/help"));
        assert_eq!(use_("a", false).usage(), "/ssh use <alias> [--here]");
        assert_eq!(Command::Stop.usage(), "/stop");
        for v in [
            "Use",
            "Local",
            "Status",
            "List",
            "YoloOn",
            "YoloOff",
            "Approve",
            "Reject",
            "MemoryList",
            "MemoryForget",
            "WorkspaceSet",
            "WorkspaceShow",
            "CronAdd",
            "CronList",
            "CronPause",
            "CronResume",
            "CronRemove",
            "CronRun",
            "CronTz",
        ] {
            assert_ne!(usage_of(v), "/ssh help", "{v}");
        }
    }

    #[test]
    fn cron_commands_keep_the_prompt_as_written() {
        let add = |schedule: &str, prompt: &str| Command::CronAdd {
            schedule: schedule.into(),
            prompt: prompt.into(),
        };
        let cases = [
            (
                "/cron add \"0 9 * * 1-5\" Check the disks on prod, tell us  here",
                add("0 9 * * 1-5", "Check the disks on prod, tell us  here"),
            ),
            (
                "/CRON ADD “*/10 * * * *” Look at `df -h`",
                add("*/10 * * * *", "Look at `df -h`"),
            ),
            ("/cron add every 10m ping it", add("every 10m", "ping it")),
            ("/cron add 'every 2h' Report", add("every 2h", "Report")),
            ("/cron", Command::CronList),
            ("/cron list", Command::CronList),
            ("/cron pause 3", Command::CronPause { id: 3 }),
            ("/cron resume #3", Command::CronResume { id: 3 }),
            ("/cron remove 12", Command::CronRemove { id: 12 }),
            ("/cron run 1", Command::CronRun { id: 1 }),
            ("/cron tz", Command::CronTz { zone: None }),
            (
                "/cron tz Europe/Berlin",
                Command::CronTz {
                    zone: Some("Europe/Berlin".into()),
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Some(Ok(want)), "{text}");
        }
        for bad in [
            "/cron add",
            "/cron add \"0 9 * * *\"",
            "/cron add \"0 9 * * * no closing quote",
            "/cron add 0 9 * * * prompt",
            "/cron add \"\" prompt",
            "/cron pause",
            "/cron pause x",
            "/cron pause 0",
            "/cron run 1 2",
            "/cron tz a b",
            "/cron list all",
            "/cron frobnicate",
        ] {
            assert!(
                matches!(parse(bad), Some(Err(_))),
                "{bad}: {:?}",
                parse(bad)
            );
        }
        let Some(Err(UsageError(u))) = parse("/cron add") else {
            panic!()
        };
        assert!(u.contains("/cron add \"<schedule>\" <prompt>"), "{u}");
    }
}
