//! What a hostile node can put in a directory gangway brings back.

use super::*;
use std::os::unix::fs::{symlink, PermissionsExt};

fn future() -> std::time::SystemTime {
    std::time::SystemTime::now() + std::time::Duration::from_secs(86_400)
}

fn touch_future(p: &Path) {
    std::fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_modified(future())
        .unwrap();
}

/// The attack the review reproduced: one rank makes `x` a link to a
/// directory of this machine, another writes `x/file` with a future mtime;
/// merged one after the other into one directory, nothing may land in the
/// link's target.
#[test]
fn a_link_planted_by_one_rank_is_not_written_through_by_another() {
    let t = tempfile::tempdir().unwrap();
    let victim = t.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let rank0 = t.path().join("rank0");
    let rank1 = t.path().join("rank1");
    std::fs::create_dir_all(&rank0).unwrap();
    std::fs::create_dir_all(rank1.join("x")).unwrap();
    symlink(&victim, rank0.join("x")).unwrap();
    std::fs::write(rank1.join("x/authorized_keys"), "attacker").unwrap();
    touch_future(&rank1.join("x/authorized_keys"));
    let dest = t.path().join("merged");

    let s0 = merge_newest(&rank0, &dest).unwrap();
    let s1 = merge_newest(&rank1, &dest).unwrap();

    assert!(
        std::fs::read_dir(&victim).unwrap().next().is_none(),
        "the merge wrote into the link's target"
    );
    assert!(
        std::fs::symlink_metadata(dest.join("x")).unwrap().is_dir(),
        "the outside link was created in the destination"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("x/authorized_keys")).unwrap(),
        "attacker"
    );
    assert!(
        s0[0].contains("x: a link to") && s0[0].contains("leaves"),
        "{s0:?}"
    );
    assert!(s1.is_empty(), "{s1:?}");
}

#[test]
fn a_link_already_in_the_destination_is_replaced_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let victim = t.path().join("victim.txt");
    std::fs::write(&victim, "mine").unwrap();
    let dest = t.path().join("merged");
    std::fs::create_dir(&dest).unwrap();
    symlink(&victim, dest.join("f")).unwrap();
    let src = t.path().join("node");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), "node's").unwrap();
    touch_future(&src.join("f"));

    merge_newest(&src, &dest).unwrap();

    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
    assert!(std::fs::symlink_metadata(dest.join("f")).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(dest.join("f")).unwrap(), "node's");
}

#[test]
fn links_inside_the_tree_are_kept_and_links_out_of_it_are_not() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("node");
    std::fs::create_dir_all(src.join("ck/a")).unwrap();
    std::fs::write(src.join("ck/a/step-9.pt"), "w").unwrap();
    symlink("a/step-9.pt", src.join("ck/latest")).unwrap();
    symlink("../../../etc", src.join("ck/a/up")).unwrap();
    symlink("/etc/passwd", src.join("abs")).unwrap();
    symlink("../ck", src.join("ck/a/sibling")).unwrap();
    let dest = t.path().join("merged");

    let skipped = merge_newest(&src, &dest).unwrap();

    assert_eq!(
        std::fs::read_link(dest.join("ck/latest")).unwrap(),
        Path::new("a/step-9.pt")
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("ck/latest")).unwrap(),
        "w"
    );
    assert!(std::fs::read_link(dest.join("ck/a/sibling")).is_ok());
    assert!(!dest.join("abs").exists() && std::fs::symlink_metadata(dest.join("abs")).is_err());
    assert!(std::fs::symlink_metadata(dest.join("ck/a/up")).is_err());
    assert_eq!(skipped.len(), 2, "{skipped:?}");
}

#[test]
fn setuid_bits_and_special_files_do_not_come_back() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("node");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("tool"), "#!/bin/sh").unwrap();
    std::fs::set_permissions(src.join("tool"), std::fs::Permissions::from_mode(0o6777)).unwrap();
    std::fs::write(src.join("data"), "d").unwrap();
    std::fs::set_permissions(src.join("data"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let fifo = src.join("pipe");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let dest = t.path().join("merged");

    let skipped = merge_newest(&src, &dest).unwrap();

    let mode = |p: &str| {
        std::fs::metadata(dest.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("tool"), 0o755);
    assert_eq!(mode("data"), 0o644);
    assert!(std::fs::symlink_metadata(dest.join("pipe")).is_err());
    assert!(skipped[0].starts_with("pipe: not a file"), "{skipped:?}");
}

#[test]
fn a_newer_file_already_there_wins() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("node");
    let dest = t.path().join("merged");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(src.join("f"), "old").unwrap();
    std::fs::write(dest.join("f"), "new").unwrap();
    touch_future(&dest.join("f"));
    merge_newest(&src, &dest).unwrap();
    assert_eq!(std::fs::read_to_string(dest.join("f")).unwrap(), "new");
}

/// A tar stream built by hand, as a hostile node's `tar` could send it.
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Tar {
        Tar(tar::Builder::new(Vec::new()))
    }
    fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_mtime(2_000_000_000);
        h
    }
    /// A member whose name is written raw into the header (the builder
    /// itself refuses `..` and absolute names).
    fn raw(mut self, kind: tar::EntryType, name: &str, link: &str, data: &[u8]) -> Tar {
        let mut h = Tar::header(kind, data.len() as u64, 0o644);
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }
    fn file(self, name: &str, data: &[u8]) -> Tar {
        self.raw(tar::EntryType::Regular, name, "", data)
    }
    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

#[test]
fn a_tar_stream_cannot_climb_out_or_write_through_its_own_links() {
    let t = tempfile::tempdir().unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let dest = t.path().join("ck").join("merged");
    let packed = Tar::new()
        .raw(tarkind::Directory, "./", "", b"")
        .file("./ok/file", b"fine")
        .file("../../outside/climbed", b"x")
        .file("/abs-file", b"x")
        .raw(tarkind::Symlink, "./out", outside.to_str().unwrap(), b"")
        .file("./out/through", b"inside")
        .raw(tarkind::Symlink, "./in", "ok", b"")
        .file("./in/x", b"through a link")
        .raw(tarkind::Symlink, "./rel", "../../outside", b"")
        .raw(tarkind::Link, "./hard", "/etc/passwd", b"")
        .raw(tarkind::Link, "./hard-ok", "./ok/file", b"")
        .raw(tarkind::Char, "./dev", "", b"")
        .bytes();

    let skipped = unpack_merging(packed.as_slice(), &dest).unwrap();

    assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
    assert_eq!(
        std::fs::read_to_string(dest.join("ok/file")).unwrap(),
        "fine"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("hard-ok")).unwrap(),
        "fine"
    );
    // The outside link was left out, so `out/` is a directory of the tree.
    assert_eq!(
        std::fs::read_to_string(dest.join("out/through")).unwrap(),
        "inside"
    );
    assert_eq!(
        std::fs::read_link(dest.join("in")).unwrap(),
        Path::new("ok")
    );
    assert!(std::fs::symlink_metadata(dest.join("ok/x")).is_err());
    for gone in ["rel", "hard", "dev", "abs-file", "climbed"] {
        assert!(
            std::fs::symlink_metadata(dest.join(gone)).is_err(),
            "{gone} came through: {skipped:?}"
        );
    }
    // ../../outside/climbed, /abs-file, out (the link), in/x, rel, hard,
    // dev.
    assert_eq!(skipped.len(), 7, "{skipped:?}");
    let parent = t.path().join("ck");
    let left: Vec<_> = std::fs::read_dir(&parent)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("merged")],
        "staging left behind"
    );
}

#[test]
fn a_stream_that_does_not_unpack_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("merged");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("kept"), "k").unwrap();
    let mut packed = Tar::new().file("./a", &[7u8; 2000]).bytes();
    packed.truncate(900);
    assert!(unpack_merging(packed.as_slice(), &dest).is_err());
    let names: Vec<_> = std::fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("kept")]);
}

#[test]
fn link_containment_is_read_from_where_the_link_is() {
    assert!(link_stays_inside(Path::new("a/b/l"), Path::new("../x")));
    assert!(link_stays_inside(Path::new("a/b/l"), Path::new("../../x")));
    assert!(!link_stays_inside(
        Path::new("a/b/l"),
        Path::new("../../../x")
    ));
    assert!(!link_stays_inside(Path::new("l"), Path::new("../x")));
    assert!(!link_stays_inside(Path::new("l"), Path::new("/x")));
    assert!(!link_stays_inside(Path::new("l"), Path::new("")));
    assert!(link_stays_inside(Path::new("l"), Path::new("./x/../y")));
    assert!(!link_stays_inside(Path::new("l"), Path::new("x/../../y")));
}

use tar::EntryType as tarkind;

/// A reader handing out a few bytes a call, as a pipe does.
struct Trickle<'a>(&'a [u8]);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(7).min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn a_staged_stream_reaches_dest_only_when_merged() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("merged");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("kept"), "k").unwrap();
    let packed = Tar::new()
        .file("./a", &[7u8; 20_000])
        .file("./d/b", b"bee")
        .bytes();
    let names = |dir: &Path| {
        let mut n: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    };

    // Unpacked, then dropped (the sender failed): nothing changed.
    let staged = Staged::unpack(Trickle(&packed), &dest).unwrap();
    assert_eq!(names(&dest), ["kept"]);
    drop(staged);
    assert_eq!(names(t.path()), ["merged"], "staging left behind");

    // Unpacked from a trickle, then merged.
    let skipped = Staged::unpack(Trickle(&packed), &dest)
        .unwrap()
        .merge()
        .unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(names(&dest), ["a", "d", "kept"]);
    assert_eq!(std::fs::read(dest.join("a")).unwrap(), [7u8; 20_000]);
    assert_eq!(std::fs::read(dest.join("d/b")).unwrap(), b"bee");
    assert_eq!(names(t.path()), ["merged"], "staging left behind");
}

#[test]
fn a_commands_tar_reaches_dest_only_when_it_exits_zero() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/b"), "bee").unwrap();
    let dest = t.path().join("dest");
    let sh = |script: String| {
        let mut c = std::process::Command::new("sh");
        c.arg("-c").arg(script);
        c
    };
    let tar = format!("tar -C {} -cf - .", src.display());

    // A sender that fails after its stream: nothing merged, what it said
    // kept, nothing left beside dest.
    match unpack_from_command(sh(format!("{tar}; echo node says no >&2; exit 3")), &dest) {
        Err(CommandTarError::Failed(status, said)) => {
            assert_eq!(status.code(), Some(3));
            assert_eq!(said, "node says no");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !dest.join("d").exists(),
        "a failed sender's files were merged"
    );
    let left: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "src" && n != "dest")
        .collect();
    assert!(left.is_empty(), "staging left behind: {left:?}");

    // Nothing sent (the node has no such directory): nothing made.
    let none = t.path().join("none");
    assert!(unpack_from_command(sh("true".into()), &none)
        .unwrap()
        .is_empty());
    assert!(!none.exists());

    // A sender that ends well: merged.
    let skipped = unpack_from_command(sh(tar), &dest).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(std::fs::read(dest.join("d/b")).unwrap(), b"bee");

    // A command that cannot start.
    assert!(matches!(
        unpack_from_command(std::process::Command::new("/nonexistent/gw"), &dest),
        Err(CommandTarError::Spawn(_))
    ));
}
