//! A tool call's arguments, checked: each accessor names the tool and the argument in the
//! error the model receives, so a call that does not fit its schema comes back as a tool error
//! the model can act on.

use serde_json::{Map, Value};

/// The argument object of one call of `tool`.
pub struct Args<'a> {
    tool: &'a str,
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    pub fn new(tool: &'a str, map: &'a Map<String, Value>) -> Args<'a> {
        Args { tool, map }
    }

    /// The error text for a call of this tool.
    pub fn bad(&self, msg: String) -> String {
        format!("invalid arguments for `{}`: {msg}", self.tool)
    }

    /// A required string.
    pub fn str(&self, name: &str) -> Result<String, String> {
        match self.map.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(self.bad(format!("`{name}` must be a string"))),
            None => Err(self.bad(format!("`{name}` is required"))),
        }
    }

    pub fn opt_str(&self, name: &str) -> Result<Option<String>, String> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.bad(format!("`{name}` must be a string"))),
        }
    }

    /// An optional positive integer (a float is taken at its whole part).
    pub fn opt_u64(&self, name: &str) -> Result<Option<u64>, String> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v
                .as_u64()
                .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
            {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.bad(format!("`{name}` must be a positive integer"))),
            },
        }
    }

    /// An optional flag, false when absent.
    /// An optional object of string values (`{"NAME": "value"}`), in the order given; at
    /// most `max` entries. Error messages name the key, never a value.
    pub fn opt_string_map(&self, name: &str, max: usize) -> Result<Vec<(String, String)>, String> {
        let Some(v) = self.map.get(name) else {
            return Ok(Vec::new());
        };
        let Some(obj) = v.as_object() else {
            return Err(self.bad(format!("`{name}` must be an object of strings")));
        };
        if obj.len() > max {
            return Err(self.bad(format!(
                "`{name}` holds {} entries; at most {max}",
                obj.len()
            )));
        }
        obj.iter()
            .map(|(k, v)| match v.as_str() {
                Some(s) => Ok((k.clone(), s.to_string())),
                None => Err(self.bad(format!("`{name}.{k}` must be a string"))),
            })
            .collect()
    }

    pub fn opt_bool(&self, name: &str) -> Result<bool, String> {
        match self.map.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(self.bad(format!("`{name}` must be true or false"))),
        }
    }

    /// A required positive id, as a number or a numeric string.
    pub fn id(&self, name: &str) -> Result<i64, String> {
        let v = self
            .map
            .get(name)
            .ok_or_else(|| self.bad(format!("`{name}` is required")))?;
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .filter(|n| *n > 0)
            .ok_or_else(|| self.bad(format!("`{name}` must be a positive integer")))
    }

    /// Refuses properties the schema does not list.
    pub fn only(&self, allowed: &[&str]) -> Result<(), String> {
        match self.map.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(self.bad(format!(
                "unknown argument `{k}` (allowed: {})",
                allowed.join(", ")
            ))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn each_accessor_names_the_tool_and_the_argument() {
        let m = map(json!({"path": 3, "limit": -2, "all": "yes", "id": "17", "x": null}));
        let a = Args::new("read_file", &m);
        assert_eq!(
            a.str("path").unwrap_err(),
            "invalid arguments for `read_file`: `path` must be a string"
        );
        assert_eq!(
            a.str("content").unwrap_err(),
            "invalid arguments for `read_file`: `content` is required"
        );
        assert!(
            a.opt_u64("limit")
                .unwrap_err()
                .contains("`limit` must be a positive integer")
        );
        assert!(
            a.opt_bool("all")
                .unwrap_err()
                .contains("`all` must be true or false")
        );
        assert_eq!(a.id("id"), Ok(17));
        assert_eq!(a.opt_str("x"), Ok(None));
        assert_eq!(a.opt_u64("missing"), Ok(None));
        assert_eq!(
            a.only(&["path", "limit", "id", "x"]).unwrap_err(),
            "invalid arguments for `read_file`: unknown argument `all` (allowed: path, limit, id, x)"
        );
        let ok = map(json!({"offset": 2.0, "replace_all": true}));
        let a = Args::new("patch", &ok);
        assert_eq!(a.opt_u64("offset"), Ok(Some(2)));
        assert_eq!(a.opt_bool("replace_all"), Ok(true));
        assert_eq!(a.only(&["offset", "replace_all"]), Ok(()));
    }
}
