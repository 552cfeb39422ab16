//! A rolling restart of one edge under steady load, as Kubernetes does it, with real edge
//! processes behind a stand-in for their Service: a TCP proxy that spreads new connections
//! round robin over its endpoints, and drops a terminating pod from them only after a
//! propagation delay (the endpoints controller and kube-proxy lag the pod's deletion). A
//! replacement edge comes up first (a Deployment's surge), then the old one terminates.
//!
//! With the chart's preStop (a sleep longer than the propagation delay before SIGTERM) and
//! the edge's drain (in-flight requests finish after SIGTERM), no request is lost. Without
//! the preStop, the requests the proxy still sends to the terminating edge after SIGTERM are
//! refused: the test requires that variant to lose requests, so it can tell the two apart.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hasten_eval::process::ManagedProcess;
use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index, start_edge,
};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

/// How long the Service keeps sending new connections to a pod after its deletion began.
const PROPAGATION: Duration = Duration::from_millis(1000);
/// The chart's preStop sleep in the rehearsal (the chart's default is 5 s), longer than the
/// propagation delay.
const PRE_STOP: Duration = Duration::from_millis(2000);
/// One request every this often, each on a new connection (many clients).
const REQUEST_EVERY: Duration = Duration::from_millis(20);

/// A Service's stand-in: new connections go round robin to the endpoints of the moment.
#[derive(Clone)]
struct Service {
    endpoints: Arc<Mutex<Vec<String>>>,
}

impl Service {
    async fn start(endpoints: Vec<String>) -> (Self, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let service = Self {
            endpoints: Arc::new(Mutex::new(endpoints)),
        };
        let routing = service.clone();
        tokio::spawn(async move {
            let mut next = 0usize;
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let backend = {
                    let endpoints = routing.endpoints.lock().unwrap();
                    next += 1;
                    endpoints[next % endpoints.len()].clone()
                };
                tokio::spawn(async move {
                    // A refused backend leaves the client with a closed connection.
                    if let Ok(mut server) = TcpStream::connect(&backend).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        (service, address)
    }

    fn add(&self, endpoint: String) {
        self.endpoints.lock().unwrap().push(endpoint);
    }

    fn remove(&self, endpoint: &str) {
        self.endpoints.lock().unwrap().retain(|e| e != endpoint);
    }
}

/// Requests through `service_addr` for `duration`: (answered, lost).
async fn steady_load(service_addr: String, question: String, duration: Duration) -> (usize, usize) {
    // No pooled connections: every request opens its own, as many clients would.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let (answered, lost) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut every = tokio::time::interval(REQUEST_EVERY);
    let started = tokio::time::Instant::now();
    let mut requests = Vec::new();
    while started.elapsed() < duration {
        every.tick().await;
        let (http, url, question) = (
            http.clone(),
            format!("http://{service_addr}/v1/retrieve"),
            question.clone(),
        );
        let (answered, lost) = (Arc::clone(&answered), Arc::clone(&lost));
        requests.push(tokio::spawn(async move {
            let ok = http
                .post(url)
                .json(&json!({"query": question, "k": 3}))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok { answered } else { lost }.fetch_add(1, Ordering::Relaxed);
        }));
    }
    for request in requests {
        request.await.unwrap();
    }
    (
        answered.load(Ordering::Relaxed),
        lost.load(Ordering::Relaxed),
    )
}

/// One rolling restart of `old` under load, with `pre_stop` before its SIGTERM: a new edge
/// joins the Service, then `old` begins terminating (the Service drops it after the
/// propagation delay). Returns (answered, lost).
async fn roll(
    name: &str,
    edge: &dyn Fn(&str) -> ManagedProcess,
    stays: &ManagedProcess,
    question: &str,
    pre_stop: Duration,
) -> (usize, usize) {
    let mut old = edge(&format!("{name}-old"));
    let old_addr = old.addr("http_addr");
    let (service, service_addr) =
        Service::start(vec![stays.addr("http_addr"), old_addr.clone()]).await;
    let load = tokio::spawn(steady_load(
        service_addr,
        question.to_string(),
        Duration::from_secs(6),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The surge: the replacement is ready before the old pod goes.
    let replacement = edge(&format!("{name}-new"));
    service.add(replacement.addr("http_addr"));
    // Deletion begins: the Service learns of it late; the kubelet runs preStop, then SIGTERM.
    let dropping = {
        let service = service.clone();
        let old_addr = old_addr.clone();
        tokio::spawn(async move {
            tokio::time::sleep(PROPAGATION).await;
            service.remove(&old_addr);
        })
    };
    tokio::time::sleep(pre_stop).await;
    old.signal("TERM").unwrap();
    let outcome = load.await.unwrap();
    dropping.await.unwrap();
    assert!(
        old.wait_exit(Duration::from_secs(30)).is_some(),
        "the old edge did not exit after SIGTERM"
    );
    drop(replacement);
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_with_pre_stop_loses_no_request_and_one_without_does() {
    let work = persistent_work_dir("rolling-restart").unwrap();
    let (bundle, _) = build_small_bundle(&work, 3, None).unwrap();
    let cloud = start_cloud_index(&work, "roll-cloud", &bundle, "127.0.0.1:0").unwrap();
    let cert = dev_cert(&work, "roll-cloud");
    let cloud_addr = cloud.addr("quic_addr");
    let edge = |name: &str| start_edge(&work, name, &bundle, &cloud_addr, &cert, &[]).unwrap();
    let stays = edge("edge-stays");
    let question = hasten_core::bundle::CorpusBundle::load(&bundle)
        .unwrap()
        .questions[0]
        .question
        .clone();

    let (answered, lost) = roll("with-pre-stop", &edge, &stays, &question, PRE_STOP).await;
    assert!(answered > 200, "only {answered} requests answered");
    assert_eq!(
        lost,
        0,
        "{lost} of {} requests lost with preStop",
        answered + lost
    );

    let (answered, lost) = roll("without", &edge, &stays, &question, Duration::ZERO).await;
    assert!(
        lost > 0,
        "no request lost without preStop ({answered} answered): the test cannot tell the two apart"
    );
    eprintln!(
        "without preStop: {lost} of {} requests lost",
        answered + lost
    );
}
