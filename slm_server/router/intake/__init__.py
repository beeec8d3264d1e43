"""Reading a request: its body within the size budgets (``body_budget``), strict
JSON, multipart forms, the fields the router reads and rewrites (``payload``), and the
route to a model (``reception``)."""
