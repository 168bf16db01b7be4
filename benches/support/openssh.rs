//! OpenSSH's own client through a ControlMaster opened once on a loopback sshd: the baseline a
//! command over the pooled SSH backend is held to (`exec`: one `true`; `agent`: a tool step).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The OpenSSH client options every call shares: no user config, strict host-key checking
/// against `dir/known_hosts` (see [`trust_host`]), the benchmark key.
pub fn ssh_opts(dir: &Path, key: &Path, port: u16) -> Vec<String> {
    vec![
        "-F".into(),
        "/dev/null".into(),
        "-o".into(),
        "BatchMode=yes".into(),
        "-o".into(),
        "StrictHostKeyChecking=yes".into(),
        "-o".into(),
        format!("UserKnownHostsFile={}", dir.join("known_hosts").display()),
        "-o".into(),
        "IdentitiesOnly=yes".into(),
        "-i".into(),
        key.display().to_string(),
        "-o".into(),
        format!("Port={port}"),
    ]
}

/// Writes `dir/known_hosts`: the loopback sshd at `port` has the public key in `host_pub`.
pub fn trust_host(dir: &Path, port: u16, host_pub: &Path) {
    let key = std::fs::read_to_string(host_pub).unwrap();
    std::fs::write(dir.join("known_hosts"), format!("[127.0.0.1]:{port} {key}")).unwrap();
}

/// A ControlMaster to `user@127.0.0.1`, its socket `dir/cm`; closed when dropped.
pub struct ControlMaster {
    opts: Vec<String>,
    path: PathBuf,
    target: String,
    master: Child,
}

impl ControlMaster {
    /// Opens the master with [`ssh_opts`] (after [`trust_host`]) and waits, at most 5 s, until
    /// it answers.
    pub fn open(dir: &Path, key: &Path, port: u16, user: &str) -> ControlMaster {
        let opts = ssh_opts(dir, key, port);
        let path = dir.join("cm");
        let target = format!("{user}@127.0.0.1");
        let master = Command::new("ssh")
            .args(&opts)
            .args(["-o", "ControlMaster=yes", "-o"])
            .arg(format!("ControlPath={}", path.display()))
            .args(["-N", &target])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let cm = ControlMaster {
            opts,
            path,
            target,
            master,
        };
        let check = || {
            Command::new("ssh")
                .args(&cm.opts)
                .arg("-o")
                .arg(format!("ControlPath={}", cm.path.display()))
                .args(["-O", "check", &cm.target])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        let mut ready = false;
        for _ in 0..500 {
            if check() {
                ready = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(ready, "ControlMaster did not come up");
        cm
    }

    /// Runs `args` on the target through the master; panics unless it succeeds.
    pub fn run(&self, args: &[&str]) {
        let st = Command::new("ssh")
            .args(&self.opts)
            .arg("-o")
            .arg(format!("ControlPath={}", self.path.display()))
            .arg(&self.target)
            .args(args)
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// The client options (for a fresh `ssh` beside the master).
    pub fn opts(&self) -> &[String] {
        &self.opts
    }

    /// The master's socket (for `scp -o ControlPath=…`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `user@127.0.0.1`.
    pub fn target(&self) -> &str {
        &self.target
    }
}

impl Drop for ControlMaster {
    fn drop(&mut self) {
        let _ = self.master.kill();
        let _ = self.master.wait();
    }
}
