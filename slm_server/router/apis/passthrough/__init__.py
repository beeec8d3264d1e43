"""The API shapes proxied as they are (chat completions, completions, embeddings,
rerank, image generations, image edits, audio transcriptions)."""
