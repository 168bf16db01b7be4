//! What a person sent, made whole for the agent before its turn is queued: the message it
//! replies to and the bundle it forwards, read through the front-end's [`Source`] and bounded
//! (a quoted text to [`MAX_QUOTED_CHARS`], a bundle to [`MAX_FORWARDED`] messages), and its
//! files and images placed in the section's workspace on its backend — an `attachments/`
//! directory, written atomically by the same path as the `write_file` tool (locally or on the
//! target; at `read` permission the section's temporary directory instead) — with the model
//! told each file's path, size and type. Images are also kept for the turn
//! ([`crate::turns::inputs`]) so a route whose model sees images gets them as image content.
//!
//! It runs in the inbox worker, never on the callback path, each read and download under a
//! deadline and a byte cap (`SSHMODE_ATTACHMENT_MAX_MB`). A file over the cap is refused with a
//! message to the sender, and nothing of it is written. A message is quoted once per section:
//! one already in the conversation (a request of the section, or quoted before) is not quoted
//! again, and in a thread the thread's root is not quoted (only an explicit reply is).
//!
//! Never: retries what the platform refuses for good (a file inside a forwarded bundle or a
//! card); falls back to local when the bound target cannot take a file; leaves a message the
//! agent cannot read silently empty.

use std::path::Path;
use std::time::Duration;

use super::binding;
use super::dispatch::Deps;
use super::port::{FileRef, Incoming, Quoted, Source, Unavailable};
use crate::exec::Place;
use crate::turns::inputs;
use crate::workspace::{self, Permission};

/// What a sticker reads as.
pub const STICKER: &str = "[a sticker]";
/// Longest text of one quoted or forwarded message given to the model.
pub const MAX_QUOTED_CHARS: usize = 4_000;
/// Most messages of a forwarded bundle given to the model.
pub const MAX_FORWARDED: usize = 20;
/// Most files downloaded for one message.
pub const MAX_FILES: usize = 10;
/// Longest wait for a quoted message or a bundle.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for one file, its placing included.
const FILE_TIMEOUT: Duration = Duration::from_secs(180);

/// A message made ready for the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    /// The request's text: the message, what it quotes or forwards, where its files are.
    pub text: String,
    /// The message quoted now; remembered once the request is queued.
    pub quoted: Option<String>,
    /// What to tell the sender at once (a file refused).
    pub notices: Vec<String>,
}

impl Prepared {
    /// Nothing is left for the agent (e.g. a message that was only a refused file).
    pub fn is_empty(&self) -> bool {
        self.text.trim().is_empty()
    }
}

/// Reads what `msg` quotes, forwards and carries, and places its files.
pub async fn prepare(
    deps: &Deps,
    msg: &Incoming,
    source: Option<&dyn Source>,
) -> anyhow::Result<Prepared> {
    let section = msg.section();
    let mut parts: Vec<String> = Vec::new();
    if !msg.text.trim().is_empty() {
        parts.push(msg.text.clone());
    } else if msg.sticker {
        // Stickers cannot be downloaded: the model learns one was sent, never an empty turn.
        parts.push(STICKER.into());
    }
    let mut out = Prepared::default();
    // (message the file belongs to, the file)
    let mut files: Vec<(String, FileRef)> = msg
        .files
        .iter()
        .map(|f| (msg.message_id.clone(), f.clone()))
        .collect();
    let mut notes: Vec<String> = Vec::new();
    match source {
        Some(src) => {
            if msg.forwarded {
                parts.push(match read(src, &msg.message_id).await {
                    Ok(list) => bundle(&msg.message_id, &list, &mut notes),
                    Err(e) => format!("[Forwarded messages that could not be read: {e}.]"),
                });
            }
            if let Some(parent) = quotable(msg)
                && !inputs::in_conversation(&deps.db, section, parent).await?
            {
                out.quoted = Some(parent.to_string());
                parts.push(match read(src, parent).await {
                    Ok(list) => quote(parent, &list, &mut files, &mut notes),
                    Err(e) => format!(
                        "[This message replies to message {parent}, which cannot be read: {e}.]"
                    ),
                });
            }
        }
        None if msg.forwarded => {
            parts.push("[Forwarded messages, which cannot be read here.]".into());
        }
        None => {}
    }
    if files.len() > MAX_FILES {
        notes.push(format!(
            "[{} more files were not downloaded: at most {MAX_FILES} are taken from one message.]",
            files.len() - MAX_FILES
        ));
        files.truncate(MAX_FILES);
    }
    if !files.is_empty() {
        match source {
            Some(src) => place_files(deps, msg, src, &files, &mut notes, &mut out.notices).await?,
            None => notes.push("[Files were sent, which cannot be read here.]".into()),
        }
    }
    parts.extend(notes);
    out.text = parts.join("\n\n");
    Ok(out)
}

/// The message to quote: a reply's parent; in a thread only an explicit reply (a message in a
/// thread names the thread's root as its parent).
fn quotable(msg: &Incoming) -> Option<&str> {
    let parent = msg.parent_id.as_deref().filter(|p| !p.is_empty())?;
    if msg.thread_id.is_some() && msg.root_id.as_deref() == Some(parent) {
        return None;
    }
    (parent != msg.message_id).then_some(parent)
}

async fn read(src: &dyn Source, message_id: &str) -> Result<Vec<Quoted>, Unavailable> {
    match tokio::time::timeout(READ_TIMEOUT, src.messages(message_id)).await {
        Ok(r) => r,
        Err(_) => Err(Unavailable::Refused("reading it timed out".into())),
    }
}

/// `text` cut to [`MAX_QUOTED_CHARS`], each line quoted.
fn quoted_lines(text: &str) -> String {
    let mut t: String = text.chars().take(MAX_QUOTED_CHARS).collect();
    if t.len() < text.len() {
        t.push_str(" […cut]");
    }
    t.lines()
        .map(|l| format!("> {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The quoted message (the first of `list`; the rest are its bundle's messages, if it is one).
fn quote(
    parent: &str,
    list: &[Quoted],
    files: &mut Vec<(String, FileRef)>,
    notes: &mut Vec<String>,
) -> String {
    let Some(first) = list
        .iter()
        .find(|q| q.message_id == parent)
        .or(list.first())
    else {
        return format!(
            "[This message replies to message {parent}, which cannot be read: Lark returned nothing.]"
        );
    };
    let inner: Vec<Quoted> = list
        .iter()
        .filter(|q| q.message_id != first.message_id)
        .cloned()
        .collect();
    files.extend(
        first
            .files
            .iter()
            .map(|f| (first.message_id.clone(), f.clone())),
    );
    let mut s = format!("[Quoted message from {}:]", first.sender);
    if !first.text.trim().is_empty() {
        s.push('\n');
        s.push_str(&quoted_lines(&first.text));
    }
    if !inner.is_empty() {
        s.push('\n');
        s.push_str(&bundle(parent, &inner, notes));
    }
    s
}

/// The messages of a forwarded bundle, at most [`MAX_FORWARDED`].
fn bundle(bundle_id: &str, list: &[Quoted], notes: &mut Vec<String>) -> String {
    let inner: Vec<&Quoted> = list.iter().filter(|q| q.message_id != bundle_id).collect();
    let mut s = format!(
        "[Forwarded messages ({}{}):]",
        inner.len().min(MAX_FORWARDED),
        if inner.len() > MAX_FORWARDED {
            format!(" of {}, the rest left out", inner.len())
        } else {
            String::new()
        }
    );
    for q in inner.iter().take(MAX_FORWARDED) {
        s.push_str(&format!("\n{}:\n{}", q.sender, quoted_lines(&q.text)));
        for f in &q.files {
            notes.push(format!(
                "[{} inside the forwarded messages was not downloaded: Lark does not let bots download files inside forwarded messages (234043).]",
                describe(f)
            ));
        }
    }
    s
}

/// `file "name"` or `image`.
fn describe(f: &FileRef) -> String {
    match &f.name {
        Some(n) => format!("{} \"{n}\"", f.kind),
        None => format!("an {}", f.kind)
            .replace("an file", "a file")
            .replace("an media", "a video"),
    }
}

/// Where a target keeps the attachments of a section whose workspace is read-only: under the
/// target user's own home (never the shared `/tmp`, where another user of the host could make
/// the directory first or read it), in `~/.sshmode-attachments`, made private (0700) and checked
/// to be a real directory of that user before anything is written into it.
async fn private_dir(ops: &crate::exec::ops::Ops, section: &str) -> Result<String, String> {
    let home = ops.backend().home().await.map_err(|e| e.to_string())?;
    let top = format!("{}/.sshmode-attachments", home.trim_end_matches('/'));
    let dir = format!("{top}/{}", safe_name(section));
    let script = format!(
        "umask 077 && mkdir -p -- {d} && chmod 700 -- {t} && [ -d {t} ] && [ ! -L {t} ] && [ -O {t} ] && [ -d {d} ] && [ ! -L {d} ] && [ -O {d} ]",
        d = crate::exec::shell_quote(&dir),
        t = crate::exec::shell_quote(&top),
    );
    let cmd = crate::exec::Command {
        script: &script,
        stdin: None,
        timeout: FILE_TIMEOUT,
        stdout_limit: 1024,
        stderr_limit: 1024,
        live: None,
    };
    let out = ops
        .backend()
        .exec(cmd, &tokio_util::sync::CancellationToken::new())
        .await
        .map_err(|e| e.to_string())?;
    if out.exit.success() {
        Ok(dir)
    } else {
        Err(format!(
            "{top} is not a private directory of the target's user"
        ))
    }
}

/// Downloads each file and writes it where the section's tools will find it.
async fn place_files(
    deps: &Deps,
    msg: &Incoming,
    src: &dyn Source,
    files: &[(String, FileRef)],
    notes: &mut Vec<String>,
    notices: &mut Vec<String>,
) -> anyhow::Result<()> {
    let section = msg.section();
    let place = binding::resolve_place(&deps.db, section, deps.clock.now()).await?;
    let ws = workspace::current(&deps.db, &deps.workspaces, section, &place).await?;
    let writable = ws.permission > Permission::Read;
    let ops = match &place {
        Place::Local => deps
            .exec
            .local_ops_in(section, Path::new(&ws.dir), writable),
        Place::Target(_) => deps.exec.ops_for(section, &place).await,
    };
    let dir = match (&place, writable, &ops) {
        (_, true, _) => format!("{}/attachments", ws.dir.trim_end_matches('/')),
        (Place::Local, false, _) => {
            format!("{}/attachments", deps.exec.local_tmp(section).display())
        }
        (Place::Target(_), false, Ok(o)) => match private_dir(o, section).await {
            Ok(d) => d,
            Err(e) => {
                for (_, f) in files {
                    notes.push(format!(
                        "[{} could not be placed on {}: {e}.]",
                        describe(f),
                        place.name()
                    ));
                }
                return Ok(());
            }
        },
        // The write below reports the backend's error for each file.
        (Place::Target(_), false, Err(_)) => String::new(),
    };
    let max = deps.config.chat.attachment_max_bytes;
    for (message_id, f) in files {
        let ops = match &ops {
            Ok(o) => o,
            Err(e) => {
                notes.push(format!(
                    "[{} could not be placed on {}: {e}.]",
                    describe(f),
                    place.name()
                ));
                continue;
            }
        };
        let got = tokio::time::timeout(FILE_TIMEOUT, src.download(message_id, f, max)).await;
        let bytes = match got {
            Ok(Ok(b)) => b,
            Ok(Err(Unavailable::TooLarge { limit_mb })) => {
                notices.push(format!(
                    "I did not take {}: it is larger than the {limit_mb} MB limit for files sent to me (SSHMODE_ATTACHMENT_MAX_MB). Put it somewhere the task can reach instead, or send a smaller part.",
                    describe(f)
                ));
                continue;
            }
            Ok(Err(Unavailable::Refused(why))) => {
                notes.push(format!("[{} could not be downloaded: {why}.]", describe(f)));
                continue;
            }
            Err(_) => {
                notes.push(format!(
                    "[{} could not be downloaded in time.]",
                    describe(f)
                ));
                continue;
            }
        };
        let mime = sniff(&bytes, f.name.as_deref());
        let name = file_name(message_id, f, mime);
        let written = tokio::time::timeout(
            FILE_TIMEOUT,
            ops.write_file(&format!("{dir}/{name}"), &bytes),
        )
        .await;
        let path = match written {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                notes.push(format!(
                    "[{} could not be placed on {}: {e}.]",
                    describe(f),
                    place.name()
                ));
                continue;
            }
            Err(_) => {
                notes.push(format!("[{} could not be placed in time.]", describe(f)));
                continue;
            }
        };
        // Recorded where it was placed, so a recall, an erasure or retention finds it.
        crate::lifecycle::record_file(&deps.db, message_id, section, place.name(), &path).await?;
        notes.push(format!(
            "[Attachment ({}{}): {path} on {} — {}, {mime}.]",
            f.kind,
            f.name
                .as_deref()
                .map(|n| format!(" \"{n}\""))
                .unwrap_or_default(),
            place.name(),
            size(bytes.len())
        ));
        if mime.starts_with("image/") {
            inputs::store_image(
                &deps.db,
                &inputs::Image {
                    message_id: msg.message_id.clone(),
                    path,
                    mime: mime.to_string(),
                    data: bytes,
                },
            )
            .await?;
        }
    }
    Ok(())
}

/// A name safe on any host: letters, digits, `.`, `-`, `_`; no leading dot; bounded.
fn safe_name(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = cleaned.trim_start_matches('.');
    let mut out: String = trimmed.chars().take(100).collect();
    if out.is_empty() {
        out.push_str("file");
    }
    out
}

/// `<message id tail>-<name>`: the sender's name made safe, or one made from the kind.
fn file_name(message_id: &str, f: &FileRef, mime: &str) -> String {
    let tail: String = {
        let id = safe_name(message_id);
        id.chars()
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    };
    let base = match &f.name {
        Some(n) => safe_name(n),
        None => {
            let ext = match mime {
                "image/png" => "png",
                "image/jpeg" => "jpg",
                "image/gif" => "gif",
                "image/webp" => "webp",
                _ if f.kind == "audio" => "opus",
                _ if f.kind == "media" => "mp4",
                _ => "bin",
            };
            let key: String = safe_name(&f.key).chars().take(16).collect();
            format!("{}-{key}.{ext}", f.kind)
        }
    };
    format!("{tail}-{base}")
}

/// The type of a file, from its first bytes, else its name.
fn sniff(bytes: &[u8], name: Option<&str>) -> &'static str {
    let magic: [(&[u8], &str); 5] = [
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF8", "image/gif"),
        (b"%PDF", "application/pdf"),
        (b"PK\x03\x04", "application/zip"),
    ];
    if let Some((_, m)) = magic.iter().find(|(p, _)| bytes.starts_with(p)) {
        return m;
    }
    if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        return "image/webp";
    }
    let ext = name
        .and_then(|n| n.rsplit_once('.'))
        .map(|(_, e)| e.to_ascii_lowercase());
    if ext.as_deref() == Some("json") {
        return "application/json";
    }
    let head = &bytes[..bytes.len().min(4096)];
    let text = match std::str::from_utf8(head) {
        Ok(_) => true,
        // A multi-byte character cut at the end of the sample is still text.
        Err(e) => e.error_len().is_none(),
    };
    if text && !head.contains(&0) {
        "text/plain"
    } else {
        "application/octet-stream"
    }
}

/// `512 bytes`, `3.4 KB`, `1.2 MB`.
fn size(n: usize) -> String {
    match n {
        n if n < 1024 => format!("{n} bytes"),
        n if n < 1024 * 1024 => format!("{:.1} KB", n as f64 / 1024.0),
        n => format!("{:.1} MB", n as f64 / (1024.0 * 1024.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incoming(thread: Option<&str>, root: Option<&str>, parent: Option<&str>) -> Incoming {
        Incoming {
            event_id: "ev".into(),
            message_id: "om_2".into(),
            chat_id: "oc_1".into(),
            thread_id: thread.map(str::to_string),
            root_id: root.map(str::to_string),
            sender: "ou_a".into(),
            text: "what does this mean?".into(),
            addressed: true,
            direct: false,
            parent_id: parent.map(str::to_string),
            files: vec![],
            forwarded: false,
            sticker: false,
        }
    }

    #[test]
    fn a_reply_quotes_its_parent_and_a_thread_message_not_its_root() {
        assert_eq!(
            quotable(&incoming(None, Some("om_1"), Some("om_1"))),
            Some("om_1")
        );
        assert_eq!(
            quotable(&incoming(Some("omt_1"), Some("om_1"), Some("om_1"))),
            None
        );
        assert_eq!(
            quotable(&incoming(Some("omt_1"), Some("om_1"), Some("om_5"))),
            Some("om_5")
        );
        assert_eq!(quotable(&incoming(None, None, None)), None);
    }

    #[test]
    fn quotes_and_bundles_are_bounded() {
        let q = |id: &str, text: &str| Quoted {
            message_id: id.into(),
            sender: "ou_b".into(),
            text: text.into(),
            files: vec![FileRef {
                key: "file_k".into(),
                kind: "file".into(),
                name: Some("a.log".into()),
            }],
            in_bundle: true,
        };
        let long = "x".repeat(MAX_QUOTED_CHARS * 2);
        let mut list = vec![q("om_b", "")];
        list.extend((0..MAX_FORWARDED + 5).map(|i| q(&format!("om_{i}"), &long)));
        let mut notes = vec![];
        let s = bundle("om_b", &list, &mut notes);
        assert!(s.starts_with(&format!(
            "[Forwarded messages ({MAX_FORWARDED} of {}, the rest left out):]",
            MAX_FORWARDED + 5
        )));
        assert_eq!(s.matches("[…cut]").count(), MAX_FORWARDED);
        assert!(s.len() < MAX_FORWARDED * (MAX_QUOTED_CHARS + 100));
        assert_eq!(notes.len(), MAX_FORWARDED);
        assert!(notes[0].contains("234043"));
    }

    #[test]
    fn names_and_types() {
        let f = FileRef {
            key: "img_v3_abc".into(),
            kind: "image".into(),
            name: None,
        };
        assert_eq!(
            file_name("om_0123456789", &f, "image/png"),
            "23456789-image-img_v3_abc.png"
        );
        let f = FileRef {
            name: Some("../../etc/pass wd".into()),
            ..f
        };
        assert_eq!(file_name("om_1", &f, "text/plain"), "om_1-_.._etc_pass_wd");
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\nrest", None), "image/png");
        assert_eq!(sniff(b"error: boom\n", Some("app.log")), "text/plain");
        assert_eq!(sniff(&[0, 1, 2, 255], None), "application/octet-stream");
        assert_eq!(size(2048), "2.0 KB");
    }
}
