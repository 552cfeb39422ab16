//! Hasten's cloud tier: exact inner-product search over a corpus (faiss flat index),
//! partitioned into shards with replicas behind a router, served to edges over QUIC and to
//! everyone else over gRPC.
//!
//! - [`searcher`]: a shard server's exact search over its bundle, with [`batcher`]
//!   coalescing concurrent searches into one faiss call; [`documents`]: documents by id,
//!   for edges that hold a fraction of the corpus;
//! - [`router`]: scatter-gather over one live replica of every shard, merge by score,
//!   failover within the request's deadline ([`shard_call`]: what one attempt is); [`replica`] keeps one replica's client and
//!   health, [`replica_set`] those of the whole shard map and their checks, [`shard_map`]
//!   which replicas serve which shard, followed from the control plane when there is one;
//! - [`response_limit`]: the largest answer either kind of server builds, checked before
//!   any work;
//! - [`quic`] and [`grpc`]: the two front ends, written once over [`SearchBackend`];
//!   [`metrics`]: what both kinds of server report to Prometheus; [`dev_cert`]: the
//!   self-signed certificate a server without one generates and keeps across restarts;
//!   [`download`]: corpus sources given to `cloud-index build` as URLs.

pub mod backend;
pub mod batcher;
pub mod config;
pub mod dev_cert;
pub mod documents;
pub mod download;
pub mod error;
pub mod grpc;
pub mod metrics;
pub mod quic;
pub mod replica;
pub mod replica_set;
pub mod response_limit;
pub mod router;
pub mod searcher;
pub mod shard_call;
pub mod shard_map;

pub use backend::SearchBackend;
pub use error::SearchError;
pub use searcher::{ExactSearcher, ShardService};
