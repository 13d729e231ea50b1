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
//!
//! Spot (interruptible) pods are not in v2: they are rented through
//! RunPod's GraphQL API (`podRentInterruptable`, [`RentInterruptable`]) on
//! the same base, key, limiter and retries, and read back like any pod
//! through v2. GraphQL answers a refusal with HTTP 200 and an `errors`
//! array of words only ([`classify_graphql`]).

use std::collections::BTreeMap;

use gangway_provider::{ErrorKind, ProviderError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::key::ApiKey;
use gangway_provider::http::limit::Limiter;

/// Where v2 is served (paths start `/v2/`).
pub const DEFAULT_ENDPOINT: &str = "https://api.runpod.io";

/// RunPod's GraphQL API under the same base (`https://api.runpod.io/graphql`),
/// with the same `Authorization: Bearer` key as REST: only for what REST
/// v2 lacks (spot pods and their prices).
pub const GRAPHQL: &str = "/graphql";

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

/// `EnvironmentVariableInput` of RunPod's GraphQL API.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EnvVar {
    /// The name.
    pub key: String,
    /// The value.
    pub value: String,
}

/// GraphQL's `PodRentInterruptableInput`: the fields gangway sends to rent
/// a spot (interruptible) pod, which REST v2 cannot make. Field names and
/// types from RunPod's GraphQL spec (API-NOTES.md, "GraphQL: spot pods").
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RentInterruptable {
    /// USD per GPU-hour offered (`Float!`).
    pub bid_per_gpu: f64,
    /// `CloudTypeEnum`: `SECURE` or `COMMUNITY` (gangway never sends `ALL`).
    pub cloud_type: Cloud,
    /// GPUs per pod (`Int!`).
    pub gpu_count: u32,
    /// GPU type id.
    pub gpu_type_id: String,
    /// The one data center (GraphQL takes one, not a list).
    pub data_center_id: String,
    /// Display name.
    pub name: String,
    /// Container image.
    pub image_name: String,
    /// Container disk, GB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_disk_in_gb: Option<u32>,
    /// No pod volume (0), as the REST pods have none.
    pub volume_in_gb: u32,
    /// Published ports, comma-separated `N/tcp` (REST takes a list).
    pub ports: String,
    /// Environment as key/value pairs (REST takes an object).
    pub env: Vec<EnvVar>,
    /// A public address, so `22/tcp` gets a mapped port (`ssh.direct`).
    pub support_public_ip: bool,
}

impl RentInterruptable {
    /// The spot rent of the pod `create` describes, bidding `bid_per_gpu`:
    /// the same name, image, GPUs, cloud, data center, ports, environment
    /// and disk, in GraphQL's shapes. `None` when `create` names no data
    /// center (GraphQL takes exactly one).
    pub fn from_create(create: &CreatePod, bid_per_gpu: f64) -> Option<RentInterruptable> {
        Some(RentInterruptable {
            bid_per_gpu,
            cloud_type: create.cloud,
            gpu_count: create.gpu.count,
            gpu_type_id: create.gpu.id.clone(),
            data_center_id: create.data_center_ids.first()?.clone(),
            name: create.name.clone(),
            image_name: create.image.clone(),
            container_disk_in_gb: create.disk,
            volume_in_gb: 0,
            ports: create.ports.join(","),
            env: create
                .env
                .iter()
                .map(|(k, v)| EnvVar {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            support_public_ip: true,
        })
    }
}

/// The mutation that rents a spot pod; its `input` is a
/// [`RentInterruptable`].
pub const RENT_INTERRUPTABLE: &str = "mutation RentInterruptable($input: PodRentInterruptableInput!) { podRentInterruptable(input: $input) { id desiredStatus } }";

/// The query of one GPU type's spot prices per GPU-hour.
pub const SPOT_PRICES: &str = "query SpotPrices($input: GpuTypeFilter) { gpuTypes(input: $input) { id secureSpotPrice communitySpotPrice } }";

/// What `podRentInterruptable` answers (the fields asked for).
#[derive(Clone, Debug, Deserialize)]
pub struct Rented {
    /// The new pod's id.
    pub id: String,
}

/// `data` of [`RENT_INTERRUPTABLE`].
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RentData {
    /// Null when RunPod refused (its reason is in `errors`).
    pub pod_rent_interruptable: Option<Rented>,
}

/// One GPU type's spot prices (GraphQL `GpuType`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpotPrice {
    /// GPU type id.
    pub id: String,
    /// USD per GPU-hour in the secure cloud; null where not sold spot.
    #[serde(default)]
    pub secure_spot_price: Option<f64>,
    /// The same in the community cloud.
    #[serde(default)]
    pub community_spot_price: Option<f64>,
}

impl SpotPrice {
    /// The spot price per GPU-hour in `cloud`, if sold there (a zero is
    /// none).
    pub fn in_cloud(&self, cloud: Cloud) -> Option<f64> {
        match cloud {
            Cloud::Secure => self.secure_spot_price,
            Cloud::Community => self.community_spot_price,
        }
        .filter(|p| *p > 0.0)
    }
}

/// `data` of [`SPOT_PRICES`].
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpotPrices {
    /// The matching types.
    pub gpu_types: Vec<SpotPrice>,
}

/// One entry of a GraphQL answer's `errors`.
#[derive(Clone, Debug, Default, Deserialize)]
struct GqlError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    extensions: Option<serde_json::Value>,
}

/// A GraphQL answer: `data`, `errors`, or both.
#[derive(Deserialize)]
struct GqlAnswer<T> {
    #[serde(default = "Option::default")]
    data: Option<T>,
    #[serde(default)]
    errors: Vec<GqlError>,
}

/// Words of a GraphQL error that say the request itself is wrong (the
/// document's validation, graphql-js's wording).
const GQL_INVALID_WORDS: &[&str] = &[
    "is not defined by type",
    "got invalid value",
    "cannot query field",
    "syntax error",
    "must provide query",
    "of required type",
    "was not provided",
    "expected type",
    "unknown argument",
];

/// What a GraphQL error means for the failover loop, from its `message`,
/// its `extensions.code` (where the server gives one) and the HTTP status.
/// RunPod's errors carry no code of their own for capacity, only words
/// (the same words as REST v2's createPod 400): "no longer any instances
/// available", "no instances currently available", and a bid that is too
/// low, are capacity; a key refused is auth; a short balance is fatal; the
/// schema's validation is an invalid request. Anything else a `mutation`
/// answers is capacity, as createPod's unexplained 400 is (RunPod answers
/// a pod it could not place with an error and a null pod); anything else
/// of a query is fatal.
pub fn classify_graphql(
    status: u16,
    message: &str,
    code: Option<&str>,
    mutation: bool,
) -> ErrorKind {
    let words = message.to_ascii_lowercase();
    let code = code.unwrap_or_default().to_ascii_uppercase();
    if status == 401
        || status == 403
        || matches!(code.as_str(), "UNAUTHENTICATED" | "FORBIDDEN")
        || words.contains("unauthorized")
        || words.contains("api key")
    {
        return ErrorKind::Auth;
    }
    if status == 429 || (500..=599).contains(&status) {
        return ErrorKind::Transient;
    }
    if words.contains("no longer any instances available")
        || words.contains("no instances currently available")
        || words.contains("not enough instances")
        || (words.contains("bid") && (words.contains("low") || words.contains("minimum")))
    {
        return ErrorKind::Capacity;
    }
    if words.contains("balance") || words.contains("insufficient funds") {
        return ErrorKind::Fatal;
    }
    if matches!(
        code.as_str(),
        "GRAPHQL_VALIDATION_FAILED" | "GRAPHQL_PARSE_FAILED" | "BAD_USER_INPUT"
    ) || GQL_INVALID_WORDS.iter().any(|w| words.contains(w))
    {
        return ErrorKind::InvalidRequest;
    }
    if status >= 400 {
        return ErrorKind::InvalidRequest;
    }
    if mutation {
        ErrorKind::Capacity
    } else {
        ErrorKind::Fatal
    }
}

/// The error of a GraphQL answer with `errors` (or without a body to
/// read): the first error decides the kind; every message is in the words.
pub fn graphql_error_of(
    status: u16,
    body: &[u8],
    mutation: bool,
    what: &str,
    location: &str,
) -> ProviderError {
    let errors = serde_json::from_slice::<GqlAnswer<serde::de::IgnoredAny>>(body)
        .map(|a| a.errors)
        .unwrap_or_default();
    let Some(first) = errors.first() else {
        return error_of(status, body, Op::Other, what, location);
    };
    let code = first
        .extensions
        .as_ref()
        .and_then(|e| e.get("code"))
        .and_then(|c| c.as_str());
    let kind = classify_graphql(status, &first.message, code, mutation);
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    let status_words = if status == 200 {
        String::new()
    } else {
        format!("HTTP {status}: ")
    };
    ProviderError::new(
        kind,
        "runpod",
        location,
        format!("{what}: {status_words}{}", messages.join("; ")),
    )
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
    /// `POST /graphql` of `query` with `variables` (the same base, key
    /// and limiter as REST): its `data`, or the error its `errors` say
    /// (GraphQL answers a refused request with HTTP 200 and `errors`).
    #[allow(clippy::too_many_arguments)]
    pub async fn graphql<T: DeserializeOwned>(
        &self,
        query: &str,
        variables: serde_json::Value,
        mutation: bool,
        what: &str,
        location: &str,
        retry: Retry,
    ) -> Result<T, ProviderError> {
        let body = serde_json::json!({"query": query, "variables": variables});
        let bytes = self.inner.encode(&body, what, location)?;
        let answer = self
            .inner
            .send(
                reqwest::Method::POST,
                GRAPHQL,
                Some(&bytes),
                false,
                retry,
                what,
                location,
            )
            .await?;
        match serde_json::from_slice::<GqlAnswer<T>>(&answer.body) {
            Ok(GqlAnswer {
                data: Some(data),
                errors,
            }) if answer.ok() && errors.is_empty() => Ok(data),
            Ok(GqlAnswer { data: None, errors }) if answer.ok() && errors.is_empty() => {
                Err(ProviderError::new(
                    ErrorKind::Fatal,
                    "runpod",
                    location,
                    format!("{what}: an answer without data or errors"),
                ))
            }
            Err(e) if answer.ok() => Err(ProviderError::new(
                ErrorKind::Fatal,
                "runpod",
                location,
                format!("{what}: unexpected answer from {}: {e}", self.inner.base()),
            )),
            _ => Err(graphql_error_of(
                answer.status,
                &answer.body,
                mutation,
                what,
                location,
            )),
        }
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
    fn graphql_errors_are_classified_by_their_words() {
        let cap = br#"{"errors": [{"message": "There are no longer any instances available with the requested specifications. Please refresh and try again.", "path": ["podRentInterruptable"]}], "data": {"podRentInterruptable": null}}"#;
        let e = graphql_error_of(200, cap, true, "rent spot pod", "US-KS-2");
        assert_eq!(e.kind, ErrorKind::Capacity);
        assert!(e.kind.fails_over());
        assert_eq!(
            e.message,
            "rent spot pod: There are no longer any instances available with the requested \
             specifications. Please refresh and try again."
        );
        let low = br#"{"errors": [{"message": "Your bid price is lower than the minimum bid price for this GPU type."}]}"#;
        assert_eq!(
            graphql_error_of(200, low, true, "rent", "").kind,
            ErrorKind::Capacity
        );
        let invalid = br#"{"errors": [{"message": "Field \"interruptible\" is not defined by type \"PodRentInterruptableInput\".", "extensions": {"code": "BAD_USER_INPUT"}}]}"#;
        let e = graphql_error_of(400, invalid, true, "rent", "");
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(
            e.message.starts_with("rent: HTTP 400: Field"),
            "{}",
            e.message
        );
        // The validation words decide even at HTTP 200.
        assert_eq!(
            graphql_error_of(200, invalid, true, "rent", "").kind,
            ErrorKind::InvalidRequest
        );
        let auth = br#"{"errors": [{"message": "Unauthorized"}]}"#;
        assert_eq!(
            graphql_error_of(401, auth, true, "rent", "").kind,
            ErrorKind::Auth
        );
        for (status, words, mutation, kind) in [
            (
                200,
                "Insufficient balance to rent this pod",
                true,
                ErrorKind::Fatal,
            ),
            (200, "something new went wrong", true, ErrorKind::Capacity),
            (200, "something new went wrong", false, ErrorKind::Fatal),
            (429, "rate limit exceeded", false, ErrorKind::Transient),
            (502, "bad gateway", true, ErrorKind::Transient),
            (200, "x", true, ErrorKind::Capacity),
        ] {
            assert_eq!(
                classify_graphql(status, words, None, mutation),
                kind,
                "{words}"
            );
        }
        assert_eq!(
            classify_graphql(200, "x", Some("UNAUTHENTICATED"), true),
            ErrorKind::Auth
        );
        // No errors array to read: the REST reading of the status.
        let e = graphql_error_of(503, b"<html>down</html>", false, "spot price", "");
        assert_eq!(e.kind, ErrorKind::Transient);
    }

    #[test]
    fn a_spot_rent_is_the_on_demand_body_in_graphqls_shapes() {
        let create = CreatePod {
            name: "c-0".into(),
            image: "img".into(),
            gpu: CreateGpu {
                id: "NVIDIA A100 80GB PCIe".into(),
                count: 2,
            },
            cloud: Cloud::Community,
            data_center_ids: vec!["EU-RO-1".into()],
            ports: vec!["22/tcp".into(), "8000/tcp".into()],
            env: [
                ("PUBLIC_KEY".to_string(), "ssh-ed25519 AAAA".to_string()),
                ("GANGWAY_TAG_CLUSTER".to_string(), "c".to_string()),
            ]
            .into_iter()
            .collect(),
            disk: None,
            global_networking: false,
        };
        let rent = RentInterruptable::from_create(&create, 0.6).unwrap();
        assert_eq!(
            serde_json::to_value(&rent).unwrap(),
            serde_json::json!({
                "bidPerGpu": 0.6, "cloudType": "COMMUNITY", "gpuCount": 2,
                "gpuTypeId": "NVIDIA A100 80GB PCIe", "dataCenterId": "EU-RO-1",
                "name": "c-0", "imageName": "img", "volumeInGb": 0,
                "ports": "22/tcp,8000/tcp",
                "env": [{"key": "GANGWAY_TAG_CLUSTER", "value": "c"},
                        {"key": "PUBLIC_KEY", "value": "ssh-ed25519 AAAA"}],
                "supportPublicIp": true,
            })
        );
        let disk = CreatePod {
            disk: Some(80),
            ..create.clone()
        };
        assert_eq!(
            serde_json::to_value(RentInterruptable::from_create(&disk, 0.6).unwrap()).unwrap()
                ["containerDiskInGb"],
            80
        );
        let nowhere = CreatePod {
            data_center_ids: Vec::new(),
            ..create
        };
        assert!(RentInterruptable::from_create(&nowhere, 0.6).is_none());
        // The mutation asks for the input type by name, as a variable.
        assert!(RENT_INTERRUPTABLE.contains("($input: PodRentInterruptableInput!)"));
        let p: SpotPrices = serde_json::from_value(serde_json::json!({"gpuTypes": [
            {"id": "NVIDIA A100 80GB PCIe", "secureSpotPrice": 0.7, "communitySpotPrice": null}]}))
        .unwrap();
        assert_eq!(p.gpu_types[0].in_cloud(Cloud::Secure), Some(0.7));
        assert_eq!(p.gpu_types[0].in_cloud(Cloud::Community), None);
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
