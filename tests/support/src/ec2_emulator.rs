//! The EC2 emulator for the AWS tests: moto's EC2 plus gangway's fault
//! injection, spot interruptions, placement groups and instance topology
//! (`tests/emulators/ec2/`, see its README). Standard library and
//! `serde_json` only:
//!
//! ```ignore
//! use gangway_test::ec2_emulator::Ec2Emulator;
//!
//! let Some(emu) = Ec2Emulator::shared() else { return }; // SKIPPED aws: why
//! emu.inject("RunInstances", &["my-cluster", "us-east-1a"], "InsufficientInstanceCapacity", "", 1);
//! let out = Command::new(gangway).envs(emu.env()).arg("launch")...;
//! ```
//!
//! One emulator serves the whole test process, and tests run in parallel
//! against it: scope fault rules with `contains` (a cluster name, a zone)
//! rather than clearing them, and name resources after the test.
//!
//! Where the emulator comes from, first that works:
//! 1. `GANGWAY_TEST_EC2_ENDPOINT` (CI starts one for the whole run);
//! 2. a server this process starts: `tests/emulators/ec2/server.py --port 0`
//!    run by `GANGWAY_TEST_PYTHON`, else `<workspace>/target/ec2-venv/bin/python`
//!    (made by `tests/emulators/ec2/setup.sh`), else `python3` if it can
//!    `import moto`.
//!
//! A server started here is run with `--watch-stdin`, and the write end of
//! its stdin pipe lives in a static that is never dropped: when this test
//! process exits, however it exits, the kernel closes the pipe, the server
//! reads end of file and exits. Nothing is left running.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Duration;

/// How long a started server may take to print `READY`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one HTTP exchange with the emulator may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(60);
/// The env var naming an emulator that is already running.
pub const ENDPOINT_VAR: &str = "GANGWAY_TEST_EC2_ENDPOINT";
/// The env var naming the python to run the server with.
pub const PYTHON_VAR: &str = "GANGWAY_TEST_PYTHON";

/// A running EC2 emulator.
pub struct Ec2Emulator {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub endpoint: String,
    /// The server, when this process started it; see the module docs.
    child: Option<Mutex<Child>>,
    /// Held open so that the server lives exactly as long as this process.
    stdin: Option<Mutex<ChildStdin>>,
}

impl Ec2Emulator {
    /// The shared emulator for this test process: `GANGWAY_TEST_EC2_ENDPOINT`
    /// if set, else one started from the venv's python; `None`, after
    /// `skip::skipped("aws", ..)` says what is missing and how to get it,
    /// when there is neither (each calling test records its own `ran aws`
    /// or skip). Panics when `GANGWAY_TEST_EC2_ENDPOINT` or
    /// `GANGWAY_TEST_PYTHON` is set but does not work.
    pub fn shared() -> Option<&'static Ec2Emulator> {
        static SHARED: OnceLock<Result<Ec2Emulator, String>> = OnceLock::new();
        crate::skip::gate("aws", SHARED.get_or_init(Self::find).as_ref())
    }

    fn find() -> Result<Ec2Emulator, String> {
        if let Some(endpoint) = std::env::var(ENDPOINT_VAR).ok().filter(|e| !e.is_empty()) {
            let emu = Ec2Emulator {
                endpoint: endpoint.trim_end_matches('/').to_string(),
                child: None,
                stdin: None,
            };
            match emu.http("GET", "/_gangway/health", &[], b"") {
                Ok((200, _)) => return Ok(emu),
                other => panic!(
                    "{ENDPOINT_VAR}={endpoint} is set, but /_gangway/health answers {other:?}"
                ),
            }
        }
        let Some(root) = workspace_root() else {
            return Err(format!(
                "tests/emulators/ec2/server.py is not above {}",
                env!("CARGO_MANIFEST_DIR")
            ));
        };
        let server = root.join("tests/emulators/ec2/server.py");
        let python = match std::env::var(PYTHON_VAR).ok().filter(|p| !p.is_empty()) {
            Some(python) => PathBuf::from(python),
            None => {
                let venv = root.join("target/ec2-venv/bin/python");
                if venv.exists() {
                    venv
                } else if python3_has_moto() {
                    PathBuf::from("python3")
                } else {
                    return Err(format!(
                        "there is no {} and python3 cannot import moto \
                         (run tests/emulators/ec2/setup.sh, or .ci/run, or set {ENDPOINT_VAR})",
                        venv.display()
                    ));
                }
            }
        };
        match Self::start(&python, &server) {
            Ok(emu) => Ok(emu),
            Err(why) => panic!(
                "cannot start the EC2 emulator with {}: {why}",
                python.display()
            ),
        }
    }

    /// Starts `server.py` with `python` and waits for its `READY` line.
    fn start(python: &Path, server: &Path) -> Result<Ec2Emulator, String> {
        let (endpoint, child, stdin) = start_server(python, server)?;
        Ok(Ec2Emulator {
            endpoint,
            child: Some(Mutex::new(child)),
            stdin: Some(Mutex::new(stdin)),
        })
    }

    /// Makes the next `times` requests (-1: all) for EC2 `action` whose
    /// parameter values contain every string of `contains` fail with `code`,
    /// with the HTTP status EC2 uses for it and `message` (empty: EC2's usual
    /// message). Returns the rule's id, for [`Ec2Emulator::remove_fault`].
    pub fn inject(
        &self,
        action: &str,
        contains: &[&str],
        code: &str,
        message: &str,
        times: i32,
    ) -> u64 {
        let mut rule = serde_json::json!({
            "action": action, "contains": contains, "code": code, "times": times,
        });
        if !message.is_empty() {
            rule["message"] = serde_json::Value::from(message);
        }
        self.inject_rule(&rule)
    }

    /// Adds a fault rule given as the control API's JSON (for `status` or
    /// `region`); returns its id.
    pub fn inject_rule(&self, rule: &serde_json::Value) -> u64 {
        let (status, body) = self.control("POST", "/_gangway/faults", &rule.to_string());
        assert_eq!(
            status, 201,
            "EC2 emulator refused fault rule {rule}: {body}"
        );
        let added: serde_json::Value = serde_json::from_str(&body).expect("fault rule JSON");
        added["id"].as_u64().expect("fault rule id")
    }

    /// Removes one fault rule.
    pub fn remove_fault(&self, id: u64) {
        self.control("DELETE", &format!("/_gangway/faults?id={id}"), "");
    }

    /// Removes every fault rule, other tests' too: tests run in parallel, so
    /// prefer rules scoped with `contains`, or [`Ec2Emulator::remove_fault`].
    pub fn clear_faults(&self) {
        self.control("DELETE", "/_gangway/faults", "");
    }

    /// How many requests the rules for `action` and `code` have failed.
    pub fn fired(&self, action: &str, code: &str) -> u32 {
        self.fault_rules()
            .iter()
            .filter(|r| r["action"] == action && r["code"] == code)
            .map(|r| r["fired"].as_u64().unwrap_or(0) as u32)
            .sum()
    }

    /// The fault rules, as the control API lists them (id, action, contains,
    /// region, code, message, status, times, remaining, fired).
    pub fn fault_rules(&self) -> Vec<serde_json::Value> {
        let (status, body) = self.control("GET", "/_gangway/faults", "");
        assert_eq!(status, 200, "EC2 emulator fault list: {body}");
        let listed: serde_json::Value = serde_json::from_str(&body).expect("fault list JSON");
        listed["rules"].as_array().cloned().unwrap_or_default()
    }

    /// Reclaims a spot instance as EC2 does: `terminated` (48) with state
    /// reason `Server.SpotInstanceTermination`.
    pub fn interrupt(&self, region: &str, instance_id: &str) {
        self.interrupt_to(region, instance_id, "terminated");
    }

    /// Reclaims an instance into `state`: `terminated`, or `stopped` (80,
    /// state reason `Server.SpotInstanceShutdown`, as for a spot instance
    /// whose interruption behavior is stop).
    pub fn interrupt_to(&self, region: &str, instance_id: &str, state: &str) {
        let spec =
            serde_json::json!({"instance_id": instance_id, "region": region, "state": state});
        let (status, body) = self.control("POST", "/_gangway/interrupt", &spec.to_string());
        assert_eq!(status, 200, "EC2 emulator interrupt {spec}: {body}");
    }

    /// Gives the instances that a gangway signing with `scope` (its
    /// access key id, see [`Ec2Emulator::env_as`]) launches machines to
    /// run on: each takes the next free `(public, private)` pair of
    /// `addresses` (more instances than free pairs is EC2's
    /// `InsufficientInstanceCapacity`), its key pair is appended to
    /// `authorized_keys` (a test sshd's), and each public address serves
    /// an IMDSv2-shaped metadata service for the instance holding it.
    /// Calling it again for the scope adds addresses and takes new
    /// launches to the first free pairs of the new list. Returns the
    /// metadata service's port (the same on every address).
    pub fn machines(
        &self,
        scope: &str,
        addresses: &[(String, String)],
        authorized_keys: &Path,
    ) -> u16 {
        let spec = serde_json::json!({
            "scope": scope,
            "addresses": addresses.iter().map(|(p, q)| [p, q]).collect::<Vec<_>>(),
            "authorized_keys": authorized_keys.display().to_string(),
        });
        let (status, body) = self.control("POST", "/_gangway/machines", &spec.to_string());
        assert_eq!(status, 200, "EC2 emulator machines {spec}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("machines JSON");
        v["imds_port"].as_u64().expect("imds_port") as u16
    }

    /// Makes the instances of `scope` publish `host_keys` (OpenSSH public
    /// key lines) in their console output, as cloud-init prints them on
    /// EC2: the keys of the sshd behind the scope's addresses, or others
    /// (a host key that changed, a machine that is not the instance).
    pub fn publish_host_keys(&self, scope: &str, host_keys: &[String]) {
        let spec = serde_json::json!({ "scope": scope, "host_keys": host_keys });
        let (status, body) = self.control("POST", "/_gangway/machines", &spec.to_string());
        assert_eq!(status, 200, "EC2 emulator host keys {spec}: {body}");
    }

    /// The `AssumeRole` calls signed with `scope`'s key:
    /// `{"role_arn", "session_name", "policy", "duration"}` each.
    pub fn assumed_roles(&self, scope: &str) -> Vec<serde_json::Value> {
        let (status, body) = self.control("GET", &format!("/_gangway/sts?scope={scope}"), "");
        assert_eq!(status, 200, "EC2 emulator sts of {scope}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("sts JSON");
        v["assume_role"].as_array().cloned().unwrap_or_default()
    }

    /// The instances `scope` launched on machines, as placed:
    /// `{"instance_id", "region", "public", "private", "scope"}` each (also
    /// once terminated).
    pub fn machines_of(&self, scope: &str) -> Vec<serde_json::Value> {
        let (status, body) = self.control("GET", &format!("/_gangway/machines?scope={scope}"), "");
        assert_eq!(status, 200, "EC2 emulator machines of {scope}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("machines JSON");
        v["instances"].as_array().cloned().unwrap_or_default()
    }

    /// Stops `scope`'s metadata services and forgets its addresses.
    pub fn forget_machines(&self, scope: &str) {
        self.control("DELETE", &format!("/_gangway/machines?scope={scope}"), "");
    }

    /// Interrupts a spot instance as EC2 does with notice: the notice
    /// (`{"action": "terminate", "time": ...}`) is in its metadata at
    /// once, and `notice_seconds` later (EC2: 120) it is terminated with
    /// state reason `Server.SpotInstanceTermination`, unless it is gone
    /// by then. Returns the notice.
    pub fn interrupt_with_notice(
        &self,
        region: &str,
        instance_id: &str,
        notice_seconds: f64,
    ) -> serde_json::Value {
        let spec = serde_json::json!({"instance_id": instance_id, "region": region,
            "notice_seconds": notice_seconds});
        let (status, body) = self.control("POST", "/_gangway/interrupt", &spec.to_string());
        assert_eq!(status, 200, "EC2 emulator interrupt {spec}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("interrupt JSON");
        v["notice"].clone()
    }

    /// Arms the kill points of `scope`, the access key id a client signs
    /// with (see [`Ec2Emulator::env_as`]): from now on its requests are
    /// counted, request k's arrival being kill point 2k-1 and its return
    /// 2k, and at point `at` (0: never, only count) every process whose
    /// environment has the entry `marker` (`KEY=VALUE`) is SIGKILLed.
    /// Returns the state, as [`Ec2Emulator::kill_state`].
    pub fn kill_at(&self, scope: &str, at: u64, marker: &str) -> serde_json::Value {
        let spec = serde_json::json!({"scope": scope, "at": at, "marker": marker});
        let (status, body) = self.control("POST", "/_gangway/kill", &spec.to_string());
        assert_eq!(status, 200, "EC2 emulator kill points {spec}: {body}");
        serde_json::from_str(&body).expect("kill points JSON")
    }

    /// The kill points of `scope`: `requests` and `points` counted so far,
    /// `at`, and `fired` (null, or the point, request, `arrival`/`return`,
    /// action and the pids `killed`).
    pub fn kill_state(&self, scope: &str) -> serde_json::Value {
        let (status, body) = self.control("GET", &format!("/_gangway/kill?scope={scope}"), "");
        assert_eq!(status, 200, "EC2 emulator kill points of {scope}: {body}");
        serde_json::from_str(&body).expect("kill points JSON")
    }

    /// Stops counting (and killing) for `scope`.
    pub fn kill_off(&self, scope: &str) {
        self.control("DELETE", &format!("/_gangway/kill?scope={scope}"), "");
    }

    /// One raw EC2 query call (`Action` and its parameters; `Version` is
    /// added) in `region`: the HTTP status and the XML body, for checks that
    /// do not go through gangway.
    pub fn call(&self, region: &str, params: &[(&str, &str)]) -> (u16, String) {
        let mut form = form_encode(params);
        if !params.iter().any(|(k, _)| *k == "Version") {
            form.push_str("&Version=2016-11-15");
        }
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20000101/{region}/ec2/aws4_request, SignedHeaders=host, Signature=0"
        );
        let headers = [
            (
                "Content-Type",
                "application/x-www-form-urlencoded; charset=utf-8",
            ),
            ("Authorization", auth.as_str()),
        ];
        self.http("POST", "/", &headers, form.as_bytes())
            .unwrap_or_else(|e| panic!("EC2 emulator at {}: {e}", self.endpoint))
    }

    /// The Linux on-demand price (USD/hour) the emulator's Price List API
    /// (GetProducts) gives `instance_type` in `region`.
    pub fn on_demand_price(&self, instance_type: &str, region: &str) -> f64 {
        let body = serde_json::json!({
            "ServiceCode": "AmazonEC2",
            "FormatVersion": "aws_v1",
            "Filters": [
                {"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type},
                {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
                {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
            ],
        });
        let headers = [
            ("Content-Type", "application/x-amz-json-1.1"),
            ("X-Amz-Target", "AWSPriceListService.GetProducts"),
        ];
        let (status, text) = self
            .http("POST", "/", &headers, body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("EC2 emulator at {}: {e}", self.endpoint));
        assert_eq!(status, 200, "GetProducts: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("GetProducts JSON");
        let doc: serde_json::Value =
            serde_json::from_str(v["PriceList"][0].as_str().expect("one product")).unwrap();
        let term = doc["terms"]["OnDemand"]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap();
        let dim = term["priceDimensions"]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap();
        dim["pricePerUnit"]["USD"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// One raw IAM query call (moto's IAM on the same endpoint; `Version`
    /// is added), as a user makes roles and instance profiles: the HTTP
    /// status and the XML body.
    pub fn iam(&self, params: &[(&str, &str)]) -> (u16, String) {
        let mut form = form_encode(params);
        form.push_str("&Version=2010-05-08");
        let auth = "AWS4-HMAC-SHA256 Credential=testing/20000101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0";
        let headers = [
            (
                "Content-Type",
                "application/x-www-form-urlencoded; charset=utf-8",
            ),
            ("Authorization", auth),
        ];
        self.http("POST", "/", &headers, form.as_bytes())
            .unwrap_or_else(|e| panic!("EC2 emulator (IAM) at {}: {e}", self.endpoint))
    }

    /// The session policies of the STS `GetFederationToken` calls signed
    /// with `scope`'s access key (each as the JSON text gangway sent).
    pub fn sts_policies(&self, scope: &str) -> Vec<String> {
        let (status, body) = self.control("GET", &format!("/_gangway/sts?scope={scope}"), "");
        assert_eq!(status, 200, "EC2 emulator sts of {scope}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("sts JSON");
        v["federation"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|f| f["policy"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many STS sessions (`GetSessionToken` or `GetFederationToken`)
    /// were signed with `scope`'s access key: the sessions gangway made from
    /// a user's keys.
    pub fn sts_sessions(&self, scope: &str) -> u64 {
        let (status, body) = self.control("GET", &format!("/_gangway/sts?scope={scope}"), "");
        assert_eq!(status, 200, "EC2 emulator sts of {scope}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("sts JSON");
        v["GetSessionToken"].as_u64().expect("GetSessionToken")
    }

    /// The environment a gangway process or an SDK client needs to reach the
    /// emulator, and nothing real: endpoint, dummy credentials, region, no
    /// retries, no instance metadata, no profile files.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL_EC2", self.endpoint.as_str()),
            // Everything else (STS, ...) goes to moto as well, never to AWS.
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_MAX_ATTEMPTS", "1"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_CONFIG_FILE", "/dev/null"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// [`Ec2Emulator::env`] signing with `access_key` instead of `testing`:
    /// the scope of kill points ([`Ec2Emulator::kill_at`]).
    pub fn env_as(&self, access_key: &str) -> Vec<(String, String)> {
        let mut env = self.env();
        for (k, v) in env.iter_mut() {
            if k == "AWS_ACCESS_KEY_ID" {
                *v = access_key.to_string();
            }
        }
        env
    }

    /// True when this process started the server (rather than CI).
    pub fn started_here(&self) -> bool {
        self.child.is_some() && self.stdin.is_some()
    }

    fn control(&self, method: &str, path: &str, json: &str) -> (u16, String) {
        let headers = [("Content-Type", "application/json")];
        self.http(method, path, &headers, json.as_bytes())
            .unwrap_or_else(|e| panic!("EC2 emulator at {}: {e}", self.endpoint))
    }

    /// One HTTP/1.1 exchange, `Connection: close`.
    fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(u16, String), String> {
        let (status, body) = http_exchange(&self.endpoint, method, path, headers, body)?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// Every `<tag>value</tag>` of an XML answer (an EC2 query call's), in
/// order.
pub fn values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(after[..j].to_string());
        rest = &after[j + close.len()..];
    }
    out
}

/// The workspace root: the first directory above this crate's that holds
/// the emulator.
fn workspace_root() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("tests/emulators/ec2/server.py").is_file())
        .map(Path::to_path_buf)
}

/// Starts `python server --host 127.0.0.1 --port 0 --watch-stdin` and
/// waits for its `READY http://...` line: the endpoint (no trailing slash),
/// the child, and the write end of its stdin, which the caller keeps open
/// for as long as the server is to live. Shared with the storage emulators.
pub(crate) fn start_server(
    python: &Path,
    server: &Path,
) -> Result<(String, Child, ChildStdin), String> {
    let mut child = Command::new(python)
        .arg(server)
        .args(["--host", "127.0.0.1", "--port", "0", "--watch-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().and_then(Result::ok);
        let _ = tx.send(first);
        // Keep reading so the server never writes into a closed pipe.
        for _ in lines {}
    });
    let line = match rx.recv_timeout(START_TIMEOUT) {
        Ok(Some(line)) => line,
        Ok(None) => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            return Err(format!(
                "it exited ({status}) before printing READY; see its stderr above"
            ));
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no READY line within {START_TIMEOUT:?}"));
        }
    };
    let Some(endpoint) = line.strip_prefix("READY ") else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("expected `READY http://...`, got {line:?}"));
    };
    let endpoint = endpoint.trim().trim_end_matches('/').to_string();
    Ok((endpoint, child, stdin))
}

/// One HTTP/1.1 exchange with `endpoint` (`http://host:port`),
/// `Connection: close`: the status and the whole body. Shared with the
/// storage emulators' helper.
pub(crate) fn http_exchange(
    endpoint: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    let host = host_port(endpoint)?;
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)
        .map_err(|e| format!("connect {host}: {e}"))?;
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(HTTP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream
        .write_all(&bytes)
        .map_err(|e| format!("send to {host}: {e}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| format!("read from {host}: {e}"))?;
    parse_response_bytes(&response)
}

fn python3_has_moto() -> bool {
    Command::new("python3")
        .args(["-c", "import moto, flask"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `host:port` of `http://host:port[/...]`.
fn host_port(endpoint: &str) -> Result<String, String> {
    let rest = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| format!("{endpoint:?}: only http:// endpoints are supported"))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("{endpoint:?}: no host"));
    }
    Ok(if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:80")
    })
}

/// `application/x-www-form-urlencoded` of the pairs, in order.
fn form_encode(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
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

/// Status and body of a whole HTTP/1.1 response (Content-Length, chunked,
/// or up to the close).
#[cfg(test)]
fn parse_response(raw: &[u8]) -> Result<(u16, String), String> {
    let (status, body) = parse_response_bytes(raw)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// [`parse_response`], the body as bytes.
fn parse_response_bytes(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {:?}", String::from_utf8_lossy(raw)))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if name == "content-length" {
            if let Ok(n) = value.parse::<usize>() {
                body = &body[..n.min(body.len())];
            }
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line without CRLF")?;
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad chunk size {size_hex:?}"))?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if raw.len() < size {
            return Err("chunk shorter than its size".into());
        }
        out.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod helper_tests {
    use super::*;

    #[test]
    fn form_encoding_escapes_all_but_unreserved() {
        assert_eq!(
            form_encode(&[
                ("Action", "RunInstances"),
                ("TagSpecification.1.Tag.1.Value", "a b/c=d&é")
            ]),
            "Action=RunInstances&TagSpecification.1.Tag.1.Value=a%20b%2Fc%3Dd%26%C3%A9"
        );
    }

    #[test]
    fn endpoints() {
        assert_eq!(
            host_port("http://127.0.0.1:5000").unwrap(),
            "127.0.0.1:5000"
        );
        assert_eq!(
            host_port("http://127.0.0.1:5000/").unwrap(),
            "127.0.0.1:5000"
        );
        assert_eq!(host_port("http://localhost").unwrap(), "localhost:80");
        assert!(host_port("https://ec2.amazonaws.com").is_err());
    }

    #[test]
    fn responses() {
        let plain = b"HTTP/1.1 500 INTERNAL SERVER ERROR\r\nContent-Type: text/xml\r\nContent-Length: 5\r\n\r\n<a/>\nextra";
        assert_eq!(parse_response(plain).unwrap(), (500, "<a/>\n".to_string()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (200, "abcde".to_string()));
        let closed = b"HTTP/1.0 200 OK\r\n\r\nuntil close";
        assert_eq!(
            parse_response(closed).unwrap(),
            (200, "until close".to_string())
        );
        assert!(parse_response(b"garbage").is_err());
    }
}
