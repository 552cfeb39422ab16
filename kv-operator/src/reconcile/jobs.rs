//! One preprocessing Job per corpus version: created by server-side apply when missing, its
//! phase read from its conditions; while it runs, its progress from the last progress line in
//! its pod's log, and once it ended, its summary (chunks done of all) from the termination
//! message of its pod.

use display_full_error::DisplayFullErrorExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, LogParams};
use kube::runtime::events::EventType;
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;

use super::{Context, apply_object, publish_event};
use crate::crd::{KvWorkerPool, PreprocessingProgress, PreprocessingStatus};
use crate::error::Error;
use crate::resources::{self, PREPROCESS_CONTAINER, job_name};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JobPhase {
    Running,
    Succeeded,
    Failed,
}

impl JobPhase {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }

    fn of(job: &Job) -> Self {
        let conditions = job
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref());
        let has = |type_: &str| {
            conditions.is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == type_ && c.status == "True")
            })
        };
        if has("Complete") {
            Self::Succeeded
        } else if has("Failed") {
            Self::Failed
        } else {
            Self::Running
        }
    }
}

pub(super) struct JobOutcome {
    pub(super) phase: JobPhase,
    pub(super) status: PreprocessingStatus,
}

/// What `kv-worker preprocess --summary-file` writes as the Job's termination message.
#[derive(Deserialize)]
struct PreprocessSummary {
    done: u64,
    total: u64,
}

/// A progress line `kv-worker preprocess` logs every few seconds when not on a terminal
/// (`hasten_kv_worker::progress::ProgressLine`; other fields ignored).
#[derive(Deserialize)]
struct ProgressLine {
    preprocessing: PreprocessingProgress,
}

/// How much of the log's end is read for the last progress line: lines come every 10 s, so a
/// few dozen lines reach back far enough even with other logging in between.
const LOG_TAIL_LINES: i64 = 50;
const LOG_LIMIT_BYTES: i64 = 64 * 1024;

/// Creates the version's preprocessing Job unless it exists, and reads how it went.
pub(super) async fn preprocess(
    pool: &KvWorkerPool,
    ctx: &Context,
    namespace: &str,
    version: &str,
) -> Result<JobOutcome, Error> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), namespace);
    let name = job_name(&pool.name_any(), version);
    let job = match jobs.get_opt(&name).await? {
        Some(job) => job,
        None => {
            let job = resources::preprocess_job(pool, version, &ctx.settings)?;
            let created = apply_object::<Job>(&ctx.client, namespace, &job).await?;
            publish_event(
                ctx,
                pool,
                EventType::Normal,
                "PreprocessingStarted",
                format!("Job {name} preprocesses corpus version {version}"),
            )
            .await;
            created
        }
    };
    let phase = JobPhase::of(&job);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let job_pods = pods
        .list(&ListParams::default().labels(&format!("job-name={name}")))
        .await?
        .items;
    let (summary, progress) = if phase == JobPhase::Running {
        (None, job_progress(&pods, &job_pods).await)
    } else {
        (job_summary(&job_pods), None)
    };
    if phase == JobPhase::Failed {
        publish_event(
            ctx,
            pool,
            EventType::Warning,
            "PreprocessingFailed",
            format!("Job {name} of corpus version {version} failed"),
        )
        .await;
    }
    Ok(JobOutcome {
        phase,
        status: PreprocessingStatus {
            version: version.into(),
            job: name,
            phase: phase.as_str().into(),
            start_time: job
                .status
                .as_ref()
                .and_then(|status| status.start_time.clone()),
            preprocessed_chunks: summary.as_ref().map(|s| s.done),
            total_chunks: summary.as_ref().map(|s| s.total),
            progress,
        },
    })
}

/// The summary in the termination message of the Job's last finished pod.
fn job_summary(pods: &[Pod]) -> Option<PreprocessSummary> {
    pods.iter()
        .filter_map(|pod| pod.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .filter_map(|status| {
            status
                .state
                .as_ref()?
                .terminated
                .as_ref()?
                .message
                .as_deref()
        })
        .filter_map(|message| serde_json::from_str::<PreprocessSummary>(message).ok())
        .max_by_key(|summary| summary.done)
}

/// The last progress line in the log of the Job's running pod. `None` before it logs one,
/// and when the log cannot be read (a pod still starting answers 400): progress is shown to
/// people, the Job's conditions alone decide what the operator does.
async fn job_progress(api: &Api<Pod>, pods: &[Pod]) -> Option<PreprocessingProgress> {
    let running = pods.iter().find(|pod| {
        pod.status
            .as_ref()
            .and_then(|status| status.phase.as_deref())
            == Some("Running")
    })?;
    let params = LogParams {
        container: Some(PREPROCESS_CONTAINER.into()),
        tail_lines: Some(LOG_TAIL_LINES),
        limit_bytes: Some(LOG_LIMIT_BYTES),
        ..LogParams::default()
    };
    let name = running.name_any();
    match api.logs(&name, &params).await {
        Ok(log) => last_progress(&log),
        Err(error) => {
            tracing::debug!(pod = %name, error = %error.display_full(), "preprocessing log unreadable");
            None
        }
    }
}

fn last_progress(log: &str) -> Option<PreprocessingProgress> {
    log.lines()
        .rev()
        .find_map(|line| serde_json::from_str::<ProgressLine>(line.trim()).ok())
        .map(|line| line.preprocessing)
}

pub(super) async fn delete_job(client: &Client, namespace: &str, name: &str) -> Result<(), Error> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    match jobs.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err.into()),
    }
}
