"""Model footprints: estimates from GGUF headers, measurements, physical memory and
the store of what was measured."""
