//! The Azure provider: Spot (and regular) VMs through Azure Resource
//! Manager.
//!
//! A cluster gets one resource group per location
//! (`gw-<cluster>-<location>-<owner hash>`), tagged like everything in it
//! with `gangway-cluster`, `gangway-owner` and `gangway-user`: a network
//! security group admitting SSH from this machine's address only, a
//! virtual network whose subnet sits behind it, a proximity placement
//! group for gangs of more than one node, and per node a static public
//! address, a NIC (accelerated networking where the size has it) and the
//! VM (`priority: Spot`, eviction policy `Delete`, max price -1 unless the
//! task caps it), whose OS disk and NIC go with it. Launch reconciles:
//! fitting VMs of the cluster are kept, others deleted, only the shortfall
//! made; a failed launch deletes what it made. Teardown deletes the
//! resource groups and forgets the cluster only when ARM says they are
//! gone.
//!
//! Credentials and subscription: [`auth`]. `GANGWAY_AZURE_ENDPOINT`
//! points ARM (and, for a loopback one, the token endpoint) elsewhere;
//! `GANGWAY_AZURE_SSH_CIDR` replaces this machine's address in the SSH
//! rule.
#![deny(missing_docs)]

pub mod arm;
pub mod auth;
mod errors;
pub mod models;
mod notice;
pub mod prices;
mod record;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeState, Placement,
    Prices, Provider, ProviderError, Result, TaggedCluster,
};
use serde_json::Value;

use arm::{Arm, ArmError, API_COMPUTE, API_NETWORK, API_RESOURCES, API_SKUS, API_SUBSCRIPTIONS};
pub use errors::classify;
use models::*;
pub use notice::{preempt_notice_probe, PREEMPT_WATCHER};
use record::{Record, Records, VmRecord};

/// Tag naming the cluster on every resource.
pub const TAG_CLUSTER: &str = "gangway-cluster";
/// Tag naming the gangway installation that launched it (its owner id).
pub const TAG_OWNER: &str = "gangway-owner";
/// Tag naming the user who launched it, for people.
pub const TAG_USER: &str = "gangway-user";

/// What a node reports when Azure evicted it.
pub const EVICTED: &str = "evicted by Azure (Spot)";

/// The VM's admin user unless the task says otherwise.
const ADMIN_USER: &str = "gangway";

/// How long a launch waits for VMs that an earlier launch of the cluster
/// (killed, or timed out) left being created, before it reconciles.
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20 * 60);

/// How often it looks at them meanwhile.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// The locations where some VM size with GPUs is not restricted for the
/// subscription, from a resource SKU list (`Microsoft.Compute/skus`),
/// sorted.
pub fn gpu_locations(skus: &[Value]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for s in skus {
        let gpus = s["capabilities"].as_array().is_some_and(|caps| {
            caps.iter().any(|c| {
                c["name"] == "GPUs"
                    && c["value"]
                        .as_str()
                        .and_then(|v| v.parse::<f64>().ok())
                        .is_some_and(|n| n > 0.0)
            })
        });
        if s["resourceType"] != "virtualMachines" || !gpus {
            continue;
        }
        let restricted = |loc: &str| {
            s["restrictions"].as_array().is_some_and(|rs| {
                rs.iter().any(|r| {
                    r["type"] == "Location"
                        && r["values"].as_array().is_some_and(|v| {
                            v.iter()
                                .any(|x| x.as_str().is_some_and(|x| x.eq_ignore_ascii_case(loc)))
                        })
                })
            })
        };
        for loc in s["locations"].as_array().into_iter().flatten() {
            if let Some(l) = loc.as_str() {
                if !restricted(l) {
                    out.insert(l.to_ascii_lowercase());
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The Azure provider.
pub struct AzureProvider {
    owner: String,
    user: Option<String>,
    public_key: PathBuf,
    records: Records,
    arm: tokio::sync::OnceCell<std::result::Result<Arm, String>>,
}

/// The task's `config.azure` section.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureOptions {
    /// The VM's admin user (default `gangway`): the key goes to its home.
    #[serde(default)]
    pub admin_user: Option<String>,
    /// The user gangway logs in as (default: the admin user).
    #[serde(default)]
    pub ssh_user: Option<String>,
    /// Accelerated networking on the NICs: default where the size has it.
    #[serde(default)]
    pub accelerated_networking: Option<bool>,
}

impl AzureOptions {
    fn from_value(v: Option<&Value>) -> std::result::Result<AzureOptions, String> {
        match v {
            None | Some(Value::Null) => Ok(AzureOptions::default()),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("config.azure: {e}")),
        }
    }

    fn admin(&self) -> String {
        self.admin_user.clone().unwrap_or_else(|| ADMIN_USER.into())
    }

    fn login(&self) -> String {
        self.ssh_user.clone().unwrap_or_else(|| self.admin())
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The ARM endpoint (`GANGWAY_AZURE_ENDPOINT`, else Azure's).
fn endpoint() -> String {
    var("GANGWAY_AZURE_ENDPOINT")
        .map(|e| e.trim_end_matches('/').to_string())
        .unwrap_or_else(|| "https://management.azure.com".into())
}

fn is_loopback_http(url: &str) -> bool {
    url.starts_with("http://127.")
        || url.starts_with("http://localhost")
        || url.starts_with("http://[::1]")
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The zone ARM wants (`"1"`) from a placement's zone: `eastus-1`, `1`, or
/// the location itself (or empty) for a VM in no zone.
pub fn zone_of(placement: &Placement) -> Option<String> {
    let z = placement.zone.trim();
    if z.is_empty() || z == placement.region {
        return None;
    }
    let bare = z
        .strip_prefix(&format!("{}-", placement.region))
        .unwrap_or(z);
    Some(bare.to_string())
}

/// The image for a request: by id, `publisher:offer:sku:version`, or the
/// default (Microsoft's Ubuntu HPC image, with NVIDIA drivers, for GPU
/// sizes; plain Ubuntu 22.04 otherwise).
pub fn image_of(req: &LaunchRequest) -> ImageReference {
    let market = |p: &str, o: &str, s: &str, v: &str| ImageReference::Marketplace {
        publisher: p.into(),
        offer: o.into(),
        sku: s.into(),
        version: v.into(),
    };
    match req.image_id.as_deref().map(str::trim) {
        Some(id) if id.starts_with('/') => ImageReference::Id { id: id.into() },
        Some(urn) if urn.split(':').count() == 4 => {
            let p: Vec<&str> = urn.split(':').collect();
            market(p[0], p[1], p[2], p[3])
        }
        _ if req.accelerator.is_some() => market("microsoft-dsvm", "ubuntu-hpc", "2204", "latest"),
        _ => market(
            "Canonical",
            "0001-com-ubuntu-server-jammy",
            "22_04-lts-gen2",
            "latest",
        ),
    }
}

/// An ARM error as the provider contract's, naming where and what; a
/// refusal of credentials names the identity.
fn perr(e: ArmError, loc: &str, what: &str, identity: &str) -> ProviderError {
    let kind = classify(&e.code, &e.message, e.status);
    let message = if kind == ErrorKind::Auth {
        format!("{what}: {e} (as {identity}; `gangway check azure` says what to run)")
    } else {
        format!("{what}: {e}")
    };
    ProviderError::new(kind, "azure", loc, message)
}

fn local_err(message: impl Into<String>) -> ProviderError {
    ProviderError::new(ErrorKind::Fatal, "azure", "", message)
}

/// The last segment of an ARM id.
fn last(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

/// A VM's state from its instance view's status codes.
pub fn state_of(vm: &Value) -> NodeState {
    let spot = vm["properties"]["priority"].as_str() == Some("Spot");
    let statuses = vm["properties"]["instanceView"]["statuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let codes: Vec<&str> = statuses.iter().filter_map(|s| s["code"].as_str()).collect();
    let power = codes
        .iter()
        .find_map(|c| c.strip_prefix("PowerState/"))
        .unwrap_or("");
    let prov = vm["properties"]["provisioningState"].as_str().unwrap_or("");
    if prov.eq_ignore_ascii_case("Failed") || prov.eq_ignore_ascii_case("Deleting") {
        return NodeState::Terminated;
    }
    match power {
        "running" => NodeState::Running,
        // A Spot VM deallocated by Azure (the `Deallocate` policy) was
        // evicted; gangway never deallocates Spot VMs.
        "deallocated" | "deallocating" if spot => NodeState::Preempted {
            reason: format!("{EVICTED}: deallocated"),
        },
        "stopped" | "stopping" | "deallocated" | "deallocating" => NodeState::Stopped,
        _ => NodeState::Pending,
    }
}

/// What every new VM of one launch shares.
pub struct Shape<'a> {
    /// The request.
    pub req: &'a LaunchRequest,
    /// Its `config.azure`.
    pub opts: &'a AzureOptions,
    /// Tags on everything.
    pub tags: &'a Tags,
    /// gangway's public key.
    pub key: &'a str,
    /// The placement group, for gangs.
    pub ppg: Option<&'a str>,
}

impl AzureProvider {
    /// A provider keeping its records under `root`, tagging with `owner`,
    /// and putting `public_key` (an OpenSSH `.pub` file) on its VMs.
    pub fn new(root: PathBuf, owner: impl Into<String>, public_key: PathBuf) -> AzureProvider {
        AzureProvider {
            owner: owner.into(),
            user: None,
            public_key,
            records: Records::new(root.join("clusters")),
            arm: tokio::sync::OnceCell::new(),
        }
    }

    /// The same provider tagging its resources with `user` too.
    pub fn with_user(mut self, user: impl Into<String>) -> AzureProvider {
        self.user = Some(user.into()).filter(|u: &String| !u.is_empty());
        self
    }

    /// The ARM client, made once: credentials and subscription found.
    async fn arm(&self) -> Result<&Arm> {
        let made = self
            .arm
            .get_or_init(|| async {
                let endpoint = endpoint();
                let http = reqwest::Client::builder()
                    .timeout(std::time::Duration::from_secs(120))
                    .build()
                    .map_err(|e| e.to_string())?;
                let loopback = is_loopback_http(&endpoint).then_some(endpoint.as_str());
                let tokens =
                    auth::Tokens::discover(loopback, http.clone()).map_err(|e| e.to_string())?;
                let sub = auth::subscription().map_err(|e| e.to_string())?;
                Ok(Arm::new(endpoint, sub, tokens, http))
            })
            .await;
        made.as_ref()
            .map_err(|e| ProviderError::new(ErrorKind::Auth, "azure", "", e.clone()))
    }

    fn owner_of(&self, cluster: &ClusterName) -> String {
        self.records
            .get(&cluster.0)
            .ok()
            .and_then(|r| r.owner)
            .unwrap_or_else(|| self.owner.clone())
    }

    /// The name of the cluster's `i`-th VM: the owner's hash in it as in
    /// the group's, so that two installations' clusters of one name (in
    /// groups of their own) never have VMs of the same name, and a VM's
    /// name says whose it is.
    pub fn vm_name(&self, cluster: &ClusterName, i: usize) -> String {
        let owner = self.owner_of(cluster);
        format!("gw-{}-{:08x}-{i}", cluster.0, fnv(owner.as_bytes()) as u32)
    }

    /// The cluster's resource group in `location`.
    pub fn group_name(&self, cluster: &ClusterName, location: &str) -> String {
        let owner = self.owner_of(cluster);
        format!(
            "gw-{}-{location}-{:08x}",
            cluster.0,
            fnv(owner.as_bytes()) as u32
        )
    }

    fn tags(&self, cluster: &ClusterName, labels: &BTreeMap<String, String>) -> Tags {
        let mut tags: Tags = labels
            .iter()
            .filter(|(k, _)| ![TAG_CLUSTER, TAG_OWNER, TAG_USER].contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        tags.insert(TAG_CLUSTER.into(), cluster.0.clone());
        tags.insert(TAG_OWNER.into(), self.owner_of(cluster));
        if let Some(u) = &self.user {
            tags.insert(TAG_USER.into(), u.clone());
        }
        tags
    }

    fn record(&self, cluster: &ClusterName) -> Result<Record> {
        self.records
            .get(&cluster.0)
            .map_err(|e| local_err(format!("reading the record of {cluster}: {e}")))
    }

    fn remember(&self, cluster: &ClusterName, f: impl FnOnce(&mut Record)) -> Result<Record> {
        self.records
            .update(&cluster.0, f)
            .map_err(|e| local_err(format!("writing the record of {cluster}: {e}")))
    }

    /// Whether a resource group is this owner's (by its tags).
    fn is_ours(&self, cluster: &ClusterName, group: &Value) -> bool {
        group["tags"][TAG_CLUSTER].as_str() == Some(cluster.0.as_str())
            && group["tags"][TAG_OWNER].as_str() == Some(self.owner_of(cluster).as_str())
    }

    /// The VMs of the group, each with its instance view.
    async fn vms(&self, arm: &Arm, rg: &str, loc: &str) -> Result<Vec<Value>> {
        let base = format!(
            "{}/providers/Microsoft.Compute/virtualMachines",
            arm.group(rg)
        );
        let list = arm
            .list(&base, API_COMPUTE)
            .await
            .map_err(|e| perr(e, loc, "listing VMs", arm.identity()))?;
        let mut out = Vec::new();
        for vm in list {
            let name = vm["name"].as_str().unwrap_or_default();
            let path = format!("{base}/{name}?$expand=instanceView");
            match arm.get(&path, API_COMPUTE).await {
                Ok(Some(v)) => out.push(v),
                Ok(None) => {}
                Err(e) => return Err(perr(e, loc, "reading a VM", arm.identity())),
            }
        }
        out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(out)
    }

    /// The VMs of the group once none is still being created or started
    /// (a `Failed` one counts as ended), or a transient error naming those
    /// that are not after [`SETTLE_TIMEOUT`].
    async fn settled_vms(&self, arm: &Arm, rg: &str, loc: &str) -> Result<Vec<Value>> {
        let deadline = std::time::Instant::now() + SETTLE_TIMEOUT;
        loop {
            let vms = self.vms(arm, rg, loc).await?;
            let pending: Vec<&str> = vms
                .iter()
                .filter(|v| state_of(v) == NodeState::Pending)
                .filter_map(|v| v["name"].as_str())
                .collect();
            if pending.is_empty() {
                return Ok(vms);
            }
            if std::time::Instant::now() > deadline {
                return Err(ProviderError::new(
                    ErrorKind::Transient,
                    "azure",
                    loc,
                    format!(
                        "VMs {} are still being created after {} min",
                        pending.join(", "),
                        SETTLE_TIMEOUT.as_secs() / 60
                    ),
                ));
            }
            tracing::debug!("waiting for VMs being created: {}", pending.join(", "));
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// The node of a VM (its NIC and public address read).
    async fn node(&self, arm: &Arm, vm: &Value, location: &str, rec: &Record) -> Result<Node> {
        let name = vm["name"].as_str().unwrap_or_default().to_string();
        let p = &vm["properties"];
        let mut private_ip = String::new();
        let mut public_ip = None;
        if let Some(nic_id) = p["networkProfile"]["networkInterfaces"][0]["id"].as_str() {
            if let Ok(Some(nic)) = arm.get(nic_id, API_NETWORK).await {
                let ipc = &nic["properties"]["ipConfigurations"][0]["properties"];
                private_ip = ipc["privateIPAddress"].as_str().unwrap_or_default().into();
                if let Some(ip_id) = ipc["publicIPAddress"]["id"].as_str() {
                    if let Ok(Some(ip)) = arm.get(ip_id, API_NETWORK).await {
                        public_ip = ip["properties"]["ipAddress"].as_str().map(str::to_string);
                    }
                }
            }
        }
        let zone = vm["zones"][0]
            .as_str()
            .map(|z| format!("{location}-{z}"))
            .unwrap_or_else(|| location.to_string());
        let spot = p["priority"].as_str() == Some("Spot");
        let size = p["hardwareProfile"]["vmSize"].as_str().unwrap_or_default();
        let mut extra = BTreeMap::new();
        let user = rec.ssh_user.clone().unwrap_or_else(|| ADMIN_USER.into());
        gangway_provider::SshEndpoint::new(public_ip.clone().unwrap_or_default(), user)
            .record(&mut extra);
        extra.insert("instance_type".into(), size.to_string());
        extra.insert(
            "market".into(),
            if spot { "spot" } else { "on-demand" }.into(),
        );
        extra.insert(
            "resource_group".into(),
            vm["id"]
                .as_str()
                .and_then(|id| id.split('/').nth(4))
                .unwrap_or_default()
                .to_string(),
        );
        let view = &p["instanceView"];
        let mut topology = Vec::new();
        if let Some(ppg) = p["proximityPlacementGroup"]["id"].as_str() {
            extra.insert("placement_group".into(), last(ppg).to_string());
            topology.push(format!("ppg:{}", last(ppg)));
        } else {
            topology.push(format!("location:{location}"));
        }
        if let Some(fd) = view["platformFaultDomain"].as_i64() {
            extra.insert("fault_domain".into(), fd.to_string());
            topology.push(format!("fault-domain:{fd}"));
        }
        if let Some(ud) = view["platformUpdateDomain"].as_i64() {
            extra.insert("update_domain".into(), ud.to_string());
        }
        Ok(Node {
            id: InstanceId(name),
            state: state_of(vm),
            private_ip,
            public_ip,
            placement: Placement {
                cloud: "azure".into(),
                region: location.to_string(),
                zone,
            },
            topology,
            extra,
        })
    }

    /// The address SSH is admitted from.
    fn ssh_cidr(&self) -> Result<String> {
        if let Some(c) = var("GANGWAY_AZURE_SSH_CIDR") {
            return Ok(c);
        }
        gangway_provider::my_public_ip()
            .map(|ip| format!("{ip}/32"))
            .map_err(|e| {
                ProviderError::new(
                    ErrorKind::InvalidRequest,
                    "azure",
                    "",
                    format!(
                        "{e}; set GANGWAY_AZURE_SSH_CIDR to the address range SSH may come from"
                    ),
                )
            })
    }

    /// The group, security group, network (and placement group): what
    /// every VM of the cluster in `location` needs. Returns the subnet id
    /// and the placement group id.
    async fn network(
        &self,
        arm: &Arm,
        req: &LaunchRequest,
        rg: &str,
        loc: &str,
        tags: &Tags,
    ) -> Result<(String, Option<String>)> {
        let location = req.placement.region.clone();
        let who = arm.identity();
        let g = arm.group(rg);
        let mut rules = vec![SecurityRule {
            name: "gangway-ssh".into(),
            properties: SecurityRuleProperties {
                protocol: "Tcp".into(),
                access: "Allow".into(),
                direction: "Inbound".into(),
                priority: 1000,
                source_address_prefix: self.ssh_cidr()?,
                source_port_range: "*".into(),
                destination_address_prefix: "*".into(),
                destination_port_range: "22".into(),
            },
        }];
        for (i, (a, b)) in req.ports.iter().enumerate() {
            rules.push(SecurityRule {
                name: format!("gangway-port-{i}"),
                properties: SecurityRuleProperties {
                    protocol: "Tcp".into(),
                    access: "Allow".into(),
                    direction: "Inbound".into(),
                    priority: 1100 + i as i32,
                    source_address_prefix: "*".into(),
                    source_port_range: "*".into(),
                    destination_address_prefix: "*".into(),
                    destination_port_range: if a == b {
                        a.to_string()
                    } else {
                        format!("{a}-{b}")
                    },
                },
            });
        }
        let nsg_path = format!("{g}/providers/Microsoft.Network/networkSecurityGroups/gangway-nsg");
        let nsg = NetworkSecurityGroup {
            location: location.clone(),
            tags: tags.clone(),
            properties: NsgProperties {
                security_rules: rules,
            },
        };
        let nsg = arm
            .put(&nsg_path, API_NETWORK, &json(&nsg))
            .await
            .map_err(|e| perr(e, loc, "creating the network security group", who))?;
        let nsg_id = nsg["id"].as_str().unwrap_or_default().to_string();
        let vnet_path = format!("{g}/providers/Microsoft.Network/virtualNetworks/gangway-vnet");
        let vnet = VirtualNetwork {
            location: location.clone(),
            tags: tags.clone(),
            properties: VnetProperties {
                address_space: AddressSpace {
                    address_prefixes: vec!["10.0.0.0/16".into()],
                },
                subnets: vec![Subnet {
                    name: "default".into(),
                    properties: SubnetProperties {
                        address_prefix: "10.0.0.0/24".into(),
                        network_security_group: SubResource { id: nsg_id },
                    },
                }],
            },
        };
        let vnet = arm
            .put(&vnet_path, API_NETWORK, &json(&vnet))
            .await
            .map_err(|e| perr(e, loc, "creating the virtual network", who))?;
        let subnet = format!(
            "{}/subnets/default",
            vnet["id"].as_str().unwrap_or(vnet_path.as_str())
        );
        let ppg = if req.count > 1 {
            let path =
                format!("{g}/providers/Microsoft.Compute/proximityPlacementGroups/gangway-ppg");
            let body = ProximityPlacementGroup {
                location: location.clone(),
                tags: tags.clone(),
                properties: PpgProperties {
                    proximity_placement_group_type: "Standard".into(),
                },
            };
            let ppg = arm
                .put(&path, API_COMPUTE, &json(&body))
                .await
                .map_err(|e| perr(e, loc, "creating the proximity placement group", who))?;
            Some(ppg["id"].as_str().unwrap_or(path.as_str()).to_string())
        } else {
            None
        };
        Ok((subnet, ppg))
    }

    /// Whether `size` has accelerated networking in `location` (resource
    /// SKUs); `None`: the size is not offered there.
    async fn accelerated(&self, arm: &Arm, location: &str, size: &str) -> Result<Option<bool>> {
        let path = format!(
            "{}/providers/Microsoft.Compute/skus?$filter=location eq '{location}'",
            arm.sub()
        );
        let skus = arm
            .list(&path.replace(' ', "%20").replace('\'', "%27"), API_SKUS)
            .await
            .map_err(|e| perr(e, location, "listing resource SKUs", arm.identity()))?;
        Ok(skus
            .iter()
            .find(|s| {
                s["resourceType"] == "virtualMachines"
                    && s["name"]
                        .as_str()
                        .is_some_and(|n| n.eq_ignore_ascii_case(size))
            })
            .map(|s| {
                s["capabilities"].as_array().is_some_and(|caps| {
                    caps.iter().any(|c| {
                        c["name"] == "AcceleratedNetworkingEnabled"
                            && c["value"]
                                .as_str()
                                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
                    })
                })
            }))
    }

    /// The VM body for one node.
    fn vm_body(&self, shape: &Shape<'_>, name: &str, nic: &str) -> VirtualMachine {
        let Shape {
            req,
            opts,
            tags,
            key,
            ppg,
        } = *shape;
        let admin = opts.admin();
        VirtualMachine {
            location: req.placement.region.clone(),
            tags: tags.clone(),
            zones: zone_of(&req.placement).map(|z| vec![z]),
            properties: VmProperties {
                hardware_profile: HardwareProfile {
                    vm_size: req.instance_type.clone(),
                },
                storage_profile: StorageProfile {
                    image_reference: image_of(req),
                    os_disk: OsDisk {
                        create_option: "FromImage".into(),
                        delete_option: "Delete".into(),
                        disk_size_gb: req.disk_size_gib.map(|g| g as i32),
                        managed_disk: ManagedDisk {
                            storage_account_type: "Premium_LRS".into(),
                        },
                    },
                },
                os_profile: OsProfile {
                    computer_name: name.to_string(),
                    admin_username: admin.clone(),
                    linux_configuration: LinuxConfiguration {
                        disable_password_authentication: true,
                        ssh: SshConfiguration {
                            public_keys: vec![SshPublicKey {
                                path: format!("/home/{admin}/.ssh/authorized_keys"),
                                key_data: key.to_string(),
                            }],
                        },
                    },
                },
                network_profile: NetworkProfile {
                    network_interfaces: vec![NicReference {
                        id: nic.to_string(),
                        properties: NicReferenceProperties {
                            primary: true,
                            delete_option: "Delete".into(),
                        },
                    }],
                },
                proximity_placement_group: ppg.map(|id| SubResource { id: id.to_string() }),
                priority: if req.use_spot { "Spot" } else { "Regular" }.into(),
                eviction_policy: req.use_spot.then(|| "Delete".to_string()),
                billing_profile: req.use_spot.then(|| BillingProfile {
                    max_price: req.max_price.filter(|p| *p > 0.0).unwrap_or(-1.0),
                }),
            },
        }
    }

    /// Makes one node: its public address, NIC and VM.
    async fn make_node(
        &self,
        arm: &Arm,
        shape: &Shape<'_>,
        rg: &str,
        name: &str,
        subnet: &str,
        accelerated: bool,
    ) -> Result<()> {
        let (req, tags) = (shape.req, shape.tags);
        let loc = req.placement.to_string();
        let who = arm.identity();
        let g = arm.group(rg);
        let ip_path = format!("{g}/providers/Microsoft.Network/publicIPAddresses/{name}-ip");
        let ip = PublicIp {
            location: req.placement.region.clone(),
            tags: tags.clone(),
            zones: zone_of(&req.placement).map(|z| vec![z]),
            sku: PublicIpSku {
                name: "Standard".into(),
                tier: "Regional".into(),
            },
            properties: PublicIpProperties {
                public_ip_allocation_method: "Static".into(),
                public_ip_address_version: "IPv4".into(),
            },
        };
        let ip = arm
            .put(&ip_path, API_NETWORK, &json(&ip))
            .await
            .map_err(|e| {
                perr(
                    e,
                    &loc,
                    &format!("creating the public address of {name}"),
                    who,
                )
            })?;
        let nic_path = format!("{g}/providers/Microsoft.Network/networkInterfaces/{name}-nic");
        let nic = NetworkInterface {
            location: req.placement.region.clone(),
            tags: tags.clone(),
            properties: NicProperties {
                enable_accelerated_networking: accelerated,
                ip_configurations: vec![IpConfiguration {
                    name: "ipconfig1".into(),
                    properties: IpConfigurationProperties {
                        subnet: SubResource { id: subnet.into() },
                        public_ip_address: SubResource {
                            id: ip["id"].as_str().unwrap_or(ip_path.as_str()).into(),
                        },
                        private_ip_allocation_method: "Dynamic".into(),
                        primary: true,
                    },
                }],
            },
        };
        let nic = arm
            .put(&nic_path, API_NETWORK, &json(&nic))
            .await
            .map_err(|e| perr(e, &loc, &format!("creating the NIC of {name}"), who))?;
        let nic_id = nic["id"].as_str().unwrap_or(nic_path.as_str()).to_string();
        let vm_path = format!("{g}/providers/Microsoft.Compute/virtualMachines/{name}");
        let body = self.vm_body(shape, name, &nic_id);
        arm.put(&vm_path, API_COMPUTE, &json(&body))
            .await
            .map_err(|e| perr(e, &loc, &format!("creating VM {name}"), who))?;
        Ok(())
    }

    /// Deletes a VM (its OS disk and NIC go with it) and its public address.
    async fn delete_vm(&self, arm: &Arm, rg: &str, name: &str, loc: &str) -> Result<()> {
        let g = arm.group(rg);
        let who = arm.identity();
        arm.delete(
            &format!("{g}/providers/Microsoft.Compute/virtualMachines/{name}"),
            API_COMPUTE,
        )
        .await
        .map_err(|e| perr(e, loc, &format!("deleting VM {name}"), who))?;
        // A NIC of a VM whose creation failed early may not have gone with it.
        for path in [
            format!("{g}/providers/Microsoft.Network/networkInterfaces/{name}-nic"),
            format!("{g}/providers/Microsoft.Network/publicIPAddresses/{name}-ip"),
        ] {
            arm.delete(&path, API_NETWORK)
                .await
                .map_err(|e| perr(e, loc, &format!("deleting {}", last(&path)), who))?;
        }
        Ok(())
    }

    /// Deletes resource group `rg` of the cluster, if it is there and
    /// ours, waiting until ARM says it is gone.
    async fn delete_group(
        &self,
        arm: &Arm,
        cluster: &ClusterName,
        rg: &str,
        loc: &str,
    ) -> Result<()> {
        let who = arm.identity();
        let path = arm.group(rg);
        match arm.get(&path, API_RESOURCES).await {
            Ok(None) => return Ok(()),
            Ok(Some(g)) if !self.is_ours(cluster, &g) => {
                tracing::warn!("resource group {rg} is not this installation's; left alone");
                return Ok(());
            }
            Ok(Some(_)) => {}
            Err(e) => return Err(perr(e, loc, "reading the resource group", who)),
        }
        arm.delete(&path, API_RESOURCES)
            .await
            .map_err(|e| perr(e, loc, &format!("deleting resource group {rg}"), who))
    }

    /// The cluster's resource groups: those of the record's locations, and
    /// any the tags find (a cluster adopted from another installation has
    /// no record here), as `(group, location)`.
    async fn groups(
        &self,
        arm: &Arm,
        cluster: &ClusterName,
        rec: &Record,
    ) -> Result<Vec<(String, String)>> {
        let mut out: BTreeMap<String, String> = rec
            .locations
            .iter()
            .map(|l| (self.group_name(cluster, l).to_ascii_lowercase(), l.clone()))
            .collect();
        let mut names: BTreeMap<String, String> = rec
            .locations
            .iter()
            .map(|l| {
                (
                    self.group_name(cluster, l).to_ascii_lowercase(),
                    self.group_name(cluster, l),
                )
            })
            .collect();
        let path = format!(
            "{}/resourcegroups?$filter=tagName%20eq%20%27{TAG_CLUSTER}%27%20and%20tagValue%20eq%20%27{}%27",
            arm.sub(),
            cluster.0
        );
        let found = arm
            .list(&path, API_RESOURCES)
            .await
            .map_err(|e| perr(e, "", "listing resource groups", arm.identity()))?;
        for g in found.iter().filter(|g| self.is_ours(cluster, g)) {
            if let (Some(name), Some(l)) = (g["name"].as_str(), g["location"].as_str()) {
                out.insert(name.to_ascii_lowercase(), l.to_string());
                names.insert(name.to_ascii_lowercase(), name.to_string());
            }
        }
        Ok(out
            .into_iter()
            .map(|(k, l)| (names.remove(&k).unwrap_or(k), l))
            .collect())
    }
}

/// Azure in the core's registry: on with an owner id to tag with, its
/// records under `records/azure`.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: "azure",
    build: |s| {
        Some(std::sync::Arc::new(
            AzureProvider::new(s.records.join("azure"), s.owner?, s.public_key()).with_user(s.user),
        ))
    },
    capacity: gangway_provider::no_capacity,
    hosts_controller: false,
    stores: &[],
};

#[async_trait::async_trait]
impl Provider for AzureProvider {
    fn name(&self) -> &str {
        "azure"
    }

    fn notice_probe(&self, node: &gangway_provider::NodeRow) -> Option<String> {
        preempt_notice_probe(node)
    }

    fn has_price_api(&self) -> bool {
        true
    }

    /// From the public Retail Prices API ([`prices`]), no credentials.
    async fn prices(&self, instance_types: &[String], regions: &[String]) -> Result<Prices> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(120))
            .build()
            .map_err(|e| local_err(format!("an HTTP client for the Retail Prices API: {e}")))?;
        let endpoint = prices::endpoint();
        let mut out = Prices::default();
        for r in regions {
            let got = prices::region_prices(&http, &endpoint, r, instance_types).await?;
            out.quotes.extend(got.quotes);
            out.notes.extend(got.notes);
        }
        Ok(out)
    }

    async fn check(&self) -> Result<CheckReport> {
        let arm = match self.arm().await {
            Ok(a) => a,
            Err(e) => {
                return Ok(CheckReport {
                    ok: false,
                    identity: None,
                    regions: Vec::new(),
                    hint: Some(e.message),
                })
            }
        };
        let who = arm.identity().to_string();
        match arm.get(&arm.sub(), API_SUBSCRIPTIONS).await {
            Ok(Some(s)) => {
                // Where this subscription may create GPU sizes: the
                // resource SKUs not restricted for it there.
                let path = format!("{}/providers/Microsoft.Compute/skus", arm.sub());
                let (regions, hint) = match arm.list(&path, API_SKUS).await {
                    Ok(skus) => {
                        let r = gpu_locations(&skus);
                        let hint = r.is_empty().then(|| {
                            format!(
                                "subscription {} may create no GPU size in any location \
                                 (every GPU SKU is restricted for it): `az vm list-skus \
                                 --resource-type virtualMachines --all` shows why; request \
                                 access or quota in the portal",
                                arm.subscription
                            )
                        });
                        (r, hint)
                    }
                    Err(e) => (
                        Vec::new(),
                        Some(format!(
                            "cannot list resource SKUs ({e}); the identity needs \
                             Microsoft.Compute/skus/read on subscription {sub} (the Reader \
                             role: `az role assignment create --assignee <identity> --role \
                             Reader --scope /subscriptions/{sub}`)",
                            sub = arm.subscription
                        )),
                    ),
                };
                Ok(CheckReport {
                    ok: true,
                    identity: Some(format!(
                        "{who}, subscription {} ({})",
                        s["displayName"].as_str().unwrap_or("?"),
                        arm.subscription
                    )),
                    regions,
                    hint,
                })
            }
            Ok(None) => Ok(CheckReport {
                ok: false,
                identity: Some(who),
                regions: Vec::new(),
                hint: Some(format!(
                    "subscription {} is not there for this identity: run `az account list` and \
                     set AZURE_SUBSCRIPTION_ID (or `az account set --subscription ID`)",
                    arm.subscription
                )),
            }),
            Err(e) => Ok(CheckReport {
                ok: false,
                identity: Some(who.clone()),
                regions: Vec::new(),
                hint: Some(format!(
                    "{e}; run `az login` (or set AZURE_TENANT_ID, AZURE_CLIENT_ID and \
                     AZURE_CLIENT_SECRET) for an identity with access to subscription {}",
                    arm.subscription
                )),
            }),
        }
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let location = req.placement.region.as_str();
        let loc = req.placement.to_string();
        let opts = AzureOptions::from_value(req.provider_config.as_ref())
            .map_err(|e| ProviderError::new(ErrorKind::InvalidRequest, "azure", &loc, e))?;
        let key = std::fs::read_to_string(&self.public_key).map_err(|e| {
            local_err(format!(
                "reading gangway's public key {}: {e}",
                self.public_key.display()
            ))
        })?;
        let key = key.trim().to_string();
        let owner = self.owner_of(&req.cluster);
        let rec = self.remember(&req.cluster, |r| {
            r.owner.get_or_insert(owner);
            r.locations.insert(location.to_string());
            r.ssh_user = Some(opts.login());
        })?;
        let arm = self.arm().await?;
        let who = arm.identity();
        let rg = self.group_name(&req.cluster, location);
        let tags = self.tags(&req.cluster, &req.labels);
        let group_path = arm.group(&rg);
        let existed = arm
            .get(&group_path, API_RESOURCES)
            .await
            .map_err(|e| perr(e, &loc, "reading the resource group", who))?;
        if let Some(g) = &existed {
            if !self.is_ours(&req.cluster, g) {
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    "azure",
                    &loc,
                    format!("resource group {rg} exists and is not this installation's cluster"),
                ));
            }
        }
        arm.put(
            &group_path,
            API_RESOURCES,
            &json(&ResourceGroup {
                location: location.to_string(),
                tags: tags.clone(),
            }),
        )
        .await
        .map_err(|e| perr(e, &loc, "creating the resource group", who))?;

        // Reconcile: fitting VMs stay, the rest go; first VMs still being
        // made (their operation was an earlier launch's) end one way or the
        // other.
        let existing = self.settled_vms(arm, &rg, &loc).await?;
        let want_zone = zone_of(&req.placement);
        let fits = |vm: &Value| {
            let p = &vm["properties"];
            p["hardwareProfile"]["vmSize"].as_str() == Some(req.instance_type.as_str())
                && vm["zones"][0].as_str().map(str::to_string) == want_zone
                && (p["priority"].as_str() == Some("Spot")) == req.use_spot
                && !matches!(
                    state_of(vm),
                    NodeState::Terminated | NodeState::Preempted { .. }
                )
        };
        let (mut keep, strays): (Vec<Value>, Vec<Value>) = existing.into_iter().partition(fits);
        let extras = keep.split_off(keep.len().min(req.count as usize));
        for vm in strays.iter().chain(&extras) {
            let name = vm["name"].as_str().unwrap_or_default();
            self.delete_vm(arm, &rg, name, &loc).await?;
            self.remember(&req.cluster, |r| {
                r.vms.remove(name);
            })?;
        }
        let kept: BTreeSet<String> = keep
            .iter()
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        let shortfall = req.count as usize - keep.len();
        let mut new_names = Vec::new();
        let mut i = 0;
        while new_names.len() < shortfall {
            let name = self.vm_name(&req.cluster, i);
            if !kept.iter().any(|k| k.eq_ignore_ascii_case(&name)) {
                new_names.push(name);
            }
            i += 1;
        }
        if !new_names.is_empty() {
            let made = async {
                let accelerated = match self.accelerated(arm, location, &req.instance_type).await? {
                    None => {
                        return Err(ProviderError::new(
                            ErrorKind::Capacity,
                            "azure",
                            &loc,
                            format!("{} is not offered in {location}", req.instance_type),
                        ))
                    }
                    Some(a) => opts.accelerated_networking.unwrap_or(a) && a,
                };
                let (subnet, ppg) = self.network(arm, req, &rg, &loc, &tags).await?;
                let shape = Shape {
                    req,
                    opts: &opts,
                    tags: &tags,
                    key: &key,
                    ppg: ppg.as_deref(),
                };
                let results = futures::future::join_all(
                    new_names
                        .iter()
                        .map(|name| self.make_node(arm, &shape, &rg, name, &subnet, accelerated)),
                )
                .await;
                // The most telling error: capacity and quota steer failover.
                let mut errs: Vec<ProviderError> =
                    results.into_iter().filter_map(|r| r.err()).collect();
                errs.sort_by_key(|e| !e.kind.fails_over());
                match errs.into_iter().next() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
            .await;
            if let Err(e) = made {
                // All or nothing: what this attempt made goes.
                let cleanup = if keep.is_empty() {
                    self.delete_group(arm, &req.cluster, &rg, &loc).await
                } else {
                    let mut r = Ok(());
                    for name in &new_names {
                        if let Err(e) = self.delete_vm(arm, &rg, name, &loc).await {
                            r = Err(e);
                        }
                    }
                    r
                };
                if let Err(c) = cleanup {
                    tracing::warn!("cleaning up after a failed launch: {c}");
                    return Err(ProviderError::new(
                        e.kind,
                        "azure",
                        &loc,
                        format!(
                            "{}; and cleaning up failed: {} (gangway down removes the rest)",
                            e.message, c.message
                        ),
                    ));
                }
                return Err(e);
            }
        }
        let rec = self.record(&req.cluster).unwrap_or(rec);
        let mut nodes = Vec::new();
        for vm in self.vms(arm, &rg, &loc).await? {
            let n = self.node(arm, &vm, location, &rec).await?;
            if n.state != NodeState::Terminated {
                nodes.push(n);
            }
        }
        self.remember(&req.cluster, |r| {
            for n in &nodes {
                r.vms.insert(
                    n.id.0.clone(),
                    VmRecord {
                        location: location.to_string(),
                        zone: n.placement.zone.clone(),
                        size: req.instance_type.clone(),
                        spot: req.use_spot,
                        private_ip: n.private_ip.clone(),
                        public_ip: n.public_ip.clone(),
                    },
                );
            }
        })?;
        if nodes.len() != req.count as usize {
            return Err(ProviderError::new(
                ErrorKind::Transient,
                "azure",
                &loc,
                format!(
                    "{} of {} VMs are there after the launch",
                    nodes.len(),
                    req.count
                ),
            ));
        }
        Ok(nodes)
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let rec = self.record(cluster)?;
        if rec.locations.is_empty() {
            return Ok(Vec::new());
        }
        let arm = self.arm().await?;
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for location in &rec.locations {
            let rg = self.group_name(cluster, location);
            for vm in self.vms(arm, &rg, location).await? {
                let n = self.node(arm, &vm, location, &rec).await?;
                seen.insert(n.id.0.to_ascii_lowercase());
                if n.state != NodeState::Terminated {
                    out.push(n);
                }
            }
        }
        // A Spot VM with the Delete policy is gone once evicted: a VM a
        // launch returned that nobody deleted was taken away.
        for (name, v) in &rec.vms {
            if seen.contains(&name.to_ascii_lowercase()) {
                continue;
            }
            let mut extra = BTreeMap::new();
            let user = rec.ssh_user.clone().unwrap_or_else(|| ADMIN_USER.into());
            gangway_provider::SshEndpoint::new(v.public_ip.clone().unwrap_or_default(), user)
                .record(&mut extra);
            extra.insert("instance_type".into(), v.size.clone());
            extra.insert(
                "market".into(),
                if v.spot { "spot" } else { "on-demand" }.into(),
            );
            out.push(Node {
                id: InstanceId(name.clone()),
                state: if v.spot {
                    NodeState::Preempted {
                        reason: EVICTED.into(),
                    }
                } else {
                    NodeState::Terminated
                },
                private_ip: v.private_ip.clone(),
                public_ip: v.public_ip.clone(),
                placement: Placement {
                    cloud: "azure".into(),
                    region: v.location.clone(),
                    zone: v.zone.clone(),
                },
                topology: Vec::new(),
                extra,
            });
        }
        out.retain(|n| n.state != NodeState::Terminated);
        Ok(out)
    }

    fn cannot_stop(&self, use_spot: bool) -> Option<&'static str> {
        use_spot.then_some(
            "Azure Spot VMs are launched with eviction policy Delete and cannot be stopped, only terminated; use --down",
        )
    }

    async fn stop(&self, cluster: &ClusterName) -> Result<()> {
        let rec = self.record(cluster)?;
        if rec.vms.values().any(|v| v.spot) {
            return Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "azure",
                "",
                self.cannot_stop(true).unwrap_or_default(),
            ));
        }
        let arm = self.arm().await?;
        for location in &rec.locations {
            let rg = self.group_name(cluster, location);
            for vm in self.vms(arm, &rg, location).await? {
                let name = vm["name"].as_str().unwrap_or_default();
                arm.post(
                    &format!(
                        "{}/providers/Microsoft.Compute/virtualMachines/{name}/deallocate",
                        arm.group(&rg)
                    ),
                    API_COMPUTE,
                )
                .await
                .map_err(|e| perr(e, location, &format!("deallocating {name}"), arm.identity()))?;
            }
        }
        Ok(())
    }

    async fn start(
        &self,
        cluster: &ClusterName,
        _provider_config: Option<&serde_json::Value>,
    ) -> Result<Vec<Node>> {
        let rec = self.record(cluster)?;
        let arm = self.arm().await?;
        for location in &rec.locations {
            let rg = self.group_name(cluster, location);
            for vm in self.vms(arm, &rg, location).await? {
                if state_of(&vm) != NodeState::Stopped {
                    continue;
                }
                let name = vm["name"].as_str().unwrap_or_default();
                arm.post(
                    &format!(
                        "{}/providers/Microsoft.Compute/virtualMachines/{name}/start",
                        arm.group(&rg)
                    ),
                    API_COMPUTE,
                )
                .await
                .map_err(|e| perr(e, location, &format!("starting {name}"), arm.identity()))?;
            }
        }
        self.describe(cluster).await
    }

    /// A launch keeps the VMs of the cluster's group that fit and adds the
    /// shortfall in the same group, network and placement group, all or
    /// nothing: lost VMs can be replaced in place.
    fn cannot_replace_nodes(&self) -> Option<&'static str> {
        None
    }

    async fn remove_nodes(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        let rec = self.record(cluster)?;
        let arm = self.arm().await?;
        for id in ids {
            let known = rec
                .vms
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(&id.0))
                .map(|(name, v)| (name.clone(), v.location.clone()));
            let (name, locations) = match known {
                Some((name, location)) => (name, vec![location]),
                None => (id.0.clone(), rec.locations.iter().cloned().collect()),
            };
            // Deleting a VM ARM no longer has (evicted) answers 204: gone.
            for location in &locations {
                let rg = self.group_name(cluster, location);
                self.delete_vm(arm, &rg, &name, location).await?;
            }
            self.remember(cluster, |r| {
                r.vms.remove(&name);
            })?;
        }
        Ok(())
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let rec = self.record(cluster)?;
        let arm = match self.arm().await {
            Ok(a) => a,
            // Nothing recorded and no way to look: nothing of ours to find.
            Err(_) if rec.locations.is_empty() => return Ok(()),
            Err(e) => return Err(e),
        };
        for (rg, location) in self.groups(arm, cluster, &rec).await? {
            self.delete_group(arm, cluster, &rg, &location).await?;
        }
        // Only now, with ARM's word that every group is gone.
        self.records
            .remove(&cluster.0)
            .map_err(|e| local_err(format!("forgetting {cluster}: {e}")))
    }

    async fn clusters(&self) -> Result<Vec<TaggedCluster>> {
        let arm = self.arm().await?;
        let path = format!(
            "{}/resourcegroups?$filter=tagName%20eq%20%27{TAG_CLUSTER}%27",
            arm.sub()
        );
        let groups = arm
            .list(&path, API_RESOURCES)
            .await
            .map_err(|e| perr(e, "", "listing resource groups", arm.identity()))?;
        let mut out: Vec<TaggedCluster> = groups
            .iter()
            .filter_map(|g| {
                Some(TaggedCluster {
                    name: ClusterName(g["tags"][TAG_CLUSTER].as_str()?.to_string()),
                    owner: g["tags"][TAG_OWNER].as_str()?.to_string(),
                    user: g["tags"][TAG_USER].as_str().map(str::to_string),
                })
            })
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
