//! `hasten-loadtest`: TopViews-shaped query workloads, a load driver with an emulated
//! network, and the evaluation of HaS against the systems a user would pick instead.

pub mod answer;
pub mod control_plane;
pub mod draft_loss;
pub mod driver;
pub mod experiment;
pub mod paraphrase;
pub mod popularity;
pub mod relay;
pub mod remote;
pub mod report;
pub mod retrieve;
pub mod scoring;
pub mod scrape;
pub mod workload;
