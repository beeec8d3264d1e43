"""``POST /v1/responses``: the endpoint (``endpoint``), the request and answer
translated to and from chat completions (``translate``), and its event stream
(``stream``)."""
