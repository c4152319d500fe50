"""What the sync and async handles share besides I/O: their metadata accessors.

``Sandbox``/``AsyncSandbox`` and ``Process``/``AsyncProcess`` differ only in how
they send (ADR 0071); the properties read from the last known ``info`` live here.
"""

from __future__ import annotations

from . import _common as c
from ._models import ProcessInfo, SandboxInfo


class SandboxView:
    """Metadata of a sandbox handle, as of the last call that returned it."""

    info: SandboxInfo
    created: bool
    """True when the call that returned this handle created the sandbox."""
    on_exit: c.OnExit

    def _init_view(self, info: SandboxInfo, created: bool, on_exit: c.OnExit) -> None:
        self.info = info
        self.created = created
        self.on_exit = on_exit

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, name={self.name!r}, state={self.state!r})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def name(self) -> str | None:
        return self.info.name

    @property
    def state(self) -> str:
        """State as of the last call that returned metadata (see ``refresh``)."""
        return self.info.state

    @property
    def labels(self) -> dict[str, str]:
        return self.info.labels

    def _path(self, *rest: str) -> str:
        return c.sandbox_path(self.id, *rest)


class ProcessView:
    """Metadata of a background process handle."""

    info: ProcessInfo

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id}, pid={self.info.pid}, running={self.info.running})"

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def pid(self) -> int:
        return self.info.pid

    @property
    def running(self) -> bool:
        return self.info.running

    @property
    def exit_code(self) -> int | None:
        return self.info.exit_code
