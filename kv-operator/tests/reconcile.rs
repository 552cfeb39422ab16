//! Reconcile scenarios against a mocked API server (see `fake_api`: no Kubernetes API server
//! can run on these machines). Each asserts the requests the operator makes, in order, and
//! what it writes: finalizer first; server-side apply of every object; the corpus version's
//! Job before any worker serves it, and the switch once the Job succeeded; status with
//! conditions; a refused spec that changes nothing; conflict and error requeues; deletion
//! cleaning up the volume claims before the finalizer goes.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;
mod fake_api;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use hasten_kv_operator::publish::{AssignmentPublisher, PublishError};
use hasten_proto::v1::KvPoolAssignment;

use fake_api::{Recorded, Reply, conflict, echo, empty_list, not_found, status};
use hasten_core::metrics::exposition;
use hasten_core::metrics::prometheus::Registry;
use hasten_kv_operator::crd::KvWorkerPool;
use hasten_kv_operator::metrics::OperatorMetrics;
use hasten_kv_operator::reconcile::{Context, FINALIZER, error_policy, reconcile};
use hasten_kv_operator::resources::job_name;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

const POOLS: &str = "/apis/hasten.dev/v1alpha1/namespaces/rag/kvworkerpools/wiki";
const WORKERS: &str = "/apis/apps/v1/namespaces/rag/statefulsets/wiki";
const JOBS: &str = "/apis/batch/v1/namespaces/rag/jobs";
const PODS: &str = "/api/v1/namespaces/rag/pods";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/rag/events";
const CLAIMS: &str = "/api/v1/namespaces/rag/persistentvolumeclaims";

/// The cluster as one scenario sees it.
#[derive(Clone, Default)]
struct World {
    /// The workers' StatefulSet, if it exists.
    workers: Option<Value>,
    /// Jobs by name.
    jobs: Vec<Value>,
    /// Termination message of the Job's pod.
    job_message: Option<String>,
    /// The Job's pod runs, and its log answers this (a status code and text).
    job_log: Option<(u16, String)>,
    /// Worker pods that are Ready.
    ready: Vec<i32>,
    /// What a status patch gets instead of success.
    status_reply: Option<Reply>,
    /// What the StatefulSet GET gets instead of the usual.
    workers_get_reply: Option<Reply>,
}

fn pool_json(version: &str, finalizer: bool) -> Value {
    let mut spec = common::cpu_spec();
    spec["corpus"]["version"] = json!(version);
    let mut pool = serde_json::to_value(common::pool(spec)).expect("serialises");
    if finalizer {
        pool["metadata"]["finalizers"] = json!([FINALIZER]);
    }
    pool
}

fn respond(world: &World, pool: &Value, request: &Recorded) -> Reply {
    let method = request.method.as_str();
    let path = request.path.as_str();
    match method {
        "GET" if path == WORKERS => world.workers_get_reply.clone().unwrap_or_else(|| {
            world
                .workers
                .clone()
                .map(|w| (200, w))
                .unwrap_or_else(not_found)
        }),
        "GET" if path.starts_with(JOBS) => world
            .jobs
            .iter()
            .find(|job| path.ends_with(job["metadata"]["name"].as_str().unwrap_or_default()))
            .map(|job| (200, job.clone()))
            .unwrap_or_else(not_found),
        "GET" if path == format!("{PODS}/job-pod/log") => match &world.job_log {
            Some((200, log)) => (200, Value::String(log.clone())),
            Some((code, _)) => status(*code, "BadRequest"),
            None => not_found(),
        },
        "GET" if path == PODS && request.query.contains("job-name") => {
            let finished = world.job_message.iter().map(|message| {
                json!({"metadata": {"name": "job-pod"}, "status": {"phase": "Succeeded", "containerStatuses": [{
                    "name": "preprocess", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "message": message}}
                }]}})
            });
            let running = world
                .job_log
                .iter()
                .map(|_| json!({"metadata": {"name": "job-pod"}, "status": {"phase": "Running"}}));
            let items: Vec<Value> = finished.chain(running).collect();
            (
                200,
                json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
            )
        }
        "GET" if path == PODS => {
            let items: Vec<Value> = world
                .ready
                .iter()
                .map(|ordinal| {
                    json!({"metadata": {"name": format!("wiki-{ordinal}")}, "status": {"conditions": [
                        {"type": "Ready", "status": "True"}
                    ]}})
                })
                .collect();
            if items.is_empty() {
                empty_list("PodList")
            } else {
                (
                    200,
                    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
                )
            }
        }
        "PATCH" if path.ends_with("/status") => {
            world.status_reply.clone().unwrap_or((200, pool.clone()))
        }
        "PATCH" if path == POOLS => (200, pool.clone()),
        "PATCH" if path == WORKERS => {
            // The applied set, with the status the StatefulSet controller would report.
            let mut applied = request.body.clone();
            let replicas = applied["spec"]["replicas"].clone();
            applied["status"] = json!({"replicas": replicas, "readyReplicas": world.ready.len()});
            (200, applied)
        }
        "PATCH" => echo(request),
        "POST" if path == EVENTS => (201, request.body.clone()),
        "DELETE" => (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
        ),
        _ => status(500, "unexpected request"),
    }
}

struct Outcome {
    result: Result<Action, hasten_kv_operator::Error>,
    requests: Vec<Recorded>,
    action_after_error: Option<Action>,
    /// The operator's metrics after the reconcile, in Prometheus's text format.
    metrics: String,
}

async fn run(pool: Value, world: World) -> Outcome {
    run_publishing(pool, world, None).await
}

/// Records what would have been proposed to the control plane; fails when told to.
#[derive(Default)]
struct RecordingPublisher {
    published: Mutex<Vec<KvPoolAssignment>>,
    unreachable: bool,
}

impl AssignmentPublisher for RecordingPublisher {
    fn publish(&self, assignment: KvPoolAssignment) -> BoxFuture<'_, Result<(), PublishError>> {
        self.published.lock().expect("lock").push(assignment);
        let outcome = if self.unreachable {
            Err(PublishError::Unreachable("no node answered".into()))
        } else {
            Ok(())
        };
        Box::pin(async move { outcome })
    }
}

async fn run_publishing(
    pool: Value,
    world: World,
    publisher: Option<Arc<RecordingPublisher>>,
) -> Outcome {
    let served = pool.clone();
    let (client, requests) = fake_api::client(move |request| respond(&world, &served, request));
    let registry = Registry::new();
    let metrics = OperatorMetrics::register(&registry).expect("metrics");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "hasten-kv-operator".into(),
            instance: Some("test".into()),
        },
    );
    let mut ctx = Context::new(client, common::settings(), metrics, recorder);
    if let Some(publisher) = publisher {
        ctx = ctx.with_publisher(publisher);
    }
    let ctx = Arc::new(ctx);
    let pool: Arc<KvWorkerPool> = Arc::new(serde_json::from_value(pool).expect("a pool"));
    let result = reconcile(pool.clone(), ctx.clone()).await;
    let action_after_error = result
        .as_ref()
        .err()
        .map(|error| error_policy(pool.clone(), error, ctx.clone()));
    drop(ctx);
    Outcome {
        result,
        requests: requests.await.expect("the fake API"),
        action_after_error,
        metrics: exposition(&registry),
    }
}

/// When `action` requeues: kube's `Action` shows it only in its `Debug` form
/// (`Action { requeue_after: Some(7.5s) }`).
fn requeue_after(action: &Action) -> Duration {
    let shown = format!("{action:?}");
    let inner = shown
        .split("Some(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no requeue in {shown}"));
    let (number, unit) =
        inner.split_at(inner.find(|c: char| c.is_alphabetic() || c == 'µ').unwrap());
    let value: f64 = number.parse().unwrap();
    Duration::from_secs_f64(match unit {
        "s" => value,
        "ms" => value / 1e3,
        "µs" => value / 1e6,
        "ns" => value / 1e9,
        other => panic!("unit {other} in {shown}"),
    })
}

fn lines(requests: &[Recorded]) -> Vec<String> {
    requests.iter().map(Recorded::line).collect()
}

fn applied<'a>(requests: &'a [Recorded], path: &str) -> &'a Value {
    let request = requests
        .iter()
        .find(|r| r.method == "PATCH" && r.path == path)
        .unwrap_or_else(|| panic!("no apply of {path}: {:#?}", lines(requests)));
    assert!(
        request.query.contains("fieldManager=hasten-kv-operator")
            && request.query.contains("force=true"),
        "{path} not server-side applied: {}",
        request.query
    );
    assert_eq!(request.content_type, "application/apply-patch+yaml");
    &request.body
}

fn status_patch(requests: &[Recorded]) -> &Value {
    &requests
        .iter()
        .find(|r| r.method == "PATCH" && r.path == format!("{POOLS}/status"))
        .unwrap_or_else(|| panic!("no status patch: {:#?}", lines(requests)))
        .body["status"]
}

fn condition<'a>(status: &'a Value, type_: &str) -> (&'a str, &'a str) {
    let condition = status["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"));
    (
        condition["status"].as_str().unwrap_or_default(),
        condition["reason"].as_str().unwrap_or_default(),
    )
}

fn job(version: &str, condition: Option<&str>) -> Value {
    let mut job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name("wiki", version), "namespace": "rag"},
        "status": {"startTime": "2026-11-26T10:00:00Z"},
    });
    if let Some(type_) = condition {
        job["status"]["conditions"] = json!([{"type": type_, "status": "True"}]);
    }
    job
}

fn workers_serving(version: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "wiki", "namespace": "rag", "annotations": {"hasten.dev/corpus-version": version}},
    })
}

#[tokio::test]
async fn a_new_pool_gets_the_finalizer_before_anything_else() {
    let outcome = run(pool_json("v1", false), World::default()).await;
    outcome.result.expect("reconciled");
    assert_eq!(lines(&outcome.requests), vec![format!("PATCH {POOLS}")]);
    let patch = outcome.requests[0].body.to_string();
    assert!(
        patch.contains(FINALIZER) && patch.contains("add"),
        "{patch}"
    );
}

#[tokio::test]
async fn the_first_version_is_preprocessed_before_any_worker_runs() {
    let outcome = run(pool_json("v1", true), World::default()).await;
    let action = outcome.result.expect("reconciled");
    let job = job_name("wiki", "v1");
    assert_eq!(
        lines(&outcome.requests),
        vec![
            format!("GET {WORKERS}"),
            "PATCH /api/v1/namespaces/rag/configmaps/wiki-config".to_string(),
            "PATCH /api/v1/namespaces/rag/services/wiki".to_string(),
            "PATCH /apis/policy/v1/namespaces/rag/poddisruptionbudgets/wiki".to_string(),
            format!("PATCH {CLAIMS}/wiki-origin"),
            format!("GET {JOBS}/{job}"),
            format!("PATCH {JOBS}/{job}"),
            format!("POST {EVENTS}"),
            format!("GET {PODS}"),
            format!("PATCH {WORKERS}"),
            format!("GET {PODS}"),
            format!("PATCH {POOLS}/status"),
        ]
    );
    let workers = applied(&outcome.requests, WORKERS);
    assert_eq!(
        workers["spec"]["replicas"], 0,
        "no workers before a version is preprocessed"
    );
    let job_body = applied(&outcome.requests, &format!("{JOBS}/{job}"));
    assert!(job_body.to_string().contains("\"--expect-version\",\"v1\""));
    let status = status_patch(&outcome.requests);
    assert_eq!(condition(status, "Ready"), ("False", "NoVersionServed"));
    assert_eq!(condition(status, "Progressing"), ("True", "Preprocessing"));
    assert_eq!(status["preprocessing"]["phase"], "Running");
    assert_eq!(status["observedGeneration"], 3);
    assert_eq!(action, Action::requeue(Duration::from_secs(15)));
}

#[tokio::test]
async fn a_corpus_version_change_runs_the_job_then_switches_the_workers() {
    // v2 asked for while v1 is served: the Job runs, the workers stay on v1.
    let running = World {
        workers: Some(workers_serving("v1")),
        jobs: vec![job("v2", None)],
        ready: vec![0, 1],
        ..World::default()
    };
    let outcome = run(pool_json("v2", true), running).await;
    outcome.result.expect("reconciled");
    let workers = applied(&outcome.requests, WORKERS);
    assert_eq!(workers["spec"]["replicas"], 2);
    assert_eq!(
        workers["spec"]["template"]["metadata"]["annotations"]["hasten.dev/corpus-version"],
        "v1"
    );
    assert!(!outcome.requests.iter().any(|r| r.method == "DELETE"));
    let status = status_patch(&outcome.requests);
    assert_eq!(status["servingVersion"], "v1");
    assert_eq!(condition(status, "Ready"), ("True", "WorkersReady"));
    assert_eq!(condition(status, "Progressing"), ("True", "Preprocessing"));

    // The Job succeeded: the workers switch to v2 and v1's Job goes.
    let done = World {
        workers: Some(workers_serving("v1")),
        jobs: vec![job("v2", Some("Complete"))],
        job_message: Some(r#"{"corpus_version":"v2","done":1200,"total":1200}"#.into()),
        ready: vec![0, 1],
        ..World::default()
    };
    let outcome = run(pool_json("v2", true), done).await;
    outcome.result.expect("reconciled");
    let sequence = lines(&outcome.requests);
    let position = |line: String| {
        sequence
            .iter()
            .position(|l| *l == line)
            .unwrap_or_else(|| panic!("{line} missing from {sequence:#?}"))
    };
    assert!(
        position(format!("PATCH {WORKERS}"))
            < position(format!("DELETE {JOBS}/{}", job_name("wiki", "v1")))
    );
    let workers = applied(&outcome.requests, WORKERS);
    assert_eq!(
        workers["spec"]["template"]["metadata"]["annotations"]["hasten.dev/corpus-version"],
        "v2"
    );
    let sync = workers["spec"]["template"]["spec"]["initContainers"][0]["command"].to_string();
    assert!(sync.contains("\"--version\",\"v2\""), "{sync}");
    let status = status_patch(&outcome.requests);
    assert_eq!(status["servingVersion"], "v2");
    assert_eq!(status["preprocessing"]["preprocessedChunks"], 1200);
    assert_eq!(status["preprocessing"]["totalChunks"], 1200);
    assert_eq!(
        status["workers"][1],
        "wiki-1.wiki.rag.svc.cluster.local:7510"
    );
    assert!(status["assignmentVersion"].is_string());
}

#[tokio::test]
async fn a_running_job_reports_the_last_progress_line_of_its_pod_log() {
    let log = [
        r#"{"preprocessing":{"step":"full-reuse","done":642,"total":642},"chunks_per_s":2.7,"left_s":0}"#,
        r#"{"preprocessing":{"step":"similarity","done":40,"total":205},"chunks_per_s":1.1,"left_s":150}"#,
        "2026-11-27T12:29:14Z INFO kv_worker: a line that is not progress",
        r#"{"preprocessing":{"step":"similarity","done":120,"total":205},"chunks_per_s":1.1,"left_s":77}"#,
        r#"{"other":"json"}"#,
    ]
    .join("\n");
    let running = World {
        workers: Some(workers_serving("v1")),
        jobs: vec![job("v2", None)],
        job_log: Some((200, log)),
        ready: vec![0, 1],
        ..World::default()
    };
    let outcome = run(pool_json("v2", true), running).await;
    outcome.result.expect("reconciled");
    let read = outcome
        .requests
        .iter()
        .find(|r| r.is("GET", "/pods/job-pod/log"))
        .unwrap_or_else(|| {
            panic!(
                "the pod's log was not read: {:#?}",
                lines(&outcome.requests)
            )
        });
    assert!(
        read.query.contains("container=preprocess") && read.query.contains("tailLines="),
        "{}",
        read.query
    );
    let status = status_patch(&outcome.requests);
    assert_eq!(status["preprocessing"]["phase"], "Running");
    assert_eq!(
        status["preprocessing"]["progress"],
        json!({"step": "similarity", "done": 120, "total": 205})
    );
    assert!(status["preprocessing"].get("preprocessedChunks").is_none());
    assert!(
        outcome
            .metrics
            .contains(r#"hasten_kv_pool_preprocessing_step_done{namespace="rag",pool="wiki"} 120"#),
        "{}",
        outcome.metrics
    );

    // A log that cannot be read yet (the pod is starting) leaves the progress out and the
    // reconcile goes on.
    let starting = World {
        workers: Some(workers_serving("v1")),
        jobs: vec![job("v2", None)],
        job_log: Some((400, String::new())),
        ready: vec![0, 1],
        ..World::default()
    };
    let outcome = run(pool_json("v2", true), starting).await;
    outcome.result.expect("reconciled");
    let status = status_patch(&outcome.requests);
    assert_eq!(status["preprocessing"]["phase"], "Running");
    assert!(
        status["preprocessing"].get("progress").is_none(),
        "{status}"
    );
    assert_eq!(condition(status, "Progressing"), ("True", "Preprocessing"));
}

#[tokio::test]
async fn a_failed_job_degrades_the_pool_and_keeps_the_old_version() {
    let failed = World {
        workers: Some(workers_serving("v1")),
        jobs: vec![job("v2", Some("Failed"))],
        ready: vec![0, 1],
        ..World::default()
    };
    let outcome = run(pool_json("v2", true), failed).await;
    outcome.result.expect("reconciled");
    let workers = applied(&outcome.requests, WORKERS);
    assert_eq!(
        workers["spec"]["template"]["metadata"]["annotations"]["hasten.dev/corpus-version"],
        "v1"
    );
    let status = status_patch(&outcome.requests);
    assert_eq!(
        condition(status, "Degraded"),
        ("True", "PreprocessingFailed")
    );
    assert_eq!(status["servingVersion"], "v1");
}

#[tokio::test]
async fn an_invalid_spec_is_reported_and_nothing_is_applied() {
    let mut pool = pool_json("v1", true);
    // The schema checks the model path's shape, not that it stays inside its claim.
    pool["spec"]["model"]["path"] = json!("../other/model.gguf");
    let outcome = run(pool, World::default()).await;
    assert_eq!(outcome.result.expect("reconciled"), Action::await_change());
    assert_eq!(
        lines(&outcome.requests),
        vec![format!("PATCH {POOLS}/status"), format!("POST {EVENTS}")]
    );
    let status = status_patch(&outcome.requests);
    assert_eq!(condition(status, "Degraded"), ("True", "InvalidSpec"));
    assert_eq!(condition(status, "Ready"), ("False", "InvalidSpec"));
}

#[tokio::test]
async fn a_conflict_requeues_at_once_and_other_errors_back_off() {
    let outcome = run(
        pool_json("v1", true),
        World {
            status_reply: Some(conflict()),
            ..World::default()
        },
    )
    .await;
    let error = outcome.result.expect_err("the status patch conflicted");
    assert!(error.is_conflict(), "{error}");
    assert_eq!(
        outcome.action_after_error,
        Some(Action::requeue(Duration::from_secs(1)))
    );

    let outcome = run(
        pool_json("v1", true),
        World {
            workers_get_reply: Some(status(500, "InternalError")),
            ..World::default()
        },
    )
    .await;
    let error = outcome.result.expect_err("the API failed");
    assert!(!error.is_conflict());
    // 5 s after a first failure, with up to as much again at random.
    let after = requeue_after(&outcome.action_after_error.expect("an action"));
    assert!(
        after >= Duration::from_secs(5) && after < Duration::from_secs(10),
        "{after:?}"
    );
    // Nothing was applied after the failed read.
    assert_eq!(lines(&outcome.requests), vec![format!("GET {WORKERS}")]);
}

#[tokio::test]
async fn deletion_removes_the_volume_claims_then_the_finalizer() {
    let mut pool = pool_json("v1", true);
    pool["metadata"]["deletionTimestamp"] = json!("2026-11-26T12:00:00Z");
    let outcome = run(pool, World::default()).await;
    outcome.result.expect("cleaned up");
    assert_eq!(
        lines(&outcome.requests),
        vec![
            format!("DELETE {CLAIMS}"),
            format!("POST {EVENTS}"),
            format!("PATCH {POOLS}")
        ]
    );
    assert!(
        outcome.requests[0]
            .query
            .contains("labelSelector=hasten.dev%2Fpool%3Dwiki"),
        "{}",
        outcome.requests[0].query
    );
    let removal = outcome.requests[2].body.to_string();
    assert!(removal.contains("remove"), "{removal}");
}

#[tokio::test]
async fn a_changed_assignment_is_published_once_and_a_failed_publication_retried() {
    let serving = || World {
        workers: Some(workers_serving("v1")),
        ready: vec![0, 1],
        ..World::default()
    };
    let publisher = Arc::new(RecordingPublisher::default());
    let outcome = run_publishing(pool_json("v1", true), serving(), Some(publisher.clone())).await;
    outcome.result.expect("reconciled");
    let published = publisher.published.lock().expect("lock").clone();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].pool, "rag/wiki");
    assert_eq!(
        published[0].workers,
        vec![
            "wiki-0.wiki.rag.svc.cluster.local:7510",
            "wiki-1.wiki.rag.svc.cluster.local:7510"
        ]
    );
    let status = status_patch(&outcome.requests);
    assert_eq!(
        status["publishedAssignmentVersion"],
        status["assignmentVersion"]
    );
    let version = published[0].assignment_version.clone();

    // Already published: nothing proposed.
    let mut pool = pool_json("v1", true);
    pool["status"] = json!({"publishedAssignmentVersion": version});
    let publisher = Arc::new(RecordingPublisher::default());
    run_publishing(pool.clone(), serving(), Some(publisher.clone()))
        .await
        .result
        .expect("reconciled");
    assert!(publisher.published.lock().expect("lock").is_empty());

    // A worker left: the new assignment is proposed; the control plane is down, so the
    // status keeps the version it has.
    let publisher = Arc::new(RecordingPublisher {
        unreachable: true,
        ..RecordingPublisher::default()
    });
    let one_left = World {
        ready: vec![1],
        ..serving()
    };
    let outcome = run_publishing(pool, one_left, Some(publisher.clone())).await;
    outcome
        .result
        .expect("a failed publication does not fail the reconcile");
    let tried = publisher.published.lock().expect("lock").clone();
    assert_eq!(
        tried[0].workers,
        vec!["wiki-1.wiki.rag.svc.cluster.local:7510"]
    );
    let status = status_patch(&outcome.requests);
    assert_eq!(status["publishedAssignmentVersion"], json!(version));
    assert_ne!(status["assignmentVersion"], json!(version));
}
