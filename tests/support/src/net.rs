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
