//! File operations inside a sandbox.

use super::*;

impl Manager {
    /// Reads a file; the stream yields chunks until the end of the file.
    pub async fn read_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
    ) -> Result<ByteStream> {
        caller.require(Scope::SandboxesWrite)?;

        validate_path(path)?;
        let (conn, inflight) = self.running_conn(caller, id_or_name, false).await?;
        let path = path.to_string();
        let user = run_as(user);
        let first = conn
            .call(proto::Request::FileRead {
                path: path.clone(),
                user,
                offset: 0,
                limit: Some(FILE_CHUNK),
            })
            .await?;
        let (data, eof) = match first {
            proto::Response::FileData { data, eof, .. } => (data, eof),
            other => return Err(unexpected(other)),
        };
        let state = (
            conn,
            inflight,
            path,
            user,
            data.len() as u64,
            eof,
            Some(data),
        );
        let stream = futures::stream::unfold(
            state,
            |(conn, inflight, path, user, offset, eof, first)| async move {
                if let Some(d) = first {
                    return Some((Ok(d), (conn, inflight, path, user, offset, eof, None)));
                }
                if eof {
                    return None;
                }
                let r = conn
                    .call(proto::Request::FileRead {
                        path: path.clone(),
                        user,
                        offset,
                        limit: Some(FILE_CHUNK),
                    })
                    .await;
                match r {
                    Ok(proto::Response::FileData { data, eof, .. }) => {
                        let off = offset + data.len() as u64;
                        let eof = eof || data.is_empty();
                        Some((Ok(data), (conn, inflight, path, user, off, eof, None)))
                    }
                    Ok(other) => Some((
                        Err(unexpected(other)),
                        (conn, inflight, path, user, offset, true, None),
                    )),
                    Err(e) => Some((Err(e), (conn, inflight, path, user, offset, true, None))),
                }
            },
        );
        Ok(stream.boxed())
    }

    /// Writes (replaces) a file from a stream of chunks; returns the bytes written. The
    /// data goes to a temporary name first and is renamed over the target at the end, so
    /// a failed upload never leaves a half-written file in place of the old one.
    pub async fn write_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
        mut body: ByteSink,
    ) -> Result<u64> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            validate_path(path)?;
            if path.ends_with('/') {
                return Err(CoreError::InvalidArgument("path names a directory".into()));
            }
            let (conn, _inflight) = self.running_conn(caller, id_or_name, true).await?;
            let user = run_as(user);
            let (dir, name) = match path.rfind('/') {
                Some(i) => (&path[..=i], &path[i + 1..]),
                None => ("", path),
            };
            let tmp = format!("{dir}.{name}.tb-upload-{}", uuid::Uuid::new_v4().simple());
            let mut written: u64 = 0;
            let mut first = true;
            let mut pending: Vec<u8> = Vec::new();
            let result: Result<()> = async {
                loop {
                    let next = body.next().await;
                    let done = next.is_none();
                    if let Some(chunk) = next {
                        let chunk = chunk.map_err(|e| {
                            CoreError::InvalidArgument(format!("upload interrupted: {e}"))
                        })?;
                        pending.extend_from_slice(&chunk);
                    }
                    while pending.len() as u64 >= FILE_CHUNK
                        || (done && (first || !pending.is_empty()))
                    {
                        let take = pending.len().min(FILE_CHUNK as usize);
                        let data: Vec<u8> = pending.drain(..take).collect();
                        let n = data.len() as u64;
                        let r = conn
                            .call(proto::Request::FileWrite {
                                path: tmp.clone(),
                                user,
                                data,
                                append: !first,
                                mode: None,
                                make_parents: first,
                            })
                            .await?;
                        match r {
                            proto::Response::Done => {}
                            other => return Err(unexpected(other)),
                        }
                        first = false;
                        written += n;
                    }
                    if done {
                        break;
                    }
                }
                match conn
                    .call(proto::Request::Rename {
                        from: tmp.clone(),
                        to: path.to_string(),
                        user,
                    })
                    .await?
                {
                    proto::Response::Done => Ok(()),
                    other => Err(unexpected(other)),
                }
            }
            .await;
            if let Err(e) = result {
                if !first {
                    let _ = conn
                        .call(proto::Request::Remove {
                            path: tmp,
                            user,
                            recursive: false,
                        })
                        .await;
                }
                return Err(e);
            }
            Ok(written)
        }
        .await;
        self.audit(caller, "file.write", id_or_name, &r).await;
        r
    }

    pub async fn list_files(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
    ) -> Result<FileList> {
        caller.require(Scope::SandboxesWrite)?;

        validate_path(path)?;
        match self
            .call(
                caller,
                id_or_name,
                false,
                proto::Request::FileList {
                    path: path.into(),
                    user: run_as(user),
                },
            )
            .await?
        {
            proto::Response::FileList { entries } => Ok(FileList {
                entries: entries.into_iter().map(file_entry).collect(),
            }),
            other => Err(unexpected(other)),
        }
    }

    pub async fn stat_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
    ) -> Result<FileEntry> {
        caller.require(Scope::SandboxesWrite)?;

        validate_path(path)?;
        match self
            .call(
                caller,
                id_or_name,
                false,
                proto::Request::FileStat {
                    path: path.into(),
                    user: run_as(user),
                },
            )
            .await?
        {
            proto::Response::FileStat(f) => Ok(file_entry(f)),
            other => Err(unexpected(other)),
        }
    }

    pub async fn mkdir(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
        parents: bool,
    ) -> Result<()> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            validate_path(path)?;
            self.call_done(
                caller,
                id_or_name,
                true,
                proto::Request::Mkdir {
                    path: path.into(),
                    user: run_as(user),
                    parents,
                },
            )
            .await
        }
        .await;
        self.audit(caller, "file.mkdir", id_or_name, &r).await;
        r
    }

    pub async fn remove_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
        recursive: bool,
    ) -> Result<()> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            validate_path(path)?;
            self.call_done(
                caller,
                id_or_name,
                false,
                proto::Request::Remove {
                    path: path.into(),
                    user: run_as(user),
                    recursive,
                },
            )
            .await
        }
        .await;
        self.audit(caller, "file.remove", id_or_name, &r).await;
        r
    }
}
