//! Class W: the isolation layers of a process started *before* hibernation, checked by
//! that same process after the wake (and in each fork, on a tier that forks memory):
//! the check that catches a restore that silently drops a layer (issue 16; CRIU restored
//! our jail without its Landlock domain, `research/memory.md`). ADR 0150.
//!
//! A checker started before the hibernate keeps a random token in memory and, on request,
//! reports from inside: each thread's seccomp mode, no_new_privs and effective
//! capabilities (`/proc/self/task/*/status`); system calls the filter refuses (`keyctl`,
//! `unshare(CLONE_NEWUSER)`, tried in a forked child); Landlock's refusal of a POSIX
//! message queue (where the tier has Landlock); the `/proc` masks (`/proc/timer_list` is
//! `/dev/null`, `/proc/sys` read-only) and its whole mount table. The host judges: every
//! layer in force before, the same process (token, pid) after, and nothing changed. The
//! daemon is `kill -9`ed and restarted while the sandbox is hibernated.
//!
//! Positive controls (ADR 0009): `wake-unmask`, a weakened build whose wake unmounts the
//! masks (what a restore that rebuilt the mounts without them would leave), must be caught
//! after the wake and not before; and `no-seccomp,no-landlock,no-proc-mask` at boot shows
//! each probe sees its layer missing — a running process's seccomp filter and Landlock
//! domain cannot be taken from it on the jail, so no wake hook can drop those there.
//!
//! Per tier (`THREADBOX_TEST_TIERS`), skipped by capability: `hibernate`; on gvisor
//! Landlock is not applicable (no `landlock` capability), the seccomp probes and the mount
//! table still are; forks with memory need `fork_memory`.

use crate::harness::*;
use crate::swap::Swap;
use crate::tiers;
use serde_json::Value;
use std::time::Duration;
use threadbox_api::{
    checkpoints::ForkRequest, CreateSandboxRequest, ExecRequest, LimitsRequest, SandboxState,
    StartProcessRequest, User,
};

/// The capability of a tier whose forks carry the parent's memory and processes.
const FORK_MEMORY: &str = "fork_memory";

const DIR: &str = "/tmp/wake-check";

/// Waits for `DIR/ask-N`, answers with `DIR/report-N.json` (written whole, then renamed).
const CHECKER: &str = r##"
import ctypes, json, os, stat, threading, time
libc = ctypes.CDLL(None, use_errno=True)
DIR = "/tmp/wake-check"
TOKEN = os.urandom(16).hex()
# Files the jail masks with /dev/null (those this kernel has are judged).
MASKED = ["kcore", "timer_list", "keys", "kpageflags", "kallsyms", "interrupts", "sysrq-trigger"]
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}[os.uname().machine]

def err(rc):
    return "ok" if rc >= 0 else os.strerror(ctypes.get_errno())

def in_child(fn):
    # A probe that could change the checker itself runs in a forked child.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = fn()
        except Exception as e:
            res = "exception " + repr(e)
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        c = os.read(r, 65536)
        if not c:
            break
        data += c
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data) if data else "no answer"

def keyctl():
    return err(libc.syscall(SYS_KEYCTL, 0, -3, 0))  # KEYCTL_GET_KEYRING_ID, session

def unshare_user():
    return err(libc.unshare(0x10000000))  # CLONE_NEWUSER

def mqueue():
    q = libc.mq_open(b"/tb-wake-check", os.O_CREAT | os.O_RDWR, 0o600, None)
    if q >= 0:
        libc.mq_unlink(b"/tb-wake-check")
        return "ok"
    return os.strerror(ctypes.get_errno())

def tasks():
    out = {}
    for t in sorted(os.listdir("/proc/self/task")):
        f = {}
        for line in open("/proc/self/task/%s/status" % t):
            k, _, v = line.partition(":")
            if k in ("Seccomp", "NoNewPrivs", "CapEff"):
                f[k] = v.strip()
        out[t] = f
    return out

def report(n):
    masked = {}
    for name in MASKED:
        p = "/proc/" + name
        masked[name] = "absent" if not os.path.exists(p) else (
            "chardev" if stat.S_ISCHR(os.stat(p).st_mode) else "file")
    mounts = sorted(set(" ".join(l.split()[4:6]) for l in open("/proc/self/mountinfo")))
    return {
        "n": n, "token": TOKEN, "pid": os.getpid(), "tasks": tasks(),
        "keyctl": in_child(keyctl), "unshare_user": in_child(unshare_user),
        "mqueue": in_child(mqueue), "masked": masked,
        "proc_sys_ro": bool(os.statvfs("/proc/sys").f_flag & os.ST_RDONLY),
        "mounts": mounts,
    }

# A second thread, so a restore that rebuilds threads is judged on each.
threading.Thread(target=lambda: time.sleep(1 << 30), daemon=True).start()
os.makedirs(DIR, exist_ok=True)
open(DIR + "/ready", "w").close()
while True:
    for name in os.listdir(DIR):
        if name.startswith("ask-"):
            n = name[4:]
            os.remove(os.path.join(DIR, name))
            tmp = DIR + "/report.tmp"
            with open(tmp, "w") as f:
                json.dump(report(n), f)
            os.rename(tmp, "%s/report-%s.json" % (DIR, n))
    time.sleep(0.02)
"##;

/// Layers found missing or changed, per stage.
#[derive(Debug, Default)]
pub struct Outcome {
    pub before: Vec<String>,
    pub after_wake: Vec<String>,
    /// One list per fork (empty where the tier forks no memory).
    pub forks: Vec<Vec<String>>,
}

fn tiers_json(d: &Daemon) -> Value {
    let list = block(d.client.call(&threadbox_api::tiers::ListTiers)).expect("tiers");
    serde_json::to_value(list).expect("tiers as json")
}

fn capabilities(tiers: &Value, tier: &str) -> Vec<String> {
    tiers["tiers"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == tier))
        .and_then(|t| t["capabilities"].as_array())
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Asks the checker for report `n` (the exec wakes a hibernated sandbox).
fn ask(d: &Daemon, id: &str, n: &str) -> Value {
    let r = d.exec(
        id,
        &ExecRequest {
            shell: Some(format!(
                "touch {DIR}/ask-{n}; i=0; while [ ! -f {DIR}/report-{n}.json ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done; cat {DIR}/report-{n}.json"
            )),
            user: User::User,
            timeout_secs: Some(120.0),
            ..Default::default()
        },
    );
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| {
        panic!(
            "report {n}: {e}: {:?} {}\n{}",
            r.exit_code,
            r.stderr,
            d.log()
        )
    })
}

/// What is missing from report `r` (and, given `before`, what changed since).
pub fn losses(r: &Value, tier: &str, caps: &[String], before: Option<&Value>) -> Vec<String> {
    let mut out = Vec::new();
    let jail = tier == "jail";
    let tasks = r["tasks"].as_object().cloned().unwrap_or_default();
    if tasks.len() < 2 {
        out.push(format!(
            "threads: expected the checker's two, saw {tasks:?}"
        ));
    }
    for (tid, f) in &tasks {
        match f["Seccomp"].as_str() {
            Some("2") => {}
            None if !jail => {}
            other => out.push(format!("seccomp: thread {tid} has mode {other:?}")),
        }
        if jail && f["NoNewPrivs"].as_str() != Some("1") {
            out.push(format!(
                "no_new_privs: thread {tid} has {:?}",
                f["NoNewPrivs"]
            ));
        }
        if jail && f["CapEff"].as_str() != Some("0000000000000000") {
            out.push(format!("capabilities: thread {tid} has {:?}", f["CapEff"]));
        }
    }
    for probe in ["keyctl", "unshare_user"] {
        if r[probe] == "ok" {
            out.push(format!(
                "seccomp: {probe} was allowed (the filter refuses it)"
            ));
        }
    }
    if caps.iter().any(|c| c == "landlock") && r["mqueue"] == "ok" {
        out.push("landlock: a POSIX message queue was opened".into());
    }
    if jail {
        let masked = r["masked"].as_object().cloned().unwrap_or_default();
        if !masked.values().any(|k| k != "absent") {
            out.push(format!(
                "masks: none of the masked files is there: {masked:?}"
            ));
        }
        for (name, kind) in &masked {
            if kind == "file" {
                out.push(format!(
                    "masks: /proc/{name} is the kernel's file, not /dev/null"
                ));
            }
        }
        if r["proc_sys_ro"] != true {
            out.push("masks: /proc/sys is writable".into());
        }
    }
    if let Some(b) = before {
        if r["token"] != b["token"] || r["pid"] != b["pid"] {
            out.push(format!(
                "not the process started before: pid {} token {} (before: pid {} token {})",
                r["pid"], r["token"], b["pid"], b["token"]
            ));
        }
        let set = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|m| m.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (now, then) = (set(&r["mounts"]), set(&b["mounts"]));
        let gone: Vec<&String> = then.iter().filter(|m| !now.contains(m)).collect();
        let new: Vec<&String> = now.iter().filter(|m| !then.contains(m)).collect();
        if !gone.is_empty() || !new.is_empty() {
            out.push(format!("masks: mounts gone {gone:?}, new {new:?}"));
        }
        for k in [
            "tasks",
            "keyctl",
            "unshare_user",
            "mqueue",
            "masked",
            "proc_sys_ro",
        ] {
            if r[k] != b[k] {
                out.push(format!("changed: {k} was {} and is {}", b[k], r[k]));
            }
        }
    }
    out
}

/// Boots a sandbox on `tier`, starts the checker, hibernates it, restarts the daemon
/// (`kill -9`), wakes it by asking, and forks it where the tier forks memory.
pub fn across_wake(d: &mut Daemon, tier: &str, caps: &[String]) -> Outcome {
    let (sb, _) = block(d.client.create(&CreateSandboxRequest {
        tier: Some(tier.to_string()),
        limits: LimitsRequest {
            memory_bytes: Some(256 << 20),
            ..Default::default()
        },
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("create on {tier}: {e}\n{}", d.log()));
    let id = sb.id;
    block(d.client.start_process(
        &id,
        &StartProcessRequest {
            command: Some(vec!["python3".into(), "-c".into(), CHECKER.into()]),
            user: User::User,
            ..Default::default()
        },
    ))
    .expect("start the checker");
    wait_for("the checker", Duration::from_secs(60), || {
        d.sh(&id, User::User, &format!("test -f {DIR}/ready"))
            .exit_code
            == Some(0)
    });
    let before = ask(d, &id, "before");
    let mut out = Outcome {
        before: losses(&before, tier, caps, None),
        ..Outcome::default()
    };

    let h = block(d.client.hibernate(&id)).unwrap_or_else(|e| panic!("hibernate: {e}"));
    assert_eq!(h.state, SandboxState::Hibernated);
    d.kill9();
    d.restart();
    let still = block(d.client.get(&id)).expect("get");
    assert_eq!(
        still.state,
        SandboxState::Hibernated,
        "hibernated across the restart"
    );
    let after = ask(d, &id, "after");
    out.after_wake = losses(&after, tier, caps, Some(&before));

    if caps.iter().any(|c| c == FORK_MEMORY) {
        let forks = block(d.client.call(&threadbox_api::checkpoints::Fork {
            sandbox: id.clone(),
            request: ForkRequest {
                count: Some(3),
                ..Default::default()
            },
        }))
        .unwrap_or_else(|e| panic!("fork: {e}"));
        for f in &forks.sandboxes {
            let r = ask(d, &f.id, "fork");
            out.forks.push(losses(&r, tier, caps, Some(&before)));
        }
    } else {
        eprintln!("forks not checked on tier {tier}: needs the {FORK_MEMORY:?} capability");
    }
    let _ = block(d.client.delete(&id, true));
    out
}

/// Every layer holds across hibernate, a daemon restart and the wake, on each tier.
pub fn held_on_each_tier() {
    let _s = serial();
    let _swap = Swap::on(512);
    let mut d = Daemon::start(&normal_bins(), None);
    let tj = tiers_json(&d);
    let mut ran = 0;
    for tier in tiers::under_test() {
        if !tiers::runs_on(&tier, &tj, &["hibernate"]) {
            continue;
        }
        let caps = capabilities(&tj, &tier);
        let o = across_wake(&mut d, &tier, &caps);
        eprintln!("tier {tier}: {o:?}");
        assert!(
            o.before.is_empty(),
            "tier {tier}: layers missing before hibernate: {:#?}",
            o.before
        );
        assert!(
            o.after_wake.is_empty(),
            "tier {tier}: layers lost across the wake: {:#?}",
            o.after_wake
        );
        for (i, f) in o.forks.iter().enumerate() {
            assert!(f.is_empty(), "tier {tier}: fork {i} lost layers: {f:#?}");
        }
        ran += 1;
    }
    assert!(ran > 0, "no tier under test can hibernate");
}

/// The controls: a wake that unmounts the masks is caught after it (and not before);
/// each probe sees its layer missing in a build without it.
pub fn controls_detect() {
    let weak = weakened_bins();
    let _s = serial();
    let _swap = Swap::on(512);
    let caps = vec!["landlock".to_string(), "hibernate".to_string()];

    let mut d = Daemon::start(&weak, Some("wake-unmask"));
    let o = across_wake(&mut d, "jail", &caps);
    eprintln!("control wake-unmask: {o:?}");
    assert!(
        o.before.is_empty(),
        "nothing dropped before: {:#?}",
        o.before
    );
    for want in [
        "masks: /proc/timer_list",
        "masks: /proc/sys",
        "masks: mounts gone",
    ] {
        assert!(
            o.after_wake.iter().any(|l| l.starts_with(want)),
            "wake-unmask not caught as {want:?}: {:#?}",
            o.after_wake
        );
    }
    drop(d);

    let mut d = Daemon::start(&weak, Some("no-seccomp,no-landlock,no-proc-mask"));
    let o = across_wake(&mut d, "jail", &caps);
    eprintln!("control no-seccomp,no-landlock,no-proc-mask: {o:?}");
    for list in [&o.before, &o.after_wake] {
        for want in [
            "seccomp: thread",
            "seccomp: keyctl",
            "seccomp: unshare_user",
            "landlock:",
            "masks: /proc/timer_list",
            "masks: /proc/sys",
        ] {
            assert!(
                list.iter().any(|l| l.starts_with(want)),
                "a missing layer not seen as {want:?}: {list:#?}"
            );
        }
    }
}
