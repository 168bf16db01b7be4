//! The guard's cases: commands that must be refused, asked or allowed, by what they show
//! of the policy — bypasses seen through, bounds that fail closed, wrappers, the caller's
//! working directory and variables, and how words are expanded.

#[cfg(test)]
mod tests {
    use super::super::testing::{DELETE, assert_allowed, assert_refused};

    use super::super::MAX_DEPTH;

    #[test]
    fn fork_bombs() {
        for cmd in [
            ":(){ :|:& };:",
            ":(){ :|: & };:",
            "f(){ f|f& };f",
            "bomb() { bomb | bomb & }; bomb",
            "function b { b | b & }; b",
            "function b() { b & b & }; b",
            "x(){\n x | x &\n}\nx",
            "bash -c ':(){ :|:& };:'",
        ] {
            assert_refused(cmd, "fork-bomb");
        }
    }

    #[test]
    fn bypasses_are_seen_through() {
        for (cmd, rule) in [
            ("sh -c \"rm -rf /\"", DELETE),
            ("bash -lc 'rm -rf /'", DELETE),
            ("bash -o pipefail -c 'rm -rf /'", DELETE),
            ("zsh -c 'rm -rf ~'", DELETE),
            ("/bin/dash -ec 'rm -rf /'", DELETE),
            ("eval \"rm -rf /\"", DELETE),
            ("eval rm -rf /", DELETE),
            ("echo $(rm -rf /)", DELETE),
            ("echo \"$(rm -rf /)\"", DELETE),
            ("echo `rm -rf /`", DELETE),
            ("x=`echo \\`rm -rf /\\``", DELETE),
            ("diff <(rm -rf /) x", DELETE),
            ("ls; rm -rf /", DELETE),
            ("true && rm -rf /", DELETE),
            ("false || rm -rf /", DELETE),
            ("ls | rm -rf /", DELETE),
            ("sleep 1 & rm -rf /", DELETE),
            ("ls\nrm -rf /", DELETE),
            ("( rm -rf / )", DELETE),
            ("(cd /tmp && rm -rf /)", DELETE),
            ("{ rm -rf /; }", DELETE),
            ("if true; then rm -rf /; fi", DELETE),
            ("for i in 1; do rm -rf /; done", DELETE),
            ("sudo rm -rf /", DELETE),
            ("sudo -u root rm -rf /", DELETE),
            ("sudo -E -u root -- rm -rf /", DELETE),
            ("sudo --user=root rm -rf /", DELETE),
            ("sudo -Eu root rm -rf /", DELETE),
            ("doas rm -rf /", DELETE),
            ("env rm -rf /", DELETE),
            ("env FOO=1 BAR=2 rm -rf /", DELETE),
            ("env -i PATH=/bin rm -rf /", DELETE),
            ("env -u HOME rm -rf /", DELETE),
            ("env -S 'rm -rf /'", DELETE),
            ("env -S 'rm -rf' /", DELETE),
            ("env --split-str='rm -rf' /", DELETE),
            ("xargs -I{} rm -rf /{}", DELETE),
            ("/usr/bin/env rm -rf /", DELETE),
            ("nice -n 5 rm -rf /", DELETE),
            ("nice -5 rm -rf /", DELETE),
            ("nohup rm -rf / &", DELETE),
            ("timeout 5 rm -rf /", DELETE),
            ("timeout -s KILL 5s rm -rf /", DELETE),
            ("command rm -rf /", DELETE),
            ("exec rm -rf /", DELETE),
            ("builtin rm -rf /", DELETE),
            ("time rm -rf /", DELETE),
            ("time -p rm -rf /", DELETE),
            ("xargs rm -rf /", DELETE),
            ("echo / | xargs rm -rf", DELETE),
            ("echo / | xargs -I{} rm -rf {}", DELETE),
            ("busybox rm -rf /", DELETE),
            ("/bin/rm -rf /", DELETE),
            ("/usr/bin/rm -rf /", DELETE),
            ("r''m -rf /", DELETE),
            ("\"rm\" -rf /", DELETE),
            ("\\rm -rf /", DELETE),
            ("'r'\"m\" -rf /", DELETE),
            ("rm -r''f /", DELETE),
            ("rm -rf '/'", DELETE),
            ("$'\\x72\\x6d' -rf /", DELETE),
            ("X=rm; $X -rf /", DELETE),
            ("X=rm; ${X} -rf /", DELETE),
            ("X=rm\n\"$X\" -rf /", DELETE),
            ("X=r; Y=m; $X$Y -rf /", DELETE),
            ("export X=rm; $X -rf /", DELETE),
            ("X='rm -rf /'; $X", DELETE),
            ("D=/; rm -rf $D", DELETE),
            ("D=/etc; rm -rf \"$D\"", DELETE),
            ("rm${IFS}-rf${IFS}/", DELETE),
            ("{rm,-rf,/}", DELETE),
            ("$(echo rm) -rf /", DELETE),
            ("`echo rm` -rf /", DELETE),
            ("echo 'rm -rf /' | sh", DELETE),
            ("printf 'rm -rf /' | bash", DELETE),
            ("bash <<< 'rm -rf /'", DELETE),
            ("sh <<EOF\nrm -rf /\nEOF", DELETE),
            ("cat <<'EOF' | sh\nrm -rf /\nEOF", DELETE),
            ("sudo env nice -n 5 timeout 5 nohup /bin/rm -rf /", DELETE),
            ("sudo sh -c 'eval \"rm -rf /\"'", DELETE),
            ("su -c 'rm -rf /'", DELETE),
            ("su root -c 'rm -rf /'", DELETE),
            ("trap 'rm -rf /' EXIT", DELETE),
            ("alias x='rm -rf /'", DELETE),
            ("sudo alias x='rm -rf /'", DELETE),
            ("command alias x='rm -rf /'", DELETE),
            ("find / -delete", DELETE),
            ("find / -exec rm -rf {} +", DELETE),
            ("find . -exec rm -rf / \\;", DELETE),
            ("X=sh; $X -c 'rm -rf /'", DELETE),
            ("sudo -u root mkfs.ext4 /dev/sda1", "format-disk"),
            ("bash -c 'dd if=/dev/zero of=/dev/sda'", "dd-device"),
            ("sh -c 'echo x > /dev/sda'", "device-write"),
            ("X=/dev/sda; echo x > $X", "device-write"),
            ("sudo reboot", "power"),
            ("nohup sh -c 'sleep 5; reboot' &", "power"),
            ("$X -rf /", "unresolved-command"),
            ("${CMD} -rf /usr", "unresolved-command"),
            ("$(which rm) -rf /", "unresolved-command"),
            ("$X -R 777 /", "unresolved-command"),
            ("$X if=/dev/zero of=/dev/sda", "unresolved-command"),
            ("X=$(get); $X -rf /", "unresolved-command"),
            ("$SUDO rm -rf /", DELETE),
            ("$SUDO sh -c 'rm -rf /'", DELETE),
            ("\"$SHELL\" -c 'rm -rf /'", DELETE),
            ("sh -c 'rm -rf \"$1\"' _ /", DELETE),
            ("echo / | xargs sh -c 'rm -rf $0'", DELETE),
        ] {
            assert_refused(cmd, rule);
        }
    }

    #[test]
    fn working_directory_loops_and_defaults_are_followed() {
        for (cmd, rule) in [
            ("cd / && rm -rf *", DELETE),
            ("cd /usr; rm -rf ./*", DELETE),
            ("cd /usr/local && rm -rf ..", DELETE),
            ("cd /tmp; cd ..; rm -rf etc", DELETE),
            ("cd && rm -rf *", DELETE),
            ("cd ~ && rm -rf .", DELETE),
            ("for d in / /etc; do rm -rf \"$d\"; done", DELETE),
            ("for d in /tmp/a /usr; do echo $d; rm -rf $d; done", DELETE),
            (
                "for a in x; do for b in /; do rm -rf $b; done; done",
                DELETE,
            ),
            ("rm -rf ${HOME:-/tmp}", DELETE),
            ("D=; rm -rf ${D:-/}", DELETE),
            ("D=/; rm -rf ${D:-./build}", DELETE),
            ("rm -rf ${UNSET_HERE:-/}", DELETE),
            ("rm -rf \"${TARGET:-/usr}\"", DELETE),
            ("cd /dev && cat x > sda", "device-write"),
        ] {
            assert_refused(cmd, rule);
        }
        for cmd in [
            "cd /tmp && rm -rf *",
            "cd ~/project && rm -rf target",
            "cd $DIR && rm -rf *",
            "cd /usr && ls && cd /tmp/x && rm -rf *",
            "cd - && rm -rf *",
            "for f in a b c; do rm -rf $f; done",
            "for f in $(ls); do rm -rf $f; done",
            "rm -rf ${BUILD_DIR:-./build}",
            "rm -rf ${UNSET_HERE:-./build}",
        ] {
            assert_allowed(cmd);
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let mut cmd = "rm -rf /".to_owned();
        for _ in 0..MAX_DEPTH {
            cmd = format!("echo $({cmd})");
        }
        assert_refused(&cmd, DELETE);
        let deeper = format!("echo $({cmd})");
        assert_refused(&deeper, "too-deep");
        let harmless = format!(
            "{}true{}",
            "$(".repeat(MAX_DEPTH + 1),
            ")".repeat(MAX_DEPTH + 1)
        );
        assert_refused(&harmless, "too-deep");

        // Scripts fed to shells nest the same way (here-documents grow linearly).
        let nest = |levels: usize| {
            let mut cmd = "rm -rf /".to_owned();
            for k in 0..levels {
                cmd = format!("sh <<'E{k}'\n{cmd}\nE{k}");
            }
            cmd
        };
        assert_refused(&nest(MAX_DEPTH), DELETE);
        assert_refused(&nest(MAX_DEPTH + 1), "too-deep");

        // Deep nesting must not overflow the stack either.
        let huge = "$(".repeat(20_000);
        assert_refused(&huge, "too-deep");
    }

    #[test]
    fn expansion_blowup_is_bounded() {
        // Doubling a variable: values past the cap become unknown, and the check stays fast
        // and still sees what follows.
        let mut cmd = "a=xxxxxxxxxxxxxxxx".to_owned();
        for _ in 0..40 {
            cmd.push_str("; a=$a$a");
        }
        assert_allowed(&format!("{cmd}; echo $a"));
        assert_refused(&format!("{cmd}; rm -rf /"), DELETE);

        // Expanding a large value many times exhausts the budget.
        let big = "x".repeat(32 * 1024);
        let uses = " $a".repeat(40);
        assert_refused(&format!("a={big}; echo{uses}"), "too-complex");

        // Nested loops multiply the work; the budget bounds it.
        let values = (1..=16)
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let mut loops = String::new();
        for v in ["a", "b", "c", "d", "e"] {
            loops.push_str(&format!("for {v} in {values}; do "));
        }
        loops.push_str("echo $a$b$c$d$e");
        loops.push_str(&"; done".repeat(5));
        assert_refused(&loops, "too-complex");

        let braces = "echo {a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}";
        assert_refused(braces, "too-complex");
    }
}

#[cfg(test)]
mod bounds_and_wrappers {
    use super::super::testing::{DELETE, assert_allowed, assert_asked, assert_refused};
    use super::super::{CPU_BUDGET, Context, Guard, MAX_WRAPPERS};
    use std::time::Duration;

    #[test]
    fn every_bound_fails_closed() {
        // 33 stacked wrappers used to pass as a plain `nice`.
        let over = "nice ".repeat(MAX_WRAPPERS + 1);
        assert_refused(&format!("{over}rm -rf /etc"), "too-complex");
        assert_refused(&format!("{over}ls"), "too-complex");
        let fits = "nice ".repeat(MAX_WRAPPERS);
        assert_refused(&format!("{fits}rm -rf /etc"), DELETE);
        assert_allowed(&format!("{fits}ls"));
    }

    /// A word known only when it runs where an option may stand is opaque (asked), and the
    /// rest is judged as if it were empty, as an unset variable is: what runs then is still
    /// refused.
    #[test]
    fn an_unknown_option_word_hides_no_command() {
        for cmd in [
            "sudo $FLAGS rm -rf /",
            "xargs $X rm -r /",
            "env $OPTS rm -rf /etc",
            "timeout $T rm -rf /",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_asked("sudo $FLAGS ls", "opaque");
        assert_asked("xargs $X ls", "opaque");
    }

    #[test]
    fn the_cpu_budget_fails_closed() {
        let g = Guard::default();
        let r = g
            .check_with("echo hi; ls", &Context::default(), Duration::ZERO)
            .unwrap_err();
        assert_eq!(r.rule, "too-complex");
        assert!(r.message.contains("CPU"), "{}", r.message);
        g.check_with("echo hi; ls", &Context::default(), CPU_BUDGET)
            .unwrap();
    }

    #[test]
    fn arithmetic_hides_no_commands() {
        for cmd in [
            "((x=1<<2))\nrm -rf /etc",
            "((x=1<<2)); rm -rf /etc",
            "echo $((1<<2))\nrm -rf /etc",
            "echo $[1<<2]\nrm -rf /etc",
            "x=$[1<<2]\nrm -rf /etc",
            "echo $(( $(rm -rf /) + 1 ))",
            "(( $(rm -rf /) ))",
            "echo $[ `rm -rf /` ]",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_allowed("((i++)); echo $((i << 2)) $[i*2]");
        assert_allowed("for ((i=0; i<3; i++)); do echo $i; done");
        assert_allowed("((cd /tmp) && ls)");
        // Each `((` looks ahead for its end; many unclosed ones are refused, not slow.
        assert_refused(&"((".repeat(30_000), "too-deep");
        assert_refused(
            &format!("{}\nrm -rf /etc", "$((1<<2".repeat(4_000)),
            "too-deep",
        );
    }

    #[test]
    fn su_runs_its_command_whatever_the_spelling() {
        for cmd in [
            "su -lc 'rm -rf /'",
            "su -c'rm -rf /'",
            "su --command='rm -rf /'",
            "su --command 'rm -rf /'",
            "su - root --command=\"rm -rf /\"",
            "su -l root -c 'rm -rf /'",
            "su -s /bin/bash -c 'rm -rf /' root",
            "su --session-command='rm -rf /'",
            "echo 'rm -rf /' | su",
            "echo 'rm -rf /' | su - root",
        ] {
            assert_refused(cmd, DELETE);
        }
        // Given twice, each command is judged.
        assert_refused("su -c ls -c 'rm -rf /'", DELETE);
        assert_refused("su -c 'rm -rf /' -c ls", DELETE);
        assert_allowed("su -c 'ls /' root");
        assert_allowed("su - deploy");
    }

    /// Wrappers the guard once missed while the judge knew them: both read one table now.
    #[test]
    fn every_wrapper_in_the_command_table_is_seen_through() {
        for cmd in [
            "taskset 1 rm -rf /",
            "taskset -c 0 rm -rf /",
            "chrt -f 10 rm -rf /",
            "flock /tmp/l -c 'rm -rf /'",
            "flock --command='rm -rf /' /tmp/l",
            "flock /tmp/l rm -rf /",
            "strace -o /tmp/t rm -rf /",
            "watch rm -rf /",
            "watch -n 5 'rm -rf /'",
            "watch -x rm -rf /",
            "script -qc 'rm -rf /' /dev/null",
            "script --command 'rm -rf /'",
            "unshare -m rm -rf /",
            "unbuffer rm -rf /",
            // An abbreviated long option takes its argument as the full one does.
            "sudo --chd /tmp rm -rf /",
            "sudo --us root rm -rf /",
            // `NAME+=value` is an assignment, not the command.
            "sudo X+=1 rm -rf /",
            "env X+=1 rm -rf /",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_allowed("taskset 1 make -j4");
        assert_allowed("watch -n 5 df -h");
        assert_allowed("script -q build.log");
        assert_allowed("flock /tmp/l -c 'cargo build'");
    }

    /// Programs whose options run a shell command: the command is judged like any script.
    #[test]
    fn commands_run_by_options_are_judged() {
        for cmd in [
            "tar --to-command='rm -rf /' -xf a.tar",
            "tar -xf a.tar --to-command 'rm -rf /'",
            "tar --to-comm='rm -rf /' -xf a.tar",
            "tar xf a.tar --checkpoint-action=exec='rm -rf /'",
            "tar -I 'rm -rf /' -xf a.tar",
            "tar xIf 'rm -rf /' a.tar",
            "rsync -e 'rm -rf /' a b:",
            "rsync --rsh='rm -rf /' a b:",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_asked("tar --to-command=\"$X\" -xf a.tar", "opaque");
        assert_asked("tar $OPTS -xf a.tar", "opaque");
        assert_asked("tar --to-command \"$X\" -xf a.tar", "opaque");
        assert_allowed("tar -xf a.tar -- --to-command=\"$X\"");
        assert_allowed("tar --to-command='cat' -xf a.tar");
        assert_allowed("tar czf /tmp/backup.tgz src");
        assert_allowed("rsync -e 'ssh -p 2222' -a src/ host:dst/");
    }

    #[test]
    fn more_wrappers_are_seen_through() {
        for cmd in [
            "coproc rm -rf /",
            "coproc killer { rm -rf /; }",
            "toybox rm -rf /",
            "pkexec rm -rf /",
            "pkexec --user root rm -rf /",
            "runuser -u root -- rm -rf /",
            "runuser -u root -c 'rm -rf /' -- ls",
            "runuser root -c 'rm -rf /'",
            "runuser -l root -c 'rm -rf /'",
            "chroot / rm -rf /",
            "chroot --userspec=0:0 /mnt rm -rf /",
            "echo 'rm -rf /' | chroot /",
            "nsenter -t 1 -m -u -i -n -p rm -rf /",
            "nsenter --target 1 --mount rm -rf /",
            "systemd-run rm -rf /",
            "systemd-run --unit x -p User=root rm -rf /",
            "systemd-run -t --uid=0 rm -rf /",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_allowed("coproc cat");
        // The command after `--` is the program, not `su`'s options.
        assert_allowed("runuser -u deploy -- ls -c 'rm -rf /'");
        assert_allowed("systemd-run --user --unit job ./build.sh");
        assert_allowed("chroot /srv/jail /bin/ls");
    }

    #[test]
    fn glob_command_names() {
        for cmd in [
            "/bin/r? -rf /",
            "/usr/bin/r* -rf /etc",
            "/bin/[r]m -rf /",
            "r[m] -rf /",
            "/bin/s? -c 'rm -rf /'",
        ] {
            assert_refused(cmd, DELETE);
        }
        assert_refused("/sbin/mkfs.e* /dev/sda1", "format-disk");
        assert_allowed("/bin/l? -la /");
        assert_allowed("[ -f x ] && echo y");
    }

    #[test]
    fn the_callers_working_directory_home_and_environment_count() {
        let g = Guard::default();
        let at = |cwd: &str, cmd: &str| {
            g.check_in(
                cmd,
                &Context {
                    cwd: Some(cwd),
                    home: Some("/home/me"),
                    ..Context::default()
                },
            )
        };
        // A previous command did `cd /`.
        for (cwd, cmd) in [
            ("/", "rm -rf *"),
            ("/", "rm -rf etc"),
            ("/usr", "rm -rf lib"),
            ("/usr/local", "rm -rf .."),
            ("/home/me", "rm -rf ."),
            ("/home/me", "rm -rf ./*"),
            ("/tmp", "rm -rf /home/me"),
        ] {
            let r = at(cwd, cmd).expect_err(cmd);
            assert_eq!(r.rule, DELETE, "{cwd}: {cmd}");
        }
        at("/tmp/work", "rm -rf *").unwrap();
        at("/home/me/project", "rm -rf target").unwrap();
        at("/", "ls; cd /tmp/x && rm -rf *").unwrap();
        // An unset variable is an empty argument, not the working directory.
        at("/", "rm -rf \"$UNSET\"").unwrap();
        at("/", "rm -rf $UNSET").unwrap();
        let env = [("TARGET".to_string(), "/".to_string())];
        let with_env = Context {
            env: &env,
            ..Context::default()
        };
        assert_eq!(
            g.check_in("rm -rf $TARGET", &with_env).unwrap_err().rule,
            DELETE
        );
        let env = [("TARGET".to_string(), "./build".to_string())];
        let with_env = Context {
            env: &env,
            ..Context::default()
        };
        g.check_in("rm -rf \"$TARGET\"", &with_env).unwrap();
        // Knowing nothing, a relative path is not judged.
        assert_allowed("rm -rf *");
    }
}

/// How words are expanded, as the guard judges them.
#[cfg(test)]
mod expansion {
    use super::super::testing::{DELETE, assert_allowed, assert_refused};

    #[test]
    fn brace_expansion_in_mixed_words() {
        for cmd in [
            "rm -rf ''/{etc,usr}",
            "rm -rf \"\"/{tmp,etc}",
            "rm -rf '/'{tmp,usr}",
            "rm -rf /{tmp/x,{a,b},etc}",
            "X=/; rm -rf $X{tmp,etc}",
        ] {
            assert_refused(cmd, DELETE);
        }
        // Quoted braces stay literal.
        assert_allowed("echo '{rm,-rf,/}'");
        assert_allowed("rm -rf '/{etc,usr}'");
        assert_allowed("rm -rf ''/{tmp/a,tmp/b}");
    }

    #[test]
    fn a_long_word_of_braces_is_scanned_once() {
        // Quadratic before: every `{` rescanned the rest of the word (1.7 s for 60 KB).
        // The check's CPU budget would refuse this if the scan were slow again.
        let word = "{".repeat(60 * 1024);
        assert_allowed(&format!("echo {word}"));
        let mixed = "{a,".repeat(20_000);
        assert_allowed(&format!("echo {mixed}"));
    }

    #[test]
    fn ifs_splitting() {
        for cmd in [
            "IFS=,; X=rm,-rf,/; $X",
            "IFS=/; X=x/-rf/; rm $X /",
            "IFS=:; for d in a:/; do rm -rf $d; done",
            "IFS=:; D=/tmp:/etc; rm -rf $D",
            "IFS=$(get); X=rm,-rf,/; $X",
        ] {
            assert!(
                super::super::Guard::default().check(cmd).is_err(),
                "allowed: {cmd}"
            );
        }
        assert_allowed("IFS=,; X=a,b; echo $X");
        assert_allowed("IFS=,; X='rm,-rf,/'; echo \"$X\"");
    }

    #[test]
    fn appends_add_to_the_value() {
        assert_refused("X=/; X+=etc; rm -rf $X", DELETE);
        assert_refused("X=/u; X+=sr; rm -rf \"$X\"", DELETE);
        assert_refused("export X=/; export X+=boot; rm -rf $X", DELETE);
        assert_allowed("X=/tmp; X+=/build; rm -rf $X");
    }

    #[test]
    fn interpreted_echo_and_printf_output_is_unknown() {
        for cmd in [
            "$(echo -e '\\x72\\x6d') -rf /",
            "$(printf '\\x72\\x6d') -rf /",
            "$(printf %s rm) -rf /",
            "X=$(printf '\\162\\155'); $X -rf /",
        ] {
            assert_refused(cmd, "unresolved-command");
        }
        // Plain text is still followed.
        assert_refused("$(echo rm) -rf /", DELETE);
        assert_refused("printf 'rm -rf /' | bash", DELETE);
    }

    #[test]
    fn unknown_values_may_be_empty() {
        for cmd in [
            "rm -rf \"$UNSET\"/*",
            "rm -rf $UNSET/",
            "rm -rf ${PREFIX}/usr",
            "rm -rf \"$(get)\"/etc",
            "rm -rf /$((0))",
        ] {
            assert_refused(cmd, DELETE);
        }
        let r = super::super::Guard::default()
            .check("rm -rf \"$UNSET\"/*")
            .unwrap_err();
        assert!(r.message.contains("empty"), "{}", r.message);
        assert_allowed("rm -rf \"$UNSET\"");
        assert_allowed("rm -rf \"${DIR:?}\"/*");
        assert_refused("rm -rf \"${DIR?}\"/*", DELETE);
        assert_allowed("rm -rf \"$DIR\"/build");
    }
}
