//! Lost contexts (issue 15, ADR 0084): the store remembers every context the agent made,
//! so one the agent no longer has (a stop/start, an agent that was restarted) is listed
//! `lost` with a reason, and the next get-or-create of its name says `recreated`.

use super::*;
use crate::store_contexts::StoredContext;
use std::sync::LazyLock;
use threadbox_api::interp::{CodeExecution, Context, ContextState};
use threadbox_api::User;

/// When this daemon process first dealt with contexts: a context recorded earlier and
/// missing from its agent now was lost across a daemon restart (the agent did not
/// survive it, as after a host reboot); one recorded later, by an agent restarted under
/// this daemon.
static FIRST_USE_MS: LazyLock<i64> = LazyLock::new(now_ms);

fn inferred_reason(s: &StoredContext) -> &'static str {
    if s.created_at < *FIRST_USE_MS {
        "daemon-restart"
    } else {
        "agent-restart"
    }
}

fn lost_context(s: StoredContext, reason: String) -> Context {
    Context {
        id: s.context_id,
        name: s.name,
        language: s.language,
        cwd: None,
        user: User::default(),
        state: ContextState::Lost,
        execution_count: 0,
        generation: 0,
        pid: None,
        created_at: rfc3339(s.created_at),
        reason: Some(reason),
        created: false,
        recreated: false,
        lost_reason: None,
    }
}

/// Marks an execution that made its context again after it was lost.
pub(super) struct LostWatch {
    store: Store,
    sandbox_id: String,
    key: String,
    before: Option<StoredContext>,
}

impl LostWatch {
    pub(super) async fn check(&self, e: &mut CodeExecution) {
        if !e.context_created {
            return;
        }
        // A new context of the agent under a name the store knew: the earlier one was
        // lost (a worker that died keeps its id, and says so with `context_created`).
        if let Some(b) = &self.before {
            if b.context_id != e.context_id {
                e.context_recreated = true;
                e.lost_reason = Some(
                    b.lost_reason
                        .clone()
                        .unwrap_or_else(|| inferred_reason(b).to_string()),
                );
            }
        }
        // Only names are get-or-create on execute (the languages'); an id is not a name.
        let name = match &self.before {
            Some(b) => b.name.clone(),
            None if threadbox_api::interp::canonical_language(&self.key)
                .is_some_and(|l| l == self.key) =>
            {
                self.key.clone()
            }
            None => return,
        };
        let row = StoredContext {
            sandbox_id: self.sandbox_id.clone(),
            language: self
                .before
                .as_ref()
                .map_or_else(|| name.clone(), |b| b.language.clone()),
            name,
            context_id: e.context_id.clone(),
            created_at: now_ms(),
            lost_reason: None,
            lost_at: None,
        };
        if let Err(err) = self.store.put_context(&row).await {
            tracing::warn!(sandbox = %self.sandbox_id, "recording a context: {err}");
        }
    }
}

impl Manager {
    /// The stored context a key (id or name) names.
    pub(super) async fn stored_context(
        &self,
        sandbox_id: &str,
        key: &str,
    ) -> Option<StoredContext> {
        let all = self.store.list_stored_contexts(sandbox_id).await.ok()?;
        let by_name = all.iter().position(|c| c.name == key);
        let i = by_name.or_else(|| all.iter().position(|c| c.context_id == key))?;
        all.into_iter().nth(i)
    }

    pub(super) async fn lost_watch(&self, sandbox_id: &str, key: &str) -> Result<LostWatch> {
        LazyLock::force(&FIRST_USE_MS);
        Ok(LostWatch {
            store: self.store.clone(),
            sandbox_id: sandbox_id.to_string(),
            key: key.to_string(),
            before: self.stored_context(sandbox_id, key).await,
        })
    }

    /// Records a context the agent just made; the reason its earlier one of that name
    /// was lost, when there was one.
    pub(super) async fn record_context(
        &self,
        sandbox_id: &str,
        name: Option<&str>,
        c: &Context,
    ) -> Option<String> {
        LazyLock::force(&FIRST_USE_MS);
        let earlier = match name {
            Some(n) => self.stored_context(sandbox_id, n).await,
            None => None,
        };
        let row = StoredContext {
            sandbox_id: sandbox_id.to_string(),
            name: c.name.clone(),
            context_id: c.id.clone(),
            language: c.language.clone(),
            created_at: now_ms(),
            lost_reason: None,
            lost_at: None,
        };
        if let Err(e) = self.store.put_context(&row).await {
            tracing::warn!(sandbox = %sandbox_id, "recording a context: {e}");
        }
        earlier.map(|b| {
            b.lost_reason
                .clone()
                .unwrap_or_else(|| inferred_reason(&b).to_string())
        })
    }

    /// The stored contexts the agent does not have (`live`), as `lost` with their reason
    /// (an inferred one is kept, so the answer does not change later).
    pub(super) async fn lost_contexts(
        &self,
        sandbox_id: &str,
        live: &[Context],
    ) -> Result<Vec<Context>> {
        LazyLock::force(&FIRST_USE_MS);
        let mut out = Vec::new();
        for s in self.store.list_stored_contexts(sandbox_id).await? {
            if live.iter().any(|c| c.name == s.name) {
                continue;
            }
            let reason = match &s.lost_reason {
                Some(r) => r.clone(),
                None => {
                    let r = inferred_reason(&s);
                    self.store.mark_context_lost(sandbox_id, &s.name, r).await?;
                    r.to_string()
                }
            };
            out.push(lost_context(s, reason));
        }
        Ok(out)
    }
}
