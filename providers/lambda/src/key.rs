//! Where the API key comes from: `LAMBDA_API_KEY`, else the key file that
//! Lambda's tools read, `~/.lambda_cloud/lambda_keys` (a line `api_key =
//! KEY`). The key is held in [`ApiKey`], whose `Debug` and `Display` never
//! show it; it is sent only in the `Authorization` header.

use std::path::{Path, PathBuf};

use gangway_provider::http::key::KeySources;
pub use gangway_provider::http::key::{ApiKey, Found};

/// The environment variable read first.
pub const KEY_VAR: &str = "LAMBDA_API_KEY";

/// The key file under `home` (`$HOME`).
pub fn key_file(home: &Path) -> PathBuf {
    home.join(".lambda_cloud").join("lambda_keys")
}

/// What to do when no key is found.
pub fn hint() -> String {
    format!(
        "set {KEY_VAR}, or put a line `api_key = <KEY>` in ~/.lambda_cloud/lambda_keys \
         (keys are made at https://cloud.lambda.ai/api-keys)"
    )
}

/// The key from `env_value` (the variable's value) or the key file under
/// `home`; `Err` says what is wrong with a file that exists.
pub fn find(env_value: Option<String>, home: Option<&Path>) -> Result<Option<Found>, String> {
    let files: Vec<PathBuf> = home.map(key_file).into_iter().collect();
    let parse = |text: &str| {
        parse_key_file(text).ok_or_else(|| "has no line `api_key = <KEY>`".to_string())
    };
    KeySources {
        var: KEY_VAR,
        files: &files,
        parse: &parse,
    }
    .find(env_value)
}

/// The key from the key file's text: the value of its `api_key` line.
fn parse_key_file(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "api_key")
            .then(|| v.trim().trim_matches(['"', '\'']).to_string())
            .filter(|v| !v.is_empty())
    })
}

/// The key this process would use: the environment, else `$HOME`'s file.
pub fn from_environment() -> Result<Option<Found>, String> {
    let home = gangway_provider::http::key::home();
    find(std::env::var(KEY_VAR).ok(), home.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_over_the_file_and_the_key_never_prints() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".lambda_cloud")).unwrap();
        std::fs::write(key_file(dir.path()), "# mine\napi_key = secret_file_key\n").unwrap();
        let f = find(Some("secret_env_key".into()), Some(dir.path()))
            .unwrap()
            .unwrap();
        assert_eq!(f.source, "LAMBDA_API_KEY");
        assert_eq!(f.key.expose(), "secret_env_key");
        let shown = format!("{f:?} {}", f.key);
        assert!(!shown.contains("secret"), "{shown}");

        let f = find(Some("  ".into()), Some(dir.path())).unwrap().unwrap();
        assert_eq!(f.key.expose(), "secret_file_key");
        assert!(
            f.source.ends_with(".lambda_cloud/lambda_keys"),
            "{}",
            f.source
        );
    }

    #[test]
    fn a_missing_file_is_no_key_and_a_broken_one_says_why() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find(None, Some(dir.path())).unwrap().is_none());
        assert!(find(None, None).unwrap().is_none());
        std::fs::create_dir_all(dir.path().join(".lambda_cloud")).unwrap();
        std::fs::write(key_file(dir.path()), "apikey: x\n").unwrap();
        let e = find(None, Some(dir.path())).unwrap_err();
        assert!(e.contains("api_key = <KEY>") && !e.contains(": x"), "{e}");
        assert_eq!(parse_key_file("api_key='k1'\n"), Some("k1".into()));
        assert_eq!(parse_key_file("api_key =\n"), None);
    }
}
