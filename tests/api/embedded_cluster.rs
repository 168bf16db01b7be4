//! The embedded cluster belongs to no single process, seen from outside: the real binary with
//! no DATABASE_URL, two commands on one data directory. Whoever attached survives the exit of
//! the command that started the cluster, the last one out stops it, a killed command does not
//! keep it running, and `serve` starts it again when it goes away under it.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, ChildStdin, Command};

use crate::helpers::eventually;

/// A bound on a command's start (the first creates the cluster and migrates).
const START_LIMIT: Duration = Duration::from_secs(90);
/// A bound on a command's exit (the shutdown grace, then stopping the cluster).
const EXIT_LIMIT: Duration = Duration::from_secs(60);
/// How soon `serve` answers ready again after the other command left, or the cluster went away.
const AGAIN_LIMIT: Duration = Duration::from_secs(15);

/// A data directory the cluster's account can reach (under root it runs as `postgres`), with
/// the logs of the commands run on it beside it.
struct Data {
    root: tempfile::TempDir,
}

impl Data {
    fn new() -> Self {
        sshmode::install_crypto_provider();
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Data { root }
    }

    fn dir(&self) -> PathBuf {
        self.root.path().join("d")
    }

    fn pg(&self) -> PathBuf {
        self.dir().join("pg")
    }

    /// `sshmode <args>` on this data directory, its standard error going to `<log>.log`.
    fn command(&self, args: &[&str], log: &str) -> Command {
        let err = std::fs::File::create(self.log(log)).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sshmode"));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("SSHMODE_DATA_DIR", self.dir())
            .env("SSHMODE_LOCAL_USER", "sshmode-tools")
            .env("RUST_LOG", "info")
            .current_dir(self.root.path())
            .stdout(Stdio::null())
            .stderr(err)
            .kill_on_drop(true);
        cmd
    }

    fn log(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("{name}.log"))
    }

    fn read_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log(name)).unwrap_or_default()
    }

    /// `sshmode chat` with its input held open, once it has opened the database.
    async fn chat(&self) -> (Child, ChildStdin) {
        let mut child = self
            .command(&["chat"], "chat")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        eventually(
            "sshmode chat to open the database",
            START_LIMIT,
            async || self.read_log("chat").contains("sshmode chat: section"),
        )
        .await;
        (child, stdin)
    }

    /// `sshmode serve` on a free port, once it answers ready.
    async fn serve(&self, name: &str) -> Serve {
        let port = crate::sshd::free_port();
        let child = self
            .command(&["serve"], name)
            .env("SSHMODE_LISTEN", format!("127.0.0.1:{port}"))
            .env("LARK_APP_ID", "cli_test_app")
            .env("LARK_APP_SECRET", "s")
            .env("LARK_VERIFICATION_TOKEN", "t")
            .env("LARK_ENCRYPT_KEY", "k")
            .env("LARK_BASE_URL", "http://127.0.0.1:9")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let serve = Serve {
            child,
            url: format!("http://127.0.0.1:{port}/readyz"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
        };
        serve
            .ready(&format!("{name} to be ready"), START_LIMIT)
            .await;
        serve
    }

    /// The postmaster's pid, from `postmaster.pid`.
    fn postmaster(&self) -> Option<i32> {
        std::fs::read_to_string(self.pg().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// Live processes whose command line names this cluster's directory (its postmaster).
    fn cluster_processes(&self) -> Vec<i32> {
        let pg = self.pg().display().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| {
                        c.split(|b| *b == 0)
                            .any(|w| String::from_utf8_lossy(w).contains(&pg))
                    })
                    .unwrap_or(false)
            })
            .collect()
    }

    /// Nothing of the cluster is left running.
    fn assert_stopped(&self, old_postmaster: i32) {
        assert!(
            !self.pg().join("postmaster.pid").exists(),
            "the cluster is still running after the last command left"
        );
        assert_eq!(self.cluster_processes(), Vec::<i32>::new());
        assert!(
            !self.runs(old_postmaster),
            "postmaster {old_postmaster} is alive"
        );
    }

    /// `pid` is alive and is this cluster's postmaster (a pid the system gave another process
    /// since does not count).
    fn runs(&self, pid: i32) -> bool {
        alive(pid) && self.cluster_processes().contains(&pid)
    }
}

/// `pid` is a running process (not gone, not a zombie waiting to be reaped).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s.rsplit_once(')')?.1.split_whitespace().next()?.to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

struct Serve {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl Serve {
    async fn is_ready(&self) -> bool {
        matches!(self.http.get(&self.url).send().await, Ok(r) if r.status() == 200)
    }

    async fn ready(&self, what: &str, within: Duration) {
        eventually(what, within, async || self.is_ready().await).await;
    }

    /// SIGTERM, then waits (bounded) for a clean exit.
    async fn stop(mut self) {
        let pid = self.child.id().unwrap() as i32;
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = tokio::time::timeout(EXIT_LIMIT, self.child.wait())
            .await
            .expect("serve stops after SIGTERM")
            .unwrap();
        assert!(status.success(), "serve exited with {status}");
    }
}

/// Waits (bounded) for `child` to exit.
async fn exited(mut child: Child, what: &str) {
    tokio::time::timeout(EXIT_LIMIT, child.wait())
        .await
        .unwrap_or_else(|_| panic!("{what} did not exit"))
        .unwrap();
}

/// `chat` starts the cluster, `serve` attaches; the chat ends and the serve keeps the very
/// same cluster, ready; when the serve stops too, nothing is left running.
#[tokio::test]
async fn embedded_cluster_outlives_the_chat_that_started_it() {
    let data = Data::new();
    let (chat, input) = data.chat().await;
    let postmaster = data.postmaster().expect("chat started the cluster");
    let serve = data.serve("serve").await;

    drop(input);
    exited(chat, "sshmode chat at the end of its input").await;
    assert_eq!(
        data.postmaster(),
        Some(postmaster),
        "the chat stopped the cluster the serve is using"
    );
    serve
        .ready("serve to stay ready after the chat left", AGAIN_LIMIT)
        .await;

    serve.stop().await;
    data.assert_stopped(postmaster);
}

/// Two `serve`s on one data directory: the first stops, the second stays ready on the same
/// cluster; the second stops, and nothing is left running.
#[tokio::test]
async fn embedded_cluster_outlives_the_first_of_two_serves() {
    let data = Data::new();
    let a = data.serve("serve-a").await;
    let postmaster = data.postmaster().expect("serve A started the cluster");
    let b = data.serve("serve-b").await;

    a.stop().await;
    assert_eq!(data.postmaster(), Some(postmaster), "serve A stopped it");
    b.ready("serve B to stay ready after A stopped", AGAIN_LIMIT)
        .await;

    b.stop().await;
    data.assert_stopped(postmaster);
    let attached = std::fs::read_dir(data.dir().join("pg.attached"))
        .unwrap()
        .count();
    assert_eq!(attached, 0, "each command removes its own attachment");
}

/// A command killed outright leaves its attachment behind; it does not count, so the last
/// live command still stops the cluster.
#[tokio::test]
async fn embedded_cluster_stops_with_the_last_live_command_after_a_kill() {
    let data = Data::new();
    let (mut chat, _input) = data.chat().await;
    let postmaster = data.postmaster().expect("chat started the cluster");
    chat.kill().await.unwrap();
    assert!(
        data.runs(postmaster),
        "killing the chat does not stop the cluster"
    );

    let serve = data.serve("serve").await;
    assert_eq!(data.postmaster(), Some(postmaster));
    serve.stop().await;
    data.assert_stopped(postmaster);
}

/// The cluster stopped from outside under a running `serve`: the serve starts it again and is
/// ready within seconds.
#[tokio::test]
async fn embedded_cluster_is_started_again_by_serve_when_it_goes_away() {
    let data = Data::new();
    let serve = data.serve("serve").await;
    let first = data.postmaster().expect("serve started the cluster");
    // SIGINT: PostgreSQL's fast shutdown, as `pg_ctl stop -m fast` sends it.
    // SAFETY: signalling a process of this test (root, or the same user).
    assert_eq!(unsafe { libc::kill(first, libc::SIGINT) }, 0);
    eventually("the first postmaster to exit", EXIT_LIMIT, async || {
        !data.runs(first)
    })
    .await;

    eventually(
        "serve to start the cluster again",
        AGAIN_LIMIT,
        async || matches!(data.postmaster(), Some(p) if p != first && data.runs(p)),
    )
    .await;
    serve
        .ready("serve to be ready on the restarted cluster", AGAIN_LIMIT)
        .await;
    let second = data.postmaster().unwrap();
    // The line follows the start, which the readiness above may beat.
    eventually("serve to log the restart", AGAIN_LIMIT, async || {
        data.read_log("serve").contains("started it again")
    })
    .await;

    serve.stop().await;
    data.assert_stopped(second);
}
