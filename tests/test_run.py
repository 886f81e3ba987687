"""The main job: every stage for real on the tiny profile, then a rerun that resumes instead of redoing."""

from __future__ import annotations

import json

import pytest

from agentrig.errors import ConfigError
from agentrig.run import PROFILES, RunConfig, _curve_steps, _Stages, below_base, run_main_job


def test_stage_record_skips_finished_stages(tmp_path):
    from rich.console import Console

    calls = []
    st = _Stages(tmp_path)
    st.run("a", "stage a", lambda: calls.append("a") or {"x": 1}, Console(), 0.0)
    again = _Stages(tmp_path)  # a new invocation reads the record from disk
    out = again.run("a", "stage a", lambda: calls.append("a2") or {"x": 2}, Console(), 0.0)
    assert calls == ["a"] and out["x"] == 1 and "seconds" in out


def test_a_folder_holding_another_run_is_refused(tmp_path):
    (tmp_path / "run_config.json").write_text(json.dumps({**RunConfig(out=str(tmp_path)).__dict__, "seed": 7}))
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        run_main_job(RunConfig(out=str(tmp_path), profile="tiny"))


def test_profiles_use_the_measured_recipe_and_fit_the_budget():
    default = PROFILES["default"]
    assert not default.dpo and PROFILES["full"].dpo
    assert (default.lora_target, default.learning_rate, default.tool_listing) == ("all", 1e-3, "compact")
    assert default.eval_limit >= 40  # the floor for intervals that mean something
    # ~15.5 min at ~440 tokens/s (4.65 s a 2,048-token step in bf16 on the 2-core machine, docs/benchmarks.md)
    assert default.sft_steps * default.batch_size * default.max_seq_length <= 420_000
    assert _curve_steps(default) == [67, 133] and _curve_steps(PROFILES["tiny"]) == [1]


@pytest.mark.slow
def test_tiny_main_job_end_to_end_and_resume(tmp_path):
    out = tmp_path / "run"
    done = run_main_job(RunConfig(out=str(out), profile="tiny", workers=1))
    assert set(done) == {"collect", "data", "sft", "curve", "eval", "rollouts", "pairs", "dpo", "eval_dpo", "report"}
    assert [p["step"] for p in done["curve"]["points"]] == [1, 2]  # the step-1 snapshot, then the final adapter
    assert 0 < done["curve"]["points"][0]["train_minutes"] <= done["curve"]["points"][1]["train_minutes"]
    assert (out / "sft" / "snapshots" / "step-1" / "adapter_model.safetensors").is_file()
    assert done["collect"]["episodes"] == PROFILES["tiny"].train_episodes
    assert (out / "sft" / "adapter" / "adapter_model.safetensors").is_file()
    assert (out / "dpo" / "adapter" / "adapter_model.safetensors").is_file()
    pairs = done["pairs"]  # the round's mix: dpo_steps x batch pairs, the rollouts' own first
    used = (out / "dpo_pairs.jsonl").read_text().splitlines()
    assert pairs["used"] == len(used) == min(pairs["pairs"], 2) and sum(pairs["used_kinds"].values()) == len(used)
    assert len((out / "dpo_pairs_all.jsonl").read_text().splitlines()) == pairs["pairs"]
    payload = json.loads((out / "eval" / "metrics.json").read_text())
    assert payload["schema"] == "agentrig.metrics/1"  # one schema with `agentrig eval` (test_evaluate)
    assert set(payload) == {"schema", "config", "limits", "results", "throughput", "episodes"}
    metrics = payload["results"]
    assert set(metrics) == {"base", "sft"}
    assert set(json.loads((out / "eval_dpo" / "metrics.json").read_text())["results"]) == {"sft+dpo"}
    html = (out / "report.html").read_text()
    assert "data:image/png;base64" in html and "sft+dpo" in html
    md = (out / "report.md").read_text()
    assert "base" in md and "sft" in md and "## Completion against training minutes" in md
    assert "## Why episodes failed" in md and "failed: " in md
    # Rerun with the same folder: every stage is skipped, nothing is recomputed.
    mtime = (out / "sft" / "adapter" / "adapter_model.safetensors").stat().st_mtime
    again = run_main_job(RunConfig(out=str(out), profile="tiny", workers=1))
    assert again == json.loads((out / "stages.json").read_text())
    assert (out / "sft" / "adapter" / "adapter_model.safetensors").stat().st_mtime == mtime


def test_the_report_names_families_where_training_lost_ground():
    from agentrig.evals.metrics import compute_metrics
    from agentrig.harness.trajectory import Episode, TaskSpec

    def eps(outcomes):
        return [Episode(episode_id=f"{fam}{i}", task=TaskSpec(id=f"{fam}{i}", prompt="p", family=fam), protocol="hermes",
                        system_prompt="s", tools=[], success=ok, termination="final_answer", check={"reasons": ["x"]})
                for i, (fam, ok) in enumerate(outcomes)]

    base = compute_metrics(eps([("no_tool", True), ("no_tool", True), ("lookup", False)]))
    trained = compute_metrics(eps([("no_tool", True), ("no_tool", False), ("lookup", True)]))
    assert below_base(base, trained) == ("families where the trained adapter completes less than the base model: "
                                         "no_tool (1/2 vs base 2/2)")
    assert below_base(base, base) == "no family where the trained adapter completes less than the base model"
