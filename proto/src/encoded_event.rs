//! A `CommittedEvent` already in its wire form: a control-plane node encodes each event
//! once and streams the same bytes to every subscriber, where it used to copy and encode
//! the event once per subscriber. Subscribers decode a plain `CommittedEvent`: the bytes
//! on the wire are the same.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

use crate::v1::CommittedEvent;

/// The encoding of one `CommittedEvent` (what [`Message::encode_to_vec`] gives), cheap to
/// clone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedEvent(Bytes);

impl EncodedEvent {
    /// Takes bytes that are the encoding of a `CommittedEvent`; what is not is sent as is,
    /// and a subscriber fails to decode it.
    pub fn from_encoded(bytes: Bytes) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &Bytes {
        &self.0
    }
}

impl From<&CommittedEvent> for EncodedEvent {
    fn from(event: &CommittedEvent) -> Self {
        Self(event.encode_to_vec().into())
    }
}

impl Message for EncodedEvent {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    /// Keeps each field as it came, so that decoding and encoding again gives the same
    /// bytes. (A node never decodes one; this is here for `Message` to be whole.)
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Appended in place: the bytes so far move into the vector without a copy.
        let mut all = Vec::from(std::mem::take(&mut self.0));
        encoding::encode_key(tag, wire_type, &mut all);
        match wire_type {
            WireType::Varint => {
                let mut value = 0;
                encoding::uint64::merge(wire_type, &mut value, buf, ctx)?;
                encoding::encode_varint(value, &mut all);
            }
            WireType::SixtyFourBit => {
                let mut value = 0;
                encoding::fixed64::merge(wire_type, &mut value, buf, ctx)?;
                all.put_u64_le(value);
            }
            WireType::ThirtyTwoBit => {
                let mut value = 0;
                encoding::fixed32::merge(wire_type, &mut value, buf, ctx)?;
                all.put_u32_le(value);
            }
            // Length-delimited; groups (unused by this schema) fail here with prost's error.
            _ => {
                let mut value = Vec::new();
                encoding::bytes::merge(wire_type, &mut value, buf, ctx)?;
                encoding::encode_varint(value.len() as u64, &mut all);
                all.extend_from_slice(&value);
            }
        }
        self.0 = all.into();
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = Bytes::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{AppliedCommand, CacheEntry, StoredEntry, applied_command};

    fn event() -> CommittedEvent {
        CommittedEvent {
            index: 42,
            applied: vec![AppliedCommand {
                kind: Some(applied_command::Kind::Inserted(StoredEntry {
                    id: 7,
                    entry: Some(CacheEntry {
                        text: Some("who wrote it".into()),
                        vector: vec![0.25, -1.5],
                        document_ids: vec![3, 9],
                        ..CacheEntry::default()
                    }),
                })),
                removed: vec![1, 2],
            }],
            state: None,
        }
    }

    #[test]
    fn it_goes_on_the_wire_as_the_event_it_encodes() {
        let event = event();
        let encoded = EncodedEvent::from(&event);
        let wire = encoded.encode_to_vec();
        assert_eq!(wire, event.encode_to_vec());
        assert_eq!(CommittedEvent::decode(wire.as_slice()).unwrap(), event);
    }

    #[test]
    fn decoding_keeps_every_field_as_it_came() {
        let mut wire = event().encode_to_vec();
        // A field this schema does not know (tag 15, fixed32) is kept too.
        encoding::fixed32::encode(15, &7, &mut wire);
        let decoded = EncodedEvent::decode(wire.as_slice()).unwrap();
        assert_eq!(decoded.as_bytes().as_ref(), wire.as_slice());
        let truncated = &wire[..wire.len() - 6];
        assert!(EncodedEvent::decode(truncated).is_err());
    }
}
