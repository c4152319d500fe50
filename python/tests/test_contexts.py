"""Persistent interpreter contexts through the SDK, against a live daemon (issue 15)."""

from __future__ import annotations

from conftest import Names

from threadbox import AsyncThreadbox, Threadbox

PNG_CLASS = """
class Pic:
    def _repr_png_(self):
        return b'\\x89PNG\\r\\n\\x1a\\n'
    def _repr_html_(self):
        return '<b>pic</b>'
Pic()
"""


def test_context_keeps_variables_and_reports_results(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("ctx"))
    ctx = sb.contexts.create("analysis")
    assert ctx.info.created
    assert sb.contexts.get_or_create("analysis").id == ctx.id
    assert ctx.run("data = [3, 1, 2]").text is None
    r = ctx.run("sorted(data)")
    assert r.status == "ok"
    assert r.text == "[1, 2, 3]"
    assert r.execution_count == 2

    r = ctx.run("print('p'); display(1)\nPic = None\n" + PNG_CLASS)
    assert r.stdout == "p\n"
    assert [o.text for o in r.results if not o.is_main_result] == ["1"]
    main = r.results[-1]
    assert main.is_main_result and main.png == b"\x89PNG\r\n\x1a\n" and main.html == "<b>pic</b>"
    assert r.images == [b"\x89PNG\r\n\x1a\n"]

    r = ctx.run("undefined_name")
    assert r.status == "exception"
    assert r.error is not None and r.error.name == "NameError"
    assert "undefined_name" in r.error.traceback

    r = ctx.run("import time\ntime.sleep(60)", timeout=1)
    assert r.status == "timed_out"
    assert not r.context_restarted
    assert ctx.run("len(data)").text == "3"

    assert ctx.interrupt() is False
    info = ctx.restart()
    assert info.generation == 2
    assert ctx.run("'data' in globals()").text == "False"
    assert [c.id for c in sb.contexts.list()] == [ctx.id]
    ctx.delete()
    assert sb.contexts.list() == []
    # The shortcut: the `python` context is made on first use.
    first = sb.run_code("v = 6")
    assert first.context_created
    assert sb.run_code("v * 7").text == "42"
    sb.delete()


async def test_async_context(atb: AsyncThreadbox, names: Names) -> None:
    sb = await atb.create(names.new("actx"))
    ctx = await sb.contexts.create("a")
    await ctx.run("x = 41")
    r = await ctx.run("x + 1")
    assert r.text == "42"
    assert (await sb.run_code("1 + 1")).text == "2"
    await ctx.delete()
    await sb.delete()
