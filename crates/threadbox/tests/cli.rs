//! End-to-end tests of the `threadbox` CLI against a real daemon. Tests that need
//! sandboxes skip (with a message) when not run as root; run `cargo build --workspace`
//! first so that `threadbox-agent` sits next to `threadbox`. The sandbox tests marked with
//! `each_tier` run on every tier of `THREADBOX_TEST_TIERS` (ADR 0123).

mod common;

use common::{each_tier, require_root, run_cli, serial, Daemon};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

// ---- without a daemon -----------------------------------------------------------------

#[test]
fn no_daemon_is_a_clear_error() {
    let run = run_cli("unix:///nonexistent/threadbox.sock", &["ls"], None).expect_code(1);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert!(run.stderr.contains("threadbox serve"), "{}", run.stderr);
    assert!(
        run.stderr.contains("unix:///nonexistent/threadbox.sock"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.trim_end().lines().count(), 1, "{}", run.stderr);
}

#[test]
fn bad_sizes_and_pairs_are_refused_before_any_call() {
    let url = "unix:///nonexistent/threadbox.sock";
    let run = run_cli(url, &["create", "--memory", "lots"], None).expect_code(1);
    assert!(
        run.stderr.contains("invalid size \"lots\""),
        "{}",
        run.stderr
    );
    let run = run_cli(url, &["create", "--label", "novalue"], None).expect_code(1);
    assert!(run.stderr.contains("expected K=V"), "{}", run.stderr);
    let run = run_cli(url, &["exec", "sb", "--user", "nobody", "--", "true"], None).expect_code(1);
    assert!(run.stderr.contains("invalid user"), "{}", run.stderr);
}

#[test]
fn openapi_subcommand_prints_the_document() {
    let run = run_cli("unix:///nonexistent/threadbox.sock", &["openapi"], None).ok();
    let doc = run.json();
    assert!(doc["paths"]["/v1/sandboxes/{sandbox}/exec"].is_object());
}

#[test]
fn serve_refuses_non_loopback_addresses_without_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::threadbox_bin())
        .args([
            "serve",
            "--insecure-no-auth",
            "--listen",
            "0.0.0.0:7999",
            "--agent",
            "/bin/true",
            "--root",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("loopback"), "{stderr}");
}

// ---- with a daemon ----------------------------------------------------------------------

#[test]
fn create_json_and_get_or_create() {
    if !require_root("create_json_and_get_or_create") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    let run = d
        .cli(&[
            "create", "--name", "alpha", "--label", "team=a", "--memory", "256M", "--json",
        ])
        .ok();
    let sb = run.json();
    for key in [
        "id",
        "name",
        "state",
        "labels",
        "image",
        "created_at",
        "limits",
    ] {
        assert!(sb.get(key).is_some(), "missing {key} in {sb}");
    }
    assert_eq!(sb["name"], "alpha");
    assert_eq!(sb["state"], "running");
    assert_eq!(sb["labels"]["team"], "a");
    assert_eq!(sb["limits"]["memory_bytes"], 256u64 << 20);
    // The same name again returns the same sandbox.
    let again = d.cli(&["create", "--name", "alpha", "--json"]).ok().json();
    assert_eq!(again["id"], sb["id"]);
    // Without --json: just the id.
    let plain = d.cli(&["create", "--name", "alpha"]).ok();
    assert_eq!(plain.stdout_str().trim(), sb["id"].as_str().unwrap());
}

#[test]
fn ls_filters_by_label_and_state() {
    if !require_root("ls_filters_by_label_and_state") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    let a = d.create(&["--label", "team=a", "--label", "tier=x"]);
    let b = d.create(&["--label", "team=b"]);
    let ids = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["ls", "--json"];
        all.extend_from_slice(args);
        let v = d.cli(&all).ok().json();
        let mut ids: Vec<String> = v["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(ids(&[]), both);
    assert_eq!(ids(&["--label", "team=a"]), vec![a.clone()]);
    assert_eq!(
        ids(&["--label", "team=a", "--label", "tier=x"]),
        vec![a.clone()]
    );
    assert_eq!(
        ids(&["--label", "team=a", "--label", "tier=y"]),
        Vec::<String>::new()
    );
    d.cli(&["pause", &b]).ok();
    assert_eq!(ids(&["--state", "paused"]), vec![b.clone()]);
    assert_eq!(ids(&["--state", "running"]), vec![a.clone()]);
    // The table has a header and one row per sandbox.
    let table = d.cli(&["ls"]).ok().stdout_str();
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains(&a) && table.contains(&b), "{table}");
    // A bad state is a usage error.
    assert_ne!(d.cli(&["ls", "--state", "sleeping"]).code, 0);
}

#[test]
fn info_by_id_and_name() {
    if !require_root("info_by_id_and_name") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    let id = d.create(&["--name", "named"]);
    let by_name = d.cli(&["info", "named", "--json"]).ok().json();
    assert_eq!(by_name["id"], id.as_str());
    let text = d.cli(&["info", &id]).ok().stdout_str();
    assert!(text.contains(&id) && text.contains("running"), "{text}");
}

#[test]
fn exec_streams_output_and_propagates_the_exit_code() {
    if !require_root("exec_streams_output_and_propagates_the_exit_code") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--tier", tier]);
        let run = d.cli(&["exec", &id, "--", "echo", "42"]).ok();
        assert_eq!(run.stdout_str(), "42\n");
        let run = d
            .cli(&[
                "exec",
                &id,
                "--",
                "sh",
                "-c",
                "echo out; echo err >&2; exit 3",
            ])
            .expect_code(3);
        assert_eq!(run.stdout_str(), "out\n");
        assert!(run.stderr.contains("err"), "{}", run.stderr);
        // stdin, env and cwd reach the process.
        let run = d
            .cli_stdin(
                &[
                    "exec",
                    &id,
                    "--stdin",
                    "--env",
                    "X=y",
                    "--cwd",
                    "/tmp",
                    "--",
                    "sh",
                    "-c",
                    "cat; echo $X; pwd",
                ],
                Some(b"in\n"),
            )
            .ok();
        assert_eq!(run.stdout_str(), "in\ny\n/tmp\n");
        // Binary output is not mangled.
        let run = d
            .cli(&["exec", &id, "--", "printf", "\\377\\000\\376"])
            .ok();
        assert_eq!(run.stdout, vec![0xff, 0, 0xfe]);
    });
}

#[test]
fn exec_json_has_the_documented_shape() {
    if !require_root("exec_json_has_the_documented_shape") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--tier", tier]);
        let v = d
            .cli(&["exec", &id, "--json", "--", "sh", "-c", "echo 42; exit 7"])
            .ok()
            .json();
        assert_eq!(v["exit_code"], 7);
        assert_eq!(v["stdout"], "42\n");
        assert_eq!(v["stderr"], "");
        assert_eq!(v["timed_out"], false);
        assert_eq!(v["truncated"], false);
        assert!(v["duration_ms"].is_u64(), "{v}");
    });
}

#[test]
fn exec_timeout_exits_124() {
    if !require_root("exec_timeout_exits_124") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--tier", tier]);
        let started = Instant::now();
        d.cli(&["exec", &id, "--timeout", "1", "--", "sleep", "30"])
            .expect_code(124);
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{:?}",
            started.elapsed()
        );
        let v = d
            .cli(&["exec", &id, "--timeout", "1", "--json", "--", "sleep", "30"])
            .ok()
            .json();
        assert_eq!(v["timed_out"], true);
        assert_eq!(v["exit_code"], serde_json::Value::Null);
    });
}

#[test]
fn pause_resume_stop_start() {
    if !require_root("pause_resume_stop_start") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--tier", tier]);
        assert_eq!(d.cli(&["pause", &id]).ok().stdout_str(), "paused\n");
        assert_eq!(
            d.cli(&["info", &id, "--json"]).ok().json()["state"],
            "paused"
        );
        assert_eq!(d.cli(&["resume", &id]).ok().stdout_str(), "running\n");
        d.cli(&["exec", &id, "--", "true"]).ok();
        assert_eq!(d.cli(&["stop", &id]).ok().stdout_str(), "stopped\n");
        let run = d.cli(&["exec", &id, "--", "true"]).expect_code(1);
        assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
        let sb = d.cli(&["start", &id, "--json"]).ok().json();
        assert_eq!(sb["state"], "running");
        d.cli(&["exec", &id, "--", "true"]).ok();
    });
}

#[test]
fn rm_deletes() {
    if !require_root("rm_deletes") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--name", "doomed", "--tier", tier]);
        d.cli(&["stop", &id]).ok();
        d.cli(&["rm", &id]).ok();
        let run = d.cli(&["info", &id]).expect_code(1);
        assert!(run.stderr.contains("not found"), "{}", run.stderr);
        // A running sandbox needs --force.
        let id = d.create(&["--tier", tier]);
        assert_eq!(d.cli(&["rm", &id]).code, 1);
        d.cli(&["rm", "--force", &id]).ok();
        assert_eq!(d.cli(&["info", &id]).code, 1);
    });
}

#[test]
fn files_round_trip_is_binary_safe() {
    if !require_root("files_round_trip_is_binary_safe") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--tier", tier]);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        d.cli(&["files", "mkdir", &id, "/tmp/a/b", "-p"]).ok();
        d.cli_stdin(&["files", "write", &id, "/tmp/a/b/blob.bin"], Some(&data))
            .ok();
        let read = d.cli(&["files", "read", &id, "/tmp/a/b/blob.bin"]).ok();
        assert!(read.stdout == data, "read back {} bytes", read.stdout.len());
        let list = d
            .cli(&["files", "ls", &id, "/tmp/a/b", "--json"])
            .ok()
            .json();
        let entries = list["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{list}");
        assert_eq!(entries[0]["name"], "blob.bin");
        assert_eq!(entries[0]["size"], data.len() as u64);
        let stat = d
            .cli(&["files", "stat", &id, "/tmp/a/b/blob.bin", "--json"])
            .ok()
            .json();
        assert_eq!(stat["kind"], "file");
        // The process inside sees the same bytes.
        let sum = d
            .cli(&["exec", &id, "--", "wc", "-c", "/tmp/a/b/blob.bin"])
            .ok()
            .stdout_str();
        assert!(sum.starts_with(&data.len().to_string()), "{sum}");
        d.cli(&["files", "rm", &id, "/tmp/a", "-r"]).ok();
        let run = d
            .cli(&["files", "read", &id, "/tmp/a/b/blob.bin"])
            .expect_code(1);
        let msg = run.stderr.to_lowercase();
        assert!(
            msg.contains("not found") || msg.contains("no such"),
            "{msg}"
        );
    });
}

#[test]
fn daemon_restart_after_kill9_readopts_sandboxes() {
    if !require_root("daemon_restart_after_kill9_readopts_sandboxes") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |mut d, tier| {
        let id = d.create(&["--name", "survivor", "--tier", tier]);
        d.cli_stdin(
            &["files", "write", &id, "/tmp/keep.txt"],
            Some(b"still here"),
        )
        .ok();
        d.kill9();
        d.restart();
        let read = d.cli(&["files", "read", "survivor", "/tmp/keep.txt"]).ok();
        assert_eq!(read.stdout, b"still here");
        let sb = d.cli(&["info", &id, "--json"]).ok().json();
        assert_eq!(sb["state"], "running");
        d.cli(&["exec", &id, "--", "true"]).ok();
    });
}

#[test]
fn unix_socket_pid_file_and_clean_sigterm() {
    if !require_root("unix_socket_pid_file_and_clean_sigterm") {
        return;
    }
    let _serial = serial();
    let mut d = Daemon::start();
    let socket = d.root_path().join("threadbox.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    let pid = std::fs::read_to_string(d.root_path().join("threadbox.pid")).unwrap();
    assert!(pid.trim().parse::<u32>().is_ok(), "{pid:?}");
    // The CLI works over the socket too.
    let run = run_cli(
        &d.socket_url(),
        &["create", "--name", "via-socket", "--json"],
        None,
    )
    .ok();
    let id = run.json()["id"].as_str().unwrap().to_string();
    let status = d.terminate();
    assert!(status.success(), "{status}\n{}", d.log());
    assert!(!socket.exists(), "socket left behind");
    assert!(
        !d.root_path().join("threadbox.pid").exists(),
        "pid file left behind"
    );
    // The sandbox outlived the daemon.
    d.restart();
    let run = d.cli(&["exec", &id, "--", "echo", "alive"]).ok();
    assert_eq!(run.stdout_str(), "alive\n");
}

#[test]
fn background_processes() {
    if !require_root("background_processes") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--tier", tier]);
        let pid = d
            .cli(&["spawn", &id, "--", "sh", "-c", "echo started $$; sleep 300"])
            .ok()
            .stdout_str()
            .trim()
            .to_string();
        let ps = d.cli(&["ps", &id, "--json"]).ok().json();
        assert!(
            ps["processes"].as_array().unwrap().iter().any(|p| p["id"]
                .as_u64()
                .map(|n| n.to_string())
                .as_deref()
                == Some(pid.as_str())),
            "{ps}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let logs = loop {
            let logs = d.cli(&["logs", &id, &pid]).ok().stdout_str();
            if logs.contains("started") {
                break logs;
            }
            assert!(
                Instant::now() < deadline,
                "no output from the background process"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        // The pid the API lists is the one the sandbox knows the process by (`$$`), on
        // both tiers (ADR 0218: gvisor's processes have a pid namespace of their own).
        let own = logs.trim().trim_start_matches("started ").to_string();
        let listed = ps["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"].as_u64().map(|n| n.to_string()).as_deref() == Some(pid.as_str()))
            .map(|p| p["pid"].to_string())
            .unwrap_or_default();
        assert_eq!(listed, own, "tier {tier}: {ps}");
        let inside = d
            .cli(&["exec", &id, "--", "cat", &format!("/proc/{own}/cmdline")])
            .ok()
            .stdout_str();
        assert!(inside.contains("echo started"), "tier {tier}: {inside:?}");
        d.cli(&["kill", &id, &pid, "--signal", "TERM"]).ok();
    });
}

#[test]
fn unknown_sandbox_is_not_found() {
    if !require_root("unknown_sandbox_is_not_found") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    for args in [
        vec!["info", "no-such-sandbox"],
        vec!["exec", "no-such-sandbox", "--", "true"],
        vec!["files", "read", "no-such-sandbox", "/etc/hostname"],
        vec!["pause", "no-such-sandbox"],
    ] {
        let run = d.cli(&args).expect_code(1);
        assert!(
            run.stderr.starts_with("error: "),
            "{args:?}: {}",
            run.stderr
        );
        assert!(run.stderr.contains("not found"), "{args:?}: {}", run.stderr);
    }
}

/// One raw GET over the daemon's socket (for query values the CLI cannot send).
fn raw_get(d: &Daemon, target: &str) -> (u16, String) {
    let (status, body) = raw(d, "GET", target, b"");
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// One raw request over the daemon's socket; the status and the body's bytes.
fn raw(d: &Daemon, method: &str, target: &str, body: &[u8]) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(d.root_path().join("threadbox.sock"))
        .expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("send the request");
    s.write_all(body).expect("send the body");
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let head_end = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(&resp)));
    let head = String::from_utf8_lossy(&resp[..head_end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {head:?}"));
    let mut body = resp[head_end + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|h| usize::from_str_radix(h.trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

#[test]
fn files_read_a_byte_range() {
    if !require_root("files_read_a_byte_range") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--tier", tier]);
        // Larger than the daemon's 1 MiB chunk to the agent, so ranges span chunks.
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        d.cli_stdin(&["files", "write", &id, "big.bin"], Some(&data))
            .ok();
        let read = |args: &[&str]| {
            let mut all = vec!["files", "read", id.as_str(), "big.bin"];
            all.extend_from_slice(args);
            d.cli(&all).ok().stdout
        };
        let r = read(&["--offset", "1048570", "--length", "1048600"]);
        assert!(r == data[1_048_570..2_097_170], "got {} bytes", r.len());
        let r = read(&["--length", "10"]);
        assert_eq!(r, data[..10]);
        let r = read(&["--offset", "2999990"]);
        assert_eq!(r, data[2_999_990..]);
        // Past the end: what there is, then nothing.
        let r = read(&["--offset", "2999990", "--length", "100"]);
        assert_eq!(r, data[2_999_990..]);
        assert!(read(&["--offset", "3000000"]).is_empty());
        assert!(read(&["--offset", "99999999999", "--length", "5"]).is_empty());

        // Bad values: a clear error, before the agent is asked.
        let run = d
            .cli(&["files", "read", &id, "big.bin", "--length", "0"])
            .expect_code(1);
        assert!(
            run.stderr.contains("length must be at least 1"),
            "{}",
            run.stderr
        );
        let run = d
            .cli(&[
                "files",
                "read",
                &id,
                "big.bin",
                "--offset",
                "9223372036854775807",
                "--length",
                "1",
            ])
            .expect_code(1);
        assert!(
            run.stderr.contains("beyond the largest file offset"),
            "{}",
            run.stderr
        );
        for bad in ["offset=abc", "offset=-1", "length=1.5", "length=-3"] {
            let (status, body) =
                raw_get(&d, &format!("/v1/sandboxes/{id}/files?path=big.bin&{bad}"));
            assert_eq!(status, 400, "{bad}: {body}");
            assert!(body.contains("invalid_argument"), "{bad}: {body}");
        }
        // A positive control for the raw request: the same route with good values answers.
        let (status, body) = raw_get(
            &d,
            &format!("/v1/sandboxes/{id}/files?path=big.bin&offset=0&length=3"),
        );
        assert_eq!(status, 200, "{body}");
    });
}

#[test]
fn exec_names_an_oom_kill_on_stderr() {
    if !require_root("exec_names_an_oom_kill_on_stderr") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--memory", "64M", "--tier", tier]);
        let run = d.cli(&[
            "exec",
            &id,
            "--",
            "python3",
            "-c",
            "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096])",
        ]);
        assert_eq!(run.code, 137, "{}", run.stderr);
        assert!(
            run.stderr.contains("killed: out of memory (limit 64 MiB)"),
            "{}",
            run.stderr
        );
        // A process killed by SIGKILL for another reason is not called an OOM kill.
        let run = d.cli(&["exec", &id, "--", "sh", "-c", "kill -9 $$"]);
        assert_eq!(run.code, 137, "{}", run.stderr);
        assert!(!run.stderr.contains("out of memory"), "{}", run.stderr);
    });
}

#[test]
fn names_that_are_not_utf8_round_trip_over_rest() {
    if !require_root("names_that_are_not_utf8_round_trip_over_rest") {
        return;
    }
    let _serial = serial();
    each_tier(&[], |d, tier| {
        let id = d.create(&["--tier", tier]);
        // b"caf\xe9-\xff.txt", made inside as a program would.
        d.cli(&[
            "exec",
            &id,
            "--",
            "python3",
            "-c",
            "open(b'/home/user/caf\\xe9-\\xff.txt', 'wb').write(b'bonjour')",
        ])
        .ok();
        let (status, body) = raw_get(
            &d,
            &format!("/v1/sandboxes/{id}/files/list?path=/home/user"),
        );
        assert_eq!(status, 200, "{body}");
        let list: serde_json::Value = serde_json::from_str(&body).unwrap();
        let entry = list["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name_b64"].is_string())
            .unwrap_or_else(|| panic!("no entry with name_b64: {list}"));
        assert_eq!(entry["name_b64"], "Y2Fm6S3/LnR4dA==");
        assert_eq!(entry["name"], "caf\u{fffd}-\u{fffd}.txt");
        let path_b64 = entry["path_b64"].as_str().expect("path_b64").to_string();
        // Given back, the bytes name the same file: read, stat, write, remove.
        let enc = path_b64
            .replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D");
        let q = |route: &str| format!("/v1/sandboxes/{id}/files{route}?path_b64={enc}");
        let (status, data) = raw(&d, "GET", &q(""), b"");
        assert_eq!((status, data.as_slice()), (200, &b"bonjour"[..]));
        let (status, stat) = raw_get(&d, &q("/stat"));
        assert_eq!(status, 200, "{stat}");
        assert!(stat.contains("\"size\":7"), "{stat}");
        let (status, _) = raw(&d, "PUT", &q(""), b"salut");
        assert_eq!(status, 204);
        let (_, data) = raw(&d, "GET", &q(""), b"");
        assert_eq!(data, b"salut");
        // A plain listing keeps plain names plain (no *_b64 fields).
        d.cli_stdin(&["files", "write", &id, "plain.txt"], Some(b"x"))
            .ok();
        let (_, body) = raw_get(&d, &format!("/v1/sandboxes/{id}/files/stat?path=plain.txt"));
        assert!(!body.contains("_b64"), "{body}");
        // The CLI shows the name escaped.
        let ls = d.cli(&["files", "ls", &id, "/home/user"]).ok().stdout_str();
        assert!(ls.contains("caf\\xe9-\\xff.txt"), "{ls}");
        // Bad requests: both forms, neither, not base64.
        for bad in ["path=a&path_b64=YQ==", "", "path_b64=***"] {
            let (status, body) = raw_get(&d, &format!("/v1/sandboxes/{id}/files/stat?{bad}"));
            assert_eq!(status, 400, "{bad}: {body}");
            assert!(body.contains("path"), "{bad}: {body}");
        }
        let (status, _) = raw(&d, "DELETE", &q(""), b"");
        assert_eq!(status, 204);
        let (status, _) = raw_get(&d, &q("/stat"));
        assert_eq!(status, 404);
    });
}
