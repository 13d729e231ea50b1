//! Readers for what Slurm's commands print: `squeue --json` where the
//! installed Slurm has it, `scontrol -o show ...` (one `Key=Value` line per
//! record) everywhere, host lists (`n[1-3,7]`) and the tree topology.

use std::collections::BTreeMap;

/// One job, as much of it as gangway needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// Job id.
    pub id: u64,
    /// `--job-name`.
    pub name: String,
    /// Numeric uid of its owner.
    pub uid: u32,
    /// `PENDING`, `RUNNING`, `NODE_FAIL` ...
    pub state: String,
    /// Why it is pending (or how it ended): `Resources`, `Priority` ...
    pub reason: String,
    /// How often Slurm requeued it (node failure, preemption).
    pub restarts: u32,
    /// Its nodes, expanded (empty while pending).
    pub nodes: Vec<String>,
    /// Its partition.
    pub partition: String,
    /// `--comment` (gangway's: `gangway-owner=<owner id>`).
    pub comment: String,
}

impl Job {
    /// Whether Slurm still holds it (queued, running, or winding down).
    pub fn alive(&self) -> bool {
        matches!(
            self.state.as_str(),
            "PENDING"
                | "RUNNING"
                | "CONFIGURING"
                | "COMPLETING"
                | "SUSPENDED"
                | "REQUEUED"
                | "REQUEUE_HOLD"
                | "REQUEUE_FED"
                | "RESIZING"
                | "SIGNALING"
                | "STAGE_OUT"
                | "STOPPED"
        )
    }
}

/// `Key=Value` fields of one `scontrol` record (`-o` lines, or the
/// multi-line form: both are whitespace-separated pairs).
pub fn fields(record: &str) -> BTreeMap<&str, &str> {
    record
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

fn null(v: &str) -> &str {
    if v == "(null)" {
        ""
    } else {
        v
    }
}

/// Jobs from `scontrol -o show job` (every job, one per line).
pub fn jobs_from_scontrol(text: &str) -> Vec<Job> {
    text.lines()
        .filter(|l| l.starts_with("JobId="))
        .filter_map(|l| {
            let f = fields(l);
            let uid = f
                .get("UserId")
                .and_then(|u| u.split_once('('))
                .and_then(|(_, n)| n.trim_end_matches(')').parse().ok())
                .unwrap_or(u32::MAX);
            Some(Job {
                id: f.get("JobId")?.parse().ok()?,
                name: f.get("JobName").map(|s| s.to_string()).unwrap_or_default(),
                uid,
                state: f.get("JobState")?.to_string(),
                reason: null(f.get("Reason").copied().unwrap_or("")).to_string(),
                restarts: f.get("Restarts").and_then(|r| r.parse().ok()).unwrap_or(0),
                nodes: expand_hostlist(null(f.get("NodeList").copied().unwrap_or(""))),
                partition: null(f.get("Partition").copied().unwrap_or("")).to_string(),
                comment: null(f.get("Comment").copied().unwrap_or("")).to_string(),
            })
        })
        .collect()
}

/// Jobs from `squeue --json` (Slurm 21.08+; it lists every job whatever
/// the filters, so the caller filters).
pub fn jobs_from_squeue_json(text: &str) -> Result<Vec<Job>, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("squeue --json: {e}"))?;
    let jobs = v
        .get("jobs")
        .and_then(|j| j.as_array())
        .ok_or("squeue --json: no 'jobs' list")?;
    let s = |j: &serde_json::Value, k: &str| {
        j.get(k)
            .and_then(|x| x.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Ok(jobs
        .iter()
        .filter_map(|j| {
            Some(Job {
                id: j.get("job_id")?.as_u64()?,
                name: s(j, "name"),
                uid: j
                    .get("user_id")
                    .and_then(|u| u.as_u64())
                    .map_or(u32::MAX, |u| u as u32),
                state: s(j, "job_state"),
                reason: s(j, "state_reason"),
                restarts: j.get("restart_cnt").and_then(|r| r.as_u64()).unwrap_or(0) as u32,
                nodes: expand_hostlist(&s(j, "nodes")),
                partition: s(j, "partition"),
                comment: s(j, "comment"),
            })
        })
        .collect())
}

/// Node name → address, from `scontrol -o show node`.
pub fn node_addresses(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| l.starts_with("NodeName="))
        .filter_map(|l| {
            let f = fields(l);
            let name = f.get("NodeName")?.to_string();
            let addr = f
                .get("NodeAddr")
                .map(|a| a.to_string())
                .unwrap_or_else(|| name.clone());
            Some((name, addr))
        })
        .collect()
}

/// Expands a Slurm host list: `n[1-3,7],gpu-[01-02]a,login` →
/// `n1 n2 n3 n7 gpu-01a gpu-02a login` (zero padding kept). One bracket
/// group per name, which is what Slurm prints for node lists.
pub fn expand_hostlist(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let bytes = list.as_bytes();
    let mut items = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
        let (Some(open), Some(close)) = (item.find('['), item.find(']')) else {
            out.push(item.to_string());
            continue;
        };
        let (prefix, ranges, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
        for r in ranges.split(',') {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let width = a.len();
            match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) if a <= b => {
                    for n in a..=b {
                        out.push(format!("{prefix}{n:0width$}{suffix}"));
                    }
                }
                _ => out.push(format!("{prefix}{r}{suffix}")),
            }
        }
    }
    out
}

/// The switch tree from `scontrol show topology`.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    /// Leaf switch of each node.
    leaf: BTreeMap<String, String>,
    /// Parent of each switch.
    parent: BTreeMap<String, String>,
}

impl Topology {
    /// Parses `SwitchName=s1 Level=0 ... Nodes=n[1-2]` lines (also
    /// `Switches=` for the upper levels).
    pub fn parse(text: &str) -> Topology {
        let mut t = Topology::default();
        for line in text.lines().filter(|l| l.contains("SwitchName=")) {
            let f = fields(line);
            let Some(name) = f.get("SwitchName") else {
                continue;
            };
            if let Some(children) = f.get("Switches") {
                for c in expand_hostlist(children) {
                    t.parent.insert(c, name.to_string());
                }
            } else if let Some(nodes) = f.get("Nodes") {
                for n in expand_hostlist(nodes) {
                    t.leaf.insert(n, name.to_string());
                }
            }
        }
        t
    }

    /// Switches from the root down to `node`'s leaf switch; empty when the
    /// node is in no switch.
    pub fn path(&self, node: &str) -> Vec<String> {
        let mut path = Vec::new();
        let mut at = self.leaf.get(node);
        while let Some(s) = at {
            if path.contains(s) || path.len() > 64 {
                break;
            }
            path.push(s.clone());
            at = self.parent.get(s);
        }
        path.reverse();
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/slurm")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn host_lists_expand_like_slurm() {
        assert_eq!(expand_hostlist("n[1-3,7]"), ["n1", "n2", "n3", "n7"]);
        assert_eq!(
            expand_hostlist("gpu-[08-10]a,login"),
            ["gpu-08a", "gpu-09a", "gpu-10a", "login"]
        );
        assert_eq!(expand_hostlist("n1"), ["n1"]);
        assert!(expand_hostlist("").is_empty());
        assert!(expand_hostlist("(null)").len() == 1);
    }

    #[test]
    fn recorded_jobs_read_the_same_from_json_and_text() {
        let json = jobs_from_squeue_json(&fixture("squeue.json")).unwrap();
        let text = jobs_from_scontrol(&fixture("scontrol-show-job-oneliner.txt"));
        assert_eq!(json.len(), 10);
        assert_eq!(json, text);
        let by = |id: u64| json.iter().find(|j| j.id == id).unwrap();
        assert_eq!(by(7).state, "RUNNING");
        assert_eq!(by(7).nodes, ["n1", "n2", "n3"]);
        assert!(by(7).alive());
        assert_eq!(by(8).reason, "Resources");
        assert!(by(8).nodes.is_empty());
        assert_eq!(by(2).state, "NODE_FAIL");
        assert!(!by(2).alive());
        assert_eq!(by(3).restarts, 1);
        assert_eq!(by(10).reason, "JobHeldUser");
        assert_eq!(by(1).uid, 0);
        assert_eq!(by(7).partition, "gpu");
    }

    #[test]
    fn recorded_topology_gives_root_first_paths() {
        let t = Topology::parse(&fixture("scontrol-show-topology.txt"));
        assert_eq!(t.path("n1"), ["s0", "s1"]);
        assert_eq!(t.path("n4"), ["s0", "s2"]);
        assert!(t.path("n9").is_empty());
    }

    #[test]
    fn recorded_nodes_give_addresses() {
        let a = node_addresses(&fixture("scontrol-show-node.txt").replace("\n   ", " "));
        assert_eq!(a.get("n1").map(String::as_str), Some("127.0.0.1"));
    }
}
