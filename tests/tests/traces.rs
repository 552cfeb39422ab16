//! OTLP trace export across real processes: an edge, a router and a shard server, each
//! given `--otlp-endpoint` of an OTLP/gRPC collector the test runs (the collector's
//! `TraceService` from opentelemetry-proto), answer one retrieval that falls back to the
//! cloud. The spans of all three processes must arrive in one trace: the edge's trace
//! context crosses QUIC to the router in the request, and the router's crosses gRPC to the
//! shard in the `traceparent` metadata, through the router's micro-batch.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hasten_core::bundle::CorpusBundle;
use hasten_tests::edge::retrieve;
use hasten_tests::{
    build_small_bundle, dev_cert, persistent_work_dir, start_cloud_index_with, start_edge,
    start_router,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;

/// Trace id -> the services that sent spans of it.
type Traces = Arc<Mutex<BTreeMap<Vec<u8>, BTreeSet<String>>>>;

#[derive(Clone, Default)]
struct Collector {
    traces: Traces,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut traces = self.traces.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(name) => Some(name.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for span in resource_spans.scope_spans.iter().flat_map(|s| &s.spans) {
                traces
                    .entry(span.trace_id.clone())
                    .or_default()
                    .insert(service.clone());
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The listener as the stream of connections tonic's server takes.
fn connections(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_is_one_trace_from_the_edge_through_the_router_to_the_shard() {
    let work = persistent_work_dir("traces").unwrap();
    let (bundle_dir, _) = build_small_bundle(&work, 3, None).unwrap();
    let bundle = CorpusBundle::load(&bundle_dir).unwrap();

    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(collector.clone()))
        .serve_with_incoming(connections(listener));
    tokio::spawn(server);

    let export = vec!["--otlp-endpoint".to_string(), endpoint.clone()];
    let shard =
        start_cloud_index_with(&work, "shard", &bundle_dir, "127.0.0.1:0", &export).unwrap();
    let router = start_router(&work, "router", &[vec![shard.addr("grpc_addr")]], &export).unwrap();
    let edge = start_edge(
        &work,
        "edge",
        &bundle_dir,
        &router.addr("quic_addr"),
        &dev_cert(&work, "router"),
        &[
            "--set",
            "retrieval.policy=cloud-only",
            "--otlp-endpoint",
            &endpoint,
        ],
    )
    .unwrap();

    let http = reqwest::Client::new();
    let (code, reply) = retrieve(
        &http,
        &edge.addr("http_addr"),
        &bundle.questions[0].question,
        5,
    )
    .await;
    assert_eq!(code, 200, "{reply}");

    // Spans are exported in batches every few seconds.
    let all: BTreeSet<String> = ["hasten-edge", "hasten-router", "hasten-shard"]
        .map(String::from)
        .into();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let joined = collector
            .traces
            .lock()
            .unwrap()
            .values()
            .any(|services| all.is_subset(services));
        if joined {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no trace holds spans of the edge, router and shard: {:?}",
            collector
                .traces
                .lock()
                .unwrap()
                .values()
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
