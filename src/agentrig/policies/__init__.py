"""Model policies: a local Hugging Face model with adapters (`hf_policy.py`, with its KV cache
`kvcache.py`) and any OpenAI-compatible endpoint (`openai_policy.py`), each implementing
`agentrig.harness.policy.Policy`, and the one loader every command uses (`loader.py`).

May import: `agentrig.harness`, `agentrig.data.render` (the chat rendering training uses, so inference
renders the same way) and the top-level helpers. torch and transformers are imported inside functions.
"""
