"""What code-completion plugins send, as their source writes it, for the tests that
replay it against the fake backend and the real llama-server."""

from __future__ import annotations

from typing import Any

# llama.vscode's /infill body (src/llama-server.ts, createRequestPayload): no model.
VSCODE: dict[str, Any] = {
    "input_prefix": "def add(a, b):\n",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"text": "import os\n", "time": 1700000000000, "filename": "util.py"}],
    "prompt": "    return",
    "n_predict": 128,
    "top_k": 40,
    "top_p": 0.99,
    "stream": False,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
    "n_indent": 4,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
}
# Its warm-up of the extra context (updateExtraContext): nothing predicted.
VSCODE_WARM_UP: dict[str, Any] = {
    "input_prefix": "",
    "input_suffix": "",
    "input_extra": VSCODE["input_extra"],
    "prompt": "",
    "n_predict": 0,
    "samplers": [],
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1,
}
