//! Names, labels and request ids gangway gives GCE resources.

/// Everything named after one cluster of one owner.
#[derive(Clone, Debug)]
pub struct Names {
    /// `gw-<cluster>-<hash>`: VM name prefix, network tag, policy and rule base.
    pub base: String,
    /// The `gangway-cluster` label value.
    pub label: String,
    /// The `gangway-owner` label value.
    pub owner_label: String,
    /// The network tag the firewall rules target.
    pub tag: String,
}

fn fnv(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// `s` as a label value: lowercase letters, digits and `-`, at most 63.
pub fn label_value(s: &str) -> String {
    clean(s, 63)
}

/// Lowercase letters, digits and `-` only (GCE names and label values).
fn clean(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .take(max)
        .collect();
    while out.ends_with('-') {
        out.pop();
    }
    out
}

impl Names {
    /// Names for `cluster` launched by `owner`. The hash keeps two clusters
    /// whose names clean to the same text (or two owners) apart.
    pub fn new(cluster: &str, owner: &str) -> Names {
        let h = fnv(&[cluster, owner]) as u32;
        let base = format!("gw-{}-{h:08x}", clean(cluster, 24));
        Names {
            label: base.clone(),
            owner_label: {
                let o = clean(owner, 63);
                if o.is_empty() {
                    "unknown".into()
                } else {
                    o
                }
            },
            tag: base.clone(),
            base,
        }
    }

    /// `bulkInsert`'s name pattern: `<base>-####`.
    pub fn pattern(&self) -> String {
        format!("{}-####", self.base)
    }

    /// The compact-placement resource policy.
    pub fn policy(&self) -> String {
        format!("{}-compact", self.base)
    }

    /// The rule opening SSH to the caller.
    pub fn firewall_ssh(&self) -> String {
        format!("{}-ssh", self.base)
    }

    /// The rule opening everything between members.
    pub fn firewall_internal(&self) -> String {
        format!("{}-internal", self.base)
    }

    /// The rule opening the task's `ports` to the world.
    pub fn firewall_ports(&self) -> String {
        format!("{}-ports", self.base)
    }
}

/// A request id (a UUID, as GCE wants) derived from `parts`: the same
/// request always gets the same id, so GCE answers a retry with the first
/// call's operation instead of doing it twice.
pub fn request_id(parts: &[&str]) -> String {
    let a = fnv(parts);
    let b = fnv(&[&format!("{a:x}"), "gangway"]);
    let v = (u128::from(a) << 64) | u128::from(b);
    // Version 4 and the RFC 4122 variant bits, so it parses as a UUID.
    let v = (v & !(0xf << 76)) | (0x4 << 76);
    let v = (v & !(0x3 << 62)) | (0x2 << 62);
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// The machine series GCE gives compact placement to, one per line (see
/// the file).
const COMPACT_SERIES: &str = include_str!("../compact_placement_series.txt");

/// A machine type's series: its name up to the first `-` (`n1-standard-8`:
/// `n1`).
pub fn series(machine_type: &str) -> &str {
    machine_type.split('-').next().unwrap_or_default()
}

/// Whether GCE accepts a compact placement policy for VMs of this type.
pub fn compact_placement_supported(machine_type: &str) -> bool {
    let s = series(machine_type);
    COMPACT_SERIES
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .any(|l| l.eq_ignore_ascii_case(s))
}

/// GCE's accelerator type for a catalog GPU name.
pub fn gpu_type(name: &str) -> String {
    match name.to_ascii_uppercase().as_str() {
        "A100" => "nvidia-tesla-a100".into(),
        "A100-80GB" => "nvidia-a100-80gb".into(),
        "H100" => "nvidia-h100-80gb".into(),
        "H100-MEGA" => "nvidia-h100-mega-80gb".into(),
        "H200" => "nvidia-h200-141gb".into(),
        "L4" => "nvidia-l4".into(),
        "T4" => "nvidia-tesla-t4".into(),
        "V100" => "nvidia-tesla-v100".into(),
        "P100" => "nvidia-tesla-p100".into(),
        "P4" => "nvidia-tesla-p4".into(),
        "K80" => "nvidia-tesla-k80".into(),
        other => format!("nvidia-{}", other.to_ascii_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_gce_names_and_per_owner() {
        let n = Names::new("My_Cluster.v2", "Alice");
        assert!(n.base.starts_with("gw-my-cluster-v2-"), "{}", n.base);
        assert!(n.base.len() <= 63 - 5);
        assert!(n
            .base
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        assert_ne!(Names::new("x", "alice").base, Names::new("x", "bob").base);
        assert_ne!(Names::new("a.b", "o").base, Names::new("a-b", "o").base);
        assert_eq!(n.owner_label, "alice");
    }

    #[test]
    fn compact_placement_only_for_the_series_gce_places_so() {
        for ty in [
            "a2-highgpu-8g",
            "a3-megagpu-8g",
            "a4-highgpu-8g",
            "g2-standard-24",
            "c3-standard-8",
            "n2-standard-8",
        ] {
            assert!(compact_placement_supported(ty), "{ty}");
        }
        for ty in ["n1-standard-8", "e2-standard-2", "custom-8-32768", ""] {
            assert!(!compact_placement_supported(ty), "{ty}");
        }
        assert_eq!(series("n2d-standard-8"), "n2d");
    }

    #[test]
    fn request_ids_are_uuids_stable_per_request() {
        let a = request_id(&["tok", "2"]);
        assert_eq!(a, request_id(&["tok", "2"]));
        assert_ne!(a, request_id(&["tok", "3"]));
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!(matches!(
            parts[3].chars().next(),
            Some('8' | '9' | 'a' | 'b')
        ));
    }
}
