//! Preemption notices of spot VMs, read on the node over the core's SSH
//! connection: nothing of gangway is installed there.

use gangway_provider::notice::Watcher;
use gangway_provider::NodeRow;

/// The preemption watcher: `templates/gcp-preempted-watch.sh` (the metadata
/// server's `instance/preempted`) before the loop every watcher shares. Run
/// with `--once` it prints `TRUE` when the VM is being preempted; without
/// arguments it polls. A node's `env.GCE_METADATA_HOST` fact (tests) points
/// it at another metadata server.
pub const PREEMPTED_WATCHER: Watcher = Watcher {
    name: "gcp-preempted-watch",
    check: include_str!("../templates/gcp-preempted-watch.sh"),
    endpoint_var: "GCE_METADATA_HOST",
    notice: "instance/preempted",
};

/// The command that asks a spot VM's metadata server whether it is being
/// preempted (printed after [`gangway_provider::NOTICE_MARK`] as
/// `instance/preempted: TRUE`), or `None` for a standard VM.
pub fn preempted_notice_probe(node: &NodeRow) -> Option<String> {
    PREEMPTED_WATCHER.probe(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gangway_provider::sh_quote;

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
        let script = PREEMPTED_WATCHER.script();
        assert!(remote.contains(&sh_quote(&script)), "{remote}");
        assert!(remote.contains("GCE_METADATA_HOST='127.0.0.1:9' sh -c "));
        assert!(script.contains("instance/preempted"));
    }
}
