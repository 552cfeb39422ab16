//! Starting the topology: certificates, the cloud tier, the control plane and the edges.

use std::path::Path;

use anyhow::{Result, anyhow};
use hasten_eval::process::{
    binary, cloud_index_route_args, cloud_index_serve_args, edge_serve_args, tls_args,
};
use hasten_loadtest::control_plane::node_args;
use hasten_proto::tls::{DevAuthority, MutualTls, TlsPaths};

use crate::processes::{Restartable, fixed_address};
use crate::{Cli, TENANTS};

/// The soak's processes and how to reach them.
pub(crate) struct Topology {
    // Fields drop in declaration order: when the soak ends early, the edges stop first and
    // the cloud replicas last.
    pub(crate) edges: Vec<Restartable>,
    pub(crate) nodes: Vec<Restartable>,
    pub(crate) router: Restartable,
    /// Cloud replicas by shard.
    pub(crate) replicas: Vec<Vec<Restartable>>,
    pub(crate) cp_addresses: Vec<String>,
    /// The soak's own client certificate, for the control plane.
    pub(crate) soak_client: MutualTls,
    pub(crate) edge_urls: Vec<String>,
    /// Where each edge serves /v1/status and /metrics.
    pub(crate) admin_urls: Vec<String>,
}

impl Topology {
    /// Starts every process, all on mutual TLS, with certificates and data under `work`.
    pub(crate) fn start(cli: &Cli, work: &Path) -> Result<Self> {
        let authority = DevAuthority::new("hasten soak CA")?;
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let issued = authority.write_bundle(
            &work.join("tls"),
            &["cloud", "control-plane", "edge", "soak"],
            &names,
        )?;
        let [cloud_tls, cp_tls, edge_tls, soak_tls]: [TlsPaths; 4] = issued
            .try_into()
            .map_err(|_| anyhow!("expected four certificates"))?;
        let soak_client = MutualTls::load(&soak_tls)?;

        // Cloud tier: 2 shards x 2 replicas on fixed gRPC ports, so a restarted replica comes
        // back where the router looks for it.
        let cloud_bin = binary("cloud-index")?;
        let mut replicas: Vec<Vec<Restartable>> = Vec::new();
        let mut shard_endpoints = Vec::new();
        for shard in 0..2 {
            let bundle = cli.bundle.join("shards").join(format!("shard-{shard}"));
            let mut row = Vec::new();
            let mut endpoints = Vec::new();
            for replica in 0..2 {
                let grpc = fixed_address()?;
                let mut args = cloud_index_serve_args(&bundle, &grpc, &work.join("unused.pem"));
                args.extend(tls_args(&cloud_tls));
                let name = format!("shard-{shard}-{replica}");
                row.push(Restartable::start(&name, cloud_bin.clone(), args, work)?);
                endpoints.push(grpc);
            }
            replicas.push(row);
            shard_endpoints.push(endpoints);
        }
        let mut router_args = cloud_index_route_args(&shard_endpoints, &work.join("unused.pem"));
        router_args.extend(tls_args(&cloud_tls));
        let router = Restartable::start("router", cloud_bin, router_args, work)?;

        // Control plane: 3 nodes with their own data directories.
        let cp_addresses: Vec<String> = (0..3).map(|_| fixed_address()).collect::<Result<_>>()?;
        let mut nodes = Vec::new();
        for id in 1..=3u64 {
            let dir = work.join(format!("node-{id}"));
            let _ = std::fs::remove_dir_all(&dir);
            let mut args = node_args(id, &cp_addresses, &dir);
            args.extend(tls_args(&cp_tls));
            nodes.push(Restartable::start(
                &format!("node-{id}"),
                binary("control-plane")?,
                args,
                work,
            )?);
        }

        // Two edges with the two tenants.
        let tenants_file = work.join("tenants.toml");
        let mut tenants_toml = String::from("[tenants]\n");
        for (tenant, token) in TENANTS {
            tenants_toml.push_str(&format!("{tenant} = [\"{token}\"]\n"));
        }
        std::fs::write(&tenants_file, tenants_toml)?;
        let mut edges = Vec::new();
        for e in 0..2 {
            let name = format!("edge-{e}");
            let mut args = edge_serve_args(
                &cli.bundle,
                &cli.model_dir,
                &router.addr("quic_addr"),
                &cloud_tls.ca,
            );
            args.extend(tls_args(&edge_tls));
            args.extend([
                "--edge-id".into(),
                name.clone(),
                "--tenants-file".into(),
                tenants_file.display().to_string(),
                // The cross-tenant check reads which cached query an acceptance went through.
                "--set".into(),
                "retrieval.expose_matched_query_text=true".into(),
                // Status and metrics name every tenant: with a tenants file they are served on
                // an admin address of their own.
                "--metrics-addr".into(),
                "127.0.0.1:0".into(),
            ]);
            // Edge e lists the nodes from node e+1 on: edges start on different nodes (as they
            // would spread over a real deployment), so whichever node leads when a follower is
            // frozen, an edge most likely follows a follower and the freeze hits its stream.
            for address in cp_addresses.iter().cycle().skip(e).take(cp_addresses.len()) {
                args.extend(["--control-plane".to_string(), address.clone()]);
            }
            edges.push(Restartable::start(&name, binary("edge-node")?, args, work)?);
        }
        let edge_urls: Vec<String> = edges
            .iter()
            .map(|e| format!("http://{}", e.addr("http_addr")))
            .collect();
        // Where each edge serves /v1/status and /metrics.
        let admin_urls: Vec<String> = edges
            .iter()
            .map(|e| format!("http://{}", e.addr("metrics_addr")))
            .collect();
        tracing::info!(?edge_urls, ?admin_urls, "topology up");
        Ok(Self {
            edges,
            nodes,
            router,
            replicas,
            cp_addresses,
            soak_client,
            edge_urls,
            admin_urls,
        })
    }
}
