//! Reachability: whether a host's SSH port answers as an SSH server does,
//! with its `SSH-` identification line, both for the hosts a launch may
//! take and for those a cluster holds (`describe`). A TCP connection alone
//! is no proof: where a network sends unknown destinations to a proxy, a
//! dead host's address still "accepts" (seen with a namespaced node whose
//! link was cut: a replacement took that very host back), and a hung sshd
//! accepts without ever speaking.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::Host;

/// How long a host has to answer (an sshd forks before it speaks: a
/// loaded machine needs more than a bare accept does).
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);
/// Most probes run at once.
const PARALLEL: usize = 32;

/// Probes every host (in parallel, at most [`PARALLEL`] at a time); the
/// answers come in the hosts' order.
pub(crate) fn reachable(hosts: &[&Host]) -> Vec<bool> {
    let mut out = Vec::with_capacity(hosts.len());
    for chunk in hosts.chunks(PARALLEL) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|h| {
                    let h: &Host = h;
                    std::thread::Builder::new()
                        .name("gangway-ssh-probe".into())
                        .spawn_scoped(s, move || probe(h))
                })
                .collect();
            for (h, handle) in chunk.iter().zip(handles) {
                // No thread to spare: probe on this one.
                let ok = match handle {
                    Ok(j) => j.join().unwrap_or(false),
                    Err(_) => probe(h),
                };
                out.push(ok);
            }
        });
    }
    out
}

/// Whether one host can be reached. A host behind a `ProxyJump` is reached
/// through its first hop, so that hop is probed instead (its address is
/// usually private); a first hop whose name does not resolve here (an
/// alias from the SSH configuration, say) is left for SSH to judge.
pub(crate) fn probe(h: &Host) -> bool {
    match h.jump.as_deref().and_then(first_hop) {
        Some((host, port)) => match resolve(&host, port) {
            Some(addrs) => answers(&addrs),
            None => true,
        },
        None => resolve(&h.address, h.port).is_some_and(|a| answers(&a)),
    }
}

/// `host:port` as socket addresses; `None` when the name does not resolve.
fn resolve(host: &str, port: u16) -> Option<Vec<SocketAddr>> {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().ok()?.collect();
    (!addrs.is_empty()).then_some(addrs)
}

/// Whether any of the addresses accepts a connection and sends an SSH
/// identification line (`SSH-...`, RFC 4253 4.2; lines before it allowed)
/// before [`TIMEOUT`] (for all of them together) runs out.
fn answers(addrs: &[SocketAddr]) -> bool {
    let deadline = Instant::now() + TIMEOUT;
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        if let Ok(s) = TcpStream::connect_timeout(a, left) {
            if speaks_ssh(s, deadline) {
                return true;
            }
        }
    }
    false
}

/// Whether the server on `s` sends an SSH identification line before
/// `deadline`.
fn speaks_ssh(mut s: TcpStream, deadline: Instant) -> bool {
    use std::io::Read;
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    // The line is at most 255 bytes; a few lines may come before it.
    while seen.len() < 4096 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        if seen.starts_with(b"SSH-") || seen.windows(5).any(|w| w == b"\nSSH-") {
            return true;
        }
    }
    false
}

/// The host and port of the first hop of a `ProxyJump` value
/// (`[user@]host[:port]`, `ssh://[user@]host[:port]`, `[v6]:port`,
/// comma-separated hops); `None` for `none` or an empty value.
pub(crate) fn first_hop(jump: &str) -> Option<(String, u16)> {
    let hop = jump.split(',').next()?.trim();
    let hop = hop.strip_prefix("ssh://").unwrap_or(hop);
    let hop = hop.rsplit_once('@').map_or(hop, |(_, h)| h);
    if hop.is_empty() || hop.eq_ignore_ascii_case("none") {
        return None;
    }
    if let Some(rest) = hop.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => 22,
        };
        return Some((host.to_string(), port));
    }
    match hop.split_once(':') {
        Some((host, port)) if !port.contains(':') => Some((host.to_string(), port.parse().ok()?)),
        // A bare IPv6 address.
        Some(_) => Some((hop.to_string(), 22)),
        None => Some((hop.to_string(), 22)),
    }
}
