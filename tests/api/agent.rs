//! The agent end to end, below chat control: turn requests go in through `Agent::accept` (as the
//! chat dispatcher will hand them over), the scripted fake model asks for tools, the tools act on
//! the section's backend — local, or the real sshd — and the answer and reactions land on the
//! fake Lark. Sections are bound by a test `Bindings` the test moves at will.

use std::collections::{HashMap, HashSet};
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sshmode::agent::{Bindings, SshModeAction};
use sshmode::exec::Place;
use sshmode::target::cli::{AddArgs, HostKeyPolicyArg, TargetCmd, run_with};
use sshmode::turns::TurnRequest;

use crate::fake_lark::FakeLark;
use crate::fake_llm::{FakeProvider, Reply, completion, text};
use crate::helpers::{TestApp, TestAppBuilder, eventually};
use crate::sshd::{self, Sshd};

pub(crate) const MODEL: &str = "m";

/// Chat control as a test sets it: a place per section, grants per (section, alias).
#[derive(Default)]
pub struct Control {
    places: Mutex<HashMap<String, Place>>,
    grants: Mutex<HashSet<(String, String)>>,
}

impl Control {
    pub(crate) fn bind(&self, section: &str, place: Place) {
        self.places
            .lock()
            .unwrap()
            .insert(section.to_string(), place);
    }

    fn grant(&self, section: &str, alias: &str) {
        self.grants
            .lock()
            .unwrap()
            .insert((section.to_string(), alias.to_string()));
    }
}

#[async_trait]
impl Bindings for Control {
    async fn place(&self, section: &str) -> anyhow::Result<Place> {
        Ok(self
            .places
            .lock()
            .unwrap()
            .get(section)
            .cloned()
            .unwrap_or(Place::Local))
    }

    async fn ssh_mode(
        &self,
        section: &str,
        _chat: &str,
        action: SshModeAction,
        target: Option<&str>,
    ) -> anyhow::Result<String> {
        Ok(match action {
            SshModeAction::Status => format!("backend: {:?}", self.place(section).await?),
            SshModeAction::ListTargets => "targets: web".into(),
            SshModeAction::RequestUse => {
                let alias = target.unwrap_or_default().to_string();
                if self
                    .grants
                    .lock()
                    .unwrap()
                    .contains(&(section.to_string(), alias.clone()))
                {
                    self.bind(section, Place::Target(alias.clone()));
                    format!("entered `{alias}`")
                } else {
                    format!(
                        "refused: no grant for `{alias}` in this thread; a user can run `/ssh yolo on {alias}`"
                    )
                }
            }
            SshModeAction::RequestLocal => {
                self.bind(section, Place::Local);
                "back to local".into()
            }
        })
    }
}

/// A model reply asking for one tool call.
pub(crate) fn call(tool: &str, args: Value) -> Reply {
    calls(&[(tool, args)])
}

/// A model reply asking for several tool calls at once.
pub(crate) fn calls(list: &[(&str, Value)]) -> Reply {
    let tool_calls: Vec<Value> = list
        .iter()
        .enumerate()
        .map(|(i, (tool, args))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": tool, "arguments": args.to_string()}})
        })
        .collect();
    completion(
        MODEL,
        json!({"role": "assistant", "content": null, "tool_calls": tool_calls}),
        json!("tool_calls"),
    )
}

pub(crate) fn say(s: &str) -> Reply {
    text(MODEL, s)
}

/// The agent's test environment: the app with a fake model provider and a fake Lark, built
/// by [`Env::builder`] (the one fixture of the agent, progress and chat-agent tests).
pub(crate) struct Env {
    pub app: TestApp,
    pub llm: FakeProvider,
    pub lark: FakeLark,
    /// The fake chat control the app asks for bindings, unless built with
    /// [`EnvBuilder::chat_control`].
    pub control: Arc<Control>,
    /// A target's sshd and its directory, when built with [`EnvBuilder::target`].
    _target: Option<(Sshd, tempfile::TempDir)>,
}

/// Configures an [`Env`].
pub(crate) struct EnvBuilder {
    vars: Vec<(String, String)>,
    progress: bool,
    chat_control: bool,
    target: Option<String>,
}

impl Env {
    /// The target's sshd, when built with [`EnvBuilder::target`].
    pub(crate) fn sshd(&self) -> Option<&Sshd> {
        self._target.as_ref().map(|(s, _)| s)
    }

    pub(crate) fn builder() -> EnvBuilder {
        EnvBuilder {
            vars: Vec::new(),
            progress: false,
            chat_control: false,
            target: None,
        }
    }
}

impl EnvBuilder {
    pub(crate) fn vars(mut self, vars: &[(&str, &str)]) -> Self {
        self.vars
            .extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// With live progress cards (off otherwise: they have their own tests).
    pub(crate) fn progress(mut self) -> Self {
        self.progress = true;
        self
    }

    /// With the service's own chat control and signed ingress, for tests that drive the
    /// agent through chat messages.
    pub(crate) fn chat_control(mut self) -> Self {
        self.chat_control = true;
        self
    }

    /// With an approved target `alias` on a fresh sshd (needs root and sshd).
    pub(crate) fn target(mut self, alias: &str) -> Self {
        self.target = Some(alias.to_string());
        self
    }

    pub(crate) async fn spawn(self) -> Env {
        let llm = FakeProvider::start().await;
        let lark = FakeLark::start().await;
        let control = Arc::new(Control::default());
        let mut b = if self.chat_control {
            crate::lark_support::app_with(&lark)
                .var("LLM_BASE_URL", &llm.base)
                .var("LLM_MODEL", MODEL)
                .var("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3")
                .var("SSHMODE_PROGRESS", "false")
        } else {
            builder(&llm, &lark, &control)
        };
        if self.progress {
            b = b.var("SSHMODE_PROGRESS", "true");
        }
        for (k, v) in &self.vars {
            b = b.var(k, v);
        }
        let app = b.spawn().await;
        let target = match &self.target {
            None => None,
            Some(alias) => {
                assert!(
                    sshd::available(),
                    "these tests need root and /usr/sbin/sshd"
                );
                let dir = tempfile::tempdir().unwrap();
                let sshd = Sshd::start_below(dir.path());
                add_target(&app, &sshd, dir.path(), alias).await;
                Some((sshd, dir))
            }
        };
        Env {
            app,
            llm,
            lark,
            control,
            _target: target,
        }
    }
}

pub(crate) fn builder(
    llm: &FakeProvider,
    lark: &FakeLark,
    control: &Arc<Control>,
) -> TestAppBuilder {
    TestApp::builder()
        .var("LARK_BASE_URL", &lark.base)
        .var("LLM_BASE_URL", &llm.base)
        .var("LLM_MODEL", MODEL)
        .var("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3")
        // These tests are about the agent; the progress card has its own (tests/api/progress.rs).
        .var("SSHMODE_PROGRESS", "false")
        .ssh_mode(control.clone())
}

async fn env(vars: &[(&str, &str)]) -> Env {
    Env::builder().vars(vars).spawn().await
}

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

pub(crate) fn request(section: &str, message_id: &str, text: &str) -> TurnRequest {
    TurnRequest {
        section: section.into(),
        chat_id: "oc_chat".into(),
        message_id: message_id.into(),
        sender: "ou_user".into(),
        text: text.into(),
        in_thread: section.starts_with("omt_"),
    }
}

/// Queues `text` as message `message_id` of `section` for a turn, as chat control would.
pub(crate) async fn accept(app: &TestApp, section: &str, message_id: &str, text: &str) {
    app.state
        .agent
        .accept(&request(section, message_id, text))
        .await
        .unwrap();
}

/// The states of `section`'s turns, oldest first.
pub(crate) async fn turn_states(app: &TestApp, section: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT state FROM turns WHERE section_id = $1 ORDER BY id")
        .bind(section)
        .fetch_all(&app.state.db)
        .await
        .unwrap()
}

pub(crate) async fn wait_turns_ended(app: &TestApp, section: &str, n: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let s = turn_states(app, section).await;
        if s.len() >= n && s.iter().all(|s| s != "running" && s != "awaiting_approval") {
            return s;
        }
        if tokio::time::Instant::now() > deadline {
            let log: Vec<(String, Value)> = event_kinds(app, section).await;
            let msgs: Vec<(String, Value)> = sqlx::query_as(
                "SELECT kind, message FROM agent_messages WHERE section_id = $1 ORDER BY id",
            )
            .bind(section)
            .fetch_all(&app.state.db)
            .await
            .unwrap();
            panic!(
                "timed out waiting for {n} ended turn(s) of {section}: {s:?}\nevents: {log:#?}\nmessages: {msgs:#?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a tool call has started in `section` (its start mark is stored).
async fn tool_started(app: &TestApp, section: &str) -> bool {
    sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM agent_messages WHERE section_id = $1 AND kind = 'tool_started'",
    )
    .bind(section)
    .fetch_one(&app.state.db)
    .await
    .unwrap()
        > 0
}

/// The tool results the model was sent in its latest request.
pub(crate) fn tool_results(llm: &FakeProvider) -> Vec<String> {
    let last = llm.requests().last().cloned().expect("a model request");
    last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Replies posted to `message_id`: (reply_in_thread, markdown text).
pub(crate) fn replies_to(lark: &FakeLark, message_id: &str) -> Vec<(bool, String)> {
    lark.requests_to(&format!("/messages/{message_id}/reply"))
        .into_iter()
        .map(|r| {
            let content: Value = serde_json::from_str(r.body["content"].as_str().unwrap()).unwrap();
            assert_eq!(r.body["msg_type"], "post");
            assert!(r.body["uuid"].as_str().is_some_and(|u| !u.is_empty()));
            (
                r.body["reply_in_thread"].as_bool().unwrap(),
                content["zh_cn"]["content"][0][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

/// Emoji added to `message_id`, in order.
pub(crate) fn reactions(lark: &FakeLark, message_id: &str) -> Vec<String> {
    lark.requests_to(&format!("/messages/{message_id}/reactions"))
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| {
            r.body["reaction_type"]["emoji_type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

pub(crate) async fn event_kinds(app: &TestApp, section: &str) -> Vec<(String, Value)> {
    sqlx::query_as("SELECT kind, payload FROM session_events WHERE section_id = $1 ORDER BY seq")
        .bind(section)
        .fetch_all(&app.state.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn local_turn_runs_every_tool_and_answers_in_place() {
    let env = env(&[]).await;
    let section = unique("oc_local");
    let msg = unique("om_local");
    env.llm
        .push(
            MODEL,
            calls(&[
                (
                    "terminal",
                    json!({"command": "mkdir -p sub && cd sub && echo hi > a.txt && echo made"}),
                ),
                ("terminal", json!({"command": "pwd"})),
            ]),
        )
        .push(
            MODEL,
            call(
                "write_file",
                json!({"path": "b.txt", "content": "alpha\nbeta\n"}),
            ),
        )
        .push(
            MODEL,
            call(
                "patch",
                json!({"path": "b.txt", "old_string": "beta", "new_string": "gamma"}),
            ),
        )
        .push(MODEL, call("read_file", json!({"path": "b.txt"})))
        .push(MODEL, call("search_files", json!({"pattern": "gam+a"})))
        .push(
            MODEL,
            call(
                "execute_code",
                json!({"code": "import os; print('py', os.getcwd())"}),
            ),
        )
        .push(MODEL, call("terminal", json!({"cmd": "oops"})))
        .push(MODEL, call("no_such_tool", json!({})))
        .push(MODEL, say("All **done**."));
    accept(&env.app, &section, &msg, "do things").await;
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);

    let reqs = env.llm.requests();
    let result_of = |i: usize| -> Vec<String> {
        reqs[i].body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect()
    };
    let first = result_of(1);
    assert!(
        first[0].contains("exit code: 0") && first[0].contains("made"),
        "{first:?}"
    );
    // The `cd` of the first command holds for the second.
    assert!(first[1].trim_end().ends_with("/sub"), "{first:?}");
    let all = result_of(8);
    assert!(all[2].contains("wrote 11 bytes"), "{all:?}");
    assert!(all[3].contains("1 replacement"), "{all:?}");
    assert!(all[4].contains("alpha\ngamma"), "{all:?}");
    assert!(
        all[5].contains("b.txt") && all[5].contains("gamma"),
        "{all:?}"
    );
    assert!(
        all[6].contains("py /") && all[6].contains("/sub"),
        "{all:?}"
    );
    assert!(
        all[7].starts_with("error: invalid arguments for `terminal`"),
        "{all:?}"
    );
    assert!(all[8].contains("no tool called `no_such_tool`"), "{all:?}");
    // The system prompt describes the backend; tools carry schemas.
    assert!(
        reqs[0].body["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("local backend")
    );
    // Six task tools, two of chat control (ssh_mode, cron), the five interactive shell tools,
    // memory and skills.
    let names: Vec<&str> = reqs[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 15, "{names:?}");
    assert!(names.contains(&"cron"), "{names:?}");
    for shell in [
        "shell_open",
        "shell_write",
        "shell_read",
        "shell_close",
        "shell_list",
    ] {
        assert!(names.contains(&shell), "{names:?}");
    }

    // The answer: a post with md, replying in place (a parent section).
    let replies = replies_to(&env.lark, &msg);
    assert_eq!(replies, vec![(false, "All **done**.".to_string())]);
    assert_eq!(reactions(&env.lark, &msg), vec!["OnIt"]);
    assert_eq!(
        env.lark
            .requests_to(&format!("/messages/{msg}/reactions/"))
            .iter()
            .filter(|r| r.method == "DELETE")
            .count(),
        0,
        "the receipt stays"
    );

    // The working directory is stored per section and backend.
    let cwd: String = sqlx::query_scalar(
        "SELECT dir FROM section_cwds WHERE section_id = $1 AND backend = 'local'",
    )
    .bind(&section)
    .fetch_one(&env.app.state.db)
    .await
    .unwrap();
    assert!(cwd.ends_with("/sub"), "{cwd}");

    // The event log: each step with its route and tokens, each tool call with backend and
    // duration, errors.
    let events = event_kinds(&env.app, &section).await;
    let steps: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| k == "agent.step")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(steps.len(), 9);
    assert_eq!(steps[0]["route"], "default/m");
    assert_eq!(steps[0]["prompt_tokens"], 11);
    let tools: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| k == "agent.tool")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(tools.len(), 9);
    assert_eq!(tools[0]["backend"], "local");
    assert_eq!(tools[0]["exit"], "exit 0");
    assert!(tools[0]["duration_ms"].is_u64());
    assert!(
        events
            .iter()
            .any(|(k, p)| k == "agent.error" && p["tool"] == "terminal")
    );
    // The turn's own entry follows its end state (the end is committed first).
    eventually("the turn's log entry", Duration::from_secs(10), || async {
        event_kinds(&env.app, &section)
            .await
            .iter()
            .any(|(k, p)| k == "agent.turn" && p["end"] == "done")
    })
    .await;

    // Accepting the same message again changes nothing.
    let again = env
        .app
        .state
        .agent
        .accept(&request(&section, &msg, "do things"))
        .await
        .unwrap();
    assert!(!again.new);
    assert_eq!(reactions(&env.lark, &msg).len(), 1);
}

/// A target `web` on a fresh sshd, registered in `app`'s database.
pub(crate) async fn add_target(app: &TestApp, sshd: &Sshd, dir: &std::path::Path, alias: &str) {
    let key = dir.join(format!("{alias}_key"));
    sshd::new_key(&key, "ed25519", "");
    sshd.authorize(&PathBuf::from(format!("{}.pub", key.display())));
    let args = AddArgs {
        alias: alias.into(),
        host: "127.0.0.1".into(),
        port: sshd.port,
        user: sshd::USER.into(),
        key: Some(key),
        passphrase_stdin: false,
        password_stdin: false,
        agent: false,
        cert: None,
        description: None,
        host_key_policy: HostKeyPolicyArg::Tofu,
        host_key: None,
        approve: true,
        offline: false,
        jump: None,
    };
    let mut out = Vec::new();
    let r = run_with(
        TargetCmd::Add(args),
        &app.state.config,
        &app.state.db,
        &mut Cursor::new(Vec::new()),
        &mut out,
    )
    .await
    .map_err(|e| format!("{e:#}"));
    assert_eq!(r, Ok(0), "{}", String::from_utf8_lossy(&out));
}

fn remote_home() -> String {
    format!("/home/{}", sshd::USER)
}

#[tokio::test]
async fn tools_act_on_the_bound_target_and_the_parent_stays_local() {
    if !sshd::available() {
        return;
    }
    let env = env(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_below(dir.path());
    add_target(&env.app, &sshd, dir.path(), "web").await;

    let thread = unique("omt_remote");
    let name = unique("f");
    env.control.bind(&thread, Place::Target("web".into()));
    env.llm
        .push(MODEL, call("terminal", json!({"command": "id -un; cd ~ && pwd"})))
        .push(MODEL, call("write_file", json!({"path": format!("~/{name}.txt"), "content": "one\ntwo\n"})))
        .push(MODEL, call("patch", json!({"path": format!("~/{name}.txt"), "old_string": "two", "new_string": "three"})))
        .push(MODEL, call("read_file", json!({"path": format!("~/{name}.txt")})))
        .push(MODEL, call("search_files", json!({"pattern": format!("{name}*"), "target": "files", "path": "~"})))
        .push(MODEL, call("execute_code", json!({"code": "import os, getpass; print(getpass.getuser(), os.path.expanduser('~'))"})))
        .push(MODEL, call("execute_code", json!({"code": "echo bash $HOME", "language": "bash"})))
        .push(MODEL, say("remote done"));
    let msg = unique("om_remote");
    accept(&env.app, &thread, &msg, "work remotely").await;
    assert_eq!(wait_turns_ended(&env.app, &thread, 1).await, vec!["done"]);
    let results = tool_results(&env.llm);
    let home = remote_home();
    assert!(
        results[0].contains(&format!("{}\n{home}", sshd::USER)),
        "{results:?}"
    );
    assert!(
        results[1].contains(&format!("{home}/{name}.txt")),
        "{results:?}"
    );
    assert!(results[3].contains("one\nthree"), "{results:?}");
    assert!(
        results[4].contains(&format!("{home}/{name}.txt")),
        "{results:?}"
    );
    assert!(
        results[5].contains(&format!("{} {home}", sshd::USER)),
        "{results:?}"
    );
    assert!(results[6].contains(&format!("bash {home}")), "{results:?}");
    // The file is really in the remote user's home (the sshd runs on this machine).
    let on_disk = std::fs::read_to_string(format!("{home}/{name}.txt")).unwrap();
    assert_eq!(on_disk, "one\nthree\n");
    assert_eq!(
        replies_to(&env.lark, &msg),
        vec![(true, "remote done".to_string())]
    );
    let events = event_kinds(&env.app, &thread).await;
    let tool = events.iter().find(|(k, _)| k == "agent.tool").unwrap();
    assert_eq!(tool.1["backend"], "ssh");
    assert_eq!(tool.1["target"], "web");

    // The parent section of the same chat is local.
    let parent = unique("oc_parent");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("local done"));
    let pmsg = unique("om_parent");
    accept(&env.app, &parent, &pmsg, "work here").await;
    wait_turns_ended(&env.app, &parent, 1).await;
    let local = tool_results(&env.llm);
    assert!(!local[0].contains(sshd::USER), "{local:?}");
    assert_eq!(
        replies_to(&env.lark, &pmsg),
        vec![(false, "local done".to_string())]
    );

    // The model enters a target itself only with a grant; the switch holds from the next call.
    let t2 = unique("omt_yolo");
    env.llm
        .push(
            MODEL,
            call(
                "ssh_mode",
                json!({"action": "request_use", "target": "web"}),
            ),
        )
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("refused, stayed local"));
    accept(&env.app, &t2, &unique("om_y1"), "go remote").await;
    wait_turns_ended(&env.app, &t2, 1).await;
    let r = tool_results(&env.llm);
    assert!(r[0].starts_with("refused"), "{r:?}");
    assert!(!r[1].contains(sshd::USER), "{r:?}");
    env.control.grant(&t2, "web");
    env.llm
        .push(
            MODEL,
            call(
                "ssh_mode",
                json!({"action": "request_use", "target": "web"}),
            ),
        )
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, call("ssh_mode", json!({"action": "request_local"})))
        .push(MODEL, call("terminal", json!({"command": "id -un"})))
        .push(MODEL, say("in and out"));
    accept(&env.app, &t2, &unique("om_y2"), "go remote now").await;
    wait_turns_ended(&env.app, &t2, 2).await;
    let r = tool_results(&env.llm);
    let n = r.len();
    assert!(r[n - 3].contains(sshd::USER), "{r:?}");
    assert!(!r[n - 1].contains(sshd::USER), "{r:?}");
}

#[tokio::test]
async fn a_target_that_is_down_fails_the_tool_and_nothing_runs_locally() {
    if !sshd::available() {
        return;
    }
    let env = env(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut sshd = Sshd::start_below(dir.path());
    add_target(&env.app, &sshd, dir.path(), "web").await;
    sshd.stop();

    let thread = unique("omt_down");
    env.control.bind(&thread, Place::Target("web".into()));
    let marker = dir.path().join("marker");
    // Readable by the test user only if written by someone: the marker would be created by a
    // local run (root) and by a remote one alike.
    env.llm
        .push(
            MODEL,
            call(
                "terminal",
                json!({"command": format!("touch {}", marker.display())}),
            ),
        )
        .push(
            MODEL,
            call(
                "write_file",
                json!({"path": marker.display().to_string(), "content": "x"}),
            ),
        )
        .push(MODEL, say("could not"));
    accept(&env.app, &thread, &unique("om_down"), "touch it").await;
    wait_turns_ended(&env.app, &thread, 1).await;
    let r = tool_results(&env.llm);
    // Each names where it was to run, in full, and the target's failure.
    for res in &r[..2] {
        assert!(
            res.starts_with("[web · ") && res.contains("] error: target `web` is unavailable"),
            "{r:?}"
        );
    }
    assert!(!marker.exists(), "nothing may run locally instead");
}

/// Whether a process running `pattern` as the sshd test user exists, asked over a separate
/// SSH connection (the pool of `app`).
pub(crate) async fn remote_pgrep(app: &TestApp, pattern: &str) -> bool {
    let ops = app
        .state
        .exec
        .ops_for(&unique("omt_probe"), &Place::Target("web".into()))
        .await
        .unwrap();
    let out = ops
        .terminal(
            &format!(
                "pgrep -u {} -f '[{}]{}' >/dev/null && echo yes || echo no",
                sshd::USER,
                &pattern[..1],
                &pattern[1..]
            ),
            Default::default(),
            &Default::default(),
        )
        .await
        .unwrap();
    String::from_utf8_lossy(&out.output.stdout).contains("yes")
}

#[tokio::test]
async fn stop_from_another_instance_kills_the_remote_command_and_tells_the_user() {
    if !sshd::available() {
        return;
    }
    let env = env(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_below(dir.path());
    add_target(&env.app, &sshd, dir.path(), "web").await;
    // A second instance on the same database (and vault key) handles the /stop.
    let other = builder(&env.llm, &env.lark, &env.control)
        .database(&env.app.db_url)
        .var(
            "SSHMODE_MASTER_KEY_FILE",
            &env.app.state.config.master_key_file.display().to_string(),
        )
        .spawn()
        .await;

    let thread = unique("omt_stop");
    env.control.bind(&thread, Place::Target("web".into()));
    let secs = 300 + (rand_u16() % 600);
    env.llm
        .push(
            MODEL,
            call("terminal", json!({"command": format!("sleep {secs}")})),
        )
        .push(MODEL, say("never reached"));
    let msg = unique("om_stop");
    accept(&env.app, &thread, &msg, "wait a while").await;
    let pattern = format!("sleep {secs}");
    eventually("the remote sleep", Duration::from_secs(20), || {
        remote_pgrep(&other, &pattern)
    })
    .await;
    // A message arriving now waits behind the running turn.
    let queued = unique("om_queued");
    accept(&env.app, &thread, &queued, "later").await;
    let said = other.state.agent.stop(&thread, "ou_user").await.unwrap();
    assert!(
        said.contains("Stopping") && said.contains("1 waiting"),
        "{said}"
    );
    eventually("the stopped turn", Duration::from_secs(10), || async {
        turn_states(&env.app, &thread)
            .await
            .first()
            .map(String::as_str)
            == Some("stopped")
    })
    .await;
    eventually(
        "the remote sleep to be gone",
        Duration::from_secs(10),
        || async { !remote_pgrep(&other, &pattern).await },
    )
    .await;
    let replies = replies_to(&env.lark, &msg);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert!(replies[0].1.starts_with("Stopped by /stop"), "{replies:?}");
    assert!(replies[0].1.contains(&pattern), "{replies:?}");
    assert_eq!(reactions(&env.lark, &msg), vec!["OnIt", "CrossMark"]);
    // The queued message stays queued and runs next (the model now answers it) …
    wait_turns_ended(&env.app, &thread, 2).await;
    assert_eq!(replies_to(&env.lark, &queued).len(), 1);
    // … and a stop with nothing running drops what waits.
    assert_eq!(
        other.state.agent.stop(&thread, "ou_user").await.unwrap(),
        sshmode::chat::NOTHING_RUNNING
    );
    drop(sshd);
}

pub(crate) fn rand_u16() -> u16 {
    uuid::Uuid::new_v4().as_bytes()[0] as u16 * 3 + uuid::Uuid::new_v4().as_bytes()[1] as u16
}

/// The local workspace of `section` (where its shell starts).
async fn workspace(app: &TestApp, section: &str) -> PathBuf {
    let backend = app
        .state
        .exec
        .backend(section, &Place::Local)
        .await
        .unwrap();
    PathBuf::from(backend.initial_dir(section).await.unwrap())
}

#[tokio::test]
async fn messages_during_a_turn_join_the_next_turn_in_order_and_sections_overlap() {
    let env = env(&[]).await;
    let a = unique("omt_a");
    let b = unique("omt_b");
    let go = workspace(&env.app, &a).await.join("go");
    env.llm.push(
        MODEL,
        call(
            "terminal",
            json!({"command": "while [ ! -f go ]; do sleep 0.05; done; echo released"}),
        ),
    );
    accept(&env.app, &a, "om_a1", "first").await;
    eventually("A's tool to start", Duration::from_secs(20), || {
        tool_started(&env.app, &a)
    })
    .await;

    // Section B runs to its end while A is blocked: their turns overlap.
    env.llm.push(MODEL, say("B done"));
    accept(&env.app, &b, "om_b1", "other").await;
    assert_eq!(wait_turns_ended(&env.app, &b, 1).await, vec!["done"]);
    assert_eq!(turn_states(&env.app, &a).await, vec!["running"]);

    accept(&env.app, &a, "om_a2", "second").await;
    accept(&env.app, &a, "om_a3", "third").await;
    env.llm
        .push(MODEL, say("first done"))
        .push(MODEL, say("second and third done"));
    std::fs::write(&go, "").unwrap();
    assert_eq!(
        wait_turns_ended(&env.app, &a, 2).await,
        vec!["done", "done"]
    );

    let last = env.llm.requests().last().cloned().unwrap();
    let users: Vec<&str> = last.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, vec!["first", "second", "third"]);
    let turn_of: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT turn_id FROM turn_requests WHERE section_id = $1 ORDER BY id")
            .bind(&a)
            .fetch_all(&env.app.state.db)
            .await
            .unwrap();
    assert_eq!(turn_of[1], turn_of[2]);
    assert_ne!(turn_of[0], turn_of[1]);
    // The second turn answers its last message, in the thread.
    assert_eq!(
        replies_to(&env.lark, "om_a3"),
        vec![(true, "second and third done".to_string())]
    );
    assert!(replies_to(&env.lark, "om_a2").is_empty());
    assert_eq!(reactions(&env.lark, "om_a2"), vec!["OnIt"]);
}

#[tokio::test]
async fn a_turn_resumes_on_another_instance_after_a_hard_stop_without_rerunning_the_command() {
    if !sshd::available() {
        return;
    }
    let lease = [("SSHMODE_TURN_LEASE_SECS", "2")];
    let env = env(&lease).await;
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_below(dir.path());
    add_target(&env.app, &sshd, dir.path(), "web").await;

    let thread = unique("omt_resume");
    env.control.bind(&thread, Place::Target("web".into()));
    let counter = format!("{}/{}", remote_home(), unique("counter"));
    env.llm
        .push(
            MODEL,
            call(
                "terminal",
                json!({"command": format!("echo run >> {counter}; sleep 60")}),
            ),
        )
        .push(MODEL, say("checked: it ran once"));
    let msg = unique("om_resume");
    accept(&env.app, &thread, &msg, "count").await;
    eventually("the command to run", Duration::from_secs(20), || async {
        std::fs::read_to_string(&counter).is_ok_and(|s| s.lines().count() == 1)
    })
    .await;
    // The runner's instance dies mid-command.
    env.app.state.turns.halt_abruptly();
    let other = builder(&env.llm, &env.lark, &env.control)
        .var("SSHMODE_TURN_LEASE_SECS", "2")
        .database(&env.app.db_url)
        .var(
            "SSHMODE_MASTER_KEY_FILE",
            &env.app.state.config.master_key_file.display().to_string(),
        )
        .spawn()
        .await;
    assert_eq!(wait_turns_ended(&other, &thread, 1).await, vec!["done"]);
    let r = tool_results(&env.llm);
    assert_eq!(r.len(), 1);
    assert!(r[0].starts_with("interrupted, outcome unknown"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(&counter).unwrap(),
        "run\n",
        "ran exactly once"
    );
    assert_eq!(
        replies_to(&env.lark, &msg),
        vec![(true, "checked: it ran once".to_string())]
    );
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM turns WHERE section_id = $1")
        .bind(&thread)
        .fetch_one(&other.state.db)
        .await
        .unwrap();
    assert_eq!(attempts, 2);
    // The command ran, so it is audited, as interrupted on a backend no longer known.
    let audited: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT subject, outcome, detail->>'command' FROM audit_log
          WHERE action = 'command.run' AND section = $1",
    )
    .bind(&thread)
    .fetch_all(&other.state.db)
    .await
    .unwrap();
    assert_eq!(audited.len(), 1, "{audited:?}");
    let (subject, outcome, command) = &audited[0];
    assert_eq!(
        (subject.as_str(), outcome.as_str()),
        ("unknown", "interrupted")
    );
    // (The counter's long random name reads as an opaque token and is redacted.)
    assert!(
        command.starts_with("echo run >> ") && command.ends_with("; sleep 60"),
        "{command}"
    );
    let _ = std::fs::remove_file(&counter);
}

#[tokio::test]
async fn a_resumed_turn_whose_answer_was_stored_posts_it_once() {
    let env = env(&[("SSHMODE_TURN_LEASE_SECS", "2")]).await;
    let section = unique("oc_once");
    let msg = unique("om_once");
    // The reply is held by Lark: the answer is stored and being sent when the runner dies.
    env.lark.hold("/reply");
    env.llm.push(MODEL, say("the answer"));
    accept(&env.app, &section, &msg, "q").await;
    env.lark
        .wait_until("the reply being sent", |r| {
            r.iter().any(|r| r.path.contains("/reply"))
        })
        .await;
    env.app.state.turns.halt_abruptly();
    env.lark.release();
    let other = builder(&env.llm, &env.lark, &env.control)
        .var("SSHMODE_TURN_LEASE_SECS", "2")
        .database(&env.app.db_url)
        .spawn()
        .await;
    assert_eq!(wait_turns_ended(&other, &section, 1).await, vec!["done"]);
    assert_eq!(
        env.llm.count(MODEL),
        1,
        "the stored answer is not asked for again"
    );
    let posted: Vec<Value> = env
        .lark
        .posted()
        .into_iter()
        .filter(|p| p["parent_id"] == msg.as_str())
        .collect();
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert!(
        replies_to(&env.lark, &msg).len() >= 2,
        "sent again, deduplicated by uuid"
    );
}

#[tokio::test]
async fn bounds_end_the_turn_and_say_which() {
    let env = env(&[
        ("SSHMODE_MAX_ITERATIONS", "3"),
        ("SSHMODE_TOOL_TIMEOUT_SECS", "1"),
    ])
    .await;
    // Iterations.
    let s1 = unique("oc_iter");
    for i in 0..3 {
        env.llm.push(
            MODEL,
            call("terminal", json!({"command": format!("echo {i}")})),
        );
    }
    accept(&env.app, &s1, "om_iter", "loop").await;
    assert_eq!(wait_turns_ended(&env.app, &s1, 1).await, vec!["bounded"]);
    let r = replies_to(&env.lark, "om_iter");
    assert!(r[0].1.contains("limit of 3 model steps"), "{r:?}");
    assert!(r[0].1.contains("echo 2"), "{r:?}");
    assert_eq!(reactions(&env.lark, "om_iter"), vec!["OnIt", "CrossMark"]);

    // Repetition, and the per-tool timeout.
    let s2 = unique("oc_repeat");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "sleep 5"})));
    for _ in 0..2 {
        env.llm
            .push(MODEL, call("terminal", json!({"command": "echo same"})));
    }
    env.llm.push(MODEL, say("unused"));
    let env2 = env;
    accept(&env2.app, &s2, "om_repeat", "repeat").await;
    assert_eq!(wait_turns_ended(&env2.app, &s2, 1).await, vec!["bounded"]);
    let r = replies_to(&env2.lark, "om_repeat");
    assert!(r[0].1.contains("limit of 3 model steps"), "{r:?}");
    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT message->>'content' FROM agent_messages WHERE section_id = $1 AND kind = 'tool' ORDER BY id",
    )
    .bind(&s2)
    .fetch_all(&env2.app.state.db)
    .await
    .unwrap();
    assert!(stored[0].contains("timed out"), "{stored:?}");
}

#[tokio::test]
async fn the_same_call_with_the_same_result_three_times_ends_the_turn() {
    let env = env(&[]).await;
    let s = unique("oc_same");
    env.llm
        .always(MODEL, call("terminal", json!({"command": "echo same"})));
    accept(&env.app, &s, "om_same", "go").await;
    assert_eq!(wait_turns_ended(&env.app, &s, 1).await, vec!["bounded"]);
    env.llm.heal(MODEL);
    let r = replies_to(&env.lark, "om_same");
    assert!(r[0].1.contains("same result 3 times"), "{r:?}");
    assert_eq!(env.llm.count(MODEL), 3);
}

#[tokio::test]
async fn the_turn_budget_stops_a_long_command() {
    let env = env(&[("SSHMODE_TURN_BUDGET_SECS", "1")]).await;
    let s = unique("oc_budget");
    env.llm
        .push(MODEL, call("terminal", json!({"command": "sleep 30"})));
    accept(&env.app, &s, "om_budget", "go").await;
    assert_eq!(wait_turns_ended(&env.app, &s, 1).await, vec!["bounded"]);
    let r = replies_to(&env.lark, "om_budget");
    assert!(r[0].1.contains("time budget"), "{r:?}");
    assert!(r[0].1.contains("sleep 30"), "{r:?}");
}

#[tokio::test]
async fn history_survives_a_restart_and_old_tool_output_is_masked_first() {
    let env = env(&[("SSHMODE_CONTEXT_TOKENS", "1000")]).await;
    let s = unique("omt_hist");
    env.llm
        .push(
            MODEL,
            call("execute_code", json!({"code": "print('x' * 6000)"})),
        )
        .push(MODEL, say("printed"));
    accept(&env.app, &s, "om_h1", "remember 42").await;
    wait_turns_ended(&env.app, &s, 1).await;
    let db = env.app.db_url.clone();
    let Env {
        app,
        llm,
        lark,
        control,
        ..
    } = env;
    app.stop().await;
    let app = builder(&llm, &lark, &control)
        .var("SSHMODE_CONTEXT_TOKENS", "1000")
        .database(&db)
        .spawn()
        .await;
    llm.push(MODEL, call("terminal", json!({"command": "true"})))
        .push(MODEL, call("terminal", json!({"command": "true"})))
        .push(MODEL, call("terminal", json!({"command": "true"})))
        .push(MODEL, say("42"));
    app.state
        .agent
        .accept(&request(&s, "om_h2", "what was it?"))
        .await
        .unwrap();
    wait_turns_ended(&app, &s, 2).await;
    let last = llm.requests().last().cloned().unwrap();
    let body = last.body["messages"].to_string();
    assert!(body.contains("what was it?"), "{body}");
    // The first turn is still in the context (or its summary), its big output masked.
    assert!(body.contains("remember 42"), "{body}");
    assert!(!body.contains(&"x".repeat(6000)), "old output masked");
    // Nothing was deleted from the stored log.
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_messages WHERE section_id = $1 AND message::text LIKE '%xxxxxxxxxx%'",
    )
    .bind(&s)
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    assert_eq!(stored, 1);
}

/// Past the token budget, the oldest whole turns give way to a stored summary; the stored log
/// keeps every message.
#[tokio::test]
async fn the_oldest_turns_are_summarised_once_the_context_is_full() {
    let env = env(&[("SSHMODE_CONTEXT_TOKENS", "1500")]).await;
    let s = unique("omt_summary");
    let question = |n: usize| format!("question {n}: {}", "q".repeat(800));
    for n in 0..6 {
        env.llm.push(MODEL, say(&format!("answer {n}")));
        accept(&env.app, &s, &unique("om_summary"), &question(n)).await;
        assert_eq!(wait_turns_ended(&env.app, &s, n + 1).await.len(), n + 1);
    }
    let last = env.llm.requests().last().cloned().unwrap();
    let messages = last.body["messages"].as_array().unwrap().clone();
    let content = |m: &Value| m["content"].as_str().unwrap_or_default().to_string();
    let summary = content(&messages[1]);
    assert!(
        summary.starts_with("Summary of the earlier conversation in this thread:"),
        "{messages:?}"
    );
    assert!(summary.contains("- user: question 0: qqq"), "{summary}");
    assert!(summary.contains("- you answered: answer 0"), "{summary}");
    // The summarised turns are no longer sent as messages; the newest is sent whole.
    assert!(
        !messages[2..]
            .iter()
            .any(|m| content(m).starts_with("question 0:")),
        "{messages:?}"
    );
    assert_eq!(content(messages.last().unwrap()), question(5));
    // The budget holds: about bytes / 4 tokens in all.
    assert!(last.body["messages"].to_string().len() / 4 <= 1500 + 100);
    // The summary was stored, and nothing left the stored log.
    let (summaries, through): (i64, Option<i64>) = sqlx::query_as(
        "SELECT count(*), max(through_id) FROM agent_summaries WHERE section_id = $1",
    )
    .bind(&s)
    .fetch_one(&env.app.state.db)
    .await
    .unwrap();
    assert!(summaries >= 1 && through.is_some());
    let users: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_messages WHERE section_id = $1 AND kind = 'user'",
    )
    .bind(&s)
    .fetch_one(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(users, 6);
}

#[tokio::test]
async fn a_runner_that_loses_its_lease_kills_its_command_and_writes_nothing_more() {
    let env = env(&[]).await;
    let s = unique("omt_fenced");
    let ws = workspace(&env.app, &s).await;
    env.llm.push(
        MODEL,
        call(
            "terminal",
            json!({"command": format!("echo $$ > pid; : {s}; while [ ! -f go ]; do sleep 0.05; done; echo finished")}),
        ),
    );
    env.llm.push(MODEL, say("should not be sent"));
    let msg = unique("om_fenced");
    accept(&env.app, &s, &msg, "block").await;
    let pid_file = ws.join("pid");
    eventually("the command to start", Duration::from_secs(20), || async {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| p.trim().parse::<u32>().is_ok())
    })
    .await;
    // Another runner claims the section (as after an expired lease): the generation moves on.
    sqlx::query(
        "UPDATE turn_sections SET generation = generation + 1, holder = 'elsewhere',
                lease_until = now() + interval '10 minutes' WHERE section_id = $1",
    )
    .bind(&s)
    .execute(&env.app.state.db)
    .await
    .unwrap();
    // The command runs in a PID namespace of its own: found here by the section id in its
    // command line, not by the pid it sees.
    eventually(
        "the command to be killed",
        Duration::from_secs(10),
        || async {
            !std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
                e.file_name().to_string_lossy().parse::<u32>().is_ok()
                    && std::fs::read(e.path().join("cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&s))
            })
        },
    )
    .await;
    // Once the runner has let go of the section it writes nothing more: what it tried to
    // write before that must have been refused.
    eventually(
        "the runner to let go of the section",
        Duration::from_secs(20),
        || async { env.app.state.turns.sections_held() == 0 },
    )
    .await;
    let tool_rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_messages WHERE section_id = $1 AND kind = 'tool'",
    )
    .bind(&s)
    .fetch_one(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(
        tool_rows, 0,
        "a write stamped with the old generation was refused"
    );
    assert_eq!(turn_states(&env.app, &s).await, vec!["running"]);
    assert!(replies_to(&env.lark, &msg).is_empty());
    assert_eq!(env.llm.count(MODEL), 1);
}

#[tokio::test]
async fn a_fenced_write_waits_for_a_claim_in_progress_and_is_refused_after_it() {
    use sshmode::turns::{Fence, Fenced};
    let app = TestApp::spawn().await;
    let db = app.state.db.clone();
    let s = unique("omt_fence");
    sqlx::query("INSERT INTO turn_sections (section_id, generation) VALUES ($1, 5)")
        .bind(&s)
        .execute(&db)
        .await
        .unwrap();
    assert!(matches!(
        Fence::at(db.clone(), &s, 4).begin().await,
        Err(Fenced::Lost)
    ));
    // A write in progress holds the claim's share lock: a new claim waits for it …
    let tx = Fence::at(db.clone(), &s, 5).begin().await.unwrap();
    let claim = {
        let db = db.clone();
        let s = s.clone();
        tokio::spawn(async move {
            sqlx::query(
                "UPDATE turn_sections SET generation = generation + 1 WHERE section_id = $1",
            )
            .bind(&s)
            .execute(&db)
            .await
            .unwrap();
        })
    };
    // The claim's UPDATE is seen waiting for a lock the write holds.
    eventually(
        "the claim to wait for the write's lock",
        Duration::from_secs(20),
        || {
            let db = db.clone();
            async move {
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE 'UPDATE turn_sections SET generation = generation + 1%')",
                )
                .fetch_one(&db)
                .await
                .unwrap()
            }
        },
    )
    .await;
    assert!(
        !claim.is_finished(),
        "the claim waits for the write in progress"
    );
    tx.commit().await.unwrap();
    claim.await.unwrap();
    // … and after it, the old generation writes nothing.
    assert!(matches!(
        Fence::at(db.clone(), &s, 5).begin().await,
        Err(Fenced::Lost)
    ));
    assert!(Fence::at(db, &s, 6).begin().await.is_ok());
}

#[tokio::test]
async fn a_second_stop_drops_the_waiting_messages() {
    let env = env(&[]).await;
    let s = unique("omt_drop");
    env.llm.push(
        MODEL,
        call(
            "terminal",
            json!({"command": "while [ ! -f go ]; do sleep 0.05; done"}),
        ),
    );
    accept(&env.app, &s, "om_d1", "block").await;
    eventually("the tool to start", Duration::from_secs(20), || {
        tool_started(&env.app, &s)
    })
    .await;
    accept(&env.app, &s, "om_d2", "waits").await;
    let first = env.app.state.agent.stop(&s, "ou_user").await.unwrap();
    assert!(first.contains("1 waiting message will run next"), "{first}");
    let second = env.app.state.agent.stop(&s, "ou_user").await.unwrap();
    assert_eq!(second, "Dropped 1 waiting message.");
    assert_eq!(wait_turns_ended(&env.app, &s, 1).await, vec!["stopped"]);
    assert_eq!(reactions(&env.lark, "om_d2"), vec!["OnIt", "CrossMark"]);
    assert!(replies_to(&env.lark, "om_d2").is_empty());
    assert_eq!(
        env.app.state.agent.stop(&s, "ou_user").await.unwrap(),
        sshmode::chat::NOTHING_RUNNING
    );
    assert_eq!(turn_states(&env.app, &s).await, vec!["stopped"]);
}

/// Two calls in one reply; the runner's instance dies while call `blocking` (0 or 1) runs.
/// Another instance resumes: the call that was running is reported interrupted and not run
/// again, the other one ran exactly once — so a start mark written in the same commit as the
/// reply (first call) or as the previous result (second call) marks exactly the call that
/// started, no more and no less.
async fn hard_stop_during_call(blocking: usize) {
    let shared = tempfile::tempdir().unwrap();
    let root = shared.path().join("workspaces");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::set_permissions(
        shared.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let root = root.display().to_string();
    let vars = [
        ("SSHMODE_TURN_LEASE_SECS", "2"),
        ("SSHMODE_WORKSPACE_ROOT", root.as_str()),
    ];
    let env = env(&vars).await;
    let s = unique("omt_two_calls");
    let ws = workspace(&env.app, &s).await;
    let command = |name: &str, i: usize| {
        let block = if i == blocking { "; sleep 60" } else { "" };
        json!({"command": format!("echo run >> {name}.count{block}")})
    };
    env.llm
        .push(
            MODEL,
            calls(&[
                ("terminal", command("first", 0)),
                ("terminal", command("second", 1)),
            ]),
        )
        .push(MODEL, say("checked"));
    let msg = unique("om_two_calls");
    accept(&env.app, &s, &msg, "two calls").await;
    let name = ["first", "second"][blocking];
    let counter = ws.join(format!("{name}.count"));
    eventually(
        "the blocking call to run",
        Duration::from_secs(20),
        || async { std::fs::read_to_string(&counter).is_ok_and(|s| s.lines().count() == 1) },
    )
    .await;
    env.app.state.turns.halt_abruptly();
    let other = builder(&env.llm, &env.lark, &env.control)
        .var("SSHMODE_TURN_LEASE_SECS", "2")
        .var("SSHMODE_WORKSPACE_ROOT", &root)
        .database(&env.app.db_url)
        .spawn()
        .await;
    assert_eq!(wait_turns_ended(&other, &s, 1).await, vec!["done"]);
    let r = tool_results(&env.llm);
    assert_eq!(r.len(), 2, "{r:?}");
    for (i, result) in r.iter().enumerate() {
        assert_eq!(
            result.starts_with("interrupted, outcome unknown"),
            i == blocking,
            "{r:?}"
        );
    }
    for name in ["first", "second"] {
        assert_eq!(
            std::fs::read_to_string(ws.join(format!("{name}.count"))).unwrap(),
            "run\n",
            "{name} ran exactly once"
        );
    }
    assert_eq!(
        replies_to(&env.lark, &msg),
        vec![(true, "checked".to_string())]
    );
}

#[tokio::test]
async fn a_hard_stop_in_the_first_of_two_calls_runs_the_second_once_on_resume() {
    hard_stop_during_call(0).await;
}

#[tokio::test]
async fn a_hard_stop_in_the_second_of_two_calls_keeps_the_first_result_on_resume() {
    hard_stop_during_call(1).await;
}

/// The turn's rows and their event-log entries are written in one statement that takes the
/// section's log lock inside it; other writers of the same log (commands, replies) append
/// at the same time. Nothing is refused or lost, and the log stays one gap-free sequence.
#[tokio::test]
async fn event_log_entries_of_a_turn_and_of_other_writers_interleave_without_loss() {
    let env = env(&[]).await;
    let s = unique("omt_log_race");
    const CALLS: usize = 12;
    for i in 0..CALLS {
        env.llm.push(
            MODEL,
            call("terminal", json!({"command": format!("echo step {i}")})),
        );
    }
    env.llm.push(MODEL, say("all steps done"));
    let stop = tokio_util::sync::CancellationToken::new();
    let noise = {
        let (db, s, stop) = (env.app.state.db.clone(), s.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.is_cancelled() && n < 2000 {
                sshmode::eventlog::append(&db, &s, "test.noise", json!({ "n": n }))
                    .await
                    .expect("a concurrent append is never refused");
                n += 1;
            }
            n
        })
    };
    accept(&env.app, &s, &unique("om_log_race"), "go").await;
    assert_eq!(wait_turns_ended(&env.app, &s, 1).await, vec!["done"]);
    stop.cancel();
    let noise = noise.await.unwrap();
    assert!(noise > 0);
    let seqs: Vec<i64> =
        sqlx::query_scalar("SELECT seq FROM session_events WHERE section_id = $1 ORDER BY seq")
            .bind(&s)
            .fetch_all(&env.app.state.db)
            .await
            .unwrap();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    let kinds = event_kinds(&env.app, &s).await;
    let count = |k: &str| kinds.iter().filter(|(kind, _)| kind == k).count();
    let rows = |kind: &'static str| {
        let db = env.app.state.db.clone();
        let s = s.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM agent_messages WHERE section_id = $1 AND kind = $2",
            )
            .bind(&s)
            .bind(kind)
            .fetch_one(&db)
            .await
            .unwrap() as usize
        }
    };
    // Every step was stored at the first try (no write failed, so the turn never had to be
    // resumed), each with its entry.
    let turn: Vec<_> = kinds.iter().filter(|(k, _)| k != "test.noise").collect();
    assert_eq!(rows("tool").await, CALLS, "{turn:?}");
    assert_eq!(count("agent.tool"), CALLS, "{turn:?}");
    assert_eq!(rows("assistant").await, CALLS + 1, "{turn:?}");
    assert_eq!(count("agent.step"), CALLS + 1, "{turn:?}");
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM turns WHERE section_id = $1")
        .bind(&s)
        .fetch_one(&env.app.state.db)
        .await
        .unwrap();
    assert_eq!(attempts, 1);
    assert_eq!(count("test.noise"), noise as usize);
}
