//! What a sandboxed local command learns about what is not its own: nothing. Through the chat
//! agent's `terminal` and MCP `exec` on `local`, `stat`, `ls -la`, `readlink`, `find`, `test -e`
//! and `du` on the data directory's files (`master.key`, `pg.password`, the cluster), another
//! section's workspace, file and link, and the service's `/proc` entries show no name, size,
//! time or link target; the data directory's path shows an empty stand-in, not the real one;
//! the file tools answer a path in the data directory the same whether it exists or not; the
//! section's own workspace and `TMPDIR` work as before.

use std::os::unix::fs::MetadataExt;

use serde_json::json;
use sshmode::exec::Place;
use sshmode::mcp::token::{self, NewToken};
use sshmode::workspace::Permission;

use crate::agent::{Env, MODEL, accept, call, say, tool_results, unique, wait_turns_ended};
use crate::helpers::TestApp;

/// Names that must never appear in what a command prints.
const OTHER_FILE: &str = "their-notes-5c1e.txt";
const OTHER_LINK: &str = "their-link-9a7d";
const LINK_TARGET: &str = "/etc/their-target-3b2f";

/// What the probes look at: the data directory's files, another section's workspace, the
/// service's `/proc` entries. Each is `(label, path)`; labels keep the names out of the output.
struct Layout {
    data_dir: String,
    other_section: String,
    probes: Vec<(String, String)>,
}

/// Puts a stand-in `pg.password` and cluster directory into the data directory (these tests
/// use an external database), gives `other` a workspace with a file and a link, and lists
/// what the probes look at.
async fn layout(app: &TestApp, other: &str) -> Layout {
    let data_dir = app.state.config.data_dir.display().to_string();
    std::fs::write(format!("{data_dir}/pg.password"), "not-the-password").unwrap();
    std::fs::create_dir_all(format!("{data_dir}/pg")).unwrap();
    std::fs::write(format!("{data_dir}/pg/PG_VERSION"), "16\n").unwrap();
    let theirs = app.state.exec.ops_for(other, &Place::Local).await.unwrap();
    theirs.write_file(OTHER_FILE, b"theirs").await.unwrap();
    let r = theirs
        .terminal(
            &format!("ln -s {LINK_TARGET} {OTHER_LINK}"),
            Default::default(),
            &Default::default(),
        )
        .await
        .unwrap();
    assert!(r.output.exit.success(), "{r:?}");
    let other_ws = theirs.backend().home().await.unwrap();
    let pid = std::process::id();
    let key = app.state.config.master_key_file.display().to_string();
    assert!(std::fs::metadata(&key).is_ok(), "the master key exists");
    let probes = [
        ("master-key", key),
        ("pg-password", format!("{data_dir}/pg.password")),
        ("cluster", format!("{data_dir}/pg")),
        ("cluster-version", format!("{data_dir}/pg/PG_VERSION")),
        ("other-workspace", other_ws.clone()),
        ("other-file", format!("{other_ws}/{OTHER_FILE}")),
        ("other-link", format!("{other_ws}/{OTHER_LINK}")),
        ("service-proc", format!("/proc/{pid}")),
        ("service-environ", format!("/proc/{pid}/environ")),
        ("service-cmdline", format!("/proc/{pid}/cmdline")),
        ("service-cwd", format!("/proc/{pid}/cwd")),
        ("service-fd", format!("/proc/{pid}/fd")),
        // PID 1 of the command's namespace is the launcher's, root's: its command line names
        // the service's pid.
        ("init-cmdline", "/proc/1/cmdline".to_string()),
        ("init-environ", "/proc/1/environ".to_string()),
    ]
    .map(|(l, p)| (l.to_string(), p))
    .to_vec();
    Layout {
        data_dir,
        other_section: other.to_string(),
        probes,
    }
}

/// A script that runs every probe on each path, errors dropped, each path's output after an
/// `@@ label` line; then the data directory's device, inode and listing; then the same on
/// its own workspace and `TMPDIR`, which must work.
fn script(layout: &Layout) -> String {
    let mut s = String::from(
        "probe() { echo \"@@ $1\"; p=$2; { stat -c '%s %Y %U %N' -- \"$p\"; readlink -- \"$p\"; \
         ls -la -- \"$p\"; find \"$p\" -maxdepth 1; du -s -- \"$p\"; test -e \"$p\" && echo exists; \
         test -L \"$p\" && echo link; } 2>/dev/null; }\n",
    );
    for (label, path) in &layout.probes {
        s.push_str(&format!("probe {label} '{path}'\n"));
    }
    let data = &layout.data_dir;
    s.push_str(&format!(
        "echo '@@ data-dir'; stat -c '%d:%i' -- '{data}'; ls -A '{data}' '{data}'/* 2>/dev/null; \
         find '{data}' 2>/dev/null | grep -v -F \"$HOME\" | grep -v -F \"$TMPDIR\"; \
         ls -A \"$HOME/..\" 2>/dev/null\n"
    ));
    s.push_str(
        "echo '@@ own'; d=$(mktemp -d ~/own.XXXXXX) && cd \"$d\" && echo mine > own.txt \
         && cat own.txt && stat -c %s own.txt && ls -la | grep -c ' own.txt$' \
         && find ~ -name own.txt | grep -c -F \"$d/\" && du -s ~ >/dev/null \
         && ln -s own.txt own.link && readlink own.link && test -e own.txt \
         && test \"$(pwd -P)\" = \"$d\" && test \"$(cd ~ && pwd -P)\" = \"$HOME\" \
         && echo tmp > \"$TMPDIR/t\" && cat \"$TMPDIR/t\" && echo own-ok\n",
    );
    s.push_str("echo '@@ end'\n");
    s
}

/// The output of each `@@ label` section of `out`.
fn sections(out: &str) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = Vec::new();
    for line in out.lines() {
        if let Some(label) = line.strip_prefix("@@ ") {
            all.push((label.to_string(), String::new()));
        } else if let Some((_, text)) = all.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    all
}

/// Checks what one run of [`script`] printed.
fn assert_nothing_leaked(layout: &Layout, out: &str, via: &str) {
    let found = sections(out);
    let of = |label: &str| {
        found
            .iter()
            .find(|(l, _)| l == label)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("{via}: no `{label}` section in:\n{out}"))
    };
    assert!(
        found.iter().any(|(l, _)| l == "end"),
        "{via}: cut short:\n{out}"
    );
    let mut leaks = Vec::new();
    for (label, _) in &layout.probes {
        let seen = of(label);
        if !seen.trim().is_empty() {
            leaks.push(format!("`{label}` shows:\n{seen}"));
        }
    }
    // The data directory's path shows a stand-in: not the real directory, and no name of
    // anything in it but the command's own workspace and tmp.
    let data = of("data-dir");
    let real = std::fs::metadata(&layout.data_dir).unwrap();
    if data.contains(&format!("{}:{}", real.dev(), real.ino())) {
        leaks.push(format!("the real data directory is visible:\n{data}"));
    }
    for name in [
        "master.key",
        "pg.password",
        "PG_VERSION",
        &layout.other_section,
        OTHER_FILE,
        OTHER_LINK,
        LINK_TARGET,
    ] {
        if out.contains(name) {
            leaks.push(format!("`{name}` is named"));
        }
    }
    assert!(
        leaks.is_empty(),
        "{via}: a local command sees what is not its own:\n{}\n\nall it printed:\n{out}",
        leaks.join("\n")
    );
    let own = of("own");
    assert!(
        own.contains("mine\n5\n1\n1\nown.txt\ntmp\nown-ok\n"),
        "{via}: the own workspace does not work as before:\n{own}"
    );
}

/// Through the chat agent: `terminal`, and `read_file` on a file of the data directory that
/// exists and on one that does not (the same answer).
#[tokio::test]
async fn the_agents_terminal_sees_nothing_of_the_data_directory_other_sections_or_the_service() {
    let env = Env::builder().spawn().await;
    let other = unique("omt_theirs");
    let layout = layout(&env.app, &other).await;
    let section = unique("oc_mine");
    let msg = unique("om_probe");
    let key = env.app.state.config.master_key_file.display().to_string();
    let missing = format!("{}/no-such-file", layout.data_dir);
    env.llm
        .push(
            MODEL,
            call(
                "terminal",
                json!({"command": script(&layout), "timeout": 60}),
            ),
        )
        .push(MODEL, call("read_file", json!({"path": key})))
        .push(MODEL, call("read_file", json!({"path": missing})))
        .push(MODEL, say("done"));
    accept(&env.app, &section, &msg, "look around").await;
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    let results = tool_results(&env.llm);
    assert_eq!(results.len(), 3, "{results:?}");
    assert_nothing_leaked(&layout, &results[0], "terminal");
    assert_eq!(
        results[1].replace(&key, "PATH"),
        results[2].replace(&missing, "PATH"),
        "read_file tells an existing file of the data directory from a missing one"
    );
}

/// Through MCP: `exec` on `local` with a token allowed there, `read_file`, and a local
/// interactive shell.
#[tokio::test]
async fn mcp_exec_on_local_sees_nothing_of_the_data_directory_other_sections_or_the_service() {
    let app = TestApp::builder()
        .var("SSHMODE_MCP_LISTEN", "127.0.0.1:0")
        .spawn()
        .await;
    let other = unique("omt_theirs");
    let layout = layout(&app, &other).await;
    let token = token::create(
        &app.state.db,
        &NewToken {
            name: "prober".into(),
            targets: Vec::new(),
            all_targets: false,
            local: true,
            permission: Permission::Full,
            expires_at: None,
        },
        "operator",
    )
    .await
    .unwrap();
    let url = format!("http://{}/mcp", app.state.mcp_addr.unwrap());
    let key = app.state.config.master_key_file.display().to_string();
    let missing = format!("{}/no-such-file", layout.data_dir);
    let out = crate::mcp::client(json!({
        "url": url,
        "token": token,
        "mode": "2026-07-28",
        "steps": [
            {"tool": "exec", "args": {"target": "local", "command": script(&layout), "timeout_ms": 60000}},
            {"tool": "read_file", "args": {"target": "local", "path": key}},
            {"tool": "read_file", "args": {"target": "local", "path": missing}},
            // The same probes typed into a local interactive shell (its output kept in a file,
            // as a terminal echoes what is typed).
            {"tool": "write_file", "args": {"target": "local", "path": "~/probe.sh", "content": script(&layout)}},
            {"tool": "shell_open", "args": {"target": "local"}},
            {"tool": "shell_write", "args": {"shell_id": "{{4.shell_id}}", "data": "bash ~/probe.sh > ~/probe.out 2>&1; echo probed-$((6*7))\r"}},
            {"tool": "shell_read", "args": {"shell_id": "{{4.shell_id}}", "mode": "raw", "wait_ms": 30000, "expect": "probed-42"}},
            {"tool": "read_file", "args": {"target": "local", "path": "~/probe.out"}},
        ],
    }))
    .await;
    assert!(out.get("error").is_none(), "{out}");
    let r = &out["results"];
    assert_eq!(r[0]["is_error"], false, "{out}");
    let stdout = r[0]["structured"]["stdout"].as_str().unwrap();
    assert_nothing_leaked(&layout, stdout, "MCP exec");
    assert_eq!(r[1]["is_error"], true, "{out}");
    assert_eq!(
        r[1]["text"].as_str().unwrap().replace(&key, "PATH"),
        r[2]["text"].as_str().unwrap().replace(&missing, "PATH"),
        "read_file tells an existing file of the data directory from a missing one"
    );
    for (i, step) in r.as_array().unwrap().iter().enumerate().skip(3) {
        assert_eq!(step["is_error"], false, "step {i}: {out}");
    }
    assert_eq!(r[6]["structured"]["matched"], true, "{out}");
    let typed = r[7]["structured"]["text"].as_str().unwrap();
    assert_nothing_leaked(&layout, typed, "MCP shell");
}

/// A local command starts with every signal at its default action, however the service was
/// started: `nohup` ignores SIGHUP, a shell's background job SIGINT and SIGQUIT, and an
/// ignored signal survives `exec` — so a Ctrl-C typed into a tool's terminal would not stop
/// its command.
#[tokio::test]
async fn local_commands_start_with_every_signal_at_its_default_whatever_the_service_ignores() {
    // As `nohup` and a background job start the service (SIGINT is left alone: this test
    // binary's other tests stop their children with it).
    for sig in [libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: changes only what this process and its children do with these signals.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let env = Env::builder().spawn().await;
    let section = unique("oc_signals");
    env.llm
        .push(
            MODEL,
            call(
                "terminal",
                json!({"command": "grep SigIgn /proc/self/status"}),
            ),
        )
        .push(MODEL, say("done"));
    accept(&env.app, &section, &unique("om_signals"), "signals").await;
    assert_eq!(wait_turns_ended(&env.app, &section, 1).await, vec!["done"]);
    let results = tool_results(&env.llm);
    let ignored = results[0]
        .split("SigIgn:")
        .nth(1)
        .map(|r| r.trim_start().chars().take(16).collect::<String>())
        .unwrap_or_else(|| panic!("no SigIgn line: {}", results[0]));
    let mask = u64::from_str_radix(&ignored, 16).unwrap();
    for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGPIPE] {
        assert_eq!(
            mask & (1 << (sig - 1)),
            0,
            "signal {sig} ignored: {}",
            results[0]
        );
    }
}
