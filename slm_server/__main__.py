"""``python -m slm_server``: see :mod:`slm_server.cli.commands`."""

from slm_server.cli.commands import main

raise SystemExit(main())
