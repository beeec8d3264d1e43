"""httpx's one-request helpers (``httpx.get``, ``httpx.post``, ``httpx.stream``...)
without their hidden cost.

Each of httpx's module-level helpers builds a client for the one request, and with it an
SSL context that loads certifi's bundle: some 30 ms of CPU per call, even for plain
HTTP. A test polling a URL every 50 ms that way keeps most of a core busy doing nothing,
and the suite's run time on two CPUs is its CPU time. These share one client instead,
built once, with no keep-alive, so each request still opens and closes its own
connection as the helpers do; the environment's proxy settings are ignored, as a local
test needs. httpx's client is safe to share between threads.
"""

from __future__ import annotations

from typing import Final

import httpx

CLIENT: Final = httpx.Client(
    trust_env=False,
    limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
)

get = CLIENT.get
post = CLIENT.post
put = CLIENT.put
delete = CLIENT.delete
request = CLIENT.request
stream = CLIENT.stream
