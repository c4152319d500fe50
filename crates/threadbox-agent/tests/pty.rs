//! Terminal sessions in the agent (ADR 0092), over the protocol (host test mode, as
//! root): a program on a pty sees a terminal of the asked size, gets typed input, and its
//! exit ends the session with its code; input to a session that is over, and bad sizes,
//! are clear errors.

mod common;

use common::*;
use threadbox_proto::*;

fn spec(script: &str, cols: u16, rows: u16) -> PtySpec {
    PtySpec {
        command: Command::Argv(vec!["/bin/sh".into(), "-c".into(), script.into()]),
        env: Default::default(),
        cwd: Some("/".into()),
        user: RunAs::User,
        cols,
        rows,
    }
}

/// Reads frames of request `id` until the terminal's output contains `needle`.
fn read_until(c: &mut Client, id: u64, out: &mut Vec<u8>, needle: &str) -> Option<Response> {
    loop {
        if String::from_utf8_lossy(out).contains(needle) {
            return None;
        }
        match c.recv() {
            Frame::Response { id: got, resp } if got == id => match resp {
                Response::Output { data, .. } => out.extend_from_slice(&data),
                other if other.is_final() => return Some(other),
                _ => {}
            },
            _ => {}
        }
    }
}

#[test]
fn a_program_on_a_terminal_reads_input_and_reports_its_exit() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    assert!(c.peer.capabilities.iter().any(|x| x == "pty"));
    let id = c.send(Request::PtyStart(spec(
        "stty size; tty; read x; echo got=$x; exit 4",
        100,
        30,
    )));
    let pid = match c.recv() {
        Frame::Response {
            resp: Response::Started { pid },
            ..
        } => pid,
        other => panic!("{other:?}"),
    };
    let mut out = Vec::new();
    assert_eq!(read_until(&mut c, id, &mut out, "30 100"), None);
    assert_eq!(read_until(&mut c, id, &mut out, "/dev/pts/"), None);
    // Input is a separate request naming the session by pid.
    let input = c.send(Request::PtyInput {
        pid,
        data: b"hello\r".to_vec(),
    });
    let fin = loop {
        match c.recv() {
            Frame::Response { id: got, resp } if got == input => {
                assert_eq!(resp, Response::Done);
            }
            Frame::Response { id: got, resp } if got == id => match resp {
                Response::Output { data, .. } => out.extend_from_slice(&data),
                other => break other,
            },
            _ => {}
        }
    };
    assert!(
        String::from_utf8_lossy(&out).contains("got=hello"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let Response::Exited(r) = fin else {
        panic!("{fin:?}")
    };
    assert_eq!(r.exit_code, Some(4));

    // The session is over: its pid names nothing.
    let late = c.call_all(Request::PtyInput {
        pid,
        data: b"x".to_vec(),
    });
    assert!(
        matches!(
            late.last(),
            Some(Response::Error {
                kind: ErrorKind::NotFound,
                ..
            })
        ),
        "{late:?}"
    );
}

#[test]
fn bad_sizes_are_refused_before_anything_starts() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    for (cols, rows) in [(0, 24), (80, 0), (5000, 24)] {
        let r = c.call_all(Request::PtyStart(spec("exit 0", cols, rows)));
        assert!(
            matches!(
                r.as_slice(),
                [Response::Error {
                    kind: ErrorKind::InvalidArgument,
                    ..
                }]
            ),
            "{cols}x{rows}: {r:?}"
        );
    }
}
