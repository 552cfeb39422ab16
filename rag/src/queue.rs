//! [`ModelQueue`]: generation uses every core, so a process answers one request at a time, in
//! arrival order, behind a bounded queue; beyond the bound a request is refused at once
//! rather than left to wait minutes.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("{0} answers already waiting for the language model; retry shortly")]
    Full(usize),
    #[error("the language model is shutting down")]
    Closed,
}

/// Called with the number of requests waiting whenever it changes (a metrics gauge).
pub type WaitingObserver = Box<dyn Fn(usize) + Send + Sync>;

pub struct ModelQueue {
    /// One permit per answer the model generates at once (one, on this process's cores).
    model: Arc<Semaphore>,
    waiting: AtomicUsize,
    max_queued: usize,
    observe: WaitingObserver,
}

impl std::fmt::Debug for ModelQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelQueue")
            .field("waiting", &self.waiting())
            .field("max_queued", &self.max_queued)
            .finish()
    }
}

impl ModelQueue {
    /// A queue that lets at most `max_queued` requests wait behind the one generating.
    pub fn new(max_queued: usize, observe: WaitingObserver) -> Self {
        Self::with_concurrency(1, max_queued, observe)
    }

    /// A queue in front of a model that generates `concurrency` answers at once (an engine
    /// that batches them), with at most `max_queued` waiting beyond those.
    pub fn with_concurrency(
        concurrency: usize,
        max_queued: usize,
        observe: WaitingObserver,
    ) -> Self {
        Self {
            model: Arc::new(Semaphore::new(concurrency.max(1))),
            waiting: AtomicUsize::new(0),
            max_queued,
            observe,
        }
    }

    pub fn max_queued(&self) -> usize {
        self.max_queued
    }

    /// Requests waiting (the one generating excluded).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Takes the model, waiting behind at most `max_queued` requests; refuses at once when
    /// that many already wait. A caller dropped while waiting gives its place back.
    pub async fn enter(self: &Arc<Self>) -> Result<OwnedSemaphorePermit, QueueError> {
        self.admit()?.ready().await
    }

    /// Admits a request without waiting: it takes the model if it is free, or a place in
    /// the queue; refused at once when `max_queued` already wait. A caller admits before it
    /// answers anything (so a refusal is a 429, not an error inside a started reply) and
    /// waits for the model with [`Admission::ready`] afterwards.
    pub fn admit(self: &Arc<Self>) -> Result<Admission, QueueError> {
        if let Ok(permit) = Arc::clone(&self.model).try_acquire_owned() {
            return Ok(Admission::Ready(permit));
        }
        Ok(Admission::Waiting(QueueSlot::take(Arc::clone(self))?))
    }
}

/// A request admitted to the model: holding it, or holding a place in the queue. Dropping
/// it gives either back.
#[derive(Debug)]
pub enum Admission {
    Ready(OwnedSemaphorePermit),
    Waiting(QueueSlot),
}

impl Admission {
    /// Waits for the model; the queue place is given back once it is taken.
    pub async fn ready(self) -> Result<OwnedSemaphorePermit, QueueError> {
        match self {
            Self::Ready(permit) => Ok(permit),
            Self::Waiting(slot) => {
                let model = Arc::clone(&slot.queue.model);
                let permit = model.acquire_owned().await.map_err(|_| QueueError::Closed);
                drop(slot);
                permit
            }
        }
    }
}

/// A place in the queue, given back when the wait ends or the waiting request is dropped.
#[derive(Debug)]
pub struct QueueSlot {
    queue: Arc<ModelQueue>,
}

impl QueueSlot {
    fn take(queue: Arc<ModelQueue>) -> Result<Self, QueueError> {
        let ahead = queue.waiting.fetch_add(1, Ordering::SeqCst);
        if ahead >= queue.max_queued {
            queue.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(QueueError::Full(queue.max_queued));
        }
        (queue.observe)(ahead + 1);
        Ok(Self { queue })
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        let left = self.queue.waiting.fetch_sub(1, Ordering::SeqCst) - 1;
        (self.queue.observe)(left);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_generates_the_bound_waits_and_the_next_is_refused() {
        let seen = Arc::new(AtomicUsize::new(usize::MAX));
        let observed = Arc::clone(&seen);
        let queue = Arc::new(ModelQueue::new(
            1,
            Box::new(move |n| observed.store(n, Ordering::SeqCst)),
        ));
        let first = queue.enter().await.unwrap();
        let waiter = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.enter().await.map(drop) }
        });
        while queue.waiting() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert!(matches!(queue.enter().await, Err(QueueError::Full(1))));
        drop(first);
        waiter.await.unwrap().unwrap();
        assert_eq!(queue.waiting(), 0);
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn admission_refuses_at_once_and_holds_its_place_until_ready() {
        let queue = Arc::new(ModelQueue::new(1, Box::new(|_| {})));
        let first = queue.admit().unwrap();
        assert!(matches!(first, Admission::Ready(_)));
        let second = queue.admit().unwrap();
        assert_eq!(
            queue.waiting(),
            1,
            "admitted, not yet waiting for the model"
        );
        assert!(matches!(queue.admit(), Err(QueueError::Full(1))));
        drop(first);
        let permit = second.ready().await.unwrap();
        assert_eq!(queue.waiting(), 0);
        assert!(matches!(queue.admit(), Ok(Admission::Waiting(_))));
        drop(permit);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_frees_its_place() {
        let queue = Arc::new(ModelQueue::new(1, Box::new(|_| {})));
        let _first = queue.enter().await.unwrap();
        let gave_up = tokio::time::timeout(Duration::from_millis(20), queue.enter()).await;
        assert!(gave_up.is_err(), "the second request waits");
        assert_eq!(queue.waiting(), 0);
        let again = tokio::time::timeout(Duration::from_millis(20), queue.enter()).await;
        assert!(
            again.is_err(),
            "and may wait again: its place was given back"
        );
    }
}
