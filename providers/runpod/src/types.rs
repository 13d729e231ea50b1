//! gangway's RunPod instance types: `<N>x_<ACCELERATOR>_<SECURE|COMMUNITY>`
//! (the form of SkyPilot's RunPod catalog, e.g. `1x_A100-80GB_SECURE`): a
//! pod of N GPUs of one type in one of RunPod's two clouds. The catalog's
//! accelerator names map to RunPod's GPU type ids by [`GPU_IDS`]; a name
//! that is not there is taken as RunPod's id itself (`1x_NVIDIA L4_SECURE`).

use crate::api::Cloud;

/// Catalog accelerator name -> RunPod GPU type id (the v2 catalog's
/// `GpuType.id`, also the v1 document's `gpuTypeIds` enum).
pub const GPU_IDS: &[(&str, &str)] = &[
    ("A100-80GB", "NVIDIA A100 80GB PCIe"),
    ("A100-80GB-SXM", "NVIDIA A100-SXM4-80GB"),
    ("A40", "NVIDIA A40"),
    ("H100", "NVIDIA H100 80GB HBM3"),
    ("H100-SXM", "NVIDIA H100 80GB HBM3"),
    ("H100-PCIE", "NVIDIA H100 PCIe"),
    ("H100-NVL", "NVIDIA H100 NVL"),
    ("H200", "NVIDIA H200"),
    ("L4", "NVIDIA L4"),
    ("L40", "NVIDIA L40"),
    ("L40S", "NVIDIA L40S"),
    ("RTX3090", "NVIDIA GeForce RTX 3090"),
    ("RTX4090", "NVIDIA GeForce RTX 4090"),
    ("RTX5090", "NVIDIA GeForce RTX 5090"),
    ("RTXA4000", "NVIDIA RTX A4000"),
    ("RTXA5000", "NVIDIA RTX A5000"),
    ("RTXA6000", "NVIDIA RTX A6000"),
    ("RTX6000-Ada", "NVIDIA RTX 6000 Ada Generation"),
];

/// One instance type, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodType {
    /// GPUs per pod.
    pub count: u32,
    /// RunPod's GPU type id.
    pub gpu_id: String,
    /// Secure or community cloud.
    pub cloud: Cloud,
}

/// Parses `<N>x_<ACCELERATOR>_<SECURE|COMMUNITY>`; `Err` says the form.
pub fn parse(instance_type: &str) -> Result<PodType, String> {
    let bad = || {
        format!(
            "{instance_type:?} is no RunPod instance type: expected <N>x_<GPU>_<SECURE|COMMUNITY>, \
             e.g. 1x_A100-80GB_SECURE"
        )
    };
    let (count, rest) = instance_type.split_once("x_").ok_or_else(bad)?;
    let (gpu, cloud) = rest.rsplit_once('_').ok_or_else(bad)?;
    let count: u32 = count.parse().ok().filter(|n| *n >= 1).ok_or_else(bad)?;
    let cloud = match cloud {
        "SECURE" => Cloud::Secure,
        "COMMUNITY" => Cloud::Community,
        _ => return Err(bad()),
    };
    if gpu.is_empty() {
        return Err(bad());
    }
    Ok(PodType {
        count,
        gpu_id: gpu_id(gpu).to_string(),
        cloud,
    })
}

/// RunPod's id of the catalog's accelerator `name` (case-insensitive), or
/// `name` itself.
pub fn gpu_id(name: &str) -> &str {
    GPU_IDS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, id)| *id)
        .unwrap_or(name)
}

/// The instance type of `count` GPUs of RunPod's `gpu_id` in `cloud`:
/// the catalog's name where [`GPU_IDS`] has one.
pub fn name(count: u32, gpu_id: &str, cloud: Cloud) -> String {
    let gpu = GPU_IDS
        .iter()
        .find(|(_, id)| *id == gpu_id)
        .map(|(n, _)| *n)
        .unwrap_or(gpu_id);
    format!("{count}x_{gpu}_{}", cloud.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_parse_to_runpods_ids_and_back() {
        let t = parse("2x_A100-80GB_SECURE").unwrap();
        assert_eq!(
            t,
            PodType {
                count: 2,
                gpu_id: "NVIDIA A100 80GB PCIe".into(),
                cloud: Cloud::Secure
            }
        );
        assert_eq!(name(2, &t.gpu_id, t.cloud), "2x_A100-80GB_SECURE");
        let t = parse("1x_rtx4090_COMMUNITY").unwrap();
        assert_eq!(t.gpu_id, "NVIDIA GeForce RTX 4090");
        assert_eq!(t.cloud, Cloud::Community);
        // RunPod's own id, spaces and all.
        assert_eq!(parse("1x_NVIDIA L4_SECURE").unwrap().gpu_id, "NVIDIA L4");
        for bad in [
            "",
            "gpu_1x_a10",
            "0x_L4_SECURE",
            "1x_L4_SPOT",
            "1x__SECURE",
            "x_L4_SECURE",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("1x_A100-80GB_SECURE"), "{bad}: {e}");
        }
    }
}
