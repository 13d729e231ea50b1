//! Ports for tests that need one nothing listens on.

use std::net::SocketAddr;

use socket2::{Domain, Socket, Type};

/// A port on 127.0.0.1 that refuses connections for as long as this value
/// lives: bound without `listen` (and without `SO_REUSEADDR`), so the
/// kernel hands it to nobody else meanwhile. Binding a listener and letting
/// it go races: a parallel test can be given the same port and bring a
/// "down" address up.
pub struct ClosedPort {
    _socket: Socket,
    /// The port.
    pub port: u16,
}

impl ClosedPort {
    /// Holds a fresh port closed.
    pub fn hold() -> ClosedPort {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a TCP socket");
        let any: SocketAddr = "127.0.0.1:0".parse().expect("an address");
        socket.bind(&any.into()).expect("bind 127.0.0.1:0");
        let port = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .expect("a bound port");
        ClosedPort {
            _socket: socket,
            port,
        }
    }
}

/// A port on 127.0.0.1 that answers every connection as an SSH server
/// first does (its identification line, then nothing more) for as long as
/// this value lives: what a pool's reachability probe asks of a host,
/// without an sshd.
pub struct SshGreeter {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    serving: Option<std::thread::JoinHandle<()>>,
    /// The port.
    pub port: u16,
}

impl SshGreeter {
    /// Starts greeting on a fresh port.
    pub fn start() -> SshGreeter {
        use std::io::Write;
        use std::sync::atomic::{AtomicBool, Ordering};
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("a bound port").port();
        l.set_nonblocking(true).expect("a non-blocking listener");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let serving = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.write_all(b"SSH-2.0-gangway-test\r\n");
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
        });
        SshGreeter {
            stop,
            serving: Some(serving),
            port,
        }
    }
}

impl Drop for SshGreeter {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.serving.take() {
            let _ = t.join();
        }
    }
}
