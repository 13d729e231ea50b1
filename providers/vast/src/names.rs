//! gangway's tags on Vast.ai, and its instance types. An instance has no
//! tags, but it has a label, which every listing returns: gangway's is
//! `<owner id>--<cluster>--<index>`, and the launching user goes in the
//! environment as `GANGWAY_TAG_USER`. An instance type is
//! `<N>x_<GPU>`, Vast's `gpu_name` with `_` for spaces (`1x_RTX_4090`):
//! a machine with N such GPUs.

/// The environment variable naming the launching user, for people.
pub const TAG_USER: &str = "GANGWAY_TAG_USER";

/// The label of node `index` of `owner`'s `cluster`.
pub fn label(owner: &str, cluster: &str, index: usize) -> String {
    format!("{owner}--{cluster}--{index}")
}

/// The (owner, cluster, index) a label of [`label`] holds.
pub fn parse_label(label: &str) -> Option<(&str, &str, usize)> {
    let (owner, rest) = label.split_once("--")?;
    let (cluster, index) = rest.rsplit_once("--")?;
    let index = index.parse().ok()?;
    (gangway_provider::is_owner_id(owner) && !cluster.is_empty()).then_some((owner, cluster, index))
}

/// (GPUs, Vast's `gpu_name`) of an instance type; `Err` says the form.
pub fn parse_type(instance_type: &str) -> Result<(u32, String), String> {
    let bad = || {
        format!(
            "{instance_type:?} is no Vast.ai instance type: expected <N>x_<GPU>, e.g. 1x_RTX_4090"
        )
    };
    let (n, gpu) = instance_type.split_once("x_").ok_or_else(bad)?;
    let n: u32 = n.parse().ok().filter(|n| *n >= 1).ok_or_else(bad)?;
    if gpu.is_empty() {
        return Err(bad());
    }
    Ok((n, gpu.replace('_', " ")))
}

/// The instance type of `n` GPUs named `gpu_name`.
pub fn type_name(n: u32, gpu_name: &str) -> String {
    format!("{n}x_{}", gpu_name.replace(' ', "_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "gw-0123456789abcdef";

    #[test]
    fn labels_carry_owner_cluster_and_index() {
        let l = label(OWNER, "my--train", 3);
        assert_eq!(parse_label(&l), Some((OWNER, "my--train", 3)));
        assert_eq!(parse_label("my instance"), None);
        assert_eq!(parse_label("alice--c--0"), None);
        assert_eq!(parse_label(&format!("{OWNER}--c--x")), None);
    }

    #[test]
    fn types_are_gpu_count_and_name() {
        assert_eq!(parse_type("2x_RTX_4090").unwrap(), (2, "RTX 4090".into()));
        assert_eq!(type_name(8, "H100 SXM"), "8x_H100_SXM");
        for bad in ["", "1x_", "0x_L40S", "gpu_1x_a10"] {
            assert!(
                parse_type(bad).unwrap_err().contains("1x_RTX_4090"),
                "{bad}"
            );
        }
    }
}
