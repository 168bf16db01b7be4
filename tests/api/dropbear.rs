//! A real Dropbear server for the SSH tests — the kind of server routers, NAS boxes and small
//! images run: an RSA host key, an RSA client key in the user's own `~/.ssh/authorized_keys`,
//! no SFTP subsystem, on a free loopback port, in the foreground (`-F -E`) as a child process
//! killed — with the per-connection processes it forked — on drop. Readiness is polled on the
//! TCP port.
//!
//! Needs root and `/usr/sbin/dropbear` (`dropbear-bin`, which `scripts/test.sh` installs).
//! Without them these tests FAIL, as the OpenSSH ones do ([`sshd::available`]), unless a
//! developer opts out of every SSH test with `SSHMODE_TEST_SKIP_SSH=1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::exec_ssh::{add_args, cli};
use crate::helpers::TestApp;
use crate::sshd;

/// The user every Dropbear test logs in as (its own, so its `authorized_keys` is its own).
pub const USER: &str = "sshmode_d";
const DROPBEAR: &str = "/usr/sbin/dropbear";
/// Where Debian's Dropbear looks for the SFTP server it starts.
const SFTP_SERVER: &str = "/usr/lib/sftp-server";

/// Whether the Dropbear tests run here; panics (the test fails) when Dropbear is missing and
/// nobody opted out of the SSH tests.
pub fn available() -> bool {
    if !sshd::available() {
        return false;
    }
    assert!(
        Path::new(DROPBEAR).exists(),
        "the Dropbear tests need {DROPBEAR} (apt-get install dropbear-bin; scripts/test.sh does it)"
    );
    sshd::ensure_user(USER);
    true
}

/// A running Dropbear.
pub struct Dropbear {
    pub port: u16,
    child: Child,
}

impl Dropbear {
    /// Starts one with a fresh RSA host key in `dir`, on a free loopback port. Without `sftp`
    /// it runs in a mount namespace of its own where the `sftp-server` it would start is
    /// `/dev/null` (so it cannot run), as on a box that has none; nothing outside changes.
    pub fn start(dir: &Path, sftp: bool) -> Dropbear {
        let host_key = dir.join("dropbear_rsa_host_key");
        let ok = Command::new("dropbearkey")
            .args(["-t", "rsa", "-s", "2048", "-f"])
            .arg(&host_key)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("dropbearkey");
        assert!(ok.success(), "dropbearkey failed");
        let port = sshd::free_port();
        let mut cmd = if sftp {
            Command::new(DROPBEAR)
        } else {
            let mut c = Command::new("unshare");
            c.args(["-m", "--propagation", "private", "sh", "-c"]).arg(format!(
                "s={SFTP_SERVER}; if [ -e \"$s\" ]; then mount --bind /dev/null \"$(readlink -f \"$s\")\" || exit 1; fi; exec \"$0\" \"$@\""
            ));
            c.arg(DROPBEAR);
            c
        };
        let child = cmd
            .args(["-F", "-E", "-s", "-m", "-r"])
            .arg(&host_key)
            .arg("-P")
            .arg(dir.join("dropbear.pid"))
            .arg("-p")
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dropbear");
        let d = Dropbear { port, child };
        for _ in 0..500 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return d;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("dropbear did not listen on {port} within 5 s");
    }

    /// Authorizes `pub_key_file` for [`USER`] in its `~/.ssh/authorized_keys`, owned by it
    /// and private, as Dropbear insists.
    pub fn authorize(&self, pub_key_file: &Path) {
        use std::io::Write;
        let ssh = PathBuf::from(format!("/home/{USER}/.ssh"));
        std::fs::create_dir_all(&ssh).unwrap();
        let keys = ssh.join("authorized_keys");
        let line = std::fs::read_to_string(pub_key_file).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&keys)
            .unwrap();
        f.write_all(line.as_bytes()).unwrap();
        let ok = Command::new("chown")
            .args(["-R", &format!("{USER}:{USER}")])
            .arg(&ssh)
            .status()
            .unwrap();
        assert!(ok.success());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

impl Drop for Dropbear {
    fn drop(&mut self) {
        for child in sshd::children_of(self.child.id() as i32) {
            // SAFETY: signalling processes our dropbear forked; no memory involved.
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An app and a Dropbear target added (RSA client key) and approved.
pub struct DropbearEnv {
    pub app: TestApp,
    pub server: Dropbear,
    pub dir: tempfile::TempDir,
}

/// An app and a Dropbear target `alias` (RSA host and client keys), with or without SFTP.
pub async fn env(alias: &str, sftp: bool) -> Option<DropbearEnv> {
    if !available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Dropbear::start(dir.path(), sftp);
    let app = TestApp::builder()
        .var("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "5")
        .spawn()
        .await;
    let key = dir.path().join("client_rsa");
    sshd::new_key(&key, "rsa", "");
    server.authorize(&PathBuf::from(format!("{}.pub", key.display())));
    let mut a = add_args(alias, server.port);
    a.user = USER.into();
    a.key = Some(key);
    let (r, out) = cli(&app, sshmode::target::cli::TargetCmd::Add(a), "").await;
    assert_eq!(r, Ok(0), "{out}");
    Some(DropbearEnv { app, server, dir })
}
