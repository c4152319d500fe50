//! Throughput of the egress splice against a direct loopback connection (no thresholds; for
//! the figures in docs/network.md). `cargo run -p threadbox-net --example splice_bench -- [MiB]`
//! (a debug build understates both; use `--release` for figures worth quoting).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use threadbox_api::network::{NetAction, NetworkPolicySpec, NetworkRuleSpec};
use threadbox_net::proxy::{self, OriginalDst};
use threadbox_net::{Floor, Limits, NetworkPolicy, SandboxNet, SandboxNetConfig, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn sink() -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut total = 0u64;
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                let _ = s.write_all(&total.to_be_bytes()).await;
            });
        }
    });
    Ok(addr)
}

async fn push(mut s: TcpStream, bytes: u64) -> std::io::Result<f64> {
    let chunk = vec![0x5au8; 256 * 1024];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < bytes {
        s.write_all(&chunk).await?;
        sent += chunk.len() as u64;
    }
    s.shutdown().await?;
    let got = s.read_u64().await?;
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(got, sent, "the sink received every byte");
    Ok(sent as f64 * 8.0 / secs / 1e9)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mib: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1024);
    let bytes = mib * 1024 * 1024;
    let target = sink().await?;
    let spec = NetworkPolicySpec {
        rules: vec![NetworkRuleSpec {
            action: NetAction::Allow,
            host: None,
            cidr: Some("127.0.0.1/32".into()),
            ports: None,
            protocol: None,
        }],
        ..Default::default()
    };
    let policy = NetworkPolicy::from_spec(&spec, 1).map_err(std::io::Error::other)?;
    let (net, mut rows) = SandboxNet::new(SandboxNetConfig {
        sandbox: "bench".into(),
        policy,
        floor: Floor {
            allow_private: vec!["127.0.0.0/8".parse().map_err(std::io::Error::other)?],
            ..Floor::default()
        },
        resolver: Arc::new(StaticResolver::default()),
        limits: Limits::default(),
    });
    tokio::spawn(async move { while rows.recv().await.is_some() {} });
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let via = l.local_addr()?;
    let od: OriginalDst = Arc::new(move |_| Ok(target));
    tokio::spawn(proxy::serve(net, l, od));
    for round in 1..=3 {
        let direct = push(TcpStream::connect(target).await?, bytes).await?;
        let spliced = push(TcpStream::connect(via).await?, bytes).await?;
        println!(
            "round {round}: {mib} MiB direct {direct:.2} Gbit/s, through the proxy {spliced:.2} Gbit/s ({:.0}%)",
            spliced / direct * 100.0
        );
    }
    Ok(())
}
