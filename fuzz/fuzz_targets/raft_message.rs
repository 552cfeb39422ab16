//! What the control plane decodes from peers and from its log, fed arbitrary bytes: the
//! peer envelope and the raft-rs messages in it (what decodes survives a re-encoding), and a log entry's command batch, checked as a proposal is and applied to a
//! state machine whose snapshot restores to the same state. Nothing may panic.
#![no_main]

use hasten_control_plane::state::{CacheStateMachine, validate};
use hasten_proto::v1::{CommandBatch, RaftMessages};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(envelope) = RaftMessages::decode(data) {
        for bytes in &envelope.messages {
            if let Ok(message) = Message::parse_from_bytes(bytes) {
                // What a node steps on survives a re-encoding. Compared field by field:
                // rust-protobuf keeps unknown fields in a hash map, so neither its equality
                // nor its bytes are stable across a round trip.
                let encoded = message.write_to_bytes().expect("a parsed message encodes");
                let again = Message::parse_from_bytes(&encoded).expect("it parses back");
                assert_eq!(what_raft_reads(&again), what_raft_reads(&message));
            }
        }
    }
    if let Ok(batch) = CommandBatch::decode(data) {
        let _ = validate(&batch.commands);
        let mut machine = CacheStateMachine::default();
        machine.apply(1, 1, batch);
        // Compared as bytes: a NaN in a cached vector is not equal to itself.
        let state = machine.to_state().encode_to_vec();
        let restored = CacheStateMachine::from_state(machine.to_state());
        assert_eq!(restored.to_state().encode_to_vec(), state);
    }
});

/// The fields raft-rs acts on, with each entry's index, term, type and payload.
fn what_raft_reads(m: &Message) -> impl PartialEq + std::fmt::Debug {
    let entries: Vec<_> = m
        .get_entries()
        .iter()
        .map(|e| (e.index, e.term, e.get_entry_type(), e.data.to_vec(), e.context.to_vec()))
        .collect();
    let snapshot = m.get_snapshot().get_metadata();
    (
        (m.get_msg_type(), m.to, m.from, m.term, m.log_term, m.index),
        (m.commit, m.reject, m.reject_hint, m.request_snapshot, m.priority),
        entries,
        (snapshot.index, snapshot.term, m.get_snapshot().data.to_vec()),
    )
}
