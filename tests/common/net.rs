//! Loopback networking shared by the tests and the benches: a free port and a plain-HTTP GET.
//! Standard library only, so that the benches can include this file with `#[path]`.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A loopback address whose port was free a moment ago. Another process may take it before
/// the caller binds it; a server started on it then exits saying so (the test server's
/// spawner starts it again on other ports).
pub fn try_free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// [`try_free_port`], for tests.
pub fn free_port() -> SocketAddr {
    try_free_port().expect("bind an ephemeral port on 127.0.0.1")
}

/// A plain HTTP/1.1 GET with `Connection: close`, each of connecting and reading within
/// its timeout: (status, body).
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    connect_timeout: Duration,
    read_timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, connect_timeout)?;
    stream.set_read_timeout(Some(read_timeout))?;
    stream.set_nodelay(true)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            let head: String = text.chars().take(32).collect();
            std::io::Error::other(format!("not an HTTP response: {head:?}"))
        })?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
