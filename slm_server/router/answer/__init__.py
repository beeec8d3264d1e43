"""Answering the client from an opened backend response: relaying a stream
(``stream_relay``, ``stream_splice``, ``sse``), a whole answer (``whole_answer``,
``answer_fields``), and the choice between them (``reply``)."""
