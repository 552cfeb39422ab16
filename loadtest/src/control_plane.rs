//! A control-plane group of real `control-plane` processes on loopback, founded together,
//! for evaluations, benchmarks and tests.

use std::path::Path;
use std::time::Duration;

use hasten_eval::process::{ManagedProcess, ProcessError, binary};

/// A node opens sled and binds its port in well under a second; this leaves room for a
/// loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A loopback port free for both TCP and UDP at the time of asking, for a process whose
/// address others must know before it starts (Raft peers), or that must come back on it
/// after a restart, so port 0 cannot be used.
///
/// It is drawn from below the kernel's ephemeral range: a port from that range (what binding
/// port 0 hands out) can be taken between this call and the node's bind as the source port
/// of any outgoing connection on the machine, such as a peer dialling the node that is still
/// starting, and the node then fails to start with "address in use".
pub fn free_loopback_port() -> std::io::Result<u16> {
    let below = ephemeral_range_start();
    if below < LOWEST_PORT + MIN_PORTS {
        // The ephemeral range covers (nearly) every port: the kernel's pick is as good.
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port());
    }
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..PORT_TRIES {
        let port = rand::random_range(LOWEST_PORT..below);
        if handed_out.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            handed_out.insert(port);
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        format!("no free loopback port in {LOWEST_PORT}..{below} after {PORT_TRIES} tries"),
    ))
}

/// Above the ports that well-known services listen on.
const LOWEST_PORT: u16 = 10_000;
const PORT_TRIES: usize = 200;
/// Fewer ports than this below the ephemeral range and draws would collide too often.
const MIN_PORTS: u16 = 1_024;

/// Ports this process has handed out: two draws must not name one port before either is
/// bound (tests in one binary run in parallel).
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// The first port of Linux's ephemeral range, or Linux's default start where it cannot be read.
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// `control-plane` flags for node `id` of the group whose node `i + 1` listens on
/// `addresses[i]`; metrics on any loopback port.
pub fn node_args(id: u64, addresses: &[String], data_dir: &Path) -> Vec<String> {
    let mut args = vec![
        "--id".to_string(),
        id.to_string(),
        "--listen".into(),
        addresses
            .get(id.saturating_sub(1) as usize)
            .cloned()
            .unwrap_or_default(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
    ];
    for (i, address) in addresses.iter().enumerate() {
        args.push("--peer".into());
        args.push(format!("{}={address}", i + 1));
    }
    args
}

/// Starts nodes 1..=`size` with empty data directories `<work>/<prefix>-<id>`; returns the
/// processes and their addresses, node 1 first.
pub fn start_group(
    work: &Path,
    prefix: &str,
    size: u64,
) -> Result<(Vec<ManagedProcess>, Vec<String>), ProcessError> {
    let io_error = |source| ProcessError::Spawn {
        name: prefix.to_string(),
        source,
    };
    let addresses = (0..size)
        .map(|_| free_loopback_port().map(|port| format!("127.0.0.1:{port}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_error)?;
    let mut nodes = Vec::new();
    for id in 1..=size {
        let name = format!("{prefix}-{id}");
        let data = work.join(&name);
        match std::fs::remove_dir_all(&data) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(io_error(err)),
            _ => {}
        }
        nodes.push(ManagedProcess::start(
            &name,
            &binary("control-plane")?,
            node_args(id, &addresses, &data),
            work,
            START_TIMEOUT,
        )?);
    }
    Ok((nodes, addresses))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_lie_below_the_ephemeral_range_and_are_not_handed_out_twice() {
        let below = ephemeral_range_start();
        let ports: Vec<u16> = (0..64).map(|_| free_loopback_port().unwrap()).collect();
        for port in &ports {
            if below >= LOWEST_PORT + MIN_PORTS {
                assert!(
                    (LOWEST_PORT..below).contains(port),
                    "port {port} is outside {LOWEST_PORT}..{below}"
                );
            }
            std::net::TcpListener::bind(("127.0.0.1", *port)).unwrap();
            std::net::UdpSocket::bind(("127.0.0.1", *port)).unwrap();
        }
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
    }
}
