//! SSH pools keep the provider contract (`gangway_test::contract`): a pool
//! of hosts that are ports on loopback greeting as SSH servers do (a launch
//! only probes that a host's SSH port answers; no sshd is involved), and
//! the allocation records under the provider's root as what it holds.

use std::path::PathBuf;

use gangway_provider::{ClusterName, ErrorKind, LaunchRequest, Provider};
use gangway_ssh::{Host, Pool, SshPools};
use gangway_test::contract::{self, placement, Harness, Next, Resource, Unsupported};
use gangway_test::net::{ClosedPort, SshGreeter};
use serde_json::Value;

const POOL: &str = "ct";
const ZONE: &str = "rack1";

struct Pools {
    p: SshPools,
    root: PathBuf,
    /// The instance type the next request asks for (a failure on demand
    /// is a request this inventory cannot meet).
    next_type: Next<String>,
    _listeners: Vec<SshGreeter>,
    _down: ClosedPort,
    _home: tempfile::TempDir,
}

fn host(name: &str, port: u16, gpu: Option<(&str, u32)>) -> Host {
    Host {
        name: name.into(),
        address: "127.0.0.1".into(),
        port,
        user: "root".into(),
        key: None,
        jump: None,
        gpu: gpu.map(|(g, n)| (g.to_string(), n)),
        topology: Vec::new(),
        zone: Some(ZONE.into()),
        drain_file: None,
    }
}

impl Pools {
    fn new() -> Pools {
        let home = tempfile::tempdir().unwrap();
        let root = home.path().join("ssh_pools");
        let mut listeners = Vec::new();
        let mut hosts = Vec::new();
        for name in ["h1", "h2", "h3"] {
            let l = SshGreeter::start();
            hosts.push(host(name, l.port, None));
            listeners.push(l);
        }
        // The only A100 host is down: asking for it is out of capacity.
        let down = ClosedPort::hold();
        hosts.push(host("down", down.port, Some(("A100", 8))));
        let pools = vec![Pool {
            name: POOL.into(),
            hosts,
        }];
        Pools {
            p: SshPools::new(&root, pools),
            root,
            next_type: Next::default(),
            _listeners: listeners,
            _down: down,
            _home: home,
        }
    }
}

impl Harness for Pools {
    fn provider(&self) -> &dyn Provider {
        &self.p
    }

    fn owner(&self) -> String {
        "gw-00000000000c0de2".into()
    }

    fn request(&self, cluster: &ClusterName, count: u32, client_token: &str) -> LaunchRequest {
        let ty = self
            .next_type
            .take()
            .unwrap_or_else(|| format!("{POOL}.cpu"));
        contract::request(
            cluster,
            count,
            client_token,
            &self.owner(),
            placement("ssh", POOL, ZONE),
            ty,
        )
    }

    fn fail_midway(&self, _cluster: &ClusterName) -> Result<contract::Midway, Unsupported> {
        Err(Unsupported(
            "a launch allocates every host or none under one lock (unit test \
             capacity_error_lists_busy_and_unreachable_and_allocates_nothing); only a crash \
             between two records leaves part of a cluster, and terminate removes every record \
             of the cluster (a_half_written_record_is_swept)"
                .into(),
        ))
    }

    fn fail_with(&self, _cluster: &ClusterName, kind: ErrorKind) -> Result<(), Unsupported> {
        let ty =
            match kind {
                ErrorKind::Capacity => format!("{POOL}.a100x8"),
                ErrorKind::InvalidRequest => format!("{POOL}.nosuch"),
                _ => return Err(Unsupported(
                    "machines in a pool have no quota, and credentials are SSH's at first contact"
                        .into(),
                )),
            };
        self.next_type.set(ty);
        Ok(())
    }

    fn clear_failures(&self, _cluster: &ClusterName) {
        self.next_type.take();
    }

    fn leftovers(&self, cluster: &ClusterName) -> Vec<Resource> {
        let Ok(dir) = std::fs::read_dir(self.root.join("alloc")) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| {
                let text = std::fs::read_to_string(e.path()).ok()?;
                let rec: Value = serde_json::from_str(&text).ok()?;
                (rec["cluster"] == cluster.0.as_str()).then(|| Resource {
                    kind: "allocation".into(),
                    id: e.file_name().to_string_lossy().into_owned(),
                    cluster: rec["cluster"].as_str().map(String::from),
                    owner: rec["owner"].as_str().map(String::from),
                })
            })
            .collect()
    }

    fn lists_clusters(&self) -> bool {
        false
    }

    fn other_owner(&self) -> Result<(Box<dyn Provider>, String), Unsupported> {
        Err(Unsupported(
            "allocation records belong to one $GANGWAY_HOME, which has one owner id".into(),
        ))
    }
}

#[tokio::test]
async fn ssh_pools_keep_the_provider_contract() {
    contract::run(&Pools::new()).await;
}
