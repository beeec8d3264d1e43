"""The router's edge: limits at the door (``http_protocol``, uvicorn's protocol
with the router's fast path; ``alarm``), the ``Host`` allow-list, API keys, and
refusals before any route runs."""
