"""The supervisor process (``python -m slm_server backends``): the pure decisions
(``core/``), reloading the registry (``reload/``), and the shell that carries them out
(the loop ``supervisor`` over ``fleet`` and ``act``; ``control``, ``remotes``, probes
and the chores).
It shares only ``slm_server.contracts`` and the shared utilities with the router."""
