//! The operator's errors, each keeping its source.

/// Why a reconcile or the leader lease failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
    #[error("rendering the {kind}")]
    Render {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the pool has no {0}")]
    MissingObjectKey(&'static str),
    #[error("the leader lease {0} is held elsewhere or could not be renewed in time")]
    LeaseLost(String),
    #[error("finalizer")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// A short label for metrics and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube(kube::Error::Api(status)) if status.code == 409 => "conflict",
            Self::Kube(_) => "api",
            Self::Render { .. } => "render",
            Self::MissingObjectKey(_) => "object",
            Self::Finalizer(_) => "finalizer",
            Self::LeaseLost(_) => "lease",
        }
    }

    /// Whether another writer changed the object first (retry soon, not with backoff).
    pub fn is_conflict(&self) -> bool {
        match self {
            Self::Kube(kube::Error::Api(status)) => status.code == 409,
            Self::Finalizer(inner) => {
                matches!(
                    inner.as_ref(),
                    kube::runtime::finalizer::Error::ApplyFailed(e)
                    | kube::runtime::finalizer::Error::CleanupFailed(e) if e.is_conflict()
                ) || matches!(
                    inner.as_ref(),
                    kube::runtime::finalizer::Error::AddFinalizer(kube::Error::Api(status))
                    | kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(status)) if status.code == 409
                )
            }
            _ => false,
        }
    }
}
