//! Background processes: start, list, logs, kill.

use super::*;

impl Manager {
    pub async fn start_process(
        &self,
        caller: &Caller,
        id_or_name: &str,
        req: StartProcessRequest,
    ) -> Result<ProcessInfo> {
        let r = async {
            caller.require(ops::StartProcess::SCOPE)?;

            let command = command_of(req.command, req.shell)?;
            validate_env(&req.env)?;
            if let Some(cwd) = &req.cwd {
                validate_path(cwd)?;
            }
            let cmd_vec = command_vec(&command);
            let mut env = req.env;
            let mut cwd = req.cwd;
            let mut user = run_as(req.user);
            let row = self.resolve(caller, id_or_name).await?;
            self.image_run(&row.image)
                .await?
                .apply(&mut env, &mut cwd, req.user, &mut user);
            crate::telemetry::inject_env(&mut env);
            self.secret_env(&row.id, &mut env).await?;
            self.relay_env(&row, &mut env);
            let spec = proto::BackgroundSpec {
                command,
                env,
                cwd,
                user,
                max_log: proto::DEFAULT_MAX_OUTPUT,
            };
            match self
                .call(
                    caller,
                    id_or_name,
                    true,
                    proto::Request::BackgroundStart(spec),
                )
                .await?
            {
                proto::Response::BackgroundStarted { bg_id, pid } => Ok(ProcessInfo {
                    id: bg_id,
                    pid,
                    command: cmd_vec,
                    running: true,
                    exit_code: None,
                    signal: None,
                    started_at: rfc3339(now_ms()),
                }),
                other => Err(unexpected(other)),
            }
        }
        .await;
        self.audit(caller, ops::StartProcess::NAME, id_or_name, &r)
            .await;
        r
    }

    pub async fn list_processes(&self, caller: &Caller, id_or_name: &str) -> Result<ProcessList> {
        caller.require(ops::ListProcesses::SCOPE)?;

        match self
            .call(caller, id_or_name, false, proto::Request::BackgroundList)
            .await?
        {
            proto::Response::BackgroundList { processes } => Ok(ProcessList {
                processes: processes
                    .into_iter()
                    .map(|p| ProcessInfo {
                        id: p.bg_id,
                        pid: p.pid,
                        command: command_vec(&p.command),
                        running: p.running,
                        exit_code: p.exit_code,
                        signal: p.signal,
                        started_at: rfc3339(p.started_at.saturating_mul(1000)),
                    })
                    .collect(),
            }),
            other => Err(unexpected(other)),
        }
    }

    pub async fn process_logs(
        &self,
        caller: &Caller,
        id_or_name: &str,
        process_id: u64,
    ) -> Result<ProcessLogs> {
        caller.require(ops::GetProcessLogs::SCOPE)?;

        match self
            .call(
                caller,
                id_or_name,
                false,
                proto::Request::BackgroundLogs { bg_id: process_id },
            )
            .await?
        {
            proto::Response::BackgroundLogs(l) => {
                let both = std::str::from_utf8(&l.stdout).is_ok()
                    && std::str::from_utf8(&l.stderr).is_ok();
                let enc = |b: &[u8]| {
                    if both {
                        String::from_utf8_lossy(b).into_owned()
                    } else {
                        base64::engine::general_purpose::STANDARD.encode(b)
                    }
                };
                Ok(ProcessLogs {
                    stdout: enc(&l.stdout),
                    stderr: enc(&l.stderr),
                    encoding: if both {
                        Encoding::Utf8
                    } else {
                        Encoding::Base64
                    },
                    stdout_dropped: l.stdout_dropped,
                    stderr_dropped: l.stderr_dropped,
                })
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn kill_process(
        &self,
        caller: &Caller,
        id_or_name: &str,
        process_id: u64,
        signal: Option<i32>,
    ) -> Result<()> {
        let r = async {
            caller.require(ops::KillProcess::SCOPE)?;

            validate_signal(signal)?;
            self.call_done(
                caller,
                id_or_name,
                false,
                proto::Request::BackgroundKill {
                    bg_id: process_id,
                    signal,
                },
            )
            .await
        }
        .await;
        self.audit(caller, ops::KillProcess::NAME, id_or_name, &r)
            .await;
        r
    }
}
