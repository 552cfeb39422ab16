//! The pool's conditions (`Ready`, `Progressing`, `Degraded`), each keeping its transition
//! time while its status stays.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::crd::{KvWorkerPool, KvWorkerPoolStatus};

pub(super) fn ready_condition(
    pool: &KvWorkerPool,
    serving: Option<&str>,
    ready: i32,
    previous: &KvWorkerPoolStatus,
    now: &Time,
) -> Condition {
    let wanted = pool.spec.replicas;
    match serving {
        None => condition(
            "Ready",
            false,
            "NoVersionServed",
            format!(
                "no workers until corpus version {} is preprocessed",
                pool.spec.corpus.version
            ),
            previous,
            now,
        ),
        Some(_) if wanted == 0 => condition(
            "Ready",
            false,
            "ScaledToZero",
            "replicas is 0".into(),
            previous,
            now,
        ),
        Some(version) if ready >= wanted => condition(
            "Ready",
            true,
            "WorkersReady",
            format!("{ready} workers serve corpus version {version}"),
            previous,
            now,
        ),
        Some(_) => condition(
            "Ready",
            false,
            "WorkersNotReady",
            format!("{ready} of {wanted} workers ready"),
            previous,
            now,
        ),
    }
}

/// A condition, keeping the previous transition time when its status did not change.
pub(super) fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    previous: &KvWorkerPoolStatus,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = previous
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time,
    }
}
