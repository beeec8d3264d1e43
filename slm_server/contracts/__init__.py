"""What the router and the supervisor share and neither owns: the state and pid
files (``records``), the command socket's protocol (``commands``), restart-request files
(``restart_requests``), the watchdog's event log (``events``), the verdict table
(``verdicts``) and the backend states (``states``). Imports nothing from either side."""
