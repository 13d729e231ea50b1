//! Spot interruption notices, read on the node over the core's SSH
//! connection: nothing of gangway is installed there.

use gangway_provider::{sh_quote, NodeRow, NOTICE_MARK};

/// The spot interruption watcher (`templates/aws-spot-watch.sh`): run with
/// `--once` it prints the node's IMDSv2 `spot/instance-action` notice, if
/// there is one; without arguments it polls (for images that want it on
/// the node).
pub const SPOT_WATCH: &str = include_str!("../templates/aws-spot-watch.sh");

/// The command that asks a spot node's metadata service for a notice
/// (printed after [`NOTICE_MARK`] as `spot/instance-action: {json}`), or
/// `None` for an on-demand node, which has none to ask. A node's
/// `env.GANGWAY_IMDS_ENDPOINT` fact (tests) points the watcher at another
/// metadata service.
pub fn spot_notice_probe(node: &NodeRow) -> Option<String> {
    if node.fact("market") != "spot" {
        return None;
    }
    let endpoint = node
        .extra
        .get("env.GANGWAY_IMDS_ENDPOINT")
        .map(|e| format!("GANGWAY_IMDS_ENDPOINT={} ", sh_quote(e)))
        .unwrap_or_default();
    // Exit 1 (no notice) and 2 (no metadata service) both print nothing.
    Some(format!(
        "n=$({endpoint}sh -c {} aws-spot-watch --once 2>/dev/null) && \
         printf '%s%s\\n' {NOTICE_MARK} \"spot/instance-action: $n\"; true",
        sh_quote(SPOT_WATCH)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(remote.contains(&sh_quote(SPOT_WATCH)), "{remote}");
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
        assert!(SPOT_WATCH.starts_with("#!/bin/sh\n"));
        assert!(SPOT_WATCH.contains("spot/instance-action"));
    }
}
