//! Micro-batching: concurrent searches coalesced into one batch.
//!
//! A faiss flat scan of one query reads every vector once and is bound by memory bandwidth;
//! a batch of queries reads them once for all (as a matrix product), so its cost grows far
//! slower than the number of queries. A shard batches the searches it receives into one
//! faiss call; a router batches the searches it receives into one request per shard, so
//! that every shard sees the same batches (a closed-loop client waits for its slowest
//! shard, and shards that batched independently were measured to settle into two
//! interleaved groups each, paying the product's fixed cost twice).
//!
//! One collector task owns the queue: it takes the oldest search, adds whatever else is
//! queued (waiting at most `max_wait` after taking the oldest, never past `max_queries`)
//! and hands the batch to its [`BatchRunner`], which answers every search of it. While as
//! many batches run as the runner can serve at once, the next one accumulates, so batches
//! grow with load instead of requests queueing one scan after another. The wait for company
//! is spent only under concurrent load (the previous batch held more than one search): a
//! lone caller's search starts at once.

use display_full_error::DisplayFullErrorExt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hasten_proto::v1::SearchResponse;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::error::SearchError;
use crate::metrics::CloudMetrics;

/// How searches are batched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchingSettings {
    /// Most query vectors in one batch. A search larger than this runs alone.
    pub max_queries: usize,
    /// Longest a batch stays open for company once the collector takes its oldest search.
    pub max_wait: Duration,
    /// Searches that may wait for a batch; beyond it callers wait to enqueue
    /// (backpressure) rather than the queue growing without bound.
    pub queue: usize,
}

/// What runs a batch: a shard's faiss call, or a router's fan-out to the shards.
pub trait BatchRunner: Send + Sync + 'static {
    /// One caller's search, as queued.
    type Search: Send + 'static;

    /// Query vectors in `search`.
    fn queries(&self, search: &Self::Search) -> usize;

    /// Batches that may run at once now.
    fn parallelism(&self) -> usize;

    /// Answers every search of `batch`, in order.
    fn run(
        self: Arc<Self>,
        batch: Vec<Self::Search>,
    ) -> impl Future<Output = Vec<Result<SearchResponse, SearchError>>> + Send;
}

struct Job<S> {
    search: S,
    /// The caller's span: the batch runs as a child of its first search's, following from
    /// the others', so that traces cross the batch.
    span: tracing::Span,
    arrived: Instant,
    deadline: Option<Instant>,
    reply: oneshot::Sender<Result<SearchResponse, SearchError>>,
}

/// Counts of what the collector ran.
#[derive(Debug, Default)]
pub struct BatchCounters {
    /// Batches run.
    pub batches: AtomicU64,
    /// Searches answered through them.
    pub searches: AtomicU64,
}

/// Handle to a batch collector.
pub struct MicroBatcher<R: BatchRunner> {
    jobs: mpsc::Sender<Job<R::Search>>,
    counters: Arc<BatchCounters>,
    metrics: CloudMetrics,
}

impl<R: BatchRunner> Clone for MicroBatcher<R> {
    fn clone(&self) -> Self {
        Self {
            jobs: self.jobs.clone(),
            counters: Arc::clone(&self.counters),
            metrics: self.metrics.clone(),
        }
    }
}

impl<R: BatchRunner> std::fmt::Debug for MicroBatcher<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicroBatcher")
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl<R: BatchRunner> MicroBatcher<R> {
    /// Starts the collector task; it ends when every handle is dropped and its batches
    /// have finished.
    pub fn start(runner: Arc<R>, settings: BatchingSettings, metrics: CloudMetrics) -> Self {
        let (jobs, queue) = mpsc::channel(settings.queue.max(1));
        let counters = Arc::new(BatchCounters::default());
        tokio::spawn(collect(
            runner,
            settings,
            queue,
            Arc::clone(&counters),
            metrics.clone(),
        ));
        Self {
            jobs,
            counters,
            metrics,
        }
    }

    pub fn counters(&self) -> &BatchCounters {
        &self.counters
    }

    /// Searches as part of the next batch. `deadline`: when the caller stops waiting; a
    /// search still queued then is dropped without being run.
    pub async fn search(
        &self,
        search: R::Search,
        deadline: Option<Instant>,
    ) -> Result<SearchResponse, SearchError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            search,
            span: tracing::Span::current(),
            arrived: Instant::now(),
            deadline,
            reply,
        };
        self.metrics.queue_depth.inc();
        if self.jobs.send(job).await.is_err() {
            self.metrics.queue_depth.dec();
            return Err(SearchError::ShuttingDown);
        }
        answer.await?
    }
}

async fn collect<R: BatchRunner>(
    runner: Arc<R>,
    settings: BatchingSettings,
    mut queue: mpsc::Receiver<Job<R::Search>>,
    counters: Arc<BatchCounters>,
    metrics: CloudMetrics,
) {
    let mut running = JoinSet::new();
    let mut held: Option<Job<R::Search>> = None;
    let mut concurrent = false;
    loop {
        while running.len() >= runner.parallelism().max(1) {
            if let Some(Err(err)) = running.join_next().await {
                tracing::error!(error = %err.display_full(), "batch task failed");
            }
        }
        let first = match held.take() {
            Some(job) => job,
            None => match queue.recv().await {
                Some(job) => {
                    metrics.queue_depth.dec();
                    job
                }
                None => break,
            },
        };
        // Under load the window opens when the collector is free, not when the oldest search
        // arrived: that one may have waited out a whole batch, and the callers just answered
        // by it are about to come back. Closing at once would send the oldest alone and
        // leave the group split in two for good.
        let close_at = Instant::now() + settings.max_wait;
        let mut queries = runner.queries(&first.search);
        let mut batch = vec![first];
        while queries < settings.max_queries {
            // A lone caller takes only what is already queued: even a timer that is due
            // at once costs a tick of tokio's timer wheel (~1 ms, measured).
            let next = if concurrent {
                tokio::time::timeout_at(close_at.into(), queue.recv())
                    .await
                    .ok()
                    .flatten()
            } else {
                queue.try_recv().ok()
            };
            let Some(job) = next else {
                break;
            };
            metrics.queue_depth.dec();
            let n = runner.queries(&job.search);
            if queries + n > settings.max_queries {
                held = Some(job);
                break;
            }
            queries += n;
            batch.push(job);
        }
        concurrent = batch.len() > 1 || held.is_some();
        metrics.batch_queries.observe(queries as f64);
        running.spawn(run(Arc::clone(&runner), batch, Arc::clone(&counters)));
    }
    while running.join_next().await.is_some() {}
}

/// Runs one batch and answers its callers; callers who gave up or whose deadline passed
/// are dropped first.
async fn run<R: BatchRunner>(
    runner: Arc<R>,
    batch: Vec<Job<R::Search>>,
    counters: Arc<BatchCounters>,
) {
    let now = Instant::now();
    let (live, expired): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .filter(|job| !job.reply.is_closed())
        .partition(|job| job.deadline.is_none_or(|d| d > now));
    for job in expired {
        let waited = now.duration_since(job.arrived);
        let _ = job.reply.send(Err(SearchError::DeadlineExceeded {
            timeout_ms: waited.as_millis() as u64,
            what: "the search waited in the queue past its deadline".into(),
        }));
    }
    let Some(oldest) = live.first().map(|job| job.arrived) else {
        return;
    };
    counters.batches.fetch_add(1, Ordering::Relaxed);
    counters
        .searches
        .fetch_add(live.len() as u64, Ordering::Relaxed);
    let span = tracing::info_span!(parent: &live[0].span, "batch", searches = live.len());
    for job in &live[1..] {
        span.follows_from(&job.span);
    }
    let (searches, replies): (Vec<_>, Vec<_>) =
        live.into_iter().map(|job| (job.search, job.reply)).unzip();
    let count = searches.len();
    let answers = runner.run(searches).instrument(span).await;
    tracing::debug!(
        searches = count,
        waited_us = now.duration_since(oldest).as_micros() as u64,
        run_us = now.elapsed().as_micros() as u64,
        "batch run"
    );
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer);
    }
}
