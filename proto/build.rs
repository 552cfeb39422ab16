//! Compiles the `.proto` files with protox (pure Rust), so no system `protoc` is needed.

use std::path::PathBuf;

const CONTROL_PROTO: &str = "proto/hasten/v1/control.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/hasten/v1/cloud.proto",
        "proto/hasten/v1/generation.proto",
        "proto/hasten/v1/kv.proto",
        "proto/hasten/v1/edge.proto",
        CONTROL_PROTO,
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::ProtoCodec")
        .compile_fds(descriptors.clone())?;
    encoded_events_server(descriptors)
}

/// A second ControlPlane server, the one control-plane nodes serve: the same service, but
/// its `Subscribe` streams [`EncodedEvent`]s (`src/encoded_event.rs`), events encoded once
/// for all subscribers instead of once per subscriber. Every message is the one generated
/// above; only the service is generated here, into `$OUT_DIR/encoded_events/`.
fn encoded_events_server(
    mut descriptors: prost_types::FileDescriptorSet,
) -> Result<(), Box<dyn std::error::Error>> {
    let control = CONTROL_PROTO.trim_start_matches("proto/");
    descriptors.file.retain(|file| file.name() == control);
    for file in &mut descriptors.file {
        file.message_type.clear();
        file.enum_type.clear();
        file.service
            .retain(|service| service.name() == "ControlPlane");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("encoded_events");
    std::fs::create_dir_all(&out)?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::ProtoCodec")
        .build_client(false)
        .out_dir(out)
        .extern_path(".hasten.v1", "crate::v1")
        .extern_path(".hasten.v1.CommittedEvent", "crate::EncodedEvent")
        .compile_fds(descriptors)?;
    Ok(())
}
