//! A local node's view of the task's absolute paths (Linux).
//!
//! A local node is a directory, and the paths a task names absolutely
//! (`file_mounts: {/data: ...}`, a checkpoint directory `/ckpt`) are kept
//! under its `root/` ([`crate::LocalTransport`]'s `node_path`). So that the
//! task's own commands find them where the task says (`cat /data/x`), each
//! of its commands starts in a mount namespace of its own, in which every
//! path under `root/` is bind-mounted at its absolute place:
//!
//! - where the host has the path's parent and the path itself, the node's
//!   copy is mounted over it (the host's stays as it was, for everyone
//!   else);
//! - where the host lacks the path (no `/data` on this machine), its
//!   nearest existing ancestor is *mirrored*: a directory of the node's own
//!   (`view/` in the node's directory) takes its place, holding a bind of
//!   every entry the host has there, plus the missing path. Anything the
//!   node later creates at a mirrored level (a new file in `/`, say) stays
//!   in `view/`: the node's own, kept between its commands, deleted with
//!   the node;
//! - the command then runs chrooted into the mirrored `/` when `/` had to
//!   be mirrored.
//!
//! Nothing is mounted in the host's namespace and nothing is created
//! outside the node's directory. As root this needs only a mount
//! namespace; otherwise a user namespace as well, mapping the user to
//! itself (so files keep their owners' names only for the user's own: the
//! rest show as `nobody`, and `sudo` does not work inside). Where neither
//! is allowed the command runs as before, the paths under `root/`, and
//! the transport says so once.
//!
//! The plan is made in the parent (directory reads, allocations); the
//! child, between fork and exec, only makes system calls on prepared
//! strings.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The node-relative directory the mirrors live in.
pub(crate) const VIEW_DIR: &str = "view";

/// What a command's namespace needs, made before the fork.
#[derive(Debug)]
pub(crate) struct View {
    /// The task's absolute paths put in place, for messages.
    pub(crate) paths: Vec<String>,
    /// Binds, in order: each source over its target.
    binds: Vec<Bind>,
    /// Where to chroot to, when `/` is mirrored.
    root: Option<CString>,
    /// The command's directory (as the host spells it; it exists in the
    /// view too).
    cwd: CString,
    /// The parent's mount namespace, to refuse to go on in it.
    parent_ns: (u64, u64),
    /// `uid_map`/`gid_map` lines, when not root.
    maps: Option<(Vec<u8>, Vec<u8>)>,
}

/// The task's paths of a node: every entry under `root` whose host path
/// does not exist, or is not a directory, or is a mount point (a bucket
/// MOUNT) in `root`; where both are directories, the entries under it.
/// Pairs of (absolute path, node's copy).
fn task_paths(root: &Path, host: &Path) -> io::Result<Vec<(PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    walk(root, host, Path::new(""), &mut out)?;
    Ok(out)
}

fn walk(root: &Path, host: &Path, rel: &Path, out: &mut Vec<(PathBuf, PathBuf)>) -> io::Result<()> {
    let mut entries: Vec<(OsString, bool)> = Vec::new();
    for e in fs::read_dir(root.join(rel))? {
        let e = e?;
        entries.push((e.file_name(), e.file_type()?.is_dir()));
    }
    entries.sort();
    for (name, is_dir) in entries {
        let rel = rel.join(&name);
        let mine = root.join(&rel);
        let theirs = host.join(&rel);
        let host_dir = fs::metadata(&theirs).is_ok_and(|m| m.is_dir());
        if is_dir && host_dir && !crate::store::is_mount_point(&mine) {
            walk(root, host, &rel, out)?;
        } else {
            out.push((Path::new("/").join(&rel), mine));
        }
    }
    Ok(())
}

/// A tree of the task's paths, by component.
#[derive(Debug, Default)]
struct Tree {
    /// The node's copy, when this is one of the task's paths.
    source: Option<PathBuf>,
    children: BTreeMap<OsString, Tree>,
}

impl Tree {
    fn insert(&mut self, path: &Path, source: PathBuf) {
        let mut t = self;
        for c in path.components().skip(1) {
            t = t.children.entry(c.as_os_str().to_owned()).or_default();
        }
        t.source = Some(source);
    }
}

/// Plans the view of a node whose directory is `node_dir`, for a command
/// in `cwd`, with `host` as the machine's `/` (tests use another). `None`
/// when the node has no absolute paths. Creates what the view needs in
/// `node_dir/view` (directories, empty files and symbolic links standing
/// for the host's entries at each mirrored level).
pub(crate) fn plan(node_dir: &Path, cwd: &Path, host: &Path) -> io::Result<Option<View>> {
    let root = node_dir.join("root");
    let paths = match task_paths(&root, host) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if paths.is_empty() {
        return Ok(None);
    }
    let mut tree = Tree::default();
    for (path, source) in &paths {
        tree.insert(path, source.clone());
    }
    let view = node_dir.join(VIEW_DIR).join("root");
    let mut b = Builder {
        host,
        view: &view,
        binds: Vec::new(),
    };
    // `/` is mirrored when a path's parent is missing on the host or is
    // `/` itself (a task path directly under `/` that the host lacks).
    let mirror_root = needs_mirror(host, Path::new("/"), &tree);
    if mirror_root {
        fs::create_dir_all(&view)?;
        b.mirror(Path::new("/"), &view, &tree)?;
    } else {
        b.over(Path::new("/"), host, &tree)?;
    }
    let parent_ns = fs::metadata("/proc/self/ns/mnt").map(|m| (m.dev(), m.ino()))?;
    Ok(Some(View {
        paths: paths.iter().map(|(p, _)| p.display().to_string()).collect(),
        binds: b.binds,
        root: mirror_root.then(|| c(&view)).transpose()?,
        cwd: c(cwd)?,
        parent_ns,
        maps: maps(),
    }))
}

/// Whether `at` (a directory the host has, as `host`+`at`) needs
/// mirroring: the host lacks one of the task's paths, or of the
/// directories leading to them, directly under it.
fn needs_mirror(host: &Path, at: &Path, t: &Tree) -> bool {
    t.children.keys().any(|name| {
        let p = at.join(name);
        fs::symlink_metadata(rebase(host, &p)).is_err()
    })
}

/// `p` (absolute) under `host` instead of `/`.
fn rebase(host: &Path, p: &Path) -> PathBuf {
    host.join(p.strip_prefix("/").unwrap_or(p))
}

fn c(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// One bind of a view: `src` over `dst`.
#[derive(Debug)]
struct Bind {
    src: CString,
    dst: CString,
    /// One of the machine's entries at a mirrored level (not a task
    /// path): it may be gone by the time the command starts (a temporary
    /// directory in `/tmp`), and then it is left out of the view.
    may_vanish: bool,
}

struct Builder<'a> {
    host: &'a Path,
    /// The node's mirror of `/` (`view/root`): a mirrored directory `p`
    /// lives at `view` + `p`.
    view: &'a Path,
    binds: Vec<Bind>,
}

impl Builder<'_> {
    fn bind(&mut self, src: &Path, dst: &Path) -> io::Result<()> {
        self.binds.push(Bind {
            src: c(src)?,
            dst: c(dst)?,
            may_vanish: false,
        });
        Ok(())
    }

    /// [`Builder::bind`] of one of the machine's entries, which may vanish
    /// before the command starts.
    fn bind_theirs(&mut self, src: &Path, dst: &Path) -> io::Result<()> {
        self.bind(src, dst)?;
        if let Some(b) = self.binds.last_mut() {
            b.may_vanish = true;
        }
        Ok(())
    }

    /// Task paths under `at` (a directory the host has, seen at `seen` in
    /// the command's view), none of whose levels needs mirroring at `at`:
    /// each child either is a task path (bound over the host's) or leads
    /// to some (mirrored below if needed, else walked).
    fn over(&mut self, at: &Path, seen: &Path, t: &Tree) -> io::Result<()> {
        for (name, sub) in &t.children {
            let p = at.join(name);
            let here = seen.join(name);
            if let Some(src) = &sub.source {
                self.bind(src, &here)?;
            } else if needs_mirror(self.host, &p, sub) {
                // The mirror lives in the node's view, bound over the
                // host's directory.
                let m = self.view.join(p.strip_prefix("/").unwrap_or(&p));
                fs::create_dir_all(&m)?;
                self.mirror(&p, &m, sub)?;
                // Over the host's directory, after its entries were bound
                // into the mirror (the binds above read the host's).
                self.bind(&m, &here)?;
            } else {
                self.over(&p, &here, sub)?;
            }
        }
        Ok(())
    }

    /// Fills `m` (a directory of the node's view) with `at`'s entries on
    /// the host, bound, and the task paths of `t` below it.
    fn mirror(&mut self, at: &Path, m: &Path, t: &Tree) -> io::Result<()> {
        let on_host = rebase(self.host, at);
        let mut entries: Vec<(OsString, fs::FileType)> = Vec::new();
        if on_host.is_dir() {
            for e in fs::read_dir(&on_host)? {
                let e = e?;
                entries.push((e.file_name(), e.file_type()?));
            }
        }
        // By name, but the entry holding the mirror itself first: bound
        // before anything is bound into the mirror, it carries no copies of
        // those binds.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.sort_by_key(|(name, _)| !m.starts_with(on_host.join(name)));
        for (name, ty) in &entries {
            if t.children.contains_key(name) {
                continue;
            }
            let theirs = on_host.join(name);
            let mine = m.join(name);
            if ty.is_symlink() {
                // Gone since it was listed: left out.
                let Ok(target) = fs::read_link(&theirs) else {
                    continue;
                };
                match fs::read_link(&mine) {
                    Ok(old) if old == target => {}
                    _ => {
                        let _ = fs::remove_file(&mine);
                        std::os::unix::fs::symlink(&target, &mine)?;
                    }
                }
                continue;
            }
            placeholder(&mine, ty.is_dir())?;
            self.bind_theirs(&theirs, &mine)?;
        }
        for (name, sub) in &t.children {
            let p = at.join(name);
            let theirs = on_host.join(name);
            let mine = m.join(name);
            if let Some(src) = &sub.source {
                placeholder(&mine, fs::metadata(src).map(|m| m.is_dir()).unwrap_or(true))?;
                self.bind(src, &mine)?;
            } else if fs::metadata(&theirs).is_ok_and(|m| m.is_dir()) {
                if needs_mirror(self.host, &p, sub) {
                    placeholder(&mine, true)?;
                    self.mirror(&p, &mine, sub)?;
                } else {
                    placeholder(&mine, true)?;
                    self.bind(&theirs, &mine)?;
                    self.over(&p, &mine, sub)?;
                }
            } else {
                // Missing on the host: a directory of the view's own.
                placeholder(&mine, true)?;
                self.mirror(&p, &mine, sub)?;
            }
        }
        Ok(())
    }
}

/// An empty directory or file at `p` to mount on (kept if there).
fn placeholder(p: &Path, dir: bool) -> io::Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() == dir && !m.file_type().is_symlink() => return Ok(()),
        Ok(m) if m.is_dir() => fs::remove_dir_all(p)?,
        Ok(_) => fs::remove_file(p)?,
        Err(_) => {}
    }
    if dir {
        fs::create_dir(p)
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(p)
            .map(drop)
    }
}

impl View {
    /// Enters the view: to be called in the child, between fork and exec.
    /// Makes only system calls.
    pub(crate) fn enter(&self) -> io::Result<()> {
        let flags = if self.maps.is_some() {
            libc::CLONE_NEWUSER | libc::CLONE_NEWNS
        } else {
            libc::CLONE_NEWNS
        };
        // SAFETY: unshare affects only this (single-threaded, forked)
        // process.
        check(unsafe { libc::unshare(flags) })?;
        // Never go on in the parent's namespace: a bind there would show
        // the host's directories inside the node's, where deleting the
        // node would reach them.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid NUL-terminated path and a stat buffer.
        check(unsafe { libc::stat(c"/proc/self/ns/mnt".as_ptr(), &mut st) })?;
        if (st.st_dev, st.st_ino) == self.parent_ns {
            return Err(io::Error::other("still in the parent's mount namespace"));
        }
        if let Some((uid_map, gid_map)) = &self.maps {
            write_proc(c"/proc/self/setgroups", b"deny")?;
            write_proc(c"/proc/self/uid_map", uid_map)?;
            write_proc(c"/proc/self/gid_map", gid_map)?;
        }
        // Nothing done here reaches the host's namespace.
        // SAFETY: valid NUL-terminated strings or nulls, as mount(2) takes.
        check(unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        })?;
        for b in &self.binds {
            // SAFETY: as above.
            let bound = check(unsafe {
                libc::mount(
                    b.src.as_ptr(),
                    b.dst.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                )
            });
            match bound {
                Err(e) if b.may_vanish && e.raw_os_error() == Some(libc::ENOENT) => {}
                other => other?,
            }
        }
        if let Some(root) = &self.root {
            // SAFETY: valid NUL-terminated paths.
            check(unsafe { libc::chroot(root.as_ptr()) })?;
        }
        // SAFETY: as above.
        check(unsafe { libc::chdir(self.cwd.as_ptr()) })?;
        Ok(())
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn write_proc(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: a valid path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    check(fd)?;
    // SAFETY: `data` is valid for its length.
    let n = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let err = io::Error::last_os_error();
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    if n < 0 {
        return Err(err);
    }
    Ok(())
}

/// Whether this process may make a command's namespace at all (tried
/// once, on `true`): the reason when not.
pub(crate) fn usable() -> Result<(), String> {
    static USABLE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    USABLE
        .get_or_init(|| {
            use std::os::unix::process::CommandExt;
            let tried = View {
                paths: Vec::new(),
                binds: Vec::new(),
                root: None,
                cwd: CString::from(c"/"),
                parent_ns: fs::metadata("/proc/self/ns/mnt")
                    .map(|m| (m.dev(), m.ino()))
                    .map_err(|e| format!("cannot read /proc/self/ns/mnt: {e}"))?,
                maps: maps(),
            };
            let mut cmd = std::process::Command::new("true");
            cmd.stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            // SAFETY: `enter` makes only system calls on prepared data.
            unsafe { cmd.pre_exec(move || tried.enter()) };
            match cmd.status() {
                Ok(s) if s.success() => Ok(()),
                Ok(s) => Err(format!("a test command in one ended with {s}")),
                Err(e) => Err(format!("cannot make one: {e}")),
            }
        })
        .clone()
}

/// The user and group maps of a user namespace, when not root.
fn maps() -> Option<(Vec<u8>, Vec<u8>)> {
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (uid != 0).then(|| {
        (
            format!("{uid} {uid} 1\n").into_bytes(),
            format!("{gid} {gid} 1\n").into_bytes(),
        )
    })
}
