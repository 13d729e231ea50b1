//! The RunPod provider: on-demand GPU pods through RunPod's REST API v2
//! (v1 was retired on 2026-11-15).
//!
//! A pod is a container on a GPU host, reached as `root` over SSH on the
//! host's public address and the port RunPod maps to the pod's `22/tcp`
//! (`ssh.direct`); it has no systemd and may not answer `nvidia-smi topo`.
//! gangway's public key goes into the pod's `PUBLIC_KEY` variable, which
//! RunPod's images install for root: the account's own key list (`PUT
//! /v2/account/ssh-keys` replaces it whole) is never touched.
//!
//! Launch is a reconcile: the cluster's pods are found by the tags in
//! their environment ([`names`]; v2 pods have no tags and its list no
//! filter), those of the right type and data center are reused, others
//! terminated, and only the shortfall created, one pod per request, all
//! in the one data center of the placement. If any pod of the shortfall
//! cannot be created or does not come up, every pod created for it is
//! terminated: all or nothing. A gang of several pods is created on
//! RunPod's global networking, so its ranks reach each other on private
//! addresses; data centers without it have no room for a gang.
//!
//! Spot (interruptible) pods are not in v2: a spot launch rents them
//! through RunPod's GraphQL API (`podRentInterruptable`), one request a
//! pod, and is otherwise the same launch (reconcile, names and tags,
//! ports, key, all or nothing, waiting, teardown through v2). The bid is
//! the GPU type's spot price per GPU-hour now (GraphQL `gpuTypes`: the
//! figure the catalog's spot column comes from); `max_hourly_cost` only
//! caps it: a spot price over the cap per GPU is no capacity here. A spot
//! pod carries `GANGWAY_TAG_MARKET=spot`; one RunPod stopped (`EXITED`) is
//! preempted. GraphQL's spot input has no global networking, so a spot
//! gang of several pods is refused unless `config.runpod.global_networking`
//! is `false` (its ranks then meet on public addresses). The API
//! key comes from `RUNPOD_API_KEY`, else runpodctl's config (module
//! [`key`]); it is sent only in the `Authorization` header.
//! `GANGWAY_RUNPOD_ENDPOINT` points the client elsewhere (the test fake)
//! and `GANGWAY_RUNPOD_RATE_SCALE` multiplies its rate-limit window.
#![deny(missing_docs)]

pub mod api;
pub mod key;
pub mod names;
pub mod types;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeState, Placement,
    PriceQuote, Prices, Provider, ProviderError, Result, SshEndpoint, TaggedCluster,
};
use serde::Deserialize;

use api::{Client, Op, Pod, PodStatus, Retry};
use gangway_provider::http::record::Records;
use names::{SPOT, TAG_CLUSTER, TAG_MARKET, TAG_OWNER, TAG_USER};

/// Replaces [`api::DEFAULT_ENDPOINT`] (a fake, a proxy).
pub const ENDPOINT_VAR: &str = "GANGWAY_RUNPOD_ENDPOINT";
/// Multiplies the client's rate-limit window (default 1).
pub const RATE_SCALE_VAR: &str = "GANGWAY_RUNPOD_RATE_SCALE";

/// The image a pod runs unless the task names one: RunPod's PyTorch
/// image, which starts sshd with `PUBLIC_KEY` installed.
pub const DEFAULT_IMAGE: &str = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04";

const PODS: &str = "/v2/pods";
const GPUS: &str = "/v2/catalog/gpus";
const DATA_CENTERS: &str = "/v2/catalog/datacenters";

/// The task's `config.runpod` section.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunpodOptions {
    /// Container image (default [`DEFAULT_IMAGE`]; `image_id` wins).
    #[serde(default)]
    pub image: Option<String>,
    /// Seconds to wait for every pod to be `RUNNING` with SSH.
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_s: u64,
    /// Milliseconds between state polls (default: 3 s, scaled with the
    /// rate limit).
    #[serde(default)]
    pub poll_ms: Option<u64>,
    /// Put the pods on RunPod's global networking (default: when there
    /// are several, so the gang's ranks reach each other).
    #[serde(default)]
    pub global_networking: Option<bool>,
}

fn default_boot_timeout() -> u64 {
    1200
}

impl RunpodOptions {
    /// Reads `config.runpod` (none: the defaults).
    pub fn from_value(v: Option<&serde_json::Value>) -> std::result::Result<Self, String> {
        let v = match v {
            None | Some(serde_json::Value::Null) => serde_json::json!({}),
            Some(v) => v.clone(),
        };
        serde_json::from_value(v).map_err(|e| {
            format!("config.runpod: {e} (known: image, boot_timeout_s, poll_ms, global_networking)")
        })
    }
}

/// The RunPod provider.
pub struct RunpodProvider {
    owner: String,
    user: Option<String>,
    public_key: PathBuf,
    records: Records,
    client: Client,
    /// Where the key was found, or what is wrong with the key file.
    key_source: std::result::Result<Option<String>, String>,
    scale: f64,
}

impl RunpodProvider {
    /// A provider tagging with `owner`, installing `public_key` (an
    /// OpenSSH `.pub` file) on its pods, keeping its records under `root`,
    /// with the API key and endpoint of this process's environment.
    pub fn new(root: PathBuf, owner: impl Into<String>, public_key: PathBuf) -> RunpodProvider {
        let endpoint = std::env::var(ENDPOINT_VAR)
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| api::DEFAULT_ENDPOINT.to_string());
        let scale = std::env::var(RATE_SCALE_VAR)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(1.0);
        let (key, key_source) = match key::from_environment() {
            Ok(Some(f)) => (Some(f.key), Ok(Some(f.source))),
            Ok(None) => (None, Ok(None)),
            Err(e) => (None, Err(e)),
        };
        let client = Client::new(
            &endpoint,
            key,
            gangway_provider::http::limit::Limiter::new(scale),
        );
        RunpodProvider {
            owner: owner.into(),
            user: None,
            public_key,
            records: Records::new(root.join("clusters")),
            scale: client.scale(),
            client,
            key_source,
        }
    }

    /// The same provider on `endpoint` with `key`, its rate-limit window
    /// multiplied by `scale`, instead of what the environment says.
    pub fn with_api(mut self, endpoint: &str, key: key::ApiKey, scale: f64) -> RunpodProvider {
        self.client = Client::new(
            endpoint,
            Some(key),
            gangway_provider::http::limit::Limiter::new(scale),
        );
        self.key_source = Ok(Some("the caller".into()));
        self.scale = self.client.scale();
        self
    }

    /// The same provider tagging pods with `user` too (readable).
    pub fn with_user(mut self, user: impl Into<String>) -> RunpodProvider {
        self.user = Some(user.into()).filter(|u: &String| !u.is_empty());
        self
    }

    fn err(kind: ErrorKind, location: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(kind, "runpod", location, message)
    }

    /// Every pod of the account.
    async fn all_pods(&self, location: &str) -> Result<Vec<Pod>> {
        Ok(self
            .client
            .get::<api::Pods>(PODS, "list pods", location)
            .await?
            .pods)
    }

    /// This owner's pods of `cluster`, not terminated, by name.
    async fn mine(&self, cluster: &str, location: &str) -> Result<Vec<Pod>> {
        let mut v: Vec<Pod> = self
            .all_pods(location)
            .await?
            .into_iter()
            .filter(|p| {
                p.env(TAG_CLUSTER) == Some(cluster)
                    && p.env(TAG_OWNER) == Some(self.owner.as_str())
                    && p.status != PodStatus::Terminated
            })
            .collect();
        v.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
        Ok(v)
    }

    /// Terminates `ids` (one already gone is no failure).
    async fn terminate_ids(&self, ids: &[String], location: &str) -> Result<()> {
        for id in ids {
            let path = format!("{PODS}/{id}");
            match self
                .client
                .call::<serde::de::IgnoredAny>(
                    reqwest::Method::DELETE,
                    &path,
                    None,
                    Op::Other,
                    "terminate pod",
                    location,
                    Retry::Safe,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.message.contains("HTTP 404") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn poll(&self, opts: &RunpodOptions) -> Duration {
        let d = match opts.poll_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs(3).mul_f64(self.scale),
        };
        d.max(Duration::from_millis(20))
    }

    /// Waits until every one of `ids` is `RUNNING` with `ssh.direct`.
    async fn wait_running(
        &self,
        ids: &BTreeSet<String>,
        dc: &str,
        opts: &RunpodOptions,
    ) -> Result<Vec<Pod>> {
        let deadline = Instant::now() + Duration::from_secs(opts.boot_timeout_s);
        loop {
            let all = self.all_pods(dc).await?;
            let ours: Vec<&Pod> = all.iter().filter(|p| ids.contains(&p.id)).collect();
            if let Some(p) = ours.iter().find(|p| {
                matches!(
                    p.status,
                    PodStatus::Exited | PodStatus::Error | PodStatus::Terminated
                )
            }) {
                return Err(Self::err(
                    ErrorKind::Capacity,
                    dc,
                    format!("pod {} went {:?} while starting", p.id, p.status).to_lowercase(),
                ));
            }
            if ours.len() < ids.len() {
                return Err(Self::err(
                    ErrorKind::Capacity,
                    dc,
                    format!(
                        "{} of the {} pods created are no longer listed",
                        ids.len() - ours.len(),
                        ids.len()
                    ),
                ));
            }
            let up = ours
                .iter()
                .filter(|p| p.status == PodStatus::Running && p.direct().is_some())
                .count();
            if up == ids.len() {
                let mut v: Vec<Pod> = ours.into_iter().cloned().collect();
                v.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(Self::err(
                    ErrorKind::Capacity,
                    dc,
                    format!(
                        "{up} of {} pods running with SSH after {} s (config.runpod.boot_timeout_s)",
                        ids.len(),
                        opts.boot_timeout_s
                    ),
                ));
            }
            tokio::time::sleep(self.poll(opts)).await;
        }
    }

    fn node(&self, p: &Pod, region: Option<&str>) -> Node {
        let mut extra = BTreeMap::new();
        let direct = p.direct();
        if let Some(d) = direct {
            // A pod's sshd answers on the host's public address at the
            // port RunPod mapped to its 22/tcp, as root.
            SshEndpoint {
                port: d.port,
                ..SshEndpoint::new(d.host.clone(), d.username.as_deref().unwrap_or("root"))
            }
            .record(&mut extra);
        }
        if let Some(g) = &p.gpu {
            let cloud = p.cloud.unwrap_or(api::Cloud::Secure);
            extra.insert("instance_type".into(), types::name(g.count, &g.id, cloud));
        }
        let spot = p.env(TAG_MARKET) == Some(SPOT);
        extra.insert(
            "market".into(),
            if spot { "spot" } else { "on-demand" }.into(),
        );
        if p.cost > 0.0 {
            extra.insert(gangway_provider::PRICE_FACT.into(), p.cost.to_string());
        }
        let dc = p.data_center_id.clone().unwrap_or_default();
        let state = match p.status {
            PodStatus::Provisioning | PodStatus::Starting | PodStatus::Unknown => {
                NodeState::Pending
            }
            PodStatus::Running => NodeState::Running,
            PodStatus::Terminated => NodeState::Terminated,
            // gangway never stops a pod: one that is not running any more
            // was stopped by RunPod, its host, or someone else.
            PodStatus::Exited | PodStatus::Error => NodeState::Preempted {
                reason: if spot {
                    format!(
                        "RunPod interrupted spot pod {} (it reports {:?}; gangway never stops pods)",
                        p.id, p.status
                    )
                } else {
                    format!(
                        "RunPod reports pod {} {:?} (gangway never stops pods)",
                        p.id, p.status
                    )
                }
                .replace("Exited", "EXITED")
                .replace("Error", "ERROR"),
            },
        };
        let public_ip = direct.map(|d| d.host.clone());
        Node {
            id: InstanceId(p.id.clone()),
            state,
            private_ip: p
                .private_ip()
                .map(str::to_string)
                .or_else(|| public_ip.clone())
                .unwrap_or_default(),
            public_ip,
            placement: Placement {
                cloud: "runpod".into(),
                region: region.unwrap_or(&dc).to_string(),
                zone: dc,
            },
            topology: Vec::new(),
            extra,
        }
    }

    fn nodes(&self, cluster: &str, pods: &[Pod]) -> Vec<Node> {
        let rec = self.records.get(cluster).unwrap_or_default();
        pods.iter()
            .map(|p| {
                let region = rec
                    .region
                    .as_deref()
                    .filter(|_| rec.zone.as_deref() == p.data_center_id.as_deref());
                self.node(p, region)
            })
            .collect()
    }

    fn public_key_text(&self, location: &str) -> Result<String> {
        std::fs::read_to_string(&self.public_key)
            .map(|k| k.trim().to_string())
            .map_err(|e| {
                Self::err(
                    ErrorKind::Fatal,
                    location,
                    format!(
                        "reading gangway's public key {}: {e}",
                        self.public_key.display()
                    ),
                )
            })
    }

    /// Creates the shortfall one pod at a time, on demand through v2 or,
    /// with a `bid` (USD per GPU-hour), as spot pods through GraphQL; the
    /// ids created go into `created` as they come, so a failure part way
    /// can undo them.
    async fn create_shortfall(
        &self,
        req: &LaunchRequest,
        keep: &[Pod],
        body: &api::CreatePod,
        bid: Option<f64>,
        dc: &str,
        created: &mut BTreeSet<String>,
    ) -> Result<()> {
        let taken: BTreeSet<&str> = keep.iter().map(|p| p.name.as_str()).collect();
        let mut index = 0;
        for _ in 0..(req.count as usize).saturating_sub(keep.len()) {
            while taken.contains(names::pod_name(&req.cluster.0, index).as_str()) {
                index += 1;
            }
            let body = api::CreatePod {
                name: names::pod_name(&req.cluster.0, index),
                ..body.clone()
            };
            index += 1;
            let id = match bid {
                None => {
                    let pod: Option<Pod> = self
                        .client
                        .post(
                            PODS,
                            &body,
                            Op::Create,
                            "create pod",
                            dc,
                            Retry::OnlyThrottled,
                        )
                        .await?;
                    pod.ok_or_else(|| {
                        Self::err(ErrorKind::Fatal, dc, "create pod: an empty answer")
                    })?
                    .id
                }
                Some(bid) => self.rent_spot(&body, bid, dc).await?,
            };
            created.insert(id);
        }
        Ok(())
    }

    /// Rents the spot pod `body` describes through GraphQL, bidding `bid`
    /// per GPU-hour; its id.
    async fn rent_spot(&self, body: &api::CreatePod, bid: f64, dc: &str) -> Result<String> {
        let input = api::RentInterruptable::from_create(body, bid).ok_or_else(|| {
            Self::err(
                ErrorKind::InvalidRequest,
                dc,
                "a RunPod spot pod needs a data center",
            )
        })?;
        let rented: api::RentData = self
            .client
            .graphql(
                api::RENT_INTERRUPTABLE,
                serde_json::json!({ "input": input }),
                true,
                "rent spot pod",
                dc,
                Retry::OnlyThrottled,
            )
            .await?;
        rented.pod_rent_interruptable.map(|r| r.id).ok_or_else(|| {
            Self::err(
                ErrorKind::Capacity,
                dc,
                "rent spot pod: RunPod rented no pod and gave no reason",
            )
        })
    }

    /// The bid per GPU-hour for a spot pod of `ty`: the type's spot price
    /// in its cloud now, unless `max_price` (per pod-hour) caps it below
    /// that, which is no capacity here.
    async fn spot_bid(&self, ty: &types::PodType, max_price: Option<f64>, dc: &str) -> Result<f64> {
        let prices: api::SpotPrices = self
            .client
            .graphql(
                api::SPOT_PRICES,
                serde_json::json!({ "input": { "id": ty.gpu_id } }),
                false,
                "spot price",
                dc,
                Retry::Safe,
            )
            .await?;
        bid_of(&prices, ty, max_price).map_err(|why| Self::err(ErrorKind::Capacity, dc, why))
    }
}

/// The bid per GPU-hour for a spot pod of `ty` from `prices` (GraphQL
/// `gpuTypes`): the spot price of its cloud, unless `max_price` (USD per
/// pod-hour) is under it per GPU; `Err` says why there is no bid.
fn bid_of(
    prices: &api::SpotPrices,
    ty: &types::PodType,
    max_price: Option<f64>,
) -> std::result::Result<f64, String> {
    let cloud = ty.cloud.as_str().to_lowercase();
    let price = prices
        .gpu_types
        .iter()
        .find(|g| g.id == ty.gpu_id)
        .and_then(|g| g.in_cloud(ty.cloud))
        .ok_or_else(|| {
            format!(
                "RunPod sells no spot {} in its {cloud} cloud now",
                ty.gpu_id
            )
        })?;
    if let Some(cap) = max_price {
        let per_gpu = cap / f64::from(ty.count.max(1));
        if per_gpu < price {
            return Err(format!(
                "the spot price of {} in RunPod's {cloud} cloud, ${price}/GPU-hour, \
                 is over max_hourly_cost ${cap}/h for {} GPUs",
                ty.gpu_id, ty.count
            ));
        }
    }
    Ok(price)
}

/// The data center of a placement: its zone, else its region.
fn data_center(p: &Placement) -> &str {
    if p.zone.is_empty() {
        &p.region
    } else {
        &p.zone
    }
}

/// RunPod in the core's registry: on with an owner id to tag with, its
/// records under `records/runpod`.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: "runpod",
    build: |s| {
        Some(std::sync::Arc::new(
            RunpodProvider::new(s.records.join("runpod"), s.owner?, s.public_key())
                .with_user(s.user),
        ))
    },
    capacity: gangway_provider::no_capacity,
    hosts_controller: false,
    stores: &[],
};

#[async_trait::async_trait]
impl Provider for RunpodProvider {
    fn name(&self) -> &str {
        "runpod"
    }

    fn has_price_api(&self) -> bool {
        true
    }

    fn cannot_stop(&self, _use_spot: bool) -> Option<&'static str> {
        Some(
            "gangway does not stop RunPod pods: a stopped pod loses its container disk \
             and may not get its GPUs back; only terminate (gangway down)",
        )
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
        #[derive(Deserialize)]
        struct Dc {
            id: String,
        }
        #[derive(Deserialize)]
        struct Dcs {
            #[serde(rename = "dataCenters")]
            data_centers: Vec<Dc>,
        }
        let identity = Some(format!("API key from {source}"));
        // Data centers are public; the pod list needs a key that works.
        let listed = match self.all_pods("").await {
            Ok(_) => {
                self.client
                    .get::<Dcs>(DATA_CENTERS, "list data centers", "")
                    .await
            }
            Err(e) => Err(e),
        };
        Ok(match listed {
            Ok(d) => CheckReport {
                ok: true,
                identity,
                regions: d.data_centers.into_iter().map(|d| d.id).collect(),
                hint: None,
            },
            Err(e) => CheckReport {
                ok: false,
                identity,
                regions: Vec::new(),
                hint: Some(e.message),
            },
        })
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let dc = data_center(&req.placement).to_string();
        let dc = dc.as_str();
        let opts = RunpodOptions::from_value(req.provider_config.as_ref())
            .map_err(|e| Self::err(ErrorKind::InvalidRequest, dc, e))?;
        if req.use_spot
            && (opts.global_networking == Some(true)
                || (req.count > 1 && opts.global_networking.is_none()))
        {
            return Err(Self::err(
                ErrorKind::InvalidRequest,
                dc,
                "RunPod rents spot pods through GraphQL's podRentInterruptable, whose input \
                 has no global networking: a spot gang's ranks could not reach each other \
                 on private addresses (launch it on demand, or set \
                 config.runpod.global_networking: false to meet on public addresses)",
            ));
        }
        let ty = types::parse(&req.instance_type)
            .map_err(|e| Self::err(ErrorKind::InvalidRequest, dc, e))?;
        if dc.is_empty() {
            return Err(Self::err(
                ErrorKind::InvalidRequest,
                "",
                "a RunPod launch needs a data center (the catalog's zone, e.g. US-KS-2)",
            ));
        }
        self.records
            .update(&req.cluster.0, |r| {
                r.ssh_user = Some("root".into());
                r.region = Some(req.placement.region.clone());
                r.zone = Some(dc.to_string());
            })
            .map_err(|e| {
                Self::err(
                    ErrorKind::Fatal,
                    "local",
                    format!("recording the cluster: {e}"),
                )
            })?;
        let existing = self.mine(&req.cluster.0, dc).await?;
        let fits = |p: &Pod| {
            p.data_center_id.as_deref() == Some(dc)
                && (p.env(TAG_MARKET) == Some(SPOT)) == req.use_spot
                && p.cloud == Some(ty.cloud)
                && p.gpu
                    .as_ref()
                    .is_some_and(|g| g.id == ty.gpu_id && g.count == ty.count)
                && matches!(
                    p.status,
                    PodStatus::Provisioning | PodStatus::Starting | PodStatus::Running
                )
        };
        let (mut keep, strays): (Vec<Pod>, Vec<Pod>) = existing.into_iter().partition(fits);
        let extras = keep.split_off(keep.len().min(req.count as usize));
        let drop: Vec<String> = strays.iter().chain(&extras).map(|p| p.id.clone()).collect();
        self.terminate_ids(&drop, dc).await?;

        let public_key = self.public_key_text(dc)?;
        let image = req
            .image_id
            .as_deref()
            .map(|i| i.strip_prefix("docker:").unwrap_or(i))
            .or(opts.image.as_deref())
            .unwrap_or(DEFAULT_IMAGE)
            .to_string();
        let mut ports = vec!["22/tcp".to_string()];
        for &(a, b) in &req.ports {
            ports.extend((a..=b).take(32).map(|p| format!("{p}/tcp")));
        }
        let mut env = names::env(
            &req.cluster.0,
            &self.owner,
            self.user.as_deref(),
            &public_key,
        );
        if req.use_spot {
            env.insert(TAG_MARKET.to_string(), SPOT.to_string());
        }
        let body = api::CreatePod {
            name: String::new(),
            image,
            gpu: api::CreateGpu {
                id: ty.gpu_id.clone(),
                count: ty.count,
            },
            cloud: ty.cloud,
            data_center_ids: vec![dc.to_string()],
            ports,
            env,
            disk: req.disk_size_gib,
            global_networking: opts.global_networking.unwrap_or(req.count > 1),
        };
        let bid = if req.use_spot && keep.len() < req.count as usize {
            Some(self.spot_bid(&ty, req.max_price, dc).await?)
        } else {
            None
        };
        let mut created = BTreeSet::new();
        let mut result = self
            .create_shortfall(req, &keep, &body, bid, dc, &mut created)
            .await;
        let mut ids: BTreeSet<String> = keep.iter().map(|p| p.id.clone()).collect();
        ids.extend(created.iter().cloned());
        let mut up = Vec::new();
        if result.is_ok() {
            match self.wait_running(&ids, dc, &opts).await {
                Ok(v) => up = v,
                Err(e) => result = Err(e),
            }
        }
        if let Err(e) = result {
            // All or nothing: whatever this launch made goes, found again
            // by tag in case an answer was lost.
            let kept: BTreeSet<&str> = keep.iter().map(|p| p.id.as_str()).collect();
            let again = self.mine(&req.cluster.0, dc).await.unwrap_or_default();
            let mut undo = created;
            undo.extend(
                again
                    .iter()
                    .filter(|p| !kept.contains(p.id.as_str()))
                    .map(|p| p.id.clone()),
            );
            let undo: Vec<String> = undo.into_iter().collect();
            if let Err(cleanup) = self.terminate_ids(&undo, dc).await {
                return Err(Self::err(
                    e.kind,
                    dc,
                    format!(
                        "{}; terminating the pods this launch made also failed: {}",
                        e.message, cleanup.message
                    ),
                ));
            }
            return Err(e);
        }
        Ok(self.nodes(&req.cluster.0, &up))
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let pods = self.mine(&cluster.0, "").await?;
        Ok(self.nodes(&cluster.0, &pods))
    }

    async fn stop(&self, _cluster: &ClusterName) -> Result<()> {
        Err(Self::err(
            ErrorKind::InvalidRequest,
            "",
            "gangway does not stop RunPod pods (a stopped pod loses its container disk); \
             use gangway down",
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
            "gangway does not stop RunPod pods, so there is nothing to start",
        ))
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let name = cluster.0.as_str();
        let ids: Vec<String> = self
            .mine(name, "")
            .await?
            .into_iter()
            .map(|p| p.id)
            .collect();
        self.terminate_ids(&ids, "").await?;
        // Until they are no longer listed, so that `down` returning means
        // nothing of the cluster is left.
        let deadline = Instant::now() + Duration::from_secs(300).mul_f64(self.scale.max(0.01));
        let opts = RunpodOptions::from_value(None).expect("defaults");
        while !self.mine(name, "").await?.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(self.poll(&opts)).await;
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
        for p in self.all_pods("").await? {
            if p.status == PodStatus::Terminated {
                continue;
            }
            if let (Some(c), Some(o)) = (p.env(TAG_CLUSTER), p.env(TAG_OWNER)) {
                out.insert(TaggedCluster {
                    name: ClusterName(c.to_string()),
                    owner: o.to_string(),
                    user: p.env(TAG_USER).map(str::to_string),
                });
            }
        }
        Ok(out.into_iter().collect())
    }

    async fn prices(&self, instance_types: &[String], regions: &[String]) -> Result<Prices> {
        let gpus: api::GpuTypes = self.client.get(GPUS, "list GPU types", "").await?;
        // Where each type's pod (its GPU count, its cloud) can be had now.
        let mut stock: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for t in instance_types {
            let Ok(ty) = types::parse(t) else { continue };
            let path = format!(
                "{GPUS}/{}?include=AVAILABILITY&product=POD&count={}&cloud={}",
                ty.gpu_id.replace(' ', "%20"),
                ty.count,
                ty.cloud.as_str()
            );
            let g: api::GpuType = self
                .client
                .get(&path, &format!("availability of {t}"), "")
                .await?;
            stock.insert(t.clone(), g.available_in().map(String::from).collect());
        }
        let mut out = prices_of(&gpus.gpus, instance_types, regions, &stock);
        // v2 has no spot prices: GraphQL's gpuTypes has them (one query for
        // every type asked). Without them the quotes stay on demand only.
        let ids: BTreeSet<String> = instance_types
            .iter()
            .filter_map(|t| types::parse(t).ok())
            .map(|ty| ty.gpu_id)
            .collect();
        if !out.quotes.is_empty() {
            match self
                .client
                .graphql::<api::SpotPrices>(
                    api::SPOT_PRICES,
                    serde_json::json!({ "input": { "ids": ids } }),
                    false,
                    "spot prices",
                    "",
                    Retry::Safe,
                )
                .await
            {
                Ok(spot) => add_spot_prices(&mut out, &spot),
                Err(e) => out
                    .notes
                    .push(format!("no spot prices (on-demand only): {}", e.message)),
            }
        }
        Ok(out)
    }
}

/// Gives each quote its pod's spot price from GraphQL's `gpuTypes`: the
/// GPUs times the spot price per GPU of its cloud, where RunPod sells it.
fn add_spot_prices(out: &mut Prices, spot: &api::SpotPrices) {
    for q in &mut out.quotes {
        let Ok(ty) = types::parse(&q.instance_type) else {
            continue;
        };
        q.spot_price = spot
            .gpu_types
            .iter()
            .find(|g| g.id == ty.gpu_id)
            .and_then(|g| g.in_cloud(ty.cloud))
            .map(|unit| (unit * f64::from(ty.count) * 10_000.0).round() / 10_000.0);
    }
}

/// Quotes from `GET /v2/catalog/gpus`: RunPod prices a GPU type per cloud,
/// the same in every data center, so a type's price (GPUs times the
/// per-GPU price of its cloud) goes to each asked region.
/// The quotes of `instance_types` in `regions` (data centers): only where
/// `stock` says the type's pod can be had now.
fn prices_of(
    gpus: &[api::GpuType],
    instance_types: &[String],
    regions: &[String],
    stock: &BTreeMap<String, BTreeSet<String>>,
) -> Prices {
    let mut out = Prices::default();
    for t in instance_types {
        let ty = match types::parse(t) {
            Ok(ty) => ty,
            Err(e) => {
                out.notes.push(e);
                continue;
            }
        };
        let Some(g) = gpus.iter().find(|g| g.id == ty.gpu_id) else {
            out.notes.push(format!(
                "{t}: RunPod no longer lists GPU type {}",
                ty.gpu_id
            ));
            continue;
        };
        let (sold, unit) = match ty.cloud {
            api::Cloud::Secure => (g.secure, g.price.secure),
            api::Cloud::Community => (g.community, g.price.community),
        };
        if !sold || unit <= 0.0 {
            out.notes.push(format!(
                "{t}: RunPod does not sell {} in its {} cloud now",
                ty.gpu_id,
                ty.cloud.as_str().to_lowercase()
            ));
            continue;
        }
        let price = (unit * f64::from(ty.count) * 10_000.0).round() / 10_000.0;
        for r in regions {
            if !stock.get(t).is_some_and(|s| s.contains(r)) {
                out.notes.push(format!("{t}: none free in {r} now"));
                continue;
            }
            out.quotes.push(PriceQuote {
                instance_type: t.clone(),
                region: r.clone(),
                zone: None,
                price: Some(price),
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
        let o = RunpodOptions::from_value(None).unwrap();
        assert_eq!(o.boot_timeout_s, 1200);
        assert_eq!(o.image, None);
        let e = RunpodOptions::from_value(Some(&serde_json::json!({"imag": "x"}))).unwrap_err();
        assert!(e.contains("imag") && e.contains("known: image"), "{e}");
    }

    fn pod(status: &str, direct: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "id": "p1", "name": "c-0", "status": status,
            "env": {"GANGWAY_TAG_CLUSTER": "c"},
            "gpu": {"id": "NVIDIA A100 80GB PCIe", "count": 1}, "cloud": "SECURE",
            "dataCenterId": "US-KS-2", "cost": 1.39,
            "ssh": {"direct": if direct {
                serde_json::json!({"host": "195.26.233.3", "port": 34446, "username": "root"})
            } else { serde_json::Value::Null }},
            "globalNetworking": {"enabled": true, "ip": "10.65.0.7"},
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_is_reached_as_root_on_its_mapped_port() {
        let p = RunpodProvider::new("/nonexistent".into(), "gw-0123456789abcdef", "/k".into());
        let n = p.node(&pod("RUNNING", true), None);
        assert_eq!(n.state, NodeState::Running);
        assert_eq!(n.private_ip, "10.65.0.7");
        assert_eq!(n.public_ip.as_deref(), Some("195.26.233.3"));
        assert_eq!(n.extra["ssh.host"], "195.26.233.3");
        assert_eq!(n.extra["ssh.port"], "34446");
        assert_eq!(n.extra["ssh.user"], "root");
        assert_eq!(n.extra["instance_type"], "1x_A100-80GB_SECURE");
        assert_eq!(n.extra[gangway_provider::PRICE_FACT], "1.39");
        assert_eq!(n.placement.zone, "US-KS-2");
        let n = p.node(&pod("STARTING", false), Some("US"));
        assert_eq!(n.state, NodeState::Pending);
        assert!(!n.extra.contains_key("ssh.port"));
        assert_eq!(n.placement.region, "US");
        match p.node(&pod("EXITED", false), None).state {
            NodeState::Preempted { reason } => assert!(reason.contains("EXITED"), "{reason}"),
            s => panic!("{s:?}"),
        }
    }

    #[test]
    fn a_spot_pod_runpod_stopped_is_preempted_and_marked_spot() {
        let p = RunpodProvider::new("/nonexistent".into(), "gw-0123456789abcdef", "/k".into());
        let mut spot = pod("EXITED", false);
        spot.env.insert(TAG_MARKET.into(), SPOT.into());
        let n = p.node(&spot, None);
        assert_eq!(n.extra["market"], "spot");
        match n.state {
            NodeState::Preempted { reason } => {
                assert!(reason.contains("interrupted spot pod p1"), "{reason}");
                assert!(reason.contains("EXITED"), "{reason}");
            }
            s => panic!("{s:?}"),
        }
        assert_eq!(
            p.node(&pod("RUNNING", true), None).extra["market"],
            "on-demand"
        );
    }

    #[test]
    fn the_bid_is_the_spot_price_of_the_cloud_unless_max_price_caps_it() {
        let prices: api::SpotPrices = serde_json::from_value(serde_json::json!({"gpuTypes": [
            {"id": "NVIDIA A100 80GB PCIe", "secureSpotPrice": 0.7, "communitySpotPrice": 0.6},
            {"id": "NVIDIA H100 80GB HBM3", "secureSpotPrice": 1.35, "communitySpotPrice": null}]}))
        .unwrap();
        let a100 = types::parse("2x_A100-80GB_COMMUNITY").unwrap();
        assert_eq!(bid_of(&prices, &a100, None), Ok(0.6));
        // $1.20 an hour for two GPUs is $0.60 a GPU: enough.
        assert_eq!(bid_of(&prices, &a100, Some(1.2)), Ok(0.6));
        // A higher cap is no higher bid.
        assert_eq!(bid_of(&prices, &a100, Some(10.0)), Ok(0.6));
        let e = bid_of(&prices, &a100, Some(1.0)).unwrap_err();
        assert!(
            e.contains("$0.6/GPU-hour") && e.contains("max_hourly_cost $1/h"),
            "{e}"
        );
        let h100 = types::parse("1x_H100_COMMUNITY").unwrap();
        let e = bid_of(&prices, &h100, None).unwrap_err();
        assert!(
            e.contains("no spot NVIDIA H100 80GB HBM3 in its community cloud"),
            "{e}"
        );
        let l4 = types::parse("1x_L4_SECURE").unwrap();
        assert!(bid_of(&prices, &l4, None).is_err());
    }

    #[test]
    fn prices_are_gpus_times_the_clouds_price_where_pods_are_free_now() {
        let gpus: api::GpuTypes = serde_json::from_value(serde_json::json!({"gpus": [
            {"id": "NVIDIA A100 80GB PCIe", "name": "A100 PCIe", "secure": true, "community": true,
             "price": {"secure": 1.39, "community": 1.19}},
            {"id": "NVIDIA H100 80GB HBM3", "secure": true, "community": false,
             "price": {"secure": 2.69, "community": 0.0}}]}))
        .unwrap();
        let p = prices_of(
            &gpus.gpus,
            &[
                "2x_A100-80GB_COMMUNITY".into(),
                "1x_H100_COMMUNITY".into(),
                "1x_L4_SECURE".into(),
                "gpu_1x_a10".into(),
            ],
            &["US-KS-2".into(), "EU-RO-1".into()],
            &BTreeMap::from([(
                "2x_A100-80GB_COMMUNITY".to_string(),
                BTreeSet::from(["US-KS-2".to_string()]),
            )]),
        );
        assert_eq!(p.quotes.len(), 1);
        assert_eq!(p.quotes[0].price, Some(2.38));
        assert_eq!(p.quotes[0].spot_price, None);
        let mut with_spot = p.clone();
        let spot: api::SpotPrices = serde_json::from_value(serde_json::json!({"gpuTypes": [
            {"id": "NVIDIA A100 80GB PCIe", "secureSpotPrice": 0.7, "communitySpotPrice": 0.6}]}))
        .unwrap();
        add_spot_prices(&mut with_spot, &spot);
        assert_eq!(with_spot.quotes[0].spot_price, Some(1.2));
        assert_eq!(p.quotes[0].region, "US-KS-2");
        assert_eq!(p.notes.len(), 4, "{:?}", p.notes);
        assert!(p.notes.iter().any(|n| n.contains("none free in EU-RO-1")));
    }

    #[test]
    fn availability_reads_the_levels_and_none_is_not_stock() {
        let g: api::GpuType = serde_json::from_value(serde_json::json!({
            "id": "NVIDIA L40S", "secure": true, "community": false,
            "price": {"secure": 0.86, "community": 0.0},
            "dataCenters": [{"id": "US-KS-2", "name": "US Kansas 2", "availability": "LOW"},
                            {"id": "EU-RO-1", "name": "EU Romania 1", "availability": "NONE"}]}))
        .unwrap();
        assert_eq!(g.available_in().collect::<Vec<_>>(), ["US-KS-2"]);
    }

    #[test]
    fn the_data_center_is_the_zone_else_the_region() {
        let mut p = Placement {
            cloud: "runpod".into(),
            region: "US-KS-2".into(),
            zone: String::new(),
        };
        assert_eq!(data_center(&p), "US-KS-2");
        p.zone = "US-GA-2".into();
        assert_eq!(data_center(&p), "US-GA-2");
    }
}
