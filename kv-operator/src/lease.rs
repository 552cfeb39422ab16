//! Leader election over a `coordination.k8s.io/v1` Lease, so that of several operator replicas
//! exactly one reconciles. A replica takes the lease when it is free or its holder has not
//! renewed it within its duration; every write carries the resourceVersion it read, so two
//! replicas racing for it cannot both win (the API server refuses the second with 409). The
//! holder renews it every `renew_every`; one that cannot renew within `renew_deadline` stops
//! acting before anyone else may take over.

use display_full_error::DisplayFullErrorExt;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;
use tokio::time::Instant;

use crate::error::Error;

/// The lease's name, namespace and timings, and who this replica is.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a holder that stopped renewing keeps the lease.
    pub duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
    /// A holder that has not renewed for this long stops acting (less than `duration`).
    pub renew_deadline: Duration,
}

/// What one attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the lease (acquired or renewed).
    Held,
    /// Another replica holds it, or won the race for it.
    HeldElsewhere,
}

/// One replica's side of the election.
pub struct LeaderLease {
    api: Api<Lease>,
    settings: LeaseSettings,
}

impl LeaderLease {
    pub fn new(client: kube::Client, settings: LeaseSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
        }
    }

    /// Takes the lease if it is free or expired, renews it if held here.
    pub async fn try_acquire_or_renew(&self) -> Result<Attempt, Error> {
        let now = Timestamp::now();
        let me = &self.settings.identity;
        let seconds = i32::try_from(self.settings.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return conflict_is_lost(self.api.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let held_here = spec.holder_identity.as_deref() == Some(me.as_str());
        if !held_here && !expired(&spec, now) {
            return Ok(Attempt::HeldElsewhere);
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(me.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: if held_here {
                spec.acquire_time
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if held_here {
                transitions
            } else {
                transitions + 1
            }),
            ..spec
        });
        // The resourceVersion read above travels with the replacement: a write in between
        // makes this one fail with 409.
        conflict_is_lost(
            self.api
                .replace(&self.settings.name, &PostParams::default(), &lease)
                .await,
        )
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) -> Result<(), Error> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => return Ok(()),
                Ok(Attempt::HeldElsewhere) => {}
                Err(err) => {
                    tracing::warn!(error = %err.display_full(), "leader lease unreadable; retrying")
                }
            }
            tokio::time::sleep(self.settings.renew_every).await;
        }
    }

    /// Renews the lease until a renewal has failed for `renew_deadline`; returns then (the
    /// caller must stop acting).
    pub async fn keep(&self) -> Error {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.settings.renew_every).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => renewed = Instant::now(),
                Ok(Attempt::HeldElsewhere) => return Error::LeaseLost(self.settings.name.clone()),
                Err(err) => tracing::warn!(error = %err.display_full(), "leader lease not renewed"),
            }
            if renewed.elapsed() >= self.settings.renew_deadline {
                return Error::LeaseLost(self.settings.name.clone());
            }
        }
    }
}

/// Whether a holder's lease has run out at `now` (no holder or no renewal counts as out).
pub fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let (Some(_), Some(renewed)) = (&spec.holder_identity, &spec.renew_time) else {
        return true;
    };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    renewed.0 + duration < now
}

fn conflict_is_lost(result: Result<Lease, kube::Error>) -> Result<Attempt, Error> {
    match result {
        Ok(_) => Ok(Attempt::Held),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::HeldElsewhere),
        Err(err) => Err(err.into()),
    }
}
