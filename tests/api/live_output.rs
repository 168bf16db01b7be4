//! Live output of running commands (issue 23) end to end: a scripted turn runs a command that
//! prints over a few seconds, locally and on the real sshd, and the fake Lark records every
//! update of the progress card. The tails appear while the command runs, in order, within the
//! card budget; a flood of output is coalesced and loses no byte of the result; escape
//! sequences and a vault secret never reach the card. (The console's piped tail is in
//! `console.rs`; the time from a line to a card update is in `benches/live_output.rs`.)

use serde_json::json;
use sshmode::exec::Place;
use sshmode::target::{self, HostKeyPolicy, NewSecrets, NewTarget};
use zeroize::Zeroizing;

use crate::agent::{Env, MODEL, accept, add_target, call, say, unique, wait_turns_ended};
use crate::fake_lark::FakeLark;
use crate::progress::{busiest_second, closed_card};
use crate::sshd::Sshd;

const STEPS: &str = "for i in $(seq 5); do echo step-$i; sleep 1; done";

async fn env() -> Env {
    Env::builder().progress().spawn().await
}

/// Every content update of the steps element, in the order Lark accepted them.
fn updates(lark: &FakeLark) -> Vec<String> {
    lark.requests_to("/elements/steps/content")
        .into_iter()
        .map(|r| r.body["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The output block of an update: the lines inside its code fence.
fn tail_of(update: &str) -> Option<String> {
    let (_, rest) = update.split_once("```\n")?;
    let (tail, _) = rest.split_once("\n```")?;
    Some(tail.to_string())
}

/// The highest `step-N` in a tail.
fn last_step(tail: &str) -> u32 {
    tail.lines()
        .filter_map(|l| l.strip_prefix("step-")?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Runs the five-step command in a thread bound to `place` and checks what the card showed.
async fn five_steps_show_live(env: &Env, place: Place) {
    let thread = unique("omt_live");
    env.control.bind(&thread, place);
    env.llm
        .push(MODEL, call("terminal", json!({ "command": STEPS })))
        .push(MODEL, say("counted"));
    accept(&env.app, &thread, &unique("om_live"), "count to five").await;
    assert_eq!(wait_turns_ended(&env.app, &thread, 1).await, vec!["done"]);
    let card = closed_card(&env.lark).await;

    let all = updates(&env.lark);
    // Tails shown while the step ran (the running line is on the card).
    let running: Vec<String> = all
        .iter()
        .filter(|u| u.contains("running"))
        .filter_map(|u| tail_of(u))
        .collect();
    let mut distinct = running.clone();
    distinct.dedup();
    assert!(distinct.len() >= 3, "tails while running: {distinct:#?}");
    let order: Vec<u32> = distinct.iter().map(|t| last_step(t)).collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "in order: {order:?} {distinct:#?}"
    );
    // The card's budget holds, and the finished step keeps its last lines.
    assert!(busiest_second(&card) <= 5, "{:?}", card.ops);
    assert!(card.refusals.is_empty(), "{:?}", card.refusals);
    let last = card.element("steps");
    let kept = tail_of(&last).unwrap_or_else(|| panic!("no output on the closed card: {last}"));
    assert_eq!(
        kept, "step-1\nstep-2\nstep-3\nstep-4\nstep-5",
        "the finished step: {last}"
    );
    assert!(!kept.contains("__sshmode_cwd_"), "{last}");
    // The model still got the whole result.
    let reqs = env.llm.requests();
    let result = reqs.last().unwrap().body.to_string();
    assert!(
        result.contains("step-1\\nstep-2\\nstep-3\\nstep-4\\nstep-5"),
        "{result}"
    );
}

#[tokio::test]
async fn a_local_command_s_output_shows_on_the_card_while_it_runs() {
    let env = env().await;
    five_steps_show_live(&env, Place::Local).await;
}

#[tokio::test]
async fn a_remote_command_s_output_shows_on_the_card_while_it_runs() {
    let env = env().await;
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start_below(dir.path());
    add_target(&env.app, &sshd, dir.path(), "web").await;
    five_steps_show_live(&env, Place::Target("web".into())).await;
    drop(sshd);
}

#[tokio::test]
async fn a_flood_of_output_is_coalesced_on_the_card_and_the_result_loses_nothing() {
    // A result limit above the output limit, so the command's own omission count shows.
    let env = Env::builder()
        .progress()
        .vars(&[("SSHMODE_TOOL_RESULT_LIMIT", "200000")])
        .spawn()
        .await;
    let thread = unique("omt_flood");
    env.control.bind(&thread, Place::Local);
    // 50 MB as fast as it can be written, numbered lines so the result's ends can be checked.
    let command = "seq 1 6000000 | awk '{printf \"%08d\\n\", $1}'; echo end-of-flood";
    env.llm
        .push(MODEL, call("terminal", json!({ "command": command })))
        .push(MODEL, say("flooded"));
    accept(&env.app, &thread, &unique("om_flood"), "flood").await;
    assert_eq!(wait_turns_ended(&env.app, &thread, 1).await, vec!["done"]);
    let card = closed_card(&env.lark).await;
    assert!(busiest_second(&card) <= 5, "{:?}", card.ops);
    assert!(card.refusals.is_empty(), "{:?}", card.refusals);
    // Every update carries at most one tail of a few lines: nothing queued behind it.
    for u in updates(&env.lark) {
        if let Some(t) = tail_of(&u) {
            assert!(t.lines().count() <= 5 && t.chars().count() <= 500, "{t}");
        }
    }
    let closed = card.element("steps");
    assert!(
        tail_of(&closed).is_some_and(|t| t.ends_with("06000000\nend-of-flood")),
        "{closed}"
    );
    // The result: head and tail as before, with every byte in between counted.
    let reqs = env.llm.requests();
    let result = reqs.last().unwrap().body.to_string();
    assert!(result.contains("00000001\\n00000002"), "head kept");
    assert!(result.contains("06000000\\nend-of-flood"), "tail kept");
    let total: u64 = 6_000_000 * 9 + "end-of-flood\n".len() as u64;
    let omitted: u64 = result
        .split(" bytes omitted")
        .next()
        .and_then(|s| s.rsplit('[').next())
        .and_then(|n| n.parse().ok())
        .expect("an omission marker");
    assert!(
        omitted > total - 128 * 1024 && omitted < total,
        "{omitted} of {total}"
    );
}

const PASSWORD: &str = "Tr0ub4dor-and-3-horses";

#[tokio::test]
async fn escape_sequences_and_a_vault_secret_never_reach_the_card() {
    let env = env().await;
    let vault =
        sshmode::vault::Vault::open_or_create(&env.app.state.config.master_key_file).unwrap();
    target::add(
        &env.app.state.db,
        &vault,
        NewTarget {
            alias: "db".into(),
            host: "db.example".into(),
            port: 22,
            user: "ops".into(),
            description: None,
            secrets: NewSecrets::Password(Zeroizing::new(PASSWORD.into())),
            host_key_policy: HostKeyPolicy::Tofu,
            host_key: None,
            approve: true,
            jump: None,
        },
        "cli",
    )
    .await
    .unwrap();
    let thread = unique("omt_esc");
    env.control.bind(&thread, Place::Local);
    // The secret is decoded on the host, so the command's own text does not hold it.
    let command = "printf '\\033[31mcolour\\033[0m\\n\\033]0;owned-title\\007after-title\\n'; sleep 1.2; \
         printf 'db login: ops / %s\\n' \"$(echo VHIwdWI0ZG9yLWFuZC0zLWhvcnNlcw== | base64 -d)\"; sleep 1.2; echo clean-again; sleep 1.2";
    env.llm
        .push(MODEL, call("terminal", json!({ "command": command })))
        .push(MODEL, say("done"));
    accept(&env.app, &thread, &unique("om_esc"), "print things").await;
    assert_eq!(wait_turns_ended(&env.app, &thread, 1).await, vec!["done"]);
    closed_card(&env.lark).await;
    let all = updates(&env.lark);
    let tails: Vec<String> = all.iter().filter_map(|u| tail_of(u)).collect();
    assert!(
        tails.iter().any(|t| t.contains("colour\nafter-title")),
        "the plain text shows: {tails:#?}"
    );
    assert!(
        tails
            .iter()
            .any(|t| t.contains("db login: ops / [secret: target-password #")),
        "the secret is masked in its tail: {tails:#?}"
    );
    for u in &all {
        assert!(!u.contains(PASSWORD), "the secret reached the card: {u}");
        assert!(!u.contains('\u{1b}') && !u.contains('\u{7}'), "{u:?}");
    }
    for t in &tails {
        assert!(!t.contains("owned-title") && !t.contains("[31m"), "{t:?}");
    }
}
