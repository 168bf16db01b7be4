//! The router file (`SSHMODE_ROUTER_CONFIG`): providers and the fallback chains of abstract
//! model names, parsed and validated once, at configuration load.
//!
//! API keys are never in the file: a provider names the environment variable that holds its
//! key (`api_key_env`), and [`RouterFile::parse`] resolves it through the variable lookup that
//! [`super::Config::from_vars`] passes in — so `config` stays the only reader of the
//! environment and tests inject keys like any other variable.

use std::collections::BTreeMap;

use secrecy::SecretString;
use serde::Deserialize;

/// Entries without a `priority` sort as if they had this one (and keep their file order).
const DEFAULT_PRIORITY: i64 = 100;

/// Longest chain accepted: the router tries each entry at most once per request, so this
/// bounds the work (and the wait) behind one request.
const MAX_CHAIN: usize = 16;

/// A parsed, validated router file with keys resolved.
#[derive(Debug, Clone)]
pub struct RouterFile {
    pub providers: BTreeMap<String, ProviderSpec>,
    /// In file order; the first is the default abstract model.
    pub chains: Vec<ChainSpec>,
}

/// One OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct ProviderSpec {
    pub name: String,
    /// Includes the version path; requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// Resolved from `api_key_env`; `None` for keyless local servers.
    pub api_key: Option<SecretString>,
    /// Extra request headers (e.g. `HTTP-Referer` for OpenRouter). Not for secrets.
    pub headers: Vec<(String, String)>,
}

/// An abstract model name and the entries that serve it, in the order they are tried.
#[derive(Debug, Clone)]
pub struct ChainSpec {
    pub name: String,
    pub entries: Vec<EntrySpec>,
}

/// One provider/model pair in a chain.
#[derive(Debug, Clone)]
pub struct EntrySpec {
    pub provider: String,
    pub model: String,
    /// The model reads images (`vision = true`): a request's images go to it as image
    /// content; to an entry without it they are described by their paths.
    pub vision: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    models: Vec<RawChain>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    base_url: String,
    api_key_env: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChain {
    name: String,
    entries: Vec<RawEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    provider: String,
    model: String,
    priority: Option<i64>,
    #[serde(default)]
    vision: bool,
}

impl RouterFile {
    /// Parses and validates the file's text; `get` resolves `api_key_env` names. The error is a
    /// sentence for the operator (it never contains a key).
    pub fn parse(text: &str, get: &dyn Fn(&str) -> Option<String>) -> Result<Self, String> {
        // The parser's own message quotes the offending line, which could hold a key pasted
        // into the file by mistake: report the line number and the reason only.
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| {
                text.as_bytes()[..s.start.min(text.len())]
                    .iter()
                    .filter(|b| **b == b'\n')
                    .count()
                    + 1
            });
            match line {
                Some(n) => format!("line {n}: {}", e.message()),
                None => e.message().to_string(),
            }
        })?;
        let mut providers = BTreeMap::new();
        for (name, p) in raw.providers {
            let base_url = p.base_url.trim().trim_end_matches('/').to_string();
            if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
                return Err(format!(
                    "provider `{name}`: base_url `{base_url}` is not an http(s) URL"
                ));
            }
            let api_key = match p.api_key_env {
                None => None,
                Some(var) => match get(&var).filter(|v| !v.trim().is_empty()) {
                    Some(key) => Some(SecretString::from(key.trim().to_string())),
                    None => {
                        return Err(format!(
                            "provider `{name}` takes its API key from {var}, which is not set"
                        ));
                    }
                },
            };
            for (h, v) in &p.headers {
                if reqwest::header::HeaderName::from_bytes(h.as_bytes()).is_err()
                    || reqwest::header::HeaderValue::from_str(v).is_err()
                {
                    return Err(format!("provider `{name}`: header `{h}` is not valid"));
                }
            }
            providers.insert(
                name.clone(),
                ProviderSpec {
                    name,
                    base_url,
                    api_key,
                    headers: p.headers.into_iter().collect(),
                },
            );
        }
        if raw.models.is_empty() {
            return Err("no [[models]] chain is defined".into());
        }
        let mut chains: Vec<ChainSpec> = Vec::new();
        for c in raw.models {
            if c.name.trim().is_empty() {
                return Err("a [[models]] chain has an empty name".into());
            }
            if chains.iter().any(|x| x.name == c.name) {
                return Err(format!("model `{}` is defined twice", c.name));
            }
            if c.entries.is_empty() || c.entries.len() > MAX_CHAIN {
                return Err(format!(
                    "model `{}` needs between 1 and {MAX_CHAIN} entries",
                    c.name
                ));
            }
            let mut entries: Vec<(i64, EntrySpec)> = Vec::new();
            for e in c.entries {
                if !providers.contains_key(&e.provider) {
                    return Err(format!(
                        "model `{}` uses provider `{}`, which is not defined",
                        c.name, e.provider
                    ));
                }
                if entries
                    .iter()
                    .any(|(_, x)| x.provider == e.provider && x.model == e.model)
                {
                    return Err(format!(
                        "model `{}` lists {}/{} twice",
                        c.name, e.provider, e.model
                    ));
                }
                entries.push((
                    e.priority.unwrap_or(DEFAULT_PRIORITY),
                    EntrySpec {
                        provider: e.provider,
                        model: e.model,
                        vision: e.vision,
                    },
                ));
            }
            // Stable: equal priorities keep file order.
            entries.sort_by_key(|(p, _)| *p);
            chains.push(ChainSpec {
                name: c.name,
                entries: entries.into_iter().map(|(_, e)| e).collect(),
            });
        }
        Ok(RouterFile { providers, chains })
    }

    /// The file equivalent of `LLM_BASE_URL` / `LLM_API_KEY` / `LLM_MODEL`: one provider
    /// called `default`, one chain named after the model.
    pub fn single(base_url: &str, api_key: Option<SecretString>, model: &str) -> Self {
        let provider = ProviderSpec {
            name: "default".into(),
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
            headers: Vec::new(),
        };
        RouterFile {
            providers: [("default".to_string(), provider)].into_iter().collect(),
            chains: vec![ChainSpec {
                name: model.into(),
                entries: vec![EntrySpec {
                    provider: "default".into(),
                    model: model.into(),
                    vision: false,
                }],
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    const EXAMPLE: &str = include_str!("../../deploy/router.example.toml");

    fn env(name: &str) -> Option<String> {
        Some(format!("key-of-{name}"))
    }

    #[test]
    fn the_shipped_example_parses() {
        let f = RouterFile::parse(EXAMPLE, &env).unwrap();
        assert!(!f.chains.is_empty());
        for c in &f.chains {
            for e in &c.entries {
                assert!(f.providers.contains_key(&e.provider));
            }
        }
    }

    #[test]
    fn priorities_order_the_chain_and_keys_come_from_the_lookup() {
        let text = r#"
            [providers.a]
            base_url = "https://a.example/v1/"
            api_key_env = "A_KEY"
            headers = { "X-Title" = "sshmode" }
            [providers.local]
            base_url = "http://127.0.0.1:1234/v1"

            [[models]]
            name = "coder"
            entries = [
              { provider = "local", model = "l", priority = 9 },
              { provider = "a", model = "a1", priority = 1 },
              { provider = "a", model = "a2", priority = 1 },
            ]
            [[models]]
            name = "cheap"
            entries = [{ provider = "local", model = "l" }]
        "#;
        let f = RouterFile::parse(text, &env).unwrap();
        let order: Vec<&str> = f.chains[0]
            .entries
            .iter()
            .map(|e| e.model.as_str())
            .collect();
        assert_eq!(order, ["a1", "a2", "l"]);
        assert_eq!(f.chains[1].name, "cheap");
        let a = &f.providers["a"];
        assert_eq!(a.base_url, "https://a.example/v1");
        assert_eq!(a.api_key.as_ref().unwrap().expose_secret(), "key-of-A_KEY");
        assert!(f.providers["local"].api_key.is_none());
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let missing_key = r#"
            [providers.a]
            base_url = "https://a.example/v1"
            api_key_env = "A_KEY"
            [[models]]
            name = "m"
            entries = [{ provider = "a", model = "x" }]
        "#;
        let e = RouterFile::parse(missing_key, &|_| None).unwrap_err();
        assert!(e.contains("A_KEY"), "{e}");
        let unknown = missing_key.replace("provider = \"a\"", "provider = \"b\"");
        let e = RouterFile::parse(&unknown, &env).unwrap_err();
        assert!(e.contains("`b`"), "{e}");
        let e = RouterFile::parse("[providers]", &env).unwrap_err();
        assert!(e.contains("[[models]]"), "{e}");
        let e =
            RouterFile::parse("\n[providers.a]\napi_key = \"sk-inline-secret\"", &env).unwrap_err();
        assert!(e.starts_with("line ") && e.contains("api_key"), "{e}");
        assert!(!e.contains("sk-inline-secret"), "{e}");
    }
}
