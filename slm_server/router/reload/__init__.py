"""The registry reloaded while the router runs, the router's side: the registry in
force (``in_force``), following the supervisor's applied registry (``follower``),
rewiring the router's parts to a new one (``rewire``), draining and retiring the
backends a reload retires (``retirements``), requests waiting for a backend a reload
started (``readiness``), and ``POST /v1/config/reload`` (``reload_api``)."""
