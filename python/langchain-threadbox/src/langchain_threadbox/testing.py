"""A scripted chat model: run graphs and agents without an LLM or an API key.

It is deterministic and stateless (it only looks at the conversation), so a graph
resumed in another process continues the same script.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict

__all__ = ["ScriptRule", "ScriptedChatModel", "call"]


def call(name: str, **args: Any) -> dict[str, Any]:
    """A tool call for a script step: ``call("run_python", code="print(1)")``."""
    return {"name": name, "args": args}


@dataclass
class ScriptRule:
    """When the latest user message contains ``match``, play ``steps``.

    Each step is a list of tool calls issued in one AI message; the next step is
    issued after the tool results come back. When the steps are used up the model
    answers ``final`` (``{last}`` is replaced by the last tool result), or the text
    returned by ``final`` when it is a callable taking the messages.
    """

    match: str
    steps: list[list[dict[str, Any]]] = field(default_factory=list)
    final: str | Callable[[Sequence[BaseMessage]], str] = "Done.\n{last}"


class ScriptedChatModel(BaseChatModel):
    """A chat model that follows :class:`ScriptRule` s instead of thinking.

    Example:
        >>> model = ScriptedChatModel(rules=[ScriptRule("primes", [[call("run_python", code="print(2)")]])])
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rules: list[ScriptRule]
    fallback: str = "I have no script for that."

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        """Tools are ignored: the script already names them."""
        return self

    def next_message(self, messages: Sequence[BaseMessage]) -> AIMessage:
        """The AI message the script produces after ``messages``."""
        h = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
        text = str(messages[h].content) if h >= 0 else ""
        rule = next((r for r in self.rules if r.match in text), None)
        if rule is None:
            return AIMessage(content=self.fallback)
        after = messages[h + 1 :]
        k = sum(1 for m in after if isinstance(m, AIMessage) and m.tool_calls)
        if k < len(rule.steps):
            return AIMessage(
                content="",
                tool_calls=[
                    {"name": tc["name"], "args": dict(tc["args"]), "id": f"call_{uuid.uuid4().hex[:12]}"}
                    for tc in rule.steps[k]
                ],
            )
        if callable(rule.final):
            return AIMessage(content=rule.final(messages))
        last = next((m for m in reversed(after) if isinstance(m, ToolMessage)), None)
        return AIMessage(content=rule.final.replace("{last}", str(last.content) if last is not None else ""))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.next_message(messages))])
