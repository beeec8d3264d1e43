"""Registry entries (one model of ``models.yaml``) for tests and benchmarks: the one place
that writes an entry's fields.

``registry_entry("alpha", port)`` is a llama.cpp chat model on ``port`` with the fields
every entry needs; keyword arguments add fields or replace the defaults::

    registry_entry("embed", fake.port, model_type="embeddings")
    registry_entry("slow", fake.port, default_timeout=1, max_concurrency=4)
    registry_entry("tiny", port, backend="mlx", model_path="org/model", quantization="4bit")

The entry is a plain dict: write it with ``tests.processes.registry_env`` (or
``yaml.safe_dump``) under the role it should have, e.g. ``{"alpha": entry}``. The same
fields serve as

- YAML text: ``registry_yaml("alpha", entry, "aliases: [a]")`` is the entry's lines under
  ``models:``, for a test that writes the registry file as text;
- a validated entry: ``model_entry(...)`` is a :class:`ModelEntry` and ``model_spec(...)``
  a :class:`ModelSpec`, for tests that use one in-process; their defaults are the ones
  such tests use (``m1`` on 8501, ``default_timeout`` 60 s, quantization Q4_1, the model
  file ``/m.gguf`` never read), each a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from slm_server.registry.schema import ModelEntry, ModelSpec

# A path that is never opened: a router in front of a backend the test started itself
# does not read the model file.
UNUSED_MODEL = "models/none.gguf"
# The model file of an entry only validated, planned or routed to in-process.
IN_PROCESS_MODEL = "/m.gguf"


def registry_entry(model_id: str, port: int, **fields: Any) -> dict[str, Any]:
    """A llama.cpp entry serving ``model_id`` on ``port`` (``default_timeout`` 10 s,
    quantization Q4_0, the model file unused); ``fields`` add to it or override it
    (an overridden field keeps its place in the entry's order)."""
    return {
        "id": model_id,
        "backend": "llamacpp",
        "port": port,
        "model_path": UNUSED_MODEL,
        "default_timeout": 10,
        "quantization": "Q4_0",
        **fields,
    }


def registry_yaml(role: str, entry: Mapping[str, Any], *extra: str) -> str:
    """``entry`` as the YAML text of the model ``role`` under ``models:`` (the role indented
    by two spaces, its fields by four, in the entry's order), then the ``extra`` lines as
    they are, at the fields' indent (e.g. ``"aliases: [a, b]"``)."""
    fields = yaml.safe_dump(dict(entry), sort_keys=False, width=1_000_000).splitlines()
    lines = [f"  {role}:", *(f"    {line}" for line in (*fields, *extra))]
    return "\n".join(lines) + "\n"


def model_entry(
    model_id: str = "m1",
    port: int = 8501,
    *,
    model_path: str = IN_PROCESS_MODEL,
    default_timeout: float = 60,
    quantization: str = "Q4_1",
    **fields: Any,
) -> ModelEntry:
    """The entry :func:`registry_entry` makes of these fields, validated as the registry
    validates each of its entries (:class:`ModelEntry`, strict)."""
    raw = registry_entry(
        model_id,
        port,
        model_path=model_path,
        default_timeout=default_timeout,
        quantization=quantization,
        **fields,
    )
    return ModelEntry.model_validate(raw)


def model_spec(
    role: str = "chat",
    model_id: str = "m1",
    port: int = 8501,
    *,
    index: int = 0,
    **fields: Any,
) -> ModelSpec:
    """:func:`model_entry` of these fields as the model ``role``, ``index`` in the file."""
    return ModelSpec(role=role, index=index, entry=model_entry(model_id, port, **fields))
