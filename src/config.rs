//! `$GANGWAY_HOME/config.yaml`: the user's defaults, in SkyPilot's
//! `~/.sky/config.yaml` layout for the keys gangway reads (`jobs.bucket`).
//! A task's own `config:` wins over it, key by key.

use std::path::Path;

use crate::spec::Task;
use crate::Error;

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
    Ok(docs.docs.first().map(crate::spec::to_json))
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
}
