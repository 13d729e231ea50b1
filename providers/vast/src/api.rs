//! Vast.ai's API: the request and response shapes gangway uses, written
//! from Vast's OpenAPI document (1.0.0) and what its official CLI sends
//! (trailing slashes, `env` as an object, `runtype`), and one client that
//! authenticates, spaces requests, retries throttled ones and turns error
//! bodies (`{success: false, error, msg}`, or plain text for a 429) into
//! [`ProviderError`]s.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_provider::{ErrorKind, ProviderError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::key::ApiKey;
use crate::limit::{backoff, Limiter};

/// Where the API is served (paths start `/api/v0/` or `/api/v1/`).
pub const DEFAULT_ENDPOINT: &str = "https://console.vast.ai";

/// One offer of the market (`POST /api/v0/bundles/`): the fields used.
#[derive(Clone, Debug, Deserialize)]
pub struct Offer {
    /// The ask id to rent it by.
    pub id: u64,
    /// The host machine.
    #[serde(default)]
    pub machine_id: u64,
    /// `RTX 4090`.
    pub gpu_name: String,
    /// GPUs.
    pub num_gpus: u32,
    /// USD an hour (the minimum bid in a `bid` search).
    pub dph_total: f64,
    /// The minimum bid for an interruptible rental.
    #[serde(default)]
    pub min_bid: Option<f64>,
    /// `City, CC`.
    #[serde(default)]
    pub geolocation: Option<String>,
}

impl Offer {
    /// The country code of its location (`US` of `Washington, US`).
    pub fn country(&self) -> Option<&str> {
        country(self.geolocation.as_deref()?)
    }
}

/// The country code of a Vast geolocation (`Washington, US` -> `US`; a
/// bare `US` is its own).
pub fn country(geolocation: &str) -> Option<&str> {
    let c = geolocation.rsplit(',').next()?.trim();
    (!c.is_empty()).then_some(c)
}

/// The answer of an offer search.
#[derive(Clone, Debug, Deserialize)]
pub struct Offers {
    /// The matching offers.
    pub offers: Vec<Offer>,
}

/// One port binding of Docker's shape (`ports["22/tcp"][0]`).
#[derive(Clone, Debug, Deserialize)]
pub struct PortBinding {
    /// The host's port, as a string.
    #[serde(rename = "HostPort")]
    pub host_port: String,
}

/// An instance (a contract): the fields used.
#[derive(Clone, Debug, Deserialize)]
pub struct Instance {
    /// Vast's id.
    pub id: u64,
    /// null while provisioning, then `loading`, `running`, `stopped`,
    /// `exited`, `offline`, ...
    #[serde(default)]
    pub actual_status: Option<String>,
    /// What the renter asked: `running` or `stopped`.
    #[serde(default)]
    pub intended_status: Option<String>,
    /// `running`, `stopped`, `unloaded`.
    #[serde(default)]
    pub cur_state: Option<String>,
    /// The label given at creation (gangway's tags).
    #[serde(default)]
    pub label: Option<String>,
    /// `RTX 4090`.
    #[serde(default)]
    pub gpu_name: Option<String>,
    /// GPUs.
    #[serde(default)]
    pub num_gpus: Option<u32>,
    /// USD an hour (the bid, for an interruptible one).
    #[serde(default)]
    pub dph_total: Option<f64>,
    /// Interruptible (a bid).
    #[serde(default)]
    pub is_bid: bool,
    /// `City, CC`.
    #[serde(default)]
    pub geolocation: Option<String>,
    /// The SSH proxy's host.
    #[serde(default)]
    pub ssh_host: Option<String>,
    /// The SSH proxy's port.
    #[serde(default)]
    pub ssh_port: Option<u16>,
    /// The machine's public address.
    #[serde(default)]
    pub public_ipaddr: Option<String>,
    /// Docker's port map (`{"22/tcp": [{"HostPort": "41022"}]}`); some
    /// answers have other shapes, read as none.
    #[serde(default, deserialize_with = "lenient_ports")]
    pub ports: BTreeMap<String, Vec<PortBinding>>,
    /// Why it is in its state, in Vast's words.
    #[serde(default)]
    pub status_msg: Option<String>,
    /// The environment as `[key, value]` pairs.
    #[serde(default, deserialize_with = "lenient_env")]
    pub extra_env: Vec<(String, String)>,
}

fn lenient_ports<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Vec<PortBinding>>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).unwrap_or_default())
}

fn lenient_env<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(String, String)>, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).unwrap_or_default())
}

impl Instance {
    /// Where its sshd answers directly: the public address and the host
    /// port of its `22/tcp`; else the SSH proxy Vast gives.
    pub fn ssh(&self) -> Option<(String, u16)> {
        let direct = self.public_ipaddr.as_deref().filter(|a| !a.is_empty());
        let port = self
            .ports
            .get("22/tcp")
            .and_then(|b| b.first())
            .and_then(|b| b.host_port.parse::<u16>().ok());
        if let (Some(a), Some(p)) = (direct, port) {
            return Some((a.to_string(), p));
        }
        match (self.ssh_host.as_deref(), self.ssh_port) {
            (Some(h), Some(p)) if !h.is_empty() => Some((h.to_string(), p)),
            _ => None,
        }
    }

    /// The value of environment variable `key`.
    pub fn env(&self, key: &str) -> Option<&str> {
        self.extra_env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET /api/v1/instances/`'s page.
#[derive(Clone, Debug, Deserialize)]
pub struct InstancePage {
    /// This page.
    #[serde(default)]
    pub instances: Vec<Instance>,
    /// The next page's token, if there is one.
    #[serde(default)]
    pub next_token: Option<String>,
}

/// `PUT /api/v0/asks/{id}/`'s body: the fields gangway sends, as the CLI
/// does.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CreateInstance {
    /// Docker image.
    pub image: String,
    /// gangway's tags ([`crate::names`]).
    pub label: String,
    /// Disk, GB.
    pub disk: f64,
    /// `ssh_direc ssh_proxy`: sshd in the container, reachable directly and
    /// through Vast's proxy (the CLI's spelling).
    pub runtype: String,
    /// Environment (the CLI's object form).
    pub env: BTreeMap<String, String>,
    /// The bid (USD an hour) for an interruptible instance; none on demand.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price: Option<f64>,
    /// A gone offer is a 410 rather than a wait.
    pub cancel_unavail: bool,
}

/// `PUT /api/v0/asks/{id}/`'s answer.
#[derive(Clone, Debug, Deserialize)]
pub struct Created {
    /// The new instance's id.
    pub new_contract: u64,
}

/// `POST /api/v0/instances/{id}/ssh/`'s body.
#[derive(Clone, Debug, Serialize)]
pub struct AttachKey {
    /// An OpenSSH public key.
    pub ssh_key: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    msg: Option<String>,
    #[serde(default)]
    detail: Option<String>,
}

/// What a failure means for the failover loop, from the status and Vast's
/// `error` word (its message only for `no_such_ask`, which it also puts
/// under `invalid_args`).
pub fn classify(status: u16, error: &str, msg: &str) -> ErrorKind {
    match (status, error) {
        _ if msg.contains("no_such_ask") || error == "no_such_ask" => ErrorKind::Capacity,
        // The bid is under the offer's minimum now: the market moved.
        (_, "invalid_price") => ErrorKind::Capacity,
        (401 | 403, _) => ErrorKind::Auth,
        (429, _) | (500..=599, _) => ErrorKind::Transient,
        (400..=499, _) => ErrorKind::InvalidRequest,
        _ => ErrorKind::Fatal,
    }
}

/// The error of a non-2xx answer, in Vast's words (never the request's
/// headers).
pub fn error_of(status: u16, body: &[u8], what: &str, location: &str) -> ProviderError {
    let (kind, text) = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) if b.error.is_some() || b.msg.is_some() || b.detail.is_some() => {
            let error = b.error.unwrap_or_default();
            let msg = b.msg.or(b.detail).unwrap_or_default();
            (
                classify(status, &error, &msg),
                format!("{what}: HTTP {status} {error}: {msg}"),
            )
        }
        _ => {
            let raw = String::from_utf8_lossy(body);
            let short: String = raw.trim().chars().take(200).collect();
            (
                classify(status, "", &short),
                format!("{what}: HTTP {status}: {short}"),
            )
        }
    };
    ProviderError::new(kind, "vast", location, text)
}

/// How a request may be repeated when it fails before an answer says
/// what happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Reads and idempotent writes: a 429, a 5xx or a lost connection is
    /// retried.
    Safe,
    /// Rentals: only a 429 is retried; a lost answer is the caller's to
    /// reconcile (by label).
    OnlyThrottled,
}

/// The API client of one key.
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: Option<ApiKey>,
    limiter: Limiter,
    attempts: u32,
}

impl Client {
    /// A client of `base` (no trailing `/api`), authenticating with `key`,
    /// spacing requests with `limiter`.
    pub fn new(base: &str, key: Option<ApiKey>, limiter: Limiter) -> Client {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(15))
            .user_agent(concat!("gangway/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            key,
            limiter,
            attempts: 6,
        }
    }

    /// The factor the rate-limit window is multiplied by.
    pub fn scale(&self) -> f64 {
        self.limiter.scale()
    }

    /// Sends one request (`body` as JSON) and reads the answer as `T`.
    pub async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
        what: &str,
        location: &str,
        retry: Retry,
    ) -> Result<T, ProviderError> {
        let Some(key) = &self.key else {
            return Err(ProviderError::new(
                ErrorKind::Auth,
                "vast",
                location,
                format!("no API key: {}", crate::key::hint()),
            ));
        };
        let body = match body {
            Some(b) => Some(serde_json::to_vec(b).map_err(|e| {
                ProviderError::new(ErrorKind::Fatal, "vast", location, format!("{what}: {e}"))
            })?),
            None => None,
        };
        let mut attempt = 0;
        loop {
            self.limiter.acquire().await;
            let mut req = self
                .http
                .request(method.clone(), format!("{}{path}", self.base))
                .header(
                    reqwest::header::AUTHORIZATION,
                    format!("Bearer {}", key.expose()),
                )
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(b) = &body {
                req = req
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(b.clone());
            }
            let (status, bytes) = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    match resp.bytes().await {
                        Ok(b) => (status, b),
                        Err(e) => (0, gangway_provider::error_chain(&e).into()),
                    }
                }
                Err(e) => (0, gangway_provider::error_chain(&e).into()),
            };
            let again = attempt + 1 < self.attempts
                && match status {
                    429 => true,
                    0 | 502..=504 => retry == Retry::Safe,
                    _ => false,
                };
            if again {
                let seed = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos() as u64)
                    .unwrap_or(0);
                tokio::time::sleep(backoff(attempt, self.limiter.scale(), None, seed)).await;
                attempt += 1;
                continue;
            }
            if status == 0 {
                return Err(ProviderError::new(
                    ErrorKind::Transient,
                    "vast",
                    location,
                    format!("{what}: {}", String::from_utf8_lossy(&bytes)),
                ));
            }
            if !(200..300).contains(&status) {
                return Err(error_of(status, &bytes, what, location));
            }
            return serde_json::from_slice::<T>(&bytes).map_err(|e| {
                ProviderError::new(
                    ErrorKind::Fatal,
                    "vast",
                    location,
                    format!("{what}: unexpected answer from {}: {e}", self.base),
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_status_and_vasts_words() {
        let gone = br#"{"success": false, "error": "invalid_args", "msg": "error 404/3603: no_such_ask Instance type by id 41001 is not available.", "ask_id": 41001}"#;
        let e = error_of(404, gone, "rent offer 41001", "US");
        assert_eq!(e.kind, ErrorKind::Capacity);
        let gone = br#"{"success": false, "error": "no_such_ask", "msg": "error 410/3907: no_such_ask Instance type 41001 is no longer available.", "ask_id": 41001}"#;
        assert_eq!(error_of(410, gone, "rent", "").kind, ErrorKind::Capacity);
        let bid = br#"{"success": false, "error": "invalid_price", "msg": "Bid price 0.1 is below the minimum bid 0.18."}"#;
        assert_eq!(error_of(400, bid, "rent", "").kind, ErrorKind::Capacity);
        let e = error_of(
            429,
            b"API requests too frequent endpoint threshold=4.5",
            "rent",
            "",
        );
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("too frequent"));
        let auth = br#"{"success": false, "error": "invalid_api_key", "msg": "Invalid or missing API key."}"#;
        assert_eq!(error_of(401, auth, "list", "").kind, ErrorKind::Auth);
        let bad = br#"{"success": false, "error": "invalid_args", "msg": "image: required"}"#;
        assert_eq!(
            error_of(400, bad, "rent", "").kind,
            ErrorKind::InvalidRequest
        );
        assert_eq!(classify(503, "", ""), ErrorKind::Transient);
    }

    #[test]
    fn a_create_request_is_the_clis_shape() {
        let c = CreateInstance {
            image: "img".into(),
            label: "gw-0123456789abcdef--c--0".into(),
            disk: 32.0,
            runtype: "ssh_direc ssh_proxy".into(),
            env: BTreeMap::new(),
            price: None,
            cancel_unavail: true,
        };
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"image": "img", "label": "gw-0123456789abcdef--c--0", "disk": 32.0,
                "runtype": "ssh_direc ssh_proxy", "env": {}, "cancel_unavail": true})
        );
        let bid = CreateInstance {
            price: Some(0.2),
            ..c
        };
        assert_eq!(serde_json::to_value(&bid).unwrap()["price"], 0.2);
    }

    #[test]
    fn instances_read_their_ssh_endpoint_direct_first() {
        let i: Instance = serde_json::from_value(serde_json::json!({
            "id": 7, "actual_status": "running", "intended_status": "running", "cur_state": "running",
            "label": "l", "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.4, "is_bid": false,
            "geolocation": "Washington, US", "ssh_host": "ssh4.vast.ai", "ssh_port": 30007,
            "public_ipaddr": "203.0.113.5", "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41022"}]},
            "extra_env": [["GANGWAY_TAG_USER", "alice"]], "status_msg": null}))
        .unwrap();
        assert_eq!(i.ssh(), Some(("203.0.113.5".into(), 41022)));
        assert_eq!(i.env("GANGWAY_TAG_USER"), Some("alice"));
        let proxy: Instance = serde_json::from_value(serde_json::json!({
            "id": 8, "ssh_host": "ssh4.vast.ai", "ssh_port": 30008, "ports": [22], "extra_env": null}))
        .unwrap();
        assert_eq!(proxy.ssh(), Some(("ssh4.vast.ai".into(), 30008)));
        assert!(proxy.ports.is_empty());
        assert_eq!(country("Washington, US"), Some("US"));
        assert_eq!(country("SI"), Some("SI"));
    }
}
