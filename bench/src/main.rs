//! threadbox-bench: figures of the engine against a bare fork+exec measured in the same
//! run, interleaved (A B A B ...) so machine drift affects both alike.
//!
//! ```text
//! threadbox-bench figures [--iterations 50] [--json]      # against a daemon it starts
//! threadbox-bench figures --url unix:///var/lib/threadbox/threadbox.sock
//! ```
#![forbid(unsafe_code)]

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde::Serialize;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use threadbox_api::{CreateSandboxRequest, ExecRequest};
use threadbox_client::Client;

#[derive(Parser)]
#[command(about = "threadbox benchmarks: figures and ratios against baselines in the same run")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create→first result, exec round trip, pause, resume vs bare fork+exec.
    Figures {
        #[arg(long, default_value_t = 50)]
        iterations: usize,
        /// Daemon to measure; without it a daemon is started on a temporary root.
        #[arg(long)]
        url: Option<String>,
        /// Print the results as one JSON document.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Serialize, Clone)]
struct Stat {
    figure: String,
    contender: String,
    n: usize,
    median_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    /// Median divided by the baseline's median (None for the baseline itself).
    ratio_to_baseline: Option<f64>,
    baseline: Option<String>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn stat(figure: &str, contender: &str, mut samples: Vec<f64>) -> Stat {
    samples.sort_by(|a, b| a.total_cmp(b));
    Stat {
        figure: figure.into(),
        contender: contender.into(),
        n: samples.len(),
        median_ms: percentile(&samples, 0.5),
        p90_ms: percentile(&samples, 0.9),
        p99_ms: percentile(&samples, 0.99),
        ratio_to_baseline: None,
        baseline: None,
    }
}

fn with_ratio(mut s: Stat, base: &Stat) -> Stat {
    s.ratio_to_baseline = Some(s.median_ms / base.median_ms);
    s.baseline = Some(base.contender.clone());
    s
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A bare fork+exec of `argv`, waiting for its output: the baseline.
fn bare(argv: &[&str]) -> Result<f64> {
    let t = Instant::now();
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()?;
    let el = t.elapsed();
    if !out.status.success() {
        bail!("baseline {argv:?} failed");
    }
    Ok(ms(el))
}

fn exec_req(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        command: Some(argv.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    }
}

struct OwnDaemon {
    child: Child,
    _root: tempfile::TempDir,
}

impl Drop for OwnDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_daemon() -> Result<(OwnDaemon, String)> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("no exe dir")?;
    let bin: PathBuf = dir.join("threadbox");
    if !bin.exists() {
        bail!("{} not found: build the workspace first", bin.display());
    }
    let root = tempfile::Builder::new().prefix("tb-bench-").tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new(&bin)
        .args(["serve", "--root"])
        .arg(root.path())
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let url = format!("unix://{}/threadbox.sock", root.path().display());
    let client = Client::new(&url)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if client.health().await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("the daemon did not come up");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((OwnDaemon { child, _root: root }, url))
}

async fn figures(iterations: usize, url: Option<String>, json: bool) -> Result<()> {
    let (_own, url) = match url {
        Some(u) => (None, u),
        None => {
            let (d, u) = start_daemon().await?;
            (Some(d), u)
        }
    };
    let client = Client::new(&url)?;
    let mut results = Vec::new();

    for (label, argv) in [
        ("echo ok", vec!["echo", "ok"]),
        ("python3 -c 'print(1)'", vec!["/usr/bin/python3", "-c", "print(1)"]),
    ] {
        // Time to interactive: create → first result, interleaved with the baseline.
        let (mut base, mut tb) = (Vec::new(), Vec::new());
        for _ in 0..iterations {
            base.push(bare(&argv)?);
            let t = Instant::now();
            let (sb, _) = client.create(&CreateSandboxRequest::default()).await?;
            let r = client.exec(&sb.id, &exec_req(&argv)).await?;
            tb.push(ms(t.elapsed()));
            if r.exit_code != Some(0) {
                bail!("{label} failed in the sandbox: {}", r.stderr);
            }
            client.delete(&sb.id, true).await?;
        }
        let b = stat(
            &format!("create→first result ({label})"),
            "bare fork+exec",
            base,
        );
        results.push(with_ratio(stat(&b.figure, "threadbox jail", tb), &b));
        results.push(b);
    }

    let (sb, _) = client.create(&CreateSandboxRequest::default()).await?;
    for (label, argv) in [
        ("true", vec!["true"]),
        ("python3 -c pass", vec!["/usr/bin/python3", "-c", "pass"]),
    ] {
        let (mut base, mut tb) = (Vec::new(), Vec::new());
        client.exec(&sb.id, &exec_req(&argv)).await?; // warm the page cache
        for _ in 0..iterations {
            base.push(bare(&argv)?);
            let t = Instant::now();
            client.exec(&sb.id, &exec_req(&argv)).await?;
            tb.push(ms(t.elapsed()));
        }
        let b = stat(
            &format!("exec round trip ({label})"),
            "bare fork+exec",
            base,
        );
        results.push(with_ratio(stat(&b.figure, "threadbox API", tb), &b));
        results.push(b);
    }

    let (mut base, mut pause, mut resume) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        base.push(bare(&["true"])?);
        let t = Instant::now();
        client.pause(&sb.id).await?;
        pause.push(ms(t.elapsed()));
        let t = Instant::now();
        client.resume(&sb.id).await?;
        resume.push(ms(t.elapsed()));
    }
    let b = stat("pause / resume", "bare fork+exec (true)", base);
    results.push(with_ratio(stat("pause", "threadbox API", pause), &b));
    results.push(with_ratio(stat("resume", "threadbox API", resume), &b));
    results.push(b);
    client.delete(&sb.id, true).await?;

    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "iterations": iterations, "results": results })
            )?
        );
    } else {
        println!(
            "{:<44} {:<24} {:>9} {:>9} {:>9} {:>8}",
            "figure", "contender", "p50 ms", "p90 ms", "p99 ms", "ratio"
        );
        for r in &results {
            println!(
                "{:<44} {:<24} {:>9.2} {:>9.2} {:>9.2} {:>8}",
                r.figure,
                r.contender,
                r.median_ms,
                r.p90_ms,
                r.p99_ms,
                r.ratio_to_baseline
                    .map(|x| format!("{x:.2}x"))
                    .unwrap_or_else(|| "base".into())
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Figures {
            iterations,
            url,
            json,
        } => figures(iterations.max(1), url, json).await,
    }
}
