//! One preprocessing Job per corpus version: created by server-side apply when missing, its
//! phase read from its conditions, and its summary (chunks done of all) from the termination
//! message of its pod.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::events::EventType;
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;

use super::{Context, apply_object, publish_event};
use crate::crd::{KvWorkerPool, PreprocessingStatus};
use crate::error::Error;
use crate::resources::{self, job_name};

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
    let summary = if phase == JobPhase::Running {
        None
    } else {
        job_summary(&ctx.client, namespace, &name).await?
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
        },
    })
}

/// The summary in the termination message of the Job's last finished pod.
async fn job_summary(
    client: &Client,
    namespace: &str,
    job: &str,
) -> Result<Option<PreprocessSummary>, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await?;
    Ok(list
        .items
        .iter()
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
        .max_by_key(|summary| summary.done))
}

pub(super) async fn delete_job(client: &Client, namespace: &str, name: &str) -> Result<(), Error> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    match jobs.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err.into()),
    }
}
