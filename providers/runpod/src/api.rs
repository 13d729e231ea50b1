//! RunPod's REST API v2: the request and response shapes gangway uses,
//! written from RunPod's v2 OpenAPI document (2.0.0, "Frontdoor v2.9.0"),
//! and one client that authenticates, spaces requests, retries throttled
//! ones and turns problem answers into [`ProviderError`]s.
//!
//! RunPod states no rate limit for pods: v2 sends `RateLimit` and
//! `RateLimit-Policy` headers, "optional", and its document's only figures
//! are the header's example, 60 a minute. The shared limiter spaces
//! requests one a second (that example); a 429 is retried after the
//! answer's `Retry-After`, or a doubling backoff where it has none.
//!
//! Successes are bare JSON (lists wrapped: `{"pods": [...]}`); failures
//! are `application/problem+json` `{title, status, detail, errors?}`.
//! Capacity has no code of its own, only a `detail`: errors are classified
//! by status and operation, the words only where the status is ambiguous.

use std::collections::BTreeMap;

use gangway_provider::{ErrorKind, ProviderError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::key::ApiKey;
use gangway_provider::http::limit::Limiter;

/// Where v2 is served (paths start `/v2/`).
pub const DEFAULT_ENDPOINT: &str = "https://api.runpod.io";

/// `PodStatus`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum PodStatus {
    /// Being placed.
    Provisioning,
    /// Placed, its container starting.
    Starting,
    /// Up.
    Running,
    /// Stopped (by someone, or the pod's command ended).
    Exited,
    /// Failed.
    Error,
    /// Gone.
    Terminated,
    /// A status this client does not know yet.
    #[serde(other)]
    Unknown,
}

/// `SecureCloud` / `CommunityCloud`.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "UPPERCASE")]
pub enum Cloud {
    /// RunPod's own data centers.
    Secure,
    /// Vetted hosts of others.
    Community,
}

impl Cloud {
    /// The name as the API and the instance types spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Cloud::Secure => "SECURE",
            Cloud::Community => "COMMUNITY",
        }
    }
}

/// One of the pod's SSH endpoints (`ssh.direct`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct SshDirect {
    /// The pod's public address.
    pub host: String,
    /// The public port mapped to the pod's 22/tcp.
    pub port: u16,
    /// Login user (`root`).
    #[serde(default)]
    pub username: Option<String>,
}

/// `ssh`: how the pod is reached.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Ssh {
    /// Straight to the pod's sshd: null unless `22/tcp` is in `ports` and
    /// the running pod has a public port for it.
    #[serde(default)]
    pub direct: Option<SshDirect>,
}

/// `globalNetworking` of a pod.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GlobalNetworking {
    /// Whether the pod is on RunPod's private network.
    #[serde(default)]
    pub enabled: bool,
    /// Its address there (other pods of the account reach it on it).
    #[serde(default)]
    pub ip: Option<String>,
}

/// The GPU of a pod (`gpu`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct PodGpu {
    /// GPU type id (`NVIDIA A100 80GB PCIe`).
    pub id: String,
    /// How many.
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

/// A pod (`Pod`): the fields gangway reads.
#[derive(Clone, Debug, Deserialize)]
pub struct Pod {
    /// RunPod's id.
    pub id: String,
    /// The name given at creation.
    #[serde(default)]
    pub name: String,
    /// Its state.
    pub status: PodStatus,
    /// Its environment (gangway's tags are here).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// GPU type and count (absent for CPU pods).
    #[serde(default)]
    pub gpu: Option<PodGpu>,
    /// Secure or community cloud.
    #[serde(default)]
    pub cloud: Option<Cloud>,
    /// Where it runs (null until placed).
    #[serde(default, rename = "dataCenterId")]
    pub data_center_id: Option<String>,
    /// How it is reached.
    #[serde(default)]
    pub ssh: Option<Ssh>,
    /// USD an hour (0 when EXITED or TERMINATED).
    #[serde(default)]
    pub cost: f64,
    /// Its private network, if on one.
    #[serde(default, rename = "globalNetworking")]
    pub global_networking: Option<GlobalNetworking>,
}

impl Pod {
    /// The value of `env` variable `key`.
    pub fn env(&self, key: &str) -> Option<&str> {
        self.env.get(key).map(String::as_str)
    }

    /// `ssh.direct`, if there is one.
    pub fn direct(&self) -> Option<&SshDirect> {
        self.ssh.as_ref()?.direct.as_ref()
    }

    /// The address on RunPod's private network, if any.
    pub fn private_ip(&self) -> Option<&str> {
        self.global_networking
            .as_ref()
            .filter(|g| g.enabled)?
            .ip
            .as_deref()
            .filter(|ip| !ip.is_empty())
    }
}

/// `GET /v2/pods`'s answer.
#[derive(Clone, Debug, Deserialize)]
pub struct Pods {
    /// Every pod of the account (no filter in v2).
    pub pods: Vec<Pod>,
}

/// `CreateGpuConfig`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CreateGpu {
    /// GPU type id.
    pub id: String,
    /// GPUs per pod.
    pub count: u32,
}

/// `CreatePodRequest`: the fields gangway sends. There is no spot or bid
/// field in v2 (the body is closed: `interruptible` is a 422).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CreatePod {
    /// Display name (at least one character).
    pub name: String,
    /// Container image.
    pub image: String,
    /// The GPUs.
    pub gpu: CreateGpu,
    /// Secure or community cloud.
    pub cloud: Cloud,
    /// The one data center to place it in.
    #[serde(rename = "dataCenterIds")]
    pub data_center_ids: Vec<String>,
    /// Published ports, `N/tcp` (`22/tcp` for `ssh.direct`).
    pub ports: Vec<String>,
    /// Environment: `PUBLIC_KEY` (what RunPod's images put into
    /// `authorized_keys`) and gangway's tags.
    pub env: BTreeMap<String, String>,
    /// Container disk, GB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<u32>,
    /// On RunPod's private network (a gang: its ranks reach each other).
    #[serde(rename = "globalNetworking", skip_serializing_if = "is_false")]
    pub global_networking: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `PodActionRequest`.
#[derive(Clone, Debug, Serialize)]
pub struct PodAction {
    /// `start`, `stop`, `restart` or `terminate`.
    pub action: &'static str,
}

/// `GpuType.price`: USD per GPU-hour.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct GpuPrice {
    /// Secure cloud.
    #[serde(default)]
    pub secure: f64,
    /// Community cloud.
    #[serde(default)]
    pub community: f64,
}

/// `GpuType`: the fields gangway reads.
#[derive(Clone, Debug, Deserialize)]
pub struct GpuType {
    /// RunPod's id (`NVIDIA A100 80GB PCIe`).
    pub id: String,
    /// Short name (`A100 PCIe`).
    #[serde(default)]
    pub name: String,
    /// Memory, GB.
    #[serde(default)]
    pub memory: f64,
    /// Sold in the secure cloud.
    #[serde(default)]
    pub secure: bool,
    /// Sold in the community cloud.
    #[serde(default)]
    pub community: bool,
    /// Prices.
    #[serde(default)]
    pub price: GpuPrice,
    /// With `include=AVAILABILITY`: the data centers that have the asked
    /// configuration, each with its level (`NONE`, `LOW`, `MEDIUM`,
    /// `HIGH`); absent when it is unavailable everywhere.
    #[serde(default, rename = "dataCenters")]
    pub data_centers: Vec<DataCenterAvailability>,
}

/// One data center of [`GpuType::data_centers`].
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct DataCenterAvailability {
    /// `US-KS-2`.
    pub id: String,
    /// `AvailabilityLevel`.
    #[serde(default)]
    pub availability: String,
}

impl GpuType {
    /// The data centers where the asked configuration can be had now
    /// (any level but `NONE`).
    pub fn available_in(&self) -> impl Iterator<Item = &str> {
        self.data_centers
            .iter()
            .filter(|d| !d.availability.is_empty() && d.availability != "NONE")
            .map(|d| d.id.as_str())
    }
}

/// `GET /v2/catalog/gpus`'s answer.
#[derive(Clone, Debug, Deserialize)]
pub struct GpuTypes {
    /// The types.
    pub gpus: Vec<GpuType>,
}

/// The RFC 9457 problem of a failure.
#[derive(Deserialize)]
struct Problem {
    #[serde(default)]
    title: String,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    errors: Vec<String>,
}

/// The operation a request is, where it changes how its failure reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `createPod`: its 400 is "could not be placed" (try the next
    /// candidate) unless it names a rule.
    Create,
    /// Anything else.
    Other,
}

/// Words of a createPod 400 that break a documented cross-field rule
/// rather than find no room: the request itself is wrong.
const RULE_WORDS: &[&str] = &["mutually exclusive", "exactly one", "required", "unknown"];

/// What a failure means for the failover loop, from the HTTP status, the
/// operation and (for a createPod 400 only) its detail.
pub fn classify(status: u16, op: Op, detail: &str) -> ErrorKind {
    let words = detail.to_ascii_lowercase();
    match status {
        401 | 403 => ErrorKind::Auth,
        // Insufficient balance: no other data center helps.
        402 => ErrorKind::Fatal,
        429 | 500..=599 => ErrorKind::Transient,
        400 if op == Op::Create && RULE_WORDS.iter().all(|w| !words.contains(w)) => {
            ErrorKind::Capacity
        }
        400 if words.contains("no longer any instances available")
            || words.contains("no instances currently available") =>
        {
            ErrorKind::Capacity
        }
        400..=499 => ErrorKind::InvalidRequest,
        _ => ErrorKind::Fatal,
    }
}

/// The error of a non-2xx answer: its kind, and its title, detail and
/// validation errors in the words (never the request's headers).
pub fn error_of(status: u16, body: &[u8], op: Op, what: &str, location: &str) -> ProviderError {
    let (kind, text) = match serde_json::from_slice::<Problem>(body) {
        Ok(p) if !p.title.is_empty() || !p.detail.is_empty() => {
            let mut text = format!("{what}: HTTP {status} {}: {}", p.title, p.detail);
            if !p.errors.is_empty() {
                text.push_str(&format!(" ({})", p.errors.join("; ")));
            }
            (classify(status, op, &p.detail), text)
        }
        _ => {
            let raw = String::from_utf8_lossy(body);
            let short: String = raw.trim().chars().take(200).collect();
            (
                classify(status, Op::Other, &short),
                format!("{what}: HTTP {status}: {short}"),
            )
        }
    };
    ProviderError::new(kind, "runpod", location, text)
}

pub use gangway_provider::http::Retry;

/// The API client of one key: the shared send loop on RunPod's v2 base.
pub struct Client {
    inner: gangway_provider::http::Client,
}

impl Client {
    /// A client of `base` (no trailing `/v2`), authenticating with `key`
    /// (`None`: every call fails as [`ErrorKind::Auth`] saying what to
    /// set), spacing requests with `limiter`.
    pub fn new(base: &str, key: Option<ApiKey>, limiter: Limiter) -> Client {
        Client {
            inner: gangway_provider::http::Client::new(
                "runpod",
                base,
                key,
                crate::key::hint,
                limiter,
            ),
        }
    }

    /// The factor the rate-limit window is multiplied by.
    pub fn scale(&self) -> f64 {
        self.inner.scale()
    }

    /// Sends one request; `Ok(None)` for an answer without a body (204).
    #[allow(clippy::too_many_arguments)]
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        op: Op,
        what: &str,
        location: &str,
        retry: Retry,
    ) -> Result<Option<T>, ProviderError> {
        let answer = self
            .inner
            .send(method, path, body.as_deref(), false, retry, what, location)
            .await?;
        if !answer.ok() {
            return Err(error_of(answer.status, &answer.body, op, what, location));
        }
        if answer.body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        self.inner
            .decode::<T>(&answer.body, what, location)
            .map(Some)
    }

    /// `GET path`, a body required.
    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        what: &str,
        location: &str,
    ) -> Result<T, ProviderError> {
        self.call(
            reqwest::Method::GET,
            path,
            None,
            Op::Other,
            what,
            location,
            Retry::Safe,
        )
        .await?
        .ok_or_else(|| {
            ProviderError::new(
                ErrorKind::Fatal,
                "runpod",
                location,
                format!("{what}: an empty answer"),
            )
        })
    }

    /// `POST path` with `body` as JSON.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        op: Op,
        what: &str,
        location: &str,
        retry: Retry,
    ) -> Result<Option<T>, ProviderError> {
        let bytes = self.inner.encode(body, what, location)?;
        self.call(
            reqwest::Method::POST,
            path,
            Some(bytes),
            op,
            what,
            location,
            retry,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_classified_by_status_and_operation() {
        let cap = br#"{"title": "Bad Request", "status": 400, "detail": "There are no longer any instances available with the requested specifications. Please refresh and try again."}"#;
        let e = error_of(400, cap, Op::Create, "create pod", "US-KS-2");
        assert_eq!(e.kind, ErrorKind::Capacity);
        assert!(e.kind.fails_over());
        assert!(
            e.message.contains("no longer any instances"),
            "{}",
            e.message
        );
        // The same words on another call are capacity too (a start).
        assert_eq!(
            error_of(400, cap, Op::Other, "start", "").kind,
            ErrorKind::Capacity
        );
        // A createPod 400 naming a rule is the request's fault.
        let rule = br#"{"title": "Bad Request", "status": 400, "detail": "exactly one of gpu or cpu must be set"}"#;
        assert_eq!(
            error_of(400, rule, Op::Create, "create pod", "").kind,
            ErrorKind::InvalidRequest
        );
        let invalid = br#"{"title": "Unprocessable Entity", "status": 422, "detail": "Request validation failed.", "errors": ["interruptible: unknown field"]}"#;
        let e = error_of(422, invalid, Op::Create, "create pod", "");
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(
            e.message.ends_with("(interruptible: unknown field)"),
            "{}",
            e.message
        );
        for (status, kind) in [
            (401, ErrorKind::Auth),
            (403, ErrorKind::Auth),
            (402, ErrorKind::Fatal),
            (404, ErrorKind::InvalidRequest),
            (409, ErrorKind::InvalidRequest),
            (429, ErrorKind::Transient),
            (503, ErrorKind::Transient),
        ] {
            assert_eq!(classify(status, Op::Other, ""), kind, "{status}");
        }
        let e = error_of(502, b"<html>bad gateway</html>", Op::Other, "list", "");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("bad gateway"));
    }

    #[test]
    fn a_create_request_is_the_documented_shape() {
        let req = CreatePod {
            name: "c-0".into(),
            image: "img".into(),
            gpu: CreateGpu {
                id: "NVIDIA A100 80GB PCIe".into(),
                count: 1,
            },
            cloud: Cloud::Secure,
            data_center_ids: vec!["US-KS-2".into()],
            ports: vec!["22/tcp".into()],
            env: [("PUBLIC_KEY".to_string(), "ssh-ed25519 AAAA".to_string())]
                .into_iter()
                .collect(),
            disk: None,
            global_networking: false,
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            serde_json::json!({
                "name": "c-0", "image": "img",
                "gpu": {"id": "NVIDIA A100 80GB PCIe", "count": 1},
                "cloud": "SECURE", "dataCenterIds": ["US-KS-2"], "ports": ["22/tcp"],
                "env": {"PUBLIC_KEY": "ssh-ed25519 AAAA"},
            })
        );
        let gang = CreatePod {
            disk: Some(80),
            global_networking: true,
            ..req
        };
        let v = serde_json::to_value(&gang).unwrap();
        assert_eq!(v["disk"], 80);
        assert_eq!(v["globalNetworking"], true);
    }

    #[test]
    fn pods_read_with_only_the_fields_used() {
        let body = br#"{"pods": [{"id": "p1", "name": "c-0", "status": "RUNNING",
            "actions": ["stop"], "image": "i", "env": {"GANGWAY_TAG_CLUSTER": "c"},
            "gpu": {"id": "NVIDIA L40S", "count": 2}, "cloud": "SECURE", "dataCenterId": "US-KS-2",
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": "x", "command": "ssh"},
                    "direct": {"host": "195.26.233.3", "port": 34446, "username": "root", "command": "ssh"}},
            "cost": 1.72, "globalNetworking": {"enabled": true, "ip": "10.65.0.2"}, "runtime": {}},
            {"id": "p2", "status": "HIBERNATING", "ssh": {"proxy": null, "direct": null}, "runtime": null}]}"#;
        let p: Pods = serde_json::from_slice(body).unwrap();
        let a = &p.pods[0];
        assert_eq!(a.status, PodStatus::Running);
        assert_eq!(a.env("GANGWAY_TAG_CLUSTER"), Some("c"));
        assert_eq!(a.direct().map(|d| d.port), Some(34446));
        assert_eq!(a.private_ip(), Some("10.65.0.2"));
        assert_eq!(a.gpu.as_ref().map(|g| g.count), Some(2));
        let b = &p.pods[1];
        assert_eq!(b.status, PodStatus::Unknown);
        assert!(b.direct().is_none() && b.private_ip().is_none() && b.env.is_empty());
    }

    #[tokio::test]
    async fn without_a_key_nothing_is_sent_and_the_error_says_what_to_set() {
        let c = Client::new("http://127.0.0.1:9", None, Limiter::new(0.0));
        let e = c
            .get::<serde_json::Value>("/v2/pods", "list pods", "")
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Auth);
        assert!(e.message.contains("RUNPOD_API_KEY"), "{}", e.message);
    }
}
