"""The documented custom environment (examples/my_env.py) loads, runs and is checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrig.envs import load_env
from agentrig.errors import ConfigError
from agentrig.harness import HarnessConfig, run_episode

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "my_env.py"


def test_example_env_runs_with_its_expert():
    env = load_env(f"{EXAMPLE}:make_env")
    for task in env.tasks("train", 5, seed=0):
        tools, cart = env.setup(task)
        ep = run_episode(task, tools, env.expert(), HarnessConfig(), episode_id=task.id)
        result = env.check(task, cart, ep)
        assert result.success, result.reasons
        assert [c.name for c in ep.steps[0].calls] == ["get_price", "add_to_cart"]
        assert ep.termination == "final_answer"


def test_docs_example_is_the_shipped_file():
    doc = (EXAMPLE.parents[1] / "docs" / "environments.md").read_text()
    assert EXAMPLE.read_text().strip() in doc


def test_load_env_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_env(str(tmp_path / "nope.py") + ":make_env")
    f = tmp_path / "e.py"
    f.write_text("def make_env():\n    return 3\n")
    with pytest.raises(ConfigError, match="not an agentrig"):
        load_env(f"{f}:make_env")
    with pytest.raises(ConfigError, match="no function"):
        load_env(f"{f}:other")
