"""Persistent interpreter contexts through the SDK, against a live daemon (issue 15)."""

from __future__ import annotations

from conftest import Names

from threadbox import AsyncThreadbox, CodeEvent, Threadbox

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


STREAMED = """
import subprocess, sys
print('one', flush=True)
subprocess.run([sys.executable, '-c', 'print("two")'])
display(3)
4
"""


def test_run_streams_events_and_folds_the_same_execution(tb: Threadbox, names: Names) -> None:
    sb = tb.create(names.new("ctxs"))
    seen: list[CodeEvent] = []
    r = sb.run_code(STREAMED, on_output=seen.append)
    kinds = [e.type for e in seen]
    assert kinds[0] == "stdout" and kinds[-1] == "result", kinds
    assert kinds.index("display") < kinds.index("result")
    assert "".join(e.text or "" for e in seen if e.type == "stdout") == "one\ntwo\n"
    assert r.status == "ok" and r.stdout == "one\ntwo\n" and r.text == "4"
    assert [o.text for o in r.results] == ["3", "4"]
    assert r.execution_id.startswith("exe-")
    # The kept execution replays the same events.
    again: list[CodeEvent] = []
    ctx = sb.contexts.list()[0]
    replayed = ctx.attach(r.execution_id, on_output=again.append)
    assert [e.raw for e in again] == [e.raw for e in seen]
    assert replayed.text == "4" and replayed.stdout == r.stdout
    # An exception is an event and a result, not an error of the call.
    errs: list[CodeEvent] = []
    r = sb.run_code("1/0", on_output=errs.append)
    assert r.status == "exception" and r.error is not None and r.error.name == "ZeroDivisionError"
    assert [e.type for e in errs] == ["exception"]
    sb.delete()


async def test_async_run_streams(atb: AsyncThreadbox, names: Names) -> None:
    sb = await atb.create(names.new("actxs"))
    seen: list[CodeEvent] = []
    r = await sb.run_code("print('a')\n5", on_output=seen.append)
    assert {e.type for e in seen} == {"stdout", "result"} and seen[-1].type == "result"
    assert r.stdout == "a\n" and r.text == "5"
    await sb.delete()
