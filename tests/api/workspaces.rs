//! Workspace permissions end to end, on both backends: the scripted fake model asks for tools,
//! the agent runs them on a local section (sandboxed) or one bound to the real sshd, and the
//! workspace's permission decides what runs — `read`, `read-write`, `full`, and the target's
//! maximum that caps them. Every refusal is checked for its effect (nothing happened) and its
//! audit row. At `read` on a target, a listener on 127.0.0.1 receives nothing through
//! `/dev/tcp`, and a hostile repository's text converter and hook do not run, each against a
//! control at `full` where they do.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use sshmode::exec::Place;
use sshmode::target::cli::{SetArgs, TargetCmd};
use sshmode::workspace::{self, Choice, LocalRules, Mode, Permission};

use crate::agent::{Env, MODEL, accept, calls, say, tool_results, unique, wait_turns_ended};
use crate::helpers::TestApp;
use crate::sshd;

/// The account local tools run as (the tests run as root; without root, this user).
fn tools_user() -> String {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return "sshmode-tools".into();
    }
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn sh(script: &str) {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One backend under test: where the section runs, its workspace on the host, who owns it,
/// and a writable place for markers that is outside the workspace.
struct Backend {
    place: Place,
    /// The workspace directory as `/workspace set` is given it.
    asked: String,
    /// The same directory on this machine's disk (the sshd runs here too).
    dir: PathBuf,
    owner: String,
    /// A directory outside the workspace that the backend user may write.
    outside: PathBuf,
}

/// The app with a fake model and chat control; with `remote`, a target `web` on a fresh sshd.
async fn env(remote: bool) -> Env {
    // These tests are about permissions: a command the guard asks about is refused here
    // (approvals have their own tests).
    let b = Env::builder().vars(&[("SSHMODE_LOCAL_RISKY", "refuse")]);
    if remote { b.target("web") } else { b }.spawn().await
}

/// Prepares a workspace with a file `x`, a file `f`, a directory `d` and a git repository
/// `repo` whose `core.fsmonitor` hook leaves `marker` when git runs it.
fn prepare(env: &Env, section: &str, remote: bool) -> (Backend, PathBuf) {
    let tag = unique("ws");
    let b = if remote {
        let home = PathBuf::from(format!("/home/{}", sshd::USER));
        Backend {
            place: Place::Target("web".into()),
            asked: format!("~/{tag}"),
            dir: home.join(&tag),
            owner: sshd::USER.into(),
            outside: home.join(format!("{tag}_out")),
        }
    } else {
        let root = std::fs::canonicalize(&env.app.state.config.exec.workspace_root).unwrap();
        Backend {
            place: Place::Local,
            asked: format!("projects/{tag}"),
            dir: root.join("projects").join(&tag),
            owner: tools_user(),
            // The section's own tmp: writable by its commands whatever the workspace.
            outside: env
                .app
                .state
                .config
                .exec
                .local
                .data_dir
                .join("tmp")
                .join(sshmode::exec::local::workspace_dir_name(section)),
        }
    };
    env.control.bind(section, b.place.clone());
    let marker = b.outside.join("fsmonitor-ran");
    std::fs::create_dir_all(b.dir.join("d")).unwrap();
    std::fs::create_dir_all(&b.outside).unwrap();
    std::fs::write(b.dir.join("x"), "the x file\n").unwrap();
    std::fs::write(b.dir.join("f"), "keep me\n").unwrap();
    std::fs::write(b.dir.join("d/inner"), "inner\n").unwrap();
    let hook = b.dir.join("fsmonitor.sh");
    std::fs::write(
        &hook,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", marker.display()),
    )
    .unwrap();
    let repo = b.dir.join("repo");
    sh(&format!(
        "chmod 755 '{hook}' && git init -q '{repo}' && cd '{repo}' && echo tracked > t.txt && \
         git add t.txt && git -c user.name=t -c user.email=t@example.com commit -qm one && \
         git config core.fsmonitor '{hook}' && chown -R '{owner}' '{dir}' '{outside}'",
        hook = hook.display(),
        repo = repo.display(),
        owner = b.owner,
        dir = b.dir.display(),
        outside = b.outside.display(),
    ));
    (b, marker)
}

async fn choose(env: &Env, section: &str, b: &Backend, permission: Permission) {
    let rules = LocalRules::from_config(&env.app.state.config.exec);
    let choice = Choice {
        dir: b.asked.clone(),
        permission: Some(permission),
        mode: Some(Mode::Dev),
    };
    let r = workspace::set(
        &env.app.state.db,
        &rules,
        "ou_user",
        section,
        &b.place,
        &choice,
    )
    .await
    .unwrap();
    let ws = r.unwrap_or_else(|why| panic!("workspace refused: {why}"));
    assert_eq!(ws.permission, permission);
}

/// Runs one turn in which the model makes `list` calls, and returns their results after the
/// `[where] ` each starts with (checked to name the backend).
async fn turn(env: &Env, section: &str, n: usize, list: &[(&str, Value)]) -> Vec<String> {
    turn_raw(env, section, n, list)
        .await
        .into_iter()
        .map(|r| {
            let (head, rest) = r
                .split_once("] ")
                .unwrap_or_else(|| panic!("a result names where it ran: {r}"));
            assert!(
                head == "[local" || head.starts_with(&format!("[web · {}@127.0.0.1:", sshd::USER)),
                "a result names where it ran: {r}"
            );
            rest.to_string()
        })
        .collect()
}

/// [`turn`], the results as the model received them.
async fn turn_raw(env: &Env, section: &str, n: usize, list: &[(&str, Value)]) -> Vec<String> {
    env.llm.push(MODEL, calls(list)).push(MODEL, say("done"));
    accept(&env.app, section, &unique("om_ws"), "go").await;
    let states = wait_turns_ended(&env.app, section, n).await;
    assert_eq!(states.last().map(String::as_str), Some("done"));
    let all = tool_results(&env.llm);
    all[all.len() - list.len()..].to_vec()
}

/// The reasons of the refused tool calls audited for `section`, by what refused them.
async fn refusals(app: &TestApp, section: &str, by: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT detail->>'tool' FROM audit_log WHERE action = 'tool.refused' AND section = $1 \
         AND outcome = 'refused' AND detail->>'by' = $2 ORDER BY id",
    )
    .bind(section)
    .bind(by)
    .fetch_all(&app.state.db)
    .await
    .unwrap()
}

fn refused_by_read(r: &str) -> bool {
    r.starts_with("error:") && r.contains("`read`")
}

/// An app (with the sshd as target `web` when `remote`, its maximum raised to `full`), a new
/// section bound to the backend, and its prepared workspace.
async fn setup(remote: bool, prefix: &str) -> (Env, String, Backend, PathBuf) {
    let env = env(remote).await;
    let section = unique(prefix);
    let (b, marker) = prepare(&env, &section, remote);
    if remote {
        set_max(&env.app, "web", "full").await;
        refuse_risky(&env.app, "web").await;
    }
    (env, section, b, marker)
}

async fn read_is_strict(remote: bool) {
    let (env, section, b, marker) = setup(remote, "omt_read").await;

    // Control: at `full` git runs the repository's fsmonitor hook, so the test can fail.
    choose(&env, &section, &b, Permission::Full).await;
    let r = turn(
        &env,
        &section,
        1,
        &[("terminal", json!({"command": "cd repo && git status"}))],
    )
    .await;
    assert!(r[0].contains("exit code: 0"), "{r:?}");
    assert!(marker.exists(), "the hook ran at full: {r:?}");
    std::fs::remove_file(&marker).unwrap();

    choose(&env, &section, &b, Permission::Read).await;
    let refused_commands = [
        "cat x > y",
        "ls; rm -rf d",
        "sh -c 'rm f'",
        "find . -delete",
        "rg --pre sh x",
        "sort -o f x",
        "echo f | xargs rm",
    ];
    let mut list: Vec<(&str, Value)> = vec![
        ("write_file", json!({"path": "new.txt", "content": "no"})),
        (
            "patch",
            json!({"path": "f", "old_string": "keep", "new_string": "lose"}),
        ),
        ("execute_code", json!({"code": "print('ran')"})),
        ("terminal", json!({"command": "cat x"})),
        ("terminal", json!({"command": "cd repo && git status"})),
    ];
    for c in refused_commands {
        list.push(("terminal", json!({ "command": c })));
    }
    let r = turn(&env, &section, 2, &list).await;
    for (i, tool) in ["write_file", "patch", "execute_code"].iter().enumerate() {
        assert!(refused_by_read(&r[i]), "{tool}: {}", r[i]);
    }
    assert!(r[3].contains("the x file"), "cat is allowed: {}", r[3]);
    assert!(
        r[4].contains("exit code: 0") && r[4].contains("nothing to commit"),
        "git status runs: {}",
        r[4]
    );
    assert!(
        !marker.exists(),
        "git status ran the fsmonitor hook at read"
    );
    for (c, out) in refused_commands.iter().zip(&r[5..]) {
        assert!(refused_by_read(out), "{c}: {out}");
    }
    // Nothing happened.
    assert!(!b.dir.join("new.txt").exists());
    assert!(!b.dir.join("y").exists());
    assert_eq!(
        std::fs::read_to_string(b.dir.join("f")).unwrap(),
        "keep me\n"
    );
    assert!(b.dir.join("d/inner").exists());
    // Every refusal is audited, and names the tool.
    let audited = refusals(&env.app, &section, "permission").await;
    assert_eq!(
        audited.len(),
        3 + refused_commands.len(),
        "audited: {audited:?}"
    );
    assert_eq!(&audited[..3], ["write_file", "patch", "execute_code"]);
}

#[tokio::test]
async fn read_refuses_changes_and_allows_looking_locally() {
    read_is_strict(false).await;
}

#[tokio::test]
async fn read_refuses_changes_and_allows_looking_on_a_target() {
    if !sshd::available() {
        return;
    }
    read_is_strict(true).await;
}

async fn read_write_stays_inside(remote: bool) {
    let env = env(remote).await;
    let section = unique("omt_rw");
    let (b, _) = prepare(&env, &section, remote);
    std::os::unix::fs::symlink(&b.outside, b.dir.join("link")).unwrap();
    // A file outside the workspace (and, locally, outside the section's tmp too) that the
    // backend user could delete if nothing stopped it.
    let tag = b.dir.file_name().unwrap().to_string_lossy().into_owned();
    let other = b.dir.with_file_name(format!("{tag}_other"));
    std::fs::create_dir_all(&other).unwrap();
    let victim = other.join("victim");
    std::fs::write(&victim, "outside\n").unwrap();
    sh(&format!("chown -R '{}' '{}'", b.owner, other.display()));
    choose(&env, &section, &b, Permission::ReadWrite).await;

    let escape = b.dir.with_file_name(format!("{tag}_escape.txt"));
    let mut list: Vec<(&str, Value)> = vec![
        (
            "write_file",
            json!({"path": "inside.txt", "content": "one\n"}),
        ),
        (
            "patch",
            json!({"path": "inside.txt", "old_string": "one", "new_string": "two"}),
        ),
        (
            "write_file",
            json!({"path": format!("../{tag}_escape.txt"), "content": "no"}),
        ),
        ("write_file", json!({"path": "link/x.txt", "content": "no"})),
        ("terminal", json!({"command": "rm inside.txt"})),
        ("terminal", json!({"command": "echo more >> inside.txt"})),
    ];
    if !remote {
        // Locally the sandbox holds the workspace limit even for code nobody can judge.
        list.push((
            "execute_code",
            json!({"code": format!("import os; os.remove({:?}); print('removed')", victim.display().to_string())}),
        ));
    }
    let r = turn(&env, &section, 1, &list).await;
    assert!(r[0].starts_with("wrote"), "{}", r[0]);
    assert!(r[1].starts_with("patched"), "{}", r[1]);
    for (i, what) in [(2, "a ../ escape"), (3, "a symlink out"), (4, "rm")] {
        assert!(
            r[i].starts_with("error:") && r[i].contains("`read-write`"),
            "{what}: {}",
            r[i]
        );
    }
    assert!(r[5].contains("exit code: 0"), "{}", r[5]);
    assert_eq!(
        std::fs::read_to_string(b.dir.join("inside.txt")).unwrap(),
        "two\nmore\n"
    );
    assert!(!escape.exists());
    assert!(!b.outside.join("x.txt").exists());
    if !remote {
        assert!(
            !r[6].contains("exit code: 0") && !r[6].contains("removed"),
            "{}",
            r[6]
        );
    }
    assert!(victim.exists(), "the file outside the workspace survived");
    let audited = refusals(&env.app, &section, "permission").await;
    assert_eq!(audited, ["write_file", "write_file", "terminal"]);
}

#[tokio::test]
async fn read_write_keeps_changes_inside_the_workspace_locally() {
    read_write_stays_inside(false).await;
}

#[tokio::test]
async fn read_write_keeps_changes_inside_the_workspace_on_a_target() {
    if !sshd::available() {
        return;
    }
    read_write_stays_inside(true).await;
}

async fn refuse_risky(app: &TestApp, alias: &str) {
    let set = SetArgs {
        risky: Some(sshmode::config::Risky::Refuse),
        ..crate::exec_ssh::set_args(alias)
    };
    crate::exec_ssh::cli_ok(app, TargetCmd::Set(set)).await;
}

async fn set_max(app: &TestApp, alias: &str, p: &str) {
    let set = SetArgs {
        permission: Permission::parse(p),
        ..crate::exec_ssh::set_args(alias)
    };
    crate::exec_ssh::cli_ok(app, TargetCmd::Set(set)).await;
}

async fn full_is_the_guard_alone(remote: bool) {
    let (env, section, b, _) = setup(remote, "omt_full").await;
    choose(&env, &section, &b, Permission::Full).await;
    let r = turn(
        &env,
        &section,
        1,
        &[
            (
                "terminal",
                json!({"command": "rm f && rm -r d && echo gone"}),
            ),
            ("terminal", json!({"command": "rm -rf /"})),
            // Risky: a person should decide; with the policy `refuse` it is refused.
            (
                "terminal",
                json!({"command": "echo touch asked | base64 -d | sh"}),
            ),
            // A recursive delete outside the workspace asks too.
            (
                "terminal",
                json!({"command": "rm -rf /tmp/sshmode-elsewhere/x"}),
            ),
        ],
    )
    .await;
    assert!(r[0].contains("gone"), "{}", r[0]);
    assert!(!b.dir.join("f").exists() && !b.dir.join("d").exists());
    assert!(r[1].starts_with("error:"), "{}", r[1]);
    assert!(r[2].starts_with("error:"), "{}", r[2]);
    assert!(
        r[2].contains("approval") && r[2].contains("into a shell"),
        "{}",
        r[2]
    );
    assert!(!b.dir.join("asked").exists());
    assert!(r[3].contains("outside the workspace"), "{}", r[3]);
    assert_eq!(
        refusals(&env.app, &section, "guard").await,
        ["terminal", "terminal", "terminal"]
    );
    let verdicts: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'verdict' FROM audit_log WHERE action = 'tool.refused' \
         AND section = $1 AND detail->>'by' = 'guard' ORDER BY id",
    )
    .bind(&section)
    .fetch_all(&env.app.state.db)
    .await
    .unwrap();
    assert_eq!(verdicts, ["refuse", "ask", "ask"]);
    assert!(refusals(&env.app, &section, "permission").await.is_empty());
}

#[tokio::test]
async fn full_allows_what_the_guard_allows_locally() {
    full_is_the_guard_alone(false).await;
}

#[tokio::test]
async fn full_allows_what_the_guard_allows_on_a_target() {
    if !sshd::available() {
        return;
    }
    full_is_the_guard_alone(true).await;
}

#[tokio::test]
async fn the_target_maximum_caps_the_chat_and_an_operator_lowers_it() {
    if !sshd::available() {
        return;
    }
    let env = env(true).await;
    let section = unique("omt_max");
    let (b, _) = prepare(&env, &section, true);
    let rules = LocalRules::from_config(&env.app.state.config.exec);
    let db = &env.app.state.db;

    // The default on a target: the remote home, read-write.
    let ws = workspace::current(db, &rules, &section, &b.place)
        .await
        .unwrap();
    assert_eq!(
        (ws.dir.as_str(), ws.permission),
        ("~", Permission::ReadWrite)
    );

    // A chat cannot go above the maximum; the refusal is audited.
    let choice = Choice {
        dir: b.asked.clone(),
        permission: Some(Permission::Full),
        mode: None,
    };
    let why = workspace::set(db, &rules, "ou_user", &section, &b.place, &choice)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        why.contains("maximum") && why.contains("sshmode target set web"),
        "{why}"
    );
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'workspace.set' AND section = $1 AND outcome = 'refused'",
    )
    .bind(&section)
    .fetch_one(db)
    .await
    .unwrap();
    assert_eq!(refused, 1);

    choose(&env, &section, &b, Permission::ReadWrite).await;
    let r = turn(
        &env,
        &section,
        1,
        &[("write_file", json!({"path": "a.txt", "content": "a"}))],
    )
    .await;
    assert!(r[0].starts_with("wrote"), "{}", r[0]);
    let system = env.llm.requests().last().unwrap().body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.contains("before anything runs, is read-write: ") && system.contains("Mode: dev"),
        "{system}"
    );

    // The operator lowers the maximum: it holds from the next call, without the chat.
    set_max(&env.app, "web", "read").await;
    let ws = workspace::current(db, &rules, &section, &b.place)
        .await
        .unwrap();
    assert_eq!(
        (ws.permission, ws.chosen),
        (Permission::Read, Permission::ReadWrite)
    );
    let r = turn(
        &env,
        &section,
        2,
        &[("write_file", json!({"path": "b.txt", "content": "b"}))],
    )
    .await;
    assert!(refused_by_read(&r[0]), "{}", r[0]);
    assert!(!b.dir.join("b.txt").exists());
    // The prompt of that turn already showed the lowered permission.
    let system = env.llm.requests().last().unwrap().body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        system.contains("before anything runs, is read: "),
        "{system}"
    );
    // The working directory follows the workspace chosen.
    let r = turn(
        &env,
        &section,
        3,
        &[("terminal", json!({"command": "pwd"}))],
    )
    .await;
    assert!(
        r[0].contains(&b.dir.display().to_string()),
        "starts in the workspace: {}",
        r[0]
    );
}

/// Mode and owner of a path, not following a link.
fn owner_and_mode(p: &std::path::Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.mode() & 0o7777)
}

/// Two sections share a directory: A (`full`) works in it, B in `sub/` below it. A swaps
/// `sub` for a link to a directory of the service's; B's next calls are refused (audited as
/// `workspace`), the decoy keeps its owner and mode, and its file is never read.
#[tokio::test]
async fn a_workspace_swapped_for_a_symlink_is_refused_never_followed() {
    let env = env(false).await;
    let (a, b) = (unique("omt_swap_a"), unique("omt_swap_b"));
    let tag = unique("swap");
    let root = std::fs::canonicalize(&env.app.state.config.exec.workspace_root).unwrap();
    let shared = root.join("projects").join(&tag);
    std::fs::create_dir_all(&shared).unwrap();
    sh(&format!("chown '{}' '{}'", tools_user(), shared.display()));
    // The decoy: a directory only the service may enter, holding a secret.
    let decoy = tempfile::Builder::new()
        .prefix("sshmode-decoy")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::write(decoy.path().join("secret"), "decoy-secret\n").unwrap();
    sh(&format!("chmod 700 '{}'", decoy.path().display()));
    let before = owner_and_mode(decoy.path());

    let place = |env: &Env, s: &str| env.control.bind(s, Place::Local);
    place(&env, &a);
    place(&env, &b);
    let at = |dir: &str| Backend {
        place: Place::Local,
        asked: dir.to_string(),
        dir: root.join(dir),
        owner: tools_user(),
        outside: decoy.path().to_path_buf(),
    };
    choose(&env, &a, &at(&format!("projects/{tag}")), Permission::Full).await;
    let r = turn(
        &env,
        &a,
        1,
        &[("terminal", json!({"command": "mkdir sub"}))],
    )
    .await;
    assert!(r[0].contains("exit code: 0"), "{}", r[0]);
    choose(
        &env,
        &b,
        &at(&format!("projects/{tag}/sub")),
        Permission::Full,
    )
    .await;
    let r = turn(
        &env,
        &b,
        1,
        &[("terminal", json!({"command": "echo mine > f && pwd"}))],
    )
    .await;
    assert!(
        r[0].contains("exit code: 0") && r[0].contains(&format!("{tag}/sub")),
        "{}",
        r[0]
    );

    let link = format!(
        "mv sub sub.old && ln -s '{}' sub && echo swapped",
        decoy.path().display()
    );
    let r = turn(&env, &a, 2, &[("terminal", json!({ "command": link }))]).await;
    assert!(r[0].contains("swapped"), "{}", r[0]);

    let secret = shared.join("sub/secret").display().to_string();
    let r = turn(
        &env,
        &b,
        2,
        &[
            ("terminal", json!({"command": "cat secret; ls -la"})),
            ("read_file", json!({ "path": secret })),
            ("write_file", json!({"path": "planted", "content": "x"})),
            (
                "execute_code",
                json!({"code": "print(open('secret').read())"}),
            ),
        ],
    )
    .await;
    for out in &r {
        assert!(
            out.starts_with("error:") && out.contains("symlink") && !out.contains("decoy-secret"),
            "{out}"
        );
    }
    assert_eq!(
        refusals(&env.app, &b, "workspace").await,
        ["terminal", "read_file", "write_file", "execute_code"]
    );
    assert_eq!(
        owner_and_mode(decoy.path()),
        before,
        "the decoy was changed"
    );
    assert!(!decoy.path().join("planted").exists());
    assert_eq!(
        std::fs::read_dir(decoy.path()).unwrap().count(),
        1,
        "nothing was added to the decoy"
    );
}

/// A loopback listener that records every connection and every byte sent to it, for a
/// bounded time.
struct Listener {
    port: u16,
    got: Arc<std::sync::Mutex<(usize, Vec<u8>)>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn start() -> Listener {
        use std::io::Read;
        use std::sync::atomic::Ordering;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let got = Arc::new(std::sync::Mutex::new((0usize, Vec::new())));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (g, s) = (got.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
            while !s.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                match l.accept() {
                    Ok((mut c, _)) => {
                        g.lock().unwrap().0 += 1;
                        let _ = c.set_nonblocking(false);
                        let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                        let mut buf = [0u8; 1024];
                        while let Ok(n) = c.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            g.lock().unwrap().1.extend_from_slice(&buf[..n]);
                        }
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
        });
        Listener {
            port,
            got,
            stop,
            thread: Some(thread),
        }
    }

    /// Connections accepted and bytes received so far.
    fn got(&self) -> (usize, Vec<u8>) {
        self.got.lock().unwrap().clone()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test]
async fn read_opens_no_socket_on_a_target() {
    if !sshd::available() {
        return;
    }
    let (env, section, b, _) = setup(true, "omt_sock").await;
    let listener = Listener::start();
    let port = listener.port;
    let send = format!("printf X 0</dev/tcp/127.0.0.1/{port} 1<&0");

    // Control: at `full` the target's bash opens the socket and the listener gets `X`, so
    // this test can fail.
    choose(&env, &section, &b, Permission::Full).await;
    let r = turn(
        &env,
        &section,
        1,
        &[("terminal", json!({ "command": send }))],
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while listener.got().1.is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(listener.got(), (1, b"X".to_vec()), "at full: {r:?}");

    choose(&env, &section, &b, Permission::Read).await;
    let refused_commands = [
        send.clone(),
        format!("printf Y >/dev/tcp/127.0.0.1/{port}"),
        format!("cat </dev/tcp/127.0.0.1/{port}"),
        format!("cat 3<>/dev/tcp/127.0.0.1/{port}"),
        format!("exec 3<>/dev/tcp/127.0.0.1/{port}; printf Z >&3"),
        format!("cat < /dev//tcp/127.0.0.1/{port}"),
        format!("cat <$(echo /dev/tcp/127.0.0.1/{port})"),
        format!("X=/dev/tcp/127.0.0.1/{port}; cat < \"$X\""),
        "ls 2>&5".to_string(),
    ];
    let mut list: Vec<(&str, Value)> = refused_commands
        .iter()
        .map(|c| ("terminal", json!({ "command": c })))
        .collect();
    list.push(("terminal", json!({"command": "cat x"})));
    let r = turn(&env, &section, 2, &list).await;
    for (c, out) in refused_commands.iter().zip(&r) {
        assert!(refused_by_read(out), "{c}: {out}");
        assert!(!out.contains("exit code"), "nothing ran: {c}: {out}");
    }
    assert!(
        r[0].contains("opens a network connection"),
        "the reason is given: {}",
        r[0]
    );
    assert!(
        r.last().unwrap().contains("the x file"),
        "read still runs commands: {r:?}"
    );
    // Nothing more reached the listener.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(listener.got(), (1, b"X".to_vec()), "at read: {r:?}");
    // Every refusal is audited as `tool.refused`, by the permission.
    let audited = refusals(&env.app, &section, "permission").await;
    assert_eq!(audited, vec!["terminal"; refused_commands.len()]);
}

/// A repository whose configuration names a text converter and whose hook runs whenever the
/// index is written: at `full` git runs both (the control); at `read`, behind the preamble,
/// neither, and `git status -v` (which would convert) is refused.
async fn read_runs_no_repository_program(remote: bool) {
    let (env, section, b, _) = setup(remote, "omt_hostile").await;
    let repo = b.dir.join("repo");
    let textconv = b.outside.join("textconv-ran");
    let hook = b.outside.join("hook-ran");
    std::fs::write(repo.join(".gitattributes"), "*.txt diff=evil\n").unwrap();
    std::fs::write(
        repo.join(".git/hooks/post-index-change"),
        format!("#!/bin/sh\ntouch '{}'\n", hook.display()),
    )
    .unwrap();
    sh(&format!(
        "cd '{repo}' && chmod 755 .git/hooks/post-index-change && \
         git -c safe.directory='*' config diff.evil.textconv \"touch '{textconv}'; cat\" && \
         echo two > t.txt && git -c safe.directory='*' -c core.fsmonitor= add t.txt && \
         chown -R '{owner}' .",
        repo = repo.display(),
        textconv = textconv.display(),
        owner = b.owner,
    ));
    let stale = "touch -d '2001-01-01 00:00' t.txt && ";
    let looking = format!("cd repo && git diff --cached && {stale}git diff && git status");

    choose(&env, &section, &b, Permission::Full).await;
    let r = turn(
        &env,
        &section,
        1,
        &[("terminal", json!({ "command": looking }))],
    )
    .await;
    assert!(
        textconv.exists() && hook.exists(),
        "at full git runs the repository's programs, so this test can fail: {r:?}"
    );
    std::fs::remove_file(&textconv).unwrap();
    std::fs::remove_file(&hook).unwrap();
    // The index is stale again, so a `git diff` that may write it would.
    std::fs::File::options()
        .write(true)
        .open(repo.join("t.txt"))
        .unwrap()
        .set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30))
        .unwrap();

    choose(&env, &section, &b, Permission::Read).await;
    let looking = "cd repo && git diff --cached && git diff && git status && git log -p -1";
    let r = turn(
        &env,
        &section,
        2,
        &[
            ("terminal", json!({ "command": looking })),
            ("terminal", json!({"command": "cd repo && git status -v"})),
        ],
    )
    .await;
    assert!(
        r[0].contains("exit code: 0") && r[0].contains("+two"),
        "git runs and shows the change: {}",
        r[0]
    );
    assert!(refused_by_read(&r[1]), "{}", r[1]);
    assert!(
        !textconv.exists(),
        "the text converter ran at read: {}",
        r[0]
    );
    assert!(!hook.exists(), "the hook ran at read: {}", r[0]);
    assert_eq!(
        refusals(&env.app, &section, "permission").await,
        ["terminal"]
    );
}

#[tokio::test]
async fn read_runs_no_repository_program_on_a_target() {
    if !sshd::available() {
        return;
    }
    read_runs_no_repository_program(true).await;
}

/// `terminal`'s `workdir` and `env` hold for one call: judged there, never changing the
/// thread's directory; names checked, values never in an error; at `read` a variable given
/// this way never turns a redirection target or a command word into something allowed.
async fn terminal_options_hold_for_one_call(remote: bool) {
    let (env, section, b, _) = setup(remote, "omt_topts").await;
    std::fs::create_dir_all(b.dir.join("sub")).unwrap();
    sh(&format!(
        "chown -R '{}' '{}'",
        b.owner,
        b.dir.join("sub").display()
    ));
    let tag = b.dir.file_name().unwrap().to_string_lossy().into_owned();
    let other = b.dir.with_file_name(format!("{tag}_wd"));
    std::fs::create_dir_all(&other).unwrap();
    sh(&format!("chown -R '{}' '{}'", b.owner, other.display()));

    choose(&env, &section, &b, Permission::Full).await;
    // Every result starts with where it ran.
    let r = turn_raw(
        &env,
        &section,
        1,
        &[("terminal", json!({"command": "true"}))],
    )
    .await;
    let want = match env.sshd() {
        None => "[local] exit code: 0".to_string(),
        Some(s) => format!("[web · {}@127.0.0.1:{}] exit code: 0", sshd::USER, s.port),
    };
    assert!(r[0].starts_with(&want), "{}", r[0]);
    let r = turn(
        &env,
        &section,
        2,
        &[
            (
                "terminal",
                json!({"command": "pwd; printf '%s|%s\\n' \"$A\" \"$B\"", "workdir": "sub",
                       "env": {"A": "x y", "B": "it's $HOME"}}),
            ),
            ("terminal", json!({"command": "pwd"})),
            (
                "terminal",
                json!({"command": "true", "env": {"BAD-NAME": "secret-value-1"}}),
            ),
            (
                "terminal",
                json!({"command": "true", "workdir": "missing-dir"}),
            ),
        ],
    )
    .await;
    let dir = std::fs::canonicalize(&b.dir).unwrap();
    assert!(
        r[0].contains(&format!("{}/sub\n", dir.display())) && r[0].contains("x y|it's $HOME\n"),
        "{}",
        r[0]
    );
    assert!(
        r[1].contains(&format!("{}\n", dir.display())) && !r[1].contains("/sub"),
        "the thread's directory is untouched: {}",
        r[1]
    );
    assert!(
        r[2].starts_with("error:") && r[2].contains("BAD-NAME") && !r[2].contains("secret-value-1"),
        "{}",
        r[2]
    );
    assert!(
        r[3].contains("exit code: 126") && r[3].contains("cannot enter the workdir"),
        "{}",
        r[3]
    );

    choose(&env, &section, &b, Permission::Read).await;
    let r = turn(
        &env,
        &section,
        3,
        &[
            (
                "terminal",
                json!({"command": "echo hi > \"$F\"", "env": {"F": "made.txt"}}),
            ),
            (
                "terminal",
                json!({"command": "$C made.txt", "env": {"C": "touch"}}),
            ),
        ],
    )
    .await;
    assert!(refused_by_read(&r[0]), "{}", r[0]);
    assert!(refused_by_read(&r[1]), "{}", r[1]);
    assert!(!b.dir.join("made.txt").exists());

    choose(&env, &section, &b, Permission::ReadWrite).await;
    let r = turn(
        &env,
        &section,
        4,
        &[(
            "terminal",
            json!({"command": "echo no > escaped.txt", "workdir": other.display().to_string()}),
        )],
    )
    .await;
    assert!(
        r[0].starts_with("error:") && r[0].contains("`read-write`"),
        "judged in its workdir: {}",
        r[0]
    );
    assert!(!other.join("escaped.txt").exists());
    assert!(!b.dir.join("escaped.txt").exists());
}

#[tokio::test]
async fn terminal_workdir_and_env_hold_for_one_call_locally() {
    terminal_options_hold_for_one_call(false).await;
}

#[tokio::test]
async fn terminal_workdir_and_env_hold_for_one_call_on_a_target() {
    if !sshd::available() {
        return;
    }
    terminal_options_hold_for_one_call(true).await;
}

/// A shared library whose constructor creates `marker`, built in `dir` with the machine's C
/// compiler and owned by `owner`: whatever loads it runs code of the caller's choosing.
pub(crate) fn constructor_library(
    dir: &std::path::Path,
    marker: &std::path::Path,
    owner: &str,
) -> PathBuf {
    let source = dir.join("ctor.c");
    let library = dir.join("libctor.so");
    std::fs::write(
        &source,
        format!(
            "#include <fcntl.h>\n#include <unistd.h>\n\
             __attribute__((constructor)) static void ran(void) {{\n\
             int fd = open({:?}, O_WRONLY | O_CREAT, 0644);\n\
             if (fd >= 0) close(fd);\n}}\n",
            marker.display().to_string()
        ),
    )
    .unwrap();
    sh(&format!(
        "cc -shared -fPIC -o '{lib}' '{src}' && chmod 755 '{lib}' && chown '{owner}' '{lib}' '{src}'",
        lib = library.display(),
        src = source.display(),
    ));
    library
}

/// A call's `env` runs no code below `full`: `LD_PRELOAD` naming a library in the workspace
/// (a chat member can send one as an attachment) loads it into `ls` at `full` (the control),
/// and at `read` and `read-write` is refused before anything runs, naming the variable, and
/// audited; an inert variable still passes.
async fn env_runs_no_code_below_full(remote: bool) {
    let (env, section, b, _) = setup(remote, "omt_env").await;
    let marker = b.outside.join("constructor-ran");
    let library = constructor_library(&b.dir, &marker, &b.owner);
    let preload = json!({"command": "ls", "env": {"LD_PRELOAD": library.display().to_string()}});

    choose(&env, &section, &b, Permission::Full).await;
    let r = turn(&env, &section, 1, &[("terminal", preload.clone())]).await;
    assert!(r[0].contains("exit code: 0"), "{r:?}");
    assert!(
        marker.exists(),
        "the constructor ran at full, so this test can fail: {r:?}"
    );
    std::fs::remove_file(&marker).unwrap();

    let mut turns = 1;
    for permission in [Permission::Read, Permission::ReadWrite] {
        choose(&env, &section, &b, permission).await;
        turns += 1;
        let r = turn(
            &env,
            &section,
            turns,
            &[
                ("terminal", preload.clone()),
                (
                    "terminal",
                    json!({"command": "ls", "env": {"LC_ALL": "C", "BASH_ENV": "x.sh"}}),
                ),
                (
                    "terminal",
                    json!({"command": "ls", "env": {"LC_ALL": "C", "TZ": "UTC"}}),
                ),
            ],
        )
        .await;
        for (i, name) in [(0, "LD_PRELOAD"), (1, "BASH_ENV")] {
            assert!(
                r[i].starts_with("error:")
                    && r[i].contains(&format!("`{permission}`"))
                    && r[i].contains(name)
                    && r[i].contains("LC_*")
                    && !r[i].contains("exit code"),
                "{permission}: {}",
                r[i]
            );
        }
        assert!(
            r[2].contains("exit code: 0") && r[2].contains("libctor.so"),
            "an inert variable passes at {permission}: {}",
            r[2]
        );
        assert!(
            !marker.exists(),
            "the constructor ran at {permission}: {r:?}"
        );
    }
    assert_eq!(
        refusals(&env.app, &section, "permission").await,
        ["terminal"; 4]
    );
}

#[tokio::test]
async fn env_runs_no_code_below_full_locally() {
    env_runs_no_code_below_full(false).await;
}

#[tokio::test]
async fn env_runs_no_code_below_full_on_a_target() {
    if !sshd::available() {
        return;
    }
    env_runs_no_code_below_full(true).await;
}
