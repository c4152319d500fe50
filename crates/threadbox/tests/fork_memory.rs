//! Fork with memory (issue 16 scope 4, ADR 0136) through the real daemon and CLI, on every
//! tier with the `fork_memory` capability (gvisor): a background counter and a listening
//! server of the parent go on in each of 3 forks, each under its own hostname; deleting
//! the parent leaves the forks running. A disk-only fork of the same parent is the
//! positive control: its processes start afresh.

mod common;

use common::{require_root, serial, Daemon};
use std::time::{Duration, Instant};

fn sh(d: &Daemon, sb: &str, script: &str) -> String {
    d.cli(&["exec", sb, "--", "sh", "-c", script])
        .ok()
        .stdout_str()
}

/// The parent's processes: a counter writing to /tmp (the sentry's memory) and a server
/// answering a token it drew at start (in its memory only).
const START: &str = r#"
nohup sh -c 'echo $$ > /tmp/counter.pid; i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done' >/dev/null 2>&1 &
nohup python3 -c '
import http.server, random
tok = str(random.random())
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(tok.encode())
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
' >/dev/null 2>&1 &
"#;

/// What the server answers, waiting (bounded) for it to listen.
fn token(d: &Daemon, sb: &str) -> String {
    let script = "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://127.0.0.1:8000/\", timeout=5).read().decode())' 2>/dev/null";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = d.cli(&["exec", sb, "--", "sh", "-c", script]);
        if r.code == 0 && !r.stdout_str().trim().is_empty() {
            return r.stdout_str().trim().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no answer from the server in {sb}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The counter is the parent's very process (same pid inside) and still counts.
fn counter_goes_on(d: &Daemon, sb: &str, parent_pid: &str) {
    let pid = sh(d, sb, "cat /tmp/counter.pid");
    assert_eq!(pid.trim(), parent_pid, "{sb}: the counter's pid file");
    assert_eq!(
        sh(d, sb, &format!("kill -0 {parent_pid} && echo alive")),
        "alive\n",
        "{sb}: the parent's counter process runs in the fork"
    );
    let first: u64 = sh(d, sb, "cat /tmp/count").trim().parse().unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now: u64 = sh(d, sb, "cat /tmp/count").trim().parse().unwrap_or(0);
        if now > first {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sb}: the counter stopped at {first}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn fork_with_memory_carries_processes_into_each_fork() {
    if !require_root("fork_with_memory_carries_processes_into_each_fork") {
        return;
    }
    let _s = serial();
    common::each_tier(&["fork_memory"], |d, tier| {
        d.create(&["--name", "p", "--tier", tier]);
        sh(&d, "p", START);
        let tok = token(&d, "p");
        let pid = sh(&d, "p", "cat /tmp/counter.pid").trim().to_string();
        counter_goes_on(&d, "p", &pid);
        sh(&d, "p", "echo disk > ~/f");

        let out = d
            .cli(&["fork", "p", "--count", "3", "--name-prefix", "k", "--json"])
            .ok()
            .json();
        assert_eq!(out["with_memory"], true, "the default on {tier}: {out}");
        let kids = out["sandboxes"].as_array().cloned().unwrap_or_default();
        assert_eq!(kids.len(), 3, "{out}");
        let parent_id = d.cli(&["info", "p", "--json"]).ok().json()["id"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let mut ids = vec![parent_id.clone()];
        for (i, k) in kids.iter().enumerate() {
            let name = format!("k-{}", i + 1);
            assert_eq!(k["state"], "running");
            assert_eq!(k["name"], name.as_str());
            ids.push(k["id"].as_str().unwrap_or("").to_string());
            assert_eq!(
                sh(&d, &name, "hostname"),
                format!("{name}\n"),
                "own hostname"
            );
            assert_eq!(
                token(&d, &name),
                tok,
                "{name}: the parent's server, its memory"
            );
            counter_goes_on(&d, &name, &pid);
            assert_eq!(
                sh(&d, &name, "cat ~/f"),
                "disk\n",
                "{name}: the parent's disk"
            );
        }
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 4, "each fork has its own id");
        // Each fork's writes are its own, in memory and on disk.
        sh(&d, "k-1", "echo mine > ~/f; echo mine > /tmp/mem");
        assert_eq!(
            sh(&d, "k-2", "cat ~/f; cat /tmp/mem 2>/dev/null || echo none"),
            "disk\nnone\n"
        );
        // The parent runs on, with its processes.
        assert_eq!(token(&d, "p"), tok);
        counter_goes_on(&d, "p", &pid);
        // Nothing of the fork is left beside the parent's disk.
        let pdir = d.root_path().join("sandboxes").join(&parent_id);
        let left: Vec<_> = std::fs::read_dir(pdir.join("forks"))
            .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "fork images left: {left:?}");

        // Positive control: a disk-only fork of the same parent starts its processes afresh.
        let disk = d
            .cli(&["fork", "p", "--disk-only", "--name-prefix", "d", "--json"])
            .ok()
            .json();
        assert_eq!(disk["with_memory"], false);
        assert_eq!(sh(&d, "d-1", "cat ~/f"), "disk\n");
        assert_eq!(
            sh(
                &d,
                "d-1",
                &format!("kill -0 {pid} 2>/dev/null && echo alive || echo gone")
            ),
            "gone\n",
            "a disk fork has no processes of the parent"
        );

        // Deleting the parent leaves the forks running, processes and all.
        d.cli(&["rm", "--force", "p"]).ok();
        for name in ["k-1", "k-2", "k-3"] {
            counter_goes_on(&d, name, &pid);
            assert_eq!(token(&d, name), tok);
        }
        assert_eq!(sh(&d, "k-1", "cat ~/f"), "mine\n");
    });
}
