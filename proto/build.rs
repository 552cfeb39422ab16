//! Compiles the `.proto` files with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/hasten/v1/cloud.proto",
        "proto/hasten/v1/generation.proto",
        "proto/hasten/v1/kv.proto",
        "proto/hasten/v1/edge.proto",
        "proto/hasten/v1/control.proto",
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::ProtoCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
