//! Local tools cannot reach the service's secrets: the clean environment, the tools account,
//! the Landlock sandbox, the file tools beneath the workspace, the embedded cluster's password,
//! the per-command limits, and failing closed. Everything goes through the operations the
//! agent's tools use (`Executors::ops_for(section, &Place::Local)`).

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sshmode::exec::ops::{Ops, ReadRange, RunOptions, SearchRequest, SearchTarget};
use sshmode::exec::{ExecError, Executors, Exit, Place};
use sshmode::store::Store;
use tokio_util::sync::CancellationToken;

use crate::helpers::{TestApp, config_from, eventually};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The local operations of `section`, as the agent's tools get them.
async fn local_ops(app: &TestApp, section: &str) -> Ops {
    app.state
        .exec
        .ops_for(section, &Place::Local)
        .await
        .unwrap()
}

async fn run(ops: &Ops, cmd: &str) -> sshmode::exec::ops::TerminalResult {
    run_for(ops, cmd, Duration::from_secs(30)).await
}

async fn run_for(ops: &Ops, cmd: &str, timeout: Duration) -> sshmode::exec::ops::TerminalResult {
    ops.terminal(
        cmd,
        RunOptions {
            timeout: Some(timeout),
            ..Default::default()
        },
        &CancellationToken::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("`{cmd}` could not run: {e}"))
}

/// How long a test here waits for a process to appear or go.
const WAIT: Duration = Duration::from_secs(15);

const SEEDED: &[(&str, &str)] = &[
    ("LARK_APP_SECRET", "seeded-lark-secret-7f3a"),
    ("LARK_ENCRYPT_KEY", "seeded-encrypt-key-91c2"),
    ("LLM_BASE_URL", "http://127.0.0.1:9/v1"),
    ("LLM_API_KEY", "seeded-llm-key-5d8e"),
    ("LLM_MODEL", "seeded-model-name-2c6d"),
    ("SSHMODE_API_TOKEN", "seeded-api-token-0b4f"),
];

async fn seeded_app() -> TestApp {
    let mut b = TestApp::builder();
    for (k, v) in SEEDED {
        b = b.var(k, v);
    }
    b.spawn().await
}

#[tokio::test]
async fn the_environment_is_an_allow_list() {
    let app = seeded_app().await;
    let ops = local_ops(&app, "omt_env").await;
    let r = run(&ops, "env").await;
    assert!(r.output.exit.success(), "{r:?}");
    let env = text(&r.output.stdout);
    for (_, v) in SEEDED {
        assert!(
            !env.contains(v),
            "`{v}` leaked into a local command:\n{env}"
        );
    }
    // The test process's own environment (which the service inherits) holds the database URL.
    let db = std::env::var("TEST_DATABASE_URL").unwrap();
    assert!(!env.contains(&db), "the database URL leaked:\n{env}");
    let allowed = [
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "LANG", "LANGUAGE", "TZ", "TERM",
        "PWD", "OLDPWD", "SHLVL", "_",
    ];
    for line in env.lines() {
        let name = line.split('=').next().unwrap();
        assert!(
            allowed.contains(&name) || name.starts_with("LC_"),
            "`{name}` is not on the allow-list:\n{env}"
        );
    }
    // HOME is the section's workspace, as `~` is for the file tools.
    let home = ops.backend().home().await.unwrap();
    assert!(env.contains(&format!("HOME={home}\n")), "{env}");
    assert!(home.ends_with("/sections/omt_env"), "{home}");
    let resolved = ops.write_file("~/note", b"x").await.unwrap();
    assert_eq!(resolved, format!("{home}/note"));
}

#[tokio::test]
async fn service_secrets_are_out_of_reach() {
    let app = seeded_app().await;
    let ops = local_ops(&app, "omt_secrets").await;
    let key = app.state.config.master_key_file.display().to_string();
    assert!(std::fs::metadata(&key).is_ok(), "the master key exists");
    let r = run(&ops, &format!("cat {key}")).await;
    assert!(!r.output.exit.success(), "{r:?}");
    assert!(r.output.stdout.is_empty());
    let r = run(&ops, &format!("ls {}", app.state.config.data_dir.display())).await;
    assert!(
        !r.output.exit.success(),
        "the data directory is listable: {r:?}"
    );
    // The service's own environment through /proc.
    let pid = std::process::id();
    let r = run(&ops, &format!("cat /proc/{pid}/environ | tr '\\0' '\\n'")).await;
    let out = text(&r.output.stdout);
    assert!(!out.contains("TEST_DATABASE_URL"), "{out}");
    assert!(out.is_empty(), "{out}");
    // And through the file tools.
    assert!(ops.read_file(&key, ReadRange::Whole).await.is_err());
    assert!(
        ops.read_file(&format!("/proc/{pid}/environ"), ReadRange::Whole)
            .await
            .is_err()
    );
    assert!(ops.write_file(&key, b"overwritten").await.is_err());
    assert_ne!(std::fs::read(&key).unwrap(), b"overwritten");
}

#[tokio::test]
async fn sections_cannot_reach_each_other() {
    let app = TestApp::spawn().await;
    let a = local_ops(&app, "omt_a").await;
    let b = local_ops(&app, "omt_b").await;
    let a_home = a.backend().home().await.unwrap();
    a.write_file("private.txt", b"only a").await.unwrap();
    let r = run(&a, "cat private.txt").await;
    assert_eq!(text(&r.output.stdout), "only a");

    let a_file = format!("{a_home}/private.txt");
    let r = run(&b, &format!("cat {a_file}")).await;
    assert!(
        !r.output.exit.success() && r.output.stdout.is_empty(),
        "{r:?}"
    );
    let r = run(&b, &format!("echo b > {a_home}/from_b; ls {a_home}")).await;
    assert!(!r.output.exit.success(), "{r:?}");
    assert!(!std::path::Path::new(&format!("{a_home}/from_b")).exists());
    assert!(b.read_file(&a_file, ReadRange::Whole).await.is_err());
    assert!(b.write_file(&a_file, b"b was here").await.is_err());
    assert!(b.patch(&a_file, "only", "b", false).await.is_err());
    assert!(b.write_file(&format!("{a_home}/new"), b"x").await.is_err());
    let found = b
        .search(
            &SearchRequest {
                pattern: "only".into(),
                path: Some(a_home.clone()),
                target: SearchTarget::Content,
                file_glob: None,
                max_results: 10,
            },
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(found.matches.is_empty(), "{found:?}");
    assert_eq!(std::fs::read(&a_file).unwrap(), b"only a");
}

#[tokio::test]
async fn workspace_and_private_tmp_are_writable() {
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_w").await;
    let r = run(
        &ops,
        "echo one > ~/f && echo two > \"$TMPDIR/g\" && mkdir -p d/e && cat ~/f \"$TMPDIR/g\" && printf '%s' \"$TMPDIR\" > tmpdir",
    )
    .await;
    assert!(r.output.exit.success(), "{r:?}");
    assert_eq!(text(&r.output.stdout), "one\ntwo\n");
    let tmp = text(&ops.read_bytes("tmpdir").await.unwrap());
    let in_tmp = format!("{tmp}/h.txt");
    ops.write_file(&in_tmp, b"three").await.unwrap();
    let r = run(&ops, &format!("cat {in_tmp}")).await;
    assert_eq!(text(&r.output.stdout), "three");
    ops.patch(&in_tmp, "three", "four", false).await.unwrap();
    assert_eq!(ops.read_bytes(&in_tmp).await.unwrap(), b"four");
    // /tmp itself is not shared between sections.
    let r = run(&ops, "echo x > /tmp/sshmode-isolation-test").await;
    assert!(!r.output.exit.success(), "{r:?}");
    if is_root() {
        // What the service writes for the tools belongs to the tools account.
        let r = run(&ops, "stat -c %U ~/f tmpdir").await;
        let owner = app.state.config.exec.local.user.clone();
        assert_eq!(text(&r.output.stdout), format!("{owner}\n{owner}\n"));
    }
}

#[tokio::test]
async fn a_symlink_to_the_master_key_is_not_followed() {
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_link").await;
    let key_path = app.state.config.master_key_file.display().to_string();
    let key = std::fs::read(&key_path).unwrap();
    let r = run(
        &ops,
        &format!("ln -s {key_path} key; ln -s ../../../master.key rel"),
    )
    .await;
    assert!(r.output.exit.success(), "{r:?}");
    for p in ["key", "rel"] {
        let e = ops.read_bytes(p).await.unwrap_err();
        assert!(
            matches!(e, ExecError::File(_) | ExecError::NotFound(_)),
            "{e}"
        );
    }
    // A link swapped in and out by a background loop while read_file runs.
    let swapper = {
        let ops = local_ops(&app, "omt_link").await;
        let script = format!(
            "while :; do ln -sfn {key_path} s.new && mv -fT s.new s; printf harmless > f.new && mv -fT f.new s; done"
        );
        tokio::spawn(async move { run_for(&ops, &script, Duration::from_secs(6)).await })
    };
    eventually("the swapping loop to start", WAIT, async || {
        ops.read_bytes("s").await.is_ok()
    })
    .await;
    let (mut ok, mut refused) = (0, 0);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        match ops.read_bytes("s").await {
            Ok(bytes) => {
                assert_ne!(
                    bytes, key,
                    "the master key was read through a swapped symlink"
                );
                ok += 1;
            }
            Err(_) => refused += 1,
        }
    }
    let r = swapper.await.unwrap();
    assert_eq!(r.output.exit, Exit::TimedOut);
    assert!(
        ok > 0 && refused > 0,
        "the race was not exercised: {ok} ok, {refused} refused"
    );
}

#[tokio::test]
async fn a_fifo_does_not_pin_a_file_read() {
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_fifo").await;
    let r = run(&ops, "mkfifo pipe").await;
    assert!(r.output.exit.success(), "{r:?}");
    let read = tokio::time::timeout(
        Duration::from_secs(20),
        ops.read_file("pipe", ReadRange::Whole),
    )
    .await
    .expect("a read of a FIFO must not block");
    let e = read.unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let write = tokio::time::timeout(Duration::from_secs(20), ops.write_file("pipe", b"x"))
        .await
        .expect("a write at a FIFO must not block");
    // The write replaces the FIFO's name with a regular file; nothing waits for a reader.
    write.unwrap();
    assert_eq!(ops.read_bytes("pipe").await.unwrap(), b"x");
}

/// How many live processes of the machine (as this test sees `/proc`, outside any namespace
/// of a command) have `marker` in their command line.
fn processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| text(c).contains(marker))
        .count()
}

/// A marker no other test or run uses, for a process's command line.
fn marker(what: &str) -> String {
    format!("{what}-{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
async fn a_background_process_does_not_outlive_its_command() {
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_bg").await;
    let m = marker("bg");
    let r = run(
        &ops,
        &format!("sh -c 'sleep 300; : {m}' >/dev/null 2>&1 & echo started"),
    )
    .await;
    assert!(r.output.exit.success(), "{r:?}");
    eventually("the background process to die", WAIT, async || {
        processes_with(&m) == 0
    })
    .await;
}

/// `setsid` leaves the command's session and process group, not its PID namespace: when the
/// command ends, so does everything it started.
#[tokio::test]
async fn a_setsid_process_does_not_outlive_its_command() {
    assert!(
        is_root(),
        "the PID namespace needs a root service, as CI runs it"
    );
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_setsid").await;
    let m = marker("setsid");
    let r = run(
        &ops,
        &format!(
            "setsid sh -c 'sleep 999; : {m}' >/dev/null 2>&1 < /dev/null & sleep 0.5; echo started"
        ),
    )
    .await;
    assert!(r.output.exit.success(), "{r:?}");
    assert_eq!(text(&r.output.stdout), "started\n");
    eventually("the setsid process to die", WAIT, async || {
        processes_with(&m) == 0
    })
    .await;
}

/// Each command has its own PID namespace and `/proc`: it sees its own processes only, not
/// another section's running script, nor PID 1 (root's); `/proc/self` works under Landlock;
/// the shell, its sequences and pipelines run as usual.
#[tokio::test]
async fn a_command_sees_only_its_own_processes() {
    assert!(
        is_root(),
        "the PID namespace needs a root service, as CI runs it"
    );
    let app = TestApp::spawn().await;
    let a = local_ops(&app, "omt_ps_a").await;
    let b = local_ops(&app, "omt_ps_b").await;
    let theirs = marker("other-section");
    let other = {
        let theirs = theirs.clone();
        tokio::spawn(async move {
            run_for(
                &b,
                &format!("sh -c 'sleep 60; : {theirs}'"),
                Duration::from_secs(8),
            )
            .await
        })
    };
    eventually("the other section's command to run", WAIT, async || {
        processes_with(&theirs) > 0
    })
    .await;
    let mine = marker("own");
    let r = run(
        &a,
        &format!(
            "echo {mine} >/dev/null; for p in $(ls /proc | grep -E '^[0-9]+$'); do printf '%s ' $p; tr '\\0' ' ' < /proc/$p/cmdline; echo; done; grep -c . /proc/self/status; true; true; echo piped | tr a-z A-Z | cat"
        ),
    )
    .await;
    assert!(r.output.exit.success(), "{r:?}");
    let out = text(&r.output.stdout);
    assert!(
        !out.contains(&theirs),
        "another section's script is visible:\n{out}"
    );
    assert!(
        out.contains(&mine),
        "the command does not see itself:\n{out}"
    );
    let pids: Vec<&str> = out
        .lines()
        .filter(|l| {
            l.split(' ')
                .next()
                .is_some_and(|p| p.parse::<u32>().is_ok())
                && l.contains(' ')
        })
        .collect();
    assert!(
        pids.len() <= 8,
        "more than the command's own processes:\n{out}"
    );
    // PID 1 of the namespace is root's (the launcher's): not listed at all (`hidepid=2`). The
    // shell it started comes first.
    assert!(
        out.starts_with("2 "),
        "PID 1 is listed, or the shell does not come first:\n{out}"
    );
    assert!(out.ends_with("PIPED\n"), "{out}");
    let status_lines: usize = out.lines().rev().nth(1).unwrap().parse().unwrap();
    assert!(
        status_lines > 10,
        "/proc/self/status is not readable:\n{out}"
    );
    // Nor through the file tools: the other command's /proc entry, by its pid here.
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| text(&c).contains(&theirs)))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .expect("the other section's command runs");
    let seen = a
        .read_bytes(&format!("/proc/{pid}/cmdline"))
        .await
        .unwrap_or_default();
    assert!(
        !text(&seen).contains(&theirs),
        "read through read_file: {}",
        text(&seen)
    );
    let r = other.await.unwrap();
    assert_eq!(r.output.exit, Exit::TimedOut);
}

/// A timeout and a cancellation (`/stop`) end the whole namespace: background and `setsid`
/// processes included, and a shell that ignores TERM.
#[tokio::test]
async fn timeouts_and_stop_end_everything() {
    assert!(
        is_root(),
        "the PID namespace needs a root service, as CI runs it"
    );
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_end").await;
    let m = marker("ends");
    let script = format!(
        "trap '' TERM; sh -c 'sleep 999; : {m}' & setsid sh -c 'trap \"\" TERM; sleep 999; : {m}' & sleep 999"
    );
    let r = run_for(&ops, &script, Duration::from_secs(2)).await;
    assert_eq!(r.output.exit, Exit::TimedOut);
    eventually("a timed-out command's processes to die", WAIT, async || {
        processes_with(&m) == 0
    })
    .await;
    let cancel = CancellationToken::new();
    let stopped = {
        let ops = local_ops(&app, "omt_end").await;
        let cancel = cancel.clone();
        let script = script.clone();
        tokio::spawn(async move {
            ops.terminal(
                &script,
                RunOptions {
                    timeout: Some(Duration::from_secs(60)),
                    ..Default::default()
                },
                &cancel,
            )
            .await
            .unwrap()
        })
    };
    eventually("the command to start", WAIT, async || {
        processes_with(&m) >= 2
    })
    .await;
    cancel.cancel();
    let r = tokio::time::timeout(Duration::from_secs(15), stopped)
        .await
        .expect("a stopped command ends")
        .unwrap();
    assert_eq!(r.output.exit, Exit::Cancelled);
    eventually("a stopped command's processes to die", WAIT, async || {
        processes_with(&m) == 0
    })
    .await;
}

/// The file tools act as the tools account, so the kernel decides: a file in a directory that
/// account cannot search is not read, and a root-owned read-only file is not replaced.
#[tokio::test]
async fn file_tools_have_the_tools_accounts_rights() {
    assert!(
        is_root(),
        "the tools account needs a root service, as CI runs it"
    );
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_rights").await;
    ops.write_file("mine.txt", b"mine").await.unwrap();
    assert_eq!(ops.read_bytes("mine.txt").await.unwrap(), b"mine");
    let home = std::path::PathBuf::from(ops.backend().home().await.unwrap());
    let closed = home.join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(closed.join("f"), b"root's").unwrap();
    std::fs::set_permissions(closed.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = ops
        .read_file(&closed.join("f").display().to_string(), ReadRange::Whole)
        .await
        .expect_err("a file behind a closed directory was read");
    assert!(e.to_string().contains("ermission denied"), "{e}");
    let ro = home.join("ro.txt");
    std::fs::write(&ro, b"original").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    let e = ops
        .write_file(&ro.display().to_string(), b"overwritten")
        .await
        .expect_err("a root-owned read-only file was replaced");
    assert!(e.to_string().contains("ermission denied"), "{e}");
    assert_eq!(std::fs::read(&ro).unwrap(), b"original");
    // The service's own files stay out of reach through the helper too.
    let key = app.state.config.master_key_file.display().to_string();
    assert!(ops.read_bytes(&key).await.is_err());
    // What the helper writes is the tools account's.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(home.join("mine.txt")).unwrap();
    assert_ne!(meta.uid(), 0);
}

/// A launch server that cannot set a command up fails it, with its reason: here the ruleset
/// it is handed is not one, so the command must not run at all.
#[tokio::test]
async fn a_launcher_that_cannot_set_up_does_not_run_the_command() {
    use sshmode::exec::local::launch::{Job, Request, Setup};
    use sshmode::exec::local::server::{LaunchServer, Reply};
    use std::os::fd::AsFd;
    assert!(is_root(), "the PID namespace needs root, as CI runs it");
    let server = LaunchServer::start(
        env!("CARGO_BIN_EXE_sshmode").as_ref(),
        4,
        Default::default(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("ran");
    let null = std::fs::File::open("/dev/null").unwrap();
    let ws = std::fs::File::open(dir.path()).unwrap();
    let request = Request {
        setup: Setup {
            landlock: true,
            ..Setup::default()
        },
        job: Job::Run {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("touch {}", flag.display()),
            ],
            env: Vec::new(),
            tty: false,
        },
    };
    let fds = [
        null.as_fd(),
        null.as_fd(),
        null.as_fd(),
        ws.as_fd(),
        ws.as_fd(),
        // In the ruleset's place.
        null.as_fd(),
    ];
    let call = server.call(&request, &fds).await.unwrap();
    match call.wait().await {
        Reply::Refused(why) => {
            assert!(why.contains("ruleset") || why.contains("landlock"), "{why}")
        }
        other => panic!("the command was not refused: {other:?}"),
    }
    assert!(!flag.exists(), "the command ran without its sandbox");
}

/// The pid of the launch server a command with `marker` runs under: its ancestor whose
/// parent is this test process (which runs the service).
fn launch_server_of(marker: &str) -> i32 {
    let parent = |pid: i32| -> i32 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0)
    };
    let mut pid: i32 = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| text(&c).contains(marker)))
        .and_then(|e| e.file_name().to_string_lossy().parse().ok())
        .expect("the command runs");
    let me = std::process::id() as i32;
    for _ in 0..16 {
        let up = parent(pid);
        if up == me {
            let cmdline = text(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap());
            assert!(cmdline.contains("__sshmode-launch"), "{cmdline}");
            return pid;
        }
        assert!(up > 1, "no launch server above the command");
        pid = up;
    }
    panic!("no launch server above the command");
}

/// Killing the launch server ends the command it runs and fails that call with a clear error;
/// the next call starts a new server and is as isolated as before.
#[tokio::test]
async fn a_killed_launcher_fails_its_call_and_is_replaced() {
    assert!(is_root(), "the launch server needs root, as CI runs it");
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_killed").await;
    let m = marker("killed");
    let running = {
        let ops = local_ops(&app, "omt_killed").await;
        let m = m.clone();
        tokio::spawn(async move {
            ops.terminal(
                &format!("sh -c 'sleep 60; : {m}'"),
                RunOptions {
                    timeout: Some(Duration::from_secs(40)),
                    ..Default::default()
                },
                &CancellationToken::new(),
            )
            .await
        })
    };
    eventually("the command to run", WAIT, async || processes_with(&m) > 0).await;
    let server = launch_server_of(&m);
    // SAFETY: killing the launch server this test's service started.
    assert_eq!(unsafe { libc::kill(server, libc::SIGKILL) }, 0);
    let r = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the call ends with its launcher")
        .unwrap();
    let e = r.expect_err("a call whose launcher was killed succeeded");
    assert!(e.to_string().contains("launcher"), "{e}");
    eventually("the command to die with its launcher", WAIT, async || {
        processes_with(&m) == 0
    })
    .await;
    // The next call gets a new server, with its own PID namespace.
    let r = run(&ops, "echo again; ls /proc | grep -cE '^[0-9]+$'").await;
    let out = text(&r.output.stdout);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("again"), "{r:?}");
    let seen: usize = lines.next().unwrap().parse().unwrap();
    assert!(seen <= 4, "the command sees other processes: {out}");
    ops.write_file("after.txt", b"after").await.unwrap();
    assert_eq!(ops.read_bytes("after.txt").await.unwrap(), b"after");
    let m2 = marker("again");
    let again = {
        let ops = local_ops(&app, "omt_killed").await;
        let m2 = m2.clone();
        tokio::spawn(async move {
            run_for(
                &ops,
                &format!("sh -c 'sleep 30; : {m2}'"),
                Duration::from_secs(3),
            )
            .await
        })
    };
    eventually("the command to run", WAIT, async || processes_with(&m2) > 0).await;
    assert_ne!(launch_server_of(&m2), server);
    assert_eq!(again.await.unwrap().output.exit, Exit::TimedOut);
}

/// The launch server runs as root but holds nothing of the service: its environment (which
/// holds the database URL here) is empty.
#[tokio::test]
async fn the_launcher_holds_none_of_the_services_environment() {
    assert!(is_root(), "the launch server needs root, as CI runs it");
    assert!(std::env::var("TEST_DATABASE_URL").is_ok());
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_server_env").await;
    let m = marker("server-env");
    let script = format!("sh -c 'sleep 30; : {m}'");
    let running = tokio::spawn(async move { run_for(&ops, &script, Duration::from_secs(3)).await });
    eventually("the command to run", WAIT, async || processes_with(&m) > 0).await;
    let server = launch_server_of(&m);
    let environ = std::fs::read(format!("/proc/{server}/environ")).unwrap();
    assert!(
        environ.is_empty(),
        "the launch server has an environment: {}",
        text(&environ).replace('\0', "\n")
    );
    assert_eq!(running.await.unwrap().output.exit, Exit::TimedOut);
}

/// Without a launcher that works, a root service says so in its level (no `pidns`).
#[tokio::test]
async fn without_a_launcher_the_level_has_no_pidns() {
    assert!(is_root(), "this test needs root, as CI runs it");
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let vars = [
        (
            "SSHMODE_DATA_DIR".to_string(),
            dir.path().join("d").display().to_string(),
        ),
        ("SSHMODE_LAUNCHER".to_string(), "/bin/false".to_string()),
    ]
    .into_iter()
    .collect();
    let config = config_from(&vars, dir.path());
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
    let exec = Executors::new(
        &config.exec,
        sshmode::target::registry(app.state.db.clone()),
        vault,
        tokio_util::task::TaskTracker::new(),
    )
    .unwrap();
    let level = exec.local_level();
    assert!(!level.pidns, "{level}");
    assert!(!level.to_string().contains("pidns"), "{level}");
    assert!(
        level.leaves_open().iter().any(|o| o.contains("setsid")),
        "{:?}",
        level.leaves_open()
    );
    // Nor is the data directory hidden: its names and sizes show to `stat`, and it says so.
    assert!(
        level
            .leaves_open()
            .iter()
            .any(|o| o.contains("data directory")),
        "{:?}",
        level.leaves_open()
    );
}

/// Every command leads a session of its own, without a controlling terminal: it cannot open
/// the terminal of `sshmode chat` as `/dev/tty` or type into it with `TIOCSTI`. (Its launcher
/// leads the process group the backend kills.)
#[tokio::test]
async fn a_command_has_a_session_of_its_own_without_a_terminal() {
    let app = TestApp::spawn().await;
    let ops = local_ops(&app, "omt_sid").await;
    let r = run(
        &ops,
        "echo $$; cat /proc/$$/stat; (exec 3<>/dev/tty) 2>&1; echo opened=$?",
    )
    .await;
    let out = text(&r.output.stdout);
    let mut lines = out.lines();
    let pid: i32 = lines.next().unwrap().trim().parse().unwrap();
    let stat = lines.next().unwrap();
    // pid (comm) state ppid pgrp session tty_nr …
    let fields: Vec<i64> = stat[stat.rfind(')').unwrap() + 2..]
        .split(' ')
        .skip(1)
        .take(4)
        .map(|f| f.parse().unwrap())
        .collect();
    let (pgrp, session, tty) = (fields[1], fields[2], fields[3]);
    // SAFETY: getsid(0) has no preconditions.
    let ours = i64::from(unsafe { libc::getsid(0) });
    assert_ne!(
        session, ours,
        "the command shares the service's session: {out}"
    );
    assert_eq!((pgrp, session), (pid.into(), pid.into()), "{out}");
    assert_eq!(tty, 0, "the command has a controlling terminal: {out}");
    assert!(
        out.contains("No such device or address") && !out.contains("opened=0"),
        "/dev/tty opened: {out}"
    );
}

#[tokio::test]
async fn the_reported_level_is_what_the_kernel_offers() {
    let app = TestApp::spawn().await;
    // Read the ABI ourselves: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION).
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    let landlock = if abi > 0 {
        Some(format!("landlock-v{}", abi.min(9)))
    } else {
        None
    };
    let expected = match (is_root(), landlock) {
        (true, Some(l)) => format!("separate-uid+pidns+{l}"),
        (true, None) => "separate-uid+pidns".into(),
        (false, Some(l)) if abi < 9 => format!("{l}+open-unix-sockets"),
        (false, Some(l)) => l,
        (false, None) => "none".into(),
    };
    assert_eq!(app.state.exec.local_level().to_string(), expected);
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(
        body.contains(&format!("local-isolation: {expected}\n")),
        "{body}"
    );
    let open = format!(
        "local-isolation-open: {}\n",
        app.state.exec.local_level().leaves_open().join("; ")
    );
    assert!(body.contains(&open), "{body}");
    assert!(is_root() || body.contains("service's own uid"), "{body}");
    if is_root() {
        let ops = local_ops(&app, "omt_id").await;
        let r = run(&ops, "id -un; id -u").await;
        let out = text(&r.output.stdout);
        assert!(
            out.starts_with(&format!("{}\n", app.state.config.exec.local.user)),
            "{out}"
        );
        assert_ne!(out.lines().nth(1), Some("0"));
    }
}

#[tokio::test]
async fn without_sandboxing_local_tools_are_refused_unless_opted_in() {
    let app = TestApp::spawn().await;
    for opted_in in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let vars = [
            (
                "SSHMODE_DATA_DIR".to_string(),
                dir.path().join("d").display().to_string(),
            ),
            (
                "SSHMODE_LOCAL_UNSANDBOXED".to_string(),
                opted_in.to_string(),
            ),
        ]
        .into_iter()
        .collect();
        let mut config = config_from(&vars, dir.path());
        config.exec.local.simulate_no_sandbox = true;
        let vault =
            Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
        let exec = Executors::new(
            &config.exec,
            sshmode::target::registry(app.state.db.clone()),
            vault,
            tokio_util::task::TaskTracker::new(),
        )
        .unwrap();
        assert_eq!(exec.local_level().to_string(), "none");
        let ops = exec.ops_for("omt_off", &Place::Local).await.unwrap();
        let ran = ops
            .terminal("echo ran", RunOptions::default(), &CancellationToken::new())
            .await;
        let read = ops.read_file("x", ReadRange::Whole).await;
        let wrote = ops.write_file("x", b"x").await;
        if opted_in {
            assert_eq!(text(&ran.unwrap().output.stdout), "ran\n");
            wrote.unwrap();
            assert_eq!(
                ops.read_file("x", ReadRange::Whole)
                    .await
                    .unwrap()
                    .text
                    .as_deref(),
                Some("x")
            );
            let _ = read;
        } else {
            let e = ran.expect_err("refused").to_string();
            assert!(e.contains("SSHMODE_LOCAL_UNSANDBOXED"), "{e}");
            assert!(read.is_err() && wrote.is_err());
            assert!(
                exec.ops_for("omt_off", &Place::Local)
                    .await
                    .unwrap()
                    .execute_code("print(1)", None, None, &CancellationToken::new())
                    .await
                    .is_err()
            );
        }
    }
}

#[tokio::test]
async fn a_fork_loop_is_stopped_and_the_service_stays_healthy() {
    // RLIMIT_NPROC counts per account: it bounds tools only when they have their own, which
    // needs a root service (as in CI).
    assert!(is_root(), "this test needs root, as CI runs it");
    let app = TestApp::builder()
        // Its own account, so the loop's processes do not count against other tests' tools.
        .var("SSHMODE_LOCAL_USER", "sshmode-forktest")
        .var("SSHMODE_LOCAL_MAX_PROCS", "40")
        .spawn()
        .await;
    let ops = local_ops(&app, "omt_fork").await;
    let r = run_for(
        &ops,
        "i=0; while [ $i -lt 400 ]; do sleep 60 & i=$((i+1)); done; echo spawned-all",
        Duration::from_secs(5),
    )
    .await;
    let err = text(&r.output.stderr);
    assert!(
        !text(&r.output.stdout).contains("spawned-all")
            || err.contains("Resource temporarily unavailable"),
        "400 processes were started: {r:?}"
    );
    assert!(err.contains("Resource temporarily unavailable"), "{err}");
    // Everything of the loop is gone, and the service and its database are fine.
    eventually("the loop's processes to be gone", WAIT, async || {
        let out = std::process::Command::new("pgrep")
            .args(["-u", "sshmode-forktest"])
            .output()
            .unwrap();
        out.stdout.is_empty()
    })
    .await;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&app.state.db)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let r = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = run(&ops, "echo alive").await;
    assert_eq!(text(&r.output.stdout), "alive\n");
}

/// The embedded cluster requires its password: neither a tool nor anyone else without it gets in.
#[tokio::test]
async fn the_embedded_cluster_needs_its_password() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("d");
    let vars = [("SSHMODE_DATA_DIR".to_string(), data.display().to_string())]
        .into_iter()
        .collect();
    let config = config_from(&vars, dir.path());
    let store = Store::open(&config).await.expect("embedded cluster starts");
    let pw_file = data.join("pg.password");
    let mode = std::fs::metadata(&pw_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let pg = data.join("pg");
    let hba = std::fs::read_to_string(pg.join("pg_hba.conf")).unwrap();
    assert!(
        !hba.lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains("trust")),
        "{hba}"
    );

    // Without the password, even as the service's own account: refused.
    let no_pw = sqlx::postgres::PgConnectOptions::new()
        .socket(&pg)
        .port(5432)
        .username("sshmode")
        .database("sshmode");
    let e = sqlx::ConnectOptions::connect(&no_pw)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("password"), "{e}");

    // A tool: psql and a raw socket connect.
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&config.master_key_file).unwrap());
    let exec = Executors::new(
        &config.exec,
        sshmode::target::registry(store.pool.clone()),
        vault,
        tokio_util::task::TaskTracker::new(),
    )
    .unwrap();
    let ops = exec.ops_for("omt_db", &Place::Local).await.unwrap();
    let psql = format!(
        "psql -X -h {p} -p 5432 -U sshmode -d sshmode -w -c 'select 1'",
        p = pg.display()
    );
    let r = run(&ops, &psql).await;
    assert!(!r.output.exit.success(), "{r:?}");
    let raw = format!(
        "python3 -c 'import socket; s=socket.socket(socket.AF_UNIX); s.connect(\"{}/.s.PGSQL.5432\"); print(\"connected\")'",
        pg.display()
    );
    let r = run(&ops, &raw).await;
    if is_root() {
        // As the tools account the socket's directory is closed.
        assert!(!text(&r.output.stdout).contains("connected"), "{r:?}");
    }
    let r = run(&ops, &format!("cat {}", pw_file.display())).await;
    assert!(r.output.stdout.is_empty(), "{r:?}");
    // The service itself still gets in.
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
    store.close().await;
}

/// A cluster made with trust authentication (by an older version) is switched to scram.
#[tokio::test]
async fn a_trusting_cluster_is_switched_to_scram() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("d");
    let vars = [("SSHMODE_DATA_DIR".to_string(), data.display().to_string())]
        .into_iter()
        .collect();
    let config = config_from(&vars, dir.path());
    let store = Store::open(&config).await.unwrap();
    store.close().await;
    // Make it look like an old cluster: trust on the socket, no password file.
    std::fs::write(data.join("pg/pg_hba.conf"), "local all all trust\n").unwrap();
    std::fs::remove_file(data.join("pg.password")).unwrap();
    let store = Store::open(&config).await.expect("reopens and switches");
    let hba = std::fs::read_to_string(data.join("pg/pg_hba.conf")).unwrap();
    assert!(
        hba.contains("scram-sha-256") && !hba.contains("trust"),
        "{hba}"
    );
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let no_pw = sqlx::postgres::PgConnectOptions::new()
        .socket(data.join("pg"))
        .port(5432)
        .username("sshmode")
        .database("sshmode");
    assert!(sqlx::ConnectOptions::connect(&no_pw).await.is_err());
    store.close().await;
}

/// A service that is not root has no tools account: Landlock alone confines its tools (run
/// here as root with the identity switch turned off, which is the non-root code path).
#[tokio::test]
async fn without_a_tools_account_landlock_alone_confines() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let vars = [(
        "SSHMODE_DATA_DIR".to_string(),
        dir.path().join("d").display().to_string(),
    )]
    .into_iter()
    .collect();
    let mut config = config_from(&vars, dir.path());
    config.exec.local.simulate_non_root = true;
    let key = config.master_key_file.clone();
    let vault = Arc::new(sshmode::vault::Vault::open_or_create(&key).unwrap());
    let exec = Executors::new(
        &config.exec,
        sshmode::target::registry(app.state.db.clone()),
        vault,
        tokio_util::task::TaskTracker::new(),
    )
    .unwrap();
    let abi = sshmode::exec::local::sandbox::kernel_landlock_abi();
    assert!(abi > 0, "this test needs a kernel with Landlock");
    // Below ABI 9 a same-uid tool may connect to the user's unix sockets: the level says so.
    let suffix = if abi < 9 { "+open-unix-sockets" } else { "" };
    assert_eq!(
        exec.local_level().to_string(),
        format!("landlock-v{}{suffix}", abi.min(9))
    );
    let open = exec.local_level().leaves_open().join("\n");
    assert!(open.contains("service's own uid"), "{open}");
    assert!(abi >= 9 || open.contains("ssh-agent"), "{open}");
    let a = exec.ops_for("omt_nr_a", &Place::Local).await.unwrap();
    let b = exec.ops_for("omt_nr_b", &Place::Local).await.unwrap();
    let r = run(&a, "id -u; echo mine > m; cat m").await;
    let me = unsafe { libc::geteuid() }.to_string();
    assert_eq!(text(&r.output.stdout), format!("{me}\nmine\n"), "{r:?}");
    let r = run(&a, &format!("cat {}", key.display())).await;
    assert!(
        !r.output.exit.success() && r.output.stdout.is_empty(),
        "{r:?}"
    );
    let pid = std::process::id();
    let r = run(&a, &format!("cat /proc/{pid}/environ")).await;
    assert!(r.output.stdout.is_empty(), "{}", text(&r.output.stdout));
    let r = run(&a, &format!("kill -0 {pid} && echo signalled")).await;
    if abi >= 6 {
        assert!(!text(&r.output.stdout).contains("signalled"), "{r:?}");
    }
    let a_home = a.backend().home().await.unwrap();
    let r = run(&b, &format!("cat {a_home}/m")).await;
    assert!(
        !r.output.exit.success() && r.output.stdout.is_empty(),
        "{r:?}"
    );
    assert!(
        b.read_file(&format!("{a_home}/m"), ReadRange::Whole)
            .await
            .is_err()
    );
    assert!(a.read_bytes(&key.display().to_string()).await.is_err());
}

/// `SSHMODE_LOCAL_TCP_PORTS`: connects to the listed ports only (Landlock V4+).
#[tokio::test]
async fn tcp_connects_are_limited_to_the_listed_ports() {
    let abi = sshmode::exec::local::sandbox::kernel_landlock_abi();
    assert!(abi >= 4, "this test needs Landlock V4 (Linux 6.7)");
    let allowed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (p, q) = (
        allowed.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    let app = TestApp::builder()
        .var("SSHMODE_LOCAL_TCP_PORTS", &format!("{p}"))
        .spawn()
        .await;
    let ops = local_ops(&app, "omt_net").await;
    let r = run(
        &ops,
        &format!(
            "for port in {p} {q}; do python3 -c \"import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 5); print(sys.argv[1])\" $port; done; true"
        ),
    )
    .await;
    assert_eq!(text(&r.output.stdout), format!("{p}\n"), "{r:?}");
}

/// A section working in a shared workspace is granted that directory, and never another
/// section's own workspace.
#[tokio::test]
async fn a_shared_workspace_is_granted_instead_of_the_own_one() {
    let app = TestApp::spawn().await;
    let exec = &app.state.exec;
    let root = app.state.config.exec.workspace_root.clone();
    let shared = root.join("team");
    let a = exec.local_ops_in("omt_sh_a", &shared, true).unwrap();
    let b = exec.local_ops_in("omt_sh_b", &shared, true).unwrap();
    let r = run(&a, "echo from-a > shared.txt; pwd").await;
    assert_eq!(
        text(&r.output.stdout),
        format!("{}\n", shared.display()),
        "{r:?}"
    );
    let r = run(&b, "cat shared.txt").await;
    assert_eq!(text(&r.output.stdout), "from-a\n", "{r:?}");
    // The section's own workspace is not granted while it works elsewhere.
    let own = exec.ops_for("omt_sh_a", &Place::Local).await.unwrap();
    own.write_file("~/mine", b"x").await.unwrap();
    let own_dir = own.backend().home().await.unwrap();
    let r = run(&a, &format!("cat {own_dir}/mine")).await;
    assert!(
        r.output.stdout.is_empty() && !r.output.exit.success(),
        "{r:?}"
    );
    assert!(a.read_bytes(&format!("{own_dir}/mine")).await.is_err());
    for bad in [
        root.clone(),
        root.join("sections"),
        root.join("sections/omt_sh_a"),
        root.join("team/../sections/omt_sh_a"),
        std::path::PathBuf::from("/etc"),
    ] {
        assert!(
            exec.local_ops_in("omt_sh_b", &bad, true).is_err(),
            "{}",
            bad.display()
        );
    }
}
