//! The Slurm clusters gangway may use, `$GANGWAY_HOME/slurm.yaml`, and the
//! capacity they offer the optimizer (cloud `slurm`, region = cluster,
//! zone = partition, on-demand only, at the price per GPU-hour you set).
//!
//! ```yaml
//! clusters:
//!   hpc:                        # infra: slurm/hpc[/gpu]
//!     conf: /etc/slurm/slurm.conf   # SLURM_CONF for this cluster (default: Slurm's own)
//!     account: proj42           # --account, --qos, --time when the task says nothing
//!     qos: normal
//!     time: "04:00:00"
//!     max_queue_wait: 10m       # a pending launch gives up after this (then failover)
//!     work_dir: ~/.gangway/slurm    # per-node homes: <work_dir>/gangway-<cluster>/<node>
//!     partitions:
//!       gpu:
//!         gpus: A100:8          # per node
//!         gres: a100            # Slurm's GRES type, when it differs from the name
//!         cpus: 64
//!         memory: 512           # GiB
//!         price_per_gpu_hour: 0.9
//!         exclusive: true
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use gangway_provider::{Capacity, Offer, DEFAULT_CPUS, DEFAULT_MEMORY_GIB};
use gangway_yaml::{self as yaml, expand_home, Cx, Kind, LocatedError as SpecError};

use crate::{Cluster, Partition};

/// The parsed file.
#[derive(Clone, Debug, Default)]
pub struct SlurmClusters {
    /// Clusters, in file order.
    pub clusters: Vec<Cluster>,
    /// Where it was read from.
    pub path: PathBuf,
}

/// Where the file lives.
pub fn path(home: &Path) -> PathBuf {
    home.join("slurm.yaml")
}

/// The catalog's instance type for `gpus` GPUs per node of a partition.
pub fn instance_type(partition: &str, gpus: u32) -> String {
    if gpus == 0 {
        format!("slurm-{partition}")
    } else {
        format!("slurm-{partition}-{gpus}gpu")
    }
}

/// Most GPUs a partition's node may have (as many as a task may ask for
/// per node).
pub const MAX_GPUS_PER_NODE: u32 = 64;

const CLUSTER_KEYS: &[&str] = &[
    "conf",
    "login",
    "login_key",
    "login_jump",
    "account",
    "qos",
    "time",
    "max_queue_wait",
    "work_dir",
    "partitions",
];
const PARTITION_KEYS: &[&str] = &[
    "gpus",
    "gres",
    "cpus",
    "memory",
    "price_per_gpu_hour",
    "exclusive",
];

/// Parses the file's text.
pub fn parse(text: &str, file: &str) -> Result<SlurmClusters, SpecError> {
    let cx = Cx { file };
    let docs = yaml::parse(text).map_err(|e| SpecError::from_yaml(file, e))?;
    let mut out = SlurmClusters {
        path: PathBuf::from(file),
        ..SlurmClusters::default()
    };
    let Some(root) = docs.docs.first() else {
        return Ok(out);
    };
    if matches!(root.kind, Kind::Null) {
        return Ok(out);
    }
    for (k, v) in cx.map(root, "")? {
        let key = cx.key(k, "")?;
        if key != "clusters" {
            return Err(cx.unknown(k, "", &key, &["clusters"]));
        }
        for (ck, cv) in cx.map(v, "clusters")? {
            let name = cx.key(ck, "clusters")?;
            let cf = format!("clusters.{name}");
            let mut c = Cluster {
                name: name.clone(),
                conf: None,
                account: None,
                qos: None,
                time_limit: None,
                login: None,
                // `~` is the home where Slurm's commands run (the login
                // node's, when it is reached over SSH).
                work_dir: "~/.gangway/slurm".into(),
                max_queue_wait: Duration::from_secs(600),
                partitions: Vec::new(),
            };
            let mut has_partitions = false;
            let mut login: Option<crate::Login> = None;
            let mut login_key = None;
            let mut login_jump = None;
            for (fk, fv) in cx.map(cv, &cf)? {
                let key = cx.key(fk, &cf)?;
                let field = format!("{cf}.{key}");
                match key.as_str() {
                    "partitions" => {
                        has_partitions = true;
                        for (pk, pv) in cx.map(fv, &field)? {
                            let pname = cx.key(pk, &field)?;
                            c.partitions.push(partition(&cx, &pname, pv, &field)?);
                        }
                    }
                    "login" => {
                        let text = cx.text(fv, &field)?;
                        if text != "local" {
                            let Some(l) = crate::Login::parse(&text) else {
                                return Err(cx.err(
                                    fv,
                                    &field,
                                    format!("'{text}' is not [user@]host[:port]"),
                                    Some("write login: local (Slurm's commands on this machine) or login: me@login1.example.com"),
                                ));
                            };
                            login = Some(l);
                        }
                    }
                    "login_key" => {
                        login_key = Some(PathBuf::from(expand_home(&cx.text(fv, &field)?)))
                    }
                    "login_jump" => login_jump = Some(cx.text(fv, &field)?),
                    "conf" => c.conf = Some(PathBuf::from(expand_home(&cx.text(fv, &field)?))),
                    "account" => c.account = Some(cx.text(fv, &field)?),
                    "qos" => c.qos = Some(cx.text(fv, &field)?),
                    "time" => c.time_limit = Some(cx.text(fv, &field)?),
                    "work_dir" => c.work_dir = cx.text(fv, &field)?,
                    "max_queue_wait" => {
                        let t = cx.text(fv, &field)?;
                        c.max_queue_wait = crate::parse_duration(&t).ok_or_else(|| {
                            cx.err(
                                fv,
                                &field,
                                format!("'{t}' is not a duration"),
                                Some("write seconds (600) or 10m, 2h"),
                            )
                        })?;
                    }
                    other => return Err(cx.unknown(fk, &cf, other, CLUSTER_KEYS)),
                }
            }
            if let Some(mut l) = login {
                l.key = login_key;
                l.jump = login_jump;
                c.login = Some(l);
            } else if login_key.is_some() || login_jump.is_some() {
                return Err(cx.err(
                    cv,
                    &cf,
                    "login_key and login_jump need a login host",
                    Some("add login: me@login1.example.com"),
                ));
            }
            if !has_partitions || c.partitions.is_empty() {
                return Err(cx.err(
                    cv,
                    &cf,
                    "a cluster needs partitions",
                    Some("add partitions: {gpu: {gpus: A100:8}}"),
                ));
            }
            out.clusters.push(c);
        }
    }
    Ok(out)
}

fn partition(
    cx: &Cx<'_>,
    name: &str,
    v: &yaml::Node,
    parent: &str,
) -> Result<Partition, SpecError> {
    let pf = format!("{parent}.{name}");
    let mut p = Partition {
        name: name.to_string(),
        gpu: None,
        gres_type: None,
        cpus: DEFAULT_CPUS,
        memory_gib: DEFAULT_MEMORY_GIB,
        max_nodes: u32::MAX,
        price_per_gpu_hour: 0.0,
        exclusive: false,
    };
    if matches!(v.kind, Kind::Null) {
        return Ok(p);
    }
    for (k, fv) in cx.map(v, &pf)? {
        let key = cx.key(k, &pf)?;
        let field = format!("{pf}.{key}");
        let text = cx.text(fv, &field)?;
        let number = || {
            text.trim_end_matches("GB")
                .parse::<f64>()
                .map_err(|_| cx.err(fv, &field, format!("'{text}' is not a number"), None))
        };
        match key.as_str() {
            "gpus" => {
                let (g, n) = text.split_once(':').unwrap_or((&text, "1"));
                let Some(n) = n.trim().parse::<u32>().ok().filter(|n| *n > 0) else {
                    return Err(cx.err(
                        fv,
                        &field,
                        format!("'{text}' is not NAME:COUNT"),
                        Some("write e.g. gpus: A100:8"),
                    ));
                };
                // The catalog offers every count up to this one: without a
                // bound, A100:100000000 made a launch run out of memory.
                if n > MAX_GPUS_PER_NODE {
                    return Err(cx.err(
                        fv,
                        &field,
                        format!("{n} GPUs per node; at most {MAX_GPUS_PER_NODE} are supported"),
                        Some("write the GPUs of one node, e.g. gpus: A100:8"),
                    ));
                }
                p.gpu = Some((g.trim().to_string(), n));
            }
            "gres" => p.gres_type = Some(text),
            "cpus" => p.cpus = number()? as f32,
            "memory" => p.memory_gib = number()? as f32,
            "price_per_gpu_hour" => p.price_per_gpu_hour = number()?,
            "exclusive" => {
                p.exclusive = match text.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(cx.err(
                            fv,
                            &field,
                            format!("'{text}' is not true or false"),
                            None,
                        ))
                    }
                }
            }
            other => return Err(cx.unknown(k, &pf, other, PARTITION_KEYS)),
        }
    }
    Ok(p)
}

/// Reads `$GANGWAY_HOME/slurm.yaml`; `None` when there is none.
pub fn load(home: &Path) -> Result<Option<SlurmClusters>, SpecError> {
    let p = path(home);
    let Ok(text) = std::fs::read_to_string(&p) else {
        return Ok(None);
    };
    parse(&text, &p.display().to_string()).map(Some)
}

impl SlurmClusters {
    /// On-demand offers per (cluster, partition): a GPU partition is
    /// offered with every GPU count up to its nodes' (Slurm allocates
    /// `--gpus-per-node=k` of them), priced per GPU-hour.
    pub fn capacity(&self) -> Capacity {
        let mut offers = Vec::new();
        for c in &self.clusters {
            for p in &c.partitions {
                let counts: Vec<u32> = match &p.gpu {
                    Some((_, n)) => (1..=*n).collect(),
                    None => vec![0],
                };
                for k in counts {
                    offers.push(Offer {
                        instance_type: instance_type(&p.name, k),
                        accelerator: p.gpu.as_ref().map(|g| g.0.clone()),
                        accelerator_count: k as f32,
                        vcpus: p.cpus,
                        memory_gib: p.memory_gib,
                        region: c.name.clone(),
                        zone: p.name.clone(),
                        price: p.price_per_gpu_hour * k as f64,
                    });
                }
            }
        }
        Capacity {
            origin: self.path.display().to_string(),
            offers,
            only_when_named: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "clusters:\n  hpc:\n    account: proj\n    max_queue_wait: 2m\n    partitions:\n      gpu:\n        gpus: A100:8\n        gres: a100\n        price_per_gpu_hour: 0.5\n      cpu:\n";

    #[test]
    fn clusters_and_partitions_become_offerings() {
        let s = parse(FILE, "slurm.yaml").unwrap();
        let c = &s.clusters[0];
        assert_eq!(c.account.as_deref(), Some("proj"));
        assert_eq!(c.max_queue_wait, Duration::from_secs(120));
        assert_eq!(c.partitions[0].gres_type.as_deref(), Some("a100"));
        let cap = s.capacity();
        let o: Vec<_> = cap.offers.iter().collect();
        assert_eq!(o.len(), 9);
        let full = o.iter().find(|o| o.accelerator_count == 8.0).unwrap();
        assert_eq!(full.instance_type, "slurm-gpu-8gpu");
        assert_eq!(full.price, 4.0);
        let one = o.iter().find(|o| o.accelerator_count == 1.0).unwrap();
        assert_eq!(one.price, 0.5);
        assert!(o
            .iter()
            .any(|o| o.instance_type == "slurm-cpu" && o.accelerator.is_none()));
    }

    #[test]
    fn mistakes_name_line_column_and_field() {
        let e = parse(
            "clusters:\n  hpc:\n    partitions:\n      gpu:\n        gpu: A100:8\n",
            "slurm.yaml",
        )
        .unwrap_err();
        assert_eq!((e.line, e.col), (5, 9));
        assert_eq!(e.field, "clusters.hpc.partitions.gpu");
        assert!(e.hint.as_deref().unwrap_or("").contains("gpus"), "{e:?}");
        let e = parse(
            "clusters:\n  hpc:\n    login: me@login 1\n    partitions: {gpu: }\n",
            "s.yaml",
        )
        .unwrap_err();
        assert_eq!(e.field, "clusters.hpc.login");
        let s = parse(
            "clusters:\n  hpc:\n    login: me@login1:2222\n    login_jump: bastion\n    partitions: {gpu: }\n",
            "s.yaml",
        )
        .unwrap();
        let l = s.clusters[0].login.clone().unwrap();
        assert_eq!(
            (l.host.as_str(), l.port, l.user.as_deref()),
            ("login1", Some(2222), Some("me"))
        );
        assert_eq!(l.jump.as_deref(), Some("bastion"));
        let e = parse("clusters:\n  hpc:\n    account: x\n", "s.yaml").unwrap_err();
        assert!(e.message.contains("partitions"), "{e:?}");
    }

    /// Found by the `slurm_clusters` fuzz target: the catalog offers every
    /// GPU count up to a node's, so this file made `catalog()` (now
    /// `capacity()`) allocate
    /// 8.5 million offerings (2.5 GB) on every launch.
    #[test]
    fn a_node_with_millions_of_gpus_is_refused() {
        let e = parse(
            "clusters:\n  hpc:\n    partitions:\n      gpu:\n        gpus: A:8529360\n",
            "slurm.yaml",
        )
        .unwrap_err();
        assert_eq!((e.line, e.col), (5, 15), "{e}");
        assert_eq!(e.field, "clusters.hpc.partitions.gpu.gpus");
        assert!(e.message.contains("at most 64"), "{e}");
        let s = parse(
            "clusters:\n  hpc:\n    partitions: {gpu: {gpus: A:64}}\n",
            "slurm.yaml",
        )
        .unwrap();
        assert_eq!(s.capacity().offers.len(), 64);
    }

    /// Found by the `slurm_clusters` fuzz target: minutes overflowed a u64
    /// of seconds, a panic ("attempt to multiply with overflow").
    #[test]
    fn a_queue_wait_beyond_u64_seconds_is_refused() {
        let e = parse(
            "clusters:\n  hp:\n    account: proj\n    max_queue_wait: 1844674407370955161   m",
            "slurm.yaml",
        )
        .unwrap_err();
        assert_eq!((e.line, e.col), (4, 21), "{e}");
        assert_eq!(e.field, "clusters.hp.max_queue_wait");
        assert!(e.message.contains("is not a duration"), "{e}");
    }
}
