"""The in-repo MLX reranker server: ``python -m slm_server mlx-rerank``.

It scores (query, document) pairs with a Qwen3-Reranker-style causal language model
loaded by mlx-lm and answers ``POST /v1/rerank`` in the same shape as llama-server.

    prompt.py   the reranker prompt and the batching plan (pure)
    api.py      request validation and the response body (pure)
    scoring.py  the model: loading and batched scoring with mlx-lm (imports MLX lazily)
    server.py   the HTTP app, the MLX worker thread and the uvicorn process
"""
