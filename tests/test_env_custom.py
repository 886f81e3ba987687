"""The documented custom environment (examples/my_env.py) loads, runs, is checked, and gets every collect feature."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agentrig.data.collect import CollectConfig, run_collect
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


def _collect(tmp_path, name, *flags):
    from agentrig.cli import main

    out = tmp_path / f"{name}.jsonl"
    assert main(["collect", "--env", f"{EXAMPLE}:make_env", "--episodes", "40", "--faults", "0", "--seed", "0",
                 "--out", str(out), "--no-progress", *flags]) == 0
    return [json.loads(x) for x in out.read_text().splitlines()]


def _tool_calls(eps):
    """Calls per tool under the original names (what --balance evens out)."""
    counts = Counter()
    for e in eps:
        back = {v: k for k, v in (e["task"]["metadata"].get("rename") or {}).get("tools", {}).items()}
        counts.update(back.get(c["name"], c["name"]) for s in e["steps"] for c in s["calls"] if s["weight"] > 0)
    return counts


def test_example_env_gets_balance_rename_and_detours(tmp_path):
    plain = _collect(tmp_path, "plain", "--detours", "0")
    eps = _collect(tmp_path, "aug", "--balance", "--rename", "0.5", "--detours", "0.3")
    assert len(eps) == 40 and all(e["success"] for e in eps)
    # renaming: the environment's aliases are offered and called, consistently within an episode
    renamed = [e for e in eps if (e["task"]["metadata"].get("rename") or {}).get("tools")]
    assert 10 <= len(renamed) <= 30
    for e in renamed:
        names = {c["name"] for s in e["steps"] if s["weight"] > 0 for c in s["calls"]}
        assert names <= set(e["task"]["allowed_tools"]) and set(e["task"]["metadata"]["rename"]["tools"].values()) >= names
        assert {"price_of", "cart_add"} <= names
    # balance: the family draw shifts toward checkout, so the three tools are called more evenly
    share = lambda es: sum(e["task"]["family"] == "checkout" for e in es) / len(es)  # noqa: E731
    assert share(eps) > share(plain) + 0.2
    evenness = lambda c: min(c.values()) / max(c.values())  # noqa: E731
    assert evenness(_tool_calls(eps)) > evenness(_tool_calls(plain))
    # detours: the expert got the rate and seed collect records; a detour is a rejected step of weight 0
    detoured = [e for e in eps if e["steps"][0]["weight"] == 0.0]
    assert 4 <= len(detoured) <= 24 and not any(s["weight"] == 0.0 for e in plain for s in e["steps"])
    assert all(e["steps"][0]["defects"][0]["kind"] == "unknown_tool" for e in detoured)
    meta = json.loads((tmp_path / "aug.jsonl.meta.json").read_text())
    assert meta["detours"] == 0.3 and meta["balance"] is True and meta["rename"] == 0.5


def test_collect_features_an_environment_lacks_are_named(tmp_path):
    bare = f"{Path(__file__).parent / 'test_evaluate.py'}:make_env"
    for flag, message in (("--rename", "tool_aliases"), ("--balance", "families")):
        cfg = CollectConfig(env=bare, episodes=2, out=str(tmp_path / "x.jsonl"), teacher="expert",
                            rename=0.5 if flag == "--rename" else 0.0, balance=flag == "--balance")
        with pytest.raises(ConfigError, match=message):
            run_collect(cfg, progress=False)


def test_env_file_imports_its_siblings(tmp_path):
    (tmp_path / "shop_helpers.py").write_text("from agentrig.envs.base import Environment\nBASE = Environment\n")
    f = tmp_path / "env.py"
    f.write_text(f"import runpy\nfrom shop_helpers import BASE\nMY = runpy.run_path({str(EXAMPLE)!r})\n"
                 "def make_env():\n    return MY['make_env']()\n")
    assert load_env(f"{f}:make_env").name == "shop"
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_sibling_module\n")
    with pytest.raises(ConfigError, match="failed to import.*no_such_sibling_module"):
        load_env(f"{bad}:make_env")


def _eval(tmp_path, env_spec, *flags):
    from agentrig.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--policy", "expert", "--env", env_spec, "--out", str(out), *flags]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    episodes = [json.loads(x) for x in (out / "episodes_expert.jsonl").read_text().splitlines()]
    return metrics, episodes


def test_eval_runs_the_expert_on_the_environments_own_splits(tmp_path, capsys):
    """An author checks tasks and checker with `agentrig eval --policy expert`; trials keep apart by id."""
    metrics, episodes = _eval(tmp_path, f"{EXAMPLE}:make_env", "--limit", "4", "--trials", "2")
    assert metrics["config"]["splits"] == ["test", "test_unseen_tools"]  # the Environment default
    assert len(episodes) == 16 and all(e["success"] for e in episodes)
    assert len({e["episode_id"] for e in episodes if e["task"]["split"] == "test"}) == 8
    assert metrics["results"]["expert"]["completion"]["value"] == 1.0

    f = tmp_path / "finite.py"
    f.write_text(f"""import runpy
MY = runpy.run_path({str(EXAMPLE)!r})

class Finite(MY['ShopEnv']):
    eval_splits = ('dev',)
    POOL = 3

    def tasks(self, split, n, seed=0, start=0, family_weights=None):
        # a fixed list of 3 tasks per split, wrapped around past its end
        return [super(Finite, self).tasks(split, 1, seed, start=i % self.POOL)[0] for i in range(start, start + n)]

class Pooled(Finite):
    def pool_size(self, split):
        return self.POOL

def make_finite():
    return Finite()

def make_pooled():
    return Pooled()
""")
    from agentrig.cli import main

    assert main(["eval", "--policy", "expert", "--env", f"{f}:make_finite", "--limit", "5",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "twice in split 'dev'" in " ".join(capsys.readouterr().err.split()) and not (tmp_path / "bad").exists()
    metrics, episodes = _eval(tmp_path, f"{f}:make_pooled", "--limit", "5")
    assert metrics["config"]["splits"] == ["dev"] and len(episodes) == 3 and all(e["success"] for e in episodes)
