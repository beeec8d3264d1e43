"""From a request to a backend: the proxy handler, the supervisor's published
states, replicas and the choice among them (``balance``, ``affinity``), admission,
the admitted call and its deadline, bounded waits, and the drain."""
