"""`agentrig serve`: an OpenAI-compatible server for the base model and its LoRA adapters.

`wire` (the chat-completions format: requests checked, messages to the training render, tool calls out as
vLLM's hermes parser writes them), `engine` (one thread batching every client's requests through `HFPolicy`),
`app` (the FastAPI routes and OpenAI-shaped errors), `server` (`ServeConfig`, the command, `start_server`).
FastAPI and uvicorn are imported only by those modules, never by `import agentrig`.
"""
