//! Preemption notices of spot VMs, read on the node over the core's SSH
//! connection: nothing of gangway is installed there.

use gangway_provider::{sh_quote, NodeRow, NOTICE_MARK};

/// The preemption watcher (`templates/gcp-preempted-watch.sh`): run with
/// `--once` it prints `TRUE` when the metadata server's
/// `instance/preempted` says so; without arguments it polls.
pub const PREEMPTED_WATCH: &str = include_str!("../templates/gcp-preempted-watch.sh");

/// The command that asks a spot VM's metadata server whether it is being
/// preempted (printed after [`NOTICE_MARK`] as `instance/preempted: TRUE`),
/// or `None` for a standard VM. A node's `env.GCE_METADATA_HOST` fact
/// (tests) points the watcher at another metadata server.
pub fn preempted_notice_probe(node: &NodeRow) -> Option<String> {
    if node.fact("market") != "spot" {
        return None;
    }
    let host = node
        .extra
        .get("env.GCE_METADATA_HOST")
        .map(|h| format!("GCE_METADATA_HOST={} ", sh_quote(h)))
        .unwrap_or_default();
    // Exit 1 (no notice) and 2 (no metadata server) both print nothing.
    Some(format!(
        "n=$({host}sh -c {} gcp-preempted-watch --once 2>/dev/null) && \
         printf '%s%s\\n' {NOTICE_MARK} \"instance/preempted: $n\"; true",
        sh_quote(PREEMPTED_WATCH)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_spot_vms_are_asked_and_the_server_is_passed_on() {
        let mut n = NodeRow {
            rank: 0,
            instance_id: "vm-0".into(),
            private_ip: "10.0.0.1".into(),
            public_ip: None,
            zone: "us-central1-a".into(),
            topology: String::new(),
            state: "running".into(),
            extra: Default::default(),
        };
        n.extra.insert("market".into(), "on-demand".into());
        assert_eq!(preempted_notice_probe(&n), None);
        n.extra.insert("market".into(), "spot".into());
        n.extra
            .insert("env.GCE_METADATA_HOST".into(), "127.0.0.1:9".into());
        let remote = preempted_notice_probe(&n).expect("a spot VM is asked");
        assert!(remote.contains(&sh_quote(PREEMPTED_WATCH)), "{remote}");
        assert!(remote.contains("GCE_METADATA_HOST='127.0.0.1:9' sh -c "));
        assert!(PREEMPTED_WATCH.contains("instance/preempted"));
    }
}
