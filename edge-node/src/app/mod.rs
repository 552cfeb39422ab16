//! The edge assembled from its configuration: secrets, the language backends, the bundle,
//! the retrieval engine and its cloud link, the services, then the HTTP, admin and gRPC
//! servers until a shutdown signal.

mod generation;
mod retrieval;

use display_full_error::DisplayFullErrorExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use hasten_core::bundle::CorpusBundle;
use hasten_core::encoder::TextEncoder;
use hasten_core::lifecycle::{shutdown_signal, write_atomically};
use hasten_core::metrics::prometheus::Registry;
use hasten_edge_node::api::{ReplyOptions, RequestLimits};
use hasten_edge_node::config::EdgeConfig;
use hasten_edge_node::document_fetch::fetch_missing_documents;
use hasten_edge_node::grpc::EdgeGrpc;
use hasten_edge_node::has::in_edge_share;
use hasten_edge_node::http::BodyLimits;
use hasten_edge_node::http::server::{self as http_server, HttpServerLimits};
use hasten_edge_node::metrics::EdgeMetrics;
use hasten_edge_node::replication::{ControlPlaneLink, CorpusIdentity};
use hasten_edge_node::service::answer::metrics::AnswerMetrics;
use hasten_edge_node::service::answer::{AnswerLimits, AnswerService};
use hasten_edge_node::service::retrieve::EdgeService;
use hasten_edge_node::tenants::TenantDirectory;
use hasten_proto::auth::AccessToken;
use hasten_proto::control::ControlAccess;
use hasten_proto::health::readiness_health;
use hasten_proto::tls::TrustRoots;
use hasten_proto::v1::edge_server::EdgeServer;
use hasten_rag::SpeculativeSettings;

use generation::{Backends, language_backend};
use retrieval::{build_engine, verify_cloud_link, warm_before_serving};

/// Serves until a shutdown signal, then drains within `server.shutdown_grace_ms`.
pub async fn serve(config: EdgeConfig) -> Result<()> {
    let services = assemble(&config).await?;
    run(&config, services).await
}

/// The edge's services and what observes them.
struct Services {
    retrieval: EdgeService,
    answers: AnswerService,
    metrics: Arc<EdgeMetrics>,
    registry: Registry,
}

/// Loads and connects everything the services need, in the order that fails fastest on a
/// bad file.
async fn assemble(config: &EdgeConfig) -> Result<Services> {
    // Secrets first: a bad file fails the start before the bundle and encoder load.
    let control_token = config
        .control_plane
        .token_file
        .as_deref()
        .map(AccessToken::load)
        .transpose()?;
    let tenants = match &config.server.tenants_file {
        Some(path) => TenantDirectory::load(path)?,
        None => {
            tracing::warn!("no tenants file: the API is open and every request shares one cache");
            TenantDirectory::open()
        }
    };
    tracing::info!(tenants = tenants.tenants().len(), "tenants loaded");
    let mutual = config.tls.load_mutual()?;
    // The language models load before the bundle: a bad file stops the start at once, naming
    // the file and why.
    let Backends {
        answers: backend,
        kv_pool,
        iterative,
    } = language_backend(config, mutual.as_ref())?;
    let bundle_dir = config.bundle.clone().unwrap_or_default();
    // With a fraction, only the edge's share stays in memory; the rest comes from the cloud.
    let fraction = config.retrieval.corpus_fraction;
    let bundle = CorpusBundle::load_share(&bundle_dir, |id| in_edge_share(id, fraction))
        .with_context(|| format!("loading the bundle {}", bundle_dir.display()))?;
    tracing::info!(
        documents = bundle.len(),
        corpus_documents = bundle.manifest.documents,
        corpus_fraction = fraction,
        "bundle loaded"
    );
    let encoder = TextEncoder::load(&config.model_dir)
        .with_context(|| format!("loading the encoder from {}", config.model_dir.display()))?;
    if encoder.dimension() != bundle.dimension() {
        anyhow::bail!(
            "the encoder makes {}-d vectors but the bundle holds {}-d vectors",
            encoder.dimension(),
            bundle.dimension()
        );
    }
    let registry = hasten_core::metrics::registry()?;
    let certificates = match &mutual {
        Some(mutual) => mutual.expiries()?,
        // Without mutual TLS the edge trusts the cloud through `cloud.ca` alone.
        None => vec![(
            "cloud_ca",
            TrustRoots::from_pem_file(&config.cloud.ca)
                .with_context(|| {
                    format!(
                        "loading the cloud CA {} (a dev cloud writes its certificate to run/cloud-dev-cert.pem)",
                        config.cloud.ca.display()
                    )
                })?
                .expires_at(),
        )],
    };
    let expiry = hasten_core::metrics::register_certificate_expiry(&registry, &certificates)?;
    let mut engine = build_engine(
        config,
        &bundle_dir,
        &bundle,
        &tenants,
        mutual.as_ref(),
        (&registry, expiry),
    )?;
    let link = (!config.control_plane.nodes.is_empty()).then(|| {
        let corpus = CorpusIdentity {
            version: bundle.manifest.corpus_version.clone(),
            dimension: bundle.dimension(),
            max_document_id: bundle.max_document_id(),
        };
        ControlPlaneLink::start(
            &config.edge_id,
            corpus,
            config.control_plane.nodes.clone(),
            ControlAccess {
                tls: mutual.clone(),
                token: control_token,
            },
        )
    });
    if let Some(link) = &link {
        engine = engine.with_replication(link.clone());
    }
    let limits = RequestLimits {
        default_k: config.retrieval.k,
        max_k: config.retrieval.max_k,
        max_query_chars: config.server.max_query_chars,
        dimension: bundle.dimension(),
    };
    drop(bundle);
    let engine = Arc::new(engine);
    match &config.retrieval.warm_queries {
        // Warming verifies the link before it asks the cloud.
        Some(path) => warm_before_serving(&engine, &encoder, path).await?,
        None => {
            tokio::spawn(verify_cloud_link(Arc::clone(&engine)));
        }
    }
    // Only an edge holding a share meets cached documents it lacks.
    if fraction < 1.0 {
        let fetcher = Arc::clone(&engine);
        tokio::spawn(
            async move { fetch_missing_documents(fetcher.caches(), fetcher.cloud()).await },
        );
    }
    let metrics = Arc::new(EdgeMetrics::register(&registry)?);
    let service = EdgeService::new(
        Arc::new(encoder),
        Arc::clone(&engine),
        limits,
        ReplyOptions {
            matched_query_text: config.retrieval.expose_matched_query_text,
            draft_trace: config.retrieval.expose_draft_trace,
        },
        Arc::clone(&metrics),
        config.server.max_in_flight,
        Arc::new(tenants),
        link.as_ref().map(|link| link.status()),
    );
    if let Some(link) = &link {
        let kv_follow = config.kv.pool.clone().zip(kv_pool);
        if let Some((name, _)) = &kv_follow {
            tracing::info!(pool = %name, "KV workers follow the pool's assignment");
        }
        link.follow(engine, kv_follow);
        tracing::info!(control_plane = ?config.control_plane.nodes, "hot cache replicated through the control plane; evictions follow its log");
    }
    let answers = AnswerService::new(
        service.clone(),
        backend,
        iterative,
        AnswerLimits {
            default_max_tokens: config.answer.default_tokens,
            max_tokens: config.answer.max_tokens,
            max_question_chars: config.server.max_query_chars,
            max_queued: config.answer.queue,
            per_tenant: config.answer.queue_per_tenant,
            rewrite_queries: config.answer.chat_query_rewrite,
            // An engine batches the answers it is sent; this process's cores do not.
            concurrency: if config.engine.url.is_some() {
                config.engine.concurrency
            } else {
                1
            },
            speculative: SpeculativeSettings {
                drafts: config.answer.speculative_drafts,
                clusters: config.answer.speculative_clusters,
                draft_tokens: config.answer.speculative_draft_tokens,
                ..SpeculativeSettings::default()
            },
        },
        Arc::new(AnswerMetrics::register(&registry)?),
    );
    Ok(Services {
        retrieval: service,
        answers,
        metrics,
        registry,
    })
}

/// The API's routes (retrieval, answers, embeddings) and the admin routes (health, status,
/// metrics).
fn routes(config: &EdgeConfig, services: &Services) -> (axum::Router, axum::Router) {
    let body_limits = BodyLimits {
        max_bytes: config.server.max_body_bytes,
        timeout: Duration::from_millis(config.server.body_timeout_ms),
    };
    let (service, answers) = (&services.retrieval, &services.answers);
    let api = hasten_edge_node::http::api_routes(service.clone(), body_limits)
        .merge(hasten_edge_node::http::answer::answer_routes(
            answers.clone(),
            body_limits,
        ))
        .merge(hasten_edge_node::http::openai::chat_routes(
            answers.clone(),
            body_limits,
        ))
        .merge(hasten_edge_node::http::iterative::iterative_routes(
            answers.clone(),
            body_limits,
        ))
        .merge(hasten_edge_node::http::embeddings::embedding_routes(
            service.clone(),
            body_limits,
        ));
    let generation = {
        let answers = answers.clone();
        Arc::new(move || answers.generation())
    };
    let admin = hasten_edge_node::http::admin_routes(
        service.clone(),
        generation,
        services.registry.clone(),
    );
    (hasten_edge_node::http::with_request_ids(api), admin)
}

/// Binds the listeners, writes the ready file and serves until a shutdown signal.
async fn run(config: &EdgeConfig, services: Services) -> Result<()> {
    let (api, admin) = routes(config, &services);
    let Services {
        retrieval: service,
        answers,
        metrics,
        ..
    } = services;
    let bind = |addr: SocketAddr, what: &'static str| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {what} on {addr}"))
    };
    let http_listener = bind(config.server.http_addr, "HTTP").await?;
    let http_addr = http_listener.local_addr()?;
    let grpc_listener = bind(config.server.grpc_addr, "gRPC").await?;
    let grpc_addr = grpc_listener.local_addr()?;
    let admin_listener = match config.server.metrics_addr {
        Some(addr) => Some(bind(addr, "the admin routes").await?),
        None => None,
    };
    let metrics_addr = admin_listener
        .as_ref()
        .map(tokio::net::TcpListener::local_addr)
        .transpose()?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let limits = HttpServerLimits {
        max_connections: config.server.max_connections,
        max_connections_per_client: config.server.connections_per_client(),
        header_timeout: Duration::from_millis(config.server.header_timeout_ms),
        shutdown_grace: Duration::from_millis(config.server.shutdown_grace_ms),
    };
    // Without an admin address of their own, the admin routes share the API's.
    let (api, admin) = match admin_listener {
        Some(listener) => (api, Some((listener, admin))),
        None => (api.merge(admin), None),
    };
    let mut servers = tokio::task::JoinSet::new();
    servers.spawn(http_server::serve(
        http_listener,
        api,
        limits,
        metrics.connections_refused("api"),
        stopped(stop_rx.clone()),
    ));
    if let Some((listener, admin)) = admin {
        // Operators and probes: few connections, never crowded out by clients.
        let admin_limits = HttpServerLimits {
            max_connections: ADMIN_CONNECTIONS,
            // Probes come from the node's address: no client bound of their own.
            max_connections_per_client: ADMIN_CONNECTIONS,
            ..limits
        };
        servers.spawn(http_server::serve(
            listener,
            admin,
            admin_limits,
            metrics.connections_refused("admin"),
            stopped(stop_rx.clone()),
        ));
    }
    let grpc = tonic::transport::Server::builder()
        // The same bound as the JSON API's body: a 384-d vector is ~1.5 KB in protobuf.
        .add_service(
            EdgeServer::new(EdgeGrpc::new(service.clone(), answers))
                .max_decoding_message_size(config.server.max_body_bytes),
        )
        .add_service(readiness_health(Arc::new(move || service.readiness())))
        .serve_with_incoming_shutdown(
            // HTTP/2 writes headers and data separately; without TCP_NODELAY the second
            // write waits for the client's delayed ACK (~40 ms).
            tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
            stopped(stop_rx),
        );
    let grace = limits.shutdown_grace;
    servers.spawn(async move {
        if let Err(err) = grpc.await {
            tracing::error!(error = %err.display_full(), "gRPC server failed");
        }
    });
    tracing::info!(%http_addr, %grpc_addr, ?metrics_addr, policy = ?config.retrieval.policy, "serving");
    if let Some(path) = &config.ready_file {
        let mut ready = serde_json::json!({
            "http_addr": http_addr.to_string(),
            "grpc_addr": grpc_addr.to_string(),
        });
        if let Some(addr) = metrics_addr {
            ready["metrics_addr"] = addr.to_string().into();
        }
        write_atomically(path, ready.to_string().as_bytes())
            .with_context(|| format!("writing the ready file {}", path.display()))?;
    }
    shutdown_signal().await;
    let _ = stop_tx.send(true);
    // Each server drains within the grace; gRPC streams get the same bound here.
    if tokio::time::timeout(grace + Duration::from_secs(1), async {
        while servers.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tracing::warn!(
            ?grace,
            "servers still draining after the shutdown grace; exiting"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// HTTP connections the admin routes accept at once.
const ADMIN_CONNECTIONS: usize = 64;

async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
