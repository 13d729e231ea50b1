//! `$GANGWAY_HOME/config.yaml`: the user's defaults, in SkyPilot's
//! `~/.sky/config.yaml` layout for the keys gangway reads (`jobs.bucket`,
//! `<provider>.remote_identity`). A task's own `config:` wins over it, key
//! by key.

use std::path::{Path, PathBuf};

use crate::spec::yaml::{Kind, Node};
use crate::spec::{SpecError, Task};
use crate::Error;

/// The key of a provider's section that names the identity its nodes
/// get (SkyPilot's spelling): an identity the user made, by the name the
/// provider knows it by, or [`LOCAL_CREDENTIALS`].
pub(crate) const REMOTE_IDENTITY: &str = "remote_identity";

/// SkyPilot's value for "nodes get credentials derived from the user's":
/// gangway's default, the same as no `remote_identity`.
pub(crate) const LOCAL_CREDENTIALS: &str = "LOCAL_CREDENTIALS";

/// Checks every `<provider>.remote_identity` of a config mapping (the
/// user's file, or a task's `config:` whose fields start with `prefix`):
/// one name, or `LOCAL_CREDENTIALS`. SkyPilot's other forms are refused,
/// located: `SERVICE_ACCOUNT` and `NO_UPLOAD` (an identity SkyPilot makes
/// or none at all) and the per-cluster list.
pub(crate) fn check_identities(file: &str, config: &Node, prefix: &str) -> Result<(), SpecError> {
    let Kind::Map(sections) = &config.kind else {
        return Ok(());
    };
    for (k, section) in sections {
        let (Kind::Scalar { text: provider, .. }, Kind::Map(fields)) = (&k.kind, &section.kind)
        else {
            continue;
        };
        for (fk, v) in fields {
            if !matches!(&fk.kind, Kind::Scalar { text, .. } if text == REMOTE_IDENTITY) {
                continue;
            }
            let field = format!("{prefix}{provider}.{REMOTE_IDENTITY}");
            let err = |message: String, hint: &str| SpecError {
                file: file.to_string(),
                line: fk.pos.line,
                col: fk.pos.col,
                field: field.clone(),
                message,
                hint: Some(hint.to_string()),
                unsupported: true,
            };
            let name_it = "name an identity you made (docs/storage.md, \"Credentials\"), or LOCAL_CREDENTIALS for credentials made from yours";
            match &v.kind {
                Kind::Scalar { text, .. } if text.trim().is_empty() => {
                    return Err(err("is empty".into(), name_it))
                }
                Kind::Scalar { text, .. }
                    if text.eq_ignore_ascii_case("SERVICE_ACCOUNT")
                        || text.eq_ignore_ascii_case("NO_UPLOAD") =>
                {
                    return Err(err(
                        format!("{text} is not supported: gangway never makes an identity for you and never leaves nodes without credentials"),
                        name_it,
                    ))
                }
                Kind::Scalar { .. } => {}
                Kind::Seq(_) => {
                    return Err(err(
                        "the per-cluster list form is not supported".into(),
                        "give one name for every cluster (a task's config: can name another)",
                    ))
                }
                _ => return Err(err(format!("expected a name, found {}", v.describe()), name_it)),
            }
        }
    }
    Ok(())
}

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
    Ok(Some(crate::spec::to_json(doc)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_task_wins_over_the_user_file_and_a_bad_file_is_located() {
        let home = tempfile::tempdir().unwrap();
        let t = crate::spec::parse_str("run: x\n", "t.yaml").unwrap();
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
        let t = crate::spec::parse_str(
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
        let t = crate::spec::parse_str("run: x\n", "t.yaml").unwrap();
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
        let t = crate::spec::parse_str(
            "run: x\nconfig:\n  aws:\n    ssh_user: root\n    remote_identity: theirs\n",
            "t.yaml",
        )
        .unwrap();
        let c = launch_config(&t, home.path()).unwrap().unwrap();
        assert_eq!(c["aws"]["remote_identity"], "theirs", "{c}");
        assert_eq!(c["aws"]["ssh_user"], "root", "{c}");
        let t = crate::spec::parse_str(
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
        let t = crate::spec::parse_str("run: x\n", "t.yaml").unwrap();
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
            let e = crate::spec::parse_str(text, "t.yaml")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("t.yaml:4:"), "{e}");
            assert!(e.contains(".remote_identity: ") && e.contains(says), "{e}");
        }
    }
}
