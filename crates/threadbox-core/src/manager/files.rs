//! File operations inside a sandbox.

use super::*;
use crate::range::FileRange;

impl Manager {
    /// Reads a file, or the bytes of `range`; the stream yields chunks until the end of
    /// the range or of the file. Only the range is asked of the agent, one bounded chunk
    /// at a time, so a 20 KB window of a 50 MB file moves 20 KB.
    pub async fn read_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &[u8],
        user: User,
        range: FileRange,
    ) -> Result<ByteStream> {
        caller.require(crate::ops::ReadFile::SCOPE)?;

        validate_path(path)?;
        let (conn, inflight) = self.running_conn(caller, id_or_name, false).await?;
        let path = proto::PathBytes::from(path);
        let user = self.run_as_in(caller, id_or_name, user).await?;
        // The first chunk is read before answering, so a missing file is an error
        // response rather than a cut stream. An empty range still opens the file.
        let first_limit = range.next_chunk(0, FILE_CHUNK).unwrap_or(0);
        let first = conn
            .call(proto::Request::FileRead {
                path: path.clone(),
                user,
                offset: range.offset(),
                limit: Some(first_limit),
            })
            .await?;
        let (data, eof) = match first {
            proto::Response::FileData { data, eof, .. } => (data, eof),
            other => return Err(unexpected(other)),
        };
        let state = RangeRead {
            conn,
            _inflight: inflight,
            path,
            user,
            range,
            done: data.len() as u64,
            eof: eof || data.is_empty(),
            first: Some(data),
        };
        let stream = futures::stream::unfold(state, |mut st| async move {
            if let Some(d) = st.first.take() {
                return Some((Ok(d), st));
            }
            if st.eof {
                return None;
            }
            let limit = st.range.next_chunk(st.done, FILE_CHUNK)?;
            let r = st
                .conn
                .call(proto::Request::FileRead {
                    path: st.path.clone(),
                    user: st.user,
                    offset: st.range.offset() + st.done,
                    limit: Some(limit),
                })
                .await;
            match r {
                Ok(proto::Response::FileData { data, eof, .. }) => {
                    st.done += data.len() as u64;
                    st.eof = eof || data.is_empty();
                    Some((Ok(data), st))
                }
                Ok(other) => {
                    st.eof = true;
                    Some((Err(unexpected(other)), st))
                }
                Err(e) => {
                    st.eof = true;
                    Some((Err(e), st))
                }
            }
        });
        Ok(stream.boxed())
    }

    /// Writes (replaces) a file from a stream of chunks; returns the bytes written. The
    /// data goes to a temporary name first and is renamed over the target at the end, so
    /// a failed upload never leaves a half-written file in place of the old one.
    pub async fn write_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &[u8],
        user: User,
        mut body: ByteSink,
    ) -> Result<u64> {
        let r = async {
            caller.require(crate::ops::WriteFile::SCOPE)?;

            validate_path(path)?;
            if path.ends_with(b"/") {
                return Err(CoreError::InvalidArgument("path names a directory".into()));
            }
            let (conn, _inflight) = self.running_conn(caller, id_or_name, true).await?;
            let user = self.run_as_in(caller, id_or_name, user).await?;
            let (dir, name) = match path.iter().rposition(|b| *b == b'/') {
                Some(i) => (&path[..=i], &path[i + 1..]),
                None => (&b""[..], path),
            };
            let suffix = format!(".tb-upload-{}", uuid::Uuid::new_v4().simple());
            let tmp = proto::PathBytes([dir, b".", name, suffix.as_bytes()].concat());
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
                        to: path.into(),
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
        self.audit(caller, crate::ops::WriteFile::NAME, id_or_name, &r)
            .await;
        r
    }

    pub async fn list_files(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &[u8],
        user: User,
    ) -> Result<FileList> {
        caller.require(ops::ListFiles::SCOPE)?;

        validate_path(path)?;
        match self
            .call(
                caller,
                id_or_name,
                false,
                proto::Request::FileList {
                    path: path.into(),
                    user: self.run_as_in(caller, id_or_name, user).await?,
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
        path: &[u8],
        user: User,
    ) -> Result<FileEntry> {
        caller.require(ops::StatFile::SCOPE)?;

        validate_path(path)?;
        match self
            .call(
                caller,
                id_or_name,
                false,
                proto::Request::FileStat {
                    path: path.into(),
                    user: self.run_as_in(caller, id_or_name, user).await?,
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
        path: &[u8],
        user: User,
        parents: bool,
    ) -> Result<()> {
        let r = async {
            caller.require(ops::Mkdir::SCOPE)?;

            validate_path(path)?;
            self.call_done(
                caller,
                id_or_name,
                true,
                proto::Request::Mkdir {
                    path: path.into(),
                    user: self.run_as_in(caller, id_or_name, user).await?,
                    parents,
                },
            )
            .await
        }
        .await;
        self.audit(caller, ops::Mkdir::NAME, id_or_name, &r).await;
        r
    }

    pub async fn remove_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &[u8],
        user: User,
        recursive: bool,
    ) -> Result<()> {
        let r = async {
            caller.require(ops::RemoveFile::SCOPE)?;

            validate_path(path)?;
            self.call_done(
                caller,
                id_or_name,
                false,
                proto::Request::Remove {
                    path: path.into(),
                    user: self.run_as_in(caller, id_or_name, user).await?,
                    recursive,
                },
            )
            .await
        }
        .await;
        self.audit(caller, ops::RemoveFile::NAME, id_or_name, &r)
            .await;
        r
    }
}

/// Where a streamed [`Manager::read_file`] stands.
struct RangeRead {
    conn: Arc<AgentConn>,
    /// Held while the stream lives, so shutdown waits for the read.
    _inflight: Inflight,
    path: proto::PathBytes,
    user: proto::RunAs,
    range: FileRange,
    /// Bytes of the range read so far.
    done: u64,
    eof: bool,
    first: Option<Vec<u8>>,
}
