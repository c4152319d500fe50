//! The store: SQLite (WAL) through sqlx with migrations, so PostgreSQL can follow.
//! Every state change of a sandbox is one statement (or one transaction), so a crash at
//! any moment leaves a row that reconciliation understands.

use crate::error::{CoreError, Result};
use crate::metrics::HistogramVec;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};
use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use threadbox_api::TtlAction;

/// Internal state: the API's states plus `deleting`, which is never shown to users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Creating,
    Running,
    Paused,
    /// Frozen with its memory pushed out of RAM (issue 16, ADR 0129).
    Hibernated,
    Stopped,
    Deleting,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Paused => "paused",
            State::Hibernated => "hibernated",
            State::Stopped => "stopped",
            State::Deleting => "deleting",
        }
    }
    pub fn parse(s: &str) -> Result<State> {
        Ok(match s {
            "creating" => State::Creating,
            "running" => State::Running,
            "paused" => State::Paused,
            "hibernated" => State::Hibernated,
            "stopped" => State::Stopped,
            "deleting" => State::Deleting,
            other => {
                return Err(CoreError::Internal(format!(
                    "unknown state {other:?} in the store"
                )))
            }
        })
    }
}

#[derive(Debug, Clone)]
pub struct SandboxRow {
    pub id: String,
    /// The tenant that owns the sandbox; names are unique per tenant.
    pub tenant: String,
    pub name: Option<String>,
    pub state: State,
    pub labels: BTreeMap<String, String>,
    pub image: String,
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u32,
    /// Size of the sandbox's disk image; 0 = no quota (created before quotas).
    pub disk_bytes: u64,
    pub idle_pause_secs: Option<u64>,
    /// Stop after this long without activity (a TTL counted from the last call).
    pub idle_stop_secs: Option<u64>,
    /// Hibernate after this long without activity (ADR 0129).
    pub idle_hibernate_secs: Option<u64>,
    pub ttl_secs: Option<u64>,
    pub ttl_action: TtlAction,
    pub slot: u32,
    pub agent_pid: Option<i32>,
    pub created_at: i64,
    pub last_active_at: i64,
    /// The isolation tier (driver) that runs it.
    pub tier: String,
    /// The egress policy as JSON (`NetworkPolicySpec`; written by `swap_network` only, so
    /// `insert_sandbox` ignores it) and its generation.
    pub network_policy: Option<String>,
    pub network_generation: u64,
    /// The in-sandbox OTLP endpoint is on (ADR 0091; written by `set_otlp_relay` only).
    pub otlp_relay: bool,
}

/// Sandboxes (alive or stopped, each holding its index until deleted) one daemon may
/// have. Each gets the lowest free index below it (`slot`); a driver may map the index to
/// what must be unique per sandbox on the host (the jail's uid ranges are this many).
pub const MAX_SANDBOXES: u32 = 2048;

#[derive(Debug, Clone)]
pub struct ImageRow {
    pub name: String,
    pub kind: String,
    pub path: Option<String>,
    pub created_at: i64,
}

#[derive(Clone)]
pub struct Store {
    pub(crate) pool: SqlitePool,
    /// Latency of the hot statements, by name (`threadbox_store_query_duration_seconds`).
    pub(crate) timings: Arc<HistogramVec<1>>,
}

/// Observes the time from its making to its drop into the store's histogram: on every
/// path out of a statement, `?` included.
struct Timed<'a>(&'a HistogramVec<1>, &'static str, std::time::Instant);

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.0.observe([self.1], self.2.elapsed());
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) fn ttl_str(a: TtlAction) -> &'static str {
    match a {
        TtlAction::Stop => "stop",
        TtlAction::Delete => "delete",
    }
}

fn row_to_sandbox(r: &sqlx::sqlite::SqliteRow) -> Result<SandboxRow> {
    let labels: String = r.try_get("labels")?;
    let ttl_action: String = r.try_get("ttl_action")?;
    Ok(SandboxRow {
        id: r.try_get("id")?,
        tenant: r.try_get("tenant")?,
        name: r.try_get("name")?,
        state: State::parse(&r.try_get::<String, _>("state")?)?,
        labels: serde_json::from_str(&labels)
            .map_err(|e| CoreError::Internal(format!("bad labels in the store: {e}")))?,
        image: r.try_get("image")?,
        memory_bytes: r.try_get::<i64, _>("memory_bytes")? as u64,
        cpus: r.try_get("cpus")?,
        pids: r.try_get::<i64, _>("pids")? as u32,
        disk_bytes: r.try_get::<i64, _>("disk_bytes")? as u64,
        idle_pause_secs: r
            .try_get::<Option<i64>, _>("idle_pause_secs")?
            .map(|v| v as u64),
        idle_stop_secs: r
            .try_get::<Option<i64>, _>("idle_stop_secs")?
            .map(|v| v as u64),
        idle_hibernate_secs: r
            .try_get::<Option<i64>, _>("idle_hibernate_secs")?
            .map(|v| v as u64),
        ttl_secs: r.try_get::<Option<i64>, _>("ttl_secs")?.map(|v| v as u64),
        ttl_action: if ttl_action == "delete" {
            TtlAction::Delete
        } else {
            TtlAction::Stop
        },
        slot: r.try_get::<i64, _>("slot")? as u32,
        agent_pid: r.try_get::<Option<i64>, _>("agent_pid")?.map(|v| v as i32),
        created_at: r.try_get("created_at")?,
        last_active_at: r.try_get("last_active_at")?,
        tier: r.try_get("tier")?,
        network_policy: r.try_get("network_policy")?,
        network_generation: r.try_get::<i64, _>("network_generation")?.max(0) as u64,
        otlp_relay: r.try_get::<i64, _>("otlp_relay")? != 0,
    })
}

/// Creates `path` as an empty file with mode 0600 unless it exists.
fn create_private(path: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes group and other permissions from `path`, if it exists.
fn restrict_to_owner(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o077 != 0 => {
            let mode = m.permissions().mode() & 0o700;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl Store {
    pub async fn open(path: &Path) -> Result<Store> {
        // The database holds key hashes, names, labels and the audit log: owner only.
        // Created 0600 here rather than by SQLite (which would use 0644 under the usual
        // umask); SQLite gives the -wal and -shm files the mode of the database file.
        // A process-wide umask is not an option: the daemon also creates image
        // directories that sandbox users must be able to read.
        create_private(path)?;
        let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(5))
            .foreign_keys(true);
        // No ping before each acquire: the database is a local file, a connection cannot
        // go stale, and the ping is one more round trip to sqlx's worker thread on every
        // query (measurable on every exec).
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        // Databases of earlier versions (and their WAL and shared-memory files, which
        // exist now that a connection is open) were 0644.
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            restrict_to_owner(Path::new(&p))?;
        }
        Ok(Store {
            pool,
            timings: Arc::default(),
        })
    }

    fn timed(&self, query: &'static str) -> Timed<'_> {
        Timed(&self.timings, query, std::time::Instant::now())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Inserts a new sandbox in state `creating`, allocating the lowest free uid slot in
    /// the same transaction. Fails with `Conflict` when the name is taken.
    pub async fn insert_sandbox(&self, row: &SandboxRow) -> Result<u32> {
        let _t = self.timed("insert_sandbox");
        // IMMEDIATE: a deferred transaction that reads, then writes, fails at once with
        // SQLITE_BUSY (no busy wait) when another connection wrote in between.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let used: Vec<i64> = sqlx::query_scalar("SELECT slot FROM sandboxes ORDER BY slot")
            .fetch_all(&mut *tx)
            .await?;
        // The lowest free slot, so uid ranges are reused after deletes.
        let mut slot: i64 = 0;
        for u in used {
            if u == slot {
                slot += 1;
            } else if u > slot {
                break;
            }
        }
        if slot >= MAX_SANDBOXES as i64 {
            return Err(CoreError::Conflict(format!(
                "this daemon holds {} sandboxes, the most its host uid range allows; delete \
                 some first",
                MAX_SANDBOXES
            )));
        }
        let labels =
            serde_json::to_string(&row.labels).map_err(|e| CoreError::Internal(e.to_string()))?;
        let res = sqlx::query(
            "INSERT INTO sandboxes (id, tenant, name, state, labels, image, memory_bytes, cpus, pids, \
             idle_pause_secs, ttl_secs, ttl_action, slot, agent_pid, created_at, last_active_at, \
             disk_bytes, tier, idle_stop_secs, idle_hibernate_secs) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&row.id)
        .bind(&row.tenant)
        .bind(&row.name)
        .bind(row.state.as_str())
        .bind(labels)
        .bind(&row.image)
        .bind(row.memory_bytes as i64)
        .bind(row.cpus)
        .bind(row.pids as i64)
        .bind(row.idle_pause_secs.map(|v| v as i64))
        .bind(row.ttl_secs.map(|v| v as i64))
        .bind(ttl_str(row.ttl_action))
        .bind(slot)
        .bind(row.created_at)
        .bind(row.last_active_at)
        .bind(row.disk_bytes as i64)
        .bind(&row.tier)
        .bind(row.idle_stop_secs.map(|v| v as i64))
        .bind(row.idle_hibernate_secs.map(|v| v as i64))
        .execute(&mut *tx)
        .await;
        match res {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Err(CoreError::Conflict(format!(
                    "a sandbox named {:?} already exists",
                    row.name.as_deref().unwrap_or("")
                )))
            }
            Err(e) => return Err(e.into()),
        }
        tx.commit().await?;
        Ok(slot as u32)
    }

    /// A sandbox of `tenant` by id or name. Another tenant's sandbox is not found, exactly
    /// like one that does not exist.
    pub async fn get_sandbox(&self, tenant: &str, id_or_name: &str) -> Result<Option<SandboxRow>> {
        let _t = self.timed("get_sandbox");
        let r = sqlx::query("SELECT * FROM sandboxes WHERE tenant = ? AND (id = ? OR name = ?) AND state != 'deleting' ORDER BY id = ? DESC LIMIT 1")
            .bind(tenant)
            .bind(id_or_name)
            .bind(id_or_name)
            .bind(id_or_name)
            .fetch_optional(&self.pool)
            .await?;
        r.as_ref().map(row_to_sandbox).transpose()
    }

    /// The oldest running sandbox of the warm pool that has `image` and a disk of
    /// `disk_bytes`, if any.
    pub async fn pool_candidate(&self, image: &str, disk_bytes: u64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM sandboxes WHERE tenant = ? AND state = 'running' AND image = ? \
             AND disk_bytes = ? ORDER BY created_at, id LIMIT 1",
        )
        .bind(crate::caller::POOL_TENANT)
        .bind(image)
        .bind(disk_bytes as i64)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Hands the pooled sandbox `id` to `row.tenant` in one statement: tenant, name,
    /// labels, limits, idle/TTL settings and times of `row`. False when `id` is no longer
    /// a running pooled sandbox; `Conflict` when the name is taken.
    pub async fn adopt_pooled(&self, id: &str, row: &SandboxRow) -> Result<bool> {
        let labels =
            serde_json::to_string(&row.labels).map_err(|e| CoreError::Internal(e.to_string()))?;
        let res = sqlx::query(
            "UPDATE sandboxes SET tenant = ?, name = ?, labels = ?, memory_bytes = ?, cpus = ?, \
             pids = ?, idle_pause_secs = ?, ttl_secs = ?, ttl_action = ?, created_at = ?, \
             last_active_at = ?, idle_stop_secs = ?, idle_hibernate_secs = ? \
             WHERE id = ? AND tenant = ? AND state = 'running'",
        )
        .bind(&row.tenant)
        .bind(&row.name)
        .bind(labels)
        .bind(row.memory_bytes as i64)
        .bind(row.cpus)
        .bind(row.pids as i64)
        .bind(row.idle_pause_secs.map(|v| v as i64))
        .bind(row.ttl_secs.map(|v| v as i64))
        .bind(ttl_str(row.ttl_action))
        .bind(row.created_at)
        .bind(row.last_active_at)
        .bind(row.idle_stop_secs.map(|v| v as i64))
        .bind(row.idle_hibernate_secs.map(|v| v as i64))
        .bind(id)
        .bind(crate::caller::POOL_TENANT)
        .execute(&self.pool)
        .await;
        match res {
            Ok(r) => Ok(r.rows_affected() == 1),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(CoreError::Conflict(format!(
                    "a sandbox named {:?} already exists",
                    row.name.as_deref().unwrap_or("")
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    pub async fn get_by_id_any(&self, id: &str) -> Result<Option<SandboxRow>> {
        let _t = self.timed("get_by_id_any");
        let r = sqlx::query("SELECT * FROM sandboxes WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        r.as_ref().map(row_to_sandbox).transpose()
    }

    /// Every sandbox, `deleting` ones included (for reconciliation).
    pub async fn all_sandboxes(&self) -> Result<Vec<SandboxRow>> {
        let rows = sqlx::query("SELECT * FROM sandboxes ORDER BY created_at, id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(row_to_sandbox).collect()
    }

    /// Moves sandbox `id` to `to` (with `agent_pid`) only if it is in one of `from`: a
    /// caller that read a state earlier cannot overwrite what changed since. `Conflict`
    /// when the row is not (or no longer) in one of `from`.
    pub async fn transition(
        &self,
        id: &str,
        from: &[State],
        to: State,
        agent_pid: Option<i32>,
    ) -> Result<()> {
        let _t = self.timed("transition");
        if from.is_empty() {
            return Err(CoreError::Internal(format!(
                "a transition of {id} to {} from no state",
                to.as_str()
            )));
        }
        let marks = vec!["?"; from.len()].join(", ");
        let sql = format!(
            "UPDATE sandboxes SET state = ?, agent_pid = ? WHERE id = ? AND state IN ({marks})"
        );
        let mut q = sqlx::query(&sql).bind(to.as_str()).bind(agent_pid).bind(id);
        for s in from {
            q = q.bind(s.as_str());
        }
        let done = q.execute(&self.pool).await?;
        if done.rows_affected() != 1 {
            let now = self.get_by_id_any(id).await?;
            return Err(CoreError::Conflict(match now {
                Some(r) => format!(
                    "sandbox {id} is {}, no longer {}",
                    r.state.as_str(),
                    from.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
                None => format!("sandbox {id} no longer exists"),
            }));
        }
        Ok(())
    }

    /// Turns the in-sandbox OTLP endpoint of `id` on or off (create sets it before boot).
    pub async fn set_otlp_relay(&self, id: &str, on: bool) -> Result<()> {
        sqlx::query("UPDATE sandboxes SET otlp_relay = ? WHERE id = ?")
            .bind(i64::from(on))
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn touch(&self, id: &str, at: i64) -> Result<()> {
        let _t = self.timed("touch");
        sqlx::query("UPDATE sandboxes SET last_active_at = ? WHERE id = ?")
            .bind(at)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn delete_sandbox(&self, id: &str) -> Result<()> {
        let _t = self.timed("delete_sandbox");
        sqlx::query("DELETE FROM sandboxes WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn insert_image(&self, img: &ImageRow) -> Result<()> {
        let res =
            sqlx::query("INSERT INTO images (name, kind, path, created_at) VALUES (?, ?, ?, ?)")
                .bind(&img.name)
                .bind(&img.kind)
                .bind(&img.path)
                .bind(img.created_at)
                .execute(&self.pool)
                .await;
        match res {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(CoreError::Conflict(
                format!("an image named {:?} already exists", img.name),
            )),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn get_image(&self, name: &str) -> Result<Option<ImageRow>> {
        let r = sqlx::query("SELECT * FROM images WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match r {
            Some(r) => Some(ImageRow {
                name: r.try_get("name")?,
                kind: r.try_get("kind")?,
                path: r.try_get("path")?,
                created_at: r.try_get("created_at")?,
            }),
            None => None,
        })
    }

    pub async fn list_images(&self) -> Result<Vec<ImageRow>> {
        let rows = sqlx::query("SELECT * FROM images ORDER BY name")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ImageRow {
                    name: r.try_get("name")?,
                    kind: r.try_get("kind")?,
                    path: r.try_get("path")?,
                    created_at: r.try_get("created_at")?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
pub(crate) mod tests;
