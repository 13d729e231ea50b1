//! Rank assignment from the network topology.
//!
//! Ranks follow the topology path (so nodes under the same leaf switch get
//! neighbouring ranks, leaves under the same spine come next), then the
//! private address as a number (then, where nodes share one address, the
//! first port of each one's range). Rank 0 is the head. Ring and tree
//! collectives that walk ranks in order then cross as few switches as the
//! layout allows.

use std::cmp::Ordering;
use std::net::IpAddr;

use gangway_provider::Node;

/// Orders nodes into ranks: index = rank.
pub(crate) fn assign_ranks(mut nodes: Vec<Node>) -> Vec<Node> {
    nodes.sort_by(|a, b| {
        by_topology_then_ip(&a.topology, &a.private_ip, &b.topology, &b.private_ip)
            .then_with(|| first_port(a).cmp(&first_port(b)))
    });
    nodes
}

/// Where nodes share an address, the first port of each one's range
/// breaks the tie the address leaves.
fn first_port(n: &Node) -> Option<u16> {
    n.extra
        .get(gangway_provider::PORT_RANGE_FACT)
        .and_then(|r| gangway_provider::parse_port_range(r))
        .map(|r| r.0)
}

fn ip_key(ip: &str) -> (u8, u128, &str) {
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => (0, u32::from(v4) as u128, ip),
        Ok(IpAddr::V6(v6)) => (1, u128::from(v6), ip),
        // Host names sort after addresses, by name.
        Err(_) => (2, 0, ip),
    }
}

fn by_topology_then_ip(ta: &[String], ia: &str, tb: &[String], ib: &str) -> Ordering {
    ta.cmp(tb).then_with(|| ip_key(ia).cmp(&ip_key(ib)))
}

/// Switches a message between two nodes passes through, in a tree whose
/// leaves are the last path element: 1 under the same leaf, 3 under the same
/// spine, and so on up to the (implicit) root above the first element.
pub(crate) fn switch_hops(a: &[String], b: &[String]) -> usize {
    let depth = a.len().max(b.len());
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    2 * (depth - common) + 1
}

/// Switches crossed by a ring over the nodes in the given order.
pub fn ring_hops(paths: &[&[String]]) -> usize {
    if paths.len() < 2 {
        return 0;
    }
    (0..paths.len())
        .map(|i| switch_hops(paths[i], paths[(i + 1) % paths.len()]))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gangway_provider::{InstanceId, NodeState, Placement};

    fn node(ip: &str, path: &str) -> Node {
        Node {
            id: InstanceId(format!("i-{ip}")),
            state: NodeState::Running,
            private_ip: ip.into(),
            public_ip: None,
            placement: Placement {
                cloud: "local".into(),
                region: "local".into(),
                zone: "local-a".into(),
            },
            topology: path.split('/').map(str::to_string).collect(),
            extra: Default::default(),
        }
    }

    /// Every ordering of `items`, by Heap's algorithm.
    fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
        let mut a = items.to_vec();
        let mut c = vec![0; a.len()];
        let mut out = vec![a.clone()];
        let mut i = 0;
        while i < a.len() {
            if c[i] < i {
                a.swap(if i % 2 == 0 { 0 } else { c[i] }, i);
                out.push(a.clone());
                c[i] += 1;
                i = 0;
            } else {
                c[i] = 0;
                i += 1;
            }
        }
        out
    }

    #[test]
    fn topology_ranks_make_the_cheapest_ring_and_ip_order_does_not() {
        // 2 spines x 2 leaves x 2 nodes, handed back shuffled with addresses
        // that do not follow the topology (as a cloud does).
        let shuffled = vec![
            node("127.0.10.5", "spine2/leaf1"),
            node("127.0.10.1", "spine1/leaf2"),
            node("127.0.10.8", "spine1/leaf1"),
            node("127.0.10.3", "spine2/leaf2"),
            node("127.0.10.2", "spine2/leaf1"),
            node("127.0.10.7", "spine1/leaf2"),
            node("127.0.10.4", "spine1/leaf1"),
            node("127.0.10.6", "spine2/leaf2"),
        ];
        let ranked = assign_ranks(shuffled.clone());
        let paths: Vec<&[String]> = ranked.iter().map(|n| n.topology.as_slice()).collect();
        let ours = ring_hops(&paths);

        let all: Vec<&[String]> = shuffled.iter().map(|n| n.topology.as_slice()).collect();
        let best = permutations(&all)
            .iter()
            .map(|p| ring_hops(p))
            .min()
            .unwrap();
        assert_eq!(
            ours,
            best,
            "ranks {:?}",
            ranked.iter().map(|n| &n.private_ip).collect::<Vec<_>>()
        );

        let mut by_ip = shuffled.clone();
        by_ip.sort_by_key(|n| ip_key(&n.private_ip).1);
        let naive: Vec<&[String]> = by_ip.iter().map(|n| n.topology.as_slice()).collect();
        assert!(
            ring_hops(&naive) > best,
            "IP order {} vs best {best}",
            ring_hops(&naive)
        );

        // Neighbours under one leaf, leaves of one spine next to each other.
        let leaves: Vec<String> = ranked.iter().map(|n| n.topology.join("/")).collect();
        assert_eq!(
            leaves,
            [
                "spine1/leaf1",
                "spine1/leaf1",
                "spine1/leaf2",
                "spine1/leaf2",
                "spine2/leaf1",
                "spine2/leaf1",
                "spine2/leaf2",
                "spine2/leaf2"
            ]
        );
        // Within a leaf, the lower address first.
        assert_eq!(ranked[0].private_ip, "127.0.10.4");
        assert_eq!(ranked[1].private_ip, "127.0.10.8");
    }

    #[test]
    fn addresses_compare_as_numbers_not_strings() {
        let ranked = assign_ranks(vec![node("10.0.0.10", ""), node("10.0.0.9", "")]);
        assert_eq!(ranked[0].private_ip, "10.0.0.9");
    }

    #[test]
    fn hops_count_switches_on_the_path() {
        let p = |s: &str| s.split('/').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(switch_hops(&p("s1/l1"), &p("s1/l1")), 1);
        assert_eq!(switch_hops(&p("s1/l1"), &p("s1/l2")), 3);
        assert_eq!(switch_hops(&p("s1/l1"), &p("s2/l1")), 5);
    }
}
