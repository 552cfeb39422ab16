//! What evaluating Hasten needs and serving it does not: the QA metrics answers are scored
//! with ([`metrics`]) and compared by ([`paired`]), answer matching inside retrieved passages for the document hit rate
//! ([`answers`]), and Hasten's binaries run as managed child processes on real sockets
//! ([`process`]), the way the load tester, the benchmarks and the integration tests start
//! the system.
//!
//! The dataset loaders stay in `hasten-core` (`corpus`): `cloud-index build` ingests the same
//! files into a bundle, so they are the product's input path, not only evaluation's.

pub mod answers;
pub mod metrics;
pub mod paired;
pub mod process;
