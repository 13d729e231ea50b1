//! The one way a test says whether it could run here. Every test whose
//! prerequisites may be missing (an sshd, root, an emulator's venv, Slurm,
//! the `../shared` data) goes through it, so that a skip is never silent:
//!
//! ```ignore
//! use gangway_test::skip; // a dev-dependency of the test's crate
//!
//! if !have_slurm() {
//!     skip::skipped("slurm", "Slurm is not installed");
//!     return;
//! }
//! skip::ran("slurm");
//! // or, for a prerequisite that is a Result<T, why>:
//! let Some(fake) = skip::gate("gcp", GceFake::try_start()) else { return };
//! ```
//!
//! * [`skipped`] prints exactly one line, `SKIPPED <suite>: <why>`, and the
//!   test returns and passes, unless `GANGWAY_REQUIRE_SUITES` (comma
//!   separated) names the suite: then it panics with that line and
//!   `but CI requires this suite here`, so the test fails.
//! * [`ran`] says the suite's prerequisites were there, so that the summary
//!   can count the tests that really ran.
//! * cargo test shows a passing test's output to nobody, so both also append
//!   a line to the file named by `GANGWAY_SUITE_LOG` when it is set:
//!   `ran <suite> <test>` or `skipped <suite> <test> <why>`, `<test>` being
//!   the test binary's name and the test's as libtest gives it (its
//!   thread's name), e.g. `it::ssh::a_gang_runs`, with no spaces.
//!   Each line is one `write(2)` to a file opened with `O_APPEND`, so lines
//!   of tests running in parallel (and of several test binaries) never
//!   interleave. `.ci/run` turns the file into its table of suites.
//!
//! A test may record several suites (a Slurm cluster behind an SSH login
//! node records `slurm` and `ssh`) and the same suite more than once; the
//! summary counts each test once per suite, and a test that recorded any
//! skip as skipped.
use std::fmt::Display;
use std::io::Write;

/// Names the suites that must not skip here (comma separated).
pub const REQUIRE_VAR: &str = "GANGWAY_REQUIRE_SUITES";
/// Names the file the `ran` / `skipped` lines are appended to.
pub const LOG_VAR: &str = "GANGWAY_SUITE_LOG";

/// Every suite, and what it needs.
pub const SUITES: &[(&str, &str)] = &[
    (
        "local",
        "the embedded local cloud: bash and python3; never skips",
    ),
    (
        "ssh",
        "a test sshd of our own: root, openssh-server, rsync, pdsh",
    ),
    (
        "netns",
        "nodes in network namespaces: root, sshd, iproute2, util-linux",
    ),
    (
        "imds",
        "the spot watcher against a fake metadata service: python3, curl",
    ),
    (
        "aws",
        "the EC2 emulator: its venv, or GANGWAY_TEST_EC2_ENDPOINT",
    ),
    (
        "gcp",
        "the Compute Engine fake's venv; port 22 on loopback addresses",
    ),
    (
        "azure",
        "the Azure Resource Manager fake: tests/emulators/azure/setup.sh's schema file; port 22 on loopback addresses",
    ),
    (
        "lambda",
        "the Lambda Cloud fake (tests/emulators/lambda): python3; for its SSH test root, openssh-server and port 22 on loopback addresses",
    ),
    (
        "runpod",
        "the RunPod fake (tests/emulators/runpod): python3; for its SSH test root, openssh-server and a free loopback port",
    ),
    (
        "vast",
        "the Vast.ai fake (tests/emulators/vast): python3; for its SSH tests root, openssh-server and a free loopback port",
    ),
    ("slurm", "a throwaway Slurm cluster: root, slurm-wlm, munge"),
    (
        "dashboard",
        "the dashboard in a real browser: Debian's chromium and chromium-driver",
    ),
    (
        "s3",
        "the S3 emulator (moto, the EC2 emulator's venv) behind the storage front; rclone for its rclone tests",
    ),
    (
        "gcs",
        "the GCS emulator (fake-gcs-server's venv) behind the storage front; rclone for its rclone tests",
    ),
    (
        "compat",
        "../shared/compat and ../shared/catalogs beside the checkout",
    ),
    ("traces", "../shared/traces beside the checkout"),
    (
        "k8s",
        "a Kubernetes control plane built from source (tests/emulators/k8s): Go, the module proxy or a warm module cache, or GANGWAY_TEST_K8S_HARNESS",
    ),
    (
        "kueue",
        "Kueue built from source beside the k8s harness (tests/emulators/k8s/build-kueue.sh): the k8s suite's needs, or GANGWAY_TEST_K8S_KUEUE",
    ),
];

/// Records that `suite`'s prerequisites are there and this test runs it.
pub fn ran(suite: &str) {
    known(suite);
    log(&format!("ran {suite} {}", test_name()));
}

/// Says that this test skips `suite` because of `why`: one line
/// `SKIPPED <suite>: <why>` on stderr; a panic instead when
/// `GANGWAY_REQUIRE_SUITES` names the suite.
pub fn skipped(suite: &str, why: impl Display) {
    known(suite);
    // One line, whatever `why` holds.
    let why = why
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let line = format!("SKIPPED {suite}: {why}");
    log(&format!("skipped {suite} {} {why}", test_name()));
    if required(suite) {
        panic!("{line}, but CI requires this suite here ({REQUIRE_VAR} names it)");
    }
    eprintln!("{line}");
}

/// [`skipped`], as a `None` to return.
pub fn skip<T>(suite: &str, why: impl Display) -> Option<T> {
    skipped(suite, why);
    None
}

/// A prerequisite that is there (`Ok`, recorded as [`ran`]) or not (`Err`
/// with the reason, recorded as [`skipped`]).
pub fn gate<T, E: Display>(suite: &str, prerequisite: Result<T, E>) -> Option<T> {
    match prerequisite {
        Ok(t) => {
            ran(suite);
            Some(t)
        }
        Err(why) => skip(suite, why),
    }
}

/// Whether `GANGWAY_REQUIRE_SUITES` names `suite`.
pub fn required(suite: &str) -> bool {
    required_suites().iter().any(|s| s == suite)
}

/// The suites `GANGWAY_REQUIRE_SUITES` names (a test fails on a name that
/// is not a suite, so that a typo there cannot excuse a suite).
pub fn required_suites() -> Vec<String> {
    let value = std::env::var(REQUIRE_VAR).unwrap_or_default();
    let names: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    for name in &names {
        assert!(
            is_suite(name),
            "{REQUIRE_VAR}={value:?} names {name:?}, which is not a suite (the suites: {})",
            suite_names()
        );
    }
    names
}

fn is_suite(name: &str) -> bool {
    SUITES.iter().any(|(s, _)| *s == name)
}

fn suite_names() -> String {
    SUITES
        .iter()
        .map(|(s, _)| *s)
        .collect::<Vec<_>>()
        .join(", ")
}

fn known(suite: &str) {
    assert!(
        is_suite(suite),
        "skip: {suite:?} is not a suite (the suites: {}); add it to tests/support/src/skip.rs",
        suite_names()
    );
}

/// The running test's name, after its test binary's (`it::ssh::...`,
/// `fake::...`): libtest names each test's thread after the test, and
/// cargo names the binary `<target>-<hash>`.
fn test_name() -> String {
    // The path it was started by: current_exe() reads /proc/self/exe,
    // which says `(deleted)` once a rebuild replaced the file.
    let binary = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((target, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => {
                target.to_string()
            }
            _ => stem,
        })
        .unwrap_or_else(|| "unknown-binary".into());
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed-thread")
        .to_string();
    // One field in the log line.
    format!("{binary}::{test}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join("_")
}

/// Appends `line` to `$GANGWAY_SUITE_LOG`, when set, in one write.
fn log(line: &str) {
    let Some(path) = std::env::var_os(LOG_VAR).filter(|p| !p.is_empty()) else {
        return;
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{LOG_VAR}={}: cannot open: {e}", path.to_string_lossy()));
    let buf = format!("{line}\n");
    // One write(2): with O_APPEND the kernel puts it at the end whole.
    match file.write(buf.as_bytes()) {
        Ok(n) if n == buf.len() => {}
        other => panic!(
            "{LOG_VAR}={}: cannot append {line:?}: {other:?}",
            path.to_string_lossy()
        ),
    }
}
