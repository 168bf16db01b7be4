//! Commands that run another command somewhere else that still reaches this host or
//! another one: on other hosts (`ssh HOST CMD`, `ansible -a CMD`, `pdsh`, `clush`, `pssh`,
//! `salt … cmd.run CMD`), in a container (`docker`/`podman`/`nerdctl run IMAGE CMD`, `exec`,
//! `kubectl exec|debug|run -- CMD`), in a sandbox or namespace (`bwrap`, `ip netns exec`,
//! `machinectl shell`, `capsh --`). The command is walked as what it is, in a place whose
//! working directory and home are unknown; a container's bind mounts (and the host's root
//! that `kubectl debug node/…` mounts at `/host`) are links from its paths to this host's,
//! so `docker run -v /:/host IMAGE rm -rf /host/etc` is judged on `/etc`.

use std::sync::Arc;

use super::{Limit, MAX_LINKS, Nesting, Stdin, Walk, follow_links, normalise};
use crate::bash::parse::ShellWord;
use crate::bash::spec::{self, maybe_option, unknown_option};

/// `ssh`'s short options that take an argument.
const SSH_WITH_ARG: &str = "BbcDEeFIiJLlmOopQRSWw";

/// Options of `ssh -o` (and of `scp`, `sftp`) whose value is a command run on this host.
const SSH_COMMAND_OPTIONS: &[&str] = &[
    "proxycommand",
    "localcommand",
    "knownhostscommand",
    "remotecommand",
];

/// `docker run`/`create`/`exec` (and podman's, nerdctl's) options that take an argument.
const CONTAINER_WITH_ARG: &str = "acehlmpuvw";
const CONTAINER_LONG_WITH_ARG: &[&str] = &[
    "add-host",
    "annotation",
    "arch",
    "attach",
    "authfile",
    "blkio-weight",
    "blkio-weight-device",
    "cap-add",
    "cap-drop",
    "cgroup-conf",
    "cgroup-parent",
    "cgroupns",
    "cgroups",
    "chrootdirs",
    "cidfile",
    "conmon-pidfile",
    "cpu-count",
    "cpu-percent",
    "cpu-period",
    "cpu-quota",
    "cpu-rt-period",
    "cpu-rt-runtime",
    "cpu-shares",
    "cpus",
    "cpuset-cpus",
    "cpuset-mems",
    "creds",
    "decryption-key",
    "detach-keys",
    "device",
    "device-cgroup-rule",
    "device-read-bps",
    "device-read-iops",
    "device-write-bps",
    "device-write-iops",
    "dns",
    "dns-opt",
    "dns-option",
    "dns-search",
    "domainname",
    "entrypoint",
    "env",
    "env-file",
    "expose",
    "gidmap",
    "gpus",
    "group-add",
    "group-entry",
    "health-cmd",
    "health-interval",
    "health-retries",
    "health-start-interval",
    "health-start-period",
    "health-timeout",
    "hooks-dir",
    "hostname",
    "hostuser",
    "init-path",
    "ip",
    "ip6",
    "ipc",
    "isolation",
    "kernel-memory",
    "label",
    "label-file",
    "link",
    "link-local-ip",
    "log-driver",
    "log-opt",
    "mac-address",
    "memory",
    "memory-reservation",
    "memory-swap",
    "memory-swappiness",
    "mount",
    "name",
    "net",
    "net-alias",
    "network",
    "network-alias",
    "oom-score-adj",
    "os",
    "passwd-entry",
    "personality",
    "pid",
    "pids-limit",
    "platform",
    "pod",
    "pod-id-file",
    "preserve-fds",
    "publish",
    "pull",
    "rdt-class",
    "requires",
    "restart",
    "retry",
    "retry-delay",
    "runtime",
    "sdnotify",
    "seccomp-policy",
    "secret",
    "security-opt",
    "shm-size",
    "shm-size-systemd",
    "stop-signal",
    "stop-timeout",
    "storage-opt",
    "subgidname",
    "subuidname",
    "sysctl",
    "timeout",
    "tmpfs",
    "tz",
    "uidmap",
    "ulimit",
    "umask",
    "unsetenv",
    "user",
    "userns",
    "uts",
    "variant",
    "volume",
    "volume-driver",
    "volumes-from",
    "workdir",
];

/// `bwrap`'s options, by how many arguments each takes.
const BWRAP_ONE: &[&str] = &[
    "args",
    "argv0",
    "userns",
    "userns2",
    "pidns",
    "uid",
    "gid",
    "hostname",
    "chdir",
    "unsetenv",
    "lock-file",
    "sync-fd",
    "remount-ro",
    "exec-label",
    "file-label",
    "proc",
    "dev",
    "tmpfs",
    "mqueue",
    "dir",
    "seccomp",
    "add-seccomp-fd",
    "block-fd",
    "userns-block-fd",
    "info-fd",
    "json-status-fd",
    "cap-add",
    "cap-drop",
    "perms",
    "size",
    "overlay-src",
    "tmp-overlay",
    "ro-overlay",
];
const BWRAP_TWO: &[&str] = &[
    "setenv",
    "bind",
    "bind-try",
    "dev-bind",
    "dev-bind-try",
    "ro-bind",
    "ro-bind-try",
    "symlink",
    "file",
    "bind-data",
    "ro-bind-data",
    "chmod",
];

impl Walk {
    /// The command a program runs elsewhere, when `base` is one that does; false otherwise.
    pub(super) fn elsewhere_runner(
        &mut self,
        base: &str,
        args: &[ShellWord],
        what: &Arc<str>,
        depth: usize,
        stdin: &Stdin,
    ) -> bool {
        match base {
            "ssh" => self.ssh(args, what, depth, stdin),
            "scp" | "sftp" => self.ssh_options(args, what, depth),
            "docker" | "podman" | "nerdctl" => self.container(args, what, depth, stdin),
            "kubectl" | "oc" => self.kubectl(args, what, depth, stdin),
            "ansible" => self.ansible(args, what, depth),
            "pdsh" | "clush" | "pssh" | "parallel-ssh" => self.fleet(base, args, what, depth),
            "salt" | "salt-ssh" => self.salt(args, what, depth),
            "ip" => self.netns(args, what, depth, stdin),
            "machinectl" => self.machinectl(args, what, depth, stdin),
            "bwrap" => self.bwrap(args, what, depth, stdin),
            "capsh" => {
                if let Some(k) = args.iter().position(|w| w.literal.as_deref() == Some("--")) {
                    self.shell("bash", &args[k + 1..], what, depth, stdin.clone());
                }
            }
            _ => return false,
        }
        true
    }

    /// Walks `run` somewhere else: working directory `cwd` (unknown when `None`), home and
    /// variables unknown, the links being `links` (a container's mounts) alone.
    fn away(
        &mut self,
        cwd: Option<String>,
        links: Vec<(String, String)>,
        what: &Arc<str>,
        run: impl FnOnce(&mut Walk),
    ) {
        if links.len() > MAX_LINKS {
            return self.bound(
                Limit::Size,
                what.clone(),
                format!("it mounts more than the {MAX_LINKS} paths followed"),
            );
        }
        let saved = (
            self.cwds.clone(),
            self.home.clone(),
            self.defs.links.clone(),
            std::mem::take(&mut self.env),
        );
        self.defs.links = links.into();
        self.cwds = match cwd {
            Some(c) => Arc::from([follow_links(&c, &self.defs.links)]),
            None => Arc::from([]),
        };
        self.home = None;
        run(self);
        (self.cwds, self.home, self.defs.links, self.env) = saved;
    }

    /// `ssh [OPTIONS] HOST [COMMAND…]`: the command words, joined, run by the remote shell
    /// (with ssh's input); none, a login shell reading the input. `-o ProxyCommand=…` and
    /// the like run here.
    fn ssh(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let mut host = false;
        let mut k = 0;
        while let Some(w) = args.get(k) {
            // A destination known only when it runs (`ssh "$host" uptime`) is a host: the
            // remote command is still judged.
            let Some(l) = w.literal.as_deref() else {
                if host {
                    break;
                }
                host = true;
                k += 1;
                continue;
            };
            if l == "--" {
                k += 1 + usize::from(!host);
                break;
            }
            if !l.starts_with('-') || l.len() < 2 {
                if host {
                    break;
                }
                host = true;
                k += 1;
                continue;
            }
            k += 1;
            for (at, c) in l.char_indices().skip(1) {
                if SSH_WITH_ARG.contains(c) {
                    let rest = &l[at + 1..];
                    let value = match rest.is_empty() {
                        true => {
                            k += 1;
                            args.get(k - 1).cloned()
                        }
                        false => Some(spec::word(rest)),
                    };
                    if c == 'o' {
                        self.ssh_option(value.as_ref(), what, depth);
                    }
                    break;
                }
            }
        }
        let command = &args[k.min(args.len())..];
        self.remote(command, what, depth, stdin);
    }

    /// `scp`, `sftp`: only their `-o` options run a command here.
    fn ssh_options(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        let mut k = 0;
        while let Some(w) = args.get(k) {
            k += 1;
            match w.literal.as_deref() {
                Some("-o") => {
                    k += 1;
                    self.ssh_option(args.get(k - 1), what, depth);
                }
                Some(l) if l.starts_with("-o") => {
                    self.ssh_option(Some(&spec::word(&l[2..])), what, depth);
                }
                _ => {}
            }
        }
    }

    /// One `-o KEY=VALUE` (or `KEY VALUE`) of ssh: a command it runs here is walked.
    fn ssh_option(&mut self, value: Option<&ShellWord>, what: &Arc<str>, depth: usize) {
        let Some(value) = value else {
            return;
        };
        let Some(text) = value.literal.as_deref() else {
            return self.opaque(
                what.clone(),
                format!(
                    "the ssh option `{}` is known only when it runs",
                    value.source
                ),
            );
        };
        let text = text.trim_start();
        let split = text
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(text.len());
        let (key, rest) = text.split_at(split);
        let command = rest.trim_start_matches(|c: char| c == '=' || c.is_whitespace());
        if SSH_COMMAND_OPTIONS.contains(&key.to_ascii_lowercase().as_str()) {
            self.code("sh", Nesting::Option, command, what, depth);
        }
    }

    /// A command run by a shell on another host: its words joined (as ssh and the fleet
    /// tools send them), or, with none, a shell reading the input.
    fn remote(&mut self, command: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let text: Option<Vec<&str>> = command.iter().map(|w| w.literal.as_deref()).collect();
        let stdin = stdin.clone();
        let what_here = what.clone();
        let word = match text {
            _ if command.is_empty() => None,
            Some(parts) => Some(spec::word(&parts.join(" "))),
            None => Some(ShellWord {
                literal: None,
                source: command
                    .iter()
                    .map(|w| w.source.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
                if_empty: None,
            }),
        };
        self.away(None, Vec::new(), what, move |walk| match word {
            None => walk.reads_input("sh", true, stdin, &what_here, depth),
            Some(w) => {
                walk.inherited = stdin;
                walk.nested("sh", Nesting::Remote, Some(&w), &what_here, depth);
                walk.inherited = None;
            }
        });
    }

    /// `docker [GLOBAL] run|create|exec …` (and `container run`, `compose run|exec`): the
    /// command in the container, its bind mounts links to this host's paths.
    fn container(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let mut k = 0;
        let sub = loop {
            let Some(w) = args.get(k) else {
                return;
            };
            k += 1;
            let Some(l) = w.literal.as_deref() else {
                if maybe_option(w) {
                    return self.opaque(what.clone(), unknown_option(w));
                }
                return;
            };
            match l {
                "-H"
                | "--host"
                | "-c"
                | "--context"
                | "--config"
                | "-l"
                | "--log-level"
                | "--root"
                | "--runroot"
                | "--url"
                | "--connection"
                | "--namespace"
                | "-n"
                | "--address"
                | "-a"
                | "-f"
                | "--file"
                | "-p"
                | "--project-name"
                | "--profile"
                | "--env-file"
                | "--project-directory" => k += 1,
                "container" => {}
                "compose" => {}
                _ if l.starts_with('-') => {}
                _ => break l.to_owned(),
            }
        };
        let rest = &args[k..];
        if !matches!(sub.as_str(), "run" | "create" | "exec") {
            return;
        }
        self.container_command(rest, what, depth, stdin, 0, Vec::new(), None);
    }

    /// The options of `run`/`exec` from `rest`, then the image (or container) and the
    /// command. An option it does not know, without `=`, is read both ways (flag, or taking
    /// the next word), at most a few times, so that neither reading hides the command.
    #[allow(clippy::too_many_arguments)]
    fn container_command(
        &mut self,
        rest: &[ShellWord],
        what: &Arc<str>,
        depth: usize,
        stdin: &Stdin,
        guesses: usize,
        mut links: Vec<(String, String)>,
        mut workdir: Option<String>,
    ) {
        let mut entrypoint: Option<ShellWord> = None;
        let mut health: Vec<ShellWord> = Vec::new();
        let mut k = 0;
        let mount = |spec_text: &str, long: bool, links: &mut Vec<(String, String)>| {
            let (src, dst) = if long {
                let mut src = None;
                let mut dst = None;
                let mut bind = true;
                for part in spec_text.split(',') {
                    let (key, value) = part.split_once('=').unwrap_or((part, ""));
                    match key {
                        "type" => bind = value == "bind",
                        "source" | "src" => src = Some(value.to_owned()),
                        "target" | "dst" | "destination" => dst = Some(value.to_owned()),
                        _ => {}
                    }
                }
                if !bind {
                    return;
                }
                (src, dst)
            } else {
                let mut parts = spec_text.splitn(3, ':');
                (
                    parts.next().map(str::to_owned),
                    parts.next().map(str::to_owned),
                )
            };
            if let (Some(src), Some(dst)) = (src, dst)
                && src.starts_with('/')
                && dst.starts_with('/')
            {
                links.push((normalise("/", &dst), normalise("/", &src)));
            }
        };
        while let Some(w) = rest.get(k) {
            let Some(l) = w.literal.as_deref() else {
                if maybe_option(w) {
                    return self.opaque(what.clone(), unknown_option(w));
                }
                break;
            };
            if l == "--" {
                k += 1;
                break;
            }
            if !l.starts_with('-') || l == "-" {
                break;
            }
            k += 1;
            let (name, attached) = match l.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (l, None),
            };
            let value = |k: &mut usize| -> Option<Option<String>> {
                match &attached {
                    Some(v) => Some(Some(v.clone())),
                    None => {
                        *k += 1;
                        rest.get(*k - 1).map(|w| w.literal.clone())
                    }
                }
            };
            if let Some(long) = name.strip_prefix("--") {
                if !spec::long_option_is(long, CONTAINER_LONG_WITH_ARG) {
                    if attached.is_none()
                        && !matches!(
                            long,
                            "rm" | "privileged"
                                | "interactive"
                                | "tty"
                                | "detach"
                                | "init"
                                | "read-only"
                                | "quiet"
                                | "no-healthcheck"
                                | "oom-kill-disable"
                                | "publish-all"
                                | "sig-proxy"
                                | "help"
                                | "replace"
                                | "rootfs"
                                | "http-proxy"
                                | "no-hosts"
                                | "systemd"
                                | "env-host"
                                | "image-volume"
                        )
                    {
                        // Unknown: read as taking the next word too.
                        if guesses < 4 {
                            let after = (k + 1).min(rest.len());
                            self.container_command(
                                &rest[after..],
                                what,
                                depth,
                                stdin,
                                guesses + 1,
                                links.clone(),
                                workdir.clone(),
                            );
                        } else {
                            return self.opaque(
                                what.clone(),
                                format!("it gives the container options it cannot read (`{l}`)"),
                            );
                        }
                    }
                    continue;
                }
                match long {
                    "volume" => {
                        if let Some(Some(v)) = value(&mut k) {
                            mount(&v, false, &mut links);
                        }
                    }
                    "mount" => {
                        if let Some(Some(v)) = value(&mut k) {
                            mount(&v, true, &mut links);
                        }
                    }
                    "workdir" => workdir = value(&mut k).flatten(),
                    "entrypoint" => {
                        entrypoint = value(&mut k).map(|v| match v {
                            Some(v) => spec::word(&v),
                            None => ShellWord {
                                literal: None,
                                source: "(an entrypoint known only when it runs)".into(),
                                if_empty: None,
                            },
                        });
                    }
                    "health-cmd" => {
                        if let Some(v) = value(&mut k) {
                            health.push(match v {
                                Some(v) => spec::word(&v),
                                None => ShellWord::default(),
                            });
                        }
                    }
                    _ => {
                        value(&mut k);
                    }
                }
                continue;
            }
            for (at, c) in l.char_indices().skip(1) {
                if CONTAINER_WITH_ARG.contains(c) {
                    let attached = &l[at + 1..];
                    let v = match attached.is_empty() {
                        true => {
                            k += 1;
                            rest.get(k - 1).and_then(|w| w.literal.clone())
                        }
                        false => Some(attached.to_owned()),
                    };
                    match (c, v) {
                        ('v', Some(v)) => mount(&v, false, &mut links),
                        ('w', v) => workdir = v,
                        _ => {}
                    }
                    break;
                }
            }
        }
        // The image (or, for `exec`, the container; for `compose`, the service), then the
        // command.
        let command: Vec<ShellWord> = entrypoint
            .into_iter()
            .chain(rest[(k + 1).min(rest.len())..].iter().cloned())
            .collect();
        let stdin = stdin.clone();
        let what_here = what.clone();
        self.away(workdir, links, what, move |walk| {
            for h in &health {
                walk.nested("sh", Nesting::Remote, Some(h), &what_here, depth);
            }
            if !command.is_empty() {
                walk.unwrapped(&command, &what_here, depth, stdin);
            }
        });
    }

    /// `kubectl exec|debug|run … -- COMMAND`: the command in the pod, or on the node
    /// (`debug node/NAME`, whose root filesystem is mounted at `/host`).
    fn kubectl(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let sub = args
            .iter()
            .filter_map(|w| w.literal.as_deref())
            .find(|l| !l.starts_with('-'));
        if !matches!(sub, Some("exec" | "debug" | "run" | "attach")) {
            return;
        }
        let Some(k) = args.iter().position(|w| w.literal.as_deref() == Some("--")) else {
            return;
        };
        let node = args[..k]
            .iter()
            .any(|w| w.literal.as_deref().is_some_and(|l| l.starts_with("node/")));
        let links = match node {
            true => vec![("/host".to_owned(), "/".to_owned())],
            false => Vec::new(),
        };
        let command = args[k + 1..].to_vec();
        let stdin = stdin.clone();
        let what_here = what.clone();
        self.away(None, links, what, move |walk| {
            walk.unwrapped(&command, &what_here, depth, stdin);
        });
    }

    /// `ansible PATTERN -m command|shell|raw -a CMD`: the command on every host.
    fn ansible(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        let Some(s) = self.options(
            args,
            "amiueflBPtMcT",
            &[
                "args",
                "module-name",
                "inventory",
                "inventory-file",
                "user",
                "extra-vars",
                "forks",
                "limit",
                "background",
                "poll",
                "tree",
                "module-path",
                "become-user",
                "become-method",
                "connection",
                "timeout",
                "private-key",
                "key-file",
                "vault-id",
                "vault-password-file",
                "ssh-common-args",
                "sftp-extra-args",
                "scp-extra-args",
                "ssh-extra-args",
                "playbook-dir",
                "task-timeout",
            ],
            what,
        ) else {
            return;
        };
        let module = s
            .values(("m", &["module-name"]))
            .last()
            .map_or(Some("command".to_owned()), |m| {
                m.and_then(|m| m.literal.clone())
            });
        let Some(args_word) = s.values(("a", &["args"])).last().flatten().cloned() else {
            return;
        };
        let shell_module = |m: &str| {
            matches!(
                m.rsplit('.').next().unwrap_or(m),
                "command" | "shell" | "raw" | "win_shell" | "win_command"
            )
        };
        match module {
            Some(m) if shell_module(&m) => self.remote(&[args_word], what, depth, &None),
            Some(_) => {}
            None => self.opaque(what.clone(), "its module is known only when it runs"),
        }
    }

    /// `pdsh`, `clush`, `pssh`: the command words, on every host.
    fn fleet(&mut self, base: &str, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        let with_arg = match base {
            "pdsh" => "wxgXltufRMe",
            "clush" => "wxgXlftuoOR",
            _ => "hHlpoetOxX",
        };
        let Some(s) = self.options(args, with_arg, &[], what) else {
            return;
        };
        self.remote(&s.operands, what, depth, &None);
    }

    /// `salt TARGET cmd.run CMD` (and `cmd.shell`, `cmd.run_all`, …): the command on every
    /// minion.
    fn salt(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize) {
        let Some(s) = self.options(args, "tcbl", &["timeout", "config-dir", "batch-size"], what)
        else {
            return;
        };
        let Some(function) = s.operands.get(1) else {
            return;
        };
        match function.literal.as_deref() {
            Some(f) if f.starts_with("cmd.") => {
                // Keyword arguments (`cwd=/`, `runas=root`) aside.
                let keyword = |l: &str| {
                    l.split_once('=').is_some_and(|(k, _)| {
                        !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    })
                };
                let command = s.operands[2..]
                    .iter()
                    .find(|w| !w.literal.as_deref().is_some_and(keyword));
                if let Some(c) = command {
                    self.remote(std::slice::from_ref(c), what, depth, &None);
                }
            }
            Some(_) => {}
            None => self.opaque(
                what.clone(),
                "the function it runs is known only when it runs",
            ),
        }
    }

    /// `ip netns exec NAME COMMAND`: the command, on this host.
    fn netns(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let lits: Vec<Option<&str>> = args.iter().map(|w| w.literal.as_deref()).collect();
        let Some(k) = lits.iter().position(|l| *l == Some("netns")) else {
            return;
        };
        if lits.get(k + 1).copied().flatten() != Some("exec") {
            return;
        }
        let start = (k + 3).min(args.len());
        self.unwrapped(&args[start..], what, depth, stdin.clone());
    }

    /// `machinectl shell [USER@]HOST [PATH ARGS…]`: the program, or a shell on the input.
    fn machinectl(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let Some(at) = args
            .iter()
            .position(|w| w.literal.as_deref() == Some("shell"))
        else {
            return;
        };
        // Options, then the machine, then the program and its arguments as they are.
        let mut k = at + 1;
        while args
            .get(k)
            .and_then(|w| w.literal.as_deref())
            .is_some_and(|l| l.starts_with('-'))
        {
            k += 1;
        }
        let command: Vec<ShellWord> = args[(k + 1).min(args.len())..].to_vec();
        let stdin = stdin.clone();
        let what_here = what.clone();
        self.away(None, Vec::new(), what, move |walk| {
            match command.is_empty() {
                true => walk.reads_input("sh", true, stdin, &what_here, depth),
                false => walk.unwrapped(&command, &what_here, depth, stdin),
            }
        });
    }

    /// `bwrap [OPTIONS] COMMAND`: the command, its binds links to this host's paths.
    fn bwrap(&mut self, args: &[ShellWord], what: &Arc<str>, depth: usize, stdin: &Stdin) {
        let mut links = Vec::new();
        let mut chdir = None;
        let mut k = 0;
        while let Some(w) = args.get(k) {
            let Some(l) = w.literal.as_deref() else {
                if maybe_option(w) {
                    return self.opaque(what.clone(), unknown_option(w));
                }
                break;
            };
            if l == "--" {
                k += 1;
                break;
            }
            let Some(name) = l.strip_prefix("--") else {
                break;
            };
            k += 1;
            let count = if BWRAP_TWO.contains(&name) {
                2
            } else if BWRAP_ONE.contains(&name) {
                1
            } else if name == "overlay" {
                3
            } else if name.starts_with("unshare-")
                || matches!(
                    name,
                    "share-net"
                        | "die-with-parent"
                        | "as-pid-1"
                        | "new-session"
                        | "clearenv"
                        | "disable-userns"
                        | "assert-userns-disabled"
                        | "level-prefix"
                )
            {
                0
            } else {
                return self.opaque(
                    what.clone(),
                    format!("`bwrap {l}` is an option it cannot read"),
                );
            };
            let values: Vec<Option<&str>> = (0..count)
                .map(|n| args.get(k + n).and_then(|w| w.literal.as_deref()))
                .collect();
            k += count;
            if name == "chdir" {
                chdir = values[0].map(str::to_owned);
            }
            if name.contains("bind") || name == "symlink" {
                match (values[0], values[1]) {
                    (Some(src), Some(dst)) if src.starts_with('/') && dst.starts_with('/') => {
                        links.push((normalise("/", dst), normalise("/", src)));
                    }
                    _ => {
                        return self.opaque(
                            what.clone(),
                            "it binds a path known only when it runs into the sandbox",
                        );
                    }
                }
            }
        }
        let command = args[k.min(args.len())..].to_vec();
        let stdin = stdin.clone();
        let what_here = what.clone();
        links.retain(|(a, b)| a != b);
        self.away(chdir, links, what, move |walk| {
            walk.unwrapped(&command, &what_here, depth, stdin);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::START;
    use super::super::{Effect, Place, walk};

    /// Where `rm` runs in `script`, when it does.
    fn rm_at(script: &str) -> Option<Place> {
        walk(script, START).into_iter().find_map(|e| match e {
            Effect::Program { argv, at, .. } if argv[0].literal.as_deref() == Some("rm") => {
                Some(at)
            }
            _ => None,
        })
    }

    #[test]
    fn commands_run_on_other_hosts_are_walked_where_nothing_is_known() {
        for script in [
            "ssh root@db1 'rm -rf /etc'",
            "ssh -p 2222 -J bastion db1 -- rm -rf /etc",
            "ssh \"$host\" rm -rf /etc",
            "echo 'rm -rf /etc' | ssh db1 sh",
            "ssh db1 bash -s <<< 'rm -rf /etc'",
            "ansible all -b -m shell -a 'rm -rf /etc'",
            "ansible web -a 'rm -rf /etc'",
            "pdsh -w 'web[01-10]' rm -rf /etc",
            "clush -w web1 rm -rf /etc",
            "salt '*' cmd.run 'rm -rf /etc' runas=root",
        ] {
            let at = rm_at(script).unwrap_or_else(|| panic!("{script}: {:?}", walk(script, START)));
            assert!(at.cwds.is_empty() && at.home.is_none(), "{script}: {at:?}");
        }
        // `-o ProxyCommand` runs here.
        assert!(rm_at("ssh -o ProxyCommand='rm x' h").is_some());
        assert!(rm_at("ssh -o 'ProxyCommand rm x' h").is_some());
        assert!(rm_at("ansible all -m ping").is_none());
        assert!(rm_at("ssh web1 uptime").is_none());
    }

    #[test]
    fn containers_mounts_are_links_to_this_hosts_paths() {
        for (script, path) in [
            (
                "docker run --rm -v /:/host alpine rm -rf /host/etc",
                "/host/etc",
            ),
            (
                "podman run --rm -v /:/host:rw alpine rm -rf /host/etc",
                "/host/etc",
            ),
            (
                "docker run --mount type=bind,source=/,target=/host ubuntu rm -rf /host/etc",
                "/host/etc",
            ),
            ("docker run -v /etc:/mnt alpine sh -c 'rm -rf /mnt'", "/mnt"),
            (
                "kubectl debug node/w1 -it --image=busybox -- rm -rf /host/etc",
                "/host/etc",
            ),
            ("bwrap --dev-bind / / --bind /etc /x rm -rf /x", "/x"),
            (
                "docker run --log-driver none -v /:/host alpine rm -rf /host/etc",
                "/host/etc",
            ),
        ] {
            let at = rm_at(script).unwrap_or_else(|| panic!("{script}: {:?}", walk(script, START)));
            assert_eq!(at.resolve(path), Some(vec!["/etc".to_owned()]), "{script}");
        }
        // Other ways to run a command elsewhere on this host.
        for script in [
            "docker exec -it app rm -rf /etc",
            "kubectl exec pod -- rm -rf /etc",
            "ip netns exec t rm -rf /etc",
            "machinectl shell .host /bin/bash -c 'rm -rf /etc'",
            "capsh --caps=x -- -c 'rm -rf /etc'",
            "ltrace -f -o /dev/null rm -rf /etc",
            "valgrind -q --tool=none rm -rf /etc",
            "perf stat -o /dev/null rm -rf /etc",
            "setpriv --reuid=0 --regid=0 --init-groups rm -rf /etc",
            "firejail --noprofile rm -rf /etc",
        ] {
            assert!(
                rm_at(script).is_some(),
                "{script}: {:?}",
                walk(script, START)
            );
        }
        assert!(rm_at("docker run --rm alpine:3.20 cat /etc/alpine-release").is_none());
    }

    #[test]
    fn find_piped_into_xargs_is_a_find_that_runs_the_command() {
        let finds: Vec<Vec<String>> = walk("find /usr -type f -print0 | xargs -0 rm -f", START)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Program { argv, .. } if argv[0].source == "find" => Some(
                    argv.iter()
                        .map(|w| w.literal.clone().unwrap_or_default())
                        .collect(),
                ),
                _ => None,
            })
            .collect();
        assert_eq!(
            finds.last().map(|f| f[f.len() - 5..].to_vec()),
            Some(
                vec!["-exec", "rm", "-f", "{}", "+"]
                    .into_iter()
                    .map(String::from)
                    .collect()
            )
        );
    }
}
