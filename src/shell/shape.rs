//! A command's shape: what "Allow in this thread" covers. Each simple command keeps its
//! program, its subcommand (for programs known to take one) and its option names; every
//! operand, option value and redirection target becomes `_`. Commands are joined by `|`
//! when piped and `;` otherwise, those inside substitutions marked with their depth, and the
//! loops, function definitions and parameter operations of the script are kept too. A
//! program name known only at run time is kept as written.
//!
//! Never: decides anything (the caller compares shapes); expands anything.

use super::parse::{Construct, RedirectKind, parse_script};

/// Programs whose first operand names what they do (`git push`, `systemctl restart`).
const SUBCOMMANDS: &[&str] = &[
    "apt",
    "apt-get",
    "brew",
    "cargo",
    "docker",
    "dnf",
    "git",
    "go",
    "helm",
    "ip",
    "kubectl",
    "npm",
    "pip",
    "pip3",
    "podman",
    "snap",
    "systemctl",
    "terraform",
    "yum",
];

/// The shape of `command`; `None` when it cannot be parsed (it then never matches).
pub fn shape(command: &str) -> Option<String> {
    let script = parse_script(command).ok()?;
    let mut out = String::new();
    for (i, c) in script.commands.iter().enumerate() {
        if i > 0 {
            out.push_str(if c.piped { " | " } else { " ; " });
        }
        if c.depth > 0 {
            out.push_str(&format!("[{}] ", c.depth));
        }
        for a in &c.assignments {
            let name = a.source.split('=').next().unwrap_or_default();
            out.push_str(&format!("{name}=_ "));
        }
        let mut words = c.argv.iter();
        let program = match words.next() {
            Some(w) => match &w.literal {
                Some(l) => super::basename(l).to_string(),
                None => w.source.clone(),
            },
            None => String::new(),
        };
        out.push_str(&program);
        let mut operands = 0;
        for w in words {
            let text = w.literal.as_deref();
            match text {
                Some(t) if t.starts_with('-') && t.len() > 1 => {
                    let name = t.split('=').next().unwrap_or(t);
                    out.push(' ');
                    out.push_str(name);
                    if t.contains('=') {
                        out.push_str("=_");
                    }
                }
                Some(t) if operands == 0 && SUBCOMMANDS.contains(&program.as_str()) => {
                    operands += 1;
                    out.push(' ');
                    out.push_str(t);
                }
                _ => {
                    operands += 1;
                    out.push_str(" _");
                }
            }
        }
        for r in &c.redirects {
            let op = match r.kind {
                RedirectKind::Input => "<",
                RedirectKind::Output => ">",
                RedirectKind::Append => ">>",
                RedirectKind::Duplicate => ">&",
                RedirectKind::HereString => "<<<",
                RedirectKind::HereDocument => "<<",
            };
            let fd = r.fd.as_deref().unwrap_or_default();
            out.push_str(&format!(" {fd}{op} _"));
        }
    }
    for k in &script.constructs {
        out.push_str(&match k {
            Construct::Loop { keyword } => format!(" ; {keyword} …"),
            Construct::Coprocess => " ; coproc …".into(),
            Construct::Function { name } => format!(" ; {name}() …"),
            Construct::Arithmetic { .. } => " ; ((…))".into(),
            Construct::Expansion { source } => format!(" ; {source}"),
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::shape;

    #[test]
    fn operands_are_placeholders_and_names_are_kept() {
        let s = |c: &str| shape(c).unwrap();
        assert_eq!(s("rm -rf /srv/a"), s("rm -rf '/tmp/b c'"));
        assert_eq!(s("rm -rf /srv/a"), "rm -rf _");
        assert_ne!(s("rm -rf /srv/a"), s("rm -r /srv/a"));
        assert_ne!(s("rm -rf /srv/a"), s("rm -rf /srv/a /srv/b"));
        assert_eq!(s("git push origin main"), "git push _ _");
        assert_ne!(s("git push origin"), s("git reset origin"));
        assert_eq!(s("sed --in-place=.bak -e x f"), "sed --in-place=_ -e _ _");
        assert_eq!(s("touch a && rm -rf \"$D\""), s("touch b; rm -rf \"$E\""));
        assert_ne!(s("touch a && rm -rf x"), s("touch a | rm -rf x"));
        assert_eq!(s("echo x > /etc/f"), "echo _ > _");
        assert_ne!(s("$(echo rm) -rf x"), s("rm -rf x"));
    }
}
