//! The event callback's checks, in the order PROTOCOL.md gives: size, signature, decryption,
//! envelope, verification token, app id, freshness. Pure functions over the raw request
//! (headers and bytes) and "now": no I/O, no storage, no knowledge of what an event means.
//!
//! Signed-only by default: with an Encrypt Key nothing is parsed, not even as JSON, before the
//! signature over the raw bytes checks out — except an unsigned url_verification of at most
//! [`MAX_UNSIGNED_BODY`] bytes, which is all an unsigned request can ever be answered as.
//! Without a key every request is refused unless unsigned events are explicitly allowed.
//!
//! JSON is read without building a `serde_json::Value`: one validating pass over the body and
//! one over the plaintext keep each object's members as raw text ([`super::json::Members`]),
//! so the envelope that is stored is the plaintext itself, written back less its token.
//!
//! Lark's AES-256-CBC is not offered by ring, so the RustCrypto `aes` + `cbc` crates do it;
//! the digest is `sha2`, and every secret comparison goes through `subtle`.

use std::time::Duration;

use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, Utc};
use secrecy::ExposeSecret;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::json::{self, Members};
use crate::config::LarkConfig;

/// Largest callback body accepted; Lark's own events are a few kilobytes.
pub const MAX_BODY: usize = 1024 * 1024;
/// Largest unsigned body parsed while an Encrypt Key is set: a url_verification is a few
/// hundred bytes, and nothing else may arrive unsigned.
pub const MAX_UNSIGNED_BODY: usize = 4 * 1024;
/// How far ahead of our clock a request's time may be (clock skew) before it is refused.
pub const MAX_SKEW: Duration = Duration::from_secs(5 * 60);

pub const HEADER_TIMESTAMP: &str = "x-lark-request-timestamp";
pub const HEADER_NONCE: &str = "x-lark-request-nonce";
pub const HEADER_SIGNATURE: &str = "x-lark-signature";

/// Why a callback request was refused. Each maps to one HTTP status and one metric label; the
/// variants carry no request content, so they are safe to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("body too large")]
    TooLarge,
    #[error("body not received in time")]
    BodyTimeout,
    #[error("unsigned events are not accepted: no encrypt key is configured")]
    Unsigned,
    #[error("missing or wrong signature")]
    BadSignature,
    #[error("body is not JSON")]
    NotJson,
    #[error("encrypted body cannot be decrypted")]
    BadCiphertext,
    #[error("body is encrypted but no encrypt key is configured")]
    UnexpectedEncryption,
    #[error("body is not encrypted but an encrypt key is configured")]
    MissingEncryption,
    #[error("required fields are missing")]
    MissingFields,
    #[error("wrong verification token")]
    BadToken,
    #[error("event is for another app")]
    WrongApp,
    #[error("request is too old")]
    Stale,
    #[error("request is dated in the future")]
    Future,
}

impl Rejection {
    /// The HTTP status the platform gets.
    pub fn status(self) -> u16 {
        match self {
            Rejection::TooLarge => 413,
            Rejection::BodyTimeout => 408,
            Rejection::Unsigned
            | Rejection::BadSignature
            | Rejection::BadToken
            | Rejection::WrongApp
            | Rejection::Stale
            | Rejection::Future
            | Rejection::MissingEncryption => 401,
            Rejection::NotJson
            | Rejection::BadCiphertext
            | Rejection::UnexpectedEncryption
            | Rejection::MissingFields => 400,
        }
    }

    /// The `reason` label of `sshmode_events_rejected_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Rejection::TooLarge => "too_large",
            Rejection::BodyTimeout => "body_timeout",
            Rejection::Unsigned => "unsigned",
            Rejection::BadSignature => "signature",
            Rejection::NotJson => "not_json",
            Rejection::BadCiphertext => "ciphertext",
            Rejection::UnexpectedEncryption => "unexpected_encryption",
            Rejection::MissingEncryption => "missing_encryption",
            Rejection::MissingFields => "missing_fields",
            Rejection::BadToken => "token",
            Rejection::WrongApp => "app_id",
            Rejection::Stale => "stale",
            Rejection::Future => "future",
        }
    }
}

/// A request that passed every check.
#[derive(Debug, Clone, PartialEq)]
pub enum Verified {
    /// `url_verification`: answer `{"challenge": …}` at once.
    Challenge(String),
    /// An event (or card action) to record.
    Event(Envelope),
}

/// A verified event, ready for the inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// v2 `header.event_id`, v1 `uuid`: the de-duplication key.
    pub event_id: String,
    /// v2 `header.event_type`, v1 `event.type`.
    pub event_type: String,
    /// The decrypted envelope as JSON text — the plaintext's own members, with its
    /// verification token removed — stored as it is.
    pub payload: String,
    /// The section the event belongs to (thread, else chat), when it names one.
    pub section: Option<String>,
    /// The chat message it carries, if any: redeliveries under a new event id act once.
    pub message_id: Option<String>,
}

/// The three signature headers, as received.
#[derive(Debug, Clone, Copy, Default)]
pub struct SignatureHeaders<'a> {
    pub timestamp: Option<&'a str>,
    pub nonce: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// Checks one callback request. `retention` is the de-duplication retention: anything older
/// could be a replay the inbox no longer remembers, so it is refused.
pub fn verify(
    config: &LarkConfig,
    headers: SignatureHeaders<'_>,
    body: &[u8],
    now: DateTime<Utc>,
    retention: Duration,
) -> Result<Verified, Rejection> {
    if body.len() > MAX_BODY {
        return Err(Rejection::TooLarge);
    }
    let encrypt_key = config.encrypt_key.as_ref().map(|k| k.expose_secret());

    // Signature first, over the raw bytes: nothing is parsed before it. Unsigned requests
    // are let through only when small, and only to be accepted as url_verification below.
    let mut signed = false;
    match encrypt_key {
        Some(key) => match (headers.timestamp, headers.nonce, headers.signature) {
            (Some(ts), Some(nonce), Some(sig)) => {
                let expected = signature(ts, nonce, key, body);
                if !same_secret(&expected, &sig.trim().to_ascii_lowercase()) {
                    return Err(Rejection::BadSignature);
                }
                signed = true;
            }
            (None, None, None) if body.len() <= MAX_UNSIGNED_BODY => {}
            _ => return Err(Rejection::BadSignature),
        },
        None if config.allow_unsigned_events => {}
        None => return Err(Rejection::Unsigned),
    }
    let unsigned = encrypt_key.is_some() && !signed;
    // An unsigned request that is not a well-formed url_verification is a signature failure,
    // whatever else is wrong with it.
    let fail = |r: Rejection| if unsigned { Rejection::BadSignature } else { r };

    // One validating pass over the body, one over the plaintext: each object's members are
    // kept as raw JSON text, so the stored envelope is the plaintext itself, less its token.
    let plain: Zeroizing<Vec<u8>>;
    let text: &[u8] = match encrypt_key {
        Some(key) => {
            let outer = Members::parse(body).map_err(|_| fail(Rejection::NotJson))?;
            let sealed = outer
                .get("encrypt")
                .ok_or(fail(Rejection::MissingEncryption))?;
            let b64 = json::as_str(sealed).ok_or(fail(Rejection::MissingFields))?;
            plain = Zeroizing::new(decrypt(key, &b64).map_err(|_| fail(Rejection::BadCiphertext))?);
            &plain
        }
        None => body,
    };
    let members = Members::parse(text).map_err(|_| {
        fail(if encrypt_key.is_some() {
            Rejection::BadCiphertext
        } else {
            Rejection::NotJson
        })
    })?;
    if encrypt_key.is_none() && members.get("encrypt").is_some() {
        return Err(Rejection::UnexpectedEncryption);
    }
    let parsed = parse_envelope(&members, text.len()).map_err(fail)?;
    if parsed.token.is_none() {
        return Err(fail(Rejection::MissingFields));
    }
    if unsigned && !matches!(parsed.kind, Kind::Challenge(_)) {
        return Err(Rejection::BadSignature);
    }

    // Freshness: the signed timestamp header where present, else the event's own time.
    let sent_at = match headers.timestamp {
        Some(ts) if signed => Some(parse_seconds(ts).ok_or(Rejection::MissingFields)?),
        _ => parsed.created_at,
    };
    check(config, &parsed, sent_at, now, retention)?;
    Ok(match parsed.kind {
        Kind::Challenge(c) => Verified::Challenge(c),
        Kind::Event(e) => Verified::Event(e),
    })
}

/// The checks of [`verify`] that still apply to an event received over the long connection,
/// which is neither signed nor encrypted (the connection itself was opened with the app's
/// secret): size, JSON, envelope, app id and freshness (by the event's own time).
///
/// The platform sends `header.token` **empty** on this path, and no official SDK checks it
/// there: an empty or missing token is accepted. A token that is present and not empty must
/// still be the verification token — nothing legitimate sends a different one.
pub fn verify_plain(
    config: &LarkConfig,
    body: &[u8],
    now: DateTime<Utc>,
    retention: Duration,
) -> Result<Envelope, Rejection> {
    if body.len() > MAX_BODY {
        return Err(Rejection::TooLarge);
    }
    let members = Members::parse(body).map_err(|_| Rejection::NotJson)?;
    if members.get("encrypt").is_some() {
        return Err(Rejection::UnexpectedEncryption);
    }
    let mut parsed = parse_envelope(&members, body.len())?;
    if parsed.token.as_ref().is_some_and(|t| t.is_empty()) {
        parsed.token = None;
    }
    check(config, &parsed, parsed.created_at, now, retention)?;
    match parsed.kind {
        Kind::Event(e) => Ok(e),
        Kind::Challenge(_) => Err(Rejection::MissingFields),
    }
}

/// Token (constant time, when the envelope carries one: [`verify`] has already required it),
/// app id, and freshness: too old could be a replay the inbox no longer remembers; too far
/// ahead would stay "fresh" for longer than the inbox remembers it.
fn check(
    config: &LarkConfig,
    parsed: &Parsed,
    sent_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    retention: Duration,
) -> Result<(), Rejection> {
    if let Some(token) = &parsed.token
        && !same_secret(token, config.verification_token.expose_secret())
    {
        return Err(Rejection::BadToken);
    }
    if parsed.app_id.as_ref().is_some_and(|a| *a != config.app_id) {
        return Err(Rejection::WrongApp);
    }
    if let Some(sent_at) = sent_at {
        let age = now.signed_duration_since(sent_at);
        let limit = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        if age > limit {
            return Err(Rejection::Stale);
        }
        let skew = chrono::Duration::from_std(MAX_SKEW).unwrap_or(chrono::Duration::zero());
        if -age > skew {
            return Err(Rejection::Future);
        }
    }
    Ok(())
}

enum Kind {
    Challenge(String),
    Event(Envelope),
}

struct Parsed {
    kind: Kind,
    /// The verification token, when the envelope has one (JSON `null` counts as none).
    token: Option<Zeroizing<String>>,
    /// v2 `header.app_id`, v1 `event.app_id`, when the envelope carries one.
    app_id: Option<String>,
    created_at: Option<DateTime<Utc>>,
}

/// Compares two secrets in constant time over their SHA-256 digests, so that neither the
/// content nor the length of the expected one shows in the timing.
fn same_secret(given: &str, expected: &str) -> bool {
    Sha256::digest(given.as_bytes())
        .ct_eq(&Sha256::digest(expected.as_bytes()))
        .into()
}

/// Tells url_verification, v2 and v1 apart and pulls out what the checks need; for an event,
/// also the envelope to store: the plaintext's own members, less the verification token
/// (`len` is the plaintext's length, to size it).
fn parse_envelope(v: &Members<'_>, len: usize) -> Result<Parsed, Rejection> {
    let owned = |s: Option<std::borrow::Cow<'_, str>>| s.map(std::borrow::Cow::into_owned);
    if v.str("type").as_deref() == Some("url_verification") {
        let challenge = owned(v.str("challenge")).ok_or(Rejection::MissingFields)?;
        let token = owned(v.str("token")).ok_or(Rejection::MissingFields)?;
        return Ok(Parsed {
            kind: Kind::Challenge(challenge),
            token: Some(Zeroizing::new(token)),
            app_id: None,
            created_at: None,
        });
    }
    if v.get("schema").is_some() {
        let header = v.get("header").map(Members::of).unwrap_or_default();
        let event_id = owned(header.str("event_id")).ok_or(Rejection::MissingFields)?;
        let event_type = owned(header.str("event_type")).ok_or(Rejection::MissingFields)?;
        let created_at = match header.get("create_time") {
            None => None,
            Some(t) if t.get() == "null" => None,
            Some(t) => Some(parse_event_time(t).ok_or(Rejection::MissingFields)?),
        };
        let app_id = owned(header.str("app_id"));
        let token = token_of(header.get("token"))?;
        // The header is written back without its token; everything else as it came.
        let mut payload = String::with_capacity(len);
        v.write(&mut payload, &[], &mut |k| {
            (k == "header").then(|| {
                let mut h = String::with_capacity(256);
                header.write(&mut h, &["token"], &mut |_| None);
                h
            })
        });
        let raw_event = v.get("event");
        return event(
            event_id, event_type, token, app_id, created_at, payload, raw_event,
        );
    }
    if v.get("uuid").is_some() {
        let event_id = owned(v.str("uuid")).ok_or(Rejection::MissingFields)?;
        let inner = v.get("event").map(Members::of).unwrap_or_default();
        let event_type = owned(inner.str("type")).ok_or(Rejection::MissingFields)?;
        let created_at = match v.get("ts") {
            None => None,
            Some(t) if t.get() == "null" => None,
            Some(t) => Some(parse_event_time_v1(t).ok_or(Rejection::MissingFields)?),
        };
        let app_id = owned(inner.str("app_id"));
        let token = token_of(v.get("token"))?;
        let mut payload = String::with_capacity(len);
        v.write(&mut payload, &["token"], &mut |_| None);
        let raw_event = v.get("event");
        return event(
            event_id, event_type, token, app_id, created_at, payload, raw_event,
        );
    }
    Err(Rejection::MissingFields)
}

/// An event envelope (v2 or v1) once its fields are pulled out; `payload` is the envelope to
/// store (token already removed), `event` its raw `event` member, which names the section.
fn event(
    event_id: String,
    event_type: String,
    token: Option<Zeroizing<String>>,
    app_id: Option<String>,
    created_at: Option<DateTime<Utc>>,
    payload: String,
    raw_event: Option<&RawValue>,
) -> Result<Parsed, Rejection> {
    if event_id.is_empty() || event_type.is_empty() {
        return Err(Rejection::MissingFields);
    }
    let route = super::event::route(&event_type, raw_event);
    Ok(Parsed {
        kind: Kind::Event(Envelope {
            event_id,
            event_type,
            payload,
            section: route.section,
            message_id: route.message_id,
        }),
        token,
        app_id,
        created_at,
    })
}

/// An envelope's verification token: absent or `null` is none; anything but a string is a
/// malformed envelope.
fn token_of(raw: Option<&RawValue>) -> Result<Option<Zeroizing<String>>, Rejection> {
    match raw {
        None => Ok(None),
        Some(t) if t.get() == "null" => Ok(None),
        Some(t) => json::as_str(t)
            .map(|s| Some(Zeroizing::new(s.into_owned())))
            .ok_or(Rejection::MissingFields),
    }
}

/// `X-Lark-Request-Timestamp`: whole seconds since the epoch.
fn parse_seconds(s: &str) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(s.trim().parse::<i64>().ok()?, 0)
}

/// v2 `header.create_time`: milliseconds as a string (or a number). Card callbacks have been
/// seen with microseconds, so a value too large to be milliseconds is read as microseconds.
fn parse_event_time(v: &RawValue) -> Option<DateTime<Utc>> {
    let n: i64 = match json::as_str(v) {
        Some(s) => s.trim().parse().ok()?,
        None => v.get().parse().ok()?,
    };
    if n > 100_000_000_000_000 {
        DateTime::from_timestamp_micros(n)
    } else {
        DateTime::from_timestamp_millis(n)
    }
}

/// v1 `ts`: seconds, possibly fractional, as a string.
fn parse_event_time_v1(v: &RawValue) -> Option<DateTime<Utc>> {
    let secs: f64 = match json::as_str(v) {
        Some(s) => s.trim().parse().ok()?,
        None => v.get().parse().ok()?,
    };
    if !secs.is_finite() || !(0.0..=1e12).contains(&secs) {
        return None;
    }
    DateTime::from_timestamp(secs as i64, 0)
}

/// Lowercase hex SHA-256(timestamp + nonce + encrypt_key + raw body).
pub fn signature(timestamp: &str, nonce: &str, encrypt_key: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(timestamp.as_bytes());
    h.update(nonce.as_bytes());
    h.update(encrypt_key.as_bytes());
    h.update(body);
    hex::encode(h.finalize())
}

/// Why a ciphertext could not be opened (never says more: padding oracles stay closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ciphertext cannot be decrypted")]
pub struct DecryptError;

fn aes_key(encrypt_key: &str) -> Zeroizing<[u8; 32]> {
    Zeroizing::new(Sha256::digest(encrypt_key.as_bytes()).into())
}

/// Opens an `encrypt` field: base64 → IV (16 bytes) ‖ AES-256-CBC ciphertext, key =
/// SHA-256(encrypt_key), strict PKCS#7.
pub fn decrypt(encrypt_key: &str, b64: &str) -> Result<Vec<u8>, DecryptError> {
    let data = B64.decode(b64.trim()).map_err(|_| DecryptError)?;
    if data.len() < 32 || data.len() % 16 != 0 {
        return Err(DecryptError);
    }
    // Decrypted in place, behind the IV, which is then dropped: no second buffer.
    let mut data = data;
    let key = aes_key(encrypt_key);
    let (iv, ct) = data.split_at_mut(16);
    let dec = cbc::Decryptor::<aes::Aes256>::new_from_slices(key.as_slice(), iv)
        .map_err(|_| DecryptError)?;
    let n = dec
        .decrypt_padded_mut::<Pkcs7>(ct)
        .map_err(|_| DecryptError)?
        .len();
    data.truncate(16 + n);
    data.drain(..16);
    Ok(data)
}

/// The inverse of [`decrypt`], as the platform does it. The service never encrypts what it
/// receives; `sshmode doctor --url`, the tests and the benchmark use this to build the requests
/// Lark would send.
pub fn encrypt(encrypt_key: &str, iv: [u8; 16], plaintext: &[u8]) -> String {
    let key = aes_key(encrypt_key);
    let enc = cbc::Encryptor::<aes::Aes256>::new_from_slices(key.as_slice(), &iv)
        .expect("key and IV have fixed, valid lengths");
    let mut buf = vec![0u8; plaintext.len() + 16];
    buf[..plaintext.len()].copy_from_slice(plaintext);
    let ct = enc
        .encrypt_padded_mut::<Pkcs7>(&mut buf, plaintext.len())
        .expect("the buffer has room for a full padding block")
        .to_vec();
    let mut out = iv.to_vec();
    out.extend_from_slice(&ct);
    B64.encode(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::SecretString;
    use serde_json::{Value, json};

    /// With a key: signed only. Without: unsigned events explicitly allowed.
    fn config(key: Option<&str>) -> LarkConfig {
        LarkConfig {
            app_id: "cli_a".into(),
            app_secret: SecretString::from("s"),
            verification_token: SecretString::from("tok"),
            encrypt_key: key.map(SecretString::from),
            allow_unsigned_events: key.is_none(),
        }
    }

    const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

    /// Verifies an unsigned body with no Encrypt Key configured.
    fn verify_plain(body: &str, at: DateTime<Utc>) -> Result<Verified, Rejection> {
        verify(&config(None), Default::default(), body.as_bytes(), at, WEEK)
    }

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_100, 0).unwrap()
    }

    fn event(token: &str) -> Value {
        json!({"schema":"2.0","header":{"event_id":"ev1","event_type":"im.message.receive_v1",
            "create_time":"1700000000000","token":token,"app_id":"cli_a","tenant_key":"t"},
            "event":{}})
    }

    #[test]
    fn round_trip_and_strict_padding() {
        for len in [0usize, 1, 15, 16, 17, 1000] {
            let msg = vec![b'x'; len];
            let b64 = encrypt("k", [7; 16], &msg);
            assert_eq!(decrypt("k", &b64).unwrap(), msg);
            assert!(decrypt("other", &b64).is_err() || decrypt("other", &b64).unwrap() != msg);
        }
        // A last block whose padding bytes disagree is refused, not trimmed.
        let key = aes_key("k");
        let mut block = [b'a'; 16];
        block[14] = 3;
        block[15] = 2;
        let enc = cbc::Encryptor::<aes::Aes256>::new_from_slices(key.as_slice(), &[0; 16]).unwrap();
        let mut buf = block;
        let ct = enc
            .encrypt_padded_mut::<aes::cipher::block_padding::NoPadding>(&mut buf, 16)
            .unwrap()
            .to_vec();
        let mut data = vec![0u8; 16];
        data.extend(ct);
        assert_eq!(decrypt("k", &B64.encode(data)), Err(DecryptError));
        assert_eq!(decrypt("k", "not base64!"), Err(DecryptError));
        assert_eq!(decrypt("k", &B64.encode([0u8; 20])), Err(DecryptError));
    }

    #[test]
    fn plain_event_passes_and_token_is_removed() {
        let body = event("tok").to_string();
        let v = verify_plain(&body, now()).unwrap();
        let Verified::Event(e) = v else {
            panic!("not an event")
        };
        assert_eq!(e.event_id, "ev1");
        assert_eq!(e.event_type, "im.message.receive_v1");
        let stored: Value = serde_json::from_str(&e.payload).unwrap();
        assert!(stored.pointer("/header/token").is_none());
        assert!(!e.payload.contains("tok\""));
        // Everything else is stored as it came.
        let mut expected = event("tok");
        expected["header"].as_object_mut().unwrap().remove("token");
        assert_eq!(stored, expected);
        let body = event("tik").to_string();
        let r = verify_plain(&body, now());
        assert_eq!(r, Err(Rejection::BadToken));
    }

    #[test]
    fn staleness_uses_header_then_create_time() {
        let body = event("tok").to_string();
        let later = now() + chrono::Duration::days(8);
        let r = verify_plain(&body, later);
        assert_eq!(r, Err(Rejection::Stale));
        let key = "ek";
        let enc = json!({"encrypt": encrypt(key, [1; 16], body.as_bytes())}).to_string();
        let ts = (later.timestamp() - 5).to_string();
        let sig = signature(&ts, "n", key, enc.as_bytes());
        let h = SignatureHeaders {
            timestamp: Some(&ts),
            nonce: Some("n"),
            signature: Some(&sig),
        };
        assert!(verify(&config(Some(key)), h, enc.as_bytes(), later, WEEK).is_ok());
    }

    #[test]
    fn signature_is_checked_before_the_body_is_read() {
        let key = "ek";
        let h = SignatureHeaders {
            timestamp: Some("1700000090"),
            nonce: Some("n"),
            signature: Some("00"),
        };
        let r = verify(&config(Some(key)), h, b"{not json", now(), WEEK);
        assert_eq!(r, Err(Rejection::BadSignature));
        // Unsigned and not a url_verification: a signature failure, whatever the body.
        let r = verify(
            &config(Some(key)),
            Default::default(),
            b"{not json",
            now(),
            WEEK,
        );
        assert_eq!(r, Err(Rejection::BadSignature));
        // Only some of the headers: refused too.
        let h = SignatureHeaders {
            timestamp: Some("1700000090"),
            ..Default::default()
        };
        let body = json!({"encrypt": encrypt(key, [1; 16], event("tok").to_string().as_bytes())});
        let r = verify(
            &config(Some(key)),
            h,
            body.to_string().as_bytes(),
            now(),
            WEEK,
        );
        assert_eq!(r, Err(Rejection::BadSignature));
        assert_eq!(Rejection::BadSignature.status(), 401);
        assert_eq!(Rejection::NotJson.status(), 400);
    }

    #[test]
    fn v1_envelope() {
        let body = json!({"uuid":"u1","token":"tok","ts":"1700000000.123","type":"event_callback",
            "event":{"type":"message"}})
        .to_string();
        let v = verify_plain(&body, now()).unwrap();
        let Verified::Event(e) = v else {
            panic!("not an event")
        };
        assert_eq!(
            (e.event_id.as_str(), e.event_type.as_str()),
            ("u1", "message")
        );
        let stored: Value = serde_json::from_str(&e.payload).unwrap();
        assert!(stored.get("token").is_none());
        assert_eq!(stored["event"]["type"], "message");
    }

    #[test]
    fn without_a_key_nothing_passes_unless_unsigned_events_are_allowed() {
        let mut c = config(None);
        c.allow_unsigned_events = false;
        let challenge = json!({"type":"url_verification","challenge":"c","token":"tok"});
        for body in [event("tok").to_string(), challenge.to_string()] {
            let r = verify(&c, Default::default(), body.as_bytes(), now(), WEEK);
            assert_eq!(r, Err(Rejection::Unsigned));
        }
        assert_eq!(Rejection::Unsigned.status(), 401);
        c.allow_unsigned_events = true;
        let r = verify(
            &c,
            Default::default(),
            challenge.to_string().as_bytes(),
            now(),
            WEEK,
        );
        assert_eq!(r, Ok(Verified::Challenge("c".into())));
    }

    #[test]
    fn an_unsigned_request_is_parsed_only_when_small() {
        let c = config(Some("ek"));
        let challenge = json!({"type":"url_verification","challenge":"c","token":"tok"});
        let sealed = encrypt("ek", [2; 16], challenge.to_string().as_bytes());
        let small = json!({ "encrypt": sealed }).to_string();
        let r = verify(&c, Default::default(), small.as_bytes(), now(), WEEK);
        assert_eq!(r, Ok(Verified::Challenge("c".into())));
        // The same url_verification, padded past the bound, is not even parsed.
        let big = format!("{small}{}", " ".repeat(MAX_UNSIGNED_BODY));
        let r = verify(&c, Default::default(), big.as_bytes(), now(), WEEK);
        assert_eq!(r, Err(Rejection::BadSignature));
    }

    #[test]
    fn a_request_from_the_future_is_refused() {
        let body = event("tok").to_string();
        let created = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        // Four minutes of skew pass; six do not.
        let early = created - chrono::Duration::minutes(4);
        assert!(verify_plain(&body, early).is_ok());
        let too_early = created - chrono::Duration::minutes(6);
        assert_eq!(verify_plain(&body, too_early), Err(Rejection::Future));
        // The signed timestamp header is judged the same way.
        let key = "ek";
        let enc = json!({"encrypt": encrypt(key, [1; 16], body.as_bytes())}).to_string();
        let ts = (now().timestamp() + 3600).to_string();
        let sig = signature(&ts, "n", key, enc.as_bytes());
        let h = SignatureHeaders {
            timestamp: Some(&ts),
            nonce: Some("n"),
            signature: Some(&sig),
        };
        let r = verify(&config(Some(key)), h, enc.as_bytes(), now(), WEEK);
        assert_eq!(r, Err(Rejection::Future));
    }

    #[test]
    fn an_event_for_another_app_is_refused() {
        let mut other = event("tok");
        other["header"]["app_id"] = json!("cli_other");
        let r = verify_plain(&other.to_string(), now());
        assert_eq!(r, Err(Rejection::WrongApp));
        // No app id in the envelope: nothing to compare.
        let mut none = event("tok");
        none["header"].as_object_mut().unwrap().remove("app_id");
        assert!(verify_plain(&none.to_string(), now()).is_ok());
        let v1 = json!({"uuid":"u1","token":"tok","ts":"1700000000","type":"event_callback",
            "event":{"type":"message","app_id":"cli_other"}});
        assert_eq!(
            verify_plain(&v1.to_string(), now()),
            Err(Rejection::WrongApp)
        );
    }

    /// The long connection's form, as the platform sends it: `header.token` empty (or absent).
    #[test]
    fn the_long_connection_accepts_an_empty_or_missing_token_and_refuses_a_wrong_one() {
        let long = |body: &Value, at| {
            super::verify_plain(&config(None), body.to_string().as_bytes(), at, WEEK)
        };
        let e = long(&event(""), now()).expect("the platform's empty token");
        assert_eq!(e.event_id, "ev1");
        let mut missing = event("");
        missing["header"].as_object_mut().unwrap().remove("token");
        assert!(long(&missing, now()).is_ok());
        let mut null = event("");
        null["header"]["token"] = Value::Null;
        assert!(long(&null, now()).is_ok());
        // The right token still passes; a wrong one, or one that is not a string, does not.
        assert!(long(&event("tok"), now()).is_ok());
        assert_eq!(long(&event("tik"), now()), Err(Rejection::BadToken));
        let mut number = event("");
        number["header"]["token"] = json!(7);
        assert_eq!(long(&number, now()), Err(Rejection::MissingFields));
        // App id and freshness still apply without a token.
        let mut other = event("");
        other["header"]["app_id"] = json!("cli_other");
        assert_eq!(long(&other, now()), Err(Rejection::WrongApp));
        let later = now() + chrono::Duration::days(8);
        assert_eq!(long(&event(""), later), Err(Rejection::Stale));
        // The webhook is not relaxed: an empty or missing token is refused there.
        assert_eq!(
            verify_plain(&event("").to_string(), now()),
            Err(Rejection::BadToken)
        );
        assert_eq!(
            verify_plain(&missing.to_string(), now()),
            Err(Rejection::MissingFields)
        );
        assert_eq!(
            verify_plain(&null.to_string(), now()),
            Err(Rejection::MissingFields)
        );
    }

    #[test]
    fn secrets_compare_by_content_only() {
        assert!(same_secret("tok", "tok"));
        for other in ["", "to", "tok ", "tok\0", "TOK"] {
            assert!(!same_secret(other, "tok"), "{other:?}");
        }
    }
}
