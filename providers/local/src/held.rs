//! Files held by a group of processes: how the local cloud tells a live
//! process group of its own from a dead one whose id the system has handed
//! to someone else, the same way on Linux and macOS (no `/proc`).
//!
//! The caller creates the file and takes an exclusive `flock` on it, and
//! the processes it then starts inherit that open file (and with it the
//! lock); so do their children. The lock lasts until the last of them has
//! exited or closed it. Anyone may ask whether it is still held by trying
//! to take it without waiting.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::Path;

/// Creates (or truncates) `path` with `contents` and takes its lock.
pub(crate) fn create(path: &Path, contents: &[u8]) -> io::Result<File> {
    use std::io::Write;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    flock(&file, libc::LOCK_EX | libc::LOCK_NB)?;
    file.write_all(contents)?;
    Ok(file)
}

/// Whether some process still holds the lock of `path`. A file that cannot
/// be opened (gone, never made) is held by no one.
pub(crate) fn is_held(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    match flock(&file, libc::LOCK_SH | libc::LOCK_NB) {
        // Taken, so no holder; released when `file` drops.
        Ok(()) => false,
        Err(e) => e.raw_os_error() == Some(libc::EWOULDBLOCK),
    }
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor `file` owns.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Lets the child a command starts inherit `fd` (every descriptor Rust
/// opens is close-on-exec): the flag is cleared in the child only, between
/// fork and exec, so no other process this one starts meanwhile gets it.
pub(crate) fn inherit(cmd: &mut std::process::Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure calls only fcntl, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || keep_open_on_exec(fd));
    }
}

/// [`inherit`] for tokio's command.
pub(crate) fn inherit_tokio(cmd: &mut tokio::process::Command, fd: RawFd) {
    // SAFETY: as in `inherit`.
    unsafe {
        cmd.pre_exec(move || keep_open_on_exec(fd));
    }
}

fn keep_open_on_exec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the parent keeps open across the fork.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_while_a_child_keeps_it_and_free_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run");
        assert!(!is_held(&path), "a missing file is held by no one");
        let file = create(&path, b"GANGWAY_RUN=1\n").unwrap();
        assert!(is_held(&path));
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.arg("-c").arg("cat >/dev/null");
        cmd.stdin(std::process::Stdio::piped());
        inherit(&mut cmd, file.as_raw_fd());
        let mut child = cmd.spawn().unwrap();
        drop(file);
        // Our descriptor is closed: the child's inherited one holds it.
        assert!(is_held(&path));
        assert_eq!(std::fs::read(&path).unwrap(), b"GANGWAY_RUN=1\n");
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
        let t = std::time::Instant::now();
        while is_held(&path) && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!is_held(&path));

        // A child that did not inherit it never holds it.
        let file = create(&path, b"").unwrap();
        let mut other = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg("cat >/dev/null")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(file);
        // (A fork by another thread may hold a copy until its exec closes
        // it: the lock can outlive our descriptor by that long.)
        let t = std::time::Instant::now();
        while is_held(&path) && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!is_held(&path));
        drop(other.stdin.take());
        other.wait().unwrap();
    }
}
