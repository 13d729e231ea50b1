//! The ssh pools inventory, `$GANGWAY_HOME/ssh_pools.yaml`: machines you
//! already have, offered to the optimizer at no cost and allocated like
//! cloud nodes by the `ssh` provider.
//!
//! ```yaml
//! pools:
//!   lab:                      # infra: ssh/lab
//!     defaults:               # optional, for every host of the pool
//!       user: ubuntu
//!       key: ~/.ssh/lab_ed25519
//!       gpus: A100:8
//!       cpus: 64
//!       memory: 512           # GiB
//!     hosts:
//!       - address: 10.0.0.11
//!         name: gpu1          # default: the address
//!         port: 22
//!         jump: bastion.example.com
//!         topology: spine1/leaf1
//!         zone: rack1         # default: the pool's name
//!       - 10.0.0.12           # an address alone takes the defaults
//! ```

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use gangway_provider::{Capacity, Offer, DEFAULT_CPUS, DEFAULT_MEMORY_GIB};
use gangway_yaml::{self as yaml, expand_home, Cx, Kind, LocatedError as SpecError, Node};

use crate::{Host, Pool};

/// A host with the sizes the optimizer needs.
#[derive(Clone, Debug)]
pub struct Sized {
    /// The host.
    pub host: Host,
    /// vCPUs.
    pub cpus: f32,
    /// Memory, GiB.
    pub memory_gib: f32,
}

/// The parsed inventory.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    /// Pools, in file order.
    pub pools: Vec<(String, Vec<Sized>)>,
    /// Where it was read from.
    pub path: PathBuf,
}

/// Where the inventory lives.
pub fn path(home: &Path) -> PathBuf {
    home.join("ssh_pools.yaml")
}

#[derive(Clone, Default)]
struct Defaults {
    user: Option<String>,
    port: Option<u16>,
    key: Option<String>,
    jump: Option<String>,
    gpus: Option<(String, u32)>,
    cpus: Option<f32>,
    memory: Option<f32>,
    zone: Option<String>,
    topology: Option<Vec<String>>,
    drain_file: Option<String>,
}

const HOST_KEYS: &[&str] = &[
    "address",
    "name",
    "port",
    "user",
    "key",
    "jump",
    "gpus",
    "cpus",
    "memory",
    "topology",
    "zone",
    "drain_file",
];

fn apply(cx: &Cx<'_>, d: &mut Defaults, key: &str, v: &Node, field: &str) -> Result<(), SpecError> {
    let text = cx.text(v, field)?;
    match key {
        "user" => d.user = Some(text),
        "port" => {
            d.port =
                Some(text.parse().map_err(|_| {
                    cx.err(v, field, format!("'{text}' is not a port number"), None)
                })?)
        }
        "key" => d.key = Some(expand_home(&text)),
        "jump" => d.jump = Some(text),
        "gpus" => {
            let (name, count) = match text.split_once(':') {
                Some((n, c)) => (n.to_string(), c.trim().parse::<u32>().ok()),
                None => (text.clone(), Some(1)),
            };
            let Some(count) = count.filter(|c| *c > 0) else {
                return Err(cx.err(
                    v,
                    field,
                    format!("'{text}' is not NAME:COUNT"),
                    Some("write e.g. gpus: A100:8"),
                ));
            };
            d.gpus = Some((name, count));
        }
        "cpus" | "memory" => {
            let n: f32 = text
                .trim_end_matches("GB")
                .parse()
                .map_err(|_| cx.err(v, field, format!("'{text}' is not a number"), None))?;
            if key == "cpus" {
                d.cpus = Some(n)
            } else {
                d.memory = Some(n)
            }
        }
        "zone" => d.zone = Some(text),
        "drain_file" => d.drain_file = Some(text),
        "topology" => {
            d.topology = Some(
                text.split('/')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            )
        }
        _ => unreachable!("checked against HOST_KEYS"),
    }
    Ok(())
}

/// Parses inventory text.
pub fn parse(text: &str, file: &str) -> Result<Inventory, SpecError> {
    let cx = Cx { file };
    let docs = yaml::parse(text).map_err(|e| SpecError::from_yaml(file, e))?;
    let mut inv = Inventory {
        path: PathBuf::from(file),
        ..Inventory::default()
    };
    let Some(root) = docs.docs.first() else {
        return Ok(inv);
    };
    if matches!(root.kind, Kind::Null) {
        return Ok(inv);
    }
    for (k, v) in cx.map(root, "")? {
        let key = cx.key(k, "")?;
        if key != "pools" {
            return Err(cx.unknown(k, "", &key, &["pools"]));
        }
        for (pk, pv) in cx.map(v, "pools")? {
            let pool = cx.key(pk, "pools")?;
            let pfield = format!("pools.{pool}");
            let mut defaults = Defaults::default();
            let mut hosts: Vec<Sized> = Vec::new();
            // Names so far: a set, as a scan of `hosts` per host made
            // 40,000 hosts take 15 s.
            let mut names: HashSet<String> = HashSet::new();
            let mut hosts_node = None;
            for (fk, fv) in cx.map(pv, &pfield)? {
                match cx.key(fk, &pfield)?.as_str() {
                    "defaults" => {
                        for (dk, dv) in cx.map(fv, &format!("{pfield}.defaults"))? {
                            let key = cx.key(dk, &pfield)?;
                            let field = format!("{pfield}.defaults.{key}");
                            if key == "address"
                                || key == "name"
                                || !HOST_KEYS.contains(&key.as_str())
                            {
                                return Err(cx.unknown(dk, &field, &key, &HOST_KEYS[2..]));
                            }
                            apply(&cx, &mut defaults, &key, dv, &field)?;
                        }
                    }
                    "hosts" => hosts_node = Some(fv),
                    other => return Err(cx.unknown(fk, &pfield, other, &["defaults", "hosts"])),
                }
            }
            let Some(hn) = hosts_node else {
                return Err(cx.err(
                    pv,
                    &pfield,
                    "a pool needs hosts",
                    Some("add hosts: [10.0.0.11, ...]"),
                ));
            };
            let Kind::Seq(items) = &hn.kind else {
                return Err(cx.err(
                    hn,
                    &format!("{pfield}.hosts"),
                    format!("expected a list, found {}", hn.describe()),
                    None,
                ));
            };
            for (i, item) in items.iter().enumerate() {
                let field = format!("{pfield}.hosts[{i}]");
                let mut d = defaults.clone();
                let (address, name) = match &item.kind {
                    Kind::Scalar { text, .. } => (text.clone(), None),
                    Kind::Map(m) => {
                        let mut address = None;
                        let mut name = None;
                        for (hk, hv) in m {
                            let key = cx.key(hk, &field)?;
                            let f = format!("{field}.{key}");
                            match key.as_str() {
                                "address" => address = Some(cx.text(hv, &f)?),
                                "name" => name = Some(cx.text(hv, &f)?),
                                k if HOST_KEYS.contains(&k) => apply(&cx, &mut d, k, hv, &f)?,
                                k => return Err(cx.unknown(hk, &field, k, HOST_KEYS)),
                            }
                        }
                        let Some(address) = address else {
                            return Err(cx.err(
                                item,
                                &format!("{field}.address"),
                                "missing field 'address'",
                                None,
                            ));
                        };
                        (address, name)
                    }
                    _ => {
                        return Err(cx.err(
                            item,
                            &field,
                            format!(
                                "expected an address or a mapping, found {}",
                                item.describe()
                            ),
                            None,
                        ))
                    }
                };
                let name = name.unwrap_or_else(|| address.clone());
                if !names.insert(name.clone()) {
                    return Err(cx.err(
                        item,
                        &field,
                        format!("host '{name}' is listed twice in pool {pool}"),
                        None,
                    ));
                }
                hosts.push(Sized {
                    host: Host {
                        name,
                        address,
                        port: d.port.unwrap_or(22),
                        user: d.user.unwrap_or_else(|| "root".into()),
                        key: d.key,
                        jump: d.jump,
                        gpu: d.gpus,
                        topology: d.topology.unwrap_or_default(),
                        zone: d.zone,
                        drain_file: d.drain_file,
                    },
                    cpus: d.cpus.unwrap_or(DEFAULT_CPUS),
                    memory_gib: d.memory.unwrap_or(DEFAULT_MEMORY_GIB),
                });
            }
            inv.pools.push((pool, hosts));
        }
    }
    Ok(inv)
}

/// Reads `$GANGWAY_HOME/ssh_pools.yaml`; `None` when there is none.
pub fn load(home: &Path) -> Result<Option<Inventory>, SpecError> {
    let p = path(home);
    let Ok(text) = std::fs::read_to_string(&p) else {
        return Ok(None);
    };
    parse(&text, &p.display().to_string()).map(Some)
}

impl Inventory {
    /// The pools as the provider wants them.
    pub fn pools(&self) -> Vec<Pool> {
        self.pools
            .iter()
            .map(|(name, hosts)| Pool {
                name: name.clone(),
                hosts: hosts.iter().map(|h| h.host.clone()).collect(),
            })
            .collect()
    }

    /// One offer per (pool, zone, instance type), at no cost, on-demand
    /// only: what the `ssh` cloud gives the catalog.
    pub fn capacity(&self) -> Capacity {
        let mut offers: Vec<Offer> = Vec::new();
        // (pool, zone, type) offered so far: a set, as a scan of the
        // offerings per host made 38,000 hosts in as many zones take minutes.
        let mut offered: HashSet<(&str, String, String)> = HashSet::new();
        for (pool, hosts) in &self.pools {
            for h in hosts {
                let ty = crate::SshPools::instance_type(pool, &h.host);
                let zone = h.host.zone.clone().unwrap_or_else(|| pool.clone());
                if !offered.insert((pool.as_str(), zone.clone(), ty.clone())) {
                    continue;
                }
                offers.push(Offer {
                    instance_type: ty,
                    accelerator: h.host.gpu.as_ref().map(|g| g.0.clone()),
                    accelerator_count: h.host.gpu.as_ref().map_or(0.0, |g| g.1 as f32),
                    vcpus: h.cpus,
                    memory_gib: h.memory_gib,
                    region: pool.clone(),
                    zone,
                    price: 0.0,
                });
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

    const INV: &str = "pools:\n  lab:\n    defaults:\n      user: ubuntu\n      gpus: A100:8\n      cpus: 64\n    hosts:\n      - address: 10.0.0.11\n        name: gpu1\n        topology: spine1/leaf1\n        zone: rack1\n      - 10.0.0.12\n  cpu:\n    hosts: [10.0.1.1]\n";

    #[test]
    fn pools_hosts_and_defaults_parse() {
        let inv = parse(INV, "ssh_pools.yaml").unwrap();
        assert_eq!(inv.pools.len(), 2);
        let (name, hosts) = &inv.pools[0];
        assert_eq!(name, "lab");
        assert_eq!(hosts[0].host.name, "gpu1");
        assert_eq!(hosts[0].host.user, "ubuntu");
        assert_eq!(hosts[0].host.gpu, Some(("A100".into(), 8)));
        assert_eq!(hosts[0].host.topology, ["spine1", "leaf1"]);
        assert_eq!(hosts[0].host.zone.as_deref(), Some("rack1"));
        assert_eq!(hosts[1].host.name, "10.0.0.12");
        assert_eq!((hosts[1].host.port, hosts[1].cpus), (22, 64.0));
        assert_eq!(inv.pools[1].1[0].host.user, "root");
    }

    #[test]
    fn the_catalog_offers_pool_hosts_for_free_on_demand() {
        let c = parse(INV, "ssh_pools.yaml").unwrap().capacity();
        let offers = &c.offers;
        assert_eq!(offers.len(), 3, "{offers:?}");
        assert_eq!(c.origin, "ssh_pools.yaml");
        assert!(offers.iter().all(|o| o.price == 0.0));
        assert!(offers
            .iter()
            .any(|o| o.region == "lab" && o.zone == "rack1" && o.accelerator_count == 8.0));
    }

    #[test]
    fn mistakes_are_located_and_named() {
        let e = parse(
            "pools:\n  lab:\n    hosts:\n      - adress: 10.0.0.1\n",
            "p.yaml",
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("p.yaml:4:9: pools.lab.hosts[0]: unknown field 'adress'"),
            "{s}"
        );
        assert!(s.contains("did you mean 'address'?"), "{s}");
        let e = parse(
            "pools:\n  lab:\n    hosts:\n      - address: a\n        gpus: A100:x\n",
            "p.yaml",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("gpus: 'A100:x' is not NAME:COUNT"),
            "{e}"
        );
        let e = parse("pools:\n  lab:\n    hosts: [a, a]\n", "p.yaml").unwrap_err();
        assert!(e.to_string().contains("listed twice"), "{e}");
    }

    /// Found with hand-made inputs while fuzzing the inventory: names and
    /// offerings were checked for duplicates by scanning all before them,
    /// so 38,000 hosts each in a zone of its own (1.5 MB) took minutes to
    /// read, on every launch.
    #[test]
    fn many_hosts_take_linear_time() {
        let n = 30_000;
        let mut text = String::from("pools:\n  lab:\n    hosts:\n");
        for i in 0..n {
            text.push_str(&format!("      - {{address: h{i}, zone: z{i}}}\n"));
        }
        let start = std::time::Instant::now();
        let inv = parse(&text, "p.yaml").unwrap();
        assert_eq!(inv.capacity().offers.len(), n);
        let took = start.elapsed();
        // Linear: well under a second in a release build, a few in debug.
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
        text.push_str("      - h7\n");
        let e = parse(&text, "p.yaml").unwrap_err();
        assert!(e.to_string().contains("host 'h7' is listed twice"), "{e}");
    }
}
