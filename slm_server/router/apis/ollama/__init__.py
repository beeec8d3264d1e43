"""Ollama's own API (``/api/...``), over the same backends as every other shape."""
