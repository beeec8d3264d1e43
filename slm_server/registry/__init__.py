"""The model registry: the YAML schema and its validation (``schema``), aliases and
presets (``presets``), where model files are found (``model_path``), and how either
process reaches a remote engine (``remote``)."""
