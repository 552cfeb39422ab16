//! The soak's own control-plane clients: status, leader, snapshots, the committed stream.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use hasten_proto::control::{MAX_MESSAGE_BYTES, endpoint};
use hasten_proto::tls::MutualTls;
use hasten_proto::v1::control_plane_client::ControlPlaneClient;
use hasten_proto::v1::{
    NodeStatus, SnapshotRequest, StatusRequest, SubscribeRequest, applied_command,
};
use parking_lot::Mutex;
use tokio::time::Instant;

/// Longest the soak waits on one control-plane call of its own (connect, status, subscribe):
/// a frozen node accepts TCP connections and then answers nothing.
pub(crate) const RPC_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest the nodes may take, after the load, to agree on one applied index holding every
/// committed entry.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the control plane committed, as one subscriber saw it.
#[derive(Clone, Debug, Default)]
pub(crate) struct CommittedEntries {
    /// Inserted and not removed since.
    pub(crate) live: HashSet<u64>,
    pub(crate) inserted: usize,
    pub(crate) removed: usize,
    /// Times the stream restarted from a whole state (events compacted away).
    pub(crate) resyncs: usize,
    /// Index of the last event seen.
    pub(crate) last_index: u64,
}

async fn client_of(
    address: &str,
    tls: &MutualTls,
) -> Result<ControlPlaneClient<tonic::transport::Channel>> {
    let endpoint = endpoint(address, Some(tls))?;
    let channel = tokio::time::timeout(RPC_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| anyhow!("{address} did not answer within {RPC_TIMEOUT:?}"))??;
    Ok(ControlPlaneClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

pub(crate) async fn status_of(address: &str, tls: &MutualTls) -> Result<NodeStatus> {
    let mut client = client_of(address, tls).await?;
    let status = tokio::time::timeout(RPC_TIMEOUT, client.status(StatusRequest {}))
        .await
        .map_err(|_| anyhow!("{address} did not answer within {RPC_TIMEOUT:?}"))??;
    Ok(status.into_inner())
}

/// Follows the committed stream across node failures and hangs, resuming after the last
/// index seen (HTTP/2 keepalive ends a stream from a frozen node).
pub(crate) async fn follow_committed(
    addresses: Vec<String>,
    tls: MutualTls,
    committed: Arc<Mutex<CommittedEntries>>,
) {
    let mut next_index = 1;
    for address in addresses.iter().cycle() {
        let Ok(mut client) = client_of(address, &tls).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let request = SubscribeRequest {
            from_index: next_index,
            subscriber: "hasten-soak".into(),
        };
        let Ok(Ok(stream)) = tokio::time::timeout(RPC_TIMEOUT, client.subscribe(request)).await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        while let Ok(Some(event)) = stream.message().await {
            let mut seen = committed.lock();
            if let Some(state) = event.state {
                seen.resyncs += 1;
                seen.live = state.entries.iter().map(|e| e.id).collect();
            }
            for applied in event.applied {
                for id in applied.removed {
                    seen.removed += usize::from(seen.live.remove(&id));
                }
                if let Some(applied_command::Kind::Inserted(stored)) = applied.kind {
                    seen.inserted += 1;
                    seen.live.insert(stored.id);
                }
            }
            seen.last_index = event.index;
            next_index = event.index + 1;
        }
    }
}

/// The index (0-based) of the node that leads now.
pub(crate) async fn leader_of(addresses: &[String], tls: &MutualTls) -> Result<usize> {
    for _ in 0..50 {
        for (index, address) in addresses.iter().enumerate() {
            if let Ok(status) = status_of(address, tls).await
                && status.role == "leader"
            {
                return Ok(index);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("no control-plane leader")
}

pub(crate) async fn snapshot_of(
    address: &str,
    tls: &MutualTls,
) -> Result<hasten_proto::v1::ControlState> {
    let mut client = client_of(address, tls).await?;
    let snapshot = tokio::time::timeout(SETTLE_TIMEOUT, client.snapshot(SnapshotRequest {}))
        .await
        .map_err(|_| anyhow!("{address} sent no snapshot within {SETTLE_TIMEOUT:?}"))??;
    Ok(snapshot.into_inner())
}

/// Polls `address` until it has applied `index`; the seconds that took, or `None` after
/// [`SETTLE_TIMEOUT`].
pub(crate) async fn catch_up(address: String, tls: MutualTls, index: u64) -> Option<f64> {
    let started = Instant::now();
    while started.elapsed() < SETTLE_TIMEOUT {
        if let Ok(status) = status_of(&address, &tls).await
            && status.applied_index >= index
        {
            return Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
