//! `gangway dashboard` end to end: the real binary serving the real state
//! of real launches on the local cloud. Over plain HTTP: the token, the
//! Host check, the limits. In a real browser (Debian's chromium driven by
//! chromedriver over its W3C WebDriver HTTP API), what a user sees: the
//! cluster and its nodes, a managed job's preemption and recovery on its
//! timeline, a change appearing without a reload, hostile names as text.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::{parts, wait_for, Running, TestHome};

/// A running `gangway dashboard`, and where it listens.
pub(crate) struct Dashboard {
    _process: Running,
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
    /// The token its URL carries.
    pub(crate) token: String,
}

impl Dashboard {
    /// Starts `gangway dashboard` in `home` and reads the URL it prints.
    pub(crate) fn start(home: &TestHome) -> Dashboard {
        let mut p = home.spawn(["dashboard"]);
        p.wait_for_stdout("http://127.0.0.1:", "the dashboard's address");
        let out = p.stdout_now();
        let url = out
            .split_whitespace()
            .find(|w| w.starts_with("http://127.0.0.1:"))
            .expect("a URL")
            .to_string();
        let rest = url.trim_start_matches("http://127.0.0.1:");
        let (port, query) = rest.split_once("/?t=").expect("port and token");
        Dashboard {
            _process: p,
            port: port.parse().expect("a port"),
            token: query.to_string(),
        }
    }

    /// `GET target` with this Host; the status and body.
    pub(crate) fn get_as(&self, target: &str, host: &str) -> (u16, String) {
        raw(
            self.port,
            &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n"),
        )
    }

    /// `GET path` with the token.
    pub(crate) fn get(&self, path: &str, extra: &str) -> (u16, String) {
        self.get_as(
            &format!("{path}?t={}{extra}", self.token),
            &format!("127.0.0.1:{}", self.port),
        )
    }
}

/// Sends `request` as is and reads the answer to its end: (status, body).
pub(crate) fn raw(port: u16, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request.as_bytes()).expect("send");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("read the answer");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A two-node cluster on the local cloud, its run still going.
fn launch_cluster(home: &TestHome, name: &str) {
    let task = home.file(
        "two.yaml",
        &format!(
            "name: two\nnum_nodes: 2\nresources:\n  infra: local\nenvs:\n  GW_TEST_MARKER: {}\nrun: sleep 600\n",
            home.marker
        ),
    );
    let (code, out, err) = parts(&home.run(["launch", &task, "-c", name, "-y", "-d"]));
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn the_clusters_page_shows_a_real_cluster_only_with_the_token() {
    let home = TestHome::new();
    launch_cluster(&home, "web");
    let nodes = home.nodes("web");
    let d = Dashboard::start(&home);

    let (code, page) = d.get("/", "");
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("data-cluster=\"web\""), "{page}");
    for n in &nodes {
        assert!(page.contains(&n.id), "node {} missing: {page}", n.id);
        assert!(page.contains(&n.ip), "address {} missing: {page}", n.ip);
    }
    assert!(page.contains("2x local.cpu"), "{page}");
    assert!(page.contains("on-demand"), "{page}");

    // The live update's fragment: the inside of <main> only.
    let (code, fragment) = d.get("/", "&part=main");
    assert_eq!(code, 200);
    assert!(fragment.starts_with("<h1>Clusters"), "{fragment}");
    assert!(fragment.contains("data-cluster=\"web\""));

    // No token, a wrong one, one a byte short: refused, and nothing of the
    // state in the answer.
    let host = format!("127.0.0.1:{}", d.port);
    let wrong = format!("{}0", &d.token[..d.token.len() - 1]);
    let short = &d.token[..d.token.len() - 1];
    for target in [
        "/".to_string(),
        "/jobs".into(),
        "/static/app.js".into(),
        format!("/?t={wrong}"),
        format!("/?t={short}"),
        format!("/?x={}", d.token),
    ] {
        let (code, body) = d.get_as(&target, &host);
        assert_eq!(code, 403, "{target}: {body}");
        assert!(!body.contains("web"), "{target}: {body}");
    }
    // Another Host (a rebound DNS name) is refused even with the token.
    let (code, _) = d.get_as(&format!("/?t={}", d.token), "evil.example:80");
    assert_eq!(code, 403);
    // Only GET and HEAD; headers past the limit are refused.
    let (code, _) = raw(
        d.port,
        &format!(
            "POST /?t={} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n",
            d.token
        ),
    );
    assert_eq!(code, 405);
    let huge = "a".repeat(20_000);
    let (code, _) = raw(
        d.port,
        &format!(
            "GET /?t={} HTTP/1.1\r\nHost: {host}\r\nX: {huge}\r\n\r\n",
            d.token
        ),
    );
    assert_eq!(code, 431);
    let (code, _) = raw(d.port, "hello\r\n\r\n");
    assert_eq!(code, 400);
    // Still serving after all that.
    assert_eq!(d.get("/", "").0, 200);

    let (code, out, err) = parts(&home.run(["down", "web", "-y"]));
    assert_eq!(code, 0, "{out}{err}");
    // The page follows the state: the cluster is gone.
    wait_for(
        "the cluster to leave the page",
        Duration::from_secs(30),
        || {
            let (_, f) = d.get("/", "&part=main");
            if f.contains("No clusters") {
                Ok(())
            } else {
                Err(f)
            }
        },
    );
}

#[test]
fn open_hands_the_printed_address_to_the_desktop() {
    let home = TestHome::new();
    // A stand-in for xdg-open (open on macOS) that writes down what it got.
    let bin = home.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let got = home.path().join("opened");
    for name in ["xdg-open", "open"] {
        let script = bin.join(name);
        std::fs::write(
            &script,
            format!("#!/bin/sh\nprintf '%s' \"$1\" > {}\n", got.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = crate::common::command_in(home.path());
    c.args(["dashboard", "--open"]).env("PATH", path);
    let mut p = Running::start(c);
    p.wait_for_stdout("http://127.0.0.1:", "the dashboard's address");
    let printed = p
        .stdout_now()
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_string();
    let opened = wait_for("the browser to be asked", Duration::from_secs(30), || {
        std::fs::read_to_string(&got).map_err(|e| e.to_string())
    });
    assert_eq!(opened, printed);
}

#[test]
fn a_second_dashboard_on_a_taken_port_says_so() {
    let home = TestHome::new();
    let d = Dashboard::start(&home);
    let (code, _, err) = parts(&home.run(["dashboard", "--port", &d.port.to_string()]));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{}", d.port)),
        "{err}"
    );
    assert!(err.contains("--port 0"), "{err}");
}

// ---------------------------------------------------------------------------
// In a real browser.
// ---------------------------------------------------------------------------

/// Chromium driven by chromedriver through the W3C WebDriver HTTP API.
struct Browser {
    driver: std::process::Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

/// The first of `names` on PATH (or in /usr/bin).
fn program(names: &[&str]) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .chain([std::path::PathBuf::from("/usr/bin")])
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

/// A free port on 127.0.0.1 (the OS's pick, released for the driver).
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// An HTTP/1.1 answer, read to its `Content-Length` (chromedriver keeps
/// the connection open after it) or to the end of the stream.
fn read_answer(s: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut answer = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(at) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&answer[..at]).to_ascii_lowercase();
            let length = head.lines().find_map(|l| {
                l.strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            });
            if length.is_some_and(|n| answer.len() >= at + 4 + n) {
                return Ok(answer);
            }
        }
        match s.read(&mut chunk) {
            Ok(0) => return Ok(answer),
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The body of an HTTP/1.1 answer, chunked or not.
fn body_of(answer: &[u8]) -> (u16, Vec<u8>) {
    let text = String::from_utf8_lossy(answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let Some(at) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (status, Vec::new());
    };
    let head = text[..at].to_ascii_lowercase();
    let mut body = &answer[at + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return (status, body.to_vec());
    }
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&body[..eol])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 || body.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&body[eol + 2..eol + 2 + size]);
        body = &body[(eol + 4 + size).min(body.len())..];
    }
    (status, out)
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session, or says why
    /// not.
    fn start() -> Result<Browser, String> {
        let chromium = program(&["chromium", "chromium-browser"])
            .ok_or("chromium is not installed (apt-get install chromium chromium-driver)")?;
        let chromedriver = program(&["chromedriver"])
            .ok_or("chromedriver is not installed (apt-get install chromium-driver)")?;
        let port = free_port();
        let driver = std::process::Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("chromedriver does not start: {e}"))?;
        let profile = tempfile::Builder::new()
            .prefix("gangway-chromium-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let mut b = Browser {
            driver,
            port,
            session: String::new(),
            _profile: profile,
        };
        wait_for(
            "chromedriver to answer",
            Duration::from_secs(30),
            || match b.request("GET", "/status", None) {
                Ok(v) if v["value"]["ready"] == true => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
        let caps = serde_json::json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--disable-dev-shm-usage", "--window-size=1280,900",
                        "--no-first-run", "--no-default-browser-check",
                        format!("--user-data-dir={}", b._profile.path().display()),
                    ],
                },
            }},
        });
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["value"]["sessionId"]
            .as_str()
            .ok_or_else(|| format!("chromedriver made no session: {v}"))?
            .to_string();
        Ok(b)
    }

    /// One WebDriver command; its JSON answer.
    fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> serde_json::Value {
        self.request(method, path, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"))
    }

    /// One WebDriver command; its JSON answer, or why there is none.
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| e.to_string())?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        );
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let answer = read_answer(&mut s)?;
        let (_, body) = body_of(&answer);
        serde_json::from_slice(&body)
            .map_err(|e| format!("no JSON ({e}): {}", String::from_utf8_lossy(&answer)))
    }

    fn session_call(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let v = self.call(
            method,
            &format!("/session/{}{path}", self.session),
            Some(body),
        );
        assert!(
            v["value"]["error"].is_null(),
            "WebDriver {method} {path}: {v}"
        );
        v["value"].clone()
    }

    /// Loads `url`.
    fn goto(&self, url: &str) {
        self.session_call("POST", "/url", serde_json::json!({ "url": url }));
    }

    /// Runs `script` in the page; its value.
    fn eval(&self, script: &str) -> serde_json::Value {
        self.session_call(
            "POST",
            "/execute/sync",
            serde_json::json!({ "script": script, "args": [] }),
        )
    }

    /// What the page shows, as a person reads it.
    fn text(&self) -> String {
        self.eval("return document.body ? document.body.innerText : ''")
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// Waits until the page shows every one of `needles`.
    fn wait_text(&self, needles: &[&str], what: &str) -> String {
        wait_for(what, Duration::from_secs(120), || {
            let t = self.text();
            if needles.iter().all(|n| t.contains(n)) {
                Ok(t)
            } else {
                Err(t)
            }
        })
    }

    /// A PNG of the window into `dir/name`, when screenshots are asked for
    /// (`GANGWAY_DASHBOARD_SCREENSHOTS=DIR`, how docs/dashboard/ is made).
    fn screenshot(&self, name: &str) {
        let Some(dir) = std::env::var_os("GANGWAY_DASHBOARD_SCREENSHOTS") else {
            return;
        };
        let v = self.call(
            "GET",
            &format!("/session/{}/screenshot", self.session),
            None,
        );
        let b64 = v["value"].as_str().expect("a screenshot");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(name), base64_decode(b64)).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.request("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Standard base64 (what WebDriver's screenshots are).
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[test]
fn base64_decodes_what_webdriver_sends() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("iVBORw0KGgo="), b"\x89PNG\r\n\x1a\n");
}

/// A managed spot job whose first run is preempted after 4 s and whose
/// second runs 8 s and succeeds; its name is markup.
fn launch_preempted_job(home: &TestHome) {
    let task = home.file(
        "spot.yaml",
        &format!(
            "name: \"<script>window.pwned=1</script>\"\nresources:\n  infra: local\n  use_spot: true\n\
             envs:\n  GW_TEST_MARKER: {}\nconfig:\n  local:\n    preemptions:\n      - {{after_s: 4}}\n\
             run: |\n  echo \"run $GANGWAY_RESTART_COUNT <img src=x onerror=window.pwned=2>\"\n  \
             [ \"$GANGWAY_RESTART_COUNT\" = 0 ] && exec sleep 300\n  sleep 8\n  echo all-done\n",
            home.marker
        ),
    );
    let (code, out, err) = parts(&home.run(["jobs", "launch", &task, "-y", "-d"]));
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn in_a_browser_the_dashboard_shows_clusters_a_preempted_job_and_live_changes() {
    let home = TestHome::new();
    launch_cluster(&home, "web");
    let nodes = home.nodes("web");
    let d = Dashboard::start(&home);
    let Some(b) = gangway_test::skip::gate("dashboard", Browser::start()) else {
        return;
    };
    let url = |path: &str| format!("http://127.0.0.1:{}{path}?t={}", d.port, d.token);

    // Without the token the browser gets the refusal, not the state.
    b.goto(&format!("http://127.0.0.1:{}/", d.port));
    let refused = b.text();
    assert!(refused.contains("forbidden"), "{refused}");
    assert!(!refused.contains("web"), "{refused}");

    // The cluster, its nodes and their addresses.
    b.goto(&url("/"));
    let mut needles = vec!["web", "2x local.cpu", "on-demand", "UP"];
    for n in &nodes {
        needles.push(&n.id);
        needles.push(&n.ip);
    }
    b.wait_text(&needles, "the cluster and its nodes on the page");
    b.screenshot("clusters.png");

    // The jobs page, open before the job exists: the job appears without
    // a reload (a value set in the page survives).
    b.goto(&url("/jobs"));
    b.wait_text(&["No managed jobs"], "the empty jobs page");
    b.eval("window.gangwayTestMark = 42; return null;");
    launch_preempted_job(&home);
    let text = b.wait_text(
        &["<script>window.pwned=1</script>"],
        "the new job on the open page",
    );
    assert!(!text.contains("No managed jobs"), "{text}");
    assert_eq!(
        b.eval("return window.gangwayTestMark === 42;"),
        serde_json::json!(true),
        "the page was reloaded instead of updated"
    );

    // The job's page, following it live through the preemption to the end.
    b.goto(&url("/jobs/1"));
    let text = b.wait_text(
        &[
            "Preemption 1:",
            "was preempted",
            "Recovery 1: running again after",
            "Run 2 on",
            "SUCCEEDED",
            "all-done",
        ],
        "the job's preemption, recovery and end on its page",
    );
    assert!(text.contains("Run 1 on local/"), "{text}");
    assert!(
        text.contains("run 0 <img src=x onerror=window.pwned=2>"),
        "{text}"
    );
    let marks = b.eval("return document.querySelectorAll('svg.timeline line.preempt').length;");
    assert_eq!(
        marks,
        serde_json::json!(1),
        "one preemption on the timeline"
    );
    let bars = b.eval("return document.querySelectorAll('svg.timeline rect.st').length;");
    assert!(bars.as_u64().unwrap_or(0) >= 6, "{bars}");
    // Markup in names and logs stayed text: nothing ran, nothing was made.
    assert_eq!(
        b.eval("return [typeof window.pwned, document.querySelectorAll('main script, main img').length];"),
        serde_json::json!(["undefined", 0])
    );
    b.screenshot("job.png");

    b.goto(&url("/jobs"));
    b.wait_text(&["SUCCEEDED"], "the ended job in the list");
    b.screenshot("jobs.png");
    b.goto(&url("/cost"));
    let text = b.wait_text(&["Total $", "cluster web", "job 1"], "the cost chart");
    // The name as text (cut to fit the chart's labels).
    assert!(text.contains("job 1 (<script>window.pwned="), "{text}");
    let bars = b.eval("return document.querySelectorAll('svg.chart g.bar').length;");
    assert_eq!(
        bars,
        serde_json::json!(2),
        "a bar for the cluster and the job"
    );
    b.screenshot("cost.png");
    b.goto(&url("/events"));
    b.wait_text(&["PREEMPTED", "RECOVERING", "SUCCEEDED"], "the events page");
    b.screenshot("events.png");
    assert_eq!(
        b.eval("return typeof window.pwned;"),
        serde_json::json!("undefined")
    );

    let (code, out, err) = parts(&home.run(["down", "web", "-y"]));
    assert_eq!(code, 0, "{out}{err}");
}

/// With `jobs.controller` set, the managed jobs, their events, output and
/// costs on the pages are the controller host's, read over SSH as the
/// `jobs` commands read them.
#[test]
fn with_a_hosted_controller_the_pages_show_the_hosts_jobs() {
    use crate::hosted::{host, host_home, kill_home, use_host, HostGuard};
    let Some(sshd) = host() else { return };
    let _guard = HostGuard(host_home(&sshd));
    let laptop = TestHome::new();
    use_host(&laptop, &sshd);
    let task = laptop.file(
        "hosted.yaml",
        "name: \"<b>on the host</b>\"\nresources:\n  infra: local\nrun: |\n  echo hosted-line-1\n  echo '<i>hosted-line-2</i>'\n",
    );
    let (code, out, err) =
        parts(&laptop.run(["jobs", "launch", &task, "-y", "--env", &laptop.marker_env()]));
    assert_eq!(code, 0, "{out}{err}");
    let d = Dashboard::start(&laptop);
    let (code, page) = d.get("/jobs", "");
    assert_eq!(code, 200, "{page}");
    assert!(page.contains("read from the controller at"), "{page}");
    assert!(page.contains("&lt;b&gt;on the host&lt;/b&gt;"), "{page}");
    assert!(!page.contains("<b>on the host"), "{page}");
    let (code, job) = d.get("/jobs/1", "&part=main");
    assert_eq!(code, 200, "{job}");
    for needle in [
        "SUCCEEDED",
        "hosted-line-1",
        "&lt;i&gt;hosted-line-2&lt;/i&gt;",
        "Run 1 on local/",
    ] {
        assert!(job.contains(needle), "{needle} missing: {job}");
    }
    let (code, cost) = d.get("/cost", "&part=main");
    assert_eq!(code, 200, "{cost}");
    assert!(cost.contains("job 1 (&lt;b&gt;on the host"), "{cost}");
    let (code, events) = d.get("/events", "&part=main");
    assert_eq!(code, 200, "{events}");
    assert!(events.contains("each managed job"), "{events}");
    // This machine has no managed job of its own: the host's are the ones.
    assert!(!laptop.path().join("jobs/managed-1").exists());
    drop(d);
    kill_home(laptop.path());
}
