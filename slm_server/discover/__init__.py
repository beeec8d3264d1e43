"""``python -m slm_server models``: the GGUF models found on this machine.

:mod:`.places` says where each store (the Hugging Face cache, LM Studio, Ollama,
llama.cpp's cache, the project's ``models/``) lives and walks its layout;
:mod:`.found` reads each file's facts from its header; :mod:`.listing` matches them to
the registry and renders the table or the JSON."""
