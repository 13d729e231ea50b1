//! The Lambda Cloud provider: on-demand GPU VMs through Lambda's public
//! REST API (v1).
//!
//! Launch is a reconcile: the cluster's instances are found by their tags
//! (`gangway-cluster` + `gangway-owner`), those of the right type and
//! region are reused, others terminated, and only the shortfall launched,
//! one instance per request (the API's launch takes no count; at most one
//! launch every 12 s). If any node of the shortfall cannot be launched or
//! does not come up, every node launched for it is terminated: all or
//! nothing. Nodes are reached over SSH on their public address, port 22,
//! with gangway's key, registered on the account as `<owner>--<cluster>`
//! (keys cannot be tagged) and removed with the cluster.
//!
//! The API key comes from `LAMBDA_API_KEY`, else `~/.lambda_cloud/lambda_keys`
//! (module [`key`]); it is sent only in the `Authorization` header and
//! never written anywhere. `GANGWAY_LAMBDA_ENDPOINT` points the client
//! elsewhere (the test fake), and `GANGWAY_LAMBDA_RATE_SCALE` multiplies
//! the client's rate-limit windows (tests: 0.01, as the fake's
//! `--rate-scale`).
#![deny(missing_docs)]

pub mod api;
pub mod key;
pub mod limit;
pub mod names;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeState, Placement,
    PriceQuote, Prices, Provider, ProviderError, Result, SshEndpoint, TaggedCluster,
};
use serde::Deserialize;

use api::{Client, Instance, InstanceStatus, Retry};
use gangway_provider::http::record::Records;
use names::{TAG_CLUSTER, TAG_OWNER, TAG_USER};

/// Replaces [`api::DEFAULT_ENDPOINT`] (a fake, a proxy).
pub const ENDPOINT_VAR: &str = "GANGWAY_LAMBDA_ENDPOINT";
/// Multiplies the client's rate-limit windows (default 1).
pub const RATE_SCALE_VAR: &str = "GANGWAY_LAMBDA_RATE_SCALE";

/// The regions of the API's `PublicRegionCode` (document 1.8.3).
pub const REGIONS: &[&str] = &[
    "asia-northeast-1",
    "asia-northeast-2",
    "asia-south-1",
    "australia-east-1",
    "europe-central-1",
    "me-west-1",
    "us-east-1",
    "us-east-2",
    "us-east-3",
    "us-midwest-1",
    "us-midwest-2",
    "us-south-1",
    "us-south-2",
    "us-south-3",
    "us-west-1",
    "us-west-2",
    "us-west-3",
];

const INSTANCES: &str = "/api/v1/instances";
const INSTANCE_TYPES: &str = "/api/v1/instance-types";
const LAUNCH: &str = "/api/v1/instance-operations/launch";
const TERMINATE: &str = "/api/v1/instance-operations/terminate";
const SSH_KEYS: &str = "/api/v1/ssh-keys";

/// The task's `config.lambda` section.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LambdaOptions {
    /// Login user on the nodes (`ubuntu` on Lambda's images).
    #[serde(default = "default_user")]
    pub ssh_user: String,
    /// Seconds to wait for every node to be `active` before giving up.
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_s: u64,
    /// Milliseconds between state polls (default: 3 s, scaled with the
    /// rate limits).
    #[serde(default)]
    pub poll_ms: Option<u64>,
}

fn default_user() -> String {
    "ubuntu".into()
}

fn default_boot_timeout() -> u64 {
    1200
}

impl LambdaOptions {
    /// Reads `config.lambda` (none: the defaults).
    pub fn from_value(v: Option<&serde_json::Value>) -> std::result::Result<Self, String> {
        match v {
            None | Some(serde_json::Value::Null) => Ok(serde_json::from_value(
                serde_json::Value::Object(Default::default()),
            )
            .expect("defaults")),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                format!("config.lambda: {e} (known: ssh_user, boot_timeout_s, poll_ms)")
            }),
        }
    }
}

/// The Lambda Cloud provider.
pub struct LambdaProvider {
    owner: String,
    user: Option<String>,
    public_key: PathBuf,
    records: Records,
    client: Client,
    /// Where the key was found, or what is wrong with the key file.
    key_source: std::result::Result<Option<String>, String>,
    scale: f64,
}

impl LambdaProvider {
    /// A provider tagging with `owner`, registering `public_key` (an
    /// OpenSSH `.pub` file) for each cluster, keeping its records under
    /// `root`, with the API key and endpoint of this process's
    /// environment.
    pub fn new(root: PathBuf, owner: impl Into<String>, public_key: PathBuf) -> LambdaProvider {
        let found = key::from_environment();
        let endpoint = std::env::var(ENDPOINT_VAR)
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| api::DEFAULT_ENDPOINT.to_string());
        let scale = std::env::var(RATE_SCALE_VAR)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(1.0);
        let (key, key_source) = match found {
            Ok(Some(f)) => (Some(f.key), Ok(Some(f.source))),
            Ok(None) => (None, Ok(None)),
            Err(e) => (None, Err(e)),
        };
        let limiter = limit::limiter(scale);
        LambdaProvider {
            owner: owner.into(),
            user: None,
            public_key,
            records: Records::new(root.join("clusters")),
            client: Client::new(&endpoint, key, limiter),
            key_source,
            scale: if scale.is_finite() && scale >= 0.0 {
                scale
            } else {
                1.0
            },
        }
    }

    /// The same provider on `endpoint` with `key`, its rate-limit windows
    /// multiplied by `scale`, instead of what the environment says (tests,
    /// embedding).
    pub fn with_api(mut self, endpoint: &str, key: key::ApiKey, scale: f64) -> LambdaProvider {
        self.client = Client::new(endpoint, Some(key), limit::limiter(scale));
        self.key_source = Ok(Some("the caller".into()));
        self.scale = self.client.scale();
        self
    }

    /// The same provider tagging instances with `user` too (readable).
    pub fn with_user(mut self, user: impl Into<String>) -> LambdaProvider {
        self.user = Some(user.into()).filter(|u: &String| !u.is_empty());
        self
    }

    fn err(kind: ErrorKind, location: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(kind, "lambda", location, message)
    }

    /// Every instance of the account.
    async fn all_instances(&self, location: &str) -> Result<Vec<Instance>> {
        self.client.get(INSTANCES, "list instances", location).await
    }

    /// This owner's instances of `cluster`, not yet terminated, by name.
    async fn mine(&self, cluster: &str, location: &str) -> Result<Vec<Instance>> {
        let mut v: Vec<Instance> = self
            .all_instances(location)
            .await?
            .into_iter()
            .filter(|i| {
                i.tag(TAG_CLUSTER) == Some(cluster)
                    && i.tag(TAG_OWNER) == Some(self.owner.as_str())
                    && i.status != InstanceStatus::Terminated
            })
            .collect();
        v.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        Ok(v)
    }

    /// Ends `ids` (a 404 for one that is already gone is no failure).
    async fn terminate_ids(&self, ids: Vec<String>, location: &str) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let body = api::TerminateInstances {
            instance_ids: ids.clone(),
        };
        match self
            .client
            .post::<_, serde::de::IgnoredAny>(TERMINATE, &body, "terminate", location, Retry::Safe)
            .await
        {
            Ok(_) => Ok(()),
            // One of them went meanwhile: end the others one by one.
            Err(e) if e.kind == ErrorKind::InvalidRequest && ids.len() > 1 => {
                for id in ids {
                    let one = api::TerminateInstances {
                        instance_ids: vec![id],
                    };
                    match self
                        .client
                        .post::<_, serde::de::IgnoredAny>(
                            TERMINATE,
                            &one,
                            "terminate",
                            location,
                            Retry::Safe,
                        )
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if e.message.contains("object-does-not-exist") => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Err(e) if e.message.contains("object-does-not-exist") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The cluster's account key, registered with gangway's public key
    /// (replaced if it holds another).
    async fn ensure_key(&self, cluster: &str, location: &str) -> Result<String> {
        let public = std::fs::read_to_string(&self.public_key).map_err(|e| {
            Self::err(
                ErrorKind::Fatal,
                location,
                format!(
                    "reading gangway's public key {}: {e}",
                    self.public_key.display()
                ),
            )
        })?;
        let public = public.trim().to_string();
        let name = names::key_name(&self.owner, cluster);
        let keys: Vec<api::SshKey> = self.client.get(SSH_KEYS, "list SSH keys", location).await?;
        if let Some(k) = keys.iter().find(|k| k.name == name) {
            if same_key(&k.public_key, &public) {
                return Ok(name);
            }
            self.delete_key(&k.id, location).await?;
        }
        let add = api::AddSshKey {
            name: name.clone(),
            public_key: public,
        };
        let _: serde::de::IgnoredAny = self
            .client
            .post(SSH_KEYS, &add, "add SSH key", location, Retry::Safe)
            .await?;
        Ok(name)
    }

    async fn delete_key(&self, id: &str, location: &str) -> Result<()> {
        let _: serde::de::IgnoredAny = self
            .client
            .call(
                reqwest::Method::DELETE,
                &format!("{SSH_KEYS}/{id}"),
                None,
                "delete SSH key",
                location,
                Retry::Safe,
            )
            .await?;
        Ok(())
    }

    fn poll(&self, opts: &LambdaOptions) -> Duration {
        let d = match opts.poll_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs(3).mul_f64(self.scale),
        };
        d.max(Duration::from_millis(20))
    }

    /// Waits until every one of `ids` is `active` with an address.
    async fn wait_active(
        &self,
        ids: &BTreeSet<String>,
        req: &LaunchRequest,
        opts: &LambdaOptions,
    ) -> Result<Vec<Instance>> {
        let region = req.placement.region.as_str();
        let deadline = Instant::now() + Duration::from_secs(opts.boot_timeout_s);
        loop {
            let all = self.all_instances(region).await?;
            let ours: Vec<&Instance> = all.iter().filter(|i| ids.contains(&i.id)).collect();
            for i in &ours {
                if matches!(
                    i.status,
                    InstanceStatus::Terminated
                        | InstanceStatus::Terminating
                        | InstanceStatus::Preempted
                ) {
                    return Err(Self::err(
                        ErrorKind::Capacity,
                        region,
                        format!("instance {} went {:?} while booting", i.id, i.status)
                            .to_lowercase(),
                    ));
                }
            }
            let up = ours
                .iter()
                .filter(|i| i.status == InstanceStatus::Active && i.ip.is_some())
                .count();
            if up == ids.len() {
                let mut v: Vec<Instance> = ours.into_iter().cloned().collect();
                v.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
                return Ok(v);
            }
            if ours.len() < ids.len() && all.iter().all(|i| !ids.contains(&i.id)) {
                return Err(Self::err(
                    ErrorKind::Capacity,
                    region,
                    "the launched instances are no longer listed",
                ));
            }
            if Instant::now() >= deadline {
                return Err(Self::err(
                    ErrorKind::Capacity,
                    region,
                    format!(
                        "{up} of {} instances active after {} s (config.lambda.boot_timeout_s)",
                        ids.len(),
                        opts.boot_timeout_s
                    ),
                ));
            }
            tokio::time::sleep(self.poll(opts)).await;
        }
    }

    fn node(&self, i: &Instance, ssh_user: &str, zone: Option<&str>) -> Node {
        let mut extra = BTreeMap::new();
        let public_ip = i.ip.clone().filter(|ip| !ip.is_empty());
        // Lambda's VMs answer SSH on port 22 of their public address: the
        // API has no other port to say.
        SshEndpoint::new(public_ip.clone().unwrap_or_default(), ssh_user).record(&mut extra);
        extra.insert("instance_type".into(), i.instance_type.name.clone());
        extra.insert("market".into(), "on-demand".into());
        if i.instance_type.price_cents_per_hour > 0 {
            extra.insert(
                gangway_provider::PRICE_FACT.into(),
                (i.instance_type.price_cents_per_hour as f64 / 100.0).to_string(),
            );
        }
        if i.status == InstanceStatus::Unhealthy {
            extra.insert("lambda_status".into(), "unhealthy".into());
        }
        let state = match i.status {
            InstanceStatus::Booting | InstanceStatus::Unknown => NodeState::Pending,
            InstanceStatus::Active | InstanceStatus::Unhealthy => NodeState::Running,
            InstanceStatus::Terminating | InstanceStatus::Terminated => NodeState::Terminated,
            InstanceStatus::Preempted => NodeState::Preempted {
                reason: "Lambda reported the instance preempted".into(),
            },
        };
        Node {
            id: InstanceId(i.id.clone()),
            state,
            private_ip: i
                .private_ip
                .clone()
                .filter(|p| !p.is_empty())
                .or_else(|| public_ip.clone())
                .unwrap_or_default(),
            public_ip,
            placement: Placement {
                cloud: "lambda".into(),
                region: i.region.name.clone(),
                zone: zone.unwrap_or(&i.region.name).to_string(),
            },
            topology: Vec::new(),
            extra,
        }
    }

    fn nodes(&self, cluster: &str, instances: &[Instance]) -> Vec<Node> {
        let rec = self.records.get(cluster).unwrap_or_default();
        let user = rec.ssh_user.unwrap_or_else(default_user);
        instances
            .iter()
            .map(|i| {
                let zone = rec
                    .zone
                    .as_deref()
                    .filter(|_| rec.region.as_deref() == Some(i.region.name.as_str()));
                self.node(i, &user, zone)
            })
            .collect()
    }

    /// Launches the shortfall one by one; the ids launched, or the first
    /// error.
    async fn launch_shortfall(
        &self,
        req: &LaunchRequest,
        keep: &[Instance],
        key_name: &str,
        launched: &mut BTreeSet<String>,
    ) -> Result<()> {
        let region = req.placement.region.as_str();
        let tags = names::tags(
            &req.cluster.0,
            &self.owner,
            self.user.as_deref(),
            &req.labels,
        )
        .map_err(|e| Self::err(ErrorKind::InvalidRequest, region, e))?;
        let taken: BTreeSet<String> = keep.iter().filter_map(|i| i.name.clone()).collect();
        let mut index = 0;
        for _ in 0..(req.count as usize).saturating_sub(keep.len()) {
            let mut name = names::instance_name(&req.cluster.0, index);
            while taken.contains(&name) {
                index += 1;
                name = names::instance_name(&req.cluster.0, index);
            }
            index += 1;
            let body = api::LaunchInstance {
                region_name: region.to_string(),
                instance_type_name: req.instance_type.clone(),
                ssh_key_names: vec![key_name.to_string()],
                name,
                tags: tags.clone(),
                image: req.image_id.clone().map(|id| api::ImageId { id }),
            };
            let out: api::Launched = self
                .client
                .post(LAUNCH, &body, "launch", region, Retry::OnlyThrottled)
                .await?;
            launched.extend(out.instance_ids);
        }
        Ok(())
    }
}

/// Whether two OpenSSH public keys are the same key (type and blob; the
/// comment may differ).
fn same_key(a: &str, b: &str) -> bool {
    let core = |s: &str| s.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    core(a) == core(b)
}

/// Lambda in the core's registry: on with an owner id to tag with, its
/// records under `records/lambda`.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: "lambda",
    build: |s| {
        Some(std::sync::Arc::new(
            LambdaProvider::new(s.records.join("lambda"), s.owner?, s.public_key())
                .with_user(s.user),
        ))
    },
    capacity: gangway_provider::no_capacity,
    hosts_controller: false,
    stores: &[],
};

#[async_trait::async_trait]
impl Provider for LambdaProvider {
    fn name(&self) -> &str {
        "lambda"
    }

    fn has_price_api(&self) -> bool {
        true
    }

    fn cannot_stop(&self, _use_spot: bool) -> Option<&'static str> {
        Some("Lambda Cloud instances cannot be stopped, only terminated")
    }

    async fn check(&self) -> Result<CheckReport> {
        let source = match &self.key_source {
            Err(e) => {
                return Ok(CheckReport {
                    ok: false,
                    identity: None,
                    regions: Vec::new(),
                    hint: Some(format!("{e}; {}", key::hint())),
                })
            }
            Ok(None) => {
                return Ok(CheckReport {
                    ok: false,
                    identity: None,
                    regions: Vec::new(),
                    hint: Some(key::hint()),
                })
            }
            Ok(Some(s)) => s.clone(),
        };
        let identity = Some(format!("API key from {source}"));
        match self
            .client
            .get::<BTreeMap<String, api::InstanceTypesItem>>(
                INSTANCE_TYPES,
                "list instance types",
                "",
            )
            .await
        {
            Ok(_) => Ok(CheckReport {
                ok: true,
                identity,
                regions: REGIONS.iter().map(|r| r.to_string()).collect(),
                hint: None,
            }),
            Err(e) => Ok(CheckReport {
                ok: false,
                identity,
                regions: Vec::new(),
                hint: Some(e.message),
            }),
        }
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let region = req.placement.region.as_str();
        if req.use_spot {
            return Err(Self::err(
                ErrorKind::InvalidRequest,
                region,
                "Lambda Cloud sells no spot instances",
            ));
        }
        let opts = LambdaOptions::from_value(req.provider_config.as_ref())
            .map_err(|e| Self::err(ErrorKind::InvalidRequest, region, e))?;
        self.records
            .update(&req.cluster.0, |r| {
                r.ssh_user = Some(opts.ssh_user.clone());
                r.region = Some(region.to_string());
                r.zone = Some(req.placement.zone.clone());
            })
            .map_err(|e| {
                Self::err(
                    ErrorKind::Fatal,
                    "local",
                    format!("recording the cluster: {e}"),
                )
            })?;
        let existing = self.mine(&req.cluster.0, region).await?;
        let fits = |i: &Instance| {
            i.region.name == region
                && i.instance_type.name == req.instance_type
                && matches!(
                    i.status,
                    InstanceStatus::Booting | InstanceStatus::Active | InstanceStatus::Unhealthy
                )
        };
        let (mut keep, strays): (Vec<Instance>, Vec<Instance>) =
            existing.into_iter().partition(|i| fits(i));
        let extras = keep.split_off(keep.len().min(req.count as usize));
        let drop: Vec<String> = strays
            .iter()
            .chain(&extras)
            .filter(|i| i.status != InstanceStatus::Terminating)
            .map(|i| i.id.clone())
            .collect();
        self.terminate_ids(drop, region).await?;

        let key_name = self.ensure_key(&req.cluster.0, region).await?;
        let mut launched = BTreeSet::new();
        let mut result = self
            .launch_shortfall(req, &keep, &key_name, &mut launched)
            .await;
        let mut ids: BTreeSet<String> = keep.iter().map(|i| i.id.clone()).collect();
        ids.extend(launched.iter().cloned());
        let mut up = Vec::new();
        if result.is_ok() {
            match self.wait_active(&ids, req, &opts).await {
                Ok(v) => up = v,
                Err(e) => result = Err(e),
            }
        }
        if let Err(e) = result {
            // All or nothing: whatever this launch made goes, found again
            // by tag in case an answer was lost.
            let kept: BTreeSet<&str> = keep.iter().map(|i| i.id.as_str()).collect();
            let again = self.mine(&req.cluster.0, region).await.unwrap_or_default();
            let mut undo: BTreeSet<String> = launched;
            undo.extend(
                again
                    .iter()
                    .filter(|i| !kept.contains(i.id.as_str()))
                    .filter(|i| i.status != InstanceStatus::Terminating)
                    .map(|i| i.id.clone()),
            );
            if let Err(cleanup) = self.terminate_ids(undo.into_iter().collect(), region).await {
                return Err(Self::err(
                    e.kind,
                    region,
                    format!(
                        "{}; terminating the nodes this launch made also failed: {}",
                        e.message, cleanup.message
                    ),
                ));
            }
            return Err(e);
        }
        Ok(self.nodes(&req.cluster.0, &up))
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let live: Vec<Instance> = self
            .mine(&cluster.0, "")
            .await?
            .into_iter()
            .filter(|i| i.status != InstanceStatus::Terminating)
            .collect();
        Ok(self.nodes(&cluster.0, &live))
    }

    async fn stop(&self, _cluster: &ClusterName) -> Result<()> {
        Err(Self::err(
            ErrorKind::InvalidRequest,
            "",
            "Lambda Cloud instances cannot be stopped, only terminated (gangway down)",
        ))
    }

    async fn start(
        &self,
        _cluster: &ClusterName,
        _provider_config: Option<&serde_json::Value>,
    ) -> Result<Vec<Node>> {
        Err(Self::err(
            ErrorKind::InvalidRequest,
            "",
            "Lambda Cloud instances cannot be stopped, so there is nothing to start",
        ))
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let name = cluster.0.as_str();
        let ids: Vec<String> = self
            .mine(name, "")
            .await?
            .into_iter()
            .filter(|i| i.status != InstanceStatus::Terminating)
            .map(|i| i.id)
            .collect();
        self.terminate_ids(ids, "").await?;
        // Until they are gone (Lambda lists them `terminating` a while), so
        // that `down` returning means nothing of the cluster is left.
        let deadline = Instant::now() + Duration::from_secs(300).mul_f64(self.scale.max(0.01));
        let opts = LambdaOptions::from_value(None).expect("defaults");
        while !self.mine(name, "").await?.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(self.poll(&opts)).await;
        }
        let key = names::key_name(&self.owner, name);
        let keys: Vec<api::SshKey> = self.client.get(SSH_KEYS, "list SSH keys", "").await?;
        for k in keys.iter().filter(|k| k.name == key) {
            self.delete_key(&k.id, "").await?;
        }
        self.records.remove(name).map_err(|e| {
            Self::err(
                ErrorKind::Fatal,
                "local",
                format!("forgetting the cluster: {e}"),
            )
        })
    }

    async fn clusters(&self) -> Result<Vec<TaggedCluster>> {
        let mut out = BTreeSet::new();
        for i in self.all_instances("").await? {
            if i.status == InstanceStatus::Terminated {
                continue;
            }
            if let (Some(c), Some(o)) = (i.tag(TAG_CLUSTER), i.tag(TAG_OWNER)) {
                out.insert(TaggedCluster {
                    name: ClusterName(c.to_string()),
                    owner: o.to_string(),
                    user: i.tag(TAG_USER).map(str::to_string),
                });
            }
        }
        // A key left without its instances (a launch that died between the
        // two) is a cluster too.
        let keys: Vec<api::SshKey> = self.client.get(SSH_KEYS, "list SSH keys", "").await?;
        for k in &keys {
            if let Some((o, c)) = names::parse_key_name(&k.name) {
                if !out.iter().any(|t| t.name.0 == c && t.owner == o) {
                    out.insert(TaggedCluster {
                        name: ClusterName(c.to_string()),
                        owner: o.to_string(),
                        user: None,
                    });
                }
            }
        }
        Ok(out.into_iter().collect())
    }

    async fn prices(&self, instance_types: &[String], regions: &[String]) -> Result<Prices> {
        let types: BTreeMap<String, api::InstanceTypesItem> = self
            .client
            .get(INSTANCE_TYPES, "list instance types", "")
            .await?;
        Ok(prices_of(&types, instance_types, regions))
    }
}

/// Quotes from `GET /instance-types`: Lambda's price is one per type, the
/// same in every region, so each asked region gets it.
fn prices_of(
    types: &BTreeMap<String, api::InstanceTypesItem>,
    instance_types: &[String],
    regions: &[String],
) -> Prices {
    let mut out = Prices::default();
    for t in instance_types {
        let Some(item) = types.get(t) else {
            out.notes
                .push(format!("{t}: Lambda no longer lists this type"));
            continue;
        };
        for r in regions {
            // Only where it can be launched now: a region without capacity
            // is not quoted, so the refreshed catalog does not plan there.
            if !item
                .regions_with_capacity_available
                .iter()
                .any(|c| c.name == *r)
            {
                out.notes.push(format!("{t}: no capacity in {r} now"));
                continue;
            }
            out.quotes.push(PriceQuote {
                instance_type: t.clone(),
                region: r.clone(),
                zone: None,
                price: Some(item.instance_type.price_cents_per_hour as f64 / 100.0),
                spot_price: None,
                accelerator: None,
                accelerator_count: None,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_default_and_refuse_unknown_keys() {
        let o = LambdaOptions::from_value(None).unwrap();
        assert_eq!(o.ssh_user, "ubuntu");
        assert_eq!(o.boot_timeout_s, 1200);
        let o = LambdaOptions::from_value(Some(&serde_json::json!({"ssh_user": "root"}))).unwrap();
        assert_eq!(o.ssh_user, "root");
        let e =
            LambdaOptions::from_value(Some(&serde_json::json!({"sshuser": "root"}))).unwrap_err();
        assert!(
            e.contains("sshuser") && e.contains("known: ssh_user"),
            "{e}"
        );
    }

    #[test]
    fn keys_compare_without_their_comments() {
        assert!(same_key(
            "ssh-ed25519 AAAA gangway",
            "ssh-ed25519 AAAA other\n"
        ));
        assert!(!same_key("ssh-ed25519 AAAA", "ssh-ed25519 BBBB"));
    }

    fn instance(status: &str, ip: Option<&str>) -> Instance {
        serde_json::from_value(serde_json::json!({
            "id": "i1", "status": status, "ip": ip, "private_ip": "10.1.2.3",
            "region": {"name": "us-east-1"}, "name": "c-0",
            "instance_type": {"name": "gpu_1x_a10", "price_cents_per_hour": 129},
            "tags": [],
        }))
        .unwrap()
    }

    #[test]
    fn a_node_is_reached_on_its_public_address_port_22() {
        let p = LambdaProvider::new("/nonexistent".into(), "gw-0123456789abcdef", "/k".into());
        let n = p.node(
            &instance("active", Some("203.0.113.9")),
            "ubuntu",
            Some("us-east-1"),
        );
        assert_eq!(n.state, NodeState::Running);
        assert_eq!(n.private_ip, "10.1.2.3");
        assert_eq!(
            n.extra.get("ssh.host").map(String::as_str),
            Some("203.0.113.9")
        );
        assert_eq!(n.extra.get("ssh.port").map(String::as_str), Some("22"));
        assert_eq!(n.extra.get("ssh.user").map(String::as_str), Some("ubuntu"));
        assert_eq!(
            n.extra
                .get(gangway_provider::PRICE_FACT)
                .map(String::as_str),
            Some("1.29")
        );
        assert_eq!(n.placement.zone, "us-east-1");
        let n = p.node(&instance("preempted", None), "ubuntu", None);
        assert!(matches!(n.state, NodeState::Preempted { .. }));
        assert_eq!(
            p.node(&instance("booting", None), "u", None).state,
            NodeState::Pending
        );
    }

    #[test]
    fn prices_are_quoted_only_where_there_is_capacity_now() {
        let types: BTreeMap<String, api::InstanceTypesItem> =
            serde_json::from_value(serde_json::json!({"gpu_8x_h100_sxm5": {
                "instance_type": {"name": "gpu_8x_h100_sxm5", "price_cents_per_hour": 3192},
                "regions_with_capacity_available": [{"name": "us-south-2"}]}}))
            .unwrap();
        let p = prices_of(
            &types,
            &["gpu_8x_h100_sxm5".into(), "gpu_gone".into()],
            &["us-south-2".into(), "us-east-1".into()],
        );
        assert_eq!(p.quotes.len(), 1);
        assert_eq!(p.quotes[0].region, "us-south-2");
        assert_eq!(p.quotes[0].price, Some(31.92));
        assert_eq!(p.notes.len(), 2, "{:?}", p.notes);
        assert!(p
            .notes
            .iter()
            .any(|n| n.contains("no capacity in us-east-1")));
    }
}
