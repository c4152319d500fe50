//! The fake tier on its own: boot, the real protocol, freeze, stop, a second instance
//! over the same root. None of these needs root.

use super::*;
use crate::agent::AgentConn;
use crate::images::ImageSpec;
use std::time::{Duration, Instant};
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

fn launch(d: &FakeDriver, id: &str) -> i32 {
    d.prepare(id, 0, 0).expect("prepare");
    let image = ImageSpec {
        lower: vec![],
        binds: vec![],
    };
    d.launch(&LaunchRequest {
        id,
        hostname: id,
        slot: 0,
        image: &image,
        limits: limits(),
    })
    .expect("launch")
}

async fn connect(d: &FakeDriver, id: &str) -> std::sync::Arc<AgentConn> {
    // The socket exists once the agent listens; the connect itself has a deadline.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match AgentConn::connect(&d.socket_path(id), Duration::from_secs(10)).await {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("agent never answered: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
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
    let pid = launch(&d, "a");
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
    assert!(d.memory_current("a").unwrap() > 0);
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
    let pid = launch(&d, "f");
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
    let image = ImageSpec {
        lower: vec![],
        binds: vec![],
    };
    let err = d
        .launch(&LaunchRequest {
            id: "nodisk",
            hostname: "nodisk",
            slot: 0,
            image: &image,
            limits: limits(),
        })
        .unwrap_err();
    assert!(matches!(err, CoreError::Conflict(_)), "{err}");
}

#[tokio::test]
async fn a_second_instance_finds_the_first_ones_agents() {
    let root = tempfile::tempdir().unwrap();
    let first = driver(root.path());
    let pid = launch(&first, "r");
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
    assert!(d.prepare("x", 0, 0).is_err());
    assert!(!d.has_disk("x"), "a failed prepare leaves nothing");
    d.prepare("x", 0, 0).unwrap();
    d.fail_next(FakeFault::SetLimits, 1);
    assert!(d.set_limits("x", &limits()).is_err());
    d.set_limits("x", &limits()).unwrap();
    d.record_oom_kill("x");
    assert_eq!(d.oom_kills("x").unwrap(), 1);
}
