"""The supervisor process (``python -m slm_server backends``): the pure decisions
(``decide``, ``phases``, ``restart_budget``, ``confirm``, ``eject``, ``strays``) and
the shell that carries them out (``supervisor``, ``control``, ``remotes``, probes).
It shares only ``slm_server.contracts`` and the shared utilities with the router."""
