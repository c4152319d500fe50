//! An OCI image config's `User`, `Env` and `WorkingDir` as the defaults of every process
//! door (issue 14 scope 1, ADR 0160): exec, background processes, interpreter contexts,
//! terminals and the files API, each with the call's own user/env/cwd winning; an image
//! whose `User` cannot be resolved, or leaves the sandbox's ids, is refused at create.
//! The image is the suite's Debian rootfs plus a layer adding user `app` (1234:2345),
//! imported from an OCI layout (no registry needed). Waits have deadlines, no sleeps.

mod common;

use common::{require_root, serial, Daemon};
use futures::StreamExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use threadbox_api::interp::{CreateContext, CreateContextRequest, ExecuteCode, ExecuteCodeRequest};
use threadbox_api::pty::PtyRequest;
use threadbox_api::{ExecRequest, StartProcessRequest, User};
use threadbox_client::Client;
use threadbox_oci::layout::{tar_dir, LayerBlob, LayoutWriter};
use threadbox_oci::manifest::Platform;
use tokio_tungstenite::tungstenite::Message;

const DEADLINE: Duration = Duration::from_secs(60);
/// What every door prints: uid, gid, HOME, USER, the directory, one image variable.
const PROBE: &str = "echo $(id -u):$(id -g) $HOME $USER $(pwd) $GREETING";

fn rootfs() -> Option<PathBuf> {
    let p = std::env::var("THREADBOX_TEST_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-rootfs/debian")
        });
    p.join("usr/bin/python3").exists().then_some(p)
}

/// The layer over the rootfs: its passwd and group plus `app`, and `/work`.
fn app_layer(rootfs: &std::path::Path) -> Vec<u8> {
    let mut passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    passwd.push_str("app:x:1234:2345:App:/home/app:/bin/sh\n");
    let mut group = std::fs::read_to_string(rootfs.join("etc/group")).unwrap();
    group.push_str("app:x:2345:\n");
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8], mode: u32, dir: bool| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(if dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    add("etc/passwd", passwd.as_bytes(), 0o644, false);
    add("etc/group", group.as_bytes(), 0o644, false);
    add("work", b"", 0o777, true);
    add("home/app", b"", 0o777, true);
    b.into_inner().unwrap()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Everything a terminal running `cmd` prints until it closes.
async fn pty_output(c: &Client, sb: &str, req: PtyRequest) -> String {
    let s = c.open_pty(sb, req).await.expect("open a terminal session");
    let mut ws = c.attach_pty(sb, &s.session, None).await.expect("attach");
    let mut out = Vec::new();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => out.extend_from_slice(&b),
            Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => break,
            Ok(Some(Ok(_))) => {}
            Err(_) => panic!("terminal timed out: {}", String::from_utf8_lossy(&out)),
        }
    }
    String::from_utf8_lossy(&out).replace('\r', "")
}

fn pty(cmd: &str, user: User, cwd: Option<&str>) -> PtyRequest {
    PtyRequest {
        cmd: Some(vec!["sh".into(), "-c".into(), cmd.into()]),
        cols: 200,
        rows: 24,
        env: Default::default(),
        cwd: cwd.map(String::from),
        user,
        shared_write: false,
    }
}

#[test]
fn the_image_config_user_env_and_workdir_are_the_defaults_of_every_door() {
    if !require_root("image config defaults") {
        return;
    }
    let Some(rootfs) = rootfs() else {
        eprintln!("skipped: no Debian rootfs (scripts/test.sh makes target/test-rootfs/debian)");
        return;
    };
    let _s = serial();
    let lay = tempfile::tempdir().unwrap();
    let mut w = LayoutWriter::create(lay.path()).unwrap();
    let base = tar_dir(&rootfs).unwrap();
    let layers = vec![LayerBlob::plain(base), LayerBlob::plain(app_layer(&rootfs))];
    let config = |user: &str| {
        serde_json::json!({
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=from-the-image"],
            "WorkingDir": "/work",
            "User": user,
        })
    };
    for (tag, user) in [
        ("app", "app"),
        ("ghost", "ghost"),
        ("wide", "70000"),
        ("num", "4321:2345"),
    ] {
        let img = w.image(&Platform::host(), &layers, config(user)).unwrap();
        w.tag(tag, &img).unwrap();
    }
    drop(layers);

    let d = Daemon::start();
    let layout = lay.path().to_str().unwrap();
    // An import takes a layout's first image: index.json names one tag at a time.
    let index_path = lay.path().join("index.json");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    for tag in ["app", "ghost", "wide", "num"] {
        let mut one = index.clone();
        one["manifests"] = serde_json::Value::Array(
            index["manifests"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
                .cloned()
                .collect(),
        );
        std::fs::write(&index_path, one.to_string()).unwrap();
        d.cli(&["image", "import", layout, "--name", tag]).ok();
    }

    // Refused at create, clearly, and nothing stays.
    let before = d.cli(&["ls", "--json"]).ok().json();
    let ghost = d.cli(&["create", "--image", "ghost"]);
    assert_ne!(ghost.code, 0);
    assert!(
        ghost
            .stderr
            .contains("no user \"ghost\" in the image's /etc/passwd"),
        "{}",
        ghost.stderr
    );
    let wide = d.cli(&["create", "--image", "wide"]);
    assert_ne!(wide.code, 0);
    assert!(wide.stderr.contains("ids 0-65535"), "{}", wide.stderr);
    assert_eq!(d.cli(&["ls", "--json"]).ok().json(), before);

    let sb = d.create(&["--image", "app"]);
    let c = Client::new(&d.url).expect("client");
    let app = "1234:2345 /home/app app /work from-the-image";
    rt().block_on(async {
        // exec: the image's user, env and directory; the call's win.
        let exec = |user: User, cwd: Option<&str>, env: &[(&str, &str)]| ExecRequest {
            shell: Some(PROBE.into()),
            user,
            cwd: cwd.map(String::from),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let r = c.exec(&sb, &exec(User::Default, None, &[])).await.unwrap();
        assert_eq!(r.stdout.trim(), app, "{r:?}");
        let r = c
            .exec(
                &sb,
                &exec(User::User, Some("/tmp"), &[("GREETING", "mine")]),
            )
            .await
            .unwrap();
        assert_eq!(
            r.stdout.trim(),
            "1000:1000 /home/user user /tmp mine",
            "{r:?}"
        );
        let r = c.exec(&sb, &exec(User::Root, None, &[])).await.unwrap();
        assert_eq!(
            r.stdout.trim(),
            "0:0 /root root /work from-the-image",
            "{r:?}"
        );

        // Background processes.
        for (user, cwd, want) in [
            (User::Default, None, app.to_string()),
            (
                User::Root,
                Some("/"),
                "0:0 /root root / from-the-image".to_string(),
            ),
        ] {
            let p = c
                .start_process(
                    &sb,
                    &StartProcessRequest {
                        shell: Some(PROBE.into()),
                        user,
                        cwd: cwd.map(String::from),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            let deadline = Instant::now() + DEADLINE;
            let logs = loop {
                let l = c.process_logs(&sb, p.id).await.unwrap();
                if l.stdout.ends_with('\n') {
                    break l;
                }
                assert!(
                    Instant::now() < deadline,
                    "no output from the process: {l:?}"
                );
                tokio::task::yield_now().await;
            };
            assert_eq!(logs.stdout.trim(), want, "{logs:?}");
        }

        // Interpreter contexts (bash: the same probe; python: its own view of the ids).
        for (name, user, want) in [
            ("img", User::Default, app),
            (
                "usr",
                User::User,
                "1000:1000 /home/user user /work from-the-image",
            ),
        ] {
            let ctx = c
                .call(&CreateContext {
                    sandbox: sb.clone(),
                    request: CreateContextRequest {
                        name: Some(name.into()),
                        language: "bash".into(),
                        cwd: None,
                        env: Default::default(),
                        user,
                    },
                })
                .await
                .unwrap();
            let e = c
                .call(&ExecuteCode {
                    sandbox: sb.clone(),
                    context: ctx.id.clone(),
                    request: ExecuteCodeRequest {
                        code: PROBE.into(),
                        env: Default::default(),
                        timeout_secs: Some(60),
                        max_output_bytes: None,
                    },
                })
                .await
                .unwrap();
            assert_eq!(e.stdout.trim(), want, "{e:?}");
        }

        // Terminals.
        let out = pty_output(&c, &sb, pty(PROBE, User::Default, None)).await;
        assert!(out.contains(app), "{out}");
        let out = pty_output(&c, &sb, pty(PROBE, User::User, Some("/tmp"))).await;
        assert!(
            out.contains("1000:1000 /home/user user /tmp from-the-image"),
            "{out}"
        );
    });

    // The files API writes as the image's user unless told otherwise.
    d.cli_stdin(&["files", "write", &sb, "/work/by-default"], Some(b"x"))
        .ok();
    d.cli_stdin(
        &["files", "write", &sb, "/work/by-root", "--user", "root"],
        Some(b"x"),
    )
    .ok();
    let r = d
        .cli(&[
            "exec",
            &sb,
            "--json",
            "--",
            "stat",
            "-c",
            "%n %u:%g",
            "/work/by-default",
            "/work/by-root",
        ])
        .json();
    assert_eq!(
        r["stdout"], "/work/by-default 1234:2345\n/work/by-root 0:0\n",
        "{r}"
    );

    // A numeric User not in passwd: its own ids, named by number, at home in /.
    let num = d.create(&["--image", "num"]);
    let r = d
        .cli(&["exec", &num, "--json", "--", "sh", "-c", PROBE])
        .json();
    assert_eq!(
        r["stdout"], "4321:2345 / 4321 /work from-the-image\n",
        "{r}"
    );

    for id in [&sb, &num] {
        d.cli(&["rm", "--force", id]).ok();
    }
}
