//! gRPC health checking (`grpc.health.v1.Health`) on every gRPC server, answering what the
//! process's `/readyz` answers: load balancers, service meshes and `grpc_health_probe` can ask
//! the gRPC port itself. (The chart's probes stay on `/readyz`: the kubelet's gRPC probe
//! cannot show a client certificate, and under mutual TLS every gRPC port asks for one.)

use std::sync::Arc;
use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::{HealthReporter, health_reporter};

/// Whether the process is ready, and if not why: the check `/readyz` runs.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// How often the readiness check runs again.
const RECHECK: Duration = Duration::from_secs(1);

/// The health service of a server whose readiness `ready` tells: the whole server (service
/// name `""`) is `SERVING` while it passes and `NOT_SERVING` while it fails, checked again
/// every second for as long as the process runs. Needs a tokio runtime.
pub fn readiness_health(ready: Readiness) -> HealthServer<impl Health> {
    let (reporter, service) = health_reporter();
    tokio::spawn(follow(reporter, ready));
    service
}

async fn follow(reporter: HealthReporter, ready: Readiness) {
    let mut every = tokio::time::interval(RECHECK);
    let mut reported = None;
    loop {
        every.tick().await;
        let status = match ready() {
            Ok(()) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        };
        if reported != Some(status) {
            reporter.set_service_status("", status).await;
            reported = Some(status);
        }
    }
}
