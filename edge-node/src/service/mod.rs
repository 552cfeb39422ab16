//! The services the front ends ([`crate::http`], [`crate::grpc`]) call: retrieval
//! ([`retrieve`]) and answers ([`answer`]). Everything that can refuse a request is done here,
//! once, whatever the wire.

pub mod answer;
pub mod retrieve;
