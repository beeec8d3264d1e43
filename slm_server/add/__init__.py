"""``python -m slm_server add PATH|NAME``: one new registry entry for a local GGUF file.

:mod:`.source` finds the file (a path, or a name as ``models`` lists it, served where
it lies); :mod:`.entry` derives the entry's values from the file's header and the
registry it joins (id, role, port, type, the context that fits the memory budget);
:mod:`.append` appends it to the registry file as text, checked first, written
atomically; :mod:`.command` does the reading and printing. The reload that follows is
the ``reload`` command's (``slm_server.cli.commands``)."""
