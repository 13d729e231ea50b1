//! Task files: reading, validating and overriding them.
//!
//! [`load`] reads a file with hard limits on size and shape and returns a
//! [`Task`] or one [`SpecError`] that names the file, line, column and field.

mod decode;
pub(crate) mod identity;
pub(crate) use decode::to_json;
pub mod model;
mod overrides;
pub mod yaml;

use std::path::Path;

pub use model::*;
pub(crate) use overrides::{OverrideError, Overrides};

/// Largest task file we read. Real ones are a few KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
const SIZE_HINT: &str = "task files describe a job; put data in file_mounts or workdir instead";

/// Why a task file was refused: a located error, as for every YAML file
/// gangway reads.
pub use gangway_yaml::LocatedError as SpecError;

fn whole_file(file: &str, message: String, hint: Option<&str>) -> SpecError {
    SpecError {
        file: file.to_string(),
        line: 0,
        col: 0,
        field: String::new(),
        message,
        hint: hint.map(str::to_string),
        unsupported: false,
    }
}

/// Reads and validates a task file.
pub fn load(path: &Path) -> Result<Task, SpecError> {
    let file = path.display().to_string();
    let cannot_read = |e: std::io::Error| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound => {
                Some("check the path; task files are YAML, e.g. examples/hello.yaml")
            }
            std::io::ErrorKind::PermissionDenied => Some("check the file's permissions"),
            _ => None,
        };
        whole_file(
            &file,
            format!("cannot read task file: {}", io_reason(&e)),
            hint,
        )
    };
    let meta = std::fs::metadata(path).map_err(cannot_read)?;
    if meta.is_dir() {
        return Err(whole_file(
            &file,
            "is a directory, expected a task file".into(),
            Some("pass the YAML file inside it, e.g. DIR/task.yaml"),
        ));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(whole_file(
            &file,
            format!(
                "task file is {} bytes; the limit is {} bytes",
                meta.len(),
                MAX_FILE_BYTES
            ),
            Some(SIZE_HINT),
        ));
    }
    // Read at most the limit even if the file grows under us.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    {
        use std::io::Read;
        let f = std::fs::File::open(path).map_err(cannot_read)?;
        f.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(cannot_read)?;
    }
    parse_bytes(&bytes, &file)
}

/// Parses a task file's raw bytes, as read from disk: refuses more than
/// [`MAX_FILE_BYTES`] and text that is not UTF-8 (located), then
/// [`parse_str`]. `file` names it in errors.
pub fn parse_bytes(bytes: &[u8], file: &str) -> Result<Task, SpecError> {
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(whole_file(
            file,
            format!("task file is larger than {MAX_FILE_BYTES} bytes"),
            Some(SIZE_HINT),
        ));
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let good = &bytes[..e.valid_up_to()];
            let line = good.iter().filter(|b| **b == b'\n').count() + 1;
            let line_start = good.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
            let col = String::from_utf8_lossy(&good[line_start..]).chars().count() + 1;
            return Err(SpecError {
                file: file.to_string(),
                line,
                col,
                field: String::new(),
                message: "file is not valid UTF-8".into(),
                hint: Some("save the task file as UTF-8 text".into()),
                unsupported: false,
            });
        }
    };
    parse_str(text, file)
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Parses task YAML; `file` names it in errors.
pub fn parse_str(text: &str, file: &str) -> Result<Task, SpecError> {
    if text.trim().is_empty() {
        return Err(whole_file(
            file,
            "task file is empty".into(),
            Some("a task needs at least `run:`; see examples/hello.yaml"),
        ));
    }
    let docs = yaml::parse(text).map_err(|e| SpecError::from_yaml(file, e))?;
    let docs: Vec<_> = docs
        .docs
        .into_iter()
        .filter(|d| !matches!(d.kind, yaml::Kind::Null))
        .collect();
    match docs.len() {
        0 => Err(whole_file(
            file,
            "task file has no content".into(),
            Some("a task needs at least `run:`; see examples/hello.yaml"),
        )),
        1 => decode::task(&docs[0], file),
        n => Err(SpecError {
            file: file.to_string(),
            line: docs[1].pos.line,
            col: docs[1].pos.col,
            field: String::new(),
            message: format!(
                "not supported yet: multi-document pipelines (this file has {n} YAML documents)"
            ),
            hint: Some("split the pipeline into one task file per stage and launch each".into()),
            unsupported: true,
        }),
    }
}

/// Splits `KEY=VALUE` (for `--env` and `--secret`).
pub fn parse_assignment(s: &str) -> Result<(String, String), AssignmentError> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| AssignmentError::NoEquals(s.to_string()))?;
    if !valid_env_name(k) {
        return Err(AssignmentError::BadName(k.to_string()));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Whether `name` is an environment variable's name as a shell takes it:
/// letters, digits and `_`, not starting with a digit. The same rule for
/// `envs:`, `secrets:`, `--env`, `--secret` and env files.
pub fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why a `KEY=VALUE` assignment (`--env`, an env file's line) was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AssignmentError {
    /// No `=`.
    #[error("expected KEY=VALUE, got '{0}'")]
    NoEquals(String),
    /// The name is not an environment variable's.
    #[error("'{0}' is not a valid environment variable name (letters, digits, _, not starting with a digit)")]
    BadName(String),
}

/// Why the copy of a task without its literal secret values could not be
/// made.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RedactError {
    /// The task itself is refused.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The secrets cannot be cut out of this file's text safely.
    #[error("{file}: cannot remove the literal secrets: values from the copy kept for recoveries ({why}); give them with --secret or --secret-file instead")]
    Refused {
        /// The task file.
        file: String,
        /// Why not.
        why: String,
    },
}

/// Reads a dotenv-style file: `KEY=VALUE` lines, `#` comments, optional `export `.
pub fn read_env_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    read_assignments(path, "env file", true)
}

/// Reads a secrets file: `KEY=VALUE` lines like an env file, but no error
/// quotes a line (it would print the value).
pub fn read_secret_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    read_assignments(path, "secret file", false)
}

fn read_assignments(path: &Path, what: &str, quote: bool) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read {what}: {}", path.display(), io_reason(&e)))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let (k, v) = parse_assignment(line).map_err(|e| {
            if quote {
                format!("{}:{}: {e}", path.display(), i + 1)
            } else {
                format!(
                    "{}:{}: expected KEY=VALUE with a valid name (the line is not shown: it may hold a secret)",
                    path.display(),
                    i + 1
                )
            }
        })?;
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(&v)
            .to_string();
        out.push((k, v));
    }
    Ok(out)
}

/// The task file's text with every literal `secrets:` value replaced by
/// `null`, for the copy a managed job keeps for its recoveries (their
/// values travel apart, in an owner-only file removed when the job ends).
/// The result is checked by parsing it again: the same task, secrets
/// without values, and none of the values anywhere in the text.
pub fn redact_secrets(text: &str, file: &str) -> Result<String, RedactError> {
    let task = parse_str(text, file)?;
    let literal: Vec<&str> = task
        .secrets
        .iter()
        .filter_map(|(_, v)| v.as_ref().map(|v| v.expose()))
        .filter(|v| !v.is_empty())
        .collect();
    if literal.is_empty() {
        return Ok(text.to_string());
    }
    let refuse = |why: &str| RedactError::Refused {
        file: file.to_string(),
        why: why.to_string(),
    };
    // Top-level keys of a block mapping start in column 1; the `secrets`
    // entry runs from its key to the next one.
    let docs = yaml::parse(text).map_err(|e| refuse(&e.message))?;
    let root = docs.docs.first().ok_or_else(|| refuse("no document"))?;
    let yaml::Kind::Map(entries) = &root.kind else {
        return Err(refuse("the document is not a mapping"));
    };
    // A git workdir's URL credentials (a secret of the task) come out of
    // the URL itself.
    let cleaned = git_url_of(entries).and_then(|raw| {
        let (clean, credentials) = decode::split_credentials(raw);
        credentials.map(|_| text.replace(raw, &clean))
    });
    let text = cleaned.as_deref().unwrap_or(text);
    let Some(i) = entries
        .iter()
        .position(|(k, _)| matches!(&k.kind, yaml::Kind::Scalar { text, .. } if text == "secrets"))
    else {
        // No `secrets:` block (the only secret is the URL's): one at the end.
        if entries.first().is_some_and(|(k, _)| k.pos.col != 1) {
            return Err(refuse("the top-level mapping is not in block style"));
        }
        let mut out = text.to_string();
        if !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str("secrets:\n");
        for (k, _) in &task.secrets {
            out.push_str(&format!("  {k}: null\n"));
        }
        return checked_copy(&task, out, &literal, file);
    };
    let start = entries[i].0.pos;
    if start.col != 1 {
        return Err(refuse("the top-level mapping is not in block style"));
    }
    let end_line = entries.get(i + 1).map(|(k, _)| k.pos.line);
    if entries.get(i + 1).is_some_and(|(k, _)| k.pos.col != 1) {
        return Err(refuse("the top-level mapping is not in block style"));
    }
    let mut out = String::with_capacity(text.len());
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let n = n + 1;
        if n < start.line || end_line.is_some_and(|e| n >= e) {
            out.push_str(line);
        } else if n == start.line {
            out.push_str("secrets:\n");
            for (k, _) in &task.secrets {
                out.push_str(&format!("  {k}: null\n"));
            }
        }
    }
    checked_copy(&task, out, &literal, file)
}

/// `out` when it is the same task as `task` with the secret values gone
/// (none of `literal` anywhere in its text).
fn checked_copy(
    task: &Task,
    out: String,
    literal: &[&str],
    file: &str,
) -> Result<String, RedactError> {
    let refuse = |why: &str| RedactError::Refused {
        file: file.to_string(),
        why: why.to_string(),
    };
    let again = parse_str(&out, file).map_err(|e| refuse(&e.to_string()))?;
    let unvalued = |t: &Task| {
        let mut t = t.clone();
        t.secrets.iter_mut().for_each(|(_, v)| *v = None);
        format!("{t:?}")
    };
    if unvalued(&again) != unvalued(task)
        || again.secrets.iter().any(|(_, v)| v.is_some())
        || literal.iter().any(|v| out.contains(v))
    {
        return Err(refuse("the redacted copy would not be the same task"));
    }
    Ok(out)
}

/// The text of the top-level `workdir: {url: ...}`, if the task has one.
fn git_url_of(entries: &[(yaml::Node, yaml::Node)]) -> Option<&str> {
    let is = |n: &yaml::Node, name: &str| matches!(&n.kind, yaml::Kind::Scalar { text, .. } if text == name);
    let (_, w) = entries.iter().find(|(k, _)| is(k, "workdir"))?;
    let yaml::Kind::Map(fields) = &w.kind else {
        return None;
    };
    match &fields.iter().find(|(k, _)| is(k, "url"))?.1.kind {
        yaml::Kind::Scalar { text, .. } => Some(text),
        _ => None,
    }
}

impl Task {
    /// Applies `--env` values; later values win.
    pub fn set_envs(&mut self, given: &[(String, String)]) {
        for (k, v) in given {
            match self.envs.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = Some(v.clone()),
                None => self.envs.push((k.clone(), Some(v.clone()))),
            }
        }
    }

    /// Applies `--secret` values; later values win.
    pub fn set_secrets(&mut self, given: &[(String, String)]) {
        for (k, v) in given {
            match self.secrets.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = Some(Secret::new(v.clone())),
                None => self.secrets.push((k.clone(), Some(Secret::new(v.clone())))),
            }
        }
    }

    /// Names of envs and secrets still missing a value.
    pub fn missing_values(&self) -> Vec<String> {
        self.envs
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| k.clone())
            .chain(
                self.secrets
                    .iter()
                    .filter(|(_, v)| v.is_none())
                    .map(|(k, _)| k.clone()),
            )
            .collect()
    }

    /// The file a task came from, for messages.
    pub fn display_name(&self, path: &Path) -> String {
        self.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
    }
}

#[cfg(test)]
mod tests;

/// The allowed name closest to `key`, if close enough to be a typo.
pub fn closest_name<'a>(key: &str, allowed: &[&'a str]) -> Option<&'a str> {
    decode::closest(key, allowed)
}

/// Parses the value of `--gpus`, `--infra`, `--cpus` or `--memory` into the
/// resource field it overrides; the error is the task field's error.
pub fn parse_flag(flag: &str, text: &str) -> Result<ResourceSpec, SpecError> {
    decode::flag(flag, text)
}
