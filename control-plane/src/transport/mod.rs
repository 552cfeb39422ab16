//! How a Raft node reaches its peers: the [`Transport`] the node sends through, gRPC for
//! real deployments ([`grpc`]), and an in-memory network for unit tests of the node.

pub mod grpc;
#[cfg(test)]
pub mod memory;

use raft::prelude::Message;

/// Outbound Raft traffic of one node. The node calls it from its own thread and never
/// waits on it: Raft tolerates lost messages (it retransmits), so an implementation drops
/// what it cannot take and reports the peer unreachable.
pub trait Transport: Send + 'static {
    /// Starts talking to peer `id` at `address` (or moves it there).
    fn add(&mut self, id: u64, address: String);
    fn remove(&mut self, id: u64);
    /// The address peer `id` is reached at.
    fn address(&self, id: u64) -> Option<String>;
    fn send(&self, messages: Vec<Message>);
}
