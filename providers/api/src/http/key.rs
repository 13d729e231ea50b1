//! An API key and where it was found: the provider's environment variable
//! first, then the files its official tools write. The key is held in
//! [`ApiKey`], whose `Debug` and `Display` never show it; it is sent only
//! in the `Authorization` header ([`super::Client`]).

use std::fmt;
use std::path::PathBuf;

/// An API key; formatting it shows `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key given directly (tests, embedding).
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A key and where it was found (for `gangway check`; never the key).
#[derive(Clone, Debug)]
pub struct Found {
    /// The key.
    pub key: ApiKey,
    /// The environment variable's name, or the file's path.
    pub source: String,
}

/// How one provider keeps its key.
pub struct KeySources<'a> {
    /// The environment variable read first (`LAMBDA_API_KEY`).
    pub var: &'a str,
    /// The files read after it, in order; the first that exists decides.
    pub files: &'a [PathBuf],
    /// The key in a file's text, or why there is none there (the reason
    /// never quotes the file).
    pub parse: &'a dyn Fn(&str) -> Result<String, String>,
}

impl KeySources<'_> {
    /// The key from `env_value` (the variable's value) or the files; `Err`
    /// says what is wrong with a file that exists.
    pub fn find(&self, env_value: Option<String>) -> Result<Option<Found>, String> {
        if let Some(k) = env_value
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
        {
            return Ok(Some(Found {
                key: ApiKey(k),
                source: self.var.to_string(),
            }));
        }
        for path in self.files {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
            };
            return match (self.parse)(&text) {
                Ok(k) => Ok(Some(Found {
                    key: ApiKey(k),
                    source: path.display().to_string(),
                })),
                Err(why) => Err(format!("{} {why}", path.display())),
            };
        }
        Ok(None)
    }
}

/// `$HOME`, when set.
pub fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_line(text: &str) -> Result<String, String> {
        let k = text.trim();
        if k.is_empty() {
            Err("is empty".into())
        } else {
            Ok(k.to_string())
        }
    }

    #[test]
    fn the_variable_wins_then_the_first_file_that_exists_and_keys_never_print() {
        let dir = tempfile::tempdir().unwrap();
        let files = [dir.path().join("a"), dir.path().join("b")];
        std::fs::write(&files[1], "secret_b\n").unwrap();
        let s = KeySources {
            var: "X_API_KEY",
            files: &files,
            parse: &one_line,
        };
        let f = s.find(Some(" secret_env ".into())).unwrap().unwrap();
        assert_eq!(
            (f.key.expose(), f.source.as_str()),
            ("secret_env", "X_API_KEY")
        );
        assert!(!format!("{f:?} {}", f.key).contains("secret"));
        let f = s.find(Some("  ".into())).unwrap().unwrap();
        assert_eq!(f.key.expose(), "secret_b");
        assert!(f.source.ends_with("/b"), "{}", f.source);
        std::fs::write(&files[0], "").unwrap();
        let e = s.find(None).unwrap_err();
        assert!(e.ends_with("/a is empty"), "{e}");
        let none = KeySources {
            var: "X_API_KEY",
            files: &[],
            parse: &one_line,
        };
        assert!(none.find(None).unwrap().is_none());
    }
}
