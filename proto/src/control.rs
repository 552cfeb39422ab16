//! Connection settings shared by every client and server of the control plane.

use std::time::Duration;

use tonic::transport::Endpoint;

/// Largest gRPC message to or from a control-plane node: a snapshot of a full cache (5,000
/// entries with their documents and vectors) is tens of megabytes.
pub const MAX_MESSAGE_BYTES: usize = 512 * 1024 * 1024;

/// How long connecting to a node may take before the caller tries another.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The gRPC endpoint of the control-plane node at `address` (host:port).
pub fn endpoint(address: &str) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true))
}
