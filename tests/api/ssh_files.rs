//! The file tools on targets without SFTP: an OpenSSH sshd with no `Subsystem sftp` line (a
//! deterministic "no SFTP") and Dropbear with no `sftp-server`. The shared behavioural suite
//! passes through the shell, binary content makes the round trip unchanged, a replaced file is
//! never seen half-written, and `target test` says which way files move.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sshmode::exec::Place;
use sshmode::target::cli::TargetCmd;

use crate::exec_ssh::{Env, cli};
use crate::helpers::TestApp;
use crate::sshd::{self, Sshd};

/// An app and an OpenSSH target `alias` whose sshd has no SFTP subsystem.
async fn openssh_without_sftp(alias: &str) -> Option<Env> {
    if !sshd::available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let sshd_dir = dir.path().join("sshd");
    std::fs::create_dir_all(&sshd_dir).unwrap();
    let sshd = Sshd::start_opts(&sshd_dir, sshd::free_port(), "", false);
    let app = TestApp::builder()
        .var("SSHMODE_SSH_CONNECT_TIMEOUT_SECS", "5")
        .spawn()
        .await;
    let env = Env { app, sshd, dir };
    env.add_key_target(alias).await;
    Some(env)
}

/// Binary bytes round trip, errors in words, and `target test` naming the shell path.
async fn files_through_the_shell(app: &TestApp, alias: &str, home: &str) {
    let ops = app
        .state
        .exec
        .ops_for(&format!("omt_{alias}"), &Place::Target(alias.into()))
        .await
        .unwrap();
    let b = ops.backend();
    // Every byte value, and more than a pipe buffer of them.
    let data: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    let path = format!("{home}/bin-{}/blob.bin", uuid::Uuid::new_v4().simple());
    b.write(&path, &data).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data, "written unchanged");
    let back = b.read(&path, 0, 1 << 20).await.unwrap();
    assert_eq!(back.size, data.len() as u64);
    assert!(back.data == data, "read back unchanged");
    let part = b.read(&path, 1000, 17).await.unwrap();
    assert_eq!(part.data, &data[1000..1017]);
    assert_eq!(part.size, data.len() as u64);
    // The same errors as over SFTP, in words — never "SFTP is not available: sender dropped".
    let e = b
        .read(&format!("{home}/no-such-file"), 0, 10)
        .await
        .unwrap_err();
    assert!(matches!(e, sshmode::exec::ExecError::NotFound(_)), "{e}");
    let e = b.read(home, 0, 10).await.unwrap_err().to_string();
    assert!(e.ends_with("is a directory"), "{e}");
    // `target test` reports the path the files take.
    let cmd = TargetCmd::Test {
        alias: alias.into(),
        trust: None,
    };
    let (r, out) = cli(app, cmd, "").await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(
        out.contains("files: through the shell") && out.contains("no SFTP subsystem"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(PathBuf::from(&path).parent().unwrap());
}

#[tokio::test]
async fn file_tools_work_on_openssh_without_sftp() {
    let Some(env) = openssh_without_sftp("nosftp").await else {
        return;
    };
    let home = format!("/home/{}", sshd::USER);
    files_through_the_shell(&env.app, "nosftp", &home).await;
    let section = format!("omt_nosftp_suite_{}", uuid::Uuid::new_v4().simple());
    let ops = env
        .app
        .state
        .exec
        .ops_for(&section, &Place::Target("nosftp".into()))
        .await
        .unwrap();
    let dir = format!("{home}/suite-{}", uuid::Uuid::new_v4().simple());
    ops.terminal(
        &format!("mkdir -p {dir} && cd {dir}"),
        Default::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    crate::exec::behaviour(&env.app, Place::Target("nosftp".into()), &section).await;
}

#[tokio::test]
async fn file_tools_work_on_dropbear_and_a_replaced_file_is_never_seen_half_written() {
    let Some(env) = crate::dropbear::env("dbfiles", false).await else {
        return;
    };
    let home = format!("/home/{}", crate::dropbear::USER);
    files_through_the_shell(&env.app, "dbfiles", &home).await;

    // Atomic replace: a reader polling the file sees one whole version or the other.
    let ops = env
        .app
        .state
        .exec
        .ops_for("omt_dbfiles_atomic", &Place::Target("dbfiles".into()))
        .await
        .unwrap();
    let path = format!("{home}/atomic-{}.bin", uuid::Uuid::new_v4().simple());
    let size = 2 << 20;
    let a = vec![b'a'; size];
    let b = vec![b'b'; size];
    ops.backend().write(&path, &a).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, path) = (stop.clone(), path.clone());
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !stop.load(Ordering::Acquire) && reads < 100_000 {
                let got = std::fs::read(&path).unwrap();
                assert_eq!(got.len(), size, "a reader saw a file of the wrong size");
                assert!(
                    got.iter().all(|&x| x == got[0]),
                    "a reader saw a mixed file"
                );
                reads += 1;
            }
            reads
        })
    };
    for i in 0..6 {
        let data = if i % 2 == 0 { &b } else { &a };
        ops.backend().write(&path, data).await.unwrap();
    }
    stop.store(true, Ordering::Release);
    let reads = reader.join().expect("the reader saw a half file");
    assert!(reads > 0);
    let _ = std::fs::remove_file(&path);
    // No temporary file is left beside it.
    let leftovers = std::fs::read_dir(&home)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".sshmode-"))
        .count();
    assert_eq!(leftovers, 0);

    // The behavioural suite, through the shell.
    let section = format!("omt_db_suite_{}", uuid::Uuid::new_v4().simple());
    let ops = env
        .app
        .state
        .exec
        .ops_for(&section, &Place::Target("dbfiles".into()))
        .await
        .unwrap();
    let dir = format!("{home}/suite-{}", uuid::Uuid::new_v4().simple());
    ops.terminal(
        &format!("mkdir -p {dir} && cd {dir}"),
        Default::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    crate::exec::behaviour(&env.app, Place::Target("dbfiles".into()), &section).await;
}

#[tokio::test]
async fn binary_files_round_trip_over_dropbear_sftp_too() {
    let Some(env) = crate::dropbear::env("dbsftp", true).await else {
        return;
    };
    let (r, out) = cli(
        &env.app,
        TargetCmd::Test {
            alias: "dbsftp".into(),
            trust: None,
        },
        "",
    )
    .await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains("files: over SFTP"), "{out}");
    let ops = env
        .app
        .state
        .exec
        .ops_for("omt_dbsftp", &Place::Target("dbsftp".into()))
        .await
        .unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let path = format!(
        "/home/{}/sftp-{}.bin",
        crate::dropbear::USER,
        uuid::Uuid::new_v4().simple()
    );
    ops.backend().write(&path, &data).await.unwrap();
    let back = ops.backend().read(&path, 0, 1 << 20).await.unwrap();
    assert!(back.data == data);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn target_test_says_files_go_over_sftp_where_there_is_sftp() {
    let Some(env) = crate::exec_ssh::env().await else {
        return;
    };
    env.add_key_target("withsftp").await;
    let (r, out) = env.test_target("withsftp", None).await;
    assert_eq!(r, Ok(0), "{out}");
    assert!(out.contains("files: over SFTP"), "{out}");
}
