//! Commands run in a sandbox: exec (buffered and streamed) and the agent self-test.

use super::*;

impl Manager {
    pub(super) async fn call(
        &self,
        caller: &Caller,
        id_or_name: &str,
        work: bool,
        req: proto::Request,
    ) -> Result<proto::Response> {
        let (conn, _inflight) = self.running_conn(caller, id_or_name, work).await?;
        conn.call(req).await
    }

    /// [`Self::call`] for requests whose only success answer is `Done`.
    pub(super) async fn call_done(
        &self,
        caller: &Caller,
        id_or_name: &str,
        work: bool,
        req: proto::Request,
    ) -> Result<()> {
        match self.call(caller, id_or_name, work, req).await? {
            proto::Response::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn exec(
        &self,
        caller: &Caller,
        id_or_name: &str,
        req: ExecRequest,
    ) -> Result<ExecResponse> {
        let r = async {
            caller.require(ops::Exec::SCOPE)?;

            // Checked before the sandbox is touched; built again with the image's defaults.
            exec_spec(req.clone(), false)?;
            let (conn, _inflight, row) = self.running_conn_row(caller, id_or_name, true).await?;
            let asked = req.user;
            let mut spec = exec_spec(req, false)?;
            let image = self.image_run(&row.image).await?;
            image.apply(&mut spec.env, &mut spec.cwd, asked, &mut spec.user);
            crate::telemetry::inject_env(&mut spec.env);
            self.secret_env(&row.id, &mut spec.env).await?;
            self.relay_env(&row, &mut spec.env);
            let oom_before = self.driver_for(&row)?.usage(&row.id, false).await.oom_kills;
            let (id, mut rx) = conn.send(proto::Request::Exec(spec))?;
            let mut guard = CancelGuard {
                conn: conn.clone(),
                id,
                armed: true,
            };
            loop {
                match rx.recv().await {
                    Some(proto::Response::Exited(r)) => {
                        guard.armed = false;
                        let mut resp = exec_response(r);
                        resp.memory_limit_bytes = oom_verdict(
                            self.driver_for(&row)?.as_ref(),
                            &row,
                            oom_before,
                            resp.exit_code,
                            resp.signal,
                        )
                        .await;
                        resp.oom_killed = resp.memory_limit_bytes.is_some();
                        crate::telemetry::record_exec(&resp);
                        return Ok(resp);
                    }
                    Some(proto::Response::Started { .. })
                    | Some(proto::Response::Output { .. }) => {}
                    Some(other) => {
                        guard.armed = false;
                        return Err(unexpected(other));
                    }
                    None => {
                        guard.armed = false;
                        return Err(CoreError::Unavailable(
                            "the sandbox's agent went away during the call".into(),
                        ));
                    }
                }
            }
        }
        .await;
        self.audit(caller, ops::Exec::NAME, id_or_name, &r).await;
        r
    }

    /// Runs a command and streams its events; the last event is `End` or `Error`.
    pub async fn exec_stream(
        &self,
        caller: &Caller,
        id_or_name: &str,
        req: ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>> {
        let r = async {
            caller.require(ops::Exec::SCOPE)?;

            exec_spec(req.clone(), true)?;
            let (conn, inflight, row) = self.running_conn_row(caller, id_or_name, true).await?;
            let asked = req.user;
            let mut spec = exec_spec(req, true)?;
            let image = self.image_run(&row.image).await?;
            image.apply(&mut spec.env, &mut spec.cwd, asked, &mut spec.user);
            crate::telemetry::inject_env(&mut spec.env);
            self.secret_env(&row.id, &mut spec.env).await?;
            self.relay_env(&row, &mut spec.env);
            let oom_before = self.driver_for(&row)?.usage(&row.id, false).await.oom_kills;
            let (id, mut rx) = conn.send(proto::Request::Exec(spec))?;
            let (tx, out) = mpsc::channel(64);
            let conn_sandbox = id_or_name.to_string();
            let driver = self.driver_for(&row)?;
            tokio::spawn(async move {
                let _inflight = inflight;
                let mut guard = CancelGuard {
                    conn: conn.clone(),
                    id,
                    armed: true,
                };
                loop {
                    let ev = match rx.recv().await {
                        Some(proto::Response::Started { pid }) => ExecEvent::Start { pid },
                        Some(proto::Response::Output { stream, data }) => {
                            let (data, encoding) = encode_bytes(&data);
                            match stream {
                                proto::Stream::Stdout => ExecEvent::Stdout { data, encoding },
                                proto::Stream::Stderr => ExecEvent::Stderr { data, encoding },
                            }
                        }
                        Some(proto::Response::Exited(r)) => {
                            guard.armed = false;
                            let memory_limit_bytes = oom_verdict(
                                driver.as_ref(),
                                &row,
                                oom_before,
                                r.exit_code,
                                r.signal,
                            )
                            .await;
                            let _ = tx
                                .send(ExecEvent::End {
                                    exit_code: r.exit_code,
                                    signal: r.signal,
                                    timed_out: r.timed_out,
                                    truncated: r.stdout_truncated || r.stderr_truncated,
                                    duration_ms: r.duration_ms,
                                    oom_killed: memory_limit_bytes.is_some(),
                                    memory_limit_bytes,
                                })
                                .await;
                            return;
                        }
                        Some(other) => {
                            guard.armed = false;
                            let e = unexpected(other);
                            // The client sees only the public message: the cause goes
                            // to the log here, since no HTTP error carries it.
                            e.log(&format!("exec stream in sandbox {conn_sandbox:?}"));
                            let _ = tx
                                .send(ExecEvent::Error {
                                    code: e.code(),
                                    message: e.public_message(),
                                })
                                .await;
                            return;
                        }
                        None => {
                            guard.armed = false;
                            tracing::warn!(sandbox = %conn_sandbox,
                                "exec stream failed: the sandbox's agent went away during the call");
                            let _ = tx
                                .send(ExecEvent::Error {
                                    code: ErrorCode::Unavailable,
                                    message: "the sandbox's agent went away during the call".into(),
                                })
                                .await;
                            return;
                        }
                    };
                    // A closed receiver means the client left: the guard cancels the call.
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
            });
            Ok(out)
        }
        .await;
        self.audit(caller, ops::Exec::NAME, id_or_name, &r).await;
        r
    }

    pub async fn selftest(&self, caller: &Caller, id_or_name: &str) -> Result<SelftestReport> {
        caller.require(ops::Selftest::SCOPE)?;

        match self
            .call(caller, id_or_name, false, proto::Request::Selftest)
            .await?
        {
            proto::Response::Selftest { checks } => {
                let mut checks: Vec<PostureCheck> = checks
                    .into_iter()
                    .map(|c| PostureCheck {
                        name: c.name,
                        ok: c.ok,
                        detail: c.detail,
                    })
                    .collect();
                // Which tier runs it, and the kernel its processes see (issue 16).
                let row = self.resolve(caller, id_or_name).await?;
                checks.insert(0, self.tier_check(&row).await?);
                Ok(SelftestReport {
                    ok: checks.iter().all(|c| c.ok),
                    checks,
                })
            }
            other => Err(unexpected(other)),
        }
    }

    /// CPU time the sandbox has used so far, microseconds (from its cgroup).
    pub async fn cpu_usage_usec(&self, caller: &Caller, id_or_name: &str) -> Result<u64> {
        caller.require(Scope::SandboxesRead)?;

        let row = self.resolve(caller, id_or_name).await?;
        self.driver_for(&row)?
            .usage(&row.id, false)
            .await
            .cpu_usec
            .ok_or_else(|| CoreError::Unavailable(format!("sandbox {} is not running", row.id)))
    }
}
