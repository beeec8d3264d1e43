"""The supervisor's pure core: the decision (``decide``) and its phases, the restart
budget, confirming a trip (``confirm``, with llama-server's ``/slots`` in
``slots_evidence``), ejecting remotes (``eject``), the registry diff and strays."""
