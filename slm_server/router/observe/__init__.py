"""What the router records about each request: the record (``exchange``), the
pure-ASGI observer that makes access lines, spans and metrics of it (``observer``),
Prometheus metrics (``metrics``, ``tally``, ``engine_metrics``) and OpenTelemetry spans
(``telemetry``, ``otlp_wire``, ``otlp_export``)."""
