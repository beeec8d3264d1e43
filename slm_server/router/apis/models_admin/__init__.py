"""The models' own endpoints, behind ``SLM_PULL_API``: ``POST /v1/models/pull`` (fetch
from a hub, then optionally add), ``GET /v1/models/local`` (what ``models --json``
lists) and ``POST /v1/models/add`` (a registry entry for a local file, then a reload)."""
