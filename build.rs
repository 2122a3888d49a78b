//! Generates the gRPC code of `proto/` at build time with protox (a protobuf compiler in Rust), so no
//! `protoc` is needed; the descriptor set it writes feeds gRPC reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // The public API, and the protocol between routers and shard servers.
    let descriptors = protox::compile(
        ["sidecar/v1/sidecar.proto", "sidecar/shard/v1/shard.proto"],
        ["proto"],
    )?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("sidecar_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    // The caller's neural distributions and the mixing answer have protobuf code of their own
    // (src/server/neural_pb.rs, src/server/mix_pb.rs, which declares `TokenProb` too).
    tonic_prost_build::configure()
        .extern_path(
            ".sidecar.v1.NeuralTopK",
            "crate::server::neural_pb::NeuralTopK",
        )
        .extern_path(
            ".sidecar.v1.NeuralLogits",
            "crate::server::neural_pb::NeuralLogits",
        )
        .extern_path(
            ".sidecar.v1.MixResponse",
            "crate::server::mix_pb::MixResponse",
        )
        .extern_path(".sidecar.v1.TokenProb", "crate::server::mix_pb::TokenProb")
        .compile_fds(descriptors)?;
    Ok(())
}
