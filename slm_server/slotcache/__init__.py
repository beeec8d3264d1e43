"""Keeping each model's prompt cache across an unload and a load: which backends can
(:mod:`.eligible`), under which key a saved cache is valid (:mod:`.key`), and the
private, bounded directory of saved slots (:mod:`.store`)."""
