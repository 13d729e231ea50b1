//! Lambda Cloud's REST API (v1): the request and response shapes gangway
//! uses, written from Lambda's OpenAPI document (1.8.3), and one client
//! that authenticates, spaces requests ([`crate::limit`]), retries
//! throttled ones and turns error envelopes into [`ProviderError`]s.
//!
//! Every success is `{"data": ...}` and every failure `{"error": {code,
//! message, suggestion?}}`; errors are classified by status and `code`,
//! the words only where no code is given.

use gangway_provider::{ErrorKind, ProviderError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::key::ApiKey;
use gangway_provider::http::limit::Limiter;

/// Where the API is served (paths start `/api/v1/`).
pub const DEFAULT_ENDPOINT: &str = "https://cloud.lambda.ai";

/// A region as the API names it (`us-east-1`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Region {
    /// `PublicRegionCode`.
    pub name: String,
}

/// An instance type (`InstanceType`): the fields gangway reads.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct InstanceType {
    /// `gpu_8x_h100_sxm5`.
    pub name: String,
    /// On-demand price, US cents an hour.
    pub price_cents_per_hour: i64,
}

/// One entry of `GET /instance-types` (`InstanceTypesItem`).
#[derive(Clone, Debug, Deserialize)]
pub struct InstanceTypesItem {
    /// The type.
    pub instance_type: InstanceType,
    /// Where it can be launched now.
    pub regions_with_capacity_available: Vec<Region>,
}

/// `InstanceStatus`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum InstanceStatus {
    /// Starting.
    Booting,
    /// Running.
    Active,
    /// Running, but Lambda's health checks fail.
    Unhealthy,
    /// Gone.
    Terminated,
    /// Going.
    Terminating,
    /// Taken away by Lambda.
    Preempted,
    /// A status this client does not know yet.
    #[serde(other)]
    Unknown,
}

/// A tag on an instance (`RequestedTagEntry` / `TagEntry`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Tag {
    /// `^[a-z][a-z0-9-:]+$`, at most 55 characters.
    pub key: String,
    /// At most 128 characters.
    pub value: String,
}

/// An instance (`Instance`): the fields gangway reads.
#[derive(Clone, Debug, Deserialize)]
pub struct Instance {
    /// Lambda's id.
    pub id: String,
    /// Its state.
    pub status: InstanceStatus,
    /// The name given at launch.
    #[serde(default)]
    pub name: Option<String>,
    /// Public IPv4 address (once booted).
    #[serde(default)]
    pub ip: Option<String>,
    /// Private IPv4 address (once booted).
    #[serde(default)]
    pub private_ip: Option<String>,
    /// Where it runs.
    pub region: Region,
    /// What it is.
    pub instance_type: InstanceType,
    /// Its tags.
    #[serde(default)]
    pub tags: Vec<Tag>,
}

impl Instance {
    /// The value of tag `key`.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags
            .iter()
            .find(|t| t.key == key)
            .map(|t| t.value.as_str())
    }
}

/// `ImageSpecificationID`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ImageId {
    /// The image's id.
    pub id: String,
}

/// `InstanceLaunchRequest`: the fields gangway sends (one instance per
/// request: the current document has no quantity).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LaunchInstance {
    /// Region.
    pub region_name: String,
    /// Type.
    pub instance_type_name: String,
    /// Exactly one key's name.
    pub ssh_key_names: Vec<String>,
    /// At most 64 characters.
    pub name: String,
    /// gangway's tags.
    pub tags: Vec<Tag>,
    /// An image by id (default: Lambda Stack).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageId>,
}

/// The answer of a launch.
#[derive(Clone, Debug, Deserialize)]
pub struct Launched {
    /// The new instances.
    pub instance_ids: Vec<String>,
}

/// `POST /instance-operations/terminate`'s body.
#[derive(Clone, Debug, Serialize)]
pub struct TerminateInstances {
    /// What to end.
    pub instance_ids: Vec<String>,
}

/// An account SSH key (`SSHKey`).
#[derive(Clone, Debug, Deserialize)]
pub struct SshKey {
    /// Lambda's id.
    pub id: String,
    /// Its name (what launches refer to).
    pub name: String,
    /// The public key.
    pub public_key: String,
}

/// `AddSSHKeyRequest` with the public key given (Lambda then generates
/// nothing).
#[derive(Clone, Debug, Serialize)]
pub struct AddSshKey {
    /// 1-64 characters.
    pub name: String,
    /// OpenSSH public key.
    pub public_key: String,
}

#[derive(Deserialize)]
struct Data<T> {
    data: T,
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

#[derive(Deserialize)]
struct ErrorBody {
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    suggestion: Option<String>,
}

/// What a failure means for the failover loop, from the HTTP status and
/// Lambda's error `code` (its words only as a last resort).
pub fn classify(status: u16, code: &str, message: &str) -> ErrorKind {
    let words = message.to_ascii_lowercase();
    match (status, code) {
        (_, "instance-operations/launch/insufficient-capacity") => ErrorKind::Capacity,
        (_, "global/quota-exceeded") => ErrorKind::Quota,
        (_, "global/invalid-api-key" | "global/account-inactive") | (401, _) => ErrorKind::Auth,
        (429, _) => ErrorKind::Transient,
        // Upstream trouble inside Lambda (`provider/internal-unavailable`).
        (_, c) if c.starts_with("provider/") => ErrorKind::Transient,
        (500..=599, _) => ErrorKind::Transient,
        _ if words.contains("insufficient capacity")
            || words.contains("not enough capacity")
            || words.contains("no capacity") =>
        {
            ErrorKind::Capacity
        }
        (403, _) => ErrorKind::Auth,
        (400..=499, _) => ErrorKind::InvalidRequest,
        _ => ErrorKind::Fatal,
    }
}

/// The error of a non-2xx answer: its kind, and its code, message and
/// suggestion in the words (never the request's headers).
pub fn error_of(status: u16, body: &[u8], op: &str, location: &str) -> ProviderError {
    let (kind, text) = match serde_json::from_slice::<ErrorEnvelope>(body) {
        Ok(ErrorEnvelope { error: e }) => {
            let mut text = format!("{op}: HTTP {status} {}: {}", e.code, e.message);
            if let Some(s) = e.suggestion.filter(|s| !s.is_empty()) {
                text.push_str(&format!(" ({s})"));
            }
            (classify(status, &e.code, &e.message), text)
        }
        Err(_) => {
            let raw = String::from_utf8_lossy(body);
            let short: String = raw.trim().chars().take(200).collect();
            (
                classify(status, "", &short),
                format!("{op}: HTTP {status}: {short}"),
            )
        }
    };
    ProviderError::new(kind, "lambda", location, text)
}

pub use gangway_provider::http::Retry;

/// The API client of one key: the shared send loop, with launches spaced
/// by Lambda's launch window.
pub struct Client {
    inner: gangway_provider::http::Client,
}

impl Client {
    /// A client of `base` (no trailing `/api/v1`), authenticating with
    /// `key` (`None`: every call fails as [`ErrorKind::Auth`] with `hint`),
    /// spacing requests with `limiter`.
    pub fn new(base: &str, key: Option<ApiKey>, limiter: Limiter) -> Client {
        Client {
            inner: gangway_provider::http::Client::new(
                "lambda",
                base,
                key,
                crate::key::hint,
                limiter,
            ),
        }
    }

    /// The factor the rate-limit windows are multiplied by.
    pub fn scale(&self) -> f64 {
        self.inner.scale()
    }

    /// Whether a key was found.
    pub fn has_key(&self) -> bool {
        self.inner.has_key()
    }

    /// The URL of `path` (`/api/v1/...`).
    pub fn url(&self, path: &str) -> String {
        self.inner.url(path)
    }

    /// Sends one request and reads `{"data": T}`; `op` names it in errors.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        op: &str,
        location: &str,
        retry: Retry,
    ) -> Result<T, ProviderError> {
        let launch = path.ends_with("/instance-operations/launch");
        let answer = self
            .inner
            .send(method, path, body.as_deref(), launch, retry, op, location)
            .await?;
        if !answer.ok() {
            return Err(error_of(answer.status, &answer.body, op, location));
        }
        self.inner
            .decode::<Data<T>>(&answer.body, op, location)
            .map(|d| d.data)
    }

    /// `GET path`.
    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        op: &str,
        location: &str,
    ) -> Result<T, ProviderError> {
        self.call(reqwest::Method::GET, path, None, op, location, Retry::Safe)
            .await
    }

    /// `POST path` with `body` as JSON.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        op: &str,
        location: &str,
        retry: Retry,
    ) -> Result<T, ProviderError> {
        let bytes = self.inner.encode(body, op, location)?;
        self.call(
            reqwest::Method::POST,
            path,
            Some(bytes),
            op,
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
    fn errors_are_classified_by_code_then_status() {
        let cap = br#"{"error": {"code": "instance-operations/launch/insufficient-capacity", "message": "Not enough capacity to fulfill launch request."}}"#;
        let e = error_of(400, cap, "launch", "us-east-1");
        assert_eq!(e.kind, ErrorKind::Capacity);
        assert!(e.kind.fails_over());
        assert_eq!(e.location, "us-east-1");
        assert!(e.message.contains("insufficient-capacity"), "{}", e.message);
        let quota = br#"{"error": {"code": "global/quota-exceeded", "message": "Quota exceeded.", "suggestion": "Contact Support to increase your quota."}}"#;
        let e = error_of(400, quota, "launch", "us-east-1");
        assert_eq!(e.kind, ErrorKind::Quota);
        assert!(e
            .message
            .ends_with("(Contact Support to increase your quota.)"));
        for (status, code, kind) in [
            (401, "global/invalid-api-key", ErrorKind::Auth),
            (403, "global/account-inactive", ErrorKind::Auth),
            (400, "global/invalid-parameters", ErrorKind::InvalidRequest),
            (
                404,
                "global/object-does-not-exist",
                ErrorKind::InvalidRequest,
            ),
            (429, "global/rate-limited", ErrorKind::Transient),
            (503, "provider/internal-unavailable", ErrorKind::Transient),
            (500, "global/unknown", ErrorKind::Transient),
        ] {
            assert_eq!(classify(status, code, ""), kind, "{status} {code}");
        }
        // Words only where there is no code to go by.
        assert_eq!(
            classify(400, "", "Insufficient capacity in region"),
            ErrorKind::Capacity
        );
        let e = error_of(502, b"<html>bad gateway</html>", "list", "");
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.contains("bad gateway"));
    }

    #[test]
    fn a_launch_request_is_the_documented_shape() {
        let req = LaunchInstance {
            region_name: "us-east-1".into(),
            instance_type_name: "gpu_1x_a10".into(),
            ssh_key_names: vec!["gw-0123456789abcdef--c".into()],
            name: "c-0".into(),
            tags: vec![Tag {
                key: "gangway-cluster".into(),
                value: "c".into(),
            }],
            image: None,
        };
        let v = serde_json::to_value(&req).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "region_name": "us-east-1",
                "instance_type_name": "gpu_1x_a10",
                "ssh_key_names": ["gw-0123456789abcdef--c"],
                "name": "c-0",
                "tags": [{"key": "gangway-cluster", "value": "c"}],
            })
        );
        let with_image = LaunchInstance {
            image: Some(ImageId { id: "img".into() }),
            ..req
        };
        assert_eq!(
            serde_json::to_value(&with_image).unwrap()["image"],
            serde_json::json!({"id": "img"})
        );
    }

    #[test]
    fn instances_read_with_only_the_fields_used() {
        let body = br#"{"data": [{"id": "i1", "status": "active", "ip": "1.2.3.4",
            "private_ip": "10.0.0.2", "ssh_key_names": ["k"], "file_system_names": [],
            "region": {"name": "us-east-1", "description": "Virginia, USA"},
            "instance_type": {"name": "gpu_1x_a10", "description": "x", "gpu_description": "A10",
              "price_cents_per_hour": 129, "specs": {"vcpus": 30, "memory_gib": 200, "storage_gib": 1400, "gpus": 1}},
            "tags": [{"key": "gangway-cluster", "value": "c"}], "actions": {}},
            {"id": "i2", "status": "rebooting", "region": {"name": "us-east-1"},
             "instance_type": {"name": "t", "price_cents_per_hour": 1}}]}"#;
        let d: Data<Vec<Instance>> = serde_json::from_slice(body).unwrap();
        let i = &d.data[0];
        assert_eq!(i.status, InstanceStatus::Active);
        assert_eq!(i.tag("gangway-cluster"), Some("c"));
        assert_eq!(i.instance_type.price_cents_per_hour, 129);
        assert_eq!(d.data[1].status, InstanceStatus::Unknown);
        assert!(d.data[1].tags.is_empty() && d.data[1].ip.is_none());
    }

    #[tokio::test]
    async fn without_a_key_nothing_is_sent_and_the_error_says_what_to_set() {
        let c = Client::new("http://127.0.0.1:9", None, Limiter::new(0.0));
        let e = c
            .get::<serde_json::Value>("/api/v1/instances", "list instances", "")
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Auth);
        assert!(e.message.contains("LAMBDA_API_KEY"), "{}", e.message);
    }
}
