//! The names gangway gives its pods and the tags it puts on them. A v2 pod
//! has no tags and the pod list has no filter, so the tags travel in the
//! pod's environment, which every listing returns: `GANGWAY_TAG_CLUSTER`,
//! `GANGWAY_TAG_OWNER` (this installation's owner id),
//! `GANGWAY_TAG_USER` (readable) and, on spot pods only,
//! `GANGWAY_TAG_MARKET=spot`. They are not `GANGWAY_CLUSTER`: the core
//! finds a cluster's processes on a node by that variable, and every
//! process of a pod has the pod's environment.

use std::collections::BTreeMap;

/// The variable naming the cluster on every pod.
pub const TAG_CLUSTER: &str = "GANGWAY_TAG_CLUSTER";
/// The variable naming the installation (owner id) that launched it.
pub const TAG_OWNER: &str = "GANGWAY_TAG_OWNER";
/// The variable naming the user who launched it, for people.
pub const TAG_USER: &str = "GANGWAY_TAG_USER";
/// The variable marking a spot (interruptible) pod: v2 shows no market,
/// and a pod RunPod stopped is told apart by it.
pub const TAG_MARKET: &str = "GANGWAY_TAG_MARKET";
/// [`TAG_MARKET`]'s value on spot pods (on-demand pods have none).
pub const SPOT: &str = "spot";
/// What RunPod's images put into root's `authorized_keys` at start.
pub const PUBLIC_KEY: &str = "PUBLIC_KEY";

/// Longest pod name gangway makes (v1 documented 191; v2 gives no limit).
const NAME_MAX: usize = 191;

/// The readable name of a cluster's pod `index`.
pub fn pod_name(cluster: &str, index: usize) -> String {
    let suffix = format!("-{index}");
    let cut: String = cluster.chars().take(NAME_MAX - suffix.len()).collect();
    format!("{cut}{suffix}")
}

/// The environment of a pod of `owner`'s `cluster`: gangway's tags and
/// the public key to log in with.
pub fn env(
    cluster: &str,
    owner: &str,
    user: Option<&str>,
    public_key: &str,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(TAG_CLUSTER.to_string(), cluster.to_string());
    out.insert(TAG_OWNER.to_string(), owner.to_string());
    if let Some(u) = user.filter(|u| !u.is_empty()) {
        out.insert(TAG_USER.to_string(), u.to_string());
    }
    out.insert(PUBLIC_KEY.to_string(), public_key.trim().to_string());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_and_the_environment_carries_the_tags_and_key() {
        assert_eq!(pod_name("train", 1), "train-1");
        let n = pod_name(&"y".repeat(300), 12);
        assert_eq!(n.chars().count(), NAME_MAX);
        assert!(n.ends_with("-12"));
        let e = env(
            "c",
            "gw-0123456789abcdef",
            Some("alice"),
            "ssh-ed25519 AAAA k\n",
        );
        assert_eq!(e[TAG_CLUSTER], "c");
        assert_eq!(e[TAG_OWNER], "gw-0123456789abcdef");
        assert_eq!(e[TAG_USER], "alice");
        assert_eq!(e[PUBLIC_KEY], "ssh-ed25519 AAAA k");
        assert!(!env("c", "o", Some(""), "k").contains_key(TAG_USER));
    }
}
