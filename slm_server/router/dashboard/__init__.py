"""The dashboard at ``GET /ui``: its endpoints, the tail of the watchdog log it
streams, the ring of recent requests, the history its charts and timeline draw from,
and its static files (``ui/``)."""
