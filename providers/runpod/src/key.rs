//! Where the API key comes from: `RUNPOD_API_KEY`, else the files RunPod's
//! own tools keep it in. `runpodctl config --apiKey` writes
//! `~/.runpod/config.toml` (a line `apiKey = "KEY"`; versions before it
//! wrote `~/.runpod.yaml`, `apiKey: KEY`, which runpodctl still reads and
//! migrates), and the Python SDK's `runpod config` writes the same
//! `~/.runpod/config.toml` as `api_key = "KEY"` under a `[default]`
//! profile. The key is held in [`ApiKey`], whose `Debug` and `Display`
//! never show it; it is sent only in the `Authorization` header.

use std::path::{Path, PathBuf};

use gangway_provider::http::key::KeySources;
pub use gangway_provider::http::key::{ApiKey, Found};

/// The environment variable read first.
pub const KEY_VAR: &str = "RUNPOD_API_KEY";

/// The files read under `home`, in order: runpodctl's and the SDK's
/// `config.toml`, then runpodctl's legacy YAML.
pub fn key_files(home: &Path) -> [PathBuf; 2] {
    [
        home.join(".runpod").join("config.toml"),
        home.join(".runpod.yaml"),
    ]
}

/// What to do when no key is found.
pub fn hint() -> String {
    format!(
        "set {KEY_VAR}, or run `runpodctl config --apiKey <KEY>` (it writes ~/.runpod/config.toml; \
         keys are made at https://www.runpod.io/console/user/settings)"
    )
}

/// The key from `env_value` (the variable's value) or the key files under
/// `home`; `Err` says what is wrong with a file that exists.
pub fn find(env_value: Option<String>, home: Option<&Path>) -> Result<Option<Found>, String> {
    let files: Vec<PathBuf> = home.map(|h| key_files(h).to_vec()).unwrap_or_default();
    let parse = |text: &str| {
        parse_key_file(text)
            .ok_or_else(|| "has no `apiKey` (runpodctl) or `api_key` (runpod SDK) line".to_string())
    };
    KeySources {
        var: KEY_VAR,
        files: &files,
        parse: &parse,
    }
    .find(env_value)
}

/// The key from a config file's text: the first `apiKey` or `api_key`
/// line, `=` (TOML) or `:` (YAML), quoted or not. TOML profiles other than
/// the first are not told apart: the SDK's `[default]` comes first.
fn parse_key_file(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let l = l.trim();
        let at = l.find(['=', ':'])?;
        let (k, v) = (l[..at].trim(), l[at + 1..].trim());
        matches!(k, "apiKey" | "api_key" | "apikey")
            .then(|| v.trim_matches(['"', '\'']).to_string())
            .filter(|v| !v.is_empty())
    })
}

/// The key this process would use: the environment, else `$HOME`'s files.
pub fn from_environment() -> Result<Option<Found>, String> {
    let home = gangway_provider::http::key::home();
    find(std::env::var(KEY_VAR).ok(), home.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_over_the_files_and_the_key_never_prints() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".runpod")).unwrap();
        let [toml, yaml] = key_files(dir.path());
        std::fs::write(&toml, "apiKey = \"secret_file_key\"\napiUrl = \"x\"\n").unwrap();
        std::fs::write(&yaml, "apiKey: secret_yaml_key\n").unwrap();
        let f = find(Some("secret_env_key".into()), Some(dir.path()))
            .unwrap()
            .unwrap();
        assert_eq!(f.source, "RUNPOD_API_KEY");
        assert_eq!(f.key.expose(), "secret_env_key");
        let shown = format!("{f:?} {}", f.key);
        assert!(!shown.contains("secret"), "{shown}");

        let f = find(Some(" ".into()), Some(dir.path())).unwrap().unwrap();
        assert_eq!(f.key.expose(), "secret_file_key");
        assert!(f.source.ends_with(".runpod/config.toml"), "{}", f.source);
        std::fs::remove_file(&toml).unwrap();
        let f = find(None, Some(dir.path())).unwrap().unwrap();
        assert_eq!(f.key.expose(), "secret_yaml_key");
    }

    #[test]
    fn the_sdks_profile_reads_and_a_file_without_a_key_says_why() {
        assert_eq!(
            parse_key_file("[default]\napi_key = \"k1\"\n"),
            Some("k1".into())
        );
        assert_eq!(parse_key_file("apikey: 'k2'\n"), Some("k2".into()));
        assert_eq!(parse_key_file("apiKey =\n"), None);
        let dir = tempfile::tempdir().unwrap();
        assert!(find(None, Some(dir.path())).unwrap().is_none());
        assert!(find(None, None).unwrap().is_none());
        std::fs::write(dir.path().join(".runpod.yaml"), "apiUrl: x\n").unwrap();
        let e = find(None, Some(dir.path())).unwrap_err();
        assert!(e.contains("apiKey") && e.contains(".runpod.yaml"), "{e}");
    }
}
