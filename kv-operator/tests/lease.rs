//! Leader election against a mocked API server (see `fake_api`: no API server runs here).
//! The fake keeps one Lease and enforces what the real one does for leader election:
//! a replace must carry the resourceVersion it read, or it gets 409.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod fake_api;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_api::{Recorded, Reply, conflict, not_found};
use hasten_kv_operator::Error;
use hasten_kv_operator::lease::{Attempt, LeaderLease, LeaseSettings};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/rag/leases/hasten-kv-operator";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/rag/leases";

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        name: "hasten-kv-operator".into(),
        namespace: "rag".into(),
        identity: identity.into(),
        duration: Duration::from_secs(15),
        renew_every: Duration::from_millis(20),
        renew_deadline: Duration::from_millis(100),
    }
}

type Stored = Arc<Mutex<Option<Value>>>;

fn lease_store(initial: Option<Value>) -> impl Fn(&Recorded) -> Reply + Send + Sync + 'static {
    lease_store_shared(initial).0
}

/// One Lease object with optimistic concurrency, as the API server keeps it; the handle lets
/// a test change it behind the replicas' backs.
fn lease_store_shared(
    initial: Option<Value>,
) -> (impl Fn(&Recorded) -> Reply + Send + Sync + 'static, Stored) {
    let stored: Stored = Arc::new(Mutex::new(initial));
    let handle = stored.clone();
    let respond = move |request: &Recorded| {
        let mut stored = stored.lock().expect("lock");
        match (request.method.as_str(), request.path.as_str()) {
            ("GET", LEASE) => stored.clone().map(|l| (200, l)).unwrap_or_else(not_found),
            ("POST", LEASES) => {
                if stored.is_some() {
                    return fake_api::status(409, "AlreadyExists");
                }
                let mut lease = request.body.clone();
                lease["metadata"]["resourceVersion"] = json!("1");
                *stored = Some(lease.clone());
                (201, lease)
            }
            ("PUT", LEASE) => {
                let current = stored.clone().expect("replace of a lease that exists");
                if request.body["metadata"]["resourceVersion"]
                    != current["metadata"]["resourceVersion"]
                {
                    return conflict();
                }
                let version: u64 = current["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut lease = request.body.clone();
                lease["metadata"]["resourceVersion"] = json!((version + 1).to_string());
                *stored = Some(lease.clone());
                (200, lease)
            }
            _ => fake_api::status(500, "unexpected request"),
        }
    };
    (respond, handle)
}

fn held_by(holder: &str, renewed: Timestamp) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "hasten-kv-operator", "namespace": "rag", "resourceVersion": "7"},
        "spec": {
            "holderIdentity": holder, "leaseDurationSeconds": 15,
            "acquireTime": renewed.to_string(), "renewTime": renewed.to_string(), "leaseTransitions": 2,
        }
    })
}

#[tokio::test]
async fn a_free_lease_is_created_and_then_renewed_by_its_holder() {
    let (client, requests) = fake_api::client(lease_store(None));
    let lease = LeaderLease::new(client, settings("op-a"));
    assert_eq!(
        lease.try_acquire_or_renew().await.expect("api"),
        Attempt::Held
    );
    assert_eq!(
        lease.try_acquire_or_renew().await.expect("api"),
        Attempt::Held
    );
    drop(lease);
    let requests = requests.await.expect("fake api");
    let lines: Vec<String> = requests.iter().map(Recorded::line).collect();
    assert_eq!(
        lines,
        vec![
            format!("GET {LEASE}"),
            format!("POST {LEASES}"),
            format!("GET {LEASE}"),
            format!("PUT {LEASE}")
        ]
    );
    assert_eq!(requests[1].body["spec"]["holderIdentity"], "op-a");
    assert_eq!(
        requests[3].body["spec"]["leaseTransitions"], 0,
        "a renewal is no transition"
    );
}

#[tokio::test]
async fn a_fresh_lease_held_elsewhere_is_left_alone_and_an_expired_one_is_taken() {
    let (client, requests) = fake_api::client(lease_store(Some(held_by("op-b", Timestamp::now()))));
    let lease = LeaderLease::new(client, settings("op-a"));
    assert_eq!(
        lease.try_acquire_or_renew().await.expect("api"),
        Attempt::HeldElsewhere
    );
    drop(lease);
    let requests = requests.await.expect("fake api");
    assert!(
        requests.iter().all(|r| r.method == "GET"),
        "no write to a held lease"
    );

    let stale = Timestamp::now() - SignedDuration::from_secs(60);
    let (client, requests) = fake_api::client(lease_store(Some(held_by("op-b", stale))));
    let lease = LeaderLease::new(client, settings("op-a"));
    assert_eq!(
        lease.try_acquire_or_renew().await.expect("api"),
        Attempt::Held
    );
    drop(lease);
    let requests = requests.await.expect("fake api");
    let takeover = &requests[1];
    assert_eq!(takeover.line(), format!("PUT {LEASE}"));
    assert_eq!(
        takeover.body["metadata"]["resourceVersion"], "7",
        "the version read travels with the write"
    );
    assert_eq!(takeover.body["spec"]["holderIdentity"], "op-a");
    assert_eq!(takeover.body["spec"]["leaseTransitions"], 3);
}

#[tokio::test]
async fn of_two_replicas_racing_for_an_expired_lease_exactly_one_wins() {
    let stale = Timestamp::now() - SignedDuration::from_secs(60);
    let (client, requests) = fake_api::client(lease_store(Some(held_by("op-old", stale))));
    let a = LeaderLease::new(client.clone(), settings("op-a"));
    let b = LeaderLease::new(client, settings("op-b"));
    // Both read the expired lease before either writes: the second write carries a stale
    // resourceVersion and loses.
    let (first, second) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
    let outcomes = [first.expect("api"), second.expect("api")];
    assert_eq!(
        outcomes.iter().filter(|o| **o == Attempt::Held).count(),
        1,
        "{outcomes:?}"
    );
    drop((a, b));
    let requests = requests.await.expect("fake api");
    assert_eq!(requests.iter().filter(|r| r.method == "PUT").count(), 2);
}

#[tokio::test]
async fn a_holder_stops_when_another_took_the_lease_or_renewals_fail_past_the_deadline() {
    let (respond, stored) = lease_store_shared(Some(held_by("op-a", Timestamp::now())));
    let (client, _requests) = fake_api::client(respond);
    let a = LeaderLease::new(client, settings("op-a"));
    assert_eq!(a.try_acquire_or_renew().await.expect("api"), Attempt::Held);
    // Another replica took it over (as after a long pause of this one).
    *stored.lock().expect("lock") = Some(held_by("op-b", Timestamp::now()));
    let lost = tokio::time::timeout(Duration::from_secs(5), a.keep())
        .await
        .expect("keep() returns once the lease is elsewhere");
    assert!(matches!(lost, Error::LeaseLost(_)), "{lost}");

    // An API that stops answering: the holder gives up after renew_deadline.
    let (client, _requests) = fake_api::client(|_| fake_api::status(503, "ServiceUnavailable"));
    let a = LeaderLease::new(client, settings("op-a"));
    let started = std::time::Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(5), a.keep())
        .await
        .expect("keep() returns after the deadline");
    assert!(matches!(lost, Error::LeaseLost(_)), "{lost}");
    assert!(started.elapsed() >= Duration::from_millis(100));
}
