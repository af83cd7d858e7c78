//! Generates the CSI types and gRPC services from proto/csi.proto: protox
//! compiles it (no protoc needed), tonic-prost-build writes the Rust.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let fds = protox::compile(["csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        // The server side only; tests build their own clients from the
        // same code (build_client), which costs nothing at run time.
        .build_server(true)
        .build_client(true)
        // RPCs the driver does not offer (ControllerPublishVolume, the
        // group snapshots...) answer UNIMPLEMENTED, as the spec asks of a
        // capability not advertised.
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
