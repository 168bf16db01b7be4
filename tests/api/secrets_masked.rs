//! Secrets masked (issue 46) end to end: a command prints secrets of every detector family, a
//! target's vaulted password in base64 and hex and the master key in base64; the model's
//! request, the progress card, the event log and the stored transcript see only masks, the
//! audit row counts them by kind, and so does `/metrics`. A mask the model writes into a
//! command stays text: nothing puts a secret back for it.

use base64::Engine as _;
use serde_json::json;
use sshmode::exec::Place;
use sshmode::target::{self, HostKeyPolicy, NewSecrets, NewTarget};
use zeroize::Zeroizing;

use crate::agent::{Env, MODEL, accept, call, say, tool_results, unique, wait_turns_ended};

const PASSWORD: &str = "Pl4in-vault-secret-46";

/// Secrets of each family, with the kind each is masked as.
fn families() -> Vec<(&'static str, String)> {
    vec![
        ("aws-access-key-id", "AKIAZCOJCBEUDBISVFZ6".into()),
        ("github-token", "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789".into()),
        ("gitlab-token", "glpat-x8Yz3kLmN0pQrStUvW12".into()),
        (
            "slack-token",
            "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx".into(),
        ),
        ("api-key", "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12".into()),
        (
            "jwt",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U".into(),
        ),
        ("url-password", "Hunter2-in-a-url".into()),
        ("password", "Winter-river-2044!".into()),
        ("authorization", "YWRtaW46SHVudGVyMnBhc3M=".into()),
        (
            "private-key",
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW".into(),
        ),
    ]
}

/// What the command prints: each family in the context a command would print it.
fn printed(master_key_b64: &str) -> String {
    let f = families();
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "AWS_ACCESS_KEY_ID={}\n\
         origin\thttps://{}@github.com/acme/infra.git (fetch)\n\
         CI_JOB_TOKEN={}\n\
         SLACK_BOT_TOKEN={}\n\
         OPENAI_API_KEY={}\n\
         set-cookie: session={}; Path=/\n\
         DATABASE_URL=postgres://app:{}@db.internal:5432/app\n\
         \x20 db_password: \"{}\"\n\
         > Authorization: Basic {}\n\
         -----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----\n\
         vaulted b64 {}\n\
         vaulted hex {}\n\
         key file {}\n\
         commit 64a383b4b8c5e1f0a9d2c3b4e5f60718293a4b5c stays\n",
        f[0].1,
        f[1].1,
        f[2].1,
        f[3].1,
        f[4].1,
        f[5].1,
        f[6].1,
        f[7].1,
        f[8].1,
        f[9].1,
        b64.encode(PASSWORD),
        hex::encode(PASSWORD),
        master_key_b64,
    )
}

/// Every secret the command prints, as written.
fn secrets(master_key_b64: &str) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut all: Vec<String> = families().into_iter().map(|(_, s)| s).collect();
    all.push(b64.encode(PASSWORD));
    all.push(hex::encode(PASSWORD));
    all.push(master_key_b64.to_string());
    all
}

async fn with_vaulted_password(env: &Env) -> String {
    let key_file = &env.app.state.config.master_key_file;
    let vault = sshmode::vault::Vault::open_or_create(key_file).unwrap();
    target::add(
        &env.app.state.db,
        &vault,
        NewTarget {
            alias: "db".into(),
            host: "db.example".into(),
            port: 22,
            user: "ops".into(),
            description: None,
            secrets: NewSecrets::Password(Zeroizing::new(PASSWORD.into())),
            host_key_policy: HostKeyPolicy::Tofu,
            host_key: None,
            approve: true,
            jump: None,
        },
        "cli",
    )
    .await
    .unwrap();
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(key_file).unwrap())
}

#[tokio::test]
async fn every_family_is_masked_for_the_model_the_card_the_event_log_and_the_audit() {
    let env = Env::builder().progress().spawn().await;
    let master = with_vaulted_password(&env).await;
    let thread = unique("omt_mask");
    env.control.bind(&thread, Place::Local);
    // Decoded on the host, so the command's own text holds none of the secrets.
    let payload = base64::engine::general_purpose::STANDARD.encode(printed(&master));
    let command = format!("echo {payload} | base64 -d; sleep 1");
    env.llm
        .push(MODEL, call("terminal", json!({ "command": command })))
        .push(MODEL, say("checked"));
    accept(&env.app, &thread, &unique("om_mask"), "show the settings").await;
    assert_eq!(wait_turns_ended(&env.app, &thread, 1).await, vec!["done"]);

    // The model: every value masked, with its kind and a tag; the ordinary line as it was.
    let results = tool_results(&env.llm).join("\n");
    for s in secrets(&master) {
        assert!(!results.contains(&s), "{s} reached the model: {results}");
    }
    for (kind, _) in families() {
        assert!(
            results.contains(&format!("[secret: {kind} #")),
            "{kind}: {results}"
        );
    }
    for kind in ["target-password", "master-key"] {
        assert!(
            results.contains(&format!("[secret: {kind} #")),
            "{kind}: {results}"
        );
    }
    assert!(results.contains("commit 64a383b4b8c5e1f0a9d2c3b4e5f60718293a4b5c stays"));
    // The two encodings of one vaulted password carry one tag.
    let tags: Vec<&str> = results
        .match_indices("[secret: target-password #")
        .map(|(i, m)| &results[i + m.len()..i + m.len() + 4])
        .collect();
    assert_eq!(tags.len(), 2, "{results}");
    assert_eq!(tags[0], tags[1], "{results}");

    // The card, the event log and the stored transcript.
    let card: Vec<String> = env
        .lark
        .requests()
        .into_iter()
        .map(|r| r.body.to_string())
        .collect();
    let events: Vec<String> =
        sqlx::query_scalar("SELECT payload::text FROM session_events WHERE section_id = $1")
            .bind(&thread)
            .fetch_all(&env.app.state.db)
            .await
            .unwrap();
    let transcript: Vec<String> =
        sqlx::query_scalar("SELECT row_to_json(m)::text FROM agent_messages m")
            .fetch_all(&env.app.state.db)
            .await
            .unwrap();
    assert!(!events.is_empty() && !transcript.is_empty());
    for text in card.iter().chain(&events).chain(&transcript) {
        for s in secrets(&master) {
            assert!(!text.contains(&s), "{s} was stored or shown: {text}");
        }
    }
    // What later turns read back is the masked result.
    assert!(
        transcript
            .iter()
            .any(|m| m.contains("[secret: github-token #")),
        "{transcript:#?}"
    );

    // The audit row counts the masks by kind; so does /metrics.
    let detail: serde_json::Value = sqlx::query_scalar(
        "SELECT detail FROM audit_log WHERE section = $1 AND action = 'command.run'",
    )
    .bind(&thread)
    .fetch_one(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(detail["masked"]["github-token"], 1, "{detail}");
    assert_eq!(detail["masked"]["target-password"], 2, "{detail}");
    assert_eq!(detail["masked"]["private-key"], 1, "{detail}");
    let metrics = env.app.metrics().await;
    assert!(
        metrics.contains("sshmode_secrets_masked_total{kind=\"github-token\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_mask_in_a_command_is_never_expanded() {
    let env = Env::builder().spawn().await;
    with_vaulted_password(&env).await;
    let thread = unique("omt_nomask");
    env.control.bind(&thread, Place::Local);
    // The model learnt a mask and writes it into a command, as a prompt-injected one might.
    env.llm
        .push(
            MODEL,
            call(
                "terminal",
                json!({ "command": "printf 'x%sx\\n' '[secret: target-password #0000]'" }),
            ),
        )
        .push(MODEL, say("sent"));
    accept(&env.app, &thread, &unique("om_nomask"), "send it").await;
    assert_eq!(wait_turns_ended(&env.app, &thread, 1).await, vec!["done"]);
    let results = tool_results(&env.llm).join("\n");
    assert!(
        results.contains("x[secret: target-password #0000]x"),
        "the mask ran as the text it is: {results}"
    );
    assert!(!results.contains(PASSWORD), "{results}");
    let command: String = sqlx::query_scalar(
        "SELECT detail->>'command' FROM audit_log WHERE section = $1 AND action = 'command.run'",
    )
    .bind(&thread)
    .fetch_one(&env.app.state.db)
    .await
    .unwrap();
    assert!(
        command.contains("[secret: target-password #0000]"),
        "{command}"
    );
}

#[tokio::test]
async fn a_pasted_secret_reaches_the_model_in_its_turn_and_is_kept_masked() {
    let env = Env::builder().spawn().await;
    let thread = unique("omt_paste");
    env.control.bind(&thread, Place::Local);
    let pasted = "Ghx7-pasted-by-a-person-46";
    env.llm.push(MODEL, say("noted")).push(MODEL, say("again"));
    accept(
        &env.app,
        &thread,
        &unique("om_paste"),
        &format!("use DB_PASSWORD={pasted} for the import"),
    )
    .await;
    assert_eq!(wait_turns_ended(&env.app, &thread, 1).await, vec!["done"]);
    // This turn: as written.
    let first = env.llm.requests().last().unwrap().body.to_string();
    assert!(first.contains(pasted), "{first}");
    // The transcript, and so the next turn: masked.
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT message::text FROM agent_messages WHERE section_id = $1 AND kind = 'user'",
    )
    .bind(&thread)
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(stored.len(), 1);
    assert!(!stored[0].contains(pasted), "{stored:?}");
    assert!(
        stored[0].contains("DB_PASSWORD=[secret: password #"),
        "{stored:?}"
    );
    accept(&env.app, &thread, &unique("om_paste2"), "and now?").await;
    assert_eq!(
        wait_turns_ended(&env.app, &thread, 2).await,
        vec!["done", "done"]
    );
    let second = env.llm.requests().last().unwrap().body.to_string();
    assert!(!second.contains(pasted), "{second}");
    assert!(
        second.contains("DB_PASSWORD=[secret: password #"),
        "{second}"
    );
}

#[tokio::test]
async fn the_event_log_keeps_a_pasted_secret_masked() {
    use crate::lark_support::{Msg, TOKEN, app_with, post, sealed_now, wait_state};
    let fake = crate::fake_lark::FakeLark::start().await;
    let app = app_with(&fake).spawn().await;
    let pasted = "Ghx7-pasted-into-the-chat-46";
    let msg = Msg::new("ev_paste", &format!("the token: {pasted}"));
    assert_eq!(post(&app, sealed_now(&msg.envelope(TOKEN))).await.0, 200);
    wait_state(&app, "ev_paste", "done").await;
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT payload->>'text' FROM session_events WHERE kind = 'message.received'",
    )
    .fetch_all(&app.state.db)
    .await
    .unwrap();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(
        logged[0],
        "the token: [secret: token #".to_string() + &logged[0][27..]
    );
    assert!(!logged[0].contains(pasted), "{logged:?}");
    app.stop().await;
}
