//! `sshmode target import`: an OpenSSH client config read as `ssh -G` reads it (checked
//! against the real `ssh -G`), its dry-run table and JSON, `--apply` adding targets pending
//! approval with their audit rows, jump hosts first, known_hosts keys pinned, conflicts left
//! alone, encrypted keys asked for on standard input; and an imported target behind an
//! imported bastion reaching a real sshd in its own network namespace once approved.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sshmode::exec::Place;
use sshmode::exec::ops::RunOptions;
use sshmode::target::cli::{ImportArgs, TargetCmd};
use sshmode::target::ssh_config::{self, Given, Proxy};
use tokio_util::sync::CancellationToken;

use crate::exec_ssh::{add_args, cli};
use crate::helpers::TestApp;
use crate::sshd;

fn import(path: &Path, apply: bool, json: bool) -> TargetCmd {
    TargetCmd::Import(ImportArgs {
        path: Some(path.to_path_buf()),
        apply,
        passphrase_stdin: false,
        json,
    })
}

/// The fixture: a config with an `Include` glob, wildcards and a negation, a `Match` block, a
/// chained `ProxyJump` (web → bastion → a hop that is no Host), `%r`/`%h` tokens, a `Host`
/// named twice, unsupported options, a missing key, a `ProxyCommand`, and a known_hosts file
/// with a plain and a hashed entry. Returns (config path, the known bastion key's fingerprint,
/// the hashed ci key's fingerprint).
struct Fixture {
    dir: tempfile::TempDir,
    config: PathBuf,
    bastion_fp: String,
    ci_fp: String,
}

fn fingerprint(pub_key: &Path) -> String {
    let out = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(pub_key)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string()
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let keys = d.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::create_dir_all(d.join("conf.d")).unwrap();
    sshd::new_key(&keys.join("shared"), "ed25519", "");
    sshd::new_key(&keys.join("web_second"), "ed25519", "");
    sshd::new_key(&d.join("bastion_host"), "ed25519", "");
    sshd::new_key(&d.join("ci_host"), "ed25519", "");
    let line = |p: &str| {
        std::fs::read_to_string(d.join(p))
            .unwrap()
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let kh = d.join("known_hosts");
    std::fs::write(
        &kh,
        format!(
            "10.1.0.1 {}\nci.example {}\n",
            line("bastion_host.pub"),
            line("ci_host.pub")
        ),
    )
    .unwrap();
    // Hashed by OpenSSH itself.
    sshd::keygen(&["-q", "-H", "-f", kh.to_str().unwrap()]);
    let k = keys.display();
    std::fs::write(
        d.join("conf.d/10-app.conf"),
        format!(
            "Host app\n  HostName app.internal.example\n  User deploy\n  IdentityFile {k}/shared\n"
        ),
    )
    .unwrap();
    std::fs::write(d.join("conf.d/README"), "Host not-included\n").unwrap();
    let config = d.join("config");
    std::fs::write(
        &config,
        format!(
            "# team hosts\n\
             Include {d}/conf.d/*.conf\n\
             Host web\n\
             \x20 HostName %h.internal.example\n\
             \x20 Port=2222\n\
             \x20 IdentityFile {k}/web_%r\n\
             \x20 IdentityFile \"{k}/shared\"\n\
             \x20 ProxyJump bastion\n\
             \x20 ForwardAgent yes\n\
             \x20 LocalForward 8080 localhost:80\n\
             Host bastion\n\
             \x20 hostname 10.1.0.1\n\
             \x20 USER jump\n\
             \x20 ProxyJump ops@edge.example.com:2200\n\
             \x20 StrictHostKeyChecking yes\n\
             Match host nothing.invalid\n\
             \x20 User matched\n\
             Host db\n\
             \x20 HostName 10.2.0.7\n\
             \x20 IdentityFile {k}/missing\n\
             \x20 ProxyJump bastion\n\
             Host web\n\
             \x20 Port 1\n\
             \x20 User second\n\
             Host *.example !secret.example\n\
             \x20 StrictHostKeyChecking yes\n\
             Host ci.example secret.example\n\
             \x20 User ci\n\
             Host legacy\n\
             \x20 ProxyCommand nc %h %p\n\
             Host * !db\n\
             \x20 IdentityFile {k}/shared\n\
             Host *\n\
             \x20 UserKnownHostsFile {kh}\n\
             \x20 User fallback\n",
            d = d.display(),
            kh = kh.display(),
        ),
    )
    .unwrap();
    Fixture {
        bastion_fp: fingerprint(&d.join("bastion_host.pub")),
        ci_fp: fingerprint(&d.join("ci_host.pub")),
        config,
        dir,
    }
}

/// `ssh -G -F config host`: its `key value` lines, keys lowercased (OpenSSH 9.2 prints `User`).
fn ssh_g(config: &Path, host: &str) -> Vec<(String, String)> {
    let ssh = Path::new("/usr/bin/ssh");
    assert!(
        ssh.exists(),
        "/usr/bin/ssh is missing: install openssh-client (scripts/test.sh does)"
    );
    let out = Command::new(ssh)
        .arg("-G")
        .arg("-F")
        .arg(config)
        .arg(host)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh -G {host}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect()
}

#[test]
fn the_config_resolves_as_ssh_g_resolves_it() {
    let f = fixture();
    let local = sshmode::target::import::Local::current().unwrap();
    let cfg = ssh_config::load(&f.config, &local.home).unwrap();
    let names: Vec<&str> = cfg.hosts.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "app",
            "web",
            "bastion",
            "db",
            "ci.example",
            "secret.example",
            "legacy"
        ]
    );
    // Every concrete host, and names that only wildcards (or nothing) match.
    let mut checked = 0;
    for name in names
        .iter()
        .copied()
        .chain(["edge.example.com", "other.example", "unlisted"])
    {
        let g = ssh_g(&f.config, name);
        let first = |k: &str| g.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        let r = cfg.resolve(name, &Given::default());
        assert_eq!(
            Some(r.hostname.clone()),
            first("hostname"),
            "{name}: hostname"
        );
        assert_eq!(
            r.user.clone().unwrap_or(local.user.clone()),
            first("user").unwrap(),
            "{name}: user"
        );
        assert_eq!(
            r.port.unwrap_or(22).to_string(),
            first("port").unwrap(),
            "{name}: port"
        );
        // ssh -G prints IdentityFile as written (9.2) or expanded (later): ours is raw.
        let ours = r.identity_files.first().map(|(v, _)| v.clone());
        let theirs = first("identityfile");
        let expanded = ours
            .as_ref()
            .map(|v| v.replace("%r", r.user.as_deref().unwrap_or("")));
        assert!(
            theirs == ours || theirs == expanded,
            "{name}: identityfile {theirs:?} vs {ours:?}"
        );
        let jump = match &r.proxy {
            Some(Proxy::Jump(j)) => Some(j.clone()),
            _ => None,
        };
        assert_eq!(jump, first("proxyjump"), "{name}: proxyjump");
        let command = match &r.proxy {
            Some(Proxy::Command(c)) => Some(c.clone()),
            _ => None,
        };
        assert_eq!(command, first("proxycommand"), "{name}: proxycommand");
        assert_eq!(
            r.strict_host_key_checking
                .clone()
                .unwrap_or("ask".into())
                .replace("yes", "true"),
            first("stricthostkeychecking")
                .unwrap()
                .replace("yes", "true"),
            "{name}: stricthostkeychecking"
        );
        checked += 1;
    }
    assert_eq!(checked, 10);
}

#[tokio::test]
async fn a_dry_run_prints_what_would_be_added_and_changes_nothing() {
    let f = fixture();
    let app = TestApp::spawn().await;
    let (r, out) = cli(&app, import(&f.config, false, false), "").await;
    assert_eq!(r, Ok(0), "{out}");
    let k = f.dir.path().join("keys");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1],
        "ALIAS\tHOST\tUSER\tPORT\tKEY\tJUMP\tHOST KEY\tACTION"
    );
    let row = |alias: &str| -> Vec<String> {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("{alias}\t")))
            .unwrap_or_else(|| panic!("no row {alias}: {out}"))
            .split('\t')
            .map(str::to_string)
            .collect()
    };
    // Jump hosts first: the hop that is no Host, then the bastion, then web.
    let order: Vec<&str> = lines[2..]
        .iter()
        .take_while(|l| !l.is_empty())
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "app",
            "edge.example.com-2200",
            "bastion",
            "web",
            "db",
            "ci.example",
            "secret.example",
            "legacy"
        ],
        "{out}"
    );
    // %h in HostName, Port from the first block, User filled by the second `Host web`, %r in
    // IdentityFile, the jump host.
    assert_eq!(
        row("web"),
        [
            "web",
            "web.internal.example",
            "second",
            "2222",
            &format!("{}/web_second", k.display()),
            "bastion",
            "tofu -",
            "add"
        ]
    );
    assert_eq!(
        row("bastion"),
        [
            "bastion",
            "10.1.0.1",
            "jump",
            "22",
            &format!("{}/shared", k.display()),
            "edge.example.com-2200",
            &format!("strict {}", f.bastion_fp),
            "add"
        ]
    );
    assert_eq!(
        row("edge.example.com-2200")[1..4],
        ["edge.example.com", "ops", "2200"]
    );
    assert_eq!(row("edge.example.com-2200")[5], "-");
    assert_eq!(row("db")[7], "skip");
    assert_eq!(row("legacy")[7], "skip");
    // The negation keeps secret.example out of the strict wildcard; the hashed known_hosts
    // entry gives ci.example's key.
    assert_eq!(row("ci.example")[6], format!("strict {}", f.ci_fp));
    assert_eq!(row("secret.example")[6], "tofu -");
    assert_eq!(row("app")[1..4], ["app.internal.example", "deploy", "22"]);
    for want in [
        "web: not supported, not imported: ForwardAgent, LocalForward".to_string(),
        "web: Host `web` is defined again at".into(),
        format!(
            "web: IdentityFile {}/shared not imported: a target keeps one key",
            k.display()
        ),
        format!("db: no key: IdentityFile {}/missing not found", k.display()),
        "legacy: ProxyCommand `nc %h %p` is not supported".into(),
        "edge.example.com-2200: a jump host that is no Host of the config".into(),
        format!(
            "bastion: host key {} ssh-ed25519 from {}:",
            f.bastion_fp,
            f.dir.path().join("known_hosts").display()
        ),
        "note: ".to_string() + &f.config.display().to_string(),
        "Match host nothing.invalid` skipped".into(),
        "*.example, !secret.example".into(),
        "dry run: 6 to add, 0 conflict(s), 2 skipped; nothing was changed".into(),
    ] {
        assert!(out.contains(&want), "missing {want:?} in\n{out}");
    }
    assert!(!out.contains("not-included"), "{out}");
    assert!(
        sshmode::target::list(&app.state.db)
            .await
            .unwrap()
            .is_empty()
    );

    // The same as JSON.
    let (r, out) = cli(&app, import(&f.config, false, true), "").await;
    assert_eq!(r, Ok(0), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["applied"], false);
    let web = v["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["alias"] == "web")
        .unwrap();
    assert_eq!(web["host"], "web.internal.example");
    assert_eq!(web["port"], 2222);
    assert_eq!(web["jump"], "bastion");
    assert_eq!(web["action"], "add");
    assert_eq!(
        web["unsupported"],
        serde_json::json!(["ForwardAgent", "LocalForward"])
    );
    let bastion = v["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["alias"] == "bastion")
        .unwrap();
    assert_eq!(bastion["host_key"]["fingerprint"], f.bastion_fp.as_str());
    assert_eq!(bastion["host_key_policy"], "strict");

    // A path that cannot be read: an error naming it.
    let (r, _) = cli(&app, import(&f.dir.path().join("nope"), false, false), "").await;
    let e = r.unwrap_err();
    assert!(e.contains("cannot read") && e.contains("nope"), "{e}");
}

#[tokio::test]
async fn apply_adds_pending_targets_jump_hosts_first_audited_and_leaves_conflicts_alone() {
    let f = fixture();
    let app = TestApp::spawn().await;
    let db = &app.state.db;
    // `app` is registered already, elsewhere.
    let mut a = add_args("app", 22);
    a.password_stdin = true;
    a.offline = true;
    a.approve = false;
    let (r, out) = cli(&app, TargetCmd::Add(a), "pw\n").await;
    assert_eq!(r, Ok(0), "{out}");

    let (r, out) = cli(&app, import(&f.config, true, false), "").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(
        out.contains("added 5 (pending: an admin must approve each before chats can use it), 1 conflict(s), 2 skipped"),
        "{out}"
    );
    assert!(
        out.contains("app: already registered as sshmode_t@127.0.0.1:22: not changed"),
        "{out}"
    );
    let all = sshmode::target::list(db).await.unwrap();
    let aliases: Vec<&str> = all.iter().map(|t| t.alias.as_str()).collect();
    assert_eq!(
        aliases,
        [
            "app",
            "bastion",
            "ci.example",
            "edge.example.com-2200",
            "secret.example",
            "web"
        ]
    );
    for t in &all {
        assert_eq!(t.status, sshmode::target::Status::Pending, "{}", t.alias);
    }
    let app_t = sshmode::target::get(db, "app").await.unwrap();
    assert_eq!(app_t.host, "127.0.0.1", "a conflict is not overwritten");
    let web = sshmode::target::get(db, "web").await.unwrap();
    assert_eq!(
        (
            web.host.as_str(),
            web.port,
            web.user.as_str(),
            web.jump.as_deref()
        ),
        ("web.internal.example", 2222, "second", Some("bastion"))
    );
    assert_eq!(web.auth, sshmode::target::AuthKind::Key);
    let bastion = sshmode::target::get(db, "bastion").await.unwrap();
    assert_eq!(
        bastion.host_key_policy,
        sshmode::target::HostKeyPolicy::Strict
    );
    let hk = bastion.host_key.unwrap();
    assert_eq!(
        (hk.fingerprint.as_str(), hk.source.as_str()),
        (f.bastion_fp.as_str(), "pinned")
    );
    assert_eq!(bastion.jump.as_deref(), Some("edge.example.com-2200"));
    // One audit row per target added, jump hosts first, by the operator.
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT subject, actor, detail->>'status' FROM audit_log WHERE action = 'target.add' ORDER BY id",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let subjects: Vec<&str> = rows.iter().map(|(s, _, _)| s.as_str()).collect();
    assert_eq!(
        subjects,
        [
            "app",
            "edge.example.com-2200",
            "bastion",
            "web",
            "ci.example",
            "secret.example"
        ]
    );
    for (s, actor, status) in &rows {
        assert_eq!(actor, &app.state.config.operator, "{s}");
        assert_eq!(status, "pending", "{s}");
    }

    // Again: every alias is a conflict now, and nothing changes.
    let (r, out) = cli(&app, import(&f.config, true, false), "").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains("added 0 (pending"), "{out}");
    assert!(
        out.contains("web: already registered with this address (pending): left as it is"),
        "{out}"
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'target.add'")
        .fetch_one(db)
        .await
        .unwrap();
    assert_eq!(n, 6);
}

#[tokio::test]
async fn an_encrypted_key_is_skipped_unless_its_passphrase_comes_on_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("locked");
    sshd::new_key(&key, "ed25519", "open sesame");
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        format!(
            "Host one\n  HostName 10.9.0.1\n  User u\n  IdentityFile {k}\n\
             Host two\n  HostName 10.9.0.2\n  User u\n  IdentityFile {k}\n",
            k = key.display()
        ),
    )
    .unwrap();
    let app = TestApp::spawn().await;
    let (r, out) = cli(&app, import(&config, true, false), "").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(
        out.contains("is encrypted: run with --apply --passphrase-stdin"),
        "{out}"
    );
    assert!(out.contains("added 0 (pending"), "{out}");
    // A wrong passphrase skips the hosts using the key; the right one, typed once, adds both.
    let with = |json| {
        TargetCmd::Import(ImportArgs {
            path: Some(config.clone()),
            apply: true,
            passphrase_stdin: true,
            json,
        })
    };
    let (r, out) = cli(&app, with(false), "wrong\n").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(
        out.contains("could not be opened (wrong passphrase?)"),
        "{out}"
    );
    // No line left to read: those hosts are skipped, saying so; the import goes on.
    let (r, out) = cli(&app, with(false), "").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains("on standard input is empty"), "{out}");
    assert!(out.contains("added 0 (pending"), "{out}");
    let (r, out) = cli(&app, with(true), "open sesame\n").await;
    assert_eq!(r, Ok(0), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["targets"][0]["action"], "added");
    assert_eq!(v["targets"][1]["action"], "added");
    assert!(!out.contains("open sesame"));
    // The key is stored decrypted-then-sealed: nothing of the passphrase is kept.
    let t = sshmode::target::get(&app.state.db, "two").await.unwrap();
    assert_eq!(t.auth, sshmode::target::AuthKind::Key);
}

#[tokio::test]
async fn an_imported_target_behind_an_imported_bastion_reaches_a_real_sshd_once_approved() {
    if !sshd::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lab = crate::jump::Lab::start(dir.path(), "");
    let app = TestApp::builder()
        .var("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "3")
        .spawn()
        .await;
    let key = crate::jump::key_for(dir.path(), "k", &[&lab.jump, &lab.target]);
    let (jaddr, taddr) = (lab.ns.jump_addr(), lab.ns.target_addr());
    // The hosts' keys as the team's known_hosts holds them: hashed by OpenSSH.
    let kh = dir.path().join("known_hosts");
    let key_line = |s: &sshd::Sshd| std::fs::read_to_string(s.dir.join("host_key.pub")).unwrap();
    std::fs::write(
        &kh,
        format!(
            "{jaddr} {}{taddr} {}",
            key_line(&lab.jump),
            key_line(&lab.target)
        ),
    )
    .unwrap();
    sshd::keygen(&["-q", "-H", "-f", kh.to_str().unwrap()]);
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        format!(
            "Host inner\n  HostName {taddr}\n  ProxyJump bastion\n\
             Host bastion\n  HostName {jaddr}\n  StrictHostKeyChecking yes\n\
             Host *\n  User {user}\n  IdentityFile {key}\n  UserKnownHostsFile {kh}\n",
            user = sshd::USER,
            key = key.display(),
            kh = kh.display(),
        ),
    )
    .unwrap();
    let (r, out) = cli(&app, import(&config, true, false), "").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains("added 2 (pending"), "{out}");
    // Pending: nothing runs there yet.
    let pending = async {
        let ops = app
            .state
            .exec
            .ops_for("omt_import_pending", &Place::Target("inner".into()))
            .await?;
        ops.terminal("true", RunOptions::default(), &CancellationToken::new())
            .await
    }
    .await;
    assert!(pending.is_err(), "a pending target must not be usable");
    // An admin approves both.
    for alias in ["bastion", "inner"] {
        let (r, out) = cli(
            &app,
            TargetCmd::Approve {
                alias: alias.into(),
            },
            "",
        )
        .await;
        assert_eq!(r, Ok(0), "{out}");
    }
    let ops = app
        .state
        .exec
        .ops_for("omt_import", &Place::Target("inner".into()))
        .await
        .unwrap();
    let r = ops
        .terminal(
            "cat /proc/net/fib_trie",
            RunOptions::default(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    let seen = String::from_utf8_lossy(&r.output.stdout);
    assert!(seen.contains(&taddr), "ran elsewhere: {seen}");
    assert!(!seen.contains(&jaddr), "ran on the jump host: {seen}");
    // The keys pinned are the ones the known_hosts file held, and the servers presented.
    for (alias, server) in [("bastion", &lab.jump), ("inner", &lab.target)] {
        let t = sshmode::target::get(&app.state.db, alias).await.unwrap();
        let hk = t.host_key.unwrap();
        assert_eq!(
            (hk.fingerprint, hk.source.as_str()),
            (server.fingerprint(), "pinned"),
            "{alias}"
        );
    }
}
