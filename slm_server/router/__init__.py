"""The router process (``python -m slm_server router``): ``app.create_app`` and its
parts, one subpackage per concern (see docs/development.md for the map). It shares
only ``slm_server.contracts`` and the shared utilities with the supervisor."""
