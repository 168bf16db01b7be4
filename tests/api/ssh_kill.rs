//! The remote kill against real sshd: it signals only the command's own process group, read
//! from behind the command's marker (a login script that prints `1` first must not turn a
//! timeout into `kill -- -1`), and a command dropped midway is still killed when the service
//! shuts down at once.

use std::path::PathBuf;
use std::time::Duration;

use sshmode::exec::ops::RunOptions;
use sshmode::exec::{Exit, Place};
use sshmode::target::cli::TargetCmd;
use tokio_util::sync::CancellationToken;

use crate::exec_ssh::{Env, add_args, cli, env_with_sshd};
use crate::sshd;

/// A user of its own, so that a wrong `kill -- -1` could reach only this test's processes.
const KILL_USER: &str = "sshmode_k";

/// Whether `pid` has exited (gone, or a zombie waiting for its parent).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                == Some("Z")
        }
    }
}

/// Polls (bounded) until `pid` has exited.
async fn wait_exited(pid: u32, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if exited(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    exited(pid)
}

#[tokio::test]
async fn a_login_script_printing_1_never_turns_a_timeout_into_kill_minus_1() {
    let Some(env) = env_with_sshd(&[("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3")], "").await else {
        return;
    };
    // Every session of this user first prints `1` on stderr, as a chatty rc file would (sshd
    // runs ~/.ssh/rc before the command, its output going to the session).
    sshd::ensure_user(KILL_USER);
    let ssh_dir = PathBuf::from(format!("/home/{KILL_USER}/.ssh"));
    std::fs::create_dir_all(&ssh_dir).unwrap();
    std::fs::write(ssh_dir.join("rc"), "printf '1\\n' >&2\n").unwrap();
    let key = env.dir.path().join("k_key");
    sshd::new_key(&key, "ed25519", "");
    env.sshd
        .authorize_for(KILL_USER, &PathBuf::from(format!("{}.pub", key.display())));
    let mut a = add_args("chatty", env.sshd.port);
    a.user = KILL_USER.into();
    a.key = Some(key);
    let (r, out) = cli(&env.app, TargetCmd::Add(a), "").await;
    assert_eq!(r, Ok(0), "{out}");

    // A bystander: another process of the same user, in a session of its own.
    let r = env
        .run(
            "chatty",
            "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!",
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&r.output.stderr),
        "1\n",
        "the rc line is the command's stderr"
    );
    let bystander: u32 = String::from_utf8_lossy(&r.output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(!exited(bystander));

    // A command that times out: its own group is killed, and nothing else.
    let ops = env
        .app
        .state
        .exec
        .ops_for("omt_chatty", &Place::Target("chatty".into()))
        .await
        .unwrap();
    let r = ops
        .terminal(
            "sleep 300 & echo $!; wait",
            RunOptions {
                timeout: Some(Duration::from_secs(1)),
                ..Default::default()
            },
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.output.exit, Exit::TimedOut);
    let child: u32 = String::from_utf8_lossy(&r.output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_exited(child, Duration::from_secs(5)).await,
        "the timed-out command's child survived"
    );
    let alive = !exited(bystander);
    // SAFETY: signalling the bystander this test started; no memory involved.
    unsafe { libc::kill(bystander as i32, libc::SIGKILL) };
    assert!(alive, "a process outside the command's group was killed");
}

#[tokio::test]
async fn a_dropped_command_is_killed_before_shutdown_ends() {
    let Some(env) = crate::exec_ssh::env().await else {
        return;
    };
    env.add_key_target("drop").await;
    let Env { app, sshd, dir } = env;
    let pid_file = format!(
        "/home/{}/drop-{}.pid",
        sshd::USER,
        uuid::Uuid::new_v4().simple()
    );
    let script = format!(
        // TERM is ignored (by the shell and, inherited, by `sleep`): only the KILL that follows
        // two seconds later ends it, so the kill is still running when shutdown begins.
        "trap '' TERM; sleep 300 & echo $! > {pid_file}; wait"
    );
    let ops = app
        .state
        .exec
        .ops_for("omt_drop", &Place::Target("drop".into()))
        .await
        .unwrap();
    {
        let never = CancellationToken::new();
        let started = format!("test -s {pid_file}");
        let dropped = ops.terminal(&script, RunOptions::default(), &never);
        tokio::pin!(dropped);
        // Dropped midway, once it has visibly started (`biased`: the command takes in what it
        // received, its pid line, before the check's answer ends the wait).
        tokio::select! {
            biased;
            _ = &mut dropped => panic!("the command should still have been running"),
            _ = crate::exec::wait_for(&ops, &started) => {}
        }
    }
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    drop(ops);
    // Shutting down at once: the service waits for the remote kill before it ends.
    app.stop().await;
    let gone = wait_exited(pid, Duration::from_millis(500)).await;
    if !gone {
        // SAFETY: cleaning up the process this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    let _ = std::fs::remove_file(&pid_file);
    drop((sshd, dir));
    assert!(gone, "the dropped command outlived the service's shutdown");
}

/// A timeout and a cancellation (what `/stop` and a cancelled turn do) of a command with a
/// child each leave no process behind, and say so truthfully.
async fn assert_stops(ops: &sshmode::exec::ops::Ops, server: &str) {
    for how in ["timeout", "cancel"] {
        let cancel = CancellationToken::new();
        let timeout = match how {
            "timeout" => Duration::from_secs(3),
            _ => {
                let c = cancel.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    c.cancel();
                });
                Duration::from_secs(60)
            }
        };
        let r = ops
            .terminal(
                "sleep 173 & echo $!; wait",
                RunOptions {
                    timeout: Some(timeout),
                    ..Default::default()
                },
                &cancel,
            )
            .await
            .unwrap();
        let want = if how == "timeout" {
            Exit::TimedOut
        } else {
            Exit::Cancelled
        };
        assert_eq!(r.output.exit, want, "{server} {how}");
        let child: u32 = String::from_utf8_lossy(&r.output.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{server} {how}: {r:?}"));
        let gone = wait_exited(child, Duration::from_secs(5)).await;
        if !gone {
            // SAFETY: cleaning up the process this test started.
            unsafe { libc::kill(child as i32, libc::SIGKILL) };
        }
        assert!(gone, "{server} {how}: the command's child kept running");
        assert_eq!(r.output.stop_note, None, "{server} {how}");
    }
}

#[tokio::test]
async fn timeout_and_stop_leave_no_process_on_openssh() {
    let Some(env) = crate::exec_ssh::env().await else {
        return;
    };
    env.add_key_target("stop_o").await;
    let ops = env
        .app
        .state
        .exec
        .ops_for("omt_stop_o", &Place::Target("stop_o".into()))
        .await
        .unwrap();
    assert_stops(&ops, "OpenSSH").await;
}

#[tokio::test]
async fn timeout_and_stop_leave_no_process_on_dropbear() {
    let Some(env) = crate::dropbear::env("stop_d", false).await else {
        return;
    };
    let ops = env
        .app
        .state
        .exec
        .ops_for("omt_stop_d", &Place::Target("stop_d".into()))
        .await
        .unwrap();
    assert_stops(&ops, "Dropbear").await;
    // Commands still work as ever: exit codes, signals, standard input.
    let r = ops
        .terminal(
            "kill -TERM $$",
            RunOptions::default(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.output.exit, Exit::Signal("TERM".into()));
}

#[tokio::test]
async fn a_group_that_cannot_be_ended_is_reported_not_claimed_killed() {
    // A target whose PATH has no `setsid`: the command gets no group of its own.
    let bin = tempfile::tempdir().unwrap();
    for tool in ["sleep", "printf", "cat"] {
        std::os::unix::fs::symlink(format!("/usr/bin/{tool}"), bin.path().join(tool)).unwrap();
    }
    let extra = format!("SetEnv PATH={}\n", bin.path().display());
    let Some(env) = env_with_sshd(&[("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3")], &extra).await
    else {
        return;
    };
    env.add_key_target("nogroup").await;
    let ops = env
        .app
        .state
        .exec
        .ops_for("omt_nogroup", &Place::Target("nogroup".into()))
        .await
        .unwrap();
    let r = ops
        .terminal(
            "sleep 171 & echo $!; wait",
            RunOptions {
                timeout: Some(Duration::from_secs(1)),
                ..Default::default()
            },
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    if let Ok(child) = String::from_utf8_lossy(&r.output.stdout)
        .trim()
        .parse::<i32>()
    {
        // SAFETY: cleaning up the process this test started.
        unsafe { libc::kill(child, libc::SIGKILL) };
    }
    assert_eq!(r.output.exit, Exit::TimedOut);
    let note = r
        .output
        .stop_note
        .expect("a stop that ended nothing says so");
    assert!(note.contains("setsid"), "{note}");
}
