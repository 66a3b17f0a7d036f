//! The environment layer: which `THREADGATE_*` variable sets which key, and the value
//! it gives that key.
//!
//! The rule: `THREADGATE_` and the key's path in capitals, sections joined by `__`
//! (`[sessions] max_pending_holds` is `THREADGATE_SESSIONS__MAX_PENDING_HOLDS`, the
//! top-level `data_dir` is `THREADGATE_DATA_DIR`). The keys are those of the defaults
//! written out, so a key added to a settings struct is settable at once. A key whose
//! default is text takes the variable's text as it is; any other takes a TOML value
//! (`5`, `true`, `["a", "b"]`); an optional key is left unset by an empty value. A few
//! older short names ([`ALIASES`]) stay. A variable with `__` that names no key is an
//! error, and so is a table's key written with one `_` (`THREADGATE_SESSIONS_MAX_LIVE`);
//! any other is left alone (other tools share the prefix, such as
//! `THREADGATE_LOG_FORMAT`). The two secrets are not keys: they are read apart from
//! the layering ([`MASTER_KEY_VAR`], [`SIGNING_SECRET_VAR`]) so no error can show them.

use std::collections::BTreeMap;

use figment::value::{Dict, Empty, Tag, Value};
use figment::{Metadata, Profile, Provider, Source};

use super::{ConfigError, Origin, Settings};

/// The prefix of every variable threadgate reads.
pub(super) const PREFIX: &str = "THREADGATE_";

/// The master key of the secrets store (base64), never a key of the file.
pub(super) const MASTER_KEY_VAR: &str = "THREADGATE_MASTER_KEY";

/// Plain's webhook signing secret, never a key of the file.
pub(super) const SIGNING_SECRET_VAR: &str = "THREADGATE_PLAIN_SIGNING_SECRET";

/// Older short names that set a key beside the rule's name (setting both to different
/// values is an error).
pub(super) const ALIASES: &[(&str, &str)] = &[
    ("THREADGATE_POLICY", "policy_file"),
    ("THREADGATE_REPO", "repo.path"),
    ("THREADGATE_IMAGE", "sandbox.image"),
    ("THREADGATE_SANDBOX_IMAGE", "sandbox.image"),
    ("THREADGATE_METRICS_LISTEN", "telemetry.metrics_listen"),
    ("THREADGATE_OTLP_ENDPOINT", "telemetry.otlp_endpoint"),
    ("THREADGATE_MAX_LIVE_SESSIONS", "sessions.max_live"),
    ("THREADGATE_DATABASE_URL", "store.url"),
];

/// A key whose value `off` also leaves it unset, as it always has.
const OFF_MEANS_UNSET: &str = "telemetry.metrics_listen";

/// Every key of the settings file with its default, by dotted path
/// (`sessions.max_live`), sorted.
pub(super) fn schema() -> Result<BTreeMap<String, Value>, ConfigError> {
    let defaults = Value::serialize(Settings::default()).map_err(|e| ConfigError::Value {
        key: "settings".into(),
        origin: Origin::Defaults,
        message: e.to_string(),
    })?;
    let mut keys = BTreeMap::new();
    if let Value::Dict(_, dict) = defaults {
        collect_leaves("", dict, &mut keys);
    }
    for (table, template) in optional_tables()? {
        keys.remove(table);
        if let Value::Dict(_, dict) = template {
            collect_leaves(table, dict, &mut keys);
        }
    }
    Ok(keys)
}

/// The tables that are unset by default (`[review.oidc]`): their keys, and the kind of
/// value each takes, come from a template written out in the table's place. Setting
/// one of them from the environment sets the table, which then needs its required keys
/// like a table in the file (a missing one is an error naming it).
pub(super) fn optional_tables() -> Result<Vec<(&'static str, Value)>, ConfigError> {
    let oidc = crate::review::oidc::OidcSettings::new("", "");
    let written = Value::serialize(oidc).map_err(|e| ConfigError::Value {
        key: "review.oidc".into(),
        origin: Origin::Defaults,
        message: e.to_string(),
    })?;
    Ok(vec![("review.oidc", written)])
}

fn collect_leaves(prefix: &str, dict: Dict, into: &mut BTreeMap<String, Value>) {
    for (name, value) in dict {
        let key = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            Value::Dict(_, inner) => collect_leaves(&key, inner, into),
            leaf => {
                into.insert(key, leaf);
            }
        }
    }
}

/// The variable the rule gives `key` (`sessions.max_live` →
/// `THREADGATE_SESSIONS__MAX_LIVE`).
pub(super) fn variable_of(key: &str) -> String {
    format!("{PREFIX}{}", key.replace('.', "__").to_uppercase())
}

/// One variable as a figment provider: its metadata names the variable, so an error
/// in its value names it too.
pub(super) struct EnvVar {
    name: String,
    key: String,
    value: Value,
    /// The variable's text, to let an older name and the new one agree.
    raw: String,
}

impl Provider for EnvVar {
    fn metadata(&self) -> Metadata {
        Metadata::named("environment variable").source(Source::Custom(self.name.clone()))
    }

    fn data(&self) -> Result<figment::value::Map<Profile, Dict>, figment::Error> {
        let nested = figment::util::nest(&self.key, self.value.clone());
        Ok(Profile::Default.collect(nested.into_dict().unwrap_or_default()))
    }
}

/// The layer of the environment `vars`: one [`EnvVar`] per variable that sets a key.
/// Refuses a variable with `__` that names no key (or a table's key with one `_`), a key
/// set by two variables to different values, and a setting's variable that is not UTF-8.
pub(super) fn layer(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<Vec<EnvVar>, ConfigError> {
    let schema = schema()?;
    let mut by_key: BTreeMap<String, EnvVar> = BTreeMap::new();
    for (name, value) in vars {
        let Some(name) = name.to_str().filter(|n| n.starts_with(PREFIX)) else {
            continue;
        };
        if name == MASTER_KEY_VAR || name == SIGNING_SECRET_VAR {
            continue;
        }
        let Some(key) = setting_key(name, &schema)? else {
            continue;
        };
        let raw = value.into_string().map_err(|_| ConfigError::Value {
            key: key.clone(),
            origin: Origin::Env {
                name: name.to_owned(),
            },
            message: "not valid UTF-8".into(),
        })?;
        if let Some(first) = by_key.get(&key) {
            if first.raw == raw {
                continue;
            }
            return Err(ConfigError::Conflict {
                key,
                first: first.name.clone(),
                second: name.to_owned(),
            });
        }
        let Some(default) = schema.get(&key) else {
            return Err(ConfigError::UnknownVariable {
                name: name.to_owned(),
            });
        };
        let value = typed(default, &key, &raw);
        by_key.insert(
            key.clone(),
            EnvVar {
                name: name.to_owned(),
                key,
                value,
                raw,
            },
        );
    }
    Ok(by_key.into_values().collect())
}

/// The key `name` sets, if any (see the module's rule).
fn setting_key(
    name: &str,
    schema: &BTreeMap<String, Value>,
) -> Result<Option<String>, ConfigError> {
    if let Some((_, key)) = ALIASES.iter().find(|(alias, _)| *alias == name) {
        return Ok(Some((*key).to_owned()));
    }
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return Ok(None);
    };
    let key = rest.to_lowercase().replace("__", ".");
    if schema.contains_key(&key) {
        return Ok(Some(key));
    }
    if rest.contains("__") {
        return Err(ConfigError::UnknownVariable {
            name: name.to_owned(),
        });
    }
    let written_flat = schema
        .keys()
        .find(|k| k.contains('.') && k.replace('.', "_") == key);
    match written_flat {
        Some(meant) => Err(ConfigError::Misspelt {
            name: name.to_owned(),
            meant: variable_of(meant),
        }),
        None => Ok(None),
    }
}

/// The value `raw` gives a key whose default is `default`.
fn typed(default: &Value, key: &str, raw: &str) -> Value {
    match default {
        Value::String(..) => Value::from(raw),
        Value::Empty(..) => {
            let unset = raw.trim().is_empty() || (key == OFF_MEANS_UNSET && raw.trim() == "off");
            if unset {
                Value::Empty(Tag::Default, Empty::None)
            } else {
                Value::from(raw)
            }
        }
        _ => raw
            .parse::<toml::Value>()
            .ok()
            .and_then(|v| Value::serialize(v).ok())
            .unwrap_or_else(|| Value::from(raw)),
    }
}

/// One row of the documentation: a key, its variable, its older names and default.
#[cfg(test)]
pub(super) struct EnvKey {
    pub(super) key: String,
    pub(super) variable: String,
    pub(super) aliases: Vec<&'static str>,
    pub(super) default: String,
}

/// Every key with its variable, for the README's table and its test.
#[cfg(test)]
pub(super) fn env_keys() -> Vec<EnvKey> {
    let schema = schema().expect("the defaults are written out");
    schema
        .into_iter()
        .map(|(key, default)| EnvKey {
            variable: variable_of(&key),
            aliases: ALIASES
                .iter()
                .filter(|(_, k)| *k == key)
                .map(|(alias, _)| *alias)
                .collect(),
            default: show(&default),
            key,
        })
        .collect()
}

#[cfg(test)]
fn show(value: &Value) -> String {
    match value {
        Value::String(_, s) if s.is_empty() => "(empty)".into(),
        Value::String(_, s) => s.clone(),
        Value::Empty(..) => "(unset)".into(),
        Value::Num(_, n) => n
            .to_u128()
            .map(|n| n.to_string())
            .or_else(|| n.to_i128().map(|n| n.to_string()))
            .unwrap_or_default(),
        Value::Bool(_, b) => b.to_string(),
        Value::Array(_, items) => {
            let items: Vec<String> = items.iter().map(|v| format!("{:?}", show(v))).collect();
            format!("[{}]", items.join(", "))
        }
        other => format!("{other:?}"),
    }
}
