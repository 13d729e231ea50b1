//! Owner locks: advisory `flock`s the kernel drops when their process dies.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use super::StateError;

/// A held lock; dropping it (or the process dying) releases it.
#[derive(Debug)]
pub(crate) struct OwnerLock {
    /// Held, never read: closing it (drop, or the process dying) is what
    /// releases the lock.
    _file: File,
}

fn flock(f: &File, op: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock on a file descriptor this File owns.
    let r = unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

impl OwnerLock {
    /// Takes the lock at `path` if no live process holds it. Retries briefly,
    /// so a concurrent `is_held` probe never makes it fail.
    pub(crate) fn try_acquire(path: &Path) -> Result<Option<OwnerLock>, StateError> {
        let io = |source| StateError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        for attempt in 0..5 {
            if flock(&file, libc::LOCK_EX).map_err(io)? {
                // The pid is for error messages only; the lock is the truth.
                file.set_len(0).map_err(io)?;
                file.rewind().map_err(io)?;
                write!(file, "{}", std::process::id()).map_err(io)?;
                return Ok(Some(OwnerLock { _file: file }));
            }
            if attempt < 4 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(None)
    }

    /// Waits until the lock is free, then takes it.
    pub(crate) fn acquire(path: &Path, timeout: Duration) -> Result<Option<OwnerLock>, StateError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(l) = Self::try_acquire(path)? {
                return Ok(Some(l));
            }
            if std::time::Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether a live process holds the lock at `path`.
    pub(crate) fn is_held(path: &Path) -> bool {
        let Ok(file) = File::open(path) else {
            return false;
        };
        // A shared probe: never conflicts with another probe, and released
        // at once when `file` drops.
        !matches!(flock(&file, libc::LOCK_SH), Ok(true))
    }

    /// The pid written by the last holder, if any.
    pub(crate) fn holder(path: &Path) -> Option<u32> {
        let mut s = String::new();
        File::open(path).ok()?.read_to_string(&mut s).ok()?;
        s.trim().parse().ok()
    }
}
