//! Interpreter figures (issue 15, ADR 0080): creating a context, a `1+1` round trip in a
//! warm context through the API against `exec python3 -c 1+1` of the same expression,
//! and a PNG round trip (a 100 KB `_repr_png_` value, base64 over the API). ipykernel in
//! a venv (pip from PyPI) is measured in the same run when it installs: started and
//! driven on the host through `jupyter_client`, so its figures are the kernel's own
//! cost without any sandbox around it.

use super::*;
use threadbox_api::interp::{
    CodeExecution, CodeStatus, CreateContext, CreateContextRequest, DeleteContext, ExecuteCode,
    ExecuteCodeRequest,
};

const ONE_PLUS_ONE: &[&str] = &["python3", "-c", "1+1"];
/// A cell whose value is a PNG of about 100 KB (random bytes after a PNG signature: the
/// worker sends `_repr_png_`'s bytes as they are).
const PNG_CELL: &str = "import os\n\
class Png:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(100_000)\n\
Png()";

/// Runs `n` kernel starts and `m` `1+1` round trips with jupyter_client; prints JSON.
const IPYKERNEL_DRIVER: &str = r#"
import json, sys, time
from jupyter_client.manager import KernelManager
n, m = int(sys.argv[1]), int(sys.argv[2])
def run(kc, code):
    msg = kc.execute(code)
    got = None
    while True:
        r = kc.get_iopub_msg(timeout=30)
        if r["parent_header"].get("msg_id") != msg:
            continue
        if r["msg_type"] == "execute_result":
            got = r["content"]["data"]
        if r["msg_type"] == "status" and r["content"]["execution_state"] == "idle":
            return got
start, first, rt = [], [], []
for _ in range(n):
    t = time.perf_counter()
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client(); kc.start_channels(); kc.wait_for_ready(timeout=60)
    start.append((time.perf_counter() - t) * 1000)
    assert run(kc, "1+1")["text/plain"] == "2"
    first.append((time.perf_counter() - t) * 1000)
    if not rt:
        for _ in range(m):
            t = time.perf_counter()
            assert run(kc, "1+1")["text/plain"] == "2"
            rt.append((time.perf_counter() - t) * 1000)
    kc.stop_channels(); km.shutdown_kernel(now=True)
print(json.dumps({"start": start, "first": first, "rt": rt}))
"#;

const IPYKERNEL: &str = "ipykernel (venv, host, jupyter_client)";

/// The other languages' contexts (ADR 0083): their `1+1` and its contender's name.
const LANG_CELLS: [(&str, &str, &str); 2] = [
    (
        "javascript",
        "1+1",
        "javascript context (node, threadbox API)",
    ),
    ("bash", "echo $((1+1))", "bash context (threadbox API)"),
];

/// A `1+1` answered: the value (Python, JavaScript) or the output (bash).
fn two(x: &CodeExecution) -> bool {
    plain(x) == Some("2") || x.stdout == "2\n"
}

fn ctx_request(name: &str) -> CreateContextRequest {
    lang_request(name, "python")
}

fn lang_request(name: &str, language: &str) -> CreateContextRequest {
    CreateContextRequest {
        name: Some(name.into()),
        language: language.into(),
        cwd: None,
        env: Default::default(),
        user: Default::default(),
    }
}

async fn execute(client: &Client, sb: &str, ctx: &str, code: &str) -> Result<CodeExecution> {
    let op = ExecuteCode {
        sandbox: sb.into(),
        context: ctx.into(),
        request: ExecuteCodeRequest {
            code: code.into(),
            env: Default::default(),
            timeout_secs: Some(60),
            max_output_bytes: None,
        },
    };
    let x = client.call(&op).await?;
    if x.status != CodeStatus::Ok {
        bail!("{code:?} in {ctx}: {:?} {:?}", x.status, x.exception);
    }
    Ok(x)
}

fn plain(x: &CodeExecution) -> Option<&str> {
    x.result.as_ref()?.data.get("text/plain")?.as_str()
}

/// A venv with ipykernel and jupyter_client (made once per machine under the temp
/// directory, reused afterwards); its python.
fn ipykernel_venv() -> std::result::Result<PathBuf, String> {
    let dir = std::env::temp_dir().join("threadbox-bench-ipykernel");
    let py = dir.join("bin/python");
    let ready = |py: &PathBuf| {
        Command::new(py)
            .args(["-c", "import ipykernel, jupyter_client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&py) {
        return Ok(py);
    }
    let run = |cmd: &mut Command, what: &str| -> std::result::Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!(
                "{what} failed: {}",
                err.lines().last().unwrap_or("")
            ))
        }
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&dir),
        "python3 -m venv",
    )?;
    run(
        Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "ipykernel",
            "jupyter_client",
        ]),
        "pip install ipykernel",
    )?;
    if ready(&py) {
        Ok(py)
    } else {
        Err("ipykernel does not import after pip install".into())
    }
}

struct Kernel {
    start: Vec<f64>,
    first: Vec<f64>,
    rt: Vec<f64>,
}

fn ipykernel(starts: usize, round_trips: usize) -> std::result::Result<Kernel, String> {
    let py = ipykernel_venv()?;
    let out = Command::new(&py)
        .args(["-c", IPYKERNEL_DRIVER])
        .arg(starts.to_string())
        .arg(round_trips.to_string())
        .output()
        .map_err(|e| format!("run the ipykernel driver: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "the ipykernel driver failed: {}",
            err.lines().last().unwrap_or("")
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("driver output: {e}"))?;
    let list = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default()
    };
    Ok(Kernel {
        start: list("start"),
        first: list("first"),
        rt: list("rt"),
    })
}

fn series_of(
    name: &str,
    k: &std::result::Result<Kernel, String>,
    pick: fn(&Kernel) -> &Vec<f64>,
) -> Series {
    match k {
        Ok(k) => Series {
            samples: pick(k).clone(),
            ..Series::new(name)
        },
        Err(e) => Series::absent(name, e),
    }
}

impl Bench {
    /// Context create → first `1+1`, the warm round trip against `exec python3 -c`, and a
    /// PNG round trip; ipykernel alongside when it installs.
    pub(crate) async fn interpreter(&mut self) -> Result<()> {
        let c = self.client.clone();
        let (sb, _) = c.create(&bench_sandbox()).await?;
        let id = sb.id.clone();
        tb_exec(&c, &id, ONE_PLUS_ONE).await?; // warm the page cache

        // Create → first result: a new context each time, deleted afterwards.
        let mut create = Series::new("context (threadbox API)");
        let mut exec_first = Series::new("exec python3 -c 1+1 (threadbox API)");
        let mut lang_first: Vec<Series> = LANG_CELLS.iter().map(|l| Series::new(l.2)).collect();
        for i in 0..self.iters {
            let name = format!("bench-{i}");
            let t = Instant::now();
            let r = async {
                c.call(&CreateContext {
                    sandbox: id.clone(),
                    request: ctx_request(&name),
                })
                .await?;
                let x = execute(&c, &id, &name, "1+1").await?;
                if plain(&x) != Some("2") {
                    bail!("1+1 gave {:?}", x.result);
                }
                Ok(ms(t.elapsed()))
            }
            .await;
            create.push(r);
            c.call(&DeleteContext {
                sandbox: id.clone(),
                context: name,
            })
            .await?;
            exec_first.push(tb_exec(&c, &id, ONE_PLUS_ONE).await);
            for (k, (lang, cell, _)) in LANG_CELLS.iter().enumerate() {
                let name = format!("bench-{lang}-{i}");
                let t = Instant::now();
                let r = async {
                    c.call(&CreateContext {
                        sandbox: id.clone(),
                        request: lang_request(&name, lang),
                    })
                    .await?;
                    let x = execute(&c, &id, &name, cell).await?;
                    if !two(&x) {
                        bail!("{cell} in {lang} gave {:?} {:?}", x.result, x.stdout);
                    }
                    Ok(ms(t.elapsed()))
                }
                .await;
                lang_first[k].push(r);
                c.call(&DeleteContext {
                    sandbox: id.clone(),
                    context: name,
                })
                .await?;
            }
        }

        // Warm round trips, interleaved.
        let warm = "warm";
        c.call(&CreateContext {
            sandbox: id.clone(),
            request: ctx_request(warm),
        })
        .await?;
        execute(&c, &id, warm, "1+1").await?;
        let mut ctx_rt = Series::new("context (threadbox API)");
        let mut exec_rt = Series::new("exec python3 -c 1+1 (threadbox API)");
        let mut png = Series::new("context, 100 KB _repr_png_ (threadbox API)");
        let mut lang_rt: Vec<Series> = LANG_CELLS.iter().map(|l| Series::new(l.2)).collect();
        for (lang, cell, _) in LANG_CELLS {
            let name = format!("warm-{lang}");
            c.call(&CreateContext {
                sandbox: id.clone(),
                request: lang_request(&name, lang),
            })
            .await?;
            execute(&c, &id, &name, cell).await?;
        }
        for i in 0..self.iters {
            for k in rotation(i, 3 + LANG_CELLS.len()) {
                match k {
                    0 => {
                        let t = Instant::now();
                        let r = execute(&c, &id, warm, "1+1").await;
                        ctx_rt.push(r.map(|_| ms(t.elapsed())));
                    }
                    1 => exec_rt.push(tb_exec(&c, &id, ONE_PLUS_ONE).await),
                    k if k >= 3 => {
                        let (lang, cell, _) = LANG_CELLS[k - 3];
                        let t = Instant::now();
                        let r = execute(&c, &id, &format!("warm-{lang}"), cell).await;
                        lang_rt[k - 3].push(r.and_then(|x| {
                            if !two(&x) {
                                bail!("{cell} in {lang} gave {:?}", x.stdout);
                            }
                            Ok(ms(t.elapsed()))
                        }));
                    }
                    _ => {
                        let t = Instant::now();
                        let r = execute(&c, &id, warm, PNG_CELL).await.and_then(|x| {
                            let b64 = x
                                .result
                                .as_ref()
                                .and_then(|r| r.data.get("image/png"))
                                .and_then(|v| v.as_str())
                                .context("no image/png in the result")?;
                            // Counted until the client holds the bytes, as a user would.
                            if b64.len() < 133_000 {
                                bail!("the PNG came back short: {} base64 bytes", b64.len());
                            }
                            Ok(ms(t.elapsed()))
                        });
                        png.push(r);
                    }
                }
            }
        }
        c.delete(&id, true).await?;

        let kernel = if self.opts.smoke || self.skipped("ipykernel") {
            Err("skipped (--smoke or --skip ipykernel)".to_string())
        } else {
            eprintln!("threadbox-bench: ipykernel in a venv (pip install on first use)");
            ipykernel(self.iters.clamp(1, 10), self.iters)
        };
        let mut ik_first = series_of(IPYKERNEL, &kernel, |k| &k.first);
        let ik_rt = series_of(IPYKERNEL, &kernel, |k| &k.rt);
        if let Ok(k) = &kernel {
            let start = Row::from_samples(
                "interpreter: kernel start (no execute)",
                IPYKERNEL,
                "ms",
                k.start.clone(),
            );
            self.rows.push(start);
        }
        if ik_first.samples.is_empty() && ik_first.live() {
            ik_first.failed = Some("no samples".into());
        }
        self.rows.extend(rows_against(
            "interpreter: create→first 1+1",
            "ms",
            exec_first,
            vec![create, ik_first]
                .into_iter()
                .chain(lang_first)
                .collect(),
        ));
        self.rows.extend(rows_against(
            "interpreter: 1+1 round trip (warm)",
            "ms",
            exec_rt,
            vec![ctx_rt, ik_rt].into_iter().chain(lang_rt).collect(),
        ));
        self.rows
            .push(png.row("interpreter: PNG round trip (100 KB)", "ms"));
        Ok(())
    }
}
