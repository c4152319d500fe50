//! `threadbox preview SB PORT [--public]` (issue 13, ADR 0072): a port of a sandbox as a
//! URL through the daemon; `--list` and `--delete` manage them.

use anyhow::{bail, Result};
use threadbox_api::previews::{CreatePreview, DeletePreview, ListPreviews, PreviewRequest};
use threadbox_client::Client;

#[derive(Debug, clap::Args)]
pub struct PreviewArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// The port a server listens on inside the sandbox (127.0.0.1 is fine).
    pub port: Option<u16>,
    /// No token: anyone who reaches the daemon and knows the URL opens it.
    #[arg(long)]
    pub public: bool,
    /// List the sandbox's previews (no tokens).
    #[arg(long, conflicts_with_all = ["public", "delete"])]
    pub list: bool,
    /// Unpublish PORT: its URL answers 404 at once, its token and cookies are void.
    #[arg(long, conflicts_with = "public")]
    pub delete: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `serve --preview-domain`: a DNS name (labels of letters, digits and `-`), lowercase.
pub fn check_domain(d: &str) -> Result<String> {
    let d = d.trim().trim_end_matches('.').to_ascii_lowercase();
    let ok = !d.is_empty()
        && d.len() <= 200
        && d.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !ok {
        bail!("--preview-domain {d:?}: expected a DNS name such as preview.example.com");
    }
    Ok(d)
}

pub async fn preview(client: &Client, a: PreviewArgs) -> Result<u8> {
    if a.list {
        let list = client.call(&ListPreviews { sandbox: a.sandbox }).await?;
        if a.json {
            crate::commands::print_json(&list)?;
            return Ok(0);
        }
        let mut out = String::new();
        for p in &list.previews {
            let access = if p.public { "public" } else { "private" };
            out.push_str(&format!(
                "{}\t{access}\t{}\t{}\n",
                p.port, p.url, p.path_url
            ));
        }
        crate::commands::write_stdout(out.as_bytes())?;
        return Ok(0);
    }
    let Some(port) = a.port else {
        bail!("name the port: threadbox preview SANDBOX PORT (or --list)");
    };
    if a.delete {
        client
            .call(&DeletePreview {
                sandbox: a.sandbox,
                port,
            })
            .await?;
        return Ok(0);
    }
    let p = client
        .call(&CreatePreview {
            sandbox: a.sandbox,
            request: PreviewRequest {
                port,
                public: a.public,
            },
        })
        .await?;
    if a.json {
        crate::commands::print_json(&p)?;
        return Ok(0);
    }
    let mut out = format!("{}\n", p.url);
    out.push_str(&format!(
        "# without wildcard DNS: {}\n# (the path form breaks apps that use absolute paths)\n",
        p.path_url
    ));
    if p.token.is_some() {
        out.push_str(
            "# private: the token in the URL is shown once; opening the URL swaps it for a cookie\n",
        );
    }
    crate::commands::write_stdout(out.as_bytes())?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn preview_domains_are_dns_names() {
        assert_eq!(
            super::check_domain("Preview.Example.COM.").unwrap(),
            "preview.example.com"
        );
        for bad in ["", "a..b", "-a.b", "a_b.c", "a b"] {
            assert!(super::check_domain(bad).is_err(), "{bad}");
        }
    }
}
