//! A control-plane group of real `control-plane` processes on loopback, founded together,
//! for evaluations, benchmarks and tests.

use std::path::Path;
use std::time::Duration;

use crate::process::{ManagedProcess, ProcessError, binary};

/// A node opens sled and binds its port in well under a second; this leaves room for a
/// loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A loopback port free at the time of asking (Raft peers must know each other's ports
/// before any node starts, so port 0 cannot be used).
pub fn free_loopback_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
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
