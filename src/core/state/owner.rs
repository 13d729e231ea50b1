//! This installation's owner id, kept in `$GANGWAY_HOME`.

use std::path::Path;

use super::StateError;

/// The file in `$GANGWAY_HOME` that keeps the installation's owner id.
pub(crate) const OWNER_FILE: &str = "owner";

/// This installation's owner id: `gw-` and 16 hex digits from the system's
/// random source, tagged on every cloud resource (`gangway-owner`) and the
/// only owner a plain `down --orphans` sweeps, so installations sharing a
/// cloud account and a user name never sweep each other's clusters. Made on
/// first use and kept in `home/owner` (mode 0600). Two processes making it
/// at once agree on one: each writes its own temporary file, and a hard
/// link (which fails where the name exists) publishes the first whole.
pub(crate) fn owner(home: &Path) -> Result<String, StateError> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = home.join(OWNER_FILE);
    let io = |source: std::io::Error| StateError::Io {
        path: path.clone(),
        source,
    };
    let read = || -> Result<Option<String>, StateError> {
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let id = text.trim();
                if gangway_provider::is_owner_id(id) {
                    Ok(Some(id.to_string()))
                } else {
                    Err(io(std::io::Error::other(format!(
                        "holds '{}', not an owner id (`gw-` and 16 hex digits)",
                        id.chars().take(40).collect::<String>()
                    ))))
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(e)),
        }
    };
    if let Some(id) = read()? {
        return Ok(id);
    }
    std::fs::create_dir_all(home).map_err(io)?;
    let mut random = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(io)?;
    let id: String = std::iter::once("gw-".to_string())
        .chain(random.iter().map(|b| format!("{b:02x}")))
        .collect();
    let tmp = home.join(format!(
        ".{OWNER_FILE}.{}.{:016x}",
        std::process::id(),
        u64::from_le_bytes(random)
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(format!("{id}\n").as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| match std::fs::hard_link(&tmp, &path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        });
    let _ = std::fs::remove_file(&tmp);
    written.map_err(io)?;
    // Ours, or the one another process published first.
    read()?.ok_or_else(|| io(std::io::ErrorKind::NotFound.into()))
}
