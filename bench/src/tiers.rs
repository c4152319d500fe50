//! Tier figures (issue 16, ADR 0120): create→first result and the exec round trip on the
//! `gvisor` tier against the `jail`, one daemon, interleaved sample by sample. runsc comes
//! from `THREADBOX_RUNSC` or PATH (scripts/test.sh puts it in target/tools/runsc).

use super::*;

#[derive(Args, Clone)]
pub struct TiersOpts {
    /// Samples per tier for the exec round trip (creates take a fifth as many, at least 3).
    #[arg(long, default_value_t = 100)]
    iterations: usize,
    /// A few iterations: checks the program completes.
    #[arg(long)]
    smoke: bool,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

fn on_tier(tier: &str) -> CreateSandboxRequest {
    let mut r = bench_sandbox();
    r.tier = Some(tier.to_string());
    r
}

pub async fn run(mut o: TiersOpts) -> Result<()> {
    if o.smoke {
        o.iterations = o.iterations.min(5);
    }
    let (_daemon, url) = start_daemon(0).await?;
    let c = Client::new(&url)?;
    let tiers = ["jail", "gvisor"];
    let list = c.call(&threadbox_api::tiers::ListTiers).await?;
    for t in tiers {
        match list.tiers.iter().find(|x| x.name == t) {
            Some(x) if x.available => {}
            Some(x) => bail!(
                "tier {t} is unavailable: {}",
                x.reason.as_deref().unwrap_or("?")
            ),
            None => bail!("the daemon has no tier {t}"),
        }
    }
    let mut ids = Vec::new();
    for t in tiers {
        let id = c.create(&on_tier(t)).await?.0.id;
        for _ in 0..5 {
            tb_exec(&c, &id, &["true"]).await?; // warm the page cache and the connection
        }
        ids.push(id);
    }
    let mut exec: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    for round in 0..o.iterations {
        for k in rotation(round, 2) {
            exec[k].push(tb_exec(&c, &ids[k], &["true"]).await?);
        }
    }
    let mut first: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    for round in 0..(o.iterations / 5).max(3) {
        for k in rotation(round, 2) {
            let t = Instant::now();
            let id = c.create(&on_tier(tiers[k])).await?.0.id;
            let r = c.exec(&id, &exec_req(&["echo", "ok"])).await?;
            first[k].push(ms(t.elapsed()));
            if r.stdout != "ok\n" {
                bail!("echo ok on {} answered {:?}", tiers[k], r.stdout);
            }
            c.delete(&id, true).await?;
        }
    }
    for id in &ids {
        c.delete(id, true).await?;
    }
    let mut rows = Vec::new();
    for (fig, mut samples) in [
        ("exec round trip (true), by tier", exec),
        ("create→first result (echo ok), by tier", first),
    ] {
        let gv = samples.pop().unwrap_or_default();
        let jail = samples.pop().unwrap_or_default();
        let base = Row::from_samples(fig, "threadbox jail", "ms", jail);
        rows.push(Row::from_samples(fig, "threadbox gvisor", "ms", gv).against(&base));
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
