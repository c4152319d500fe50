//! Tracing figures (issue 17, ADR 0090): what exporting traces costs an exec and a create.
//! Two daemons in the same run, interleaved sample by sample: one with no OTLP endpoint
//! (tracing off: the layer makes no span) and one exporting every request's spans over
//! OTLP/HTTP to a local sink that answers 200 and discards the body. The sink is a thread
//! in this process, so the export's network cost is loopback only.

use super::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

#[derive(Args, Clone)]
pub struct TracingOpts {
    /// Samples per contender for the exec round trip (creates take a fifth as many).
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// A few iterations: checks the program completes.
    #[arg(long)]
    smoke: bool,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

/// An OTLP/HTTP sink on a free loopback port: reads each request, answers `200 {}`.
fn sink() -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(mut w) = conn.try_clone() else { return };
                let mut r = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut len = 0usize;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                len = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if w.write_all(ok.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(url)
}

pub async fn run(mut o: TracingOpts) -> Result<()> {
    if o.smoke {
        o.iterations = o.iterations.min(5);
    }
    let url = sink()?;
    let (_off_daemon, off_url) = start_daemon(0).await?;
    let (_on_daemon, on_url) = start_daemon_with(0, &["--otlp-endpoint".into(), url]).await?;
    let contenders = [
        ("tracing off (no endpoint)", Client::new(&off_url)?),
        ("tracing on (OTLP export)", Client::new(&on_url)?),
    ];
    let mut ids = Vec::new();
    for (_, c) in &contenders {
        let id = c.create(&bench_sandbox()).await?.0.id;
        for _ in 0..5 {
            tb_exec(c, &id, &["true"]).await?; // warm the page cache and the connection
        }
        ids.push(id);
    }
    let mut exec: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    for round in 0..o.iterations {
        for k in rotation(round, 2) {
            exec[k].push(tb_exec(&contenders[k].1, &ids[k], &["true"]).await?);
        }
    }
    let mut create: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    for round in 0..(o.iterations / 5).max(3) {
        for k in rotation(round, 2) {
            let c = &contenders[k].1;
            let t = Instant::now();
            let id = c.create(&bench_sandbox()).await?.0.id;
            create[k].push(ms(t.elapsed()));
            c.delete(&id, true).await?;
        }
    }
    for ((_, c), id) in contenders.iter().zip(&ids) {
        c.delete(id, true).await?;
    }

    let mut rows = Vec::new();
    for (fig, mut samples) in [
        ("exec round trip (true), tracing", exec),
        ("create (cold), tracing", create),
    ] {
        let on = samples.pop().unwrap_or_default();
        let off = samples.pop().unwrap_or_default();
        let base = Row::from_samples(fig, contenders[0].0, "ms", off);
        rows.push(Row::from_samples(fig, contenders[1].0, "ms", on).against(&base));
        rows.push(base);
    }
    if o.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"machine": machine(), "results": rows}))?
        );
    } else {
        print!("{}", stats::table(&rows));
    }
    Ok(())
}
