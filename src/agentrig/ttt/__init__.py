"""Test-time training (`agentrig ttt`): an adapter adapts to an environment's tools before it works there.

- `blind.py`: the blind environment the loop gets (no checker, no task answers, its own seed namespace);
- `explore.py`: the tools called from their schemas, from each other's results and with broken values;
- `practice.py`: tasks built backwards from successful calls and chains, each with its own assertion;
- `loop.py`: the loop (explore, practice, rollouts with DAgger takeovers, LoRA SFT continuing the adapter
  with replay), the compute-matched control, the command;
- `pertask.py`: the per-task mode (`--per-task`): k sampled rollouts per task, a checker-free selector, a
  few LoRA steps on the best rollout when they disagree, the answer, the adapter reset.

May import: harness, envs, data, train, policies (the loop runs the adapter and trains it). Not evals: the
evaluation of a TTT adapter is somebody else's code (`agentrig eval`, `agentrig compare`); the one edge is
the command's `--per-task` dispatch to `evals.pertask`, which checks the answers the blind loop hands it.
"""
