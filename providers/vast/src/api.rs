//! Vast.ai's API: the request and response shapes gangway uses, written
//! from Vast's OpenAPI document (1.0.0) and what its official CLI sends
//! (trailing slashes, `env` as an object, `runtype`), and one client that
//! authenticates, spaces requests, retries throttled ones and turns error
//! bodies (`{success: false, error, msg}`, or plain text for a 429) into
//! [`ProviderError`]s.
//!
//! Vast.ai limits each endpoint per key as a minimum interval between
//! requests (its create endpoint documents a threshold of 4.5, units not
//! stated) and answers a 429, often plain text, with no `Retry-After`. The
//! shared limiter spaces requests one a second; a 429 is retried with a
//! doubling backoff.

use std::collections::BTreeMap;

use gangway_provider::{ErrorKind, ProviderError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::key::ApiKey;
use gangway_provider::http::limit::Limiter;

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

pub use gangway_provider::http::Retry;

/// The API client of one key: the shared send loop on Vast.ai's base.
pub struct Client {
    inner: gangway_provider::http::Client,
}

impl Client {
    /// A client of `base` (no trailing `/api`), authenticating with `key`,
    /// spacing requests with `limiter`.
    pub fn new(base: &str, key: Option<ApiKey>, limiter: Limiter) -> Client {
        Client {
            inner: gangway_provider::http::Client::new(
                "vast",
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
        let body = match body {
            Some(b) => Some(self.inner.encode(b, what, location)?),
            None => None,
        };
        let answer = self
            .inner
            .send(method, path, body.as_deref(), false, retry, what, location)
            .await?;
        if !answer.ok() {
            return Err(error_of(answer.status, &answer.body, what, location));
        }
        self.inner.decode::<T>(&answer.body, what, location)
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
