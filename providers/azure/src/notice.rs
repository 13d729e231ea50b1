//! Spot eviction notices, read on the node over the core's SSH connection:
//! nothing of gangway is installed there.

use gangway_provider::notice::Watcher;
use gangway_provider::NodeRow;

/// The Spot eviction watcher: `templates/azure-preempt-watch.sh` (a
/// `Preempt` event in the instance metadata service's Scheduled Events)
/// before the loop every watcher shares. A node's
/// `env.GANGWAY_AZURE_IMDS_ENDPOINT` fact (tests) points it at another
/// metadata service.
pub const PREEMPT_WATCHER: Watcher = Watcher {
    name: "azure-preempt-watch",
    check: include_str!("../templates/azure-preempt-watch.sh"),
    endpoint_var: "GANGWAY_AZURE_IMDS_ENDPOINT",
    notice: "scheduledevents/Preempt",
};

/// The command that asks a Spot node's metadata service for a notice
/// (printed after [`gangway_provider::NOTICE_MARK`] as
/// `scheduledevents/Preempt: {document}`), or `None` for a regular VM.
pub fn preempt_notice_probe(node: &NodeRow) -> Option<String> {
    PREEMPT_WATCHER.probe(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_with(facts: &[(&str, &str)]) -> NodeRow {
        NodeRow {
            rank: 0,
            instance_id: "gw-c-0".into(),
            private_ip: "10.0.0.4".into(),
            public_ip: None,
            zone: "1".into(),
            topology: String::new(),
            state: "running".into(),
            extra: facts
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn only_spot_vms_are_asked_and_the_endpoint_is_passed_on() {
        assert_eq!(
            preempt_notice_probe(&node_with(&[("market", "on-demand")])),
            None
        );
        let n = node_with(&[
            ("market", "spot"),
            ("env.GANGWAY_AZURE_IMDS_ENDPOINT", "http://127.0.0.2:8"),
        ]);
        let probe = preempt_notice_probe(&n).expect("a spot VM is asked");
        assert!(probe.contains("GANGWAY_AZURE_IMDS_ENDPOINT='http://127.0.0.2:8' sh -c "));
        assert!(probe.contains("--once"));
    }

    /// Runs the watcher's `check` against a document served by a stub
    /// `curl` on PATH.
    fn check_against(doc: &str) -> (i32, String) {
        let dir = tempfile::tempdir().unwrap();
        let curl = dir.path().join("curl");
        std::fs::write(&curl, format!("#!/bin/sh\ncat <<'DOC'\n{doc}\nDOC\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&curl, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(PREEMPT_WATCHER.script())
            .arg("azure-preempt-watch")
            .arg("--once")
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    dir.path().display(),
                    std::env::var("PATH").unwrap()
                ),
            )
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    #[test]
    fn a_preempt_event_is_the_notice_and_others_are_not() {
        let (rc, out) = check_against(r#"{"DocumentIncarnation": 1, "Events": []}"#);
        assert_eq!((rc, out.as_str()), (1, ""));
        let (rc, _) = check_against(
            r#"{"DocumentIncarnation": 2, "Events": [{"EventId": "a", "EventType": "Freeze"}]}"#,
        );
        assert_eq!(rc, 1);
        let doc = "{\"DocumentIncarnation\": 3,\n \"Events\": [{\"EventId\": \"602d\", \"EventType\": \"Preempt\", \"EventStatus\": \"Scheduled\"}]}";
        let (rc, out) = check_against(doc);
        assert_eq!(rc, 0);
        assert!(
            out.contains("\"Preempt\"") && !out.trim().contains('\n'),
            "{out}"
        );
        let (rc, _) = check_against("<html>not IMDS</html>");
        assert_eq!(rc, 2);
    }
}
