"""``python -m slm_server <command>``: the commands (``commands``), the log viewer
(``logview``) and the collector's tuning for the serving processes (``gc_tuning``)."""
