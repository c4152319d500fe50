//! JavaScript (node) and bash contexts through the real daemon and the CLI's `run`
//! (issue 15, ADR 0083): state persists between cells, errors are results, a timeout
//! interrupts and keeps the state, and the contexts survive pause/resume and a daemon
//! restart.

mod common;

use common::*;
use serde_json::Value;

fn run(d: &Daemon, sb: &str, lang: &str, code: &str, extra: &[&str]) -> Value {
    let mut args = vec!["run", "--json", sb, "--language", lang];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-c", code]);
    d.cli(&args).ok().json()
}

fn result_text(v: &Value) -> Option<String> {
    v["result"]["data"]["text/plain"].as_str().map(String::from)
}

#[test]
fn javascript_context_keeps_state_and_reports_errors() {
    if !require_root("javascript_context_keeps_state_and_reports_errors") {
        return;
    }
    each_tier(&[], |mut d, tier| {
        let sb = d.create(&["--tier", tier]);

        let v = run(
            &d,
            &sb,
            "javascript",
            "let x = 40; globalThis.y = 1; x",
            &[],
        );
        assert_eq!(v["status"], "ok", "{v}");
        assert_eq!(v["context_created"], true, "{v}");
        assert_eq!(result_text(&v).as_deref(), Some("40"), "{v}");
        let v = run(
            &d,
            &sb,
            "javascript",
            "console.log('hi', x); x + y + 1",
            &[],
        );
        assert_eq!(result_text(&v).as_deref(), Some("42"), "{v}");
        assert_eq!(v["stdout"], "hi 40\n", "{v}");
        assert_eq!(v["context_created"], false, "{v}");
        assert_eq!(v["execution_count"], 2, "{v}");

        // An error is a result with its name, value and stack (the cell's frames).
        let v = run(
            &d,
            &sb,
            "javascript",
            "function f() { throw new TypeError('bad ' + x) }\nf()",
            &[],
        );
        assert_eq!(v["status"], "exception", "{v}");
        assert_eq!(v["exception"]["name"], "TypeError", "{v}");
        assert_eq!(v["exception"]["value"], "bad 40", "{v}");
        let tb = v["exception"]["traceback"].as_str().unwrap_or("");
        assert!(tb.contains("<cell-3>:1"), "{v}");
        assert!(!tb.contains("node:internal"), "{v}");

        // A promise's value is awaited; rich output through display().
        let v = run(
            &d,
            &sb,
            "javascript",
            "display({'text/html': '<b>x</b>'}, {raw: true}); Promise.resolve(x * 2)",
            &[],
        );
        assert_eq!(result_text(&v).as_deref(), Some("80"), "{v}");
        assert_eq!(v["outputs"][0]["data"]["text/html"], "<b>x</b>", "{v}");

        // A busy loop is interrupted by the timeout and the state stays.
        let v = run(
            &d,
            &sb,
            "javascript",
            "while (true) {}",
            &["--timeout", "1"],
        );
        assert_eq!(v["status"], "timed_out", "{v}");
        assert_eq!(v["context_restarted"], false, "{v}");
        // So is a cell waiting on a promise that never settles.
        let v = run(
            &d,
            &sb,
            "javascript",
            "await new Promise(() => {})",
            &["--timeout", "1"],
        );
        assert_eq!(v["status"], "timed_out", "{v}");
        assert_eq!(v["context_restarted"], false, "{v}");
        assert_eq!(
            result_text(&run(&d, &sb, "javascript", "x", &[])).as_deref(),
            Some("40")
        );

        // Paused, then the daemon killed: the worker is the agent's child.
        d.cli(&["pause", &sb]).ok();
        let v = run(&d, &sb, "javascript", "x + 1", &[]);
        assert_eq!(result_text(&v).as_deref(), Some("41"), "{v}");
        d.kill9();
        d.restart();
        let v = run(&d, &sb, "javascript", "x + 2", &[]);
        assert_eq!(result_text(&v).as_deref(), Some("42"), "{v}");
        assert_eq!(v["context_created"], false, "{v}");

        // Its own child cgroup, as a Python worker's (where the tier has call cgroups).
        let listed = d.cli(&["tiers", "--json"]).ok().json();
        if !tiers::has(tier, &listed, "call_cgroups") {
            eprintln!("the worker's cgroup: skipped on tier {tier}: needs the \"call_cgroups\" capability");
            return;
        }
        let v = run(
            &d,
            &sb,
            "javascript",
            "require('fs').readFileSync('/proc/self/cgroup', 'utf8')",
            &[],
        );
        assert!(result_text(&v).unwrap_or_default().contains("ctx-"), "{v}");
    });
}

#[test]
fn bash_context_keeps_state_and_its_channel_from_the_cells_programs() {
    if !require_root("bash_context_keeps_state_and_its_channel_from_the_cells_programs") {
        return;
    }
    each_tier(&[], |mut d, tier| {
        let sb = d.create(&["--tier", tier]);

        let v = run(
            &d,
            &sb,
            "bash",
            "x=41; cd /tmp; f() { echo \"f$1\"; }; export E=e",
            &[],
        );
        assert_eq!(v["status"], "ok", "{v}");
        assert_eq!(v["context_created"], true, "{v}");
        let v = run(
            &d,
            &sb,
            "bash",
            "echo $((x+1)); pwd; f 2; sh -c 'echo $E'",
            &[],
        );
        assert_eq!(v["stdout"], "42\n/tmp\nf2\ne\n", "{v}");
        assert_eq!(v["execution_count"], 2, "{v}");

        // A failing last command is an error result; the shell stays.
        let v = run(&d, &sb, "bash", "echo out; ls /nonexistent", &[]);
        assert_eq!(v["status"], "exception", "{v}");
        assert_eq!(v["exception"]["name"], "ExitStatus", "{v}");
        assert_eq!(v["exception"]["value"], "2", "{v}");
        assert!(
            v["stderr"].as_str().unwrap_or("").contains("nonexistent"),
            "{v}"
        );

        // Per-cell environment, restored after the cell.
        let v = run(&d, &sb, "bash", "echo \"$K\"", &["-e", "K=it's"]);
        assert_eq!(v["stdout"], "it's\n", "{v}");
        let v = run(&d, &sb, "bash", "echo ${K-unset}", &[]);
        assert_eq!(v["stdout"], "unset\n", "{v}");

        // The control channel is the shell's alone: a program of the cell does not hold it
        // (the positive control: the shell itself does, as a copy kept during the cell).
        let v = run(
        &d,
        &sb,
        "bash",
        "ls -l /proc/$$/fd | grep -c socket:; /bin/sh -c 'ls -l /proc/self/fd | grep -c socket:'",
        &[],
    );
        assert_eq!(v["stdout"], "1\n0\n", "{v}");

        // A timeout stops a waiting command and a builtin loop alike; the state stays.
        let v = run(&d, &sb, "bash", "sleep 100", &["--timeout", "1"]);
        assert_eq!(v["status"], "timed_out", "{v}");
        assert_eq!(v["context_restarted"], false, "{v}");
        let v = run(&d, &sb, "bash", "while :; do :; done", &["--timeout", "1"]);
        assert_eq!(v["status"], "timed_out", "{v}");
        assert_eq!(v["context_restarted"], false, "{v}");
        let v = run(&d, &sb, "bash", "echo $x", &[]);
        assert_eq!(v["stdout"], "41\n", "{v}");

        d.cli(&["pause", &sb]).ok();
        let v = run(&d, &sb, "bash", "echo $x; pwd", &[]);
        assert_eq!(v["stdout"], "41\n/tmp\n", "{v}");
        d.kill9();
        d.restart();
        let v = run(&d, &sb, "bash", "echo $x", &[]);
        assert_eq!(v["stdout"], "41\n", "{v}");
        assert_eq!(v["context_created"], false, "{v}");

        // `run-code` is an alias of `run`; the code may also be positional there.
        let v = d
            .cli(&["run-code", "--json", "--context", "bash", &sb, "echo $x"])
            .ok()
            .json();
        assert_eq!(v["stdout"], "41\n", "{v}");
        // An existing context of another language is refused, not reused silently.
        let r = d.cli(&["run", &sb, "--context", "bash", "-l", "python", "-c", "1"]);
        assert_ne!(r.code, 0);
        assert!(r.stderr.contains("is a bash context"), "{}", r.stderr);
    });
}

#[test]
fn idle_contexts_let_the_sandbox_auto_pause_and_a_running_cell_holds_it() {
    if !require_root("idle_contexts_let_the_sandbox_auto_pause_and_a_running_cell_holds_it") {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let d = Daemon::start();
    let sb = d.create(&["--idle-pause", "1"]);
    let state = |d: &Daemon| d.cli(&["info", "--json", &sb]).ok().json()["state"].clone();
    // Three idle contexts do not keep the sandbox awake.
    d.cli(&["run", &sb, "-c", "x = 1"]).ok();
    run(&d, &sb, "bash", "y=2", &[]);
    run(&d, &sb, "javascript", "globalThis.z = 3", &[]);
    d.wait_for(
        "auto-pause with idle contexts",
        Duration::from_secs(30),
        || state(&d) == "paused",
    );
    // A cell several reaper ticks longer than the idle pause runs to its end: it is in
    // flight, and the sandbox is never paused under it.
    let done = AtomicBool::new(false);
    let mut paused_under = false;
    std::thread::scope(|s| {
        let cell = s.spawn(|| {
            let v = run(&d, &sb, "bash", "sleep 5; echo $y", &["--timeout", "60"]);
            done.store(true, Ordering::SeqCst);
            v
        });
        // The execute resumes the paused sandbox first. A pause under the cell is
        // recorded and undone (so the cell can end and the test fail, not hang).
        let mut resumed = false;
        while !done.load(Ordering::SeqCst) {
            let st = state(&d);
            resumed |= st == "running";
            if resumed && st == "paused" && !done.load(Ordering::SeqCst) {
                paused_under = true;
                let _ = d.cli(&["resume", &sb]);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let v = cell.join().expect("the cell's thread");
        assert_eq!(v["stdout"], "2\n", "{v}");
        assert!(
            resumed,
            "the sandbox was never seen running during the cell"
        );
    });
    assert!(!paused_under, "the sandbox was paused under a running cell");
    // And once it ended, idle again: paused.
    d.wait_for("auto-pause after the cell", Duration::from_secs(30), || {
        state(&d) == "paused"
    });
}
