//! Where the API key comes from: `VAST_API_KEY`, else the file the
//! official CLI (`vastai set api-key KEY`) writes: `vast_api_key` in its
//! configuration directory (`$XDG_CONFIG_HOME/vastai`, by default
//! `~/.config/vastai`), or `~/.vast_api_key` where older versions kept it.
//! The file holds the key alone. The key is held in [`ApiKey`], whose
//! `Debug` and `Display` never show it; it is sent only in the
//! `Authorization` header.

use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable read first.
pub const KEY_VAR: &str = "VAST_API_KEY";

/// An API key; formatting it shows `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key given directly (tests, embedding).
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key, for the `Authorization` header only.
    pub(crate) fn expose(&self) -> &str {
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
    /// `VAST_API_KEY`, or the file's path.
    pub source: String,
}

/// The files read, in order, under `home` with `xdg` (`XDG_CONFIG_HOME`).
pub fn key_files(home: &Path, xdg: Option<&Path>) -> [PathBuf; 2] {
    let config = xdg
        .map(Path::to_path_buf)
        .unwrap_or_else(|| home.join(".config"));
    [
        config.join("vastai").join("vast_api_key"),
        home.join(".vast_api_key"),
    ]
}

/// What to do when no key is found.
pub fn hint() -> String {
    format!(
        "set {KEY_VAR}, or run `vastai set api-key <KEY>` (it writes ~/.config/vastai/vast_api_key; \
         keys are made at https://cloud.vast.ai/manage-keys/)"
    )
}

/// The key from `env_value` or the key files; `Err` says what is wrong
/// with a file that exists.
pub fn find(
    env_value: Option<String>,
    home: Option<&Path>,
    xdg: Option<&Path>,
) -> Result<Option<Found>, String> {
    if let Some(k) = env_value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
    {
        return Ok(Some(Found {
            key: ApiKey(k),
            source: KEY_VAR.to_string(),
        }));
    }
    let Some(home) = home else { return Ok(None) };
    for path in key_files(home, xdg) {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let key = text.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(format!("{} does not hold one key", path.display()));
        }
        return Ok(Some(Found {
            key: ApiKey(key.to_string()),
            source: path.display().to_string(),
        }));
    }
    Ok(None)
}

/// The key this process would use: the environment, else the files.
pub fn from_environment() -> Result<Option<Found>, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|x| !x.is_empty())
        .map(PathBuf::from);
    find(std::env::var(KEY_VAR).ok(), home.as_deref(), xdg.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_then_the_clis_files_and_the_key_never_prints() {
        let dir = tempfile::tempdir().unwrap();
        let [config, legacy] = key_files(dir.path(), None);
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        std::fs::write(&config, "secret_config_key\n").unwrap();
        std::fs::write(&legacy, "secret_legacy_key").unwrap();
        let f = find(Some("secret_env".into()), Some(dir.path()), None)
            .unwrap()
            .unwrap();
        assert_eq!(f.source, "VAST_API_KEY");
        assert!(!format!("{f:?} {}", f.key).contains("secret"));
        let f = find(None, Some(dir.path()), None).unwrap().unwrap();
        assert_eq!(f.key.expose(), "secret_config_key");
        assert!(f.source.ends_with(".config/vastai/vast_api_key"));
        std::fs::remove_file(&config).unwrap();
        let f = find(None, Some(dir.path()), None).unwrap().unwrap();
        assert_eq!(f.key.expose(), "secret_legacy_key");
        std::fs::write(&legacy, "two words\n").unwrap();
        assert!(find(None, Some(dir.path()), None).is_err());
        assert!(find(None, None, None).unwrap().is_none());
    }
}
