//! The Vast.ai provider: GPU machines rented from Vast's market through
//! its API, on demand or interruptible (a bid: Vast's spot).
//!
//! An instance is a container on a host's machine, reached as `root` over
//! SSH at the machine's public address and the host port mapped to its
//! `22/tcp` (else Vast's SSH proxy); no systemd, and `nvidia-smi topo` may
//! not answer. gangway's public key is attached to each instance it rents
//! (`POST /instances/{id}/ssh/`), never added to the account.
//!
//! Launch is a reconcile: the cluster's instances are found by their
//! label (`<owner>--<cluster>--<index>`, [`names`]), those that fit are
//! reused, others destroyed, and the shortfall rented from the cheapest
//! location (Vast's `geolocation`) of the placement's country that has
//! enough offers for it, all the gang's machines in that one location. If
//! any rental fails or a machine does not come up, every instance rented
//! for it is destroyed: all or nothing. An interruptible instance that is
//! outbid is stopped by Vast: describe reports it preempted.
//!
//! The API key comes from `VAST_API_KEY`, else the CLI's key file (module
//! [`key`]); it is sent only in the `Authorization` header.
//! `GANGWAY_VAST_ENDPOINT` points the client elsewhere (the test fake) and
//! `GANGWAY_VAST_RATE_SCALE` multiplies its rate-limit window.
#![deny(missing_docs)]

pub mod api;
pub mod key;
pub mod names;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeState, Placement,
    PriceQuote, Prices, Provider, ProviderError, Result, SshEndpoint, TaggedCluster,
};
use reqwest::Method;
use serde::Deserialize;

use api::{Client, Instance, Offer, Retry};
use gangway_provider::http::record::{self, Records};

/// Replaces [`api::DEFAULT_ENDPOINT`] (a fake, a proxy).
pub const ENDPOINT_VAR: &str = "GANGWAY_VAST_ENDPOINT";
/// Multiplies the client's rate-limit window (default 1).
pub const RATE_SCALE_VAR: &str = "GANGWAY_VAST_RATE_SCALE";

/// The image an instance runs unless the task names one.
pub const DEFAULT_IMAGE: &str = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-devel";

const SEARCH: &str = "/api/v0/bundles/";
const INSTANCES: &str = "/api/v1/instances/";
const NONE: Option<&()> = None;

/// The task's `config.vast` section.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VastOptions {
    /// Docker image (default [`DEFAULT_IMAGE`]; `image_id` wins).
    #[serde(default)]
    pub image: Option<String>,
    /// Disk, GB, when the task gives no `disk_size` (default 32).
    #[serde(default = "default_disk")]
    pub disk_gb: u32,
    /// Seconds to wait for every instance to be running with SSH.
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_s: u64,
    /// Milliseconds between state polls (default: 3 s, scaled).
    #[serde(default)]
    pub poll_ms: Option<u64>,
    /// Only verified machines (default true).
    #[serde(default = "yes")]
    pub verified: bool,
}

fn default_disk() -> u32 {
    32
}

fn default_boot_timeout() -> u64 {
    1200
}

fn yes() -> bool {
    true
}

impl VastOptions {
    /// Reads `config.vast` (none: the defaults).
    pub fn from_value(v: Option<&serde_json::Value>) -> std::result::Result<Self, String> {
        let v = match v {
            None | Some(serde_json::Value::Null) => serde_json::json!({}),
            Some(v) => v.clone(),
        };
        serde_json::from_value(v).map_err(|e| {
            format!("config.vast: {e} (known: image, disk_gb, boot_timeout_s, poll_ms, verified)")
        })
    }
}

/// The Vast.ai provider.
pub struct VastProvider {
    owner: String,
    user: Option<String>,
    public_key: PathBuf,
    records: Records,
    client: Client,
    key_source: std::result::Result<Option<String>, String>,
    scale: f64,
}

impl VastProvider {
    /// A provider labelling with `owner`, attaching `public_key` (an
    /// OpenSSH `.pub` file) to its instances, keeping its records under
    /// `root`, with the API key and endpoint of this process's environment.
    pub fn new(root: PathBuf, owner: impl Into<String>, public_key: PathBuf) -> VastProvider {
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
        VastProvider {
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
    pub fn with_api(mut self, endpoint: &str, key: key::ApiKey, scale: f64) -> VastProvider {
        self.client = Client::new(
            endpoint,
            Some(key),
            gangway_provider::http::limit::Limiter::new(scale),
        );
        self.key_source = Ok(Some("the caller".into()));
        self.scale = self.client.scale();
        self
    }

    /// The same provider naming `user` on its instances too (readable).
    pub fn with_user(mut self, user: impl Into<String>) -> VastProvider {
        self.user = Some(user.into()).filter(|u: &String| !u.is_empty());
        self
    }

    fn err(kind: ErrorKind, location: &str, message: impl Into<String>) -> ProviderError {
        ProviderError::new(kind, "vast", location, message)
    }

    /// Every instance of the account, page by page.
    async fn all_instances(&self, location: &str) -> Result<Vec<Instance>> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let path = match &token {
                Some(t) => format!("{INSTANCES}?limit=25&after_token={t}"),
                None => format!("{INSTANCES}?limit=25"),
            };
            let page: api::InstancePage = self
                .client
                .call(
                    Method::GET,
                    &path,
                    NONE,
                    "list instances",
                    location,
                    Retry::Safe,
                )
                .await?;
            out.extend(page.instances);
            match page.next_token.filter(|t| !t.is_empty()) {
                Some(t) if token.as_deref() != Some(t.as_str()) => token = Some(t),
                _ => return Ok(out),
            }
        }
    }

    /// This owner's instances of `cluster`, by label.
    async fn mine(&self, cluster: &str, location: &str) -> Result<Vec<Instance>> {
        let mut v: Vec<Instance> = self
            .all_instances(location)
            .await?
            .into_iter()
            .filter(|i| {
                i.label
                    .as_deref()
                    .and_then(names::parse_label)
                    .is_some_and(|(o, c, _)| o == self.owner && c == cluster)
            })
            .collect();
        v.sort_by_key(|i| (i.label.clone(), i.id));
        Ok(v)
    }

    /// Destroys `ids` (one already gone is no failure).
    async fn destroy(&self, ids: &[u64], location: &str) -> Result<()> {
        for id in ids {
            let path = format!("/api/v0/instances/{id}/");
            match self
                .client
                .call::<_, serde::de::IgnoredAny>(
                    Method::DELETE,
                    &path,
                    Some(&serde_json::json!({})),
                    "destroy instance",
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

    fn poll(&self, opts: &VastOptions) -> Duration {
        let d = match opts.poll_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs(3).mul_f64(self.scale),
        };
        d.max(Duration::from_millis(20))
    }

    /// The offers of `n`x`gpu` for rent now, on demand or as bids, cheapest
    /// first.
    async fn offers(
        &self,
        n: u32,
        gpu: &str,
        bid: bool,
        verified: bool,
        location: &str,
    ) -> Result<Vec<Offer>> {
        let mut q = serde_json::json!({
            "rentable": {"eq": true},
            "rented": {"eq": false},
            "external": {"eq": false},
            "gpu_name": {"eq": gpu},
            "num_gpus": {"eq": n},
            "order": [["dph_total", "asc"]],
            "type": if bid { "bid" } else { "on-demand" },
            "limit": 200,
        });
        if verified {
            q["verified"] = serde_json::json!({"eq": true});
        }
        let found: api::Offers = self
            .client
            .call(
                Method::POST,
                SEARCH,
                Some(&q),
                "search offers",
                location,
                Retry::Safe,
            )
            .await?;
        Ok(found.offers)
    }

    /// Waits until every one of `ids` is running with an SSH endpoint.
    async fn wait_running(
        &self,
        ids: &BTreeSet<u64>,
        location: &str,
        opts: &VastOptions,
    ) -> Result<Vec<Instance>> {
        let deadline = Instant::now() + Duration::from_secs(opts.boot_timeout_s);
        loop {
            let all = self.all_instances(location).await?;
            let ours: Vec<&Instance> = all.iter().filter(|i| ids.contains(&i.id)).collect();
            if ours.len() < ids.len() {
                return Err(Self::err(
                    ErrorKind::Capacity,
                    location,
                    "a rented instance is no longer listed",
                ));
            }
            if let Some(i) = ours.iter().find(|i| lost(i).is_some()) {
                return Err(Self::err(
                    ErrorKind::Capacity,
                    location,
                    format!(
                        "instance {} stopped while starting: {}",
                        i.id,
                        lost(i).unwrap()
                    ),
                ));
            }
            let up = ours
                .iter()
                .filter(|i| i.actual_status.as_deref() == Some("running") && i.ssh().is_some())
                .count();
            if up == ids.len() {
                let mut v: Vec<Instance> = ours.into_iter().cloned().collect();
                v.sort_by_key(|i| (i.label.clone(), i.id));
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(Self::err(
                    ErrorKind::Capacity,
                    location,
                    format!(
                        "{up} of {} instances running with SSH after {} s (config.vast.boot_timeout_s)",
                        ids.len(),
                        opts.boot_timeout_s
                    ),
                ));
            }
            tokio::time::sleep(self.poll(opts)).await;
        }
    }

    fn node(&self, i: &Instance, rec: &record::Record) -> Node {
        let mut extra = BTreeMap::new();
        let ssh = i.ssh();
        if let Some((host, port)) = &ssh {
            SshEndpoint {
                port: *port,
                ..SshEndpoint::new(host.clone(), "root")
            }
            .record(&mut extra);
        }
        if let (Some(n), Some(g)) = (i.num_gpus, i.gpu_name.as_deref()) {
            extra.insert("instance_type".into(), names::type_name(n, g));
        }
        extra.insert(
            "market".into(),
            if i.is_bid { "spot" } else { "on-demand" }.into(),
        );
        if let Some(p) = i.dph_total.filter(|p| *p > 0.0) {
            extra.insert(gangway_provider::PRICE_FACT.into(), p.to_string());
        }
        if let Some(g) = &i.geolocation {
            extra.insert("location".into(), g.clone());
        }
        let state = match (lost(i), i.actual_status.as_deref()) {
            (Some(reason), _) => NodeState::Preempted { reason },
            (None, Some("running")) => NodeState::Running,
            _ => NodeState::Pending,
        };
        let country = i
            .geolocation
            .as_deref()
            .and_then(api::country)
            .unwrap_or_default()
            .to_string();
        let region = rec
            .region
            .clone()
            .filter(|r| *r == country || country.is_empty())
            .unwrap_or(country);
        let zone = rec
            .zone
            .clone()
            .filter(|_| rec.region.as_deref() == Some(region.as_str()))
            .unwrap_or_else(|| region.clone());
        // Vast has no private network between machines: the gang's
        // addresses are the public ones.
        let public = i.public_ipaddr.clone().filter(|a| !a.is_empty());
        Node {
            id: InstanceId(i.id.to_string()),
            state,
            private_ip: public
                .clone()
                .or_else(|| ssh.as_ref().map(|s| s.0.clone()))
                .unwrap_or_default(),
            public_ip: public,
            placement: Placement {
                cloud: "vast".into(),
                region,
                zone,
            },
            topology: Vec::new(),
            extra,
        }
    }

    fn nodes(&self, cluster: &str, instances: &[Instance]) -> Vec<Node> {
        let rec = self.records.get(cluster).unwrap_or_default();
        instances.iter().map(|i| self.node(i, &rec)).collect()
    }

    /// Rents `offers` one by one, attaching gangway's key to each; the ids
    /// go into `rented` as they come.
    #[allow(clippy::too_many_arguments)]
    async fn rent(
        &self,
        req: &LaunchRequest,
        offers: &[Offer],
        taken: &BTreeSet<usize>,
        body: &api::CreateInstance,
        public_key: &str,
        location: &str,
        rented: &mut BTreeSet<u64>,
    ) -> Result<()> {
        let mut index = 0;
        for offer in offers {
            while taken.contains(&index) {
                index += 1;
            }
            let price = if req.use_spot {
                let floor = offer.min_bid.unwrap_or(offer.dph_total);
                let bid = req.max_price.unwrap_or(floor);
                if bid < floor {
                    return Err(Self::err(
                        ErrorKind::Capacity,
                        location,
                        format!(
                            "offer {}: its minimum bid ${floor}/h is over max_price ${bid}/h",
                            offer.id
                        ),
                    ));
                }
                Some(bid)
            } else {
                None
            };
            let body = api::CreateInstance {
                label: names::label(&self.owner, &req.cluster.0, index),
                price,
                ..body.clone()
            };
            index += 1;
            let made: api::Created = self
                .client
                .call(
                    Method::PUT,
                    &format!("/api/v0/asks/{}/", offer.id),
                    Some(&body),
                    &format!("rent offer {}", offer.id),
                    location,
                    Retry::OnlyThrottled,
                )
                .await?;
            rented.insert(made.new_contract);
            let _: serde::de::IgnoredAny = self
                .client
                .call(
                    Method::POST,
                    &format!("/api/v0/instances/{}/ssh/", made.new_contract),
                    Some(&api::AttachKey {
                        ssh_key: public_key.to_string(),
                    }),
                    "attach SSH key",
                    location,
                    Retry::Safe,
                )
                .await?;
        }
        Ok(())
    }
}

/// Why an instance is lost, if it is: stopped although gangway never
/// stops one (it asked it to run), by an outbid for a bid.
fn lost(i: &Instance) -> Option<String> {
    let stopped = matches!(
        i.actual_status.as_deref(),
        Some("stopped" | "exited" | "offline")
    ) || i.cur_state.as_deref() == Some("stopped");
    if !stopped || i.intended_status.as_deref() == Some("stopped") {
        return None;
    }
    let words = i
        .status_msg
        .clone()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| i.actual_status.clone().unwrap_or_else(|| "stopped".into()));
    Some(if i.is_bid {
        format!("interruptible instance {} stopped (outbid?): {words}", i.id)
    } else {
        format!("instance {} stopped by Vast or its host: {words}", i.id)
    })
}

/// The cheapest `need` offers in one location of `country` (in
/// `location_of_kept`, where the gang already has machines).
fn choose(
    offers: &[Offer],
    need: usize,
    country: &str,
    location_of_kept: Option<&str>,
) -> Option<Vec<Offer>> {
    if need == 0 {
        return Some(Vec::new());
    }
    let mut by_place: BTreeMap<&str, Vec<&Offer>> = BTreeMap::new();
    let mut machines = BTreeSet::new();
    for o in offers {
        let Some(g) = o.geolocation.as_deref() else {
            continue;
        };
        // Two offers of one machine are one machine's GPUs, never two nodes.
        if o.country() != Some(country)
            || location_of_kept.is_some_and(|k| k != g)
            || !machines.insert(o.machine_id)
        {
            continue;
        }
        by_place.entry(g).or_default().push(o);
    }
    by_place
        .into_values()
        .filter(|v| v.len() >= need)
        .map(|mut v| {
            v.sort_by(|a, b| a.dph_total.total_cmp(&b.dph_total));
            v.truncate(need);
            v
        })
        .min_by(|a, b| {
            let cost = |v: &Vec<&Offer>| v.iter().map(|o| o.dph_total).sum::<f64>();
            cost(a).total_cmp(&cost(b))
        })
        .map(|v| v.into_iter().cloned().collect())
}

/// Vast.ai in the core's registry: on with an owner id to label with, its
/// records under `records/vast`.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: "vast",
    build: |s| {
        Some(std::sync::Arc::new(
            VastProvider::new(s.records.join("vast"), s.owner?, s.public_key()).with_user(s.user),
        ))
    },
    capacity: gangway_provider::no_capacity,
    hosts_controller: false,
    stores: &[],
};

#[async_trait::async_trait]
impl Provider for VastProvider {
    fn name(&self) -> &str {
        "vast"
    }

    fn has_price_api(&self) -> bool {
        true
    }

    fn cannot_stop(&self, _use_spot: bool) -> Option<&'static str> {
        Some(
            "gangway does not stop Vast.ai instances: a stopped instance keeps its disk \
             (and its storage charges) but may not get its machine back; only destroy \
             (gangway down)",
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
        let identity = Some(format!("API key from {source}"));
        let listed = match self.all_instances("").await {
            Ok(_) => {
                let q = serde_json::json!({"rentable": {"eq": true}, "limit": 1000});
                self.client
                    .call::<_, api::Offers>(
                        Method::POST,
                        SEARCH,
                        Some(&q),
                        "search offers",
                        "",
                        Retry::Safe,
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        Ok(match listed {
            Ok(o) => CheckReport {
                ok: true,
                identity,
                regions: o
                    .offers
                    .iter()
                    .filter_map(|o| o.country().map(str::to_string))
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
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
        let country = req.placement.region.as_str();
        let opts = VastOptions::from_value(req.provider_config.as_ref())
            .map_err(|e| Self::err(ErrorKind::InvalidRequest, country, e))?;
        let (n, gpu) = names::parse_type(&req.instance_type)
            .map_err(|e| Self::err(ErrorKind::InvalidRequest, country, e))?;
        self.records
            .update(&req.cluster.0, |r| {
                r.ssh_user = Some("root".into());
                r.region = Some(country.to_string());
                r.zone = Some(req.placement.zone.clone());
            })
            .map_err(|e| {
                Self::err(
                    ErrorKind::Fatal,
                    "local",
                    format!("recording the cluster: {e}"),
                )
            })?;
        let existing = self.mine(&req.cluster.0, country).await?;
        let fits = |i: &Instance| {
            i.gpu_name.as_deref() == Some(gpu.as_str())
                && i.num_gpus == Some(n)
                && i.is_bid == req.use_spot
                && i.geolocation.as_deref().and_then(api::country) == Some(country)
                && lost(i).is_none()
        };
        let (mut keep, mut strays): (Vec<Instance>, Vec<Instance>) =
            existing.into_iter().partition(fits);
        // One location for the whole gang: the first kept node's.
        let place = keep.first().and_then(|i| i.geolocation.clone());
        let (here, elsewhere): (Vec<Instance>, Vec<Instance>) =
            keep.into_iter().partition(|i| i.geolocation == place);
        keep = here;
        strays.extend(elsewhere);
        strays.extend(keep.split_off(keep.len().min(req.count as usize)));
        let drop: Vec<u64> = strays.iter().map(|i| i.id).collect();
        self.destroy(&drop, country).await?;

        let need = (req.count as usize).saturating_sub(keep.len());
        let public_key = std::fs::read_to_string(&self.public_key).map_err(|e| {
            Self::err(
                ErrorKind::Fatal,
                country,
                format!(
                    "reading gangway's public key {}: {e}",
                    self.public_key.display()
                ),
            )
        })?;
        let public_key = public_key.trim().to_string();
        let mut chosen = Vec::new();
        if need > 0 {
            let offers = self
                .offers(n, &gpu, req.use_spot, opts.verified, country)
                .await?;
            chosen = choose(&offers, need, country, place.as_deref()).ok_or_else(|| {
                Self::err(
                    ErrorKind::Capacity,
                    country,
                    format!(
                        "no location in {country} has {need} {} offers of {} for rent now{}",
                        if req.use_spot {
                            "interruptible"
                        } else {
                            "on-demand"
                        },
                        req.instance_type,
                        place
                            .as_deref()
                            .map(|p| format!(" (the gang is in {p})"))
                            .unwrap_or_default()
                    ),
                )
            })?;
        }
        let mut env = BTreeMap::new();
        if let Some(u) = &self.user {
            env.insert(names::TAG_USER.to_string(), u.clone());
        }
        let body = api::CreateInstance {
            image: req
                .image_id
                .as_deref()
                .map(|i| i.strip_prefix("docker:").unwrap_or(i))
                .or(opts.image.as_deref())
                .unwrap_or(DEFAULT_IMAGE)
                .to_string(),
            label: String::new(),
            disk: f64::from(req.disk_size_gib.unwrap_or(opts.disk_gb)),
            runtype: "ssh_direc ssh_proxy".into(),
            env,
            price: None,
            cancel_unavail: true,
        };
        let taken: BTreeSet<usize> = keep
            .iter()
            .filter_map(|i| i.label.as_deref().and_then(names::parse_label))
            .map(|(_, _, index)| index)
            .collect();
        let mut rented = BTreeSet::new();
        let mut result = self
            .rent(
                req,
                &chosen,
                &taken,
                &body,
                &public_key,
                country,
                &mut rented,
            )
            .await;
        let mut ids: BTreeSet<u64> = keep.iter().map(|i| i.id).collect();
        ids.extend(rented.iter().copied());
        let mut up = Vec::new();
        if result.is_ok() {
            match self.wait_running(&ids, country, &opts).await {
                Ok(v) => up = v,
                Err(e) => result = Err(e),
            }
        }
        if let Err(e) = result {
            // All or nothing: whatever this launch rented goes, found again
            // by label in case an answer was lost.
            let kept: BTreeSet<u64> = keep.iter().map(|i| i.id).collect();
            let again = self.mine(&req.cluster.0, country).await.unwrap_or_default();
            let mut undo = rented;
            undo.extend(again.iter().map(|i| i.id).filter(|id| !kept.contains(id)));
            let undo: Vec<u64> = undo.into_iter().collect();
            if let Err(cleanup) = self.destroy(&undo, country).await {
                return Err(Self::err(
                    e.kind,
                    country,
                    format!(
                        "{}; destroying the instances this launch rented also failed: {}",
                        e.message, cleanup.message
                    ),
                ));
            }
            return Err(e);
        }
        Ok(self.nodes(&req.cluster.0, &up))
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let mine = self.mine(&cluster.0, "").await?;
        Ok(self.nodes(&cluster.0, &mine))
    }

    async fn stop(&self, _cluster: &ClusterName) -> Result<()> {
        Err(Self::err(
            ErrorKind::InvalidRequest,
            "",
            "gangway does not stop Vast.ai instances; use gangway down",
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
            "gangway does not stop Vast.ai instances, so there is nothing to start",
        ))
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let name = cluster.0.as_str();
        let ids: Vec<u64> = self.mine(name, "").await?.iter().map(|i| i.id).collect();
        self.destroy(&ids, "").await?;
        let deadline = Instant::now() + Duration::from_secs(300).mul_f64(self.scale.max(0.01));
        let opts = VastOptions::from_value(None).expect("defaults");
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
        for i in self.all_instances("").await? {
            if let Some((o, c, _)) = i.label.as_deref().and_then(names::parse_label) {
                out.insert(TaggedCluster {
                    name: ClusterName(c.to_string()),
                    owner: o.to_string(),
                    user: i.env(names::TAG_USER).map(str::to_string),
                });
            }
        }
        Ok(out.into_iter().collect())
    }

    async fn prices(&self, instance_types: &[String], regions: &[String]) -> Result<Prices> {
        let mut out = Prices::default();
        for t in instance_types {
            let (n, gpu) = match names::parse_type(t) {
                Ok(x) => x,
                Err(e) => {
                    out.notes.push(e);
                    continue;
                }
            };
            let demand = self.offers(n, &gpu, false, true, "").await?;
            let bids = self.offers(n, &gpu, true, true, "").await?;
            quote(&mut out, t, &demand, &bids, regions);
        }
        Ok(out)
    }
}

/// The cheapest on-demand and bid price of `t` in each asked region (a
/// country) from the offers for rent now; a region with none is a note.
fn quote(out: &mut Prices, t: &str, demand: &[Offer], bids: &[Offer], regions: &[String]) {
    let cheapest = |offers: &[Offer], r: &str, price: fn(&Offer) -> f64| {
        offers
            .iter()
            .filter(|o| o.country() == Some(r))
            .map(price)
            .min_by(f64::total_cmp)
    };
    for r in regions {
        let price = cheapest(demand, r, |o| o.dph_total);
        let spot = cheapest(bids, r, |o| o.min_bid.unwrap_or(o.dph_total));
        if price.is_none() && spot.is_none() {
            out.notes
                .push(format!("{t}: no Vast.ai offer in {r} for rent now"));
            continue;
        }
        out.quotes.push(PriceQuote {
            instance_type: t.to_string(),
            region: r.clone(),
            zone: None,
            price,
            spot_price: spot,
            accelerator: None,
            accelerator_count: None,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(id: u64, machine: u64, price: f64, geo: &str) -> Offer {
        serde_json::from_value(serde_json::json!({"id": id, "machine_id": machine,
            "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": price, "min_bid": price / 2.0,
            "geolocation": geo}))
        .unwrap()
    }

    #[test]
    fn a_gang_goes_to_the_cheapest_location_with_room_for_all_of_it() {
        let offers = [
            offer(1, 10, 0.30, "Texas, US"),
            offer(2, 20, 0.40, "Oregon, US"),
            offer(3, 21, 0.41, "Oregon, US"),
            offer(4, 22, 0.50, "Oregon, US"),
            offer(5, 11, 0.20, "Texas, US"),
            offer(6, 30, 0.10, "Ljubljana, SI"),
        ];
        let ids = |v: Option<Vec<Offer>>| v.map(|v| v.iter().map(|o| o.id).collect::<Vec<_>>());
        assert_eq!(ids(choose(&offers, 2, "US", None)), Some(vec![5, 1]));
        assert_eq!(ids(choose(&offers, 3, "US", None)), Some(vec![2, 3, 4]));
        assert_eq!(ids(choose(&offers, 4, "US", None)), None);
        assert_eq!(
            ids(choose(&offers, 1, "US", Some("Oregon, US"))),
            Some(vec![2])
        );
        // One machine's two offers are not two nodes.
        let same = [
            offer(1, 10, 0.3, "Texas, US"),
            offer(2, 10, 0.3, "Texas, US"),
        ];
        assert_eq!(ids(choose(&same, 2, "US", None)), None);
    }

    fn instance(actual: &str, cur: &str, bid: bool) -> Instance {
        serde_json::from_value(serde_json::json!({
            "id": 7, "actual_status": actual, "intended_status": "running", "cur_state": cur,
            "label": "gw-0123456789abcdef--c--0", "gpu_name": "RTX 4090", "num_gpus": 1,
            "dph_total": 0.2, "is_bid": bid, "geolocation": "Washington, US",
            "public_ipaddr": if actual == "running" { "203.0.113.5" } else { "" },
            "ports": if actual == "running" {
                serde_json::json!({"22/tcp": [{"HostPort": "41022"}]})
            } else { serde_json::json!({}) },
            "status_msg": if cur == "stopped" { "Instance stopped: outbid" } else { "" }}))
        .unwrap()
    }

    #[test]
    fn an_outbid_instance_is_preempted_and_a_running_one_reached_as_root() {
        let p = VastProvider::new("/nonexistent".into(), "gw-0123456789abcdef", "/k".into());
        let rec = record::Record::default();
        let n = p.node(&instance("running", "running", true), &rec);
        assert_eq!(n.state, NodeState::Running);
        assert_eq!(n.extra["ssh.host"], "203.0.113.5");
        assert_eq!(n.extra["ssh.port"], "41022");
        assert_eq!(n.extra["ssh.user"], "root");
        assert_eq!(n.extra["market"], "spot");
        assert_eq!(n.extra["instance_type"], "1x_RTX_4090");
        assert_eq!(n.placement.region, "US");
        match p.node(&instance("stopped", "stopped", true), &rec).state {
            NodeState::Preempted { reason } => assert!(reason.contains("outbid"), "{reason}"),
            s => panic!("{s:?}"),
        }
        assert_eq!(
            p.node(&instance("loading", "running", false), &rec).state,
            NodeState::Pending
        );
    }

    #[test]
    fn prices_are_the_cheapest_offer_per_country() {
        let demand = [
            offer(1, 1, 0.40, "Texas, US"),
            offer(2, 2, 0.30, "Oregon, US"),
        ];
        let bids = [offer(1, 1, 0.40, "Texas, US")];
        let mut out = Prices::default();
        quote(
            &mut out,
            "1x_RTX_4090",
            &demand,
            &bids,
            &["US".into(), "SI".into()],
        );
        assert_eq!(out.quotes.len(), 1);
        assert_eq!(out.quotes[0].price, Some(0.30));
        assert_eq!(out.quotes[0].spot_price, Some(0.20));
        assert_eq!(out.notes.len(), 1);
        let o = VastOptions::from_value(Some(&serde_json::json!({"disk": 1}))).unwrap_err();
        assert!(o.contains("known: image"), "{o}");
    }
}
