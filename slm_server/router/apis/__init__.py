"""One module (or folder) per API shape the router serves on top of the backends'
own: the endpoints proxied as they are (``passthrough``), the OpenAI Responses API
(``responses/``), and the router's own model list and health views
(``models_and_health``)."""
