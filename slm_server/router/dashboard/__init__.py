"""The dashboard at ``GET /ui``: its endpoints, the tail of the watchdog log it
streams, the ring of recent requests, and its static files (``ui/``)."""
