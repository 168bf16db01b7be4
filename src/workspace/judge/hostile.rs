//! Tests of [`read_preamble`] against hostile repositories. Each case configures a program
//! that git runs from the repository's own configuration (it leaves a marker file), and runs
//! commands as a `read` workspace would. The control runs them without the preamble and must
//! see the marker (so the test can fail); with the preamble, under `sh` and `bash`, the marker
//! must not appear. Every case runs on every git found here: the one on `PATH`, Debian's
//! `/usr/bin/git`, and any listed in `SSHMODE_TEST_GITS` (colon-separated paths to `git`
//! binaries, e.g. a build of 2.20, the oldest the targets are taken to have). A case needing a
//! newer git than one found is not run on that git; each case must run on at least one.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::testing::SCOPE;
use super::{Permission, check_command, read_preamble};

/// One git binary under test, first on `PATH` through a directory of its own.
struct Git {
    /// A directory holding only `git`, a link to the binary.
    bin: tempfile::TempDir,
    version: (u32, u32),
    label: String,
}

fn version_of(binary: &Path) -> Option<((u32, u32), String)> {
    let out = Command::new(binary).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let number = text.strip_prefix("git version ")?;
    let mut parts = number.split('.').map(|p| p.parse::<u32>().ok());
    Some(((parts.next()??, parts.next()??), text))
}

/// Every git found here, once each.
fn gits() -> Vec<Git> {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut candidates: Vec<PathBuf> = path
        .split(':')
        .map(|d| Path::new(d).join("git"))
        .filter(|p| p.is_file())
        .take(1)
        .collect();
    candidates.push(PathBuf::from("/usr/bin/git"));
    if let Ok(extra) = std::env::var("SSHMODE_TEST_GITS") {
        candidates.extend(
            extra
                .split(':')
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        );
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for c in candidates {
        let Ok(real) = std::fs::canonicalize(&c) else {
            continue;
        };
        if seen.contains(&real) {
            continue;
        }
        seen.push(real.clone());
        let (version, label) = version_of(&real)
            .unwrap_or_else(|| panic!("{} is not a git that answers --version", c.display()));
        let bin = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&real, bin.path().join("git")).unwrap();
        out.push(Git {
            bin,
            version,
            label,
        });
    }
    assert!(!out.is_empty(), "git must be installed for these tests");
    out
}

/// Answers every HTTP request with `401` and a Basic challenge, so that git asks its
/// credential helpers; stops when dropped (or after a minute).
struct Http401 {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Http401 {
    fn start() -> Http401 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut buf = [0u8; 4096];
                        let _ = s.read(&mut buf);
                        let _ = s.write_all(
                            b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"x\"\r\n\
                              Content-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Http401 {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Http401 {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A place for one run: a home, the repository `repo`, and the marker its programs leave.
struct Fixture<'g> {
    git: &'g Git,
    dir: tempfile::TempDir,
    marker: PathBuf,
    server: Option<Http401>,
}

impl<'g> Fixture<'g> {
    fn new(git: &'g Git) -> Fixture<'g> {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran.marker");
        Fixture {
            git,
            dir,
            marker,
            server: None,
        }
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    /// The environment of every command: this git first, no user or system configuration,
    /// no prompts, and none of git's own variables from outside.
    fn env(&self, cmd: &mut Command) {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", self.git.bin.path().display()))
            .env("HOME", self.dir.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .stdin(Stdio::null());
        for v in [
            "GIT_DIR",
            "GIT_WORK_TREE",
            "GIT_PAGER",
            "PAGER",
            "GIT_EXTERNAL_DIFF",
            "GIT_SSH",
            "GIT_SSH_COMMAND",
            "GIT_ASKPASS",
            "SSH_ASKPASS",
            "GIT_CONFIG_PARAMETERS",
        ] {
            cmd.env_remove(v);
        }
    }

    fn git_in(&self, dir: &Path, args: &[&str]) -> String {
        let mut cmd = Command::new("git");
        self.env(&mut cmd);
        let out = cmd.current_dir(dir).args(args).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn git(&self, args: &[&str]) -> String {
        self.git_in(&self.repo(), args)
    }

    fn commit(&self, message: &str) {
        self.git(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-qam",
            message,
        ]);
    }

    fn config(&self, key: &str, value: &str) {
        self.git(&["config", key, value]);
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.repo().join(file), text).unwrap();
    }

    /// Shell text that leaves the marker.
    fn touch(&self) -> String {
        format!("touch '{}'", self.marker.display())
    }

    /// A program file that leaves the marker and fails.
    fn program(&self) -> String {
        let p = self.dir.path().join("evil-program");
        std::fs::write(&p, format!("#!/bin/sh\n{}\nexit 1\n", self.touch())).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        p.display().to_string()
    }

    /// `repo` with `a.txt` (`one`) and `.gitattributes` committed.
    fn init(&self, attributes: &str) {
        self.git_in(self.dir.path(), &["init", "-q", "repo"]);
        self.write(".gitattributes", attributes);
        self.write("a.txt", "one\n");
        self.git(&["add", "."]);
        self.commit("one");
    }

    /// `repo` as a partial clone of `srv` without its blobs: reading `b.txt` fetches.
    fn partial_clone(&self) {
        let srv = self.dir.path().join("srv");
        self.git_in(self.dir.path(), &["init", "-q", "srv"]);
        std::fs::write(srv.join("b.txt"), "blob\n").unwrap();
        self.git_in(&srv, &["add", "."]);
        self.git_in(
            &srv,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "commit",
                "-qm",
                "srv",
            ],
        );
        self.git_in(&srv, &["config", "uploadpack.allowFilter", "true"]);
        self.git_in(&srv, &["config", "uploadpack.allowAnySHA1InWant", "true"]);
        let url = format!("file://{}", srv.display());
        self.git_in(
            self.dir.path(),
            &[
                "clone",
                "-q",
                "--no-checkout",
                "--filter=blob:none",
                &url,
                "repo",
            ],
        );
    }

    /// `repo` whose last commit merges a conflicting change to `a.txt`, merged by the
    /// `evil` driver (only `true` while merging here).
    fn merged(&self) {
        self.init("*.txt merge=evil\n");
        self.git(&["checkout", "-qb", "side"]);
        self.write("a.txt", "side\n");
        self.commit("side");
        self.git(&["checkout", "-q", "-"]);
        self.write("a.txt", "main\n");
        self.commit("main");
        self.git(&[
            "-c",
            "merge.evil.driver=true",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "merge",
            "-q",
            "side",
            "-m",
            "merge",
        ]);
    }

    /// Runs `script` in `repo` under `shell`, with the preamble first when `armed`; on a
    /// terminal when `tty` (git starts a pager only there).
    fn run(&self, shell: &str, script: &str, armed: bool, tty: bool) -> Output {
        let file = self.dir.path().join("run.sh");
        let text = if armed {
            format!("{}{script}", read_preamble())
        } else {
            script.to_owned()
        };
        std::fs::write(&file, text).unwrap();
        let mut cmd = if tty {
            let mut c = Command::new("script");
            c.arg("-qec")
                .arg(format!("{shell} '{}'", file.display()))
                .arg("/dev/null");
            c
        } else {
            let mut c = Command::new(shell);
            c.arg(&file);
            c
        };
        self.env(&mut cmd);
        cmd.current_dir(self.repo())
            .output()
            .unwrap_or_else(|e| panic!("{shell} (and `script` for a terminal) must be here: {e}"))
    }
}

/// One hostile configuration, and commands that make git run it.
struct Case {
    name: &'static str,
    /// The oldest git (major, minor) with the feature.
    since: (u32, u32),
    /// Whether the read judge allows `script` (when not, the preamble must hold anyway).
    judged: bool,
    /// Whether git only runs it on a terminal (the pager).
    tty: bool,
    setup: fn(&mut Fixture),
    script: &'static str,
    /// Text the output shows with the preamble: git still works.
    shows: &'static str,
}

const CASES: &[Case] = &[
    Case {
        name: "core.fsmonitor",
        since: (2, 16),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("");
            f.config("core.fsmonitor", &format!("{}; false", f.touch()));
        },
        script: "git status\n",
        shows: "nothing to commit",
    },
    Case {
        name: "filter.<driver>.clean",
        since: (2, 0),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("*.txt filter=evil\n");
            f.config("filter.evil.clean", &format!("{}; cat", f.touch()));
            f.write("a.txt", "two\n");
        },
        script: "git status\ngit diff\n",
        shows: "+two",
    },
    Case {
        name: "filter.<driver>.process",
        since: (2, 11),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("*.txt filter=evil\n");
            f.config("filter.evil.process", &format!("{}; exit 1", f.touch()));
            f.write("a.txt", "two\n");
        },
        script: "git status\n",
        shows: "a.txt",
    },
    Case {
        name: "a filter named with `=`, which `-c` cannot name",
        since: (2, 0),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("*.txt filter=a=b\n");
            f.config("filter.a=b.clean", &format!("{}; cat", f.touch()));
            f.write("a.txt", "two\n");
        },
        script: "git status\n",
        shows: "",
    },
    Case {
        name: "diff.external",
        since: (2, 0),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("");
            f.config("diff.external", &format!("{}; true", f.touch()));
            f.write("a.txt", "two\n");
        },
        script: "git diff\ngit log -p -1\n",
        shows: "+two",
    },
    Case {
        name: "diff.<driver>.command",
        since: (2, 0),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("*.txt diff=evil\n");
            f.config("diff.evil.command", &format!("{}; true", f.touch()));
            f.write("a.txt", "two\n");
        },
        script: "git diff\ngit show\n",
        shows: "+two",
    },
    Case {
        name: "diff.<driver>.textconv",
        since: (2, 0),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("*.txt diff=evil\n");
            f.config("diff.evil.textconv", &format!("{}; cat", f.touch()));
            f.write("a.txt", "two\n");
            f.git(&["add", "a.txt"]);
        },
        script: "git diff --cached\ngit log -p -1\ngit show\n",
        shows: "+two",
    },
    Case {
        name: "diff.<driver>.textconv through `status -v`",
        since: (2, 0),
        judged: false,
        tty: false,
        setup: |f| {
            f.init("*.txt diff=evil\n");
            f.config("diff.evil.textconv", &format!("{}; cat", f.touch()));
            f.write("a.txt", "two\n");
            f.git(&["add", "a.txt"]);
        },
        script: "git status -v\n",
        shows: "",
    },
    Case {
        name: "merge.<driver>.driver through `log.diffMerges=remerge`",
        since: (2, 36),
        judged: true,
        tty: false,
        setup: |f| {
            f.merged();
            f.config("merge.evil.driver", &format!("{}; false", f.touch()));
            f.config("log.diffMerges", "remerge");
        },
        script: "git log -p -m -1\n",
        shows: "merge",
    },
    Case {
        name: "merge.<driver>.driver through `--remerge-diff`",
        since: (2, 36),
        judged: false,
        tty: false,
        setup: |f| {
            f.merged();
            f.config("merge.evil.driver", &format!("{}; false", f.touch()));
        },
        script: "git show --remerge-diff HEAD\n",
        shows: "",
    },
    Case {
        name: "core.alternateRefsCommand",
        since: (2, 23),
        judged: false,
        tty: false,
        setup: |f| {
            f.init("");
            f.git_in(f.dir.path(), &["init", "-q", "alt"]);
            let objects = f.dir.path().join("alt/.git/objects");
            f.write(
                ".git/objects/info/alternates",
                &format!("{}\n", objects.display()),
            );
            f.config("core.alternateRefsCommand", &format!("{}; true", f.touch()));
        },
        script: "git log --alternate-refs -1\n",
        shows: "",
    },
    Case {
        name: "a hook (post-index-change, whenever the index is written)",
        since: (2, 22),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("");
            let hook = f.repo().join(".git/hooks/post-index-change");
            std::fs::create_dir_all(hook.parent().unwrap()).unwrap();
            std::fs::write(&hook, format!("#!/bin/sh\n{}\n", f.touch())).unwrap();
            std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            // Only the time changes: git refreshes the index, and writes it if it may.
            let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
            std::fs::File::options()
                .write(true)
                .open(f.repo().join("a.txt"))
                .unwrap()
                .set_modified(old)
                .unwrap();
        },
        script: "git diff\ngit status\n",
        shows: "nothing to commit",
    },
    Case {
        name: "core.pager",
        since: (2, 0),
        judged: true,
        tty: true,
        setup: |f| {
            f.init("");
            f.config("core.pager", &format!("{}; cat", f.touch()));
        },
        script: "git log -1\n",
        shows: "one",
    },
    Case {
        name: "pager.<command>",
        since: (2, 0),
        judged: true,
        tty: true,
        setup: |f| {
            f.init("");
            for c in ["status", "log", "diff", "show"] {
                f.config(&format!("pager.{c}"), &format!("{}; cat", f.touch()));
            }
        },
        script: "git show\ngit status\n",
        shows: "one",
    },
    Case {
        name: "gpg.program through log.showSignature",
        since: (2, 10),
        judged: true,
        tty: false,
        setup: |f| {
            f.init("");
            // A commit with a (bogus) signature: showing its signature runs gpg.program.
            let raw = f.git(&["cat-file", "commit", "HEAD"]);
            let (headers, message) = raw.split_once("\n\n").unwrap();
            let signed = format!(
                "{headers}\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n \
                 -----END PGP SIGNATURE-----\n\n{message}"
            );
            let file = f.dir.path().join("signed");
            std::fs::write(&file, signed).unwrap();
            let oid = f.git(&[
                "hash-object",
                "-t",
                "commit",
                "-w",
                &file.display().to_string(),
            ]);
            f.git(&["update-ref", "HEAD", oid.trim()]);
            f.config("log.showSignature", "true");
            let program = f.program();
            f.config("gpg.program", &program);
        },
        script: "git log -1\n",
        shows: "one",
    },
    Case {
        name: "core.sshCommand through a lazy fetch",
        since: (2, 20),
        judged: true,
        tty: false,
        setup: |f| {
            f.partial_clone();
            f.config("remote.origin.url", "ssh://sshmode.invalid/r");
            f.config("core.sshCommand", &format!("{}; false", f.touch()));
        },
        script: "git show HEAD:b.txt\n",
        shows: "",
    },
    Case {
        name: "remote.<name>.uploadpack through a lazy fetch",
        since: (2, 20),
        judged: true,
        tty: false,
        setup: |f| {
            f.partial_clone();
            f.config(
                "remote.origin.uploadpack",
                &format!("{}; git-upload-pack", f.touch()),
            );
        },
        script: "git show HEAD:b.txt\n",
        shows: "",
    },
    Case {
        name: "a credential helper through a lazy fetch",
        since: (2, 20),
        judged: true,
        tty: false,
        setup: |f| {
            f.partial_clone();
            let server = Http401::start();
            f.config(
                "remote.origin.url",
                &format!("http://127.0.0.1:{}/r", server.port),
            );
            f.config("credential.helper", &format!("!{}; false", f.touch()));
            f.server = Some(server);
        },
        script: "git show HEAD:b.txt\n",
        shows: "",
    },
];

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_read_preamble_keeps_git_from_running_the_repositorys_programs() {
    let gits = gits();
    let labels: Vec<&str> = gits.iter().map(|g| g.label.as_str()).collect();
    eprintln!("hostile repositories, on {labels:?}");
    let mut ran = vec![0usize; CASES.len()];
    let mut failures: Vec<String> = Vec::new();
    for git in &gits {
        for (k, case) in CASES.iter().enumerate() {
            if git.version < case.since {
                continue;
            }
            ran[k] += 1;
            let what = format!("{} on {}", case.name, git.label);
            if check_command(Permission::Read, case.script, &SCOPE).is_ok() != case.judged {
                failures.push(format!(
                    "{what}: the judge should {} {:?}",
                    if case.judged { "allow" } else { "refuse" },
                    case.script
                ));
            }
            // The control: without the preamble the program runs, so this test can fail.
            let mut f = Fixture::new(git);
            (case.setup)(&mut f);
            let out = f.run("sh", case.script, false, case.tty);
            if !f.marker.exists() {
                failures.push(format!(
                    "{what}: without the preamble the program did not run, so the test could \
                     not fail:\n{}",
                    text(&out)
                ));
            }
            for shell in ["sh", "bash"] {
                let mut f = Fixture::new(git);
                (case.setup)(&mut f);
                let out = f.run(shell, case.script, true, case.tty);
                if f.marker.exists() {
                    failures.push(format!(
                        "{what}, {shell}: the program ran under the preamble:\n{}",
                        text(&out)
                    ));
                } else if !String::from_utf8_lossy(&out.stdout).contains(case.shows) {
                    failures.push(format!(
                        "{what}, {shell}: git did not show {:?}:\n{}",
                        case.shows,
                        text(&out)
                    ));
                }
            }
        }
    }
    for (case, n) in CASES.iter().zip(ran) {
        if n == 0 {
            failures.push(format!("{} ran on no git found here", case.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_driver_git_cannot_disarm_stops_git() {
    for git in &gits() {
        let f = Fixture::new(git);
        f.init("*.txt filter=a=b\n");
        f.config("filter.a=b.clean", &format!("{}; cat", f.touch()));
        f.write("a.txt", "two\n");
        for shell in ["sh", "bash"] {
            let out = f.run(shell, "git status", true, false);
            assert_eq!(out.status.code(), Some(2), "{}: {}", git.label, text(&out));
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("cannot be disarmed"),
                "{}: {}",
                git.label,
                text(&out)
            );
            assert!(!f.marker.exists());
        }
        // With nothing to disarm, git works under `set -eu` too.
        let plain = Fixture::new(git);
        plain.init("");
        for shell in ["sh", "bash"] {
            let out = plain.run(shell, "set -eu\ngit status\n", true, false);
            assert!(out.status.success(), "{}: {}", git.label, text(&out));
        }
    }
}

#[test]
fn the_read_preamble_writes_no_index_and_refuses_other_subcommands() {
    for git in &gits() {
        let f = Fixture::new(git);
        f.init("");
        let index = f.repo().join(".git/index");
        // Stat information out of date, content the same: `status` and `diff` would refresh
        // the index and write it.
        let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let touch_old = || {
            std::fs::File::options()
                .write(true)
                .open(f.repo().join("a.txt"))
                .unwrap()
                .set_modified(old)
                .unwrap();
        };
        touch_old();
        let before = std::fs::read(&index).unwrap();
        for shell in ["sh", "bash"] {
            let out = f.run(shell, "git status\ngit diff\n", true, false);
            assert!(out.status.success(), "{}: {}", git.label, text(&out));
            assert_eq!(
                std::fs::read(&index).unwrap(),
                before,
                "{}, {shell}: the index was rewritten",
                git.label
            );
            let out = f.run(shell, "git stash", true, false);
            assert_eq!(out.status.code(), Some(2), "{}: {}", git.label, text(&out));
            assert!(String::from_utf8_lossy(&out.stderr).contains("read permission"));
        }
        // The control: without the preamble, `diff` rewrites it.
        let out = f.run("sh", "git diff\n", false, false);
        assert!(out.status.success(), "{}", text(&out));
        assert_ne!(
            std::fs::read(&index).unwrap(),
            before,
            "{}: the control did not rewrite the index",
            git.label
        );
    }
}
