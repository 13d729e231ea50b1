//! The spot watchers (`gangway_aws::SPOT_WATCHER`,
//! `gangway_gcp::PREEMPTED_WATCHER`: each cloud's part in
//! `providers/{aws,gcp}/templates/` before the loop they share,
//! `providers/api/templates/notice-watch.sh`) against a fake metadata service on
//! 127.0.0.1: `--once` before and after a notice and with no metadata
//! service, the polling mode signalling a process group, and the SSH
//! transport's `preemption_notice` running the AWS one on a node.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gangway::transport::ssh::SshTransport;
use gangway_provider::notice::Watcher;
use gangway_provider::NodeRow;
use gangway_provider::Transport;
use gangway_test::net::ClosedPort;
use serde_json::Value;

use crate::common::{parts, wait_for, Running};
use crate::sshd::Sshd;

/// Bounded waits for what the watcher does asynchronously.
const WAIT: Duration = Duration::from_secs(20);

/// The notice the fake service posts once armed.
const NOTICE: &str = r#"{"action": "terminate", "time": "2026-12-02T22:51:00Z"}"#;

/// A fake metadata service. AWS IMDSv2: `PUT /latest/api/token` (with the
/// TTL header) hands out tokens; `GET /latest/meta-data/spot/instance-action`
/// answers 401 without a valid token, 404 until `POST /_notice` arms it,
/// then 200 with the notice. GCP: `GET /computeMetadata/v1/instance/preempted`
/// answers 403 without `Metadata-Flavor: Google`, then `FALSE`, or `TRUE`
/// once armed. `POST /_expire` forgets every AWS token (as if they expired);
/// `GET /_stats` counts token PUTs, instance-action GETs and 401s.
const FAKE_IMDS: &str = r#"
import http.server, json, secrets, threading
NOTICE = b'{"action": "terminate", "time": "2026-12-02T22:51:00Z"}'
lock = threading.Lock()
st = {"armed": False, "tokens": set(), "puts": 0, "gets": 0, "unauthorized": 0}

class H(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        if self.path != "/latest/api/token":
            return self.reply(404)
        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self.reply(400)
        with lock:
            token = secrets.token_hex(16)
            st["tokens"].add(token)
            st["puts"] += 1
        self.reply(200, token.encode())

    def do_GET(self):
        with lock:
            if self.path == "/_stats":
                stats = {k: st[k] for k in ("puts", "gets", "unauthorized")}
                return self.reply(200, json.dumps(stats).encode())
            if self.path == "/computeMetadata/v1/instance/preempted":
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self.reply(403)
                return self.reply(200, b"TRUE" if st["armed"] else b"FALSE")
            if self.headers.get("X-aws-ec2-metadata-token") not in st["tokens"]:
                st["unauthorized"] += 1
                return self.reply(401)
            if self.path != "/latest/meta-data/spot/instance-action":
                return self.reply(404)
            st["gets"] += 1
            armed = st["armed"]
        if armed:
            self.reply(200, NOTICE)
        else:
            self.reply(404, b"Not Found")

    def do_POST(self):
        with lock:
            if self.path == "/_notice":
                st["armed"] = True
            elif self.path == "/_expire":
                st["tokens"].clear()
            else:
                return self.reply(404)
        self.reply(200)

    def log_message(self, *args):
        pass

srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// Whether `prog` can be run here.
fn have(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// `ran imds`, or None (after `SKIPPED imds: why`) when python3 or curl
/// is missing.
fn tools() -> Option<()> {
    for prog in ["python3", "curl"] {
        if !have(prog) {
            return crate::skip::skip(
                "imds",
                format_args!(
                    "the spot watcher was NOT tested because {prog} is not installed \
                     (the fake metadata service needs python3, the watcher curl)"
                ),
            );
        }
    }
    crate::skip::ran("imds");
    Some(())
}

/// Makes `cmd`'s process die with the test's thread (a failing or killed
/// test leaves no server or watcher behind; `Drop`s handle the rest).
fn tie_to_test(cmd: &mut Command) {
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Kills and reaps a child on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The fake metadata service, killed on drop.
struct FakeImds {
    _server: Reaped,
    port: u16,
}

impl FakeImds {
    fn start() -> FakeImds {
        let mut cmd = Command::new("python3");
        cmd.args(["-c", FAKE_IMDS])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        tie_to_test(&mut cmd);
        let mut child = cmd.spawn().expect("python3 starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout is piped"))
            .read_line(&mut line)
            .expect("the fake IMDS prints its port");
        let server = Reaped(child);
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the fake IMDS printed {line:?}, not a port"));
        FakeImds {
            _server: server,
            port,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One request with no body; returns the response body.
    fn request(&self, method: &str, path: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("the fake IMDS listens");
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
        )
        .expect("send request");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read response");
        assert!(
            out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
            "{method} {path}: {out}"
        );
        out.split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default()
    }

    /// Posts a notice.
    fn arm(&self) {
        self.request("POST", "/_notice");
    }

    /// Forgets every token handed out so far.
    fn expire_tokens(&self) {
        self.request("POST", "/_expire");
    }

    /// The counters: `puts`, `gets`, `unauthorized`.
    fn stats(&self) -> Value {
        serde_json::from_str(&self.request("GET", "/_stats")).expect("stats JSON")
    }
}

/// Which watcher a test runs, and how it is pointed at the fake service.
#[derive(Clone, Copy, Debug)]
enum Cloud {
    Aws,
    Gcp,
}

impl Cloud {
    /// The watcher as its provider crate embeds it.
    fn watcher(self) -> Watcher {
        match self {
            Cloud::Aws => gangway_aws::SPOT_WATCHER,
            Cloud::Gcp => gangway_gcp::PREEMPTED_WATCHER,
        }
    }

    /// The variable naming the metadata service, and its value for a
    /// service on 127.0.0.1:`port`.
    fn endpoint(self, port: u16) -> (&'static str, String) {
        match self {
            Cloud::Aws => ("GANGWAY_IMDS_ENDPOINT", format!("http://127.0.0.1:{port}")),
            Cloud::Gcp => ("GCE_METADATA_HOST", format!("127.0.0.1:{port}")),
        }
    }

    /// What the watcher prints (and writes) for a notice.
    fn notice(self) -> String {
        match self {
            Cloud::Aws => format!("{NOTICE}\n"),
            Cloud::Gcp => "TRUE\n".into(),
        }
    }
}

/// `sh -c WATCHER NAME ARGS` pointed at a service on 127.0.0.1:`port`,
/// with no other watcher settings from the environment.
fn watcher(cloud: Cloud, port: u16, args: &[&str]) -> Command {
    let (var, value) = cloud.endpoint(port);
    let w = cloud.watcher();
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(w.script())
        .arg(w.name)
        .args(args)
        .env_remove("GANGWAY_IMDS_ENDPOINT")
        .env_remove("GCE_METADATA_HOST")
        .env_remove("GANGWAY_SPOT_POLL_S")
        .env_remove("GANGWAY_NOTICE_FILE")
        .env_remove("GANGWAY_NOTICE_PGID")
        .env(var, value)
        .stdin(Stdio::null());
    tie_to_test(&mut c);
    c
}

/// `--once` to its end, with a hang detector: (code, stdout, stderr).
fn once(cloud: Cloud, port: u16) -> (i32, String, String) {
    parts(&Running::start(watcher(cloud, port, &["--once"])).wait())
}

fn once_says_no_notice_then_prints_it(cloud: Cloud) {
    let Some(()) = tools() else { return };
    let imds = FakeImds::start();
    let (code, out, err) = once(cloud, imds.port);
    assert_eq!((code, out.as_str(), err.as_str()), (1, "", ""), "before");
    imds.arm();
    let (code, out, err) = once(cloud, imds.port);
    assert_eq!(code, 0, "after: {out}{err}");
    assert_eq!(out, cloud.notice());
    assert_eq!(err, "");
}

#[test]
fn aws_once_says_no_notice_then_prints_it_when_posted() {
    once_says_no_notice_then_prints_it(Cloud::Aws);
}

#[test]
fn gcp_once_says_not_preempted_then_true() {
    once_says_no_notice_then_prints_it(Cloud::Gcp);
}

#[test]
fn aws_once_sends_the_token_with_every_get() {
    let Some(()) = tools() else { return };
    let imds = FakeImds::start();
    assert_eq!(once(Cloud::Aws, imds.port).0, 1);
    imds.arm();
    assert_eq!(once(Cloud::Aws, imds.port).0, 0);
    let stats = imds.stats();
    assert_eq!(stats["unauthorized"], 0, "{stats}");
    assert_eq!(stats["gets"], 2, "{stats}");
    assert_eq!(stats["puts"], 2, "a token per run: {stats}");
}

#[test]
fn no_metadata_service_is_exit_2_with_a_message() {
    let Some(()) = tools() else { return };
    for cloud in [Cloud::Aws, Cloud::Gcp] {
        let held = ClosedPort::hold();
        let port = held.port;
        let (code, out, err) = once(cloud, port);
        assert_eq!(code, 2, "{cloud:?}: {out}{err}");
        assert_eq!(out, "", "{cloud:?}");
        assert!(
            err.contains("metadata") && err.contains(&format!("127.0.0.1:{port}")),
            "{cloud:?}: {err}"
        );
        // The polling mode gives up at once too: not a cloud node.
        let (code, _, err) = parts(&Running::start(watcher(cloud, port, &[])).wait());
        assert_eq!(code, 2, "{cloud:?}: {err}");
        assert!(err.contains("metadata"), "{cloud:?}: {err}");
    }
}

/// Starts the polling watcher for a sleeper in its own process group, waits
/// until it has asked (and been told there is no notice), runs `before`,
/// arms the notice, and checks that the sleeper dies of SIGTERM, the notice
/// file holds the notice and the watcher exits 0 printing it.
fn polling_terminates_the_process_group(cloud: Cloud, imds: &FakeImds, before: impl FnOnce()) {
    let dir = tempfile::tempdir().expect("tempdir");
    let notice_file = dir.path().join("notice");

    // The "job": a sleeper leading its own process group.
    let mut job = Command::new("sleep");
    job.arg("60").stdin(Stdio::null()).process_group(0);
    tie_to_test(&mut job);
    let mut job = Reaped(job.spawn().expect("sleep starts"));
    let pgid = job.0.id();

    let mut c = watcher(cloud, imds.port, &[]);
    c.env("GANGWAY_SPOT_POLL_S", "0.2")
        .env("GANGWAY_NOTICE_FILE", &notice_file)
        .env("GANGWAY_NOTICE_PGID", pgid.to_string());
    let mut w = Running::start(c);

    // It polls without acting (the fake counts AWS GETs only; give the GCP
    // watcher a few polls' time instead).
    match cloud {
        Cloud::Aws => wait_for("the watcher to poll", WAIT, || {
            let stats = imds.stats();
            if stats["gets"].as_u64() >= Some(1) {
                Ok(())
            } else {
                Err(stats.to_string())
            }
        }),
        Cloud::Gcp => std::thread::sleep(Duration::from_secs(1)),
    }
    assert!(!w.exited(), "exited before a notice: {}", w.stderr_now());
    assert!(!notice_file.exists());
    assert!(
        matches!(job.0.try_wait(), Ok(None)),
        "the job was signalled"
    );

    before();
    imds.arm();
    let status = wait_for("the job to be terminated", WAIT, || {
        match job.0.try_wait() {
            Ok(Some(s)) => Ok(s),
            _ => Err(format!("still running; watcher: {}", w.stderr_now())),
        }
    });
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    let (code, out, err) = parts(&w.wait());
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out, cloud.notice());
    assert_eq!(
        std::fs::read_to_string(&notice_file).expect("the notice file"),
        cloud.notice()
    );
}

#[test]
fn aws_polling_refreshes_its_token_writes_the_notice_and_terminates_the_group() {
    let Some(()) = tools() else { return };
    let imds = FakeImds::start();
    // Its token expires just before the notice comes: it must get a new
    // one on the 401.
    polling_terminates_the_process_group(Cloud::Aws, &imds, || imds.expire_tokens());
    let stats = imds.stats();
    assert_eq!(
        stats["puts"], 2,
        "one token, then one after the 401: {stats}"
    );
    assert!(stats["unauthorized"].as_u64() >= Some(1), "{stats}");
}

#[test]
fn gcp_polling_writes_true_and_terminates_the_group() {
    let Some(()) = tools() else { return };
    let imds = FakeImds::start();
    polling_terminates_the_process_group(Cloud::Gcp, &imds, || {});
}

#[test]
fn the_ssh_transport_reads_a_gcp_spot_nodes_preemption() {
    let Some(()) = tools() else { return };
    let Some(sshd) = Sshd::start(1) else { return };
    let imds = FakeImds::start();
    let host = format!("127.0.0.1:{}", imds.port);
    let spot = ssh_node(
        &sshd,
        0,
        &[("market", "spot"), ("env.GCE_METADATA_HOST", &host)],
    );
    let on_demand = ssh_node(
        &sshd,
        1,
        &[("market", "on-demand"), ("env.GCE_METADATA_HOST", &host)],
    );
    let home = tempfile::tempdir().expect("tempdir");
    let t = SshTransport::new(home.path(), "gce", true)
        .expect("transport")
        .with_notice_probe(std::sync::Arc::new(gangway_gcp::preempted_notice_probe));
    let nodes = [spot.clone(), on_demand.clone()];
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(t.connect(&nodes))
        .expect("connect");
    assert_eq!(t.preemption_notice(&spot), None, "before the preemption");
    imds.arm();
    assert_eq!(
        t.preemption_notice(&spot).as_deref(),
        Some("instance/preempted: TRUE")
    );
    assert_eq!(t.preemption_notice(&on_demand), None);
}

/// A node of `sshd` with `facts` on top of how it is reached.
fn ssh_node(sshd: &Sshd, rank: u32, facts: &[(&str, &str)]) -> NodeRow {
    let mut extra = BTreeMap::new();
    extra.insert("ssh.host".to_string(), sshd.addrs[0].clone());
    extra.insert("ssh.port".to_string(), sshd.port.to_string());
    extra.insert("ssh.user".to_string(), sshd.user.clone());
    extra.insert("ssh.key".to_string(), sshd.client_key.display().to_string());
    for (k, v) in facts {
        extra.insert(k.to_string(), v.to_string());
    }
    NodeRow {
        rank,
        instance_id: format!("i-{rank}"),
        private_ip: sshd.addrs[0].clone(),
        public_ip: None,
        zone: "us-east-1a".into(),
        topology: String::new(),
        state: "running".into(),
        extra,
    }
}

#[test]
fn the_ssh_transport_reads_a_spot_nodes_notice() {
    let Some(()) = tools() else { return };
    let Some(sshd) = Sshd::start(1) else { return };
    let imds = FakeImds::start();
    let endpoint = imds.endpoint();
    let held = ClosedPort::hold();
    let closed = format!("http://127.0.0.1:{}", held.port);
    let spot = ssh_node(
        &sshd,
        0,
        &[
            ("market", "spot"),
            ("instance_type", "p4d.24xlarge"),
            ("env.GANGWAY_IMDS_ENDPOINT", &endpoint),
        ],
    );
    let on_demand = ssh_node(
        &sshd,
        1,
        &[
            ("market", "on-demand"),
            ("env.GANGWAY_IMDS_ENDPOINT", &endpoint),
        ],
    );
    // A spot node without a metadata service: no notice, and no error.
    let elsewhere = ssh_node(
        &sshd,
        2,
        &[("market", "spot"), ("env.GANGWAY_IMDS_ENDPOINT", &closed)],
    );
    let home = tempfile::tempdir().expect("tempdir");
    let t = SshTransport::new(home.path(), "imds", true)
        .expect("transport")
        .with_notice_probe(std::sync::Arc::new(gangway_aws::spot_notice_probe));
    let nodes = [spot.clone(), on_demand.clone(), elsewhere.clone()];
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(t.connect(&nodes))
        .expect("connect");

    assert_eq!(t.preemption_notice(&spot), None, "before the notice");
    let asked = imds.stats()["gets"].as_u64();
    assert_eq!(asked, Some(1), "the spot node asked once");
    imds.arm();
    assert_eq!(
        t.preemption_notice(&spot),
        Some(format!("spot/instance-action: {NOTICE}"))
    );
    assert_eq!(t.preemption_notice(&on_demand), None);
    assert_eq!(t.preemption_notice(&elsewhere), None);
    // Only the spot node's two checks reached the service.
    assert_eq!(imds.stats()["gets"], 2);
}
