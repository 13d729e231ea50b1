//! Azure Resource Manager over HTTP: bearer tokens, throttling (429 with
//! `Retry-After`), long-running operations (`Azure-AsyncOperation`, else
//! `Location`), paged lists (`nextLink`) and ARM's error body.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::auth::{AuthError, Tokens};

/// `Microsoft.Resources` (resource groups and their operation results).
pub const API_RESOURCES: &str = "2025-03-01";
/// `Microsoft.Compute` VMs, proximity placement groups, operations.
pub const API_COMPUTE: &str = "2024-11-01";
/// `Microsoft.Compute/skus`.
pub const API_SKUS: &str = "2021-07-01";
/// `Microsoft.Network`, all of it.
pub const API_NETWORK: &str = "2024-10-01";
/// `GET /subscriptions/{id}`.
pub const API_SUBSCRIPTIONS: &str = "2022-12-01";

/// How many times a throttled or failing request is sent again.
const RETRIES: u32 = 6;
/// How long a long-running operation is waited for.
const LRO_LIMIT: Duration = Duration::from_secs(30 * 60);

/// What went wrong talking to ARM.
#[derive(Debug, Clone)]
pub struct ArmError {
    /// HTTP status (0: a failed long-running operation, or no answer).
    pub status: u16,
    /// ARM's error code (`SkuNotAvailable`), or a word of ours.
    pub code: String,
    /// ARM's message.
    pub message: String,
}

impl std::fmt::Display for ArmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl ArmError {
    fn local(code: &str, message: impl Into<String>) -> ArmError {
        ArmError {
            status: 0,
            code: code.into(),
            message: message.into(),
        }
    }

    /// Whether ARM said the thing is not there.
    pub fn not_found(&self) -> bool {
        self.status == 404
    }

    /// From ARM's error body `{"error": {"code", "message", "details"}}`
    /// (or a failed operation's `error`).
    pub fn from_body(status: u16, body: &Value, raw: &str) -> ArmError {
        let e = if body["error"].is_object() {
            &body["error"]
        } else {
            body
        };
        let code = e["code"].as_str().unwrap_or("").to_string();
        let mut message = e["message"].as_str().unwrap_or("").to_string();
        if let Some(details) = e["details"].as_array() {
            for d in details {
                if let (Some(c), Some(m)) = (d["code"].as_str(), d["message"].as_str()) {
                    message.push_str(&format!(" ({c}: {m})"));
                }
            }
        }
        if code.is_empty() && message.is_empty() {
            return ArmError {
                status,
                code: format!("HTTP{status}"),
                message: raw.chars().take(300).collect(),
            };
        }
        ArmError {
            status,
            code,
            message,
        }
    }
}

impl From<AuthError> for ArmError {
    fn from(e: AuthError) -> ArmError {
        ArmError {
            status: 401,
            code: "CredentialUnavailable".into(),
            message: e.to_string(),
        }
    }
}

/// One answer: status, the headers ARM's operations are steered by, body.
struct Answer {
    status: StatusCode,
    async_op: Option<String>,
    location: Option<String>,
    retry_after: Option<Duration>,
    body: Value,
}

/// An ARM client for one subscription.
pub struct Arm {
    /// The ARM endpoint, no trailing slash.
    pub endpoint: String,
    /// The subscription id.
    pub subscription: String,
    tokens: Tokens,
    http: reqwest::Client,
    /// The least wait between polls (tests: the fake's `Retry-After: 0`).
    min_poll: Duration,
}

pub(crate) fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    h.get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|s| Duration::from_secs_f64(s.clamp(0.0, 120.0)))
}

impl Arm {
    /// A client of `endpoint` for `subscription`.
    pub fn new(
        endpoint: String,
        subscription: String,
        tokens: Tokens,
        http: reqwest::Client,
    ) -> Arm {
        Arm {
            endpoint,
            subscription,
            tokens,
            http,
            min_poll: Duration::from_millis(200),
        }
    }

    /// Who the tokens are for.
    pub fn identity(&self) -> &str {
        &self.tokens.identity
    }

    /// `/subscriptions/{sub}`.
    pub fn sub(&self) -> String {
        format!("/subscriptions/{}", self.subscription)
    }

    /// `/subscriptions/{sub}/resourceGroups/{rg}`.
    pub fn group(&self, rg: &str) -> String {
        format!("{}/resourceGroups/{rg}", self.sub())
    }

    fn url(&self, path: &str, api: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            return path.to_string();
        }
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}{path}{sep}api-version={api}", self.endpoint)
    }

    /// One request, sent again while throttled (429, honouring
    /// `Retry-After`) or while ARM answers 5xx or not at all.
    async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ArmError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let token = self.tokens.token().await?;
            let mut req = self
                .http
                .request(method.clone(), url)
                .bearer_auth(token)
                .header("Accept", "application/json");
            if let Some(b) = body {
                req = req
                    .header("Content-Type", "application/json")
                    .body(serde_json::to_vec(b).unwrap_or_default());
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) if attempt < RETRIES => {
                    tracing::debug!("ARM {method} {url}: {e}; again");
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
                Err(e) => {
                    return Err(ArmError::local(
                        "ConnectionFailed",
                        format!("{method} {url}: {}", gangway_provider::error_chain(&e)),
                    ))
                }
            };
            let status = resp.status();
            let headers = resp.headers().clone();
            let text = resp.text().await.unwrap_or_default();
            let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let wait = retry_after(&headers);
            if (status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error())
                && attempt < RETRIES
            {
                let wait = wait.unwrap_or_else(|| backoff(attempt));
                tracing::debug!("ARM {method} {url}: {status}; again in {wait:?}");
                tokio::time::sleep(wait).await;
                continue;
            }
            if !status.is_success() {
                return Err(ArmError::from_body(status.as_u16(), &body, &text));
            }
            let h = |k: &str| {
                headers
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            return Ok(Answer {
                status,
                async_op: h("azure-asyncoperation"),
                location: h("location"),
                retry_after: wait,
                body,
            });
        }
    }

    /// GET a resource; `Ok(None)` when it is not there.
    pub async fn get(&self, path: &str, api: &str) -> Result<Option<Value>, ArmError> {
        match self.send(Method::GET, &self.url(path, api), None).await {
            Ok(a) => Ok(Some(a.body)),
            Err(e) if e.not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every item of a paged list.
    pub async fn list(&self, path: &str, api: &str) -> Result<Vec<Value>, ArmError> {
        let mut url = self.url(path, api);
        let mut out = Vec::new();
        loop {
            let a = match self.send(Method::GET, &url, None).await {
                Ok(a) => a,
                Err(e) if e.not_found() => return Ok(out),
                Err(e) => return Err(e),
            };
            if let Some(items) = a.body["value"].as_array() {
                out.extend(items.iter().cloned());
            }
            match a.body["nextLink"].as_str() {
                Some(next) if !next.is_empty() => url = next.to_string(),
                _ => return Ok(out),
            }
        }
    }

    /// PUT a resource and wait for its operation; the resource as it is then.
    pub async fn put(&self, path: &str, api: &str, body: &Value) -> Result<Value, ArmError> {
        let a = self
            .send(Method::PUT, &self.url(path, api), Some(body))
            .await?;
        if a.async_op.is_some() || a.location.is_some() {
            self.wait(&a).await?;
            return Ok(self.get(path, api).await?.unwrap_or(a.body));
        }
        Ok(a.body)
    }

    /// POST an action (VM `start`, `deallocate`) and wait for it.
    pub async fn post(&self, path: &str, api: &str) -> Result<(), ArmError> {
        let a = self
            .send(
                Method::POST,
                &self.url(path, api),
                Some(&Value::Object(Default::default())),
            )
            .await?;
        self.wait(&a).await
    }

    /// DELETE a resource and wait until ARM says it is gone (or it was
    /// never there).
    pub async fn delete(&self, path: &str, api: &str) -> Result<(), ArmError> {
        let a = match self.send(Method::DELETE, &self.url(path, api), None).await {
            Ok(a) => a,
            Err(e) if e.not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        if a.status == StatusCode::NO_CONTENT {
            return Ok(());
        }
        self.wait(&a).await
    }

    /// Waits for the operation an answer started: `Azure-AsyncOperation`
    /// when there is one (its `status`), else `Location` (202 while it
    /// runs), each polled after the `Retry-After` ARM asks for.
    async fn wait(&self, first: &Answer) -> Result<(), ArmError> {
        let started = Instant::now();
        let mut pause = first.retry_after.unwrap_or(Duration::from_secs(1));
        if let Some(op) = &first.async_op {
            loop {
                tokio::time::sleep(pause.max(self.min_poll)).await;
                let a = self.send(Method::GET, op, None).await?;
                match a.body["status"].as_str().unwrap_or("") {
                    "Succeeded" => return Ok(()),
                    "Failed" | "Canceled" | "Cancelled" => {
                        let mut e = ArmError::from_body(0, &a.body, "");
                        if e.code.starts_with("HTTP") {
                            e.code = "OperationFailed".into();
                            e.message = format!("the operation ended {}", a.body["status"]);
                        }
                        return Err(e);
                    }
                    _ => {}
                }
                if started.elapsed() > LRO_LIMIT {
                    return Err(ArmError::local("OperationTimedOut", op.clone()));
                }
                pause = a.retry_after.unwrap_or(Duration::from_secs(2));
            }
        }
        if let Some(loc) = &first.location {
            let mut url = loc.clone();
            loop {
                tokio::time::sleep(pause.max(self.min_poll)).await;
                let a = self.send(Method::GET, &url, None).await?;
                if a.status != StatusCode::ACCEPTED {
                    return Ok(());
                }
                if let Some(next) = a.location {
                    url = next;
                }
                if started.elapsed() > LRO_LIMIT {
                    return Err(ArmError::local("OperationTimedOut", loc.clone()));
                }
                pause = a.retry_after.unwrap_or(Duration::from_secs(2));
            }
        }
        Ok(())
    }
}

pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(500u64 << attempt.min(6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arm_error_bodies_give_code_message_and_details() {
        let body = serde_json::json!({"error": {"code": "OperationNotAllowed",
            "message": "Operation could not be completed",
            "details": [{"code": "QuotaExceeded", "message": "Low Priority Cores"}]}});
        let e = ArmError::from_body(409, &body, "");
        assert_eq!(e.code, "OperationNotAllowed");
        assert!(
            e.message.contains("QuotaExceeded: Low Priority Cores"),
            "{e}"
        );
        // A failed operation's document carries `error` the same way.
        let op = serde_json::json!({"status": "Failed", "error": {"code": "ZonalAllocationFailed", "message": "no"}});
        assert_eq!(
            ArmError::from_body(0, &op, "").code,
            "ZonalAllocationFailed"
        );
        let e = ArmError::from_body(502, &Value::Null, "bad gateway");
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            ("HTTP502", "bad gateway")
        );
    }

    #[test]
    fn retry_after_is_read_in_seconds() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert("retry-after", "3".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after", "0".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::ZERO));
    }
}
