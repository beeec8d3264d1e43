"""An agent-sized request, as coding agents send it: a system prompt of about 20k tokens
and 20 tools, the same in each API shape's own form (chat completions, Responses,
Messages). Deterministic: the same text on every run.

    system = system_prompt(AGENT_RULES)      # about 19,800 tokens (Gemma's tokenizer)
    chat_request("model", system, "Which tool lists a directory?", max_tokens=8)

The three ``*_request`` builders give the whole body in each shape, as the real-model
test sends it and the ``agent_request`` benchmark measures it.
"""

from __future__ import annotations

from typing import Any

TOOL_NAMES = (
    "bash",
    "read_file",
    "write_file",
    "edit_file",
    "multi_edit",
    "glob",
    "grep",
    "list_dir",
    "web_fetch",
    "todo_write",
    "notebook_edit",
    "task",
    "git_status",
    "git_diff",
    "git_commit",
    "run_tests",
    "format_code",
    "lint",
    "search_symbols",
    "ask_user",
)
# Rules of the system prompt that make it about 19,800 tokens with Gemma's tokenizer.
AGENT_RULES = 400
PARAMS = (
    ("path", "string", "The absolute path of the file or directory to work on"),
    ("command", "string", "The shell command to run, exactly as it would be typed"),
    ("pattern", "string", "A regular expression or glob pattern to match against"),
    ("content", "string", "The full text to write, replacing what was there"),
    ("timeout_ms", "integer", "How long to wait before giving up, in milliseconds"),
    ("recursive", "boolean", "Whether to descend into subdirectories"),
)
SUBJECTS = (
    "the build scripts",
    "the test suite",
    "the public API",
    "the configuration files",
    "the database migrations",
    "the command-line interface",
    "the documentation pages",
    "the logging code",
    "the error handling",
    "the network client",
    "the caching layer",
    "the release notes",
    "the dependency pins",
    "the type annotations",
    "the benchmarks",
    "the user interface",
    "the scheduler",
    "the authentication module",
    "the parser",
    "the serialisation code",
    "the plugin loader",
    "the metrics exporter",
)
ACTIONS = (
    "read the surrounding code before changing anything",
    "keep the change as small as the task allows",
    "run the narrowest test that covers the change, then the wider suite",
    "explain in one sentence why the change is needed",
    "never invent a file path: list the directory first",
    "prefer editing an existing file to creating a new one",
    "quote the exact error message when a command fails",
    "leave unrelated formatting alone",
    "ask before deleting anything the user did not mention",
    "check the project's conventions in its contributing guide",
    "write the test first when fixing a reported bug",
    "mention every file you touched in the final summary",
    "stop and report when the same command fails twice",
)
REASONS = (
    "because reviewers read diffs line by line",
    "since the maintainers rely on a clean history",
    "as other developers depend on its behaviour",
    "so that continuous integration stays green",
    "because users upgrade without reading the changelog",
    "since a wrong guess costs more time than a question",
    "as the production deployment reads these files at start-up",
)


def system_prompt(rules: int) -> str:
    """A coding agent's instructions: an opening and ``rules`` numbered rules, each
    different from the others."""
    lines = [
        "You are a coding agent working in the user's repository from a terminal. You "
        "read and edit files, run commands and report what you did. Follow every rule "
        "below; when two rules disagree, the later one wins.",
        "",
    ]
    for n in range(rules):
        subject = SUBJECTS[n % len(SUBJECTS)]
        action = ACTIONS[(n * 5) % len(ACTIONS)]
        reason = REASONS[(n * 3) % len(REASONS)]
        lines.append(
            f"Rule {n + 1}. When a task touches {subject} (case {n // len(SUBJECTS) + 1}), "
            f"{action}, {reason}; then note rule {n + 1} in your plan."
        )
    return "\n".join(lines)


def _schema(index: int) -> dict[str, Any]:
    chosen = [PARAMS[(index + k) % len(PARAMS)] for k in range(3)]
    return {
        "type": "object",
        "properties": {name: {"type": kind, "description": text} for name, kind, text in chosen},
        "required": [chosen[0][0]],
        "additionalProperties": False,
    }


def _description(index: int, name: str) -> str:
    return (
        f"{name.replace('_', ' ').capitalize()}: a tool of the coding agent. Use it for "
        f"{SUBJECTS[index % len(SUBJECTS)]} and similar work; "
        f"{ACTIONS[index % len(ACTIONS)]}, {REASONS[index % len(REASONS)]}."
    )


def chat_tools() -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": _description(i, name),
                "parameters": _schema(i),
            },
        }
        for i, name in enumerate(TOOL_NAMES)
    ]


def responses_tools() -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": name,
            "description": _description(i, name),
            "parameters": _schema(i),
            "strict": False,
        }
        for i, name in enumerate(TOOL_NAMES)
    ]


def messages_tools() -> list[dict[str, Any]]:
    return [
        {"name": name, "description": _description(i, name), "input_schema": _schema(i)}
        for i, name in enumerate(TOOL_NAMES)
    ]


def chat_request(model: str, system: str, ask: str, max_tokens: int) -> dict[str, Any]:
    """A chat completions request: ``system`` as the system message, ``ask`` as the
    user's, the 20 tools."""
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": ask}],
        "tools": chat_tools(),
        "max_tokens": max_tokens,
    }


def responses_request(model: str, system: str, ask: str, max_output_tokens: int) -> dict[str, Any]:
    """The same request in the Responses API: ``system`` as ``instructions``, not stored
    (as Codex CLI sends it)."""
    return {
        "model": model,
        "instructions": system,
        "input": [{"role": "user", "content": ask}],
        "tools": responses_tools(),
        "max_output_tokens": max_output_tokens,
        "store": False,
    }


def messages_request(model: str, system: str, ask: str, max_tokens: int) -> dict[str, Any]:
    """The same request in Anthropic's Messages API: ``system`` as the top-level
    ``system``."""
    return {
        "model": model,
        "system": system,
        "messages": [{"role": "user", "content": ask}],
        "tools": messages_tools(),
        "max_tokens": max_tokens,
    }
