//! `config.local`: the options a task gives the local cloud.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::ZONES;

/// What is wrong with a task's `config.local`: the message of an
/// invalid-request error.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum ConfigError {
    /// `config.local` is not a mapping.
    #[error("config.local must be a mapping with keys {}, got {got}", KNOWN_KEYS.join(", "))]
    NotAMapping {
        /// What it is instead.
        got: &'static str,
    },
    /// A key the local cloud does not know.
    #[error("config.local.{key} is not an option of the local cloud; it knows {}", KNOWN_KEYS.join(", "))]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// `config.local.<path>` has the wrong shape or value.
    #[error("config.local.{path} must be {expected}{}", got.as_ref().map(|g| format!(", got {g}")).unwrap_or_default())]
    Invalid {
        /// Where, below `config.local`.
        path: String,
        /// What it must be.
        expected: String,
        /// What it is, where that helps.
        got: Option<String>,
    },
    /// A zone the local cloud does not have.
    #[error("config.local.capacity.{zone}: no such zone; the local cloud has {}", ZONES.join(", "))]
    UnknownZone {
        /// The zone.
        zone: String,
    },
    /// A key of one `preemptions` entry that is not an option.
    #[error("config.local.preemptions[{index}].{key} is not an option; use after_s and notice_s")]
    UnknownPreemptionKey {
        /// The entry.
        index: usize,
        /// The key.
        key: String,
    },
    /// A `preemptions` entry without `after_s`.
    #[error("config.local.preemptions[{index}] needs after_s")]
    NoAfter {
        /// The entry.
        index: usize,
    },
}

fn invalid(
    path: impl Into<String>,
    expected: impl Into<String>,
    got: Option<String>,
) -> ConfigError {
    ConfigError::Invalid {
        path: path.into(),
        expected: expected.into(),
        got,
    }
}

/// Nodes a zone can run at once when the task does not say.
pub(crate) const DEFAULT_CAPACITY: u64 = 256;

/// Every key `config.local` may have.
pub(crate) const KNOWN_KEYS: &[&str] = &[
    "capacity",
    "topology",
    "seed",
    "preempt_after_s",
    "notice_s",
    "boot_s",
    "preemptions",
    "preempt_nodes",
    "addresses",
];

/// The variable that picks [`Addresses`] where a task's `config.local`
/// does not (a CI pass runs the whole local suite in single-address mode
/// with it); the same values as `config.local.addresses`.
pub const ADDRESSES_ENV: &str = "GANGWAY_LOCAL_ADDRESSES";

/// How nodes are told apart on the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addresses {
    /// `per-node` where this machine answers on the whole of 127.0.0.0/8
    /// (Linux), else `single` (macOS without aliases).
    Auto,
    /// Each node its own loopback address in 127.0.0.0/8.
    PerNode,
    /// Every node on 127.0.0.1 with a port range of its own.
    Single,
}

impl Addresses {
    /// `single`, `per-node` or `auto`.
    pub fn parse(text: &str) -> Option<Addresses> {
        match text {
            "auto" => Some(Addresses::Auto),
            "per-node" => Some(Addresses::PerNode),
            "single" => Some(Addresses::Single),
            _ => None,
        }
    }
}

/// How many running nodes each zone takes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Capacity {
    /// The same limit in every zone.
    All(u64),
    /// Per zone; zones not named get [`DEFAULT_CAPACITY`].
    PerZone(BTreeMap<String, u64>),
}

/// `config.local`, checked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LocalConfig {
    /// `capacity`.
    pub capacity: Capacity,
    /// `topology`: switch paths by launch index.
    pub topology: Option<Vec<String>>,
    /// `seed`: shuffles the order nodes and addresses come back in.
    pub seed: Option<u64>,
    /// `preempt_after_s` (spot launches only).
    pub preempt_after_s: Option<f64>,
    /// `notice_s`: how long before the preemption its notice appears.
    pub notice_s: f64,
    /// `boot_s`: how long a launch takes to return, as a cloud's boot does.
    pub boot_s: f64,
    /// `preemptions`: `(after_s, notice_s)` for the 1st, 2nd, ... launch of
    /// a cluster name (spot only); later launches are not preempted.
    pub preemptions: Option<Vec<(f64, f64)>>,
    /// `preempt_nodes`: how many of a preempted launch's new nodes are
    /// preempted (the first ones it creates); all when absent. One node
    /// of a gang lost, as a spot market takes single machines.
    pub preempt_nodes: Option<u32>,
    /// `addresses`: `None` when the task does not say.
    pub addresses: Option<Addresses>,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            capacity: Capacity::All(DEFAULT_CAPACITY),
            topology: None,
            seed: None,
            preempt_after_s: None,
            notice_s: 0.0,
            boot_s: 0.0,
            preemptions: None,
            preempt_nodes: None,
            addresses: None,
        }
    }
}

impl LocalConfig {
    /// Running nodes `zone` takes.
    pub fn capacity(&self, zone: &str) -> u64 {
        match &self.capacity {
            Capacity::All(n) => *n,
            Capacity::PerZone(m) => m.get(zone).copied().unwrap_or(DEFAULT_CAPACITY),
        }
    }

    /// Parses `config.local`; `None` and `null` are the defaults.
    pub fn parse(value: Option<&Value>) -> Result<LocalConfig, ConfigError> {
        let mut cfg = LocalConfig::default();
        let map = match value {
            None | Some(Value::Null) => return Ok(cfg),
            Some(Value::Object(map)) => map,
            Some(other) => {
                return Err(ConfigError::NotAMapping {
                    got: kind_of(other),
                })
            }
        };
        for (key, v) in map {
            match key.as_str() {
                "capacity" => cfg.capacity = parse_capacity(v)?,
                "topology" => cfg.topology = Some(parse_topology(v)?),
                "seed" => {
                    cfg.seed = Some(v.as_u64().ok_or_else(|| {
                        invalid("seed", "a non-negative integer", Some(kind_of(v).into()))
                    })?)
                }
                "preempt_after_s" => cfg.preempt_after_s = Some(seconds("preempt_after_s", v)?),
                "notice_s" => cfg.notice_s = seconds("notice_s", v)?,
                "boot_s" => cfg.boot_s = seconds("boot_s", v)?,
                "preemptions" => cfg.preemptions = Some(parse_preemptions(v)?),
                "preempt_nodes" => {
                    cfg.preempt_nodes = Some(
                        v.as_u64()
                            .filter(|n| *n > 0)
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| {
                                invalid(
                                    "preempt_nodes",
                                    "a positive integer",
                                    Some(kind_of(v).into()),
                                )
                            })?,
                    )
                }
                "addresses" => {
                    cfg.addresses =
                        Some(v.as_str().and_then(Addresses::parse).ok_or_else(|| {
                            invalid(
                                "addresses",
                                "single, per-node or auto",
                                Some(match v {
                                    Value::String(s) => format!("{s:?}"),
                                    other => kind_of(other).to_owned(),
                                }),
                            )
                        })?)
                }
                other => return Err(ConfigError::UnknownKey { key: other.into() }),
            }
        }
        Ok(cfg)
    }
}

fn parse_preemptions(v: &Value) -> Result<Vec<(f64, f64)>, ConfigError> {
    let shape = || {
        invalid(
            "preemptions",
            "a list of {after_s: N, notice_s: N} (notice_s optional), one per launch of the cluster",
            None,
        )
    };
    let list = v.as_array().ok_or_else(shape)?;
    let mut out = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let m = item.as_object().ok_or_else(shape)?;
        for k in m.keys() {
            if k != "after_s" && k != "notice_s" {
                return Err(ConfigError::UnknownPreemptionKey {
                    index: i,
                    key: k.clone(),
                });
            }
        }
        let after = m.get("after_s").ok_or(ConfigError::NoAfter { index: i })?;
        let after = seconds(&format!("preemptions[{i}].after_s"), after)?;
        let notice = match m.get("notice_s") {
            Some(n) => seconds(&format!("preemptions[{i}].notice_s"), n)?,
            None => 0.0,
        };
        out.push((after, notice));
    }
    Ok(out)
}

fn parse_capacity(v: &Value) -> Result<Capacity, ConfigError> {
    let shape = || {
        invalid(
            "capacity",
            format!(
                "a non-negative integer or a mapping from zone ({}) to one",
                ZONES.join(", ")
            ),
            Some(kind_of(v).into()),
        )
    };
    match v {
        Value::Number(n) => n.as_u64().map(Capacity::All).ok_or_else(shape),
        Value::Object(m) => {
            let mut zones = BTreeMap::new();
            for (zone, n) in m {
                if !ZONES.contains(&zone.as_str()) {
                    return Err(ConfigError::UnknownZone { zone: zone.clone() });
                }
                let n = n.as_u64().ok_or_else(|| {
                    invalid(
                        format!("capacity.{zone}"),
                        "a non-negative integer",
                        Some(kind_of(n).into()),
                    )
                })?;
                zones.insert(zone.clone(), n);
            }
            Ok(Capacity::PerZone(zones))
        }
        _ => Err(shape()),
    }
}

fn parse_topology(v: &Value) -> Result<Vec<String>, ConfigError> {
    let shape = || {
        invalid(
            "topology",
            "a list of switch paths like \"spine1/leaf2\"",
            Some(kind_of(v).into()),
        )
    };
    let list = v.as_array().ok_or_else(shape)?;
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            item.as_str().map(str::to_owned).ok_or_else(|| {
                invalid(
                    format!("topology[{i}]"),
                    "a switch path like \"spine1/leaf2\"",
                    Some(kind_of(item).into()),
                )
            })
        })
        .collect()
}

fn seconds(key: &str, v: &Value) -> Result<f64, ConfigError> {
    match v.as_f64() {
        Some(s) if (0.0..1e9).contains(&s) => Ok(s),
        _ => Err(invalid(
            key,
            "a number of seconds >= 0",
            Some(match v {
                Value::Number(n) => n.to_string(),
                other => kind_of(other).to_owned(),
            }),
        )),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Splits a switch path, `"spine1/leaf2"` ⇒ `["spine1", "leaf2"]`.
pub(crate) fn split_path(path: &str) -> Vec<String> {
    path.split('/')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_full() {
        assert_eq!(LocalConfig::parse(None).unwrap(), LocalConfig::default());
        assert_eq!(
            LocalConfig::parse(Some(&Value::Null)).unwrap(),
            LocalConfig::default()
        );
        let c = LocalConfig::parse(Some(&json!({
            "capacity": {"local-a": 2},
            "topology": ["s1/l1", "s1/l2"],
            "seed": 7,
            "preempt_after_s": 1,
            "notice_s": 0.5
        })))
        .unwrap();
        assert_eq!(c.capacity("local-a"), 2);
        assert_eq!(c.capacity("local-b"), DEFAULT_CAPACITY);
        assert_eq!(c.seed, Some(7));
        assert_eq!(c.preempt_after_s, Some(1.0));
        assert_eq!(c.notice_s, 0.5);
        assert_eq!(c.addresses, None);
        let c = LocalConfig::parse(Some(&json!({"addresses": "single"}))).unwrap();
        assert_eq!(c.addresses, Some(Addresses::Single));
        let c = LocalConfig::parse(Some(&json!({"capacity": 3}))).unwrap();
        assert_eq!(c.capacity("local-c"), 3);
    }

    #[test]
    fn bad_values_name_the_key() {
        for (v, needle) in [
            (json!({"capacity": "lots"}), "config.local.capacity"),
            (json!({"capacity": -1}), "config.local.capacity"),
            (
                json!({"capacity": {"local-z": 1}}),
                "config.local.capacity.local-z",
            ),
            (
                json!({"capacity": {"local-a": 1.5}}),
                "config.local.capacity.local-a",
            ),
            (json!({"topology": "s1/l1"}), "config.local.topology"),
            (json!({"topology": [1]}), "config.local.topology[0]"),
            (json!({"seed": "x"}), "config.local.seed"),
            (
                json!({"preempt_after_s": -1}),
                "config.local.preempt_after_s",
            ),
            (json!({"notice_s": "soon"}), "config.local.notice_s"),
            (json!({"capactiy": 1}), "config.local.capactiy"),
            (json!([1]), "config.local must be a mapping"),
            (json!({"addresses": "many"}), "config.local.addresses"),
            (json!({"addresses": 1}), "config.local.addresses"),
        ] {
            let e = LocalConfig::parse(Some(&v)).unwrap_err().to_string();
            assert!(e.contains(needle), "{v}: {e}");
        }
    }

    #[test]
    fn paths_split_on_slash() {
        assert_eq!(split_path("spine1/leaf2"), vec!["spine1", "leaf2"]);
        assert!(split_path("").is_empty());
        assert_eq!(split_path("/a//b/"), vec!["a", "b"]);
    }
}
