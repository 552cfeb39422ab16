//! What the control plane decodes from peers and from its log, fed arbitrary bytes: the
//! peer envelope and the raft-rs messages in it (what decodes re-encodes to the same
//! message), and a log entry's command batch, checked as a proposal is and applied to a
//! state machine whose snapshot restores to the same state. Nothing may panic.
#![no_main]

use control_plane::state::{CacheStateMachine, validate};
use hasten_proto::v1::{CommandBatch, RaftMessages};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(envelope) = RaftMessages::decode(data) {
        for bytes in &envelope.messages {
            if let Ok(message) = Message::parse_from_bytes(bytes) {
                let encoded = message.write_to_bytes().expect("a parsed message encodes");
                let again = Message::parse_from_bytes(&encoded).expect("it parses back");
                assert_eq!(again, message);
            }
        }
    }
    if let Ok(batch) = CommandBatch::decode(data) {
        let _ = validate(&batch.commands);
        let mut machine = CacheStateMachine::default();
        machine.apply(1, 1, batch);
        let restored = CacheStateMachine::from_state(machine.to_state());
        assert_eq!(restored.to_state(), machine.to_state());
    }
});
