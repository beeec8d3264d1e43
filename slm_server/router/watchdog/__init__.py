"""The router's half of the watchdog: every outcome judged, failure streaks
(``streaks``), stall timers, and restart requests on a trip (``tripwire``)."""
