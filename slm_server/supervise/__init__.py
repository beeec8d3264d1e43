"""The supervisor process (``python -m slm_server backends``), in layers: the loop
(``supervisor``) over reloading the registry (``reload/``), which stands on the shell
that carries the decisions out (``shell/``: the backends, the one seam to the OS, the
chores), which stands on the pure decisions (``core/``). It shares only
``slm_server.contracts``, the registry's schema and the shared utilities with the
router."""
