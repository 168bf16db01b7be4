//! The shell-analysis core: what the command guard (`exec::guard`) and the workspace
//! permission judge (`workspace::judge`) both need to read a command line the way a shell
//! would, so that the two policies cannot drift apart.
//!
//! It owns the parser ([`parse`]: quoting, substitutions, here-documents, simple commands),
//! the one table of command specs ([`spec`]: shells, inline interpreters, the wrappers that
//! run another command and the programs whose options do — their option letters and arities,
//! operands, which options change directory, run a script or write a file — and option
//! syntax), expansion ([`expand`]: words to the arguments the shell would pass, as far as
//! they can be known, within a budget), the one walk ([`effects`]: a command's effects in order — programs and where they
//! run, writes, nested scripts, sockets, descriptors, and what cannot be seen through), what
//! an allowance in a thread covers ([`cover`]: operands that are data may differ, code never),
//! the bounds the policies share, and the [`Verdict`] a policy answers with.
//!
//! It never decides what is allowed (that is each policy's), never executes anything, never
//! touches the filesystem, and imports nothing above it (`exec`, `workspace`).

pub mod cover;
pub mod effects;
pub mod expand;
pub mod parse;
pub mod spec;

/// Longest command either policy examines; longer ones are refused.
pub const MAX_INPUT: usize = 64 * 1024;
/// Deepest nesting of shells, `eval`, substitutions and arithmetic followed.
pub const MAX_DEPTH: usize = 8;
/// Most wrapper commands (`sudo env nice …`) unwrapped on the way to one command; more are
/// refused.
pub const MAX_WRAPPERS: usize = 32;

/// What a policy says about a command, ordered by strictness: `Allow < Ask < Refuse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Nothing risky was seen.
    Allow,
    /// Risky or opaque: a person should decide (inline interpreter code that deletes or runs
    /// programs, a pipe into a shell, service, firewall, account or partition changes).
    Ask,
    /// Catastrophic, or not allowed at the workspace's permission: never runs.
    Refuse,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Ask => "ask",
            Verdict::Refuse => "refuse",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The last component of a command name (`/usr/bin/rm` → `rm`).
pub fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The first `max` characters of `s`, with `…` when it was longer.
pub fn abbreviate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

/// Quotes `s` for a POSIX shell: `'…'` with embedded quotes escaped.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}
