//! One reconcile of a `KvWorkerPool`: validate, apply the desired objects by server-side
//! apply, run the corpus version's preprocessing Job and switch the workers to it once it
//! succeeded, report status; on deletion, delete what owner references cannot (the workers'
//! volume claims) before the finalizer goes.

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_core::retry::jittered;
use hasten_proto::v1::KvPoolAssignment;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Api, Client, Resource, ResourceExt};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::crd::{KvWorkerPool, KvWorkerPoolStatus};
use crate::error::Error;
use crate::metrics::OperatorMetrics;
use crate::publish::AssignmentPublisher;
use crate::resources::{
    self, FIELD_MANAGER, POOL_LABEL, RenderSettings, SERVING_ANNOTATION, job_name,
};
use crate::validate::{InvalidSpec, validate};

mod conditions;
mod jobs;

use conditions::{condition, ready_condition};
use jobs::{JobPhase, delete_job, preprocess};

/// The finalizer the operator puts on every pool.
pub const FINALIZER: &str = "hasten.dev/kv-worker-pool";
/// Requeue while something moves (a Job runs, workers roll), and when all is steady.
const REQUEUE_PROGRESSING: Duration = Duration::from_secs(15);
const REQUEUE_STEADY: Duration = Duration::from_secs(300);
/// Requeue after a conflict (another writer changed the object first): soon, no backoff.
pub const REQUEUE_CONFLICT: Duration = Duration::from_secs(1);

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: RenderSettings,
    pub metrics: OperatorMetrics,
    pub recorder: Recorder,
    /// Where the assignments go, when a control plane is configured.
    publisher: Option<Arc<dyn AssignmentPublisher>>,
    /// Consecutive failures per pool (namespace/name), for the backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    pub fn new(
        client: Client,
        settings: RenderSettings,
        metrics: OperatorMetrics,
        recorder: Recorder,
    ) -> Self {
        Self {
            client,
            settings,
            metrics,
            recorder,
            publisher: None,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Publishes every pool's assignment through `publisher` when it changes.
    pub fn with_publisher(mut self, publisher: Arc<dyn AssignmentPublisher>) -> Self {
        self.publisher = Some(publisher);
        self
    }
}

fn pool_key(pool: &KvWorkerPool) -> String {
    format!(
        "{}/{}",
        pool.namespace().unwrap_or_default(),
        pool.name_any()
    )
}

/// Reconciles one pool (the controller's reconcile function).
#[tracing::instrument(skip_all, fields(pool = %pool_key(&pool)))]
pub async fn reconcile(pool: Arc<KvWorkerPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let key = pool_key(&pool);
    let namespace = pool
        .namespace()
        .ok_or(Error::MissingObjectKey("metadata.namespace"))?;
    let api: Api<KvWorkerPool> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, pool, |event| async {
        match event {
            Event::Apply(pool) => apply(&pool, &ctx).await,
            Event::Cleanup(pool) => cleanup(&pool, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .reconciled(started.elapsed(), result.as_ref().err().map(Error::reason));
    if result.is_ok() {
        ctx.failures.lock().remove(&key);
    }
    result
}

/// What the controller does after a failed reconcile: retry a conflict at once, anything else
/// with exponential backoff per pool.
pub fn error_policy(pool: Arc<KvWorkerPool>, error: &Error, ctx: Arc<Context>) -> Action {
    if error.is_conflict() {
        tracing::debug!(pool = %pool_key(&pool), error = %error.display_full(), "conflict; requeued");
        return Action::requeue(REQUEUE_CONFLICT);
    }
    let failures = {
        let mut failures = ctx.failures.lock();
        let count = failures.entry(pool_key(&pool)).or_insert(0);
        *count += 1;
        *count
    };
    let delay = backoff(failures);
    tracing::warn!(pool = %pool_key(&pool), error = %error.display_full(), failures, ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// 5 s after the first failure, doubling, at most 5 minutes, each with up to as much again
/// at random (operators restarted together do not requeue in lockstep).
pub fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(6);
    jittered(Duration::from_secs(5 << exponent).min(Duration::from_secs(300)))
}

async fn publish_event(
    ctx: &Context,
    pool: &KvWorkerPool,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    // Events are for people; failing to record one must not fail the reconcile.
    if let Err(err) = ctx.recorder.publish(&event, &pool.object_ref(&())).await {
        tracing::warn!(error = %err.display_full(), reason, "event not recorded");
    }
}

async fn apply_object<K>(client: &Client, namespace: &str, object: &K) -> Result<K, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let name = object
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingObjectKey("metadata.name"))?;
    Ok(api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await?)
}

async fn apply(pool: &KvWorkerPool, ctx: &Context) -> Result<Action, Error> {
    let name = pool.name_any();
    let namespace = pool
        .namespace()
        .ok_or(Error::MissingObjectKey("metadata.namespace"))?;
    let budgets = match validate(&name, &pool.spec) {
        Ok(budgets) => budgets,
        Err(invalid) => return refuse(pool, ctx, invalid).await,
    };
    let client = &ctx.client;
    let workers_api: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
    let serving = workers_api
        .get_opt(&name)
        .await?
        .and_then(|set| set.metadata.annotations)
        .and_then(|annotations| annotations.get(SERVING_ANNOTATION).cloned());
    let target = pool.spec.corpus.version.clone();

    // What does not depend on the served version first: the Job writes into the origin claim.
    let desired = resources::desired(pool, budgets, &ctx.settings)?;
    apply_object::<ConfigMap>(client, &namespace, &desired.config_map).await?;
    apply_object::<Service>(client, &namespace, &desired.service).await?;
    apply_object::<PodDisruptionBudget>(client, &namespace, &desired.pod_disruption_budget).await?;
    apply_object::<PersistentVolumeClaim>(client, &namespace, &desired.origin).await?;

    let mut preprocessing = pool
        .status
        .as_ref()
        .and_then(|status| status.preprocessing.clone())
        .filter(|preprocessing| preprocessing.version == target);
    let mut now_serving = serving.clone();
    if serving.as_deref() != Some(target.as_str()) {
        let job = preprocess(pool, ctx, &namespace, &target).await?;
        if job.phase == JobPhase::Succeeded {
            now_serving = Some(target.clone());
        }
        preprocessing = Some(job.status);
    }
    let stateful_set = resources::workers(pool, &desired, now_serving.as_deref(), &ctx.settings)?;
    let applied = apply_object::<StatefulSet>(client, &namespace, &stateful_set).await?;
    if now_serving != serving {
        publish_event(
            ctx,
            pool,
            EventType::Normal,
            "Switched",
            format!(
                "workers switch to corpus version {target} (from {})",
                serving.as_deref().unwrap_or("none")
            ),
        )
        .await;
        if let Some(previous) = &serving {
            delete_job(client, &namespace, &job_name(&name, previous)).await?;
        }
    }

    let ready_workers = ready_workers(pool, ctx, &namespace).await?;
    let replicas = applied
        .status
        .as_ref()
        .map(|status| status.replicas)
        .unwrap_or(0);
    let ready = i32::try_from(ready_workers.len()).unwrap_or(i32::MAX);
    let workers: Vec<String> = ready_workers
        .iter()
        .map(|ordinal| resources::worker_address(pool, *ordinal, &ctx.settings))
        .collect();
    let previous = pool.status.clone().unwrap_or_default();
    let running = preprocessing
        .as_ref()
        .is_some_and(|job| job.phase == JobPhase::Running.as_str());
    let failed = preprocessing
        .as_ref()
        .is_some_and(|job| job.phase == JobPhase::Failed.as_str());
    let progressing = running || ready < pool.spec.replicas || replicas != pool.spec.replicas;
    let now = Time(Timestamp::now());
    let conditions = vec![
        ready_condition(pool, now_serving.as_deref(), ready, &previous, &now),
        if running {
            condition(
                "Progressing",
                true,
                "Preprocessing",
                format!("preprocessing corpus version {target}"),
                &previous,
                &now,
            )
        } else if progressing {
            condition(
                "Progressing",
                true,
                "RollingOut",
                format!("{ready} of {} workers ready", pool.spec.replicas),
                &previous,
                &now,
            )
        } else {
            condition(
                "Progressing",
                false,
                "Stable",
                "workers ready on the spec's corpus version".into(),
                &previous,
                &now,
            )
        },
        if failed {
            condition(
                "Degraded",
                true,
                "PreprocessingFailed",
                format!(
                    "the preprocessing Job of corpus version {target} failed; serving {}",
                    now_serving.as_deref().unwrap_or("nothing")
                ),
                &previous,
                &now,
            )
        } else {
            condition(
                "Degraded",
                false,
                "AsExpected",
                String::new(),
                &previous,
                &now,
            )
        },
    ];
    let assignment = resources::assignment_version(&workers);
    let published = publish(ctx, pool, &namespace, &workers, &assignment, &previous).await;
    let status = KvWorkerPoolStatus {
        observed_generation: pool.metadata.generation,
        replicas,
        ready_replicas: ready,
        selector: Some(resources::selector_string(&name)),
        serving_version: now_serving.clone(),
        preprocessing: preprocessing.clone(),
        assignment_version: Some(assignment),
        published_assignment_version: published,
        workers,
        conditions,
    };
    patch_status(ctx, pool, &status).await?;
    let running_job = preprocessing.as_ref().filter(|_| running);
    let age = running_job
        .and_then(|job| job.start_time.as_ref())
        .map(|started| (Timestamp::now().as_second() - started.0.as_second()).max(0) as f64)
        .unwrap_or(0.0);
    let done = running_job
        .and_then(|job| job.progress.as_ref())
        .map_or(0, |progress| progress.done);
    ctx.metrics
        .pool(&namespace, &name, pool.spec.replicas, ready, (age, done));
    Ok(Action::requeue(if progressing {
        REQUEUE_PROGRESSING
    } else {
        REQUEUE_STEADY
    }))
}

/// Publishes the pool's assignment unless the control plane has it already; returns the
/// version the control plane holds as far as this operator knows. A failure is logged and
/// retried at the next reconcile: the workers serve meanwhile, edges route by the previous
/// assignment (a worker that left is skipped as down).
async fn publish(
    ctx: &Context,
    pool: &KvWorkerPool,
    namespace: &str,
    workers: &[String],
    assignment: &str,
    previous: &KvWorkerPoolStatus,
) -> Option<String> {
    let known = previous.published_assignment_version.clone();
    let Some(publisher) = &ctx.publisher else {
        return known;
    };
    if known.as_deref() == Some(assignment) {
        return known;
    }
    let published = publisher
        .publish(KvPoolAssignment {
            pool: format!("{namespace}/{}", pool.name_any()),
            workers: workers.to_vec(),
            assignment_version: assignment.to_string(),
        })
        .await;
    match published {
        Ok(()) => {
            ctx.metrics.published(None);
            publish_event(
                ctx,
                pool,
                EventType::Normal,
                "AssignmentPublished",
                format!(
                    "assignment {assignment} over {} workers committed by the control plane",
                    workers.len()
                ),
            )
            .await;
            Some(assignment.to_string())
        }
        Err(err) => {
            ctx.metrics.published(Some(&err));
            tracing::warn!(error = %err.display_full(), assignment, "assignment not published; retried at the next reconcile");
            known
        }
    }
}

/// Reports an invalid spec in the conditions and changes nothing else.
async fn refuse(pool: &KvWorkerPool, ctx: &Context, invalid: InvalidSpec) -> Result<Action, Error> {
    let previous = pool.status.clone().unwrap_or_default();
    let now = Time(Timestamp::now());
    let message = invalid.to_string();
    let status = KvWorkerPoolStatus {
        observed_generation: pool.metadata.generation,
        conditions: vec![
            condition(
                "Ready",
                false,
                "InvalidSpec",
                message.clone(),
                &previous,
                &now,
            ),
            condition(
                "Progressing",
                false,
                "InvalidSpec",
                "nothing applied".into(),
                &previous,
                &now,
            ),
            condition(
                "Degraded",
                true,
                "InvalidSpec",
                message.clone(),
                &previous,
                &now,
            ),
        ],
        ..previous.clone()
    };
    patch_status(ctx, pool, &status).await?;
    publish_event(ctx, pool, EventType::Warning, "InvalidSpec", message).await;
    Ok(Action::await_change())
}

async fn patch_status(
    ctx: &Context,
    pool: &KvWorkerPool,
    status: &KvWorkerPoolStatus,
) -> Result<(), Error> {
    let api: Api<KvWorkerPool> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    api.patch_status(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    Ok(())
}

/// Ordinals of the pool's worker pods that are Ready, ascending.
async fn ready_workers(
    pool: &KvWorkerPool,
    ctx: &Context,
    namespace: &str,
) -> Result<Vec<i32>, Error> {
    let name = pool.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&resources::selector_string(&name)))
        .await?;
    let prefix = format!("{name}-");
    let mut ordinals: Vec<i32> = list
        .items
        .iter()
        .filter(|pod| {
            pod.status
                .as_ref()
                .and_then(|status| status.conditions.as_ref())
                .is_some_and(|conditions| {
                    conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
        })
        .filter_map(|pod| {
            pod.metadata
                .name
                .as_deref()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()
        })
        .collect();
    ordinals.sort_unstable();
    Ok(ordinals)
}

/// Deletes the workers' volume claims (StatefulSets leave them behind on purpose; owner
/// references do not reach them), then lets the finalizer go.
async fn cleanup(pool: &KvWorkerPool, ctx: &Context) -> Result<Action, Error> {
    let name = pool.name_any();
    let namespace = pool
        .namespace()
        .ok_or(Error::MissingObjectKey("metadata.namespace"))?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    claims
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{POOL_LABEL}={name}")),
        )
        .await?;
    publish_event(
        ctx,
        pool,
        EventType::Normal,
        "CleanedUp",
        "deleted the workers' volume claims".into(),
    )
    .await;
    ctx.metrics.forget(&namespace, &name);
    Ok(Action::await_change())
}
