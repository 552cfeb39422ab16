//! The protobuf codec of every Hasten gRPC service: prost's encoder, and a decoder that
//! answers a message which does not decode as the sender's mistake (INVALID_ARGUMENT)
//! rather than prost's INTERNAL, which tells a client to look for a bug on the server.

use display_full_error::DisplayFullErrorExt;
use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// [`tonic_prost::ProstCodec`] with [`StrictDecoder`]; `build.rs` names it for every
/// generated service.
#[derive(Debug, Clone)]
pub struct ProtoCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(PhantomData)
    }
}

/// Decodes a protobuf message; one that does not decode is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct StrictDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|err| {
            Status::invalid_argument(format!(
                "the message is not valid protobuf: {}",
                err.display_full()
            ))
        })
    }
}
