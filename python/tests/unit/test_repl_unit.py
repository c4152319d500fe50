"""Offline tests of the ``PythonREPLTool`` drop-in and ``reset_python`` (issue 15): the
name, argument and input cleaning of ``langchain_experimental``'s tool, and the toolkit's
tool list. Against a daemon: ``tests/test_python_repl.py``."""

from __future__ import annotations

import pytest
from langchain_core.tools import BaseTool

from langchain_threadbox import PythonREPLTool, ThreadboxToolkit
from langchain_threadbox.repl import sanitize_input
from threadbox import Threadbox


def test_same_name_argument_and_description_style_as_langchain() -> None:
    tool = PythonREPLTool(client=Threadbox(url="http://127.0.0.1:9"))
    assert isinstance(tool, BaseTool)
    assert tool.name == "Python_REPL"
    assert list(tool.args) == ["query"]
    assert tool.description.startswith("A Python shell. Use this to execute python commands.")
    assert tool.response_format == "content_and_artifact"
    assert tool.toolkit.stateful


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("```python\nprint(1)\n```", "print(1)"),
        ("  `x = 2`  ", "x = 2"),
        ("Python print('a')", "print('a')"),
        ("df.describe()", "df.describe()"),
    ],
)
def test_query_is_cleaned_as_the_original_does(raw: str, clean: str) -> None:
    assert sanitize_input(raw) == clean


def test_needs_a_stateful_toolkit() -> None:
    tb = Threadbox(url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="stateful"):
        PythonREPLTool(toolkit=ThreadboxToolkit(client=tb))
    with pytest.raises(TypeError):
        PythonREPLTool(toolkit=ThreadboxToolkit(client=tb, stateful=True), timeout=5)


def test_reset_python_only_in_the_stateful_toolkit() -> None:
    tb = Threadbox(url="http://127.0.0.1:9")
    stateless = [t.name for t in ThreadboxToolkit(client=tb).get_tools()]
    assert "reset_python" not in stateless and len(stateless) == 5
    stateful = [t.name for t in ThreadboxToolkit(client=tb, stateful=True).get_tools()]
    assert stateful[-1] == "reset_python" and len(stateful) == 6
    reset = ThreadboxToolkit(client=tb, stateful=True, name_prefix="sb_").get_tools(["reset_python"])[0]
    assert reset.name == "sb_reset_python" and reset.args == {}
    with pytest.raises(ValueError, match="reset_python"):
        ThreadboxToolkit(client=tb).get_tools(["reset_python"])


def test_a_recreated_context_is_told_to_the_model() -> None:
    from langchain_threadbox._code import format_execution
    from threadbox._interp import ContextInfo, Execution

    wire = {
        "execution_id": "exe-1",
        "context_id": "ctx-2",
        "execution_count": 1,
        "status": "exception",
        "exception": {"name": "NameError", "value": "name 'df' is not defined", "traceback": "NameError\n"},
        "context_created": True,
        "context_recreated": True,
        "lost_reason": "stopped",
    }
    ex = Execution.from_dict(wire)
    assert ex.context_recreated and ex.lost_reason == "stopped"
    text, artifact = format_execution(ex, max_chars=10_000, timeout=30)
    assert isinstance(text, str)
    assert "lost (stopped) and made again" in text
    assert artifact["context_recreated"] is True
    # Without the flag nothing is said about it.
    plain, _ = format_execution(Execution.from_dict({**wire, "context_recreated": False}), max_chars=10_000, timeout=30)
    assert "lost" not in str(plain)
    info = ContextInfo.from_dict({"id": "ctx-2", "name": "js", "recreated": True, "lost_reason": "stopped"})
    assert info.recreated and info.lost_reason == "stopped"
