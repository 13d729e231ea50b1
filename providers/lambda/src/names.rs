//! The names gangway gives what it makes on Lambda, and the tags it puts
//! on instances. SSH keys cannot be tagged, so their name carries the
//! owner id and the cluster (`<owner>--<cluster>`); instances carry both
//! as tags, and a readable name.

use crate::api::Tag;

/// Tag naming the cluster on every instance.
pub const TAG_CLUSTER: &str = "gangway-cluster";
/// Tag naming the installation (owner id) that launched it.
pub const TAG_OWNER: &str = "gangway-owner";
/// Tag naming the user who launched it, for people.
pub const TAG_USER: &str = "gangway-user";

/// Names and tag values longer than the API takes.
const NAME_MAX: usize = 64;
const TAG_VALUE_MAX: usize = 128;
const TAG_KEY_MAX: usize = 55;

/// A short stable digest of `s` (FNV-1a, 32 bits), for names cut to fit.
fn digest(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// `prefix` + `rest`, cut to 64 characters with a digest of the whole
/// where it is longer (so two long names never collide on their start).
fn fit(prefix: &str, rest: &str) -> String {
    let whole = format!("{prefix}{rest}");
    if whole.chars().count() <= NAME_MAX {
        return whole;
    }
    let keep = NAME_MAX - 9 - prefix.chars().count().min(NAME_MAX - 9);
    let cut: String = rest.chars().take(keep).collect();
    format!("{prefix}{cut}~{}", digest(&whole))
}

/// The account SSH key of `owner`'s `cluster`.
pub fn key_name(owner: &str, cluster: &str) -> String {
    fit(&format!("{owner}--"), cluster)
}

/// The (owner, cluster) a key name of [`key_name`] holds, where it was not
/// cut to fit.
pub fn parse_key_name(name: &str) -> Option<(&str, &str)> {
    let (owner, cluster) = name.split_once("--")?;
    (gangway_provider::is_owner_id(owner) && !cluster.is_empty() && !cluster.contains('~'))
        .then_some((owner, cluster))
}

/// The readable name of a cluster's node `index`.
pub fn instance_name(cluster: &str, index: usize) -> String {
    let suffix = format!("-{index}");
    let name = fit("", cluster);
    if name.chars().count() + suffix.len() <= NAME_MAX {
        format!("{name}{suffix}")
    } else {
        let cut: String = name.chars().take(NAME_MAX - suffix.len()).collect();
        format!("{cut}{suffix}")
    }
}

/// Whether `key` is a tag key the API takes (`^[a-z][a-z0-9-:]+$`, at most
/// 55 characters).
pub fn tag_key_ok(key: &str) -> bool {
    let mut c = key.chars();
    key.len() >= 2
        && key.len() <= TAG_KEY_MAX
        && c.next().is_some_and(|f| f.is_ascii_lowercase())
        && c.all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || x == '-' || x == ':')
}

/// The tags of a node of `owner`'s `cluster`: gangway's three, then the
/// task's labels that the API can hold (others are left out: Lambda's
/// tag keys are lowercase letters, digits, `-` and `:` only). `Err` names
/// what cannot be tagged at all.
pub fn tags(
    cluster: &str,
    owner: &str,
    user: Option<&str>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<Tag>, String> {
    if cluster.chars().count() > TAG_VALUE_MAX {
        return Err(format!(
            "a cluster name on Lambda has at most {TAG_VALUE_MAX} characters (it is tagged on every instance)"
        ));
    }
    let tag = |k: &str, v: &str| Tag {
        key: k.to_string(),
        value: v.to_string(),
    };
    let mut out = vec![tag(TAG_CLUSTER, cluster), tag(TAG_OWNER, owner)];
    if let Some(u) = user.filter(|u| !u.is_empty()) {
        out.push(tag(
            TAG_USER,
            &u.chars().take(TAG_VALUE_MAX).collect::<String>(),
        ));
    }
    for (k, v) in labels {
        if tag_key_ok(k) && !k.starts_with("gangway-") && v.chars().count() <= TAG_VALUE_MAX {
            out.push(tag(k, v));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "gw-0123456789abcdef";

    #[test]
    fn key_names_carry_owner_and_cluster_and_fit() {
        let n = key_name(OWNER, "train");
        assert_eq!(n, "gw-0123456789abcdef--train");
        assert_eq!(parse_key_name(&n), Some((OWNER, "train")));
        let long = "x".repeat(100);
        let n = key_name(OWNER, &long);
        assert_eq!(n.chars().count(), 64);
        assert!(n.starts_with("gw-0123456789abcdef--xxx"), "{n}");
        assert_ne!(n, key_name(OWNER, &"x".repeat(101)));
        // Cut names are not read back as a cluster; others' names never.
        assert_eq!(parse_key_name(&n), None);
        assert_eq!(parse_key_name("my-laptop"), None);
        assert_eq!(parse_key_name("alice--train"), None);
    }

    #[test]
    fn instance_names_fit() {
        assert_eq!(instance_name("train", 1), "train-1");
        let n = instance_name(&"y".repeat(80), 12);
        assert_eq!(n.chars().count(), 64);
        assert!(n.ends_with("-12"));
    }

    #[test]
    fn tags_hold_gangways_three_and_the_labels_lambda_takes() {
        let labels = [
            ("team", "ml"),
            ("Team", "x"),
            ("gangway-owner", "spoof"),
            ("cost:center", "42"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let t = tags("c", OWNER, Some("alice"), &labels).unwrap();
        let keys: Vec<_> = t.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "gangway-cluster",
                "gangway-owner",
                "gangway-user",
                "cost:center",
                "team"
            ]
        );
        assert_eq!(t[1].value, OWNER);
        assert!(tags(&"c".repeat(129), OWNER, None, &Default::default()).is_err());
        assert!(tag_key_ok("gangway-cluster") && !tag_key_ok("9a") && !tag_key_ok("a"));
    }
}
