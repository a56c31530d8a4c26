"""A serving engine seen from outside: llama-server, vLLM, SGLang or another playground, over HTTP.

What such a server publishes about its speculation is all this layer can read: an answer streamed through the
OpenAI-compatible chat endpoint with llama-server's `timings` (`draft_n`, `draft_n_accepted`), the Prometheus
counters of `/metrics` before and after it, and what `/props` or `/v1/models` say it runs. The rounds
themselves (which tokens were drafted, where the draft broke off) never leave the server.
"""
