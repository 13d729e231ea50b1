//! `gangway catalog refresh gcp`: which machine types and accelerators each
//! zone has (the Compute API's aggregated lists) and what they cost (the
//! Cloud Billing Catalog API's public SKUs: a VM's price is its vCPUs,
//! GiB of memory and GPUs, each at its family's unit price in the region).
//!
//! SKUs are matched by their descriptions, the only place the family and
//! the part are written: `[Spot Preemptible ]<FAMILY>[ Predefined] Instance
//! Core|Ram running in <where>` and `Nvidia [Tesla ]<MODEL> GPU [attached
//! to Spot Preemptible VMs ]running in <where>`; commitments, custom and
//! sole-tenant shapes, workstation and reservation-only GPUs are skipped.

use std::collections::{BTreeMap, HashMap};

/// The Compute Engine service in the Cloud Billing catalog.
pub(crate) const COMPUTE_SERVICE: &str = "6F81-5844-456A";

/// What a priced VM is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Part {
    Core,
    Ram,
}

/// Unit prices (USD per vCPU-hour, GiB-hour or GPU-hour) by
/// (family or GPU, part, spot, region).
#[derive(Clone, Debug, Default)]
pub(crate) struct UnitPrices {
    machine: HashMap<(String, Part, bool, String), f64>,
    gpu: HashMap<(String, bool, String), f64>,
    /// SKUs read, for the report.
    pub skus: usize,
}

/// A machine type as one zone lists it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Shape {
    pub vcpus: f64,
    pub memory_gib: f64,
    /// Bundled GPUs (A2, A3, G2): catalog name and count.
    pub gpus: Option<(String, f64)>,
}

/// The GPU models GCE lets one attach to an N1 host.
const N1_ATTACHABLE: &[&str] = &["T4", "V100", "P100", "P4", "K80"];

/// The catalog name (`A100-80GB`, `T4`) of a GCE accelerator type
/// (`nvidia-a100-80gb`, `nvidia-tesla-t4`): the inverse of
/// [`crate::gpu_type`] where that has a table entry.
pub(crate) fn catalog_gpu(gce: &str) -> String {
    for name in [
        "A100",
        "A100-80GB",
        "H100",
        "H100-MEGA",
        "H200",
        "L4",
        "T4",
        "V100",
        "P100",
        "P4",
        "K80",
    ] {
        if crate::gpu_type(name) == gce {
            return name.to_string();
        }
    }
    gce.trim_start_matches("nvidia-")
        .trim_start_matches("tesla-")
        .to_ascii_uppercase()
}

/// The catalog name of a GPU SKU's model (`Tesla A100`, `A100 80GB`,
/// `H100 80GB Mega`): the first word, `-80GB` for A100's larger memory,
/// `-MEGA` for A3 Mega's H100.
fn sku_gpu(model: &str) -> Option<String> {
    let words: Vec<&str> = model
        .split_whitespace()
        .filter(|w| !w.eq_ignore_ascii_case("nvidia") && !w.eq_ignore_ascii_case("tesla"))
        .collect();
    let first = words.first()?.to_ascii_uppercase();
    let has = |w: &str| words.iter().any(|x| x.eq_ignore_ascii_case(w));
    Some(if has("mega") {
        format!("{first}-MEGA")
    } else if first == "A100" && has("80GB") {
        "A100-80GB".into()
    } else if words.len() > 1 && !words[1..].iter().all(|w| w.ends_with("GB")) {
        // A variant this reader does not know (e.g. a workstation edition).
        return None;
    } else {
        first
    })
}

/// SKU families a machine type may be priced under, most specific first:
/// `a3-megagpu-8g` → `A3MEGA`, `A3`; `n1-standard-8` → `N1STANDARD`, `N1`.
fn families(machine_type: &str) -> Vec<String> {
    let mut parts = machine_type.split('-');
    let series = parts.next().unwrap_or_default().to_ascii_uppercase();
    let variant = parts
        .next()
        .unwrap_or_default()
        .trim_end_matches("gpu")
        .to_ascii_uppercase();
    vec![format!("{series}{variant}"), series]
}

fn unit_price(sku: &serde_json::Value) -> Option<(f64, String)> {
    let expr = sku.pointer("/pricingInfo/0/pricingExpression")?;
    let unit = expr.get("usageUnit")?.as_str()?.to_string();
    let price = expr
        .get("tieredRates")?
        .as_array()?
        .iter()
        .filter_map(|t| {
            let p = t.get("unitPrice")?;
            if p.get("currencyCode").and_then(|c| c.as_str()) != Some("USD") {
                return None;
            }
            let units: f64 = match p.get("units") {
                Some(serde_json::Value::String(s)) => s.parse().ok()?,
                Some(v) => v.as_f64()?,
                None => 0.0,
            };
            let nanos = p.get("nanos").and_then(|n| n.as_f64()).unwrap_or(0.0);
            Some(units + nanos / 1e9)
        })
        .fold(None, |best: Option<f64>, p| {
            Some(best.map_or(p, |b| b.max(p)))
        })?;
    Some((price, unit))
}

/// Words that mark a SKU as something other than a plain VM part.
const NOT_PLAIN: &[&str] = &[
    "Commitment",
    "Custom",
    "Sole Tenancy",
    "Extended",
    "Reserved",
    "Reservation",
    "Virtual Workstation",
    "DWS",
    "Flex",
    "Calendar",
    "Premium",
];

impl UnitPrices {
    /// Reads one page of SKUs into the table.
    pub fn add_page(&mut self, skus: &[serde_json::Value]) {
        for sku in skus {
            self.skus += 1;
            self.add(sku);
        }
    }

    fn add(&mut self, sku: &serde_json::Value) {
        let text = |p: &str| sku.pointer(p).and_then(|v| v.as_str()).unwrap_or_default();
        if text("/category/resourceFamily") != "Compute" {
            return;
        }
        let spot = match text("/category/usageType") {
            "OnDemand" => false,
            "Preemptible" => true,
            _ => return,
        };
        let desc = text("/description");
        if NOT_PLAIN.iter().any(|w| desc.contains(w)) {
            return;
        }
        let Some((price, unit)) = unit_price(sku) else {
            return;
        };
        let Some((what, _)) = desc.split_once(" running in ") else {
            return;
        };
        let regions: Vec<String> = sku
            .get("serviceRegions")
            .and_then(|r| r.as_array())
            .map(|r| {
                r.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if let Some((model, _)) = what.split_once(" GPU") {
            if unit != "h" {
                return;
            }
            let Some(gpu) = sku_gpu(model) else { return };
            for r in regions {
                self.gpu.insert((gpu.clone(), spot, r), price);
            }
            return;
        }
        // "Spot Preemptible" since Spot VMs; "Preemptible" before.
        let what = what
            .strip_prefix("Spot Preemptible ")
            .or_else(|| what.strip_prefix("Preemptible "))
            .unwrap_or(what);
        let (family, part) = if let Some(f) = what.strip_suffix(" Instance Core") {
            (f, Part::Core)
        } else if let Some(f) = what.strip_suffix(" Instance Ram") {
            (f, Part::Ram)
        } else {
            return;
        };
        let wanted_unit = match part {
            Part::Core => "h",
            Part::Ram => "GiBy.h",
        };
        if unit != wanted_unit {
            return;
        }
        let family: String = family
            .trim_end_matches(" Predefined")
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_uppercase();
        for r in regions {
            self.machine.insert((family.clone(), part, spot, r), price);
        }
    }

    /// The hourly price of `machine_type` of `shape` with `extra` GPUs
    /// attached, on this market in this region, if every part is priced.
    pub fn price(
        &self,
        machine_type: &str,
        shape: &Shape,
        extra: Option<(&str, f64)>,
        spot: bool,
        region: &str,
    ) -> Option<f64> {
        let part = |p: Part| {
            families(machine_type)
                .into_iter()
                .find_map(|f| self.machine.get(&(f, p, spot, region.to_string())).copied())
        };
        let mut total = part(Part::Core)? * shape.vcpus + part(Part::Ram)? * shape.memory_gib;
        let gpus = shape
            .gpus
            .as_ref()
            .map(|(g, n)| (g.as_str(), *n))
            .into_iter()
            .chain(extra);
        for (gpu, n) in gpus {
            total += self.gpu.get(&(gpu.to_string(), spot, region.to_string()))? * n;
        }
        Some((total * 1e6).round() / 1e6)
    }

    /// Whether any SKU was read.
    pub fn is_empty(&self) -> bool {
        self.machine.is_empty() && self.gpu.is_empty()
    }
}

/// One zone's offer: machine types by name and accelerators (catalog name
/// → most cards per VM).
#[derive(Clone, Debug, Default)]
pub(crate) struct ZoneOffer {
    pub machines: BTreeMap<String, Shape>,
    pub accelerators: BTreeMap<String, u32>,
}

/// GPU counts GCE lets one attach to an N1 host, up to the zone's maximum.
pub(crate) fn attachable(offer: &ZoneOffer) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (gpu, max) in &offer.accelerators {
        if !N1_ATTACHABLE.contains(&gpu.as_str()) {
            continue;
        }
        for n in [1u32, 2, 4, 8] {
            if n <= *max {
                out.push((gpu.clone(), f64::from(n)));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sku(
        desc: &str,
        usage: &str,
        unit: &str,
        region: &str,
        units: &str,
        nanos: i64,
    ) -> serde_json::Value {
        json!({
            "description": desc,
            "category": {"resourceFamily": "Compute", "usageType": usage, "resourceGroup": "X"},
            "serviceRegions": [region],
            "pricingInfo": [{"pricingExpression": {"usageUnit": unit, "tieredRates": [
                {"startUsageAmount": 0, "unitPrice": {"currencyCode": "USD", "units": units, "nanos": nanos}}
            ]}}],
        })
    }

    #[test]
    fn gpu_names_meet_the_catalogs() {
        assert_eq!(catalog_gpu("nvidia-tesla-t4"), "T4");
        assert_eq!(catalog_gpu("nvidia-a100-80gb"), "A100-80GB");
        assert_eq!(catalog_gpu("nvidia-h100-mega-80gb"), "H100-MEGA");
        assert_eq!(catalog_gpu("nvidia-b200"), "B200");
        assert_eq!(sku_gpu("Nvidia Tesla T4").as_deref(), Some("T4"));
        assert_eq!(sku_gpu("Nvidia Tesla A100").as_deref(), Some("A100"));
        assert_eq!(sku_gpu("Nvidia A100 80GB").as_deref(), Some("A100-80GB"));
        assert_eq!(sku_gpu("Nvidia H100 80GB").as_deref(), Some("H100"));
        assert_eq!(
            sku_gpu("Nvidia H100 80GB Mega").as_deref(),
            Some("H100-MEGA")
        );
        assert_eq!(sku_gpu("Nvidia Tesla T4 Something").as_deref(), None);
        assert_eq!(families("a3-megagpu-8g"), ["A3MEGA", "A3"]);
        assert_eq!(families("n1-standard-8"), ["N1STANDARD", "N1"]);
    }

    #[test]
    fn a_vm_costs_its_cores_memory_and_gpus_on_its_market() {
        let mut u = UnitPrices::default();
        u.add_page(&[
            sku("N1 Predefined Instance Core running in Americas", "OnDemand", "h", "us-central1", "0", 31_611_000),
            sku("N1 Predefined Instance Ram running in Americas", "OnDemand", "GiBy.h", "us-central1", "0", 4_237_000),
            sku("Spot Preemptible N1 Predefined Instance Core running in Americas", "Preemptible", "h", "us-central1", "0", 10_000_000),
            // The older wording, before Spot VMs.
            sku("Preemptible N1 Predefined Instance Ram running in Americas", "Preemptible", "GiBy.h", "us-central1", "0", 1_000_000),
            sku("Nvidia Tesla T4 GPU running in Americas", "OnDemand", "h", "us-central1", "0", 350_000_000),
            sku("Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in Americas", "Preemptible", "h", "us-central1", "0", 140_000_000),
            sku("A2 Instance Core running in Americas", "OnDemand", "h", "us-central1", "0", 31_611_000),
            sku("A2 Instance Ram running in Americas", "OnDemand", "GiBy.h", "us-central1", "0", 4_237_000),
            sku("Nvidia Tesla A100 GPU running in Americas", "OnDemand", "h", "us-central1", "2", 933_908_000),
            // Skipped: a commitment, a custom shape, another family, a license.
            sku("Commitment v1: N1 Predefined Instance Core in Americas for 1 Year", "Commit1Yr", "h", "us-central1", "0", 1),
            sku("N1 Custom Instance Core running in Americas", "OnDemand", "h", "us-central1", "9", 0),
            json!({"description": "Licensing Fee for Windows", "category": {"resourceFamily": "License", "usageType": "OnDemand"}}),
        ]);
        assert_eq!(u.skus, 12);
        let n1 = Shape {
            vcpus: 8.0,
            memory_gib: 30.0,
            gpus: None,
        };
        // 8 × 0.031611 + 30 × 0.004237 + 1 × 0.35
        assert_eq!(
            u.price(
                "n1-standard-8",
                &n1,
                Some(("T4", 1.0)),
                false,
                "us-central1"
            ),
            Some(0.729998)
        );
        // Spot: 8 × 0.01 + 30 × 0.001 + 2 × 0.14
        assert_eq!(
            u.price("n1-standard-8", &n1, Some(("T4", 2.0)), true, "us-central1"),
            Some(0.39)
        );
        // No V100 SKU, no price; no SKU in another region either.
        assert_eq!(
            u.price(
                "n1-standard-8",
                &n1,
                Some(("V100", 1.0)),
                false,
                "us-central1"
            ),
            None
        );
        assert_eq!(
            u.price("n1-standard-8", &n1, None, false, "europe-west4"),
            None
        );
        let a2 = Shape {
            vcpus: 12.0,
            memory_gib: 85.0,
            gpus: Some(("A100".into(), 1.0)),
        };
        // 12 × 0.031611 + 85 × 0.004237 + 2.933908
        assert_eq!(
            u.price("a2-highgpu-1g", &a2, None, false, "us-central1"),
            Some(3.673385)
        );
        assert_eq!(
            u.price("a2-highgpu-1g", &a2, None, true, "us-central1"),
            None,
            "no spot SKUs for A2 given"
        );
    }

    #[test]
    fn n1_hosts_take_the_zones_attachable_gpus_up_to_its_maximum() {
        let mut z = ZoneOffer::default();
        z.accelerators.insert("T4".into(), 4);
        z.accelerators.insert("A100".into(), 16);
        let got = attachable(&z);
        assert_eq!(
            got,
            [
                ("T4".to_string(), 1.0),
                ("T4".into(), 2.0),
                ("T4".into(), 4.0)
            ]
        );
    }
}
