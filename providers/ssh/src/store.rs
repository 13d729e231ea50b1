//! Allocation records on disk: one file per allocated host under
//! `root/alloc/`, created with `O_EXCL` while holding an exclusive `flock`
//! on `root/lock`.
//!
//! Every record is created and written under the lock, so a record that
//! cannot be parsed while the lock is held was left by a process killed
//! in the middle of writing it (its launch never returned): it is removed.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// `root/alloc/<pool>__<host>`: one host allocated to one cluster.
///
/// `cluster`, `owner`, `client_token` and `at_ms` say who holds the host
/// and since when; the rest is a copy of what the host was at allocation
/// time, so a host since removed from the inventory can still be reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Alloc {
    pub cluster: String,
    pub owner: String,
    pub client_token: String,
    pub at_ms: u64,
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub instance_type: String,
    #[serde(default)]
    pub address: String,
}

/// The directory the records live in.
#[derive(Clone, Debug)]
pub(crate) struct Store {
    pub root: PathBuf,
}

impl Store {
    fn alloc_dir(&self) -> PathBuf {
        self.root.join("alloc")
    }

    /// Takes the exclusive lock (waiting for it), creating the directories.
    pub fn lock(&self) -> io::Result<Locked> {
        fs::create_dir_all(self.alloc_dir())?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.root.join("lock"))?;
        loop {
            // SAFETY: flock on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(Locked {
                    dir: self.alloc_dir(),
                    _file: file,
                });
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// The store while this process holds the lock (released on drop, or by
/// the kernel when the process dies).
pub(crate) struct Locked {
    dir: PathBuf,
    _file: File,
}

impl Locked {
    /// Every record, by file name, in no particular order. Removes records
    /// that do not parse (see the module documentation) and ignores other
    /// entries (dot files).
    pub fn read_all(&self) -> io::Result<Vec<(String, Alloc)>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            match serde_json::from_slice::<Alloc>(&bytes) {
                Ok(a) => out.push((name, a)),
                Err(_) => remove(&path)?,
            }
        }
        Ok(out)
    }

    /// Creates the record for `a.pool`/`a.host`; `Ok(false)` when one
    /// exists already. A record that could not be written whole is removed.
    pub fn create(&self, a: &Alloc) -> io::Result<bool> {
        let path = self.dir.join(file_name(&a.pool, &a.host));
        let mut f = match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e),
        };
        let written = serde_json::to_vec_pretty(a)
            .map_err(io::Error::other)
            .and_then(|mut bytes| {
                bytes.push(b'\n');
                f.write_all(&bytes)?;
                f.sync_all()
            });
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        sync_dir(&self.dir);
        Ok(true)
    }

    /// Marks the host of record `name` resting until `until_ms`.
    pub fn rest(&self, name: &str, until_ms: u64) -> io::Result<()> {
        let dir = self.dir.with_file_name("rest");
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{name}.tmp"));
        fs::write(&tmp, format!("{until_ms}\n"))?;
        fs::rename(&tmp, dir.join(name))?;
        sync_dir(&dir);
        Ok(())
    }

    /// The record names of hosts resting at `now_ms`; expired marks go.
    pub fn resting(&self, now_ms: u64) -> io::Result<BTreeSet<String>> {
        let dir = self.dir.with_file_name("rest");
        let mut out = BTreeSet::new();
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let until = fs::read_to_string(e.path())
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if until > now_ms {
                out.insert(name);
            } else {
                remove(&e.path())?;
            }
        }
        Ok(out)
    }

    /// Deletes the record with this file name; a missing one is fine.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        remove(&self.dir.join(name))?;
        sync_dir(&self.dir);
        Ok(())
    }
}

fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// `<pool>__<host>`, each part with every byte outside `[A-Za-z0-9._-]`
/// (and a leading `.`) written as `%XX`. Underscores of the pool are
/// escaped too when it contains `__` or ends with `_`, so that the first
/// `__` of a name always separates the two parts: different hosts never
/// share a file.
pub(crate) fn file_name(pool: &str, host: &str) -> String {
    let tricky = pool.contains("__") || pool.ends_with('_');
    format!("{}__{}", escape(pool, tricky), escape(host, false))
}

fn escape(s: &str, underscore: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, b) in s.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric()
            || b == b'-'
            || (b == b'.' && i > 0)
            || (b == b'_' && !underscore);
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Milliseconds since the epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
