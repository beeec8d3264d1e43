"""From registry entries to command lines (pure argv builders per backend kind) and
the one module that spawns, signals and reaps processes (``process``)."""
