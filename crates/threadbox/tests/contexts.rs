//! Interpreter contexts through the real daemon and the CLI (issue 15): variables
//! persist between executions, an exception is a result, a timeout interrupts and keeps
//! the state, and contexts survive pause/resume and a daemon restart.

mod common;

use common::*;
use serde_json::Value;

fn run_code(d: &Daemon, sb: &str, code: &str, extra: &[&str]) -> Value {
    let mut args = vec!["run-code", "--json", sb];
    args.extend_from_slice(extra);
    args.push(code);
    d.cli(&args).ok().json()
}

fn result_text(v: &Value) -> Option<String> {
    v["result"]["data"]["text/plain"].as_str().map(String::from)
}

#[test]
fn contexts_keep_state_through_pause_and_a_daemon_restart() {
    if !require_root("contexts_keep_state_through_pause_and_a_daemon_restart") {
        return;
    }
    each_tier(&[], |mut d, tier| {
        let sb = d.create(&["--tier", tier]);

        let first = run_code(&d, &sb, "x = 41\nimport math", &[]);
        assert_eq!(first["status"], "ok", "{first}");
        assert_eq!(first["context_created"], true, "{first}");
        let v = run_code(&d, &sb, "x + 1", &[]);
        assert_eq!(result_text(&v).as_deref(), Some("42"), "{v}");
        assert_eq!(v["context_created"], false);
        assert_eq!(v["execution_count"], 2);

        // An exception is a result: the call succeeds and the variables stay.
        let v = run_code(&d, &sb, "1/0", &[]);
        assert_eq!(v["status"], "exception", "{v}");
        assert_eq!(v["exception"]["name"], "ZeroDivisionError");
        // The human form exits 1 and prints the traceback.
        let r = d.cli(&["run-code", &sb, "1/0"]);
        assert_eq!(r.code, 1);
        assert!(r.stderr.contains("ZeroDivisionError"), "{}", r.stderr);

        // A timeout interrupts the cell and keeps the state.
        let v = run_code(&d, &sb, "import time\ntime.sleep(100)", &["--timeout", "1"]);
        assert_eq!(v["status"], "timed_out", "{v}");
        assert_eq!(v["context_restarted"], false, "{v}");
        assert_eq!(
            result_text(&run_code(&d, &sb, "x", &[])).as_deref(),
            Some("41")
        );

        // Paused: the next execution resumes the sandbox, and the state is there.
        d.cli(&["pause", &sb]).ok();
        let v = run_code(&d, &sb, "x * 2", &[]);
        assert_eq!(result_text(&v).as_deref(), Some("82"), "{v}");
        let info = d.cli(&["info", "--json", &sb]).ok().json();
        assert_eq!(info["state"], "running");

        // The worker is the agent's child: a daemon restart keeps it.
        d.kill9();
        d.restart();
        let v = run_code(&d, &sb, "math.floor(x / 2)", &[]);
        assert_eq!(result_text(&v).as_deref(), Some("20"), "{v}");
        assert_eq!(v["context_created"], false, "{v}");

        // The API makes only the language names on first use (another must be created
        // first); the CLI's `run --context NAME` creates it, in `--language` (python).
        let r = d.cli(&["run", "--json", &sb, "--context", "other", "-c", "x"]);
        let v = r.ok().json();
        assert_eq!(v["status"], "exception", "{v}");
        assert_eq!(v["exception"]["name"], "NameError", "{v}");
    });
}
