"""Tool calls through the target's own chat template: OpenAI's ``tools`` and ``tool_choice``
read and checked, the grammar a call must match, and the calls read back out of an answer.

The format is the one Qwen2.5's template teaches its model (Hermes's): each call is
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, where ``<tool_call>`` is one
control token of the vocabulary. ``read_tools(tools, tool_choice, names)`` checks OpenAI's
shapes (every refusal a ``UsageError`` whose message begins with the field, as the front end
spells it) and returns a ``Tools``; ``call_grammar`` is the GBNF of one or more calls of the
offered functions (each function's ``parameters`` a JSON schema, converted with
llama-cpp-python's converter); ``choice`` says how it applies: ``auto`` lazily (text stays free
until the model writes ``<tool_call>``), ``required`` and a named function from the first
token, ``none`` not at all (the tools are then not shown to the model). ``split_calls(text)``
is the answer's text before its first call and the calls in OpenAI's shape; an answer that
is one call as bare JSON (no tags: small models often answer so) is read as that call.
``HeldCalls`` streams an answer's text until its first call and holds the rest, so that a
front end sends the calls whole at the end. ``template_message(message, where)`` is an
OpenAI-style message as the chat template reads it (an assistant's earlier ``tool_calls``
with their arguments as objects, a ``tool`` message's result as text), each refusal a
``UsageError`` whose message begins with ``where``. ``tool_call_token(target, prompts)`` is
that token in the target's vocabulary, and ``answer_grammar`` the grammar an answer of a
loaded target must match.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localspec.backend.grammar import (
    GrammarError,
    check_grammar,
    compile_lazy,
    model_grammar,
    schema_grammar,
)
from localspec.errors import UsageError
from localspec.session.chat_template import ROLES

if TYPE_CHECKING:
    from localspec.backend.llama import LlamaLane
    from localspec.core.grammar import Grammar
    from localspec.session.prompts import Prompts

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 64
AUTO, NONE, REQUIRED = "auto", "none", "required"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)
BARE_STARTS = ("{", "```json")  # how an answer that is one bare call begins


@dataclass(frozen=True)
class Tools:
    """The functions offered (OpenAI's ``tools`` entries, as given) and the choice: ``auto``,
    ``none``, ``required`` or a function's name."""

    functions: tuple[dict[str, Any], ...]
    choice: str

    @property
    def shown(self) -> list[dict[str, Any]]:
        """The tools as the chat template is given them (none when the choice is none)."""
        return [] if self.choice == NONE else list(self.functions)

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.functions]

    @property
    def lazy(self) -> bool:
        """Whether text may come before a call (the grammar waits for ``<tool_call>``)."""
        return self.choice == AUTO


def _function(i: int, tool: Any, field: str) -> dict[str, Any]:
    where = f"{field}[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise UsageError(f'{where} must be {{"type": "function", "function": {{...}}}}')
    function = tool.get("function")
    if not isinstance(function, dict):
        raise UsageError(f"{where}.function must be an object with a name")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(f"{where}.function.name must be 1 to 64 letters, digits, _ . or -")
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, dict):
        raise UsageError(f"{where}.function.parameters must be a JSON schema object")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise UsageError(f"{where}.function.description must be text")
    return tool


def read_tools(tools: Any, tool_choice: Any, names: tuple[str, str] = ("tools", "tool_choice")
               ) -> Tools | None:  # fmt: skip
    """The request's tools, checked; None when it offers none."""
    field, choice_field = names
    if tools is None or tools == []:
        if tool_choice not in (None, NONE, AUTO):
            raise UsageError(f"{choice_field} needs {field}")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise UsageError(f"{field} must be a list of at most {MAX_TOOLS} functions")
    functions = tuple(_function(i, tool, field) for i, tool in enumerate(tools))
    names_given = [t["function"]["name"] for t in functions]
    if len(set(names_given)) != len(names_given):
        raise UsageError(f"{field}: two functions have the same name")
    choice = AUTO if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        named = choice.get("function") if choice.get("type") == "function" else None
        name = named.get("name") if isinstance(named, dict) else None
        if name not in names_given:
            raise UsageError(
                f'{choice_field} must name one of the tools: {{"type": "function", '
                f'"function": {{"name": ...}}}}'
            )
        choice = name
    elif choice not in (AUTO, NONE, REQUIRED):
        raise UsageError(f"{choice_field} must be auto, none, required or a named function")
    return Tools(functions, str(choice))


def call_grammar(tools: Tools, field: str = "tools") -> str:
    """GBNF of one or more calls (of the named function only, when the choice names one)."""
    offered = [t["function"] for t in tools.functions]
    if tools.choice not in (AUTO, NONE, REQUIRED):
        offered = [f for f in offered if f["name"] == tools.choice]
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters", {"type": "object"}),
            },
            "required": ["name", "arguments"],
        }
        for f in offered
    ]
    try:
        call = schema_grammar({"anyOf": calls} if len(calls) > 1 else calls[0])
    except GrammarError as e:
        raise UsageError(f"{field}: a function's parameters: {e}") from None
    # The converter's rule root is one call; the answer is calls between their tags.
    body = re.sub(r"^root ::=", "call ::=", call, flags=re.M)
    text = f'root ::= tool-call ("\\n" tool-call)*\ntool-call ::= "{OPEN}\\n" call "\\n{CLOSE}"\n'
    text += body
    try:
        check_grammar(text)
    except GrammarError as e:
        raise UsageError(f"{field}: {e}") from None
    return text


def _shaped(call: Any, index: int) -> dict[str, Any] | None:
    """A call as the model wrote it (``{"name", "arguments"}``) in OpenAI's shape."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", {})
    return {
        "id": f"call_{index}",
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(arguments)},
    }


def bare_call(text: str, names: Collection[str]) -> dict[str, Any] | None:
    """An answer that is nothing but one call written without its tags, as JSON (in a
    ``json`` code block or not), naming one of ``names`` with an object of arguments:
    small models asked with tools often answer so."""
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    try:
        call = json.loads(fenced.group(1) if fenced else body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
        return None
    if call["name"] not in names or not isinstance(call["arguments"], dict):
        return None
    return _shaped(call, 0)


def split_calls(text: str, names: Collection[str] = ()) -> tuple[str, list[dict[str, Any]]]:
    """The text before the first call, and the calls in OpenAI's shape (``id``, ``type``,
    ``function.name``, ``function.arguments`` as JSON text); a call that does not parse is
    left in the text. With the functions' ``names``, an answer that is one bare call
    (``bare_call``) is that call."""
    calls: list[dict[str, Any]] = []
    for match in _CALL.finditer(text):
        try:
            shaped = _shaped(json.loads(match.group(1)), len(calls))
        except json.JSONDecodeError:
            continue
        if shaped is not None:
            calls.append(shaped)
    if not calls:
        bare = bare_call(text, names) if names else None
        return ("", [bare]) if bare is not None else (text, [])
    return text[: text.find(OPEN)].rstrip(), calls


class HeldCalls:
    """One streamed answer's text: what to send now, and what its end adds."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = names
        self.sent = ""
        self.pending = ""  # the end of the text so far, which may begin a tag
        self.held = ""

    def piece(self, text: str) -> str:
        """The part of ``text`` to stream now ('' once a call has begun). A tag may come as
        several tokens: text that may begin one waits for the next piece. An answer that
        begins as a bare call would (``{`` or a json code block) is held whole."""
        if self.held:
            self.held += text
            return ""
        text = self.pending + text
        self.pending = ""
        if not self.sent:
            lead = text.lstrip()
            if lead.startswith(BARE_STARTS):
                self.held = text
                return ""
            if not lead or any(start.startswith(lead) for start in BARE_STARTS):
                self.pending = text
                return ""
        if OPEN in text:
            cut = text.index(OPEN)
            self.held, text = text[cut:], text[:cut]
        else:
            keep = next((n for n in range(len(OPEN) - 1, 0, -1) if text.endswith(OPEN[:n])), 0)
            if keep:
                self.pending, text = text[-keep:], text[:-keep]
        self.sent += text
        return text

    def end(self) -> tuple[str, list[dict[str, Any]]]:
        """Text still to stream, and the calls (with their ``index``) for ``delta.tool_calls``."""
        _, calls = split_calls(self.sent + self.pending + self.held, self.names)
        if not calls:
            return self.pending + self.held, []
        return "", [{"index": i, **call} for i, call in enumerate(calls)]


def template_message(message: Any, where: str) -> dict[str, Any]:
    """An OpenAI-style message as the chat template reads it: text content (content parts of
    text joined), an assistant's ``tool_calls`` with each function's ``arguments`` (JSON text
    in OpenAI's shape) as the object it spells, and no content for a turn that only called
    tools. ``where`` names the message in a refusal (``messages[2]``)."""
    example = "e.g. {'role': 'user', 'content': 'Hello'}"
    if not isinstance(message, Mapping) or message.get("role") not in ROLES:
        raise UsageError(f"{where} needs a role of system, user, assistant or tool", example)
    content = message.get("content")
    calls = message.get("tool_calls") if message["role"] == "assistant" else None
    if content is None and calls:
        content = ""  # an assistant's turn that only called tools
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise UsageError(f"{where}: only text content is supported", example)
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise UsageError(f"{where}.content must be text", example)
    out: dict[str, Any] = {"role": message["role"], "content": content}
    if calls:
        out["tool_calls"] = _past_calls(calls, f"{where}.tool_calls")
    return out


def _past_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` with their arguments as objects."""
    shape = '{"type": "function", "function": {"name": ..., "arguments": "..."}}'
    again = "give the calls as the answer's tool_calls gave them"
    if not isinstance(calls, list):
        raise UsageError(f"{where} must be a list", f"each call {shape}")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", "{}") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise UsageError(f"{where}: each must be {shape}", again)
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            raise UsageError(f"{where}: arguments must be JSON text", again) from None
        out.append({"type": "function", "id": call.get("id"),
                    "function": {"name": name, "arguments": parsed}})  # fmt: skip
    return out


def tool_call_token(target: LlamaLane, prompts: Prompts) -> int:
    """The token that opens a tool call in the target's chat template; a ``UsageError``
    when the template shows the model no tools or the vocabulary has no such token."""
    spelled = target.tokenize(OPEN, add_special=False, parse_special=True)
    # A tokenizer may put a space before it (SentencePiece's): the tag is one token.
    found = [t for t in spelled if target.token_bytes(t) == OPEN.encode()]
    if not prompts.has_tools() or len(found) != 1:
        raise UsageError(
            f"tools: the chat template of {prompts.label} has no tool calls",
            "use a model whose template takes tools, such as Qwen2.5's",
        )
    return found[0]


def takes_tools(target: LlamaLane, prompts: Prompts) -> bool:
    """Whether the target's chat template takes tools (``tool_call_token``)."""
    try:
        tool_call_token(target, prompts)
    except UsageError:
        return False
    return True


def answer_grammar(
    target: LlamaLane, prompts: Prompts, grammar: str | None, tools: Tools | None
) -> Grammar | None:
    """The grammar an answer must match, compiled for the target's vocabulary: its tool
    calls' (from the tool-call token on, when lazy), else ``grammar``'s GBNF; None: free."""
    if tools is not None and tools.choice != NONE:
        calls = call_grammar(tools)
        if tools.lazy:
            return compile_lazy(target, calls, [tool_call_token(target, prompts)])
        return model_grammar(target, calls)
    return model_grammar(target, grammar) if grammar is not None else None
