//! `sshmode chat` end to end: the real binary with piped input, the scripted fake model, the
//! real sshd as a target and a fresh database. No Lark variables are set.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::fake_llm::{FakeProvider, Reply, completion};
use crate::helpers::fresh_database;
use crate::sshd::{self, Sshd};

const MODEL: &str = "m";
/// The tools account local commands run as when the tests run as root.
const TOOLS_USER: &str = "sshmode-tools";
/// A bound on one whole console run (each line waits for its turn).
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn terminal(command: &str) -> Reply {
    let args = json!({ "command": command });
    completion(
        MODEL,
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "terminal", "arguments": args.to_string()}}]}),
        json!("tool_calls"),
    )
}

fn echo(prefix: &str) -> Reply {
    Reply::EchoTool {
        prefix: prefix.into(),
    }
}

/// The user local commands run as: the tools account under root, else this user.
fn local_user() -> String {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return TOOLS_USER.into();
    }
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

struct Env {
    db_url: String,
    data_dir: tempfile::TempDir,
    llm: FakeProvider,
}

impl Env {
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sshmode"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", &self.db_url)
            .env("SSHMODE_DATA_DIR", self.data_dir.path())
            .env("SSHMODE_LOCAL_USER", TOOLS_USER)
            .env("LLM_BASE_URL", &self.llm.base)
            .env("LLM_API_KEY", "sk-console-test")
            .env("LLM_MODEL", MODEL)
            .current_dir(self.data_dir.path())
            .kill_on_drop(true);
        cmd
    }

    /// Runs `sshmode chat` with `lines` piped in; returns (exit status, stdout, stderr).
    async fn chat(&self, args: &[&str], lines: &[&str]) -> (Option<i32>, String, String) {
        let mut all = vec!["chat"];
        all.extend_from_slice(args);
        let mut child = self
            .command(&all)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(format!("{}\n", lines.join("\n")).as_bytes())
            .await
            .unwrap();
        drop(stdin);
        let out = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
            .await
            .expect("sshmode chat finishes")
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Registers the sshd as the approved target `alias` through `sshmode target add`.
    async fn add_target(&self, sshd: &Sshd, dir: &Path, alias: &str) {
        let key = dir.join(format!("{alias}_key"));
        sshd::new_key(&key, "ed25519", "");
        sshd.authorize(&dir.join(format!("{alias}_key.pub")));
        let port = sshd.port.to_string();
        let key = key.display().to_string();
        let out = self
            .command(&[
                "target",
                "add",
                alias,
                "--host",
                "127.0.0.1",
                "--port",
                &port,
                "--user",
                sshd::USER,
                "--key",
                &key,
                "--approve",
            ])
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The line of `out` that starts with `prefix`.
fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{out}"))
}

#[tokio::test]
async fn console_binds_runs_remotely_resumes_and_returns_to_local() {
    if !sshd::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_below(dir.path());
    let env = Env {
        db_url: fresh_database().await,
        data_dir: tempfile::tempdir().unwrap(),
        llm: FakeProvider::start().await,
    };
    env.add_target(&sshd, dir.path(), "web").await;
    let section = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let sub = format!("d_{section}");

    // First run: bind in place, then a remote command that leaves the shell in a new directory.
    env.llm
        .push(
            MODEL,
            terminal(&format!("mkdir -p ~/{sub} && cd ~/{sub} && id -un")),
        )
        .push(MODEL, echo("remote: "));
    let (code, out, err) = env
        .chat(
            &["--section", &section],
            &[
                "/ssh use web --here",
                &format!("/workspace set ~/{sub} read-write office"),
                "who runs commands there?",
            ],
        )
        .await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("now runs on `web`"), "{out}");
    assert!(line(&out, "remote: ").contains(sshd::USER), "{out}");
    assert!(out.contains("· terminal:"), "progress lines: {out}");
    assert!(
        err.contains(&format!("console:{section}")),
        "the section is named: {err}"
    );

    // Second run, same section: still bound, still in that directory; then back to local.
    env.llm
        .push(MODEL, terminal("pwd; id -un"))
        .push(MODEL, echo("resumed: "))
        .push(MODEL, terminal("id -un"))
        .push(MODEL, echo("local: "));
    let (code, out, err) = env
        .chat(
            &["--section", &section],
            &[
                "where are you?",
                "/workspace show",
                "/ssh local",
                "and now?",
                "/ssh status",
            ],
        )
        .await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    // The workspace chosen in the first run holds in the resumed section.
    assert!(
        out.contains(&format!("Workspace on `web`: `~/{sub}`"))
            && out.contains("Permission: read-write")
            && out.contains("Mode: office"),
        "{out}"
    );
    // Back on local, the local workspace and its permission show in the status.
    assert!(
        out.contains("Workspace on local:") && out.contains("Permission: full"),
        "{out}"
    );
    let resumed = line(&out, "resumed: ");
    assert!(
        resumed.contains(&format!("/home/{}/{sub}", sshd::USER)) && resumed.contains(sshd::USER),
        "{out}"
    );
    assert!(out.contains("Left `web`"), "{out}");
    let local = line(&out, "local: ");
    assert!(local.contains(&local_user()), "{out}");
    assert!(!local.contains(sshd::USER), "{out}");
    // Lines are handled in order: each answer comes after the one before it.
    let pos = |s: &str| out.find(s).unwrap_or_else(|| panic!("{s:?} in {out}"));
    assert!(pos("resumed: ") < pos("Left `web`") && pos("Left `web`") < pos("local: "));

    // The audit names the console user as the actor of the binding.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&env.db_url)
        .await
        .unwrap();
    let actors: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT actor FROM audit_log WHERE actor LIKE 'console:%'")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let me = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let me = String::from_utf8(me.stdout).unwrap();
    assert_eq!(actors, vec![format!("console:{}", me.trim())]);
}

#[tokio::test]
async fn console_without_a_model_still_runs_commands_and_exits_at_end_of_input() {
    let env = Env {
        db_url: fresh_database().await,
        data_dir: tempfile::tempdir().unwrap(),
        llm: FakeProvider::start().await,
    };
    let mut cmd = env.command(&["chat"]);
    cmd.env_remove("LLM_BASE_URL")
        .env_remove("LLM_API_KEY")
        .env_remove("LLM_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"/help\nhello\n/ssh status\n")
        .await
        .unwrap();
    drop(stdin);
    let out = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("/ssh use"), "help: {stdout}");
    assert!(stdout.contains(sshmode::chat::NO_MODEL), "{stdout}");
    assert_eq!(env.llm.requests().len(), 0);
}

/// Waits (bounded) until the request for `message_id` is settled.
async fn settled(db: &sqlx::PgPool, message_id: &str) {
    let deadline = tokio::time::Instant::now() + RUN_LIMIT;
    while sshmode::turns::request_settled(db, message_id)
        .await
        .unwrap()
        != Some(true)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{message_id} never settled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A service's runner leaves console sections to their console (it could not answer them),
/// and the console's runner takes what waits in its section.
#[tokio::test]
async fn console_sections_are_run_by_their_console_only() {
    let llm = FakeProvider::start().await;
    let lark = crate::fake_lark::FakeLark::start().await;
    let app = crate::helpers::TestApp::builder()
        .var("LARK_BASE_URL", &lark.base)
        .var("LLM_BASE_URL", &llm.base)
        .var("LLM_API_KEY", "sk-console-test")
        .var("LLM_MODEL", MODEL)
        .spawn()
        .await;
    let name = format!("s{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let section = format!("console:{name}");
    let request = |section: &str, message_id: &str| sshmode::turns::TurnRequest {
        section: section.into(),
        chat_id: section.into(),
        message_id: message_id.into(),
        sender: "console:someone".into(),
        text: "hello".into(),
        in_thread: true,
    };
    let waiting = format!("{section}:early");
    let lark = format!("om_{name}");
    // Queued first, so a runner that could claim it would take it before the other.
    app.state
        .agent
        .accept(&request(&section, &waiting))
        .await
        .unwrap();
    app.state
        .agent
        .accept(&request(&format!("omt_{name}"), &lark))
        .await
        .unwrap();
    settled(&app.state.db, &lark).await;
    assert_eq!(
        sshmode::turns::request_settled(&app.state.db, &waiting)
            .await
            .unwrap(),
        Some(false),
        "the service's runner must not take a console section"
    );

    llm.always(
        MODEL,
        crate::fake_llm::text(MODEL, "answered in the console"),
    );
    let env = Env {
        db_url: app.db_url.clone(),
        data_dir: tempfile::tempdir().unwrap(),
        llm: llm.clone(),
    };
    let (code, out, err) = env.chat(&["--section", &name], &["and now?"]).await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("answered in the console"), "{out}");
    assert_eq!(
        sshmode::turns::request_settled(&app.state.db, &waiting)
            .await
            .unwrap(),
        Some(true)
    );
    app.stop().await;
}

/// The console asks inline; with piped input the next line answers, and a line that is not
/// an answer denies the call and is then the next message.
#[tokio::test]
async fn console_asks_inline_and_the_next_piped_line_answers() {
    let env = Env {
        db_url: fresh_database().await,
        data_dir: tempfile::tempdir().unwrap(),
        llm: FakeProvider::start().await,
    };
    env.llm
        .push(MODEL, terminal("echo first_ran && rm -rf \"$NOPE_DIR\""))
        .push(MODEL, echo("first: "))
        .push(MODEL, terminal("echo second_ran && rm -r \"$NOPE_DIR\""))
        .push(MODEL, echo("second: "))
        .push(MODEL, crate::fake_llm::text(MODEL, "third: an answer"));
    let (code, out, err) = env
        .chat(&[], &["run the first", "o", "run the second", "what now?"])
        .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out.matches("allow [o]nce / allow in [t]hread / [d]eny?")
            .count(),
        2,
        "{out}"
    );
    assert!(
        out.contains(
            "  allow in thread covers: exactly this command\n    (run in this directory)\n"
        ),
        "{out}"
    );
    assert!(
        line(&out, "first: ").contains("allowed by the requester (console:"),
        "{out}"
    );
    assert!(line(&out, "first: ").contains("first_ran"), "{out}");
    let second = line(&out, "second: ");
    assert!(
        second.contains("denied by the requester (console:") && !second.contains("second_ran"),
        "{out}"
    );
    assert!(out.contains("third: an answer"), "{out}");
    let asked: Vec<String> = env
        .llm
        .requests()
        .iter()
        .filter_map(|r| {
            r.body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str().map(str::to_string))
        })
        .collect();
    assert_eq!(
        asked.last().map(String::as_str),
        Some("what now?"),
        "{asked:?}"
    );
}

#[tokio::test]
async fn console_piped_output_shows_a_running_command_s_lines_as_they_come() {
    let env = Env {
        db_url: fresh_database().await,
        data_dir: tempfile::tempdir().unwrap(),
        llm: FakeProvider::start().await,
    };
    let section = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    env.llm
        .push(
            MODEL,
            terminal(
                "for i in $(seq 3); do printf '\\033[1mstep-%s\\033[0m\\n' $i; sleep 0.7; done",
            ),
        )
        .push(MODEL, crate::fake_llm::text(MODEL, "counted"));
    let (code, out, err) = env
        .chat(&["--section", &section], &["count to three"])
        .await;
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    // Piped: each line once, appended below the step, without escape sequences, before the
    // answer.
    let tail: Vec<&str> = out.lines().filter(|l| l.starts_with("  │ ")).collect();
    assert_eq!(
        tail,
        ["  │ step-1", "  │ step-2", "  │ step-3"],
        "stdout:\n{out}"
    );
    assert!(!out.contains('\u{1b}'), "{out:?}");
    let step = out.find("· terminal:").expect("the step line");
    let first = out.find("  │ step-1").unwrap();
    let answer = out.find("counted").expect("the answer");
    assert!(step < first && first < answer, "{out}");
}

/// `/cron` in the console: added and listed; a console section's due schedule fires while
/// that console runs (its anchor printed, its turn queued), and `serve` leaves it alone.
#[tokio::test]
async fn console_schedules_are_added_listed_and_fired_by_their_console() {
    let env = Env {
        db_url: fresh_database().await,
        data_dir: tempfile::tempdir().unwrap(),
        llm: FakeProvider::start().await,
    };
    let (code, out, err) = env
        .chat(
            &["--section", "cron"],
            &["/cron add \"every 1h\" report the load", "/cron list"],
        )
        .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("⏰ Scheduled #1: `every 1h`"), "{out}");
    assert!(out.contains("#1 `every 1h` (UTC) · next: "), "{out}");
    // Due now: the next run of this console fires it.
    let db = sqlx::PgPool::connect(&env.db_url).await.unwrap();
    sqlx::query("UPDATE schedules SET next_due = now() - interval '1 second' WHERE id = 1")
        .execute(&db)
        .await
        .unwrap();
    // Each model answer takes a moment, so the console is still running when the tick comes.
    env.llm.always(
        MODEL,
        Reply::Delayed(
            Duration::from_millis(1500),
            Box::new(crate::fake_llm::text(MODEL, "done")),
        ),
    );
    let (code, out, err) = env.chat(&["--section", "cron"], &["hello"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("⏰ scheduled #1: report the load"), "{out}");
    let fired: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT state, anchor_message_id FROM schedule_firings WHERE schedule_id = 1",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0].0, "fired");
    let queued: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM turn_requests WHERE schedule_id = 1 AND section_id = 'console:cron'",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(queued, 1);
}
