"""``python -m slm_server``: see :mod:`slm_server.cli`."""

from slm_server.cli import main

raise SystemExit(main())
