"""The OpenAI-compatible paths every model server (llama-server, llama-cpp-python's
server, mlx-openai-server, the MLX reranker) serves under the same names as the gateway:
the router proxies its API shapes of the same name to them (the table of shapes,
``slm_server/router/apis/table.py``, names them), and the supervisor's canary asks them.
Each is written here once. ``INFILL`` is llama-server's own (fill in the middle), which
the router serves as it is and sends completions with OpenAI's ``suffix`` to."""

from __future__ import annotations

from typing import Final

CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
EMBEDDINGS: Final = "/v1/embeddings"
RERANK: Final = "/v1/rerank"
INFILL: Final = "/infill"

__all__ = ["CHAT", "COMPLETIONS", "EMBEDDINGS", "INFILL", "RERANK"]
