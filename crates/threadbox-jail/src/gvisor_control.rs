//! The one call the daemon makes on a sentry's control server itself rather than through
//! a `runsc` command (ADR 0217): the signal that tells a restored agent to bind its socket
//! again, on the critical path of every wake and every fork with memory.
//!
//! runsc's control protocol (`pkg/urpc`, release-20240729.0) is one JSON object per call
//! on a stream unix socket, `{"method": …, "arg": …}`, answered by one JSON object
//! `{"success": bool, "err": string, "result": …}`; files ride along as `SCM_RIGHTS`, none
//! here. `runsc kill ID USR2` does exactly this call (`Sandbox.SignalContainer`:
//! `containerManager.Signal` with `DeliverToProcess` and pid 0, the container's init),
//! after starting a 50 MB Go binary and loading the container's state: 20–25 ms a call,
//! and a restore's control server that does not accept yet cost one such start per try.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// `boot.ContMgrSignal`.
const SIGNAL_METHOD: &str = "containerManager.Signal";
/// `boot.DeliverToProcess`: the process `PID` names, or the container's init for pid 0.
const DELIVER_TO_PROCESS: i32 = 0;
/// An answer larger than this is not the sentry's answer to a signal.
const MAX_ANSWER: u64 = 64 * 1024;

/// Why a call did not go through.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    /// Nothing accepts at the socket yet (a restore still loading) or any more.
    #[error("the control server does not accept at {path}: {source}")]
    NotAccepting { path: String, source: io::Error },
    #[error("the control server's answer could not be read: {0}")]
    Io(#[from] io::Error),
    #[error("the control server's answer is not urpc's JSON: {0}")]
    Garbled(#[from] serde_json::Error),
    /// The server ran the call and it failed (`RemoteError`).
    #[error("the sentry refused: {0}")]
    Refused(String),
}

/// Sends signal `signo` to the init process of container `cid` through the control
/// server at `sock`, waiting at most `timeout` for the answer.
pub(crate) fn signal_init(
    sock: &Path,
    cid: &str,
    signo: i32,
    timeout: Duration,
) -> Result<(), ControlError> {
    let mut s = UnixStream::connect(sock).map_err(|source| ControlError::NotAccepting {
        path: sock.display().to_string(),
        source,
    })?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let call = serde_json::json!({
        "method": SIGNAL_METHOD,
        "arg": {"CID": cid, "Signo": signo, "PID": 0, "Mode": DELIVER_TO_PROCESS},
    });
    s.write_all(&serde_json::to_vec(&call)?)?;
    answer(&mut (&s).take(MAX_ANSWER))
}

/// Reads one urpc answer from `r`: Ok when the call succeeded.
fn answer(r: &mut impl Read) -> Result<(), ControlError> {
    let mut it = serde_json::Deserializer::from_reader(r).into_iter::<serde_json::Value>();
    let v = match it.next() {
        Some(v) => v?,
        None => {
            return Err(ControlError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection closed with no answer",
            )))
        }
    };
    if v["success"].as_bool() == Some(true) {
        Ok(())
    } else {
        Err(ControlError::Refused(
            v["err"].as_str().unwrap_or("no reason given").to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A stand-in control server that answers one call with `reply` and hands back the
    /// call it read (urpc's server reads one JSON value, as here).
    fn serve_once(dir: &Path, reply: &'static [u8]) -> std::thread::JoinHandle<serde_json::Value> {
        let l = UnixListener::bind(dir.join("ctl.sock")).expect("bind");
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().expect("accept");
            let call = serde_json::Deserializer::from_reader(&mut c)
                .into_iter::<serde_json::Value>()
                .next()
                .expect("a call")
                .expect("JSON");
            c.write_all(reply).expect("reply");
            call
        })
    }

    #[test]
    fn the_signal_call_is_runsc_kills_and_a_success_is_ok() {
        let d = tempfile::tempdir().expect("tempdir");
        let server = serve_once(d.path(), br#"{"success":true,"err":"","result":{}}"#);
        signal_init(
            &d.path().join("ctl.sock"),
            "sb-1",
            12,
            Duration::from_secs(5),
        )
        .expect("signalled");
        let call = server.join().expect("server");
        assert_eq!(call["method"], "containerManager.Signal");
        assert_eq!(
            call["arg"],
            serde_json::json!({"CID": "sb-1", "Signo": 12, "PID": 0, "Mode": 0})
        );
    }

    #[test]
    fn a_refusal_a_closed_connection_and_no_server_are_errors() {
        let d = tempfile::tempdir().expect("tempdir");
        let server = serve_once(d.path(), br#"{"success":false,"err":"no such container"}"#);
        let e = signal_init(
            &d.path().join("ctl.sock"),
            "sb-1",
            12,
            Duration::from_secs(5),
        );
        assert!(
            matches!(&e, Err(ControlError::Refused(m)) if m == "no such container"),
            "{e:?}"
        );
        server.join().expect("server");
        std::fs::remove_file(d.path().join("ctl.sock")).expect("rm");
        let server = serve_once(d.path(), b"");
        let e = signal_init(
            &d.path().join("ctl.sock"),
            "sb-1",
            12,
            Duration::from_secs(5),
        );
        assert!(matches!(e, Err(ControlError::Io(_))), "{e:?}");
        server.join().expect("server");
        let e = signal_init(
            &d.path().join("none.sock"),
            "sb-1",
            12,
            Duration::from_secs(5),
        );
        assert!(matches!(e, Err(ControlError::NotAccepting { .. })), "{e:?}");
    }
}
