//! The edge's JSON request parser and checks, fed arbitrary bodies: a body is parsed and
//! checked or refused naming a field, never a panic; whatever passes is within the limits.
#![no_main]

use hasten_edge_node::api::json::parse_body;
use hasten_edge_node::api::{RequestLimits, RetrieveInput};
use hasten_edge_node::retrieval::Query;
use libfuzzer_sys::fuzz_target;

const LIMITS: RequestLimits = RequestLimits {
    default_k: 10,
    max_k: 100,
    max_query_chars: 2000,
    dimension: 384,
};

fuzz_target!(|data: &[u8]| {
    let body = match parse_body(data) {
        Ok(body) => body,
        Err(refused) => {
            assert!(!refused.field.is_empty());
            return;
        }
    };
    let Ok(valid) = RetrieveInput::from(body).validate(&LIMITS) else {
        return;
    };
    assert!((1..=LIMITS.max_k).contains(&valid.k));
    match valid.query {
        Query::Text(text) => {
            assert!(!text.trim().is_empty());
            assert!(text.chars().count() <= LIMITS.max_query_chars);
        }
        Query::Vector(vector) => {
            assert_eq!(vector.len(), LIMITS.dimension);
            let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-3, "norm {norm}");
        }
    }
});
