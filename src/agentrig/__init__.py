"""agentrig: train small language models into tool-using agents.

`import agentrig` is light: it never imports torch, transformers, peft or trl.
"""

__version__ = "0.1.0"
