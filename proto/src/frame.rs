//! Length-prefixed protobuf frames: a 4-byte big-endian length, then the encoded message.
//!
//! One QUIC bidirectional stream carries exactly one request frame and one response frame,
//! so a frame never needs a type tag beyond the `oneof` inside the message.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame accepted by default: a batch of 256 queries with k = 100 and vectors
/// (256 x 100 x 384 x 4 bytes ~ 39 MB) is the largest legitimate message; 64 MiB leaves
/// room for texts while refusing a corrupt or hostile length before allocating it. The
/// cloud's gRPC messages have the same limit, and a cloud server refuses a search whose
/// answer could exceed it before searching (`hasten_cloud_index::response_limit`).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// Bytes of the length prefix.
const PREFIX_BYTES: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: usize, max: usize },
    #[error("frame truncated: expected {expected} bytes, got {got}")]
    Truncated { expected: usize, got: usize },
    #[error("undecodable frame")]
    Decode(#[from] prost::DecodeError),
    #[error("stream i/o")]
    Io(#[from] std::io::Error),
}

/// Encodes `message` with its length prefix.
pub fn encode_frame<M: Message>(message: &M) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX_BYTES + len);
    // A prost message larger than 4 GiB cannot be built from our inputs (bounded request
    // sizes), so the cast cannot truncate in practice; `decode_frame` rejects it anyway.
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    message.encode_raw(&mut buf);
    buf.freeze()
}

/// Decodes one complete frame from `buf`, which must hold exactly one frame.
pub fn decode_frame<M: Message + Default>(buf: &[u8], max_bytes: usize) -> Result<M, FrameError> {
    let (prefix, body) = match buf.split_first_chunk::<PREFIX_BYTES>() {
        Some(split) => split,
        None => {
            return Err(FrameError::Truncated {
                expected: PREFIX_BYTES,
                got: buf.len(),
            });
        }
    };
    let len = u32::from_be_bytes(*prefix) as usize;
    if len > max_bytes {
        return Err(FrameError::TooLarge {
            len,
            max: max_bytes,
        });
    }
    if body.len() != len {
        return Err(FrameError::Truncated {
            expected: len,
            got: body.len(),
        });
    }
    Ok(M::decode(body)?)
}

/// Writes one frame to `writer`.
pub async fn write_frame<W, M>(writer: &mut W, message: &M) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    M: Message,
{
    writer.write_all(&encode_frame(message)).await?;
    Ok(())
}

/// Reads one frame from `reader`, refusing lengths above `max_bytes` before allocating.
pub async fn read_frame<R, M>(reader: &mut R, max_bytes: usize) -> Result<M, FrameError>
where
    R: AsyncRead + Unpin,
    M: Message + Default,
{
    let mut prefix = [0u8; PREFIX_BYTES];
    reader.read_exact(&mut prefix).await?;
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max_bytes {
        return Err(FrameError::TooLarge {
            len,
            max: max_bytes,
        });
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Truncated {
                expected: len,
                got: 0,
            }
        } else {
            FrameError::Io(e)
        }
    })?;
    Ok(M::decode(body.as_slice())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{QueryVector, SearchRequest};

    fn sample() -> SearchRequest {
        SearchRequest {
            queries: vec![QueryVector {
                values: vec![0.25, -1.5, 3.0],
            }],
            k: 7,
            include_vectors: true,
            include_texts: false,
            timeout_ms: 250,
            allow_partial: true,
        }
    }

    #[test]
    fn frame_round_trips() {
        let frame = encode_frame(&sample());
        let decoded: SearchRequest = decode_frame(&frame, DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(decoded, sample());
    }

    /// Found by the `quic_frame` fuzz target (a false alarm of its first version, which
    /// compared messages): a search whose query holds a NaN, which is not equal to itself.
    /// Decoded and re-encoded, the frame is stable byte for byte.
    #[test]
    fn a_nan_query_survives_the_frame_round_trip_byte_for_byte() {
        let found: [u8; 17] = [
            0x00, 0x00, 0x00, 0x0d, 0x0a, 0x0b, 0x0a, 0x09, 0x0d, 0xff, 0xff, 0xff, 0xff, 0x10,
            0x80, 0x80, 0x44,
        ];
        let request: crate::v1::QuicRequest =
            decode_frame(&found, DEFAULT_MAX_FRAME_BYTES).unwrap();
        // The input is not canonical (an unpacked float, an unknown field), so compare the
        // canonical re-encoding with its own round trip.
        let canonical = encode_frame(&request);
        let again: crate::v1::QuicRequest =
            decode_frame(&canonical, DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(encode_frame(&again), canonical);
        let Some(crate::v1::quic_request::Body::Search(search)) = request.body else {
            panic!("not a search: {request:?}");
        };
        assert!(search.queries[0].values[0].is_nan());
    }

    #[test]
    fn oversized_length_is_refused_before_reading_the_body() {
        let frame = encode_frame(&sample());
        let err = decode_frame::<SearchRequest>(&frame, 3).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { max: 3, .. }), "{err}");
    }

    #[test]
    fn truncated_and_trailing_bytes_are_refused() {
        let frame = encode_frame(&sample());
        let short = &frame[..frame.len() - 1];
        assert!(matches!(
            decode_frame::<SearchRequest>(short, DEFAULT_MAX_FRAME_BYTES),
            Err(FrameError::Truncated { .. })
        ));
        let mut long = frame.to_vec();
        long.push(0);
        assert!(matches!(
            decode_frame::<SearchRequest>(&long, DEFAULT_MAX_FRAME_BYTES),
            Err(FrameError::Truncated { .. })
        ));
        assert!(matches!(
            decode_frame::<SearchRequest>(&[0, 0], DEFAULT_MAX_FRAME_BYTES),
            Err(FrameError::Truncated { .. })
        ));
    }

    #[tokio::test]
    async fn frames_cross_an_async_stream() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move { write_frame(&mut a, &sample()).await });
        let read: SearchRequest = read_frame(&mut b, DEFAULT_MAX_FRAME_BYTES).await.unwrap();
        writer.await.unwrap().unwrap();
        assert_eq!(read, sample());
    }

    #[tokio::test]
    async fn a_stream_closed_mid_frame_is_an_error() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let frame = encode_frame(&sample());
        a.write_all(&frame[..frame.len() - 2]).await.unwrap();
        drop(a);
        let err = read_frame::<_, SearchRequest>(&mut b, DEFAULT_MAX_FRAME_BYTES)
            .await
            .unwrap_err();
        assert!(matches!(err, FrameError::Truncated { .. }), "{err}");
    }
}
