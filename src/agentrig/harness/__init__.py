"""The harness: one episode of a policy on a task's tools, and the records it leaves.

Holds the loop (`loop.py`), the policy interface (`policy.py`), the episode's reading view
(`transcript.py`), the records (`trajectory.py`), tools (`tools.py`), output protocols and every
model-facing text (`protocol.py`, `feedback.json`), memory (`memory.py`), fault injection (`faults.py`)
and the scripted demo (`demo.py`). May import: only `agentrig.errors` and itself; no model library
(torch, transformers) and nothing from the other packages, which all build on this one.

The names users import are re-exported here: `from agentrig.harness import run_episode, ScriptedPolicy`.
"""

from agentrig.harness.loop import EpisodeRunner, HarnessConfig, run_episode, run_episodes
from agentrig.harness.policy import Policy, PolicyReply, PolicyRequest, ScriptedPolicy

__all__ = ["EpisodeRunner", "HarnessConfig", "Policy", "PolicyReply", "PolicyRequest", "ScriptedPolicy",
           "run_episode", "run_episodes"]
