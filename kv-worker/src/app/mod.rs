//! What `kv-worker` runs: the server assembled from its configuration, and the offline
//! commands over a store; `main.rs` is the command line over them.

mod model;
pub(crate) mod serve;
pub(crate) mod store;
