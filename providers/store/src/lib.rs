//! Buckets for gangway: S3 and GCS behind one API (the `object_store`
//! crate), for what gangway itself does with them (preflight checks,
//! manifests, pruning), and the rclone settings the nodes use to move the
//! bytes themselves.
//!
//! gangway never moves data or checkpoint bytes through the machine it runs
//! on: nodes run rclone, configured entirely through `RCLONE_CONFIG_*`
//! environment variables that reach them like secrets ([`Bucket::node_env`]).
#![deny(missing_docs)]
// Built with no store (gangway without its cloud features), every bucket
// operation ends at `Creds::Never`: what follows it is unreachable.
#![cfg_attr(
    not(any(feature = "s3", feature = "gcs")),
    allow(unreachable_code, unused_mut, unused_imports, unused_variables)
)]

mod admin;
#[cfg(feature = "gcs")]
mod downscope;
mod upload;
mod url;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

pub use admin::Created;
pub use upload::Uploaded;
pub use url::{BucketUrl, Scheme, UrlError};

/// Where the stores are: their public endpoints unless the environment
/// points elsewhere (an S3-compatible store, or the test emulators).
#[derive(Clone, Debug, Default)]
pub struct Endpoints {
    /// An S3-compatible endpoint (`http://127.0.0.1:9000`); path-style
    /// requests are used with it. From `GANGWAY_S3_ENDPOINT`, else the AWS
    /// SDKs' and CLI's own `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`
    /// (neither of those when `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`).
    pub s3: Option<String>,
    /// `AWS_REGION` (or `AWS_DEFAULT_REGION`): the S3 region to sign for.
    pub s3_region: Option<String>,
    /// A GCS JSON-API endpoint other than Google's: `GANGWAY_GCS_ENDPOINT`,
    /// else Google's client libraries' `STORAGE_EMULATOR_HOST`.
    pub gcs: Option<String>,
    /// The GCS endpoint is an emulator named by `STORAGE_EMULATOR_HOST`:
    /// as Google's client libraries do, no credentials are looked for and
    /// requests carry none.
    pub gcs_anonymous: bool,
}

impl Endpoints {
    /// From this process's environment.
    pub fn from_env() -> Endpoints {
        Endpoints::from_vars(|k| std::env::var(k).ok())
    }

    /// From the variables `var` returns (empty ones count as unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Endpoints {
        let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        // The AWS SDKs' switch that turns their endpoint variables off.
        let aws_endpoints = !var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let s3 = var("GANGWAY_S3_ENDPOINT").or_else(|| {
            aws_endpoints
                .then(|| var("AWS_ENDPOINT_URL_S3").or_else(|| var("AWS_ENDPOINT_URL")))
                .flatten()
        });
        let (gcs, gcs_anonymous) = match var("GANGWAY_GCS_ENDPOINT") {
            Some(e) => (Some(e), false),
            // Google's libraries take `host:port` or a whole URL.
            None => match var("STORAGE_EMULATOR_HOST") {
                Some(h) if h.contains("://") => (Some(h), true),
                Some(h) => (Some(format!("http://{h}")), true),
                None => (None, false),
            },
        };
        Endpoints {
            s3,
            s3_region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")),
            gcs,
            gcs_anonymous,
        }
    }
}

/// What went wrong with a bucket, in the store's own words where it gave
/// some. Every variant names the bucket.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The bucket does not exist.
    #[error("{url}: the bucket does not exist")]
    NoSuchBucket {
        /// The bucket (and prefix) asked about.
        url: BucketUrl,
    },
    /// The credentials were refused or lack a permission.
    #[error("{url}: access denied: {reason}")]
    AccessDenied {
        /// The bucket.
        url: BucketUrl,
        /// The store's reason.
        reason: String,
    },
    /// S3 keeps the bucket in another region than the one requests are
    /// signed for.
    #[error(
        "{url}: the bucket is in {region}, and requests were signed for {signed_for} (AWS_REGION)"
    )]
    WrongRegion {
        /// The bucket.
        url: BucketUrl,
        /// Where S3 says it is.
        region: String,
        /// The region gangway signed for.
        signed_for: String,
    },
    /// No credentials could be found for the store.
    #[error("{url}: no credentials: {reason}")]
    NoCredentials {
        /// The bucket.
        url: BucketUrl,
        /// What was looked for.
        reason: String,
    },
    /// This build has no client for the store.
    #[error("{url}: this gangway was built without {store} support (cargo feature `{feature}`)")]
    NotBuilt {
        /// The bucket.
        url: BucketUrl,
        /// `S3`, `GCS`.
        store: &'static str,
        /// The feature to build with.
        feature: &'static str,
    },
    /// Anything else the store answered.
    #[error("{url}: {reason}")]
    Store {
        /// The bucket.
        url: BucketUrl,
        /// What the store said.
        reason: String,
    },
}

impl StoreError {
    fn from_object_store(url: &BucketUrl, e: object_store::Error) -> StoreError {
        use object_store::Error as E;
        let reason = e.to_string();
        match e {
            E::NotFound { .. } => StoreError::NoSuchBucket { url: url.clone() },
            // S3 says so in its error code, which object_store passes on.
            _ if reason.contains("NoSuchBucket") => StoreError::NoSuchBucket { url: url.clone() },
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => StoreError::AccessDenied {
                url: url.clone(),
                reason,
            },
            // A refused listing comes as a generic error carrying the
            // status and the store's body.
            _ if reason.contains("403 Forbidden") || reason.contains("401 Unauthorized") => {
                StoreError::AccessDenied {
                    url: url.clone(),
                    reason: store_words(&reason).unwrap_or(reason),
                }
            }
            _ => StoreError::Store {
                url: url.clone(),
                reason,
            },
        }
    }

    /// Whether the store said the bucket is not there.
    pub fn is_no_such_bucket(&self) -> bool {
        matches!(self, StoreError::NoSuchBucket { .. })
    }
}

/// The text of `<tag>` in an XML error body (S3's).
fn xml_field<'a>(body: &'a str, tag: &str) -> Option<&'a str> {
    let start = body.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = body[start..].find(&format!("</{tag}>"))?;
    Some(&body[start..start + end])
}

/// `error.message` of a JSON error body (GCS's).
fn json_error_message(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["error"]["message"].as_str().map(str::to_string)
}

/// The store's own words in an error that carries its answer's body: S3's
/// XML `<Code>` and `<Message>`, GCS's JSON `error.message`.
fn store_words(reason: &str) -> Option<String> {
    if let Some(message) = xml_field(reason, "Message") {
        let message = message.trim();
        return Some(match xml_field(reason, "Code") {
            Some(code) => format!("{}: {message}", code.trim()),
            None => message.to_string(),
        });
    }
    json_error_message(&reason[reason.find('{')?..])
}

/// S3 keys given explicitly, instead of the environment's.
#[derive(Clone)]
pub struct S3Keys {
    /// Access key id.
    pub key_id: String,
    /// Secret access key.
    pub secret: String,
    /// Session token of temporary credentials.
    pub token: Option<String>,
}

/// One object under a bucket URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// The key below the URL's prefix (`step-10/model.pt`).
    pub key: String,
    /// Bytes.
    pub size: u64,
    /// When it was last written, in milliseconds since the epoch.
    pub modified_ms: i64,
}

/// The credentials a node needs to reach a bucket as the user does.
#[derive(Clone)]
enum Creds {
    #[cfg(feature = "s3")]
    S3(object_store::aws::AwsCredentialProvider),
    #[cfg(feature = "gcs")]
    Gcs(object_store::gcp::GcpCredentialProvider),
    /// Built with neither store: no bucket can be opened.
    #[cfg(not(any(feature = "s3", feature = "gcs")))]
    #[allow(dead_code)]
    Never(std::convert::Infallible),
}

/// A bucket (at a prefix) and a client for it.
pub struct Bucket {
    url: BucketUrl,
    store: Arc<dyn ObjectStore>,
    creds: Creds,
    endpoints: Endpoints,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Bucket {
    /// A client for `url` with the user's own credentials (the standard
    /// environment variables and files of each store). Makes no request.
    pub fn open(url: &BucketUrl, endpoints: &Endpoints) -> Result<Bucket, StoreError> {
        Bucket::open_as(url, endpoints, None)
    }

    /// The same, with `keys` for S3 instead of the environment's (ignored
    /// for other stores).
    pub fn open_as(
        url: &BucketUrl,
        endpoints: &Endpoints,
        keys: Option<&S3Keys>,
    ) -> Result<Bucket, StoreError> {
        let built = match url.scheme {
            Scheme::S3 => open_s3(url, endpoints, keys),
            Scheme::Gcs => open_gcs(url, endpoints),
        }?;
        Ok(Bucket {
            url: url.clone(),
            store: built.0,
            creds: built.1,
            endpoints: endpoints.clone(),
        })
    }

    /// The bucket and prefix.
    pub fn url(&self) -> &BucketUrl {
        &self.url
    }

    fn path(&self, key: &str) -> ObjectPath {
        let full = self.url.join(key).prefix;
        ObjectPath::from(full)
    }

    fn fail(&self, e: object_store::Error) -> StoreError {
        StoreError::from_object_store(&self.url, e)
    }

    /// Checks that the bucket exists and these credentials may list it:
    /// one list request, before anything is provisioned.
    /// A refusal that S3 explains with the bucket's region (a redirect, a
    /// malformed authorization) says which region it wants.
    pub async fn check(&self) -> Result<(), StoreError> {
        let prefix = (!self.url.prefix.is_empty()).then(|| self.path(""));
        let err = match self.store.list_with_delimiter(prefix.as_ref()).await {
            Ok(_) => return Ok(()),
            Err(e) => self.fail(e),
        };
        match err {
            // A listing that is not found is a bucket that is not there.
            StoreError::Store { reason, .. } if reason.contains("404 Not Found") => {
                Err(StoreError::NoSuchBucket {
                    url: self.url.clone(),
                })
            }
            other => Err(self.explained(other).await),
        }
    }

    /// `err`, or [`StoreError::WrongRegion`] when S3 says the bucket is in
    /// another region than the one requests were signed for (asked only
    /// after a refusal: nothing more is sent on the way that works).
    async fn explained(&self, err: StoreError) -> StoreError {
        if !matches!(
            err,
            StoreError::Store { .. } | StoreError::AccessDenied { .. }
        ) {
            return err;
        }
        match self.region_elsewhere().await {
            Some((region, signed_for)) => StoreError::WrongRegion {
                url: self.url.clone(),
                region,
                signed_for,
            },
            None => err,
        }
    }

    /// Whether the URL's prefix is itself one object (`s3://b/file.txt`).
    pub async fn is_object(&self) -> Result<bool, StoreError> {
        if self.url.prefix.is_empty() {
            return Ok(false);
        }
        match self.store.head(&self.path("")).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.explained(self.fail(e)).await),
        }
    }

    /// Writes `bytes` at `key` (below the prefix), whole or not at all.
    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.store
            .put(&self.path(key), PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.fail(e))
    }

    /// Reads `key`; `None` when there is no such object.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.store.get(&self.path(key)).await {
            Ok(r) => r
                .bytes()
                .await
                .map(|b| Some(b.to_vec()))
                .map_err(|e| self.fail(e)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Every object below `under` (relative to the prefix), keys relative
    /// to the prefix, in key order.
    pub async fn list(&self, under: &str) -> Result<Vec<Object>, StoreError> {
        let base = self.path("");
        let at = self.path(under);
        let mut out: Vec<Object> = self
            .store
            .list(Some(&at))
            .map_ok(|m| Object {
                key: relative(&base, &m.location),
                size: m.size,
                modified_ms: m.last_modified.timestamp_millis(),
            })
            .try_collect()
            .await
            .map_err(|e| self.fail(e))?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Deletes `keys` (relative to the prefix); missing ones are fine.
    /// Batched where the store can (S3's DeleteObjects: 1,000 a request).
    pub async fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let paths: Vec<object_store::Result<ObjectPath>> =
            keys.iter().map(|k| Ok(self.path(k))).collect();
        let mut done = self
            .store
            .delete_stream(futures::stream::iter(paths).boxed());
        while let Some(r) = done.next().await {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(())
    }

    /// The "directories" right below `under` (relative to the prefix):
    /// the distinct next path segments, one listing request a page.
    pub async fn list_dirs(&self, under: &str) -> Result<Vec<String>, StoreError> {
        let base = self.path("");
        let at = self.path(under);
        let listed = self
            .store
            .list_with_delimiter(Some(&at))
            .await
            .map_err(|e| self.fail(e))?;
        let mut out: Vec<String> = listed
            .common_prefixes
            .iter()
            .map(|p| relative(&base, p))
            .collect();
        out.sort();
        Ok(out)
    }

    /// The environment that lets rclone on a node reach this bucket as
    /// `remote:` with the user's current credentials. The values are
    /// secrets: they go to nodes the way a task's `secrets:` do, never on
    /// a command line, into logs or into gangway's state.
    pub async fn node_env(&self, remote: &str) -> Result<Vec<(String, String)>, StoreError> {
        let p = format!("RCLONE_CONFIG_{}_", remote.to_ascii_uppercase());
        let mut env = Vec::new();
        // When the credentials are taken to expire, for a mount to reread
        // them then (`GW_EXPIRES_<REMOTE>`, Unix seconds).
        #[cfg_attr(not(feature = "gcs"), allow(unused_mut))]
        let mut expires: Option<u64> = None;
        let mut set = |k: &str, v: &str| env.push((format!("{p}{k}"), v.to_string()));
        match &self.creds {
            #[cfg(feature = "s3")]
            Creds::S3(provider) => {
                let c = provider
                    .get_credential()
                    .await
                    .map_err(|e| StoreError::NoCredentials {
                        url: self.url.clone(),
                        reason: e.to_string(),
                    })?;
                set("TYPE", "s3");
                set("ENV_AUTH", "false");
                set("ACCESS_KEY_ID", &c.key_id);
                set("SECRET_ACCESS_KEY", &c.secret_key);
                if let Some(t) = &c.token {
                    set("SESSION_TOKEN", t);
                }
                if let Some(r) = &self.endpoints.s3_region {
                    set("REGION", r);
                }
                match &self.endpoints.s3 {
                    Some(ep) => {
                        set("PROVIDER", "Other");
                        set("ENDPOINT", ep);
                        set("FORCE_PATH_STYLE", "true");
                    }
                    None => set("PROVIDER", "AWS"),
                }
                // Objects are not re-listed one by one after uploads.
                set("NO_CHECK_BUCKET", "true");
            }
            #[cfg(feature = "gcs")]
            Creds::Gcs(provider) => {
                let c = provider
                    .get_credential()
                    .await
                    .map_err(|e| StoreError::NoCredentials {
                        url: self.url.clone(),
                        reason: e.to_string(),
                    })?;
                set("TYPE", "google cloud storage");
                if c.bearer.is_empty() {
                    // Credentials that sign nothing (an emulator's).
                    set("ANONYMOUS", "true");
                } else {
                    // An OAuth access token bounded to this bucket and
                    // prefix (exchanged at Google's STS): short-lived, no
                    // refresh token; it ends when STS says or with the
                    // user's token it came from.
                    let (scoped, lifetime) = downscope::downscope(&c.bearer, &self.url)
                        .await
                        .map_err(|reason| StoreError::NoCredentials {
                            url: self.url.clone(),
                            reason: format!(
                                "the token for nodes could not be narrowed to this bucket \
                                     (Google's Security Token Service, a Credential Access \
                                     Boundary): {reason}"
                            ),
                        })?;
                    let token = serde_json::json!({
                        "access_token": scoped,
                        "token_type": "Bearer",
                    });
                    set("TOKEN", &token.to_string());
                    let mut until = gcs_token_expires(&c.bearer);
                    if let Some(s) = lifetime {
                        until = until.min(unix_now() + s);
                    }
                    expires = Some(until);
                }
                // A token bounded to a prefix may not list the bucket's
                // root, which rclone does to check the bucket exists.
                set("NO_CHECK_BUCKET", "true");
                set("BUCKET_POLICY_ONLY", "true");
                if let Some(ep) = &self.endpoints.gcs {
                    // rclone wants the JSON API's root.
                    set(
                        "ENDPOINT",
                        &format!("{}/storage/v1/", ep.trim_end_matches('/')),
                    );
                }
            }
            #[cfg(not(any(feature = "s3", feature = "gcs")))]
            Creds::Never(n) => match *n {},
        }
        if let Some(e) = expires {
            env.push((
                format!("GW_EXPIRES_{}", remote.to_ascii_uppercase()),
                e.to_string(),
            ));
        }
        Ok(env)
    }
}

/// The environment that lets rclone on a node reach `url` as `remote:`
/// with the node's own identity (an instance profile through the EC2
/// metadata service, a service account through the GCE metadata server):
/// rclone's `env_auth`, and no credentials at all. Nothing in it is
/// secret, and nothing expires.
pub fn identity_env(url: &BucketUrl, endpoints: &Endpoints, remote: &str) -> Vec<(String, String)> {
    let p = format!("RCLONE_CONFIG_{}_", remote.to_ascii_uppercase());
    let mut env = Vec::new();
    let mut set = |k: &str, v: &str| env.push((format!("{p}{k}"), v.to_string()));
    match url.scheme {
        Scheme::S3 => {
            set("TYPE", "s3");
            set("ENV_AUTH", "true");
            if let Some(r) = &endpoints.s3_region {
                set("REGION", r);
            }
            match &endpoints.s3 {
                Some(ep) => {
                    set("PROVIDER", "Other");
                    set("ENDPOINT", ep);
                    set("FORCE_PATH_STYLE", "true");
                }
                None => set("PROVIDER", "AWS"),
            }
            set("NO_CHECK_BUCKET", "true");
        }
        Scheme::Gcs => {
            set("TYPE", "google cloud storage");
            set("ENV_AUTH", "true");
            set("BUCKET_POLICY_ONLY", "true");
            if let Some(ep) = &endpoints.gcs {
                set(
                    "ENDPOINT",
                    &format!("{}/storage/v1/", ep.trim_end_matches('/')),
                );
            }
        }
    }
    env
}

/// `location` below `base`, without the separating `/`.
fn relative(base: &ObjectPath, location: &ObjectPath) -> String {
    let b = base.as_ref();
    let l = location.as_ref();
    if b.is_empty() {
        return l.to_string();
    }
    l.strip_prefix(b)
        .map(|r| r.trim_start_matches('/').to_string())
        .unwrap_or_else(|| l.to_string())
}

type Built = (Arc<dyn ObjectStore>, Creds);

#[cfg(feature = "s3")]
fn open_s3(url: &BucketUrl, ep: &Endpoints, keys: Option<&S3Keys>) -> Result<Built, StoreError> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as K};
    // The builder's own reading of the environment, except the endpoint:
    // that is `ep.s3`'s choice alone (object_store would prefer
    // AWS_ENDPOINT_URL_S3 over GANGWAY_S3_ENDPOINT, and refuse an http one).
    let mut b = AmazonS3Builder::new();
    for (k, v) in std::env::vars() {
        if !k.starts_with("AWS_") {
            continue;
        }
        match k.to_ascii_lowercase().parse::<K>() {
            Ok(K::Endpoint | K::S3Endpoint) | Err(_) => {}
            Ok(key) => b = b.with_config(key, v),
        }
    }
    let mut b = b.with_bucket_name(&url.bucket);
    if let Some(k) = keys {
        b = b
            .with_access_key_id(&k.key_id)
            .with_secret_access_key(&k.secret);
        if let Some(t) = &k.token {
            b = b.with_token(t);
        }
    }
    if let Some(r) = &ep.s3_region {
        b = b.with_region(r);
    }
    if let Some(e) = &ep.s3 {
        b = b
            .with_endpoint(e)
            .with_allow_http(e.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    let s3 = b.build().map_err(|e| StoreError::NoCredentials {
        url: url.clone(),
        reason: e.to_string(),
    })?;
    let creds = Creds::S3(Arc::clone(s3.credentials()));
    Ok((Arc::new(s3), creds))
}

#[cfg(not(feature = "s3"))]
fn open_s3(url: &BucketUrl, _: &Endpoints, _: Option<&S3Keys>) -> Result<Built, StoreError> {
    Err(StoreError::NotBuilt {
        url: url.clone(),
        store: "S3",
        feature: "s3",
    })
}

/// How long a GCS access token is taken to last from when this process
/// first saw it: Google's tokens last an hour from when they were made, and
/// object_store fetches a fresh one when it first needs one (a token from
/// a GCE metadata server may be older: then less; docs/storage.md).
#[cfg(feature = "gcs")]
const GCS_TOKEN_TAKEN_TO_LAST: std::time::Duration = std::time::Duration::from_secs(50 * 60);

/// Now, in Unix seconds.
#[cfg(feature = "gcs")]
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// When `bearer` is taken to expire (Unix seconds): [`GCS_TOKEN_TAKEN_TO_LAST`]
/// after this process first saw it.
#[cfg(feature = "gcs")]
fn gcs_token_expires(bearer: &str) -> u64 {
    use std::sync::Mutex;
    use std::time::{SystemTime, UNIX_EPOCH};
    static SEEN: Mutex<Option<(String, SystemTime)>> = Mutex::new(None);
    let now = SystemTime::now();
    let first = match SEEN.lock() {
        Ok(mut seen) => match seen.as_ref() {
            Some((b, at)) if b == bearer => *at,
            _ => {
                *seen = Some((bearer.to_string(), now));
                now
            }
        },
        Err(_) => now,
    };
    (first + GCS_TOKEN_TAKEN_TO_LAST)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(feature = "gcs")]
fn open_gcs(url: &BucketUrl, ep: &Endpoints) -> Result<Built, StoreError> {
    use object_store::gcp::GoogleCloudStorageBuilder;
    let mut b = GoogleCloudStorageBuilder::from_env().with_bucket_name(&url.bucket);
    if ep.gcs_anonymous {
        // An emulator (STORAGE_EMULATOR_HOST): no OAuth at all, as
        // Google's client libraries treat one.
        b = b.with_service_account_key(
            r#"{"disable_oauth":true,"client_email":"","private_key":"","private_key_id":""}"#,
        );
    }
    if let Some(e) = &ep.gcs {
        b = b
            .with_base_url(e.trim_end_matches('/'))
            .with_client_options(
                object_store::ClientOptions::new().with_allow_http(e.starts_with("http://")),
            );
    }
    let gcs = b.build().map_err(|e| StoreError::NoCredentials {
        url: url.clone(),
        reason: e.to_string(),
    })?;
    let creds = Creds::Gcs(Arc::clone(gcs.credentials()));
    Ok((Arc::new(gcs), creds))
}

#[cfg(not(feature = "gcs"))]
fn open_gcs(url: &BucketUrl, _: &Endpoints) -> Result<Built, StoreError> {
    Err(StoreError::NotBuilt {
        url: url.clone(),
        store: "GCS",
        feature: "gcs",
    })
}

#[cfg(test)]
mod tests {
    use super::{store_words, Endpoints};

    fn endpoints(vars: &[(&str, &str)]) -> Endpoints {
        Endpoints::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn s3_endpoints_follow_gangway_then_the_aws_sdks_variables() {
        let e = endpoints(&[
            ("AWS_ENDPOINT_URL", "http://all:1"),
            ("AWS_ENDPOINT_URL_S3", "http://s3:2"),
            ("GANGWAY_S3_ENDPOINT", "http://gw:3"),
        ]);
        assert_eq!(e.s3.as_deref(), Some("http://gw:3"));
        let e = endpoints(&[
            ("AWS_ENDPOINT_URL", "http://all:1"),
            ("AWS_ENDPOINT_URL_S3", "http://s3:2"),
        ]);
        assert_eq!(e.s3.as_deref(), Some("http://s3:2"));
        let e = endpoints(&[("AWS_ENDPOINT_URL", "http://all:1")]);
        assert_eq!(e.s3.as_deref(), Some("http://all:1"));
        let e = endpoints(&[
            ("AWS_ENDPOINT_URL_S3", "http://s3:2"),
            ("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"),
        ]);
        assert_eq!(e.s3, None);
        let e = endpoints(&[("AWS_ENDPOINT_URL_S3", " ")]);
        assert_eq!(e.s3, None);
    }

    #[test]
    fn a_gcs_emulator_host_is_an_anonymous_endpoint_unless_gangways_own_is_set() {
        let e = endpoints(&[("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")]);
        assert_eq!(e.gcs.as_deref(), Some("http://127.0.0.1:4443"));
        assert!(e.gcs_anonymous);
        let e = endpoints(&[("STORAGE_EMULATOR_HOST", "https://gcs.test:8")]);
        assert_eq!(e.gcs.as_deref(), Some("https://gcs.test:8"));
        let e = endpoints(&[
            ("STORAGE_EMULATOR_HOST", "127.0.0.1:4443"),
            ("GANGWAY_GCS_ENDPOINT", "http://gw:9"),
        ]);
        assert_eq!(e.gcs.as_deref(), Some("http://gw:9"));
        assert!(!e.gcs_anonymous);
        assert_eq!(endpoints(&[]).gcs, None);
    }

    #[test]
    fn the_stores_words_are_found_in_either_body() {
        let s3 =
            "Error performing GET http://h/b?list-type=2 - Server returned non-2xx status code: \
                  403 Forbidden: <?xml version=\"1.0\"?>\n<Error><Code>AccessDenied</Code>\
                  <Message>no ListBucket here</Message></Error>";
        assert_eq!(
            store_words(s3).as_deref(),
            Some("AccessDenied: no ListBucket here")
        );
        let gcs = "Error performing GET http://h/b - 403 Forbidden: {\"error\": {\"code\": 403, \
                   \"message\": \"caller lacks storage.objects.list\"}}";
        assert_eq!(
            store_words(gcs).as_deref(),
            Some("caller lacks storage.objects.list")
        );
        assert_eq!(store_words("HEAD http://h/b/x - 403 Forbidden: "), None);
    }
}
