//! The retrieval exchange: `POST /v1/retrieve` under the load driver, its replies read as
//! [`EdgeReply`]s for scoring.

use display_full_error::DisplayFullErrorExt;
use tokio::time::Instant;

use crate::driver::{DriverSettings, Exchange, RunOutcome, post_json, run_exchange};
use crate::scoring::EdgeReply;
use crate::workload::WorkloadQuery;

/// `POST /v1/retrieve` with `k` documents.
pub struct Retrieve {
    pub k: usize,
}

impl Exchange for Retrieve {
    type Reply = EdgeReply;

    async fn exchange(
        &self,
        client: &reqwest::Client,
        url: &str,
        query: &WorkloadQuery,
        _intended: Instant,
    ) -> Result<EdgeReply, String> {
        let body = serde_json::json!({"query": query.question, "k": self.k});
        post_json(client, &format!("{url}/v1/retrieve"), &body)
            .await?
            .json::<EdgeReply>()
            .await
            .map_err(|e| format!("bad reply: {}", e.display_full()))
    }
}

/// Runs `workload`'s retrievals against `edges`; see [`run_exchange`].
pub async fn run(
    workload: &[WorkloadQuery],
    edges: &[String],
    settings: &DriverSettings,
    progress: impl Fn(usize) + Send + Sync + 'static,
) -> RunOutcome<EdgeReply> {
    let retrieve = Retrieve { k: settings.k };
    run_exchange(workload, edges, retrieve, settings, progress).await
}

#[cfg(test)]
mod tests {
    //! The load driver under the retrieval exchange, against stand-in edges on real sockets.
    use std::sync::atomic::AtomicUsize;

    use axum::Router;
    use axum::routing::post;

    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::*;
    use crate::driver::{DriverSettings, LoadModel};

    /// A stand-in edge on a real socket: answers every retrieval after `service` time, one
    /// request at a time (a single-server queue), and counts what it served.
    async fn serial_edge(service: Duration) -> (String, Arc<AtomicUsize>) {
        let served = Arc::new(AtomicUsize::new(0));
        let queue = Arc::new(tokio::sync::Mutex::new(()));
        let counter = Arc::clone(&served);
        let app = Router::new().route(
            "/v1/retrieve",
            post(move || {
                let queue = Arc::clone(&queue);
                let counter = Arc::clone(&counter);
                async move {
                    let _turn = queue.lock().await;
                    tokio::time::sleep(service).await;
                    counter.fetch_add(1, Ordering::SeqCst);
                    axum::Json(serde_json::json!({
                        "documents": [], "outcome": "fallback", "matched_query": null
                    }))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, served)
    }

    fn workload(n: usize) -> Vec<WorkloadQuery> {
        (0..n)
            .map(|seq| WorkloadQuery {
                seq,
                day: 0,
                question: format!("question {seq}"),
                answers: vec![],
                entity: "e".into(),
                source: "test".into(),
                relation: None,
                gold_passage: None,
                popularity: Default::default(),
            })
            .collect()
    }

    fn settings(load: LoadModel, warmup: usize, max_duration: Option<Duration>) -> DriverSettings {
        DriverSettings {
            load,
            k: 10,
            warmup,
            max_duration,
            request_timeout: Duration::from_secs(30),
            cycle: false,
            client: None,
        }
    }

    #[tokio::test]
    async fn open_loop_spreads_queries_over_edges_and_leaves_warmup_out() {
        let (a, served_a) = serial_edge(Duration::from_millis(1)).await;
        let (b, served_b) = serial_edge(Duration::from_millis(1)).await;
        let load = LoadModel::Open {
            rate_qps: 200.0,
            seed: 1,
        };
        let outcome = run(&workload(20), &[a, b], &settings(load, 5, None), |_| {}).await;
        assert_eq!(
            served_a.load(Ordering::SeqCst),
            10,
            "query i goes to edge i mod 2"
        );
        assert_eq!(served_b.load(Ordering::SeqCst), 10);
        let seqs: Vec<usize> = outcome.records.iter().map(|r| r.question.seq).collect();
        assert_eq!(
            seqs,
            (5..20).collect::<Vec<_>>(),
            "warm-up queries are sent, not counted"
        );
        assert!(outcome.records.iter().all(|r| r.result.is_ok()));
    }

    #[tokio::test]
    async fn open_loop_latency_includes_the_queue_a_closed_loop_never_builds() {
        // 20 queries at 200 q/s against a server that takes 40 ms each: arrivals outpace
        // service, so the last query waits behind ~19 others (~0.7 s). One closed-loop client
        // never queues: each query sees about the service time.
        let service = Duration::from_millis(40);
        let (url, _) = serial_edge(service).await;
        let open = LoadModel::Open {
            rate_qps: 200.0,
            seed: 3,
        };
        let outcome = run(
            &workload(20),
            std::slice::from_ref(&url),
            &settings(open, 0, None),
            |_| {},
        )
        .await;
        let worst = outcome.records.iter().map(|r| r.latency).max().unwrap();
        assert!(
            worst >= Duration::from_millis(500),
            "open-loop worst {worst:?}"
        );

        let closed = LoadModel::Closed { clients: 1 };
        let outcome = run(&workload(10), &[url], &settings(closed, 0, None), |_| {}).await;
        let worst = outcome.records.iter().map(|r| r.latency).max().unwrap();
        assert!(
            worst >= service && worst < Duration::from_millis(300),
            "closed-loop worst {worst:?}"
        );
    }

    #[tokio::test]
    async fn duration_bounds_a_run() {
        let (url, served) = serial_edge(Duration::from_millis(1)).await;
        let open = LoadModel::Open {
            rate_qps: 50.0,
            seed: 5,
        };
        let bound = Some(Duration::from_millis(400));
        let outcome = run(
            &workload(1000),
            std::slice::from_ref(&url),
            &settings(open, 0, bound),
            |_| {},
        )
        .await;
        // ~20 arrivals expected in 0.4 s at 50 q/s; far below the 1,000 queued.
        assert!(
            (5..=50).contains(&outcome.records.len()),
            "{}",
            outcome.records.len()
        );
        assert_eq!(served.load(Ordering::SeqCst), outcome.records.len());

        let closed = LoadModel::Closed { clients: 2 };
        let outcome = run(
            &workload(100_000),
            &[url],
            &settings(closed, 0, bound),
            |_| {},
        )
        .await;
        assert!(outcome.records.len() < 100_000);
        assert!(outcome.wall < Duration::from_secs(2), "{:?}", outcome.wall);
    }
}
