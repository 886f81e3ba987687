"""Training data: episodes collected from a teacher, then samples, tokens, exports and preference pairs.

Holds collection (`collect.py`, `augment.py`), the episode-to-sample cut and rendering (`samples.py`,
`render.py`, `templates/`), the build and its CLI (`databuild.py`, `datacli.py`), export formats
(`exports.py`) and DPO pairs (`pairs.py`). May import: `agentrig.harness`, `agentrig.envs` and the
top-level helpers (`config`, `errors`, `jsonl`, `models`); never training or evaluation. Two edges against the grain,
each imported inside the function that needs it: `collect.py` loads a model or API teacher through
`agentrig.policies.loader`, and `databuild.py` reads BFCL's questions (`agentrig.bfcl.data`) to refuse them.
"""
