//! The command line, as documented in INTERFACES.md.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "threadbox",
    version,
    about = "Self-hosted sandboxes for AI agents",
    long_about = "Self-hosted sandboxes for AI agents.\n\n\
        Start the daemon with `threadbox serve`; every other command is a client of it. \
        The daemon is found through --url, else THREADBOX_URL, else the local socket \
        <THREADBOX_ROOT or /var/lib/threadbox>/threadbox.sock, else http://127.0.0.1:7420. \
        THREADBOX_API_KEY is sent as a bearer token when set; THREADBOX_TENANT makes the \
        operator (or an admin key) act for that tenant.",
    propagate_version = true
)]
pub struct Cli {
    /// Daemon URL: unix:///path/to/threadbox.sock or http://host:port.
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve(ServeArgs),
    /// Create a sandbox (or return the existing one of that name); prints its id.
    Create(CreateArgs),
    /// List sandboxes.
    Ls(LsArgs),
    /// Show one sandbox.
    Info(SandboxJson),
    /// Run a command in a sandbox and wait for it; exits with its exit code.
    Exec(ExecArgs),
    /// An interactive terminal in a sandbox (like `docker exec -it`); exits with the
    /// program's exit code.
    Shell(crate::shell_cmd::ShellArgs),
    /// Run code in a persistent interpreter context of a sandbox (variables survive
    /// between calls); prints output, the last expression's value, images as files.
    #[command(alias = "run-code")]
    Run(crate::code_cmd::RunCodeArgs),
    /// Freeze a sandbox: its processes keep their memory but use no CPU.
    Pause(SandboxJson),
    /// Freeze a sandbox and push its memory out of RAM (to swap): no CPU, next to no
    /// memory; any call wakes it with its processes where they were.
    Hibernate(SandboxJson),
    /// Thaw a paused or hibernated sandbox.
    Resume(SandboxJson),
    /// Stop a sandbox's processes; its disk is kept.
    Stop(SandboxJson),
    /// Boot a stopped sandbox again on its disk.
    Start(SandboxJson),
    /// Delete a sandbox and its disk.
    Rm(RmArgs),
    /// Files inside a sandbox.
    #[command(subcommand)]
    Files(FilesCommand),
    /// List a sandbox's background processes.
    Ps(SandboxJson),
    /// Start a background process in a sandbox; prints its id.
    Spawn(SpawnArgs),
    /// Show the captured output of a background process.
    Logs(LogsArgs),
    /// Send a signal to a background process.
    Kill(KillArgs),
    /// Run the isolation checks inside a sandbox; exits 1 if any fails.
    Selftest(SandboxJson),
    /// The daemon's isolation tiers: available or why not, kernel, capabilities.
    Tiers(JsonFlag),
    /// Root filesystem images.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Print the daemon's OpenAPI document (no daemon needed).
    Openapi,
    /// API keys (admin).
    #[command(subcommand)]
    Keys(crate::gov_cmd::KeysCommand),
    /// Per-tenant quotas and spend caps (admin).
    #[command(subcommand)]
    Quota(crate::gov_cmd::QuotaCommand),
    /// A sandbox's egress policy.
    #[command(subcommand)]
    Net(crate::net_cmd::NetCommand),
    /// Secrets the sandbox never holds: set (value from stdin), ls, rm.
    #[command(subcommand)]
    Secret(crate::secret_cmd::SecretCommand),
    /// A port of a sandbox as a URL through the daemon (private unless --public).
    Preview(crate::preview_cmd::PreviewArgs),
    /// Checkpoint a sandbox's disk (frozen for the instant); `checkpoint rm SB CK` deletes one.
    Checkpoint(crate::ckpt_cmd::CheckpointArgs),
    /// List a sandbox's checkpoints (size, parent, label, time).
    Checkpoints(crate::ckpt_cmd::CheckpointsArgs),
    /// Return a sandbox's disk to a checkpoint; its processes are restarted on it.
    Rewind(crate::ckpt_cmd::RewindArgs),
    /// New running sandboxes with a sandbox's files, limits, image, network and labels.
    Fork(crate::ckpt_cmd::ForkArgs),
    /// Templates: named disks new sandboxes start from (`create --template NAME`).
    #[command(subcommand)]
    Template(crate::template_cmd::TemplateCommand),
    /// Metered use: CPU-seconds, memory GiB-seconds, disk, running/paused time.
    Usage(crate::gov_cmd::UsageArgs),
    /// The hash-chained audit log (admin).
    #[command(subcommand)]
    Audit(crate::gov_cmd::AuditCommand),
    /// Serve the sandbox tools over MCP on stdin/stdout, calling the daemon (for Claude
    /// Desktop, MultiServerMCPClient and other MCP clients).
    #[command(
        long_about = "Serve the sandbox tools over MCP (Model Context Protocol) on \
        stdin/stdout. Each tool call goes to the daemon found through --url, THREADBOX_URL \
        or the local socket, authenticated with THREADBOX_API_KEY when set. The daemon \
        also serves the same tools over Streamable HTTP at /mcp."
    )]
    Mcp,
    /// Internal: the single-threaded jail launch helper (dispatched before parsing).
    #[command(name = "__jail-launch", hide = true)]
    JailLaunch,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Root of the daemon's state.
    #[arg(long, env = "THREADBOX_ROOT", value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// TCP address to listen on [default: 127.0.0.1:7420]; TCP clients need an API key.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// JSON configuration file: {"root", "listen", "agent", "max_upload", "warm_pool", "staged_pool", "max_disk_bytes", "allowed_hosts", "allowed_origins"}; flags win.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The threadbox-agent binary [default: threadbox-agent next to this binary].
    #[arg(long, env = "THREADBOX_AGENT", value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// Largest accepted file upload, e.g. 1G, 512M [default: 1G].
    #[arg(long, value_name = "SIZE")]
    pub max_upload: Option<String>,
    /// Largest disk one sandbox may ask for (`limits.disk_bytes`), e.g. 100G; also caps
    /// the default of 10G [default: 100G].
    #[arg(long, value_name = "SIZE")]
    pub max_disk_bytes: Option<String>,
    /// Keep N sandboxes of the default image and limits booted ahead of time, so a
    /// create they satisfy returns at once (hostname = sandbox id) [default: 0].
    #[arg(long, value_name = "N")]
    pub warm_pool: Option<usize>,
    /// Also keep N sandboxes of a template warm: [TENANT/]NAME=N (repeatable; tenant
    /// `default` unless given). A create with that template takes one.
    #[arg(long, value_name = "[TENANT/]NAME=N")]
    pub warm_pool_template: Vec<String>,
    /// Keep N staged slots for forks: sandboxes booted up to the point where their disk
    /// is needed (no disk of anyone's is in them), so a fork only attaches its disk clone
    /// [default: 0].
    #[arg(long, value_name = "N")]
    pub staged_pool: Option<usize>,
    /// Open a private range to sandbox egress (repeatable), e.g. 10.1.0.0/16 for a LAN
    /// service; a tenant's policy must still allow it. The daemon's ports stay closed.
    #[arg(long, value_name = "CIDR")]
    pub egress_allow_private: Vec<String>,
    /// Static names for sandbox DNS: lines `IP NAME...` (hosts(5) format), asked first.
    #[arg(long, value_name = "FILE")]
    pub egress_hosts: Option<PathBuf>,
    /// Upstream DNS servers the daemon asks for allowed names (repeatable, IP:PORT)
    /// [default: the host's /etc/resolv.conf].
    #[arg(long, value_name = "ADDR")]
    pub egress_dns: Vec<String>,
    /// A CA (PEM file) that upstreams of hosts named by secrets may also be signed by,
    /// besides the host's roots (repeatable; e.g. a company CA, or a test upstream's).
    #[arg(long, value_name = "FILE")]
    pub egress_upstream_ca: Vec<PathBuf>,
    /// Domain of preview URLs, `{port}-{id}.DOMAIN` (it and its subdomains must reach
    /// this daemon: a wildcard DNS record) [default: localhost, which browsers resolve to
    /// loopback by themselves]. The path form `/preview/{id}/{port}/` works without it.
    #[arg(long, value_name = "DOMAIN")]
    pub preview_domain: Option<String>,
    /// Where the root's file system cannot reflink (ext4), keep sandbox disks on a sparse
    /// xfs image `ROOT/store.xfs` mounted on `ROOT/sandboxes`, so checkpoints and forks
    /// copy nothing: `auto`; `off` copies instead (ADR 0101) [default: auto].
    #[arg(long, value_name = "auto|off", env = "THREADBOX_STORE_IMAGE")]
    pub store_image: Option<threadbox_jail::store::StoreMode>,
    /// Size of the store image when it is made, e.g. 200G; a larger size on a later start
    /// grows it [default: the size of the file system holding the root].
    #[arg(long, value_name = "SIZE")]
    pub store_size: Option<String>,
    /// Serve TCP WITHOUT API keys: every TCP client acts as the operator. Loopback
    /// addresses only; logged loudly at start. Without it, TCP requires a key.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Let sandboxes run WITHOUT Landlock where the kernel cannot enforce it (by default
    /// they refuse to start). `selftest` and sandbox info then show the missing layer.
    #[arg(long)]
    pub insecure_allow_no_landlock: bool,
    /// gVisor's runsc for the `gvisor` tier (default: `runsc` on PATH). Without one the
    /// tier refuses creates, saying why.
    #[arg(long, env = "THREADBOX_RUNSC", value_name = "PATH")]
    pub runsc: Option<PathBuf>,
    /// Also accept this Host header on TCP (every route, /mcp included; repeatable; `*`
    /// accepts any): a hostname (any port) or host:port. localhost, 127.0.0.1, ::1 and the
    /// --listen address are always accepted. Old name: --mcp-allowed-host.
    #[arg(long = "allowed-host", alias = "mcp-allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Accept browser requests (any route) carrying this Origin, e.g.
    /// https://app.example.com:443 (repeatable; `*` accepts any). Requests without an
    /// Origin always pass; with one not listed they are refused. Old name:
    /// --mcp-allowed-origin.
    #[arg(
        long = "allowed-origin",
        alias = "mcp-allowed-origin",
        value_name = "ORIGIN"
    )]
    pub allowed_origins: Vec<String>,
    /// Export traces over OTLP/HTTP to this base URL, e.g. http://127.0.0.1:4318
    /// (`/v1/traces` is appended). Also OTEL_EXPORTER_OTLP_ENDPOINT; unset: no traces.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TtlActionArg {
    Stop,
    Delete,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    Creating,
    Running,
    Paused,
    Hibernated,
    Stopped,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Unique name; an existing name returns that sandbox (get-or-create).
    #[arg(long)]
    pub name: Option<String>,
    /// Label K=V (repeatable).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Image name [default: host].
    #[arg(long)]
    pub image: Option<String>,
    /// Memory limit: 512M, 1G, 1.5G, 64MiB or a number of bytes.
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// CPU limit in cores, e.g. 0.5 or 2.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Maximum number of processes and threads.
    #[arg(long, value_name = "N")]
    pub pids: Option<u32>,
    /// Size of the sandbox's writable disk: 1G, 512M... [default: 10G].
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// Pause after this many seconds without API activity.
    #[arg(long, value_name = "SECS")]
    pub idle_pause: Option<u64>,
    /// Stop after this many seconds without API activity (files are kept).
    #[arg(long, value_name = "SECS")]
    pub idle_stop: Option<u64>,
    /// Hibernate after this many seconds without API activity (memory to swap; the next
    /// call wakes it). Longer than --idle-pause, shorter than --idle-stop.
    #[arg(long, value_name = "SECS")]
    pub idle_hibernate: Option<u64>,
    /// Stop (or delete, see --ttl-action) this many seconds after creation.
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u64>,
    /// What the TTL does.
    #[arg(long, value_enum, value_name = "ACTION")]
    pub ttl_action: Option<TtlActionArg>,
    /// Isolation tier: jail or gvisor [default: jail] (`threadbox tiers` lists them).
    #[arg(long, value_name = "TIER")]
    pub tier: Option<String>,
    /// Egress to allow: HOST[:PORTS], *.SUFFIX[:PORTS], CIDR[:PORTS] or a preset
    /// (python-packages, npm, github, rust-crates). Repeatable; without it the sandbox
    /// reaches nothing outside itself.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// A secret of the tenant the sandbox may use (repeatable): env NAME holds a
    /// placeholder the daemon swaps for the value only on requests to the secret's host.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Open an OTLP/HTTP endpoint inside (127.0.0.1:4318, in OTEL_EXPORTER_OTLP_ENDPOINT)
    /// whose spans the daemon forwards to its collector (needs serve --otlp-endpoint)
    #[arg(long)]
    pub otlp_relay: bool,
    /// Start from a template (name or id): its disk is cloned, and its image, limits,
    /// labels and network policy are the defaults of the flags not given.
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// Print the sandbox as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only sandboxes with label K=V (repeatable: all must match).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Only sandboxes in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Print {"sandboxes": [...]} as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct JsonFlag {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SandboxJson {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Kill the command's whole process tree after this many seconds (exit code 124).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Environment variable K=V (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox [default: the user's home].
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// `user` (uid 1000, default) or `root`.
    #[arg(long, short = 'u', value_name = "NAME")]
    pub user: Option<String>,
    /// Send all of this command's stdin to the process.
    #[arg(long)]
    pub stdin: bool,
    /// Wait for the end and print the result as one JSON document (exit status 0 when
    /// the call succeeded; the process's code is in `exit_code`).
    #[arg(long)]
    pub json: bool,
    /// Bound on captured stdout and stderr, each (e.g. 1M).
    #[arg(long, value_name = "SIZE")]
    pub max_output: Option<String>,
    /// Copy the output to a terminal unfiltered. By default, output bound for a terminal
    /// loses its title (OSC 0/1/2) and clipboard (OSC 52) escape sequences; pipes and
    /// --json are never filtered.
    #[arg(long)]
    pub raw: bool,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Delete even when it is running.
    #[arg(long, short = 'f')]
    pub force: bool,
}

#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// List a directory.
    Ls(FileJsonArgs),
    /// Write a file's raw bytes to stdout.
    Read(FileReadArgs),
    /// Replace a file with the raw bytes of stdin.
    Write(FileArgs),
    /// Create a directory.
    Mkdir(MkdirArgs),
    /// Remove a file (or, with -r, a directory tree).
    Rm(FileRmArgs),
    /// Show one file's metadata.
    Stat(FileJsonArgs),
}

#[derive(Debug, Args)]
pub struct FileArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Path inside the sandbox.
    pub path: String,
    /// `user` (default) or `root`.
    #[arg(long, short = 'u', value_name = "NAME")]
    pub user: Option<String>,
}

#[derive(Debug, Args)]
pub struct FileReadArgs {
    #[command(flatten)]
    pub file: FileArgs,
    /// Copy the bytes to a terminal unfiltered (see `exec --raw`); a pipe or file
    /// always gets them unchanged.
    #[arg(long)]
    pub raw: bool,
    /// First byte to print (default 0); past the end of the file prints nothing.
    #[arg(long, value_name = "BYTES")]
    pub offset: Option<u64>,
    /// Print at most this many bytes (default: to the end of the file).
    #[arg(long, value_name = "BYTES")]
    pub length: Option<u64>,
}

#[derive(Debug, Args)]
pub struct FileJsonArgs {
    #[command(flatten)]
    pub file: FileArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct MkdirArgs {
    #[command(flatten)]
    pub file: FileArgs,
    /// Create missing parents; no error if it exists.
    #[arg(short = 'p', long)]
    pub parents: bool,
}

#[derive(Debug, Args)]
pub struct FileRmArgs {
    #[command(flatten)]
    pub file: FileArgs,
    /// Remove a directory and everything in it.
    #[arg(short = 'r', long)]
    pub recursive: bool,
}

#[derive(Debug, Args)]
pub struct SpawnArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Environment variable K=V (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// `user` (default) or `root`.
    #[arg(long, short = 'u', value_name = "NAME")]
    pub user: Option<String>,
    /// Print the process as JSON.
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Background process id (from `spawn` or `ps`).
    pub process_id: u64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Copy the output to a terminal unfiltered (see `exec --raw`).
    #[arg(long)]
    pub raw: bool,
}

#[derive(Debug, Args)]
pub struct KillArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Background process id (from `spawn` or `ps`).
    pub process_id: u64,
    /// Signal number or name (9, KILL, SIGTERM, ...) [default: 9].
    #[arg(long, short = 's', value_name = "SIGNAL")]
    pub signal: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Register a root filesystem directory on the daemon's host as an image.
    Add {
        /// Image name.
        name: String,
        /// Root filesystem directory.
        dir: PathBuf,
        /// Print the image as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List images.
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pull an OCI image from a registry (`python:3.12-slim`, `ghcr.io/o/r:tag`,
    /// `localhost:5000/app@sha256:…`).
    Pull(crate::image_cmd::PullArgs),
    /// Import a `docker save` archive or an OCI layout (directory or tar) on the daemon's
    /// host.
    Import(crate::image_cmd::ImportArgs),
    /// Remove an image (refused while a sandbox uses it); layers no other image uses go
    /// with it.
    Rm {
        /// Image name.
        name: String,
    },
}
