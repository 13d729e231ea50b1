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
