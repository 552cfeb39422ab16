//! The QUIC fast path's frame decoder, fed whatever a peer could put on a stream: it decodes
//! or refuses, never panics; what decodes re-encodes to the same bytes; a search that
//! decodes passes the cloud's request checks or is refused by them.
#![no_main]

use hasten_cloud_index::response_limit::ResponseLimit;
use hasten_proto::frame::{DEFAULT_MAX_FRAME_BYTES, decode_frame, encode_frame};
use hasten_proto::v1::{QuicRequest, QuicResponse, quic_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = decode_frame::<QuicRequest>(data, DEFAULT_MAX_FRAME_BYTES) {
        // Compared as bytes: a NaN in a vector is not equal to itself.
        let encoded = encode_frame(&request);
        let again: QuicRequest =
            decode_frame(&encoded, DEFAULT_MAX_FRAME_BYTES).expect("a re-encoded frame decodes");
        assert_eq!(encode_frame(&again), encoded);
        if let Some(quic_request::Body::Search(search)) = &request.body {
            // A shard of 100 passages of up to ~1 KB, 384-d.
            let limit = ResponseLimit::new(384, 100, 1024, 0);
            if let Ok(queries) = hasten_cloud_index::searcher::validated_queries(search, &limit) {
                assert_eq!(queries.len(), search.queries.len() * 384);
                assert!(queries.iter().all(|x| x.is_finite()));
            }
        }
    }
    // Edges decode the cloud's answers with the same decoder.
    let _ = decode_frame::<QuicResponse>(data, DEFAULT_MAX_FRAME_BYTES);
});
