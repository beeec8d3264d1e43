"""The registry reloaded while the supervisor runs: preparing the new one (``prepare``),
applying it (``apply``: the difference, the backends it retires while they drain, which
the shell keeps in ``shell/retiring``; it also puts the first registry in force) and the
watch on the registry file (``watch``)."""
