//! Interpreter contexts end to end over the protocol (host test mode, as root): a Python
//! worker per context, state kept between cells, rich outputs, interrupts and timeouts.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use threadbox_proto::interp::{CellStatus, ContextState};
use threadbox_proto::*;

fn python_ctx(c: &mut Client, name: &str) -> ContextInfo {
    match c.call(Request::ContextCreate(ContextSpec {
        name: Some(name.into()),
        language: "python".into(),
        cwd: Some("/tmp".into()),
        env: BTreeMap::new(),
        user: RunAs::User,
    })) {
        Response::Context(i) => i,
        other => panic!("create failed: {other:?}"),
    }
}

fn cell(ctx: &str, code: &str) -> CellSpec {
    CellSpec {
        ctx: ctx.into(),
        code: code.into(),
        env: BTreeMap::new(),
        timeout_ms: Some(30_000),
        max_output: 1 << 20,
        stream: false,
    }
}

fn run(c: &mut Client, spec: CellSpec) -> Execution {
    match c.call(Request::ContextExecute(spec)) {
        Response::Executed(e) => e,
        other => panic!("execute failed: {other:?}"),
    }
}

fn text_result(e: &Execution) -> Option<String> {
    e.result
        .as_ref()
        .and_then(|r| r.data.get("text/plain"))
        .and_then(|v| v.as_str())
        .map(String::from)
}

#[test]
fn state_persists_and_last_expression_is_the_result() {
    if skip_unless_root() {
        return;
    }
    let cg = TestCgroup::new();
    let agent = Agent::start_with(cg.as_ref());
    let mut c = agent.connect();
    assert!(c.peer.capabilities.iter().any(|c| c == "interpreter"));
    let info = python_ctx(&mut c, "main");
    assert!(info.created);
    assert_eq!(info.state, ContextState::Idle);
    // Get-or-create by name.
    let again = python_ctx(&mut c, "main");
    assert_eq!(again.id, info.id);
    assert!(!again.created);

    assert_eq!(text_result(&run(&mut c, cell("main", "x = 41"))), None);
    let e = run(&mut c, cell("main", "x + 1"));
    assert_eq!(text_result(&e), Some("42".into()), "{e:?}");
    assert_eq!(e.status, CellStatus::Ok);
    assert_eq!(e.execution_count, 2);
    let e = run(&mut c, cell("main", "print(1)\n2"));
    assert_eq!(e.stdout, "1\n");
    assert_eq!(text_result(&e), Some("2".into()));
    assert_eq!(text_result(&run(&mut c, cell("main", "2;"))), None);
    assert_eq!(text_result(&run(&mut c, cell(&info.id, "if x: 3"))), None);
    // A def with blank lines inside is one definition (the `python -i` regression).
    run(&mut c, cell("main", "def f():\n\n    return x * 2\n"));
    assert_eq!(
        text_result(&run(&mut c, cell("main", "f()"))),
        Some("82".into())
    );
    // fd-level output of subprocesses and C code.
    let e = run(
        &mut c,
        cell(
            "main",
            "import subprocess, os\nsubprocess.run(['echo', 'hi'])\nos.system('echo e >&2')\nos.write(1, b'raw\\n');",
        ),
    );
    assert!(
        e.stdout.contains("hi\n") && e.stdout.contains("raw\n"),
        "{e:?}"
    );
    assert!(e.stderr.contains("e\n"), "{e:?}");
    // Confined like an exec: the sandbox user, in its own cgroup under the sandbox's.
    let e = run(&mut c, cell("main", "import os; os.getuid(), os.getcwd()"));
    assert_eq!(text_result(&e), Some("(1000, '/tmp')".into()));
    if let Some(cg) = &cg {
        assert!(
            cg.children().iter().any(|n| n.starts_with("ctx-")),
            "{:?}",
            cg.children()
        );
    }
    let e = run(
        &mut c,
        cell(
            "main",
            "open('/proc/self/status').read().split('Seccomp:')[1].split()[0]",
        ),
    );
    assert_eq!(
        text_result(&e),
        Some("'2'".into()),
        "seccomp filter in the worker"
    );
    // The control socket is private: not in the cell's environment, not inherited by
    // the programs a cell starts (only their stdio and the listing's own fd).
    let e = run(
        &mut c,
        cell(
            "main",
            "import os, subprocess\nfds = subprocess.run(['ls', '/proc/self/fd'], capture_output=True, text=True, close_fds=False).stdout.split()\n(sorted(fds, key=int), 'THREADBOX_CTL_FD' in os.environ)",
        ),
    );
    assert_eq!(
        text_result(&e),
        Some("(['0', '1', '2', '3'], False)".into()),
        "{e:?}"
    );
}

#[test]
fn exceptions_are_results_and_the_context_lives_on() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    python_ctx(&mut c, "p");
    run(&mut c, cell("p", "y = 7\ndef f():\n    return 1/0\n"));
    let e = run(&mut c, cell("p", "f()"));
    assert_eq!(e.status, CellStatus::Exception);
    let ex = e.exception.expect("an exception");
    assert_eq!(ex.name, "ZeroDivisionError");
    assert!(ex.traceback.contains("return 1/0"), "{}", ex.traceback);
    assert!(
        !ex.traceback.contains("threadbox-worker"),
        "user frames only: {}",
        ex.traceback
    );
    let e = run(&mut c, cell("p", "import sys; sys.exit(3)"));
    assert_eq!(e.exception.map(|x| x.name), Some("SystemExit".into()));
    let e = run(&mut c, cell("p", "1/("));
    assert_eq!(e.exception.map(|x| x.name), Some("SyntaxError".into()));
    assert_eq!(
        text_result(&run(&mut c, cell("p", "y * 6"))),
        Some("42".into())
    );
    // os._exit ends the worker: the cell says so, the next one gets a new context.
    let e = run(&mut c, cell("p", "import os; os._exit(1)"));
    assert_eq!(e.status, CellStatus::ContextDied);
    assert_eq!(e.reason.as_deref(), Some("exited:1"));
    let e = run(&mut c, cell("p", "'y' in globals()"));
    assert!(e.context_created);
    assert_eq!(text_result(&e), Some("False".into()));
}

#[test]
fn rich_outputs_by_mime_type() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    python_ctx(&mut c, "r");
    let code = "class A:\n    def _repr_png_(self): return b'\\x89PNG\\r\\n'\n    def _repr_html_(self): return '<b>a</b>'\n    def _repr_svg_(self): return '<svg/>'\n    def _repr_json_(self): return {'k': 1}\nA()";
    let e = run(&mut c, cell("r", code));
    let d = &e.result.expect("a result").data;
    assert_eq!(d["image/png"], "iVBORw0K");
    assert_eq!(d["text/html"], "<b>a</b>");
    assert_eq!(d["image/svg+xml"], "<svg/>");
    assert_eq!(d["application/json"], serde_json::json!({"k": 1}));
    let code = "class B:\n    def _repr_mimebundle_(self, **kw): return {'text/html': '<i>b</i>'}\n    def _repr_html_(self): return 'not this'\ndisplay(B(), 5); print('p')";
    let e = run(&mut c, cell("r", code));
    assert_eq!(e.outputs.len(), 2);
    assert_eq!(e.outputs[0].data["text/html"], "<i>b</i>");
    assert_eq!(e.outputs[1].data["text/plain"], "5");
    assert_eq!(e.stdout, "p\n");
    let e = run(
        &mut c,
        cell("r", "import asyncio\nawait asyncio.sleep(0.01)\n5"),
    );
    assert_eq!(text_result(&e), Some("5".into()));
    // matplotlib, where the image has it; otherwise say which path was tested.
    let has_mpl = run(
        &mut c,
        cell(
            "r",
            "import importlib.util as u; u.find_spec('matplotlib') is not None",
        ),
    );
    if text_result(&has_mpl).as_deref() == Some("True") {
        let e = run(
            &mut c,
            cell(
                "r",
                "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()",
            ),
        );
        let png = e
            .outputs
            .iter()
            .find_map(|o| o.data.get("image/png"))
            .expect("a PNG");
        assert!(png.as_str().unwrap_or("").starts_with("iVBORw0KGgo"));
        eprintln!("TESTED: matplotlib figure flushed at show()");
    } else {
        eprintln!("TESTED: the _repr_png_ protocol only (matplotlib is not importable here)");
    }
}

#[test]
fn streaming_sends_events_in_order() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    python_ctx(&mut c, "s");
    let mut spec = cell("s", "print('a')\ndisplay(1)\n2");
    spec.stream = true;
    let frames = c.call_all(Request::ContextExecute(spec));
    let kinds: Vec<&str> = frames
        .iter()
        .map(|f| match f {
            Response::Cell(CodeEvent::Start { .. }) => "start",
            Response::Cell(CodeEvent::Stdout { .. }) => "stdout",
            Response::Cell(CodeEvent::Display(_)) => "display",
            Response::Cell(CodeEvent::Result(_)) => "result",
            Response::Cell(CodeEvent::End(_)) => "end",
            Response::Executed(_) => "executed",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["start", "stdout", "stdout", "display", "result", "end", "executed"]
    );
}

#[test]
fn timeout_interrupts_and_keeps_state() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    python_ctx(&mut c, "t");
    run(&mut c, cell("t", "z = 5"));
    let mut spec = cell("t", "import time\ntime.sleep(100)");
    spec.timeout_ms = Some(500);
    let t0 = Instant::now();
    let e = run(&mut c, spec);
    assert_eq!(e.status, CellStatus::TimedOut, "{e:?}");
    assert_eq!(
        e.exception.map(|x| x.name),
        Some("KeyboardInterrupt".into())
    );
    assert!(!e.context_restarted);
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert_eq!(text_result(&run(&mut c, cell("t", "z"))), Some("5".into()));

    // A cell that ignores SIGINT (C code holds the interpreter) is killed after the grace:
    // the context answers again, and says its state is gone.
    let mut spec = cell(
        "t",
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nimport time\ntime.sleep(100)",
    );
    spec.timeout_ms = Some(300);
    let e = run(&mut c, spec);
    assert_eq!(e.status, CellStatus::TimedOut, "{e:?}");
    assert!(e.context_restarted, "{e:?}");
    let e = run(&mut c, cell("t", "'z' in globals()"));
    assert_eq!(text_result(&e), Some("False".into()), "{e:?}");
}

#[test]
fn interrupt_request_and_busy_context() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let mut c2 = agent.connect();
    python_ctx(&mut c, "i");
    assert_eq!(
        c.call(Request::ContextInterrupt { ctx: "i".into() }),
        Response::Interrupted { interrupted: false }
    );
    run(&mut c, cell("i", "w = 3"));
    let mut spec = cell("i", "while True: pass");
    spec.stream = true;
    let id = c.send(Request::ContextExecute(spec));
    // Wait for the start event so the cell runs.
    match c.recv() {
        Frame::Response {
            id: got,
            resp: Response::Cell(CodeEvent::Start { .. }),
        } => assert_eq!(got, id),
        other => panic!("{other:?}"),
    }
    match c2.call(Request::ContextExecute(cell("i", "1"))) {
        Response::Error { message, .. } => assert!(message.contains("context_busy"), "{message}"),
        other => panic!("expected busy, got {other:?}"),
    }
    let listed = match c2.call(Request::ContextList) {
        Response::Contexts { contexts } => contexts,
        other => panic!("{other:?}"),
    };
    assert_eq!(listed[0].state, ContextState::Busy);
    assert_eq!(
        c2.call(Request::ContextInterrupt { ctx: "i".into() }),
        Response::Interrupted { interrupted: true }
    );
    let ex = loop {
        match c.recv() {
            Frame::Response {
                resp: Response::Executed(e),
                ..
            } => break e,
            Frame::Response { .. } => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(ex.status, CellStatus::Interrupted, "{ex:?}");
    assert!(!ex.context_restarted, "SIGINT stopped the loop: {ex:?}");
    let e = run(&mut c, cell("i", "w"));
    assert_eq!(text_result(&e), Some("3".into()), "{e:?}");
    // Restart loses the state; delete removes the context.
    let info = match c.call(Request::ContextRestart { ctx: "i".into() }) {
        Response::Context(i) => i,
        other => panic!("{other:?}"),
    };
    assert_eq!(info.generation, 2);
    assert_eq!(
        text_result(&run(&mut c, cell("i", "'w' in globals()"))),
        Some("False".into())
    );
    assert_eq!(
        c.call(Request::ContextDelete { ctx: "i".into() }),
        Response::Done
    );
    assert!(
        matches!(c.call(Request::ContextList), Response::Contexts { contexts } if contexts.is_empty())
    );
}

#[test]
fn escalation_kills_the_cells_children_before_the_worker() {
    if skip_unless_root() {
        return;
    }
    // The cell's children are found in the context's cgroup.
    let cg = TestCgroup::new();
    let agent = Agent::start_with(cg.as_ref());
    let mut c = agent.connect();
    python_ctx(&mut c, "e");
    run(&mut c, cell("e", "kept = 7"));
    // The cell ignores SIGINT and waits on a child: after the grace the child is
    // killed, the cell ends, and the worker with its variables stays.
    let mut spec = cell(
        "e",
        "import signal, subprocess\nold = signal.signal(signal.SIGINT, signal.SIG_IGN)\n\
         try:\n    subprocess.run(['sleep', '100'])\nfinally:\n    signal.signal(signal.SIGINT, old)",
    );
    spec.timeout_ms = Some(300);
    let e = run(&mut c, spec);
    assert_eq!(e.status, CellStatus::TimedOut, "{e:?}");
    assert!(!e.context_restarted, "{e:?}");
    assert_eq!(
        text_result(&run(&mut c, cell("e", "kept"))),
        Some("7".into())
    );

    // Positive control: with no child to kill, a cell that ignores SIGINT still ends by
    // the worker's restart, and the answer says the state is gone.
    let mut spec = cell(
        "e",
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
    );
    spec.timeout_ms = Some(300);
    let e = run(&mut c, spec);
    assert_eq!(e.status, CellStatus::TimedOut, "{e:?}");
    assert!(e.context_restarted, "{e:?}");
    let e = run(&mut c, cell("e", "'kept' in globals()"));
    assert_eq!(text_result(&e), Some("False".into()), "{e:?}");
}

#[test]
fn output_of_leftover_processes_is_drained_between_cells() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    python_ctx(&mut c, "d");
    // A process the cell leaves behind writes 1 MB on the worker's stdout after the
    // cell ended: more than a pipe holds. Undrained, it would block before its marker.
    let e = run(
        &mut c,
        cell(
            "d",
            "import subprocess, os, tempfile\nmark = tempfile.mktemp()\n\
             subprocess.Popen(['sh', '-c', 'sleep 0.2; head -c 1000000 /dev/zero; touch ' + mark])\n\
             mark",
        ),
    );
    assert_eq!(e.status, CellStatus::Ok, "{e:?}");
    let mark = text_result(&e).expect("the marker's path");
    // Another context waits for the marker, so that `d` stays idle the whole time
    // (a cell of `d` would read its pipes itself).
    python_ctx(&mut c, "w");
    let mut spec = cell(
        "w",
        &format!(
            "import os, time\nwhile not os.path.exists({mark}):\n    time.sleep(0.02)\n'seen'"
        ),
    );
    spec.timeout_ms = Some(20_000);
    let e = run(&mut c, spec);
    assert_eq!(e.status, CellStatus::Ok, "{e:?}");
    assert_eq!(text_result(&e), Some("'seen'".into()));
    // What it wrote between the cells is not the next cell's output.
    let e = run(&mut c, cell("d", "print('only this')"));
    assert_eq!(
        e.stdout,
        "only this\n",
        "{:?}",
        &e.stdout[..e.stdout.len().min(80)]
    );
}
