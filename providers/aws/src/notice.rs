//! Spot interruption notices, read on the node over the core's SSH
//! connection: nothing of gangway is installed there.

use gangway_provider::notice::Watcher;
use gangway_provider::NodeRow;

/// The spot interruption watcher: `templates/aws-spot-watch.sh` (IMDSv2
/// `spot/instance-action`, with its session token) before the loop every
/// watcher shares. Run with `--once` it prints the node's notice, if there
/// is one; without arguments it polls (for images that want it on the
/// node). A node's `env.GANGWAY_IMDS_ENDPOINT` fact (tests) points it at
/// another metadata service.
pub const SPOT_WATCHER: Watcher = Watcher {
    name: "aws-spot-watch",
    check: include_str!("../templates/aws-spot-watch.sh"),
    endpoint_var: "GANGWAY_IMDS_ENDPOINT",
    notice: "spot/instance-action",
};

/// The command that asks a spot node's metadata service for a notice
/// (printed after [`gangway_provider::NOTICE_MARK`] as
/// `spot/instance-action: {json}`), or `None` for an on-demand node, which
/// has none to ask.
pub fn spot_notice_probe(node: &NodeRow) -> Option<String> {
    SPOT_WATCHER.probe(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gangway_provider::sh_quote;

    fn node_with(facts: &[(&str, &str)]) -> NodeRow {
        NodeRow {
            rank: 0,
            instance_id: "i-0".into(),
            private_ip: "10.0.0.1".into(),
            public_ip: None,
            zone: "us-east-1a".into(),
            topology: String::new(),
            state: "running".into(),
            extra: facts
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn only_spot_nodes_are_asked_for_a_notice() {
        for facts in [
            &[][..],
            &[("market", "on-demand"), ("instance_type", "p4d.24xlarge")][..],
        ] {
            assert_eq!(spot_notice_probe(&node_with(facts)), None, "{facts:?}");
        }
        let n = node_with(&[("market", "spot"), ("instance_type", "p4d.24xlarge")]);
        let remote = spot_notice_probe(&n).expect("a spot node is asked");
        assert!(
            remote.contains(&sh_quote(&SPOT_WATCHER.script())),
            "{remote}"
        );
        assert!(remote.contains("--once") && !remote.contains("GANGWAY_IMDS_ENDPOINT="));
        let n = node_with(&[
            ("market", "spot"),
            ("env.GANGWAY_IMDS_ENDPOINT", "http://127.0.0.1:9"),
        ]);
        let remote = spot_notice_probe(&n).unwrap();
        assert!(remote.contains("GANGWAY_IMDS_ENDPOINT='http://127.0.0.1:9' sh -c "));
    }

    #[test]
    fn the_embedded_watcher_is_the_template() {
        let script = SPOT_WATCHER.script();
        assert!(script.starts_with("#!/bin/sh\n"));
        assert!(script.contains("spot/instance-action"));
    }
}
