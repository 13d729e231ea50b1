//! Where the API key comes from: `VAST_API_KEY`, else the file the
//! official CLI (`vastai set api-key KEY`) writes: `vast_api_key` in its
//! configuration directory (`$XDG_CONFIG_HOME/vastai`, by default
//! `~/.config/vastai`), or `~/.vast_api_key` where older versions kept it.
//! The file holds the key alone. The key is held in [`ApiKey`], whose
//! `Debug` and `Display` never show it; it is sent only in the
//! `Authorization` header.

use std::path::{Path, PathBuf};

use gangway_provider::http::key::KeySources;
pub use gangway_provider::http::key::{ApiKey, Found};

/// The environment variable read first.
pub const KEY_VAR: &str = "VAST_API_KEY";

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
    let files: Vec<PathBuf> = home.map(|h| key_files(h, xdg).to_vec()).unwrap_or_default();
    let parse = |text: &str| {
        let key = text.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            Err("does not hold one key".to_string())
        } else {
            Ok(key.to_string())
        }
    };
    KeySources {
        var: KEY_VAR,
        files: &files,
        parse: &parse,
    }
    .find(env_value)
}

/// The key this process would use: the environment, else the files.
pub fn from_environment() -> Result<Option<Found>, String> {
    let home = gangway_provider::http::key::home();
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
