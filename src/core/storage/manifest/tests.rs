//! The manifest rules, in Rust and on the nodes, over the same lines.

use super::*;

const MD5: &str = "0123456789abcdef0123456789abcdef";

fn line(path: &str, key: &str) -> String {
    format!("{path}\t10\t1733390000.123456\t{key}\t{MD5}")
}

/// Lines gangway writes: taken by both.
fn good() -> Vec<String> {
    vec![
        line("model.pt", "gen-5/rank-0/model.pt"),
        line("a/b/c.bin", "gen-3/rank-12/a/b/c.bin"),
        line(".hidden/x", "gen-0/rank-1/.hidden/x"),
        line("spaces in name", "gen-5/rank-0/spaces in name"),
        format!("f\t0\t17\tgen-5/rank-0/f\t{MD5}"),
    ]
}

/// Lines a hostile bucket writer could put there: refused by both.
fn hostile() -> Vec<String> {
    vec![
        // The review's attack: a key that climbs to another bucket.
        line("x", "../../other-bucket/x"),
        line("x", "gen-5/rank-0/../../../other-bucket/x"),
        line("../escape", "gen-5/rank-0/../escape"),
        line("/etc/passwd", "gen-5/rank-0//etc/passwd"),
        line("a//b", "gen-5/rank-0/a//b"),
        line("a/./b", "gen-5/rank-0/a/./b"),
        line("a/", "gen-5/rank-0/a/"),
        line("", "gen-5/rank-0/"),
        line("x", "gen-5/rank-0/y"),
        line("x", "gen-6/rank-0/x"),
        line("x", "gen-05/rank-0/x"),
        line("x", "gen-99999999999999999999/rank-0/x"),
        line("x", "gen-5/rank-a/x"),
        line("x", "gen-5/x"),
        line("x", "s3://other/gen-5/rank-0/x"),
        line("x", "/gen-5/rank-0/x"),
        line(".gangway-synced", "gen-5/rank-0/.gangway-synced"),
        line(
            "d/.gangway-manifest-4",
            "gen-5/rank-0/d/.gangway-manifest-4",
        ),
        line("a\rb", "gen-5/rank-0/a\rb"),
        format!("x\t-1\t17\tgen-5/rank-0/x\t{MD5}"),
        format!("x\t1e3\t17\tgen-5/rank-0/x\t{MD5}"),
        format!("x\t99999999999999999999\t17\tgen-5/rank-0/x\t{MD5}"),
        format!("x\t1\t17.\tgen-5/rank-0/x\t{MD5}"),
        format!("x\t1\tnow\tgen-5/rank-0/x\t{MD5}"),
        "x\t1\t17\tgen-5/rank-0/x\t0123456789ABCDEF0123456789ABCDEF".into(),
        "x\t1\t17\tgen-5/rank-0/x\tshort".into(),
        format!("x\t1\t17\tgen-5/rank-0/x\t{MD5}\textra"),
        "x\t1\t17\tgen-5/rank-0/x".into(),
        String::new(),
    ]
}

#[test]
fn lines_gangway_writes_are_taken() {
    for l in good() {
        let got = parse_line(&l, 5).unwrap_or_else(|e| panic!("{l:?}: {e}"));
        assert!(got.key.ends_with(&format!("/{}", got.path)), "{got:?}");
        assert!(got.generation <= 5 && got.md5 == MD5, "{got:?}");
    }
    let text = good().join("\n") + "\n";
    assert_eq!(parse(&text, 5).unwrap().len(), 5);
}

#[test]
fn hostile_lines_are_refused_naming_the_line() {
    for l in hostile() {
        assert!(parse_line(&l, 5).is_err(), "taken: {l:?}");
        let text = format!("{}\n{l}\n{}\n", good()[0], good()[1]);
        let e = parse(&text, 5).unwrap_err();
        assert_eq!(e.line, 2, "{l:?}: {e}");
    }
    let e = parse_line(&line("x", "../../other-bucket/x"), 5).unwrap_err();
    assert_eq!(e, "key outside gen-N/rank-R/: ../../other-bucket/x");
}

/// The nodes' awk check agrees with the Rust one on every line above
/// (mawk here, as on Debian and Ubuntu images).
#[test]
fn the_nodes_check_agrees_with_this_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut disagree = Vec::new();
    for (l, want_ok) in good()
        .into_iter()
        .map(|l| (l, true))
        .chain(hostile().into_iter().map(|l| (l, false)))
    {
        let file = dir.path().join("rank-0.tsv");
        std::fs::write(&file, format!("{l}\n")).unwrap();
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{VALIDATE}\ngw_ck_valid 5 \"$1\" manifests/5/rank-0.tsv"
            ))
            .arg("validate")
            .arg(&file)
            .output()
            .unwrap();
        let ok = out.status.success();
        if ok != want_ok || ok != parse_line(&l, 5).is_ok() {
            disagree.push(format!(
                "{l:?}: awk {}, rust {}: {}",
                ok,
                parse_line(&l, 5).is_ok(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        if !ok {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("manifests/5/rank-0.tsv line 1: "),
                "{l:?}: {err}"
            );
        }
    }
    assert!(disagree.is_empty(), "{disagree:#?}");
}
