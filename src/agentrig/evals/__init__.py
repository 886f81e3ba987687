"""Running and measuring: task-completion evaluation, its metrics and reports, and the terminal chat.

Holds `evaluate.py` (`agentrig eval`), `metrics.py`, `report.py` and `chat.py` (`agentrig chat`). May import:
`agentrig.harness`, `agentrig.envs`, `agentrig.policies` and the top-level helpers; never training or data.
"""
