//! `$GANGWAY_HOME/config.yaml`: the user's defaults, in SkyPilot's
//! `~/.sky/config.yaml` layout for the keys gangway reads (`jobs.bucket`,
//! `<provider>.remote_identity`). A task's own `config:` wins over it, key
//! by key.

use std::path::{Path, PathBuf};

use crate::core::spec::identity::{check_identities, LOCAL_CREDENTIALS, REMOTE_IDENTITY};
use crate::core::spec::Task;
use crate::Error;

/// `$GANGWAY_HOME`, or `~/.gangway`.
pub(crate) fn gangway_home() -> Result<PathBuf, Error> {
    if let Some(h) = std::env::var_os("GANGWAY_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".gangway")),
        None => Err(Error::usage(
            "neither GANGWAY_HOME nor HOME is set; gangway needs a directory for its state",
            Some("export GANGWAY_HOME=/some/dir"),
        )),
    }
}

/// The user's config file as JSON; `None` when there is none.
pub(crate) fn user_config(home: &Path) -> Result<Option<serde_json::Value>, Error> {
    let path = home.join("config.yaml");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::usage(
                format!("{}: {e}", path.display()),
                Some("check the file's permissions"),
            ))
        }
    };
    let docs = gangway_yaml::parse(&text).map_err(|e| {
        Error::Spec(gangway_yaml::LocatedError::from_yaml(
            &path.display().to_string(),
            e,
        ))
    })?;
    let Some(doc) = docs.docs.first() else {
        return Ok(None);
    };
    check_identities(&path.display().to_string(), doc, "")?;
    Ok(Some(crate::core::spec::to_json(doc)))
}

/// The task's `config:` as launches hand it to the providers (each gets
/// its own section): with the user file's `<provider>.remote_identity`
/// where the task names none, and `LOCAL_CREDENTIALS` (the default) taken
/// out, so a provider sees a name or nothing.
pub(crate) fn launch_config(task: &Task, home: &Path) -> Result<Option<serde_json::Value>, Error> {
    let user = user_config(home)?;
    let mut config = task.config.clone();
    if let Some(serde_json::Value::Object(user)) = &user {
        for (provider, section) in user {
            let Some(id) = section.get(REMOTE_IDENTITY).and_then(|v| v.as_str()) else {
                continue;
            };
            let c = config.get_or_insert_with(|| serde_json::json!({}));
            let Some(c) = c.as_object_mut() else { break };
            let s = c
                .entry(provider.clone())
                .or_insert_with(|| serde_json::json!({}));
            if let Some(s) = s.as_object_mut() {
                s.entry(REMOTE_IDENTITY)
                    .or_insert_with(|| serde_json::Value::String(id.to_string()));
            }
        }
    }
    if let Some(serde_json::Value::Object(c)) = &mut config {
        for section in c.values_mut() {
            if let Some(s) = section.as_object_mut() {
                let local = s
                    .get(REMOTE_IDENTITY)
                    .and_then(|v| v.as_str())
                    .is_some_and(|v| v.eq_ignore_ascii_case(LOCAL_CREDENTIALS));
                if local {
                    s.remove(REMOTE_IDENTITY);
                }
            }
        }
    }
    Ok(config)
}

/// `jobs.bucket`: where managed jobs keep their workdir and local file
/// mounts (`s3://...` or `gs://...`), from the task's `config:` or the
/// user's config file.
pub(crate) fn jobs_bucket(task: &Task, home: &Path) -> Result<Option<String>, Error> {
    let pick = |v: &serde_json::Value| v["jobs"]["bucket"].as_str().map(str::to_string);
    // Read (and checked) even when the task decides.
    let user = user_config(home)?;
    Ok(task
        .config
        .as_ref()
        .and_then(pick)
        .or_else(|| user.as_ref().and_then(pick)))
}

/// A path the user wrote, as this machine reads it: `~/` expanded
/// against `$HOME`, then made absolute.
pub(crate) fn local_path(p: &str) -> PathBuf {
    let expanded = match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(p),
    };
    std::path::absolute(&expanded).unwrap_or(expanded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_wins_over_the_user_file_and_a_bad_file_is_located() {
        let home = tempfile::tempdir().unwrap();
        let t = crate::core::spec::parse_str("run: x\n", "t.yaml").unwrap();
        assert_eq!(jobs_bucket(&t, home.path()).unwrap(), None);
        std::fs::write(
            home.path().join("config.yaml"),
            "jobs:\n  bucket: s3://mine\n",
        )
        .unwrap();
        assert_eq!(
            jobs_bucket(&t, home.path()).unwrap().as_deref(),
            Some("s3://mine")
        );
        let t = crate::core::spec::parse_str(
            "run: x\nconfig:\n  jobs:\n    bucket: gs://theirs\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(
            jobs_bucket(&t, home.path()).unwrap().as_deref(),
            Some("gs://theirs")
        );
        std::fs::write(home.path().join("config.yaml"), "jobs: [\n").unwrap();
        let e = jobs_bucket(&t, home.path()).unwrap_err().to_string();
        assert!(e.contains("config.yaml:"), "{e}");
    }

    #[test]
    fn remote_identity_comes_from_the_task_or_the_user_file_and_local_credentials_is_none() {
        let home = tempfile::tempdir().unwrap();
        let t = crate::core::spec::parse_str("run: x\n", "t.yaml").unwrap();
        assert_eq!(launch_config(&t, home.path()).unwrap(), None);
        std::fs::write(
            home.path().join("config.yaml"),
            "aws:\n  remote_identity: gangway-nodes\ngcp:\n  remote_identity: LOCAL_CREDENTIALS\n",
        )
        .unwrap();
        let c = launch_config(&t, home.path()).unwrap().unwrap();
        assert_eq!(c["aws"]["remote_identity"], "gangway-nodes", "{c}");
        assert!(c["gcp"].get("remote_identity").is_none(), "{c}");
        // The task's own wins, other keys of its section stay.
        let t = crate::core::spec::parse_str(
            "run: x\nconfig:\n  aws:\n    ssh_user: root\n    remote_identity: theirs\n",
            "t.yaml",
        )
        .unwrap();
        let c = launch_config(&t, home.path()).unwrap().unwrap();
        assert_eq!(c["aws"]["remote_identity"], "theirs", "{c}");
        assert_eq!(c["aws"]["ssh_user"], "root", "{c}");
        let t = crate::core::spec::parse_str(
            "run: x\nconfig:\n  aws:\n    remote_identity: LOCAL_CREDENTIALS\n",
            "t.yaml",
        )
        .unwrap();
        let c = launch_config(&t, home.path()).unwrap().unwrap();
        assert!(c["aws"].get("remote_identity").is_none(), "{c}");
    }

    #[test]
    fn unsupported_remote_identities_name_the_file_line_and_key() {
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join("config.yaml"),
            "jobs:\n  bucket: s3://b\naws:\n  remote_identity: SERVICE_ACCOUNT\n",
        )
        .unwrap();
        let t = crate::core::spec::parse_str("run: x\n", "t.yaml").unwrap();
        let e = launch_config(&t, home.path()).unwrap_err().to_string();
        assert!(
            e.contains("config.yaml:4:")
                && e.contains("aws.remote_identity: SERVICE_ACCOUNT is not supported"),
            "{e}"
        );
        for (text, says) in [
            (
                "run: x\nconfig:\n  gcp:\n    remote_identity: NO_UPLOAD\n",
                "NO_UPLOAD is not supported",
            ),
            (
                "run: x\nconfig:\n  aws:\n    remote_identity:\n      - my-*: a\n",
                "per-cluster list form",
            ),
            (
                "run: x\nconfig:\n  aws:\n    remote_identity: ''\n",
                "is empty",
            ),
        ] {
            let e = crate::core::spec::parse_str(text, "t.yaml")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("t.yaml:4:"), "{e}");
            assert!(e.contains(".remote_identity: ") && e.contains(says), "{e}");
        }
    }
}
