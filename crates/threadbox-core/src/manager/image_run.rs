//! An OCI image config's `Env`, `WorkingDir` and `User` as the defaults of every process
//! of a sandbox (issue 14, ADR 0160): exec, background processes, interpreter contexts,
//! terminals and the files API. The call's own env, cwd and user win.

use super::*;
use crate::oci::{self, OCI_KIND};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, OnceLock};

/// What an image gives the processes of its sandboxes.
#[derive(Debug, Default)]
pub(super) struct ImageRun {
    env: Vec<(String, String)>,
    cwd: Option<String>,
    /// The resolved `User`; `None`: the image names none (or is not an OCI image).
    user: Option<proto::RunAs>,
}

impl ImageRun {
    /// Puts the image's variables under the call's (the call's win), its directory when
    /// the call names none, and its user when the call said none (`User::Default`).
    pub(super) fn apply(
        &self,
        env: &mut BTreeMap<String, String>,
        cwd: &mut Option<String>,
        asked: User,
        user: &mut proto::RunAs,
    ) {
        for (k, v) in &self.env {
            env.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if cwd.is_none() {
            cwd.clone_from(&self.cwd);
        }
        *user = self.user_for(asked);
    }

    pub(super) fn user_for(&self, asked: User) -> proto::RunAs {
        match (asked, self.user) {
            (User::Default, Some(u)) => u,
            (a, _) => run_as(a),
        }
    }
}

/// Image records never change under their path (one per manifest digest), so what they
/// resolve to is kept for the process's life.
fn cache() -> &'static Mutex<HashMap<String, Arc<ImageRun>>> {
    static C: OnceLock<Mutex<HashMap<String, Arc<ImageRun>>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// Reads an `oci` row's record and, for its `User`, the image's `/etc/passwd` and
/// `/etc/group` from its layers; an unresolvable user is `invalid_argument`.
fn load(root: &std::path::Path, row: &ImageRow) -> Result<ImageRun> {
    let rec = oci::record(row)?;
    let mut env = BTreeMap::new();
    let mut cwd = None;
    oci::apply_defaults(&rec, &mut env, &mut cwd);
    let spec = rec
        .run
        .user
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let user = match spec {
        None => None,
        Some(spec) => {
            let layers = oci::image_spec(root, row)?.lower;
            let read = |rel| {
                crate::oci_user::read_merged(&layers, rel).map_err(|e| {
                    CoreError::Internal(format!("image {}: reading {rel}: {e}", row.name))
                })
            };
            let (passwd, group) = (read("etc/passwd")?, read("etc/group")?);
            crate::oci_user::resolve(Some(spec), passwd.as_deref(), group.as_deref())
                .map_err(|e| CoreError::InvalidArgument(format!("image {}: {e}", row.name)))?
        }
    };
    Ok(ImageRun {
        env: env.into_iter().collect(),
        cwd,
        user,
    })
}

impl Manager {
    /// The defaults of `image` (none for `host` and `rootfs` images). Fails only when an
    /// OCI image's `User` cannot be resolved — which a create refuses, so a sandbox that
    /// exists has none that fails; a record that vanished since gives no defaults.
    pub(super) async fn image_run(&self, image: &str) -> Result<Arc<ImageRun>> {
        let Some(row) = self.store.get_image(image).await? else {
            return Ok(Arc::default());
        };
        if row.kind != OCI_KIND {
            return Ok(Arc::default());
        }
        let Some(key) = row.path.clone() else {
            return Ok(Arc::default());
        };
        if let Some(r) = cache().lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(r.clone());
        }
        let root = self.root().to_path_buf();
        let loaded = blocking(move || match load(&root, &row) {
            Err(e @ CoreError::InvalidArgument(_)) => Err(e),
            Err(_) => Ok(None),
            Ok(r) => Ok(Some(r)),
        })
        .await?;
        let Some(r) = loaded else {
            return Ok(Arc::default());
        };
        let r = Arc::new(r);
        cache()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, r.clone());
        Ok(r)
    }

    /// The agent's user for a call on the sandbox `id_or_name` that asked for `asked`:
    /// only a call that asked for none looks the sandbox's image up.
    pub(super) async fn run_as_in(
        &self,
        caller: &Caller,
        id_or_name: &str,
        asked: User,
    ) -> Result<proto::RunAs> {
        if asked != User::Default {
            return Ok(run_as(asked));
        }
        let row = self.resolve(caller, id_or_name).await?;
        Ok(self.image_run(&row.image).await?.user_for(asked))
    }
}
