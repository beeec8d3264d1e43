"""Command lines for the MLX backends, as pure functions of a registry entry.

``mlx`` entries run ``mlx-openai-server launch``; ``mlx-rerank`` entries run this
package's own reranker server (``python -m slm_server mlx-rerank``).
"""

from __future__ import annotations

from slm_server.config import ModelEntry


def mlx_argv(program: str, entry: ModelEntry, model_path: str) -> list[str]:
    """The ``mlx-openai-server launch`` command line for ``entry``."""
    argv = [program, "launch", "--model-path", model_path, "--model-type", entry.model_type]
    argv += ["--host", entry.host, "--port", str(entry.port)]
    if entry.context_length is not None:
        argv += ["--context-length", str(entry.context_length)]
    argv += ["--max-concurrency", str(entry.max_concurrency)]
    if entry.enable_auto_tool_choice:
        argv += ["--enable-auto-tool-choice"]
    if entry.tool_call_parser is not None:
        argv += ["--tool-call-parser", entry.tool_call_parser]
    if entry.reasoning_parser is not None:
        argv += ["--reasoning-parser", entry.reasoning_parser]
    if entry.model_type in ("image-generation", "image-edit"):
        default = "flux-schnell" if entry.model_type == "image-generation" else "flux-kontext-dev"
        argv += ["--config-name", entry.config_name or default]
    return argv


def mlx_rerank_argv(python: str, entry: ModelEntry, model_path: str) -> list[str]:
    """The in-repo reranker server's command line for ``entry``."""
    return [
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
