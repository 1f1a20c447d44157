//! Compiles the report-channel protocol with a pure-Rust protobuf compiler
//! (protox), so building nestor needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/nestor.proto");
    let fds = protox::compile(["nestor.proto"], ["proto"])?;
    tonic_prost_build::configure().build_server(true).build_client(true).compile_fds(fds)?;
    Ok(())
}
