//! Micro-batching: a shard coalesces concurrent searches into one faiss call.
//!
//! A faiss flat scan of one query reads every vector once and is bound by memory bandwidth;
//! a batch of queries reads them once for all (as a matrix product), so its cost grows far
//! slower than the number of queries. One collector task owns the queue: it takes the
//! oldest search, adds whatever else is queued (waiting at most `max_wait` after the oldest
//! arrived, never past `max_queries`), runs the batch on the blocking pool and answers each
//! caller. While a batch runs the next one accumulates, so batches grow with load instead
//! of requests queueing one scan after another. The wait for company is spent only under
//! concurrent load (the previous batch held more than one search): a lone caller's search
//! starts at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hasten_proto::v1::SearchResponse;
use tokio::sync::{mpsc, oneshot};

use crate::error::SearchError;
use crate::searcher::{ExactSearcher, PreparedSearch};

/// How a shard batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchingSettings {
    /// Most query vectors in one faiss call. A request larger than this runs alone.
    pub max_queries: usize,
    /// Longest a search waits for company after it arrived.
    pub max_wait: Duration,
    /// Searches that may wait for a batch; beyond it callers wait to enqueue
    /// (backpressure) rather than the queue growing without bound.
    pub queue: usize,
}

#[derive(Debug)]
struct Job {
    prepared: PreparedSearch,
    arrived: Instant,
    deadline: Option<Instant>,
    reply: oneshot::Sender<Result<SearchResponse, SearchError>>,
}

/// Counts of what the collector ran.
#[derive(Debug, Default)]
pub struct BatchCounters {
    /// faiss calls made.
    pub batches: AtomicU64,
    /// Searches answered through them.
    pub searches: AtomicU64,
}

/// Handle to a shard's batch collector.
#[derive(Clone, Debug)]
pub struct MicroBatcher {
    jobs: mpsc::Sender<Job>,
    counters: Arc<BatchCounters>,
}

impl MicroBatcher {
    /// Starts the collector task; it ends when every handle is dropped.
    pub fn start(searcher: Arc<ExactSearcher>, settings: BatchingSettings) -> Self {
        let (jobs, queue) = mpsc::channel(settings.queue.max(1));
        let counters = Arc::new(BatchCounters::default());
        tokio::spawn(collect(searcher, settings, queue, Arc::clone(&counters)));
        Self { jobs, counters }
    }

    pub fn counters(&self) -> &BatchCounters {
        &self.counters
    }

    /// Searches as part of the next batch. `deadline`: when the caller stops waiting; a
    /// search still queued then is dropped without being run.
    pub async fn search(
        &self,
        prepared: PreparedSearch,
        deadline: Option<Instant>,
    ) -> Result<SearchResponse, SearchError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            prepared,
            arrived: Instant::now(),
            deadline,
            reply,
        };
        self.jobs
            .send(job)
            .await
            .map_err(|_| SearchError::ShuttingDown)?;
        answer
            .await
            .map_err(|_| SearchError::Task("the batch carrying this search failed".into()))?
    }
}

async fn collect(
    searcher: Arc<ExactSearcher>,
    settings: BatchingSettings,
    mut queue: mpsc::Receiver<Job>,
    counters: Arc<BatchCounters>,
) {
    let dimension = searcher.bundle().dimension().max(1);
    let mut held: Option<Job> = None;
    let mut concurrent = false;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match queue.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        let close_at = if concurrent {
            first.arrived + settings.max_wait
        } else {
            first.arrived
        };
        let mut queries = first.prepared.len(dimension);
        let mut batch = vec![first];
        while queries < settings.max_queries {
            match tokio::time::timeout_at(close_at.into(), queue.recv()).await {
                Ok(Some(job)) => {
                    let n = job.prepared.len(dimension);
                    if queries + n > settings.max_queries {
                        held = Some(job);
                        break;
                    }
                    queries += n;
                    batch.push(job);
                }
                Ok(None) | Err(_) => break,
            }
        }
        concurrent = batch.len() > 1 || held.is_some();
        run(&searcher, batch, &counters).await;
    }
}

/// Runs one batch and answers its callers; callers who gave up or whose deadline passed
/// are dropped first.
async fn run(searcher: &Arc<ExactSearcher>, batch: Vec<Job>, counters: &BatchCounters) {
    let now = Instant::now();
    let (live, expired): (Vec<Job>, Vec<Job>) = batch
        .into_iter()
        .filter(|job| !job.reply.is_closed())
        .partition(|job| job.deadline.is_none_or(|d| d > now));
    for job in expired {
        let waited = now.duration_since(job.arrived);
        let _ = job.reply.send(Err(SearchError::DeadlineExceeded {
            timeout_ms: waited.as_millis() as u64,
            what: "the search waited in the shard's queue past its deadline".into(),
        }));
    }
    if live.is_empty() {
        return;
    }
    counters.batches.fetch_add(1, Ordering::Relaxed);
    counters
        .searches
        .fetch_add(live.len() as u64, Ordering::Relaxed);
    let searcher = Arc::clone(searcher);
    let outcome = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let prepared: Vec<&PreparedSearch> = live.iter().map(|job| &job.prepared).collect();
        let result = searcher.search_batch(&prepared);
        tracing::debug!(
            searches = live.len(),
            waited_us = started.duration_since(live[0].arrived).as_micros() as u64,
            search_us = started.elapsed().as_micros() as u64,
            "batch searched"
        );
        (live, result)
    })
    .await;
    let (live, result) = match outcome {
        Ok(done) => done,
        // The callers' reply senders went down with the task: each sees a task failure.
        Err(err) => {
            tracing::error!(%err, "batched search task failed");
            return;
        }
    };
    match result {
        Ok(responses) => {
            for (job, response) in live.into_iter().zip(responses) {
                let _ = job.reply.send(Ok(response));
            }
        }
        Err(err) => {
            for job in live {
                let _ = job.reply.send(Err(err.clone()));
            }
        }
    }
}
