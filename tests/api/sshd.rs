//! A real OpenSSH server for the SSH tests: throwaway host key, `UsePAM no`, password and
//! public-key authentication, a user CA, authorized keys in the fixture's own directory, on a
//! free loopback port, in the foreground (`-D -e`) as a child process that is killed — with
//! the per-connection processes it forked — on drop. Readiness is polled on the TCP port.
//!
//! Needs root (to create test users and run sshd) and `/usr/sbin/sshd`. Without them the SSH
//! tests FAIL — in `scripts/test.sh`, and so in CI, too — unless a developer opts out with
//! `SSHMODE_TEST_SKIP_SSH=1`; then [`available`] says loudly that they were skipped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The test user every SSH test logs in as (created once, idempotently).
pub const USER: &str = "sshmode_t";
/// Its password.
pub const PASSWORD: &str = "pw-Zq8#tricky 'quoted' pass";

/// Set to `1` by a developer without root or sshd to skip the SSH tests (never in CI).
pub const SKIP_VAR: &str = "SSHMODE_TEST_SKIP_SSH";

/// Whether SSH tests run here. Panics (the test fails) when they cannot and nobody opted out;
/// prints a loud notice when a developer did.
pub fn available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let sshd = Path::new("/usr/sbin/sshd").exists();
    let opted_out = std::env::var(SKIP_VAR).is_ok_and(|v| v == "1");
    match policy(root, sshd, opted_out) {
        Ok(true) => {
            ensure_user(USER);
            true
        }
        Ok(false) => {
            eprintln!(
                "\n!!!!! SKIPPING SSH TESTS ({SKIP_VAR}=1): root={root}, sshd={sshd}. \
                 Nothing about SSH was tested !!!!!\n"
            );
            false
        }
        Err(why) => panic!("{why}"),
    }
}

/// Run (`Ok(true)`), skip because a developer opted out (`Ok(false)`), or fail.
fn policy(root: bool, sshd: bool, opted_out: bool) -> Result<bool, String> {
    if root && sshd {
        return Ok(true);
    }
    if opted_out {
        return Ok(false);
    }
    Err(format!(
        "the SSH tests need root (for useradd) and /usr/sbin/sshd (root={root}, sshd={sshd}): \
         run them through scripts/test.sh as root, or set {SKIP_VAR}=1 to skip them on a \
         developer machine"
    ))
}

#[test]
fn missing_root_or_sshd_fails_unless_a_developer_opts_out() {
    assert_eq!(policy(true, true, false), Ok(true));
    assert_eq!(
        policy(true, true, true),
        Ok(true),
        "available tests always run"
    );
    for (root, sshd) in [(false, true), (true, false), (false, false)] {
        let e = policy(root, sshd, false).unwrap_err();
        assert!(e.contains(SKIP_VAR) && e.contains("root"), "{e}");
        assert_eq!(policy(root, sshd, true), Ok(false));
    }
}

/// Creates `user` (a login shell, a home, [`PASSWORD`]) once per process.
pub fn ensure_user(user: &str) {
    static DONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    if done.iter().any(|u| u == user) {
        return;
    }
    let exists = Command::new("id")
        .arg(user)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !exists {
        let ok = Command::new("useradd")
            .args(["-m", "-s", "/bin/bash", user])
            .status()
            .expect("useradd");
        assert!(ok.success(), "useradd {user} failed");
    }
    let mut child = Command::new("chpasswd")
        .stdin(Stdio::piped())
        .spawn()
        .expect("chpasswd");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{user}:{PASSWORD}\n").as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "chpasswd failed");
    std::fs::create_dir_all("/run/sshd").expect("mkdir /run/sshd");
    done.push(user.to_string());
}

/// Runs `ssh-keygen` with `args`; panics on failure.
pub fn keygen(args: &[&str]) {
    let out = Command::new("ssh-keygen")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Creates a key pair at `path` (`path.pub` beside it).
pub fn new_key(path: &Path, kind: &str, passphrase: &str) {
    let mut args = vec!["-q", "-t", kind, "-N", passphrase, "-C", "test", "-f"];
    let p = path.to_str().unwrap();
    args.push(p);
    if kind == "rsa" {
        args.extend(["-b", "2048"]);
    }
    keygen(&args);
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running sshd.
pub struct Sshd {
    pub port: u16,
    /// The fixture directory: host key, config, CA, authorized keys (`<user>.keys`).
    pub dir: PathBuf,
    child: Child,
}

impl Sshd {
    /// Starts sshd on `port` with the host key at `dir/host_key` (created if missing) and a
    /// user CA at `dir/ca` (created if missing).
    /// Starts one in a new directory `sshd` below `parent`, on a free port.
    pub fn start_below(parent: &Path) -> Sshd {
        let dir = parent.join("sshd");
        std::fs::create_dir_all(&dir).unwrap();
        Sshd::start(&dir, free_port())
    }

    pub fn start(dir: &Path, port: u16) -> Sshd {
        Self::start_with(dir, port, "")
    }

    /// [`Sshd::start`] with `extra` lines appended to its configuration.
    pub fn start_with(dir: &Path, port: u16, extra: &str) -> Sshd {
        Self::start_opts(dir, port, extra, true)
    }

    /// [`Sshd::start_with`], with or without an SFTP subsystem.
    pub fn start_opts(dir: &Path, port: u16, extra: &str, sftp: bool) -> Sshd {
        Self::start_at(dir, None, "127.0.0.1", port, extra, sftp)
    }

    /// An sshd listening on `addr:port` inside the network namespace `netns` (created by the
    /// caller), with `extra` configuration lines. Ready once it has written its pid file, which
    /// sshd does after it listens (the service may not be able to reach it directly).
    pub fn start_netns(dir: &Path, netns: &str, addr: &str, port: u16, extra: &str) -> Sshd {
        Self::start_at(dir, Some(netns), addr, port, extra, true)
    }

    fn start_at(
        dir: &Path,
        netns: Option<&str>,
        addr: &str,
        port: u16,
        extra: &str,
        sftp: bool,
    ) -> Sshd {
        let host_key = dir.join("host_key");
        if !host_key.exists() {
            new_key(&host_key, "ed25519", "");
        }
        let ca = dir.join("ca");
        if !ca.exists() {
            new_key(&ca, "ed25519", "");
        }
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress {addr}\nHostKey {hk}\nPidFile {pid}\nUsePAM no\n\
                 PasswordAuthentication yes\nPubkeyAuthentication yes\nKbdInteractiveAuthentication no\n\
                 TrustedUserCAKeys {ca}.pub\nAuthorizedKeysFile {dir}/%u.keys\nStrictModes no\n\
                 {subsystem}MaxSessions 10\nMaxStartups 100:30:200\nLogLevel ERROR\n{extra}",
                hk = host_key.display(),
                pid = dir.join("sshd.pid").display(),
                ca = ca.display(),
                dir = dir.display(),
                subsystem = if sftp { "Subsystem sftp internal-sftp\n" } else { "" },
            ),
        )
        .unwrap();
        let mut cmd = match netns {
            None => Command::new("/usr/sbin/sshd"),
            Some(ns) => {
                let mut c = Command::new("ip");
                // `ip netns exec` execs sshd in place: the child is sshd itself.
                c.args(["netns", "exec", ns, "/usr/sbin/sshd"]);
                c
            }
        };
        let child = cmd
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sshd");
        let sshd = Sshd {
            port,
            dir: dir.to_path_buf(),
            child,
        };
        match netns {
            None => sshd.wait_ready(),
            Some(_) => sshd.wait_pid_file(),
        }
        sshd
    }

    fn wait_pid_file(&self) {
        // Bounded poll: sshd writes its pid file once it listens.
        for _ in 0..500 {
            if self.dir.join("sshd.pid").exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("sshd in its namespace did not start within 5 s");
    }

    fn wait_ready(&self) {
        // Bounded poll of the port: sshd is ready when it accepts.
        for _ in 0..500 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("sshd did not listen on {} within 5 s", self.port);
    }

    /// Authorizes a public key (file contents) for [`USER`].
    pub fn authorize(&self, pub_key_file: &Path) {
        self.authorize_for(USER, pub_key_file)
    }

    /// Authorizes a public key (file contents) for `user`.
    pub fn authorize_for(&self, user: &str, pub_key_file: &Path) {
        use std::io::Write;
        let line = std::fs::read_to_string(pub_key_file).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{user}.keys")))
            .unwrap();
        f.write_all(line.as_bytes()).unwrap();
    }

    /// Signs `key.pub` with the fixture's CA for [`USER`], giving `key-cert.pub`.
    pub fn certify(&self, key: &Path) -> PathBuf {
        let ca = self.dir.join("ca");
        let pubk = format!("{}.pub", key.display());
        keygen(&[
            "-q",
            "-s",
            ca.to_str().unwrap(),
            "-I",
            "test-cert",
            "-n",
            USER,
            "-V",
            "-5m:+1h",
            &pubk,
        ]);
        PathBuf::from(format!("{}-cert.pub", key.display()))
    }

    /// The host key's `SHA256:…` fingerprint, from `ssh-keygen -l`.
    pub fn fingerprint(&self) -> String {
        let out = Command::new("ssh-keygen")
            .args(["-l", "-f"])
            .arg(self.dir.join("host_key.pub"))
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        text.split_whitespace().nth(1).unwrap().to_string()
    }

    /// Kills sshd and every connection process it forked.
    pub fn stop(&mut self) {
        let pid = self.child.id() as i32;
        for child in children_of(pid) {
            // SAFETY: signalling processes our sshd forked; no memory involved.
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Pids whose parent is `pid` (from /proc).
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state, ppid, …
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r)
            && rest
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse::<i32>().ok())
                == Some(pid)
        {
            out.push(p);
        }
    }
    out
}
