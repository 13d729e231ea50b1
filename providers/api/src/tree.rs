//! Directory trees copied between this machine and nodes.
//!
//! Uploads ([`copy_tree`]) carry the user's own files to a node. Downloads
//! go the other way and bring back whatever a node's job wrote, so they
//! treat every entry as hostile: [`merge_newest`] and [`unpack_merging`]
//! never create, follow or write through a link that leaves the
//! destination tree, never take an absolute path or a `..` from a tar
//! stream, never create devices, FIFOs or hard links, and never keep a
//! setuid, setgid or sticky bit or a node's owner. What they leave out is
//! returned, one line per entry, for the job's events.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Entries a download left out, one line each: the path in the node's
/// tree and why.
pub type Skipped = Vec<String>;

/// Copies `src` (file or directory) to `dest`, skipping files whose size
/// and modification time already match; symlinks are copied as links.
/// For the user's own files going to a node, never for what comes back.
pub fn copy_tree(src: &Path, dest: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    if meta.is_dir() {
        std::fs::create_dir_all(dest)?;
        for entry in std::fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dest.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(src)?;
        let _ = std::fs::remove_file(dest);
        return std::os::unix::fs::symlink(target, dest);
    }
    if let Ok(d) = std::fs::metadata(dest) {
        if d.len() == meta.len() && d.modified().ok() == meta.modified().ok() {
            return Ok(());
        }
    }
    std::fs::copy(src, dest)?;
    if let Ok(m) = meta.modified() {
        let f = std::fs::File::options().write(true).open(dest)?;
        f.set_modified(m)?;
    }
    Ok(())
}

/// Merges the tree under `src` (a node's directory, or a download's
/// staging directory) into `dest`, where a file already at least as new
/// wins. `dest` itself is this machine's and trusted; nothing under `src`
/// is: see the module's rules. Returns what was left out.
pub fn merge_newest(src: &Path, dest: &Path) -> std::io::Result<Skipped> {
    let mut skipped = Skipped::new();
    std::fs::create_dir_all(dest)?;
    if std::fs::symlink_metadata(src)?.is_dir() {
        merge_dir(src, dest, Path::new(""), &mut skipped)?;
    } else {
        skipped.push(format!(
            "{}: not a directory; nothing copied",
            src.display()
        ));
    }
    Ok(skipped)
}

fn merge_dir(
    src_root: &Path,
    dest_root: &Path,
    rel: &Path,
    skipped: &mut Skipped,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(src_root.join(rel))?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let rel = rel.join(entry.file_name());
        let from = src_root.join(&rel);
        let to = dest_root.join(&rel);
        let meta = std::fs::symlink_metadata(&from)?;
        let kind = meta.file_type();
        // lstat: a link at the destination is a link, never its target.
        let there = std::fs::symlink_metadata(&to).ok();
        let there_is_dir = there.as_ref().is_some_and(|m| m.is_dir());
        if kind.is_dir() {
            match &there {
                None => std::fs::create_dir(&to)?,
                Some(_) if there_is_dir => {}
                Some(_) => {
                    skipped.push(format!(
                        "{}: a directory where another node left a file or link; kept that",
                        rel.display()
                    ));
                    continue;
                }
            }
            merge_dir(src_root, dest_root, &rel, skipped)?;
            continue;
        }
        if there_is_dir {
            skipped.push(format!(
                "{}: a file or link where another node left a directory; kept that",
                rel.display()
            ));
            continue;
        }
        if let (Some(d), Ok(m)) = (&there, meta.modified()) {
            if d.modified().is_ok_and(|dm| dm >= m) {
                continue;
            }
        }
        if kind.is_symlink() {
            let target = std::fs::read_link(&from)?;
            place_link(&rel, &target, &to, there.is_some(), skipped)?;
        } else if kind.is_file() {
            let file = open_no_follow(&from)?;
            place_file(file, &to, executable(&meta), meta.modified().ok())?;
        } else {
            skipped.push(format!(
                "{}: not a file, directory or link (a device, FIFO or socket); not copied",
                rel.display()
            ));
        }
    }
    Ok(())
}

/// Whether the link `target`, found at `rel` (relative to the tree's
/// root), names something inside the tree, read as a path: relative, and
/// never climbing above the root. Every directory on the way is a real
/// directory (the merge checks), so the path is what the kernel follows.
pub fn link_stays_inside(rel: &Path, target: &Path) -> bool {
    let mut depth = rel.components().count() as i64 - 1;
    if target.as_os_str().is_empty() {
        return false;
    }
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Makes the link `to` (at `rel` in the tree) to `target` when the link
/// stays inside the tree, replacing the file or link `there` was;
/// otherwise says in `skipped` that it was left out.
fn place_link(
    rel: &Path,
    target: &Path,
    to: &Path,
    there: bool,
    skipped: &mut Skipped,
) -> std::io::Result<()> {
    if !link_stays_inside(rel, target) {
        skipped.push(format!(
            "{}: a link to {} leaves the directory; not copied",
            rel.display(),
            target.display()
        ));
        return Ok(());
    }
    if there {
        std::fs::remove_file(to)?;
    }
    std::os::unix::fs::symlink(target, to)
}

fn executable(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Writes `from`'s bytes to `to` through a new file beside it renamed
/// over it (a rename replaces a link at `to`, never writes through it):
/// mode 0644, or 0755 when the source was executable; never a setuid,
/// setgid or sticky bit; owned by this process's user.
fn place_file(
    mut from: impl Read,
    to: &Path,
    exec: bool,
    mtime: Option<std::time::SystemTime>,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let parent = to.parent().unwrap_or(Path::new("."));
    let name = to
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let mode = if exec { 0o755 } else { 0o644 };
    for i in 0..100u32 {
        let tmp = parent.join(format!(".gangway-merge-{}-{i}-{name}", std::process::id()));
        let mut out = match std::fs::File::options()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let written = std::io::copy(&mut from, &mut out).and_then(|_| match mtime {
            Some(m) => out.set_modified(m),
            None => Ok(()),
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, to)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "no free temporary name beside {}",
        to.display()
    )))
}

/// A tar member's path as a path inside the tree: `./` and empty segments
/// dropped; `None` for an absolute path, a `..` segment or the root
/// itself.
fn member_path(raw: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Makes `rel`'s directories under `root` as real directories; `false`
/// when one on the way is a file or a link (nothing is written then).
fn real_dirs(root: &Path, rel: &Path) -> std::io::Result<bool> {
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(&at)?,
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Unpacks a tar stream of a node's directory (what `tar -C DIR -cf - .`
/// wrote there) into a fresh directory beside `dest`, by the module's
/// rules, then [`merge_newest`]s it into `dest`: a stream that does not
/// unpack changes nothing in `dest`. Returns what was left out.
pub fn unpack_merging(packed: impl std::io::Read, dest: &Path) -> std::io::Result<Skipped> {
    Staged::unpack(packed, dest)?.merge()
}

/// A node's tar stream unpacked beside its destination, not merged yet:
/// for a stream read as it arrives (an SSH command's output), whose
/// sender's exit status is known only at its end. Dropped unmerged, it
/// leaves nothing behind.
#[derive(Debug)]
pub struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
    skipped: Skipped,
}

impl Staged {
    /// Reads `packed` to its end into a fresh directory beside `dest` (by
    /// the module's rules), holding only one entry's buffer in memory.
    pub fn unpack(packed: impl std::io::Read, dest: &Path) -> std::io::Result<Staged> {
        std::fs::create_dir_all(dest)
            .map_err(context(format!("cannot create {}", dest.display())))?;
        let tmp =
            tempdir_beside(dest).map_err(context("cannot make a temporary directory".into()))?;
        let mut staged = Staged {
            tmp,
            dest: dest.to_path_buf(),
            skipped: Skipped::new(),
        };
        // On an error, dropping `staged` removes the directory.
        staged.skipped = unpack_into(packed, &staged.tmp)
            .map_err(context("cannot read the node's tar stream".into()))?;
        Ok(staged)
    }

    /// Merges what was unpacked into the destination ([`merge_newest`]);
    /// what was left out, from both steps.
    pub fn merge(mut self) -> std::io::Result<Skipped> {
        let mut skipped = std::mem::take(&mut self.skipped);
        skipped.extend(merge_newest(&self.tmp, &self.dest)?);
        Ok(skipped)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// How [`unpack_from_command`] failed.
#[derive(Debug)]
pub enum CommandTarError {
    /// The command could not be started.
    Spawn(std::io::Error),
    /// It ended unsuccessfully: its status and what it said on stderr.
    Failed(std::process::ExitStatus, String),
    /// Its stream could not be unpacked or merged.
    Unpack(std::io::Error),
}

/// Runs `cmd`, whose standard output is a node's tar stream or nothing
/// (`tar -c` of a directory the node may not have), unpacking it as it
/// arrives (a checkpoint can be larger than memory) and merging it into
/// `dest` only once the command exited 0; nothing sent, nothing made.
/// Its stderr is read beside the stream, so a chatty node never stalls it.
pub fn unpack_from_command(
    mut cmd: std::process::Command,
    dest: &Path,
) -> Result<Skipped, CommandTarError> {
    use std::process::Stdio;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(CommandTarError::Spawn)?;
    let (Some(stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(CommandTarError::Spawn(std::io::Error::other("no pipes")));
    };
    let said = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stderr.read_to_end(&mut s);
        s
    });
    let staged = stage_stream(stdout, dest);
    let status = child.wait().map_err(CommandTarError::Spawn)?;
    let said = said.join().unwrap_or_default();
    if !status.success() {
        return Err(CommandTarError::Failed(
            status,
            String::from_utf8_lossy(&said).trim().to_string(),
        ));
    }
    match staged {
        None => Ok(Vec::new()),
        Some(staged) => staged
            .and_then(Staged::merge)
            .map_err(CommandTarError::Unpack),
    }
}

/// Unpacks `packed`, a node's tar stream or nothing (`tar -c` of a
/// directory the node may not have), into a directory beside `dest` as it
/// arrives, and reads it to its end so that its writer can finish: `None`
/// when nothing came. Merge the answer only once the writer succeeded.
pub fn stage_stream(packed: impl std::io::Read, dest: &Path) -> Option<std::io::Result<Staged>> {
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(packed);
    let staged = match out.fill_buf() {
        Ok([]) => None,
        Ok(_) => Some(Staged::unpack(&mut out, dest)),
        Err(e) => Some(Err(e)),
    };
    let _ = std::io::copy(&mut out, &mut std::io::sink());
    staged
}

/// Prefixes an error with `what`.
fn context(what: String) -> impl FnOnce(std::io::Error) -> std::io::Error {
    move |e| std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn unpack_into(packed: impl std::io::Read, root: &Path) -> std::io::Result<Skipped> {
    let mut skipped = Skipped::new();
    let mut archive = tar::Archive::new(packed);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let Some(rel) = member_path(&raw) else {
            if raw.components().any(|c| !matches!(c, Component::CurDir)) {
                skipped.push(format!(
                    "{}: an absolute path or one with '..' in the node's tar stream; not copied",
                    raw.display()
                ));
            }
            continue;
        };
        let mtime = entry
            .header()
            .mtime()
            .ok()
            .map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        let parent = rel.parent().unwrap_or(Path::new(""));
        if !real_dirs(root, parent)? {
            skipped.push(format!(
                "{}: under a file or link of the same stream; not copied",
                rel.display()
            ));
            continue;
        }
        let to = root.join(&rel);
        let there = std::fs::symlink_metadata(&to).ok();
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Directory => {
                if !real_dirs(root, &rel)? {
                    skipped.push(format!(
                        "{}: a directory where the stream had a file or link; not copied",
                        rel.display()
                    ));
                }
            }
            _ if there.as_ref().is_some_and(|m| m.is_dir()) => {
                skipped.push(format!(
                    "{}: a file or link where the stream had a directory; not copied",
                    rel.display()
                ));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let exec = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
                place_file(&mut entry, &to, exec, mtime)?;
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()?
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                place_link(&rel, &target, &to, there.is_some(), &mut skipped)?;
            }
            tar::EntryType::Link => {
                // A hard link names an earlier member: its bytes are copied
                // when that member is a file this stream already unpacked.
                let target = entry.link_name()?.map(|t| t.into_owned());
                let earlier = target
                    .as_deref()
                    .and_then(member_path)
                    .map(|t| root.join(t))
                    .filter(|t| std::fs::symlink_metadata(t).is_ok_and(|m| m.is_file()));
                match earlier {
                    Some(t) => {
                        let exec = std::fs::symlink_metadata(&t).is_ok_and(|m| executable(&m));
                        place_file(open_no_follow(&t)?, &to, exec, mtime)?;
                    }
                    None => skipped.push(format!(
                        "{}: a hard link to {} outside the stream; not copied",
                        rel.display(),
                        target.map(|t| t.display().to_string()).unwrap_or_default()
                    )),
                }
            }
            other => skipped.push(format!(
                "{}: not a file, directory or link ({other:?}); not copied",
                rel.display()
            )),
        }
    }
    Ok(skipped)
}

/// A new, empty directory beside `dest` (same file system: the merge can
/// rename), named after this process and the time.
pub fn tempdir_beside(dest: &Path) -> std::io::Result<PathBuf> {
    let parent = dest.parent().unwrap_or(dest);
    for i in 0..100u32 {
        let p = parent.join(format!(
            ".gangway-download-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
                + u64::from(i)
        ));
        if std::fs::create_dir(&p).is_ok() {
            return Ok(p);
        }
    }
    Err(std::io::Error::other("no free temporary directory name"))
}

#[cfg(test)]
mod tests;
