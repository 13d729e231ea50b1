//! The nodes' restore script against a hostile bucket: a directory that
//! rclone reads as the store (a local path is an rclone remote), beside
//! another "bucket" the node's credentials could reach.

use gangway_test::skip;
use std::path::{Path, PathBuf};

struct Store {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Store {
    fn new() -> Store {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        for d in ["bucket/job", "other-bucket", "ck", "home"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("other-bucket/secret"), "not yours").unwrap();
        Store { _dir: dir, root }
    }

    fn job(&self) -> PathBuf {
        self.root.join("bucket/job")
    }

    /// Puts an object under the job's prefix and returns its manifest line
    /// (as gangway writes it) for `path`.
    fn object(&self, gen: u64, rank: u32, path: &str, bytes: &[u8]) -> String {
        let key = format!("gen-{gen}/rank-{rank}/{path}");
        let at = self.job().join(&key);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(&at, bytes).unwrap();
        format!(
            "{path}\t{}\t1733390000.5\t{key}\t{}",
            bytes.len(),
            md5_hex(bytes)
        )
    }

    fn manifest(&self, gen: u64, rank: u32, lines: &[String]) {
        let d = self.job().join(format!("manifests/{gen}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("rank-{rank}.tsv")), lines.join("\n") + "\n").unwrap();
    }

    /// Runs the restore of `gen` as a node's storage step does.
    fn restore(&self, gen: u64) -> (bool, String) {
        // The storage step's own script, as every node runs it.
        let script = super::super::node_script(&[]);
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .env("HOME", self.root.join("home"))
            .env("GANGWAY_CHECKPOINT_DIR", self.root.join("ck"))
            .env("GW_CK_BASE", self.job())
            .env("GW_CK_RESTORE", gen.to_string())
            .env("GW_RCLONE_VERSION", "unused")
            .env("GANGWAY_RCLONE_URL", "http://127.0.0.1:9/none")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// The checkpoint directory's files, without gangway's own.
    fn restored(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.root.join("ck"), Path::new(""), &mut out);
        out.retain(|p| !p.starts_with(".gangway-"));
        out.sort();
        out
    }
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let rel = rel.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            walk(root, &rel, out);
        } else {
            out.push(rel.display().to_string());
        }
    }
}

fn md5_hex(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)[..32].to_string()
}

fn have_rclone() -> bool {
    let ok = std::process::Command::new("rclone")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        skip::ran("local");
    } else {
        skip::skipped("local", "rclone is not installed (the nodes' copy tool)");
    }
    ok
}

#[test]
fn a_checkpoint_restores_and_is_checked_against_its_manifest() {
    if !have_rclone() {
        return;
    }
    let s = Store::new();
    let a = s.object(4, 0, "model.pt", b"weights of step 9");
    let b = s.object(5, 1, "opt/state.bin", b"optimizer");
    s.manifest(5, 0, &[a]);
    s.manifest(5, 1, &[b]);
    let (ok, out) = s.restore(5);
    assert!(ok, "{out}");
    assert_eq!(s.restored(), vec!["model.pt", "opt/state.bin"]);
    assert_eq!(
        std::fs::read(s.root.join("ck/model.pt")).unwrap(),
        b"weights of step 9"
    );
}

/// The review's attack: a manifest line whose key climbs out of the job's
/// prefix made every node copy another bucket into the checkpoint.
#[test]
fn a_manifest_key_that_climbs_to_another_bucket_restores_nothing() {
    if !have_rclone() {
        return;
    }
    let s = Store::new();
    let good = s.object(5, 0, "model.pt", b"weights");
    let evil = format!(
        "secret\t9\t1733390001\t../../other-bucket/secret\t{}",
        md5_hex(b"not yours")
    );
    s.manifest(5, 0, std::slice::from_ref(&good));
    s.manifest(5, 1, &[good, evil]);
    let (ok, out) = s.restore(5);
    assert!(!ok, "restored: {out}");
    assert!(
        out.contains(
            "manifests/5/rank-1.tsv line 2: key outside gen-N/rank-R/: ../../other-bucket/secret"
        ),
        "{out}"
    );
    assert!(
        out.contains("nothing of checkpoint 5 was restored"),
        "{out}"
    );
    assert_eq!(s.restored(), Vec::<String>::new(), "{out}");
}

#[test]
fn a_path_that_climbs_out_of_the_checkpoint_directory_restores_nothing() {
    if !have_rclone() {
        return;
    }
    let s = Store::new();
    let evil = s.object(5, 0, "x", b"payload");
    // Rewritten to a path with `..` and a key that holds it.
    let evil = evil
        .replace("x\t", "../escaped\t")
        .replace("rank-0/x", "rank-0/../escaped");
    s.manifest(5, 0, &[evil]);
    let (ok, out) = s.restore(5);
    assert!(!ok, "{out}");
    assert!(
        out.contains("manifests/5/rank-0.tsv line 1: a . or .. segment"),
        "{out}"
    );
    assert!(!s.root.join("escaped").exists());
}

#[test]
fn an_object_that_differs_from_its_manifest_fails_the_restore() {
    if !have_rclone() {
        return;
    }
    let s = Store::new();
    let line = s.object(5, 0, "model.pt", b"weights");
    // Same size, other bytes: only the MD5 tells.
    std::fs::write(s.job().join("gen-5/rank-0/model.pt"), b"WEIGHTS").unwrap();
    s.manifest(5, 0, std::slice::from_ref(&line));
    let (ok, out) = s.restore(5);
    assert!(!ok, "{out}");
    assert!(out.contains("model.pt has MD5"), "{out}");

    let s = Store::new();
    s.object(5, 0, "model.pt", b"weights");
    std::fs::write(s.job().join("gen-5/rank-0/model.pt"), b"weights, longer").unwrap();
    s.manifest(5, 0, &[line]);
    let (ok, out) = s.restore(5);
    assert!(!ok, "{out}");
    assert!(
        out.contains("model.pt is 15 bytes, its manifest says 7"),
        "{out}"
    );
}
