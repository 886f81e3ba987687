"""BFCL offline: the Berkeley Function Calling Leaderboard's test data, run through agentrig's harness.

`data` loads entries from the installed `bfcl-eval` package, `types` maps BFCL parameter types to JSON
Schema, `checker` scores single-turn answers by BFCL's AST rules, `multi_turn` executes and scores
multi-turn entries on BFCL's pure-Python backends, `runner` drives a policy through the harness,
`report` writes the figures, and `bench` is the `agentrig bench bfcl` command. May import:
`agentrig.harness`, `agentrig.policies`, `agentrig.evals` (metrics) and the top-level helpers.
"""
