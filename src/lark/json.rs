//! Borrowed views of JSON objects for the callback path: an object's members as raw JSON
//! text, read in one validating pass without building a `serde_json::Value`, so an event can be
//! checked and stored as the bytes it arrived in. Never decides what a field means.
//!
//! The accessors answer as `Value::get` / `Value::as_str` would: a missing member, a member of
//! another JSON type, or any JSON value that is not an object, reads as nothing.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// The members of one JSON object, in order, each value as its raw (validated) JSON text.
/// Any other JSON value parses as an object without members.
#[derive(Debug, Default)]
pub struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Members<'a> {
    /// Parses `text`, which must be one JSON value; every nested value is validated too.
    pub fn parse(text: &'a [u8]) -> Result<Members<'a>, serde_json::Error> {
        serde_json::from_slice(text)
    }

    /// Parses a member's raw value as an object (nothing when it is not one).
    pub fn of(raw: &'a RawValue) -> Members<'a> {
        // Raw values were validated when their parent was parsed.
        Members::parse(raw.get().as_bytes()).unwrap_or_default()
    }

    /// The member `name` — the last one, when the text repeats it, as `serde_json::Value` and
    /// PostgreSQL's `jsonb` keep the last.
    pub fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
    }

    /// The member `name` when it is a string.
    pub fn str(&self, name: &str) -> Option<Cow<'a, str>> {
        self.get(name).and_then(as_str)
    }

    /// Writes the object back as JSON text without the members `drop` names, replacing the
    /// value of a member by `replace(name)` where that gives one. Repeated names keep only
    /// their last member, as a parse would.
    pub fn write(
        &self,
        out: &mut String,
        drop: &[&str],
        replace: &mut dyn FnMut(&str) -> Option<String>,
    ) {
        out.push('{');
        let mut first = true;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if drop.contains(&k.as_ref()) || self.0[i + 1..].iter().any(|(later, _)| later == k) {
                continue;
            }
            if !first {
                out.push(',');
            }
            first = false;
            // A key is a string: serialising one cannot fail.
            out.push_str(&serde_json::to_string(k.as_ref()).unwrap_or_default());
            out.push(':');
            match replace(k) {
                Some(value) => out.push_str(&value),
                None => out.push_str(v.get()),
            }
        }
        out.push('}');
    }
}

/// A raw value as a string, when it is one (borrowed unless it contains escapes).
pub fn as_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
    if !text.starts_with('"') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(text);
    de.deserialize_str(CowStr).ok()
}

/// A string, borrowed from the input where it has no escapes.
struct CowStr;

impl<'de> Visitor<'de> for CowStr {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(CowStr).map(Key)
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MembersVisitor)
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8).min(64));
        while let Some(Key(k)) = map.next_key()? {
            members.push((k, map.next_value::<&'de RawValue>()?));
        }
        Ok(Members(members))
    }

    // Any other JSON value: validated, and read as an object without members.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Members::default())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Members::default())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Members::default())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Members::default())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Members::default())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Members::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Members::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn members_read_as_value_would() {
        let text = br#"{"a":"x","b":{"c":[1,2]},"a":"y","e":"q\"\u00e9","n":null}"#;
        let m = Members::parse(text).unwrap();
        assert_eq!(m.str("a").as_deref(), Some("y"));
        assert!(matches!(m.str("a"), Some(Cow::Borrowed(_))));
        assert_eq!(m.str("e").as_deref(), Some("q\"é"));
        assert_eq!(m.str("b"), None);
        assert_eq!(m.str("n"), None);
        assert!(m.get("n").is_some());
        assert!(m.get("zz").is_none());
        assert_eq!(
            Members::of(m.get("b").unwrap()).get("c").unwrap().get(),
            "[1,2]"
        );
        // Not an object: no members, but still valid JSON.
        for other in [&b"[1,{}]"[..], b"\"s\"", b"1.5", b"true", b"null"] {
            assert!(Members::parse(other).unwrap().0.is_empty());
        }
        // Invalid anywhere, however deep: refused.
        for bad in [
            &b"{\"a\":[1,}"[..],
            b"{\"a\":\"\x01\"}",
            b"{} x",
            b"{\"a\":\"\xff\"}",
        ] {
            assert!(
                Members::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn write_drops_replaces_and_keeps_the_last_of_repeated_members() {
        let text = br#"{"k\"ey":1,"drop":2,"r":{"x":1},"k\"ey":3}"#;
        let m = Members::parse(text).unwrap();
        let mut out = String::new();
        m.write(&mut out, &["drop"], &mut |k| {
            (k == "r").then(|| "\"replaced\"".to_string())
        });
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v, json!({"k\"ey": 3, "r": "replaced"}));
    }
}
