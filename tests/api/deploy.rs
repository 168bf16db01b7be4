//! deploy/ as an operator takes it: every YAML and unit file parses and says what the docs
//! say it does (replicas, migrations first, probes, hardening, capabilities; on Kubernetes no
//! service account token, a NetworkPolicy, two nodes, the AppArmor profile deploy/ ships, a
//! `privileged` namespace; Compose on loopback with no password of its own), every variable
//! named there is in `.env.example`, `systemd-analyze verify` accepts the unit, and the service
//! reaches the strongest isolation level with only the unit's capabilities.
//!
//! No container engine or systemd runs here: the unit's capability bounding set and
//! `NoNewPrivileges` are applied with `setpriv`; its mount settings (`ProtectSystem=strict`,
//! `PrivateTmp`, `ReadWritePaths`) are not exercised.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml_ng::Value;

use crate::helpers::{TestApp, eventually, fresh_database};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every document of a YAML file.
fn yaml_docs(rel: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(&read(rel))
        .map(|d| {
            serde::Deserialize::deserialize(d)
                .unwrap_or_else(|e| panic!("{rel} does not parse: {e}"))
        })
        .collect()
}

/// A unit file's `Key=Value` lines by section (a key may repeat).
fn unit(rel: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut sections: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut current = None;
    for (n, line) in read(rel).lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = Some(name.to_string());
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{rel}:{}: not Key=Value: {line}", n + 1));
        let section = current
            .clone()
            .unwrap_or_else(|| panic!("{rel}: a key before any section"));
        sections
            .entry(section)
            .or_default()
            .push((k.trim().to_string(), v.trim().to_string()));
    }
    sections
}

fn get<'a>(
    u: &'a BTreeMap<String, Vec<(String, String)>>,
    section: &str,
    key: &str,
) -> Vec<&'a str> {
    u.get(section)
        .into_iter()
        .flatten()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

fn deploy_files() -> Vec<String> {
    let mut files = vec!["deploy/Dockerfile".to_string(), ".dockerignore".to_string()];
    for dir in [
        "deploy",
        "deploy/apparmor",
        "deploy/k8s",
        "deploy/systemd",
        "deploy/sysusers.d",
    ] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                files.push(p.strip_prefix(root()).unwrap().display().to_string());
            }
        }
    }
    files.sort();
    files.dedup();
    files
}

#[test]
fn every_deploy_file_parses_and_says_what_the_docs_say() {
    // Kubernetes: one Deployment of 2 replicas that migrates first, with probes and resources;
    // a Service, a ConfigMap, an example Secret and a PodDisruptionBudget.
    let mut kinds = BTreeSet::new();
    let mut deployment = None;
    let mut policy = None;
    let mut namespace = None;
    for f in deploy_files()
        .iter()
        .filter(|f| f.starts_with("deploy/k8s/"))
    {
        for doc in yaml_docs(f) {
            let kind = doc["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{f}: no kind"))
                .to_string();
            assert!(doc["metadata"]["name"].is_string(), "{f}: no name");
            match kind.as_str() {
                "Deployment" => deployment = Some(doc.clone()),
                "NetworkPolicy" => policy = Some(doc.clone()),
                "Namespace" => namespace = Some(doc.clone()),
                _ => {}
            }
            kinds.insert(kind);
        }
    }
    let want: BTreeSet<String> = [
        "ConfigMap",
        "Deployment",
        "Namespace",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Secret",
        "Service",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds, want);
    let d = deployment.unwrap();
    assert_eq!(d["spec"]["replicas"].as_u64(), Some(2));
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(
        pod["initContainers"][0]["args"][0].as_str(),
        Some("migrate")
    );
    let c = &pod["containers"][0];
    assert_eq!(c["args"][0].as_str(), Some("serve"));
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert!(
        c["resources"]["requests"]["memory"].is_string()
            && c["resources"]["limits"]["memory"].is_string()
    );
    let caps: Vec<&str> = c["securityContext"]["capabilities"]["add"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(caps.contains(&"SYS_ADMIN"), "{caps:?}");
    k8s_passes_a_clusters_defaults(pod, &policy.unwrap(), &namespace.unwrap());

    // Compose: PostgreSQL + sshmode, health on /readyz, a named data volume, the env from .env.
    let compose = &yaml_docs("deploy/docker-compose.yml")[0];
    let s = &compose["services"]["sshmode"];
    assert!(compose["services"]["postgres"].is_mapping());
    let health: Vec<&str> = s["healthcheck"]["test"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(health.iter().any(|t| t.ends_with("/readyz")), "{health:?}");
    assert_eq!(s["env_file"].as_str(), Some("../.env"));
    assert!(
        s["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| v.as_str() == Some("sshmode-data:/var/lib/sshmode"))
    );
    assert!(
        compose["volumes"]["sshmode-data"].is_null()
            || compose["volumes"]["sshmode-data"].is_mapping()
    );
    compose_is_closed_by_default(compose);

    // The unit: the hardening and the capabilities isolation needs, and nothing more.
    let u = unit("deploy/systemd/sshmode.service");
    let svc = |k: &str| get(&u, "Service", k);
    assert_eq!(svc("ExecStart"), ["/usr/local/bin/sshmode serve"]);
    assert_eq!(svc("NoNewPrivileges"), ["yes"]);
    assert_eq!(svc("ProtectSystem"), ["strict"]);
    assert_eq!(svc("ReadWritePaths"), ["/var/lib/sshmode"]);
    assert_eq!(svc("PrivateTmp"), ["yes"]);
    assert_eq!(svc("RestrictNamespaces"), ["pid mnt"]);
    assert_eq!(svc("Restart"), ["on-failure"]);
    assert_eq!(svc("EnvironmentFile"), ["/etc/sshmode/sshmode.env"]);
    let bounding: BTreeSet<&str> = svc("CapabilityBoundingSet")[0].split_whitespace().collect();
    let needed: BTreeSet<&str> = [
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_KILL",
        "CAP_SETPCAP",
        "CAP_SYS_ADMIN",
    ]
    .into();
    assert_eq!(bounding, needed);
    assert_eq!(get(&u, "Install", "WantedBy"), ["multi-user.target"]);

    // sysusers.d creates the tools account the unit cannot create itself.
    let sysusers = read("deploy/sysusers.d/sshmode.conf");
    assert!(
        sysusers
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["u", "sshmode-tools"])),
        "{sysusers}"
    );

    // The image: locked build, a runtime without and a variant with the PostgreSQL server.
    let docker = read("deploy/Dockerfile");
    assert!(docker.contains("cargo build --release --locked"));
    for stage in ["AS build", "AS runtime", "FROM runtime AS embedded"] {
        assert!(docker.contains(stage), "{stage}");
    }
}

/// A string sequence of a YAML value (empty when absent).
fn strings(v: &Value) -> Vec<&str> {
    v.as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect()
}

/// The pod spec, NetworkPolicy and Namespace of deploy/k8s: no service account token, two
/// replicas on two nodes, the sandbox's AppArmor profile, ingress only to the listener from
/// the ingress controller's and the monitoring namespace, egress only where the service goes,
/// and a namespace whose Pod Security level admits `SYS_ADMIN`.
fn k8s_passes_a_clusters_defaults(pod: &Value, policy: &Value, namespace: &Value) {
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(
        spread["topologyKey"].as_str(),
        Some("kubernetes.io/hostname")
    );
    assert_eq!(spread["maxSkew"].as_u64(), Some(1));
    assert_eq!(spread["whenUnsatisfiable"].as_str(), Some("DoNotSchedule"));
    assert_eq!(
        spread["labelSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
        Some("sshmode")
    );
    let c = &pod["containers"][0];
    let apparmor = &c["securityContext"]["appArmorProfile"];
    assert_eq!(apparmor["type"].as_str(), Some("Localhost"));
    let profile = apparmor["localhostProfile"].as_str().unwrap();
    // The profile the manifest names is the one deploy/ ships.
    let shipped = read("deploy/apparmor/sshmode");
    assert!(
        shipped.contains(&format!("profile {profile} ")),
        "deploy/apparmor/sshmode does not define `{profile}`"
    );
    assert!(!shipped.contains("deny mount"), "the launcher mounts");

    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
        Some("sshmode")
    );
    assert_eq!(
        strings(&policy["spec"]["policyTypes"]),
        ["Ingress", "Egress"]
    );
    let ingress = policy["spec"]["ingress"].as_sequence().unwrap();
    assert_eq!(ingress.len(), 1, "one rule: the listener");
    assert_eq!(ingress[0]["ports"][0]["port"].as_str(), Some("http"));
    let from: BTreeSet<&str> = ingress[0]["from"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|f| {
            assert!(
                f["podSelector"].is_null() && f["ipBlock"].is_null(),
                "{f:?}"
            );
            f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(from, ["ingress-nginx", "monitoring"].into());
    let mut egress = BTreeSet::new();
    for rule in policy["spec"]["egress"].as_sequence().unwrap() {
        for p in rule["ports"].as_sequence().unwrap() {
            egress.insert((
                p["port"].as_u64().unwrap(),
                p["protocol"].as_str().unwrap().to_string(),
            ));
        }
    }
    let want: BTreeSet<(u64, String)> = [
        (53, "UDP"),
        (53, "TCP"),
        (5432, "TCP"),
        (443, "TCP"),
        (22, "TCP"),
    ]
    .map(|(p, s)| (p, s.to_string()))
    .into();
    assert_eq!(egress, want);

    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].as_str(),
        Some("privileged")
    );
}

/// Compose publishes the port on loopback only and has no database password of its own.
fn compose_is_closed_by_default(compose: &Value) {
    let s = &compose["services"]["sshmode"];
    assert_eq!(strings(&s["ports"]), ["127.0.0.1:8080:8080"]);
    assert_eq!(strings(&s["security_opt"]), ["apparmor=sshmode"]);
    let required = "${POSTGRES_PASSWORD:?";
    let pw = compose["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"]
        .as_str()
        .unwrap();
    assert!(pw.starts_with(required), "{pw}");
    let url = s["environment"]["DATABASE_URL"].as_str().unwrap();
    assert!(url.contains(required), "{url}");
    let text = read("deploy/docker-compose.yml");
    assert!(
        !text.contains("change-me"),
        "a default password is in the file"
    );
    assert!(!text.contains(":-"), "a variable with a default");
}

#[test]
fn the_scripts_have_a_shebang_and_ci_checks_the_deploy_files() {
    for f in [
        "scripts/pg.sh",
        "scripts/test.sh",
        "scripts/bench.sh",
        "scripts/check-deploy.sh",
    ] {
        assert!(read(f).starts_with("#!/usr/bin/env bash\n"), "{f}");
    }
    // CI validates the manifests before the tests, and never skips it.
    let test = read("scripts/test.sh");
    let check = test
        .find("bash scripts/check-deploy.sh")
        .expect("test.sh runs it");
    assert!(check < test.find("\ncargo test").unwrap());
}

#[test]
fn every_variable_named_in_deploy_is_in_env_example() {
    let example = read(".env.example");
    let documented: BTreeSet<String> = example
        .lines()
        .map(|l| l.trim_start_matches('#').trim())
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_string()))
        .collect();
    let name = regex::Regex::new(
        r"\b(SSHMODE_[A-Z0-9_]+|LARK_[A-Z0-9_]+|LLM_[A-Z0-9_]+|DATABASE_URL|RUST_LOG)\b",
    )
    .unwrap();
    let mut seen = 0;
    for f in deploy_files() {
        for m in name.find_iter(&read(&f)) {
            seen += 1;
            assert!(
                documented.contains(m.as_str()),
                "{f} names {}, which .env.example does not",
                m.as_str()
            );
        }
    }
    assert!(seen > 20, "the deploy files name their variables");
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    // scripts/test.sh installs it (Debian's `systemd`): without it this test fails, never skips.
    let out = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .expect("systemd-analyze (Debian's systemd package; scripts/test.sh installs it)");
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sshmode.service");
    let text = read("deploy/systemd/sshmode.service")
        .replace("/usr/local/bin/sshmode", env!("CARGO_BIN_EXE_sshmode"));
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.trim().is_empty(), "{err}");
}

/// `sshmode serve` under `setpriv` with the unit's bounding set (or that set less `drop`) and
/// no-new-privs: the isolation level its /readyz reports.
async fn level_under_unit_caps(drop: Option<&str>) -> String {
    let u = unit("deploy/systemd/sshmode.service");
    let caps: Vec<String> = get(&u, "Service", "CapabilityBoundingSet")[0]
        .split_whitespace()
        .filter(|c| Some(*c) != drop)
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let db = fresh_database().await;
    let data = tempfile::tempdir().unwrap();
    let port = crate::sshd::free_port();
    let bounding = format!("--bounding-set=-all,{}", caps.join(","));
    let bin = env!("CARGO_BIN_EXE_sshmode");
    let mut child = crate::helpers::serve_child(
        &["setpriv", &bounding, "--no-new-privs", "--", bin, "serve"],
        bin,
        &db,
        data.path(),
        port,
        &[
            ("LARK_APP_ID", "cli_test_app"),
            ("LARK_APP_SECRET", "s"),
            ("LARK_VERIFICATION_TOKEN", "t"),
            ("LARK_ENCRYPT_KEY", "k"),
            ("LARK_BASE_URL", "http://127.0.0.1:9"),
        ],
    );
    let url = format!("http://127.0.0.1:{port}/readyz");
    let http = reqwest::Client::new();
    let mut body = String::new();
    eventually(
        "the service under setpriv to be ready",
        Duration::from_secs(60),
        async || match http.get(&url).send().await {
            Ok(r) if r.status() == 200 => {
                body = r.text().await.unwrap_or_default();
                true
            }
            _ => false,
        },
    )
    .await;
    let _ = child.kill().await;
    body.lines()
        .find_map(|l| l.strip_prefix("local-isolation: "))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn the_units_capabilities_give_the_strongest_isolation_and_less_does_not() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test runs the service as root, as the unit does"
    );
    assert!(
        Path::new("/usr/bin/setpriv").exists() || which("setpriv"),
        "needs setpriv (util-linux)"
    );
    // The level the service finds here with every capability: the strongest the machine has.
    let app = TestApp::spawn().await;
    let unrestricted = app.state.exec.local_level().to_string();
    app.stop().await;
    assert!(
        unrestricted.starts_with("separate-uid+pidns"),
        "{unrestricted}"
    );
    assert_eq!(level_under_unit_caps(None).await, unrestricted);
    // Without CAP_SYS_ADMIN there is no PID namespace per command.
    let without = level_under_unit_caps(Some("CAP_SYS_ADMIN")).await;
    assert!(
        without.starts_with("separate-uid") && !without.contains("pidns"),
        "{without}"
    );
}

fn which(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).exists()))
        .unwrap_or(false)
}
