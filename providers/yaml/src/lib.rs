//! Located YAML: a small tree that remembers where every node came from,
//! and the helpers that turn it into precise errors (`file:line:col:
//! field.path: message`, with a did-you-mean hint). The task parser and the
//! providers' configuration files (ssh pools, Slurm clusters) share it.
#![deny(missing_docs)]

use std::fmt;
use std::path::Path;

mod tree;

pub use tree::*;

/// Why a YAML file (a task, a provider's configuration) was refused:
/// where, which field, what is wrong, and what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct LocatedError {
    /// The file (or `<string>`).
    pub file: String,
    /// 1-based line, 0 when the error is about the whole file.
    pub line: usize,
    /// 1-based column, 0 when the error is about the whole file.
    pub col: usize,
    /// Dotted field path (`resources.accelerators`), empty at top level.
    pub field: String,
    /// What is wrong and what was expected.
    pub message: String,
    /// What to do about it.
    pub hint: Option<String>,
    /// Whether the input is valid but uses something gangway does not support.
    pub unsupported: bool,
}

impl fmt::Display for LocatedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.col)?;
        }
        write!(f, ": ")?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}", self.message)?;
        if let Some(h) = &self.hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LocatedError {}

impl LocatedError {
    /// A YAML syntax error in `file`, located.
    pub fn from_yaml(file: &str, e: YamlError) -> LocatedError {
        LocatedError {
            file: file.to_string(),
            line: e.pos.line,
            col: e.pos.col,
            field: e.field,
            message: e.message,
            hint: e.hint,
            unsupported: false,
        }
    }
}

/// Located errors for one file.
pub struct Cx<'a> {
    /// The file, as errors name it.
    pub file: &'a str,
}

impl Cx<'_> {
    /// An error at `n`, about `field`.
    pub fn err(
        &self,
        n: &Node,
        field: &str,
        message: impl Into<String>,
        hint: Option<&str>,
    ) -> LocatedError {
        LocatedError {
            file: self.file.to_string(),
            line: n.pos.line,
            col: n.pos.col,
            field: field.to_string(),
            message: message.into(),
            hint: hint.map(str::to_string),
            unsupported: false,
        }
    }

    /// `n`'s entries, or an error if it is not a mapping.
    pub fn map<'n>(&self, n: &'n Node, field: &str) -> Result<&'n [(Node, Node)], LocatedError> {
        match &n.kind {
            Kind::Map(m) => Ok(m),
            _ => Err(self.err(
                n,
                field,
                format!("expected a mapping, found {}", n.describe()),
                None,
            )),
        }
    }

    /// `n`'s text, or an error if it is not a scalar.
    pub fn text(&self, n: &Node, field: &str) -> Result<String, LocatedError> {
        match &n.kind {
            Kind::Scalar { text, .. } => Ok(text.clone()),
            _ => Err(self.err(
                n,
                field,
                format!("expected a value, found {}", n.describe()),
                None,
            )),
        }
    }

    /// A mapping key's text.
    pub fn key(&self, k: &Node, field: &str) -> Result<String, LocatedError> {
        self.text(k, field)
    }

    /// An unknown key `key` at `k`, with the closest allowed name as a hint.
    pub fn unknown(&self, k: &Node, field: &str, key: &str, allowed: &[&str]) -> LocatedError {
        let hint = closest(key, allowed).map(|c| format!("did you mean '{c}'?"));
        self.err(
            k,
            field,
            format!("unknown field '{key}'"),
            Some(&hint.unwrap_or_else(|| format!("expected one of {}", allowed.join(", ")))),
        )
    }
}

/// The allowed name closest to `key`, if close enough to be a typo.
pub fn closest<'a>(key: &str, allowed: &[&'a str]) -> Option<&'a str> {
    let lower = key.to_ascii_lowercase();
    allowed
        .iter()
        .map(|a| {
            let l = a.to_ascii_lowercase();
            // Of names as far apart, one that begins with what was typed
            // (`H10` -> `H100`, not `A10`).
            (
                strsim::damerau_levenshtein(&lower, &l),
                !l.starts_with(&lower),
                *a,
            )
        })
        .filter(|(d, _, a)| *d <= 2.max(a.len() / 4))
        .min()
        .map(|(_, _, a)| a)
}

/// `~/x` under `$HOME`; anything else as written.
pub fn expand_home(p: &str) -> String {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(h)) => Path::new(&h).join(rest).display().to_string(),
        _ => p.to_string(),
    }
}

/// A duration in a configuration file: seconds (`600`) or `30s`, `10m`,
/// `2h`; `None` for anything else, or one too long to count in seconds.
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: u64 = num.parse().ok()?;
    // Checked: 1844674407370955161m overflowed (a panic in debug builds, a
    // wrong wait in release ones).
    let secs = match unit.trim() {
        "s" => Some(n),
        "m" | "min" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => None,
    }?;
    Some(std::time::Duration::from_secs(secs))
}

#[cfg(test)]
mod closest_tests {
    use super::closest;

    #[test]
    fn of_names_as_far_apart_the_one_typed_the_start_of_wins() {
        let gpus = ["A10", "A100", "H100", "T4"];
        assert_eq!(closest("H10", &gpus), Some("H100"));
        assert_eq!(closest("a10g", &gpus), Some("A10"));
        assert_eq!(closest("xyzzy", &gpus), None);
    }
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_read_in_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("600"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_duration("ten"), None);
        assert_eq!(parse_duration("1844674407370955161m"), None);
        assert_eq!(parse_duration("5124095576030432h"), None);
    }
}
