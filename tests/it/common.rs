//! Running the real `gangway` binary in a clean environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared` beside the repository, if this checkout has it.
pub fn shared() -> Option<PathBuf> {
    let p = root().join("../shared");
    p.is_dir().then_some(p)
}

/// Runs gangway with `args`, with no catalog override from the environment.
pub fn gangway<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_gangway"))
        .args(args)
        .env_remove("GANGWAY_CATALOG_DIR")
        .env_remove("RUST_LOG")
        .current_dir(root())
        .output()
        .expect("gangway runs")
}

/// Exit code, stdout and stderr as strings.
pub fn parts(o: &Output) -> (i32, String, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write fixture");
    p
}
