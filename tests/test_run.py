"""The main job: every stage for real on the tiny profile, then a rerun that resumes instead of redoing."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from agentrig.errors import ConfigError
from agentrig.run import (PROFILES, RunConfig, _curve_steps, _Stages, _train, below_base, load_mix, mix_episodes,
                          parse_mix, run_main_job)

REPO = Path(__file__).resolve().parents[1]
SHOP = f"{REPO}/examples/my_env.py:make_env"  # the example shop environment, with an expert teacher


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


def test_a_refused_env_or_mix_leaves_the_folder_free_for_the_corrected_command(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="unknown environment 'nosuchenv'"):
        run_main_job(RunConfig(out=str(out), profile="tiny", mix="nosuchenv=0.2"))
    with pytest.raises(ConfigError, match="unknown environment 'nosuch'"):
        run_main_job(RunConfig(out=str(out), profile="tiny", env="nosuch"))
    assert not (out / "run_config.json").exists()  # nothing recorded, so the fixed command may use this --out


def _trainer_configs(profile: str, tmp_path, monkeypatch) -> list:
    """The `TrainConfig`s the main job's training stages hand to `run_train` for `profile` (SFT, then DPO)."""
    import agentrig.train.train as train

    handed = []

    def run_train(config, resume=False, callbacks=None):
        handed.append(config)
        return train.TrainResult(str(tmp_path / config.stage / "adapter"), config.output_dir, config.stage, [],
                                 config.max_steps, 0.0, 0, 0, "")

    monkeypatch.setattr(train, "run_train", run_train)
    prof, cfg = PROFILES[profile], RunConfig(out=str(tmp_path), profile=profile)
    sft = _train(cfg, prof, tmp_path, "sft", str(tmp_path / "data"), prof.sft_steps)
    if prof.dpo:
        _train(cfg, prof, tmp_path, "dpo", str(tmp_path / "dpo_pairs.jsonl"), prof.dpo_steps, adapter=sft["adapter"])
    return handed


@pytest.mark.parametrize("profile", list(PROFILES))
def test_profiles_use_the_measured_recipe_and_fit_the_budget(profile, tmp_path, monkeypatch):
    """The LoRA each profile trains, read from the PEFT model that the config it hands the trainer builds: the
    seed's rank and alpha (and dropout, which the seed leaves at TrainConfig's default), on every linear layer
    but the head (the measured recipe, docs/training.md), with the seed's schedule."""
    import torch
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer

    from agentrig.models import quiet_loading, tiny_random_model
    from agentrig.train.train import _lora_config, _training_kwargs
    from agentrig.train.trainconfig import load_config

    seed = load_config(REPO / "examples" / "lora_agent.yaml")
    sft, *dpo = _trainer_configs(profile, tmp_path, monkeypatch)
    base = tiny_random_model(256)
    linear = sorted(n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head")
    with quiet_loading():
        model = get_peft_model(base, _lora_config(sft, base))
    layers = {n.removeprefix("base_model.model."): m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    assert sorted(layers) == linear  # every linear layer, attention and MLP, and not the (tied) head
    assert set(seed.target_modules()) <= {n.rsplit(".", 1)[-1] for n in layers}
    for name, layer in layers.items():
        assert layer.r["default"] == seed.lora_rank, name
        assert layer.scaling["default"] == seed.lora_alpha / seed.lora_rank, name
        dropout = layer.lora_dropout["default"]
        assert (dropout.p if isinstance(dropout, torch.nn.Dropout) else 0.0) == seed.lora_dropout, name
    # SFT compiles its layers on a CPU with a C++ compiler (measured: 1.2x a step); DPO's few steps never do,
    # nor the tiny profile's two; without a compiler the job trains eager rather than stopping.
    from agentrig.run import _compiles
    from agentrig.train.compile import has_cpp_compiler

    assert sft.torch_compile == (profile != "tiny" and has_cpp_compiler())
    assert not any(d.torch_compile for d in dpo)
    # the tool-name tokens weighted 5x in SFT's loss (docs/training.md, row 29); DPO has no token loss to weight
    assert sft.tool_name_weight == 5.0 and all(d.tool_name_weight == 1.0 for d in dpo)
    with monkeypatch.context() as patched:
        patched.setattr("shutil.which", lambda name: None)
        assert not _compiles(PROFILES[profile], "sft")
    args = _training_kwargs(sft, tmp_path / "checkpoints")
    assert (args["learning_rate"], args["lr_scheduler_type"]) == (PROFILES[profile].learning_rate, seed.lr_scheduler_type)
    assert args["max_steps"] == PROFILES[profile].sft_steps
    if profile == "default":
        assert PROFILES[profile].eval_limit >= 40  # the floor for intervals that mean something
        assert _curve_steps(PROFILES["default"]) == [135] and _curve_steps(PROFILES["tiny"]) == [1]
        # ~19 min at ~480 tokens/s (compiled bf16 steps on a 2-core CPU with AMX, docs/training.md row 40); the
        # base model's row on fewer tasks than the adapter's pays for most of the steps past row 35's 200
        tokens_per_step = args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] * sft.max_seq_length
        assert args["max_steps"] * tokens_per_step <= 560_000
        assert PROFILES[profile].base_eval_limit < PROFILES[profile].eval_limit
    # default is SFT only; full and tiny add a DPO round, which continues the SFT adapter (and its saved
    # config states that adapter's LoRA).
    assert len(dpo) == (0 if profile == "default" else 1)
    for config in dpo:
        assert config.adapter_name_or_path == str(tmp_path / "sft" / "adapter")
        assert _lora_config(config, base).to_dict() == _lora_config(sft, base).to_dict()


@pytest.mark.slow
def test_tiny_main_job_end_to_end_and_resume(tmp_path):
    """Every stage of the tiny profile, with `--mix examples/my_env.py:make_env=0.3`: the shop's expert
    episodes join datadesk's in the training data, base and SFT are evaluated on both, the report shows each
    environment's table, and a rerun recomputes nothing."""
    out = tmp_path / "run"
    done = run_main_job(RunConfig(out=str(out), profile="tiny", workers=1, mix=f"{SHOP}=0.3"))
    assert list(done) == ["collect", "collect_mix_0", "data", "sft", "eval", "curve", "eval_mix_0", "rollouts", "pairs",
                          "dpo", "eval_dpo", "ttt", "eval_ttt", "report"]
    # test-time training adapted the SFT adapter to the unseen-tools split's tools, and was evaluated paired
    assert done["ttt"]["split"] == "test_unseen_tools" and done["ttt"]["steps"] == 1
    assert (out / "ttt" / "adapter-ttt" / "adapter_model.safetensors").is_file()
    # the profile's ttt_rollouts: one practice task rolled out, the others learned from their constructed solution
    verified = done["ttt"]["practice"]["verified"]
    assert done["ttt"]["rollouts"]["episodes"] == min(1, verified)
    assert done["ttt"]["rollouts"]["constructed_only"] == verified - min(1, verified)
    assert {r["split"] for r in done["eval_ttt"]["paired"]} == {"test", "test_unseen_tools"}
    assert all(r["n"] == PROFILES["tiny"].eval_limit for r in done["eval_ttt"]["paired"])
    n = PROFILES["tiny"].train_episodes
    assert done["collect"]["episodes"] == n == 24
    assert done["collect_mix_0"]["episodes"] == round(n * 0.3 / 0.7) == 10  # 10 of 34: 29% of all episodes
    assert (done["collect_mix_0"]["env"], done["collect_mix_0"]["share"]) == (SHOP, 0.3)
    shop_lines = (out / "collect" / "mix_0.jsonl").read_text().splitlines()
    assert len(shop_lines) == 10 and {json.loads(line)["task"]["env"] for line in shop_lines} == {"shop"}
    assert {json.loads(line)["task"]["env"] for line in (out / "collect" / "train.jsonl").read_text().splitlines()} \
        == {"datadesk"}
    assert done["data"]["episodes_files"] == [str(out / "collect" / "train.jsonl"), str(out / "collect" / "mix_0.jsonl")]
    # quiet detours (docs/training.md, rows 32, 32s1): on for datadesk's expert, not asked of the shop's, which has none
    meta = {name: json.loads((out / "collect" / f"{name}.jsonl.meta.json").read_text()) for name in ("train", "mix_0")}
    assert meta["train"]["quiet_detours"] is True and meta["mix_0"]["quiet_detours"] is False
    assert "That call was rejected" not in (out / "collect" / "train.jsonl").read_text()
    card = json.loads((out / "data" / "data_card.json").read_text())
    assert set(card["envs"]) == {"datadesk", "shop"} and done["data"]["envs"] == card["envs"]
    # the primary environment's evaluation is as without a mix; the shop's has its own stage and folder
    assert done["eval"]["splits"] == ["test", "test_unseen_tools"]
    assert set(json.loads((out / "eval" / "metrics.json").read_text())["results"]) == {"base", "sft"}
    mixed = done["eval_mix_0"]
    assert (mixed["env"], mixed["env_name"], mixed["splits"]) == (SHOP, "shop", ["test", "test_unseen_tools"])
    payload = json.loads((out / "eval_mix_0" / "metrics.json").read_text())
    assert set(payload["results"]) == {"base", "sft"}
    for name in ("base", "sft"):
        metrics = mixed[name]["metrics"]
        assert set(metrics["by_split"]) == {"test", "test_unseen_tools"}
        assert metrics["episodes"] == 2 * PROFILES["tiny"].eval_limit
        episodes = (out / "eval_mix_0" / Path(mixed[name]["episodes_file"]).name).read_text().splitlines()
        assert {json.loads(line)["task"]["env"] for line in episodes} == {"shop"}
    md = (out / "report.md").read_text()
    assert f"- training mixture: datadesk 24 episodes (70.6%), shop ({SHOP}) 10 episodes (29.4%, share 0.3)" in md
    section = md.split("## Mixed-in environment: shop", 1)[1]
    assert f"Mixed-in environment {SHOP}: evaluation on test, test_unseen_tools with 2 tasks per split" in section
    assert "| metric | base | sft |" in section and "completion on test_unseen_tools" in section
    assert "| family | base | sft |" in section and ("| buy |" in section or "| checkout |" in section)
    assert "Mixed-in environment: shop" in (out / "report.html").read_text()
    # the curve: the base model (the base row's episode), the step-1 snapshot (evaluated by the stage), the final
    # adapter (the evaluation's episode), all on the first test task
    curve = done["curve"]
    assert (curve["split"], curve["tasks"]) == ("test", PROFILES["tiny"].curve_limit) and not (out / "curve" / "episodes_step-2.jsonl").exists()
    assert [p["step"] for p in curve["points"]] == [0, 1, 2] and all(p["completion"]["total"] == 1 for p in curve["points"])
    assert 0 == curve["points"][0]["train_minutes"] < curve["points"][1]["train_minutes"] <= curve["points"][2]["train_minutes"]
    snapshot = [json.loads(line) for line in (out / "curve" / "episodes_step-1.jsonl").read_text().splitlines()]
    first = [json.loads(line) for line in (out / "eval" / "episodes_sft.jsonl").read_text().splitlines()][0]
    assert [e["task"]["id"] for e in snapshot] == [first["task"]["id"]]
    assert [p["completion"]["hits"] for p in curve["points"]][2] == int(first["success"])
    assert "completion curve: the first 1 test tasks at every point" in md
    sft = done["sft"]
    assert f"(SFT at {sft['tokens'] / sft['train_seconds']:.0f} tokens/s)" in md and sft["tokens"] > 0
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
    assert "data:image/png;base64" in html and "sft+dpo" in html and "sft+ttt" in html
    md = (out / "report.md").read_text()
    assert "base" in md and "sft" in md and "## Completion against training minutes" in md
    assert "## Why episodes failed" in md and "failed: " in md
    assert "test-time training on test_unseen_tools: " in md and "sft -> sft+ttt on the same tasks" in md
    # Rerun with the same folder: every stage is skipped, nothing is recomputed.
    mtime = (out / "sft" / "adapter" / "adapter_model.safetensors").stat().st_mtime
    again = run_main_job(RunConfig(out=str(out), profile="tiny", workers=1, mix=f"{SHOP}=0.3"))
    assert again == json.loads((out / "stages.json").read_text())
    assert (out / "sft" / "adapter" / "adapter_model.safetensors").stat().st_mtime == mtime


def test_mix_flag_parses_shares_and_refuses_bad_ones_with_advice():
    # split on the last '=', since a file spec holds ':'; a share is of all teacher episodes
    assert parse_mix(f"{SHOP}=0.3") == ((SHOP, 0.3),)
    assert parse_mix(f" {SHOP}=0.2 , datadesk=0.1") == ((SHOP, 0.2), ("datadesk", 0.1))
    assert parse_mix("none") == parse_mix("None") == ()
    assert RunConfig(mix=f"{SHOP}=0.3").mix == f"{SHOP}=0.3" and RunConfig().mix is None  # None: the profile's
    assert mix_episodes(24, ((SHOP, 0.3),)) == [10]  # 10 of 34 episodes, 29%
    assert mix_episodes(400, (("a", 0.2), ("b", 0.2))) == [133, 133]
    assert mix_episodes(4, (("a", 0.01),)) == [1]  # never none
    for text, message in [(f"{SHOP}=0", r"outside \(0, 0.9\]"), (f"{SHOP}=0.95", r"outside \(0, 0.9\]"),
                          (f"{SHOP}=-0.1", "outside"), (f"{SHOP}=nan", "outside"), (f"{SHOP}=0.6,datadesk=0.5", "add up to 1.1"),
                          (f"{SHOP}=0.3,{SHOP}=0.2", "appears twice"), (f"{SHOP}=lots", "'lots' is not a number"),
                          (SHOP, "write ENV=SHARE, e.g. --mix toolworld=0.3"), ("=0.3", "write ENV=SHARE"),
                          (",", "names no environment")]:
        with pytest.raises(ConfigError, match=message):
            RunConfig(mix=text)  # refused when the config is built, before any run folder is touched
    assert [env.name for env in load_mix(parse_mix(f"{SHOP}=0.3"), "datadesk")] == ["shop"]
    with pytest.raises(ConfigError, match=r"--mix nosuchenv=0.3: unknown environment 'nosuchenv': use 'datadesk', "):
        load_mix(parse_mix("nosuchenv=0.3"), "datadesk")
    with pytest.raises(ConfigError, match=r"--mix /no/such/env.py:make_env=0.3: environment file .* does not exist"):
        load_mix(parse_mix("/no/such/env.py:make_env=0.3"), "datadesk")
    with pytest.raises(ConfigError, match="that is the primary --env already"):
        load_mix(parse_mix("datadesk=0.3"), "datadesk")
    with pytest.raises(ConfigError, match="an MCP server needs its tasks file"):
        load_mix(parse_mix("mcp:stdio:server=0.3"), "datadesk")
    with pytest.raises(ConfigError, match="the mixture: the shares add up to 1"):  # a profile's mix, same rules
        load_mix(((SHOP, 0.5), ("datadesk", 0.5)), "x.py:make_env")


def test_a_folder_from_before_mixtures_resumes_without_one(tmp_path, monkeypatch):
    """A run_config.json without `mix` (and without the folder's resolved mixture) resumes, and keeps training on
    its own environment alone even once the profile's mix is set: no mixed stage is added to a finished run."""
    done = ["collect", "data", "sft", "curve", "eval", "rollouts", "pairs", "dpo", "eval_dpo", "report"]
    old = {k: v for k, v in RunConfig(out=str(tmp_path), profile="tiny", workers=1).__dict__.items() if k != "mix"}
    (tmp_path / "run_config.json").write_text(json.dumps({"config_class": "RunConfig", **old}))
    records = {name: {"seconds": 1.0} for name in done}
    records["report"].update(markdown=str(tmp_path / "report.md"), html=str(tmp_path / "report.html"))
    (tmp_path / "stages.json").write_text(json.dumps(records))
    monkeypatch.setitem(PROFILES, "tiny", replace(PROFILES["tiny"], mix=((SHOP, 0.3),)))
    again = run_main_job(RunConfig(out=str(tmp_path), profile="tiny", workers=1))
    assert list(again) == done  # every stage skipped, none added
    saved = json.loads((tmp_path / "run_config.json").read_text())
    assert saved["mix"] is None and saved["resolved_mix"] == []
    with pytest.raises(ConfigError, match="holds a run with other settings"):  # an explicit --mix is another run
        run_main_job(RunConfig(out=str(tmp_path), profile="tiny", workers=1, mix=f"{SHOP}=0.3"))


def test_sft_steps_overrides_the_profile_and_refuses_nonsense(tmp_path):
    """`agentrig run --sft-steps N`: the profile with N steps (the curve's snapshots follow them), nothing else
    changed; a run folder records it, so resuming with other steps is another run; 0 is refused with advice."""
    from agentrig.cli import main

    assert RunConfig().profile_settings() is PROFILES["default"]
    prof = RunConfig(sft_steps=200).profile_settings()
    assert prof.sft_steps == 200 and _curve_steps(prof) == [100]
    assert replace(prof, sft_steps=PROFILES["default"].sft_steps) == PROFILES["default"]  # nothing else changed
    with pytest.raises(ConfigError, match="--sft-steps must be at least 1, got 0; leave it out for the profile's 270"):
        RunConfig(sft_steps=0)
    assert main(["run", "--sft-steps", "0", "--out", str(tmp_path / "never")]) == 2
    assert not (tmp_path / "never").exists()
    (tmp_path / "run_config.json").write_text(json.dumps({"config_class": "RunConfig", **asdict(
        RunConfig(out=str(tmp_path), profile="tiny", workers=1))}))
    (tmp_path / "stages.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        run_main_job(RunConfig(out=str(tmp_path), profile="tiny", workers=1, sft_steps=3))


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


FS_BIN = REPO / ".venv" / "npm" / "node_modules" / ".bin" / "mcp-server-filesystem"


@pytest.mark.slow
@pytest.mark.skipif(not FS_BIN.exists(), reason="the MCP filesystem server is not installed (`make setup` with npm)")
def test_tiny_main_job_on_an_mcp_server(tmp_path):
    """`agentrig run --env mcp:... --tasks ...`: every stage on the reference filesystem server's real tools, the
    model teacher (DPO rollouts) included; evaluation on its test split, the curve on its first task."""
    pytest.importorskip("mcp")
    files = "{sandbox:" + str(REPO / "examples" / "mcp" / "files") + "}"  # a fresh copy per episode
    cfg = RunConfig(out=str(tmp_path / "run"), profile="tiny", workers=1, env=f"mcp:stdio:{FS_BIN} {files}",
                    tasks=str(REPO / "examples" / "mcp" / "files_tasks.jsonl"))
    done = run_main_job(cfg)
    assert set(done) == {"collect", "data", "sft", "eval", "curve", "rollouts", "pairs", "dpo", "eval_dpo", "ttt",
                         "eval_ttt", "report"}
    assert done["curve"]["split"] == "test" and [p["step"] for p in done["curve"]["points"]] == [0, 1, 2]
    assert done["ttt"]["split"] == "test"  # the file's only evaluation split: its tools
    # the filesystem server answers in plain text, so no practice task can quote a result: the stage says so
    assert "no practice task" in done["ttt"]["skipped"] and done["eval_ttt"]["skipped"] == done["ttt"]["skipped"]
    assert "test-time training on test: skipped" in (tmp_path / "run" / "report.md").read_text()
    assert done["collect"]["episodes"] == PROFILES["tiny"].train_episodes and done["collect"]["successes"] >= 20
    assert done["eval"]["splits"] == ["test"]
    payload = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    assert set(payload["results"]) == {"base", "sft"}
    rollouts = (tmp_path / "run" / "collect" / "rollouts.jsonl").read_text().splitlines()
    assert len(rollouts) == PROFILES["tiny"].rollout_episodes
    assert all(json.loads(line)["metadata"]["mcp"]["name"] == "secure-filesystem-server" for line in rollouts)
    assert "evaluation on test with" in (tmp_path / "run" / "report.md").read_text()
