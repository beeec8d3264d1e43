"""Filling in the middle: llama-server's ``POST /infill`` served as it is, and OpenAI's
``suffix`` on ``POST /v1/completions`` translated to it (:mod:`.to_infill`) and its
answer translated back, whole (:mod:`.from_infill`) or event by event
(:mod:`.events`), for models whose vocabulary has the tokens
(:mod:`slm_server.memory.fill_in`)."""
