//! `gangway dashboard`: the clusters, managed jobs, costs and events of
//! this `$GANGWAY_HOME` as web pages, served by gangway itself on
//! 127.0.0.1 only. Every request must carry the token printed with the
//! URL (32 bytes from the OS's random source), so other users of the
//! machine, and pages in the browser from other sites, read nothing.
//!
//! It reads what the commands read, through the same functions: the state
//! store for clusters (`status`), managed jobs (`jobs queue`, `jobs
//! events`, `jobs logs`), the ledger (`cost-report`); with a hosted
//! controller (`jobs.controller`), the managed jobs come from the host
//! over SSH as the CLI's do. It changes nothing.

pub(crate) mod http;
mod model;
mod render;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::core::state::Store;
use crate::Error;

use self::http::{Refused, Request, Response};
use self::model::Source;

/// How many connections are answered at once; more wait for a slot.
const MAX_CONNECTIONS: usize = 32;

/// A dashboard bound to its port, not yet serving.
pub(crate) struct Bound {
    listener: std::net::TcpListener,
    dashboard: Arc<Dashboard>,
}

/// What every request is checked against and read from.
struct Dashboard {
    home: PathBuf,
    token: String,
    port: u16,
}

/// A new token: 32 bytes from the operating system's random source, hex.
fn new_token() -> std::io::Result<String> {
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    Ok(random.iter().map(|b| format!("{b:02x}")).collect())
}

/// Binds 127.0.0.1:`port` (0: a free port) for the dashboard of `home`.
pub(crate) fn bind(home: &Path, port: u16) -> Result<Bound, Error> {
    // The store must open (and its schema be current) before a page asks.
    Store::open(home)?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
        Error::usage(
            format!("cannot listen on 127.0.0.1:{port}: {e}"),
            Some("pick another port with --port, or --port 0 for any free one"),
        )
    })?;
    let port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    Ok(Bound {
        listener,
        dashboard: Arc::new(Dashboard {
            home: home.to_path_buf(),
            token: new_token()?,
            port,
        }),
    })
}

impl Bound {
    /// The address to open, token included.
    pub(crate) fn url(&self) -> String {
        format!(
            "http://127.0.0.1:{}/?t={}",
            self.dashboard.port, self.dashboard.token
        )
    }

    /// Answers requests until the future is dropped.
    pub(crate) async fn serve(self) -> Result<(), Error> {
        let listener = tokio::net::TcpListener::from_std(self.listener)?;
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                // Out of descriptors, a connection reset before accept:
                // the next one may do better.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                return Ok(());
            };
            let d = Arc::clone(&self.dashboard);
            tasks.spawn(async move {
                answer(d, stream).await;
                drop(slot);
            });
            while tasks.try_join_next().is_some() {}
        }
    }
}

async fn answer(d: Arc<Dashboard>, mut stream: TcpStream) {
    let request = match http::read_head(&mut stream).await {
        Ok(head) => http::parse(&head),
        Err(e) => Err(e),
    };
    let (response, head_only) = match request {
        Ok(req) => {
            let head_only = req.head_only;
            let r = tokio::task::spawn_blocking(move || route(&d, &req))
                .await
                .unwrap_or_else(|_| Response::text(500, "the page could not be made"));
            (r, head_only)
        }
        Err(Refused::Method) => (Response::text(405, "only GET and HEAD"), false),
        Err(Refused::TooLarge) => (Response::text(431, "request headers too large"), false),
        Err(Refused::BadRequest) => (Response::text(400, "not an HTTP/1.1 request"), false),
    };
    http::send(&mut stream, &response, head_only).await;
}

/// Answers one request (blocking: it reads the store, perhaps the hosted
/// controller over SSH).
fn route(d: &Dashboard, req: &Request) -> Response {
    // A page from another site that points a name of its own at
    // 127.0.0.1 (DNS rebinding) sends its own Host.
    let host_ok = req.host.as_deref().is_some_and(|h| {
        h == format!("127.0.0.1:{}", d.port) || h == format!("localhost:{}", d.port)
    });
    if !host_ok {
        return Response::text(403, "forbidden: this dashboard answers 127.0.0.1 only");
    }
    if !req.param("t").is_some_and(|t| http::same(t, &d.token)) {
        return Response::text(
            403,
            "forbidden: open the address `gangway dashboard` printed (it carries the token)",
        );
    }
    let fragment = req.param("part") == Some("main");
    let page = match req.path.as_str() {
        "/static/app.js" => {
            return Response {
                status: 200,
                content_type: "text/javascript; charset=utf-8",
                body: include_str!("assets/app.js").as_bytes().to_vec(),
            }
        }
        "/static/style.css" => {
            return Response {
                status: 200,
                content_type: "text/css; charset=utf-8",
                body: include_str!("assets/style.css").as_bytes().to_vec(),
            }
        }
        "/" => render::Page::Clusters,
        "/jobs" => render::Page::Jobs,
        "/cost" => render::Page::Cost,
        "/events" => render::Page::Events,
        p => match p
            .strip_prefix("/jobs/")
            .and_then(|id| id.parse::<i64>().ok())
        {
            Some(id) => render::Page::Job(id),
            None => return Response::text(404, "no such page"),
        },
    };
    match page_html(d, page, fragment) {
        Ok((status, html)) => Response::html(status, html),
        Err(e) => {
            let main = render::error_main(&e.to_string());
            let html = if fragment {
                main
            } else {
                render::document(page, &d.token, &main)
            };
            Response::html(500, html)
        }
    }
}

/// A page's HTML (or only its `<main>`'s inside, for the live update).
fn page_html(d: &Dashboard, page: render::Page, fragment: bool) -> Result<(u16, String), Error> {
    let store = Store::open(&d.home)?;
    let source = Source::new(&d.home, &store)?;
    let (status, main) = render::main(&source, page, &d.token)?;
    let html = if fragment {
        main
    } else {
        render::document(page, &d.token, &main)
    };
    Ok((status, html))
}
