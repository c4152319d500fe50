//! Hibernate figures (issue 16 scope 3, ADR 0129/0130), per tier, one daemon: hibernate
//! and wake (`resume`) of a small sandbox with a background process, the gvisor memory
//! image's size, and the host RAM a hibernated sandbox holds against a paused one (the
//! resident memory of every process in its cgroup, plus what the cgroup is charged).
//! The jail's hibernate needs swap: without any on the host, a swap file of 512 MiB is
//! made for the run (root) and removed after; if that fails the jail is reported skipped.

use super::*;

#[derive(Args, Clone)]
pub struct HibernateOpts {
    /// Hibernate/wake cycles per tier.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// A few iterations: checks the program completes.
    #[arg(long)]
    smoke: bool,
    /// Print the results as one JSON document instead of the table.
    #[arg(long)]
    json: bool,
}

/// A swap file on for the run, off and removed on drop.
struct TempSwap(PathBuf);

impl TempSwap {
    fn on() -> Option<TempSwap> {
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        if swaps.lines().count() > 1 {
            return None;
        }
        let f = std::env::temp_dir().join(format!("tb-bench-swap-{}", std::process::id()));
        let ok = |c: &mut Command| c.status().map(|s| s.success()).unwrap_or(false);
        let made = ok(Command::new("fallocate").args(["-l", "512M"]).arg(&f))
            && ok(Command::new("chmod").arg("600").arg(&f))
            && ok(Command::new("mkswap").arg("-q").arg(&f))
            && ok(Command::new("swapon").arg(&f));
        if !made {
            let _ = std::fs::remove_file(&f);
            return None;
        }
        Some(TempSwap(f))
    }
}

impl Drop for TempSwap {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Host RAM of sandbox `id`: the resident memory of every process in its cgroup (0 when
/// it has none), in MB.
fn host_rss_mb(id: &str) -> f64 {
    let mut kb = 0u64;
    for base in [
        "/sys/fs/cgroup/pids/threadbox",
        "/sys/fs/cgroup/memory/threadbox",
        "/sys/fs/cgroup/threadbox",
    ] {
        let Ok(procs) = std::fs::read_to_string(format!("{base}/{id}/cgroup.procs")) else {
            continue;
        };
        for pid in procs.lines() {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            kb += status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
        }
        break;
    }
    kb as f64 / 1024.0
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

pub async fn run(mut o: HibernateOpts) -> Result<()> {
    if o.smoke {
        o.iterations = o.iterations.min(3);
    }
    let swap = TempSwap::on();
    let (daemon, url) = start_daemon(0).await?;
    let c = Client::new(&url)?;
    let list = c.call(&threadbox_api::tiers::ListTiers).await?;
    let mut rows = Vec::new();
    for tier in ["jail", "gvisor"] {
        let usable = list.tiers.iter().any(|x| {
            x.name == tier && x.available && x.capabilities.iter().any(|c| c == "hibernate")
        });
        if !usable {
            eprintln!("skipped tier {tier}: unavailable or without hibernate");
            continue;
        }
        let mut req = bench_sandbox();
        req.tier = Some(tier.to_string());
        let id = c.create(&req).await?.0.id;
        c.start_process(
            &id,
            &StartProcessRequest {
                command: None,
                shell: Some("while true; do sleep 0.1; done".into()),
                env: Default::default(),
                cwd: None,
                user: Default::default(),
            },
        )
        .await?;
        tb_exec(&c, &id, &["true"]).await?;
        // RAM: paused, then hibernated.
        c.pause(&id).await?;
        let paused = host_rss_mb(&id);
        c.resume(&id).await?;
        let (mut hib, mut wake, mut first) = (Vec::new(), Vec::new(), Vec::new());
        let mut hibernated_rss = Vec::new();
        let mut image = Vec::new();
        for _ in 0..o.iterations {
            let t = Instant::now();
            if let Err(e) = c.hibernate(&id).await {
                eprintln!("skipped tier {tier}: hibernate failed: {e}");
                break;
            }
            hib.push(ms(t.elapsed()));
            hibernated_rss.push(host_rss_mb(&id));
            let img = daemon
                ._root
                .path()
                .join("sandboxes")
                .join(&id)
                .join("hibernate");
            if img.is_dir() {
                image.push(dir_bytes(&img) as f64 / 1e6);
            }
            let t = Instant::now();
            c.resume(&id).await?;
            wake.push(ms(t.elapsed()));
            first.push(tb_exec(&c, &id, &["true"]).await?);
        }
        c.delete(&id, true).await?;
        if hib.is_empty() {
            continue;
        }
        let who = format!("threadbox {tier}");
        rows.push(Row::from_samples(
            "hibernate (small sandbox)",
            &who,
            "ms",
            hib,
        ));
        rows.push(Row::from_samples("wake (resume)", &who, "ms", wake));
        rows.push(Row::from_samples(
            "first exec after wake",
            &who,
            "ms",
            first,
        ));
        rows.push(Row::value("host RAM, paused", &who, "MB", paused, 1));
        rows.push(Row::from_samples(
            "host RAM, hibernated",
            &who,
            "MB",
            hibernated_rss,
        ));
        if !image.is_empty() {
            rows.push(Row::from_samples("memory image", &who, "MB", image));
        }
    }
    drop(swap);
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
