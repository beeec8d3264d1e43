"""The supervisor's shell: the one seam to the OS (``control``), its backends (``backend``,
``fleet``, ``retiring``), carrying out decide's actions (``act``), and the chores: the
state file, footprints, housekeeping, the command socket, evidence and probes, remotes,
the launcher lock, the stop and reload flags, slot saves."""
