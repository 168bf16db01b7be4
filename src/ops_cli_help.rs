//! The command line's own help, checked as a whole: clap's consistency checks, an example on
//! every command, help text on every argument, and `--json` only where the output is JSON.

use std::collections::BTreeSet;

use clap::CommandFactory;

use crate::Cli;

/// The commands whose output `--json` turns into JSON (the path below `sshmode`).
const JSON: &[&str] = &[
    "audit list",
    "doctor",
    "guard check",
    "mcp token list",
    "schedule list",
    "skill list",
    "skill show",
    "target import",
    "target list",
    "target show",
];

/// Every command below `cmd` (itself included) with its path of names.
fn walk(path: &str, cmd: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
    out.push((path.to_string(), cmd.clone()));
    // clap's own `help` subcommands are not ours.
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let p = if path.is_empty() {
            sub.get_name().to_string()
        } else {
            format!("{path} {}", sub.get_name())
        };
        walk(&p, sub, out);
    }
}

fn commands() -> Vec<(String, clap::Command)> {
    let mut root = Cli::command();
    root.build();
    let mut all = Vec::new();
    walk("", &root, &mut all);
    all
}

#[test]
fn the_definitions_are_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn every_command_has_an_example_that_runs_it() {
    let mut missing = Vec::new();
    for (path, cmd) in commands() {
        let after = cmd
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let invocation = format!("sshmode {path}").trim_end().to_string();
        let ok = after.starts_with("Examples:\n")
            && after
                .lines()
                .skip(1)
                .any(|l| l.trim_start().starts_with(&invocation));
        if !ok {
            missing.push(invocation);
        }
    }
    assert!(
        missing.is_empty(),
        "no `Examples:` naming the command: {missing:?}"
    );
}

#[test]
fn every_argument_has_help() {
    let mut missing = Vec::new();
    for (path, cmd) in commands() {
        for arg in cmd.get_arguments() {
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("sshmode {path}: {}", arg.get_id()));
            }
        }
    }
    assert!(missing.is_empty(), "arguments without help: {missing:?}");
}

#[test]
fn json_is_offered_only_where_the_output_is_json() {
    let with_json: BTreeSet<String> = commands()
        .into_iter()
        .filter(|(_, cmd)| cmd.get_arguments().any(|a| a.get_long() == Some("json")))
        .map(|(path, _)| path)
        .collect();
    let want: BTreeSet<String> = JSON.iter().map(|s| s.to_string()).collect();
    assert_eq!(with_json, want);
    // A flag on a parent would reach every subcommand: none is global.
    for (path, cmd) in commands() {
        for arg in cmd.get_arguments() {
            assert!(
                !arg.is_global_set(),
                "sshmode {path}: {} is global",
                arg.get_id()
            );
        }
    }
}
