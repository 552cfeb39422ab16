//! `hasten-loadtest`: popularity-skewed query workloads and their evaluation against Hasten
//! edges (document hit rate, draft acceptance, latency).

pub mod evaluation;
pub mod workload;
