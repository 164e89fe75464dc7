//! Binding the TCP ports podmend serves (the webhook, the metrics and probe ports, the guard's
//! health port): an IPv6 address is bound dual-stack, so the default `[::]` takes connections
//! of both families on IPv4-only, dual-stack and IPv6-only clusters alike.
//!
//! Linux decides whether an IPv6 socket also takes IPv4 connections from the per-network-
//! namespace sysctl `net.ipv6.bindv6only` unless the socket says so itself: podmend turns
//! `IPV6_V6ONLY` off, so `[::]` stays dual-stack whatever the node sets. IPv6 turned off with
//! `net.ipv6.conf.*.disable_ipv6` still lets `[::]` bind and take IPv4 connections. A kernel
//! booted without IPv6 (`ipv6.disable=1`) refuses the address family itself: then
//! `[::]:PORT` falls back to `0.0.0.0:PORT`, with a warning. Any other address is bound as
//! given, and a failure is the caller's to report.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// The accept backlog: tokio's, which `TcpListener::bind` used before.
const BACKLOG: i32 = 1024;

/// Binds `address` for a tokio runtime (call it inside one): IPv6 dual-stack, `[::]` falling
/// back to `0.0.0.0` on a kernel without IPv6.
pub fn bind(address: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let listener = match bind_std(address) {
        Err(error) if falls_back(address, &error) => {
            let ipv4 = SocketAddr::from((Ipv4Addr::UNSPECIFIED, address.port()));
            tracing::warn!(
                "cannot listen on {address} ({error}): this kernel has no IPv6; listening on \
                 {ipv4}, IPv4 only"
            );
            bind_std(ipv4)?
        }
        other => other?,
    };
    tokio::net::TcpListener::from_std(listener)
}

/// Whether a failure to bind `address` is the kernel refusing IPv6 altogether, for the one
/// address that has an IPv4 equivalent meaning the same: every address.
fn falls_back(address: SocketAddr, error: &io::Error) -> bool {
    address.ip() == Ipv6Addr::UNSPECIFIED && error.raw_os_error() == Some(libc::EAFNOSUPPORT)
}

fn bind_std(address: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    if address.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    // As the standard library's bind does on Unix: a restarted server can bind the port while
    // the old connections are in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel booted with `ipv6.disable=1` cannot be made inside a test (a network
    /// namespace inherits the host's kernel), so its refusal is emulated by its errno here.
    #[test]
    fn only_the_ipv6_any_address_falls_back_and_only_when_the_kernel_has_no_ipv6() {
        let refused = io::Error::from_raw_os_error(libc::EAFNOSUPPORT);
        let any6: SocketAddr = "[::]:8443".parse().expect("address");
        assert!(falls_back(any6, &refused));
        let in_use = io::Error::from_raw_os_error(libc::EADDRINUSE);
        assert!(!falls_back(any6, &in_use));
        let loopback6: SocketAddr = "[::1]:8443".parse().expect("address");
        assert!(!falls_back(loopback6, &refused));
    }

    #[tokio::test]
    async fn the_ipv6_any_address_takes_ipv4_connections() {
        let listener = bind("[::]:0".parse().expect("address")).expect("bind [::]");
        let port = listener.local_addr().expect("local address").port();
        let client = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port));
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        connected.expect("IPv4 connect to [::]");
        let (_, peer) = accepted.expect("accept");
        assert_eq!(peer.ip().to_canonical(), Ipv4Addr::LOCALHOST);
    }
}
