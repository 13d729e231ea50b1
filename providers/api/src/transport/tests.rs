//! Processes found by their environment, as nodes' kill commands find them.

use super::*;

fn started_with(var: &str, value: &str) -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("30")
        .env(var, value)
        .spawn()
        .unwrap()
}

/// A `.` in one cluster's name matched another cluster's processes when
/// the environment was matched as a pattern.
#[test]
fn a_cluster_name_is_matched_as_a_fixed_string() {
    let mut ours = started_with("GANGWAY_CLUSTER", "team.a");
    let mut theirs = started_with("GANGWAY_CLUSTER", "teamXa");
    let mut quoted = started_with("GANGWAY_CLUSTER", "it's");
    let kill = |cluster: &str| {
        let script = kill_where(&[("GANGWAY_CLUSTER", cluster)], "-9");
        let s = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .status()
            .unwrap();
        assert!(s.success());
    };
    kill("team.a");
    kill("it's");
    assert!(gone(&mut ours), "its own process was not killed");
    assert!(gone(&mut quoted), "a name with a quote was not matched");
    assert!(
        theirs.try_wait().unwrap().is_none(),
        "another cluster's process was killed"
    );
    let _ = theirs.kill();
    let _ = theirs.wait();
}

/// Whether `child` ends within 10 s.
fn gone(child: &mut std::process::Child) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}
