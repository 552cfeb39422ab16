//! The servers `cloud-index` runs, each assembled from its configuration; `main.rs` is the
//! command line over them.

pub(crate) mod build;
mod listeners;
pub(crate) mod router;
pub(crate) mod shard;
