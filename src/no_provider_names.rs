//! The core never decides by a provider's name: what differs between
//! providers is a method or a type of the contract in `gangway-provider`.
//! This test reads the core's sources and fails on any comparison with a
//! registered provider's name.
//!
//! What counts as a comparison: the name as a string literal next to `==`
//! or `!=` (also inside `Some(..)`), as a `match` or `matches!` pattern
//! (`"name" =>`, `"name" |`, `| "name"`), or in `eq`/`eq_ignore_ascii_case`.
//! Naming a provider is still fine where it is data, not a decision: the
//! embedded catalogs' table, the SkyPilot-layout facts, the list of cloud
//! names a task may spell.
//!
//! What is left out, and why: code compiled only for tests, since tests
//! must name the clouds they set up. That is a file declared as
//! `#[cfg(test)] mod x;` (`optimizer/tests.rs`, `state/tests.rs`, this
//! file), and in every other file whatever follows a `#[cfg(test)]` line
//! that opens a module (rustfmt keeps a file's test module last).

use std::path::{Path, PathBuf};

/// Files under `dir`, with the `.rs` files declared `#[cfg(test)] mod x;`
/// left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut test_only = Vec::new();
    for f in ["lib.rs", "main.rs", "mod.rs"] {
        if let Ok(text) = std::fs::read_to_string(dir.join(f)) {
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            for w in lines.windows(2) {
                if w[0] == "#[cfg(test)]" {
                    if let Some(m) = w[1].strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                        test_only.push(format!("{m}.rs"));
                    }
                }
            }
        }
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() {
            if !test_only.contains(&format!("{name}.rs")) {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") && !test_only.iter().any(|t| t == name) {
            out.push(p);
        }
    }
}

/// The part of a file that is built outside tests.
fn built(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

/// The comparisons with `name` in `line`.
fn compares(line: &str, name: &str) -> bool {
    let lit = format!("\"{name}\"");
    let squeezed: String = line.split_whitespace().collect::<Vec<_>>().join(" ");
    [
        format!("== {lit}"),
        format!("!= {lit}"),
        format!("== Some({lit})"),
        format!("!= Some({lit})"),
        format!("{lit} =="),
        format!("{lit} !="),
        format!("{lit} =>"),
        format!("{lit} |"),
        format!("| {lit}"),
        format!("eq({lit})"),
        format!("eq_ignore_ascii_case({lit})"),
    ]
    .iter()
    .any(|p| squeezed.contains(p.as_str()))
        || (squeezed.contains("matches!(") && squeezed.contains(&lit))
}

#[test]
fn the_core_compares_no_provider_names() {
    let names: Vec<&str> = crate::core::registry::registered().collect();
    assert!(names.contains(&"local"), "{names:?}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 20, "{files:?}");
    assert!(!files.iter().any(|f| f.ends_with("no_provider_names.rs")));
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        for (i, line) in built(&text).lines().enumerate() {
            for name in &names {
                if compares(line, name) {
                    found.push(format!(
                        "{}:{}: {}",
                        f.strip_prefix(&root).unwrap_or(f).display(),
                        i + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core compares provider names; make it a provider method or \
         contract type instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_each_kind_of_comparison_and_skips_tests() {
    for line in [
        r#"if cloud == "local" {"#,
        r#"&& best.cloud != "local""#,
        r#"spec.infra.cloud.as_deref() == Some("local")"#,
        r#"        "slurm" => Some(Box::new(x)),"#,
        r#"!matches!(cloud, "local" | "slurm" | "")"#,
        r#"if c.eq_ignore_ascii_case("aws") {"#,
    ] {
        assert!(
            ["local", "slurm", "aws"].iter().any(|n| compares(line, n)),
            "{line}"
        );
    }
    for line in [
        r#"cloud: "aws".into(),"#,
        r#"("local", include_str!("data/local.csv"), true),"#,
        r#"let home = home.join("ssh");"#,
    ] {
        assert!(
            !["local", "ssh", "aws"].iter().any(|n| compares(line, n)),
            "{line}"
        );
    }
    let text = "fn f() {}\n#[cfg(test)]\nmod tests {\n    x == \"local\"\n}\n";
    assert_eq!(built(text), "fn f() {}");
}
