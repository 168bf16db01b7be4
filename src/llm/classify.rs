//! What a provider's "no" means. Decided from the error code, the message and the HTTP status
//! together, in that order, because the same status means different things at different
//! providers (a 429 may be a rate limit or an empty quota; a 400 or 403 may be a bill).
//! Also owns scrubbing provider messages before they are stored or shown (their secrets masked
//! by [`crate::mask`]).

use std::sync::LazyLock;
use std::time::Duration;

use regex::Regex;
use serde::Serialize;

/// A failed call to one provider entry, before classification.
#[derive(Debug, Clone)]
pub enum CallFailure {
    /// The provider answered with a non-2xx status.
    Status {
        status: u16,
        /// From `Retry-After` / `retry-after-ms`, when present and sane.
        retry_after: Option<Duration>,
        /// `error.code` (string or number) and `error.type`, when the body had them.
        code: Option<String>,
        kind: Option<String>,
        /// `error.message`, or the start of the body; not yet scrubbed.
        message: String,
    },
    /// No answer within the request timeout.
    Timeout,
    /// Could not connect, or the connection broke.
    Connection(String),
    /// A 2xx whose body is not a usable completion.
    BadReply(String),
}

/// The failure classes; each drives a different router reaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// Slow down: cool for `Retry-After` (or the short default), use the next entry.
    RateLimited,
    /// Quota or bill exhausted: cool this provider/model entry for the long quota cooldown.
    Quota,
    /// The key is wrong: disable the entry until its configuration changes.
    Auth,
    /// 5xx, timeout, connection trouble: next entry at once; cool after repeats.
    Transient,
    /// The request itself is wrong: hand it back to the caller, cool nothing.
    BadRequest,
}

impl FailureClass {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::RateLimited => "rate_limited",
            FailureClass::Quota => "quota",
            FailureClass::Auth => "auth",
            FailureClass::Transient => "transient",
            FailureClass::BadRequest => "bad_request",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "rate_limited" => FailureClass::RateLimited,
            "quota" => FailureClass::Quota,
            "auth" => FailureClass::Auth,
            "transient" => FailureClass::Transient,
            "bad_request" => FailureClass::BadRequest,
            _ => return None,
        })
    }

    /// A few words for a person reading a chat message or the health page.
    pub fn describe(self) -> &'static str {
        match self {
            FailureClass::RateLimited => "rate limited",
            FailureClass::Quota => "quota or balance exhausted",
            FailureClass::Auth => "API key rejected",
            FailureClass::Transient => "unreachable or failing",
            FailureClass::BadRequest => "request refused",
        }
    }
}

/// Codes (from `error.code` or `error.type`) that mean the money or the quota is gone.
const QUOTA_CODES: &[&str] = &[
    "insufficient_quota",
    "billing_hard_limit_reached",
    "billing_not_active",
    "accountoverdueerror",
    "arrearage",
    "throttling.allocationquota",
    "allocationquota.freetieronly",
    "insufficient_balance",
    "insufficient_credits",
    "quota_exceeded",
    "payment_required",
];

/// Codes that mean "slow down" even though some contain the word "quota".
const RATE_CODES: &[&str] = &[
    "rate_limit_exceeded",
    "rate_limit_error",
    "throttling",
    "throttling.ratequota",
    "throttling.user",
    "requests",
    "tokens",
    "too_many_requests",
];

/// Codes that mean the credentials are wrong.
const AUTH_CODES: &[&str] = &[
    "invalid_api_key",
    "invalid_authentication",
    "authentication_error",
    "authenticationerror",
    "permission_denied",
    "permissiondenied",
    "invalidapikey",
    "unauthorized",
    "accessdenied",
];

/// Message text that signals an exhausted quota or balance.
static QUOTA_TEXT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)\b(quota|billing|credits?|balance|arrear\w*|overdue|payment required|insufficient funds|top[ -]?up|recharge)\b",
    )
    .expect("valid regex")
});

/// Classifies a failure. See ERRORS.md for the shapes this is built from.
pub fn classify(f: &CallFailure) -> FailureClass {
    let (status, code, kind, message) = match f {
        CallFailure::Timeout | CallFailure::Connection(_) | CallFailure::BadReply(_) => {
            return FailureClass::Transient;
        }
        CallFailure::Status {
            status,
            code,
            kind,
            message,
            ..
        } => (*status, code, kind, message),
    };
    let codes: Vec<String> = [code, kind]
        .into_iter()
        .flatten()
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let has = |list: &[&str]| codes.iter().any(|c| list.contains(&c.as_str()));
    if status == 402 || has(QUOTA_CODES) {
        return FailureClass::Quota;
    }
    if has(RATE_CODES) {
        return FailureClass::RateLimited;
    }
    if has(AUTH_CODES) && status != 429 {
        return FailureClass::Auth;
    }
    if matches!(status, 400 | 403 | 429) && QUOTA_TEXT.is_match(message) {
        return FailureClass::Quota;
    }
    match status {
        429 => FailureClass::RateLimited,
        401 | 403 => FailureClass::Auth,
        408 | 409 | 425 => FailureClass::Transient,
        500..=599 => FailureClass::Transient,
        400..=499 => FailureClass::BadRequest,
        // A 1xx/3xx reaching here is a misbehaving endpoint, not a wrong request.
        _ => FailureClass::Transient,
    }
}

/// Most characters of a provider message that are kept.
const MESSAGE_LIMIT: usize = 300;

/// Makes a provider message safe to store and show: removes the key itself and anything shaped
/// like a credential, collapses whitespace, and bounds the length.
pub fn scrub(message: &str, key: Option<&str>) -> String {
    let mut s = message.to_string();
    if let Some(k) = key.filter(|k| k.len() >= 4) {
        s = s.replace(k, "[redacted]");
    }
    let s = crate::mask::redact(&s);
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match s.char_indices().nth(MESSAGE_LIMIT) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_in_command_lines_are_redacted_and_the_rest_kept() {
        let secret = "Hunter2pass";
        for line in [
            "mysql -u root -pHunter2pass app",
            "mysqldump -h db -P 3306 -u root -pHunter2pass --all-databases",
            "mariadb -pHunter2pass -e 'select 1'",
            "PGPASSWORD=Hunter2pass psql -h db -U app",
            "export DB_PASSWORD='Hunter2pass'",
            "app --password=Hunter2pass --verbose",
            "app --password Hunter2pass --verbose",
            "vault login -method=userpass password=Hunter2pass",
            "app --api-key Hunter2pass",
            "app --token=Hunter2pass",
            "psql postgres://app:Hunter2pass@db:5432/app",
            "git clone https://deploy:Hunter2pass@git.example.com/repo.git",
            "redis-cli -u redis://:Hunter2pass@cache:6379",
            "curl -u admin:Hunter2pass https://example.com",
            "curl --user admin:Hunter2pass https://example.com",
            "curl -H 'Authorization: Bearer Hunter2pass' https://x",
            "curl -H 'Authorization: Basic Hunter2pass' https://x",
            "sshpass -p Hunter2pass ssh host",
            r#"echo '{"secret": "Hunter2pass"}'"#,
            "AWS_SECRET_ACCESS_KEY=Hunter2pass aws s3 ls",
        ] {
            let r = crate::mask::redact(line);
            assert!(!r.contains(secret), "{line} -> {r}");
            assert!(r.contains("[secret: "), "{line} -> {r}");
        }
        for plain in [
            "mkdir -p /tmp/x",
            "cp -p a b",
            "mysql -P 3306 -u root app",
            "ps -u root",
            "sort -u list.txt",
            "grep -r password src/",
            "echo basic example output",
            "ssh deploy@host uptime",
            "git clone https://git.example.com/repo.git",
        ] {
            assert_eq!(crate::mask::redact(plain), plain);
        }
    }

    fn status(status: u16, code: Option<&str>, kind: Option<&str>, message: &str) -> FailureClass {
        classify(&CallFailure::Status {
            status,
            retry_after: None,
            code: code.map(str::to_string),
            kind: kind.map(str::to_string),
            message: message.into(),
        })
    }

    #[test]
    fn the_shapes_from_errors_md() {
        use FailureClass::*;
        assert_eq!(
            status(
                429,
                Some("rate_limit_exceeded"),
                Some("requests"),
                "Rate limit reached for gpt-4o"
            ),
            RateLimited
        );
        assert_eq!(
            status(
                429,
                Some("insufficient_quota"),
                Some("insufficient_quota"),
                "You exceeded your current quota, please check your plan and billing details."
            ),
            Quota
        );
        assert_eq!(
            status(
                403,
                Some("AccountOverdueError"),
                Some("Forbidden"),
                "The request failed because your account has an overdue balance."
            ),
            Quota
        );
        for s in [400, 403] {
            assert_eq!(
                status(
                    s,
                    Some("Arrearage"),
                    Some("Arrearage"),
                    "Access denied, please make sure your account is in good standing."
                ),
                Quota
            );
        }
        assert_eq!(
            status(
                429,
                Some("Throttling.RateQuota"),
                None,
                "Requests rate limit exceeded"
            ),
            RateLimited
        );
        assert_eq!(
            status(
                429,
                Some("Throttling.AllocationQuota"),
                None,
                "Free allocated quota exceeded."
            ),
            Quota
        );
        assert_eq!(status(402, None, None, "out of credits"), Quota);
        assert_eq!(
            status(401, Some("invalid_api_key"), None, "Incorrect"),
            Auth
        );
        assert_eq!(status(403, Some("permission_denied"), None, "no"), Auth);
        assert_eq!(status(403, None, None, "forbidden"), Auth);
        assert_eq!(status(429, None, None, "insufficient balance"), Quota);
        assert_eq!(status(429, None, None, "slow down"), RateLimited);
        assert_eq!(
            status(400, Some("context_length_exceeded"), None, "too long"),
            BadRequest
        );
        assert_eq!(status(404, None, None, "model not found"), BadRequest);
        assert_eq!(status(503, None, None, "overloaded"), Transient);
        assert_eq!(classify(&CallFailure::Timeout), Transient);
    }

    #[test]
    fn scrub_removes_keys_and_bounds_length() {
        let m = scrub(
            "Incorrect API key provided: sk-proj-abcdef123456. Authorization: Bearer xyz  and my-key-value",
            Some("my-key-value"),
        );
        assert!(
            !m.contains("abcdef123456") && !m.contains("xyz") && !m.contains("my-key-value"),
            "{m}"
        );
        assert!(m.contains("Incorrect API key provided"));
        assert!(scrub(&"a ".repeat(1000), None).chars().count() <= MESSAGE_LIMIT + 1);
    }
}
