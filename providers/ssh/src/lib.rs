//! The `ssh` provider: machines you already have, grouped in pools and
//! allocated to clusters as a cloud allocates nodes.
//!
//! # Model
//!
//! - A [`Pool`] is a region (`infra: ssh/<pool>`); a host's zone label
//!   (default: the pool's name) is its zone.
//! - A host's instance type is `<pool>.<gpu>x<count>` (e.g. `lab.a100x8`)
//!   or `<pool>.cpu`; see [`SshPools::instance_type`].
//! - A node's id is `<pool>/<host name>`. Nodes are never created or
//!   destroyed: `launch` allocates hosts to the cluster, `terminate`
//!   releases them. Killing what runs on them is the caller's job.
//!
//! # Allocation records
//!
//! `root/alloc/<pool>__<host>` holds a JSON record (`cluster`, `owner`,
//! `client_token`, `at_ms`, and a copy of the host's pool, name, zone,
//! instance type and address). Records are created with `O_EXCL` while
//! holding an exclusive `flock` on `root/lock`, so two clusters never share
//! a host, several gangway processes can share the pools, and a process
//! killed at any moment leaves either a whole record or one that the next
//! call removes.
//!
//! A launch allocates only hosts that accept a TCP connection on their
//! SSH port within 2 s (probed outside the lock, then allocated under it),
//! in inventory order, and allocates nothing when it cannot get them all.
//!
//! The calls do blocking work (the lock, the probes, the file system) on a
//! thread of their own, never on the caller's executor.
#![deny(missing_docs)]

pub mod inventory;
mod probe;
mod store;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeRow, NodeState,
    Placement, Provider, ProviderError, Result, SshEndpoint,
};
use serde::{Deserialize, Serialize};

use store::{file_name, now_ms, Alloc, Store};

/// Provider name and the cloud of every placement.
const NAME: &str = "ssh";

/// One machine of a pool (parsed from the inventory by the main crate).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// Unique within the pool; the instance id is `<pool>/<name>`.
    pub name: String,
    /// Address (IP or DNS name) SSH connects to.
    pub address: String,
    /// SSH port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// SSH user.
    #[serde(default = "default_user")]
    pub user: String,
    /// Private key path.
    #[serde(default)]
    pub key: Option<String>,
    /// `ProxyJump` value.
    #[serde(default)]
    pub jump: Option<String>,
    /// Accelerator name and count, e.g. `("A100", 8)`.
    #[serde(default)]
    pub gpu: Option<(String, u32)>,
    /// Switch path from the root down, e.g. `["spine1", "leaf2"]`.
    #[serde(default)]
    pub topology: Vec<String>,
    /// Zone label; `None` means the pool's name.
    #[serde(default)]
    pub zone: Option<String>,
    /// A file on the host whose presence is a notice that the host is
    /// about to leave the pool (maintenance, a reboot): what its first line
    /// says is the notice's reason. `None`: the host is never asked.
    #[serde(default)]
    pub drain_file: Option<String>,
}

fn default_port() -> u16 {
    22
}

fn default_user() -> String {
    "root".to_string()
}

/// A named group of hosts: one region of the `ssh` cloud.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    /// Pool name (the region).
    pub name: String,
    /// Hosts, in inventory order (the order they are allocated in).
    pub hosts: Vec<Host>,
}

/// The `ssh` provider over a fixed inventory of pools.
#[derive(Clone, Debug)]
pub struct SshPools {
    store: Store,
    pools: Arc<Vec<Pool>>,
    /// What this process last learnt of each held host's liveness, by
    /// `pool/host` (see [`SshPools::describe_now`]).
    liveness: Arc<std::sync::Mutex<std::collections::HashMap<String, Liveness>>>,
}

/// A held host's liveness as this process last probed it.
#[derive(Clone, Copy, Debug)]
struct Liveness {
    /// When it was last probed.
    probed: std::time::Instant,
    /// Whether it answered then.
    answered: bool,
    /// When it last answered, if ever here.
    last_answer: Option<std::time::Instant>,
}

/// A held host is probed at most this often by one process: a controller
/// describes a running cluster every second, and each probe is a
/// connection the host's sshd logs.
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// A held host that answered before, here, counts as lost only once it has
/// not answered for this long (one slow greeting on a loaded host is not
/// a loss); one this process never heard from counts as lost at its first
/// unanswered probe (a driver asking after its run failed).
const LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

impl SshPools {
    /// `root` is `$GANGWAY_HOME/ssh_pools` (allocation records live there);
    /// created on first use. A relative root is made absolute against the
    /// current directory.
    pub fn new(root: impl Into<PathBuf>, pools: Vec<Pool>) -> Self {
        let root = root.into();
        let root = std::path::absolute(&root).unwrap_or(root);
        SshPools {
            store: Store { root },
            pools: Arc::new(pools),
            liveness: Arc::default(),
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.store.root
    }

    /// The inventory.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// The instance type of a host: `<pool>.<gpu>x<count>` (GPU name
    /// lowercased, e.g. `gpus.a100x8`), or `<pool>.cpu` for a host without
    /// GPUs (or with a count of 0).
    pub fn instance_type(pool: &str, h: &Host) -> String {
        match &h.gpu {
            Some((name, count)) if *count > 0 => {
                format!("{pool}.{}x{count}", name.to_lowercase())
            }
            _ => format!("{pool}.cpu"),
        }
    }

    /// Hosts not allocated to any cluster, as (pool, host name), in
    /// inventory order (for reporting capacity). Reachability is not probed.
    pub fn free_hosts(&self) -> io::Result<Vec<(String, String)>> {
        let lock = self.store.lock()?;
        let taken: BTreeSet<String> = lock.read_all()?.into_iter().map(|(f, _)| f).collect();
        drop(lock);
        Ok(self
            .pools
            .iter()
            .flat_map(|p| p.hosts.iter().map(move |h| (p, h)))
            .filter(|(p, h)| !taken.contains(&file_name(&p.name, &h.name)))
            .map(|(p, h)| (p.name.clone(), h.name.clone()))
            .collect())
    }

    fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// The host a record names, with its position in the inventory.
    fn lookup(&self, a: &Alloc) -> Option<((usize, usize), &Pool, &Host)> {
        self.pools
            .iter()
            .enumerate()
            .filter(|(_, p)| p.name == a.pool)
            .find_map(|(i, p)| {
                let j = p.hosts.iter().position(|h| h.name == a.host)?;
                Some(((i, j), p, &p.hosts[j]))
            })
    }

    /// Allocates and reports the nodes of a launch (blocking).
    pub(crate) fn launch_now(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let region = req.placement.region.as_str();
        let zone = req.placement.zone.as_str();
        let loc = format!("{region}/{zone}");
        let invalid = |m: String| error(ErrorKind::InvalidRequest, &loc, m);
        if req.placement.cloud != NAME {
            return Err(invalid(format!(
                "placement {} is not in the ssh cloud",
                req.placement
            )));
        }
        let Some(pool) = self.pool(region) else {
            let names: Vec<&str> = self.pools.iter().map(|p| p.name.as_str()).collect();
            return Err(invalid(format!(
                "no ssh pool {region:?}; the inventory has {}",
                list_or_none(&names)
            )));
        };
        let zones: BTreeSet<String> = pool.hosts.iter().map(|h| zone_of(pool, h)).collect();
        if !zones.contains(zone) {
            let zones: Vec<&str> = zones.iter().map(String::as_str).collect();
            return Err(invalid(format!(
                "no zone {zone:?} in pool {region}; it has {}",
                list_or_none(&zones)
            )));
        }
        let ty = req.instance_type.as_str();
        let matching: Vec<&Host> = pool
            .hosts
            .iter()
            .filter(|h| zone_of(pool, h) == zone && SshPools::instance_type(&pool.name, h) == ty)
            .collect();
        if matching.is_empty() {
            let here: BTreeSet<String> = pool
                .hosts
                .iter()
                .filter(|h| zone_of(pool, h) == zone)
                .map(|h| SshPools::instance_type(&pool.name, h))
                .collect();
            let here: Vec<&str> = here.iter().map(String::as_str).collect();
            let elsewhere: BTreeSet<String> = pool
                .hosts
                .iter()
                .filter(|h| SshPools::instance_type(&pool.name, h) == ty)
                .map(|h| zone_of(pool, h))
                .collect();
            let mut m = format!(
                "no instance type {ty:?} in pool {region} zone {zone}; it has {}",
                list_or_none(&here)
            );
            if !elsewhere.is_empty() {
                let z: Vec<&str> = elsewhere.iter().map(String::as_str).collect();
                m.push_str(&format!(" ({ty} is in zone {})", z.join(", ")));
            }
            return Err(invalid(m));
        }
        if req.count == 0 {
            return Err(invalid(
                "a launch needs at least one node; 0 asked for".into(),
            ));
        }
        if req.cluster.0.is_empty() {
            return Err(invalid("the cluster name is empty".into()));
        }
        let count = req.count as usize;
        let fatal =
            |doing: &str, e: io::Error| error(ErrorKind::Fatal, &loc, format!("{doing}: {e}"));

        // Probe results of this call, by host name (hosts of one pool).
        let mut reachable: HashMap<&str, bool> = HashMap::new();
        loop {
            let lock = self.store.lock().map_err(|e| fatal("taking the lock", e))?;
            let allocs = lock
                .read_all()
                .map_err(|e| fatal("reading allocation records", e))?;
            let holder: HashMap<&str, &str> = allocs
                .iter()
                .map(|(f, a)| (f.as_str(), a.cluster.as_str()))
                .collect();
            let held_by = |h: &Host| holder.get(file_name(&pool.name, &h.name).as_str()).copied();

            // The cluster's hosts elsewhere in the inventory: a cluster lives
            // in one zone, on one instance type.
            let mut other: Vec<String> = allocs
                .iter()
                .filter(|(_, a)| a.cluster == req.cluster.0)
                .filter_map(|(_, a)| self.lookup(a))
                .filter(|(_, p, h)| {
                    p.name != pool.name
                        || zone_of(p, h) != zone
                        || SshPools::instance_type(&p.name, h) != ty
                })
                .map(|(_, p, h)| {
                    format!(
                        "{}/{} ({} in zone {})",
                        p.name,
                        h.name,
                        SshPools::instance_type(&p.name, h),
                        zone_of(p, h)
                    )
                })
                .collect();
            if !other.is_empty() {
                other.sort();
                return Err(invalid(format!(
                    "cluster {} already holds {}; this launch asks for {ty} in pool {region} \
                     zone {zone} (down the cluster first)",
                    req.cluster,
                    other.join(", ")
                )));
            }

            let mine: Vec<&Host> = matching
                .iter()
                .copied()
                .filter(|h| held_by(h) == Some(req.cluster.0.as_str()))
                .collect();
            if mine.len() >= count {
                return Ok(mine[..count].iter().map(|h| node(pool, h)).collect());
            }
            let need = count - mine.len();
            let resting = lock
                .resting(now_ms())
                .map_err(|e| fatal("reading resting records", e))?;
            let rests = |h: &Host| resting.contains(&file_name(&pool.name, &h.name));
            let free: Vec<&Host> = matching
                .iter()
                .copied()
                .filter(|h| held_by(h).is_none() && !rests(h))
                .collect();
            let ok: Vec<&Host> = free
                .iter()
                .copied()
                .filter(|h| reachable.get(h.name.as_str()) == Some(&true))
                .collect();
            let unprobed: Vec<&Host> = free
                .iter()
                .copied()
                .filter(|h| !reachable.contains_key(h.name.as_str()))
                .collect();

            if ok.len() >= need {
                let mut created: Vec<&Host> = Vec::new();
                for h in &ok[..need] {
                    let rec = Alloc {
                        cluster: req.cluster.0.clone(),
                        owner: req.owner.clone(),
                        client_token: req.client_token.clone(),
                        at_ms: now_ms(),
                        pool: pool.name.clone(),
                        host: h.name.clone(),
                        zone: zone.to_string(),
                        instance_type: ty.to_string(),
                        address: h.address.clone(),
                    };
                    match lock.create(&rec) {
                        Ok(true) => created.push(h),
                        // Not under this lock: someone writes records
                        // without it. Treat the host as busy and retry.
                        Ok(false) => break,
                        Err(e) => {
                            for h in &created {
                                let _ = lock.remove(&file_name(&pool.name, &h.name));
                            }
                            return Err(fatal("writing an allocation record", e));
                        }
                    }
                }
                if created.len() == need {
                    let mut hosts = mine;
                    hosts.extend(created);
                    let order = |h: &Host| pool.hosts.iter().position(|x| x.name == h.name);
                    hosts.sort_by_key(|h| order(h));
                    return Ok(hosts.iter().map(|h| node(pool, h)).collect());
                }
                for h in &created {
                    let _ = lock.remove(&file_name(&pool.name, &h.name));
                }
                continue;
            }

            if unprobed.is_empty() {
                let busy: Vec<&str> = matching
                    .iter()
                    .filter(|h| held_by(h).is_some_and(|c| c != req.cluster.0))
                    .map(|h| h.name.as_str())
                    .collect();
                let unreachable: Vec<&str> = free
                    .iter()
                    .filter(|h| reachable.get(h.name.as_str()) == Some(&false))
                    .map(|h| h.name.as_str())
                    .collect();
                let mut why = Vec::new();
                if !mine.is_empty() {
                    why.push(format!("{} already allocated to this cluster", mine.len()));
                }
                if !busy.is_empty() {
                    why.push(format!("busy: {}", busy.join(", ")));
                }
                if !unreachable.is_empty() {
                    why.push(format!("unreachable: {}", unreachable.join(", ")));
                }
                let rested: Vec<&str> = matching
                    .iter()
                    .filter(|h| held_by(h).is_none() && rests(h))
                    .map(|h| h.name.as_str())
                    .collect();
                if !rested.is_empty() {
                    why.push(format!(
                        "resting after a loss (up to {} min): {}",
                        REST.as_secs() / 60,
                        rested.join(", ")
                    ));
                }
                let why = if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", why.join("; "))
                };
                return Err(error(
                    ErrorKind::Capacity,
                    &loc,
                    format!(
                        "pool {region} zone {zone}: {} of {} {ty} hosts free and reachable, \
                         {count} asked for{why}",
                        mine.len() + ok.len(),
                        matching.len()
                    ),
                ));
            }

            // Probe (without the lock) as many more hosts as are missing.
            drop(lock);
            let batch: Vec<&Host> = unprobed.into_iter().take(need - ok.len()).collect();
            for (h, up) in batch.iter().zip(probe::reachable(&batch)) {
                reachable.insert(h.name.as_str(), up);
            }
        }
    }

    /// The cluster's nodes, in inventory order (blocking).
    pub(crate) fn describe_now(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let allocs = self.cluster_allocs(cluster)?;
        let mut held: Vec<((usize, usize), &Pool, &Host)> = Vec::new();
        let mut gone: Vec<Node> = Vec::new();
        for (_, a) in &allocs {
            match self.lookup(a) {
                Some((at, p, h)) => held.push((at, p, h)),
                None => gone.push(terminated(a)),
            }
        }
        // A held host that no longer answers on its SSH port is lost to
        // the cluster (a machine that died, a cut link): said so, as a
        // cloud says a node was taken, so that a managed job replaces it.
        let up = self.alive(&held);
        let mut known: Vec<((usize, usize), Node)> = held
            .iter()
            .zip(up)
            .map(|((at, p, h), up)| {
                let mut n = node(p, h);
                if !up {
                    n.state = NodeState::Preempted {
                        reason: unanswered(h),
                    };
                }
                (*at, n)
            })
            .collect();
        known.sort_by_key(|(at, _)| *at);
        gone.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(known.into_iter().map(|(_, n)| n).chain(gone).collect())
    }

    /// Whether each held host is still alive, by [`probe`] at most every
    /// [`PROBE_EVERY`] (the last answer kept between), lost only as
    /// [`LOST_AFTER`] says.
    fn alive(&self, held: &[((usize, usize), &Pool, &Host)]) -> Vec<bool> {
        let now = std::time::Instant::now();
        let key = |p: &Pool, h: &Host| format!("{}/{}", p.name, h.name);
        let known = self.liveness.lock().map(|m| m.clone()).unwrap_or_default();
        let due: Vec<usize> = (0..held.len())
            .filter(|&i| {
                let (_, p, h) = held[i];
                known
                    .get(&key(p, h))
                    .is_none_or(|l| now.duration_since(l.probed) >= PROBE_EVERY)
            })
            .collect();
        let answers = probe::reachable(&due.iter().map(|&i| held[i].2).collect::<Vec<_>>());
        let mut m = self.liveness.lock().unwrap_or_else(|e| e.into_inner());
        for (&i, answered) in due.iter().zip(answers) {
            let (_, p, h) = held[i];
            let k = key(p, h);
            let last_answer = if answered {
                Some(now)
            } else {
                m.get(&k).and_then(|l| l.last_answer)
            };
            m.insert(
                k,
                Liveness {
                    probed: now,
                    answered,
                    last_answer,
                },
            );
        }
        held.iter()
            .map(|(_, p, h)| match m.get(&key(p, h)) {
                Some(l) if !l.answered => l
                    .last_answer
                    .is_some_and(|t| now.duration_since(t) < LOST_AFTER),
                _ => true,
            })
            .collect()
    }

    /// Releases every host of the cluster (blocking).
    pub(crate) fn terminate_now(&self, cluster: &ClusterName) -> Result<()> {
        self.release_where(cluster, |_| true)
    }

    /// Releases the cluster's hosts whose ids (`pool/host`) are in `ids`
    /// (blocking); its other hosts stay held.
    pub(crate) fn release_now(&self, cluster: &ClusterName, ids: &[String]) -> Result<()> {
        self.release_where(cluster, |a| ids.contains(&format!("{}/{}", a.pool, a.host)))
    }

    /// Releases these lost hosts of the cluster, each resting for
    /// [`REST`] first: a replacement must not take a host back that was
    /// just lost (a draining host still answers SSH).
    fn release_lost(&self, cluster: &ClusterName, ids: &[String]) -> Result<()> {
        {
            let lock = self
                .store
                .lock()
                .map_err(|e| error(ErrorKind::Fatal, "", format!("taking the lock: {e}")))?;
            let until = now_ms() + REST.as_millis() as u64;
            for id in ids {
                if let Some((pool, host)) = id.split_once('/') {
                    lock.rest(&file_name(pool, host), until).map_err(|e| {
                        error(
                            ErrorKind::Fatal,
                            pool,
                            format!("writing a resting record for {id}: {e}"),
                        )
                    })?;
                }
            }
        }
        self.release_now(cluster, ids)
    }

    /// Releases the cluster's hosts whose allocation `which` picks.
    fn release_where(&self, cluster: &ClusterName, which: impl Fn(&Alloc) -> bool) -> Result<()> {
        let lock = self
            .store
            .lock()
            .map_err(|e| error(ErrorKind::Fatal, "", format!("taking the lock: {e}")))?;
        let allocs = lock.read_all().map_err(|e| {
            error(
                ErrorKind::Fatal,
                "",
                format!("reading allocation records: {e}"),
            )
        })?;
        for (f, a) in allocs
            .iter()
            .filter(|(_, a)| a.cluster == cluster.0 && which(a))
        {
            lock.remove(f).map_err(|e| {
                error(
                    ErrorKind::Fatal,
                    &format!("{}/{}", a.pool, a.zone),
                    format!("releasing {}/{}: {e}", a.pool, a.host),
                )
            })?;
        }
        Ok(())
    }

    fn cluster_allocs(&self, cluster: &ClusterName) -> Result<Vec<(String, Alloc)>> {
        let lock = self
            .store
            .lock()
            .map_err(|e| error(ErrorKind::Fatal, "", format!("taking the lock: {e}")))?;
        let allocs = lock.read_all().map_err(|e| {
            error(
                ErrorKind::Fatal,
                "",
                format!("reading allocation records: {e}"),
            )
        })?;
        Ok(allocs
            .into_iter()
            .filter(|(_, a)| a.cluster == cluster.0)
            .collect())
    }

    fn check_now(&self) -> CheckReport {
        let hosts: usize = self.pools.iter().map(|p| p.hosts.len()).sum();
        CheckReport {
            ok: hosts > 0,
            identity: Some(format!("{hosts} host{}", if hosts == 1 { "" } else { "s" })),
            regions: self.pools.iter().map(|p| p.name.clone()).collect(),
            hint: (hosts == 0)
                .then(|| "list machines under `pools:` in $GANGWAY_HOME/ssh_pools.yaml".into()),
        }
    }
}

/// The node fact naming a host's drain file ([`Host::drain_file`]).
const DRAIN_FILE: &str = "pool.drain_file";

/// How long a host removed from a cluster as lost (it stopped answering,
/// or its drain file gave notice) is not allocated again: long enough
/// that the replacement, and a whole-gang recovery after it, go
/// elsewhere; short enough that a host back from a reboot rejoins the
/// pool without anyone's help.
pub const REST: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The command that asks a pool host whether its drain file is there
/// (`~/` is the login's home): the file's first line after
/// [`gangway_provider::NOTICE_MARK`], or nothing.
fn drain_probe(node: &NodeRow) -> Option<String> {
    let f = node.extra.get(DRAIN_FILE)?;
    Some(format!(
        "f={}; case \"$f\" in \"~/\"*) f=\"$HOME/${{f#\"~/\"}}\" ;; esac; \
         if [ -e \"$f\" ]; then w=$(head -n 1 \"$f\" 2>/dev/null | tr -d '\\r'); \
         printf '%s%s\\n' {} \"the pool's host is draining ($f): ${{w:-no reason given}}\"; fi; true",
        gangway_provider::sh_quote(f),
        gangway_provider::NOTICE_MARK
    ))
}

/// A host's zone: its label, or the pool's name.
fn zone_of(pool: &Pool, h: &Host) -> String {
    h.zone.clone().unwrap_or_else(|| pool.name.clone())
}

/// An allocated host of the inventory, as a running node.
fn node(pool: &Pool, h: &Host) -> Node {
    let ty = SshPools::instance_type(&pool.name, h);
    let mut extra = BTreeMap::new();
    SshEndpoint {
        host: h.address.clone(),
        port: h.port,
        user: h.user.clone(),
        key: h.key.as_ref().map(PathBuf::from),
        jump: h.jump.clone(),
    }
    .record(&mut extra);
    let gpus = h.gpu.as_ref().map_or(0, |g| g.1);
    extra.insert("gpus".to_string(), gpus.to_string());
    extra.insert("instance_type".to_string(), ty);
    extra.insert("pool".to_string(), pool.name.clone());
    if let Some(f) = &h.drain_file {
        extra.insert(DRAIN_FILE.to_string(), f.clone());
    }
    Node {
        id: InstanceId(format!("{}/{}", pool.name, h.name)),
        state: NodeState::Running,
        private_ip: h.address.clone(),
        public_ip: None,
        placement: Placement {
            cloud: NAME.to_string(),
            region: pool.name.clone(),
            zone: zone_of(pool, h),
        },
        topology: h.topology.clone(),
        extra,
    }
}

/// A host still allocated but gone from the inventory, from its record.
/// Why a held host counts as lost: it did not answer (the probe's words).
fn unanswered(h: &Host) -> String {
    let within = probe::TIMEOUT.as_secs();
    match h.jump.as_deref() {
        Some(j) => format!(
            "the pool's host {} stopped answering: no SSH answer from its jump host {j} within {within} s",
            h.name
        ),
        None => format!(
            "the pool's host {} stopped answering: no SSH answer from {}:{} within {within} s",
            h.name, h.address, h.port
        ),
    }
}

fn terminated(a: &Alloc) -> Node {
    let mut extra = BTreeMap::new();
    SshEndpoint::new(a.address.clone(), "").record(&mut extra);
    extra.insert("instance_type".to_string(), a.instance_type.clone());
    extra.insert("pool".to_string(), a.pool.clone());
    Node {
        id: InstanceId(format!("{}/{}", a.pool, a.host)),
        state: NodeState::Terminated,
        private_ip: a.address.clone(),
        public_ip: None,
        placement: Placement {
            cloud: NAME.to_string(),
            region: a.pool.clone(),
            zone: if a.zone.is_empty() {
                a.pool.clone()
            } else {
                a.zone.clone()
            },
        },
        topology: Vec::new(),
        extra,
    }
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn error(kind: ErrorKind, location: &str, message: String) -> ProviderError {
    ProviderError::new(kind, NAME, location, message)
}

const NOT_STOPPED: &str =
    "machines in an ssh pool are not stopped or started by gangway; use down to release them";

/// The ssh pools in the core's registry: there when
/// `$GANGWAY_HOME/ssh_pools.yaml` lists machines (a broken file is
/// reported where the catalog is loaded), allocations recorded under
/// `$GANGWAY_HOME/ssh_pools`.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: NAME,
    build: |s| {
        let inv = inventory::load(s.home).ok()??;
        Some(Arc::new(SshPools::new(
            s.home.join("ssh_pools"),
            inv.pools(),
        )))
    },
    capacity: |home| Ok(inventory::load(home)?.map(|inv| inv.capacity())),
    hosts_controller: false,
    stores: &[],
};

#[async_trait::async_trait]
impl Provider for SshPools {
    /// Pool machines were up before the cluster: the first contact waits a
    /// minute, not a VM's boot.
    fn first_contact_wait(&self) -> std::time::Duration {
        std::time::Duration::from_secs(60)
    }

    /// The pool's first host in inventory order.
    fn configured_host(&self, region: &str) -> Option<SshEndpoint> {
        let pool = self.pools.iter().find(|p| p.name == region)?;
        let h = pool.hosts.first()?;
        Some(SshEndpoint {
            host: h.address.clone(),
            port: h.port,
            user: h.user.clone(),
            key: h.key.as_ref().map(PathBuf::from),
            jump: h.jump.clone(),
        })
    }

    /// A pool machine that refuses gangway's key refuses for good.
    fn key_refusal_grace(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Pool machines are the same machines cluster after cluster: their
    /// host keys are learnt once.
    fn hosts_outlive_clusters(&self) -> bool {
        true
    }

    /// Pool machines stay after a cluster: a teardown kills what the
    /// cluster still runs on them before they are released.
    fn machines_outlive_clusters(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        NAME
    }

    async fn check(&self) -> Result<CheckReport> {
        Ok(self.check_now())
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let this = self.clone();
        let req = req.clone();
        off_thread(move || this.launch_now(&req)).await
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let this = self.clone();
        let cluster = cluster.clone();
        off_thread(move || this.describe_now(&cluster)).await
    }

    async fn stop(&self, _cluster: &ClusterName) -> Result<()> {
        Err(error(ErrorKind::InvalidRequest, "", NOT_STOPPED.into()))
    }

    fn cannot_stop(&self, _use_spot: bool) -> Option<&'static str> {
        Some("machines in an SSH pool cannot be stopped by gangway; use --down to release them")
    }

    async fn start(
        &self,
        _cluster: &ClusterName,
        _provider_config: Option<&serde_json::Value>,
    ) -> Result<Vec<Node>> {
        Err(error(ErrorKind::InvalidRequest, "", NOT_STOPPED.into()))
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let this = self.clone();
        let cluster = cluster.clone();
        off_thread(move || this.terminate_now(&cluster)).await
    }

    fn notice_probe(&self, node: &NodeRow) -> Option<String> {
        // Pools have no spot market: a host's operator posts the notice,
        // by creating the host's drain file.
        drain_probe(node)
    }

    fn cannot_replace_nodes(&self) -> Option<&'static str> {
        // A launch keeps the cluster's hosts and takes only the shortfall
        // from the free, reachable hosts of the same pool, zone and type.
        None
    }

    async fn remove_nodes(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        let this = self.clone();
        let cluster = cluster.clone();
        let ids: Vec<String> = ids.iter().map(|i| i.0.clone()).collect();
        off_thread(move || this.release_lost(&cluster, &ids)).await
    }
}

/// Runs blocking work on a thread of its own and waits for it without
/// blocking the caller's executor (this crate has no runtime of its own).
/// A caller that stops waiting leaves the work to finish on its own (every
/// call is idempotent). Without a thread to spare, runs it here.
async fn off_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    use std::future::Future;
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll, Waker};

    type Outcome<T> = std::thread::Result<T>;
    struct Shared<T> {
        out: Option<Outcome<T>>,
        waker: Option<Waker>,
    }
    struct Wait<T>(Arc<Mutex<Shared<T>>>);
    impl<T> Future for Wait<T> {
        type Output = T;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
            let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match s.out.take() {
                Some(Ok(v)) => Poll::Ready(v),
                Some(Err(panic)) => resume_unwind(panic),
                None => {
                    s.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        }
    }

    let shared = Arc::new(Mutex::new(Shared {
        out: None,
        waker: None,
    }));
    let theirs = Arc::clone(&shared);
    // The closure goes to the thread, or comes back if there is none.
    let slot = Arc::new(Mutex::new(Some(f)));
    let their_slot = Arc::clone(&slot);
    let spawned = std::thread::Builder::new()
        .name("gangway-ssh".into())
        .spawn(move || {
            let f = their_slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            let Some(f) = f else { return };
            let out = catch_unwind(AssertUnwindSafe(f));
            let mut s = theirs.lock().unwrap_or_else(|e| e.into_inner());
            s.out = Some(out);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
    if spawned.is_err() {
        let f = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(f) = f {
            return f();
        }
    }
    Wait(shared).await
}
