//! The GCP provider: Compute Engine through Google's official Rust client
//! (`google-cloud-compute-v1`, REST/JSON, with `google-cloud-auth`'s
//! Application Default Credentials).
//!
//! A launch is a reconcile by label (`gangway-cluster`, `gangway-owner`):
//! running VMs of the right zone, type and market are kept, stopped
//! on-demand ones started, others deleted, and the shortfall created by one
//! `instances.bulkInsert` (`count = minCount`, all or nothing) with a
//! `requestId` derived from the request, so a retried call never doubles
//! the cluster. Per cluster: two firewall rules (SSH from the caller's
//! address, everything between members, by network tag) and, for multi-node
//! GPU gangs, a compact-placement resource policy. Operations are waited
//! for and their `error` read (the client's `until_done` answers `Ok` for a
//! failed operation), and GCE's codes steer the failover loop.
//!
//! `GANGWAY_GCP_ENDPOINT` points it elsewhere (private endpoints, the test
//! fake); a plain-http loopback endpoint is used without credentials.
#![deny(missing_docs)]

mod errors;
mod names;
mod notice;
mod pricing;
mod record;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gangway_provider::{
    CheckReport, ClusterName, ErrorKind, InstanceId, LaunchRequest, Node, NodeState, Placement,
    PriceQuote, Prices, Provider, ProviderError, Result, TaggedCluster,
};
use google_cloud_compute_v1::client::{
    AcceleratorTypes, Firewalls, Instances, MachineTypes, ResourcePolicies, ZoneOperations,
};
use google_cloud_compute_v1::model::{
    self, access_config, attached_disk, firewall, instance, resource_policy_group_placement_policy,
    scheduling,
};
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::paginator::ItemPaginator;
use google_cloud_lro::Poller;
use record::{KeptVm, Record};

pub use errors::{classify_codes, classify_http, GcpError};
pub use names::{gpu_type, request_id, Names};
pub use notice::{preempted_notice_probe, PREEMPTED_WATCHER};

/// Label naming the cluster (a sanitized name plus a hash of the exact one).
pub const LABEL_CLUSTER: &str = "gangway-cluster";
/// Label naming the gangway installation that launched it (its owner id).
pub const LABEL_OWNER: &str = "gangway-owner";
/// Label naming the user who launched it (cleaned), for people: sweeps go
/// by the owner.
pub const LABEL_USER: &str = "gangway-user";

/// Metadata item holding the cluster's exact name.
const META_CLUSTER: &str = "gangway-cluster";

/// Metadata item saying whether gangway reaches the VM at its internal IP.
const META_INTERNAL: &str = "gangway-internal-ips";

/// A VM's metadata value for `key`.
fn meta<'a>(i: &'a model::Instance, key: &str) -> Option<&'a str> {
    i.metadata
        .as_ref()?
        .items
        .iter()
        .find(|it| it.key.as_deref() == Some(key))
        .and_then(|it| it.value.as_deref())
}

/// The description of a cluster's firewall rules and policy: resources
/// without labels say whose they are here (`; user U` only when known).
fn describe_owner(cluster: &str, owner_label: &str, user_label: Option<&str>) -> String {
    match user_label {
        Some(u) => format!("gangway cluster {cluster}; owner {owner_label}; user {u}"),
        None => format!("gangway cluster {cluster}; owner {owner_label}"),
    }
}

/// The cluster, owner and user a description by [`describe_owner`] names
/// (earlier versions wrote no user; the oldest no owner: not found).
fn described_cluster(description: &str) -> Option<TaggedCluster> {
    let rest = description.strip_prefix("gangway cluster ")?;
    let label = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    };
    let (rest, user) = match rest.rsplit_once("; user ") {
        Some((r, u)) if label(u) && r.contains("; owner ") => (r, Some(u.to_string())),
        _ => (rest, None),
    };
    let (cluster, owner) = rest.rsplit_once("; owner ")?;
    (label(owner) && !cluster.is_empty()).then(|| TaggedCluster {
        name: ClusterName(cluster.to_string()),
        owner: owner.to_string(),
        user,
    })
}

/// The operation GCE records when it takes a Spot VM back.
const PREEMPTED_OP: &str = "compute.instances.preempted";

/// The user gangway puts its key in for (`ssh-keys` metadata).
const DEFAULT_SSH_USER: &str = "gangway";

fn err(kind: ErrorKind, location: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::new(kind, "gcp", location, message)
}

struct Clients {
    project: String,
    instances: Instances,
    policies: ResourcePolicies,
    firewalls: Firewalls,
    operations: ZoneOperations,
    machine_types: MachineTypes,
    accelerator_types: AcceleratorTypes,
}

/// The GCP provider.
pub struct GcpProvider {
    owner: String,
    /// The `gangway-user` label value, cleaned.
    user_label: Option<String>,
    /// The owner versions before owner ids labelled with here (the user's
    /// name): clusters recorded by them are still found by it.
    legacy_owner: Option<String>,
    public_key: PathBuf,
    records: PathBuf,
    clients: tokio::sync::OnceCell<std::result::Result<Clients, ProviderError>>,
    /// A catalog refresh asks per region; the zones' offers and the SKUs
    /// are read once.
    offers: tokio::sync::OnceCell<BTreeMap<String, pricing::ZoneOffer>>,
    unit_prices: tokio::sync::OnceCell<(pricing::UnitPrices, Vec<String>)>,
}

/// The task's `config.gcp` settings.
#[derive(Clone, Debug, Default)]
struct Options {
    ssh_user: Option<String>,
    ssh_cidr: Option<String>,
    network: Option<String>,
    termination_action: Option<String>,
    use_internal_ips: bool,
    placement: Option<bool>,
    boot_timeout_s: Option<u64>,
    preemption_notice_s: Option<u64>,
    /// `remote_identity`: the service account (email) every VM runs as,
    /// with [`STORAGE_SCOPE`], so its rclone reaches GCS through the
    /// metadata server and no token of the user's goes to it.
    remote_identity: Option<String>,
}

/// The one OAuth scope a VM with `remote_identity` gets: Cloud Storage,
/// read and write (objects and buckets, not their IAM policies). The
/// tokens the VM's metadata server hands out can then reach nothing but
/// Storage, whatever other roles the service account holds; a wider
/// scope (`cloud-platform`, SkyPilot's) would let them use every role.
pub const STORAGE_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";

/// What a managed-job controller host's VM gets besides [`STORAGE_SCOPE`]:
/// Compute Engine, to launch, stop and terminate the jobs' VMs and its own.
pub const COMPUTE_SCOPE: &str = "https://www.googleapis.com/auth/compute";

/// Scopes whose tokens reach GCS objects.
fn reaches_storage(scope: &str) -> bool {
    scope.ends_with("/auth/devstorage.read_write")
        || scope.ends_with("/auth/devstorage.full_control")
        || scope.ends_with("/auth/cloud-platform")
}

const OPTION_KEYS: &[&str] = &[
    "ssh_user",
    "ssh_cidr",
    "network",
    "termination_action",
    "use_internal_ips",
    "placement_policy",
    "boot_timeout_s",
    "preemption_notice_s",
    "remote_identity",
];

fn options(v: Option<&serde_json::Value>, loc: &str) -> Result<Options> {
    let mut o = Options::default();
    let Some(v) = v else { return Ok(o) };
    let bad = |k: &str, why: &str| {
        err(
            ErrorKind::InvalidRequest,
            loc,
            format!("config.gcp.{k}: {why}"),
        )
    };
    let map = v.as_object().ok_or_else(|| bad("", "must be a mapping"))?;
    for (k, v) in map {
        let s = || {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(k, "must be a string"))
        };
        match k.as_str() {
            "ssh_user" => o.ssh_user = Some(s()?),
            "ssh_cidr" => o.ssh_cidr = Some(s()?),
            "network" => o.network = Some(s()?),
            "termination_action" => {
                let t = s()?.to_ascii_uppercase();
                if t != "STOP" && t != "DELETE" {
                    return Err(bad(k, "must be STOP or DELETE"));
                }
                o.termination_action = Some(t);
            }
            "use_internal_ips" => {
                o.use_internal_ips = v.as_bool().ok_or_else(|| bad(k, "must be true or false"))?
            }
            "placement_policy" => {
                o.placement = Some(v.as_bool().ok_or_else(|| bad(k, "must be true or false"))?)
            }
            "boot_timeout_s" => {
                o.boot_timeout_s = Some(v.as_u64().ok_or_else(|| bad(k, "must be seconds"))?)
            }
            "preemption_notice_s" => {
                o.preemption_notice_s = Some(v.as_u64().ok_or_else(|| bad(k, "must be seconds"))?)
            }
            // The core has taken out LOCAL_CREDENTIALS (the default).
            "remote_identity" => {
                let email = s()?;
                if !email.contains('@') {
                    return Err(bad(
                        k,
                        &format!("'{email}' is not a service account's email (NAME@PROJECT.iam.gserviceaccount.com)"),
                    ));
                }
                o.remote_identity = Some(email)
            }
            other => {
                return Err(bad(
                    other,
                    &format!("not a setting (known: {})", OPTION_KEYS.join(", ")),
                ))
            }
        }
    }
    Ok(o)
}

/// The gcloud CLI's configuration directory.
fn gcloud_dir() -> Option<PathBuf> {
    std::env::var_os("CLOUDSDK_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/gcloud")))
}

/// `[section] key` of the active gcloud configuration.
fn gcloud_setting(section: &str, key: &str) -> Option<String> {
    let dir = gcloud_dir()?;
    let active = std::fs::read_to_string(dir.join("active_config"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "default".into());
    let text = std::fs::read_to_string(dir.join("configurations").join(format!("config_{active}")))
        .ok()?;
    let header = format!("[{section}]");
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == header;
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == key && !v.trim().is_empty() {
                    return Some(v.trim().to_string());
                }
            }
        }
    }
    None
}

/// The project: `GOOGLE_CLOUD_PROJECT`, `CLOUDSDK_CORE_PROJECT`, then the
/// active gcloud configuration's `core/project`.
pub fn project() -> Option<String> {
    for v in ["GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"] {
        if let Ok(p) = std::env::var(v) {
            if !p.is_empty() {
                return Some(p);
            }
        }
    }
    gcloud_setting("core", "project")
}

/// The credentials file ADC reads, and whether the environment named it.
fn adc_file() -> Option<(PathBuf, bool)> {
    match std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS") {
        Some(p) if !p.is_empty() => Some((PathBuf::from(p), true)),
        _ => gcloud_dir()
            .map(|d| d.join("application_default_credentials.json"))
            .filter(|p| p.exists())
            .map(|p| (p, false)),
    }
}

/// `text` with every secret of the credentials file cut out (the auth
/// library's parse errors may quote what they could not read).
fn redacted(mut text: String) -> String {
    let Some((path, _)) = adc_file() else {
        return text;
    };
    let Ok(doc) = std::fs::read_to_string(path)
        .map_err(|_| ())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|_| ()))
    else {
        return text;
    };
    for k in [
        "private_key",
        "private_key_id",
        "refresh_token",
        "client_secret",
    ] {
        if let Some(v) = doc.get(k).and_then(|v| v.as_str()).filter(|v| v.len() >= 4) {
            text = text.replace(v, "[redacted]");
            // serde quotes with escapes: `\n` for a newline.
            text = text.replace(&v.escape_debug().to_string(), "[redacted]");
        }
    }
    text
}

/// Who Application Default Credentials will speak for, in the order the
/// auth library looks (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's
/// application-default file, the metadata server), told from the file's
/// public fields only (a key or token is never read out). `Err` says what
/// is wrong with a file that is named or found.
pub fn identity() -> std::result::Result<String, GcpError> {
    let Some((path, named)) = adc_file() else {
        return Ok(
            "the metadata server's service account (no credentials file; that works only on GCE, GKE or Cloud Run)"
                .into(),
        );
    };
    let whence = if named {
        format!("GOOGLE_APPLICATION_CREDENTIALS={}", path.display())
    } else {
        path.display().to_string()
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => return Err(GcpError::CredentialsUnreadable { whence, source }),
    };
    let doc: serde_json::Value = match serde_json::from_str(&text) {
        Ok(doc) => doc,
        Err(source) => return Err(GcpError::CredentialsNotJson { whence, source }),
    };
    describe_credentials(&doc, gcloud_setting("core", "account"), &whence)
}

/// Says what a credentials file is, from its `type` and public fields.
fn describe_credentials(
    doc: &serde_json::Value,
    gcloud_account: Option<String>,
    whence: &str,
) -> std::result::Result<String, GcpError> {
    let field = |k: &str| doc.get(k).and_then(|v| v.as_str()).unwrap_or_default();
    // `.../serviceAccounts/EMAIL:generateAccessToken`
    let impersonated = || {
        let url = field("service_account_impersonation_url");
        url.rsplit_once("serviceAccounts/")
            .map(|(_, rest)| rest.split(':').next().unwrap_or(rest).to_string())
            .filter(|e| !e.is_empty())
    };
    match field("type") {
        "service_account" if !field("client_email").is_empty() => Ok(format!(
            "service account {} ({whence})",
            field("client_email")
        )),
        "authorized_user" => Ok(format!(
            "user credentials{} ({whence})",
            gcloud_account
                .map(|a| format!(" of {a}"))
                .unwrap_or_default()
        )),
        "impersonated_service_account" => Ok(format!(
            "service account {} by impersonation ({whence})",
            impersonated().unwrap_or_else(|| "(unnamed)".into())
        )),
        "external_account" | "external_account_authorized_user" => Ok(format!(
            "workload identity federation{} ({whence})",
            impersonated()
                .map(|e| format!(" as {e}"))
                .unwrap_or_default()
        )),
        "" => Err(GcpError::CredentialsWithoutType {
            whence: whence.into(),
        }),
        "service_account" => Err(GcpError::KeyWithoutEmail {
            whence: whence.into(),
        }),
        other => Err(GcpError::UnknownCredentials {
            whence: whence.into(),
            kind: other.into(),
        }),
    }
}

/// The API endpoint override, and whether it is a loopback plain-http one
/// (used without credentials).
fn endpoint() -> (Option<String>, bool) {
    match std::env::var("GANGWAY_GCP_ENDPOINT") {
        Ok(e) if !e.is_empty() => {
            let local = is_loopback_http(&e);
            (Some(e.trim_end_matches('/').to_string()), local)
        }
        _ => (None, false),
    }
}

/// The Cloud Billing API's base URL (`GANGWAY_GCP_BILLING_ENDPOINT` for
/// tests and private endpoints), and whether it is a loopback plain-http
/// one (used without credentials).
fn billing_endpoint() -> (String, bool) {
    match std::env::var("GANGWAY_GCP_BILLING_ENDPOINT") {
        Ok(e) if !e.is_empty() => {
            let local = is_loopback_http(&e);
            (e.trim_end_matches('/').to_string(), local)
        }
        _ => ("https://cloudbilling.googleapis.com".into(), false),
    }
}

fn is_loopback_http(url: &str) -> bool {
    url.starts_with("http://127.")
        || url.starts_with("http://localhost")
        || url.starts_with("http://[::1]")
}

/// The bare zone of a VM.
fn zone_of(i: &model::Instance) -> String {
    last(i.zone.as_deref().unwrap_or_default()).to_string()
}

/// Whether a VM is Spot.
fn is_spot(i: &model::Instance) -> bool {
    i.scheduling
        .as_ref()
        .and_then(|s| s.provisioning_model.as_ref())
        .is_some_and(|m| *m == scheduling::ProvisioningModel::Spot)
}

fn region_of(zone: &str) -> &str {
    zone.rsplit_once('-').map_or(zone, |(r, _)| r)
}

fn last(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

impl GcpProvider {
    /// A provider labelling with `owner`, putting `public_key` (an OpenSSH
    /// `.pub` file) into each VM's `ssh-keys`, and keeping the regions each
    /// cluster touched under `root`.
    pub fn new(root: PathBuf, owner: impl Into<String>, public_key: PathBuf) -> GcpProvider {
        GcpProvider {
            owner: owner.into(),
            user_label: None,
            legacy_owner: None,
            public_key,
            records: root.join("clusters"),
            clients: tokio::sync::OnceCell::new(),
            offers: tokio::sync::OnceCell::new(),
            unit_prices: tokio::sync::OnceCell::new(),
        }
    }

    /// The same provider labelling its VMs with `user` too
    /// (`gangway-user`, cleaned to a label value; nothing is found by it).
    pub fn with_user(mut self, user: &str) -> GcpProvider {
        self.user_label = Some(names::label_value(user)).filter(|u| !u.is_empty());
        self
    }

    /// The same provider finding clusters that an earlier version recorded
    /// under this root by `owner`, the owner that version labelled them
    /// with (the user's name): so `down` of a cluster launched before an
    /// upgrade still finds its VMs, rules and policy.
    pub fn with_legacy_owner(mut self, owner: &str) -> GcpProvider {
        self.legacy_owner = Some(owner.to_string()).filter(|o| !o.is_empty());
        self
    }

    async fn clients(&self) -> Result<&Clients> {
        let r = self
            .clients
            .get_or_init(|| async {
                let project = project().ok_or_else(|| {
                    err(
                        ErrorKind::Auth,
                        "",
                        "no project: set GOOGLE_CLOUD_PROJECT or run `gcloud config set project ID`",
                    )
                })?;
                let (ep, anonymous) = endpoint();
                macro_rules! build {
                    ($t:ty) => {{
                        let mut b = <$t>::builder()
                            .with_attempt_timeout(Duration::from_secs(60))
                            .with_retry_policy(
                                google_cloud_gax::retry_policy::RetryPolicyExt::with_attempt_limit(
                                    google_cloud_gax::retry_policy::Aip194Strict,
                                    3,
                                ),
                            );
                        // Operations are looked at after 100 ms, then
                        // up to every 2 s (the client's own default starts
                        // at 1 s and grows to a minute).
                        if let Ok(backoff) =
                            google_cloud_gax::exponential_backoff::ExponentialBackoffBuilder::new()
                                .with_initial_delay(Duration::from_millis(100))
                                .with_maximum_delay(Duration::from_secs(2))
                                .build()
                        {
                            b = b.with_polling_backoff_policy(backoff);
                        }
                        if let Some(ep) = &ep {
                            b = b.with_endpoint(ep.clone());
                        }
                        if anonymous {
                            b = b.with_credentials(
                                google_cloud_auth::credentials::anonymous::Builder::new().build(),
                            );
                        }
                        b.build().await.map_err(|e| {
                            err(
                                ErrorKind::Auth,
                                "",
                                format!(
                                    "cannot build the Compute Engine client: {} (run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file)",
                                    redacted(gangway_provider::error_chain(&e))
                                ),
                            )
                        })?
                    }};
                }
                Ok(Clients {
                    project,
                    instances: build!(Instances),
                    policies: build!(ResourcePolicies),
                    firewalls: build!(Firewalls),
                    operations: build!(ZoneOperations),
                    machine_types: build!(MachineTypes),
                    accelerator_types: build!(AcceleratorTypes),
                })
            })
            .await;
        r.as_ref().map_err(Clone::clone)
    }

    /// Every zone's machine types (of these names) and accelerators, from
    /// two aggregated lists.
    async fn zone_offers(
        &self,
        instance_types: &[String],
    ) -> Result<BTreeMap<String, pricing::ZoneOffer>> {
        let c = self.clients().await?;
        let mut out: BTreeMap<String, pricing::ZoneOffer> = BTreeMap::new();
        let scope_zone = |scope: &str| scope.trim_start_matches("zones/").to_string();
        // GCE names are [a-z0-9-]: nothing to escape in the RE2 alternation.
        let mut items = c
            .machine_types
            .aggregated_list()
            .set_project(&c.project)
            .set_filter(format!("name eq \"({})\"", instance_types.join("|")))
            .by_item();
        while let Some(item) = items.next().await {
            let (scope, list) =
                item.map_err(|e| call_err(&e, "", "machineTypes.aggregatedList"))?;
            let zone = scope_zone(&scope);
            for m in list.machine_types {
                let Some(name) = m.name.clone() else { continue };
                let gpus = m.accelerators.first().and_then(|a| {
                    Some((
                        pricing::catalog_gpu(a.guest_accelerator_type.as_deref()?),
                        f64::from(a.guest_accelerator_count?),
                    ))
                });
                out.entry(zone.clone()).or_default().machines.insert(
                    name,
                    pricing::Shape {
                        vcpus: f64::from(m.guest_cpus.unwrap_or(0)),
                        memory_gib: f64::from(m.memory_mb.unwrap_or(0)) / 1024.0,
                        gpus,
                    },
                );
            }
        }
        let mut items = c
            .accelerator_types
            .aggregated_list()
            .set_project(&c.project)
            .by_item();
        while let Some(item) = items.next().await {
            let (scope, list) =
                item.map_err(|e| call_err(&e, "", "acceleratorTypes.aggregatedList"))?;
            let zone = scope_zone(&scope);
            for a in list.accelerator_types {
                let Some(name) = a.name.as_deref() else {
                    continue;
                };
                out.entry(zone.clone()).or_default().accelerators.insert(
                    pricing::catalog_gpu(name),
                    a.maximum_cards_per_instance.unwrap_or(0).max(0) as u32,
                );
            }
        }
        Ok(out)
    }

    /// Unit prices from the Cloud Billing catalog's Compute Engine SKUs,
    /// and what went wrong if they could not be read (never fatal: the
    /// catalog keeps its prices).
    async fn read_skus(&self) -> (pricing::UnitPrices, Vec<String>) {
        let mut units = pricing::UnitPrices::default();
        match self.sku_pages(&mut units).await {
            Ok(()) if units.is_empty() => (
                units,
                vec!["the Cloud Billing catalog listed no Compute Engine VM prices: prices stay as they were".into()],
            ),
            Ok(()) => (units, Vec::new()),
            Err(why) => (
                pricing::UnitPrices::default(),
                vec![format!("prices not refreshed, they stay as they were: {why}")],
            ),
        }
    }

    async fn sku_pages(
        &self,
        units: &mut pricing::UnitPrices,
    ) -> std::result::Result<(), GcpError> {
        let (base, anonymous) = billing_endpoint();
        let key = std::env::var("GANGWAY_GCP_BILLING_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
        let mut headers = http::HeaderMap::new();
        if !anonymous && key.is_none() {
            let creds = google_cloud_auth::credentials::Builder::default()
                .build()
                .map_err(|e| {
                    GcpError::BillingNoCredentials(redacted(gangway_provider::error_chain(&e)))
                })?;
            match creds.headers(http::Extensions::new()).await {
                Ok(google_cloud_auth::credentials::CacheableResource::New { data, .. }) => {
                    headers = data
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(GcpError::BillingCredentials(redacted(
                        gangway_provider::error_chain(&e),
                    )))
                }
            }
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| GcpError::HttpClient(e.without_url().to_string()))?;
        let url = format!("{base}/v1/services/{}/skus", pricing::COMPUTE_SERVICE);
        let mut token = String::new();
        for _ in 0..200 {
            let mut q: Vec<(&str, &str)> = vec![("currencyCode", "USD"), ("pageSize", "5000")];
            if !token.is_empty() {
                q.push(("pageToken", &token));
            }
            if let Some(k) = &key {
                q.push(("key", k));
            }
            // Errors never carry the URL: it may hold the API key.
            let resp = http
                .get(&url)
                .headers(headers.clone())
                .query(&q)
                .send()
                .await
                .map_err(|e| GcpError::Billing {
                    base: base.clone(),
                    why: e.without_url().to_string(),
                })?;
            let status = resp.status();
            let body = resp.text().await.map_err(|e| GcpError::Billing {
                base: base.clone(),
                why: e.without_url().to_string(),
            })?;
            let doc: serde_json::Value =
                serde_json::from_str(&body).map_err(|_| GcpError::BillingNotJson {
                    base: base.clone(),
                    status,
                })?;
            if !status.is_success() {
                let msg = doc
                    .pointer("/error/message")
                    .and_then(|m| m.as_str())
                    .unwrap_or("no message");
                let code = doc
                    .pointer("/error/status")
                    .and_then(|m| m.as_str())
                    .unwrap_or("");
                return Err(GcpError::BillingRefused {
                    status: status.as_u16(),
                    code: code.into(),
                    message: msg.into(),
                });
            }
            if let Some(skus) = doc.get("skus").and_then(|s| s.as_array()) {
                units.add_page(skus);
            }
            match doc.get("nextPageToken").and_then(|t| t.as_str()) {
                Some(t) if !t.is_empty() => token = t.to_string(),
                _ => return Ok(()),
            }
        }
        Err(GcpError::TooManyPages)
    }

    /// The cluster's names: this provider's owner's, or the earlier
    /// version's for a cluster only that version recorded here.
    fn names(&self, cluster: &ClusterName) -> Names {
        let own = Names::new(&cluster.0, &self.owner);
        if let Some(legacy) = &self.legacy_owner {
            if !self.records.join(&own.base).exists() {
                let old = Names::new(&cluster.0, legacy);
                if self.records.join(&old.base).exists() {
                    return old;
                }
            }
        }
        own
    }

    fn label_filter(&self, names: &Names) -> String {
        format!(
            "labels.{LABEL_CLUSTER} = {} AND labels.{LABEL_OWNER} = {}",
            names.label, names.owner_label
        )
    }

    /// The cluster's VMs in every zone.
    async fn vms(&self, names: &Names) -> Result<Vec<model::Instance>> {
        let c = self.clients().await?;
        let mut items = c
            .instances
            .aggregated_list()
            .set_project(&c.project)
            .set_filter(self.label_filter(names))
            .by_item();
        let mut out = Vec::new();
        while let Some(item) = items.next().await {
            let (_, scoped) = item.map_err(|e| call_err(&e, "", "instances.aggregatedList"))?;
            out.extend(scoped.instances);
        }
        Ok(out)
    }

    fn record(&self, names: &Names) -> Record {
        Record::read(&self.records.join(&names.base))
    }

    fn keep_record(&self, names: &Names, r: &Record, loc: &str) -> Result<()> {
        r.write(&self.records.join(&names.base)).map_err(|e| {
            err(
                ErrorKind::Fatal,
                loc,
                format!("cannot record the cluster locally: {e}"),
            )
        })
    }

    fn remember_region(&self, names: &Names, region: &str) -> Result<()> {
        let mut r = self.record(names);
        if r.add_region(region) {
            self.keep_record(names, &r, region)?;
        }
        Ok(())
    }

    /// The recorded VMs that are gone and were preempted: GCE deletes a
    /// Spot VM whose termination action is DELETE, and only its zone's
    /// `compute.instances.preempted` operation (matched by the VM's id, so
    /// an earlier VM of the same name does not count) says why.
    async fn deleted_by_preemption(
        &self,
        names: &Names,
        present: &[model::Instance],
    ) -> Result<Vec<Node>> {
        let missing: Vec<KeptVm> = self
            .record(names)
            .vms
            .into_iter()
            .filter(|k| !present.iter().any(|i| i.id == k.id.parse::<u64>().ok()))
            .collect();
        if missing.is_empty() {
            return Ok(Vec::new());
        }
        let c = self.clients().await?;
        let mut zones: Vec<&str> = missing.iter().map(|k| k.zone.as_str()).collect();
        zones.sort();
        zones.dedup();
        let mut out = Vec::new();
        for zone in zones {
            let mut ops = c
                .operations
                .list()
                .set_project(&c.project)
                .set_zone(zone)
                .set_filter(format!("operationType = \"{PREEMPTED_OP}\""))
                .by_item();
            while let Some(op) = ops.next().await {
                let op = op.map_err(|e| call_err(&e, zone, "zoneOperations.list"))?;
                let Some(k) = missing
                    .iter()
                    .find(|k| op.target_id.map(|t| t.to_string()).as_deref() == Some(&k.id))
                else {
                    continue;
                };
                if out.iter().any(|n: &Node| n.id.0 == k.name) {
                    continue;
                }
                out.push(Node {
                    id: InstanceId(k.name.clone()),
                    state: NodeState::Preempted {
                        reason: format!(
                            "GCE preempted the Spot VM{} and deleted it",
                            op.insert_time
                                .as_deref()
                                .map(|t| format!(" at {t}"))
                                .unwrap_or_default()
                        ),
                    },
                    private_ip: String::new(),
                    public_ip: None,
                    placement: Placement {
                        cloud: "gcp".into(),
                        region: region_of(zone).to_string(),
                        zone: zone.to_string(),
                    },
                    topology: Vec::new(),
                    extra: BTreeMap::new(),
                });
            }
        }
        Ok(out)
    }

    fn node(&self, i: &model::Instance, opts_user: &str, internal: bool) -> Node {
        let zone = zone_of(i);
        let nic = i.network_interfaces.first();
        let private_ip = nic.and_then(|n| n.network_ip.clone()).unwrap_or_default();
        let public_ip = nic
            .and_then(|n| n.access_configs.first())
            .and_then(|a| a.nat_ip.clone());
        let spot = is_spot(i);
        let mut extra = BTreeMap::new();
        let host = if internal {
            Some(private_ip.clone())
        } else {
            public_ip.clone()
        };
        gangway_provider::SshEndpoint::new(host.unwrap_or_default(), opts_user).record(&mut extra);
        extra.insert(
            "market".to_string(),
            if spot { "spot" } else { "on-demand" }.to_string(),
        );
        if let Some(t) = &i.machine_type {
            extra.insert("instance_type".to_string(), last(t).to_string());
        }
        // Runs as a service account whose tokens reach Storage: its
        // rclone uses the metadata server's.
        if let Some(sa) = i
            .service_accounts
            .iter()
            .find(|a| a.scopes.iter().any(|s| reaches_storage(s)))
        {
            extra.insert(
                "service_account".to_string(),
                sa.email.clone().unwrap_or_default(),
            );
            extra.insert(
                gangway_provider::IDENTITY_STORES_FACT.to_string(),
                "gs".to_string(),
            );
        }
        let topology = i
            .resource_status
            .as_ref()
            .and_then(|r| r.physical_host.as_deref())
            .map(|h| {
                // `/BLOCK/SUBBLOCK/HOST`: the switch path is block, sub-block.
                let parts: Vec<String> = h
                    .split('/')
                    .filter(|p| !p.is_empty())
                    .map(str::to_string)
                    .collect();
                parts[..parts.len().saturating_sub(1)].to_vec()
            })
            .unwrap_or_default();
        Node {
            id: InstanceId(i.name.clone().unwrap_or_default()),
            state: state_of(i, spot),
            private_ip,
            public_ip,
            placement: Placement {
                cloud: "gcp".into(),
                region: region_of(&zone).to_string(),
                zone,
            },
            topology,
            extra,
        }
    }

    async fn wait_op(
        &self,
        poller: impl Poller<model::Operation, model::Operation>,
        loc: &str,
        call: &str,
        limit: Duration,
    ) -> Result<model::Operation> {
        let op = tokio::time::timeout(limit, poller.until_done())
            .await
            .map_err(|_| {
                err(
                    ErrorKind::Transient,
                    loc,
                    format!(
                        "{call}: the operation was not done after {} s",
                        limit.as_secs()
                    ),
                )
            })?
            .map_err(|e| call_err(&e, loc, call))?;
        if let Some(e) = &op.error {
            let codes: Vec<String> = e.errors.iter().filter_map(|x| x.code.clone()).collect();
            let words: Vec<String> = e
                .errors
                .iter()
                .map(|x| {
                    format!(
                        "{}: {}",
                        x.code.as_deref().unwrap_or("ERROR"),
                        x.message.as_deref().unwrap_or("")
                    )
                })
                .collect();
            return Err(err(
                classify_codes(&codes, op.http_error_status_code),
                loc,
                format!("{call}: {}", words.join("; ")),
            ));
        }
        Ok(op)
    }

    async fn delete_vms(&self, vms: &[model::Instance]) -> Result<()> {
        let c = self.clients().await?;
        let mut waits = Vec::new();
        for i in vms {
            let zone = zone_of(i);
            let name = i.name.clone().unwrap_or_default();
            let poller = c
                .instances
                .delete()
                .set_project(&c.project)
                .set_zone(&zone)
                .set_instance(&name)
                .poller();
            waits.push(async move {
                done_unless(
                    self.wait_op(poller, &zone, "instances.delete", Duration::from_secs(300))
                        .await,
                    is_not_found,
                )
            });
        }
        for w in waits {
            w.await?;
        }
        Ok(())
    }

    async fn ensure_firewall(
        &self,
        names: &Names,
        opts: &Options,
        req: &LaunchRequest,
        nonce: &str,
    ) -> Result<()> {
        let c = self.clients().await?;
        let network = opts
            .network
            .clone()
            .unwrap_or_else(|| "global/networks/default".into());
        let cidr = match (&opts.ssh_cidr, std::env::var("GANGWAY_GCP_SSH_CIDR")) {
            (Some(c), _) => c.clone(),
            (None, Ok(c)) if !c.is_empty() => c,
            _ => {
                let ip = tokio::task::spawn_blocking(gangway_provider::my_public_ip)
                    .await
                    .map_err(|e| err(ErrorKind::Fatal, "", e.to_string()))?
                    .map_err(|e| {
                        err(
                            ErrorKind::Fatal,
                            "",
                            format!("{e} to open SSH to it only; set config.gcp.ssh_cidr or GANGWAY_GCP_SSH_CIDR"),
                        )
                    })?;
                format!("{ip}/32")
            }
        };
        let mut ssh_ports = vec!["22".to_string()];
        for (a, b) in &req.ports {
            ssh_ports.push(if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            });
        }
        // Firewall rules have no labels: the description names cluster and
        // owner, for the owner sweep (`down --orphans`).
        let labels = |mut f: model::Firewall| {
            f.description = Some(describe_owner(
                &req.cluster.0,
                &names.owner_label,
                self.user_label.as_deref(),
            ));
            f
        };
        let rules = [
            labels(
                model::Firewall::new()
                    .set_name(names.firewall_ssh())
                    .set_network(&network)
                    .set_direction(firewall::Direction::Ingress)
                    .set_allowed([firewall::Allowed::new()
                        .set_ip_protocol("tcp")
                        .set_ports(["22"])])
                    .set_source_ranges([cidr])
                    .set_target_tags([names.tag.clone()]),
            ),
            labels(
                model::Firewall::new()
                    .set_name(names.firewall_internal())
                    .set_network(&network)
                    .set_direction(firewall::Direction::Ingress)
                    .set_allowed([firewall::Allowed::new().set_ip_protocol("all")])
                    .set_source_tags([names.tag.clone()])
                    .set_target_tags([names.tag.clone()]),
            ),
        ];
        let mut rules = rules.to_vec();
        if !req.ports.is_empty() {
            rules.push(labels(
                model::Firewall::new()
                    .set_name(names.firewall_ports())
                    .set_network(&network)
                    .set_direction(firewall::Direction::Ingress)
                    .set_allowed([firewall::Allowed::new()
                        .set_ip_protocol("tcp")
                        .set_ports(ssh_ports.into_iter().skip(1))])
                    .set_source_ranges(["0.0.0.0/0"])
                    .set_target_tags([names.tag.clone()]),
            ));
        }
        for rule in rules {
            let name = rule.name.clone().unwrap_or_default();
            let poller = c
                .firewalls
                .insert()
                .set_project(&c.project)
                .set_request_id(request_id(&[&req.client_token, nonce, &name]))
                .set_body(rule)
                .with_idempotency(true)
                .poller();
            done_unless(
                self.wait_op(
                    poller,
                    "global",
                    "firewalls.insert",
                    Duration::from_secs(120),
                )
                .await,
                is_already_there,
            )?;
        }
        Ok(())
    }

    async fn ensure_policy(
        &self,
        names: &Names,
        region: &str,
        count: u32,
        token: &str,
    ) -> Result<String> {
        let c = self.clients().await?;
        let name = names.policy();
        let policy = model::ResourcePolicy::new()
            .set_name(&name)
            .set_description(describe_owner(
                &names.base,
                &names.owner_label,
                self.user_label.as_deref(),
            ))
            .set_group_placement_policy(
                model::ResourcePolicyGroupPlacementPolicy::new()
                    .set_collocation(
                        resource_policy_group_placement_policy::Collocation::Collocated,
                    )
                    .set_vm_count(count as i32),
            );
        let poller = c
            .policies
            .insert()
            .set_project(&c.project)
            .set_region(region)
            .set_request_id(request_id(&[token, region, &name]))
            .set_body(policy)
            .with_idempotency(true)
            .poller();
        done_unless(
            self.wait_op(
                poller,
                region,
                "resourcePolicies.insert",
                Duration::from_secs(120),
            )
            .await,
            is_already_there,
        )?;
        Ok(name)
    }

    async fn delete_network_things(&self, names: &Names, regions: &[String]) -> Result<()> {
        let c = self.clients().await?;
        for region in regions {
            let poller = c
                .policies
                .delete()
                .set_project(&c.project)
                .set_region(region)
                .set_resource_policy(names.policy())
                .poller();
            done_unless(
                self.wait_op(
                    poller,
                    region,
                    "resourcePolicies.delete",
                    Duration::from_secs(120),
                )
                .await,
                is_not_found,
            )?;
        }
        for fw in [
            names.firewall_ssh(),
            names.firewall_internal(),
            names.firewall_ports(),
        ] {
            let poller = c
                .firewalls
                .delete()
                .set_project(&c.project)
                .set_firewall(&fw)
                .poller();
            done_unless(
                self.wait_op(
                    poller,
                    "global",
                    "firewalls.delete",
                    Duration::from_secs(120),
                )
                .await,
                is_not_found,
            )?;
        }
        Ok(())
    }

    /// Starts (or stops) one VM and waits until that is done.
    async fn power(&self, i: &model::Instance, start: bool) -> Result<()> {
        let c = self.clients().await?;
        let zone = zone_of(i);
        let name = i.name.clone().unwrap_or_default();
        let limit = Duration::from_secs(600);
        if start {
            let p = c
                .instances
                .start()
                .set_project(&c.project)
                .set_zone(&zone)
                .set_instance(name)
                .poller();
            self.wait_op(p, &zone, "instances.start", limit).await?;
        } else {
            let p = c
                .instances
                .stop()
                .set_project(&c.project)
                .set_zone(&zone)
                .set_instance(name)
                .poller();
            self.wait_op(p, &zone, "instances.stop", limit).await?;
        }
        Ok(())
    }

    fn public_key(&self) -> Result<String> {
        std::fs::read_to_string(&self.public_key)
            .map(|k| k.trim().to_string())
            .map_err(|e| {
                err(
                    ErrorKind::Fatal,
                    "",
                    format!(
                        "cannot read gangway's public key {}: {e}",
                        self.public_key.display()
                    ),
                )
            })
    }
}

/// Unique per launch attempt (see the request ids in `launch`).
fn nonce() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{t}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Whether GCE refused the request as such (invalid, unsupported: what a
/// placement policy it will not honour gets), as opposed to capacity,
/// quota, throttling or credentials.
fn refused(e: &ProviderError) -> bool {
    matches!(e.kind, ErrorKind::InvalidRequest | ErrorKind::Fatal)
}

fn is_not_found(e: &ProviderError) -> bool {
    e.message.contains("404")
        || e.message.contains("notFound")
        || e.message.contains("was not found")
}

fn is_already_there(e: &ProviderError) -> bool {
    e.message.contains("alreadyExists") || e.message.contains("409")
}

/// An operation's end where `fine` errors (the thing already exists, is
/// already gone) count as done.
fn done_unless(r: Result<model::Operation>, fine: fn(&ProviderError) -> bool) -> Result<()> {
    match r {
        Err(e) if fine(&e) => Ok(()),
        other => other.map(|_| ()),
    }
}

/// A client call's error, named and classified.
fn call_err(e: &google_cloud_gax::error::Error, loc: &str, call: &str) -> ProviderError {
    let (kind, words) = errors::describe(e);
    err(kind, loc, format!("{call}: {words}"))
}

fn state_of(i: &model::Instance, spot: bool) -> NodeState {
    use instance::Status as S;
    match i.status.as_ref() {
        Some(S::Running) => NodeState::Running,
        Some(S::Provisioning) | Some(S::Staging) | Some(S::Pending) | Some(S::Repairing) => {
            NodeState::Pending
        }
        Some(S::Terminated) | Some(S::Stopped) | Some(S::Stopping) | Some(S::Suspended)
        | Some(S::Suspending) | Some(S::PendingStop)
            if spot =>
        {
            NodeState::Preempted {
                reason: format!(
                    "GCE stopped the Spot VM ({})",
                    i.status
                        .as_ref()
                        .and_then(|s| s.name())
                        .unwrap_or("TERMINATED")
                ),
            }
        }
        Some(S::Terminated) | Some(S::Stopped) | Some(S::Suspended) => NodeState::Stopped,
        Some(S::Stopping) | Some(S::Suspending) | Some(S::PendingStop) => NodeState::Stopped,
        _ => NodeState::Terminated,
    }
}

/// GCP in the core's registry: on with an owner id to tag with, its
/// records under `records/gcp`.
pub const REGISTRATION: gangway_provider::Registration = gangway_provider::Registration {
    name: "gcp",
    build: |s| {
        Some(std::sync::Arc::new(
            GcpProvider::new(s.records.join("gcp"), s.owner?, s.public_key())
                .with_user(s.user)
                .with_legacy_owner(s.legacy_owner),
        ))
    },
    capacity: gangway_provider::no_capacity,
    hosts_controller: true,
    stores: &[gangway_provider::StoreAccess {
        scheme: "gs",
        user_keys: None,
        node_keys: None,
        project: Some(project),
    }],
};

#[async_trait::async_trait]
impl Provider for GcpProvider {
    fn has_price_api(&self) -> bool {
        true
    }

    fn notice_probe(&self, node: &gangway_provider::NodeRow) -> Option<String> {
        preempted_notice_probe(node)
    }

    fn identity_stores(&self, provider_config: Option<&serde_json::Value>) -> Vec<String> {
        match options(provider_config, "") {
            Ok(o) if o.remote_identity.is_some() => vec!["gs".to_string()],
            _ => Vec::new(),
        }
    }

    fn name(&self) -> &str {
        "gcp"
    }

    async fn check(&self) -> Result<CheckReport> {
        let (ep, anonymous) = endpoint();
        let id = identity();
        let c = match self.clients().await {
            Ok(c) => c,
            Err(e) => {
                // A named but broken credentials file says more than the
                // client's "could not create default credentials".
                let (identity, hint) = match (&id, anonymous) {
                    (Err(why), false) => (None, why.to_string()),
                    (Ok(i), false) => (Some(i.clone()), e.message),
                    (_, true) => (None, e.message),
                };
                return Ok(CheckReport {
                    ok: false,
                    identity,
                    regions: Vec::new(),
                    hint: Some(hint),
                });
            }
        };
        let at = ep.as_ref().map(|e| format!(" at {e}")).unwrap_or_default();
        let who = match (anonymous, &id) {
            (true, _) => format!("project {}{at} (no credentials)", c.project),
            (false, Ok(i)) => format!("project {} as {i}{at}", c.project),
            (false, Err(_)) => format!("project {}{at}", c.project),
        };
        if let (false, Err(why)) = (anonymous, &id) {
            return Ok(CheckReport {
                ok: false,
                identity: Some(who),
                regions: Vec::new(),
                hint: Some(why.to_string()),
            });
        }
        let probe = c
            .instances
            .list()
            .set_project(&c.project)
            .set_zone("us-central1-a")
            .set_max_results(1u32)
            .send()
            .await;
        Ok(match probe {
            Ok(_) => CheckReport {
                ok: true,
                identity: Some(who),
                // Where this project sees GPUs (one aggregated list; a
                // refusal here leaves the list empty, not the check red).
                regions: self.gpu_regions().await.unwrap_or_default(),
                hint: None,
            },
            Err(e) => {
                let mut hint = call_err(&e, "us-central1-a", "instances.list").message;
                if id
                    .as_deref()
                    .is_ok_and(|i| i.starts_with("the metadata server"))
                {
                    hint.push_str(
                        "; off Google Cloud, run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file",
                    );
                }
                CheckReport {
                    ok: false,
                    identity: Some(who),
                    regions: Vec::new(),
                    hint: Some(hint),
                }
            }
        })
    }

    async fn launch(&self, req: &LaunchRequest) -> Result<Vec<Node>> {
        let zone = req.placement.zone.clone();
        let region = region_of(&zone).to_string();
        let loc = format!("{region}/{zone}");
        let opts = options(req.provider_config.as_ref(), &loc)?;
        let user = opts
            .ssh_user
            .clone()
            .unwrap_or_else(|| DEFAULT_SSH_USER.into());
        let names = self.names(&req.cluster);
        let nonce = nonce();
        // Reconcile: keep what fits, start stopped on-demand VMs, delete the rest.
        let vms = self.vms(&names).await?;
        let mut keep = Vec::new();
        let mut to_start = Vec::new();
        let mut strays = Vec::new();
        for i in vms {
            let z = zone_of(&i);
            let ty = last(i.machine_type.as_deref().unwrap_or_default()).to_string();
            let spot = is_spot(&i);
            // The identity asked for, or none.
            let runs_as = i.service_accounts.first().and_then(|a| a.email.as_deref());
            let fits = z == zone
                && ty == req.instance_type
                && spot == req.use_spot
                && runs_as == opts.remote_identity.as_deref();
            match i.status.as_ref() {
                _ if !fits => strays.push(i),
                Some(instance::Status::Running)
                | Some(instance::Status::Provisioning)
                | Some(instance::Status::Staging)
                    if keep.len() + to_start.len() < req.count as usize =>
                {
                    keep.push(i)
                }
                Some(instance::Status::Terminated) | Some(instance::Status::Stopped)
                    if !spot && keep.len() + to_start.len() < req.count as usize =>
                {
                    to_start.push(i)
                }
                _ => strays.push(i),
            }
        }
        self.delete_vms(&strays).await?;
        for i in &to_start {
            self.power(i, true).await?;
        }
        let have = (keep.len() + to_start.len()) as u32;
        if have < req.count {
            let shortfall = req.count - have;
            self.remember_region(&names, &region)?;
            self.ensure_firewall(&names, &opts, req, &nonce).await?;
            let gpu = req.accelerator.as_ref().filter(|(_, n)| *n > 0.0);
            // Compact placement for multi-node GPU gangs (or as the task
            // says), but only on the series GCE places so: it refuses the
            // policy for any other (N1 hosts of T4, V100, P100, P4).
            let wanted = opts.placement.unwrap_or(req.count > 1 && gpu.is_some());
            let compact = wanted && names::compact_placement_supported(&req.instance_type);
            if wanted && !compact {
                tracing::info!(
                    "{loc}: no compact placement: GCE gives none to {} ({} series)",
                    req.instance_type,
                    names::series(&req.instance_type)
                );
            }
            // A policy GCE refuses is no reason to end the launch: the gang
            // is asked for without one (a capacity or quota answer still
            // fails over; throttling and credentials still count).
            let mut policy = None;
            if compact {
                match self.ensure_policy(&names, &region, req.count, &nonce).await {
                    Ok(p) => policy = Some(p),
                    Err(e) if refused(&e) => tracing::warn!(
                        "{loc}: compact placement refused, launching without it: {e}"
                    ),
                    Err(e) => return Err(e),
                }
            }
            let with_policy = policy.is_some();
            let first = self
                .bulk_insert(req, &names, &opts, &user, shortfall, policy, &nonce)
                .await;
            match first {
                Err(e) if with_policy && refused(&e) => {
                    tracing::warn!(
                        "{loc}: the gang was refused with compact placement, asking without it: {e}"
                    );
                    self.bulk_insert(req, &names, &opts, &user, shortfall, None, &nonce)
                        .await?;
                }
                other => other?,
            }
        }
        // Every VM running, with its addresses.
        let limit = Duration::from_secs(opts.boot_timeout_s.unwrap_or(600));
        let started = Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            let vms: Vec<model::Instance> = self
                .vms(&names)
                .await?
                .into_iter()
                .filter(|i| zone_of(i) == zone)
                .collect();
            let nodes: Vec<Node> = vms
                .iter()
                .map(|i| self.node(i, &user, opts.use_internal_ips))
                .collect();
            if let Some(p) = nodes.iter().find_map(|n| match &n.state {
                NodeState::Preempted { reason } => Some(format!("{}: {reason}", n.id)),
                _ => None,
            }) {
                return Err(err(
                    ErrorKind::Capacity,
                    &loc,
                    format!("a VM was taken back while starting: {p}"),
                ));
            }
            let ready = nodes.len() == req.count as usize
                && nodes.iter().all(|n| {
                    n.state == NodeState::Running
                        && !n.private_ip.is_empty()
                        && (opts.use_internal_ips || n.public_ip.is_some())
                });
            if ready {
                let mut r = self.record(&names);
                r.add_region(&region);
                r.vms = vms
                    .iter()
                    .map(|i| KeptVm {
                        name: i.name.clone().unwrap_or_default(),
                        id: i.id.map(|id| id.to_string()).unwrap_or_default(),
                        zone: zone_of(i),
                    })
                    .collect();
                self.keep_record(&names, &r, &loc)?;
                return Ok(nodes);
            }
            if started.elapsed() > limit {
                return Err(err(
                    ErrorKind::Capacity,
                    &loc,
                    format!(
                        "{} of {} VMs running after {} s",
                        nodes
                            .iter()
                            .filter(|n| n.state == NodeState::Running)
                            .count(),
                        req.count,
                        limit.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    async fn describe(&self, cluster: &ClusterName) -> Result<Vec<Node>> {
        let names = self.names(cluster);
        let vms = self.vms(&names).await?;
        let mut nodes: Vec<Node> = vms
            .iter()
            .map(|i| {
                let user = meta(i, "ssh-keys")
                    .and_then(|v| v.split_once(':').map(|(u, _)| u))
                    .unwrap_or(DEFAULT_SSH_USER);
                self.node(i, user, meta(i, META_INTERNAL) == Some("true"))
            })
            .collect();
        nodes.extend(self.deleted_by_preemption(&names, &vms).await?);
        Ok(nodes)
    }

    fn host_env(&self) -> Vec<(String, String)> {
        project()
            .map(|p| vec![("GOOGLE_CLOUD_PROJECT".to_string(), p)])
            .unwrap_or_default()
    }

    /// The VM's name, zone and project from its metadata server
    /// (`GCE_METADATA_HOST` where it is elsewhere), then instances.stop
    /// with its service account's token (ADC on a VM: the metadata
    /// server). Not waited for: the caller is on the VM going down.
    async fn stop_this_machine(&self) -> Result<()> {
        let host = std::env::var("GCE_METADATA_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "metadata.google.internal".into());
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| err(ErrorKind::Fatal, "", e.to_string()))?;
        let mut read = Vec::new();
        for path in ["instance/name", "instance/zone", "project/project-id"] {
            let answer = http
                .get(format!("http://{host}/computeMetadata/v1/{path}"))
                .header("Metadata-Flavor", "Google")
                .send()
                .await
                .and_then(|r| r.error_for_status());
            let text = match answer {
                Ok(r) => r.text().await.ok(),
                Err(_) => None,
            };
            read.push(text.map(|t| t.trim().to_string()).ok_or_else(|| {
                err(
                    ErrorKind::InvalidRequest,
                    "",
                    format!(
                        "the metadata server at {host} did not answer {path} (is this a GCE VM?)"
                    ),
                )
            })?);
        }
        let (name, zone, project) = (&read[0], last(&read[1]).to_string(), &read[2]);
        let c = self.clients().await?;
        c.instances
            .stop()
            .set_project(project)
            .set_zone(&zone)
            .set_instance(name)
            .send()
            .await
            .map_err(|e| {
                err(
                    ErrorKind::Transient,
                    &zone,
                    format!("instances.stop of this VM ({name}): {e}"),
                )
            })?;
        Ok(())
    }

    /// The keys the guest agent wrote to the VM's guest attributes
    /// (`hostkeys/`, enabled by gangway's `enable-guest-attributes`
    /// metadata): `Some(empty)` until it has written them.
    async fn host_keys(&self, node: &Node) -> Result<Option<Vec<String>>> {
        let c = self.clients().await?;
        let zone = node.placement.zone.as_str();
        let answer = c
            .instances
            .get_guest_attributes()
            .set_project(&c.project)
            .set_zone(zone)
            .set_instance(node.id.0.as_str())
            .set_query_path("hostkeys/")
            .send()
            .await
            .map_err(|e| call_err(&e, zone, "instances.getGuestAttributes"));
        let attrs = match answer {
            Ok(a) => a,
            Err(e) if is_not_found(&e) => return Ok(Some(Vec::new())),
            Err(e) => return Err(e),
        };
        Ok(Some(
            attrs
                .query_value
                .map(|v| v.items)
                .unwrap_or_default()
                .iter()
                .filter(|i| i.namespace.as_deref() == Some("hostkeys"))
                .filter_map(|i| {
                    // The value is the base64 blob (some agents write the
                    // whole `TYPE BASE64` line).
                    let kind = i.key.as_deref()?;
                    let value = i.value.as_deref()?.trim();
                    let blob = value
                        .strip_prefix(kind)
                        .map(str::trim_start)
                        .unwrap_or(value);
                    gangway_provider::host_keys::key_line(kind, blob.split_whitespace().next()?)
                })
                .collect(),
        ))
    }

    async fn stop(&self, cluster: &ClusterName) -> Result<()> {
        for i in self.vms(&self.names(cluster)).await? {
            if is_spot(&i) {
                return Err(err(
                    ErrorKind::InvalidRequest,
                    &zone_of(&i),
                    "Spot VMs are not stopped and started by gangway; use `gangway down`",
                ));
            }
            self.power(&i, false).await?;
        }
        Ok(())
    }

    async fn start(
        &self,
        cluster: &ClusterName,
        _provider_config: Option<&serde_json::Value>,
    ) -> Result<Vec<Node>> {
        let names = self.names(cluster);
        for i in self.vms(&names).await? {
            if !matches!(
                i.status,
                Some(instance::Status::Terminated) | Some(instance::Status::Stopped)
            ) {
                continue;
            }
            self.power(&i, true).await?;
        }
        self.describe(cluster).await
    }

    async fn terminate(&self, cluster: &ClusterName) -> Result<()> {
        let names = self.names(cluster);
        let vms = self.vms(&names).await?;
        // Regions with the placement policy: recorded at launch, where the
        // VMs are, and wherever GCE has one of this name (a record lost
        // with another machine's state).
        let mut regions = self.record(&names).regions;
        regions.extend(vms.iter().map(|i| region_of(&zone_of(i)).to_string()));
        regions.extend(self.policy_regions(&names).await?);
        regions.sort();
        regions.dedup();
        self.delete_vms(&vms).await?;
        self.delete_network_things(&names, &regions).await?;
        let _ = std::fs::remove_file(self.records.join(&names.base));
        Ok(())
    }

    fn cannot_replace_nodes(&self) -> Option<&'static str> {
        // A launch keeps the cluster's running VMs and bulk-inserts only
        // the shortfall, in the same zone and compact placement policy,
        // named after the largest number in use.
        None
    }

    async fn remove_nodes(&self, cluster: &ClusterName, ids: &[InstanceId]) -> Result<()> {
        let names = self.names(cluster);
        let gone: Vec<model::Instance> = self
            .vms(&names)
            .await?
            .into_iter()
            .filter(|i| {
                let name = i.name.as_deref().unwrap_or_default();
                ids.iter().any(|x| x.0 == name)
            })
            .collect();
        self.delete_vms(&gone).await
    }

    async fn topology(&self, nodes: &[Node]) -> Result<Vec<Vec<String>>> {
        Ok(nodes.iter().map(|n| n.topology.clone()).collect())
    }

    /// One quote per (type, GPUs, zone) the zones of `regions` offer:
    /// machine types from the Compute API, N1 hosts once per GPU model and
    /// count the zone can attach (a type-wide quote there would keep a T4
    /// row alive in a zone without T4s), priced from the Cloud Billing
    /// catalog where it answers; where it does not, prices stay as shipped
    /// and the notes say why.
    async fn prices(&self, instance_types: &[String], regions: &[String]) -> Result<Prices> {
        let offers = self
            .offers
            .get_or_try_init(|| self.zone_offers(instance_types))
            .await?;
        let (units, notes) = self.unit_prices.get_or_init(|| self.read_skus()).await;
        let mut quotes = Vec::new();
        for (zone, offer) in offers {
            let region = region_of(zone);
            if !regions.iter().any(|r| r == region) {
                continue;
            }
            for (ty, shape) in &offer.machines {
                if !instance_types.contains(ty) {
                    continue;
                }
                // A type with bundled GPUs is one shape: its quote is for
                // the type whatever the catalog calls its GPU (ours says
                // H100 for a3-megagpu, GCE says nvidia-h100-mega-80gb).
                // A type without: only for rows without a GPU.
                let mut variants: Vec<(Option<String>, Option<f64>, Option<(String, f64)>)> =
                    match &shape.gpus {
                        Some(_) => vec![(None, None, None)],
                        None => vec![(Some(String::new()), Some(0.0), None)],
                    };
                if shape.gpus.is_none() && ty.starts_with("n1-") {
                    variants.extend(
                        pricing::attachable(offer)
                            .into_iter()
                            .map(|(g, n)| (Some(g.clone()), Some(n), Some((g, n)))),
                    );
                }
                for (gpu, count, extra) in variants {
                    let extra = extra.as_ref().map(|(g, n)| (g.as_str(), *n));
                    quotes.push(PriceQuote {
                        instance_type: ty.clone(),
                        region: region.to_string(),
                        zone: Some(zone.clone()),
                        price: units.price(ty, shape, extra, false, region),
                        spot_price: units.price(ty, shape, extra, true, region),
                        accelerator: gpu,
                        accelerator_count: count,
                    });
                }
            }
        }
        let mut notes = notes.clone();
        for r in regions {
            if !offers.keys().any(|z| region_of(z) == r) {
                notes.push(format!(
                    "the Compute API lists no zones in {r} (none with these types): its offerings are gone from the refreshed catalog"
                ));
            }
        }
        if !units.is_empty() {
            let unpriced: std::collections::BTreeSet<&str> = quotes
                .iter()
                .filter(|q| q.price.is_none())
                .map(|q| q.instance_type.as_str())
                .collect();
            if !unpriced.is_empty() {
                notes.push(format!(
                    "no Cloud Billing SKUs matched {} in {}: their prices stay as they were",
                    unpriced.into_iter().collect::<Vec<_>>().join(", "),
                    regions.join(", ")
                ));
            }
        }
        Ok(Prices { quotes, notes })
    }

    async fn clusters(&self) -> Result<Vec<TaggedCluster>> {
        let c = self.clients().await?;
        // Every VM with an owner label, whoever's: the caller tells its
        // own from others' and from earlier versions' (a user as owner).
        let mut items = c
            .instances
            .aggregated_list()
            .set_project(&c.project)
            .set_filter(format!("labels.{LABEL_OWNER}:*"))
            .by_item();
        let mut out: Vec<TaggedCluster> = Vec::new();
        let mut add = |t: TaggedCluster| {
            if !out.iter().any(|c| c.name == t.name && c.owner == t.owner) {
                out.push(t);
            }
        };
        while let Some(item) = items.next().await {
            let (_, scoped) = item.map_err(|e| call_err(&e, "", "instances.aggregatedList"))?;
            for i in scoped.instances {
                let (Some(n), Some(owner)) = (meta(&i, META_CLUSTER), i.labels.get(LABEL_OWNER))
                else {
                    continue;
                };
                add(TaggedCluster {
                    name: ClusterName(n.to_string()),
                    owner: owner.clone(),
                    user: i.labels.get(LABEL_USER).cloned(),
                });
            }
        }
        // Clusters whose VMs are gone but whose firewall rules (and so,
        // perhaps, placement policy) are not.
        let mut rules = c
            .firewalls
            .list()
            .set_project(&c.project)
            .set_filter("name eq \"gw-.*\"")
            .by_item();
        while let Some(rule) = rules.next().await {
            let rule = rule.map_err(|e| call_err(&e, "global", "firewalls.list"))?;
            if let Some(t) = rule.description.as_deref().and_then(described_cluster) {
                add(t);
            }
        }
        Ok(out)
    }
}

impl GcpProvider {
    /// Regions with at least one zone offering GPUs to this project.
    async fn gpu_regions(&self) -> Result<Vec<String>> {
        let c = self.clients().await?;
        let mut items = c
            .accelerator_types
            .aggregated_list()
            .set_project(&c.project)
            .by_item();
        let mut out: Vec<String> = Vec::new();
        while let Some(item) = items.next().await {
            let (scope, list) =
                item.map_err(|e| call_err(&e, "", "acceleratorTypes.aggregatedList"))?;
            if !list.accelerator_types.is_empty() {
                out.push(region_of(scope.trim_start_matches("zones/")).to_string());
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Regions holding a placement policy of this cluster's name.
    async fn policy_regions(&self, names: &Names) -> Result<Vec<String>> {
        let c = self.clients().await?;
        let mut items = c
            .policies
            .aggregated_list()
            .set_project(&c.project)
            .set_filter(format!("name = {}", names.policy()))
            .by_item();
        let mut out = Vec::new();
        while let Some(item) = items.next().await {
            let (scope, list) =
                item.map_err(|e| call_err(&e, "", "resourcePolicies.aggregatedList"))?;
            if !list.resource_policies.is_empty() {
                out.push(scope.trim_start_matches("regions/").to_string());
            }
        }
        Ok(out)
    }

    /// One `instances.bulkInsert` of `count` VMs, waited for.
    #[allow(clippy::too_many_arguments)]
    async fn bulk_insert(
        &self,
        req: &LaunchRequest,
        names: &Names,
        opts: &Options,
        user: &str,
        count: u32,
        policy: Option<String>,
        nonce: &str,
    ) -> Result<()> {
        let c = self.clients().await?;
        let zone = &req.placement.zone;
        let loc = format!("{}/{zone}", region_of(zone));
        // One id per attempt: the client resends it when it retries the
        // POST (so a lost answer never doubles the gang), while a later
        // attempt (another zone, a retry after a failed operation, a
        // relaunch after down, the same gang without a placement policy)
        // is a new request: GCE answers a reused id with the first call's
        // operation, whatever the new call asks. Doubles across attempts
        // are what the reconcile by label prevents.
        let id = if policy.is_some() {
            request_id(&[&req.client_token, zone, nonce])
        } else {
            request_id(&[&req.client_token, zone, nonce, "no-policy"])
        };
        let body = self.bulk_body(req, names, opts, user, count, policy)?;
        let poller = c
            .instances
            .bulk_insert()
            .set_project(&c.project)
            .set_zone(zone)
            .set_request_id(id)
            .set_body(body)
            .with_idempotency(true)
            .poller();
        self.wait_op(
            poller,
            &loc,
            "instances.bulkInsert",
            Duration::from_secs(900),
        )
        .await
        .map_err(|mut e| {
            if let Some(email) = &opts.remote_identity {
                if e.message.to_ascii_lowercase().contains("serviceaccount") {
                    e.message.push_str(&format!(
                        " (config.gcp.remote_identity names the service account '{email}': \
                         create it, let it use your buckets and let yourself act as it \
                         (roles/iam.serviceAccountUser), or fix the name; docs/gcp.md, \
                         \"Node identity\", says how)"
                    ));
                }
            }
            e
        })?;
        Ok(())
    }

    fn bulk_body(
        &self,
        req: &LaunchRequest,
        names: &Names,
        opts: &Options,
        user: &str,
        count: u32,
        policy: Option<String>,
    ) -> Result<model::BulkInsertInstanceResource> {
        let gpu = req.accelerator.as_ref().filter(|(_, n)| *n > 0.0);
        let image = req.image_id.clone().unwrap_or_else(|| {
            if gpu.is_some() {
                "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204".into()
            } else {
                "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts".into()
            }
        });
        let mut labels: HashMap<String, String> = req
            .labels
            .iter()
            .filter(|(k, _)| ![LABEL_CLUSTER, LABEL_OWNER, LABEL_USER].contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(LABEL_CLUSTER.into(), names.label.clone());
        labels.insert(LABEL_OWNER.into(), names.owner_label.clone());
        if let Some(u) = &self.user_label {
            labels.insert(LABEL_USER.into(), u.clone());
        }
        let mut sched = model::Scheduling::new().set_automatic_restart(!req.use_spot);
        if req.use_spot {
            sched = sched
                .set_provisioning_model(scheduling::ProvisioningModel::Spot)
                .set_instance_termination_action(match opts.termination_action.as_deref() {
                    Some("DELETE") => scheduling::InstanceTerminationAction::Delete,
                    _ => scheduling::InstanceTerminationAction::Stop,
                });
            // More warning than GCE's default (none before the soft off):
            // the metadata server says `preempted` this long before.
            if let Some(s) = opts.preemption_notice_s {
                sched = sched
                    .set_preemption_notice_duration(model::Duration::new().set_seconds(s as i64));
            }
        }
        if gpu.is_some() || req.use_spot {
            sched = sched.set_on_host_maintenance(scheduling::OnHostMaintenance::Terminate);
        }
        let mut access = Vec::new();
        if !opts.use_internal_ips {
            access.push(
                model::AccessConfig::new()
                    .set_name("External NAT")
                    .set_type(access_config::Type::OneToOneNat),
            );
        }
        let mut props = model::InstanceProperties::new()
            .set_machine_type(&req.instance_type)
            .set_disks([model::AttachedDisk::new()
                .set_boot(true)
                .set_auto_delete(true)
                .set_type(attached_disk::Type::Persistent)
                .set_initialize_params(
                    model::AttachedDiskInitializeParams::new()
                        .set_source_image(image)
                        .set_disk_size_gb(i64::from(req.disk_size_gib.unwrap_or(256)))
                        .set_disk_type("pd-balanced"),
                )])
            .set_network_interfaces([model::NetworkInterface::new()
                .set_network(
                    opts.network
                        .clone()
                        .unwrap_or_else(|| "global/networks/default".into()),
                )
                .set_access_configs(access)])
            .set_scheduling(sched)
            .set_metadata(
                model::Metadata::new().set_items([
                    model::metadata::Items::new()
                        .set_key("ssh-keys")
                        .set_value(format!("{user}:{}", self.public_key()?)),
                    // The exact name (labels hold a cleaned one), for the
                    // owner sweep.
                    model::metadata::Items::new()
                        .set_key(META_CLUSTER)
                        .set_value(&req.cluster.0),
                    // How gangway reaches it, for nodes described later
                    // (`gangway start` after a stop).
                    model::metadata::Items::new()
                        .set_key(META_INTERNAL)
                        .set_value(opts.use_internal_ips.to_string()),
                    // The guest agent publishes the VM's SSH host keys
                    // there, for gangway to check them by.
                    model::metadata::Items::new()
                        .set_key("enable-guest-attributes")
                        .set_value("TRUE"),
                ]),
            )
            .set_tags(model::Tags::new().set_items([names.tag.clone()]))
            .set_labels(labels);
        if let Some(email) = &opts.remote_identity {
            let mut scopes = vec![STORAGE_SCOPE];
            if req.labels.contains_key(gangway_provider::CONTROLLER_LABEL) {
                scopes.push(COMPUTE_SCOPE);
            }
            props = props.set_service_accounts([model::ServiceAccount::new()
                .set_email(email)
                .set_scopes(scopes)]);
        }
        // N1 hosts take attached GPUs; A2/A3/G2 types carry their own.
        if let Some((name, n)) = gpu {
            if req.instance_type.starts_with("n1-") {
                props = props.set_guest_accelerators([model::AcceleratorConfig::new()
                    .set_accelerator_type(gpu_type(name))
                    .set_accelerator_count(*n as i32)]);
            }
        }
        if let Some(p) = policy {
            props = props.set_resource_policies([p]);
        }
        Ok(model::BulkInsertInstanceResource::new()
            .set_count(i64::from(count))
            .set_min_count(i64::from(count))
            .set_name_pattern(names.pattern())
            .set_instance_properties(props))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_identity_is_a_service_account_email() {
        let o = options(
            Some(&serde_json::json!({"remote_identity": "nodes@p.iam.gserviceaccount.com"})),
            "x",
        )
        .unwrap();
        assert_eq!(
            o.remote_identity.as_deref(),
            Some("nodes@p.iam.gserviceaccount.com")
        );
        let e = options(Some(&serde_json::json!({"remote_identity": "nodes"})), "x").unwrap_err();
        assert!(
            e.message.contains("config.gcp.remote_identity") && e.message.contains("email"),
            "{e}"
        );
    }

    #[test]
    fn task_settings_are_checked_by_name() {
        let ok = serde_json::json!({"ssh_user": "me", "termination_action": "delete"});
        let o = options(Some(&ok), "x").unwrap();
        assert_eq!(o.termination_action.as_deref(), Some("DELETE"));
        let typo = serde_json::json!({"ssh_usr": "me"});
        assert!(options(Some(&typo), "x")
            .unwrap_err()
            .message
            .contains("ssh_usr"));
        let bad = serde_json::json!({"termination_action": "PAUSE"});
        assert!(options(Some(&bad), "x").is_err());
    }

    #[test]
    fn credentials_files_are_told_by_their_public_fields() {
        use serde_json::json;
        let d = |v: serde_json::Value, acct: Option<&str>| {
            describe_credentials(&v, acct.map(str::to_string), "F")
        };
        let sa = d(
            json!({"type": "service_account", "client_email": "ci@p.iam.gserviceaccount.com",
                   "private_key": "-----BEGIN PRIVATE KEY-----SECRET"}),
            None,
        )
        .unwrap();
        assert_eq!(sa, "service account ci@p.iam.gserviceaccount.com (F)");
        assert!(!sa.contains("SECRET"));
        assert_eq!(
            d(
                json!({"type": "authorized_user", "refresh_token": "SECRET"}),
                Some("me@x.org")
            )
            .unwrap(),
            "user credentials of me@x.org (F)"
        );
        assert_eq!(
            d(json!({"type": "impersonated_service_account",
                     "service_account_impersonation_url": "https://iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/run@p.iam.gserviceaccount.com:generateAccessToken"}), None).unwrap(),
            "service account run@p.iam.gserviceaccount.com by impersonation (F)"
        );
        assert!(d(json!({"type": "external_account"}), None)
            .unwrap()
            .starts_with("workload identity federation ("));
        assert_eq!(
            d(json!({"client_email": "x"}), None)
                .unwrap_err()
                .to_string(),
            "F has no \"type\": not a credentials file"
        );
        assert!(d(json!({"type": "service_account"}), None)
            .unwrap_err()
            .to_string()
            .contains("client_email"));
        assert_eq!(
            d(json!({"type": "gdch"}), None).unwrap_err().to_string(),
            "F: credentials of type \"gdch\" are not known"
        );
    }

    #[test]
    fn descriptions_say_whose_a_rule_is() {
        let t = |name: &str, owner: &str, user: Option<&str>| TaggedCluster {
            name: ClusterName(name.into()),
            owner: owner.into(),
            user: user.map(str::to_string),
        };
        let d = describe_owner("my cluster; owner x; user y", "gw-1", Some("alice"));
        assert_eq!(
            described_cluster(&d),
            Some(t("my cluster; owner x; user y", "gw-1", Some("alice")))
        );
        let d = describe_owner("c; user z", "gw-1", None);
        assert_eq!(described_cluster(&d), Some(t("c; user z", "gw-1", None)));
        assert_eq!(
            described_cluster("gangway cluster c; owner alice"),
            Some(t("c", "alice", None)),
            "an earlier version's rule: a user as owner"
        );
        assert_eq!(
            described_cluster("gangway cluster c"),
            None,
            "the oldest form"
        );
        assert_eq!(described_cluster("someone else's rule"), None);
    }

    #[test]
    fn regions_come_from_zones() {
        assert_eq!(region_of("us-central1-a"), "us-central1");
        assert_eq!(region_of("europe-west4-b"), "europe-west4");
    }
}
