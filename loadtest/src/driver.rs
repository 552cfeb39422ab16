//! The load driver: sends a workload's questions to edges over HTTP, open loop (Poisson
//! arrivals at a target rate) or closed loop (N clients, each waiting for its answer), and
//! records each query's outcome and latency. Latency runs from the query's *intended* send
//! time, so a driver or edge that falls behind cannot hide its queueing (coordinated omission).

use display_full_error::DisplayFullErrorExt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use tokio::time::Instant;

use crate::workload::WorkloadQuery;

/// What one query exchanges with an edge: the request the driver sends, and what it keeps of
/// the reply.
pub trait Exchange: Send + Sync + 'static {
    type Reply: Send + 'static;

    /// Sends `query` to the edge at `url`; `intended` is when the load model meant it to
    /// go, so that times inside the reply (a first token) count the queueing before it.
    fn exchange(
        &self,
        client: &reqwest::Client,
        url: &str,
        query: &WorkloadQuery,
        intended: Instant,
    ) -> impl Future<Output = Result<Self::Reply, String>> + Send;
}

/// One query's outcome: which edge, its latency from its intended send time, and the reply.
#[derive(Clone, Debug)]
pub struct Sent<R> {
    pub question: WorkloadQuery,
    /// Which of the system's edges answered (index into its edge list).
    pub edge: usize,
    pub latency: Duration,
    /// When it was meant to be sent, from the start of the run.
    pub sent: Duration,
    pub result: Result<R, String>,
}

/// POSTs `body` to `url`: the response when it succeeded, else the transport error or the
/// HTTP status with its body, as a record's error text.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> Result<reqwest::Response, String> {
    let response = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| format!("transport: {}", e.display_full()))?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(format!("HTTP {}: {body}", status.as_u16()));
    }
    Ok(response)
}

/// How queries are issued.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LoadModel {
    /// `clients` concurrent clients, each sending its next query when the last answered.
    Closed { clients: usize },
    /// Poisson arrivals at `rate_qps`, whatever the edges' answers.
    Open { rate_qps: f64, seed: u64 },
}

#[derive(Clone, Debug)]
pub struct DriverSettings {
    pub load: LoadModel,
    /// Documents per query.
    pub k: usize,
    /// Queries before this many count only as warm-up (they fill caches, not figures).
    pub warmup: usize,
    /// Stop issuing queries after this long.
    pub max_duration: Option<Duration>,
    pub request_timeout: Duration,
    /// Start the workload over when it runs out, until `max_duration` (a deployment's
    /// load test), instead of stopping.
    pub cycle: bool,
    /// The HTTP client (a deployment's token and CA); a plain one when `None`.
    pub client: Option<reqwest::Client>,
}

/// What one run produced, warm-up excluded.
#[derive(Clone, Debug)]
pub struct RunOutcome<R> {
    pub records: Vec<Sent<R>>,
    /// From the first measured query's intended start to the last answer.
    pub wall: Duration,
}

/// Sends one query and reports its record.
struct Requester<X: Exchange> {
    client: reqwest::Client,
    workload: Arc<Vec<WorkloadQuery>>,
    edges: Arc<Vec<String>>,
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Instant, Sent<X::Reply>)>,
    done: Arc<AtomicUsize>,
    progress: Arc<dyn Fn(usize) + Send + Sync>,
    exchange: Arc<X>,
    started: Instant,
}

// Not derived: a derive would ask `X: Clone` of every exchange.
impl<X: Exchange> Clone for Requester<X> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            workload: Arc::clone(&self.workload),
            edges: Arc::clone(&self.edges),
            tx: self.tx.clone(),
            done: Arc::clone(&self.done),
            progress: Arc::clone(&self.progress),
            exchange: Arc::clone(&self.exchange),
            started: self.started,
        }
    }
}

impl<X: Exchange> Requester<X> {
    async fn request(&self, index: usize, client_id: usize, intended: Instant) {
        let query = &self.workload[index % self.workload.len()];
        let edge = client_id % self.edges.len().max(1);
        let result = self
            .exchange
            .exchange(&self.client, &self.edges[edge], query, intended)
            .await;
        let record = Sent {
            question: query.clone(),
            edge,
            latency: intended.elapsed(),
            sent: intended.saturating_duration_since(self.started),
            result,
        };
        let _ = self.tx.send((index, intended, record));
        (self.progress)(self.done.fetch_add(1, Ordering::Relaxed) + 1);
    }
}

/// The load driver's HTTP client settings. Pooled connections are dropped after 5 s idle:
/// an edge closes a connection idle for its `header_timeout_ms` (10 s by default), and a
/// request sent on a connection the server is closing fails without reaching it (seen once
/// at 0.35 q/s over two edges, where gaps of 10 s between one edge's questions are common).
pub fn client_builder(request_timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .timeout(request_timeout)
        .pool_max_idle_per_host(1024)
        .pool_idle_timeout(Duration::from_secs(5))
}

/// Runs `workload` against `edges` (client i talks to edge i mod E), each query one
/// `exchange`. `progress` is called after every answer with the number answered so far.
pub async fn run_exchange<X: Exchange>(
    workload: &[WorkloadQuery],
    edges: &[String],
    exchange: X,
    settings: &DriverSettings,
    progress: impl Fn(usize) + Send + Sync + 'static,
) -> RunOutcome<X::Reply> {
    let client = settings.client.clone().unwrap_or_else(|| {
        client_builder(settings.request_timeout)
            .build()
            .unwrap_or_default()
    });
    let workload: Arc<Vec<WorkloadQuery>> = Arc::new(workload.to_vec());
    let edges: Arc<Vec<String>> = Arc::new(edges.to_vec());
    let started = Instant::now();
    let deadline = settings.max_duration.map(|d| started + d);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant, Sent<X::Reply>)>();
    let requester = Requester {
        client,
        workload: Arc::clone(&workload),
        edges,
        tx,
        done: Arc::new(AtomicUsize::new(0)),
        progress: Arc::new(progress),
        exchange: Arc::new(exchange),
        started,
    };
    // With `cycle`, indexes run past the workload's end (taken modulo its length).
    let queries = if settings.cycle && deadline.is_some() && !workload.is_empty() {
        usize::MAX
    } else {
        workload.len()
    };
    match settings.load {
        LoadModel::Closed { clients } => {
            let next = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for client_id in 0..clients.max(1) {
                let next = Arc::clone(&next);
                let requester = requester.clone();
                tasks.push(tokio::spawn(async move {
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        if index >= queries || deadline.is_some_and(|d| Instant::now() >= d) {
                            return;
                        }
                        requester.request(index, client_id, Instant::now()).await;
                    }
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
        }
        LoadModel::Open { rate_qps, seed } => {
            let gaps = Exp::new(rate_qps.max(1e-9)).map_err(|e| e.to_string_full());
            let mut rng = StdRng::seed_from_u64(seed);
            let mut intended = started;
            let mut tasks = Vec::with_capacity(workload.len());
            for index in 0..queries {
                if let Ok(gaps) = &gaps {
                    intended += Duration::from_secs_f64(gaps.sample(&mut rng));
                }
                if deadline.is_some_and(|d| intended >= d) {
                    break;
                }
                tokio::time::sleep_until(intended).await;
                let requester = requester.clone();
                tasks.push(tokio::spawn(async move {
                    requester.request(index, index, intended).await
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
        }
    }
    drop(requester);
    let mut answered = Vec::new();
    while let Some(item) = rx.recv().await {
        answered.push(item);
    }
    answered.sort_by_key(|(index, _, _)| *index);
    let measured: Vec<(Instant, Sent<X::Reply>)> = answered
        .into_iter()
        .filter(|(index, _, _)| *index >= settings.warmup)
        .map(|(_, intended, record)| (intended, record))
        .collect();
    let first = measured.iter().map(|(t, _)| *t).min().unwrap_or(started);
    let last = measured
        .iter()
        .map(|(t, r)| *t + r.latency)
        .max()
        .unwrap_or(first);
    RunOutcome {
        wall: last.saturating_duration_since(first),
        records: measured.into_iter().map(|(_, r)| r).collect(),
    }
}
