"""``python -m slm_server <command>``: the commands (``commands``), the log viewer
(``logview``), the collector's tuning for the serving processes (``gc_tuning``), and a
coding agent started against the gateway (``launch``)."""
