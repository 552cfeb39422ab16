//! A stand-in for the Kubernetes API server, for the operator's reconcile and lease tests.
//!
//! No API server can run on these machines (no container runtime, no etcd), so the tests give
//! `kube::Client` a `tower-test` mock service: every request the operator makes is recorded
//! (method, path, query, JSON body) and answered by the scenario's responder. The tests then
//! assert the request sequence and bodies; what the real API server would do with them
//! (defaulting, admission, the StatefulSet controller) is not exercised here.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// One request the operator made.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

impl Recorded {
    /// `METHOD path` (the query left out), for sequence assertions.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    pub fn is(&self, method: &str, path_suffix: &str) -> bool {
        self.method == method && self.path.ends_with(path_suffix)
    }
}

/// What the fake answers: a status code and a JSON body; a JSON string goes out as plain
/// text instead (the API server answers a pod's log so, and nothing else as a bare string).
pub type Reply = (u16, Value);

/// A Status object as the API server sends with errors.
pub fn status(code: u16, reason: &str) -> Reply {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": reason, "reason": reason, "code": code}),
    )
}

pub fn not_found() -> Reply {
    status(404, "NotFound")
}

pub fn conflict() -> Reply {
    status(409, "Conflict")
}

/// The request's own body back (what apply and create return, give or take defaults).
pub fn echo(request: &Recorded) -> Reply {
    (200, request.body.clone())
}

pub fn empty_list(kind: &str) -> Reply {
    (
        200,
        json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}),
    )
}

/// A client whose requests go to `respond`; the handle yields every request once all
/// clones of the client are dropped.
pub fn client(
    respond: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
) -> (Client, JoinHandle<Vec<Recorded>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let respond = Arc::new(respond);
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.expect("request body");
            let body = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
            };
            let recorded = Recorded {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string(),
                body,
            };
            let (code, reply) = respond(&recorded);
            let (content_type, bytes) = match reply {
                Value::String(text) => ("text/plain", text.into_bytes()),
                json => ("application/json", serde_json::to_vec(&json).unwrap()),
            };
            let response = Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, content_type)
                .body(Body::from(bytes))
                .unwrap();
            send.send_response(response);
            seen.push(recorded);
        }
        seen
    });
    (Client::new(service, "rag"), task)
}

/// Shared mutable state a responder can keep between requests.
pub fn shared<T>(value: T) -> Arc<Mutex<T>> {
    Arc::new(Mutex::new(value))
}
