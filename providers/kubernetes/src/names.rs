//! Names Kubernetes accepts, made from gangway's: label values, pod names,
//! GPU names read from node labels, and the catalog's instance types.

/// A stable 64-bit FNV-1a hash (the same on every machine and version).
pub fn hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// Whether `v` is a valid label value: at most 63 characters,
/// alphanumerics, `-`, `_`, `.`, beginning and ending alphanumeric.
pub fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// `v` itself where it is a valid label value, else `h-` and a hash of it
/// (the exact text then travels in an annotation).
pub fn label_value(v: &str) -> String {
    if is_label_value(v) && !v.is_empty() {
        v.to_string()
    } else {
        format!("h-{:016x}", hash(&[v]))
    }
}

/// The name prefix of a cluster's pods: a DNS-1123 slug of the cluster's
/// name and a hash of name and owner (so two installations' clusters of
/// one name never share pod names), e.g. `gw-train-3f2a9c1d`.
pub fn pod_prefix(cluster: &str, owner: &str) -> String {
    let mut slug: String = cluster
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    slug.truncate(40);
    let slug = slug.trim_matches('-');
    let h = hash(&[cluster, owner]) as u32;
    if slug.is_empty() {
        format!("gw-{h:08x}")
    } else {
        format!("gw-{slug}-{h:08x}")
    }
}

/// gangway's name for a GPU product as a node label says it, the way the
/// NVIDIA GPU operator (`nvidia.com/gpu.product`: `NVIDIA-H100-80GB-HBM3`,
/// `NVIDIA-A100-SXM4-80GB`, `NVIDIA-RTX-A6000`) and GKE
/// (`cloud.google.com/gke-accelerator`: `nvidia-tesla-a100`,
/// `nvidia-a100-80gb`) write them: `H100`, `A100-80GB`, `A100`, `A6000`.
/// The memory size keeps apart the catalog's types that differ by it
/// (A100 40/80 GB, V100 16/32 GB) wherever in the label it stands; a
/// product it does not know keeps the label's text.
pub fn gpu_name(label: &str) -> String {
    let up = label.to_ascii_uppercase();
    let words: Vec<&str> = up
        .split(['-', '_', ' '])
        .filter(|w| !w.is_empty() && *w != "NVIDIA" && *w != "TESLA" && *w != "GEFORCE")
        .collect();
    const KNOWN: &[&str] = &[
        "GB200",
        "B200",
        "B100",
        "H200",
        "H100",
        "GH200",
        "A100",
        "A10G",
        "A10",
        "A40",
        "A30",
        "A6000",
        "L40S",
        "L40",
        "L4",
        "T4",
        "V100",
        "P100",
        "P4",
        "K80",
        "RTX6000",
        "RTXPRO6000",
    ];
    // Catalog types named by their memory as well (`A100-80GB`).
    const BY_MEMORY: &[(&str, &str)] = &[("A100", "80GB"), ("V100", "32GB")];
    for (i, w) in words.iter().enumerate() {
        if let Some(k) = KNOWN.iter().find(|k| *k == w) {
            let rest = &words[i + 1..];
            if let Some((_, mem)) = BY_MEMORY
                .iter()
                .find(|(g, mem)| g == k && rest.contains(mem))
            {
                return format!("{k}-{mem}");
            }
            return k.to_string();
        }
        // Consumer cards: `NVIDIA-GeForce-RTX-4090` → `RTX4090`.
        if *w == "RTX" {
            if let Some(n) = words
                .get(i + 1)
                .filter(|n| n.len() == 4 && n.starts_with(['3', '4', '5']))
            {
                if n.bytes().all(|b| b.is_ascii_digit()) {
                    return format!("RTX{n}");
                }
            }
        }
    }
    label.to_string()
}

/// One pod shape the catalog offers: GPUs (name, count), CPUs and memory
/// requested.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// GPU name and count, if any.
    pub gpu: Option<(String, u32)>,
    /// CPUs requested (cores, may be fractional).
    pub cpus: f64,
    /// Memory requested, GiB.
    pub memory_gib: f64,
}

impl Shape {
    /// The catalog's instance type: `H100x4-48c-400g`, `cpu-8c-30g`.
    pub fn instance_type(&self) -> String {
        let gpu = match &self.gpu {
            Some((g, n)) => format!("{g}x{n}"),
            None => "cpu".into(),
        };
        format!("{gpu}-{}c-{}g", trim(self.cpus), trim(self.memory_gib))
    }

    /// Reads an instance type back.
    pub fn parse(it: &str) -> Option<Shape> {
        let mut parts = it.rsplitn(3, '-');
        let mem = parts.next()?.strip_suffix('g')?.parse::<f64>().ok()?;
        let cpus = parts.next()?.strip_suffix('c')?.parse::<f64>().ok()?;
        let gpu = parts.next()?;
        let gpu = if gpu == "cpu" {
            None
        } else {
            let (name, n) = gpu.rsplit_once('x')?;
            Some((name.to_string(), n.parse::<u32>().ok().filter(|n| *n > 0)?))
        };
        (cpus.is_finite() && mem.is_finite()).then_some(Shape {
            gpu,
            cpus,
            memory_gib: mem,
        })
    }
}

/// A number as short as it reads: `4`, `0.5`, `7.5`.
fn trim(x: f64) -> String {
    let s = format!("{:.1}", (x * 10.0).floor() / 10.0);
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_valid_or_hashed() {
        assert_eq!(label_value("train-1"), "train-1");
        assert_eq!(label_value("gw-00000000000000aa"), "gw-00000000000000aa");
        for bad in ["my cluster", "-x", "x-", "é", &"a".repeat(64), ""] {
            let v = label_value(bad);
            assert!(v.starts_with("h-") && is_label_value(&v), "{bad} → {v}");
        }
        assert_ne!(label_value("a b"), label_value("a  b"));
    }

    #[test]
    fn pod_prefixes_are_dns_names_per_owner() {
        let p = pod_prefix("My_Train.run", "gw-1");
        assert!(p.starts_with("gw-my-train-run-"), "{p}");
        assert_ne!(p, pod_prefix("My_Train.run", "gw-2"));
        let long = pod_prefix(&"x".repeat(200), "o");
        assert!(long.len() <= 3 + 40 + 1 + 8, "{long}");
        assert!(pod_prefix("___", "o").starts_with("gw-"));
    }

    #[test]
    fn gpu_products_read_as_catalog_names() {
        assert_eq!(gpu_name("NVIDIA-H100-80GB-HBM3"), "H100");
        assert_eq!(gpu_name("nvidia-tesla-a100"), "A100");
        assert_eq!(gpu_name("nvidia-a100-80gb"), "A100-80GB");
        // The GPU operator's 80 GB SXM and PCIe A100s, and its 40 GB one.
        assert_eq!(gpu_name("NVIDIA-A100-SXM4-80GB"), "A100-80GB");
        assert_eq!(gpu_name("NVIDIA-A100-80GB-PCIe"), "A100-80GB");
        assert_eq!(gpu_name("NVIDIA-A100-SXM4-40GB"), "A100");
        assert_eq!(gpu_name("NVIDIA-A100-PCIE-40GB"), "A100");
        assert_eq!(gpu_name("Tesla-V100-SXM2-32GB"), "V100-32GB");
        assert_eq!(gpu_name("NVIDIA-RTX-A6000"), "A6000");
        assert_eq!(gpu_name("NVIDIA-GeForce-RTX-4090"), "RTX4090");
        assert_eq!(gpu_name("nvidia-h100-80gb"), "H100");
        assert_eq!(gpu_name("NVIDIA-GH200-480GB"), "GH200");
        assert_eq!(gpu_name("nvidia-l4"), "L4");
        assert_eq!(gpu_name("nvidia-tesla-t4"), "T4");
        assert_eq!(gpu_name("Tesla-V100-SXM2-16GB"), "V100");
        assert_eq!(gpu_name("NVIDIA-L40S"), "L40S");
        assert_eq!(gpu_name("MI300X"), "MI300X");
    }

    #[test]
    fn instance_types_round_trip() {
        for s in [
            Shape {
                gpu: Some(("H100".into(), 4)),
                cpus: 48.0,
                memory_gib: 400.5,
            },
            Shape {
                gpu: Some(("NVIDIA-X.Y".into(), 1)),
                cpus: 0.5,
                memory_gib: 2.0,
            },
            Shape {
                gpu: None,
                cpus: 8.0,
                memory_gib: 30.0,
            },
        ] {
            let it = s.instance_type();
            assert_eq!(Shape::parse(&it), Some(s), "{it}");
        }
        assert_eq!(
            Shape {
                gpu: Some(("A100".into(), 8)),
                cpus: 96.0,
                memory_gib: 1000.0
            }
            .instance_type(),
            "A100x8-96c-1000g"
        );
        assert_eq!(Shape::parse("m5.large"), None);
        assert_eq!(Shape::parse("H100x0-1c-1g"), None);
    }
}
