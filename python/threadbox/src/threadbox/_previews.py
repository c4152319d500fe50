"""Port previews (``sb.previews``): a port of the sandbox as a URL through the daemon.

:class:`Previews` (sync) and :class:`AsyncPreviews` are thin over the REST routes
``/v1/sandboxes/{id}/previews``.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from ._models import PreviewInfo

if TYPE_CHECKING:
    from ._async import AsyncSandbox
    from ._sync import Sandbox


def create_body(port: int, public: bool) -> dict[str, Any]:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError("port must be an int in 1..65535")
    return {"port": port, "public": bool(public)}


class Previews:
    """The published ports of a sandbox (``sb.previews``)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def create(self, port: int, *, public: bool = False) -> PreviewInfo:
        """Publishes ``port`` (a server may listen on 127.0.0.1 inside); private unless
        ``public``. Publishing a port again replaces its token."""
        data = self._sb.client._json("POST", self._sb._path("previews"), json_body=create_body(port, public))
        return PreviewInfo.from_dict(data)

    def list(self) -> builtins.list[PreviewInfo]:
        data = self._sb.client._json("GET", self._sb._path("previews"))
        return [PreviewInfo.from_dict(d) for d in data.get("previews", [])]

    def delete(self, port: int) -> None:
        """Unpublishes ``port``: its URL answers 404, its token and cookies are void."""
        self._sb.client._send("DELETE", self._sb._path("previews", str(int(port))))


class AsyncPreviews:
    """The async twin of :class:`Previews`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def create(self, port: int, *, public: bool = False) -> PreviewInfo:
        data = await self._sb.client._json("POST", self._sb._path("previews"), json_body=create_body(port, public))
        return PreviewInfo.from_dict(data)

    async def list(self) -> builtins.list[PreviewInfo]:
        data = await self._sb.client._json("GET", self._sb._path("previews"))
        return [PreviewInfo.from_dict(d) for d in data.get("previews", [])]

    async def delete(self, port: int) -> None:
        await self._sb.client._send("DELETE", self._sb._path("previews", str(int(port))))
