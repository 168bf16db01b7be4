//! The secret scanner: finds secrets in a text and masks their values. One implementation for
//! every text that leaves a tool (the gate masks each result with it, MCP's too), for audit
//! rows (the command line, the text typed into a shell) and for provider messages.
//!
//! A secret is found by [`detect`] (a small table of known formats, assignments to secret-ish
//! names and an entropy check, [`detect::TABLE`]) or because it is a known secret: the service's
//! own keys and every target's vaulted secrets, in plain, base64 or hex ([`find_known`], called
//! by the vault on what it opens). [`apply`] replaces each value by `[secret: KIND #TAG]`, where
//! TAG is a keyed hash of the value (an HMAC under a per-deployment key the vault derives from
//! its master key), so two secrets can be told apart and none can be recovered from its tag;
//! without a key ([`redact`]) the mask is `[secret: KIND]`.
//!
//! Never: keeps, logs or returns a secret's value; substitutes a mask back (a mask is text like
//! any other, and is never matched again as a secret).

pub mod detect;

use std::collections::BTreeMap;
use std::ops::Range;

pub use detect::detect;

/// A secret found in a text: where its value lies, what kind it is, and its tag when the finder
/// computed it (a known secret's tag is the tag of the secret, whichever encoding was found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub range: Range<usize>,
    pub kind: &'static str,
    pub tag: Option<String>,
}

/// How many values of each kind were masked.
pub type Counts = BTreeMap<&'static str, u32>;

/// A text with its secrets masked, and how many of each kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Masked {
    pub text: String,
    pub counts: Counts,
}

impl Masked {
    /// The total number of masks.
    pub fn total(&self) -> u32 {
        self.counts.values().sum()
    }
}

/// Adds `more` to `into`.
pub fn add_counts(into: &mut Counts, more: &Counts) {
    for (k, n) in more {
        *into.entry(k).or_default() += n;
    }
}

/// The opening of every mask; a value that starts with it is never a secret.
pub const MASK_OPEN: &str = "[secret: ";

/// `text` with every `found` value replaced by its mask. Overlapping finds are merged into one
/// mask (the first's kind). `tag` computes the tag of a value whose finder gave none (`None`:
/// no tag).
pub fn apply(text: &str, mut found: Vec<Found>, tag: &dyn Fn(&str) -> Option<String>) -> Masked {
    if found.is_empty() {
        return Masked {
            text: text.to_string(),
            counts: Counts::new(),
        };
    }
    found.sort_by(|a, b| {
        a.range
            .start
            .cmp(&b.range.start)
            .then(b.range.end.cmp(&a.range.end))
    });
    // Merge overlaps: the first (longest at its start) keeps its kind and tag.
    let mut merged: Vec<Found> = Vec::with_capacity(found.len());
    for f in found {
        if f.range.is_empty() {
            continue;
        }
        match merged.last_mut() {
            Some(last) if f.range.start < last.range.end => {
                last.range.end = last.range.end.max(f.range.end);
            }
            _ => merged.push(f),
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut counts = Counts::new();
    let mut at = 0;
    for f in merged {
        out.push_str(&text[at..f.range.start]);
        let t = f.tag.or_else(|| tag(&text[f.range.clone()]));
        out.push_str(MASK_OPEN);
        out.push_str(f.kind);
        if let Some(t) = t {
            out.push_str(" #");
            out.push_str(&t);
        }
        out.push(']');
        *counts.entry(f.kind).or_default() += 1;
        at = f.range.end;
    }
    out.push_str(&text[at..]);
    Masked { text: out, counts }
}

/// `text` with the secrets [`detect`] finds masked without a tag (`[secret: KIND]`): for texts
/// read where no deployment key is at hand (a provider's message, the text typed into a shell).
pub fn redact(text: &str) -> String {
    apply(text, detect(text), &|_| None).text
}

/// Shortest known secret matched anywhere in a text; a shorter one must stand as a whole word.
const MIN_SUBSTRING: usize = 8;
/// Shortest line of a multi-line secret (a key's body) that counts as a piece of it.
const MIN_KEY_LINE: usize = 16;

/// Where `secret` (a known one: the service's own, or a target's opened by the vault) occurs in
/// `text`, written as it is, in base64 (standard or URL-safe, padded or not) or in hex; for a
/// multi-line secret, each of its longer lines. Every find carries `tag`.
pub fn find_known(text: &str, secret: &str, kind: &'static str, tag: &str) -> Vec<Found> {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let secret = secret.trim();
    let mut out = Vec::new();
    if secret.is_empty() {
        return out;
    }
    let mut push = |range: Range<usize>| {
        out.push(Found {
            range,
            kind,
            tag: Some(tag.to_string()),
        })
    };
    if secret.contains('\n') {
        for (i, _) in text.match_indices(secret) {
            push(i..i + secret.len());
        }
        for line in secret.lines().map(str::trim) {
            if line.len() >= MIN_KEY_LINE && !line.starts_with("-----") {
                for (i, _) in text.match_indices(line) {
                    push(i..i + line.len());
                }
            }
        }
        return out;
    }
    if secret.len() < MIN_SUBSTRING {
        // A short secret only as a whole word.
        let bytes = text.as_bytes();
        let sep = |c: u8| c.is_ascii_whitespace() || b"\"'`,;:()[]{}<>=@/".contains(&c);
        for (i, _) in text.match_indices(secret) {
            let end = i + secret.len();
            if (i == 0 || sep(bytes[i - 1])) && (end == bytes.len() || sep(bytes[end])) {
                push(i..end);
            }
        }
        return out;
    }
    let b = secret.as_bytes();
    let mut forms = vec![
        secret.to_string(),
        STANDARD.encode(b),
        URL_SAFE.encode(b),
        hex::encode(b),
        hex::encode_upper(b),
    ];
    forms.push(STANDARD_NO_PAD.encode(b));
    forms.push(URL_SAFE_NO_PAD.encode(b));
    // A one-line certificate (`type base64 comment`): its base64 part alone counts too.
    forms.extend(
        secret
            .split_whitespace()
            .filter(|w| w.len() >= 32)
            .map(str::to_string),
    );
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    forms.dedup();
    for f in &forms {
        for (i, _) in text.match_indices(f.as_str()) {
            push(i..i + f.len());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_finds_become_one_mask_and_counts_are_per_kind() {
        let t = "a=SECRETVALUE b=OTHER";
        let m = apply(
            t,
            vec![
                Found {
                    range: 2..13,
                    kind: "password",
                    tag: None,
                },
                Found {
                    range: 4..8,
                    kind: "token",
                    tag: None,
                },
                Found {
                    range: 16..21,
                    kind: "token",
                    tag: Some("beef".into()),
                },
            ],
            &|v| Some(format!("{}", v.len())),
        );
        assert_eq!(m.text, "a=[secret: password #11] b=[secret: token #beef]");
        assert_eq!(m.counts.get("password"), Some(&1));
        assert_eq!(m.counts.get("token"), Some(&1));
        assert_eq!(m.total(), 2);
    }

    #[test]
    fn a_known_secret_is_found_plain_base64_and_hex() {
        use base64::Engine as _;
        let s = "correct-horse-battery";
        let b64 = base64::engine::general_purpose::STANDARD.encode(s);
        let text = format!("a {s} b {b64} c {} d", hex::encode(s));
        let m = apply(
            &text,
            find_known(&text, s, "service-secret", "0a0b"),
            &|_| None,
        );
        assert_eq!(
            m.text,
            "a [secret: service-secret #0a0b] b [secret: service-secret #0a0b] c [secret: service-secret #0a0b] d"
        );
        // Short secrets only as words.
        assert!(find_known("hunter2x", "hunt", "k", "t").is_empty());
        assert_eq!(find_known("pw=hunt;", "hunt", "k", "t").len(), 1);
    }
}
