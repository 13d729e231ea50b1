//! GPU discovery on a node: parsing what `nvidia-smi` prints, and the order
//! of the node's GPUs that keeps the best-linked ones next to each other.
//!
//! Pure parsing, no IO: the caller runs `nvidia-smi` on the node (and
//! decides what a missing `nvidia-smi` means: a CPU-only node) and hands the
//! text here.
//!
//! ```text
//! nvidia-smi --query-gpu=index,name,memory.total,uuid,pci.bus_id --format=csv,noheader,nounits
//!     -> parse_query -> [Gpu]
//! nvidia-smi topo -m
//!     -> parse_topo  -> Topo
//! ordered(&gpus, Some(&topo)) -> CUDA_VISIBLE_DEVICES order
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

/// One GPU as `nvidia-smi --query-gpu` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Gpu {
    /// nvidia-smi's index (the default CUDA device order is the same unless
    /// `CUDA_DEVICE_ORDER` says otherwise).
    pub(crate) index: u32,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub(crate) name: String,
    /// Total memory in MiB.
    pub(crate) memory_mib: u64,
    /// `GPU-...` UUID, stable across reboots.
    pub(crate) uuid: String,
    /// PCI bus id, `domain:bus:device.function` in hex.
    pub(crate) pci_bus_id: String,
}

/// The kind of path between two GPUs in `nvidia-smi topo -m`, from best to
/// worst: NVLink, then PCIe paths that stay ever further from the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[expect(clippy::enum_variant_names, reason = "NvLink is NVIDIA's name for it")]
pub(crate) enum Link {
    /// `X`: the GPU itself (the matrix diagonal).
    Itself,
    /// `NV#`: a bonded set of this many NVLinks (directly or through NVSwitch).
    NvLink(u32),
    /// `PIX`: at most a single PCIe bridge.
    Pix,
    /// `PXB`: several PCIe bridges, not through the host bridge.
    Pxb,
    /// `PHB`: through a PCIe host bridge (typically the CPU).
    Phb,
    /// `NODE`: between PCIe host bridges within one NUMA node.
    Node,
    /// `SYS` (older drivers: `SOC`): across the interconnect between NUMA nodes.
    Sys,
}

impl Link {
    /// Parses one cell of the matrix (`X`, `NV12`, `PIX`, ...).
    pub(crate) fn parse(cell: &str) -> Option<Link> {
        Some(match cell {
            "X" => Link::Itself,
            "PIX" => Link::Pix,
            "PXB" => Link::Pxb,
            "PHB" => Link::Phb,
            "NODE" => Link::Node,
            "SYS" | "SOC" => Link::Sys,
            _ => {
                let n = cell.strip_prefix("NV")?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                Link::NvLink(n.parse().ok()?)
            }
        })
    }

    /// How good the link is for traffic between two GPUs: higher is better.
    /// More bonded NVLinks beat fewer; every NVLink beats every PCIe path.
    pub(crate) fn score(self) -> u32 {
        match self {
            Link::Itself => u32::MAX,
            Link::NvLink(n) => 100 + n,
            Link::Pix => 5,
            Link::Pxb => 4,
            Link::Phb => 3,
            Link::Node => 2,
            Link::Sys => 1,
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::Itself => f.write_str("X"),
            Link::NvLink(n) => write!(f, "NV{n}"),
            Link::Pix => f.write_str("PIX"),
            Link::Pxb => f.write_str("PXB"),
            Link::Phb => f.write_str("PHB"),
            Link::Node => f.write_str("NODE"),
            Link::Sys => f.write_str("SYS"),
        }
    }
}

/// The GPU-to-GPU part of `nvidia-smi topo -m`: `links[a][b]` is the path
/// from GPU `a` to GPU `b` (by nvidia-smi index). NIC rows and columns, CPU
/// and NUMA affinity and the legend are not kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Topo {
    links: Vec<Vec<Link>>,
}

impl Topo {
    /// Number of GPUs in the matrix.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.links.len()
    }

    /// The link from GPU `a` to GPU `b`, if both are in the matrix.
    pub(crate) fn link(&self, a: u32, b: u32) -> Option<Link> {
        self.links.get(a as usize)?.get(b as usize).copied()
    }

    /// The rows of the matrix, GPU 0 first.
    #[cfg(test)]
    pub(crate) fn rows(&self) -> &[Vec<Link>] {
        &self.links
    }
}

/// What a node is asked to learn its GPUs: the csv query, a separator
/// line, then the topology matrix (both empty on a machine without
/// `nvidia-smi`, which is then a CPU node).
pub(crate) const DISCOVER_SCRIPT: &str = "nvidia-smi --query-gpu=index,name,memory.total,uuid,pci.bus_id \
     --format=csv,noheader,nounits 2>/dev/null; echo '---gangway-topo---'; nvidia-smi topo -m 2>/dev/null; true";

/// From [`DISCOVER_SCRIPT`]'s output: the GPU count and the order to give
/// `CUDA_VISIBLE_DEVICES` (NVLink neighbours adjacent). Unparseable output
/// counts as no GPUs.
pub(crate) fn discovered(output: &str) -> (usize, Vec<u32>) {
    let (query, topo) = output
        .split_once("---gangway-topo---")
        .unwrap_or((output, ""));
    let gpus = parse_query(query.trim()).unwrap_or_default();
    if gpus.is_empty() {
        return (0, Vec::new());
    }
    let topo = parse_topo(topo.trim()).ok();
    (gpus.len(), ordered(&gpus, topo.as_ref()))
}

/// Parses `nvidia-smi --query-gpu=index,name,memory.total,uuid,pci.bus_id
/// --format=csv,noheader,nounits`: one GPU a line.
///
/// Empty text (or only blank lines) gives an empty list: that is what a
/// node whose driver sees no GPU prints. A node without `nvidia-smi` at all
/// (CPU-only) is the caller's concern: it never gets here.
///
/// Tolerated beyond the exact format: a header line (the query run without
/// `noheader`), a ` MiB` unit after the memory (run without `nounits`), and
/// commas inside the name. Anything else (an error message on stdout, a
/// `[N/A]` or `[Unknown Error]` field, a repeated index) is an error naming
/// the line.
pub(crate) fn parse_query(text: &str) -> Result<Vec<Gpu>, String> {
    let mut gpus: Vec<Gpu> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || (n == 0 && is_query_header(line)) {
            continue;
        }
        let bad = |why: &str| format!("nvidia-smi --query-gpu line {}: {why}: {raw:?}", n + 1);
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() < 5 {
            return Err(bad(&format!(
                "expected 5 fields (index, name, memory.total, uuid, pci.bus_id), found {}",
                fields.len()
            )));
        }
        let [index, .., memory, uuid, bus] = fields[..] else {
            unreachable!("at least 5 fields");
        };
        let name = fields[1..fields.len() - 3].join(",");
        let index: u32 = index
            .parse()
            .map_err(|_| bad(&format!("index {index:?} is not a number")))?;
        let memory_mib: u64 = memory
            .strip_suffix("MiB")
            .unwrap_or(memory)
            .trim()
            .parse()
            .map_err(|_| bad(&format!("memory.total {memory:?} is not a number of MiB")))?;
        if name.trim().is_empty() {
            return Err(bad("empty name"));
        }
        if !(uuid.starts_with("GPU-") && uuid.len() > 4) || uuid.contains(char::is_whitespace) {
            return Err(bad(&format!("uuid {uuid:?} is not a GPU-... uuid")));
        }
        if !bus.contains(':') || bus.contains(char::is_whitespace) {
            return Err(bad(&format!("pci.bus_id {bus:?} is not a PCI bus id")));
        }
        if gpus.iter().any(|g| g.index == index) {
            return Err(bad(&format!("index {index} appears twice")));
        }
        gpus.push(Gpu {
            index,
            name: name.trim().to_string(),
            memory_mib,
            uuid: uuid.to_string(),
            pci_bus_id: bus.to_string(),
        });
    }
    Ok(gpus)
}

/// Whether `line` is the csv header of our query (with or without units).
fn is_query_header(line: &str) -> bool {
    let squeezed: String = line
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    squeezed == "index,name,memory.total[mib],uuid,pci.bus_id"
        || squeezed == "index,name,memory.total,uuid,pci.bus_id"
}

/// Parses the GPU-to-GPU matrix of `nvidia-smi topo -m` (NV#, PIX, PXB,
/// PHB, NODE, SYS, X) into a matrix of link kinds.
///
/// Accepts both layouts nvidia-smi prints (tab-separated with ` X ` cells,
/// or space-aligned), lines before the header (a prompt, a `GPU Topology:`
/// title), NIC rows and columns, affinity columns and the legend, all of
/// which are skipped. The header must list `GPU0 GPU1 ...` in order, and a
/// row must follow for each of them, in order, with `X` exactly on the
/// diagonal; anything else is an error naming the line.
///
/// Terminal escape sequences are dropped first: nvidia-smi underlines the
/// header with `ESC[4m` ... `ESC[0m` even when its output is a pipe (seen
/// with driver 580 on an H200, `tests/fixtures/nvidia-smi/topo-1xH200-recorded.txt`),
/// which left the header unrecognised and every real node in index order.
pub(crate) fn parse_topo(text: &str) -> Result<Topo, TopoError> {
    let text = without_escapes(text);
    let mut lines = text.lines().enumerate();
    let n = loop {
        let Some((_, line)) = lines.next() else {
            return Err(TopoError::NoHeader);
        };
        let gpu_columns = line
            .split_whitespace()
            .take_while(|w| gpu_number(w).is_some())
            .count();
        if gpu_columns == 0 {
            continue;
        }
        for (i, w) in line.split_whitespace().take(gpu_columns).enumerate() {
            if gpu_number(w) != Some(i) {
                return Err(TopoError::Header {
                    column: i + 1,
                    word: w.to_string(),
                    line: line.to_string(),
                });
            }
        }
        break gpu_columns;
    };
    let mut links = Vec::with_capacity(n);
    for row in 0..n {
        let Some((ln, line)) = lines.next() else {
            return Err(TopoError::MissingRow { row });
        };
        let bad = |why: String| TopoError::Line {
            number: ln + 1,
            why,
            line: line.to_string(),
        };
        let mut words = line.split_whitespace();
        let label = words.next().unwrap_or("");
        if gpu_number(label) != Some(row) {
            return Err(bad(format!("expected the row for GPU{row}")));
        }
        let mut cells = Vec::with_capacity(n);
        for col in 0..n {
            let Some(word) = words.next() else {
                return Err(bad(format!("{n} link columns expected, found {col}")));
            };
            let link = Link::parse(word).ok_or_else(|| {
                bad(format!(
                    "{word:?} (GPU{row} to GPU{col}) is not a link kind (X, NV#, PIX, PXB, PHB, NODE, SYS)"
                ))
            })?;
            if (link == Link::Itself) != (row == col) {
                return Err(bad(format!(
                    "GPU{row} to GPU{col} is {word}: X belongs on the diagonal only"
                )));
            }
            cells.push(link);
        }
        links.push(cells);
    }
    Ok(Topo { links })
}

/// Why an `nvidia-smi topo -m` matrix was not understood.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(crate) enum TopoError {
    /// No line names `GPU0`.
    #[error("nvidia-smi topo -m: no header line naming GPU0 found")]
    NoHeader,
    /// The header's GPU columns are not `GPU0 GPU1 ...` in order.
    #[error("nvidia-smi topo -m header: column {column} is {word:?}, expected GPU{}: {line:?}", column - 1)]
    Header {
        /// 1-based column.
        column: usize,
        /// What it says.
        word: String,
        /// The header line.
        line: String,
    },
    /// The text ends before a GPU's row.
    #[error("nvidia-smi topo -m: the text ends before the row for GPU{row}")]
    MissingRow {
        /// The GPU.
        row: usize,
    },
    /// A row is not what it should be.
    #[error("nvidia-smi topo -m line {number}: {why}: {line:?}")]
    Line {
        /// 1-based line number.
        number: usize,
        /// What is wrong.
        why: String,
        /// The line.
        line: String,
    },
}

/// `text` without ANSI CSI sequences (`ESC [` parameters, then a final
/// letter), the only escapes nvidia-smi prints; other text as it is.
fn without_escapes(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\x1b') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, up to the final byte (@ to ~).
            for p in chars.by_ref() {
                if ('@'..='~').contains(&p) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `GPU12` -> `Some(12)`.
fn gpu_number(word: &str) -> Option<usize> {
    let digits = word.strip_prefix("GPU")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// An order of the GPUs in which neighbours share the best links (NVLink >
/// PIX > PXB > PHB > NODE > SYS), starting at GPU 0, for
/// `CUDA_VISIBLE_DEVICES`.
///
/// Greedy: from the current GPU go to the unvisited GPU with the best link,
/// the lowest index on a tie. So a GPU's NVLink partner always comes right
/// after it (when the partner is still unvisited), and a box where every pair
/// has the same link (NVSwitch, or all `SYS`) keeps index order. Without a
/// matrix, or for GPUs the matrix does not cover, index order.
pub(crate) fn ordered(gpus: &[Gpu], topo: Option<&Topo>) -> Vec<u32> {
    let mut left: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    left.sort_unstable();
    left.dedup();
    let score = |a: u32, b: u32| {
        topo.and_then(|t| t.link(a, b))
            .map_or(0, |l| if a == b { 0 } else { l.score() })
    };
    let mut order = Vec::with_capacity(left.len());
    if left.is_empty() {
        return order;
    }
    let mut at = left.remove(0);
    order.push(at);
    while !left.is_empty() {
        let best = (0..left.len())
            .max_by_key(|&i| (score(at, left[i]), std::cmp::Reverse(left[i])))
            .expect("not empty");
        at = left.remove(best);
        order.push(at);
    }
    order
}

/// The accelerator name gangway (and SkyPilot's catalogs) use for an
/// nvidia-smi product name: "NVIDIA A100-SXM4-80GB" -> "A100-80GB",
/// "NVIDIA H100 80GB HBM3" -> "H100", "Tesla V100-SXM2-16GB" -> "V100",
/// "NVIDIA L4" -> "L4", "Tesla T4" -> "T4", "NVIDIA A10G" -> "A10G",
/// "NVIDIA L40S" -> "L40S", "NVIDIA H200" -> "H200".
///
/// Rules: drop the brand words (NVIDIA, Tesla, GeForce, Quadro); A100 and
/// V100 keep a memory suffix only for the larger model (`A100-80GB`,
/// `V100-32GB`), as the catalogs do; `RTX A6000` is `A6000` and
/// `RTX 4090` is `RTX4090`; anything else is its first word up to a `-`
/// (`P100-PCIE-16GB` -> `P100`, `H100 NVL` -> `H100`).
#[cfg(test)]
pub(crate) fn accelerator_name(nvidia_name: &str) -> String {
    const BRANDS: [&str; 4] = ["NVIDIA", "Tesla", "GeForce", "Quadro"];
    let words: Vec<&str> = nvidia_name
        .split_whitespace()
        .skip_while(|w| BRANDS.iter().any(|b| w.eq_ignore_ascii_case(b)))
        .collect();
    let Some(&first) = words.first() else {
        return String::new();
    };
    let model = first.split('-').next().unwrap_or(first);
    let rest = words.join(" ").to_ascii_uppercase();
    match model.to_ascii_uppercase().as_str() {
        "A100" if rest.contains("80GB") => "A100-80GB".to_string(),
        "V100" if rest.contains("32GB") => "V100-32GB".to_string(),
        "RTX" => match words.get(1) {
            Some(next) if next.starts_with('A') => next.to_string(),
            Some(next) => {
                let ada = if rest.contains("ADA") { "Ada" } else { "" };
                format!("RTX{next}{ada}")
            }
            None => "RTX".to_string(),
        },
        _ => model.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($name:literal) => {
            (
                $name,
                include_str!(concat!("../../../tests/fixtures/nvidia-smi/", $name)),
            )
        };
    }

    const QUERIES: [(&str, &str); 4] = [
        fixture!("query-8xH100-SXM.csv"),
        fixture!("query-2xA100-PCIE-40GB.csv"),
        fixture!("query-1xL4.csv"),
        fixture!("query-1xH200-recorded.csv"),
    ];

    const TOPOS: [(&str, &str); 12] = [
        fixture!("topo-aws-p4d-8xA100-NV12.txt"),
        fixture!("topo-aws-g6e-4xL40S-NODE.txt"),
        fixture!("topo-8xH100-NV18.txt"),
        fixture!("topo-4xH100-NV6-nics.txt"),
        fixture!("topo-4xRTX3090-NV4-pairs.txt"),
        fixture!("topo-8xA6000-NV4-pairs.txt"),
        fixture!("topo-4xA100-NV12-pair-mlx5.txt"),
        fixture!("topo-8xPCIe-PIX-PXB-SYS-mlx5.txt"),
        fixture!("topo-8xRTX4090-SYS-nics.txt"),
        fixture!("topo-2xRTX5090-PHB.txt"),
        fixture!("topo-1xTeslaP4.txt"),
        fixture!("topo-1xH200-recorded.txt"),
    ];

    fn topo(name: &str) -> Topo {
        let (_, text) = TOPOS.iter().find(|(n, _)| *n == name).expect("fixture");
        parse_topo(text).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// `n` GPUs with indexes 0..n (only the index matters to `ordered`).
    fn gpus(n: u32) -> Vec<Gpu> {
        (0..n)
            .map(|index| Gpu {
                index,
                name: "NVIDIA L4".into(),
                memory_mib: 23034,
                uuid: format!("GPU-{index}"),
                pci_bus_id: format!("00000000:{index:02X}:00.0"),
            })
            .collect()
    }

    #[test]
    fn every_fixture_parses() {
        for (name, text) in QUERIES {
            let gpus = parse_query(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!gpus.is_empty(), "{name}");
        }
        for (name, text) in TOPOS {
            let t = parse_topo(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(t.len() > 0, "{name}");
        }
    }

    #[test]
    fn query_counts_names_memory_and_ids() {
        let h100 = parse_query(QUERIES[0].1).unwrap();
        assert_eq!(h100.len(), 8);
        assert_eq!(
            h100.iter().map(|g| g.index).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        assert!(h100.iter().all(|g| g.name == "NVIDIA H100 80GB HBM3"));
        assert!(h100.iter().all(|g| g.memory_mib == 81559));
        assert_eq!(h100[0].uuid, "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1");
        assert_eq!(h100[7].pci_bus_id, "00000000:DB:00.0");
        let uuids: std::collections::HashSet<_> = h100.iter().map(|g| &g.uuid).collect();
        assert_eq!(uuids.len(), 8);

        let a100 = parse_query(QUERIES[1].1).unwrap();
        assert_eq!(a100.len(), 2);
        assert_eq!(
            a100[1],
            Gpu {
                index: 1,
                name: "NVIDIA A100-PCIE-40GB".into(),
                memory_mib: 40960,
                uuid: "GPU-14ac2834-0d81-0508-69eb-e25264c08d21".into(),
                pci_bus_id: "00000000:8A:00.0".into(),
            }
        );

        let l4 = parse_query(QUERIES[2].1).unwrap();
        assert_eq!(l4.len(), 1);
        assert_eq!(
            (l4[0].name.as_str(), l4[0].memory_mib),
            ("NVIDIA L4", 23034)
        );

        let names: Vec<String> = [&h100[0], &a100[0], &l4[0]]
            .iter()
            .map(|g| accelerator_name(&g.name))
            .collect();
        assert_eq!(names, ["H100", "A100", "L4"]);
    }

    /// Recorded on a real node (an H200, driver 580.159.04), not taken
    /// from a post: what the driver's discovery really reads.
    #[test]
    fn a_recorded_h200_node_is_discovered_whole() {
        let text = include_str!("../../../tests/fixtures/nvidia-smi/discover-1xH200-recorded.txt");
        assert!(
            text.contains('\x1b'),
            "the recording keeps nvidia-smi's escapes"
        );
        assert_eq!(discovered(text), (1, vec![0]));
        let (_, topo_text) = text.split_once("---gangway-topo---").unwrap();
        let t = parse_topo(topo_text.trim()).expect("the recorded matrix parses");
        assert_eq!(t.rows(), &[vec![Link::Itself]]);
        let gpus = parse_query(QUERIES[3].1).unwrap();
        assert_eq!(
            (gpus.len(), gpus[0].name.as_str(), gpus[0].memory_mib),
            (1, "NVIDIA H200", 143771)
        );
        assert_eq!(accelerator_name(&gpus[0].name), "H200");
    }

    /// The header underlined as the recorded H200 output has it, on a
    /// matrix with NVLink pairs 0-2 and 1-3: each pair still comes out
    /// adjacent (index order would be the silent fallback).
    #[test]
    fn an_underlined_header_keeps_the_matrix() {
        let name = "topo-4xRTX3090-NV4-pairs.txt";
        let plain = TOPOS.iter().find(|(n, _)| *n == name).unwrap().1;
        let (header, rest) = plain.trim_start().split_once('\n').unwrap();
        let underlined = format!("\t\x1b[4m{}\x1b[0m\n{rest}", header.trim());
        let got = parse_topo(&underlined).expect("an underlined header parses");
        assert_eq!(got, topo(name));
        assert_eq!(ordered(&gpus(4), Some(&got)), [0, 2, 3, 1]);
        let output = format!(
            "{}\n---gangway-topo---\n{underlined}",
            QUERIES[0].1.lines().take(4).collect::<Vec<_>>().join("\n")
        );
        assert_eq!(discovered(&output), (4, vec![0, 2, 3, 1]));
    }

    #[test]
    fn empty_query_output_is_no_gpus() {
        assert_eq!(parse_query(""), Ok(vec![]));
        assert_eq!(parse_query("\n  \n"), Ok(vec![]));
    }

    #[test]
    fn query_tolerates_a_header_units_and_crlf() {
        let text = "index, name, memory.total [MiB], uuid, pci.bus_id\r\n\
                    0, NVIDIA L4, 23034 MiB, GPU-453f8851-d1a3-e72d-4d85-3ef04418205b, 00000000:01:00.0\r\n";
        let gpus = parse_query(text).unwrap();
        assert_eq!(gpus, parse_query(QUERIES[2].1).unwrap());
    }

    #[test]
    fn malformed_query_output_names_the_line() {
        let good =
            "0, NVIDIA L4, 23034, GPU-453f8851-d1a3-e72d-4d85-3ef04418205b, 00000000:01:00.0\n";
        for (bad, why) in [
            (
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                "expected 5 fields",
            ),
            (
                "x, NVIDIA L4, 23034, GPU-1, 00000000:01:00.0",
                "index \"x\"",
            ),
            (
                "1, NVIDIA L4, [N/A], GPU-1, 00000000:01:00.0",
                "memory.total \"[N/A]\"",
            ),
            (
                "1, NVIDIA L4, 23034, [Unknown Error], 00000000:01:00.0",
                "uuid",
            ),
            ("1, NVIDIA L4, 23034, GPU-1, nowhere", "pci.bus_id"),
            ("1, , 23034, GPU-1, 00000000:01:00.0", "empty name"),
            (
                "0, NVIDIA L4, 23034, GPU-2, 00000000:02:00.0",
                "appears twice",
            ),
        ] {
            let err = parse_query(&format!("{good}{bad}\n")).unwrap_err();
            assert!(err.contains("line 2"), "{err}");
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    #[test]
    fn topo_matrices_are_square_symmetric_with_x_on_the_diagonal() {
        let sizes = [8, 4, 8, 4, 4, 8, 4, 8, 8, 2, 1];
        for ((name, _), n) in TOPOS.iter().zip(sizes) {
            let t = topo(name);
            assert_eq!(t.len(), n, "{name}");
            for a in 0..n as u32 {
                assert_eq!(t.rows()[a as usize].len(), n, "{name}");
                for b in 0..n as u32 {
                    assert_eq!(t.link(a, b), t.link(b, a), "{name}: GPU{a}-GPU{b}");
                    assert_eq!(t.link(a, b) == Some(Link::Itself), a == b, "{name}");
                }
            }
            assert_eq!(t.link(n as u32, 0), None);
        }
    }

    #[test]
    fn topo_link_kinds_are_read_right() {
        let p4d = topo("topo-aws-p4d-8xA100-NV12.txt");
        assert_eq!(p4d.link(0, 7), Some(Link::NvLink(12)));
        assert_eq!(
            topo("topo-8xH100-NV18.txt").link(3, 4),
            Some(Link::NvLink(18))
        );
        let pcie = topo("topo-8xPCIe-PIX-PXB-SYS-mlx5.txt");
        assert_eq!(pcie.link(0, 1), Some(Link::Pix));
        assert_eq!(pcie.link(0, 2), Some(Link::Pxb));
        assert_eq!(pcie.link(3, 4), Some(Link::Sys));
        let rtx = topo("topo-4xRTX3090-NV4-pairs.txt");
        assert_eq!(rtx.link(0, 1), Some(Link::Phb));
        assert_eq!(rtx.link(0, 2), Some(Link::NvLink(4)));
        assert_eq!(rtx.link(0, 3), Some(Link::Node));
        let nics = topo("topo-4xH100-NV6-nics.txt");
        assert_eq!(
            nics.rows()[0],
            [
                Link::Itself,
                Link::NvLink(6),
                Link::NvLink(6),
                Link::NvLink(6)
            ]
        );
        assert_eq!(topo("topo-1xTeslaP4.txt").rows(), [vec![Link::Itself]]);
        for l in [
            Link::Itself,
            Link::NvLink(18),
            Link::Pix,
            Link::Pxb,
            Link::Phb,
            Link::Node,
            Link::Sys,
        ] {
            assert_eq!(Link::parse(&l.to_string()), Some(l));
        }
        assert_eq!(Link::parse("SOC"), Some(Link::Sys));
        assert_eq!(Link::parse("NV"), None);
        assert_eq!(Link::parse("NVX"), None);
    }

    #[test]
    fn malformed_topo_names_the_line() {
        let header = "\tGPU0\tGPU1\tCPU Affinity\n";
        for (text, want) in [
            ("nothing here\n".to_string(), "no header line"),
            ("\tGPU1\tGPU0\n".to_string(), "expected GPU0"),
            (
                format!("{header}GPU0\t X \tPHB\t0-7\n"),
                "before the row for GPU1",
            ),
            (
                format!("{header}GPU0\t X \tPHB\t0-7\nGPU2\tPHB\t X \t0-7\n"),
                "line 3: expected the row for GPU1",
            ),
            (
                format!("{header}GPU0\t X \n"),
                "line 2: 2 link columns expected, found 1",
            ),
            (
                format!("{header}GPU0\t X \tQPI\t0-7\n"),
                "line 2: \"QPI\" (GPU0 to GPU1) is not a link kind",
            ),
            (
                format!("{header}GPU0\tPHB\tPHB\t0-7\n"),
                "line 2: GPU0 to GPU0 is PHB",
            ),
            (
                format!("{header}GPU0\t X \t X \t0-7\n"),
                "line 2: GPU0 to GPU1 is X",
            ),
        ] {
            let err = parse_topo(&text).unwrap_err().to_string();
            assert!(err.contains(want), "want {want:?} in {err:?}");
        }
    }

    #[test]
    fn ordered_keeps_nvlink_pairs_adjacent_on_a_pcie_box() {
        // Pairs 0-2 and 1-3 are bridged; 0-1 and 2-3 are PHB, the rest NODE.
        let t = topo("topo-4xRTX3090-NV4-pairs.txt");
        let order = ordered(&gpus(4), Some(&t));
        assert_eq!(order, [0, 2, 3, 1]);
        assert_pairs_adjacent(&order, &t);

        let t = topo("topo-8xA6000-NV4-pairs.txt");
        let order = ordered(&gpus(8), Some(&t));
        assert_eq!(order, (0..8).collect::<Vec<_>>());
        assert_pairs_adjacent(&order, &t);

        // PIX pairs stay together, then PXB within a socket before SYS.
        let t = topo("topo-8xPCIe-PIX-PXB-SYS-mlx5.txt");
        assert_eq!(ordered(&gpus(8), Some(&t)), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn ordered_nvlink_pairs_stay_adjacent_whatever_the_numbering() {
        // The 3090 box with its GPUs renumbered every way: each NVLink pair
        // must still sit side by side, starting at GPU 0.
        let base = topo("topo-4xRTX3090-NV4-pairs.txt");
        for perm in permutations(4) {
            let links = (0..4)
                .map(|a| (0..4).map(|b| base.rows()[perm[a]][perm[b]]).collect())
                .collect();
            let t = Topo { links };
            let order = ordered(&gpus(4), Some(&t));
            assert_eq!(order[0], 0);
            assert_pairs_adjacent(&order, &t);
        }
    }

    #[test]
    fn ordered_is_index_order_on_uniform_boxes_and_without_a_matrix() {
        for name in [
            "topo-aws-p4d-8xA100-NV12.txt",
            "topo-8xH100-NV18.txt",
            "topo-8xRTX4090-SYS-nics.txt",
        ] {
            assert_eq!(
                ordered(&gpus(8), Some(&topo(name))),
                (0..8).collect::<Vec<_>>(),
                "{name}"
            );
        }
        assert_eq!(ordered(&gpus(3), None), [0, 1, 2]);
        assert_eq!(ordered(&[], None), Vec::<u32>::new());
        // GPUs the matrix does not know go last, in index order.
        let t = topo("topo-2xRTX5090-PHB.txt");
        assert_eq!(ordered(&gpus(4), Some(&t)), [0, 1, 2, 3]);
    }

    #[test]
    fn accelerator_names_match_the_catalogs() {
        for (nvidia, ours) in [
            ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
            ("NVIDIA A100 80GB PCIe", "A100-80GB"),
            ("NVIDIA A100-SXM4-40GB", "A100"),
            ("NVIDIA A100-PCIE-40GB", "A100"),
            ("NVIDIA H100 80GB HBM3", "H100"),
            ("NVIDIA H100 NVL", "H100"),
            ("NVIDIA H200", "H200"),
            ("Tesla V100-SXM2-16GB", "V100"),
            ("Tesla V100-SXM2-32GB", "V100-32GB"),
            ("Tesla P100-PCIE-16GB", "P100"),
            ("Tesla P4", "P4"),
            ("NVIDIA L4", "L4"),
            ("Tesla T4", "T4"),
            ("NVIDIA A10G", "A10G"),
            ("NVIDIA A10", "A10"),
            ("NVIDIA L40S", "L40S"),
            ("NVIDIA RTX A6000", "A6000"),
            ("NVIDIA GeForce RTX 4090", "RTX4090"),
            ("Quadro RTX 6000", "RTX6000"),
            ("NVIDIA RTX 6000 Ada Generation", "RTX6000Ada"),
            ("", ""),
        ] {
            assert_eq!(accelerator_name(nvidia), ours, "{nvidia}");
        }
    }

    fn assert_pairs_adjacent(order: &[u32], t: &Topo) {
        for a in 0..t.len() as u32 {
            for b in 0..t.len() as u32 {
                if matches!(t.link(a, b), Some(Link::NvLink(_))) {
                    let pa = order.iter().position(|&g| g == a).unwrap();
                    let pb = order.iter().position(|&g| g == b).unwrap();
                    assert_eq!(pa.abs_diff(pb), 1, "GPU{a}-GPU{b} apart in {order:?}");
                }
            }
        }
    }

    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = Vec::new();
        for p in permutations(n - 1) {
            for i in 0..=p.len() {
                let mut q = p.clone();
                q.insert(i, n - 1);
                out.push(q);
            }
        }
        out
    }
}
