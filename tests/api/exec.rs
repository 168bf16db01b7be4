//! The execution layer's behaviour, written once and run against every backend: here on the
//! local backend, in `exec_ssh` on a real sshd. One behaviour, two backends.

use std::time::Duration;

use sha2::Digest;
use sshmode::exec::ops::{Ops, ReadRange, RunOptions, SearchRequest, SearchTarget};
use sshmode::exec::{ExecError, Exit, Place};
use tokio_util::sync::CancellationToken;

use crate::helpers::TestApp;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn sh(ops: &Ops, cmd: &str) -> sshmode::exec::ops::TerminalResult {
    ops.terminal(cmd, RunOptions::default(), &CancellationToken::new())
        .await
        .unwrap_or_else(|e| panic!("`{cmd}` failed: {e}"))
}

/// Runs `check` until it succeeds (bounded: 10 s), pausing 20 ms between tries.
pub async fn wait_for(ops: &Ops, check: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if sh(ops, check).await.output.exit.success() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "`{check}` did not succeed within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deterministic pseudo-random bytes (xorshift), so a corrupted byte anywhere shows.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Every backend must pass this. `section` must be fresh (its own working directory).
pub async fn behaviour(app: &TestApp, place: Place, section: &str) {
    let exec = &app.state.exec;
    let ops = exec.ops_for(section, &place).await.expect("backend");
    let never = CancellationToken::new();

    // Exit codes, stdout and stderr kept apart.
    let r = sh(&ops, "echo out; echo err >&2; exit 3").await;
    assert_eq!(r.output.exit, Exit::Code(3));
    assert_eq!(text(&r.output.stdout), "out\n");
    assert_eq!(text(&r.output.stderr), "err\n");
    // Standard input is empty: a command reading it does not wait.
    let r = ops
        .terminal(
            "cat; echo done",
            RunOptions {
                timeout: Some(Duration::from_secs(10)),
                ..Default::default()
            },
            &never,
        )
        .await
        .unwrap();
    assert_eq!(text(&r.output.stdout), "done\n");
    let r = sh(&ops, "printf 'no newline'").await;
    assert_eq!(text(&r.output.stdout), "no newline");
    assert!(r.output.exit.success());

    // A signal is reported as such.
    let r = sh(&ops, "kill -TERM $$").await;
    assert_eq!(r.output.exit, Exit::Signal("TERM".into()), "{r:?}");

    // The working directory starts in the backend's initial dir and `cd` persists, without
    // disturbing the exit code.
    let start = ops.cwd().await.unwrap();
    let r = sh(&ops, "mkdir -p sub/deeper && cd sub; exit 4").await;
    assert_eq!(r.output.exit, Exit::Code(4));
    assert_eq!(r.cwd, format!("{start}/sub"));
    let r = sh(&ops, "pwd").await;
    assert_eq!(text(&r.output.stdout), format!("{start}/sub\n"));
    sh(&ops, "cd deeper").await;
    assert_eq!(ops.cwd().await.unwrap(), format!("{start}/sub/deeper"));
    sh(&ops, "cd ../..").await;
    assert_eq!(ops.cwd().await.unwrap(), start);
    // Another section on the same backend keeps its own directory.
    let other = exec
        .ops_for(&format!("{section}-other"), &place)
        .await
        .unwrap();
    sh(&other, "cd /tmp").await;
    assert_eq!(ops.cwd().await.unwrap(), start);

    // `~` and $HOME are the backend user's.
    let home = ops.backend().home().await.unwrap();
    let r = sh(&ops, "printf '%s' \"$HOME\"; cd ~ && printf ':%s' \"$PWD\"").await;
    assert_eq!(text(&r.output.stdout), format!("{home}:{home}"));
    sh(&ops, &format!("cd {}", sshmode::exec::shell_quote(&start))).await;
    let tilde_file = format!("~/.sshmode-test-{}", uuid::Uuid::new_v4().simple());
    let resolved = ops.write_file(&tilde_file, b"tilde").await.unwrap();
    assert_eq!(resolved, format!("{home}/{}", &tilde_file[2..]));
    let r = sh(&ops, &format!("cat {}; rm -f {}", resolved, resolved)).await;
    assert_eq!(text(&r.output.stdout), "tilde");

    // Environment variables for one command — passed on standard input, never on the shell's
    // command line, which anyone on the host can read with `ps`.
    let secret = format!("s3cret-{}", uuid::Uuid::new_v4().simple());
    let r = ops
        .terminal(
            "printf '%s|%s|' \"$GREETING\" \"$TOKEN\"; tr '\\0' ' ' < /proc/$$/cmdline",
            RunOptions {
                env: vec![
                    ("GREETING".into(), "hi 'there' $x\n".into()),
                    ("TOKEN".into(), secret.clone()),
                ],
                ..Default::default()
            },
            &never,
        )
        .await
        .unwrap();
    let out = text(&r.output.stdout);
    let values = format!("hi 'there' $x\n|{secret}|");
    assert!(out.starts_with(&values), "{out}");
    let cmdline = &out[values.len()..];
    assert!(
        cmdline.contains("GREETING"),
        "the script is this shell's command line: {cmdline}"
    );
    assert!(
        !cmdline.contains(&secret),
        "an env value shows in `ps`: {cmdline}"
    );

    // Timeout: the command and its children are killed, partial output returned.
    let r = ops
        .terminal(
            "sleep 300 & echo $! > sleeper.pid; echo started; wait",
            RunOptions {
                timeout: Some(Duration::from_secs(1)),
                ..Default::default()
            },
            &never,
        )
        .await
        .unwrap();
    assert_eq!(r.output.exit, Exit::TimedOut);
    assert_eq!(
        r.output.stop_note, None,
        "the stop ended the command's group"
    );
    assert_eq!(text(&r.output.stdout), "started\n");
    let r = sh(
        &ops,
        "p=$(cat sleeper.pid); s=$(awk '/^State:/{print $2}' /proc/$p/status 2>/dev/null); \
         if [ -z \"$s\" ] || [ \"$s\" = Z ]; then echo gone; else echo alive; fi",
    )
    .await;
    assert_eq!(
        text(&r.output.stdout),
        "gone\n",
        "the timed-out child survived"
    );

    // A caller that drops a running command (it gave up, or is shutting down) does not leave
    // it running: its group is killed, now locally, in the background remotely.
    sh(&ops, "rm -f dropped.pid").await;
    {
        let dropped = sh(&ops, "sleep 300 & echo $! > dropped.pid; wait");
        tokio::pin!(dropped);
        // Dropped once it has visibly started.
        // `biased`: the command is polled first at every wake-up, so what it has received
        // (its pid line) is taken in before the check's answer ends the wait.
        tokio::select! {
            biased;
            _ = &mut dropped => panic!("the command should still have been running"),
            _ = wait_for(&ops, "test -s dropped.pid") => {}
        }
    }
    let mut state = String::new();
    for _ in 0..100 {
        let r = sh(
            &ops,
            "p=$(cat dropped.pid); s=$(awk '/^State:/{print $2}' /proc/$p/status 2>/dev/null); \
             if [ -z \"$s\" ] || [ \"$s\" = Z ]; then echo gone; else echo alive; fi",
        )
        .await;
        state = text(&r.output.stdout);
        if state == "gone\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "gone\n", "the dropped command's child survived");

    // Cancellation, once the command has visibly started.
    sh(&ops, "rm -f cancel.flag").await;
    let cancel = CancellationToken::new();
    let trigger = async {
        wait_for(&ops, "test -e cancel.flag").await;
        cancel.cancel();
    };
    let (r, ()) = tokio::join!(
        ops.terminal(
            "echo begun; touch cancel.flag; sleep 300",
            RunOptions::default(),
            &cancel
        ),
        trigger
    );
    let r = r.unwrap();
    assert_eq!(r.output.exit, Exit::Cancelled);
    assert_eq!(text(&r.output.stdout), "begun\n");

    // A command that never reads its (large) input still times out, and what it printed
    // meanwhile is kept.
    let input = vec![b'x'; 8 * 1024 * 1024];
    let r = ops
        .backend()
        .exec(
            sshmode::exec::Command {
                script: "echo ran; sleep 300",
                stdin: Some(&input),
                timeout: Duration::from_secs(2),
                stdout_limit: 4096,
                stderr_limit: 4096,
                live: None,
            },
            &never,
        )
        .await
        .unwrap();
    assert_eq!(r.exit, Exit::TimedOut, "{r:?}");
    assert_eq!(text(&r.stdout), "ran\n");

    // Commands the tools ran are counted by backend and outcome.
    let metrics = app.metrics().await;
    let backend = format!("backend=\"{}\"", ops.backend().name());
    for outcome in ["ok", "failed", "timed_out", "cancelled"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("sshmode_exec_commands_total")
                    && l.contains(&backend)
                    && l.contains(&format!("outcome=\"{outcome}\""))),
            "{outcome}: {metrics}"
        );
    }

    // Output is bounded: head and tail kept.
    let r = sh(
        &ops,
        "head -c 300000 /dev/zero | tr '\\0' 'a'; echo; echo END",
    )
    .await;
    assert!(r.output.stdout_omitted > 0);
    assert!(r.output.stdout.len() < 100_000);
    assert!(text(&r.output.stdout).ends_with("END\n"));

    // A file that reports no size (procfs) is read to its end, as locally.
    let read = ops
        .read_file("/proc/version", ReadRange::Whole)
        .await
        .unwrap();
    let version = read.text.unwrap_or_default();
    assert!(version.starts_with("Linux version"), "{version:?}");

    // A 10 MB binary file round trip, checked on the backend's host too.
    let data = noise(10 * 1024 * 1024, 7);
    let path = ops.write_file("blob.bin", &data).await.unwrap();
    assert_eq!(path, format!("{start}/blob.bin"));
    let back = ops.read_bytes("blob.bin").await.unwrap();
    assert!(back == data, "10 MB round trip differs");
    let r = sh(&ops, "sha256sum blob.bin").await;
    let want = hex::encode(sha2::Sha256::digest(&data));
    assert!(text(&r.output.stdout).starts_with(&want));
    let read = ops.read_file("blob.bin", ReadRange::Whole).await.unwrap();
    assert!(read.binary && read.text.is_none());
    assert_eq!(read.size, data.len() as u64);

    // Atomic write: parents created, mode kept, content replaced, no temp file left.
    ops.write_file("w/a/b/f.txt", b"one\n").await.unwrap();
    sh(&ops, "chmod 751 w/a/b/f.txt").await;
    ops.write_file("w/a/b/f.txt", b"two\n").await.unwrap();
    let r = sh(&ops, "stat -c %a w/a/b/f.txt; cat w/a/b/f.txt; ls -A w/a/b").await;
    assert_eq!(text(&r.output.stdout), "751\ntwo\nf.txt\n");
    let r = ops.write_file("w", b"x").await;
    assert!(matches!(r, Err(ExecError::File(_))), "{r:?}");

    // Reads: whole, line range, byte range, missing.
    ops.write_file("lines.txt", b"l1\nl2\nl3\nl4\n")
        .await
        .unwrap();
    let r = ops.read_file("lines.txt", ReadRange::Whole).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("l1\nl2\nl3\nl4\n"));
    assert!(!r.truncated && !r.binary);
    let r = ops
        .read_file("lines.txt", ReadRange::Lines { start: 2, count: 2 })
        .await
        .unwrap();
    assert_eq!(r.text.as_deref(), Some("l2\nl3\n"));
    assert!(r.truncated);
    let r = ops
        .read_file("lines.txt", ReadRange::Bytes { offset: 3, len: 2 })
        .await
        .unwrap();
    assert_eq!(r.text.as_deref(), Some("l2"));
    let r = ops.read_file("missing.txt", ReadRange::Whole).await;
    assert!(matches!(r, Err(ExecError::NotFound(_))), "{r:?}");

    // Patch.
    let p = ops.patch("lines.txt", "l3", "L3", false).await.unwrap();
    assert_eq!(p.replacements, 1);
    let r = ops.patch("lines.txt", "l", "x", false).await;
    assert!(matches!(r, Err(ExecError::Invalid(_))), "{r:?}");
    let r = ops.read_file("lines.txt", ReadRange::Whole).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("l1\nl2\nL3\nl4\n"));

    // Search: contents and names.
    ops.write_file("src/a.rs", b"fn alpha() {}\nfn beta() {}\n")
        .await
        .unwrap();
    ops.write_file("src/b.txt", b"alpha again\n").await.unwrap();
    let found = ops
        .search(
            &SearchRequest {
                pattern: "alph[a]".into(),
                path: Some("src".into()),
                target: SearchTarget::Content,
                file_glob: None,
                max_results: 10,
            },
            &never,
        )
        .await
        .unwrap();
    let mut m = found.matches.clone();
    m.sort();
    assert_eq!(
        m,
        vec![
            format!("{start}/src/a.rs:1:fn alpha() {{}}"),
            format!("{start}/src/b.txt:1:alpha again"),
        ]
    );
    let found = ops
        .search(
            &SearchRequest {
                pattern: "*.rs".into(),
                path: None,
                target: SearchTarget::Files,
                file_glob: None,
                max_results: 10,
            },
            &never,
        )
        .await
        .unwrap();
    assert_eq!(found.matches, vec![format!("{start}/src/a.rs")]);

    // Code execution, in the working directory.
    let out = ops
        .execute_code("import os\nprint(os.getcwd())", None, None, &never)
        .await
        .unwrap();
    assert_eq!(text(&out.stdout), format!("{start}\n"));
    let out = ops
        .execute_code("echo from bash; exit 5", Some("bash"), None, &never)
        .await
        .unwrap();
    assert_eq!(
        (text(&out.stdout), out.exit),
        ("from bash\n".into(), Exit::Code(5))
    );

    // The guard refuses before anything runs, on every backend.
    let r = ops
        .terminal("rm -rf / --no-preserve-root", RunOptions::default(), &never)
        .await;
    assert!(matches!(r, Err(ExecError::Refused(_))), "{r:?}");
    let r = ops
        .execute_code("rm -rf / --no-preserve-root", Some("sh"), None, &never)
        .await;
    assert!(matches!(r, Err(ExecError::Refused(_))), "{r:?}");

    // It judges with the section's working directory: after `cd /` in one call, `rm -rf *`
    // in the next would delete everything. (`--version` keeps the command harmless should
    // the guard ever let it through: rm only prints its version.)
    assert_eq!(sh(&ops, "cd /").await.cwd, "/");
    let r = ops
        .terminal("rm -rf --version *", RunOptions::default(), &never)
        .await;
    assert!(matches!(r, Err(ExecError::Refused(_))), "{r:?}");
    assert_eq!(sh(&ops, &format!("cd {start}")).await.cwd, start);
}

#[tokio::test]
async fn local_backend_behaves() {
    let app = TestApp::spawn().await;
    behaviour(&app, Place::Local, "omt_local_suite").await;
    // The local section works inside the workspace root.
    let ops = app
        .state
        .exec
        .ops_for("omt_local_suite", &Place::Local)
        .await
        .unwrap();
    let cwd = ops.cwd().await.unwrap();
    assert!(cwd.starts_with(&app.state.config.exec.workspace_root.display().to_string()));
    // A process that left the group and holds stdout open does not cost the output already
    // read (reading stops after a bounded wait).
    let r = sh(&ops, "echo before; setsid sleep 5 & exit 0").await;
    assert_eq!(r.output.exit, Exit::Code(0));
    assert_eq!(text(&r.output.stdout), "before\n");
}

#[tokio::test]
async fn an_unknown_target_is_an_error_never_local() {
    let app = TestApp::spawn().await;
    let r = app
        .state
        .exec
        .ops_for("omt_x", &Place::Target("nowhere".into()))
        .await;
    match r {
        Err(ExecError::Unavailable { alias, .. }) => assert_eq!(alias, "nowhere"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("an unknown target must not yield a backend"),
    }
}

/// `sshmode guard check`: one `verdict<TAB>reason<TAB>command` line per command read, the
/// operator's patterns applied, exit 0 whatever the verdicts; `--json`, `--file` and
/// `--permission` too.
#[test]
fn guard_check_prints_a_verdict_per_command_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let patterns = dir.path().join("guard.txt");
    std::fs::write(&patterns, "^terraform\\s+destroy\n").unwrap();
    let run = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sshmode"))
            .args(["guard", "check"])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("SSHMODE_DATA_DIR", dir.path())
            .env("SSHMODE_GUARD_EXTRA_FILE", &patterns)
            .current_dir(dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let out = run(
        &[],
        "ls\nrm -rf /\npython3 -c 'import os; os.system(\"x\")'\nterraform destroy\n",
    );
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    let verdicts: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(verdicts, ["allow", "refuse", "ask", "refuse"], "{out}");
    assert!(rows.iter().all(|r| r.len() == 3), "{out}");
    assert_eq!(rows[3][2], "terraform destroy");
    assert!(rows[3][1].contains("operator"), "{out}");

    let out = run(&["--permission", "read", "--json"], "touch x\n");
    let row: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(row["verdict"], "refuse");
    assert_eq!(row["by"], "permission");

    let file = dir.path().join("commands.txt");
    std::fs::write(&file, "rm x\n").unwrap();
    let ws = dir.path().to_str().unwrap();
    let path = file.to_str().unwrap();
    let args = [
        "--permission",
        "read-write",
        "--workdir",
        ws,
        "--file",
        path,
    ];
    let out = run(&args, "ls\n");
    assert!(out.starts_with("refuse\t"), "{out}");
    assert!(out.contains("`read-write`"), "{out}");
    assert_eq!(
        out.lines().count(),
        1,
        "stdin is not read with --file: {out}"
    );
}
