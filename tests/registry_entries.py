"""Registry entries (one model of ``models.yaml``) for tests and benchmarks.

``registry_entry("alpha", port)`` is a llama.cpp chat model on ``port`` with the fields
every entry needs; keyword arguments add fields or replace the defaults::

    registry_entry("embed", fake.port, model_type="embeddings")
    registry_entry("slow", fake.port, default_timeout=1, max_concurrency=4)
    registry_entry("tiny", port, backend="mlx", model_path="org/model", quantization="4bit")

The entry is a plain dict: write it with ``tests.processes.registry_env`` (or
``yaml.safe_dump``) under the role it should have, e.g. ``{"alpha": entry}``.
"""

from __future__ import annotations

from typing import Any

# A path that is never opened: a router in front of a backend the test started itself
# does not read the model file.
UNUSED_MODEL = "models/none.gguf"


def registry_entry(model_id: str, port: int, **fields: Any) -> dict[str, Any]:
    """A llama.cpp entry serving ``model_id`` on ``port`` (``default_timeout`` 10 s,
    quantization Q4_0, the model file unused); ``fields`` add to it or override it."""
    return {
        "id": model_id,
        "backend": "llamacpp",
        "port": port,
        "model_path": UNUSED_MODEL,
        "default_timeout": 10,
        "quantization": "Q4_0",
        **fields,
    }
