//! Bucket `file_mounts`: read from the task (SkyPilot's forms, `$VAR`s
//! from `envs` substituted), checked before anything is provisioned, and
//! made on every node by rclone, which moves the bytes straight between the
//! node and the store.

use std::path::{Path, PathBuf};

use gangway_provider::{StoreAccess, StoreKeys};
use gangway_store::{Bucket, BucketUrl, Endpoints, Scheme, StoreError};
use serde::{Deserialize, Serialize};

use crate::core::runtime::runtime;
use crate::core::spec::{MountSource, SpecError, Task};
use crate::core::state::Store;
use crate::Error;

pub(crate) mod checkpoint;
pub mod manifest;

/// How a bucket appears on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Mode {
    /// Downloaded before setup (every node in parallel).
    Copy,
    /// A FUSE mount, every read going to the store.
    Mount,
    /// A FUSE mount with a local cache of what was read and written.
    MountCached,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        match s.to_ascii_uppercase().as_str() {
            "COPY" => Some(Mode::Copy),
            "MOUNT" => Some(Mode::Mount),
            "MOUNT_CACHED" => Some(Mode::MountCached),
            _ => None,
        }
    }
}

/// One bucket mount, resolved: what the driver needs to make it on a node
/// (no secrets: credentials travel separately, as secrets do).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct BucketMount {
    /// Path on the node, as the task wrote it.
    pub(crate) dest: String,
    /// The bucket and prefix, `$VAR`s substituted.
    pub(crate) url: String,
    /// The rclone remote that reaches it (`gw0`), configured by
    /// `RCLONE_CONFIG_GW0_*`.
    pub(crate) remote: String,
    /// How.
    pub(crate) mode: Mode,
    /// Made by gangway when missing (a `{name: ...}` mount).
    #[serde(default)]
    pub(crate) create: Option<Create>,
}

/// A bucket gangway makes when it is missing, and fills from a local
/// `source`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Create {
    /// Kept when its cluster (or managed job) goes; SkyPilot's default.
    pub(crate) persistent: bool,
    /// A local directory (or file) uploaded into it, changed files only.
    pub(crate) source: Option<PathBuf>,
}

/// A client for `url` with the user's own credentials: for S3 those of
/// the AWS SDK's chain (environment, profiles, SSO, instance role) when
/// this build has AWS, else the environment's.
pub(crate) async fn user_bucket(url: &BucketUrl) -> Result<Bucket, StoreError> {
    let endpoints = Endpoints::from_env();
    if let Some(user_keys) = access(url).and_then(|(_, a)| a.user_keys) {
        let c = user_keys()
            .await
            .map_err(|reason| StoreError::NoCredentials {
                url: url.clone(),
                reason,
            })?;
        return Bucket::open_as(&url.clone(), &endpoints, Some(&keys(c)));
    }
    Bucket::open(url, &endpoints)
}

/// The provider crate that serves `url`'s store in this build, and what
/// it does for it.
fn access(url: &BucketUrl) -> Option<(&'static str, &'static StoreAccess)> {
    crate::core::registry::store_access(url.scheme.url_scheme())
}

/// rclone's settings for `remote` reaching `url` from a node, with
/// credentials fit to leave this machine: temporary AWS credentials (a
/// 12-hour STS session when the user's are long-lived keys), a GCP OAuth
/// access token. Made fresh for every use, so they are renewed each time.
pub(crate) async fn node_env(
    url: &BucketUrl,
    remote: &str,
) -> Result<Vec<(String, String)>, StoreError> {
    let endpoints = Endpoints::from_env();
    if let Some((provider, node_keys)) = access(url).and_then(|(p, a)| Some((p, a.node_keys?))) {
        let c = narrowed_node_keys(url, provider, node_keys)
            .await
            .map_err(|reason| StoreError::NoCredentials {
                url: url.clone(),
                reason,
            })?;
        let expires = c.expires.unwrap_or_else(reread_by);
        let mut env = Bucket::open_as(url, &endpoints, Some(&keys(c)))?
            .node_env(remote)
            .await?;
        env.push((expires_var(remote), unix_seconds(expires).to_string()));
        return Ok(with_conf(reread_at_the_latest(env, remote), remote));
    }
    // A GCS token is told to expire when it is taken to (50 minutes after
    // it was first seen), or sooner by the same rule as S3 keys.
    let env = Bucket::open(url, &endpoints)?.node_env(remote).await?;
    Ok(with_conf(reread_at_the_latest(env, remote), remote))
}

/// `env` with `remote`'s expiry (if it has one) no later than
/// [`reread_by`]: the one rule for every store's credentials.
fn reread_at_the_latest(mut env: Vec<(String, String)>, remote: &str) -> Vec<(String, String)> {
    let (var, cap) = (expires_var(remote), unix_seconds(reread_by()));
    for (k, v) in &mut env {
        if *k == var {
            if let Ok(e) = v.parse::<u64>() {
                *v = e.min(cap).to_string();
            }
        }
    }
    env
}

/// When a mount is told its credentials expire at the latest: three
/// renewals from now, plus the 10 seconds rclone's OAuth client takes a
/// token to be expired early and 5 more. It rereads them then (as far as
/// it is told), so credentials renewed by the driver reach it even when the
/// chain did not say when they end, and a GCS mount takes a renewed token
/// long before the one it holds runs out. (Without the margin, renewals a
/// few seconds apart made a token that rclone took as expired at once.)
fn reread_by() -> std::time::SystemTime {
    std::time::SystemTime::now() + 3 * renew_every() + std::time::Duration::from_secs(15)
}

/// The stores (URL schemes, `s3`, `gs`) that a run's nodes reach with an
/// identity of their own (an instance profile, a service account their
/// provider attached, see [`gangway_provider::IDENTITY_STORES_FACT`]):
/// for those buckets the nodes' rclone uses it, and no credentials of the
/// user's are made or leave this machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnIdentity(Vec<String>);

impl OwnIdentity {
    /// What every one of `nodes` reaches by itself (nothing for no nodes):
    /// a bucket is reached so only when no node of the run needs more.
    pub(crate) fn of_nodes(nodes: &[gangway_provider::NodeRow]) -> OwnIdentity {
        let mut each = nodes
            .iter()
            .map(|n| gangway_provider::identity_stores(&n.extra));
        let Some(first) = each.next() else {
            return OwnIdentity::default();
        };
        let common = each.fold(first, |all, n| {
            all.into_iter().filter(|s| n.contains(s)).collect()
        });
        OwnIdentity(common)
    }

    /// What nodes launched with `config` (the launch's whole `config:`,
    /// see [`crate::core::config::launch_config`]) may reach by themselves, on
    /// any provider it has a section for. Only for checks made before
    /// there are nodes: their credentials are then left to the storage
    /// step, which makes them if the nodes turn out to need them.
    pub(crate) fn configured(
        config: Option<&serde_json::Value>,
        providers: &crate::core::registry::Providers,
    ) -> OwnIdentity {
        let mut stores = Vec::new();
        if let Some(serde_json::Value::Object(sections)) = config {
            for (cloud, section) in sections {
                if let Some(p) = providers.get(cloud) {
                    stores.extend(p.identity_stores(Some(section)));
                }
            }
        }
        stores.sort();
        stores.dedup();
        OwnIdentity(stores)
    }

    /// Whether the nodes reach `url` with their own identity.
    pub(crate) fn covers(&self, url: &BucketUrl) -> bool {
        self.0.iter().any(|s| s == url.scheme.url_scheme())
    }
}

/// rclone's settings for `remote` reaching `url` from nodes that have
/// `own` identity: that identity where it covers the bucket (nothing
/// secret, nothing to renew), else credentials made from the user's
/// ([`node_env`]).
pub(crate) async fn bucket_env(
    url: &BucketUrl,
    remote: &str,
    own: &OwnIdentity,
) -> Result<Vec<(String, String)>, StoreError> {
    if own.covers(url) {
        let env = gangway_store::identity_env(url, &Endpoints::from_env(), remote);
        return Ok(with_conf(env, remote));
    }
    node_env(url, remote).await
}

/// `env` with `remote`'s configuration file text ([`rclone_conf`]) added:
/// every set of node settings carries it, first ones and renewals alike.
fn with_conf(mut env: Vec<(String, String)>, remote: &str) -> Vec<(String, String)> {
    let conf = rclone_conf(remote, &env);
    env.push((conf_var(remote), conf));
    env
}

/// The variable that carries `remote`'s whole rclone configuration file,
/// as gangway wrote it.
fn conf_var(remote: &str) -> String {
    format!("GW_RCLONE_CONF_{}", remote.to_ascii_uppercase())
}

/// `remote`'s rclone configuration file (what a mount rereads when its
/// credentials are renewed), written here from the `RCLONE_CONFIG_<R>_*`
/// values gangway chose: the node writes this text as it is, and never
/// reads its settings back out of an environment that also holds the
/// task's values (one with a newline could add a line such as
/// `RCLONE_CONFIG_GW0_ENDPOINT=...`). S3 keys stay out of it (the mount
/// reads them through the AWS SDK's credential_process); a GCS token gets
/// its expiry, so rclone knows when to read the file again. A value with a
/// line break is left out.
fn rclone_conf(remote: &str, env: &[(String, String)]) -> String {
    let prefix = format!("RCLONE_CONFIG_{}_", remote.to_ascii_uppercase());
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let kind = get(&format!("{prefix}TYPE")).unwrap_or_default();
    let expires = get(&expires_var(remote))
        .and_then(|v| v.parse::<u64>().ok())
        .map(utc_stamp);
    let mut out = format!("[{remote}]\n");
    for (name, value) in env {
        let Some(key) = name.strip_prefix(&prefix) else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        if value.contains(['\n', '\r']) {
            continue;
        }
        if kind == "s3"
            && matches!(
                key.as_str(),
                "access_key_id" | "secret_access_key" | "session_token" | "env_auth"
            )
        {
            continue;
        }
        match (&expires, key.as_str(), value.strip_suffix('}')) {
            (Some(when), "token", Some(open)) => {
                out.push_str(&format!("{key} = {open}, \"expiry\": \"{when}\"}}\n"));
            }
            _ => out.push_str(&format!("{key} = {value}\n")),
        }
    }
    if kind == "s3" {
        out.push_str("env_auth = true\n");
    }
    out
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC).
fn utc_stamp(secs: u64) -> String {
    // Days to a civil date (Howard Hinnant's algorithm).
    let days = (secs / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let t = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// The variable that tells a node when `remote`'s credentials expire (Unix
/// seconds), as [`gangway_store::Bucket::node_env`] spells it.
fn expires_var(remote: &str) -> String {
    format!("GW_EXPIRES_{}", remote.to_ascii_uppercase())
}

fn unix_seconds(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How often a driver hands its nodes' bucket mounts fresh credentials
/// while setup or the run goes on: every 10 minutes, or
/// `GANGWAY_CREDENTIAL_RENEW_SECONDS`.
pub(crate) fn renew_every() -> std::time::Duration {
    let secs = std::env::var("GANGWAY_CREDENTIAL_RENEW_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .unwrap_or(600);
    std::time::Duration::from_secs(secs)
}

/// How long one set of node credentials is handed out again: an STS
/// session lasts 12 hours, so what a node gets has hours left; a
/// checkpoint sync every few seconds costs one STS call in five minutes,
/// not one each (less when renewals come more often than that).
fn node_keys_reused_for() -> std::time::Duration {
    std::time::Duration::from_secs(300).min(renew_every() / 2)
}

/// The provider's node keys (its [`StoreAccess::node_keys`]) for `url`'s
/// bucket and prefix, reused for [`node_keys_reused_for`] (in memory
/// only): each bucket and prefix its own keys, reaching nothing else.
async fn narrowed_node_keys(
    url: &BucketUrl,
    provider: &str,
    node_keys: for<'a> fn(&'a str, &'a str, Option<&'a str>) -> gangway_provider::StoreFuture<'a>,
) -> Result<StoreKeys, String> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Instant;
    type Kept = HashMap<(String, String), (Instant, StoreKeys)>;
    static KEPT: Mutex<Option<Kept>> = Mutex::new(None);
    let key = (url.bucket.clone(), url.prefix.clone());
    if let Some((at, c)) = KEPT
        .lock()
        .map_err(|e| e.to_string())?
        .as_ref()
        .and_then(|k| k.get(&key))
    {
        if at.elapsed() < node_keys_reused_for() {
            return Ok(c.clone());
        }
    }
    let role = node_role(provider)?;
    let c = node_keys(&url.bucket, &url.prefix, role.as_deref()).await?;
    KEPT.lock()
        .map_err(|e| e.to_string())?
        .get_or_insert_with(HashMap::new)
        .insert(key, (Instant::now(), c.clone()));
    Ok(c)
}

/// `<provider>.node_role` of the user's `config.yaml`: the IAM role
/// whose sessions, narrowed to a bucket and prefix, nodes get (today
/// `aws.node_role`, see docs/storage.md). `Err` for a value that is not a
/// role's ARN.
fn node_role(provider: &str) -> Result<Option<String>, String> {
    let home = crate::core::config::gangway_home().map_err(|e| e.to_string())?;
    let config = crate::core::config::user_config(&home).map_err(|e| e.to_string())?;
    let Some(v) = config.as_ref().map(|c| &c[provider]["node_role"]) else {
        return Ok(None);
    };
    match v {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(arn)
            if arn.starts_with("arn:")
                && arn.split(':').nth(2) == Some("iam")
                && arn.contains(":role/") =>
        {
            Ok(Some(arn.clone()))
        }
        other => Err(format!(
            "{provider}.node_role in {} is {other}, not a role's ARN (arn:aws:iam::ACCOUNT:role/NAME)",
            home.join("config.yaml").display()
        )),
    }
}

fn keys(c: StoreKeys) -> gangway_store::S3Keys {
    gangway_store::S3Keys {
        key_id: c.key_id,
        secret: c.secret,
        token: c.token,
    }
}

/// `url` parsed, its error as the store's kind of error.
pub(crate) fn bad_url(url: &str) -> Result<BucketUrl, StoreError> {
    BucketUrl::parse(url).map_err(|e| StoreError::Store {
        url: BucketUrl {
            scheme: Scheme::S3,
            bucket: url.to_string(),
            prefix: String::new(),
        },
        reason: e.to_string(),
    })
}

/// A bucket checkpoint to restore on every node before setup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Restore {
    /// `checkpoint.storage`.
    pub(crate) url: String,
    /// The complete generation to restore.
    pub(crate) generation: u64,
}

/// Where a mount came from in the task file, for errors.
struct Located<'a> {
    file: &'a str,
    field: String,
    at: (usize, usize),
}

impl Located<'_> {
    fn error(&self, message: String, hint: &str) -> Error {
        Error::Spec(SpecError {
            file: self.file.to_string(),
            line: self.at.0,
            col: self.at.1,
            field: self.field.clone(),
            message,
            hint: Some(hint.to_string()),
            unsupported: false,
        })
    }
}

/// `$VAR` and `${VAR}` from the task's `envs`, as SkyPilot substitutes
/// them in bucket names and paths. A variable without a value is an error
/// naming it.
fn substitute(s: &str, task: &Task) -> Result<String, String> {
    let value = |name: &str| {
        task.envs
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.clone())
            .ok_or_else(|| format!("${name} has no value in envs (give it with --env {name}=...)"))
    };
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in '{s}'"))?;
            (&braced[..end], end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        out.push_str(&value(name)?);
        rest = &after[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The task's bucket mounts, resolved and named, in task order; local
/// mounts are left to the caller. Errors are located in `file`.
pub(crate) fn bucket_mounts(task: &Task, file: &Path) -> Result<Vec<BucketMount>, Error> {
    let file = file.display().to_string();
    let mut out = Vec::new();
    for m in &task.file_mounts {
        let mount = MountResolver {
            task,
            here: Located {
                file: &file,
                field: format!("file_mounts.{}", m.dest),
                at: m.at,
            },
        };
        let Some(target) = mount.target(&m.source)? else {
            continue;
        };
        let url = mount.substitute(&target.url)?;
        let parsed =
            BucketUrl::parse(&url).map_err(|e| mount.here.error(e.to_string(), URL_HINT))?;
        out.push(BucketMount {
            dest: m.dest.clone(),
            url: parsed.to_string(),
            remote: format!("gw{}", out.len()),
            mode: target.mode,
            create: target.create,
        });
    }
    Ok(out)
}

const URL_HINT: &str = "write s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]";
const ENV_HINT: &str = "set it under envs: or with --env";

/// Where a bucket mount points, before its `$VAR`s are substituted.
struct MountTarget {
    url: String,
    mode: Mode,
    /// The bucket gangway creates for it, if it does.
    create: Option<Create>,
}

/// One of the task's file mounts being resolved, its errors located.
struct MountResolver<'a> {
    task: &'a Task,
    here: Located<'a>,
}

impl MountResolver<'_> {
    /// `s` with the task's `envs` substituted.
    fn substitute(&self, s: &str) -> Result<String, Error> {
        substitute(s, self.task).map_err(|e| self.here.error(e, ENV_HINT))
    }

    /// Where a mount from `source` points: a bucket URL is copied, a
    /// storage mapping mounted (unless its mode says otherwise) from a
    /// bucket URL or a bucket gangway creates; `None` for a local path.
    fn target(&self, source: &MountSource) -> Result<Option<MountTarget>, Error> {
        let (name, source, store, mode, persistent) = match source {
            MountSource::Local(_) => return Ok(None),
            MountSource::Uri(u) => {
                return Ok(Some(MountTarget {
                    url: u.clone(),
                    mode: Mode::Copy,
                    create: None,
                }))
            }
            MountSource::Storage {
                name,
                source,
                store,
                mode,
                persistent,
            } => (name, source, store, mode, persistent),
        };
        let mode = mode.as_deref().and_then(Mode::parse).unwrap_or(Mode::Mount);
        match (source.as_deref(), name.as_deref()) {
            (Some(src), _) if src.contains("://") => Ok(Some(MountTarget {
                url: src.to_string(),
                mode,
                create: None,
            })),
            (source, Some(name)) => {
                let (url, create) =
                    self.named_bucket(name, source, store.as_deref(), *persistent)?;
                Ok(Some(MountTarget {
                    url,
                    mode,
                    create: Some(create),
                }))
            }
            (Some(src), None) => Err(self.here.error(
                format!("uploading {src} needs name: (the bucket gangway creates and fills)"),
                "give the bucket a globally unique name, e.g. name: my-team-data",
            )),
            (None, None) => Err(self.here.error(
                "a storage mount needs name: (a bucket) or source: (a bucket URL)".into(),
                "write {name: my-bucket, mode: MOUNT} or {source: s3://my-bucket/path}",
            )),
        }
    }

    /// The URL of the bucket `name` in `store` (S3 when none is named) and
    /// how gangway creates it: filled from the local `source` if there is
    /// one, kept unless `persistent` is false.
    fn named_bucket(
        &self,
        name: &str,
        source: Option<&str>,
        store: Option<&str>,
        persistent: Option<bool>,
    ) -> Result<(String, Create), Error> {
        let name = self.substitute(name)?;
        let source = match source {
            None => None,
            Some(src) => Some(self.local_source(src)?),
        };
        let create = Create {
            persistent: persistent.unwrap_or(true),
            source,
        };
        Ok((
            format!("{}://{name}", self.scheme(store)?.url_scheme()),
            create,
        ))
    }

    /// A local source to upload into a created bucket; it must exist.
    fn local_source(&self, src: &str) -> Result<PathBuf, Error> {
        let path = crate::core::config::local_path(&self.substitute(src)?);
        if !path.exists() {
            return Err(self.here.error(
                format!("source {} does not exist", path.display()),
                "a local source is resolved against the directory you run gangway from",
            ));
        }
        Ok(path)
    }

    /// The scheme of a mount's `store:`, S3 when it names none.
    fn scheme(&self, store: Option<&str>) -> Result<Scheme, Error> {
        let Some(s) = store else {
            return Ok(Scheme::S3);
        };
        let s = self.substitute(s)?;
        Scheme::from_store_name(&s).ok_or_else(|| {
            self.here.error(
                format!("store '{s}' is not supported"),
                "use store: s3 or store: gcs",
            )
        })
    }
}

/// Where a mount sits in the task file, for its errors.
fn located<'a>(task: &Task, file: &'a str, m: &BucketMount) -> Located<'a> {
    let at = task
        .file_mounts
        .iter()
        .find(|f| f.dest == m.dest)
        .map_or((0, 0), |f| f.at);
    Located {
        file,
        field: format!("file_mounts.{}", m.dest),
        at,
    }
}

/// A store's refusal, located, with what to do about it.
fn refused(here: &Located<'_>, e: StoreError) -> Error {
    let hint = match &e {
        StoreError::NoSuchBucket { .. } => {
            "check the name; gangway creates only the buckets of {name: ...} mounts"
        }
        StoreError::AccessDenied { .. } | StoreError::NoCredentials { .. } => {
            "check that your credentials may list this bucket (AWS: s3:ListBucket; GCS: storage.objects.list)"
        }
        StoreError::WrongRegion { region, .. } => {
            return here.error(
                e.to_string(),
                &format!(
                    "set AWS_REGION={region}: gangway and the nodes sign S3 requests for AWS_REGION"
                ),
            )
        }
        _ => "the store's answer is above",
    };
    here.error(e.to_string(), hint)
}

/// Checks every bucket before anything is provisioned: it exists (or is
/// one gangway will create) and the user's credentials may list it (one
/// request each; a COPY of one object, `s3://b/file.txt`, is looked up
/// instead). Creates nothing: [`make_buckets`] does, once the user has
/// said yes.
pub(crate) async fn preflight(
    task: &Task,
    file: &Path,
    mounts: &[BucketMount],
    own: &OwnIdentity,
) -> Result<(), Error> {
    let file_s = file.display().to_string();
    for m in mounts {
        let here = located(task, &file_s, m);
        let fail = |e: StoreError| refused(&here, e);
        let url = BucketUrl::parse(&m.url).map_err(|e| here.error(e.to_string(), ""))?;
        let bucket = user_bucket(&url).await.map_err(fail)?;
        let is_object = m.mode == Mode::Copy && bucket.is_object().await.map_err(fail)?;
        if !is_object {
            match bucket.check().await {
                Err(e) if e.is_no_such_bucket() && m.create.is_some() => {}
                other => other.map_err(fail)?,
            }
        }
        // Credentials for the nodes must be had now, not first there
        // (unless the nodes will have an identity of their own).
        if !own.covers(&url) {
            node_env(&url, &m.remote).await.map_err(fail)?;
        }
    }
    Ok(())
}

/// Makes the buckets of `{name: ...}` mounts that are missing, recorded
/// for `owner` (`cluster:NAME`, `job:ID`) before each is made, and uploads
/// each local `source` (changed files only). Says what it did on stderr.
pub(crate) async fn make_buckets(
    task: &Task,
    file: &Path,
    mounts: &[BucketMount],
    store: &Store,
    owner: &str,
) -> Result<(), Error> {
    let file_s = file.display().to_string();
    for m in mounts {
        let Some(create) = &m.create else { continue };
        let here = located(task, &file_s, m);
        let fail = |e: StoreError| refused(&here, e);
        let url = BucketUrl::parse(&m.url).map_err(|e| here.error(e.to_string(), ""))?;
        let bucket = user_bucket(&url).await.map_err(fail)?;
        match bucket.check().await {
            Ok(()) => {}
            Err(e) if e.is_no_such_bucket() => {
                let ours = store.add_bucket(&m.url, owner, create.persistent)?;
                let made = bucket
                    .create(None, bucket_project(&url).as_deref())
                    .await
                    .map_err(fail)?;
                if made == gangway_store::Created::Existed || !ours {
                    // Made meanwhile by another launch (of this installation
                    // or another): theirs, never deleted at this one's down.
                    if ours {
                        store.forget_bucket(&m.url)?;
                    }
                    eprintln!(
                        "Bucket {} was made meanwhile by another launch; it is theirs: kept at down",
                        m.url
                    );
                } else {
                    eprintln!(
                        "Created bucket {}{}",
                        m.url,
                        if create.persistent {
                            " (persistent: kept after down)"
                        } else {
                            " (deleted at down: persistent: false)"
                        }
                    );
                }
            }
            Err(e) => return Err(fail(e)),
        }
        if let Some(src) = &create.source {
            let up = bucket.upload_dir(src, "").await.map_err(fail)?;
            eprintln!(
                "Uploaded {} to {}: {} file(s), {} byte(s); {} unchanged",
                src.display(),
                m.url,
                up.sent,
                up.bytes,
                up.kept
            );
        }
    }
    Ok(())
}

/// Puts a managed job's workdir and local file mounts (`uploads`: where
/// each goes on the node, and the local path) in `jobs.bucket` under
/// `gangway-jobs/<tag>/`, once, from here, and adds them to `mounts` as
/// COPY bucket mounts, so every recovery's nodes fetch them from the store
/// instead of this machine. Returns where they are.
pub(crate) async fn stage_job_files(
    jobs_bucket: &str,
    uploads: Vec<(String, PathBuf)>,
    mounts: &mut Vec<BucketMount>,
    tag: &str,
) -> Result<String, Error> {
    let fail = |e: StoreError| {
        Error::usage(
            format!("jobs.bucket: {e}"),
            Some("jobs.bucket (config.yaml or the task's config:) names a bucket that exists and that your credentials may write"),
        )
    };
    let base = BucketUrl::parse(jobs_bucket).map_err(|e| {
        Error::usage(
            format!("jobs.bucket: {e}"),
            Some("write jobs: {bucket: s3://BUCKET} or gs://BUCKET"),
        )
    })?;
    let url = base.join(&format!("gangway-jobs/{tag}"));
    let bucket = user_bucket(&url).await.map_err(fail)?;
    bucket.check().await.map_err(fail)?;
    match stage(&bucket, &url, uploads, mounts).await {
        Ok(()) => Ok(url.to_string()),
        Err(e) => {
            // Nothing half-staged is left behind.
            let _ = remove_job_files(&url.to_string()).await;
            Err(fail(e))
        }
    }
}

async fn stage(
    bucket: &Bucket,
    url: &BucketUrl,
    uploads: Vec<(String, PathBuf)>,
    mounts: &mut Vec<BucketMount>,
) -> Result<(), StoreError> {
    for (i, (dest, src)) in uploads.into_iter().enumerate() {
        let under = format!("files/{i}");
        let up = bucket.upload_dir(&src, &under).await?;
        // One file is one object, fetched to the path itself.
        let key = match (src.is_file(), src.file_name()) {
            (true, Some(name)) => format!("{under}/{}", name.to_string_lossy()),
            _ => under,
        };
        eprintln!(
            "Uploaded {} to {}: {} file(s), {} byte(s)",
            src.display(),
            url.join(&key),
            up.sent,
            up.bytes
        );
        mounts.push(BucketMount {
            dest,
            url: url.join(&key).to_string(),
            remote: format!("gw{}", mounts.len()),
            mode: Mode::Copy,
            create: None,
        });
    }
    Ok(())
}

/// Deletes what [`stage_job_files`] put in the bucket.
pub(crate) async fn remove_job_files(url: &str) -> Result<usize, StoreError> {
    let bucket = user_bucket(&bad_url(url)?).await?;
    let keys: Vec<String> = bucket.list("").await?.into_iter().map(|o| o.key).collect();
    bucket.delete(&keys).await?;
    Ok(keys.len())
}

/// The project new buckets for `url` go in, where its store has
/// projects: its provider's answer, else `GOOGLE_CLOUD_PROJECT`.
fn bucket_project(url: &BucketUrl) -> Option<String> {
    match access(url).and_then(|(_, a)| a.project) {
        Some(project) => project(),
        None => std::env::var("GOOGLE_CLOUD_PROJECT").ok(),
    }
}

/// Deletes the non-persistent buckets `owner` created and forgets them
/// all. Stops at the first that cannot be deleted, which stays recorded.
pub(crate) async fn remove_buckets(store: &Store, owner: &str) -> Result<Vec<String>, String> {
    let mut removed = Vec::new();
    for b in store.buckets_of(owner).map_err(|e| e.to_string())? {
        if !b.persistent {
            let url = bad_url(&b.url).map_err(|e| e.to_string())?;
            user_bucket(&url)
                .await
                .map_err(|e| e.to_string())?
                .remove()
                .await
                .map_err(|e| e.to_string())?;
            removed.push(b.url.clone());
        }
        store.forget_bucket(&b.url).map_err(|e| e.to_string())?;
    }
    Ok(removed)
}

/// Checks `checkpoint.storage` when it is a bucket: a valid URL, the bucket
/// exists and the user's credentials may list it. Returns the URL as
/// gangway writes it.
pub(crate) fn check_checkpoint_bucket(
    url: &str,
    file: &Path,
    at: (usize, usize),
    own: &OwnIdentity,
) -> Result<String, Error> {
    let file_s = file.display().to_string();
    let here = Located {
        file: &file_s,
        field: "checkpoint.storage".into(),
        at,
    };
    let parsed = BucketUrl::parse(url).map_err(|e| {
        here.error(
            e.to_string(),
            "write s3://BUCKET/PREFIX or gs://BUCKET/PREFIX",
        )
    })?;
    runtime()?
        .block_on(async {
            user_bucket(&parsed).await?.check().await?;
            bucket_env(&parsed, checkpoint::REMOTE, own)
                .await
                .map(|_| ())
        })
        .map_err(|e: StoreError| {
            here.error(
            e.to_string(),
            "checkpoints go to a bucket that exists and that your credentials may list and write",
        )
        })?;
    Ok(parsed.to_string())
}

/// [`preflight`] from synchronous code.
pub(crate) fn preflight_now(
    task: &Task,
    file: &Path,
    mounts: &[BucketMount],
    own: &OwnIdentity,
) -> Result<(), Error> {
    if mounts.is_empty() {
        return Ok(());
    }
    runtime()?.block_on(preflight(task, file, mounts, own))
}

/// [`make_buckets`] from synchronous code.
pub(crate) fn make_buckets_now(
    task: &Task,
    file: &Path,
    mounts: &[BucketMount],
    store: &Store,
    owner: &str,
) -> Result<(), Error> {
    if mounts.iter().all(|m| m.create.is_none()) {
        return Ok(());
    }
    runtime()?.block_on(make_buckets(task, file, mounts, store, owner))
}

/// [`remove_buckets`], saying on stderr what it deleted or why it could
/// not (what it could not delete stays recorded, for `down` to retry).
pub(crate) async fn remove_buckets_saying(store: &Store, owner: &str) {
    match remove_buckets(store, owner).await {
        Ok(urls) => {
            for u in urls {
                eprintln!("Deleted bucket {u} (persistent: false)");
            }
        }
        Err(e) => eprintln!("gangway: warning: a bucket gangway created could not be deleted: {e}"),
    }
}

/// [`remove_buckets_saying`] from synchronous code.
pub(crate) fn remove_buckets_now(store: &Store, owner: &str) {
    match runtime() {
        Ok(rt) => rt.block_on(remove_buckets_saying(store, owner)),
        Err(e) => eprintln!("gangway: warning: a bucket gangway created could not be deleted: {e}"),
    }
}

/// rclone's settings for every mount's bucket, with the nodes' `own`
/// identity or the user's current credentials (see [`bucket_env`]): made
/// for one run, given to its storage step only.
pub(crate) async fn node_credentials(
    mounts: &[BucketMount],
    restore: Option<&Restore>,
    own: &OwnIdentity,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut env = rclone_source_env();
    if let Some(r) = restore {
        let url = bad_url(&r.url)?;
        env.extend(bucket_env(&url, checkpoint::REMOTE, own).await?);
        env.extend(checkpoint::restore_env(&url, r.generation));
    }
    for m in mounts {
        let url = bad_url(&m.url)?;
        env.extend(bucket_env(&url, &m.remote, own).await?);
    }
    Ok(env)
}

/// The bash script of a node's storage step: it makes `mounts` (COPY
/// downloads, MOUNT and MOUNT_CACHED start `rclone mount` in the
/// background), then restores a bucket checkpoint when `GW_CK_RESTORE` is
/// set. Each mount's path on the node comes in `GANGWAY_MOUNT_<i>` (the
/// transport's spelling of it). Fails naming the mount when rclone or FUSE
/// is missing.
pub(crate) fn node_script(mounts: &[BucketMount]) -> String {
    let mut s = String::from(RCLONE_PRELUDE);
    s.push_str(GIT_WORKDIR);
    s.push_str(MOUNT_FUNCTIONS);
    for (i, m) in mounts.iter().enumerate() {
        let src = {
            let url = BucketUrl::parse(&m.url).expect("checked when resolved");
            url.rclone_path(&m.remote)
        };
        let what = format!("{} -> {}", m.url, m.dest);
        let line = match m.mode {
            Mode::Copy => format!(
                "gw_copy {} \"$GANGWAY_MOUNT_{i}\" {}\n",
                sh(&src),
                sh(&what)
            ),
            Mode::Mount => format!(
                "gw_mount {} \"$GANGWAY_MOUNT_{i}\" off {} {}\n",
                sh(&src),
                sh(&what),
                sh(&m.remote)
            ),
            Mode::MountCached => format!(
                "gw_mount {} \"$GANGWAY_MOUNT_{i}\" full {} {}\n",
                sh(&src),
                sh(&what),
                sh(&m.remote)
            ),
        };
        s.push_str(&line);
    }
    s.push_str(manifest::VALIDATE);
    s.push_str(checkpoint::MANIFESTS);
    s.push_str(checkpoint::RESTORE);
    s
}

/// The FUSE mounts (MOUNT, MOUNT_CACHED) of `mounts` whose credentials
/// the driver renews: they outlive the storage step. Those the nodes
/// reach with their `own` identity need none.
pub(crate) fn renewed_mounts(mounts: &[BucketMount], own: &OwnIdentity) -> Vec<BucketMount> {
    mounts
        .iter()
        .filter(|m| m.mode != Mode::Copy)
        .filter(|m| BucketUrl::parse(&m.url).map_or(true, |u| !own.covers(&u)))
        .cloned()
        .collect()
}

/// Hands the FUSE mounts of `mounts` (see [`renewed_mounts`]) on every
/// node fresh credentials: the files their rclone rereads when its
/// credentials expire are rewritten (the storage step wrote them first). Returns how many nodes took them,
/// or what failed, naming the node.
pub(crate) async fn renew_mounts(
    mounts: &[BucketMount],
    cluster: &str,
    nodes: &[gangway_provider::NodeRow],
    transport: std::sync::Arc<dyn gangway_provider::Transport>,
) -> Result<usize, String> {
    let mut env = vec![("GANGWAY_CLUSTER".to_string(), cluster.to_string())];
    let mut script = format!("{RCLONE_PRELUDE}{MOUNT_FUNCTIONS}");
    for m in mounts.iter().filter(|m| m.mode != Mode::Copy) {
        let url = bad_url(&m.url).map_err(|e| e.to_string())?;
        env.extend(node_env(&url, &m.remote).await.map_err(|e| e.to_string())?);
        script.push_str(&format!("gw_creds {}\n", sh(&m.remote)));
    }
    let cmd = gangway_provider::NodeCommand {
        script,
        env,
        cwd: "~".into(),
        task_view: false,
    };
    let runs = nodes.iter().map(|n| {
        let t = std::sync::Arc::clone(&transport);
        let (n, cmd) = (n.clone(), cmd.clone());
        async move {
            let (reader, writer) = std::io::pipe().map_err(|e| e.to_string())?;
            let child = t.spawn(&n, &cmd, writer).map_err(|e| e.to_string())?;
            let output = tokio::task::spawn_blocking(move || {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut { reader }, &mut s);
                s
            });
            let status = child.wait().await.map_err(|e| e.to_string())?;
            let output = output.await.unwrap_or_default();
            if status.success() {
                Ok(())
            } else {
                Err(format!("{}: {status}: {}", n.label(), output.trim()))
            }
        }
    });
    let ends: Vec<Result<(), String>> = futures::future::join_all(runs).await;
    let failed: Vec<String> = ends.into_iter().filter_map(Result::err).collect();
    if failed.is_empty() {
        Ok(nodes.len())
    } else {
        Err(failed.join("; "))
    }
}

/// Single-quoted for bash.
fn sh(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The rclone gangway installs on a node that lacks one.
pub(crate) const RCLONE_VERSION: &str = "v1.68.2";

/// The environment that tells a node where to fetch rclone when it has
/// none: `GANGWAY_RCLONE_URL` from this machine's environment (a mirror
/// for nodes without internet), else rclone's own download site; and
/// `GANGWAY_RCLONE_SHA256`, the zip's checksum, when set.
pub(crate) fn rclone_source_env() -> Vec<(String, String)> {
    let mut env = vec![("GW_RCLONE_VERSION".to_string(), RCLONE_VERSION.to_string())];
    for var in ["GANGWAY_RCLONE_URL", "GANGWAY_RCLONE_SHA256"] {
        if let Ok(v) = std::env::var(var) {
            env.push((var.to_string(), v));
        }
    }
    env
}

/// What every script that runs rclone on a node starts with: rclone runs
/// with remotes from `RCLONE_CONFIG_*` only, and a node without one gets
/// rclone's static build in `~/.gangway/bin` (no root needed), once.
pub(crate) const RCLONE_PRELUDE: &str = r#"set -u
gw_fail() { echo "gangway: $*" >&2; exit 3; }
# A node path as the transport spelled it (`~/x` on SSH nodes), made real.
gw_path() { case "$1" in "~") printf '%s' "$HOME" ;; "~/"*) printf '%s/%s' "$HOME" "${1#"~/"}" ;; *) printf '%s' "$1" ;; esac; }
gw_rclone_bin=""
gw_need_rclone() {
  [ -n "$gw_rclone_bin" ] && return 0
  # The installed one, not the function below of the same name.
  gw_rclone_bin="$(unset -f rclone; command -v rclone)"
  [ -n "$gw_rclone_bin" ] && return 0
  if [ -x "$HOME/.gangway/bin/rclone" ]; then gw_rclone_bin="$HOME/.gangway/bin/rclone"; return 0; fi
  v="$GW_RCLONE_VERSION"
  case "$(uname -m)" in
    x86_64|amd64) a=amd64 ;; aarch64|arm64) a=arm64 ;;
    *) gw_fail "rclone is not installed on this node and there is no build of it for $(uname -m); install it in the image" ;;
  esac
  url="${GANGWAY_RCLONE_URL:-https://downloads.rclone.org/$v/rclone-$v-linux-$a.zip}"
  t="$(mktemp -d)" || gw_fail "no temporary directory"
  gw_fetch() {
    if command -v curl >/dev/null 2>&1; then curl -fsSL --retry 3 -o "$2" "$1"
    elif command -v wget >/dev/null 2>&1; then wget -q -O "$2" "$1"
    else false; fi
  }
  gw_fetch "$url" "$t/rclone.zip" || { rm -rf "$t"; gw_fail "rclone is not installed on this node and it could not be downloaded from $url (install it in the image, e.g. apt-get install rclone, or set GANGWAY_RCLONE_URL to a mirror)"; }
  # Checked before it is unpacked: against GANGWAY_RCLONE_SHA256 when set,
  # else against the SHA256SUMS published beside the zip.
  want="${GANGWAY_RCLONE_SHA256:-}"; from="GANGWAY_RCLONE_SHA256"
  if [ -z "$want" ]; then
    from="${url%/*}/SHA256SUMS"
    gw_fetch "$from" "$t/SHA256SUMS" || { rm -rf "$t"; gw_fail "cannot fetch $from to check the rclone download (set GANGWAY_RCLONE_SHA256 to the zip's SHA-256 for a mirror without one)"; }
    want="$(awk -v f="${url##*/}" '$2 == f || $2 == "*" f { print $1; exit }' "$t/SHA256SUMS")"
    [ -n "$want" ] || { rm -rf "$t"; gw_fail "$from lists no checksum for ${url##*/}"; }
  fi
  got="$(sha256sum "$t/rclone.zip" 2>/dev/null | cut -d' ' -f1)"
  [ -n "$got" ] || got="$(python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$t/rclone.zip" 2>/dev/null)"
  [ "$got" = "$want" ] || { rm -rf "$t"; gw_fail "the rclone downloaded from $url has SHA-256 ${got:-unknown (no sha256sum or python3 here)}, not $want (from $from): not installed"; }
  (cd "$t" && { unzip -q rclone.zip 2>/dev/null || python3 -m zipfile -e rclone.zip . 2>/dev/null; }) \
    || { rm -rf "$t"; gw_fail "cannot unpack $url (no unzip or python3 on this node)"; }
  f="$(find "$t" -type f -name rclone | head -n 1)"
  [ -n "$f" ] || { rm -rf "$t"; gw_fail "no rclone in $url"; }
  mkdir -p "$HOME/.gangway/bin" && cp "$f" "$HOME/.gangway/bin/rclone.$$" && chmod 0755 "$HOME/.gangway/bin/rclone.$$" \
    && mv -f "$HOME/.gangway/bin/rclone.$$" "$HOME/.gangway/bin/rclone" || { rm -rf "$t"; gw_fail "cannot install rclone in ~/.gangway/bin"; }
  rm -rf "$t"
  echo "gangway: installed rclone from $url in ~/.gangway/bin" >&2
  gw_rclone_bin="$HOME/.gangway/bin/rclone"
}
rclone() { gw_need_rclone; "$gw_rclone_bin" --config "" "$@"; }
# rclone's S3 client refuses AWS_CA_BUNDLE; the same CA goes to rclone's
# own HTTP client instead.
if [ -n "${AWS_CA_BUNDLE:-}" ]; then export RCLONE_CA_CERT="$AWS_CA_BUNDLE"; unset AWS_CA_BUNDLE; fi
"#;

/// A git workdir (`GW_GIT_URL` at `GW_GIT_REF`) into `GANGWAY_WORKDIR`:
/// a shallow fetch of the ref, or, for a commit the server will not serve
/// alone, the whole history; then a forced checkout (untracked files stay).
/// A URL or ref that begins with `-` is refused (git would read it as an
/// option; the task parser refuses them first), and positional arguments
/// follow `--`. The URL's credentials (`user:token@`, taken out of it when
/// the task was read) come as the secret `GANGWAY_GIT_CREDENTIALS` and
/// reach git only through `GIT_ASKPASS`: never the URL, the remote's
/// configuration, a command line or the log.
const GIT_WORKDIR: &str = r#"if [ -n "${GW_GIT_URL:-}" ]; then
  command -v git >/dev/null 2>&1 || gw_fail "workdir: git is not installed on this node (needed to clone $GW_GIT_URL)"
  wd="$(gw_path "$GANGWAY_WORKDIR")"; ref="${GW_GIT_REF:-}"
  case "$GW_GIT_URL" in -*) gw_fail "workdir: the url begins with '-'" ;; esac
  case "$ref" in -*) gw_fail "workdir: the ref begins with '-'" ;; esac
  mkdir -p "$wd" || gw_fail "workdir: cannot make $wd"
  export GIT_TERMINAL_PROMPT=0
  if [ -n "${GANGWAY_GIT_CREDENTIALS:-}" ]; then
    gw_askpass="$(mktemp)" || gw_fail "workdir: no temporary file"
    trap 'rm -f "$gw_askpass"' EXIT
    cat > "$gw_askpass" <<'GW_ASKPASS'
#!/bin/sh
c="$GANGWAY_GIT_CREDENTIALS"
case "$1" in
  [Uu]sername*) printf '%s\n' "${c%%:*}" ;;
  *) case "$c" in *:*) printf '%s\n' "${c#*:}" ;; *) echo ;; esac ;;
esac
GW_ASKPASS
    chmod 700 "$gw_askpass" && export GIT_ASKPASS="$gw_askpass"
  fi
  [ -d "$wd/.git" ] || git -C "$wd" init -q || gw_fail "workdir: git init failed in $wd"
  git -C "$wd" remote remove origin >/dev/null 2>&1
  git -C "$wd" remote add -- origin "$GW_GIT_URL" || gw_fail "workdir: git remote add failed"
  if git -C "$wd" fetch -q --depth 1 -- origin ${ref:+"$ref"} 2>"$wd/.git/gangway-fetch.err"; then
    git -C "$wd" checkout -q --force FETCH_HEAD -- || gw_fail "workdir: cannot check out $GW_GIT_URL ${ref:-HEAD}"
  elif [ -n "$ref" ] && git -C "$wd" fetch -q -- origin 2>"$wd/.git/gangway-fetch.err" \
      && git -C "$wd" rev-parse -q --verify "$ref^{commit}" >/dev/null; then
    git -C "$wd" checkout -q --force "$ref" -- || gw_fail "workdir: cannot check out $ref of $GW_GIT_URL"
  else
    gw_fail "workdir: cannot fetch ${ref:-the default branch} of $GW_GIT_URL: $(tail -n 2 "$wd/.git/gangway-fetch.err" | tr '\n' ' ')"
  fi
  echo "workdir: $GW_GIT_URL at ${ref:-HEAD} ($(git -C "$wd" rev-parse --short HEAD))"
fi
"#;

/// Shell functions of the storage step's mounts.
const MOUNT_FUNCTIONS: &str = r#"gw_copy() {
  gw_need_rclone
  set -- "$1" "$(gw_path "$2")" "$3"
  # One object (s3://b/file.txt) lands at the path; a prefix fills it.
  if rclone lsjson --stat "$1" 2>/dev/null | grep -q '"IsDir": *false'; then
    mkdir -p "$(dirname "$2")" || gw_fail "$3: cannot make $(dirname "$2")"
    rclone copyto "$1" "$2" || gw_fail "$3: rclone copyto failed"
  else
    mkdir -p "$2" || gw_fail "$3: cannot make $2"
    rclone copy --fast-list --transfers 16 --checkers 16 "$1" "$2" || gw_fail "$3: rclone copy failed"
  fi
}
# The directory of this cluster's renewable mount credentials on this node:
# 0700, named by the cluster's scope, removed at down.
gw_cred_dir() {
  d="$HOME/.gangway/creds/$(printf %s "${GANGWAY_SCOPE:-${GANGWAY_CLUSTER:-}}" | tr -c 'A-Za-z0-9._-' '_')"
  (umask 077 && mkdir -p "$d" && chmod 0700 "$d") || gw_fail "cannot make $d"
  printf '%s' "$d"
}
# gw_creds REMOTE: writes REMOTE's settings (RCLONE_CONFIG_<R>_*) where its
# mount rereads them when they expire (GW_EXPIRES_<R>): an rclone config
# file, and for S3 keys the keys as an AWS credential_process answer (a
# node's own identity has none: env_auth alone). Written aside under this
# shell's pid, so two writers (nodes sharing a home) never take each
# other's file. Each file
# is 0600 and replaced whole (written aside, then renamed).
gw_creds() {
  r="$1"; R="$(printf %s "$r" | tr a-z A-Z)"; d="$(gw_cred_dir)" || exit 3
  type="$(printenv "RCLONE_CONFIG_${R}_TYPE")"
  exp="$(printenv "GW_EXPIRES_${R}")"
  when=""; [ -n "$exp" ] && when="$(date -u -d "@$exp" +%Y-%m-%dT%H:%M:%SZ)"
  (
    umask 077
    if [ "$type" = s3 ] && [ -z "$(printenv "RCLONE_CONFIG_${R}_ACCESS_KEY_ID")" ]; then
      # The node's own identity (env_auth: the instance profile): no keys
      # to keep, and the SDK must be free to ask the metadata service.
      rm -f "$d/$r.json" "$d/$r.aws"
    elif [ "$type" = s3 ]; then
      key="$(printenv "RCLONE_CONFIG_${R}_ACCESS_KEY_ID")"; secret="$(printenv "RCLONE_CONFIG_${R}_SECRET_ACCESS_KEY")"
      token="$(printenv "RCLONE_CONFIG_${R}_SESSION_TOKEN")"
      case "$key$secret$token" in *'"'*|*'\'*) gw_fail "$r: credentials with quotes" ;; esac
      { printf '{"Version": 1, "AccessKeyId": "%s", "SecretAccessKey": "%s"' "$key" "$secret"
        if [ -n "$token" ]; then printf ', "SessionToken": "%s"' "$token"; fi
        if [ -n "$when" ]; then printf ', "Expiration": "%s"' "$when"; fi
        printf '}\n'; } > "$d/$r.json.$$" && mv -f "$d/$r.json.$$" "$d/$r.json" || gw_fail "$r: cannot write $d/$r.json"
      printf '[profile gangway]\ncredential_process = cat %s\n' "$d/$r.json" > "$d/$r.aws.$$" \
        && mv -f "$d/$r.aws.$$" "$d/$r.aws" || gw_fail "$r: cannot write $d/$r.aws"
    fi
    # The configuration gangway wrote, as it is: nothing is parsed out of
    # the environment, which also holds the task's values.
    conf="$(printenv "GW_RCLONE_CONF_${R}")" || gw_fail "$r: gangway sent no rclone configuration"
    printf '%s\n' "$conf" > "$d/$r.conf.$$" && mv -f "$d/$r.conf.$$" "$d/$r.conf" || gw_fail "$r: cannot write $d/$r.conf"
  ) || exit 3
}
# rclone for REMOTE's mount: its settings from the files above only (none
# from the environment), S3 keys through the AWS SDK's credential_process.
gw_mount_rclone() {
  r="$1"; R="$(printf %s "$r" | tr a-z A-Z)"; d="$(gw_cred_dir)" || exit 3; shift
  (
    for v in $(env | sed -n "s/^\(RCLONE_CONFIG_${R}_[A-Za-z0-9_]*\)=.*/\1/p"); do unset "$v"; done
    unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE
    if [ -f "$d/$r.aws" ]; then
      export AWS_CONFIG_FILE="$d/$r.aws" AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_PROFILE=gangway \
        AWS_SDK_LOAD_CONFIG=1 AWS_EC2_METADATA_DISABLED=true
    fi
    exec "$gw_rclone_bin" --config "$d/$r.conf" "$@"
  )
}
gw_mount() {
  set -- "$1" "$(gw_path "$2")" "$3" "$4" "$5"
  gw_need_rclone
  gw_creds "$5"
  [ -e /dev/fuse ] || gw_fail "$4: this node has no /dev/fuse, so it cannot mount buckets (use mode: COPY)"
  command -v fusermount3 >/dev/null 2>&1 || command -v fusermount >/dev/null 2>&1 \
    || gw_fail "$4: fusermount is not installed (apt-get install fuse3), so rclone cannot mount"
  mkdir -p "$2" || gw_fail "$4: cannot make $2"
  real="$(cd "$2" && pwd -P)"
  # Mounted by an earlier job on this cluster: kept.
  if [ "$(stat -c %d "$real" 2>/dev/null)" != "$(stat -c %d "$real/.." 2>/dev/null)" ]; then return 0; fi
  gw_mount_rclone "$5" mount "$1" "$real" --daemon --daemon-wait 30s --vfs-cache-mode "$3" \
    --dir-cache-time 5s --allow-non-empty || gw_fail "$4: rclone mount failed"
  # Teardown unmounts what is listed here (the cluster's scope, path)
  # before it removes anything or kills the cluster's processes.
  printf '%s\t%s\n' "${GANGWAY_SCOPE:-${GANGWAY_CLUSTER:-}}" "$real" >> "$HOME/.gangway-mounts"
}
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::spec::parse_str;

    #[test]
    fn every_skypilot_form_resolves_to_a_bucket_and_a_mode() {
        let t = parse_str(
            "envs:\n  B: my-ckpts\n  STORE: gcs\nfile_mounts:\n  /data: s3://train-data/shards\n  /ck:\n    name: $B\n    store: $STORE\n    mode: MOUNT_CACHED\n  /src:\n    source: gs://code-${B}/v1\n  /local: .\nrun: x\n",
            "t.yaml",
        )
        .unwrap();
        let m = bucket_mounts(&t, Path::new("t.yaml")).unwrap();
        let got: Vec<(&str, &str, Mode, &str)> = m
            .iter()
            .map(|m| (m.dest.as_str(), m.url.as_str(), m.mode, m.remote.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("/data", "s3://train-data/shards", Mode::Copy, "gw0"),
                ("/ck", "gs://my-ckpts", Mode::MountCached, "gw1"),
                ("/src", "gs://code-my-ckpts/v1", Mode::Mount, "gw2"),
            ]
        );
    }

    #[test]
    fn a_bad_bucket_names_the_file_line_and_field() {
        let t = parse_str(
            "file_mounts:\n  /a: s3://ok-bucket\n  /data: s3://Bad_Name/x\nrun: x\n",
            "t.yaml",
        )
        .unwrap();
        let e = bucket_mounts(&t, Path::new("t.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.yaml:3:"), "{e}");
        assert!(
            e.contains("file_mounts./data") && e.contains("Bad_Name"),
            "{e}"
        );
        let t = parse_str("file_mounts:\n  /d: s3://$NOPE/x\nrun: x\n", "t.yaml").unwrap();
        let e = bucket_mounts(&t, Path::new("t.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("$NOPE has no value"), "{e}");
    }

    fn node(stores: Option<&str>) -> gangway_provider::NodeRow {
        gangway_provider::NodeRow {
            rank: 0,
            instance_id: "i-1".into(),
            private_ip: "10.0.0.1".into(),
            public_ip: None,
            zone: "z".into(),
            topology: String::new(),
            state: "running".into(),
            extra: stores
                .map(|s| {
                    [(
                        gangway_provider::IDENTITY_STORES_FACT.to_string(),
                        s.to_string(),
                    )]
                    .into_iter()
                    .collect()
                })
                .unwrap_or_default(),
        }
    }

    #[test]
    fn a_bucket_is_reached_by_the_nodes_own_identity_only_when_every_node_has_it() {
        let s3 = BucketUrl::parse("s3://bkt/p").unwrap();
        let gs = BucketUrl::parse("gs://bkt/p").unwrap();
        let own = OwnIdentity::of_nodes(&[node(Some("s3")), node(Some("s3"))]);
        assert!(own.covers(&s3) && !own.covers(&gs));
        // One node without it (or with another store's): the user's way.
        let mixed = OwnIdentity::of_nodes(&[node(Some("s3")), node(None)]);
        assert!(!mixed.covers(&s3));
        let other = OwnIdentity::of_nodes(&[node(Some("s3")), node(Some("gs"))]);
        assert!(!other.covers(&s3) && !other.covers(&gs));
        assert!(!OwnIdentity::of_nodes(&[]).covers(&s3));
        // Covered: env_auth, and nothing secret made or sent.
        let env = runtime()
            .unwrap()
            .block_on(bucket_env(&s3, "gw0", &own))
            .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("RCLONE_CONFIG_GW0_TYPE"), Some("s3"), "{env:?}");
        assert_eq!(get("RCLONE_CONFIG_GW0_ENV_AUTH"), Some("true"), "{env:?}");
        for secret in [
            "ACCESS_KEY_ID",
            "SECRET_ACCESS_KEY",
            "SESSION_TOKEN",
            "TOKEN",
        ] {
            assert_eq!(get(&format!("RCLONE_CONFIG_GW0_{secret}")), None, "{env:?}");
        }
        assert_eq!(get("GW_EXPIRES_GW0"), None, "{env:?}");
        let own_gs = OwnIdentity::of_nodes(&[node(Some("gs,s3"))]);
        let env = runtime()
            .unwrap()
            .block_on(bucket_env(&gs, "gw1", &own_gs))
            .unwrap();
        assert!(
            env.contains(&(
                "RCLONE_CONFIG_GW1_TYPE".into(),
                "google cloud storage".into()
            )) && env.contains(&("RCLONE_CONFIG_GW1_ENV_AUTH".into(), "true".into()))
                && !env.iter().any(|(k, _)| k.ends_with("_TOKEN")),
            "{env:?}"
        );
        // A mount the nodes reach by themselves has nothing to renew.
        let m = |url: &str| BucketMount {
            dest: "/d".into(),
            url: url.into(),
            remote: "gw0".into(),
            mode: Mode::Mount,
            create: None,
        };
        let renewed = renewed_mounts(&[m("s3://bkt"), m("gs://bkt")], &own);
        assert_eq!(renewed, vec![m("gs://bkt")]);
    }

    /// The review's attack: a task env value with a newline made `env`
    /// print a line `RCLONE_CONFIG_GW0_ENDPOINT=...` that the node read
    /// into the mount's configuration. The node now writes the text gangway
    /// built, and reads nothing out of the environment.
    #[test]
    fn a_task_value_with_a_newline_cannot_write_the_mounts_configuration() {
        let env = vec![
            ("RCLONE_CONFIG_GW0_TYPE".to_string(), "s3".to_string()),
            ("RCLONE_CONFIG_GW0_PROVIDER".to_string(), "AWS".to_string()),
            (
                "RCLONE_CONFIG_GW0_ACCESS_KEY_ID".to_string(),
                "AKIA".to_string(),
            ),
            (
                "RCLONE_CONFIG_GW0_SECRET_ACCESS_KEY".to_string(),
                "sec".to_string(),
            ),
            (
                "RCLONE_CONFIG_GW0_REGION".to_string(),
                "us-east-1".to_string(),
            ),
        ];
        let conf = rclone_conf("gw0", &env);
        assert_eq!(
            conf,
            "[gw0]\ntype = s3\nprovider = AWS\nregion = us-east-1\nenv_auth = true\n"
        );
        let home = tempfile::tempdir().unwrap();
        let script = format!(
            "{RCLONE_PRELUDE}{MOUNT_FUNCTIONS}\ngw_creds gw0\ncat \"$(gw_cred_dir)/gw0.conf\"\n"
        );
        let mut c = std::process::Command::new("bash");
        c.arg("-c")
            .arg(script)
            .env("HOME", home.path())
            .env("GANGWAY_CLUSTER", "c1");
        for (k, v) in &env {
            c.env(k, v);
        }
        c.env(conf_var("gw0"), &conf);
        c.env(
            "TASK_VALUE",
            "x\nRCLONE_CONFIG_GW0_ENDPOINT=http://stranger.example\n",
        );
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(text, conf);
        assert!(!text.contains("stranger"), "{text}");
    }

    #[test]
    fn a_gcs_token_gets_its_expiry_in_utc() {
        assert_eq!(utc_stamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_stamp(1_764_931_845), "2025-12-05T10:50:45Z");
        assert_eq!(utc_stamp(951_782_400), "2000-02-29T00:00:00Z");
        let env = vec![
            (
                "RCLONE_CONFIG_GW1_TYPE".to_string(),
                "google cloud storage".to_string(),
            ),
            (
                "RCLONE_CONFIG_GW1_TOKEN".to_string(),
                "{\"access_token\": \"t\"}".to_string(),
            ),
            ("GW_EXPIRES_GW1".to_string(), "0".to_string()),
        ];
        assert_eq!(
            rclone_conf("gw1", &env),
            "[gw1]\ntype = google cloud storage\ntoken = {\"access_token\": \"t\", \"expiry\": \"1970-01-01T00:00:00Z\"}\n"
        );
    }

    #[test]
    fn the_node_script_quotes_what_it_is_given() {
        let m = BucketMount {
            dest: "/d".into(),
            url: "s3://b-1/it's".into(),
            remote: "gw0".into(),
            mode: Mode::Copy,
            create: None,
        };
        let s = node_script(&[m]);
        assert!(
            s.contains(r#"gw_copy 'gw0:b-1/it'\''s' "$GANGWAY_MOUNT_0""#),
            "{s}"
        );
    }
}
