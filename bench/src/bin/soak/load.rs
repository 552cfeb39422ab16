//! The load: open-loop Poisson queries to the edges, each answer's phase, latency and kind.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hasten_loadtest::workload::WorkloadQuery;
use parking_lot::Mutex;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::TENANTS;

/// What a client waits before giving up on an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// One query's fate.
pub(crate) struct Answer {
    pub(crate) phase: usize,
    pub(crate) latency: Duration,
    /// `accepted`, `fallback`, or an error kind.
    pub(crate) kind: String,
}

pub(crate) struct Load {
    pub(crate) workload: Vec<WorkloadQuery>,
    pub(crate) edges: Vec<String>,
    pub(crate) rate: f64,
    pub(crate) duration: Duration,
}

/// Open-loop Poisson load for the run's duration; latency runs from each query's intended
/// send time.
pub(crate) async fn drive(
    load: Load,
    phase: Arc<AtomicUsize>,
    answers: Arc<Mutex<Vec<Answer>>>,
    asked: Arc<Mutex<HashMap<usize, HashSet<String>>>>,
    cross_tenant: Arc<Mutex<Vec<Value>>>,
) {
    let client = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .unwrap_or_default();
    let mut rng = StdRng::seed_from_u64(11);
    let gaps = Exp::new(load.rate.max(0.001)).ok();
    let started = Instant::now();
    let mut next = started;
    let mut tasks = Vec::new();
    for i in 0.. {
        if next.duration_since(started) >= load.duration {
            break;
        }
        tokio::time::sleep_until(next).await;
        let query = load.workload[i % load.workload.len()].question.clone();
        let tenant = (i / 2) % TENANTS.len();
        let edge = load.edges[i % load.edges.len()].clone();
        let intended = next;
        let phase_now = phase.load(Ordering::Relaxed);
        let (client, answers, asked, cross_tenant) = (
            client.clone(),
            Arc::clone(&answers),
            Arc::clone(&asked),
            Arc::clone(&cross_tenant),
        );
        tasks.push(tokio::spawn(async move {
            asked
                .lock()
                .entry(tenant)
                .or_default()
                .insert(query.clone());
            let kind = match ask(&client, &edge, TENANTS[tenant].1, &query).await {
                Ok(reply) => {
                    let outcome = reply["outcome"].as_str().unwrap_or("unknown").to_string();
                    if outcome == "accepted"
                        && let Some(matched) = reply["matched_query"]["text"].as_str()
                        && !asked
                            .lock()
                            .get(&tenant)
                            .is_some_and(|own| own.contains(matched))
                    {
                        cross_tenant.lock().push(json!({
                            "tenant": TENANTS[tenant].0,
                            "question": query,
                            "matched": matched,
                        }));
                    }
                    outcome
                }
                Err(kind) => kind,
            };
            answers.lock().push(Answer {
                phase: phase_now,
                latency: intended.elapsed(),
                kind,
            });
        }));
        if let Some(gaps) = &gaps {
            next += Duration::from_secs_f64(gaps.sample(&mut rng));
        }
    }
    for task in tasks {
        let _ = task.await;
    }
}

/// One query; the reply, or the kind of failure.
async fn ask(
    client: &reqwest::Client,
    edge: &str,
    token: &str,
    question: &str,
) -> Result<Value, String> {
    let response = client
        .post(format!("{edge}/v1/retrieve"))
        .bearer_auth(token)
        .json(&json!({"query": question, "k": 10}))
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                "client_timeout".to_string()
            } else {
                "transport".to_string()
            }
        })?;
    let status = response.status().as_u16();
    let body: Value = response.json().await.map_err(|_| "bad_reply".to_string())?;
    if status == 200 {
        Ok(body)
    } else {
        Err(format!(
            "http_{status}_{}",
            body["error"]["code"].as_str().unwrap_or("unknown")
        ))
    }
}
