//! Hasten's control plane: a Raft group (raft-rs, sled) that replicates the hot cache, the
//! shard map and runtime configuration to every edge.

pub mod config;
pub mod join;
pub mod message;
pub mod metrics;
pub mod node;
pub mod service;
pub mod state;
pub mod storage;
pub mod transport;
