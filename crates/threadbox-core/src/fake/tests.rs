//! The fake tier on its own: boot, the real protocol, freeze, stop, a second instance
//! over the same root. None of these needs root.

use super::*;
use crate::agent::AgentConn;
use crate::driver::Driver;
use std::time::Duration;
use threadbox_proto::{Request, Response};

fn limits() -> Limits {
    Limits {
        memory_bytes: 1 << 30,
        cpus: 1.0,
        pids: 512,
    }
}

fn driver(root: &Path) -> FakeDriver {
    FakeDriver::new(root, agent_binary().expect("agent binary"))
}

fn spec(id: &str) -> SandboxSpec {
    SandboxSpec {
        id: id.into(),
        hostname: id.into(),
        index: 0,
        image: ImageRow {
            name: "host".into(),
            kind: "host".into(),
            path: None,
            created_at: 0,
        },
        limits: limits(),
        disk_bytes: 0,
        trust_ca: None,
        network: false,
    }
}

async fn launch(d: &FakeDriver, id: &str) -> i32 {
    let d: &dyn Driver = d;
    d.prepare(&spec(id)).await.expect("prepare");
    d.launch(&spec(id)).await.expect("launch")
}

async fn connect(d: &FakeDriver, id: &str) -> std::sync::Arc<AgentConn> {
    // The driver's connect waits for the agent to listen, within this deadline.
    AgentConn::connect(d, id, Duration::from_secs(20))
        .await
        .expect("the agent answers")
}

/// The process's state letter in `/proc/<pid>/stat`.
fn proc_state(pid: i32) -> String {
    stat_fields(pid)
        .and_then(|f| f.first().cloned())
        .unwrap_or_default()
}

#[tokio::test]
async fn boots_a_real_agent_and_speaks_the_protocol() {
    let root = tempfile::tempdir().unwrap();
    let d = driver(root.path());
    assert!(!d.has_disk("a"));
    let pid = launch(&d, "a").await;
    assert!(d.has_disk("a"));
    assert!(
        d.agent_alive("a", pid),
        "{:?} {:?}",
        std::fs::read(format!("/proc/{pid}/cmdline")),
        std::fs::read_to_string(root.path().join("a/agent.log"))
    );
    assert!(!d.agent_alive("a", pid + 1));
    let conn = connect(&d, "a").await;
    assert_eq!(conn.call(Request::Ping).await.unwrap(), Response::Pong);
    assert!(Driver::usage(&d, "a", false).await.memory_bytes > Some(0));
    assert_eq!(d.limits("a"), Some(limits()));
    d.destroy("a").unwrap();
    assert!(!d.agent_alive("a", pid));
    assert!(!d.has_disk("a"));
    assert!(!root.path().join("a").exists());
}

#[tokio::test]
async fn freeze_stops_the_agent_and_thaw_continues_it() {
    let root = tempfile::tempdir().unwrap();
    let d = driver(root.path());
    let pid = launch(&d, "f").await;
    let conn = connect(&d, "f").await;
    d.freeze("f").unwrap();
    assert!(d.is_frozen("f").unwrap());
    assert_eq!(proc_state(pid), "T", "the agent is stopped while frozen");
    d.thaw("f").unwrap();
    assert!(!d.is_frozen("f").unwrap());
    assert_eq!(conn.call(Request::Ping).await.unwrap(), Response::Pong);
    d.stop("f").unwrap();
    assert!(!d.agent_alive("f", pid));
    assert!(
        !d.is_frozen("f").unwrap(),
        "nothing runs, so nothing is frozen"
    );
    assert!(d.has_disk("f"), "stop keeps the disk");
}

#[tokio::test]
async fn launch_without_a_disk_is_a_conflict() {
    let root = tempfile::tempdir().unwrap();
    let d = driver(root.path());
    let d: &dyn Driver = &d;
    let err = d.launch(&spec("nodisk")).await.unwrap_err();
    assert!(matches!(err, CoreError::Conflict(_)), "{err}");
}

#[tokio::test]
async fn a_second_instance_finds_the_first_ones_agents() {
    let root = tempfile::tempdir().unwrap();
    let first = driver(root.path());
    let pid = launch(&first, "r").await;
    // Once it answers it is past its exec (its command line names the socket).
    drop(connect(&first, "r").await);
    let second = driver(root.path());
    assert!(second.agent_alive("r", pid));
    let conn = connect(&second, "r").await;
    assert_eq!(conn.call(Request::Ping).await.unwrap(), Response::Pong);
    second.stop("r").unwrap();
    assert!(!first.agent_alive("r", pid));
    // A stale pid file does not name whatever process got that pid next.
    std::fs::write(
        root.path().join("r/agent.pid"),
        std::process::id().to_string(),
    )
    .unwrap();
    assert_eq!(second.agent_pid("r"), None);
}

#[tokio::test]
async fn injected_faults_fire_once() {
    let root = tempfile::tempdir().unwrap();
    let d = driver(root.path());
    d.fail_next(FakeFault::Prepare, 1);
    assert!(d.prepare("x").is_err());
    assert!(!d.has_disk("x"), "a failed prepare leaves nothing");
    d.prepare("x").unwrap();
    d.fail_next(FakeFault::SetLimits, 1);
    assert!(d.set_limits("x", &limits()).is_err());
    d.set_limits("x", &limits()).unwrap();
    d.record_oom_kill("x");
    assert_eq!(d.oom_kills("x").unwrap(), 1);
}
