"""Fetching a model from a hub: ``python -m slm_server pull REF`` and ``POST
/v1/models/pull``. A reference names a Hugging Face repository (with a quantization or
a file) or an Ollama library model; the files are staged under the models folder's
``.pull/``, checked against the hub's size and SHA-256, and only then moved to their
final names (``docs/models.md``)."""
