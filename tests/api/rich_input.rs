//! Rich input, end to end through signed events, the fake Lark (its message and resource
//! endpoints) and the fake model: every post element reaches the model, a reply brings the
//! message it quotes (once, with its sender; an unreadable one is named; a card as its title
//! and text, bounded however hostile), a file lands in the
//! section's workspace locally and on a bound target, an image goes to a vision route as image
//! content and to another as its path, an oversize file is refused with nothing written, a
//! sticker never makes an empty turn, a forwarded bundle is expanded within its bounds (a file
//! inside named, never fetched), and images past their retention go without a new image.

use std::path::Path;

use serde_json::{Value, json};

use crate::agent::{Env, MODEL, say, turn_states, wait_turns_ended};
use crate::fake_lark::FakeLark;
use crate::fake_llm::FakeProvider;
use crate::helpers::TestApp;
use crate::lark_support::*;
use crate::sshd;

async fn send_env(app: &TestApp, env: &Value) {
    let (status, body) = post(app, sealed(env, ENCRYPT_KEY, now_secs())).await;
    assert_eq!(status, 200, "{body}");
}

async fn send(app: &TestApp, m: &Msg) {
    send_env(app, &m.envelope(TOKEN)).await;
}

/// A one-to-one message of `kind` with `content`.
fn rich(id: &str, kind: &'static str, content: Value) -> Msg {
    let mut m = Msg::new(id, "");
    m.body = Some((kind, content));
    m
}

/// The user messages of every request the model received, as sent (a string, or parts).
fn user_contents(llm: &FakeProvider) -> Vec<Value> {
    let last = llm.requests().last().cloned().expect("a model request");
    last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].clone())
        .collect()
}

/// The text of the last user message the model received.
fn last_user_text(llm: &FakeProvider) -> String {
    let c = user_contents(llm).pop().expect("a user message");
    match c {
        Value::String(s) => s,
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        other => panic!("unexpected content {other}"),
    }
}

/// The path the model was told for an attachment, from `[Attachment (…): <path> on …`.
fn told_path(text: &str) -> String {
    let start = text.find("[Attachment (").expect("an attachment line") + 1;
    let rest = &text[start..];
    let after = &rest[rest.find("): ").unwrap() + 3..];
    after[..after.find(" on ").unwrap()].to_string()
}

async fn chat_env() -> Env {
    Env::builder().chat_control().spawn().await
}

#[tokio::test]
async fn a_post_with_a_code_block_a_link_a_mention_and_an_emoji_reaches_the_model_whole() {
    let env = chat_env().await;
    env.llm.push(MODEL, say("it lists files"));
    let mut env_json = rich(
        "post1",
        "post",
        json!({"title": "", "content": [
            [{"tag": "text", "text": "what is"}],
            [{"tag": "code_block", "language": "SHELL", "text": "ls -la"}],
            [{"tag": "text", "text": "see "}, {"tag": "a", "text": "the manual", "href": "https://man.example/ls"},
             {"tag": "text", "text": ", cc "}, {"tag": "at", "user_id": "@_user_2", "user_name": "Ann"},
             {"tag": "emotion", "emoji_type": "THUMBSUP"}]
        ]}),
    )
    .envelope(TOKEN);
    env_json["event"]["message"]["mentions"] = json!([{"key": "@_user_2",
        "id": {"open_id": "ou_ann", "union_id": "on_ann"}, "name": "Ann", "tenant_key": "tk"}]);
    send_env(&env.app, &env_json).await;
    assert_eq!(wait_turns_ended(&env.app, "oc_chat", 1).await, vec!["done"]);
    assert_eq!(
        last_user_text(&env.llm),
        "what is\n```shell\nls -la\n```\n\nsee [the manual](https://man.example/ls), cc @Ann:THUMBSUP:"
    );
}

#[tokio::test]
async fn a_reply_brings_the_quoted_message_and_its_sender_once() {
    let env = chat_env().await;
    env.lark.add_message(
        "om_err",
        "text",
        json!({"text": "deploy failed: ENOSPC writing /var/lib/app"}),
        "ou_colleague",
        None,
    );
    env.llm.push(MODEL, say("the disk is full"));
    let mut m = Msg::new("ask1", "what does this mean?");
    m.parent_id = Some("om_err".into());
    m.root_id = Some("om_err".into());
    send(&env.app, &m).await;
    assert_eq!(wait_turns_ended(&env.app, "oc_chat", 1).await, vec!["done"]);
    assert_eq!(
        last_user_text(&env.llm),
        "what does this mean?\n\n[Quoted message from ou_colleague:]\n> deploy failed: ENOSPC writing /var/lib/app"
    );
    // A second reply to the same message: the quote is already in the conversation.
    env.llm.push(MODEL, say("free some space"));
    let mut m = Msg::new("ask2", "and how do I fix it?");
    m.parent_id = Some("om_err".into());
    m.root_id = Some("om_err".into());
    send(&env.app, &m).await;
    wait_turns_ended(&env.app, "oc_chat", 2).await;
    assert_eq!(last_user_text(&env.llm), "and how do I fix it?");
    let all = serde_json::to_string(&user_contents(&env.llm)).unwrap();
    assert_eq!(all.matches("ENOSPC").count(), 1, "{all}");
    assert_eq!(env.lark.requests_to("/messages/om_err").len(), 1);
}

/// A 2.0 alert card, as an alerting bot sends it.
fn alert_card() -> Value {
    json!({"schema": "2.0",
    "config": {"update_multi": true},
    "header": {"title": {"tag": "plain_text", "content": "CPU high on web-1"}, "template": "red"},
    "body": {"elements": [
        {"tag": "markdown", "content": "usage **97%** for 10 min, see [the dashboard](https://grafana.example/d/1)"},
        {"tag": "column_set", "columns": [
            {"tag": "column", "elements": [{"tag": "markdown", "content": "host: web-1"}]},
            {"tag": "column", "elements": [{"tag": "markdown", "content": "since: 12:00"}]}]},
        {"tag": "img", "img_key": "img_v3_cpu", "alt": {"tag": "plain_text", "content": ""}},
        {"tag": "button", "text": {"tag": "plain_text", "content": "Silence"},
         "behaviors": [{"type": "callback", "value": {"act": "silence"}}]}
    ]}})
}

/// A reply to a card message (msg_type `interactive`) that quotes it.
fn reply_to(event_id: &str, text: &str, parent: &str) -> Msg {
    let mut m = Msg::new(event_id, text);
    m.parent_id = Some(parent.into());
    m.root_id = Some(parent.into());
    m
}

#[tokio::test]
async fn a_reply_to_an_alert_card_brings_its_title_and_text() {
    let env = chat_env().await;
    env.lark
        .add_message("om_alert", "interactive", alert_card(), "cli_alerts", None);
    env.llm.push(MODEL, say("web-1 is busy"));
    send(
        &env.app,
        &reply_to("card1", "what should I do?", "om_alert"),
    )
    .await;
    assert_eq!(wait_turns_ended(&env.app, "oc_chat", 1).await, vec!["done"]);
    assert_eq!(
        last_user_text(&env.llm),
        "what should I do?\n\n[Quoted message from a bot (cli_alerts):]\n\
         > CPU high on web-1\n\
         > usage **97%** for 10 min, see [the dashboard](https://grafana.example/d/1)\n\
         > host: web-1\n\
         > since: 12:00\n\
         > [image]\n\
         > [button: Silence]"
    );
    // Read in the default form, once; a card's image is never asked for (Lark refuses: 234043).
    let reads = env.lark.requests_to("/messages/om_alert");
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert_eq!(reads[0].path, "/open-apis/im/v1/messages/om_alert");
    assert!(env.lark.requests_to("/resources/").is_empty());
}

/// A card built to hurt: nested far deeper than any real one, thousands of long elements full
/// of mention and font markup, hundreds of images. The quote keeps the usual bound, nothing is
/// downloaded, and markup the model repeats is posted inert.
#[tokio::test]
async fn a_hostile_card_is_bounded_and_inert() {
    let env = chat_env().await;
    let mut deep = json!({"tag": "markdown", "content": "the bottom"});
    for _ in 0..200 {
        deep = json!({"tag": "column_set", "columns": [{"tag": "column", "elements": [deep]}]});
    }
    let mut elements = vec![deep];
    for i in 0..2_000 {
        elements.push(json!({"tag": "markdown",
            "content": format!("<at id=all></at> <font color='red'>alarm {i}</font> {}", "z".repeat(40))}));
    }
    for i in 0..300 {
        elements.push(json!({"tag": "img", "img_key": format!("img_v3_{i}")}));
    }
    let card = json!({"schema": "2.0",
        "header": {"title": {"tag": "plain_text", "content": "<at id=all></at> ALERT"}},
        "body": {"elements": elements}});
    env.lark
        .add_message("om_hostile", "interactive", card, "ou_mallory", None);
    env.llm
        .push(MODEL, say("It says <at id=all></at> ALERT, alarm 0."));
    send(&env.app, &reply_to("card2", "what is this?", "om_hostile")).await;
    assert_eq!(wait_turns_ended(&env.app, "oc_chat", 1).await, vec!["done"]);
    let text = last_user_text(&env.llm);
    let quote = text
        .strip_prefix("what is this?\n\n[Quoted message from ou_mallory:]\n")
        .unwrap_or_else(|| panic!("{text:.300}"));
    assert!(
        quote.starts_with("> <at id=all></at> ALERT\n> the bottom\n> <at id=all></at> <font color='red'>alarm 0</font>"),
        "{quote:.300}"
    );
    // Cut like any quoted message: 4 000 characters, every line quoted.
    assert!(
        quote.ends_with(" […cut]"),
        "{}",
        &quote[quote.len() - 100..]
    );
    assert!(!quote.contains("alarm 1999"));
    assert!(quote.chars().count() < 4_000 + 2 * quote.lines().count() + 10);
    assert!(quote.lines().all(|l| l.starts_with("> ")));
    assert!(env.lark.requests_to("/resources/").is_empty());
    // The model repeating the card's mention markup mentions nobody.
    let answer = env.lark.requests_to("/messages/om_card2/reply");
    let posted = answer
        .iter()
        .map(|r| r.body["content"].as_str().unwrap_or_default())
        .find(|c| c.contains("ALERT"))
        .expect("the answer was posted");
    assert!(!posted.contains("<at"), "{posted}");
}

#[tokio::test]
async fn a_parent_that_cannot_be_read_is_named() {
    let env = chat_env().await;
    env.llm.push(MODEL, say("I cannot see it"));
    let mut m = Msg::new("gone1", "what about this?");
    m.parent_id = Some("om_gone".into());
    m.root_id = Some("om_gone".into());
    send(&env.app, &m).await;
    wait_turns_ended(&env.app, "oc_chat", 1).await;
    assert_eq!(
        last_user_text(&env.llm),
        "what about this?\n\n[This message replies to message om_gone, which cannot be read: it was deleted or recalled.]"
    );
    // Without the scope, the message says which scope is missing.
    env.lark.drop_message_scope();
    env.lark
        .add_message("om_there", "text", json!({"text": "x"}), "ou_b", None);
    env.llm.push(MODEL, say("no scope"));
    let mut m = Msg::new("gone2", "and this?");
    m.parent_id = Some("om_there".into());
    m.root_id = Some("om_there".into());
    send(&env.app, &m).await;
    wait_turns_ended(&env.app, "oc_chat", 2).await;
    let t = last_user_text(&env.llm);
    assert!(t.contains("om_there, which cannot be read"), "{t}");
    assert!(t.contains("im:message:readonly"), "{t}");
}

#[tokio::test]
async fn a_file_lands_in_the_local_workspace_and_the_model_is_told_where() {
    let env = chat_env().await;
    let content = b"12:00 ERROR connection refused\n".to_vec();
    env.lark
        .add_resource("om_file1", "file_log1", content.clone());
    env.llm.push(MODEL, say("the service is down"));
    send(
        &env.app,
        &rich(
            "file1",
            "file",
            json!({"file_key": "file_log1", "file_name": "app.log"}),
        ),
    )
    .await;
    wait_turns_ended(&env.app, "oc_chat", 1).await;
    let text = last_user_text(&env.llm);
    assert!(
        text.starts_with("[Attachment (file \"app.log\"): "),
        "{text}"
    );
    assert!(
        text.ends_with(" on local — 31 bytes, text/plain.]"),
        "{text}"
    );
    let path = told_path(&text);
    assert!(path.ends_with("/attachments/om_file1-app.log"), "{path}");
    assert!(path.starts_with(&env.app.data_dir.path().display().to_string()));
    assert_eq!(std::fs::read(&path).unwrap(), content);
    let download = env.lark.requests_to("/resources/file_log1");
    assert_eq!(download.len(), 1);
    assert!(
        download[0].path.ends_with("?type=file"),
        "{}",
        download[0].path
    );
}

#[tokio::test]
async fn in_a_thread_bound_to_a_target_a_file_lands_on_the_target() {
    let env = Env::builder().chat_control().target("web").spawn().await;
    let app = &env.app;
    let mut use_web = Msg::new("use", "@_user_1 /ssh use web");
    use_web.chat_type = "group";
    use_web.mention_bot = true;
    send(app, &use_web).await;
    wait_state(app, "use", "done").await;

    let content = b"[server]\nport = 8080\n".to_vec();
    env.lark.add_resource("om_cfg", "file_cfg", content.clone());
    env.llm.push(MODEL, say("port 8080"));
    let mut m = rich(
        "cfg",
        "file",
        json!({"file_key": "file_cfg", "file_name": "app.toml"}),
    );
    m.chat_type = "group";
    m.thread_id = Some("omt_use".into());
    m.root_id = Some("om_use".into());
    send(app, &m).await;
    assert_eq!(wait_turns_ended(app, "omt_use", 1).await, vec!["done"]);
    let text = last_user_text(&env.llm);
    let path = told_path(&text);
    assert_eq!(
        path,
        format!("/home/{}/attachments/om_cfg-app.toml", sshd::USER)
    );
    assert!(text.contains(" on web — "), "{text}");
    // The target is this machine's sshd: its user's home holds the file, owned by that user.
    assert_eq!(std::fs::read(&path).unwrap(), content);
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata(&path).unwrap().uid();
    assert_ne!(uid, 0, "written by the target's user, not by the service");
}

#[tokio::test]
async fn at_read_permission_a_target_keeps_the_file_in_a_private_directory_of_its_user() {
    let env = Env::builder().chat_control().target("web").spawn().await;
    let app = &env.app;
    let mut use_web = Msg::new("use", "@_user_1 /ssh use web");
    use_web.chat_type = "group";
    use_web.mention_bot = true;
    send(app, &use_web).await;
    wait_state(app, "use", "done").await;
    let home = format!("/home/{}", sshd::USER);
    let mut ws = Msg::new("ws", &format!("@_user_1 /workspace set {home} read"));
    ws.chat_type = "group";
    ws.mention_bot = true;
    ws.thread_id = Some("omt_use".into());
    ws.root_id = Some("om_use".into());
    send(app, &ws).await;
    wait_state(app, "ws", "done").await;

    env.lark
        .add_resource("om_ro", "file_ro", b"read only\n".to_vec());
    env.llm.push(MODEL, say("noted"));
    let mut m = rich(
        "ro",
        "file",
        json!({"file_key": "file_ro", "file_name": "notes.txt"}),
    );
    m.chat_type = "group";
    m.thread_id = Some("omt_use".into());
    m.root_id = Some("om_use".into());
    send(app, &m).await;
    assert_eq!(wait_turns_ended(app, "omt_use", 1).await, vec!["done"]);
    let text = last_user_text(&env.llm);
    let path = told_path(&text);
    // Not in the read-only workspace, and not in the shared /tmp: under the user's own home.
    assert!(
        path.starts_with(&format!("{home}/.sshmode-attachments/")),
        "{path}"
    );
    assert!(!std::path::Path::new(&format!("{home}/attachments/om_ro-notes.txt")).exists());
    assert_eq!(std::fs::read(&path).unwrap(), b"read only\n");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let top = std::fs::symlink_metadata(format!("{home}/.sshmode-attachments")).unwrap();
    assert!(top.is_dir());
    assert_eq!(
        top.permissions().mode() & 0o777,
        0o700,
        "private to the user"
    );
    assert_ne!(top.uid(), 0, "made by the target's user");
}

/// An app whose one model entry is `vision` (or not), and its fakes.
async fn router_app(vision: bool) -> (TestApp, FakeProvider, FakeLark, tempfile::NamedTempFile) {
    let llm = FakeProvider::start().await;
    let lark = FakeLark::start().await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        format!(
            "[providers.p]\nbase_url = \"{}\"\n\n[[models]]\nname = \"{MODEL}\"\nentries = [{{ provider = \"p\", model = \"{MODEL}\", vision = {vision} }}]\n",
            llm.base
        ),
    )
    .unwrap();
    let app = app_with(&lark)
        .var("SSHMODE_ROUTER_CONFIG", &file.path().display().to_string())
        .var("SSHMODE_PROGRESS", "false")
        .spawn()
        .await;
    (app, llm, lark, file)
}

const PNG: &[u8] =
    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";

#[tokio::test]
async fn an_image_reaches_a_vision_route_as_image_content_and_another_as_its_path() {
    for vision in [true, false] {
        let (app, llm, lark, _file) = router_app(vision).await;
        lark.add_resource("om_img", "img_v3_shot", PNG.to_vec());
        llm.push(MODEL, say("a screenshot"));
        send(
            &app,
            &rich("img", "image", json!({"image_key": "img_v3_shot"})),
        )
        .await;
        wait_turns_ended(&app, "oc_chat", 1).await;
        let content = user_contents(&llm).pop().unwrap();
        let text = last_user_text(&llm);
        assert!(
            text.contains("om_img-image-img_v3_shot.png on local"),
            "{text}"
        );
        assert!(text.contains("image/png"), "{text}");
        if vision {
            let parts = content.as_array().expect("parts for a vision route");
            assert_eq!(parts[1]["type"], "image_url");
            let url = parts[1]["image_url"]["url"].as_str().unwrap();
            use base64::Engine;
            let expected = base64::engine::general_purpose::STANDARD.encode(PNG);
            assert_eq!(url, format!("data:image/png;base64,{expected}"));
        } else {
            assert!(content.is_string(), "{content}");
        }
        assert_eq!(
            lark.requests_to("/resources/img_v3_shot")[0].path,
            "/open-apis/im/v1/messages/om_img/resources/img_v3_shot?type=image"
        );
    }
}

/// Every file below `dir` whose path has an `attachments` component.
fn attachments_below(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(attachments_below(&p));
        } else if p.components().any(|c| c.as_os_str() == "attachments") {
            out.push(p.display().to_string());
        }
    }
    out
}

#[tokio::test]
async fn an_oversize_file_is_refused_with_a_message_and_nothing_is_written() {
    let env = Env::builder()
        .chat_control()
        .vars(&[("SSHMODE_ATTACHMENT_MAX_MB", "1")])
        .spawn()
        .await;
    env.lark
        .add_resource("om_big", "file_big", vec![b'x'; 1024 * 1024 + 1]);
    // A file that fits, sent first, shows where a file would land.
    env.lark
        .add_resource("om_small", "file_small", b"ok".to_vec());
    env.llm.push(MODEL, say("got it"));
    send(
        &env.app,
        &rich(
            "small",
            "file",
            json!({"file_key": "file_small", "file_name": "small.txt"}),
        ),
    )
    .await;
    wait_turns_ended(&env.app, "oc_chat", 1).await;
    let data = env.app.data_dir.path();
    assert_eq!(attachments_below(data).len(), 1);

    send(
        &env.app,
        &rich(
            "big",
            "file",
            json!({"file_key": "file_big", "file_name": "dump.bin"}),
        ),
    )
    .await;
    wait_state(&env.app, "big", "done").await;
    let replies = env.lark.requests_to("/messages/om_big/reply");
    assert_eq!(replies.len(), 1);
    let said = crate::fake_lark::message_text(replies[0].body["content"].as_str().unwrap());
    let said = said.as_str();
    assert!(said.contains("file \"dump.bin\""), "{said}");
    assert!(said.contains("larger than the 1 MB limit"), "{said}");
    // Nothing of it on disk, not even a temporary file; and no turn for a refused file alone.
    assert_eq!(
        attachments_below(data).len(),
        1,
        "{:?}",
        attachments_below(data)
    );
    assert_eq!(turn_states(&env.app, "oc_chat").await.len(), 1);

    // Served without a declared length, it is cut off as it streams past the limit.
    env.lark
        .add_resource_streamed("om_big2", "file_big2", vec![b'y'; 2 * 1024 * 1024]);
    send(
        &env.app,
        &rich(
            "big2",
            "file",
            json!({"file_key": "file_big2", "file_name": "dump2.bin"}),
        ),
    )
    .await;
    wait_state(&env.app, "big2", "done").await;
    let replies = env.lark.requests_to("/messages/om_big2/reply");
    assert_eq!(replies.len(), 1);
    assert!(
        replies[0].body["content"]
            .as_str()
            .unwrap()
            .contains("larger than the 1 MB limit")
    );
    assert_eq!(
        attachments_below(data).len(),
        1,
        "{:?}",
        attachments_below(data)
    );
    assert_eq!(turn_states(&env.app, "oc_chat").await.len(), 1);
}

#[tokio::test]
async fn a_sticker_never_makes_an_empty_turn() {
    let env = chat_env().await;
    env.llm.push(MODEL, say("nice sticker"));
    send(
        &env.app,
        &rich("st", "sticker", json!({"file_key": "file_sticker"})),
    )
    .await;
    wait_turns_ended(&env.app, "oc_chat", 1).await;
    assert_eq!(last_user_text(&env.llm), "[a sticker]");
    // Stickers cannot be downloaded: nothing was asked of the resource endpoint.
    let downloads: Vec<String> = env
        .lark
        .requests_to("/resources/")
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert!(downloads.is_empty(), "{downloads:?}");

    // In a thread the bot is in, a sticker that mentions nobody asks nothing (as before).
    env.llm.push(MODEL, say("hello"));
    let mut hi = Msg::new("hi", "@_user_1 hi");
    hi.chat_type = "group";
    hi.mention_bot = true;
    hi.thread_id = Some("omt_t".into());
    hi.root_id = Some("om_t".into());
    send(&env.app, &hi).await;
    wait_turns_ended(&env.app, "omt_t", 1).await;
    let mut st = rich("st2", "sticker", json!({"file_key": "file_sticker"}));
    st.chat_type = "group";
    st.thread_id = Some("omt_t".into());
    st.root_id = Some("om_t".into());
    send(&env.app, &st).await;
    wait_state(&env.app, "st2", "done").await;
    assert_eq!(turn_states(&env.app, "omt_t").await.len(), 1);
}

#[tokio::test]
async fn a_forwarded_bundle_reaches_the_model_expanded_and_bounded_and_its_file_is_named_once() {
    let env = chat_env().await;
    let bundle = "om_fwd1";
    env.lark.add_message(
        bundle,
        "merge_forward",
        json!("Merged and Forwarded Message"),
        "ou_me",
        None,
    );
    // 25 messages inside: the first far longer than a quoted message may be, one a file.
    let long = "x".repeat(5_000);
    for i in 0..25 {
        let (kind, content) = match i {
            0 => ("text", json!({ "text": long })),
            1 => (
                "file",
                json!({"file_key": "file_inner", "file_name": "inner.log"}),
            ),
            _ => ("text", json!({ "text": format!("line {i}") })),
        };
        env.lark.add_message(
            &format!("om_in{i}"),
            kind,
            content,
            "ou_colleague",
            Some(bundle),
        );
    }
    env.lark
        .add_resource("om_in1", "file_inner", b"never served".to_vec());
    env.llm.push(MODEL, say("read them"));
    send(
        &env.app,
        &rich(
            "fwd1",
            "merge_forward",
            json!("Merged and Forwarded Message"),
        ),
    )
    .await;
    assert_eq!(wait_turns_ended(&env.app, "oc_chat", 1).await, vec!["done"]);
    let text = last_user_text(&env.llm);
    assert!(
        text.starts_with("[Forwarded messages (20 of 25, the rest left out):]\nou_colleague:\n> "),
        "{text}"
    );
    // Each message cut at 4 000 characters; the first 20 given, the rest left out.
    assert!(
        text.contains(&format!("> {} […cut]", "x".repeat(4_000))),
        "{text}"
    );
    assert!(!text.contains(&"x".repeat(4_001)), "{text}");
    assert!(text.contains("> line 19"), "{text}");
    assert!(!text.contains("> line 20"), "{text}");
    assert!(
        text.ends_with(
            "[file \"inner.log\" inside the forwarded messages was not downloaded: Lark does not let bots download files inside forwarded messages (234043).]"
        ),
        "{text}"
    );
    // The bundle was read once, and the file inside never asked for, so never retried.
    let reads = env
        .lark
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == format!("/open-apis/im/v1/messages/{bundle}"))
        .count();
    assert_eq!(reads, 1);
    let downloads: Vec<String> = env
        .lark
        .requests_to("/resources/")
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert!(downloads.is_empty(), "{downloads:?}");
}

async fn insert_image(db: &sqlx::PgPool, message_id: &str, hours_old: i32) {
    sqlx::query(
        "INSERT INTO message_images (message_id, path, mime, data, created_at)
         VALUES ($1, '/p.png', 'image/png', '\\x00', now() - make_interval(hours => $2))",
    )
    .bind(message_id)
    .bind(hours_old)
    .execute(db)
    .await
    .unwrap();
}

#[tokio::test]
async fn images_past_their_retention_are_purged_without_a_new_image() {
    let app = TestApp::builder().spawn().await;
    let url = app.stop().await;
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    insert_image(&pool, "om_old", 49).await;
    insert_image(&pool, "om_recent", 47).await;
    pool.close().await;
    // `serve` purges at start (and hourly), no image being stored.
    let app = TestApp::builder().database(&url).spawn().await;
    let db = app.state.db.clone();
    crate::helpers::eventually(
        "the image purge",
        std::time::Duration::from_secs(30),
        async || {
            let left: Vec<String> =
                sqlx::query_scalar("SELECT message_id FROM message_images ORDER BY message_id")
                    .fetch_all(&db)
                    .await
                    .unwrap();
            left == vec!["om_recent".to_string()]
        },
    )
    .await;
    app.stop().await;
}

/// A recalled file is overwritten with `[recalled]` where it landed, in the local workspace
/// and on a target; locally, a directory on the way swapped for a link out of the workspace
/// (as a tool could) is not followed: the file it points at stays as it was.
#[tokio::test]
async fn a_recalled_file_is_overwritten_where_it_landed_and_no_link_is_followed_out() {
    let env = Env::builder().chat_control().target("web").spawn().await;
    let app = &env.app;
    let recalled_text = sshmode::lifecycle::RECALLED.as_bytes();
    let file = |id: &str, name: &str, content: &[u8]| {
        env.lark
            .add_resource(&format!("om_{id}"), &format!("file_{id}"), content.to_vec());
        env.llm.push(MODEL, say("read"));
        rich(
            id,
            "file",
            json!({"file_key": format!("file_{id}"), "file_name": name}),
        )
    };
    send(app, &file("rf1", "a.env", b"password=one\n")).await;
    wait_turns_ended(app, "oc_chat", 1).await;
    let first = told_path(&last_user_text(&env.llm));
    send(app, &file("rf2", "b.env", b"password=two\n")).await;
    wait_turns_ended(app, "oc_chat", 2).await;
    let second = told_path(&last_user_text(&env.llm));
    assert_eq!(std::fs::read(&second).unwrap(), b"password=two\n");

    send_env(app, &recalled("ev_rc1", "om_rf1", "oc_chat")).await;
    wait_state(app, "ev_rc1", "done").await;
    assert_eq!(std::fs::read(&first).unwrap(), recalled_text);

    // The attachments directory becomes a link to a directory outside the workspace holding a
    // file of the recalled one's name.
    let outside = tempfile::tempdir().unwrap();
    let name = Path::new(&second).file_name().unwrap();
    std::fs::write(outside.path().join(name), "precious").unwrap();
    let dir = Path::new(&second).parent().unwrap();
    std::fs::rename(dir, dir.with_extension("moved")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir).unwrap();
    send_env(app, &recalled("ev_rc2", "om_rf2", "oc_chat")).await;
    wait_state(app, "ev_rc2", "done").await;
    assert_eq!(
        std::fs::read(outside.path().join(name)).unwrap(),
        b"precious"
    );

    // On a target, as its user.
    let mut use_web = Msg::new("use", "@_user_1 /ssh use web");
    use_web.chat_type = "group";
    use_web.mention_bot = true;
    send(app, &use_web).await;
    wait_state(app, "use", "done").await;
    let mut m = file("rf3", "c.env", b"password=three\n");
    m.chat_type = "group";
    m.thread_id = Some("omt_use".into());
    m.root_id = Some("om_use".into());
    send(app, &m).await;
    assert_eq!(wait_turns_ended(app, "omt_use", 1).await, vec!["done"]);
    let remote = told_path(&last_user_text(&env.llm));
    assert!(
        remote.starts_with(&format!("/home/{}/", sshd::USER)),
        "{remote}"
    );
    assert_eq!(std::fs::read(&remote).unwrap(), b"password=three\n");
    send_env(app, &recalled("ev_rc3", "om_rf3", "oc_chat")).await;
    wait_state(app, "ev_rc3", "done").await;
    assert_eq!(std::fs::read(&remote).unwrap(), recalled_text);
}
