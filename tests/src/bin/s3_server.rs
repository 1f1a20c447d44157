//! An S3-compatible server on loopback for the object-storage tests and
//! benchmarks: `s3-server ROOT` serves the directory ROOT (one bucket per
//! subdirectory) on a free port of 127.0.0.1 and prints `listening on PORT`
//! once it accepts connections. Credentials: access key `nestor`, secret
//! `nestor-secret`.

use std::path::PathBuf;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let root: PathBuf = std::env::args_os().nth(1).map(PathBuf::from).ok_or_else(|| anyhow::anyhow!("usage: s3-server ROOT [PORT]"))?;
    let port: u16 = std::env::args().nth(2).map(|p| p.parse()).transpose()?.unwrap_or(0);
    std::fs::create_dir_all(&root)?;
    let fs = s3s_fs::FileSystem::new(&root).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut builder = S3ServiceBuilder::new(fs);
    builder.set_auth(SimpleAuth::from_single("nestor", "nestor-secret"));
    let service = builder.build();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on {}", listener.local_addr()?.port());
    loop {
        let (socket, _) = listener.accept().await?;
        let service = service.clone();
        tokio::spawn(async move {
            let _ = Builder::new(TokioExecutor::new()).serve_connection(TokioIo::new(socket), service).await;
        });
    }
}
