"""Python SDK for threadbox, a self-hosted sandbox service for AI agents.

Quick start::

    from threadbox import Threadbox

    tb = Threadbox()                      # THREADBOX_URL / THREADBOX_API_KEY
    with tb.create(name="demo") as sb:    # deleted at the end of the block
        r = sb.exec("python3 -c 'print(6*7)'", timeout=10)
        print(r.exit_code, r.stdout)
        sb.files.write("notes/hello.txt", b"hi")
        print(sb.files.read("notes/hello.txt"))
"""

from ._async import (
    AsyncExecStream,
    AsyncFiles,
    AsyncProcess,
    AsyncProcesses,
    AsyncSandbox,
    AsyncThreadbox,
)
from ._checkpoints import CheckpointInfo
from ._common import DEFAULT_URL, resolve_config
from ._errors import (
    Conflict,
    DaemonUnreachable,
    FileNotFound,
    InternalError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    PreconditionFailed,
    ProcessNotFound,
    ProtocolError,
    QuotaExceeded,
    SandboxNotFound,
    SandboxNotRunning,
    ThreadboxError,
    Unauthenticated,
    Unavailable,
)
from ._images import AsyncImages, Images
from ._interp import (
    AsyncCodeContext,
    AsyncContexts,
    CodeContext,
    CodeError,
    CodeEvent,
    ContextInfo,
    Contexts,
    Execution,
    Output,
)
from ._models import (
    EndEvent,
    ExecEvent,
    ExecResult,
    FileEntry,
    Health,
    ImageInfo,
    Limits,
    OutputEvent,
    PreviewInfo,
    ProcessInfo,
    ProcessLogs,
    SandboxInfo,
    SelftestCheck,
    SelftestReport,
    StartEvent,
)
from ._network import AsyncNetwork, NetLogPage, NetLogRecord, Network, NetworkInfo
from ._sync import ExecStream, Files, Process, Processes, Sandbox, Threadbox, default_client
from ._templates import AsyncTemplates, BuildStep, TemplateInfo, Templates

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL",
    "AsyncCodeContext",
    "AsyncContexts",
    "CodeContext",
    "CodeError",
    "CodeEvent",
    "ContextInfo",
    "Contexts",
    "Execution",
    "Output",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncThreadbox",
    "Conflict",
    "DaemonUnreachable",
    "EndEvent",
    "ExecEvent",
    "ExecResult",
    "ExecStream",
    "FileEntry",
    "FileNotFound",
    "Files",
    "Health",
    "ImageInfo",
    "Images",
    "AsyncImages",
    "Templates",
    "AsyncTemplates",
    "TemplateInfo",
    "BuildStep",
    "InternalError",
    "InvalidArgument",
    "Limits",
    "NotFound",
    "OutputEvent",
    "PayloadTooLarge",
    "PermissionDenied",
    "PreconditionFailed",
    "Network",
    "AsyncNetwork",
    "NetworkInfo",
    "NetLogPage",
    "NetLogRecord",
    "Process",
    "PreviewInfo",
    "ProcessInfo",
    "ProcessLogs",
    "ProcessNotFound",
    "Processes",
    "ProtocolError",
    "QuotaExceeded",
    "Sandbox",
    "SandboxInfo",
    "CheckpointInfo",
    "SandboxNotFound",
    "SandboxNotRunning",
    "SelftestCheck",
    "SelftestReport",
    "StartEvent",
    "Threadbox",
    "ThreadboxError",
    "Unauthenticated",
    "Unavailable",
    "default_client",
    "resolve_config",
]
