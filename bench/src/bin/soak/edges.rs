//! Watching the edges: their applied control-plane index, subscription and followed node.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::time::Instant;

use crate::control::RPC_TIMEOUT;

/// How often each edge's applied control-plane index is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The control-plane node the edge whose log is `log` follows now, by the last stream it
/// started (`following the control plane`).
pub(crate) fn followed_node(log: &Path, addresses: &[String]) -> Option<usize> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .rev()
        .find(|line| line.contains("following the control plane"))?;
    addresses.iter().position(|address| {
        line.match_indices(address.as_str())
            .any(|(at, _)| !line[at + address.len()..].starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// The edge's applied control-plane index and whether it is subscribed, from its status.
async fn edge_link(client: &reqwest::Client, url: &str) -> Option<(u64, bool)> {
    let status: Value = client
        .get(format!("{url}/v1/status"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let link = &status["control_plane"];
    Some((
        link["applied_index"].as_u64()?,
        link["subscribed"].as_bool()?,
    ))
}

pub(crate) async fn edge_links(
    client: &reqwest::Client,
    urls: &[String],
) -> Vec<Option<(u64, bool)>> {
    let mut links = Vec::new();
    for url in urls {
        links.push(edge_link(client, url).await);
    }
    links
}

pub(crate) fn status_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(RPC_TIMEOUT)
        .build()
        .unwrap_or_default()
}

/// Each edge's applied index, sampled every [`SAMPLE_EVERY`] through the run.
pub(crate) struct EdgeSample {
    pub(crate) at_s: f64,
    pub(crate) phase: usize,
    pub(crate) applied: Vec<Option<u64>>,
}

pub(crate) async fn sample_edges(
    urls: Vec<String>,
    phase: Arc<AtomicUsize>,
    started: Instant,
    samples: Arc<Mutex<Vec<EdgeSample>>>,
) {
    let client = status_client();
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    loop {
        ticks.tick().await;
        let phase_now = phase.load(Ordering::Relaxed);
        let applied = edge_links(&client, &urls)
            .await
            .into_iter()
            .map(|link| link.map(|(index, _)| index))
            .collect();
        samples.lock().push(EdgeSample {
            at_s: started.elapsed().as_secs_f64(),
            phase: phase_now,
            applied,
        });
    }
}

/// The longest stretch of `phase` over which edge `edge`'s sampled applied index did not
/// move (or stayed unreadable).
pub(crate) fn longest_unchanged_s(samples: &[EdgeSample], phase: usize, edge: usize) -> f64 {
    let mut longest = 0.0_f64;
    let mut since: Option<(f64, Option<u64>)> = None;
    for sample in samples.iter().filter(|s| s.phase == phase) {
        let value = sample.applied.get(edge).copied().flatten();
        match since {
            Some((from, seen)) if seen == value => {
                longest = longest.max(sample.at_s - from);
            }
            _ => since = Some((sample.at_s, value)),
        }
    }
    longest
}
