//! Rules about the host itself, judged on one normalised simple command: its identity and
//! boot files — the account databases (`/etc/passwd`, `shadow`, `group`, `gshadow`,
//! `sudoers` and `sudoers.d`, PAM), what boots it (`/boot`, the bootloader's and init's
//! configuration, `/sbin/init`, `fstab`) and the keys that let its operators in — refused
//! whichever program writes, appends to, moves away, removes, replaces with a link or
//! re-permissions them; and its storage and system state — volumes, pools and encrypted
//! disks destroyed (refused), every process killed (refused), swap, mounts, network links,
//! addresses and routes, services' processes, crontabs installed, containers' data pruned,
//! boot entries and kernel settings changed (asked).
//!
//! A path is judged after `..` is resolved, against globs (`/etc/pass*`), and with the
//! unknown parts of a word empty: `"/boot/vmlinuz-$(uname -r)"` is a file in `/boot`.

use super::rules::{comp_matches, normalize, shown};
use super::{Objection, abbreviate};
use crate::bash::basename;
use crate::bash::expand::{Env, Field};

/// Files in `/etc` that hold the accounts or decide how the host boots and logs in.
const ETC_FILES: &[&str] = &[
    "passwd",
    "shadow",
    "group",
    "gshadow",
    "passwd-",
    "shadow-",
    "group-",
    "gshadow-",
    "subuid",
    "subgid",
    "sudoers",
    "fstab",
    "crypttab",
    "login.defs",
    "nsswitch.conf",
    "ld.so.preload",
    "ld.so.conf",
    "pam.conf",
    "inittab",
    "securetty",
    "rc.local",
];

/// Directories in `/etc` every file of which is such a file.
const ETC_DIRS: &[&str] = &[
    "sudoers.d",
    "pam.d",
    "security",
    "grub.d",
    "initramfs-tools",
    "dracut.conf.d",
    "ld.so.conf.d",
];

/// The identity or boot file a path names (or, as a glob, matches), as normalised.
pub(super) fn identity_file(path: &str) -> Option<String> {
    let (home, comps) = match path.strip_prefix('~') {
        Some(after) => (
            true,
            normalize(after.split_once('/').map_or("", |(_, r)| r))?,
        ),
        None if path.starts_with('/') => (false, normalize(path)?),
        None => return None,
    };
    let any = |c: &str, names: &[&str]| names.iter().any(|n| comp_matches(c, n));
    let hit = match comps.as_slice() {
        // `~/.ssh/authorized_keys`, the operators' way in.
        [s, k] if home => comp_matches(s, ".ssh") && k.starts_with("authorized_keys"),
        _ if home => false,
        [e, f] if comp_matches(e, "etc") => any(f, ETC_FILES),
        [e, d, _, ..] if comp_matches(e, "etc") && any(d, ETC_DIRS) => true,
        [e, d, g, ..] if comp_matches(e, "etc") && comp_matches(d, "default") => {
            comp_matches(g, "grub") || comp_matches(g, "grub.d")
        }
        [e, s, f] if comp_matches(e, "etc") && comp_matches(s, "systemd") => {
            comp_matches(f, "system.conf")
        }
        [e, s, y, t] if comp_matches(e, "etc") && comp_matches(s, "systemd") => {
            comp_matches(y, "system") && comp_matches(t, "default.target")
        }
        [e, s, f, ..] if comp_matches(e, "etc") && comp_matches(s, "ssh") => {
            comp_matches(f, "sshd_config") || comp_matches(f, "sshd_config.d")
        }
        [b, _, ..] if comp_matches(b, "boot") => true,
        [d, i] if any(d, &["sbin", "bin"]) => comp_matches(i, "init"),
        [u, d, i] if comp_matches(u, "usr") && any(d, &["sbin", "bin"]) => comp_matches(i, "init"),
        [r, s, k] if comp_matches(r, "root") => {
            comp_matches(s, ".ssh") && k.starts_with("authorized_keys")
        }
        [h, _, s, k] if comp_matches(h, "home") => {
            comp_matches(s, ".ssh") && k.starts_with("authorized_keys")
        }
        _ => false,
    };
    hit.then(|| match home {
        true => format!("~/{}", comps.join("/")),
        false => format!("/{}", comps.join("/")),
    })
}

/// The refusal for `cmd`, which would `how` (write, remove, …) the identity file `file`.
pub(super) fn identity_refusal(cmd: &str, file: &str, how: &str) -> Objection {
    Objection::new(
        "system-file",
        format!(
            "refused: `{}` would {how} {file}, which holds the host's accounts or decides how it \
             boots and who can log in; change it with the tool made for it (visudo, vipw, \
             usermod, update-grub) or ask an operator",
            abbreviate(cmd, 160)
        ),
    )
}

/// Removing, moving away, replacing with a link or re-permissioning an identity file.
pub(super) fn identity_rules(args: &[Field], env: &Env) -> Result<(), Objection> {
    let Some(name) = args.first().and_then(Field::val).map(basename) else {
        return Ok(());
    };
    if !matches!(
        name,
        "rm" | "unlink"
            | "srm"
            | "wipe"
            | "shred"
            | "mv"
            | "ln"
            | "link"
            | "chmod"
            | "chown"
            | "chgrp"
            | "chattr"
            | "setfacl"
            | "chcon"
            | "setfattr"
    ) {
        return Ok(());
    }
    let cmd = shown(args, 160);
    let operands: Vec<&Field> = operands(&args[1..]);
    let hit = |f: &Field| identity_file(&env.resolve(f.judged()));
    let (checked, how): (Vec<&Field>, &str) = match name {
        "rm" | "unlink" | "srm" | "wipe" => (operands.clone(), "remove"),
        "shred"
            if args[1..].iter().any(|f| {
                f.val().is_some_and(|v| {
                    v == "--remove"
                        || v.starts_with("--remove=")
                        || v.starts_with("--u")
                        || (v.starts_with('-') && !v.starts_with("--") && v.contains('u'))
                })
            }) =>
        {
            (operands.clone(), "remove")
        }
        "mv" => match operands.split_last() {
            Some((_, sources)) => (sources.to_vec(), "move away"),
            None => (Vec::new(), ""),
        },
        "ln" | "link" => match operands.as_slice() {
            [.., last] if operands.len() > 1 => (vec![*last], "replace with a link"),
            _ => (Vec::new(), ""),
        },
        "chmod" | "chown" | "chgrp" | "chattr" | "setfacl" | "chcon" | "setfattr" => (
            args[1..].iter().collect(),
            "change the permissions, owner or attributes of",
        ),
        _ => return Ok(()),
    };
    for f in checked {
        if let Some(file) = hit(f) {
            return Err(identity_refusal(&cmd, &file, how));
        }
    }
    Ok(())
}

/// Operands of a command's arguments: words after `--`, and those not starting with `-`.
fn operands(args: &[Field]) -> Vec<&Field> {
    let mut out = Vec::new();
    let mut done = false;
    for f in args {
        match f.val() {
            Some("--") if !done => done = true,
            Some(v) if !done && v.starts_with('-') && v.len() > 1 => {}
            _ => out.push(f),
        }
    }
    out
}

/// Destroying storage, or every process: refused.
pub(super) fn storage_rules(args: &[Field]) -> Result<(), Objection> {
    let Some(name) = args.first().and_then(Field::val).map(basename) else {
        return Ok(());
    };
    if !matches!(
        name,
        "pvremove"
            | "vgremove"
            | "lvremove"
            | "zpool"
            | "zfs"
            | "cryptsetup"
            | "nvme"
            | "mdadm"
            | "sgdisk"
            | "killall5"
            | "pkill"
            | "killall"
            | "umount"
    ) {
        return Ok(());
    }
    let cmd = shown(args, 160);
    let vals: Vec<&str> = args[1..].iter().map(Field::judged).collect();
    let has = |w: &str| vals.contains(&w);
    let verb = vals
        .iter()
        .copied()
        .find(|v| !v.starts_with('-'))
        .unwrap_or_default();
    let destroy = |what: &str| {
        Err(Objection::new(
            "storage",
            format!(
                "refused: `{cmd}` would destroy {what} and the data on it; this is not allowed \
                 through this tool, ask an operator"
            ),
        ))
    };
    match name {
        "pvremove" | "vgremove" | "lvremove" => destroy("a volume"),
        "zpool" if matches!(verb, "destroy" | "labelclear") => destroy("a storage pool"),
        "zfs" if verb == "destroy" => destroy("a dataset"),
        "cryptsetup"
            if matches!(
                verb,
                "erase" | "luksErase" | "luksFormat" | "reencrypt" | "luksKillSlot"
            ) =>
        {
            destroy("an encrypted disk's keys")
        }
        "nvme" if matches!(verb, "format" | "sanitize") => destroy("a disk"),
        "mdadm" if has("--zero-superblock") => destroy("a RAID member's metadata"),
        "sgdisk"
            if vals.iter().any(|v| {
                matches!(*v, "--zap-all" | "--zap" | "--clear")
                    || (v.starts_with('-') && !v.starts_with("--") && v.contains(['Z', 'z', 'o']))
            }) =>
        {
            destroy("a disk's partition table")
        }
        "killall5" => Err(Objection::new(
            "kill-all",
            format!(
                "refused: `{cmd}` would signal every process, which ends your session and the \
                 services; name the exact process IDs"
            ),
        )),
        "pkill" | "killall"
            if vals.windows(2).any(|w| {
                matches!(w[0], "-u" | "--user" | "-U" | "--uid") && matches!(w[1], "root" | "0")
            }) || vals.iter().any(|v| matches!(*v, "--user=root" | "--uid=0")) =>
        {
            Err(Objection::new(
                "kill-all",
                format!(
                    "refused: `{cmd}` would signal every process of root, which stops the \
                     services and the system; name the exact processes"
                ),
            ))
        }
        "umount"
            if vals
                .iter()
                .any(|v| *v == "/" || *v == "-a" || *v == "--all") =>
        {
            Err(Objection::new(
                "storage",
                format!(
                    "refused: `{cmd}` would unmount the root filesystem or every filesystem; ask \
                     an operator"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// System state a person should decide on changing: swap, mounts, the network, processes
/// by name, crontabs installed, containers' data, boot entries and images, kernel settings.
pub(super) fn state_asks(args: &[Field], env: &Env) -> Option<Objection> {
    let name = basename(args.first()?.val()?);
    if !matches!(
        name,
        "swapoff"
            | "mount"
            | "ip"
            | "ifconfig"
            | "ifdown"
            | "if-down"
            | "nmcli"
            | "pkill"
            | "killall"
            | "crontab"
            | "docker"
            | "podman"
            | "nerdctl"
            | "efibootmgr"
            | "update-initramfs"
            | "update-grub"
            | "update-grub2"
            | "grub-install"
            | "grub2-install"
            | "grub-mkconfig"
            | "grub2-mkconfig"
            | "dracut"
            | "mkinitcpio"
            | "kernel-install"
            | "bootctl"
            | "sysctl"
            | "tee"
    ) {
        return None;
    }
    let cmd = shown(args, 160);
    let vals: Vec<&str> = args[1..].iter().map(Field::judged).collect();
    let words: Vec<&str> = vals
        .iter()
        .copied()
        .filter(|v| !v.starts_with('-'))
        .collect();
    let has = |w: &str| vals.contains(&w);
    let ask = |rule: &str, why: &str| Some(Objection::ask(rule, format!("`{cmd}` {why}")));
    let listing = vals.iter().all(|v| {
        matches!(
            *v,
            "-s" | "--show" | "--summary" | "-l" | "--list" | "-V" | "--version" | "-h" | "--help"
        )
    });
    match name {
        "swapoff" if !listing => ask(
            "swap",
            "turns swap off, which can run the host out of memory",
        ),
        "mount" if vals.iter().any(|v| v.contains("remount")) => ask(
            "mounts",
            "remounts a filesystem, which can make it read-only",
        ),
        "ip" => {
            let object = words.first().copied().unwrap_or_default();
            let action = words.get(1).copied().unwrap_or_default();
            let cuts = match object {
                "l" | "li" | "lin" | "link" => {
                    matches!(action, "del" | "delete")
                        || (action == "set" && words.contains(&"down"))
                }
                "a" | "ad" | "add" | "addr" | "addre" | "addres" | "address" | "r" | "ro"
                | "rou" | "rout" | "route" | "n" | "ne" | "nei" | "neigh" | "ru" | "rule" => {
                    matches!(
                        action,
                        "del" | "delete" | "flush" | "f" | "fl" | "flu" | "flus"
                    )
                }
                _ => false,
            };
            cuts.then(|| Objection::ask(
                "network",
                format!("`{cmd}` takes a network link, address or route away, which can cut the host off"),
            ))
        }
        "ifconfig" if words.contains(&"down") => ask(
            "network",
            "takes a network link down, which can cut the host off",
        ),
        "ifdown" | "if-down" if !listing => ask(
            "network",
            "takes a network link down, which can cut the host off",
        ),
        "nmcli" => {
            let cuts = words.windows(2).any(|w| {
                matches!(
                    (w[0], w[1]),
                    (
                        "device" | "dev" | "d",
                        "disconnect" | "delete" | "down" | "del"
                    ) | ("connection" | "con" | "c", "down" | "delete" | "del")
                        | ("networking" | "n", "off")
                        | ("radio" | "r", _)
                )
            }) && !words.iter().any(|w| matches!(*w, "on" | "show" | "status"));
            cuts.then(|| {
                Objection::ask(
                    "network",
                    format!("`{cmd}` disconnects the network, which can cut the host off"),
                )
            })
        }
        "pkill" | "killall" if !listing => ask(
            "processes",
            "signals every process matching a name, which can stop services or the session",
        ),
        "crontab"
            if !vals
                .iter()
                .any(|v| v.starts_with('-') && v[1..].contains(['l', 'r', 'e'])) =>
        {
            ask("crontab", "replaces every cron job of the account")
        }
        "docker" | "podman" | "nerdctl"
            if words.windows(2).any(|w| {
                matches!(
                    (w[0], w[1]),
                    (
                        "system" | "volume" | "image" | "container" | "network" | "builder",
                        "prune"
                    ) | ("system", "reset")
                )
            }) || words.first().is_some_and(|w| *w == "volume")
                && words.get(1).is_some_and(|w| matches!(*w, "rm" | "remove")) =>
        {
            ask("containers", "deletes containers' data, images or volumes")
        }
        "efibootmgr"
            if !vals
                .iter()
                .all(|v| matches!(*v, "-v" | "--verbose" | "-q" | "--quiet")) =>
        {
            ask("boot", "changes the machine's boot entries")
        }
        "update-initramfs" | "update-grub" | "update-grub2" | "grub-install" | "grub2-install"
        | "grub-mkconfig" | "grub2-mkconfig" | "dracut" | "mkinitcpio" | "kernel-install"
        | "bootctl"
            if !listing && !has("status") =>
        {
            ask("boot", "rebuilds or changes what the machine boots")
        }
        "sysctl"
            if vals.iter().any(|v| {
                v.contains('=')
                    || *v == "-w"
                    || *v == "-p"
                    || v.starts_with("--write")
                    || v.starts_with("--load")
            }) =>
        {
            ask("kernel-state", "changes kernel settings")
        }
        "tee" => kernel_target(
            args[1..].iter().filter(|f| !f.judged().starts_with('-')),
            env,
        )
        .map(|p| {
            Objection::ask(
                "kernel-state",
                format!("`{cmd}` writes to {p}, which changes the kernel's state at once"),
            )
        }),
        _ => None,
    }
}

/// The first path in `/sys` or `/proc/sys` among `fields`: writing there changes the
/// kernel's state.
pub(super) fn kernel_target<'a>(
    fields: impl Iterator<Item = &'a Field>,
    env: &Env,
) -> Option<String> {
    fields
        .map(|f| env.resolve(f.judged()).into_owned())
        .find(|p| {
            let comps = normalize(p).unwrap_or_default();
            matches!(comps.as_slice(), [s, _, ..] if comp_matches(s, "sys"))
                || matches!(comps.as_slice(), [p, s, _, ..] if comp_matches(p, "proc") && comp_matches(s, "sys"))
        })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_allowed, assert_asked, assert_refused};

    #[test]
    fn identity_and_boot_files_are_refused_whatever_writes_them() {
        for cmd in [
            "echo 'toor:x:0:0::/root:/bin/bash' >> /etc/passwd",
            "echo 'deploy ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/deploy",
            "rm -f /etc/shadow",
            "unlink /etc/passwd",
            "shred -u /etc/gshadow",
            "mv /etc/passwd /tmp/",
            "ln -sf /dev/null /etc/passwd",
            "chmod 666 /etc/shadow",
            "chown nobody: /etc/sudoers",
            "chattr +i /etc/pass* /etc/shad*",
            "cp /bin/sh /sbin/init",
            "install -m 0755 /bin/true /sbin/init",
            "rm -f /boot/vmlinuz-*",
            "cd /etc; rm -f passwd shadow group",
            "truncate -s 0 \"/boot/vmlinuz-$(uname -r)\"",
            "cp /dev/null \"$(readlink -f /etc/passwd)\"",
            "truncate -s 0 `ls /etc/sudoers`",
            "echo 'GRUB_CMDLINE_LINUX=\"init=/bin/bash\"' >> /etc/default/grub",
            "ln -sf /lib/systemd/system/emergency.target /etc/systemd/system/default.target",
            "echo key >> /root/.ssh/authorized_keys",
        ] {
            assert_refused(cmd, "system-file");
        }
        for cmd in [
            "echo x >> /etc/hosts",
            "cp /etc/passwd ./passwd.bak",
            "cat /etc/shadow",
            "chmod 600 ~/.ssh/id_ed25519",
            "rm -f /etc/nginx/sites-enabled/default",
            "ls -la /boot",
            "ln -s /etc/passwd ./passwd-link",
        ] {
            assert_allowed(cmd);
        }
    }

    #[test]
    fn storage_and_system_state() {
        for (cmd, rule) in [
            ("lvremove -f vg0/root", "storage"),
            ("vgremove -ff vg0", "storage"),
            ("zpool destroy -f tank", "storage"),
            ("zfs destroy -r rpool/ROOT", "storage"),
            ("cryptsetup luksErase --batch-mode /dev/sda3", "storage"),
            ("nvme format --force /dev/nvme0n1", "storage"),
            ("mdadm --zero-superblock /dev/sdb1", "storage"),
            ("sgdisk --zap-all /dev/sda", "storage"),
            ("umount -lf /", "storage"),
            ("killall5 -9", "kill-all"),
            ("pkill -9 -u root", "kill-all"),
        ] {
            assert_refused(cmd, rule);
        }
        for (cmd, rule) in [
            ("swapoff -a", "swap"),
            ("mount -o remount,ro /", "mounts"),
            ("ip link set eth0 down", "network"),
            ("ip addr flush dev eth0", "network"),
            ("ip route del default", "network"),
            ("ifconfig eth0 down", "network"),
            ("nmcli networking off", "network"),
            ("killall -9 sshd", "processes"),
            ("crontab /dev/null", "crontab"),
            ("docker system prune -af --volumes", "containers"),
            ("efibootmgr -B -b 0000", "boot"),
            ("update-initramfs -d -k all", "boot"),
            ("echo 1 | tee /sys/block/sda/device/delete", "kernel-state"),
            ("echo 0 > /proc/sys/kernel/sysrq", "kernel-state"),
        ] {
            assert_asked(cmd, rule);
        }
        for cmd in [
            "zpool status",
            "zfs list",
            "lvs",
            "mdadm --detail /dev/md0",
            "swapon --show",
            "ip link show",
            "ip route get 8.8.8.8",
            "ifconfig -a",
            "nmcli device status",
            "crontab -l",
            "docker system df",
            "cat /proc/sys/vm/swappiness",
            "efibootmgr -v",
            "umount /mnt/usb",
        ] {
            assert_allowed(cmd);
        }
    }
}
