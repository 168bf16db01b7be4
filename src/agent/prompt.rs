//! The system prompt, built at each step from the section's state: its backend (local, or the
//! target alias with `user@host`), its working directory there, its workspace (directory,
//! permission, mode), what `ssh_mode` can do here,
//! the line between task tools (the backend) and the local control plane, and the chat's
//! notes (fenced as notes, not instructions).

use std::collections::HashMap;
use std::sync::Mutex;

use super::{AgentDeps, SshModeAction};
use crate::exec::Place;

/// Most sections whose last prompt is kept; past it the cache starts again empty.
const MAX_CACHED: usize = 1024;

/// The last prompt built per section, with the place and the fingerprint of the state it was
/// built from, so a step whose section did not change costs two reads instead of a dozen.
#[derive(Default)]
pub struct Cache {
    inner: Mutex<HashMap<String, (Place, String, String)>>,
}

/// One read that changes whenever anything the prompt shows changes: the binding, the grants
/// (and the minute, for their remaining time), the working directories, the workspaces, any
/// target, the chat's notes.
const FINGERPRINT: &str = "SELECT md5(concat_ws('|', \
    (SELECT alias || kind || bound_at::text FROM bindings WHERE section = $1), \
    (SELECT string_agg(id::text || expires_at::text, ',' ORDER BY id) FROM grants \
        WHERE section = $1 AND closed_at IS NULL AND expires_at > now()), \
    (SELECT string_agg(backend || '=' || dir, ',' ORDER BY backend) FROM section_cwds \
        WHERE section_id = $1), \
    (SELECT string_agg(backend || set_at::text, ',' ORDER BY backend) FROM workspaces \
        WHERE section_id = $1), \
    (SELECT max(updated_at)::text || count(*)::text FROM targets), \
    (SELECT count(*)::text || '.' || coalesce(max(id), 0)::text FROM memory_notes \
        WHERE chat_id = $2), \
    date_trunc('minute', now())::text))";

/// The prompt for this step: the cached one when neither the place nor the fingerprint
/// changed, else built afresh. The two are read at the same time; a failed fingerprint read
/// just builds afresh.
pub async fn system_prompt(deps: &AgentDeps, section: &str, chat_id: &str) -> String {
    let (place, fingerprint) = tokio::join!(deps.bindings.place(section), async {
        sqlx::query_scalar::<_, String>(FINGERPRINT)
            .bind(section)
            .bind(chat_id)
            .fetch_one(&deps.db)
            .await
            .ok()
    });
    if let (Ok(p), Some(f)) = (&place, &fingerprint)
        && let Some((cp, cf, prompt)) = deps
            .prompts
            .inner
            .lock()
            .expect("prompt cache")
            .get(section)
        && cp == p
        && cf == f
    {
        return prompt.clone();
    }
    let built_for = place.as_ref().ok().cloned();
    let prompt = build(deps, section, chat_id, place).await;
    if let (Some(f), Some(p)) = (fingerprint, built_for) {
        let mut cache = deps.prompts.inner.lock().expect("prompt cache");
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(section.to_string(), (p, f, prompt.clone()));
    }
    prompt
}

/// Builds the prompt. A part that cannot be read says so instead of failing the step.
async fn build(
    deps: &AgentDeps,
    section: &str,
    chat_id: &str,
    place: anyhow::Result<Place>,
) -> String {
    let backend = match &place {
        Ok(Place::Local) => {
            "the local backend: a sandboxed workspace on the service's own machine".to_string()
        }
        Ok(Place::Target(alias)) => match crate::target::get(&deps.db, alias).await {
            Ok(t) => format!(
                "the SSH target `{alias}` ({}@{}{}{})",
                t.user,
                t.host,
                if t.port == 22 {
                    String::new()
                } else {
                    format!(":{}", t.port)
                },
                t.via()
            ),
            Err(_) => {
                format!("the SSH target `{alias}` (not registered now: task tools will fail)")
            }
        },
        Err(e) => format!("unknown right now ({e}); task tools will fail until it is resolved"),
    };
    // The workspace, read with the stored working directory on this backend.
    let ws = match &place {
        Ok(p) => Some(crate::workspace::current(&deps.db, &deps.workspaces, section, p).await),
        Err(_) => None,
    };
    let cwd = ws
        .as_ref()
        .and_then(|r| r.as_ref().ok())
        .and_then(|w| w.cwd.clone());
    let workspace = match ws {
        Some(Ok(ws)) => format!(
            "Your workspace is `{}` on this backend; work there unless the user asks otherwise. Its permission, enforced by the tools before anything runs, is {}\n{}\nOnly a user changes these (`/workspace set <dir> [read|read-write|full] [office|dev|design]`, up to the maximum an operator allows); if a refusal blocks the task, say which permission it needs.",
            ws.dir,
            ws.permission_guidance(),
            ws.mode.guidance()
        ),
        Some(Err(e)) => {
            format!("unknown right now ({e}); task tools will fail until it is resolved.")
        }
        None => "unknown until the backend is known.".to_string(),
    };
    let ssh = match deps
        .bindings
        .ssh_mode(section, chat_id, SshModeAction::Status, None)
        .await
    {
        Ok(s) => s,
        Err(e) => format!("(status unavailable: {e})"),
    };
    format!(
        "You are sshmode, an engineering assistant working in a team chat thread. You do the work \
yourself with your tools and then answer briefly in Markdown.\n\n\
## Where your task tools run\n\
This thread's backend is {backend}. The task tools (terminal, read_file, write_file, patch, \
search_files, execute_code) run there, resolved again at every call. Paths are on that host: \
`~` is that user's home; relative paths are relative to the working directory{cwd}. \
If the backend fails, the tool fails with the reason; nothing runs anywhere else instead.\n\n\
## Workspace\n\
{workspace}\n\n\
## Switching backends\n\
`ssh_mode` asks chat control: `status`, `list_targets`, `request_use` with a `target` \
(allowed only where the users granted it with `/ssh yolo on`), `request_local`. A refusal is \
final for this turn; tell the user what they can do (for example `/ssh use <alias>`). \
Current state: {ssh}\n\n\
## The control plane\n\
Memory and skills belong to the service's local control plane, never to the backend, and \
are the same whatever the backend. Do not look for them on the target. `memory` keeps short \
notes for this chat (add, list, remove); `skills` lists, views and manages this chat's \
runbooks (shared ones, which an admin made visible to every chat, are read-only). Before remote work, view the built-in `ssh-mode` skill; after it, update \
notes and skills with what you learned. Never store secrets in either.\n\n\
## Rules\n\
Check before you change. Never repeat a command whose outcome is unknown without checking \
its effect first. Keep answers short: what you did, what you found, what is left.{notes}",
        notes = match deps.plane.prompt_notes(chat_id).await {
            Ok(b) if b.is_empty() => String::new(),
            Ok(b) => format!("\n\n{b}"),
            Err(e) => format!("\n\n(the notes of this chat cannot be read now: {e})"),
        },
        cwd = match cwd {
            Some(d) => format!(" (now `{d}`)"),
            None => String::new(),
        },
    )
}
