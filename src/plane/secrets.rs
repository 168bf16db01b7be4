//! The secret filter of the control plane: what memory and skills refuse to store, and what
//! the gate masks in every tool result. A text is refused when it holds a private-key block,
//! one of the service's own keys (Lark app secret, encrypt key and verification token, model
//! API keys, the API token, the database password), or a secret of any SSH target. A tool
//! result is masked ([`SecretFilter::mask`]): what the scanner's detectors find
//! ([`crate::mask::detect`]), the service's own keys and every target's secrets in plain,
//! base64 or hex, and the master key in base64 or hex. Target secrets are looked for inside the
//! vault ([`crate::target::holds_secret`] → [`crate::vault::Vault::contains_secret`],
//! [`crate::target::find_secrets`] → [`crate::vault::Vault::find_secrets`]): this module never
//! sees a target's plaintext.
//!
//! Never: echoes, logs or formats a secret; a refusal names only the kind of secret found.

use std::sync::Arc;

use secrecy::{ExposeSecret, SecretString};
use sqlx::PgPool;

use crate::config::{Config, LlmConfig};
use crate::mask::{Counts, Masked};
use crate::metrics::{KindLabel, Metrics};
use crate::vault::Vault;

/// Why a text was refused. The message names the kind of secret, never the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Leak {
    #[error(
        "it holds a private key block; keys belong in the target vault (`sshmode target add`), never in notes or skills"
    )]
    PrivateKey,
    #[error(
        "it holds one of this service's own keys or tokens; configuration secrets are never stored in notes or skills"
    )]
    ServiceKey,
    #[error(
        "it holds the key, certificate or password of an SSH target; those stay in the vault and are never stored in notes or skills"
    )]
    TargetSecret,
}

/// The service's own secrets, and the vault to check target secrets against.
pub struct SecretFilter {
    own: Vec<SecretString>,
    vault: Arc<Vault>,
    /// Where masks are counted (`sshmode_secrets_masked_total`); none in tools and tests that
    /// build a filter of their own.
    metrics: Option<Arc<Metrics>>,
}

impl SecretFilter {
    pub fn new(config: &Config, vault: Arc<Vault>) -> SecretFilter {
        let mut own: Vec<SecretString> = Vec::new();
        if let Some(l) = &config.lark {
            own.push(l.app_secret.clone());
            own.push(l.verification_token.clone());
            own.extend(l.encrypt_key.clone());
        }
        if let LlmConfig::Single {
            api_key: Some(k), ..
        } = &config.llm
        {
            own.push(k.clone());
        }
        if let Some(f) = &config.router_file {
            own.extend(f.providers.values().filter_map(|p| p.api_key.clone()));
        }
        own.extend(config.api_token.clone());
        if let Some(url) = &config.database_url
            && let Some((raw, decoded)) = database_password(url.expose_secret())
        {
            own.push(SecretString::from(raw));
            own.push(SecretString::from(decoded));
        }
        own.retain(|s| !s.expose_secret().trim().is_empty());
        SecretFilter {
            own,
            vault,
            metrics: None,
        }
    }

    /// The filter, counting masks in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> SecretFilter {
        self.metrics = Some(metrics);
        self
    }

    /// `text` with every secret masked (`[secret: KIND #TAG]`, the tag keyed by the vault):
    /// what the detectors find, the service's own keys and every target's secrets (plain,
    /// base64, hex), the master key. `Err` when the targets' secrets could not be searched.
    pub async fn mask(&self, db: &PgPool, text: &str) -> anyhow::Result<Masked> {
        if text.is_empty() {
            return Ok(Masked::default());
        }
        let mut found = crate::mask::detect(text);
        for s in &self.own {
            let v = s.expose_secret();
            let tag = self.vault.tag(v.trim().as_bytes());
            found.extend(crate::mask::find_known(text, v, "service-secret", &tag));
        }
        found.extend(crate::target::find_secrets(db, &self.vault, text).await?);
        Ok(crate::mask::apply(text, found, &|v| {
            Some(self.vault.tag(v.as_bytes()))
        }))
    }

    /// Counts masks of a result handed back (`sshmode_secrets_masked_total{kind}`).
    pub fn count(&self, counts: &Counts) {
        if let Some(m) = &self.metrics {
            for (kind, n) in counts {
                m.secrets_masked
                    .get_or_create(&KindLabel {
                        kind: (*kind).to_string(),
                    })
                    .inc_by(u64::from(*n));
            }
        }
    }

    /// Checks `text` (a note, or a skill's name, description and body joined). `Ok(Err(_))` is
    /// a refusal; `Err` is a failure to check at all (the text is then not stored either).
    pub async fn check(&self, db: &PgPool, text: &str) -> anyhow::Result<Result<(), Leak>> {
        if has_private_key_block(text) {
            return Ok(Err(Leak::PrivateKey));
        }
        if self
            .own
            .iter()
            .any(|s| crate::vault::holds(text, s.expose_secret()))
        {
            return Ok(Err(Leak::ServiceKey));
        }
        if crate::target::holds_secret(db, &self.vault, text).await? {
            return Ok(Err(Leak::TargetSecret));
        }
        Ok(Ok(()))
    }
}

/// Whether a line opens a PEM private-key block (`-----BEGIN … PRIVATE KEY-----`).
pub fn has_private_key_block(text: &str) -> bool {
    text.lines().any(|l| {
        l.find("-----BEGIN ")
            .is_some_and(|i| l[i..].contains("PRIVATE KEY-----"))
    })
}

/// The password part of `scheme://user:password@host/…`, as written and percent-decoded
/// (either spelling may be pasted).
fn database_password(url: &str) -> Option<(String, String)> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    let pw = userinfo.split_once(':')?.1;
    if pw.is_empty() {
        return None;
    }
    Some((pw.to_string(), percent_decode(pw)))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(Ok(v)) = s.get(i + 1..i + 3).map(|h| u8::from_str_radix(h, 16))
        {
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_key_blocks_of_every_kind() {
        for kind in ["OPENSSH ", "RSA ", "EC ", ""] {
            let t = format!("see:\n-----BEGIN {kind}PRIVATE KEY-----\nabc\n");
            assert!(has_private_key_block(&t), "{kind}");
        }
        assert!(!has_private_key_block("-----BEGIN CERTIFICATE-----"));
        assert!(!has_private_key_block("use a private key from the vault"));
    }

    #[test]
    fn database_password_is_found_raw_and_decoded() {
        assert_eq!(
            database_password("postgres://app:p%40ss@db:5432/x"),
            Some(("p%40ss".to_string(), "p@ss".to_string()))
        );
        assert_eq!(database_password("postgres://app@db/x"), None);
        assert_eq!(database_password("postgres:///x?host=/run"), None);
    }
}
