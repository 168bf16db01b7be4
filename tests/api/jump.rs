//! Targets behind jump hosts, against real OpenSSH servers: a target the service cannot reach
//! at all (its sshd in a network namespace of its own, reachable only from the jump host's
//! namespace) runs commands and file tools through the jump host; a chain of two jump hosts;
//! a wrong jump host key refused and audited; a jump host that forbids forwarding reported in
//! those words; a pending, disabled or removed jump host; loops refused.

use std::path::{Path, PathBuf};
use std::process::{Command as Proc, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use sshmode::exec::ops::{ReadRange, RunOptions};
use sshmode::exec::{ExecError, Place};
use sshmode::target::cli::{SetArgs, TargetCmd};
use tokio_util::sync::CancellationToken;

use crate::exec_ssh::{add_args, cli, cli_ok};
use crate::helpers::TestApp;
use crate::sshd::{self, Sshd};

/// Runs `ip args…`; panics with its error output on failure.
fn ip(args: &[&str]) {
    let out = Proc::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two network namespaces: J (the jump host's), joined to the service's namespace by one veth
/// pair (`10.201.N.1` here, `10.201.N.2` in J), and T (the target's), joined to J only
/// (`10.202.N.1` in J, `10.202.N.2` in T). Nothing routes from here to `10.202.N.0/30`, and J
/// does not forward: T is reachable only through a connection J makes. Deleted on drop.
pub struct Namespaces {
    n: u32,
    jump_ns: String,
    target_ns: String,
}

impl Namespaces {
    fn create() -> Namespaces {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        // Names and subnets unique to this process and call; a leftover of an earlier run
        // (same N) is skipped, a bounded number of times.
        for _ in 0..250 {
            let n = (std::process::id() * 7 + NEXT.fetch_add(1, Ordering::Relaxed)) % 250 + 1;
            let jump_ns = format!("sshmj{n}");
            let target_ns = format!("sshmt{n}");
            let added = Proc::new("ip")
                .args(["netns", "add", &jump_ns])
                .stderr(Stdio::null())
                .status()
                .expect("ip netns add");
            if !added.success() {
                continue;
            }
            // From here on the guard deletes whatever was made, even if a step fails.
            let ns = Namespaces {
                n,
                jump_ns,
                target_ns,
            };
            ns.wire();
            return ns;
        }
        panic!("no free network namespace name");
    }

    fn wire(&self) {
        let (n, j, t) = (self.n, self.jump_ns.as_str(), self.target_ns.as_str());
        ip(&["netns", "add", t]);
        let (hj, jh) = (format!("sjh{n}"), format!("sjj{n}"));
        let (jt, tj) = (format!("stj{n}"), format!("stt{n}"));
        ip(&["link", "add", &hj, "type", "veth", "peer", "name", &jh]);
        ip(&["link", "set", &jh, "netns", j]);
        ip(&["addr", "add", &format!("10.201.{n}.1/30"), "dev", &hj]);
        ip(&["link", "set", &hj, "up"]);
        ip(&[
            "-n",
            j,
            "addr",
            "add",
            &format!("10.201.{n}.2/30"),
            "dev",
            &jh,
        ]);
        ip(&["-n", j, "link", "set", &jh, "up"]);
        ip(&["-n", j, "link", "set", "lo", "up"]);
        ip(&[
            "-n", j, "link", "add", &jt, "type", "veth", "peer", "name", &tj,
        ]);
        ip(&["-n", j, "link", "set", &tj, "netns", t]);
        ip(&[
            "-n",
            j,
            "addr",
            "add",
            &format!("10.202.{n}.1/30"),
            "dev",
            &jt,
        ]);
        ip(&["-n", j, "link", "set", &jt, "up"]);
        ip(&[
            "-n",
            t,
            "addr",
            "add",
            &format!("10.202.{n}.2/30"),
            "dev",
            &tj,
        ]);
        ip(&["-n", t, "link", "set", &tj, "up"]);
        ip(&["-n", t, "link", "set", "lo", "up"]);
    }

    /// The jump host's address, as the service reaches it.
    pub fn jump_addr(&self) -> String {
        format!("10.201.{}.2", self.n)
    }

    /// The target's address, as the jump host reaches it.
    pub fn target_addr(&self) -> String {
        format!("10.202.{}.2", self.n)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth ends, and with them their peers.
        for ns in [&self.target_ns, &self.jump_ns] {
            let _ = Proc::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = Proc::new("ip")
            .args(["link", "del", &format!("sjh{}", self.n)])
            .stderr(Stdio::null())
            .status();
    }
}

/// The namespaces and the two servers in them. The servers are dropped (killed) before the
/// namespaces are deleted.
pub struct Lab {
    pub jump: Sshd,
    pub target: Sshd,
    pub ns: Namespaces,
}

impl Lab {
    pub fn start(dir: &Path, jump_extra: &str) -> Lab {
        let ns = Namespaces::create();
        let jump_dir = dir.join("jump-sshd");
        let target_dir = dir.join("target-sshd");
        std::fs::create_dir_all(&jump_dir).unwrap();
        std::fs::create_dir_all(&target_dir).unwrap();
        let jump = Sshd::start_netns(&jump_dir, &ns.jump_ns, &ns.jump_addr(), 22, jump_extra);
        let target = Sshd::start_netns(&target_dir, &ns.target_ns, &ns.target_addr(), 22, "");
        Lab { jump, target, ns }
    }
}

/// A fresh key pair authorized on each of `servers`.
pub fn key_for(dir: &Path, name: &str, servers: &[&Sshd]) -> PathBuf {
    let p = dir.join(name);
    sshd::new_key(&p, "ed25519", "");
    for s in servers {
        s.authorize(&PathBuf::from(format!("{}.pub", p.display())));
    }
    p
}

/// `sshmode target add <alias> --host H --port P --key K [--jump J] [--offline] --approve`.
async fn add(
    app: &TestApp,
    alias: &str,
    host: &str,
    port: u16,
    key: &Path,
    jump: Option<&str>,
    offline: bool,
) -> (Result<i32, String>, String) {
    let mut a = add_args(alias, port);
    a.host = host.into();
    a.key = Some(key.to_path_buf());
    a.jump = jump.map(str::to_string);
    a.offline = offline;
    cli(app, TargetCmd::Add(a), "").await
}

async fn run(app: &TestApp, alias: &str, cmd: &str) -> Result<String, ExecError> {
    let ops = app
        .state
        .exec
        .ops_for(&format!("omt_jump_{alias}"), &Place::Target(alias.into()))
        .await?;
    let r = ops
        .terminal(cmd, RunOptions::default(), &CancellationToken::new())
        .await?;
    assert!(r.output.exit.success(), "{cmd}: {:?}", r.output);
    Ok(String::from_utf8_lossy(&r.output.stdout).into_owned())
}

async fn app_with(vars: &[(&str, &str)]) -> TestApp {
    vars.iter()
        .fold(
            TestApp::builder().var("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3"),
            |b, (k, v)| b.var(k, v),
        )
        .spawn()
        .await
}

async fn show(app: &TestApp, alias: &str) -> String {
    let (r, out) = cli(
        app,
        TargetCmd::Show {
            alias: alias.into(),
            json: false,
        },
        "",
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    out
}

async fn test_target(app: &TestApp, alias: &str) -> (Result<i32, String>, String) {
    cli(
        app,
        TargetCmd::Test {
            alias: alias.into(),
            trust: None,
        },
        "",
    )
    .await
}

#[tokio::test]
async fn a_target_reachable_only_through_its_jump_host_runs_commands_and_files_through_it() {
    if !sshd::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lab = Lab::start(dir.path(), "");
    // One channel per connection, one connection per target, a short idle time: the tunnel
    // must take no channel of the jump host's only connection, and the reaper must leave that
    // connection open while the tunnel lives.
    let app = app_with(&[
        ("SSHMODE_SSH_MAX_CONNECTIONS", "1"),
        ("SSHMODE_SSH_CHANNELS_PER_CONNECTION", "1"),
        ("SSHMODE_SSH_QUEUE_TIMEOUT_SECS", "2"),
        ("SSHMODE_SSH_IDLE_SECS", "1"),
    ])
    .await;
    let key = key_for(dir.path(), "k", &[&lab.jump, &lab.target]);
    let (jaddr, taddr) = (lab.ns.jump_addr(), lab.ns.target_addr());

    // The service cannot reach the target itself: neither to see its key nor to connect.
    let (r, out) = add(&app, "direct", &taddr, 22, &key, None, false).await;
    assert!(r.is_err(), "{out}");
    let (r, out) = add(&app, "direct", &taddr, 22, &key, None, true).await;
    assert_eq!(r, Ok(0), "{out}");
    let e = run(&app, "direct", "true").await.unwrap_err();
    assert!(
        matches!(e, ExecError::Unavailable { .. }),
        "a direct connection must fail: {e}"
    );

    // Through the jump host: `add` sees the target's own key through it.
    let (r, out) = add(&app, "bastion", &jaddr, 22, &key, None, false).await;
    assert_eq!(r, Ok(0), "{out}");
    let (r, out) = add(&app, "inner", &taddr, 22, &key, Some("bastion"), false).await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains("via bastion"), "{out}");
    let t = sshmode::target::get(&app.state.db, "inner").await.unwrap();
    assert_eq!(
        t.host_key.as_ref().unwrap().fingerprint,
        lab.target.fingerprint(),
        "the target's own key, not the jump host's"
    );
    assert_eq!(t.jump.as_deref(), Some("bastion"));

    // Commands run on the target: its namespace's address is the one it has.
    let addrs = run(&app, "inner", "cat /proc/net/fib_trie; echo; hostname")
        .await
        .unwrap();
    assert!(addrs.contains(&taddr), "{addrs}");
    assert!(!addrs.contains(&jaddr), "ran on the jump host: {addrs}");
    // File tools, both ways, through the jump host.
    let ops = app
        .state
        .exec
        .ops_for("omt_jump_files", &Place::Target("inner".into()))
        .await
        .unwrap();
    let name = format!("jumped-{}.txt", uuid::Uuid::new_v4().simple());
    ops.write_file(&name, b"through the bastion\n")
        .await
        .unwrap();
    let read = ops.read_file(&name, ReadRange::Whole).await.unwrap();
    assert_eq!(read.text.as_deref(), Some("through the bastion\n"));
    let seen = run(&app, "inner", &format!("cat ~/{name}; rm ~/{name}"))
        .await
        .unwrap();
    assert_eq!(seen, "through the bastion\n");

    // While a long command runs through the tunnel: the tunnel takes no channel (the jump
    // host's one connection, with its one channel, still runs a command of its own), and the
    // reaper leaves that connection open however long it has itself been idle.
    let marker =
        std::env::temp_dir().join(format!("sshmode-jump-{}", uuid::Uuid::new_v4().simple()));
    let long = {
        let app_exec = app.state.exec.clone();
        let script = format!("touch {}; sleep 4; echo still here", marker.display());
        tokio::spawn(async move {
            let ops = app_exec
                .ops_for("omt_jump_long", &Place::Target("inner".into()))
                .await
                .unwrap();
            ops.terminal(&script, RunOptions::default(), &CancellationToken::new())
                .await
        })
    };
    // The target shares this machine's file system: its command has started once the file
    // exists (bounded poll).
    for _ in 0..300 {
        if marker.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(marker.exists(), "the long command did not start");
    let counts = app.state.exec.ssh.connection_counts().await;
    assert_eq!((counts["bastion"], counts["inner"]), (1, 1), "{counts:?}");
    let on_jump = run(&app, "bastion", "cat /proc/net/fib_trie")
        .await
        .unwrap();
    assert!(on_jump.contains(&jaddr), "{on_jump}");
    let out = long.await.unwrap().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.output.stdout), "still here\n");
    assert_eq!(app.state.exec.ssh.connection_counts().await["bastion"], 1);
    let _ = std::fs::remove_file(&marker);

    // `show`, `list` and `test` name the path; `test` works through it and says so.
    let shown = show(&app, "inner").await;
    assert!(shown.contains("jump host:       bastion"), "{shown}");
    assert!(
        shown.contains(&format!(
            "path:            sshmode → bastion ({}@{jaddr}:22) → inner",
            sshd::USER
        )),
        "{shown}"
    );
    let (_, list) = cli(&app, TargetCmd::List { json: false }, "").await;
    assert!(
        list.contains(&format!(
            "inner\t{}@{taddr}:22 via bastion\tapproved",
            sshd::USER
        )),
        "{list}"
    );
    let (r, out) = test_target(&app, "inner").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(
        out.contains("authenticated and ran `true` through its jump host"),
        "{out}"
    );
    assert!(out.contains(&lab.target.fingerprint()), "{out}");
    // Every tool result says where it ran, path included.
    let backend = app
        .state
        .exec
        .backend("omt_jump_loc", &Place::Target("inner".into()))
        .await
        .unwrap();
    assert_eq!(
        backend.location(),
        format!("inner · {}@{taddr} via bastion", sshd::USER)
    );
}

/// Two sshds on loopback: a jump host and a target (reachable directly too; these tests are
/// about what the jump path does, the namespaces test about reachability).
struct Pair {
    jump: Sshd,
    target: Sshd,
    key: PathBuf,
    dir: tempfile::TempDir,
}

fn pair(jump_extra: &str) -> Option<Pair> {
    if !sshd::available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let jd = dir.path().join("jump");
    let td = dir.path().join("target");
    std::fs::create_dir_all(&jd).unwrap();
    std::fs::create_dir_all(&td).unwrap();
    let jump = Sshd::start_with(&jd, sshd::free_port(), jump_extra);
    let target = Sshd::start_with(&td, sshd::free_port(), "");
    let key = key_for(dir.path(), "k", &[&jump, &target]);
    Some(Pair {
        jump,
        target,
        key,
        dir,
    })
}

#[tokio::test]
async fn a_wrong_jump_host_key_is_refused_and_audited() {
    let Some(p) = pair("") else { return };
    let app = app_with(&[]).await;
    let (r, out) = add(&app, "gate", "127.0.0.1", p.jump.port, &p.key, None, false).await;
    assert_eq!(r, Ok(0), "{out}");
    let (r, out) = add(
        &app,
        "behind",
        "127.0.0.1",
        p.target.port,
        &p.key,
        Some("gate"),
        false,
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    // The jump host's pinned key is not the one it presents (the target's key stands in for a
    // man in the middle's).
    cli_ok(
        &app,
        TargetCmd::Rekey {
            alias: "gate".into(),
            host_key: p.target.fingerprint(),
        },
    )
    .await;
    let e = run(&app, "behind", "true").await.unwrap_err().to_string();
    assert!(
        e.contains("target `behind` is unavailable")
            && e.contains("host key of its jump host `gate` changed")
            && e.contains(&p.jump.fingerprint()),
        "{e}"
    );
    let mismatches: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT detail FROM audit_log WHERE subject = 'gate' AND action = 'hostkey.mismatch'",
    )
    .fetch_all(&app.state.db)
    .await
    .unwrap();
    assert_eq!(mismatches.len(), 1, "{mismatches:?}");
    assert_eq!(mismatches[0]["presented"], p.jump.fingerprint());
    let (r, out) = test_target(&app, "behind").await;
    assert_eq!(r, Ok(1), "{out}");
    assert!(out.contains("host key of `gate` changed"), "{out}");
    // The target's own key is checked on its own: a wrong one is refused and audited with
    // the path it was seen through.
    cli_ok(
        &app,
        TargetCmd::Rekey {
            alias: "gate".into(),
            host_key: p.jump.fingerprint(),
        },
    )
    .await;
    cli_ok(
        &app,
        TargetCmd::Rekey {
            alias: "behind".into(),
            host_key: p.jump.fingerprint(),
        },
    )
    .await;
    let e = run(&app, "behind", "true").await.unwrap_err();
    assert!(matches!(e, ExecError::HostKeyMismatch { .. }), "{e}");
    let via: serde_json::Value = sqlx::query_scalar(
        "SELECT detail FROM audit_log WHERE subject = 'behind' AND action = 'hostkey.mismatch'",
    )
    .fetch_one(&app.state.db)
    .await
    .unwrap();
    assert_eq!(via["via"], "gate", "{via}");
    drop(p.dir);
}

#[tokio::test]
async fn a_jump_host_that_forbids_forwarding_is_reported_in_those_words() {
    let Some(p) = pair("AllowTcpForwarding no\n") else {
        return;
    };
    let app = app_with(&[]).await;
    let (r, out) = add(
        &app,
        "closed",
        "127.0.0.1",
        p.jump.port,
        &p.key,
        None,
        false,
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    // `add` cannot see the key through it, and says why.
    let (r, _) = add(
        &app,
        "beyond",
        "127.0.0.1",
        p.target.port,
        &p.key,
        Some("closed"),
        false,
    )
    .await;
    let e = r.unwrap_err();
    assert!(e.contains("administratively prohibited"), "{e}");
    let (r, out) = add(
        &app,
        "beyond",
        "127.0.0.1",
        p.target.port,
        &p.key,
        Some("closed"),
        true,
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    let e = run(&app, "beyond", "true").await.unwrap_err().to_string();
    assert!(
        e.contains("the jump host `closed` refused to forward")
            && e.contains("administratively prohibited")
            && e.contains("AllowTcpForwarding no"),
        "{e}"
    );
    let (r, out) = test_target(&app, "beyond").await;
    assert_eq!(r, Ok(1), "{out}");
    assert!(out.contains("administratively prohibited"), "{out}");
    // The jump host itself is fine.
    assert!(run(&app, "closed", "true").await.is_ok());
}

#[tokio::test]
async fn a_pending_disabled_or_removed_jump_host_fails_the_targets_behind_it() {
    let Some(p) = pair("") else { return };
    let app = app_with(&[]).await;
    let mut a = add_args("hub", p.jump.port);
    a.key = Some(p.key.clone());
    a.approve = false;
    cli_ok(&app, TargetCmd::Add(a)).await;
    let (r, out) = add(
        &app,
        "spoke",
        "127.0.0.1",
        p.target.port,
        &p.key,
        Some("hub"),
        false,
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    let e = run(&app, "spoke", "true").await.unwrap_err().to_string();
    assert!(
        e.contains("target `spoke` is unavailable: its jump host `hub` is pending"),
        "{e}"
    );
    cli_ok(
        &app,
        TargetCmd::Approve {
            alias: "hub".into(),
        },
    )
    .await;
    assert_eq!(run(&app, "spoke", "echo ok").await.unwrap(), "ok\n");

    // Disabled: the targets behind it fail at once (their pooled connection included).
    let out = cli_ok(
        &app,
        TargetCmd::Disable {
            alias: "hub".into(),
        },
    )
    .await;
    assert!(
        out.contains("now fail until it is approved again: spoke"),
        "{out}"
    );
    let e = run(&app, "spoke", "true").await.unwrap_err().to_string();
    assert!(
        e.contains("target `spoke` is unavailable: its jump host `hub` is disabled"),
        "{e}"
    );
    cli_ok(
        &app,
        TargetCmd::Approve {
            alias: "hub".into(),
        },
    )
    .await;
    assert_eq!(run(&app, "spoke", "echo again").await.unwrap(), "again\n");

    // Removal is refused while a target depends on it, naming that target.
    let (r, _) = cli(
        &app,
        TargetCmd::Remove {
            alias: "hub".into(),
        },
        "",
    )
    .await;
    let e = r.unwrap_err();
    assert!(
        e.contains("target `hub` is the jump host of `spoke`") && e.contains("--no-jump"),
        "{e}"
    );
    assert!(sshmode::target::get(&app.state.db, "hub").await.is_ok());
    // Moved off it, the target is direct again and the jump host can go.
    let out = cli_ok(
        &app,
        TargetCmd::Set(SetArgs {
            alias: "spoke".into(),
            workspace: None,
            permission: None,
            jump: None,
            no_jump: true,
            approvers: None,
            risky: None,
        }),
    )
    .await;
    assert!(out.contains("reached directly"), "{out}");
    cli_ok(
        &app,
        TargetCmd::Remove {
            alias: "hub".into(),
        },
    )
    .await;
    assert_eq!(run(&app, "spoke", "echo direct").await.unwrap(), "direct\n");
    drop(p.dir);
}

#[tokio::test]
async fn a_chain_of_jump_hosts_connects_hop_by_hop() {
    let Some(p) = pair("") else { return };
    let app = app_with(&[]).await;
    // outer → mid (the same server, reached through outer) → end.
    let (r, out) = add(&app, "outer", "127.0.0.1", p.jump.port, &p.key, None, false).await;
    assert_eq!(r, Ok(0), "{out}");
    let (r, out) = add(
        &app,
        "mid",
        "127.0.0.1",
        p.jump.port,
        &p.key,
        Some("outer"),
        false,
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    let (r, out) = add(
        &app,
        "end",
        "127.0.0.1",
        p.target.port,
        &p.key,
        Some("mid"),
        false,
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    assert_eq!(run(&app, "end", "echo far").await.unwrap(), "far\n");
    let counts = app.state.exec.ssh.connection_counts().await;
    assert_eq!(
        (counts["outer"], counts["mid"], counts["end"]),
        (1, 1, 1),
        "{counts:?}"
    );
    let (r, out) = test_target(&app, "end").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains("through its 2 jump hosts"), "{out}");
    assert!(out.contains("sshmode → outer ("), "{out}");
    // A disabled hop anywhere on the way fails the target, naming that hop.
    let (r, _) = cli(
        &app,
        TargetCmd::Disable {
            alias: "outer".into(),
        },
        "",
    )
    .await;
    assert_eq!(r, Ok(0));
    let e = run(&app, "end", "true").await.unwrap_err().to_string();
    assert!(e.contains("its jump host `outer` is disabled"), "{e}");
    drop(p.dir);
}

#[tokio::test]
async fn a_loop_of_jump_hosts_is_refused_when_set_and_when_connecting() {
    let app = app_with(&[]).await;
    let agent_target = |alias: &str, jump: Option<&str>| {
        let mut a = add_args(alias, 22);
        a.agent = true;
        a.offline = true;
        a.jump = jump.map(str::to_string);
        TargetCmd::Add(a)
    };
    for (alias, jump) in [("ra", None), ("rb", Some("ra")), ("rc", Some("rb"))] {
        cli_ok(&app, agent_target(alias, jump)).await;
    }
    let set_jump = |alias: &str, jump: &str| {
        TargetCmd::Set(SetArgs {
            alias: alias.into(),
            workspace: None,
            permission: None,
            jump: Some(jump.into()),
            no_jump: false,
            approvers: None,
            risky: None,
        })
    };
    let (r, _) = cli(&app, set_jump("ra", "rc"), "").await;
    let e = r.unwrap_err();
    assert!(
        e.contains("`rc` is itself reached through `ra` (ra → rc → rb → ra)")
            && e.contains("may not loop"),
        "{e}"
    );
    let (r, _) = cli(&app, set_jump("ra", "ra"), "").await;
    assert!(r.unwrap_err().contains("cannot be its own jump host"));
    let (r, _) = cli(&app, agent_target("rd", Some("rd")), "").await;
    assert!(r.unwrap_err().contains("cannot be its own jump host"));
    let (r, _) = cli(&app, agent_target("re", Some("nowhere")), "").await;
    assert!(r.unwrap_err().contains("no target named `nowhere`"));
    assert!(
        sshmode::target::get(&app.state.db, "ra")
            .await
            .unwrap()
            .jump
            .is_none(),
        "nothing changed"
    );
    // A loop that got into the table some other way is still never followed.
    sqlx::query("UPDATE targets SET jump = 'rc' WHERE alias = 'ra'")
        .execute(&app.state.db)
        .await
        .unwrap();
    let e = run(&app, "rc", "true").await.unwrap_err().to_string();
    assert!(
        e.contains("more than 8 jump hosts (or its jump hosts form a loop)"),
        "{e}"
    );
}
