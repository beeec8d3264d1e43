"""The registry reloaded while the supervisor runs: preparing the new one
(``prepare``), applying it (``apply``, which also puts the first one in force), the
backends it retires while they drain (``retire``) and the watch on the registry file
(``watch``)."""
