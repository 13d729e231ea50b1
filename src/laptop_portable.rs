//! The laptop side of gangway runs on macOS as well as Linux (the nodes
//! stay Linux): this test reads the sources built for the laptop (the core,
//! the provider contract, the local provider, whose nodes are processes on
//! the laptop, and every other provider's laptop half) and
//! fails on an interface only Linux has, unless it sits behind
//! `cfg(target_os = "linux")` with an alternative next to it.
//!
//! What counts: reading `/proc` or `/sys`, Linux-only system calls and
//! socket flags, the `ip` tool. What is left out, and why: code compiled
//! only for tests (the suites run on Linux), and the scripts the SSH and
//! Slurm transports send to their nodes, which are Linux machines; those
//! are named in [`NODE_SIDE`] with the reason.

use std::path::{Path, PathBuf};

/// Interfaces only Linux has.
const LINUX_ONLY: &[&str] = &[
    "/proc/",
    "/proc\"",
    "\"/sys/",
    "/dev/shm",
    "prctl",
    "PR_SET_PDEATHSIG",
    "MSG_NOSIGNAL",
    "SOCK_CLOEXEC",
    "pipe2",
    "accept4",
    "epoll",
    "inotify",
    "signalfd",
    "eventfd",
    "timerfd",
    "memfd",
    "Command::new(\"ip\")",
];

/// (file, pattern, why it is fine there): text that is a script for a
/// remote Linux node, not something the laptop runs.
const NODE_SIDE: &[(&str, &str, &str)] = &[
    (
        "src/core/transport/ssh.rs",
        "/proc/",
        "signal_job's script runs on the SSH node",
    ),
    (
        "providers/slurm/src/transport.rs",
        "/proc/",
        "signal_job's script runs on the Slurm node",
    ),
    (
        "providers/api/src/transport.rs",
        "/proc/",
        "signal_token and the default kill_cluster are scripts the SSH and Slurm \
         transports run on their nodes (the local transport has its own)",
    ),
];

/// The `.rs` files under `dir`, with those declared `#[cfg(test)] mod x;`
/// or `#[cfg(target_os = "linux")] mod x;`
/// in the directory's lib.rs/main.rs/mod.rs, or in `dir.rs` beside it (a
/// module's own file: `tree.rs` declaring `tree/tests.rs`), left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut test_only = Vec::new();
    let parents = ["lib.rs", "main.rs", "mod.rs"]
        .map(|f| dir.join(f))
        .into_iter()
        .chain(std::iter::once(dir.with_extension("rs")));
    for f in parents {
        if let Ok(text) = std::fs::read_to_string(f) {
            let lines: Vec<&str> = text.lines().map(str::trim).collect();
            for w in lines.windows(2) {
                // Test modules, and modules built only on Linux (whose
                // callers are gated the same way, with an alternative).
                if w[0] == "#[cfg(test)]" || w[0] == "#[cfg(target_os = \"linux\")]" {
                    if let Some(m) = w[1].strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                        test_only.push(format!("{m}.rs"));
                    }
                }
            }
        }
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read a source directory")
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

/// The part of a file built outside tests (rustfmt keeps the test module
/// last).
fn built(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

/// The Linux-only uses in `text` (`file` relative to the repository),
/// as `file:line: text`: each line with one of [`LINUX_ONLY`], unless one
/// of the three lines above it says `cfg(target_os = "linux")` or
/// [`NODE_SIDE`] excuses it.
fn linux_only_uses(file: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for pat in LINUX_ONLY {
            if !code.contains(pat) {
                continue;
            }
            let gated = lines[i.saturating_sub(3)..=i]
                .iter()
                .any(|l| l.contains("cfg(target_os = \"linux\")"));
            let excused = NODE_SIDE
                .iter()
                .any(|(f, p, _)| *f == file && pat.starts_with(p));
            if !gated && !excused {
                found.push(format!("{file}:{}: {}", i + 1, line.trim()));
                // Each line once.
                break;
            }
        }
    }
    found
}

#[test]
fn the_laptop_side_uses_no_linux_only_interface() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [
        "src",
        "providers/local/src",
        "providers/api/src",
        "providers/ssh/src",
        "providers/slurm/src",
        "providers/aws/src",
        "providers/gcp/src",
        "providers/yaml/src",
    ] {
        sources(&repo.join(dir), &mut files);
    }
    assert!(files.len() > 30, "{files:?}");
    assert!(!files.iter().any(|f| f.ends_with("laptop_portable.rs")));
    assert!(files
        .iter()
        .any(|f| f.ends_with("providers/local/src/market.rs")));
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(repo).unwrap_or(f).display().to_string();
        let text = std::fs::read_to_string(f).expect("read a source");
        found.extend(linux_only_uses(&rel, &built(&text)));
    }
    assert!(
        found.is_empty(),
        "the laptop side (which runs on macOS too) uses Linux-only interfaces; use a \
         portable one (process groups, kill(pid, 0), a held lock: providers/local/src/held.rs) \
         or put it behind cfg(target_os = \"linux\") with a macOS alternative:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_linux_only_uses_and_what_excuses_them() {
    for line in [
        r#"let env = std::fs::read(format!("/proc/{pid}/environ"))?;"#,
        r#"unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };"#,
        r#"let fd = libc::epoll_create1(0);"#,
        r#"Command::new("ip").args(["addr", "add"])"#,
    ] {
        assert_eq!(linux_only_uses("src/x.rs", line).len(), 1, "{line}");
    }
    let gated =
        "#[cfg(target_os = \"linux\")]\nfn f() {\n    std::fs::read(\"/proc/self/stat\");\n}";
    assert!(linux_only_uses("src/x.rs", gated).is_empty());
    let remote = r#"    "for p in /proc/[0-9]*; do kill $p; done""#;
    assert!(linux_only_uses("src/core/transport/ssh.rs", remote).is_empty());
    assert_eq!(linux_only_uses("src/core/gang/driver.rs", remote).len(), 1);
    // Comments and test modules do not count.
    assert!(linux_only_uses("src/x.rs", "// unlike /proc/PID/environ").is_empty());
    let text = "fn f() {}\n#[cfg(test)]\nmod tests {\n    \"/proc/1\"\n}\n";
    assert_eq!(built(text), "fn f() {}");
}
