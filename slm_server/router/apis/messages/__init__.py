"""The Anthropic Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``)
over any chat-completions backend: requests translated to chat completions
(:mod:`.request`), answers translated back whole (:mod:`.answer`) or event by event
(:mod:`.stream`), token counts asked of llama-server or estimated (:mod:`.count`)."""
