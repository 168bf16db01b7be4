//! Stored content's lifecycle: retention enforced on old rows and files (new ones kept),
//! `sshmode erase` for a chat and for a person (audit facts kept, content gone).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sqlx::PgPool;
use sshmode::config::RetentionConfig;
use sshmode::lifecycle::{self, Roots};

use crate::helpers::{TestApp, audit_rows_mentioning};

/// A turn of `section` in `chat`, started `days_ago`.
async fn turn(db: &PgPool, section: &str, chat: &str, days_ago: i32) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO turns (section_id, chat_id, state, started_at)
         VALUES ($1, $2, 'done', now() - make_interval(days => $3)) RETURNING id",
    )
    .bind(section)
    .bind(chat)
    .bind(days_ago)
    .fetch_one(db)
    .await
    .unwrap()
}

/// A message `text` from `sender` as every table keeps it: the event log, the turn request,
/// the conversation's user row — `days_ago`.
async fn message(
    db: &PgPool,
    section: &str,
    chat: &str,
    message_id: &str,
    sender: &str,
    text: &str,
    days_ago: i32,
) -> i64 {
    let turn = turn(db, section, chat, days_ago).await;
    sqlx::query(
        "INSERT INTO session_events (section_id, seq, at, kind, payload)
         SELECT $1, COALESCE(MAX(seq), 0) + 1, now() - make_interval(days => $5), 'message.received',
                jsonb_build_object('message_id', $2::text, 'sender', $3::text, 'text', $4::text,
                                   'chat_id', $6::text)
           FROM session_events WHERE section_id = $1",
    )
    .bind(section)
    .bind(message_id)
    .bind(sender)
    .bind(text)
    .bind(days_ago)
    .bind(chat)
    .execute(db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO turn_requests (section_id, message_id, chat_id, sender, text, in_thread,
                                    created_at, turn_id)
         VALUES ($1, $2, $3, $4, $5, false, now() - make_interval(days => $6), $7)",
    )
    .bind(section)
    .bind(message_id)
    .bind(chat)
    .bind(sender)
    .bind(text)
    .bind(days_ago)
    .bind(turn)
    .execute(db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO agent_messages (section_id, turn_id, kind, message, bytes, at)
         VALUES ($1, $2, 'user', jsonb_build_object('role', 'user', 'content', $3::text), 10,
                 now() - make_interval(days => $4))",
    )
    .bind(section)
    .bind(turn)
    .bind(text)
    .bind(days_ago)
    .execute(db)
    .await
    .unwrap();
    turn
}

/// How many rows of the event log, the conversation and the turn requests still hold `text`.
async fn holding(db: &PgPool, text: &str) -> (i64, i64, i64) {
    let count = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .bind(text)
            .fetch_one(db)
            .await
            .unwrap()
    };
    (
        count("SELECT count(*) FROM session_events WHERE strpos(payload::text, $1) > 0").await,
        count("SELECT count(*) FROM agent_messages WHERE strpos(message::text, $1) > 0").await,
        count("SELECT count(*) FROM turn_requests WHERE strpos(text, $1) > 0").await,
    )
}

/// A file at `path` (its directories made), modified `days_ago`.
fn file(path: &Path, days_ago: u64) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, b"data").unwrap();
    age(path, days_ago);
    path.to_path_buf()
}

fn age(path: &Path, days_ago: u64) {
    let t = SystemTime::now() - Duration::from_secs(days_ago * 24 * 3600);
    std::fs::File::open(path).unwrap().set_modified(t).unwrap();
}

async fn placed(db: &PgPool, message_id: &str, section: &str, path: &Path, days_ago: i32) {
    lifecycle::record_file(
        db,
        message_id,
        section,
        "local",
        &path.display().to_string(),
    )
    .await
    .unwrap();
    sqlx::query(
        "UPDATE message_files SET placed_at = now() - make_interval(days => $2) WHERE path = $1",
    )
    .bind(path.display().to_string())
    .bind(days_ago)
    .execute(db)
    .await
    .unwrap();
}

#[tokio::test]
async fn retention_deletes_old_rows_files_and_idle_workspaces_and_keeps_the_rest() {
    let app = TestApp::spawn().await;
    let db = &app.state.db;
    let roots = Roots::of(&app.state.config);
    message(db, "oc_r", "oc_r", "om_old", "ou_a", "old words", 10).await;
    message(db, "oc_r", "oc_r", "om_new", "ou_a", "new words", 0).await;
    let [ws_old, _] = roots.of_section("omt_idle");
    let [ws_busy, _] = roots.of_section("omt_busy");
    let [ws_fresh, _] = roots.of_section("omt_fresh");
    let old_file = file(&ws_fresh.join("attachments/old.png"), 10);
    let new_file = file(&ws_fresh.join("attachments/new.png"), 0);
    placed(db, "om_old", "omt_fresh", &old_file, 10).await;
    placed(db, "om_new", "omt_fresh", &new_file, 0).await;
    file(&ws_old.join("notes.txt"), 10);
    age(&ws_old, 10);
    file(&ws_busy.join("notes.txt"), 10);
    age(&ws_busy, 10);
    turn(db, "omt_busy", "oc_r", 0).await;

    let retention = RetentionConfig {
        eventlog_days: 5,
        inbox_days: 5,
        attachment_days: 5,
        workspace_idle_days: 5,
    };
    lifecycle::enforce(db, &retention, &roots).await;

    assert_eq!(
        holding(db, "old words").await,
        (0, 0, 0),
        "old rows deleted"
    );
    assert_eq!(holding(db, "new words").await, (1, 1, 1), "new rows kept");
    assert!(!old_file.exists(), "an old attachment is removed");
    assert!(new_file.exists(), "a new attachment is kept");
    let files: i64 = sqlx::query_scalar("SELECT count(*) FROM message_files")
        .fetch_one(db)
        .await
        .unwrap();
    assert_eq!(files, 1);
    assert!(!ws_old.exists(), "an idle workspace is removed");
    assert!(
        ws_busy.exists(),
        "a workspace whose thread ran a turn lately is kept"
    );
    assert!(ws_fresh.exists(), "a workspace changed lately is kept");

    // The append-only guard still refuses every other change.
    for sql in [
        "UPDATE session_events SET payload = '{}'",
        "DELETE FROM session_events",
        "UPDATE agent_messages SET message = '{}'",
        "DELETE FROM agent_messages",
    ] {
        let e = sqlx::query(sql).execute(db).await.unwrap_err();
        assert!(e.to_string().contains("append-only"), "{sql}: {e}");
    }
    app.stop().await;
}

async fn erase(db: &PgPool, roots: &Roots, chat: Option<&str>, person: Option<&str>) -> String {
    let mut out = Vec::new();
    let code = lifecycle::cli::run_with(
        lifecycle::cli::EraseArgs {
            chat: chat.map(str::to_string),
            person: person.map(str::to_string),
        },
        db,
        "cli:ops",
        roots,
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(code, 0);
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn erase_removes_a_chats_and_a_persons_content_and_keeps_the_audit_facts() {
    let app = TestApp::spawn().await;
    let db = &app.state.db;
    let roots = Roots::of(&app.state.config);
    // Chat oc_a: a thread where ou_p asked something, a note, a command audited, a workspace.
    message(
        db,
        "omt_a1",
        "oc_a",
        "om_a1",
        "ou_p",
        "chat-a secret plan",
        0,
    )
    .await;
    sqlx::query(
        "INSERT INTO memory_notes (chat_id, section_id, content, created_by)
         VALUES ('oc_a', 'omt_a1', 'chat-a note', 'model')",
    )
    .execute(db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO audit_log (actor, action, subject, detail, section, outcome)
         VALUES ('ou_p', 'command.run', 'local', '{\"command\": \"uptime\"}', 'omt_a1', 'ok')",
    )
    .execute(db)
    .await
    .unwrap();
    let [ws_a1, _] = roots.of_section("omt_a1");
    let attachment = file(&ws_a1.join("attachments/a1.png"), 0);
    placed(db, "om_a1", "omt_a1", &attachment, 0).await;
    // Chat oc_b: ou_p and ou_q both wrote.
    message(db, "oc_b", "oc_b", "om_b1", "ou_p", "person-p words", 0).await;
    message(db, "oc_b", "oc_b", "om_b2", "ou_q", "person-q words", 0).await;

    let out = erase(db, &roots, Some("oc_a"), None).await;
    assert!(out.starts_with("erased chat oc_a\n"), "{out}");
    assert!(out.contains("sections: "), "{out}");
    assert!(
        out.contains(&format!("removed {}", ws_a1.display())),
        "{out}"
    );
    assert_eq!(holding(db, "chat-a secret plan").await, (0, 0, 0));
    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM memory_notes WHERE chat_id = 'oc_a'")
        .fetch_one(db)
        .await
        .unwrap();
    assert_eq!(notes, 0);
    assert!(!ws_a1.exists() && !attachment.exists());
    let facts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'command.run' AND section = 'omt_a1'",
    )
    .fetch_one(db)
    .await
    .unwrap();
    assert_eq!(facts, 1, "who ran what where stays");
    assert_eq!(
        holding(db, "person-p words").await,
        (1, 1, 1),
        "other chats untouched"
    );

    let out = erase(db, &roots, None, Some("ou_p")).await;
    assert!(out.starts_with("erased person ou_p\n"), "{out}");
    assert_eq!(holding(db, "person-p words").await, (0, 0, 0));
    assert_eq!(
        holding(db, "person-q words").await,
        (1, 1, 1),
        "another person's messages stay"
    );
    assert_eq!(
        holding(db, lifecycle::ERASED).await.2,
        2,
        "rows stay, text gone"
    );
    let erasures: Vec<(String, String)> = sqlx::query_as(
        "SELECT actor, subject FROM audit_log WHERE action = 'content.erase' ORDER BY id",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert_eq!(
        erasures,
        vec![
            ("cli:ops".to_string(), "oc_a".to_string()),
            ("cli:ops".to_string(), "ou_p".to_string())
        ]
    );
    for secret in ["chat-a secret plan", "person-p words", "chat-a note"] {
        assert_eq!(audit_rows_mentioning(db, secret).await, 0, "{secret}");
    }
    app.stop().await;
}
