//! Stored content's lifecycle: retention enforced on old rows and files (new ones kept),
//! `sshmode erase` for a chat and for a person (audit facts kept, content gone).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sqlx::PgPool;
use sshmode::config::RetentionConfig;
use sshmode::lifecycle::{self, Roots};

use crate::helpers::{TestApp, audit_rows_mentioning, eventually};
use crate::lark_support::{
    Msg, TOKEN, chat_event, post, recalled, sealed_now, users_removed, wait_state,
};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

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

/// Sends `v` signed now and waits until the inbox has handled it.
async fn deliver(app: &TestApp, event_id: &str, v: &serde_json::Value) {
    let (status, body) = post(app, sealed_now(v)).await;
    assert_eq!(status, 200, "{body}");
    wait_state(app, event_id, "done").await;
}

/// Rows anywhere the service keeps content (event log, conversation, summaries, turn
/// requests, the inbox, audit details) that hold `text`.
async fn stored_anywhere(db: &PgPool, text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (table, sql) in [
        (
            "session_events",
            "SELECT count(*) FROM session_events WHERE strpos(payload::text, $1) > 0",
        ),
        (
            "agent_messages",
            "SELECT count(*) FROM agent_messages WHERE strpos(message::text, $1) > 0",
        ),
        (
            "agent_summaries",
            "SELECT count(*) FROM agent_summaries WHERE strpos(summary, $1) > 0",
        ),
        (
            "turn_requests",
            "SELECT count(*) FROM turn_requests WHERE strpos(text, $1) > 0",
        ),
        (
            "inbox_events",
            "SELECT count(*) FROM inbox_events WHERE strpos(payload::text, $1) > 0",
        ),
        (
            "audit_log",
            "SELECT count(*) FROM audit_log WHERE strpos(detail::text, $1) > 0",
        ),
    ] {
        let n: i64 = sqlx::query_scalar(sql)
            .bind(text)
            .fetch_one(db)
            .await
            .unwrap();
        if n > 0 {
            found.push(format!("{table}: {n}"));
        }
    }
    found
}

#[tokio::test]
async fn a_message_recalled_before_or_while_it_is_handled_is_dropped_or_stopped_and_erased() {
    use crate::agent::{Env, MODEL, call, reactions, say, wait_turns_ended};
    let env = Env::builder().chat_control().spawn().await;
    let (app, db) = (&env.app, &env.app.state.db);
    // The first message's turn runs a command that waits; the second waits behind it.
    env.llm.push(
        MODEL,
        call(
            "terminal",
            json!({"command": "while [ ! -f go ]; do sleep 0.05; done"}),
        ),
    );
    let m1 = Msg::new("ev_m1", "deploy with password hunter2-one");
    deliver(app, "ev_m1", &m1.envelope(TOKEN)).await;
    eventually("the first turn's tool to start", WAIT, async || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM agent_messages WHERE section_id = 'oc_chat' AND kind = 'tool_started'",
        )
        .fetch_one(db)
        .await
        .unwrap()
            > 0
    })
    .await;
    let m2 = Msg::new("ev_m2", "and the token is hunter2-two");
    deliver(app, "ev_m2", &m2.envelope(TOKEN)).await;
    eventually("the waiting message's receipt", WAIT, async || {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT receipt_reaction FROM turn_requests WHERE message_id = 'om_ev_m2'",
        )
        .fetch_optional(db)
        .await
        .unwrap()
        .flatten()
        .is_some()
    })
    .await;

    // Recalled before it was handled: dropped, its receipt taken off, its text gone.
    deliver(app, "ev_r2", &recalled("ev_r2", "om_ev_m2", "oc_chat")).await;
    let (dropped, text): (bool, String) = sqlx::query_as(
        "SELECT dropped_at IS NOT NULL, text FROM turn_requests WHERE message_id = 'om_ev_m2'",
    )
    .fetch_one(db)
    .await
    .unwrap();
    assert!(dropped);
    assert_eq!(text, lifecycle::RECALLED);
    assert!(
        env.lark
            .requests_to("/messages/om_ev_m2/reactions/")
            .iter()
            .any(|r| r.method == "DELETE"),
        "the receipt is taken off"
    );
    assert_eq!(
        stored_anywhere(db, "hunter2-two").await,
        Vec::<String>::new()
    );

    // Recalled while its turn runs: stopped as by /stop, and erased.
    deliver(app, "ev_r1", &recalled("ev_r1", "om_ev_m1", "oc_chat")).await;
    assert_eq!(wait_turns_ended(app, "oc_chat", 1).await, vec!["stopped"]);
    assert_eq!(
        stored_anywhere(db, "hunter2-one").await,
        Vec::<String>::new()
    );

    // Recalled before its message arrived: the message is never handled.
    deliver(app, "ev_r3", &recalled("ev_r3", "om_ev_m3", "oc_chat")).await;
    let m3 = Msg::new("ev_m3", "one more secret hunter2-three");
    deliver(app, "ev_m3", &m3.envelope(TOKEN)).await;
    let requests: i64 =
        sqlx::query_scalar("SELECT count(*) FROM turn_requests WHERE message_id = 'om_ev_m3'")
            .fetch_one(db)
            .await
            .unwrap();
    assert_eq!(requests, 0, "a message recalled first is not handled");
    assert!(reactions(&env.lark, "om_ev_m3").is_empty());
    assert_eq!(
        stored_anywhere(db, "hunter2-three").await,
        Vec::<String>::new()
    );

    // A recall is an event of its own: delivered again, it changes nothing; and it is never
    // taken for a redelivery of the message it names.
    deliver(app, "ev_r1", &recalled("ev_r1", "om_ev_m1", "oc_chat")).await;
    let recalls: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM inbox_events WHERE event_type = 'im.message.recalled_v1'",
    )
    .fetch_one(db)
    .await
    .unwrap();
    assert_eq!(recalls, 3);

    // A later turn's model context holds none of it.
    env.llm.push(MODEL, say("ok"));
    let m4 = Msg::new("ev_m4", "what now?");
    deliver(app, "ev_m4", &m4.envelope(TOKEN)).await;
    wait_turns_ended(app, "oc_chat", 2).await;
    let sent = env.llm.requests().last().unwrap().body.to_string();
    assert!(!sent.contains("hunter2"), "{sent}");
    assert!(sent.contains(lifecycle::RECALLED), "{sent}");
    // The audit trail keeps that it happened, not what it said.
    let redactions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'content.redact'")
            .fetch_one(db)
            .await
            .unwrap();
    assert!(redactions >= 3, "{redactions}");
}

/// Runs `sql` (seeding a test's state).
async fn exec(db: &PgPool, sql: &str) {
    sqlx::query(sql).execute(db).await.unwrap();
}

async fn count(db: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db).await.unwrap()
}

#[tokio::test]
async fn the_bot_removed_or_the_chat_disbanded_leaves_nothing_running_or_granted() {
    use crate::agent::{Env, MODEL, call, replies_to, wait_turns_ended};
    let env = Env::builder().chat_control().spawn().await;
    let (app, db) = (&env.app, &env.app.state.db);
    env.llm.push(
        MODEL,
        call(
            "terminal",
            json!({"command": "while [ ! -f go ]; do sleep 0.05; done"}),
        ),
    );
    let mut m = Msg::new("ev_g1", "@_user_1 run the long thing");
    m.chat_type = "group";
    m.mention_bot = true;
    m.chat_id = "oc_g".into();
    m.thread_id = Some("omt_g1".into());
    m.root_id = Some("om_groot".into());
    deliver(app, "ev_g1", &m.envelope(TOKEN)).await;
    eventually("the turn's tool to start", WAIT, async || {
        count(
            db,
            "SELECT count(*) FROM agent_messages WHERE section_id = 'omt_g1' AND kind = 'tool_started'",
        )
        .await
            > 0
    })
    .await;
    let turn: i64 = count(db, "SELECT id FROM turns WHERE section_id = 'omt_g1'").await;
    exec(
        db,
        "INSERT INTO bindings (section, alias, kind, owner, bound_at, chat_id)
               VALUES ('omt_g1', 'web', 'sticky', 'ou_user', now(), 'oc_g')",
    )
    .await;
    exec(
        db,
        "INSERT INTO grants (section, scope, granted_by, granted_at, expires_at)
               VALUES ('omt_g1', 'web', 'ou_user', now(), now() + interval '1 hour')",
    )
    .await;
    exec(
        db,
        "INSERT INTO schedules (chat_id, section_id, root_message_id, in_thread, spec, tz,
                                      prompt, creator, created_at, next_due)
               VALUES ('oc_g', 'omt_g1', 'om_groot', true, 'every 1h', 'UTC', 'check', 'ou_user',
                       now(), now() + interval '1 hour')",
    )
    .await;
    exec(
        db,
        &format!(
            "INSERT INTO call_approvals (turn_id, call_key, section_id, state, scope,
                         command, thread_until, reason, location, cwd, requester, approvers,
                         deadline, decided_by)
               VALUES ({turn}, 'k1', 'omt_g1', 'allowed', 'thread', 'ls', now() + interval '1 hour',
                       'r', 'local', '/', 'ou_user', 'requester', now() + interval '1 hour',
                       'ou_user')"
        ),
    )
    .await;

    deliver(
        app,
        "ev_bot_out",
        &chat_event(
            "ev_bot_out",
            "im.chat.member.bot.deleted_v1",
            "oc_g",
            "ou_owner",
        ),
    )
    .await;
    assert_eq!(wait_turns_ended(app, "omt_g1", 1).await, vec!["stopped"]);
    assert_eq!(
        count(db, "SELECT count(*) FROM bindings WHERE chat_id = 'oc_g'").await,
        0
    );
    assert_eq!(
        count(
            db,
            "SELECT count(*) FROM grants WHERE section = 'omt_g1' AND closed_at IS NULL"
        )
        .await,
        0
    );
    assert_eq!(
        count(db, "SELECT count(*) FROM call_approvals WHERE section_id = 'omt_g1' AND thread_until > now()").await,
        0,
        "allowances end"
    );
    assert_eq!(
        count(
            db,
            "SELECT count(*) FROM schedules WHERE chat_id = 'oc_g' AND paused_at IS NULL"
        )
        .await,
        0,
        "schedules pause"
    );
    for action in ["binding.release", "grant.revoke", "schedule.pause"] {
        assert_eq!(
            count(db, &format!("SELECT count(*) FROM audit_log WHERE actor = 'system' AND action = '{action}' AND section = 'omt_g1'")).await,
            1,
            "{action}"
        );
    }
    // Nothing is posted there again: the stopped turn's answer is not sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(replies_to(&env.lark, "om_ev_g1").is_empty());
    assert!(lifecycle::is_departed(db, "oc_g").await.unwrap());
    // Added back, it starts clean.
    deliver(
        app,
        "ev_bot_in",
        &chat_event(
            "ev_bot_in",
            "im.chat.member.bot.added_v1",
            "oc_g",
            "ou_owner",
        ),
    )
    .await;
    assert!(!lifecycle::is_departed(db, "oc_g").await.unwrap());
    assert_eq!(
        count(db, "SELECT count(*) FROM bindings WHERE chat_id = 'oc_g'").await,
        0
    );

    // A chat disbanded ends the same way.
    exec(
        db,
        "INSERT INTO bindings (section, alias, kind, owner, bound_at, chat_id)
               VALUES ('oc_d', 'web', 'sticky', 'ou_user', now(), 'oc_d')",
    )
    .await;
    deliver(
        app,
        "ev_gone",
        &chat_event("ev_gone", "im.chat.disbanded_v1", "oc_d", "ou_owner"),
    )
    .await;
    assert_eq!(
        count(db, "SELECT count(*) FROM bindings WHERE chat_id = 'oc_d'").await,
        0
    );
    assert!(lifecycle::is_departed(db, "oc_d").await.unwrap());
}

#[tokio::test]
async fn a_person_removed_loses_their_allowances_approvals_and_schedules_there() {
    use crate::agent::Env;
    let env = Env::builder().chat_control().spawn().await;
    let (app, db) = (&env.app, &env.app.state.db);
    let turn: i64 = count(
        db,
        "INSERT INTO turns (section_id, chat_id, state) VALUES ('omt_p', 'oc_p', 'done') RETURNING id",
    )
    .await;
    for (key, who, state) in [
        ("a_p", "ou_p", "allowed"),
        ("a_q", "ou_q", "allowed"),
        ("w_p", "ou_p", "waiting"),
    ] {
        let (scope, decided) = if state == "allowed" {
            ("'thread'", format!("'{who}'"))
        } else {
            ("NULL", "NULL".to_string())
        };
        exec(db, &format!("INSERT INTO call_approvals (turn_id, call_key, section_id, state, scope,
                             command, thread_until, reason, location, cwd, requester, approvers,
                             deadline, decided_by)
                   VALUES ({turn}, '{key}', 'omt_p', '{state}', {scope}, 'ls', now() + interval '1 hour',
                           'r', 'local', '/', '{who}', 'requester', now() + interval '1 hour',
                           {decided})")).await;
    }
    for who in ["ou_p", "ou_q"] {
        exec(
            db,
            &format!(
                "INSERT INTO grants (section, scope, granted_by, granted_at, expires_at)
                   VALUES ('omt_p', 'web-{who}', '{who}', now(), now() + interval '1 hour')"
            ),
        )
        .await;
        exec(
            db,
            &format!(
                "INSERT INTO schedules (chat_id, section_id, root_message_id, in_thread,
                             spec, tz, prompt, creator, created_at, next_due)
                   VALUES ('oc_p', 'omt_p', 'om_proot', true, 'every 1h', 'UTC', 'check', '{who}',
                           now(), now() + interval '1 hour')"
            ),
        )
        .await;
    }

    deliver(
        app,
        "ev_left",
        &users_removed("ev_left", "oc_p", "ou_owner", &["ou_p"]),
    )
    .await;

    let live = |who: &str| {
        format!(
            "SELECT count(*) FROM call_approvals WHERE decided_by = '{who}' AND thread_until > now()"
        )
    };
    assert_eq!(count(db, &live("ou_p")).await, 0, "their allowances end");
    assert_eq!(count(db, &live("ou_q")).await, 1, "others' stay");
    assert_eq!(
        count(
            db,
            "SELECT count(*) FROM call_approvals WHERE call_key = 'w_p' AND deadline > now()"
        )
        .await,
        0,
        "their pending approval lapses"
    );
    assert_eq!(
        count(db, "SELECT count(*) FROM grants WHERE closed_at IS NULL").await,
        1,
        "only the other person's grant is open"
    );
    let paused: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT creator, paused_reason FROM schedules ORDER BY creator")
            .fetch_all(db)
            .await
            .unwrap();
    assert_eq!(paused[0].0, "ou_p");
    assert!(
        paused[0]
            .1
            .as_deref()
            .unwrap_or_default()
            .contains("left the chat"),
        "{paused:?}"
    );
    assert_eq!(paused[1], ("ou_q".to_string(), None));
    let said: Vec<String> = env
        .lark
        .requests_to("/messages/om_proot/reply")
        .iter()
        .map(|r| crate::fake_lark::message_text(r.body["content"].as_str().unwrap()))
        .collect();
    assert!(
        said.iter()
            .any(|t| t.contains("is paused") && t.contains("left the chat")),
        "{said:?}"
    );
}

/// The bot removed from a chat while a replica holds the chat's interactive shell on a target
/// and a running turn, the event handled by whichever replica takes it: the shell closes
/// (audited, by `system`, with the reason), the turn stops, its progress card is written no
/// more, and the pooled connections to the target, which nothing else binds, close.
#[tokio::test]
async fn a_chat_the_bot_left_keeps_no_shell_connection_or_card_on_any_replica() {
    use crate::agent::{Env, MODEL, call, say, wait_turns_ended};
    use sshmode::exec::Place;
    use sshmode::workspace::{self, Choice, LocalRules, Permission};
    let env = Env::builder()
        .chat_control()
        .progress()
        .target("web")
        .spawn()
        .await;
    let (app, db) = (&env.app, &env.app.state.db);
    let group = |id: &str, text: &str, thread: Option<&str>| {
        let mut m = Msg::new(id, &format!("@_user_1 {text}"));
        m.chat_type = "group";
        m.mention_bot = true;
        m.chat_id = "oc_left".into();
        if let Some(t) = thread {
            m.thread_id = Some(t.into());
            m.root_id = Some("om_use".into());
        }
        m
    };
    deliver(
        app,
        "use",
        &group("use", "/ssh use web", None).envelope(TOKEN),
    )
    .await;
    let web = Place::Target("web".into());
    assert_eq!(
        sshmode::chat::binding::resolve_place(db, "omt_use", app.state.clock.now())
            .await
            .unwrap(),
        web
    );
    let mut out = Vec::new();
    let set = sshmode::target::cli::run_with(
        sshmode::target::cli::TargetCmd::Set(sshmode::target::cli::SetArgs {
            permission: Some(Permission::Full),
            risky: Some(sshmode::config::Risky::Allow),
            ..crate::exec_ssh::set_args("web")
        }),
        &app.state.config,
        db,
        &mut std::io::Cursor::new(Vec::new()),
        &mut out,
    )
    .await
    .unwrap();
    assert_eq!(set, 0, "{}", String::from_utf8_lossy(&out));
    let choice = Choice {
        dir: "~".into(),
        permission: Some(Permission::Full),
        mode: None,
    };
    let rules = LocalRules::from_config(&app.state.config.exec);
    workspace::set(db, &rules, "ou_user", "omt_use", &web, &choice)
        .await
        .unwrap()
        .unwrap_or_else(|why| panic!("workspace refused: {why}"));
    env.llm
        .push(MODEL, call("shell_open", json!({})))
        .push(MODEL, say("open"));
    deliver(
        app,
        "t1",
        &group("t1", "open a shell", Some("omt_use")).envelope(TOKEN),
    )
    .await;
    assert_eq!(wait_turns_ended(app, "omt_use", 1).await, vec!["done"]);
    assert_eq!(
        app.state.exec.shells.list("omt_use").len(),
        1,
        "{:?}",
        crate::agent::tool_results(&env.llm)
    );
    // A long command keeps a turn, and its progress card, running.
    env.llm
        .push(MODEL, call("terminal", json!({"command": "sleep 600"})))
        .push(MODEL, say("never reached"));
    deliver(
        app,
        "t2",
        &group("t2", "wait a while", Some("omt_use")).envelope(TOKEN),
    )
    .await;
    eventually("the remote sleep and a progress card", WAIT, async || {
        count(
            db,
            "SELECT count(*) FROM agent_messages WHERE section_id = 'omt_use' AND kind = 'tool_started'",
        )
        .await
            > 1
            && !env.lark.requests_to("/cardkit/").is_empty()
    })
    .await;
    assert!(app.state.exec.ssh.connection_counts().await["web"] >= 1);
    // A second replica joins: the event may be handled by either; what the first holds must
    // end either way.
    let other = crate::lark_support::app_with(&env.lark)
        .var("LLM_BASE_URL", &env.llm.base)
        .var("LLM_MODEL", MODEL)
        .var("SSHMODE_PROGRESS", "false")
        .var(
            "SSHMODE_MASTER_KEY_FILE",
            &app.state.config.master_key_file.display().to_string(),
        )
        .database(&app.db_url)
        .spawn()
        .await;

    deliver(
        &other,
        "ev_left",
        &chat_event(
            "ev_left",
            "im.chat.member.bot.deleted_v1",
            "oc_left",
            "ou_owner",
        ),
    )
    .await;
    let card_writes = || {
        env.lark.requests_to("/cardkit/").len()
            + env
                .lark
                .requests()
                .iter()
                .filter(|r| r.method == "PATCH" && r.path.contains("/im/v1/messages/"))
                .count()
    };
    assert_eq!(
        wait_turns_ended(app, "omt_use", 2).await,
        vec!["done", "stopped"]
    );
    let at_end = card_writes();
    eventually(
        "the shell closed on the replica holding it",
        WAIT,
        async || app.state.exec.shells.list("omt_use").is_empty(),
    )
    .await;
    eventually("the shell's close audited", WAIT, async || {
        count(
            db,
            "SELECT count(*) FROM audit_log WHERE action = 'shell.close' AND actor = 'system'
               AND section = 'omt_use' AND detail::text LIKE '%the bot was removed from this chat%'",
        )
        .await
            == 1
    })
    .await;
    eventually("the pooled connections closed", WAIT, async || {
        app.state
            .exec
            .ssh
            .connection_counts()
            .await
            .get("web")
            .copied()
            .unwrap_or(0)
            == 0
    })
    .await;
    assert!(other.state.exec.shells.list("omt_use").is_empty());
    assert_eq!(
        other
            .state
            .exec
            .ssh
            .connection_counts()
            .await
            .get("web")
            .copied()
            .unwrap_or(0),
        0
    );
    // The stopped turn's card is not closed or replaced: nothing is written there again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(card_writes(), at_end, "card writes after the bot left");
    assert!(
        env.lark
            .requests_to("/reply")
            .iter()
            .all(|r| !r.body.to_string().contains("never reached"))
    );
}
