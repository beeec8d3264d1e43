"""Models loaded on demand, the router's side: the load planner (``loader``),
whether a model fits in memory (``memory_fit``), and the load and unload endpoints
(``load_api``)."""
