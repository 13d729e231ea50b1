//! Where ARM tokens and the subscription come from, as Azure's own tools
//! find them.
//!
//! Against Azure, Microsoft's `azure_identity` credentials, tried in this
//! order: a service principal in the environment (`AZURE_TENANT_ID`,
//! `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`), workload identity
//! (`AZURE_FEDERATED_TOKEN_FILE` with the tenant and client ids), the Azure
//! CLI's login (`az login`), and managed identity (on an Azure VM). The
//! subscription is `AZURE_SUBSCRIPTION_ID`, else the Azure CLI profile's
//! default (`~/.azure/azureProfile.json`).
//!
//! Against a plain-http loopback endpoint (`GANGWAY_AZURE_ENDPOINT`, the
//! fake), tokens come from that endpoint's own identity platform route by
//! the client-credentials grant: `azure_identity` refuses an authority that
//! is not HTTPS (docs/design.md, "Azure").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use azure_core::credentials::TokenCredential;
use tokio::sync::Mutex;

/// The scope of an ARM token.
pub const ARM_SCOPE: &str = "https://management.azure.com/.default";

/// Why no token or subscription could be had, in words that say what to run.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No credential of the chain is there.
    #[error(
        "no Azure credentials found: run `az login` (then `az account set --subscription ID`), \
         or set AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET for a service principal"
    )]
    NoCredentials,
    /// A credential was there and refused.
    #[error("{identity} could not get a token: {message}")]
    Refused {
        /// Whose.
        identity: String,
        /// The identity platform's (or the tool's) words.
        message: String,
    },
    /// No subscription is set.
    #[error(
        "no Azure subscription: set AZURE_SUBSCRIPTION_ID, or run `az account set --subscription ID`"
    )]
    NoSubscription,
}

/// One way of getting tokens.
enum Source {
    /// An `azure_identity` credential.
    Sdk(Arc<dyn TokenCredential>),
    /// The client-credentials grant against a loopback authority (the fake).
    Loopback {
        authority: String,
        tenant: String,
        client_id: String,
        secret: String,
    },
}

/// Tokens for ARM, cached until shortly before they expire.
pub struct Tokens {
    source: Source,
    /// Who the tokens are for, readable (never a secret).
    pub identity: String,
    cached: Mutex<Option<(String, Instant)>>,
    http: reqwest::Client,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl Tokens {
    /// The chain's first credential that is there (see the module's
    /// documentation); `loopback` is the fake's URL when the endpoint is one.
    pub fn discover(loopback: Option<&str>, http: reqwest::Client) -> Result<Tokens, AuthError> {
        let refused = |identity: &str, e: azure_core::Error| AuthError::Refused {
            identity: identity.to_string(),
            message: e.to_string(),
        };
        let (tenant, client, secret) = (
            var("AZURE_TENANT_ID"),
            var("AZURE_CLIENT_ID"),
            var("AZURE_CLIENT_SECRET"),
        );
        if let Some(authority) = loopback {
            let identity = match &client {
                Some(c) => format!("service principal {c} (at {authority})"),
                None => format!("the test identity of {authority}"),
            };
            return Ok(Tokens {
                source: Source::Loopback {
                    authority: authority.trim_end_matches('/').to_string(),
                    tenant: tenant.unwrap_or_else(|| "gangway-test".into()),
                    client_id: client.unwrap_or_else(|| "gangway".into()),
                    secret: secret.unwrap_or_else(|| "gangway".into()),
                },
                identity,
                cached: Mutex::new(None),
                http,
            });
        }
        let (source, identity): (Arc<dyn TokenCredential>, String) =
            match (tenant, client, secret, var("AZURE_FEDERATED_TOKEN_FILE")) {
                (Some(t), Some(c), Some(s), _) => {
                    let identity = format!("service principal {c} (tenant {t})");
                    let cred =
                        azure_identity::ClientSecretCredential::new(&t, c.clone(), s.into(), None)
                            .map_err(|e| refused(&identity, e))?;
                    (cred, identity)
                }
                (Some(t), Some(c), None, Some(_)) => {
                    let identity = format!("workload identity {c} (tenant {t})");
                    let cred = azure_identity::WorkloadIdentityCredential::new(None)
                        .map_err(|e| refused(&identity, e))?;
                    (cred, identity)
                }
                _ if az_profile().is_some() => {
                    let identity = "the Azure CLI's login (az login)".to_string();
                    let cred = azure_identity::AzureCliCredential::new(None)
                        .map_err(|e| refused(&identity, e))?;
                    (cred, identity)
                }
                _ if var("MSI_ENDPOINT").is_some() || var("IDENTITY_ENDPOINT").is_some() => {
                    let identity = "this machine's managed identity".to_string();
                    let cred = azure_identity::ManagedIdentityCredential::new(None)
                        .map_err(|e| refused(&identity, e))?;
                    (cred, identity)
                }
                _ => return Err(AuthError::NoCredentials),
            };
        Ok(Tokens {
            source: Source::Sdk(source),
            identity,
            cached: Mutex::new(None),
            http,
        })
    }

    /// A bearer token for ARM.
    pub async fn token(&self) -> Result<String, AuthError> {
        let mut cached = self.cached.lock().await;
        if let Some((t, until)) = &*cached {
            if Instant::now() < *until {
                return Ok(t.clone());
            }
        }
        let refused = |message: String| AuthError::Refused {
            identity: self.identity.clone(),
            message,
        };
        let (token, lifetime) = match &self.source {
            Source::Sdk(cred) => {
                let t = cred
                    .get_token(&[ARM_SCOPE], None)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
                let left = t.expires_on - azure_core::time::OffsetDateTime::now_utc();
                let secs = left.whole_seconds().max(0) as u64;
                (t.token.secret().to_string(), Duration::from_secs(secs))
            }
            Source::Loopback {
                authority,
                tenant,
                client_id,
                secret,
            } => {
                let form = [
                    ("grant_type", "client_credentials"),
                    ("client_id", client_id.as_str()),
                    ("client_secret", secret.as_str()),
                    ("scope", ARM_SCOPE),
                ];
                let body = form
                    .iter()
                    .map(|(k, v)| format!("{k}={}", form_encode(v)))
                    .collect::<Vec<_>>()
                    .join("&");
                let resp = self
                    .http
                    .post(format!("{authority}/{tenant}/oauth2/v2.0/token"))
                    .header("Content-Type", "application/x-www-form-urlencoded")
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| refused(gangway_provider::error_chain(&e)))?;
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                if !status.is_success() {
                    return Err(refused(
                        doc["error_description"]
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| format!("HTTP {status}: {text}")),
                    ));
                }
                let token = doc["access_token"]
                    .as_str()
                    .ok_or_else(|| refused(format!("no access_token in {text}")))?;
                let secs = doc["expires_in"].as_u64().unwrap_or(300);
                (token.to_string(), Duration::from_secs(secs))
            }
        };
        // Renewed a little before it runs out.
        let until = Instant::now() + lifetime.saturating_sub(Duration::from_secs(120));
        *cached = Some((token.clone(), until));
        Ok(token)
    }
}

fn form_encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Azure CLI's profile file, where `az login` keeps its subscriptions.
fn az_profile() -> Option<PathBuf> {
    let dir = var("AZURE_CONFIG_DIR")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".azure")))?;
    let p = dir.join("azureProfile.json");
    p.is_file().then_some(p)
}

/// The subscription: `AZURE_SUBSCRIPTION_ID`, else the Azure CLI's default.
pub fn subscription() -> Result<String, AuthError> {
    if let Some(s) = var("AZURE_SUBSCRIPTION_ID") {
        return Ok(s);
    }
    let text = az_profile()
        .and_then(|p| std::fs::read(p).ok())
        .ok_or(AuthError::NoSubscription)?;
    // The CLI writes the file with a byte order mark.
    let text = String::from_utf8_lossy(&text);
    let doc: serde_json::Value = serde_json::from_str(text.trim_start_matches('\u{feff}'))
        .map_err(|_| AuthError::NoSubscription)?;
    doc["subscriptions"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["isDefault"] == true))
        .and_then(|s| s["id"].as_str())
        .map(str::to_string)
        .ok_or(AuthError::NoSubscription)
}

#[cfg(test)]
mod tests {
    #[test]
    fn form_values_are_encoded() {
        assert_eq!(
            super::form_encode("https://management.azure.com/.default"),
            "https%3A%2F%2Fmanagement.azure.com%2F.default"
        );
        assert_eq!(super::form_encode("a b&c"), "a%20b%26c");
    }
}
