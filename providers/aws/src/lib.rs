//! The AWS provider: EC2 instances through the official SDK.
//!
//! Launch is a reconcile. The cluster's instances are found by tag
//! (`gangway-cluster` + `gangway-owner`); running ones are reused, stopped
//! ones started, strays (another zone, type or market) terminated, and only
//! the shortfall created, by one `RunInstances` with `MinCount = MaxCount`
//! (all or nothing) and a `ClientToken` derived from the request, so a
//! retried call cannot double the cluster even where the token is not
//! honoured. Every resource (instances, volumes, security group, key pair,
//! placement group) carries both tags, and `gangway-user` (who launched it,
//! for people reading the console); teardown finds them the same way.
//!
//! Credentials, region and endpoint come from the SDK's standard chain
//! (environment, profiles, SSO, IMDS; `AWS_ENDPOINT_URL[_EC2]` for private
//! endpoints and emulators; `AWS_MAX_ATTEMPTS` for the SDK's own retries).
#![deny(missing_docs)]

mod config;
mod errors;
mod notice;
mod record;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::primitives::Blob;
use aws_sdk_ec2::types::{
    BlockDeviceMapping, EbsBlockDevice, Filter, HttpTokensState, IamInstanceProfileSpecification,
    Instance, InstanceInterruptionBehavior, InstanceLifecycleType, InstanceMarketOptionsRequest,
    InstanceMetadataOptionsRequest, InstanceNetworkInterfaceSpecification, InstanceStateName,
    InstanceType, IpPermission, IpRange, MarketType, Placement as Ec2Placement, PlacementStrategy,
    ResourceType, SpotInstanceType, SpotMarketOptions, Tag, TagSpecification, UserIdGroupPair,
    VolumeType,
};
use aws_sdk_ec2::Client;
use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeState, Placement,
    PriceQuote, Prices, Provider, ProviderError, Result, TaggedCluster,
};

pub use config::{AwsOptions, ConfigError};
pub use errors::classify;
use errors::{code_of, from_sdk};
pub use notice::{spot_notice_probe, SPOT_WATCHER};
use record::{Record, Records};

/// Tag naming the cluster on every resource.
pub const TAG_CLUSTER: &str = "gangway-cluster";
/// Tag naming the gangway installation that launched it (its owner id).
pub const TAG_OWNER: &str = "gangway-owner";
/// Tag naming the user who launched it, for people (sweeps go by the owner).
pub const TAG_USER: &str = "gangway-user";

/// EC2's reason code for a spot reclaim.
pub const SPOT_REASON: &str = "Server.SpotInstanceTermination";

/// Instance families `DescribeInstanceTopology` answers for (AWS's list).
const TOPOLOGY_FAMILIES: &[&str] = &[
    "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6", "trn1", "trn1n", "trn2", "g6", "g6e",
    "hpc6a", "hpc6id", "hpc7a", "hpc7g",
];

/// The AWS provider.
pub struct AwsProvider {
    owner: String,
    user: Option<String>,
    /// The owner tag versions before owner ids used here (the user's
    /// name): clusters recorded by them are still found by it.
    legacy_owner: Option<String>,
    public_key: PathBuf,
    records: Records,
    base: tokio::sync::OnceCell<aws_config::SdkConfig>,
    clients: Mutex<HashMap<String, Client>>,
}

/// Everything one region needs before instances can be created there.
struct Network {
    subnet: String,
    group: String,
}

/// What `DescribeInstanceTypes` says about one type.
#[derive(Default)]
struct TypeFacts {
    arm: bool,
    efa_interfaces: i32,
    cluster_placement: bool,
}

impl AwsProvider {
    /// A provider keeping its records under `root`, tagging with `owner`,
    /// and importing `public_key` (an OpenSSH `.pub` file) as each
    /// cluster's key pair.
    pub fn new(root: PathBuf, owner: impl Into<String>, public_key: PathBuf) -> AwsProvider {
        AwsProvider {
            owner: owner.into(),
            user: None,
            legacy_owner: None,
            public_key,
            records: Records::new(root.join("clusters")),
            base: tokio::sync::OnceCell::new(),
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The same provider tagging its resources with `user` too
    /// (`gangway-user`, readable; nothing is found by it).
    pub fn with_user(mut self, user: impl Into<String>) -> AwsProvider {
        self.user = Some(user.into()).filter(|u: &String| !u.is_empty());
        self
    }

    /// The same provider finding clusters that an earlier version recorded
    /// under this root (records without an owner) by `owner`, the owner tag
    /// that version gave them (the user's name): so `down` of a cluster
    /// launched before an upgrade still finds its resources.
    pub fn with_legacy_owner(mut self, owner: impl Into<String>) -> AwsProvider {
        self.legacy_owner = Some(owner.into()).filter(|o: &String| !o.is_empty());
        self
    }

    /// The same provider on an explicit SDK configuration instead of the
    /// standard chain (tests, embedding).
    pub fn with_sdk_config(mut self, conf: aws_config::SdkConfig) -> AwsProvider {
        self.base = tokio::sync::OnceCell::new_with(Some(conf));
        self
    }

    async fn base(&self) -> &aws_config::SdkConfig {
        self.base
            .get_or_init(|| async {
                aws_config::defaults(aws_config::BehaviorVersion::latest())
                    .load()
                    .await
            })
            .await
    }

    /// Linux, shared-tenancy on-demand USD/hour of `instance_types` in
    /// `regions`, from the Price List Query API (its endpoint is in
    /// us-east-1; one query per type, all its regions at once). What the
    /// API said when it refused, as words for a note.
    async fn on_demand_prices(
        &self,
        instance_types: &[String],
        regions: &[String],
    ) -> std::result::Result<HashMap<(String, String), f64>, String> {
        use aws_sdk_pricing::types::{Filter, FilterType};
        let conf = aws_sdk_pricing::config::Builder::from(self.base().await)
            .region(aws_config::Region::new("us-east-1"))
            .build();
        let pricing = aws_sdk_pricing::Client::from_conf(conf);
        let term = |field: &str, value: &str| {
            Filter::builder()
                .r#type(FilterType::TermMatch)
                .field(field)
                .value(value)
                .build()
                .map_err(|e| e.to_string())
        };
        let mut prices = HashMap::new();
        for t in instance_types {
            let filters = vec![
                term("instanceType", t)?,
                term("operatingSystem", "Linux")?,
                term("tenancy", "Shared")?,
                term("preInstalledSw", "NA")?,
                term("capacitystatus", "Used")?,
            ];
            let mut token: Option<String> = None;
            loop {
                let resp = pricing
                    .get_products()
                    .service_code("AmazonEC2")
                    .format_version("aws_v1")
                    .set_filters(Some(filters.clone()))
                    .max_results(100)
                    .set_next_token(token.take())
                    .send()
                    .await
                    .map_err(|e| {
                        let code = e.code().unwrap_or("error").to_string();
                        let msg = e
                            .message()
                            .map(str::to_string)
                            .unwrap_or_else(|| gangway_provider::error_chain(&e));
                        format!("answered {code}: {msg}")
                    })?;
                for doc in resp.price_list() {
                    if let Some((ty, region, price)) = on_demand_of(doc) {
                        if regions.contains(&region) {
                            prices.insert((ty, region), price);
                        }
                    }
                }
                match resp.next_token() {
                    Some(t) if !t.is_empty() => token = Some(t.to_string()),
                    _ => break,
                }
            }
        }
        Ok(prices)
    }

    /// The EC2 client for `region` (one per region, reused).
    async fn ec2(&self, region: &str) -> Client {
        if let Some(c) = self.clients.lock().unwrap().get(region) {
            return c.clone();
        }
        let conf = aws_sdk_ec2::config::Builder::from(self.base().await)
            .region(aws_config::Region::new(region.to_string()))
            .build();
        let c = Client::from_conf(conf);
        self.clients
            .lock()
            .unwrap()
            .insert(region.to_string(), c.clone());
        c
    }

    /// The owner tag of the cluster's resources: the one its record says,
    /// the earlier version's for a record written before owner ids, else
    /// this provider's.
    fn owner_of(&self, cluster: &ClusterName) -> String {
        let rec = self.records.get(&cluster.0).unwrap_or_default();
        match (rec.owner, &self.legacy_owner) {
            (Some(o), _) => o,
            (None, Some(legacy)) if !rec.regions.is_empty() => legacy.clone(),
            _ => self.owner.clone(),
        }
    }

    /// Name of the cluster's security group, key pair and placement group.
    fn resource_name(&self, cluster: &ClusterName) -> String {
        let owner = self.owner_of(cluster);
        format!("gangway-{}-{:08x}", cluster.0, fnv(owner.as_bytes()) as u32)
    }

    fn tags(&self, cluster: &ClusterName, labels: &BTreeMap<String, String>) -> Vec<Tag> {
        let mut tags: Vec<Tag> = labels
            .iter()
            .filter(|(k, _)| {
                !k.starts_with("aws:") && ![TAG_CLUSTER, TAG_OWNER, TAG_USER].contains(&k.as_str())
            })
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        tags.push(Tag::builder().key(TAG_CLUSTER).value(&cluster.0).build());
        tags.push(
            Tag::builder()
                .key(TAG_OWNER)
                .value(self.owner_of(cluster))
                .build(),
        );
        if let Some(u) = &self.user {
            tags.push(Tag::builder().key(TAG_USER).value(u).build());
        }
        tags
    }

    fn tag_spec(&self, kind: ResourceType, tags: &[Tag]) -> TagSpecification {
        TagSpecification::builder()
            .resource_type(kind)
            .set_tags(Some(tags.to_vec()))
            .build()
    }

    fn ours(&self, cluster: &ClusterName) -> Vec<Filter> {
        vec![
            filter(&format!("tag:{TAG_CLUSTER}"), &cluster.0),
            filter(&format!("tag:{TAG_OWNER}"), &self.owner_of(cluster)),
        ]
    }

    fn record(&self, cluster: &ClusterName) -> Result<Record> {
        self.records
            .get(&cluster.0)
            .map_err(|e| local_err(&format!("reading the record of {cluster}: {e}")))
    }

    fn remember(&self, cluster: &ClusterName, f: impl FnOnce(&mut Record)) -> Result<Record> {
        self.records
            .update(&cluster.0, f)
            .map_err(|e| local_err(&format!("writing the record of {cluster}: {e}")))
    }

    /// The cluster's instances in `region`, in any of `states`.
    async fn instances(
        &self,
        ec2: &Client,
        region: &str,
        cluster: &ClusterName,
        states: &[&str],
    ) -> Result<Vec<Instance>> {
        let mut filters = self.ours(cluster);
        filters.push(
            Filter::builder()
                .name("instance-state-name")
                .set_values(Some(states.iter().map(|s| s.to_string()).collect()))
                .build(),
        );
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let resp = ec2
                .describe_instances()
                .set_filters(Some(filters.clone()))
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| from_sdk(e, region, "DescribeInstances"))?;
            for r in resp.reservations() {
                out.extend(r.instances().iter().cloned());
            }
            match resp.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => break,
            }
        }
        out.sort_by_key(|i| {
            (
                i.launch_time().map(|t| t.secs()).unwrap_or_default(),
                i.ami_launch_index().unwrap_or_default(),
                i.instance_id().unwrap_or_default().to_string(),
            )
        });
        Ok(out)
    }

    fn node(&self, i: &Instance, region: &str, rec: &Record) -> Node {
        let zone = i
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_string();
        let private_ip = i.private_ip_address().unwrap_or_default().to_string();
        let public_ip = i.public_ip_address().map(str::to_string);
        let mut extra = BTreeMap::new();
        let reach = if rec.use_internal_ips {
            Some(private_ip.clone())
        } else {
            public_ip.clone()
        };
        let mut ssh = gangway_provider::SshEndpoint::new(
            reach.unwrap_or_default(),
            rec.ssh_user.clone().unwrap_or_else(|| "ubuntu".into()),
        );
        ssh.jump = rec.ssh_jump.clone();
        ssh.record(&mut extra);
        if let Some(t) = i.instance_type() {
            extra.insert("instance_type".to_string(), t.as_str().to_string());
        }
        let spot = i.instance_lifecycle() == Some(&InstanceLifecycleType::Spot);
        extra.insert(
            "market".to_string(),
            if spot { "spot" } else { "on-demand" }.to_string(),
        );
        if let Some(g) = i.placement().and_then(|p| p.group_name()) {
            if !g.is_empty() {
                extra.insert("placement_group".to_string(), g.to_string());
            }
        }
        // Launched with an instance profile: its role is what the node's
        // rclone reaches S3 as.
        if let Some(arn) = i.iam_instance_profile().and_then(|p| p.arn()) {
            extra.insert("iam_instance_profile".to_string(), arn.to_string());
            extra.insert(
                gangway_provider::IDENTITY_STORES_FACT.to_string(),
                "s3".to_string(),
            );
        }
        Node {
            id: InstanceId(i.instance_id().unwrap_or_default().to_string()),
            state: state_of(i),
            private_ip,
            public_ip,
            placement: Placement {
                cloud: "aws".into(),
                region: region.to_string(),
                zone,
            },
            topology: Vec::new(),
            extra,
        }
    }

    async fn type_facts(&self, ec2: &Client, loc: &str, ty: &str) -> Result<TypeFacts> {
        let resp = ec2
            .describe_instance_types()
            .instance_types(InstanceType::from(ty))
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            // EC2 answers an unknown type with InvalidInstanceType: this
            // region does not sell it.
            Err(e) if code_of(&e).is_some_and(|c| c.starts_with("InvalidInstanceType")) => {
                return Err(ProviderError::new(
                    ErrorKind::Capacity,
                    "aws",
                    loc,
                    format!("{ty} is not offered in this region"),
                ))
            }
            Err(e) => return Err(from_sdk(e, loc, "DescribeInstanceTypes")),
        };
        let Some(info) = resp.instance_types().first() else {
            return Ok(TypeFacts::default());
        };
        let arm = info.processor_info().is_some_and(|p| {
            p.supported_architectures()
                .iter()
                .any(|a| a.as_str() == "arm64")
        });
        let net = info.network_info();
        let efa_interfaces = if net.and_then(|n| n.efa_supported()).unwrap_or(false) {
            net.and_then(|n| n.efa_info())
                .and_then(|e| e.maximum_efa_interfaces())
                .unwrap_or(1)
        } else {
            0
        };
        let cluster_placement = info
            .placement_group_info()
            .map(|p| {
                p.supported_strategies()
                    .iter()
                    .any(|s| s.as_str() == "cluster")
            })
            .unwrap_or(true);
        Ok(TypeFacts {
            arm,
            efa_interfaces,
            cluster_placement,
        })
    }

    /// Subnet and security group for a zone, creating the group if needed.
    async fn network(
        &self,
        ec2: &Client,
        loc: &str,
        req: &LaunchRequest,
        opts: &AwsOptions,
    ) -> Result<Network> {
        let vpc = match &opts.vpc_id {
            Some(v) => v.clone(),
            None => {
                let resp = ec2
                    .describe_vpcs()
                    .filters(filter("is-default", "true"))
                    .send()
                    .await
                    .map_err(|e| from_sdk(e, loc, "DescribeVpcs"))?;
                resp.vpcs()
                    .first()
                    .and_then(|v| v.vpc_id())
                    .map(str::to_string)
                    .ok_or_else(|| {
                        ProviderError::new(
                            ErrorKind::InvalidRequest,
                            "aws",
                            loc,
                            "this region has no default VPC; name one with config.aws.vpc_id",
                        )
                    })?
            }
        };
        let subnets = ec2
            .describe_subnets()
            .filters(filter("vpc-id", &vpc))
            .filters(filter("availability-zone", &req.placement.zone))
            .send()
            .await
            .map_err(|e| from_sdk(e, loc, "DescribeSubnets"))?;
        // Prefer the zone's default subnet, then one that gives public IPs.
        let mut subs: Vec<_> = subnets.subnets().to_vec();
        subs.sort_by_key(|s| {
            (
                !s.default_for_az().unwrap_or(false),
                !s.map_public_ip_on_launch().unwrap_or(false),
                s.subnet_id().unwrap_or_default().to_string(),
            )
        });
        let subnet = subs
            .first()
            .and_then(|s| s.subnet_id())
            .map(str::to_string)
            .ok_or_else(|| {
                ProviderError::new(
                    ErrorKind::Capacity,
                    "aws",
                    loc,
                    format!("VPC {vpc} has no subnet in {}", req.placement.zone),
                )
            })?;

        let name = self.resource_name(&req.cluster);
        let found = ec2
            .describe_security_groups()
            .filters(filter("group-name", &name))
            .filters(filter("vpc-id", &vpc))
            .send()
            .await
            .map_err(|e| from_sdk(e, loc, "DescribeSecurityGroups"))?;
        let group = match found.security_groups().first().and_then(|g| g.group_id()) {
            Some(g) => g.to_string(),
            None => {
                let tags = self.tags(&req.cluster, &req.labels);
                let made = ec2
                    .create_security_group()
                    .group_name(&name)
                    .description(format!("gangway cluster {}", req.cluster))
                    .vpc_id(&vpc)
                    .tag_specifications(self.tag_spec(ResourceType::SecurityGroup, &tags))
                    .send()
                    .await;
                match made {
                    Ok(r) => r.group_id().unwrap_or_default().to_string(),
                    // Another attempt made it meanwhile: look again.
                    Err(e) if code_of(&e) == Some("InvalidGroup.Duplicate") => ec2
                        .describe_security_groups()
                        .filters(filter("group-name", &name))
                        .filters(filter("vpc-id", &vpc))
                        .send()
                        .await
                        .map_err(|e| from_sdk(e, loc, "DescribeSecurityGroups"))?
                        .security_groups()
                        .first()
                        .and_then(|g| g.group_id())
                        .unwrap_or_default()
                        .to_string(),
                    Err(e) => return Err(from_sdk(e, loc, "CreateSecurityGroup")),
                }
            }
        };
        // Rules are (re)applied every launch: a crash between creating the
        // group and authorizing would otherwise leave it closed for good.
        let cidr = ssh_cidr(opts).await.map_err(|e| {
            ProviderError::new(
                ErrorKind::InvalidRequest,
                "aws",
                loc,
                gangway_provider::error_chain(&e),
            )
        })?;
        let mut rules = vec![
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(22)
                .to_port(22)
                .ip_ranges(
                    IpRange::builder()
                        .cidr_ip(&cidr)
                        .description("ssh from the gangway user")
                        .build(),
                )
                .build(),
            IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(
                    UserIdGroupPair::builder()
                        .group_id(&group)
                        .description("all traffic between the cluster's nodes")
                        .build(),
                )
                .build(),
        ];
        for (from, to) in &req.ports {
            rules.push(
                IpPermission::builder()
                    .ip_protocol("tcp")
                    .from_port(i32::from(*from))
                    .to_port(i32::from(*to))
                    .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").build())
                    .build(),
            );
        }
        for rule in rules {
            let r = ec2
                .authorize_security_group_ingress()
                .group_id(&group)
                .ip_permissions(rule)
                .send()
                .await;
            match r {
                Ok(_) => {}
                Err(e) if code_of(&e) == Some("InvalidPermission.Duplicate") => {}
                Err(e) => return Err(from_sdk(e, loc, "AuthorizeSecurityGroupIngress")),
            }
        }
        Ok(Network { subnet, group })
    }

    /// Imports gangway's public key as the cluster's key pair.
    async fn key_pair(&self, ec2: &Client, loc: &str, req: &LaunchRequest) -> Result<String> {
        let name = self.resource_name(&req.cluster);
        let material = std::fs::read(&self.public_key).map_err(|e| {
            local_err(&format!(
                "cannot read gangway's public key {}: {e}",
                self.public_key.display()
            ))
        })?;
        let tags = self.tags(&req.cluster, &req.labels);
        let r = ec2
            .import_key_pair()
            .key_name(&name)
            .public_key_material(Blob::new(material))
            .tag_specifications(self.tag_spec(ResourceType::KeyPair, &tags))
            .send()
            .await;
        match r {
            Ok(_) => Ok(name),
            Err(e) if code_of(&e) == Some("InvalidKeyPair.Duplicate") => Ok(name),
            Err(e) => Err(from_sdk(e, loc, "ImportKeyPair")),
        }
    }

    async fn placement_group(
        &self,
        ec2: &Client,
        loc: &str,
        req: &LaunchRequest,
    ) -> Result<String> {
        let name = self.resource_name(&req.cluster);
        let tags = self.tags(&req.cluster, &req.labels);
        let r = ec2
            .create_placement_group()
            .group_name(&name)
            .strategy(PlacementStrategy::Cluster)
            .tag_specifications(self.tag_spec(ResourceType::PlacementGroup, &tags))
            .send()
            .await;
        match r {
            Ok(_) => Ok(name),
            Err(e) if code_of(&e) == Some("InvalidPlacementGroup.Duplicate") => Ok(name),
            Err(e) => Err(from_sdk(e, loc, "CreatePlacementGroup")),
        }
    }

    /// The AMI: the task's `image_id`, else the newest matching
    /// `config.aws.ami_name` (default: the Deep Learning AMI for GPU types,
    /// Ubuntu 22.04 otherwise), with its root device name.
    async fn image(
        &self,
        ec2: &Client,
        loc: &str,
        req: &LaunchRequest,
        opts: &AwsOptions,
        arm: bool,
    ) -> Result<(String, String)> {
        let mut q = ec2.describe_images();
        let wanted = match req.image_id.as_deref() {
            Some(id) if id.starts_with("ami-") => {
                q = q.image_ids(id);
                format!("image {id}")
            }
            Some(other) => {
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    "aws",
                    loc,
                    format!(
                        "image_id '{other}' is not an AMI id (ami-...); on AWS give an AMI \
                         id or leave image_id out for the Deep Learning AMI"
                    ),
                ))
            }
            None => {
                let gpu = req.accelerator.is_some();
                let (owner, name) = match (&opts.ami_owner, &opts.ami_name) {
                    (o, Some(n)) => (o.clone().unwrap_or_else(|| "amazon".into()), n.clone()),
                    (_, None) if gpu => (
                        "amazon".to_string(),
                        "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *"
                            .to_string(),
                    ),
                    (_, None) => (
                        "099720109477".to_string(),
                        format!(
                            "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-{}-server-*",
                            if arm { "arm64" } else { "amd64" }
                        ),
                    ),
                };
                q = q
                    .owners(&owner)
                    .filters(filter("name", &name))
                    .filters(filter("state", "available"))
                    .filters(filter("architecture", if arm { "arm64" } else { "x86_64" }));
                format!("an image named '{name}' owned by {owner}")
            }
        };
        let resp = q
            .send()
            .await
            .map_err(|e| from_sdk(e, loc, "DescribeImages"))?;
        let best = resp
            .images()
            .iter()
            .max_by(|a, b| a.creation_date().cmp(&b.creation_date()));
        match best {
            Some(img) => Ok((
                img.image_id().unwrap_or_default().to_string(),
                img.root_device_name().unwrap_or("/dev/sda1").to_string(),
            )),
            None => Err(ProviderError::new(
                ErrorKind::InvalidRequest,
                "aws",
                loc,
                format!("no AMI found: {wanted}; set image_id or config.aws.ami_name"),
            )),
        }
    }

    /// Creates `count` instances in one call: all of them or none.
    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        ec2: &Client,
        loc: &str,
        req: &LaunchRequest,
        opts: &AwsOptions,
        count: u32,
        token: &str,
    ) -> Result<()> {
        let facts = self.type_facts(ec2, loc, &req.instance_type).await?;
        let net = self.network(ec2, loc, req, opts).await?;
        let key = self.key_pair(ec2, loc, req).await?;
        let (image, root_device) = self.image(ec2, loc, req, opts, facts.arm).await?;
        let multi_gpu = req.count > 1 && req.accelerator.is_some();
        let group = if opts.placement_group.unwrap_or(multi_gpu) && facts.cluster_placement {
            Some(self.placement_group(ec2, loc, req).await?)
        } else {
            None
        };
        let want_efa = opts
            .efa
            .unwrap_or(req.network_tier.as_deref() == Some("best"));
        let tags = self.tags(&req.cluster, &req.labels);
        let mut name_tags = tags.clone();
        name_tags.push(
            Tag::builder()
                .key("Name")
                .value(format!("gangway-{}", req.cluster))
                .build(),
        );
        let mut call = ec2
            .run_instances()
            .image_id(&image)
            .instance_type(InstanceType::from(req.instance_type.as_str()))
            .min_count(count as i32)
            .max_count(count as i32)
            .client_token(token)
            .key_name(&key)
            .placement(
                Ec2Placement::builder()
                    .availability_zone(&req.placement.zone)
                    .set_group_name(group.clone())
                    .build(),
            )
            .tag_specifications(self.tag_spec(ResourceType::Instance, &name_tags))
            .tag_specifications(self.tag_spec(ResourceType::Volume, &tags))
            .metadata_options(
                InstanceMetadataOptionsRequest::builder()
                    .http_tokens(HttpTokensState::Required)
                    .http_put_response_hop_limit(2)
                    .build(),
            );
        if want_efa && facts.efa_interfaces > 0 {
            // One EFA interface per network card. Several interfaces rule
            // out an automatic public address, so all cards are used only
            // for nodes reached on their private addresses
            // (config.aws.use_internal_ips + ssh_jump); otherwise one EFA
            // interface with a public address, so the launch still works.
            let n = if opts.use_internal_ips {
                facts.efa_interfaces
            } else {
                1
            };
            for card in 0..n {
                call = call.network_interfaces(
                    InstanceNetworkInterfaceSpecification::builder()
                        .device_index(if card == 0 { 0 } else { 1 })
                        .network_card_index(card)
                        .interface_type("efa")
                        .subnet_id(&net.subnet)
                        .groups(&net.group)
                        .delete_on_termination(true)
                        .set_associate_public_ip_address(
                            (n == 1 && !opts.use_internal_ips).then_some(true),
                        )
                        .build(),
                );
            }
        } else {
            call = call.subnet_id(&net.subnet).security_group_ids(&net.group);
        }
        if let Some(gib) = req.disk_size_gib {
            call = call.block_device_mappings(
                BlockDeviceMapping::builder()
                    .device_name(root_device)
                    .ebs(
                        EbsBlockDevice::builder()
                            .volume_size(gib as i32)
                            .volume_type(VolumeType::Gp3)
                            .delete_on_termination(true)
                            .build(),
                    )
                    .build(),
            );
        }
        if req.use_spot {
            call = call.instance_market_options(
                InstanceMarketOptionsRequest::builder()
                    .market_type(MarketType::Spot)
                    .spot_options(
                        SpotMarketOptions::builder()
                            .spot_instance_type(SpotInstanceType::OneTime)
                            .instance_interruption_behavior(InstanceInterruptionBehavior::Terminate)
                            .set_max_price(req.max_price.map(|p| format!("{p:.4}")))
                            .build(),
                    )
                    .build(),
            );
        }
        if let Some(profile) = &opts.remote_identity {
            call = call.iam_instance_profile(
                IamInstanceProfileSpecification::builder()
                    .name(profile)
                    .build(),
            );
        }
        call.send().await.map_err(|e| {
            let mut e = from_sdk(e, loc, "RunInstances");
            if let Some(profile) = &opts.remote_identity {
                if e.message
                    .to_ascii_lowercase()
                    .contains("iaminstanceprofile")
                {
                    e.message.push_str(&format!(
                        " (config.aws.remote_identity names the instance profile '{profile}': \
                         create it with a role that may use your buckets, or fix the name; \
                         docs/aws.md, \"Node identity\", says which)"
                    ));
                }
            }
            e
        })?;
        Ok(())
    }

    /// Polls until the cluster has exactly `count` running nodes in the
    /// zone with reachable addresses, or says why not.
    async fn wait_running(
        &self,
        ec2: &Client,
        loc: &str,
        req: &LaunchRequest,
        opts: &AwsOptions,
        rec: &Record,
    ) -> Result<Vec<Node>> {
        let start = Instant::now();
        let deadline = Duration::from_secs(opts.boot_timeout_s);
        loop {
            let all = self
                .instances(
                    ec2,
                    loc,
                    &req.cluster,
                    &["pending", "running", "shutting-down", "terminated"],
                )
                .await?;
            // Only this launch's placement counts; earlier, terminated
            // attempts elsewhere are history.
            let mine: Vec<&Instance> = all
                .iter()
                .filter(|i| {
                    i.placement().and_then(|p| p.availability_zone())
                        == Some(req.placement.zone.as_str())
                        && i.instance_type().map(|t| t.as_str()) == Some(req.instance_type.as_str())
                })
                .collect();
            let alive: Vec<&Instance> = mine
                .iter()
                .copied()
                .filter(|i| {
                    matches!(
                        state_name(i),
                        Some(InstanceStateName::Pending | InstanceStateName::Running)
                    )
                })
                .collect();
            if alive.len() < req.count as usize {
                // Something of ours died while booting: a spot reclaim or a
                // capacity failure after acceptance.
                let why = mine
                    .iter()
                    .filter(|i| !alive.iter().any(|a| a.instance_id() == i.instance_id()))
                    .filter(|i| {
                        i.launch_time().map(|t| t.secs()).unwrap_or(0) + 5 >= start_secs(start)
                    })
                    .map(|i| {
                        format!(
                            "{} {}",
                            i.instance_id().unwrap_or_default(),
                            i.state_reason()
                                .and_then(|r| r.message())
                                .unwrap_or("terminated")
                        )
                    })
                    .collect::<Vec<_>>();
                return Err(ProviderError::new(
                    ErrorKind::Capacity,
                    "aws",
                    loc,
                    format!(
                        "only {} of {} instances are alive{}",
                        alive.len(),
                        req.count,
                        if why.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", why.join("; "))
                        }
                    ),
                ));
            }
            let ready = alive.iter().all(|i| {
                state_name(i) == Some(&InstanceStateName::Running)
                    && if rec.use_internal_ips {
                        i.private_ip_address().is_some()
                    } else {
                        i.public_ip_address().is_some()
                    }
            });
            if ready {
                return Ok(alive
                    .iter()
                    .take(req.count as usize)
                    .map(|i| self.node(i, &req.placement.region, rec))
                    .collect());
            }
            if start.elapsed() >= deadline {
                return Err(ProviderError::new(
                    ErrorKind::Capacity,
                    "aws",
                    loc,
                    format!(
                        "{} of {} instances not running with an address after {} s",
                        alive
                            .iter()
                            .filter(|i| state_name(i) != Some(&InstanceStateName::Running))
                            .count(),
                        req.count,
                        opts.boot_timeout_s
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(opts.poll_ms)).await;
        }
    }

    /// Terminates `ids` and waits until EC2 reports them gone.
    async fn terminate_ids(
        &self,
        ec2: &Client,
        loc: &str,
        ids: Vec<String>,
        cluster: &ClusterName,
    ) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        for chunk in ids.chunks(500) {
            let r = ec2
                .terminate_instances()
                .set_instance_ids(Some(chunk.to_vec()))
                .send()
                .await;
            match r {
                Ok(_) => {}
                Err(e) if code_of(&e) == Some("InvalidInstanceID.NotFound") => {}
                Err(e) => return Err(from_sdk(e, loc, "TerminateInstances")),
            }
        }
        // Groups and keys can only go once nothing uses them.
        let start = Instant::now();
        loop {
            let left = self
                .instances(
                    ec2,
                    loc,
                    cluster,
                    &["pending", "running", "stopping", "stopped", "shutting-down"],
                )
                .await?
                .into_iter()
                .filter(|i| ids.iter().any(|x| Some(x.as_str()) == i.instance_id()))
                .count();
            if left == 0 {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(900) {
                return Err(ProviderError::new(
                    ErrorKind::Transient,
                    "aws",
                    loc,
                    format!(
                        "{left} instance(s) still shutting down after 15 minutes; run down again"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Removes the cluster's security group, placement group and key pair
    /// in one region; each step is idempotent.
    async fn delete_resources(
        &self,
        ec2: &Client,
        region: &str,
        cluster: &ClusterName,
    ) -> Result<()> {
        let name = self.resource_name(cluster);
        let groups = ec2
            .describe_placement_groups()
            .set_filters(Some(self.ours(cluster)))
            .send()
            .await;
        let mut pg_names: Vec<String> = match groups {
            Ok(r) => r
                .placement_groups()
                .iter()
                .filter_map(|g| g.group_name().map(str::to_string))
                .collect(),
            Err(e) => return Err(from_sdk(e, region, "DescribePlacementGroups")),
        };
        if !pg_names.contains(&name) {
            pg_names.push(name.clone());
        }
        for g in pg_names {
            retry_in_use(region, "DeletePlacementGroup", || async {
                match ec2.delete_placement_group().group_name(&g).send().await {
                    Ok(_) => Ok(()),
                    Err(e) if code_of(&e) == Some("InvalidPlacementGroup.Unknown") => Ok(()),
                    Err(e) => Err(e),
                }
            })
            .await?;
        }
        let sgs = ec2
            .describe_security_groups()
            .set_filters(Some(self.ours(cluster)))
            .send()
            .await
            .map_err(|e| from_sdk(e, region, "DescribeSecurityGroups"))?;
        for g in sgs.security_groups() {
            let Some(id) = g.group_id() else { continue };
            retry_in_use(region, "DeleteSecurityGroup", || async {
                match ec2.delete_security_group().group_id(id).send().await {
                    Ok(_) => Ok(()),
                    Err(e) if code_of(&e) == Some("InvalidGroup.NotFound") => Ok(()),
                    Err(e) => Err(e),
                }
            })
            .await?;
        }
        match ec2.delete_key_pair().key_name(&name).send().await {
            Ok(_) => Ok(()),
            Err(e) if code_of(&e) == Some("InvalidKeyPair.NotFound") => Ok(()),
            Err(e) => Err(from_sdk(e, region, "DeleteKeyPair")),
        }
    }
}

/// (instance type, region code, USD/hour) of one Price List API product
/// document (the JSON text GetProducts returns per product): its on-demand
/// term's hourly dimension. `None` for anything else (a reservation fee, a
/// price of 0 for a type no longer sold, a document of another shape).
fn on_demand_of(doc: &str) -> Option<(String, String, f64)> {
    let v: serde_json::Value = serde_json::from_str(doc).ok()?;
    let attrs = &v["product"]["attributes"];
    let ty = attrs["instanceType"].as_str()?.to_string();
    let region = attrs["regionCode"].as_str()?.to_string();
    let terms = v["terms"]["OnDemand"].as_object()?;
    let price = terms.values().find_map(|term| {
        term["priceDimensions"].as_object()?.values().find_map(|d| {
            let hourly = d["unit"]
                .as_str()
                .is_some_and(|u| u.eq_ignore_ascii_case("hrs"));
            let usd = d["pricePerUnit"]["USD"].as_str()?.parse::<f64>().ok()?;
            (hourly && usd > 0.0).then_some(usd)
        })
    })?;
    Some((ty, region, price))
}

/// Where AWS publishes the Spot Instance Advisor's data.
const SPOT_ADVISOR_URL: &str = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json";

/// `(region, instance type, bucket)` of every Linux entry of a Spot
/// Instance Advisor document (`spot_advisor.<region>.Linux.<type>.r`, 0 to
/// 4), sorted; `None` when the document is not one, or lists nothing.
fn advisor_buckets(text: &str) -> Option<Vec<(String, String, u8)>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let mut out = Vec::new();
    for (region, oses) in v["spot_advisor"].as_object()? {
        let Some(linux) = oses["Linux"].as_object() else {
            continue;
        };
        for (ty, e) in linux {
            if let Some(r) = e["r"].as_u64().filter(|r| *r <= 4) {
                out.push((region.clone(), ty.clone(), r as u8));
            }
        }
    }
    out.sort();
    (!out.is_empty()).then_some(out)
}

/// AWS in the core's registry: on with an owner id to tag with, its
/// records under `records/aws`.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: "aws",
    build: |s| {
        Some(std::sync::Arc::new(
            AwsProvider::new(s.records.join("aws"), s.owner?, s.public_key())
                .with_user(s.user)
                .with_legacy_owner(s.legacy_owner),
        ))
    },
    capacity: gangway_provider::no_capacity,
    hosts_controller: true,
    stores: &[gangway_provider::StoreAccess {
        scheme: "s3",
        user_keys: Some(|| Box::pin(user_credentials())),
        node_keys: Some(node_keys),
        project: None,
    }],
};

#[async_trait::async_trait]
impl Provider for AwsProvider {
    fn has_price_api(&self) -> bool {
        true
    }

    fn notice_probe(&self, node: &gangway_provider::NodeRow) -> Option<String> {
        spot_notice_probe(node)
    }

    fn identity_stores(&self, provider_config: Option<&serde_json::Value>) -> Vec<String> {
        match AwsOptions::from_value(provider_config) {
            Ok(o) if o.remote_identity.is_some() => vec!["s3".to_string()],
            _ => Vec::new(),
        }
    }

    fn name(&self) -> &str {
        "aws"
    }

    async fn check(&self) -> Result<CheckReport> {
        let base = self.base().await;
        let region = base
            .region()
            .map(|r| r.to_string())
            .unwrap_or_else(|| "us-east-1".into());
        let sts = aws_sdk_sts::Client::new(base);
        let who = match sts.get_caller_identity().send().await {
            Ok(r) => r.arn().map(str::to_string),
            Err(e) => {
                let err = from_sdk(e, &region, "GetCallerIdentity");
                return Ok(CheckReport {
                    ok: false,
                    identity: None,
                    regions: Vec::new(),
                    hint: Some(err.message),
                });
            }
        };
        let ec2 = self.ec2(&region).await;
        let regions = match ec2.describe_regions().send().await {
            Ok(r) => r
                .regions()
                .iter()
                .filter_map(|r| r.region_name().map(str::to_string))
                .collect(),
            Err(e) => {
                let err = from_sdk(e, &region, "DescribeRegions");
                return Ok(CheckReport {
                    ok: false,
                    identity: who,
                    regions: Vec::new(),
                    hint: Some(err.message),
                });
            }
        };
        Ok(CheckReport {
            ok: true,
            identity: who,
            regions,
            hint: None,
        })
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let region = req.placement.region.as_str();
        let loc = format!("{region}/{}", req.placement.zone);
        let opts = AwsOptions::from_value(req.provider_config.as_ref()).map_err(|e| {
            ProviderError::new(ErrorKind::InvalidRequest, "aws", &loc, e.to_string())
        })?;
        // Recorded before anything exists there, with the owner tag the
        // cluster's resources carry (an earlier version's stays theirs).
        let owner = self.owner_of(&req.cluster);
        let rec = self.remember(&req.cluster, |r| {
            r.owner.get_or_insert(owner);
            r.regions.insert(region.to_string());
            r.ssh_user = Some(opts.ssh_user.clone());
            r.use_internal_ips = opts.use_internal_ips;
            r.ssh_jump = opts.ssh_jump.clone();
        })?;
        let ec2 = self.ec2(region).await;
        let existing = self
            .instances(
                &ec2,
                &loc,
                &req.cluster,
                &["pending", "running", "stopping", "stopped"],
            )
            .await?;
        let fits = |i: &Instance| {
            i.placement().and_then(|p| p.availability_zone()) == Some(req.placement.zone.as_str())
                && i.instance_type().map(|t| t.as_str()) == Some(req.instance_type.as_str())
                && (i.instance_lifecycle() == Some(&InstanceLifecycleType::Spot)) == req.use_spot
                // The identity asked for (an instance profile's ARN ends
                // with its name), or none.
                && i.iam_instance_profile()
                    .and_then(|p| p.arn())
                    .and_then(|a| a.rsplit('/').next())
                    == opts.remote_identity.as_deref()
        };
        let (mut keep, strays): (Vec<Instance>, Vec<Instance>) =
            existing.into_iter().partition(fits);
        // Never more than asked for: the newest extras go.
        let extras = keep.split_off(keep.len().min(req.count as usize));
        let drop: Vec<String> = strays
            .iter()
            .chain(&extras)
            .filter_map(|i| i.instance_id().map(str::to_string))
            .collect();
        if !drop.is_empty() {
            self.terminate_ids(&ec2, &loc, drop, &req.cluster).await?;
        }
        // Stopped nodes of this cluster come back rather than being replaced.
        let stopped: Vec<String> = keep
            .iter()
            .filter(|i| {
                matches!(
                    state_name(i),
                    Some(InstanceStateName::Stopped | InstanceStateName::Stopping)
                )
            })
            .filter_map(|i| i.instance_id().map(str::to_string))
            .collect();
        if !stopped.is_empty() {
            self.start_ids(&ec2, &loc, &req.cluster, stopped).await?;
        }
        let shortfall = req.count - keep.len() as u32;
        if shortfall > 0 {
            let mut have: Vec<&str> = keep.iter().filter_map(|i| i.instance_id()).collect();
            have.sort();
            let token = client_token(req, &self.owner_of(&req.cluster), shortfall, &have);
            self.run(&ec2, &loc, req, &opts, shortfall, &token).await?;
        }
        let mut nodes = self.wait_running(&ec2, &loc, req, &opts, &rec).await?;
        // What spot nodes are billed: the zone's market price now, for the
        // cost ledger (the plan's price may be days old). Not known (the
        // call refused or empty): the ledger keeps the plan's.
        if req.use_spot {
            if let Some(price) = spot_price_now(&ec2, &req.instance_type, &req.placement.zone).await
            {
                for n in &mut nodes {
                    n.extra
                        .insert(gangway_provider::PRICE_FACT.to_string(), price.to_string());
                }
            }
        }
        Ok(nodes)
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let rec = self.record(cluster)?;
        let mut out = Vec::new();
        for region in &rec.regions {
            let ec2 = self.ec2(region).await;
            let all = self
                .instances(
                    &ec2,
                    region,
                    cluster,
                    &[
                        "pending",
                        "running",
                        "stopping",
                        "stopped",
                        "shutting-down",
                        "terminated",
                    ],
                )
                .await?;
            for i in &all {
                let n = self.node(i, region, &rec);
                // A node terminated by us is gone; a reclaimed one is news.
                if n.state != NodeState::Terminated {
                    out.push(n);
                }
            }
        }
        Ok(out)
    }

    fn cannot_stop(&self, use_spot: bool) -> Option<&'static str> {
        // gangway asks EC2 for one-time spot requests, which cannot stop.
        use_spot.then_some(
            "AWS spot instances (one-time requests) cannot be stopped, only terminated; use --down",
        )
    }

    async fn stop(&self, cluster: &ClusterName) -> Result<()> {
        let rec = self.record(cluster)?;
        for region in &rec.regions {
            let ec2 = self.ec2(region).await;
            let live = self
                .instances(&ec2, region, cluster, &["pending", "running"])
                .await?;
            if live
                .iter()
                .any(|i| i.instance_lifecycle() == Some(&InstanceLifecycleType::Spot))
            {
                return Err(ProviderError::new(
                    ErrorKind::InvalidRequest,
                    "aws",
                    region.as_str(),
                    "one-time spot instances cannot be stopped; use down (and managed jobs to resume later)",
                ));
            }
            let ids: Vec<String> = live
                .iter()
                .filter_map(|i| i.instance_id().map(str::to_string))
                .collect();
            if !ids.is_empty() {
                ec2.stop_instances()
                    .set_instance_ids(Some(ids))
                    .send()
                    .await
                    .map_err(|e| from_sdk(e, region, "StopInstances"))?;
            }
        }
        Ok(())
    }

    async fn start(
        &self,
        cluster: &ClusterName,
        provider_config: Option<&serde_json::Value>,
    ) -> Result<Vec<Node>> {
        let opts = AwsOptions::from_value(provider_config)
            .map_err(|e| ProviderError::new(ErrorKind::InvalidRequest, "aws", "", e.to_string()))?;
        let rec = self.record(cluster)?;
        let mut out = Vec::new();
        for region in &rec.regions {
            let ec2 = self.ec2(region).await;
            let all = self
                .instances(
                    &ec2,
                    region,
                    cluster,
                    &["pending", "running", "stopping", "stopped"],
                )
                .await?;
            let ids: Vec<String> = all
                .iter()
                .filter(|i| {
                    matches!(
                        state_name(i),
                        Some(InstanceStateName::Stopped | InstanceStateName::Stopping)
                    )
                })
                .filter_map(|i| i.instance_id().map(str::to_string))
                .collect();
            if !ids.is_empty() {
                self.start_ids(&ec2, region, cluster, ids).await?;
            }
            let start = Instant::now();
            loop {
                let now = self
                    .instances(
                        &ec2,
                        region,
                        cluster,
                        &["pending", "running", "stopping", "stopped"],
                    )
                    .await?;
                let ready = now.iter().all(|i| {
                    state_name(i) == Some(&InstanceStateName::Running)
                        && (rec.use_internal_ips || i.public_ip_address().is_some())
                });
                if ready {
                    out.extend(now.iter().map(|i| self.node(i, region, &rec)));
                    break;
                }
                if start.elapsed() > Duration::from_secs(opts.boot_timeout_s) {
                    return Err(ProviderError::new(
                        ErrorKind::Capacity,
                        "aws",
                        region.as_str(),
                        format!("nodes not running {} s after start", opts.boot_timeout_s),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(opts.poll_ms)).await;
            }
        }
        Ok(out)
    }

    /// The instance and region from the instance metadata service (IMDSv2;
    /// `AWS_EC2_METADATA_SERVICE_ENDPOINT` where it is elsewhere), then
    /// StopInstances with the instance profile's credentials.
    async fn stop_this_machine(&self) -> Result<()> {
        let imds = aws_config::imds::Client::builder().build();
        let read = |path: &'static str| {
            let imds = imds.clone();
            async move {
                imds.get(path).await.map(String::from).map_err(|e| {
                    ProviderError::new(
                        ErrorKind::InvalidRequest,
                        "aws",
                        "",
                        format!(
                            "the instance metadata service did not answer {path} (is this an EC2 instance?): {e}"
                        ),
                    )
                })
            }
        };
        let id = read("/latest/meta-data/instance-id").await?;
        let region = read("/latest/meta-data/placement/region").await?;
        let ec2 = self.ec2(&region).await;
        ec2.stop_instances()
            .instance_ids(id.trim())
            .send()
            .await
            .map_err(|e| from_sdk(e, &region, "StopInstances"))?;
        Ok(())
    }

    /// The keys cloud-init printed on the instance's serial console
    /// (GetConsoleOutput, the latest output where the instance type
    /// keeps it: Nitro; else the buffered one EC2 took at boot).
    async fn host_keys(&self, node: &Node) -> Result<Option<Vec<String>>> {
        let region = node.placement.region.as_str();
        let ec2 = self.ec2(region).await;
        let ask = |latest: bool| {
            ec2.get_console_output()
                .instance_id(node.id.0.as_str())
                .set_latest(latest.then_some(true))
                .send()
        };
        let answer = match ask(true).await {
            Ok(a) => a,
            Err(_) => ask(false)
                .await
                .map_err(|e| from_sdk(e, region, "GetConsoleOutput"))?,
        };
        let text = answer
            .output()
            .and_then(|b| aws_smithy_types::base64::decode(b.trim()).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Ok(Some(gangway_provider::host_keys::in_console_output(&text)))
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let rec = self.record(cluster)?;
        for region in &rec.regions {
            let ec2 = self.ec2(region).await;
            let ids: Vec<String> = self
                .instances(
                    &ec2,
                    region,
                    cluster,
                    &["pending", "running", "stopping", "stopped", "shutting-down"],
                )
                .await?
                .iter()
                .filter_map(|i| i.instance_id().map(str::to_string))
                .collect();
            self.terminate_ids(&ec2, region, ids, cluster).await?;
            self.delete_resources(&ec2, region, cluster).await?;
        }
        self.records
            .remove(&cluster.0)
            .map_err(|e| local_err(&format!("removing the record of {cluster}: {e}")))
    }

    fn cannot_replace_nodes(&self) -> Option<&'static str> {
        // A launch keeps the cluster's instances and runs only the
        // shortfall, in the same zone, placement group and subnet.
        None
    }

    async fn remove_nodes(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        let rec = self.record(cluster)?;
        for region in &rec.regions {
            let ec2 = self.ec2(region).await;
            // Only ids this region has: one unknown id fails a whole
            // TerminateInstances call.
            let here: Vec<String> = self
                .instances(
                    &ec2,
                    region,
                    cluster,
                    &["pending", "running", "stopping", "stopped", "shutting-down"],
                )
                .await?
                .iter()
                .filter_map(|i| i.instance_id())
                .filter(|i| ids.iter().any(|x| x.0 == *i))
                .map(str::to_string)
                .collect();
            self.terminate_ids(&ec2, region, here, cluster).await?;
        }
        Ok(())
    }

    /// One quote per (type, zone) EC2 offers (`DescribeInstanceTypeOfferings`),
    /// with the latest Linux spot price where `DescribeSpotPriceHistory`
    /// has one. On-demand prices are not in the EC2 API (they live in the
    /// Pricing API), so `price` stays `None` and the catalog keeps its own.
    async fn prices(&self, instance_types: &[String], regions: &[String]) -> Result<Prices> {
        let mut out = Vec::new();
        for region in regions {
            let ec2 = self.ec2(region).await;
            let mut offered: BTreeMap<(String, String), Option<(i64, f64)>> = BTreeMap::new();
            for chunk in instance_types.chunks(50) {
                let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
                let mut token: Option<String> = None;
                loop {
                    let resp = ec2
                        .describe_instance_type_offerings()
                        .location_type(aws_sdk_ec2::types::LocationType::AvailabilityZone)
                        .filters(filter_many("instance-type", &names))
                        .set_next_token(token.take())
                        .send()
                        .await
                        .map_err(|e| from_sdk(e, region, "DescribeInstanceTypeOfferings"))?;
                    for o in resp.instance_type_offerings() {
                        if let (Some(t), Some(z)) = (o.instance_type(), o.location()) {
                            offered.insert((t.as_str().to_string(), z.to_string()), None);
                        }
                    }
                    match resp.next_token() {
                        Some(t) if !t.is_empty() => token = Some(t.to_string()),
                        _ => break,
                    }
                }
                let mut token: Option<String> = None;
                loop {
                    let resp = ec2
                        .describe_spot_price_history()
                        .set_instance_types(Some(
                            names.iter().map(|t| InstanceType::from(*t)).collect(),
                        ))
                        .product_descriptions("Linux/UNIX")
                        .start_time(aws_sdk_ec2::primitives::DateTime::from(
                            std::time::SystemTime::now(),
                        ))
                        .set_next_token(token.take())
                        .send()
                        .await
                        .map_err(|e| from_sdk(e, region, "DescribeSpotPriceHistory"))?;
                    for p in resp.spot_price_history() {
                        let (Some(t), Some(z), Some(price)) = (
                            p.instance_type(),
                            p.availability_zone(),
                            p.spot_price().and_then(|s| s.parse::<f64>().ok()),
                        ) else {
                            continue;
                        };
                        let when = p.timestamp().map(|t| t.secs()).unwrap_or(0);
                        // A price for a zone the offerings did not list is
                        // still news that the type is sold there.
                        let slot = offered
                            .entry((t.as_str().to_string(), z.to_string()))
                            .or_default();
                        if slot.is_none_or(|(w, _)| when >= w) {
                            *slot = Some((when, price));
                        }
                    }
                    match resp.next_token() {
                        Some(t) if !t.is_empty() => token = Some(t.to_string()),
                        _ => break,
                    }
                }
            }
            out.extend(offered.into_iter().map(|((t, z), p)| PriceQuote {
                instance_type: t,
                region: region.clone(),
                zone: Some(z),
                price: None,
                spot_price: p.map(|(_, p)| p),
                accelerator: None,
                accelerator_count: None,
            }));
        }
        // On-demand prices are not in the EC2 API: the Price List Query API
        // has them, per region (the same in every zone of it).
        let mut notes = Vec::new();
        match self.on_demand_prices(instance_types, regions).await {
            Ok(prices) => {
                let mut missing = 0;
                for q in &mut out {
                    match prices.get(&(q.instance_type.clone(), q.region.clone())) {
                        Some(p) => q.price = Some(*p),
                        None => missing += 1,
                    }
                }
                if missing > 0 {
                    notes.push(format!(
                        "{missing} zone offering(s) had no Linux on-demand price in the AWS Price List API: kept from the catalog"
                    ));
                }
            }
            Err(why) => notes.push(format!(
                "on-demand prices not refreshed (kept from the catalog): the AWS Price List API (pricing:GetProducts) {why}"
            )),
        }
        Ok(Prices { quotes: out, notes })
    }

    /// The Spot Instance Advisor's public feed (Linux buckets), or the
    /// copy `GANGWAY_SPOT_ADVISOR_URL` names.
    async fn interruption_buckets(&self) -> Result<Option<Vec<(String, String, u8)>>> {
        let url =
            std::env::var("GANGWAY_SPOT_ADVISOR_URL").unwrap_or_else(|_| SPOT_ADVISOR_URL.into());
        let fail = |kind: ErrorKind, why: String| {
            ProviderError::new(kind, "aws", "spot advisor", format!("{url}: {why}"))
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| fail(ErrorKind::Fatal, e.to_string()))?;
        let resp = client
            .get(&url)
            .send()
            .await
            .map_err(|e| fail(ErrorKind::Transient, gangway_provider::error_chain(&e)))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(fail(ErrorKind::Transient, format!("HTTP {status}")));
        }
        let text = resp
            .text()
            .await
            .map_err(|e| fail(ErrorKind::Transient, e.to_string()))?;
        let rows = advisor_buckets(&text).ok_or_else(|| {
            fail(
                ErrorKind::Fatal,
                "not the Spot Instance Advisor feed (no spot_advisor.<region>.Linux.<type>.r)"
                    .into(),
            )
        })?;
        Ok(Some(rows))
    }

    async fn topology(&self, nodes: &[Node]) -> Result<Vec<Vec<String>>> {
        let mut paths: HashMap<String, Vec<String>> = HashMap::new();
        let mut by_region: BTreeMap<&str, Vec<&Node>> = BTreeMap::new();
        for n in nodes {
            by_region
                .entry(n.placement.region.as_str())
                .or_default()
                .push(n);
        }
        for (region, ns) in by_region {
            let ids: Vec<String> = ns
                .iter()
                .filter(|n| {
                    n.extra
                        .get("instance_type")
                        .is_some_and(|t| TOPOLOGY_FAMILIES.contains(&family(t)))
                })
                .map(|n| n.id.0.clone())
                .collect();
            if ids.is_empty() {
                continue;
            }
            let ec2 = self.ec2(region).await;
            // Not every account or region answers this; ranks then fall
            // back to placement group + private address.
            if let Ok(resp) = ec2
                .describe_instance_topology()
                .set_instance_ids(Some(ids))
                .send()
                .await
            {
                for t in resp.instances() {
                    if let Some(id) = t.instance_id() {
                        paths.insert(id.to_string(), t.network_nodes().to_vec());
                    }
                }
            }
        }
        Ok(nodes
            .iter()
            .map(|n| {
                paths.remove(&n.id.0).unwrap_or_else(|| {
                    n.extra
                        .get("placement_group")
                        .map(|g| vec![g.clone()])
                        .unwrap_or_default()
                })
            })
            .collect())
    }

    async fn clusters(&self) -> Result<Vec<TaggedCluster>> {
        let base_region = self
            .base()
            .await
            .region()
            .map(|r| r.to_string())
            .unwrap_or_else(|| "us-east-1".into());
        let ec2 = self.ec2(&base_region).await;
        let regions: Vec<String> = ec2
            .describe_regions()
            .send()
            .await
            .map_err(|e| from_sdk(e, &base_region, "DescribeRegions"))?
            .regions()
            .iter()
            .filter_map(|r| r.region_name().map(str::to_string))
            .collect();
        // Every region at once: a sweep is ~40 regions x 4 calls. Every
        // resource with an owner tag, whoever's: the caller tells its own
        // from others' and from earlier versions' (a user name as owner).
        let mut tasks = tokio::task::JoinSet::new();
        for region in regions {
            let ec2 = self.ec2(&region).await;
            tasks.spawn(async move {
                let found = sweep_region(&ec2, &region).await;
                (region, found)
            });
        }
        let mut found: BTreeMap<TaggedCluster, Vec<String>> = BTreeMap::new();
        while let Some(joined) = tasks.join_next().await {
            let (region, clusters) = joined.map_err(|e| local_err(&format!("sweep task: {e}")))?;
            for c in clusters? {
                found.entry(c).or_default().push(region.clone());
            }
        }
        // Where this owner's clusters are is recorded, so `terminate`
        // knows where to look (others' are not this provider's to end).
        let mut out = Vec::new();
        for (c, regions) in found {
            if c.owner == self.owner {
                let owner = c.owner.clone();
                self.remember(&c.name, |r| {
                    r.owner.get_or_insert(owner);
                    r.regions.extend(regions);
                })?;
            }
            out.push(c);
        }
        Ok(out)
    }
}

impl AwsProvider {
    async fn start_ids(
        &self,
        ec2: &Client,
        loc: &str,
        cluster: &ClusterName,
        ids: Vec<String>,
    ) -> Result<()> {
        // A node still stopping cannot be started yet.
        let start = Instant::now();
        loop {
            let now = self.instances(ec2, loc, cluster, &["stopping"]).await?;
            if !now
                .iter()
                .any(|i| ids.iter().any(|x| Some(x.as_str()) == i.instance_id()))
            {
                break;
            }
            if start.elapsed() > Duration::from_secs(600) {
                return Err(ProviderError::new(
                    ErrorKind::Transient,
                    "aws",
                    loc,
                    "instances still stopping after 10 minutes",
                ));
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        ec2.start_instances()
            .set_instance_ids(Some(ids))
            .send()
            .await
            .map_err(|e| from_sdk(e, loc, "StartInstances"))?;
        Ok(())
    }
}

/// The clusters holding anything with an owner tag in one region
/// (instances, security groups, key pairs, placement groups), with their
/// owner and user tags.
async fn sweep_region(ec2: &Client, region: &str) -> Result<Vec<TaggedCluster>> {
    let owner = filter("tag-key", TAG_OWNER);
    let mut names: Vec<TaggedCluster> = Vec::new();
    let inst = ec2
        .describe_instances()
        .filters(owner.clone())
        .filters(filter_many(
            "instance-state-name",
            &["pending", "running", "stopping", "stopped", "shutting-down"],
        ))
        .send()
        .await
        .map_err(|e| from_sdk(e, region, "DescribeInstances"))?;
    for r in inst.reservations() {
        for i in r.instances() {
            names.extend(tagged(i.tags()));
        }
    }
    let sgs = ec2
        .describe_security_groups()
        .filters(owner.clone())
        .send()
        .await
        .map_err(|e| from_sdk(e, region, "DescribeSecurityGroups"))?;
    for g in sgs.security_groups() {
        names.extend(tagged(g.tags()));
    }
    let keys = ec2
        .describe_key_pairs()
        .filters(owner.clone())
        .send()
        .await
        .map_err(|e| from_sdk(e, region, "DescribeKeyPairs"))?;
    for k in keys.key_pairs() {
        names.extend(tagged(k.tags()));
    }
    let pgs = ec2
        .describe_placement_groups()
        .filters(owner)
        .send()
        .await
        .map_err(|e| from_sdk(e, region, "DescribePlacementGroups"))?;
    for g in pgs.placement_groups() {
        names.extend(tagged(g.tags()));
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// Retries a delete that EC2 refuses while something still uses the
/// resource (network interfaces detach a little after termination).
async fn retry_in_use<F, Fut, E, R>(loc: &str, call: &str, f: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<(), aws_sdk_ec2::error::SdkError<E, R>>>,
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match f().await {
            Ok(()) => return Ok(()),
            Err(e)
                if tries < 30
                    && matches!(
                        code_of(&e),
                        Some("DependencyViolation" | "InvalidPlacementGroup.InUse")
                    ) =>
            {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(from_sdk(e, loc, call)),
        }
    }
}

fn state_name(i: &Instance) -> Option<&InstanceStateName> {
    i.state().and_then(|s| s.name())
}

/// gangway's view of an instance's state.
fn state_of(i: &Instance) -> NodeState {
    let reason = i.state_reason().and_then(|r| r.code()).unwrap_or_default();
    if reason == SPOT_REASON {
        let words = i
            .state_reason()
            .and_then(|r| r.message())
            .unwrap_or(SPOT_REASON);
        return NodeState::Preempted {
            reason: format!("AWS reclaimed the spot instance ({words})"),
        };
    }
    match state_name(i) {
        Some(InstanceStateName::Pending) => NodeState::Pending,
        Some(InstanceStateName::Running) => NodeState::Running,
        Some(InstanceStateName::Stopping | InstanceStateName::Stopped) => NodeState::Stopped,
        _ => NodeState::Terminated,
    }
}

fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

fn filter_many(name: &str, values: &[&str]) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.iter().map(|s| s.to_string()).collect()))
        .build()
}

/// The cluster a resource's tags name, with their owner and user.
fn tagged(tags: &[Tag]) -> Option<TaggedCluster> {
    Some(TaggedCluster {
        name: ClusterName(tag_value(tags, TAG_CLUSTER)?),
        owner: tag_value(tags, TAG_OWNER)?,
        user: tag_value(tags, TAG_USER),
    })
}

fn tag_value(tags: &[Tag], key: &str) -> Option<String> {
    tags.iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value().map(str::to_string))
}

fn local_err(message: &str) -> ProviderError {
    ProviderError::new(ErrorKind::Fatal, "aws", "local", message)
}

/// `p4d.24xlarge` → `p4d`.
fn family(instance_type: &str) -> &str {
    instance_type.split('.').next().unwrap_or(instance_type)
}

/// The newest Linux spot price of `instance_type` in `zone` (USD per
/// hour), from DescribeSpotPriceHistory; `None` when it cannot be had.
async fn spot_price_now(ec2: &Client, instance_type: &str, zone: &str) -> Option<f64> {
    let resp = ec2
        .describe_spot_price_history()
        .instance_types(InstanceType::from(instance_type))
        .availability_zone(zone)
        .product_descriptions("Linux/UNIX")
        .start_time(aws_sdk_ec2::primitives::DateTime::from(
            std::time::SystemTime::now(),
        ))
        .send()
        .await
        .ok()?;
    resp.spot_price_history()
        .iter()
        .filter_map(|p| {
            let price = p.spot_price()?.parse::<f64>().ok()?;
            Some((p.timestamp().map(|t| t.secs()).unwrap_or(0), price))
        })
        .filter(|(_, p)| p.is_finite() && *p > 0.0)
        .max_by_key(|(when, _)| *when)
        .map(|(_, p)| p)
}

fn start_secs(start: Instant) -> i64 {
    let ago = start.elapsed().as_secs() as i64;
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64 - ago)
        .unwrap_or(0)
}

/// 64-bit FNV-1a: stable across builds (unlike std's hasher), so tokens and
/// names stay the same from one gangway version to the next.
fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The `ClientToken` for creating `shortfall` instances on top of `have`
/// for the cluster of this owner: the same request gives the same token, a
/// different one (another owner's cluster of the same name included) never
/// does (EC2 allows 64 ASCII characters).
pub fn client_token(req: &LaunchRequest, owner: &str, shortfall: u32, have: &[&str]) -> String {
    let key = format!(
        "{}|{}|{}|{}|{}|{}|{}|{}",
        req.client_token,
        owner,
        req.placement.region,
        req.placement.zone,
        req.instance_type,
        req.use_spot,
        shortfall,
        have.join(",")
    );
    let short: String = req
        .cluster
        .0
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(40)
        .collect();
    format!("gw-{short}-{:016x}", fnv(key.as_bytes()))
}

/// Who may reach port 22: the configured CIDR, `GANGWAY_AWS_SSH_CIDR`, or
/// the caller's public address as AWS sees it.
async fn ssh_cidr(opts: &AwsOptions) -> std::result::Result<String, ConfigError> {
    if let Some(c) = &opts.ssh_cidr {
        return Ok(c.clone());
    }
    if let Ok(c) = std::env::var("GANGWAY_AWS_SSH_CIDR") {
        return if config::looks_like_cidr(&c) {
            Ok(c)
        } else {
            Err(ConfigError::BadEnvCidr(c))
        };
    }
    let ip = tokio::task::spawn_blocking(my_public_ip)
        .await
        .map_err(|e| ConfigError::Lookup(e.to_string()))??;
    Ok(format!("{ip}/32"))
}

/// Our public address, for a security group open to it only.
fn my_public_ip() -> std::result::Result<String, ConfigError> {
    gangway_provider::my_public_ip().map_err(ConfigError::NoPublicIp)
}

/// AWS credentials as a bucket client or a node's rclone takes them.
pub use gangway_provider::StoreKeys as StorageCredentials;

/// [`node_credentials`] as the registry hands it out.
fn node_keys<'a>(
    bucket: &'a str,
    prefix: &'a str,
    role: Option<&'a str>,
) -> gangway_provider::StoreFuture<'a> {
    Box::pin(node_credentials(bucket, prefix, role))
}

/// The user's credentials from the SDK's standard chain (environment,
/// profiles, SSO, instance role), as they are.
pub async fn user_credentials() -> std::result::Result<StorageCredentials, String> {
    use aws_credential_types::provider::ProvideCredentials;
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let provider = conf.credentials_provider().ok_or(
        "no AWS credentials provider (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)",
    )?;
    let c = provider
        .provide_credentials()
        .await
        .map_err(|e| format!("no AWS credentials: {e}"))?;
    Ok(StorageCredentials {
        key_id: c.access_key_id().to_string(),
        secret: c.secret_access_key().to_string(),
        token: c.session_token().map(str::to_string),
        expires: c.expiry(),
    })
}

/// Credentials to hand to a node for the S3 bucket `bucket` under
/// `prefix` (empty: the whole bucket): temporary ones only, and no more
/// than that bucket and prefix. With `role` (the user's `aws.node_role`),
/// a one-hour `AssumeRole` session of that role whose session policy
/// ([`node_policy`]) allows listing, reading, writing and deleting under
/// the prefix and nothing else (the session can do what both the role and
/// the policy allow), from any credentials of the user's, temporary ones
/// (SSO, an assumed role) included. Without one, long-lived keys are
/// exchanged for a 12-hour STS federation session with the same policy, so
/// neither the keys nor the rest of the user's permissions leave this
/// machine; temporary user credentials cannot be narrowed that way (STS
/// refuses federation from them) and are passed on as they are.
pub async fn node_credentials(
    bucket: &str,
    prefix: &str,
    role: Option<&str>,
) -> std::result::Result<StorageCredentials, String> {
    let user = user_credentials().await?;
    if user.token.is_some() && role.is_none() {
        return Ok(user);
    }
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .load()
        .await;
    let sts = aws_sdk_sts::Client::new(&conf);
    let region = || conf.region().map_or("us-east-1".into(), |r| r.to_string());
    // STS takes at most 2,048 characters of policy: a prefix too long for
    // that narrows the session to the bucket alone.
    let mut policy = node_policy(bucket, prefix);
    if policy.len() > 2048 {
        policy = node_policy(bucket, "");
    }
    let c = if let Some(role) = role {
        sts.assume_role()
            .role_arn(role)
            // 2-64 of [A-Za-z0-9+=,.@-]: shown in CloudTrail.
            .role_session_name("gangway-node")
            .policy(policy)
            // What every role allows (more needs the role's
            // MaxSessionDuration raised); sessions are renewed anyway.
            .duration_seconds(3600)
            .send()
            .await
            .map_err(|e| from_sdk(e, &region(), &format!("AssumeRole of {role}")).message)?
            .credentials()
            .cloned()
            .ok_or("STS AssumeRole returned no credentials")?
    } else {
        sts.get_federation_token()
            // 2-32 of [A-Za-z0-9+=,.@-]: shown in CloudTrail as the caller.
            .name("gangway-node")
            .policy(policy)
            .duration_seconds(12 * 3600)
            .send()
            .await
            .map_err(|e| from_sdk(e, &region(), "GetFederationToken").message)?
            .credentials()
            .cloned()
            .ok_or("STS GetFederationToken returned no credentials")?
    };
    Ok(StorageCredentials {
        key_id: c.access_key_id().to_string(),
        secret: c.secret_access_key().to_string(),
        token: Some(c.session_token().to_string()),
        expires: std::time::SystemTime::try_from(*c.expiration()).ok(),
    })
}

/// The session policy of a node's credentials for `bucket` under
/// `prefix`: the bucket's location; listing only under the prefix; reading,
/// writing and deleting objects (and multipart uploads) only under it.
/// Nothing of any other bucket.
pub fn node_policy(bucket: &str, prefix: &str) -> String {
    let prefix = prefix.trim_matches('/');
    let bucket_arn = format!("arn:aws:s3:::{bucket}");
    let (objects, listed) = if prefix.is_empty() {
        (vec![format!("{bucket_arn}/*")], None)
    } else {
        (
            vec![
                format!("{bucket_arn}/{prefix}"),
                format!("{bucket_arn}/{prefix}/*"),
            ],
            Some(vec![prefix.to_string(), format!("{prefix}/*")]),
        )
    };
    let mut list = serde_json::json!({
        "Sid": "List",
        "Effect": "Allow",
        "Action": ["s3:ListBucket"],
        "Resource": bucket_arn,
    });
    if let Some(p) = listed {
        list["Condition"] = serde_json::json!({"StringLike": {"s3:prefix": p}});
    }
    serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Bucket",
                "Effect": "Allow",
                "Action": ["s3:GetBucketLocation", "s3:ListBucketMultipartUploads"],
                "Resource": bucket_arn,
            },
            list,
            {
                "Sid": "Objects",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts"
                ],
                "Resource": objects,
            }
        ]
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    /// A node's S3 session reaches its bucket and prefix only.
    #[test]
    fn a_nodes_session_policy_names_its_bucket_and_prefix_only() {
        let p: serde_json::Value = serde_json::from_str(&node_policy("ck", "/run1/")).unwrap();
        let st = p["Statement"].as_array().unwrap();
        assert_eq!(st[0]["Resource"], "arn:aws:s3:::ck");
        assert_eq!(st[1]["Action"], serde_json::json!(["s3:ListBucket"]));
        assert_eq!(
            st[1]["Condition"]["StringLike"]["s3:prefix"],
            serde_json::json!(["run1", "run1/*"])
        );
        assert_eq!(
            st[2]["Resource"],
            serde_json::json!(["arn:aws:s3:::ck/run1", "arn:aws:s3:::ck/run1/*"])
        );
        let whole: serde_json::Value = serde_json::from_str(&node_policy("ck", "")).unwrap();
        assert_eq!(whole["Statement"][1].get("Condition"), None);
        assert_eq!(
            whole["Statement"][2]["Resource"],
            serde_json::json!(["arn:aws:s3:::ck/*"])
        );
        // STS takes at most 2,048 characters of policy.
        assert!(node_policy(&"b".repeat(63), &"p/".repeat(100)).len() < 2048);
    }

    use super::*;

    #[test]
    fn the_spot_advisor_feed_gives_linux_buckets_per_region_and_type() {
        let feed = r#"{"ranges": [{"index": 0, "label": "<5%"}],
            "spot_advisor": {
              "us-east-1": {"Linux": {"p4d.24xlarge": {"s": 69, "r": 4}, "g5.xlarge": {"s": 60, "r": 1}},
                            "Windows": {"g5.xlarge": {"s": 50, "r": 3}}},
              "eu-west-1": {"Linux": {"bad.type": {"s": 1, "r": 9}}}}}"#;
        assert_eq!(
            advisor_buckets(feed),
            Some(vec![
                ("us-east-1".into(), "g5.xlarge".into(), 1),
                ("us-east-1".into(), "p4d.24xlarge".into(), 4),
            ])
        );
        assert_eq!(advisor_buckets(r#"{"spot_advisor": {}}"#), None);
        assert_eq!(advisor_buckets("<html>"), None);
    }

    #[test]
    fn a_price_list_document_gives_its_hourly_on_demand_price() {
        let doc = |unit: &str, usd: &str| {
            serde_json::json!({
                "product": {"productFamily": "Compute Instance", "attributes": {
                    "instanceType": "p4d.24xlarge", "regionCode": "us-east-1",
                    "operatingSystem": "Linux", "tenancy": "Shared"}, "sku": "ABC"},
                "serviceCode": "AmazonEC2",
                "terms": {"OnDemand": {"ABC.JRTCKXETXF": {"priceDimensions": {
                    "ABC.JRTCKXETXF.6YS6EN2CT7": {"unit": unit, "pricePerUnit": {"USD": usd},
                        "description": "$32.7726 per On Demand Linux p4d.24xlarge Instance Hour"}},
                    "sku": "ABC", "effectiveDate": "2026-11-01T00:00:00Z"}}},
                "version": "20261101", "publicationDate": "2026-11-01T00:00:00Z"
            })
            .to_string()
        };
        assert_eq!(
            on_demand_of(&doc("Hrs", "32.7726000000")),
            Some(("p4d.24xlarge".into(), "us-east-1".into(), 32.7726))
        );
        // Not an hourly price, a zero price, not a product document.
        assert_eq!(on_demand_of(&doc("Quantity", "1000")), None);
        assert_eq!(on_demand_of(&doc("Hrs", "0.0000000000")), None);
        assert_eq!(on_demand_of("{\"terms\": {}}"), None);
        assert_eq!(on_demand_of("not json"), None);
    }

    fn req() -> LaunchRequest {
        LaunchRequest {
            cluster: ClusterName("train".into()),
            owner: "alice".into(),
            placement: Placement {
                cloud: "aws".into(),
                region: "us-east-1".into(),
                zone: "us-east-1a".into(),
            },
            instance_type: "p4d.24xlarge".into(),
            count: 4,
            use_spot: true,
            accelerator: Some(("A100".into(), 8.0)),
            disk_size_gib: None,
            image_id: None,
            client_token: "tok".into(),
            provider_config: None,
            network_tier: None,
            max_price: None,
            ports: Vec::new(),
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn client_tokens_are_stable_and_differ_per_request() {
        let r = req();
        let a = client_token(&r, "alice", 4, &[]);
        assert_eq!(a, client_token(&r, "alice", 4, &[]));
        assert!(a.len() <= 64 && a.starts_with("gw-train-"), "{a}");
        assert_ne!(a, client_token(&r, "alice", 2, &["i-1", "i-2"]));
        assert_ne!(a, client_token(&r, "bob", 4, &[]));
        let mut other = r.clone();
        other.placement.zone = "us-east-1b".into();
        assert_ne!(a, client_token(&other, "alice", 4, &[]));
        let mut long = r;
        long.cluster = ClusterName("x".repeat(200));
        assert!(client_token(&long, "alice", 1, &[]).len() <= 64);
    }

    #[test]
    fn spot_reclaims_are_preemptions_not_terminations() {
        use aws_sdk_ec2::types::{InstanceState, StateReason};
        let reclaimed = Instance::builder()
            .state(
                InstanceState::builder()
                    .name(InstanceStateName::Terminated)
                    .build(),
            )
            .state_reason(
                StateReason::builder()
                    .code(SPOT_REASON)
                    .message("Server.SpotInstanceTermination: Spot instance termination")
                    .build(),
            )
            .build();
        assert!(
            matches!(state_of(&reclaimed), NodeState::Preempted { reason } if reason.contains("spot"))
        );
        let ended = Instance::builder()
            .state(
                InstanceState::builder()
                    .name(InstanceStateName::Terminated)
                    .build(),
            )
            .build();
        assert_eq!(state_of(&ended), NodeState::Terminated);
        let stopped = Instance::builder()
            .state(
                InstanceState::builder()
                    .name(InstanceStateName::Stopped)
                    .build(),
            )
            .build();
        assert_eq!(state_of(&stopped), NodeState::Stopped);
    }

    #[test]
    fn families_for_topology() {
        assert_eq!(family("p4d.24xlarge"), "p4d");
        assert!(TOPOLOGY_FAMILIES.contains(&family("p5.48xlarge")));
        assert!(!TOPOLOGY_FAMILIES.contains(&family("g5.xlarge")));
    }

    #[test]
    fn names_are_per_owner() {
        let a = AwsProvider::new("/tmp/a".into(), "alice", "/k".into());
        let b = AwsProvider::new("/tmp/a".into(), "bob", "/k".into());
        let c = ClusterName("train".into());
        assert_ne!(a.resource_name(&c), b.resource_name(&c));
        assert!(a.resource_name(&c).starts_with("gangway-train-"));
    }
}
