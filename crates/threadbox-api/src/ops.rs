//! The API's operations, one type each: the type is the operation's input, and its
//! [`Operation`] impl says what it answers, its name (the audit log's action) and where it lives on REST.
//!
//! Every door is derived from these types (ADR 0057):
//! - the daemon's core runs them (`threadbox_core::ops`: scope, validation, audit, the
//!   manager call) — the only validation in the codebase;
//! - REST handlers (`threadbox-server/src/routes.rs`) parse HTTP into one and answer its
//!   output;
//! - MCP tools build one from their arguments;
//! - the Rust client sends one with [`Operation::METHOD`], [`Operation::PATH`],
//!   [`Operation::path_values`], [`Operation::query`] and [`Operation::body`]
//!   (`threadbox-client`'s `Client::call`).
//!
//! So a new operation costs one type here, its `run` in core, and thin door code.
//! Operations whose input or output is a byte stream (a file's contents, a streamed exec)
//! are types here too, but their transport is written by each door.

pub use crate::gov_ops::*;
pub use crate::image_ops::*;
use crate::routes;
use crate::*;
use std::collections::BTreeMap;

/// The HTTP method of an operation's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Delete,
}

/// One operation of the API; the implementing type is its input.
pub trait Operation: Send + 'static {
    /// What a successful call answers.
    type Output: Send + 'static;
    /// The operation's name (`sandbox.pause`), stable: the audit log's action for the
    /// operations that are audited (writes), and the tracing name of every one.
    const NAME: &'static str;
    /// The scope a caller needs.
    const SCOPE: Scope;
    const METHOD: HttpMethod;
    /// The route template (see [`routes`]).
    const PATH: &'static str;
    /// The values of [`Self::PATH`]'s placeholders, in order.
    fn path_values(&self) -> Vec<String> {
        Vec::new()
    }
    /// Query parameters (unencoded), in order.
    fn query(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The JSON request body, if the route takes one.
    fn body(&self) -> Option<serde_json::Value> {
        None
    }
}

fn to_json<T: Serialize>(v: &T) -> Option<serde_json::Value> {
    // These types serialize infallibly (plain structs of strings, numbers and maps).
    serde_json::to_value(v).ok()
}

/// Declares an operation on one sandbox named in the path, without a body.
macro_rules! sandbox_op {
    ($(#[$doc:meta])* $name:ident => $out:ty, $audit:literal, $scope:ident, $method:ident, $path:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            /// Id or name of the sandbox.
            pub sandbox: String,
        }

        impl Operation for $name {
            type Output = $out;
            const NAME: &'static str = $audit;
            const SCOPE: Scope = Scope::$scope;
            const METHOD: HttpMethod = HttpMethod::$method;
            const PATH: &'static str = $path;
            fn path_values(&self) -> Vec<String> {
                vec![self.sandbox.clone()]
            }
        }
    };
}

// ---- sandboxes ------------------------------------------------------------------------

/// Get-or-create by name.
#[derive(Debug, Clone)]
pub struct CreateSandbox(pub CreateSandboxRequest);

impl Operation for CreateSandbox {
    type Output = CreatedSandbox;
    const NAME: &'static str = "sandbox.create";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::SANDBOXES;
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.0)
    }
}

/// Sandboxes carrying every one of `labels`, optionally only those in `state`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListSandboxes {
    pub labels: BTreeMap<String, String>,
    pub state: Option<SandboxState>,
}

impl Operation for ListSandboxes {
    type Output = SandboxList;
    const NAME: &'static str = "sandbox.list";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::SANDBOXES;
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut q: Vec<_> = self
            .labels
            .iter()
            .map(|(k, v)| ("label", format!("{k}={v}")))
            .collect();
        if let Some(s) = self.state {
            q.push(("state", s.as_str().to_string()));
        }
        q
    }
}

sandbox_op!(
    /// One sandbox.
    GetSandbox => Sandbox, "sandbox.get", SandboxesRead, Get, routes::SANDBOX);
sandbox_op!(
    /// Freeze a running sandbox.
    PauseSandbox => Sandbox, "sandbox.pause", SandboxesWrite, Post, routes::SANDBOX_PAUSE);
sandbox_op!(
    /// Freeze a sandbox and push its memory out of RAM (swap on the jail tier); any call
    /// wakes it, its processes continuing where they were.
    HibernateSandbox => Sandbox, "sandbox.hibernate", SandboxesWrite, Post, routes::SANDBOX_HIBERNATE);
sandbox_op!(
    /// Thaw a paused sandbox; a stopped one is refused (`sandbox_not_running`).
    ResumeSandbox => Sandbox, "sandbox.resume", SandboxesWrite, Post, routes::SANDBOX_RESUME);
sandbox_op!(
    /// End every process; the disk stays.
    StopSandbox => Sandbox, "sandbox.stop", SandboxesWrite, Post, routes::SANDBOX_STOP);
sandbox_op!(
    /// Make a sandbox run again, whatever it is: boot a stopped one on its disk, thaw a
    /// paused one, leave a running one (the transition table's `Start`).
    StartSandbox => Sandbox, "sandbox.start", SandboxesWrite, Post, routes::SANDBOX_START);
sandbox_op!(
    /// The isolation checks run inside the sandbox.
    Selftest => SelftestReport, "sandbox.selftest", SandboxesWrite, Get, routes::SANDBOX_SELFTEST);
sandbox_op!(
    /// The sandbox's background processes.
    ListProcesses => ProcessList, "process.list", SandboxesWrite, Get, routes::PROCESSES);

/// Delete a sandbox; without `force`, a running or paused one is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteSandbox {
    pub sandbox: String,
    pub force: bool,
}

impl Operation for DeleteSandbox {
    type Output = ();
    const NAME: &'static str = "sandbox.delete";
    const SCOPE: Scope = Scope::SandboxesDelete;
    const METHOD: HttpMethod = HttpMethod::Delete;
    const PATH: &'static str = routes::SANDBOX;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn query(&self) -> Vec<(&'static str, String)> {
        if self.force {
            vec![("force", "true".into())]
        } else {
            Vec::new()
        }
    }
}

// ---- exec and processes ---------------------------------------------------------------

/// Run a command to completion.
#[derive(Debug, Clone)]
pub struct Exec {
    pub sandbox: String,
    pub request: ExecRequest,
}

impl Operation for Exec {
    type Output = ExecResponse;
    const NAME: &'static str = "sandbox.exec";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::EXEC;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.request)
    }
}

/// Start a background process.
#[derive(Debug, Clone)]
pub struct StartProcess {
    pub sandbox: String,
    pub request: StartProcessRequest,
}

impl Operation for StartProcess {
    type Output = ProcessInfo;
    const NAME: &'static str = "process.start";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::PROCESSES;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.request)
    }
}

/// The captured output of a background process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetProcessLogs {
    pub sandbox: String,
    pub process_id: u64,
}

impl Operation for GetProcessLogs {
    type Output = ProcessLogs;
    const NAME: &'static str = "process.logs";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::PROCESS_LOGS;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone(), self.process_id.to_string()]
    }
}

/// Send `signal` (default 9) to a background process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillProcess {
    pub sandbox: String,
    pub process_id: u64,
    pub signal: Option<i32>,
}

impl Operation for KillProcess {
    type Output = ();
    const NAME: &'static str = "process.kill";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::PROCESS_KILL;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone(), self.process_id.to_string()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&KillProcessRequest {
            signal: self.signal,
        })
    }
}

// ---- files ------------------------------------------------------------------------------

/// A path inside a sandbox, and who accesses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileTarget {
    pub sandbox: String,
    /// Absolute, or relative to the user's home; bytes, since names need not be UTF-8
    /// (ADR 0026).
    pub path: Vec<u8>,
    pub user: User,
}

impl FileTarget {
    pub fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }

    /// `path` (or `path_b64` when it is not UTF-8) and `user`, the query of every file
    /// route.
    pub fn query(&self) -> Vec<(&'static str, String)> {
        let path = match std::str::from_utf8(&self.path) {
            Ok(p) => ("path", p.to_string()),
            Err(_) => ("path_b64", encode_bytes(&self.path).0),
        };
        let mut q = vec![path];
        // Absent means the sandbox's default user (ADR 0160).
        if self.user != User::Default {
            q.push(("user", self.user.as_str().to_string()));
        }
        q
    }
}

/// Declares a file operation: a [`FileTarget`] and optionally one boolean flag that is a
/// query parameter when true.
macro_rules! file_op {
    ($(#[$doc:meta])* $name:ident => $out:ty, $audit:literal, $scope:ident, $method:ident, $path:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name(pub FileTarget);

        impl Operation for $name {
            type Output = $out;
            const NAME: &'static str = $audit;
            const SCOPE: Scope = Scope::$scope;
            const METHOD: HttpMethod = HttpMethod::$method;
            const PATH: &'static str = $path;
            fn path_values(&self) -> Vec<String> {
                self.0.path_values()
            }
            fn query(&self) -> Vec<(&'static str, String)> {
                self.0.query()
            }
        }
    };
    ($(#[$doc:meta])* $name:ident { $flag:ident } => $out:ty, $audit:literal, $scope:ident, $method:ident, $path:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            pub target: FileTarget,
            pub $flag: bool,
        }

        impl Operation for $name {
            type Output = $out;
            const NAME: &'static str = $audit;
            const SCOPE: Scope = Scope::$scope;
            const METHOD: HttpMethod = HttpMethod::$method;
            const PATH: &'static str = $path;
            fn path_values(&self) -> Vec<String> {
                self.target.path_values()
            }
            fn query(&self) -> Vec<(&'static str, String)> {
                let mut q = self.target.query();
                if self.$flag {
                    q.push((stringify!($flag), "true".into()));
                }
                q
            }
        }
    };
}

file_op!(
    /// A directory's entries.
    ListFiles => FileList, "file.list", SandboxesWrite, Get, routes::FILES_LIST);
file_op!(
    /// One entry.
    StatFile => FileEntry, "file.stat", SandboxesWrite, Get, routes::FILES_STAT);
file_op!(
    /// Make a directory; with `parents`, missing parents too and no error when it exists.
    Mkdir { parents } => (), "file.mkdir", SandboxesWrite, Post, routes::FILES_MKDIR);
file_op!(
    /// Remove a file; with `recursive`, a directory and everything in it.
    RemoveFile { recursive } => (), "file.remove", SandboxesWrite, Delete, routes::FILES);

// ---- images -------------------------------------------------------------------------------

/// The known images.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListImages;

impl Operation for ListImages {
    type Output = ImageList;
    const NAME: &'static str = "image.list";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::IMAGES;
}

/// Register a root filesystem directory on the daemon's host as an image.
#[derive(Debug, Clone)]
pub struct AddImage(pub AddImageRequest);

impl Operation for AddImage {
    type Output = Image;
    const NAME: &'static str = "image.add";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::IMAGES;
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_query_parameters_only_when_set() {
        let target = FileTarget {
            sandbox: "b".into(),
            path: "/tmp/x".into(),
            user: User::Root,
        };
        let op = RemoveFile {
            target: target.clone(),
            recursive: true,
        };
        assert_eq!(
            op.query(),
            vec![
                ("path", "/tmp/x".to_string()),
                ("user", "root".to_string()),
                ("recursive", "true".to_string())
            ]
        );
        let op = Mkdir {
            target,
            parents: false,
        };
        assert_eq!(op.query().len(), 2);
    }

    #[test]
    fn every_operation_path_is_a_shared_route() {
        for path in [
            CreateSandbox::PATH,
            GetSandbox::PATH,
            DeleteSandbox::PATH,
            StartSandbox::PATH,
            Exec::PATH,
            GetProcessLogs::PATH,
            KillProcess::PATH,
            RemoveFile::PATH,
            ListFiles::PATH,
            AddImage::PATH,
        ] {
            assert!(routes::ALL.contains(&path), "{path}");
        }
    }
}
