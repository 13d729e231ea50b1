//! The dashboard's HTTP/1.1: one `GET` (or `HEAD`) per connection, read
//! with hard limits (header size, time), answered and closed. Enough for a
//! browser on the same machine; nothing here trusts the request.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most a request's line and headers may take.
pub(crate) const MAX_HEAD: usize = 16 * 1024;

/// How long a client may take to send its request.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to read the answer.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// A request, as far as the dashboard reads one.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// `GET` or `HEAD`.
    pub(crate) head_only: bool,
    /// The path, without the query (not decoded).
    pub(crate) path: String,
    /// The query's `key=value` pairs (not decoded).
    pub(crate) query: Vec<(String, String)>,
    /// The `Host` header, if any.
    pub(crate) host: Option<String>,
}

impl Request {
    /// The first value of query parameter `key`.
    pub(crate) fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request is refused before it is routed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not HTTP/1.x, or not readable.
    BadRequest,
    /// A method other than GET or HEAD.
    Method,
    /// Headers past [`MAX_HEAD`].
    TooLarge,
}

/// Parses a request's head (everything before the blank line).
pub(crate) fn parse(head: &[u8]) -> Result<Request, Refused> {
    let text = std::str::from_utf8(head).map_err(|_| Refused::BadRequest)?;
    let mut lines = text.split("\r\n");
    let first = lines.next().ok_or(Refused::BadRequest)?;
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refused::BadRequest);
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Err(Refused::BadRequest);
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Err(Refused::Method),
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    let mut host = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            if line.is_empty() {
                continue;
            }
            return Err(Refused::BadRequest);
        };
        if name.eq_ignore_ascii_case("host") {
            host = Some(value.trim().to_string());
        }
    }
    Ok(Request {
        head_only,
        path: path.to_string(),
        query,
        host,
    })
}

/// Reads a request's head from `stream`: up to the blank line, at most
/// [`MAX_HEAD`] bytes, within [`READ_TIMEOUT`]. A body is never read (GET
/// has none; the connection closes after the answer).
pub(crate) async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, Refused> {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        let mut chunk = [0u8; 2048];
        loop {
            let n = stream
                .read(&mut chunk)
                .await
                .map_err(|_| Refused::BadRequest)?;
            if n == 0 {
                return Err(Refused::BadRequest);
            }
            let from = buf.len().saturating_sub(3);
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = find_blank_line(&buf[from..]) {
                buf.truncate(from + end);
                return Ok(());
            }
            if buf.len() > MAX_HEAD {
                return Err(Refused::TooLarge);
            }
        }
    };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(())) => Ok(buf),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Refused::BadRequest),
    }
}

fn find_blank_line(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n")
}

/// An answer.
pub(crate) struct Response {
    /// Status code.
    pub(crate) status: u16,
    /// `Content-Type`.
    pub(crate) content_type: &'static str,
    /// The body.
    pub(crate) body: Vec<u8>,
}

impl Response {
    /// An HTML page or fragment.
    pub(crate) fn html(status: u16, body: String) -> Response {
        Response {
            status,
            content_type: "text/html; charset=utf-8",
            body: body.into_bytes(),
        }
    }

    /// Plain text.
    pub(crate) fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// The whole answer on the wire. Every answer forbids caching, sniffing,
/// framing, referrers and anything not from the dashboard itself; there is
/// no CORS header, so other origins cannot read it.
pub(crate) fn encode(r: &Response, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n\
         Content-Type: {}\r\n\
         Content-Length: {}\r\n\
         Cache-Control: no-store\r\n\
         X-Content-Type-Options: nosniff\r\n\
         Referrer-Policy: no-referrer\r\n\
         X-Frame-Options: DENY\r\n\
         Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; \
         img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'\r\n\
         Connection: close\r\n\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(&r.body);
    }
    out
}

/// Writes `r` and closes the connection's sending side.
pub(crate) async fn send(stream: &mut TcpStream, r: &Response, head_only: bool) {
    let bytes = encode(r, head_only);
    let write = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(WRITE_TIMEOUT, write).await;
}

/// Whether two strings are equal, in time that does not depend on where
/// they first differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_browsers_get() {
        let r =
            parse(b"GET /jobs/3?t=abc&part=main HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: */*")
                .unwrap();
        assert_eq!(r.path, "/jobs/3");
        assert_eq!(r.param("t"), Some("abc"));
        assert_eq!(r.param("part"), Some("main"));
        assert_eq!(r.param("x"), None);
        assert_eq!(r.host.as_deref(), Some("127.0.0.1:8080"));
        assert!(!r.head_only);
    }

    #[test]
    fn refuses_what_is_not_a_get() {
        assert_eq!(parse(b"POST / HTTP/1.1\r\nHost: x"), Err(Refused::Method));
        assert_eq!(parse(b"GET /\r\n"), Err(Refused::BadRequest));
        assert_eq!(
            parse(b"GET http://evil/ HTTP/1.1"),
            Err(Refused::BadRequest)
        );
        assert_eq!(parse(b"GET / SSH-2.0"), Err(Refused::BadRequest));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nno colon"),
            Err(Refused::BadRequest)
        );
        assert_eq!(parse(&[0xff, 0xfe]), Err(Refused::BadRequest));
    }

    #[test]
    fn compares_tokens_whole() {
        assert!(same("abcd", "abcd"));
        assert!(!same("abcd", "abce"));
        assert!(!same("abc", "abcd"));
        assert!(!same("", "a"));
    }

    #[test]
    fn answers_carry_the_protective_headers() {
        let wire = String::from_utf8(encode(&Response::text(403, "no"), false)).unwrap();
        assert!(wire.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{wire}");
        for h in [
            "Content-Length: 2",
            "Cache-Control: no-store",
            "Referrer-Policy: no-referrer",
            "script-src 'self'",
            "Connection: close",
        ] {
            assert!(wire.contains(h), "{h} missing: {wire}");
        }
        assert!(!wire.contains("Access-Control"), "{wire}");
        assert!(wire.ends_with("\r\n\r\nno"));
        let head = String::from_utf8(encode(&Response::text(200, "body"), true)).unwrap();
        assert!(head.ends_with("\r\n\r\n"), "{head}");
    }
}
