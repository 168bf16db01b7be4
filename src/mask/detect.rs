//! The detectors: one table ([`TABLE`]) of patterns, each with the kind it names and the check
//! its value must pass. Known formats need no check beyond their shape; an assignment to a
//! secret-ish name (`password=`, `"token": "…"`, `--api-key …`) checks that the value is not a
//! placeholder (`${X}`, `<redacted>`, `null`, a path, a short lowercase word); a long string
//! after a weaker name (`signing_key`, `auth`, `session`, or a secret-ish name followed by a
//! space) must also look random (its entropy). Tested against the corpora of `tests/corpus/`
//! (`tests/secret_corpus.rs`).

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

use super::Found;

/// What a rule's value must pass beyond its pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// A known format: its shape is enough.
    Format,
    /// An assignment or header: not a placeholder.
    Value,
    /// A string after a weaker name: not a placeholder, and random-looking.
    Random,
    /// The value of a command-line option (`--password …`): the name is an option (`-` or
    /// `--` after a space or at a line's start), the value not a placeholder.
    Option,
}

/// One detector: the kind it names (`None`: from the name it found, see [`kind_of_name`]), its
/// pattern (the value is the group `v`, else the whole match) and its check.
struct Rule {
    kind: Option<&'static str>,
    pattern: String,
    check: Check,
}

/// Names whose value is a secret whatever it looks like (the name must end with one of these).
const STRONG: &str = r"(?:passw(?:or)?d|passphrase|[_.\-]pass|\bpass|pwd|secret|token|api[_.\-]?key|access[_.\-]?key|private[_.\-]?key|secret[_.\-]?key|credentials?|auth[_.\-]?token)";
/// Names whose value is a secret when it looks random.
const WEAK: &str = r"(?:key|secret|token|passw(?:or)?d|auth|credentials?|signature|sig|salt|cookie|session|bearer|pat)";
/// What may follow a secret-ish name: an environment or a number (`DB_PASSWORD_PROD`).
const SUFFIX: &str =
    r"(?:[_.\-](?:prod|production|dev|development|test|staging|stage|live|local|old|new|[0-9]+))?";
/// An assigned value: double-quoted, single-quoted or a bare word.
const VALUE: &str = r#"(?:"(?P<dq>[^"\n]*)"|'(?P<sq>[^'\n]*)'|(?P<v>[^\s"',;&]+))"#;

fn rules() -> Vec<Rule> {
    let format = |kind: &'static str, pattern: &str| Rule {
        kind: Some(kind),
        pattern: pattern.to_string(),
        check: Check::Format,
    };
    let value = |kind: Option<&'static str>, pattern: String| Rule {
        kind,
        pattern,
        check: Check::Value,
    };
    vec![
        // Private keys (PEM, PKCS#8, OpenSSH), whole blocks; a block whose end was cut off; the
        // body and end of a block whose start scrolled away (a live tail).
        format(
            "private-key",
            r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----",
        ),
        format(
            "private-key",
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[^\n]*(?:\n[ \t]*(?:[A-Za-z0-9+/=]{16,}|Proc-Type:[^\n]*|DEK-Info:[^\n]*|Comment:[^\n]*)?[ \t]*\r?)*",
        ),
        format(
            "private-key",
            r"(?m)(?:^[ \t]*[A-Za-z0-9+/=]{40,}\r?\n)+[ \t]*-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----",
        ),
        format(
            "aws-access-key-id",
            r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|APKA)[A-Z2-7]{16}\b",
        ),
        format("gcp-api-key", r"\bAIza[0-9A-Za-z_\-]{35}"),
        format(
            "github-token",
            r"\b(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59})\b",
        ),
        format(
            "gitlab-token",
            r"\bgl(?:pat|dt|rt|ptt|cbt|imt|oas|ft|soat|ffct|agent)-[A-Za-z0-9_\-]{20,}",
        ),
        format("slack-token", r"\bxox[abeoprs]-[A-Za-z0-9\-]{20,}"),
        format("slack-token", r"\bxapp-[0-9]-[A-Za-z0-9\-]{20,}"),
        format(
            "slack-webhook",
            r"https://hooks\.slack\.com/(?:services|workflows|triggers)/(?P<v>[A-Za-z0-9_/\-]{20,})",
        ),
        format("lark-token", r"\b[tu]-g[A-Za-z0-9_\-]{30,}"),
        format("api-key", r"\b(?:sk|rk)-[A-Za-z0-9_\-]{16,}"),
        format("stripe-key", r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"),
        format("npm-token", r"\bnpm_[A-Za-z0-9]{36}\b"),
        format(
            "jwt",
            r"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]*",
        ),
        format(
            "azure-storage-key",
            r"(?i)AccountKey=(?P<v>[A-Za-z0-9+/]{80,}={0,2})",
        ),
        format(
            "azure-client-secret",
            r"\b[A-Za-z0-9_~.\-]{3}[0-9]Q~[A-Za-z0-9_~.\-]{31,34}",
        ),
        // `scheme://user:password@host`.
        value(
            Some("url-password"),
            r#"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@'"]*:(?P<v>[^\s@/'"]+)@"#.to_string(),
        ),
        // `Authorization: Bearer …`, `Basic …`, `token …`, or no scheme.
        value(
            Some("authorization"),
            r#"(?i)\b(?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["']?(?:(?:bearer|basic|token|bot|digest|negotiate|apikey)[ \t]+)?(?P<v>[^\s"',;]+)"#.to_string(),
        ),
        // `mysql -pSECRET` (`-P` is the port), `sshpass -p SECRET`.
        value(
            Some("password"),
            r"(?i)\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlcheck|mariadb|mariadb-dump|mariadb-admin)\b[^;&|\n]*?[ \t](?-i:-p)(?P<v>[^\s-]\S*)".to_string(),
        ),
        value(
            Some("password"),
            r"(?i)\bsshpass\b[^;&|\n]*?[ \t](?-i:-p)[ \t]*(?P<v>\S+)".to_string(),
        ),
        // `curl -u user:password`, `--user user:password`.
        value(
            Some("password"),
            r"(?:[ \t]-u|[ \t]--user|[ \t]--proxy-user)[ \t=]+[^\s:]+:(?P<v>\S+)".to_string(),
        ),
        // `--password …`, `--token …` as separate words.
        Rule {
            kind: None,
            pattern: format!(r"(?i)(?P<n>{STRONG}{SUFFIX})[ \t]+{VALUE}"),
            check: Check::Option,
        },
        // `PASSWORD=…`, `password: …`, `"token": "…"`, `Password=…;` (connection strings).
        value(
            None,
            format!(r#"(?i)(?P<n>{STRONG}{SUFFIX})["']?[ \t]*[=:][ \t]*{VALUE}"#),
        ),
        // A random-looking string after a weaker name, or a secret-ish name and a space.
        Rule {
            kind: None,
            pattern: format!(
                r#"(?i)(?P<n>{WEAK}{SUFFIX})["']?(?:[ \t]*[=:][ \t]*|[ \t]+)["']?(?P<v>[A-Za-z0-9+/_.~\-]{{16,}}={{0,2}})"#
            ),
            check: Check::Random,
        },
        Rule {
            kind: Some("bearer"),
            pattern: r"(?i)\bbearer[ \t]+(?P<v>[A-Za-z0-9._~+/\-]{16,}=*)".to_string(),
            check: Check::Random,
        },
    ]
}

/// The compiled table: the rules and their regexes.
pub struct Table {
    rules: Vec<Rule>,
    regexes: Vec<Regex>,
}

/// The detectors, compiled once.
pub static TABLE: LazyLock<Table> = LazyLock::new(|| {
    let rules = rules();
    // Word boundaries are ASCII ones, so the fast engines run on any text (a Unicode `\b`
    // makes them give up on the first non-ASCII byte).
    let regexes = rules
        .iter()
        .map(|r| Regex::new(&r.pattern.replace(r"\b", r"(?-u:\b)")).expect("valid detector"))
        .collect();
    Table { rules, regexes }
});

/// A mask already in a text: never read as a secret, nor its words as a name and value.
static MASK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\[secret: [a-z0-9\-]+(?: #[0-9a-f]+)?\]").expect("valid"));

/// Every secret the table finds in `text`: where its value lies and its kind (no tag).
pub fn detect(text: &str) -> Vec<Found> {
    let t = &*TABLE;
    let mut out = Vec::new();
    let masks: Vec<Range<usize>> = if text.contains(super::MASK_OPEN) {
        MASK.find_iter(text).map(|m| m.range()).collect()
    } else {
        Vec::new()
    };
    let in_mask = |r: &Range<usize>| masks.iter().any(|m| r.start < m.end && m.start < r.end);
    for (rule, re) in t.rules.iter().zip(&t.regexes) {
        // Most texts match no rule: a plain search first, the captures only where it found.
        let Some(first) = re.find(text) else {
            continue;
        };
        for c in re.captures_iter(&text[first.start()..]) {
            let base = first.start();
            let Some(v) = c
                .name("v")
                .or_else(|| c.name("dq"))
                .or_else(|| c.name("sq"))
                .or_else(|| c.get(0))
            else {
                continue;
            };
            let value = v.as_str();
            let range = v.start() + base..v.end() + base;
            if in_mask(&range) {
                continue;
            }
            let ok = match rule.check {
                Check::Format => true,
                Check::Option => {
                    let n = c
                        .name("n")
                        .map_or(0..0, |n| n.start() + base..n.end() + base);
                    let name = name_ending(text, n.start, n.end);
                    let at = n.end - name.len();
                    name.starts_with('-')
                        && (at == 0 || matches!(text.as_bytes()[at - 1], b' ' | b'\t' | b'\n'))
                        && !placeholder(value, false)
                }
                Check::Value => !placeholder(value, rule.kind.is_some()),
                Check::Random => !placeholder(value, false) && random(value),
            };
            if !ok {
                continue;
            }
            let kind = rule.kind.unwrap_or_else(|| match c.name("n") {
                Some(n) => kind_of_name(name_ending(text, n.start() + base, n.end() + base)),
                None => "credential",
            });
            out.push(Found {
                range: trim(text, range),
                kind,
                tag: None,
            });
        }
    }
    out
}

/// The whole name a secret-ish word ends (`AWS_SECRET_ACCESS_KEY` for `ACCESS_KEY`): the
/// name characters before `start`, up to `end`.
fn name_ending(text: &str, start: usize, end: usize) -> &str {
    let before = text[..start]
        .bytes()
        .rev()
        .take(64)
        .take_while(|b| b.is_ascii_alphanumeric() || b"_.-".contains(b))
        .count();
    &text[start - before..end]
}

/// The range without surrounding spaces.
fn trim(text: &str, r: Range<usize>) -> Range<usize> {
    let s = &text[r.clone()];
    let start = r.start + (s.len() - s.trim_start().len());
    let end = r.end - (s.len() - s.trim_end().len());
    start..end.max(start)
}

/// The kind an assignment's name gives its value.
fn kind_of_name(name: &str) -> &'static str {
    let n = name.to_ascii_lowercase();
    if n.contains("aws") && n.contains("secret") || n.contains("secretaccesskey") {
        "aws-secret-key"
    } else if n.contains("pass") || n.contains("pwd") {
        "password"
    } else if n.contains("token") || n.contains("bearer") || n.ends_with("pat") {
        "token"
    } else if n.contains("secret") {
        "secret"
    } else if n.contains("key") {
        "key"
    } else {
        "credential"
    }
}

/// Whether an assigned value is a placeholder rather than a secret: empty, a variable or
/// command substitution, a template, a mask already, a word such as `null`, a path, a number,
/// code, or (unless `any_length`) a short lowercase word.
fn placeholder(value: &str, any_length: bool) -> bool {
    let v = value.trim();
    if v.is_empty() {
        return true;
    }
    if v.starts_with(super::MASK_OPEN) || v.starts_with("[secret") {
        return true;
    }
    // Variables, command substitutions, templates, format strings, arrays and objects, `***`.
    if v.starts_with(['$', '<', '{', '['])
        || v.starts_with("%s")
        || v.starts_with("%(")
        || v.starts_with("%{")
        || v.contains("{{")
        || v.bytes().all(|b| b == b'*')
    {
        return true;
    }
    // A path (`/run/secrets/db`, `~/.netrc`, `./token`), unless it looks random (a base64
    // key may start with `/`).
    if (v.starts_with('/') || v.starts_with("~/") || v.starts_with("./")) && !random(v) {
        return true;
    }
    // A YAML tag (`!vault`, `!Ref`) or a call (`getpass()`, `os.environ.get(`).
    let word_then = |c: u8| {
        let b = v.as_bytes();
        let n = b
            .iter()
            .take_while(|&&x| x.is_ascii_alphanumeric() || x == b'_' || x == b'.')
            .count();
        n > 0 && !b[0].is_ascii_digit() && b.get(n) == Some(&c)
    };
    if (v.starts_with('!') && v[1..].bytes().all(|b| b.is_ascii_alphanumeric())) || word_then(b'(')
    {
        return true;
    }
    let lower = v.to_ascii_lowercase();
    if matches!(
        lower.as_str(),
        "null"
            | "none"
            | "nil"
            | "true"
            | "false"
            | "yes"
            | "no"
            | "undefined"
            | "required"
            | "optional"
            | "string"
            | "redacted"
            | "hidden"
            | "xxx"
            | "xxxx"
            | "env"
            | "file"
    ) {
        return true;
    }
    if any_length {
        return false;
    }
    if v.len() < 4 {
        return true;
    }
    if v.bytes().all(|b| b.is_ascii_digit()) && v.len() < 8 {
        return true;
    }
    v.len() < 8 && v.bytes().all(|b| b.is_ascii_lowercase())
}

/// Whether a string looks random: long enough, of several character classes (or hex with
/// letters and digits), and with a high enough entropy per character.
fn random(v: &str) -> bool {
    let v = v.trim_end_matches('=');
    if v.len() < 16 {
        return false;
    }
    let lower = v.bytes().any(|b| b.is_ascii_lowercase());
    let upper = v.bytes().any(|b| b.is_ascii_uppercase());
    let digit = v.bytes().any(|b| b.is_ascii_digit());
    let classes = [lower, upper, digit].iter().filter(|&&x| x).count();
    let hex = v.bytes().all(|b| b.is_ascii_hexdigit());
    if classes < 2 && !(hex && v.len() >= 32) {
        return false;
    }
    // A word with dashes or dots (`sshmode-tools.service`) is not random.
    if v.split(['-', '.', '_']).all(|p| p.len() < 12) && v.contains(['-', '.', '_']) {
        return false;
    }
    entropy(v) >= 3.0
}

/// Shannon entropy of `s`, in bits per character.
fn entropy(s: &str) -> f64 {
    let mut counts = [0u32; 256];
    for b in s.bytes() {
        counts[b as usize] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use crate::mask::redact;

    /// Each family: a line holding a secret, and the secret that must be gone.
    const FAMILIES: &[(&str, &str)] = &[
        (
            "aws_access_key_id = AKIAZCOJCBEUDBISVFZ6",
            "AKIAZCOJCBEUDBISVFZ6",
        ),
        (
            "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        (
            "key=AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY&q=x",
            "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
        ),
        (
            "origin https://ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789@github.com/a/b (fetch)",
            "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        ),
        (
            "registered glpat-x8Yz3kLmN0pQrStUvW12",
            "glpat-x8Yz3kLmN0pQrStUvW12",
        ),
        (
            "using xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
            "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        ),
        (
            "{\"tenant_access_token\":\"t-g1044ghJKLmnOPqrSTuvWXyz0123456789AB\"}",
            "t-g1044ghJKLmnOPqrSTuvWXyz0123456789AB",
        ),
        (
            "Incorrect API key provided: sk-proj-Ab12Cd34Ef56Gh78Ij90",
            "sk-proj-Ab12Cd34Ef56Gh78Ij90",
        ),
        (
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        ),
        (
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----",
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",
        ),
        (
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----",
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
        ),
        ("psql postgres://app:Hunter2pass@db:5432/app", "Hunter2pass"),
        (
            "Server=db;User ID=sa;Password=Hunter2pass;Encrypt=True",
            "Hunter2pass",
        ),
        ("  password: Hunter2pass", "Hunter2pass"),
        ("\"client_secret\": \"Hunter2pass\",", "Hunter2pass"),
        ("secret = Hunter2pass", "Hunter2pass"),
        (
            "Authorization: Basic YWRtaW46SHVudGVyMnBhc3M=",
            "YWRtaW46SHVudGVyMnBhc3M=",
        ),
        (
            "signing_key: 9f8e7d6c5b4a39281706f5e4d3c2b1a0",
            "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
        ),
    ];

    #[test]
    fn each_family_is_masked() {
        for (line, secret) in FAMILIES {
            let r = redact(line);
            assert!(!r.contains(secret), "{line} -> {r}");
            assert!(r.contains("[secret: "), "{line} -> {r}");
        }
    }

    #[test]
    fn ordinary_lines_are_untouched() {
        for line in [
            "commit 64a383b4b8c5e1f0a9d2c3b4e5f60718293a4b5c",
            "3b7e4c0d9a1f2e5b6c8d7a9e0f1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b  sshmode.tar.gz",
            "550e8400-e29b-41d4-a716-446655440000",
            "PASSWORD_STORE_DIR=/home/deploy/.password-store",
            "TOKEN_TTL_SECONDS=3600",
            "  password: ${DB_PASSWORD}",
            "api_key = <redacted>",
            "\"token_type\":\"Bearer\",\"expires_in\":3600",
            "passwd:         files systemd",
            "PasswordAuthentication no",
            "Accepted publickey for deploy from 10.0.0.7 port 52144 ssh2: ED25519 SHA256:8nMJdl3u+a78iqiuBhTibrYVteri5OUFEBlaqROowjs",
            "git@github.com:acme/infra.git",
            "https://user@example.com/path?x=1",
            "the token expired; run `gh auth login` again",
            "a=[secret: password #3f2a]",
        ] {
            assert_eq!(redact(line), line);
        }
    }

    #[test]
    fn a_masked_text_masks_to_itself() {
        for (line, _) in FAMILIES {
            let once = redact(line);
            assert_eq!(redact(&once), once, "{line}");
        }
    }
}
