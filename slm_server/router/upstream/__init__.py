"""Talking to backends: the one HTTP client and its error boundary (``client``)
and sending one call under watch (``sender``)."""
