"""``python -m slm_server launch claude|codex|opencode``: a coding agent started against
the running gateway. ``agents`` (each agent's own configuration; pure), ``gateway`` (the
router's URL from the settings, the key, one JSON ``GET``; ``status`` asks it too),
``survey`` (what the gateway and its registry say of the models), ``preflight`` (what
will not work, and the model chosen when none is named; pure), ``process`` (the agent
run under a private directory, its signals and exit status), ``command`` (the wiring)."""
