//! An in-memory network of nodes in one process, for unit tests of the node: messages go
//! straight into the receiving node's queue, and a node can be cut off from the others.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use raft::prelude::Message;
use tokio::sync::mpsc;

use super::Transport;
use crate::message::NodeRequest;

/// The nodes of one test, by id.
#[derive(Default)]
pub struct MemoryNetwork {
    nodes: Mutex<HashMap<u64, mpsc::Sender<NodeRequest>>>,
    isolated: Mutex<HashSet<u64>>,
}

impl MemoryNetwork {
    pub fn join(&self, id: u64, node: mpsc::Sender<NodeRequest>) {
        self.nodes.lock().insert(id, node);
    }

    /// Drops every message to or from `id` until [`Self::heal`].
    pub fn isolate(&self, id: u64) {
        self.isolated.lock().insert(id);
    }

    pub fn heal(&self, id: u64) {
        self.isolated.lock().remove(&id);
    }

    fn deliver(&self, from: u64, message: Message) {
        let to = message.to;
        {
            let isolated = self.isolated.lock();
            if isolated.contains(&from) || isolated.contains(&to) {
                return;
            }
        }
        if let Some(node) = self.nodes.lock().get(&to) {
            let _ = node.try_send(NodeRequest::Step(vec![message]));
        }
    }
}

/// One node's end of a [`MemoryNetwork`].
pub struct MemoryTransport {
    pub me: u64,
    pub network: Arc<MemoryNetwork>,
    pub addresses: HashMap<u64, String>,
}

impl Transport for MemoryTransport {
    fn add(&mut self, id: u64, address: String) {
        self.addresses.insert(id, address);
    }

    fn remove(&mut self, id: u64) {
        self.addresses.remove(&id);
    }

    fn address(&self, id: u64) -> Option<String> {
        self.addresses.get(&id).cloned()
    }

    fn send(&self, messages: Vec<Message>) {
        for message in messages {
            self.network.deliver(self.me, message);
        }
    }
}
