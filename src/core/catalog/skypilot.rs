//! Reader for SkyPilot's v8 catalog layout (`<cloud>/vms.csv`).
//!
//! Columns are found by header name, so the AWS, GCP, Azure and Lambda
//! layouts (which order them differently) all load. GCP lists GPUs as rows
//! of their own (empty `InstanceType`) priced apart from the host; those are
//! joined to the host types they attach to, and the offering costs both.

use std::collections::{HashMap, HashSet};

use super::{CatalogError, Interner, Offering};

struct Cols {
    instance_type: usize,
    accel: Option<usize>,
    accel_count: Option<usize>,
    vcpus: Option<usize>,
    memory: Option<usize>,
    gpu_info: Option<usize>,
    price: usize,
    spot: Option<usize>,
    region: usize,
    zone: Option<usize>,
}

/// Parses one `vms.csv`. Returns the offerings and one warning per row
/// that could not be used (`file:line: reason`).
pub fn load_skypilot_csv(
    cloud: &str,
    text: &str,
    shown: &str,
) -> Result<(Vec<Offering>, Vec<String>), CatalogError> {
    let mut rdr = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let headers = rdr
        .headers()
        .map_err(|e| CatalogError::Layout {
            path: shown.into(),
            reason: format!("cannot read the header row: {e}"),
        })?
        .clone();
    let find = |name: &str| headers.iter().position(|h| h.trim() == name);
    let need = |name: &str| {
        find(name).ok_or_else(|| CatalogError::Layout {
            path: shown.into(),
            reason: format!(
                "missing column '{name}' (found: {}); expected SkyPilot's v8 vms.csv layout",
                headers.iter().collect::<Vec<_>>().join(",")
            ),
        })
    };
    let cols = Cols {
        instance_type: need("InstanceType")?,
        accel: find("AcceleratorName"),
        accel_count: find("AcceleratorCount"),
        vcpus: find("vCPUs"),
        memory: find("MemoryGiB"),
        gpu_info: find("GpuInfo"),
        price: need("Price")?,
        spot: find("SpotPrice"),
        region: need("Region")?,
        zone: find("AvailabilityZone"),
    };
    let mut hosts: Vec<Offering> = Vec::new();
    let mut gpus: Vec<(Offering, usize)> = Vec::new();
    let mut warnings = Vec::new();
    let mut record = csv::StringRecord::new();
    let mut names = Interner::default();
    let cloud_name = names.get(cloud);
    loop {
        match rdr.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map_or(0, |p| p.line());
                warnings.push(format!("{shown}:{line}: unreadable row: {e}"));
                continue;
            }
        }
        let line = record.position().map_or(0, |p| p.line()) as usize;
        match row(&cloud_name, &record, &cols, &mut names) {
            Ok(Some(o)) if o.instance_type.is_empty() => gpus.push((o, line)),
            Ok(Some(o)) => hosts.push(o),
            Ok(None) => {}
            Err(e) => warnings.push(format!("{shown}:{line}: {e}")),
        }
    }
    if !gpus.is_empty() {
        let joined = attach_gpus(&hosts, gpus, shown, &mut warnings);
        // Hosts of GPU-bound families cannot be rented without their GPUs.
        hosts.retain(|h| h.accelerator.is_some() || !gpu_bound_host(&h.instance_type));
        hosts.extend(joined);
    }
    Ok((hosts, warnings))
}

/// What gangway's own catalog rows say and SkyPilot's leave out, per
/// cloud: whether GPU types are launched in a cluster placement group, and
/// which instance families have EFA. Data about the catalogs' layout, not a
/// provider's behaviour: the provider decides at launch what it does with
/// them.
struct Layout {
    cloud: &'static str,
    gpus_take_placement_groups: bool,
    efa_families: &'static [&'static str],
}

const LAYOUT: &[Layout] = &[Layout {
    cloud: "aws",
    gpus_take_placement_groups: true,
    efa_families: &["p4d", "p4de", "p5", "p5e", "p5en", "p6"],
}];
fn row(
    cloud: &super::Name,
    r: &csv::StringRecord,
    c: &Cols,
    names: &mut Interner,
) -> Result<Option<Offering>, String> {
    let get = |i: Option<usize>| i.and_then(|i| r.get(i)).map(str::trim).unwrap_or("");
    let num = |i: Option<usize>, name: &str| -> Result<Option<f64>, String> {
        let s = get(i);
        if s.is_empty() {
            return Ok(None);
        }
        s.parse::<f64>()
            .ok()
            .filter(|v| super::in_range(*v))
            .map(Some)
            .ok_or_else(|| format!("{name}: '{s}' is not a number (0 to 1,000,000)"))
    };
    if r.len() < c.region.max(c.price) + 1 {
        return Err(format!("only {} fields", r.len()));
    }
    let accelerator = match get(c.accel) {
        "" => None,
        // TPUs are not GPUs and need their own provisioning path.
        a if a.starts_with("tpu-") => return Ok(None),
        a => Some(names.get(a)),
    };
    let count = num(c.accel_count, "AcceleratorCount")?.unwrap_or(0.0) as f32;
    if accelerator.is_some() && count <= 0.0 {
        return Err("AcceleratorCount must be positive when AcceleratorName is set".into());
    }
    // Published catalogs use 0 for "no price here"; nothing is free.
    let price = num(Some(c.price), "Price")?.filter(|p| *p > 0.0);
    let spot_price = num(c.spot, "SpotPrice")?.filter(|p| *p > 0.0);
    if price.is_none() && spot_price.is_none() {
        return Err("no Price and no SpotPrice".into());
    }
    let region = get(Some(c.region));
    if region.is_empty() {
        return Err("empty Region".into());
    }
    let zone = match get(c.zone) {
        "" => region,
        z => z,
    };
    let gpu_mem = gpu_memory_gib(get(c.gpu_info));
    let instance_type = get(Some(c.instance_type));
    let family = instance_type.split('.').next().unwrap_or("");
    let layout = LAYOUT.iter().find(|l| *cloud == l.cloud);
    Ok(Some(Offering {
        cloud: cloud.clone(),
        instance_type: names.get(instance_type),
        accelerator,
        accelerator_count: count,
        accelerator_memory_gib: gpu_mem,
        vcpus: num(c.vcpus, "vCPUs")?.unwrap_or(0.0) as f32,
        memory_gib: num(c.memory, "MemoryGiB")?.unwrap_or(0.0) as f32,
        region: names.get(region),
        zone: names.get(zone),
        price,
        spot_price,
        placement: layout.is_some_and(|l| l.gpus_take_placement_groups) && count > 0.0,
        efa: layout.is_some_and(|l| l.efa_families.contains(&family)),
        // Published catalogs carry the provider's figures.
        estimated: super::Estimated::default(),
    }))
}

/// `{'Gpus': [{... 'MemoryInfo': {'SizeInMiB': 40960}}] ...}` -> 40 GiB.
fn gpu_memory_gib(info: &str) -> Option<f32> {
    let at = info.find("SizeInMiB")?;
    let digits: String = info[at..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse::<f32>().ok().map(|mib| mib / 1024.0)
}

/// GCP machine families that only exist with their GPUs attached.
fn gpu_bound_host(t: &str) -> bool {
    ["a2-", "a3-", "a4-", "a4x-", "g2-", "g4-"]
        .iter()
        .any(|p| t.starts_with(p))
}

/// Host types a GCP GPU row attaches to: the A2/A3/A4/G2 families carry a
/// fixed number of GPUs; T4/V100/P100/P4 attach to N1 hosts within a vCPU
/// limit per GPU count.
fn hosts_for(gpu: &str, count: f32, host: &Offering) -> bool {
    let t = host.instance_type.as_str();
    let n = count as u32;
    if (count - n as f32).abs() > f32::EPSILON {
        return false;
    }
    match gpu {
        "A100" if n == 16 => t == "a2-megagpu-16g",
        "A100" => t == format!("a2-highgpu-{n}g"),
        "A100-80GB" => t == format!("a2-ultragpu-{n}g"),
        "H100" => t == format!("a3-highgpu-{n}g"),
        "H100-MEGA" => t == format!("a3-megagpu-{n}g"),
        "H200" => t == format!("a3-ultragpu-{n}g"),
        "B200" => t == format!("a4-highgpu-{n}g"),
        "L4" => {
            let per = match n {
                1 => &[
                    "g2-standard-4",
                    "g2-standard-8",
                    "g2-standard-12",
                    "g2-standard-16",
                    "g2-standard-32",
                ][..],
                2 => &["g2-standard-24"][..],
                4 => &["g2-standard-48"][..],
                8 => &["g2-standard-96"][..],
                _ => &[][..],
            };
            per.contains(&t)
        }
        "T4" | "V100" | "P100" | "P4" | "K80" => {
            if !(t.starts_with("n1-standard-") || t.starts_with("n1-highmem-")) {
                return false;
            }
            // Most vCPUs an N1 host may have with this many GPUs attached.
            let max_vcpus = match (gpu, n) {
                ("T4", 1 | 2) => 48,
                ("T4", 4) => 96,
                ("V100", 1) => 12,
                ("V100", 2) => 24,
                ("V100", 4) => 48,
                ("V100", 8) => 96,
                ("P100", 1) => 16,
                ("P100", 2) => 32,
                ("P100", 4) => 64,
                ("P4", 1) => 24,
                ("P4", 2) => 48,
                ("P4", 4) => 96,
                ("K80", 1) => 8,
                ("K80", 2) => 16,
                ("K80", 4) => 32,
                ("K80", 8) => 64,
                // No such host: with 0 here, hosts that gave no vCPUs took
                // any count.
                _ => return false,
            };
            host.vcpus as u32 <= max_vcpus
        }
        _ => false,
    }
}

fn attach_gpus(
    hosts: &[Offering],
    gpus: Vec<(Offering, usize)>,
    shown: &str,
    warnings: &mut Vec<String>,
) -> Vec<Offering> {
    // Each host type once per zone, and each GPU row once per (GPU, count,
    // zone): the join pairs them, so repeated rows multiplied each other
    // (1 MB of repeated T4 and N1 rows made 300 million offerings).
    let mut by_zone: HashMap<&str, Vec<&Offering>> = HashMap::new();
    let mut host_seen: HashSet<(&str, &str)> = HashSet::new();
    for h in hosts.iter().filter(|h| h.accelerator.is_none()) {
        if host_seen.insert((h.zone.as_str(), h.instance_type.as_str())) {
            by_zone.entry(h.zone.as_str()).or_default().push(h);
        }
    }
    let mut gpu_seen: HashSet<(super::Name, u32, super::Name)> = HashSet::new();
    let mut out = Vec::new();
    for (g, line) in gpus {
        let Some(name) = g.accelerator.as_deref() else {
            warnings.push(format!(
                "{shown}:{line}: a row with no InstanceType must name an accelerator"
            ));
            continue;
        };
        let key = (
            g.accelerator.clone().unwrap_or_default(),
            g.accelerator_count.to_bits(),
            g.zone.clone(),
        );
        if !gpu_seen.insert(key) {
            warnings.push(format!(
                "{shown}:{line}: {name}:{} in {} is listed again; the first row is used",
                g.accelerator_count, g.zone
            ));
            continue;
        }
        let mut matched = false;
        for h in by_zone.get(g.zone.as_str()).into_iter().flatten() {
            if !hosts_for(name, g.accelerator_count, h) {
                continue;
            }
            matched = true;
            let sum = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a + b);
            out.push(Offering {
                accelerator: g.accelerator.clone(),
                accelerator_count: g.accelerator_count,
                accelerator_memory_gib: g.accelerator_memory_gib,
                price: sum(h.price, g.price),
                spot_price: sum(h.spot_price, g.spot_price),
                placement: true,
                ..(*h).clone()
            });
        }
        if !matched {
            tracing::debug!(
                "{shown}:{line}: no host type for {name}:{} in {}",
                g.accelerator_count,
                g.zone
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const AWS: &str = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone,Arch
p4d.24xlarge,A100,8.0,96.0,1152.0,\"{'Gpus': [{'Name': 'A100', 'MemoryInfo': {'SizeInMiB': 40960}}]}\",21.96,8.5,us-east-1,use1-az2,x86_64
g5.xlarge,A10G,1.0,4.0,16.0,,1.006,,us-east-1,use1-az1,x86_64
g5.2xlarge,A10G,one,8.0,32.0,,1.212,0.5,us-east-1,use1-az1,x86_64
m6i.large,,,2.0,8.0,,0.096,0.04,us-east-1,use1-az1,x86_64
";

    const GCP: &str = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice
a2-highgpu-1g,12.0,85.0,,,,us-central1,us-central1-a,0.7,0.35
n1-standard-8,8.0,30.0,,,,us-central1,us-central1-a,0.38,0.08
n1-standard-96,96.0,360.0,,,,us-central1,us-central1-a,4.5,1.0
,,,A100,1,{'Gpus': [{'MemoryInfo': {'SizeInMiB': 40960}}]},us-central1,us-central1-a,2.9,1.4
,,,V100,1,,us-central1,us-central1-a,2.48,0.74
,,,tpu-v2-8,1,,us-central1,us-central1-a,4.5,1.35
,,,T4,1,,us-central1,us-central1-b,0.35,0.11
";

    #[test]
    fn aws_rows_load_and_bad_rows_are_named() {
        let (rows, warnings) = load_skypilot_csv("aws", AWS, "aws/vms.csv").unwrap();
        assert_eq!(rows.len(), 3);
        let p4d = &rows[0];
        assert_eq!(p4d.accelerator.as_deref(), Some("A100"));
        assert_eq!(p4d.accelerator_count, 8.0);
        assert_eq!(p4d.accelerator_memory_gib, Some(40.0));
        assert_eq!(p4d.zone, "use1-az2");
        assert!(p4d.efa && p4d.placement);
        assert_eq!(rows[1].spot_price, None);
        assert_eq!(
            warnings,
            vec!["aws/vms.csv:4: AcceleratorCount: 'one' is not a number (0 to 1,000,000)"]
        );
    }

    /// A price that overflows when summed or kept as f32 is refused like
    /// NaN, naming the row and field.
    #[test]
    fn a_price_too_large_to_add_up_is_refused_like_nan() {
        let csv = GCP.replace(
            "n1-standard-8,8.0,30.0,,,,us-central1,us-central1-a,0.38,0.08",
            "n1-standard-8,8.0,30.0,,,,us-central1,us-central1-a,1e300,0.08",
        );
        let (_, warnings) = load_skypilot_csv("gcp", &csv, "gcp/vms.csv").unwrap();
        assert_eq!(
            warnings,
            vec!["gcp/vms.csv:3: Price: '1e300' is not a number (0 to 1,000,000)"]
        );
    }

    #[test]
    fn gcp_gpus_join_their_hosts_and_cost_both() {
        let (rows, warnings) = load_skypilot_csv("gcp", GCP, "gcp/vms.csv").unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let a100: Vec<_> = rows
            .iter()
            .filter(|o| o.accelerator.as_deref() == Some("A100"))
            .collect();
        assert_eq!(a100.len(), 1);
        assert_eq!(a100[0].instance_type, "a2-highgpu-1g");
        assert!((a100[0].price.unwrap() - 3.6).abs() < 1e-9);
        assert!((a100[0].spot_price.unwrap() - 1.75).abs() < 1e-9);
        // V100:1 fits n1-standard-8 (<= 12 vCPUs) but not n1-standard-96.
        let v100: Vec<_> = rows
            .iter()
            .filter(|o| o.accelerator.as_deref() == Some("V100"))
            .map(|o| o.instance_type.as_str())
            .collect();
        assert_eq!(v100, vec!["n1-standard-8"]);
        // T4 in a zone without hosts, and TPUs, produce nothing.
        assert!(rows.iter().all(|o| o.accelerator.as_deref() != Some("T4")));
        assert!(rows.iter().all(|o| !o.instance_type.is_empty()));
    }

    /// Found with a hand-made input while fuzzing the catalog loader: GPU
    /// rows are joined to every host they fit in their zone, so repeated
    /// rows multiplied (1 MB of them ran out of memory).
    #[test]
    fn repeated_rows_do_not_multiply_in_the_join() {
        let n = 1000;
        let mut csv = String::from(
            "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice\n",
        );
        for i in 0..n {
            csv.push_str(&format!("n1-standard-{i},4,15,,,,r,z,0.1,0.1\n"));
            csv.push_str(",,,T4,1,,r,z,0.3,0.1\n");
        }
        // Twice the same host type, and a count no N1 host takes with a
        // host that gave no vCPUs.
        csv.push_str("n1-standard-0,4,15,,,,r,z,0.2,0.2\n,,,T4,3,,r,z,0.9,0.3\nn1-standard-x,,,,,,r,z,0.1,\n");
        let (rows, warnings) = load_skypilot_csv("gcp", &csv, "gcp/vms.csv").unwrap();
        let t4: Vec<_> = rows
            .iter()
            .filter(|o| o.accelerator.as_deref() == Some("T4"))
            .collect();
        assert_eq!(t4.len(), n + 1, "one T4:1 offering per N1 host type");
        assert!(t4.iter().all(|o| o.accelerator_count == 1.0));
        assert_eq!(
            t4[0].price,
            Some(0.4),
            "the first n1-standard-0 row is used"
        );
        assert_eq!(warnings.len(), n - 1, "{:?}", warnings.first());
        assert_eq!(
            warnings[0],
            "gcp/vms.csv:5: T4:1 in z is listed again; the first row is used"
        );
    }

    #[test]
    fn missing_columns_are_a_layout_error() {
        let e = load_skypilot_csv("x", "Foo,Bar\n1,2\n", "x/vms.csv").unwrap_err();
        assert!(
            e.to_string().contains("missing column 'InstanceType'"),
            "{e}"
        );
    }
}
