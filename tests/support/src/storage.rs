//! The object-store emulators for the bucket tests (`tests/emulators/s3`,
//! `tests/emulators/gcs`, `tests/emulators/storage`; see the README there):
//! moto's S3 and fake-gcs-server, each behind the storage front, which logs
//! every request (method, path, bytes each way, status, `User-Agent` and
//! the `X-Gangway-Caller` header) and injects faults. Standard library and
//! `serde_json` only:
//!
//! ```ignore
//! use gangway_test::storage::StoreEmulator;
//!
//! let Some(s3) = StoreEmulator::s3() else { return }; // SKIPPED s3: why
//! s3.create_bucket("my-test-bucket");
//! Command::new("rclone").envs(s3.rclone_env("store")).args(["copy", dir, "store:my-test-bucket/x"]);
//! s3.fault(&serde_json::json!({"method": "PUT", "path_contains": "my-test-bucket/ckpt",
//!                              "after_bytes": 1 << 20, "action": "drop"}));
//! let mine: Vec<_> = s3.requests().into_iter().filter(|r| r.path.contains("my-test-bucket")).collect();
//! ```
//!
//! One emulator of each kind serves the whole test process (tests run in
//! parallel against it: name buckets after the test, scope fault rules with
//! `path_contains`, and filter the log by path or caller rather than
//! clearing it). Where it comes from, first that works:
//! 1. `GANGWAY_TEST_S3_ENDPOINT` / `GANGWAY_TEST_GCS_ENDPOINT`: one that is
//!    already running (its front's URL);
//! 2. a server this process starts with `--watch-stdin` (it exits when this
//!    process does): `tests/emulators/s3/server.py` run by
//!    `GANGWAY_TEST_S3_PYTHON`, else `<workspace>/target/ec2-venv/bin/python`
//!    (the EC2 emulator's venv has moto's S3: `tests/emulators/ec2/setup.sh`),
//!    else `python3` if it can import moto; `tests/emulators/gcs/server.py`
//!    run by `GANGWAY_TEST_GCS_PYTHON`, else
//!    `<workspace>/target/gcs-venv/bin/python` (`tests/emulators/gcs/setup.sh`).
//!
//! Without either, [`StoreEmulator::s3`] says `SKIPPED s3: ...` (and
//! [`StoreEmulator::gcs`] `SKIPPED gcs: ...`) through [`crate::skip`].
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use crate::ec2_emulator::{http_exchange, start_server};

/// The access key id and secret the S3 emulator takes (any would do).
pub const S3_KEY: &str = "testing";
/// The region S3 clients are configured with.
pub const S3_REGION: &str = "us-east-1";
/// The project GCS buckets are created in.
pub const GCS_PROJECT: &str = "test";
/// The header the front logs as a request's `caller`.
pub const CALLER_HEADER: &str = "X-Gangway-Caller";
/// A GCS service-account key that makes object_store skip OAuth
/// (`disable_oauth`); object_store's `google_service_account_key`.
pub const GCS_NO_AUTH_KEY: &str =
    r#"{"disable_oauth":true,"client_email":"","private_key":"","private_key_id":""}"#;

/// Which store an emulator is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// moto's S3 (suite `s3`).
    S3,
    /// fake-gcs-server (suite `gcs`).
    Gcs,
}

impl Store {
    /// The suite its tests record (`skip`): `s3` or `gcs`.
    pub fn suite(self) -> &'static str {
        match self {
            Store::S3 => "s3",
            Store::Gcs => "gcs",
        }
    }

    fn dir(self) -> &'static str {
        self.suite()
    }

    fn endpoint_var(self) -> &'static str {
        match self {
            Store::S3 => "GANGWAY_TEST_S3_ENDPOINT",
            Store::Gcs => "GANGWAY_TEST_GCS_ENDPOINT",
        }
    }

    fn python_var(self) -> &'static str {
        match self {
            Store::S3 => "GANGWAY_TEST_S3_PYTHON",
            Store::Gcs => "GANGWAY_TEST_GCS_PYTHON",
        }
    }

    fn venv(self) -> &'static str {
        match self {
            Store::S3 => "target/ec2-venv/bin/python",
            Store::Gcs => "target/gcs-venv/bin/python",
        }
    }

    fn setup(self) -> &'static str {
        match self {
            Store::S3 => "tests/emulators/ec2/setup.sh",
            Store::Gcs => "tests/emulators/gcs/setup.sh",
        }
    }
}

/// One request the front handled, as `GET /_gangway/requests` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    /// Its number in the log, from 1.
    pub id: u64,
    /// When it arrived, seconds since the Unix epoch.
    pub time: f64,
    /// How long it took, in seconds.
    pub duration_s: f64,
    /// `GET`, `PUT`, ...
    pub method: String,
    /// The path and query, as the client sent them.
    pub path: String,
    /// Body bytes received from the client.
    pub bytes_in: u64,
    /// Body bytes sent back to the client.
    pub bytes_out: u64,
    /// The status answered; `None` when the connection was dropped first.
    pub status: Option<u16>,
    /// The client's `User-Agent` (`rclone/...`, `object_store/...`).
    pub user_agent: Option<String>,
    /// The client's `X-Gangway-Caller` header.
    pub caller: Option<String>,
    /// The access key id an S3 request was signed with (SigV4's
    /// `Credential=`; the public half only); for a GCS request with an
    /// OAuth token, `bearer-sha256:` and 16 hex digits of its SHA-256.
    pub key_id: Option<String>,
    /// The fault rule that fired on it.
    pub fault: Option<u64>,
    /// What went wrong, when something did (`dropped by fault rule`, ...).
    pub error: Option<String>,
}

impl RequestRecord {
    fn from_json(v: &serde_json::Value) -> RequestRecord {
        let text = |k: &str| v[k].as_str().map(String::from);
        RequestRecord {
            id: v["id"].as_u64().unwrap_or(0),
            time: v["time"].as_f64().unwrap_or(0.0),
            duration_s: v["duration_s"].as_f64().unwrap_or(0.0),
            method: text("method").unwrap_or_default(),
            path: text("path").unwrap_or_default(),
            bytes_in: v["bytes_in"].as_u64().unwrap_or(0),
            bytes_out: v["bytes_out"].as_u64().unwrap_or(0),
            status: v["status"].as_u64().map(|s| s as u16),
            user_agent: text("user_agent"),
            caller: text("caller"),
            key_id: text("key_id"),
            fault: v["fault"].as_u64(),
            error: text("error"),
        }
    }
}

/// An object as [`StoreEmulator::list`] gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The key (object name), from the bucket's root.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// A running store emulator behind its front.
pub struct StoreEmulator {
    /// Which store.
    pub store: Store,
    /// The front's `http://127.0.0.1:PORT`, no trailing slash: clients and
    /// the control API both use it.
    pub endpoint: String,
    /// The server, when this process started it.
    _child: Option<Mutex<Child>>,
    /// Held open so that the server lives exactly as long as this process.
    _stdin: Option<Mutex<ChildStdin>>,
}

impl StoreEmulator {
    /// The shared S3 emulator of this test process (recorded as `ran s3`),
    /// or `None` after `SKIPPED s3: why`.
    pub fn s3() -> Option<&'static StoreEmulator> {
        static SHARED: OnceLock<Result<StoreEmulator, String>> = OnceLock::new();
        crate::skip::gate("s3", SHARED.get_or_init(|| Self::find(Store::S3)).as_ref())
    }

    /// The shared GCS emulator of this test process (recorded as `ran gcs`),
    /// or `None` after `SKIPPED gcs: why`.
    pub fn gcs() -> Option<&'static StoreEmulator> {
        static SHARED: OnceLock<Result<StoreEmulator, String>> = OnceLock::new();
        crate::skip::gate(
            "gcs",
            SHARED.get_or_init(|| Self::find(Store::Gcs)).as_ref(),
        )
    }

    /// The shared emulator of `store`.
    pub fn shared(store: Store) -> Option<&'static StoreEmulator> {
        match store {
            Store::S3 => Self::s3(),
            Store::Gcs => Self::gcs(),
        }
    }

    /// An emulator of its own for the caller (a fresh, empty store and log),
    /// or why there cannot be one here; records nothing. Panics when the
    /// venv is there but the server does not start.
    pub fn start(store: Store) -> Result<StoreEmulator, String> {
        let (python, server) = Self::python_and_server(store)?;
        Self::spawn(store, &python, &server)
    }

    fn find(store: Store) -> Result<StoreEmulator, String> {
        let var = store.endpoint_var();
        if let Some(endpoint) = std::env::var(var).ok().filter(|e| !e.is_empty()) {
            let emu = StoreEmulator {
                store,
                endpoint: endpoint.trim_end_matches('/').to_string(),
                _child: None,
                _stdin: None,
            };
            match http_exchange(&emu.endpoint, "GET", "/_gangway/health", &[], b"") {
                Ok((200, _)) => return Ok(emu),
                other => panic!("{var}={endpoint} is set, but /_gangway/health answers {other:?}"),
            }
        }
        Self::start(store)
    }

    fn python_and_server(store: Store) -> Result<(PathBuf, PathBuf), String> {
        let Some(root) = workspace_root() else {
            return Err(format!(
                "tests/emulators/storage/front.py is not above {}",
                env!("CARGO_MANIFEST_DIR")
            ));
        };
        let server = root.join(format!("tests/emulators/{}/server.py", store.dir()));
        if let Some(python) = std::env::var_os(store.python_var()).filter(|p| !p.is_empty()) {
            return Ok((PathBuf::from(python), server));
        }
        let venv = root.join(store.venv());
        if venv.exists() {
            return Ok((venv, server));
        }
        if store == Store::S3 && python3_can_import("moto") {
            return Ok((PathBuf::from("python3"), server));
        }
        Err(format!(
            "there is no {} (run {}, or .ci/run; or set {} or {})",
            venv.display(),
            store.setup(),
            store.python_var(),
            store.endpoint_var()
        ))
    }

    fn spawn(store: Store, python: &Path, server: &Path) -> Result<StoreEmulator, String> {
        match start_server(python, server) {
            Ok((endpoint, child, stdin)) => Ok(StoreEmulator {
                store,
                endpoint,
                _child: Some(Mutex::new(child)),
                _stdin: Some(Mutex::new(stdin)),
            }),
            Err(why) => panic!(
                "cannot start the {} emulator with {}: {why}",
                store.suite(),
                python.display()
            ),
        }
    }

    /// The environment that configures an rclone remote named `remote`
    /// for this emulator, with no config file (`RCLONE_CONFIG_<REMOTE>_*`;
    /// the recipe of `tests/emulators/storage/README.md`). For S3 it also
    /// empties `AWS_CA_BUNDLE`, on which rclone 1.60's S3 backend fails.
    pub fn rclone_env(&self, remote: &str) -> Vec<(String, String)> {
        let r = remote.to_ascii_uppercase().replace('-', "_");
        let option =
            |name: &str, value: &str| (format!("RCLONE_CONFIG_{r}_{name}"), value.to_string());
        let mut env = vec![("RCLONE_CONFIG".to_string(), "/dev/null".to_string())];
        match self.store {
            Store::S3 => env.extend([
                ("AWS_CA_BUNDLE".to_string(), String::new()),
                option("TYPE", "s3"),
                option("PROVIDER", "Other"),
                option("ENV_AUTH", "false"),
                option("ACCESS_KEY_ID", S3_KEY),
                option("SECRET_ACCESS_KEY", S3_KEY),
                option("REGION", S3_REGION),
                option("ENDPOINT", &self.endpoint),
                option("FORCE_PATH_STYLE", "true"),
            ]),
            Store::Gcs => env.extend([
                option("TYPE", "google cloud storage"),
                option("ENDPOINT", &format!("{}/storage/v1/", self.endpoint)),
                option("ANONYMOUS", "true"),
                option("PROJECT_NUMBER", GCS_PROJECT),
                option("BUCKET_POLICY_ONLY", "true"),
            ]),
        }
        env
    }

    /// object_store's configuration keys and values for this emulator
    /// (`AmazonS3Builder::with_config` / `GoogleCloudStorageBuilder::with_config`
    /// after `key.parse()`, or `object_store::parse_url_opts`); the bucket is
    /// the caller's.
    ///
    /// * S3: `aws_endpoint`, `aws_region`, `aws_access_key_id`,
    ///   `aws_secret_access_key`, `aws_allow_http=true`,
    ///   `aws_virtual_hosted_style_request=false`.
    /// * GCS: `google_base_url` (the front), `google_service_account_key`
    ///   ([`GCS_NO_AUTH_KEY`]: no OAuth), `google_allow_http=true`. Not
    ///   `skip_signature`: with it object_store still asks the metadata
    ///   server for a token before every write.
    pub fn object_store_options(&self) -> Vec<(String, String)> {
        let pairs: Vec<(&str, &str)> = match self.store {
            Store::S3 => vec![
                ("aws_endpoint", &self.endpoint),
                ("aws_region", S3_REGION),
                ("aws_access_key_id", S3_KEY),
                ("aws_secret_access_key", S3_KEY),
                ("aws_allow_http", "true"),
                ("aws_virtual_hosted_style_request", "false"),
            ],
            Store::Gcs => vec![
                ("google_base_url", &self.endpoint),
                ("google_service_account_key", GCS_NO_AUTH_KEY),
                ("google_allow_http", "true"),
            ],
        };
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Creates bucket `name` (S3: `PUT /name`; GCS: the JSON API's insert
    /// in project `test`); panics unless the store says it did.
    pub fn create_bucket(&self, name: &str) {
        let (status, body) = match self.store {
            Store::S3 => self.call("PUT", &format!("/{name}"), &[], b""),
            Store::Gcs => self.call(
                "POST",
                &format!("/storage/v1/b?project={GCS_PROJECT}"),
                &[("Content-Type", "application/json")],
                serde_json::json!({ "name": name }).to_string().as_bytes(),
            ),
        };
        assert_eq!(
            status,
            200,
            "{} emulator: create bucket {name}: {}",
            self.store.suite(),
            String::from_utf8_lossy(&body)
        );
    }

    /// Whether bucket `name` exists (S3: `HEAD /name`; GCS: the bucket's
    /// metadata).
    pub fn bucket_exists(&self, name: &str) -> bool {
        let (status, body) = match self.store {
            Store::S3 => self.call("HEAD", &format!("/{name}"), &[], b""),
            Store::Gcs => self.call("GET", &format!("/storage/v1/b/{name}"), &[], b""),
        };
        match status {
            200 => true,
            404 => false,
            _ => panic!(
                "{} emulator: bucket {name}: {status} {}",
                self.store.suite(),
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// Writes one object (a single request; for seeding a test's bucket).
    pub fn put_object(&self, bucket: &str, key: &str, data: &[u8]) {
        let octets = [("Content-Type", "application/octet-stream")];
        let (status, body) = match self.store {
            Store::S3 => self.call(
                "PUT",
                &format!("/{bucket}/{}", encode_key(key)),
                &octets,
                data,
            ),
            Store::Gcs => self.call(
                "POST",
                &format!(
                    "/upload/storage/v1/b/{bucket}/o?uploadType=media&name={}",
                    encode(key)
                ),
                &octets,
                data,
            ),
        };
        assert_eq!(
            status,
            200,
            "{} emulator: put {bucket}/{key}: {}",
            self.store.suite(),
            String::from_utf8_lossy(&body)
        );
    }

    /// One object's bytes, `None` when there is no such object.
    pub fn get_object(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let path = match self.store {
            Store::S3 => format!("/{bucket}/{}", encode_key(key)),
            Store::Gcs => format!("/storage/v1/b/{bucket}/o/{}?alt=media", encode(key)),
        };
        match self.call("GET", &path, &[], b"") {
            (200, body) => Some(body),
            (404, _) => None,
            (status, body) => panic!(
                "{} emulator: get {bucket}/{key}: {status} {}",
                self.store.suite(),
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// The objects of `bucket` whose keys start with `prefix`, in key
    /// order (every page).
    pub fn list(&self, bucket: &str, prefix: &str) -> Vec<Listed> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = match &token {
                Some(t) => format!("&{}={}", self.page_param(), encode(t)),
                None => String::new(),
            };
            let path = match self.store {
                Store::S3 => format!("/{bucket}?list-type=2&prefix={}{page}", encode(prefix)),
                Store::Gcs => format!("/storage/v1/b/{bucket}/o?prefix={}{page}", encode(prefix)),
            };
            let (status, body) = self.call("GET", &path, &[], b"");
            let body = String::from_utf8_lossy(&body).into_owned();
            assert_eq!(
                status,
                200,
                "{} emulator: list {bucket}/{prefix}: {body}",
                self.store.suite()
            );
            let (items, next) = match self.store {
                Store::S3 => parse_s3_list(&body),
                Store::Gcs => parse_gcs_list(&body),
            };
            out.extend(items);
            match next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    fn page_param(&self) -> &'static str {
        match self.store {
            Store::S3 => "continuation-token",
            Store::Gcs => "pageToken",
        }
    }

    /// The front's request log (every test's, oldest first).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.requests_since(0)
    }

    /// The requests logged after the one numbered `id` (see
    /// [`RequestRecord::id`]): a test that shares the emulator takes the
    /// last id before it starts, rather than clearing the log.
    pub fn requests_since(&self, id: u64) -> Vec<RequestRecord> {
        let body = self.control("GET", &format!("/_gangway/requests?since={id}"), "");
        body["requests"]
            .as_array()
            .map(|a| a.iter().map(RequestRecord::from_json).collect())
            .unwrap_or_default()
    }

    /// The id of the last request logged so far (0: none).
    pub fn last_request_id(&self) -> u64 {
        self.requests().last().map_or(0, |r| r.id)
    }

    /// Empties the request log (other tests' entries too: prefer
    /// [`StoreEmulator::requests_since`] on a shared emulator).
    pub fn reset_log(&self) {
        self.control("POST", "/_gangway/reset-log", "");
    }

    /// Adds a fault rule (`tests/emulators/storage/README.md`), e.g.
    /// `{"method": "PUT", "path_contains": "bucket/ckpt", "after_bytes": N,
    /// "action": "drop"}` or `{"path_contains": "...", "status": 503,
    /// "times": 2}`; returns its id. Panics when the front refuses it.
    pub fn fault(&self, rule: &serde_json::Value) -> u64 {
        let added = self.control_checked("POST", "/_gangway/faults", &rule.to_string(), 201);
        added["id"].as_u64().expect("fault rule id")
    }

    /// The fault rules, with `remaining` and `fired`.
    pub fn fault_rules(&self) -> Vec<serde_json::Value> {
        self.control("GET", "/_gangway/faults", "")["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// How often rule `id` fired.
    pub fn fired(&self, id: u64) -> u64 {
        self.fault_rules()
            .iter()
            .find(|r| r["id"].as_u64() == Some(id))
            .and_then(|r| r["fired"].as_u64())
            .unwrap_or(0)
    }

    /// Removes one fault rule.
    pub fn remove_fault(&self, id: u64) {
        self.control("DELETE", &format!("/_gangway/faults?id={id}"), "");
    }

    /// The GCS front's token exchanges (its STS face, `POST /v1/token`):
    /// `{"id", "subject_sha256", "boundary", "token_sha256", ...}` each,
    /// oldest first; `boundary` is the access boundary asked for.
    pub fn token_exchanges(&self) -> Vec<serde_json::Value> {
        self.control("GET", "/_gangway/sts", "")["exchanges"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// True when this process started the server.
    pub fn started_here(&self) -> bool {
        self._child.is_some()
    }

    /// One raw request to the store through the front: status and body.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        // moto takes an unsigned request as anonymous, which may not read
        // what a signed one wrote: a SigV4-shaped header (never checked).
        let signed = format!(
            "AWS4-HMAC-SHA256 Credential={S3_KEY}/20000101/{S3_REGION}/s3/aws4_request, SignedHeaders=host, Signature=0"
        );
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if self.store == Store::S3 && !path.starts_with("/_gangway/") {
            all.push(("Authorization", &signed));
        }
        http_exchange(&self.endpoint, method, path, &all, body)
            .unwrap_or_else(|e| panic!("{} emulator at {}: {e}", self.store.suite(), self.endpoint))
    }

    fn control(&self, method: &str, path: &str, json: &str) -> serde_json::Value {
        self.control_checked(method, path, json, 200)
    }

    fn control_checked(
        &self,
        method: &str,
        path: &str,
        json: &str,
        want: u16,
    ) -> serde_json::Value {
        let (status, body) = self.call(
            method,
            path,
            &[("Content-Type", "application/json")],
            json.as_bytes(),
        );
        let text = String::from_utf8_lossy(&body);
        assert_eq!(
            status,
            want,
            "{} emulator: {method} {path} {json}: {text}",
            self.store.suite()
        );
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }
}

/// The rclone binary, or why it is not there (`apt-get install rclone`).
pub fn rclone() -> Result<PathBuf, String> {
    let ok = Command::new("rclone")
        .arg("version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(PathBuf::from("rclone"))
    } else {
        Err("rclone is not installed (apt-get install rclone fuse3, or .ci/run)".into())
    }
}

/// The workspace root: the first directory above this crate's that holds
/// the storage front.
fn workspace_root() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("tests/emulators/storage/front.py").is_file())
        .map(Path::to_path_buf)
}

fn python3_can_import(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// [`encode`], keeping the `/` between a key's segments (S3 paths).
fn encode_key(key: &str) -> String {
    key.split('/').map(encode).collect::<Vec<_>>().join("/")
}

/// Decodes the five XML entities and numeric references.
fn xml_unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(end) = tail.find(';') else {
            out.push_str(tail);
            return out;
        };
        let entity = &tail[1..end];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| entity.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => out.push(c),
            None => out.push_str(&tail[..=end]),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The text of each `<tag>...</tag>` in `xml`, in order.
fn xml_elements<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    out
}

/// The objects of an S3 ListObjectsV2 answer, and the next page's token.
fn parse_s3_list(xml: &str) -> (Vec<Listed>, Option<String>) {
    let items = xml_elements(xml, "Contents")
        .into_iter()
        .map(|c| Listed {
            key: xml_unescape(xml_elements(c, "Key").first().copied().unwrap_or_default()),
            size: xml_elements(c, "Size")
                .first()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        })
        .collect();
    let truncated = xml_elements(xml, "IsTruncated").first() == Some(&"true");
    let next = xml_elements(xml, "NextContinuationToken")
        .first()
        .map(|t| xml_unescape(t))
        .filter(|_| truncated);
    (items, next)
}

/// The objects of a GCS JSON objects.list answer, and the next page's token.
fn parse_gcs_list(json: &str) -> (Vec<Listed>, Option<String>) {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let items = v["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|o| Listed {
                    key: o["name"].as_str().unwrap_or_default().to_string(),
                    // The JSON API writes sizes as strings.
                    size: o["size"]
                        .as_str()
                        .and_then(|s| s.parse().ok())
                        .or_else(|| o["size"].as_u64())
                        .unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default();
    let next = v["nextPageToken"].as_str().map(String::from);
    (items, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn s3_listing_parses_keys_sizes_and_the_next_page() {
        let xml = r#"<?xml version="1.0"?><ListBucketResult><IsTruncated>true</IsTruncated><Contents><Key>a&amp;b/c d</Key><Size>12</Size></Contents><Contents><Key>e</Key><Size>0</Size></Contents><NextContinuationToken>t&#x2B;1</NextContinuationToken></ListBucketResult>"#;
        let (items, next) = parse_s3_list(xml);
        assert_eq!(
            items,
            vec![
                Listed {
                    key: "a&b/c d".into(),
                    size: 12
                },
                Listed {
                    key: "e".into(),
                    size: 0
                }
            ]
        );
        assert_eq!(next.as_deref(), Some("t+1"));
        let last = xml.replace("<IsTruncated>true", "<IsTruncated>false");
        assert_eq!(parse_s3_list(&last).1, None);
    }

    #[test]
    fn gcs_listing_parses_string_sizes_and_the_next_page() {
        let json = r#"{"items":[{"name":"x/y","size":"4096"}],"nextPageToken":"p2"}"#;
        let (items, next) = parse_gcs_list(json);
        assert_eq!(
            items,
            vec![Listed {
                key: "x/y".into(),
                size: 4096
            }]
        );
        assert_eq!(next.as_deref(), Some("p2"));
        assert_eq!(
            parse_gcs_list(r#"{"kind":"storage#objects"}"#),
            (vec![], None)
        );
    }

    #[test]
    fn keys_are_encoded_per_segment() {
        assert_eq!(encode_key("ckpt/step 10/a+b.pt"), "ckpt/step%2010/a%2Bb.pt");
        assert_eq!(encode("a/b"), "a%2Fb");
    }

    #[test]
    fn request_records_read_the_fronts_log() {
        let v = serde_json::json!({"id": 3, "time": 1.5, "duration_s": 0.25, "method": "PUT",
            "path": "/b/k", "bytes_in": 10, "bytes_out": 0, "status": null,
            "user_agent": "rclone/", "caller": "node-1", "fault": 2, "error": "dropped by fault rule"});
        let r = RequestRecord::from_json(&v);
        assert_eq!((r.id, r.status, r.fault), (3, None, Some(2)));
        assert_eq!(r.caller.as_deref(), Some("node-1"));
        assert_eq!(r.bytes_in, 10);
    }

    /// Seeds, lists and reads back through the front, and checks the log
    /// and a fault rule: what every bucket test relies on, without rclone.
    fn front_logs_and_faults(emu: &StoreEmulator, bucket: &str) {
        emu.create_bucket(bucket);
        let before = emu.last_request_id();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        emu.put_object(bucket, "dir/one.bin", &data);
        emu.put_object(bucket, "dir/two words.txt", b"two");
        emu.put_object(bucket, "other", b"3");
        assert_eq!(
            emu.list(bucket, "dir/"),
            vec![
                Listed {
                    key: "dir/one.bin".into(),
                    size: 300_000
                },
                Listed {
                    key: "dir/two words.txt".into(),
                    size: 3
                },
            ]
        );
        assert_eq!(
            emu.get_object(bucket, "dir/one.bin").as_deref(),
            Some(&data[..])
        );
        assert_eq!(emu.get_object(bucket, "dir/none"), None);
        let log = emu.requests_since(before);
        let put = log
            .iter()
            .find(|r| r.path.contains("one.bin") && r.bytes_in > 0)
            .expect("the upload is logged");
        assert_eq!((put.bytes_in, put.status), (300_000, Some(200)));
        let get = log
            .iter()
            .find(|r| r.method == "GET" && r.path.contains("one.bin") && r.status == Some(200))
            .expect("the download is logged");
        assert_eq!(get.bytes_out, 300_000);

        // An upload cut after 1000 bytes leaves nothing; a 503 is answered.
        let drop = emu.fault(&serde_json::json!({
            "path_contains": [bucket, "cut"], "after_bytes": 1000, "action": "drop"}));
        let octets = [("Content-Type", "application/octet-stream")];
        let path = match emu.store {
            Store::S3 => format!("/{bucket}/cut"),
            Store::Gcs => format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name=cut"),
        };
        let method = if emu.store == Store::S3 {
            "PUT"
        } else {
            "POST"
        };
        let auth = "AWS4-HMAC-SHA256 Credential=testing/20000101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0";
        let cut = http_exchange(
            &emu.endpoint,
            method,
            &path,
            &[octets[0], ("Authorization", auth)],
            &data,
        );
        assert!(cut.is_err(), "a dropped upload gets no answer: {cut:?}");
        assert_eq!(emu.fired(drop), 1);
        assert!(emu.list(bucket, "cut").is_empty());
        let logged = emu
            .requests_since(before)
            .into_iter()
            .find(|r| r.fault == Some(drop))
            .expect("the dropped request is logged");
        assert_eq!((logged.bytes_in, logged.status), (1000, None));
        let busy = emu.fault(&serde_json::json!({
            "path_contains": [bucket, "busy"], "status": 503, "times": 1}));
        let busy_path = path.replace("cut", "busy");
        assert_eq!(emu.call(method, &busy_path, &octets, b"x").0, 503);
        assert_eq!(emu.call(method, &busy_path, &octets, b"x").0, 200);
        assert_eq!(emu.fired(busy), 1);
    }

    #[test]
    fn s3_front_logs_and_faults() {
        let Some(emu) = StoreEmulator::s3() else {
            return;
        };
        front_logs_and_faults(emu, "support-s3-front");
    }

    #[test]
    fn gcs_front_logs_and_faults() {
        let Some(emu) = StoreEmulator::gcs() else {
            return;
        };
        front_logs_and_faults(emu, "support-gcs-front");
    }

    /// rclone, configured only by [`StoreEmulator::rclone_env`], copies a
    /// directory up and back, and the log shows its bytes under its tag.
    fn rclone_round_trip(emu: &StoreEmulator, bucket: &str) {
        let Some(rclone) = crate::skip::gate(emu.store.suite(), rclone()) else {
            return;
        };
        emu.create_bucket(bucket);
        let dir =
            std::env::temp_dir().join(format!("gangway-test-{bucket}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("up/sub")).unwrap();
        let big: Vec<u8> = (0..(9 << 20) as u32).map(|i| (i * 7 % 253) as u8).collect();
        std::fs::File::create(dir.join("up/sub/big.bin"))
            .and_then(|mut f| f.write_all(&big))
            .unwrap();
        std::fs::write(dir.join("up/small.txt"), b"small\n").unwrap();
        let before = emu.last_request_id();
        let run = |args: &[&str]| {
            let out = Command::new(&rclone)
                .envs(emu.rclone_env("store"))
                .args(["--header", &format!("{CALLER_HEADER}: node-7")])
                .args(args)
                .output()
                .expect("rclone runs");
            assert!(
                out.status.success(),
                "rclone {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let up = dir.join("up");
        let down = dir.join("down");
        let remote = format!("store:{bucket}/ckpt");
        run(&["copy", up.to_str().unwrap(), &remote]);
        run(&["copy", &remote, down.to_str().unwrap()]);
        assert_eq!(std::fs::read(down.join("sub/big.bin")).unwrap(), big);
        assert_eq!(std::fs::read(down.join("small.txt")).unwrap(), b"small\n");
        assert_eq!(
            emu.list(bucket, "ckpt/"),
            vec![
                Listed {
                    key: "ckpt/small.txt".into(),
                    size: 6
                },
                Listed {
                    key: "ckpt/sub/big.bin".into(),
                    size: 9 << 20
                },
            ]
        );
        let log = emu.requests_since(before);
        let sent: u64 = log
            .iter()
            .filter(|r| r.caller.as_deref() == Some("node-7"))
            .map(|r| r.bytes_in)
            .sum();
        assert!(sent >= (9 << 20) + 6, "node-7 sent {sent} bytes");
        assert!(log
            .iter()
            .filter(|r| r.caller.as_deref() == Some("node-7"))
            .all(|r| r.user_agent.as_deref().unwrap_or("").starts_with("rclone/")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn s3_rclone_round_trip() {
        let Some(emu) = StoreEmulator::s3() else {
            return;
        };
        rclone_round_trip(emu, "support-s3-rclone");
    }

    #[test]
    fn gcs_rclone_round_trip() {
        let Some(emu) = StoreEmulator::gcs() else {
            return;
        };
        rclone_round_trip(emu, "support-gcs-rclone");
    }
}
