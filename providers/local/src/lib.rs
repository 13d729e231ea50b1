//! The embedded `local` cloud: a small cloud on this machine (Linux or
//! macOS: nothing here reads `/proc` or needs more than 127.0.0.1), so the
//! code paths gangway uses against a real cloud (failover on capacity,
//! idempotent relaunch, rank assignment from topology, spot preemption)
//! can be exercised without one.
//!
//! # Model
//!
//! - One region, `local`, with zones `local-a`, `local-b`, `local-c`.
//! - Instance types `local.cpu` (no GPU) and `local.gpu1`, `local.gpu2`,
//!   `local.gpu4`, `local.gpu8` (that many fake GPUs, announced to commands
//!   through `env.CUDA_VISIBLE_DEVICES`).
//! - A node is a directory, `root/nodes/<id>/`, with `home/` (where commands
//!   run), `procs/` (the caller registers every process group it starts on
//!   the node there, as a file named by the pgid that names its run and
//!   whose `flock` the group holds while it lives) and `metadata/`
//!   (where preemption notices appear, as on a cloud's metadata server),
//!   plus its own loopback address in 127.0.0.0/8, or, in single-address
//!   mode (`config.local.addresses`; a machine that answers only on
//!   127.0.0.1, as macOS does), 127.0.0.1 and a range of ports of its own.
//! - Instances are JSON records under `root/instances/<cluster>/` (so a
//!   describe reads one cluster's records, not every cluster's), each written
//!   atomically; every mutating call holds an exclusive `flock` on
//!   `root/lock`, so several gangway processes can share the cloud, and a
//!   caller killed at any moment leaves records that `describe` reports
//!   truthfully and `terminate` cleans up.
//!
//! # Options (`config.local`)
//!
//! - `capacity`: running nodes per zone, an integer or a map zone → integer
//!   (default 256); a launch that does not fit fails with
//!   [`ErrorKind::Capacity`] and creates nothing.
//! - `topology`: switch paths such as `"spine1/leaf2"`, by launch index.
//! - `seed`: return nodes, and hand out new addresses, in a shuffled but
//!   deterministic order, as real clouds do not answer in topology order.
//! - `preempt_after_s`, `notice_s`: for spot launches, a detached "market"
//!   process posts a preemption notice `notice_s` before `preempt_after_s`
//!   and then kills every registered process group of the launched nodes.
//!
//! The calls do blocking file system work (and may wait on the lock) on the
//! calling thread; they are short.
#![deny(missing_docs)]

mod config;
mod held;
mod market;
mod store;
#[cfg(test)]
mod tests;
mod transport;
#[cfg(target_os = "linux")]
mod view;

pub use transport::LocalTransport;

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeState, Placement,
    Provider, ProviderError, Result,
};

use config::{split_path, LocalConfig};
use serde_json::Value;
use store::{
    allocate_addresses_from, allocate_ports_from, answers_on, first_address, first_port, now_ms,
    port_free, Layout, RecState, Record, Rng, PORTS_PER_NODE, PORT_RANGES, SINGLE_ADDR,
};

pub use config::{Addresses, ADDRESSES_ENV};

/// Provider name, region and cloud of every placement.
const NAME: &str = "local";
/// The one region.
const REGION: &str = "local";
/// The zones.
pub(crate) const ZONES: &[&str] = &["local-a", "local-b", "local-c"];
/// Instance types and their fake GPU counts (the catalog's `local.csv` rows).
const TYPES: &[(&str, u32)] = &[
    ("local.cpu", 0),
    ("local.gpu1", 1),
    ("local.gpu2", 2),
    ("local.gpu4", 4),
    ("local.gpu8", 8),
];

/// The local cloud, keeping its state under one root directory.
#[derive(Clone, Debug)]
pub struct LocalProvider {
    layout: Layout,
}

impl LocalProvider {
    /// `root` is `$GANGWAY_HOME/local`; created on first use. A relative
    /// root is made absolute against the current directory.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let root = std::path::absolute(&root).unwrap_or(root);
        LocalProvider {
            layout: Layout { root },
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.layout.root
    }

    fn launch_now(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let zone = req.placement.zone.as_str();
        let loc = format!("{REGION}/{zone}");
        let invalid = |m: String| error(ErrorKind::InvalidRequest, &loc, m);
        if req.placement.cloud != NAME {
            return Err(invalid(format!(
                "placement {} is not in the local cloud",
                req.placement
            )));
        }
        if req.placement.region != REGION {
            return Err(invalid(format!(
                "no region {:?}; the local cloud has one region, {REGION}",
                req.placement.region
            )));
        }
        if !ZONES.contains(&zone) {
            return Err(invalid(format!(
                "no zone {zone:?}; the local cloud has {}",
                ZONES.join(", ")
            )));
        }
        let gpus = gpus_of(&req.instance_type).ok_or_else(|| {
            invalid(format!(
                "no instance type {:?}; the local cloud has {}",
                req.instance_type,
                TYPES.iter().map(|t| t.0).collect::<Vec<_>>().join(", ")
            ))
        })?;
        if req.count == 0 {
            return Err(invalid(
                "a launch needs at least one node; 0 asked for".into(),
            ));
        }
        if req.cluster.0.is_empty() {
            return Err(invalid("the cluster name is empty".into()));
        }
        let cfg =
            LocalConfig::parse(req.provider_config.as_ref()).map_err(|e| invalid(e.to_string()))?;

        let _lock = self
            .layout
            .lock()
            .map_err(|e| fatal(&loc, "taking the lock", e))?;
        let now = now_ms();
        let all = self.read_all(&loc)?;
        self.layout
            .sweep_leftovers(&all)
            .map_err(|e| fatal(&loc, "sweeping leftovers", e))?;
        let mine: Vec<&Record> = all.iter().filter(|r| r.cluster == req.cluster.0).collect();
        if let Some(r) = mine
            .iter()
            .find(|r| !r.preempted(now) && (r.zone != zone || r.instance_type != req.instance_type))
        {
            return Err(invalid(format!(
                "cluster {} already has nodes in {} of type {}; this launch asks for {} in {zone} \
                 (terminate the cluster first)",
                req.cluster, r.zone, r.instance_type, req.instance_type
            )));
        }
        let (gone, live): (Vec<&Record>, Vec<&Record>) =
            mine.iter().copied().partition(|r| r.preempted(now));
        let count = req.count as usize;
        let mut running: Vec<&Record> = live
            .iter()
            .copied()
            .filter(|r| r.state == RecState::Running)
            .collect();
        running.sort_by_key(|r| r.launch_index);
        running.truncate(count);
        let mut stopped: Vec<&Record> = live
            .iter()
            .copied()
            .filter(|r| r.state == RecState::Stopped)
            .collect();
        stopped.sort_by_key(|r| r.launch_index);
        stopped.truncate(count - running.len());
        let n_new = count - running.len() - stopped.len();

        let asked = (stopped.len() + n_new) as u64;
        if asked > 0 {
            let cap = cfg.capacity(zone);
            let in_use = all
                .iter()
                .filter(|r| r.zone == zone && r.holds_capacity(now))
                .count() as u64;
            if in_use + asked > cap {
                return Err(error(
                    ErrorKind::Capacity,
                    &loc,
                    format!(
                        "zone {zone} has capacity for {cap} nodes (config.local.capacity); \
                         {in_use} in use, {asked} asked for"
                    ),
                ));
            }
        }

        // New nodes take the lowest launch indices the cluster's surviving
        // nodes leave free (replacements of preempted nodes take theirs).
        let kept: HashSet<u32> = live.iter().map(|r| r.launch_index).collect();
        let new_indices: Vec<u32> = (0u32..).filter(|i| !kept.contains(i)).take(n_new).collect();
        let topology: Vec<Vec<String>> = match &cfg.topology {
            None => vec![Vec::new(); n_new],
            Some(paths) => {
                let needed = new_indices
                    .iter()
                    .map(|i| *i as usize + 1)
                    .max()
                    .unwrap_or(0)
                    .max(count);
                if paths.len() < needed {
                    return Err(invalid(format!(
                        "config.local.topology has {} entries but {needed} nodes need one each \
                         (entry i is the switch path of the node with launch index i)",
                        paths.len()
                    )));
                }
                new_indices
                    .iter()
                    .map(|i| split_path(&paths[*i as usize]))
                    .collect()
            }
        };

        let gone_ids: HashSet<&str> = gone.iter().map(|r| r.id.as_str()).collect();
        let used: HashSet<Ipv4Addr> = all
            .iter()
            .filter(|r| !gone_ids.contains(r.id.as_str()))
            .filter_map(|r| r.ip.parse().ok())
            .collect();
        let first = first_address(&self.layout.root);
        let single = single_address(cfg.addresses, first);
        let mut addrs: Vec<(Ipv4Addr, Option<u16>)> = if single {
            let asked_ports: u32 = req
                .ports
                .iter()
                .map(|(a, b)| u32::from(b.saturating_sub(*a)) + 1)
                .sum();
            if asked_ports >= u32::from(PORTS_PER_NODE) {
                return Err(invalid(format!(
                    "the task's ports ({asked_ports} of them) do not fit a node's range of \
                     {PORTS_PER_NODE} ports in single-address mode (config.local.addresses: \
                     single, or a machine that answers only on 127.0.0.1); ask for at most {}",
                    PORTS_PER_NODE - 1
                )));
            }
            let used: HashSet<u16> = all
                .iter()
                .filter(|r| !gone_ids.contains(r.id.as_str()))
                .filter_map(|r| r.ports)
                .collect();
            let first = first_port(&self.layout.root);
            allocate_ports_from(first, &used, n_new, port_free)
                .ok_or_else(|| {
                    error(
                        ErrorKind::Capacity,
                        &loc,
                        format!(
                            "no free range of {PORTS_PER_NODE} ports left in {}-{} on 127.0.0.1 \
                             (single-address mode)",
                            PORT_RANGES.start,
                            PORT_RANGES.end - 1
                        ),
                    )
                })?
                .into_iter()
                .map(|p| (SINGLE_ADDR, Some(p)))
                .collect()
        } else {
            allocate_addresses_from(first, &used, n_new)
                .ok_or_else(|| {
                    error(
                        ErrorKind::Capacity,
                        &loc,
                        "no free address left in 127.0.0.0/8".to_string(),
                    )
                })?
                .into_iter()
                .map(|a| (a, None))
                .collect()
        };
        // Two streams, so that the order nodes come back in depends only on
        // the seed and the nodes, not on how many addresses were drawn.
        if let Some(seed) = cfg.seed {
            Rng::new(seed).shuffle(&mut addrs);
        }

        // Everything is checked: from here on, change the cloud.
        for r in &gone {
            self.destroy(r)
                .map_err(|e| fatal(&loc, "removing a preempted node", e))?;
        }
        // Which launch of this cluster name this is (for `preemptions`).
        let launch_no = if n_new > 0 {
            self.layout.launch_number(&req.cluster.0, &req.client_token)
        } else {
            0
        };
        let schedule = match &cfg.preemptions {
            Some(list) => list.get(launch_no as usize).copied(),
            None => cfg.preempt_after_s.map(|a| (a, cfg.notice_s)),
        };
        let timing = match (req.use_spot, schedule) {
            (true, Some((after, notice))) if n_new > 0 => {
                let preempt_at = now + (after * 1000.0).round() as u64;
                let notice_at = preempt_at
                    .saturating_sub((notice * 1000.0).round() as u64)
                    .max(now);
                let marked = cfg.preempt_nodes.map_or(n_new, |k| (k as usize).min(n_new));
                Some((notice_at, preempt_at, marked))
            }
            _ => None,
        };
        let mut progress = Progress {
            cluster: req.cluster.0.clone(),
            stop_after: if n_new > 0 {
                self.take_midway_fault(&loc)?
            } else {
                None
            },
            ..Progress::default()
        };
        let outcome = self.apply(
            req,
            gpus,
            now,
            &stopped,
            &new_indices,
            topology,
            &addrs,
            timing,
            &mut progress,
        );
        if let Err(e) = outcome {
            if progress.stop_after.is_some() {
                // As a launcher killed here would: no roll-back.
                return Err(error(ErrorKind::Fatal, &loc, format!("launching: {e}")));
            }
            self.roll_back(&progress);
            return Err(fatal(&loc, "launching", e));
        }
        for r in &running {
            // Repairs a directory lost to a crash between its record and it.
            let _ = self.layout.make_node_dirs(&r.id);
        }

        let mut records: Vec<Record> = running.iter().map(|r| (*r).clone()).collect();
        records.extend(progress.started);
        records.extend(progress.created);
        records.sort_by_key(|r| r.launch_index);
        let now = now_ms();
        let mut nodes: Vec<Node> = records.iter().map(|r| self.node(r, now)).collect();
        if let Some(seed) = cfg.seed {
            Rng::new(!seed).shuffle(&mut nodes);
        }
        Ok(nodes)
    }

    /// The mutating half of a launch: starts `stopped`, creates the new
    /// nodes, records what it did in `progress` for a roll-back.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        req: &LaunchRequest,
        gpus: u32,
        now: u64,
        stopped: &[&Record],
        new_indices: &[u32],
        topology: Vec<Vec<String>>,
        addrs: &[(Ipv4Addr, Option<u16>)],
        timing: Option<(u64, u64, usize)>,
        progress: &mut Progress,
    ) -> io::Result<()> {
        for r in stopped {
            self.layout.make_node_dirs(&r.id)?;
            market::clear_notices(&self.layout.node_dir(&r.id).join("metadata"));
            let mut rec = (*r).clone();
            rec.state = RecState::Running;
            self.layout.write_record(&rec)?;
            progress.started.push(rec);
        }
        let mut taken = HashSet::new();
        let ids: Vec<String> = new_indices
            .iter()
            .map(|_| {
                let id = self.layout.new_id(&taken);
                taken.insert(id.clone());
                id
            })
            .collect();
        // Directories first, then the market, then the records one by one: a
        // crash leaves directories without records (swept under the lock)
        // and a cluster with fewer records, never a record without its node.
        for id in &ids {
            progress.dirs.push(id.clone());
            self.layout.make_node_dirs(id)?;
        }
        let market_pid = match timing {
            Some((notice_at, preempt_at, marked)) => {
                let dirs: Vec<PathBuf> = ids
                    .iter()
                    .take(marked)
                    .map(|id| self.layout.node_dir(id))
                    .collect();
                let pid = market::spawn(&dirs, notice_at, preempt_at)?;
                progress.market = Some(pid);
                Some(pid)
            }
            None => None,
        };
        for (j, (id, path)) in ids.iter().zip(topology).enumerate() {
            // Only the nodes the market was told about are preempted.
            let timing = timing.filter(|t| j < t.2);
            let rec = Record {
                id: id.clone(),
                cluster: req.cluster.0.clone(),
                owner: req.owner.clone(),
                client_token: req.client_token.clone(),
                region: REGION.to_string(),
                zone: req.placement.zone.clone(),
                instance_type: req.instance_type.clone(),
                use_spot: req.use_spot,
                ip: addrs[j].0.to_string(),
                topology: path,
                state: RecState::Running,
                gpus,
                launch_index: new_indices[j],
                created_ms: now,
                preempt_at_ms: timing.map(|t| t.1),
                notice_at_ms: timing.map(|t| t.0),
                market_pid: market_pid.filter(|_| timing.is_some()),
                ports: addrs[j].1,
            };
            self.layout.write_record(&rec)?;
            progress.created.push(rec);
            if progress.stop_after == Some(progress.created.len() as u64) {
                return Err(io::Error::other(format!(
                    "stopped half-way after {} of {} new nodes \
                     (faults.json launch_midway, injected)",
                    progress.created.len(),
                    ids.len()
                )));
            }
        }
        Ok(())
    }

    /// Undoes a failed launch as far as it got.
    fn roll_back(&self, progress: &Progress) {
        if let (Some(pid), Some(first)) = (progress.market, progress.dirs.first()) {
            market::kill(pid, &self.layout.node_dir(first));
        }
        for id in &progress.dirs {
            kill_registered(&self.layout.node_dir(id).join("procs"));
            let _ = self.layout.remove_node_dir(id);
            let _ = self.layout.remove_record(&progress.cluster, id);
        }
        for r in &progress.started {
            let mut rec = r.clone();
            rec.state = RecState::Stopped;
            let _ = self.layout.write_record(&rec);
        }
    }

    /// Kills everything of one node and deletes it, directory before record.
    fn destroy(&self, r: &Record) -> io::Result<()> {
        let dir = self.layout.node_dir(&r.id);
        if let Some(pid) = r.market_pid {
            market::kill(pid, &dir);
        }
        kill_registered(&dir.join("procs"));
        self.layout.remove_node_dir(&r.id)?;
        self.layout.remove_record(&r.cluster, &r.id)
    }

    fn read_all(&self, loc: &str) -> Result<Vec<Record>> {
        self.layout
            .read_records()
            .map_err(|e| fatal(loc, "reading instance records", e))
    }

    fn cluster_records(&self, cluster: &ClusterName) -> Result<Vec<Record>> {
        let mut recs: Vec<Record> = self
            .layout
            .read_cluster(&cluster.0)
            .map_err(|e| fatal(REGION, "reading instance records", e))?
            .into_iter()
            .filter(|r| r.cluster == cluster.0)
            .collect();
        recs.sort_by(|a, b| (a.launch_index, &a.id).cmp(&(b.launch_index, &b.id)));
        Ok(recs)
    }

    fn describe_now(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let recs = self.cluster_records(cluster)?;
        let now = now_ms();
        Ok(recs.iter().map(|r| self.node(r, now)).collect())
    }

    fn stop_now(&self, cluster: &ClusterName) -> Result<()> {
        let _lock = self
            .layout
            .lock()
            .map_err(|e| fatal(REGION, "taking the lock", e))?;
        for mut rec in self.cluster_records(cluster)? {
            let dir = self.layout.node_dir(&rec.id);
            if let Some(pid) = rec.market_pid {
                market::kill(pid, &dir);
            }
            kill_registered(&dir.join("procs"));
            market::clear_notices(&dir.join("metadata"));
            rec.state = RecState::Stopped;
            rec.preempt_at_ms = None;
            rec.notice_at_ms = None;
            rec.market_pid = None;
            self.layout
                .write_record(&rec)
                .map_err(|e| fatal(&format!("{REGION}/{}", rec.zone), "stopping", e))?;
        }
        Ok(())
    }

    fn start_now(&self, cluster: &ClusterName, config: Option<&Value>) -> Result<Vec<Node>> {
        let cfg = LocalConfig::parse(config)
            .map_err(|e| error(ErrorKind::InvalidRequest, REGION, e.to_string()))?;
        let _lock = self
            .layout
            .lock()
            .map_err(|e| fatal(REGION, "taking the lock", e))?;
        let now = now_ms();
        let all = self.read_all(REGION)?;
        let mut recs: Vec<Record> = all
            .iter()
            .filter(|r| r.cluster == cluster.0)
            .cloned()
            .collect();
        if recs.is_empty() {
            return Err(error(
                ErrorKind::InvalidRequest,
                REGION,
                format!("no cluster {cluster}"),
            ));
        }
        recs.sort_by(|a, b| (a.launch_index, &a.id).cmp(&(b.launch_index, &b.id)));
        let mut asked: BTreeMap<&str, u64> = BTreeMap::new();
        for r in recs.iter().filter(|r| r.state == RecState::Stopped) {
            *asked.entry(r.zone.as_str()).or_default() += 1;
        }
        for (zone, asked) in &asked {
            let in_use = all
                .iter()
                .filter(|r| r.zone == *zone && r.holds_capacity(now))
                .count() as u64;
            let capacity = cfg.capacity(zone);
            if in_use + asked > capacity {
                return Err(error(
                    ErrorKind::Capacity,
                    &format!("{REGION}/{zone}"),
                    format!(
                        "zone {zone} has capacity for {capacity} nodes \
                         (config.local.capacity); {in_use} in use, {asked} asked for"
                    ),
                ));
            }
        }
        for rec in recs.iter_mut().filter(|r| r.state == RecState::Stopped) {
            let loc = format!("{REGION}/{}", rec.zone);
            self.layout
                .make_node_dirs(&rec.id)
                .map_err(|e| fatal(&loc, "starting", e))?;
            market::clear_notices(&self.layout.node_dir(&rec.id).join("metadata"));
            rec.state = RecState::Running;
            self.layout
                .write_record(rec)
                .map_err(|e| fatal(&loc, "starting", e))?;
        }
        let now = now_ms();
        Ok(recs.iter().map(|r| self.node(r, now)).collect())
    }

    fn terminate_now(&self, cluster: &ClusterName) -> Result<()> {
        let _lock = self
            .layout
            .lock()
            .map_err(|e| fatal(REGION, "taking the lock", e))?;
        let all = self.read_all(REGION)?;
        self.layout
            .sweep_leftovers(&all)
            .map_err(|e| fatal(REGION, "sweeping leftovers", e))?;
        for r in all.iter().filter(|r| r.cluster == cluster.0) {
            self.destroy(r)
                .map_err(|e| fatal(&format!("{REGION}/{}", r.zone), "terminating", e))?;
        }
        Ok(())
    }

    fn remove_now(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        let _lock = self
            .layout
            .lock()
            .map_err(|e| fatal(REGION, "taking the lock", e))?;
        let all = self.read_all(REGION)?;
        for r in all
            .iter()
            .filter(|r| r.cluster == cluster.0 && ids.iter().any(|i| i.0 == r.id))
        {
            self.destroy(r)
                .map_err(|e| fatal(&format!("{REGION}/{}", r.zone), "terminating a node", e))?;
        }
        Ok(())
    }

    /// The caller's view of a record at `now_ms`.
    fn node(&self, r: &Record, now_ms: u64) -> Node {
        let dir = self.layout.node_dir(&r.id);
        let state = match r.state {
            RecState::Stopped => NodeState::Stopped,
            RecState::Running if r.preempted(now_ms) => NodeState::Preempted {
                reason: format!(
                    "spot capacity reclaimed by the local market (preempt_after_s={})",
                    r.preempt_at_ms.unwrap_or(0).saturating_sub(r.created_ms) as f64 / 1000.0
                ),
            },
            RecState::Running => NodeState::Running,
        };
        let mut extra = BTreeMap::new();
        extra.insert("dir".to_string(), dir.display().to_string());
        extra.insert("home".to_string(), dir.join("home").display().to_string());
        extra.insert("procs".to_string(), dir.join("procs").display().to_string());
        extra.insert("gpus".to_string(), r.gpus.to_string());
        extra.insert("instance_type".to_string(), r.instance_type.clone());
        extra.insert("launch_index".to_string(), r.launch_index.to_string());
        if let Some(first) = r.ports {
            // Read by the gang's environment: MASTER_PORT, the task's ports
            // and GANGWAY_PORT_RANGE come from the node's range.
            extra.insert(
                gangway_provider::PORT_RANGE_FACT.to_string(),
                format!("{first}-{}", first + (PORTS_PER_NODE - 1)),
            );
        }
        if r.gpus > 0 {
            let devices: Vec<String> = (0..r.gpus).map(|i| i.to_string()).collect();
            extra.insert("env.CUDA_VISIBLE_DEVICES".to_string(), devices.join(","));
        }
        extra.insert(
            "env.GANGWAY_METADATA_DIR".to_string(),
            dir.join("metadata").display().to_string(),
        );
        Node {
            id: InstanceId(r.id.clone()),
            state,
            private_ip: r.ip.clone(),
            public_ip: None,
            placement: Placement {
                cloud: NAME.to_string(),
                region: r.region.clone(),
                zone: r.zone.clone(),
            },
            topology: r.topology.clone(),
            extra,
        }
    }
}

/// What a launch has done so far, for its roll-back.
#[derive(Default)]
struct Progress {
    cluster: String,
    /// Injected (`launch_midway`): fail, without rolling back, once this
    /// many new nodes are recorded.
    stop_after: Option<u64>,
    started: Vec<Record>,
    dirs: Vec<String>,
    market: Option<u32>,
    created: Vec<Record>,
}

/// The local cloud in the core's registry: always there, its state under
/// `$GANGWAY_HOME/local`.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: NAME,
    build: |s| {
        Some(std::sync::Arc::new(LocalProvider::new(
            s.home.join("local"),
        )))
    },
    capacity: gangway_provider::no_capacity,
    hosts_controller: false,
    stores: &[],
};

#[async_trait::async_trait]
impl Provider for LocalProvider {
    fn runs_on_this_machine(&self) -> bool {
        true
    }

    /// Local nodes are process groups on this machine, not SSH hosts.
    fn transport(
        &self,
        _home: &Path,
        _cluster: &str,
    ) -> Option<Box<dyn gangway_provider::Transport>> {
        Some(Box::new(LocalTransport::default()))
    }

    fn name(&self) -> &str {
        NAME
    }

    async fn check(&self) -> Result<CheckReport> {
        let identity = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| NAME.to_string());
        Ok(CheckReport {
            ok: true,
            identity: Some(identity),
            regions: vec![REGION.to_string()],
            hint: None,
        })
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        self.fault("launch")?;
        let nodes = self.returned(self.launch_now(req))?;
        // A cloud takes a while to boot nodes; `boot_s` simulates that
        // (outside the lock), so interrupted launches can be exercised.
        if let Ok(cfg) = LocalConfig::parse(req.provider_config.as_ref()) {
            if cfg.boot_s > 0.0 {
                sleep(std::time::Duration::from_secs_f64(cfg.boot_s)).await;
            }
        }
        Ok(nodes)
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        self.fault("describe")?;
        self.returned(self.describe_now(cluster))
    }

    async fn stop(&self, cluster: &ClusterName) -> Result<()> {
        self.fault("stop")?;
        self.returned(self.stop_now(cluster))
    }

    async fn start(&self, cluster: &ClusterName, config: Option<&Value>) -> Result<Vec<Node>> {
        self.fault("start")?;
        self.returned(self.start_now(cluster, config))
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        self.fault("terminate")?;
        self.returned(self.terminate_now(cluster))
    }

    fn cannot_replace_nodes(&self) -> Option<&'static str> {
        // A launch keeps a cluster's running nodes and makes only the
        // shortfall, in the same zone, with the lowest free launch
        // indices (so the same topology entries).
        None
    }

    async fn remove_nodes(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        self.fault("terminate")?;
        self.returned(self.remove_now(cluster, ids))
    }
}

impl LocalProvider {
    /// Counts a kill point and dies at the one `faults` names.
    fn kill_point(&self, faults: &serde_json::Map<String, Value>) -> Result<()> {
        let Some(at) = faults.get("kill_at").and_then(Value::as_u64) else {
            return Ok(());
        };
        let counter = self.layout.root.join("calls");
        let n = std::fs::read_to_string(&counter)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0)
            + 1;
        std::fs::write(&counter, n.to_string()).map_err(|e| fatal(REGION, "counting calls", e))?;
        if n == at {
            // SAFETY: kill(2) of this very process, on the test's request.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        Ok(())
    }

    /// The kill point as a call returns.
    fn returned<T>(&self, r: Result<T>) -> Result<T> {
        let path = self.layout.root.join("faults.json");
        if path.exists() {
            if let Ok(_lock) = self.layout.lock() {
                let faults: Option<serde_json::Map<String, Value>> = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok());
                if let Some(f) = faults {
                    self.kill_point(&f)?;
                }
            }
        }
        r
    }

    /// The local cloud's API failing on purpose, as the emulators of the
    /// real clouds can: `root/faults.json` maps an operation (`launch`,
    /// `describe`, `stop`, `terminate`) to `{"times": N, "kind": K,
    /// "message": M}`; the next N calls (all of them when N is -1) fail
    /// with that error kind (`transient`, `auth`, `fatal`, ...) and change
    /// nothing. Tests write the file; it does not exist otherwise.
    ///
    /// `{"launch_midway": {"times": N, "after_nodes": K}}` makes the next N
    /// launches that create nodes stop with a `Fatal` error once K of their
    /// new nodes are recorded, leaving those K as a launcher killed there
    /// would (no roll-back): a half-created cluster for `terminate`.
    ///
    /// `{"kill_at": N}` in the same file is the fault sweep's kill point:
    /// every call's arrival and its return are counted across processes
    /// (`root/calls`), and the process at the N-th of them is killed with
    /// SIGKILL there (odd N: before a call changes anything; even N: after
    /// it did, before the caller hears), as a test harness kills a client
    /// when an emulator logs its N-th request.
    fn fault(&self, op: &str) -> Result<()> {
        let path = self.layout.root.join("faults.json");
        if !path.exists() {
            return Ok(());
        }
        let _lock = self
            .layout
            .lock()
            .map_err(|e| fatal(REGION, "taking the lock", e))?;
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(());
        };
        let mut all: serde_json::Map<String, Value> = serde_json::from_str(&text).map_err(|e| {
            error(
                ErrorKind::Fatal,
                REGION,
                format!("{}: not a faults file: {e}", path.display()),
            )
        })?;
        self.kill_point(&all)?;
        let Some(f) = all.get_mut(op).and_then(Value::as_object_mut) else {
            return Ok(());
        };
        let times = f.get("times").and_then(Value::as_i64).unwrap_or(1);
        if times == 0 {
            return Ok(());
        }
        let kind = match f.get("kind").and_then(Value::as_str).unwrap_or("transient") {
            "capacity" => ErrorKind::Capacity,
            "quota" => ErrorKind::Quota,
            "auth" => ErrorKind::Auth,
            "invalid" => ErrorKind::InvalidRequest,
            "fatal" => ErrorKind::Fatal,
            _ => ErrorKind::Transient,
        };
        let message = f
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("the local cloud's API failed (injected)")
            .to_string();
        if times > 0 {
            f.insert("times".into(), Value::from(times - 1));
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, Value::Object(all).to_string())
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| fatal(REGION, "updating faults.json", e))?;
        }
        Err(error(kind, REGION, format!("{op}: {message}")))
    }
}

impl LocalProvider {
    /// Consumes one `launch_midway` fault, if `faults.json` has one: the
    /// number of new nodes after which the launch stops. The caller holds
    /// the lock.
    fn take_midway_fault(&self, loc: &str) -> Result<Option<u64>> {
        let path = self.layout.root.join("faults.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let mut all: serde_json::Map<String, Value> = serde_json::from_str(&text).map_err(|e| {
            error(
                ErrorKind::Fatal,
                loc,
                format!("{}: not a faults file: {e}", path.display()),
            )
        })?;
        let Some(f) = all.get_mut("launch_midway").and_then(Value::as_object_mut) else {
            return Ok(None);
        };
        let times = f.get("times").and_then(Value::as_i64).unwrap_or(1);
        if times == 0 {
            return Ok(None);
        }
        let after = f.get("after_nodes").and_then(Value::as_u64).unwrap_or(1);
        if times > 0 {
            f.insert("times".into(), Value::from(times - 1));
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, Value::Object(all).to_string())
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| fatal(loc, "updating faults.json", e))?;
        }
        Ok(Some(after))
    }
}

/// Waits without blocking the caller's executor (this crate has no runtime
/// of its own): a thread sleeps and wakes the task, so a caller can cancel
/// a launch that is still "booting".
async fn sleep(d: std::time::Duration) {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll, Waker};

    struct Shared {
        done: bool,
        waker: Option<Waker>,
    }
    struct Sleep(Arc<Mutex<Shared>>);
    impl Future for Sleep {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if s.done {
                Poll::Ready(())
            } else {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
    let shared = Arc::new(Mutex::new(Shared {
        done: false,
        waker: None,
    }));
    let theirs = Arc::clone(&shared);
    std::thread::spawn(move || {
        std::thread::sleep(d);
        let mut s = theirs.lock().unwrap_or_else(|e| e.into_inner());
        s.done = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    });
    Sleep(shared).await
}

/// Kills (SIGKILL to the whole process group) every process group
/// registered in a node's procs dir, and removes the registrations. Used by
/// terminate/stop/preemption, and public so callers can reuse it.
///
/// A registration is an empty file named by the pgid. Names that are not a
/// pgid above 1 are left alone, and so is the caller's own process group.
pub fn kill_registered(procs_dir: &Path) {
    let Ok(entries) = fs::read_dir(procs_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pgid) = name.to_str().and_then(|s| s.parse::<i64>().ok()) else {
            continue;
        };
        kill_group(pgid);
        let _ = fs::remove_file(entry.path());
    }
}

/// SIGKILL to process group `pgid`; never to groups 0 and 1, nor our own.
/// A group that is gone already (ESRCH) is fine.
pub(crate) fn kill_group(pgid: i64) {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return;
    };
    // SAFETY: getpgrp and kill have no memory-safety preconditions.
    unsafe {
        if pgid <= 1 || pgid == libc::getpgrp() {
            return;
        }
        libc::kill(-pgid, libc::SIGKILL);
    }
}

/// Whether a launch puts its nodes on 127.0.0.1 with a port range each:
/// the task's `config.local.addresses`, else [`ADDRESSES_ENV`], else
/// whether this machine answers on `probe` (the first address this root
/// would hand out). Linux answers on all of 127.0.0.0/8; macOS only on
/// 127.0.0.1 unless aliases were added, so it gets single-address mode
/// with no configuration. The same probe, and the same code, on both.
pub fn single_address(configured: Option<Addresses>, probe: Ipv4Addr) -> bool {
    let from_env = || {
        std::env::var(ADDRESSES_ENV)
            .ok()
            .and_then(|v| Addresses::parse(v.trim()))
    };
    match configured.or_else(from_env).unwrap_or(Addresses::Auto) {
        Addresses::Single => true,
        Addresses::PerNode => false,
        Addresses::Auto => !answers_on(probe),
    }
}

fn gpus_of(instance_type: &str) -> Option<u32> {
    TYPES
        .iter()
        .find(|(name, _)| *name == instance_type)
        .map(|(_, gpus)| *gpus)
}

fn error(kind: ErrorKind, location: &str, message: String) -> ProviderError {
    ProviderError::new(kind, NAME, location, message)
}

fn fatal(location: &str, doing: &str, e: io::Error) -> ProviderError {
    error(ErrorKind::Fatal, location, format!("{doing}: {e}"))
}
