//! The one send loop of the JSON-over-HTTPS providers: it refuses to send
//! without a key (saying what to set), spaces requests with the key's
//! [`Limiter`], retries what may be retried, and hands every answer with a
//! status to the provider, whose error envelopes differ.

use std::time::Duration;

use serde::de::DeserializeOwned;

use super::key::ApiKey;
use super::limit::{backoff, Limiter};
use crate::{error_chain, ErrorKind, ProviderError};

/// What may be retried of a request whose answer was lost or refused for
/// what happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Reads and idempotent writes: a 429, a 5xx or a lost connection is
    /// retried.
    Safe,
    /// Creations: only a 429 (the request was refused unseen) is retried;
    /// a lost answer is the caller's to reconcile (by its tags or labels).
    OnlyThrottled,
}

/// An answer with a status (any status: the caller reads its errors).
#[derive(Clone, Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
}

impl Answer {
    /// Whether the status is 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// The API client of one key of one cloud.
pub struct Client {
    http: reqwest::Client,
    cloud: &'static str,
    base: String,
    key: Option<ApiKey>,
    hint: fn() -> String,
    limiter: Limiter,
    attempts: u32,
}

impl Client {
    /// A client of `cloud`'s API at `base`, authenticating with `key`
    /// (`None`: every call fails as [`ErrorKind::Auth`] with `hint`'s
    /// words), spacing requests with `limiter`.
    pub fn new(
        cloud: &'static str,
        base: &str,
        key: Option<ApiKey>,
        hint: fn() -> String,
        limiter: Limiter,
    ) -> Client {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(15))
            .user_agent(concat!("gangway/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Client {
            http,
            cloud,
            base: base.trim_end_matches('/').to_string(),
            key,
            hint,
            limiter,
            attempts: 6,
        }
    }

    /// The factor the rate-limit windows are multiplied by.
    pub fn scale(&self) -> f64 {
        self.limiter.scale()
    }

    /// Whether a key was found.
    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }

    /// Where the API is served.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The URL of `path` under the base.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends one request (`body` as JSON), a `launch` if the limiter
    /// spaces launches apart; retries as `retry` allows. `Err` only where
    /// nothing was answered (no key: `Auth`; the connection: `Transient`,
    /// `what` naming the request); any status is the caller's to read.
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&[u8]>,
        launch: bool,
        retry: Retry,
        what: &str,
        location: &str,
    ) -> Result<Answer, ProviderError> {
        let Some(key) = &self.key else {
            return Err(ProviderError::new(
                ErrorKind::Auth,
                self.cloud,
                location,
                format!("no API key: {}", (self.hint)()),
            ));
        };
        let mut attempt = 0;
        loop {
            self.limiter.acquire(launch).await;
            let mut req = self
                .http
                .request(method.clone(), self.url(path))
                .header(
                    reqwest::header::AUTHORIZATION,
                    format!("Bearer {}", key.expose()),
                )
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(b) = body {
                req = req
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(b.to_vec());
            }
            let (status, retry_after, bytes) = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let after = resp
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok());
                    match resp.bytes().await {
                        Ok(b) => (status, after, b.to_vec()),
                        Err(e) => (0, None, error_chain(&e).into_bytes()),
                    }
                }
                Err(e) => (0, None, error_chain(&e).into_bytes()),
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
                let wait = backoff(attempt, self.limiter.scale(), retry_after, seed);
                tokio::time::sleep(wait).await;
                attempt += 1;
                continue;
            }
            if status == 0 {
                return Err(ProviderError::new(
                    ErrorKind::Transient,
                    self.cloud,
                    location,
                    format!("{what}: {}", String::from_utf8_lossy(&bytes)),
                ));
            }
            return Ok(Answer {
                status,
                body: bytes,
            });
        }
    }

    /// `bytes` read as `T`, or a `Fatal` error naming `what` and the API.
    pub fn decode<T: DeserializeOwned>(
        &self,
        bytes: &[u8],
        what: &str,
        location: &str,
    ) -> Result<T, ProviderError> {
        serde_json::from_slice::<T>(bytes).map_err(|e| {
            ProviderError::new(
                ErrorKind::Fatal,
                self.cloud,
                location,
                format!("{what}: unexpected answer from {}: {e}", self.base),
            )
        })
    }

    /// `body` as JSON bytes, or a `Fatal` error naming `what`.
    pub fn encode<B: serde::Serialize>(
        &self,
        body: &B,
        what: &str,
        location: &str,
    ) -> Result<Vec<u8>, ProviderError> {
        serde_json::to_vec(body).map_err(|e| {
            ProviderError::new(
                ErrorKind::Fatal,
                self.cloud,
                location,
                format!("{what}: {e}"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint() -> String {
        "set X_API_KEY".into()
    }

    #[tokio::test]
    async fn without_a_key_nothing_is_sent_and_the_error_says_what_to_set() {
        // A port nothing listens on: were anything sent, the error would
        // be a connection's.
        let c = Client::new("x", "http://127.0.0.1:9", None, hint, Limiter::new(0.0));
        assert!(!c.has_key());
        let e = c
            .send(
                reqwest::Method::GET,
                "/p",
                None,
                false,
                Retry::Safe,
                "list",
                "here",
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Auth);
        assert!(e.message.contains("set X_API_KEY"), "{e}");
    }

    #[tokio::test]
    async fn a_lost_connection_is_transient_and_names_the_request() {
        let c = Client::new(
            "x",
            "http://127.0.0.1:9/",
            Some(ApiKey::new("k")),
            hint,
            Limiter::new(0.0),
        );
        assert_eq!(c.url("/a"), "http://127.0.0.1:9/a");
        let e = c
            .send(
                reqwest::Method::GET,
                "/p",
                None,
                false,
                Retry::OnlyThrottled,
                "list",
                "here",
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transient);
        assert!(e.message.starts_with("list: "), "{e}");
        assert!(!e.message.contains("Bearer"), "{e}");
    }
}
