"""Command lines for the MLX backends, as pure functions of a registry entry.

``mlx`` entries run ``mlx-openai-server launch``; ``mlx-rerank`` entries run this
package's own reranker server (``python -m slm_server mlx-rerank``). Which optional flags
``mlx-openai-server`` gets depends on what the installed release accepts
(:class:`~slm_server.launch.mlx_options.MlxOptions`); with no knowledge of it, only the
flags every release has and the fields the entry sets.
"""

from __future__ import annotations

import math

from slm_server.launch.mlx_options import MlxOptions
from slm_server.registry.schema import ModelEntry

IMAGE_TYPES = ("image-generation", "image-edit")
TEXT_TYPES = ("lm", "multimodal")
DEFAULT_CONFIG_NAMES = {"image-generation": "flux-schnell", "image-edit": "flux-kontext-dev"}


def _concurrency(entry: ModelEntry, options: MlxOptions | None) -> list[str]:
    """``max_concurrency`` on the installed release's concurrency flag(s)."""
    if options is None:
        return []
    if options.supports("--max-concurrency"):
        return ["--max-concurrency", str(entry.max_concurrency)]
    argv: list[str] = []
    if entry.model_type in TEXT_TYPES:
        # Continuous batching: decode (and prefill) at most as many requests as the
        # router lets through at once.
        for flag in ("--decode-concurrency", "--prompt-concurrency"):
            if options.supports(flag):
                argv += [flag, str(entry.max_concurrency)]
    return argv


def mlx_argv(
    program: str, entry: ModelEntry, model_path: str, options: MlxOptions | None = None
) -> list[str]:
    """The ``mlx-openai-server launch`` command line for ``entry``."""
    argv = [program, "launch", "--model-path", model_path, "--model-type", entry.model_type]
    argv += ["--host", entry.host, "--port", str(entry.port)]
    if options is not None and options.supports("--served-model-name"):
        argv += ["--served-model-name", entry.id]
    if entry.context_length is not None and entry.model_type in TEXT_TYPES:
        argv += ["--context-length", str(entry.context_length)]
    argv += _concurrency(entry, options)
    if options is not None and options.supports("--queue-timeout"):
        # The router's deadline covers queueing and generation; the backend never needs
        # to give up first.
        argv += ["--queue-timeout", str(math.ceil(entry.default_timeout) + 5)]
    if options is not None and options.supports("--no-log-file"):
        # Its output already goes to logs/mlx-<id>-<port>.log; no stray logs/app.log.
        argv += ["--no-log-file"]
    if entry.enable_auto_tool_choice:
        argv += ["--enable-auto-tool-choice"]
    if entry.tool_call_parser is not None:
        argv += ["--tool-call-parser", entry.tool_call_parser]
    if entry.reasoning_parser is not None:
        argv += ["--reasoning-parser", entry.reasoning_parser]
    if entry.model_type in IMAGE_TYPES:
        argv += ["--config-name", entry.config_name or DEFAULT_CONFIG_NAMES[entry.model_type]]
    return argv


def unsupported_choices(entry: ModelEntry, options: MlxOptions) -> list[tuple[str, str]]:
    """``(field, message)`` for each field whose value the installed release refuses."""
    problems = []
    for name, flag, value in (
        ("tool_call_parser", "--tool-call-parser", entry.tool_call_parser),
        ("reasoning_parser", "--reasoning-parser", entry.reasoning_parser),
        ("config_name", "--config-name", entry.config_name),
    ):
        if value is None:
            continue
        allowed = options.refuses(flag, value)
        if allowed is not None:
            problems.append(
                (
                    name,
                    f"'{value}' is not accepted by the installed mlx-openai-server "
                    f"(it accepts: {', '.join(allowed)})",
                )
            )
    return problems


def mlx_rerank_argv(python: str, entry: ModelEntry, model_path: str) -> list[str]:
    """The in-repo reranker server's command line for ``entry``."""
    argv = [
        python,
        "-m",
        "slm_server",
        "mlx-rerank",
        "--model-path",
        model_path,
        "--host",
        entry.host,
        "--port",
        str(entry.port),
        "--model-id",
        entry.id,
    ]
    if entry.context_length is not None:
        # The longest prompt (instruction, query and document) it scores.
        argv += ["--max-length", str(entry.context_length)]
    return argv
