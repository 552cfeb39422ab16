//! Publishing each pool's chunk-to-worker assignment through the Raft control plane, so that
//! every edge configured with the pool (`kv_pool`) routes by the same ready workers: a
//! `KvPoolAssignment` command, proposed to one control-plane node after another until one
//! commits it. The assignment is the ready workers' addresses; rendezvous hashing over them
//! (`hasten_worker_api::kv::routing`) gives each chunk's owner on every edge alike.

use display_full_error::DisplayFullErrorExt;
use std::time::Duration;

use futures::future::BoxFuture;
use hasten_proto::control::{self, ControlAccess};
use hasten_proto::v1::{ControlCommand, KvPoolAssignment, ProposeRequest, control_command};

/// How long one node may take to commit the proposal before the next is tried.
const PROPOSE_DEADLINE: Duration = Duration::from_secs(5);

/// Why an assignment was not published (the next reconcile tries again).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("no control-plane node committed the assignment: {0}")]
    Unreachable(String),
    #[error("the control plane refused the assignment")]
    Refused(#[source] tonic::Status),
}

/// Where assignments go.
pub trait AssignmentPublisher: Send + Sync {
    fn publish(&self, assignment: KvPoolAssignment) -> BoxFuture<'_, Result<(), PublishError>>;
}

/// Proposes assignments to a control plane.
pub struct ControlPlanePublisher {
    endpoints: Vec<String>,
    access: ControlAccess,
}

impl ControlPlanePublisher {
    pub fn new(endpoints: Vec<String>, access: ControlAccess) -> Self {
        Self { endpoints, access }
    }

    async fn propose(&self, assignment: KvPoolAssignment) -> Result<(), PublishError> {
        let request = ProposeRequest {
            commands: vec![ControlCommand {
                kind: Some(control_command::Kind::KvPool(assignment)),
            }],
        };
        let mut failures = Vec::new();
        for endpoint in &self.endpoints {
            let mut client = match control::connect(endpoint, &self.access).await {
                Ok(client) => client,
                Err(err) => {
                    failures.push(format!("{endpoint}: {}", err.display_full()));
                    continue;
                }
            };
            match tokio::time::timeout(PROPOSE_DEADLINE, client.propose(request.clone())).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                    return Err(PublishError::Refused(status));
                }
                Ok(Err(status)) => failures.push(format!("{endpoint}: {status}")),
                Err(_) => failures.push(format!("{endpoint}: no answer in {PROPOSE_DEADLINE:?}")),
            }
        }
        Err(PublishError::Unreachable(failures.join("; ")))
    }
}

impl AssignmentPublisher for ControlPlanePublisher {
    fn publish(&self, assignment: KvPoolAssignment) -> BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(self.propose(assignment))
    }
}
