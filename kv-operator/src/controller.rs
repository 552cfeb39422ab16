//! The controller loop: watches pools and the StatefulSets and Jobs they own, and runs
//! [`crate::reconcile`] on every change (and on the requeues it asks for).

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::Controller;
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::crd::KvWorkerPool;
use crate::reconcile::{Context, error_policy, reconcile};

/// Runs until the process is asked to stop (SIGTERM/SIGINT).
pub async fn run(client: Client, namespace: &str, ctx: Arc<Context>) {
    let pools: Api<KvWorkerPool> = Api::namespaced(client.clone(), namespace);
    let owned =
        watcher::Config::default().labels("app.kubernetes.io/managed-by=hasten-kv-operator");
    Controller::new(pools, watcher::Config::default())
        .owns(
            Api::<StatefulSet>::namespaced(client.clone(), namespace),
            owned.clone(),
        )
        .owns(Api::<Job>::namespaced(client, namespace), owned)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((pool, _)) => tracing::debug!(pool = %pool.name, "reconciled"),
                Err(err) => {
                    tracing::debug!(error = %err.display_full(), "reconcile did not complete")
                }
            }
        })
        .await;
}
