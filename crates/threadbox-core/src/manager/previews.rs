//! Port previews (issue 13, scope 5; ADR 0072): publish a port of a sandbox as a URL
//! through the daemon, check a visitor's token or cookie, and dial the port **inside the
//! sandbox's network namespace** (so a server bound to 127.0.0.1 there is reachable).
//!
//! Tokens are 256 random bits shown once; the store keeps SHA-256 of the token and of the
//! cookie it is exchanged for (the cookie is derived from the token, so the daemon can
//! hand it out without storing either). A preview belongs to one sandbox and one port:
//! the token and cookie of one never open another.

use super::convert::rfc3339;
use super::*;
use crate::store_previews::StoredPreview;
use sha2::{Digest, Sha256};
use std::net::{Ipv4Addr, SocketAddr};
use subtle::ConstantTimeEq;
use threadbox_api::previews::{
    CreatePreview, DeletePreview, ListPreviews, Preview, PreviewList, PreviewRequest,
};

/// The query parameter a private preview URL carries once.
pub const PREVIEW_TOKEN_QUERY: &str = "tb_preview";
/// The cookie the token becomes (HttpOnly, scoped to the one preview's host or path).
pub const PREVIEW_COOKIE: &str = "tb_preview";
/// A header a program may send instead of the query or cookie.
pub const PREVIEW_TOKEN_HEADER: &str = "x-threadbox-preview-token";
/// Where the path form lives: `/preview/{id}/{port}/...`.
pub const PREVIEW_PATH_PREFIX: &str = "/preview/";

const TOKEN_PREFIX: &str = "tbp_";

/// What a visitor presents.
#[derive(Debug, Clone, Copy, Default)]
pub struct PreviewCredentials<'a> {
    /// From `?tb_preview=` or the token header.
    pub token: Option<&'a str>,
    /// From the `tb_preview` cookie(s); any one that matches opens.
    pub cookies: &'a [&'a str],
}

/// A visitor let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewGrant {
    /// The cookie to set: only when a valid token was presented for a private preview.
    pub cookie: Option<String>,
}

/// A connection to the published port inside the sandbox. While it lives the sandbox
/// counts as busy (no idle pause under an open WebSocket).
pub struct PreviewConn {
    pub stream: tokio::net::TcpStream,
    pub guard: PreviewGuard,
}

/// Keeps the sandbox busy (see [`PreviewConn`]) until dropped.
pub struct PreviewGuard(#[allow(dead_code)] Inflight);

fn hex_sha256(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// The cookie a token is exchanged for: derived, so only a holder of the token has it.
fn cookie_for(token: &str) -> String {
    hex_sha256(&format!("threadbox preview cookie\0{token}"))
}

fn same(presented_hash: &str, stored: Option<&str>) -> bool {
    stored.is_some_and(|s| bool::from(presented_hash.as_bytes().ct_eq(s.as_bytes())))
}

fn not_found() -> CoreError {
    // One answer for an unknown sandbox, a deleted one, another tenant's, and a port
    // without a preview: nothing tells them apart.
    CoreError::NotFoundOther("no such preview".into())
}

impl Manager {
    /// The host form's domain (`serve --preview-domain`), lowercase.
    pub fn preview_domain(&self) -> String {
        self.config
            .preview_domain
            .trim_matches('.')
            .to_ascii_lowercase()
    }

    fn preview_view(&self, p: &StoredPreview, token: Option<&str>) -> Preview {
        let domain = &self.config.preview_domain;
        let addr = self
            .config
            .preview_addr
            .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 7420)));
        let port = addr.port();
        let ip = match addr.ip() {
            ip if ip.is_unspecified() => "127.0.0.1".to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            ip => ip.to_string(),
        };
        let query = token
            .map(|t| format!("?{PREVIEW_TOKEN_QUERY}={t}"))
            .unwrap_or_default();
        Preview {
            sandbox: p.sandbox_id.clone(),
            port: p.port,
            public: p.public,
            url: format!("http://{}-{}.{domain}:{port}/{query}", p.port, p.sandbox_id),
            path_url: format!(
                "http://{ip}:{port}{PREVIEW_PATH_PREFIX}{}/{}/{query}",
                p.sandbox_id, p.port
            ),
            token: token.map(str::to_string),
            created_at: rfc3339(p.created_at),
        }
    }

    pub async fn create_preview(&self, caller: &Caller, op: CreatePreview) -> Result<Preview> {
        let r = self.create_preview_inner(caller, &op).await;
        let target = format!("{}:{}", op.sandbox, op.request.port);
        self.audit(caller, CreatePreview::NAME, &target, &r).await;
        r
    }

    async fn create_preview_inner(&self, caller: &Caller, op: &CreatePreview) -> Result<Preview> {
        caller.require(CreatePreview::SCOPE)?;
        let PreviewRequest { port, public } = op.request;
        if port == 0 {
            return Err(CoreError::InvalidArgument(
                "port must be 1..=65535 (the port a server listens on inside the sandbox)".into(),
            ));
        }
        let row = self.resolve(caller, &op.sandbox).await?;
        self.require_row_capability(&row, crate::driver::capability::EGRESS, "a preview")?;
        self.require_booted_netns(&row.id, "publish a preview")
            .await?;
        let token = if public {
            None
        } else {
            let mut buf = [0u8; 32];
            getrandom::getrandom(&mut buf).map_err(|e| {
                CoreError::Internal(format!("the system's random source failed: {e}"))
            })?;
            use base64::Engine;
            Some(format!(
                "{TOKEN_PREFIX}{}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
            ))
        };
        let stored = StoredPreview {
            sandbox_id: row.id.clone(),
            port,
            public,
            token_hash: token.as_deref().map(hex_sha256),
            cookie_hash: token.as_deref().map(|t| hex_sha256(&cookie_for(t))),
            created_at: now_ms(),
        };
        self.store.put_preview(&stored).await?;
        Ok(self.preview_view(&stored, token.as_deref()))
    }

    pub async fn list_previews(&self, caller: &Caller, op: ListPreviews) -> Result<PreviewList> {
        caller.require(ListPreviews::SCOPE)?;
        let row = self.resolve(caller, &op.sandbox).await?;
        let previews = self.store.list_previews(&row.id).await?;
        Ok(PreviewList {
            previews: previews
                .iter()
                .map(|p| self.preview_view(p, None))
                .collect(),
        })
    }

    pub async fn delete_preview(&self, caller: &Caller, op: DeletePreview) -> Result<()> {
        let r = async {
            caller.require(DeletePreview::SCOPE)?;
            let row = self.resolve(caller, &op.sandbox).await?;
            if self.store.delete_preview(&row.id, op.port).await? {
                Ok(())
            } else {
                Err(CoreError::NotFoundOther(format!(
                    "sandbox {} has no preview of port {}",
                    op.sandbox, op.port
                )))
            }
        }
        .await;
        let target = format!("{}:{}", op.sandbox, op.port);
        self.audit(caller, DeletePreview::NAME, &target, &r).await;
        r
    }

    /// Checks a visitor of preview `sandbox_id:port`: `NotFoundOther` (the same for every
    /// kind of absence) or `Unauthenticated` (a private preview, nothing valid presented).
    /// No caller: a preview's visitor holds no API key and acts for nobody.
    pub async fn preview_authorize(
        &self,
        sandbox_id: &str,
        port: u16,
        creds: PreviewCredentials<'_>,
    ) -> Result<PreviewGrant> {
        match self.store.get_by_id_any(sandbox_id).await? {
            Some(row) if row.state != State::Deleting => {}
            _ => return Err(not_found()),
        }
        let p = self
            .store
            .get_preview(sandbox_id, port)
            .await?
            .ok_or_else(not_found)?;
        if p.public {
            return Ok(PreviewGrant { cookie: None });
        }
        if let Some(token) = creds.token {
            if same(&hex_sha256(token), p.token_hash.as_deref()) {
                return Ok(PreviewGrant {
                    cookie: Some(cookie_for(token)),
                });
            }
        }
        if creds
            .cookies
            .iter()
            .any(|c| same(&hex_sha256(c), p.cookie_hash.as_deref()))
        {
            return Ok(PreviewGrant { cookie: None });
        }
        Err(CoreError::Unauthenticated(format!(
            "this preview is private: open the URL `threadbox preview` printed (it carries \
             ?{PREVIEW_TOKEN_QUERY}=...), or send the token in {PREVIEW_TOKEN_HEADER}"
        )))
    }

    /// Dials `127.0.0.1:port` inside sandbox `sandbox_id`'s network namespace, resuming
    /// it first if it is paused (and counting the request as activity). Call after
    /// [`Self::preview_authorize`].
    pub async fn preview_connect(&self, sandbox_id: &str, port: u16) -> Result<PreviewConn> {
        let row = match self.store.get_by_id_any(sandbox_id).await? {
            Some(row) if row.state != State::Deleting => row,
            _ => return Err(not_found()),
        };
        // The daemon acting for the sandbox's tenant: the implicit resume of a call.
        let caller = Caller::system(&row.tenant);
        let (_conn, inflight, row) = self.running_conn_row(&caller, &row.id, false).await?;
        let pid = row.agent_pid.ok_or_else(|| {
            CoreError::Unavailable(format!("sandbox {} has no running agent", row.id))
        })?;
        let ns = self
            .driver_for(&row)?
            .egress_netns(&row.id, pid)
            .await?
            .ok_or_else(|| {
                CoreError::Unavailable(format!(
                    "sandbox {} has no network namespace of ours to preview (on the {} tier, \
                     only a sandbox created with a network policy has one)",
                    row.id, row.tier
                ))
            })?;
        let fd = blocking(move || {
            use std::os::fd::AsFd;
            Ok(threadbox_sys::net::socket_in_netns(
                ns.as_fd(),
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK,
            )?)
        })
        .await?;
        let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
        let stream = socket
            .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .await
            .map_err(|e| {
                CoreError::Unavailable(format!(
                    "nothing answers on 127.0.0.1:{port} inside sandbox {}: {e}",
                    row.id
                ))
            })?;
        Ok(PreviewConn {
            stream,
            guard: PreviewGuard(inflight),
        })
    }
}

impl crate::ops::Run for CreatePreview {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Preview> {
        m.create_preview(caller, self).await
    }
}

impl crate::ops::Run for ListPreviews {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<PreviewList> {
        m.list_previews(caller, self).await
    }
}

impl crate::ops::Run for DeletePreview {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.delete_preview(caller, self).await
    }
}
