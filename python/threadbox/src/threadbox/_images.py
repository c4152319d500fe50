"""Images of the daemon's catalog (issue 14): ``tb.images.pull()``, ``list()``,
``remove()``, ``import_archive()``, for the sync and the async client.

A pull's answer is an NDJSON stream of events (``resolved``, ``progress``, ``layer``,
then ``done`` or ``error``); ``on_progress`` hears each one as a dict.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from ._errors import ProtocolError, error_from_code
from ._models import ImageInfo

if TYPE_CHECKING:
    from ._async import AsyncThreadbox
    from ._sync import Threadbox

__all__ = ["AsyncImages", "Images"]

ProgressFn = Callable[[dict[str, Any]], None]

#: Pulls and imports take as long as the image takes: no read timeout (a layer being
#: unpacked sends nothing for a while).
_LONG = httpx.Timeout(None, connect=10.0)


def _pull_body(
    reference: str,
    name: str | None,
    platform: str | None,
    username: str | None,
    password: str | None,
    insecure: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {"reference": reference, "insecure": insecure}
    for k, v in (("name", name), ("platform", platform), ("username", username), ("password", password)):
        if v is not None:
            body[k] = v
    return body


def _event(line: str) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        ev = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"bad image event from daemon: {line[:200]!r}") from e
    if not isinstance(ev, dict):
        raise ProtocolError(f"bad image event from daemon: {line[:200]!r}")
    return ev


def _final(ev: dict[str, Any]) -> ImageInfo | None:
    kind = ev.get("event")
    if kind == "done":
        return ImageInfo.from_dict(ev.get("image") or {})
    if kind == "error":
        raise error_from_code(str(ev.get("code", "internal")), str(ev.get("message", "")), path="/v1/images/pull")
    return None


def _image_path(name: str) -> str:
    return "/v1/images/" + quote(name, safe="")


class Images:
    """The image catalog of a :class:`~threadbox.Threadbox` (``tb.images``)."""

    def __init__(self, client: Threadbox) -> None:
        self._c = client

    def pull(
        self,
        reference: str,
        *,
        name: str | None = None,
        platform: str | None = None,
        username: str | None = None,
        password: str | None = None,
        insecure: bool = False,
        on_progress: ProgressFn | None = None,
    ) -> ImageInfo:
        """Pulls ``reference`` (``python:3.12-slim``, ``localhost:5000/app@sha256:…``)
        into the catalog as ``name`` (default: the reference). Needs an admin key."""
        body = _pull_body(reference, name, platform, username, password, insecure)
        resp = self._c._send("POST", "/v1/images/pull", json_body=body, stream=True, timeout=_LONG)
        try:
            for line in resp.iter_lines():
                ev = _event(line)
                if ev is None:
                    continue
                if on_progress is not None:
                    on_progress(ev)
                img = _final(ev)
                if img is not None:
                    return img
        finally:
            resp.close()
        raise ProtocolError("the pull's stream ended without `done` or `error`")

    def list(self) -> builtins.list[ImageInfo]:
        """Every image of the catalog."""
        data = self._c._json("GET", "/v1/images")
        return [ImageInfo.from_dict(i) for i in (data or {}).get("images", [])]

    def import_archive(self, path: str, *, name: str | None = None, platform: str | None = None) -> ImageInfo:
        """Imports a ``docker save`` archive or an OCI layout at ``path`` on the
        daemon's host."""
        body: dict[str, Any] = {"path": path}
        if name is not None:
            body["name"] = name
        if platform is not None:
            body["platform"] = platform
        return ImageInfo.from_dict(self._c._json("POST", "/v1/images/import", json_body=body, timeout=_LONG))

    def remove(self, name: str) -> None:
        """Removes an image (``ConflictError`` while a sandbox uses it)."""
        self._c._json("DELETE", _image_path(name))


class AsyncImages:
    """The image catalog of an :class:`~threadbox.AsyncThreadbox` (``tb.images``)."""

    def __init__(self, client: AsyncThreadbox) -> None:
        self._c = client

    async def pull(
        self,
        reference: str,
        *,
        name: str | None = None,
        platform: str | None = None,
        username: str | None = None,
        password: str | None = None,
        insecure: bool = False,
        on_progress: ProgressFn | None = None,
    ) -> ImageInfo:
        """See :meth:`Images.pull`."""
        body = _pull_body(reference, name, platform, username, password, insecure)
        resp = await self._c._send("POST", "/v1/images/pull", json_body=body, stream=True, timeout=_LONG)
        try:
            async for line in resp.aiter_lines():
                ev = _event(line)
                if ev is None:
                    continue
                if on_progress is not None:
                    on_progress(ev)
                img = _final(ev)
                if img is not None:
                    return img
        finally:
            await resp.aclose()
        raise ProtocolError("the pull's stream ended without `done` or `error`")

    async def list(self) -> builtins.list[ImageInfo]:
        """Every image of the catalog."""
        data = await self._c._json("GET", "/v1/images")
        return [ImageInfo.from_dict(i) for i in (data or {}).get("images", [])]

    async def import_archive(self, path: str, *, name: str | None = None, platform: str | None = None) -> ImageInfo:
        """See :meth:`Images.import_archive`."""
        body: dict[str, Any] = {"path": path}
        if name is not None:
            body["name"] = name
        if platform is not None:
            body["platform"] = platform
        return ImageInfo.from_dict(await self._c._json("POST", "/v1/images/import", json_body=body, timeout=_LONG))

    async def remove(self, name: str) -> None:
        """See :meth:`Images.remove`."""
        await self._c._json("DELETE", _image_path(name))
