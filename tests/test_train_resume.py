"""Checkpoints and --resume: an interrupted run ends where an uninterrupted one does.

One test interrupts in-process (a callback stops after a checkpoint), for SFT and for DPO; one SIGKILLs a real
`python -m agentrig train` process after a checkpoint and resumes it from the command line, and one runs
the `accelerate launch` path with a single CPU process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_train import synthetic_samples, tiny_config, tiny_model_dir, write_jsonl  # noqa: F401 (fixture)
from test_train_dpo import sft_adapter, synthetic_pairs  # noqa: F401 (fixture)


def _adapter_tensors(folder: str | Path) -> dict:
    from safetensors.torch import load_file

    return load_file(Path(folder) / "adapter_model.safetensors")


def _assert_same_adapter(a: str | Path, b: str | Path) -> None:
    import torch

    ta, tb = _adapter_tensors(a), _adapter_tensors(b)
    assert ta.keys() == tb.keys()
    for key in ta:
        assert torch.allclose(ta[key], tb[key], atol=1e-5, rtol=1e-4), key


def test_resumed_run_matches_uninterrupted(tmp_path, tiny_model_dir):
    from transformers import TrainerCallback

    from agentrig.train.train import last_complete_checkpoint, run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=2))
    full = run_train(tiny_config(tiny_model_dir, data, tmp_path / "full", max_steps=8, save_steps=4,
                                 lr_scheduler_type="cosine", gradient_accumulation_steps=2))

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 4:
                control.should_training_stop = True

    config = tiny_config(tiny_model_dir, data, tmp_path / "cut", max_steps=8, save_steps=4,
                         lr_scheduler_type="cosine", gradient_accumulation_steps=2)
    first = run_train(config, callbacks=[StopAt()])
    assert first.global_step == 4
    assert last_complete_checkpoint(tmp_path / "cut" / "checkpoints").name == "checkpoint-4"
    resumed = run_train(config, resume=True)

    assert resumed.global_step == 8
    assert [h["step"] for h in resumed.loss_history] == list(range(1, 9))  # the curve covers the whole run
    for a, b in zip(full.loss_history, resumed.loss_history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
    _assert_same_adapter(full.adapter_dir, resumed.adapter_dir)


def test_resumed_dpo_run_matches_uninterrupted(tmp_path, tiny_model_dir, sft_adapter):
    """DPO with --resume: the same pairs, the same reference log-probs (the SFT adapter's, not the
    checkpoint's), the same losses and the same adapter as a run that was never stopped."""
    import json

    from transformers import TrainerCallback

    from agentrig.train.train import last_complete_checkpoint, run_train

    data = write_jsonl(tmp_path / "pairs.jsonl", synthetic_pairs(16, seed=3))

    def config(out):  # 6 steps of 2: 12 of the 16 pairs, a seeded sample the resumed run must draw again
        return tiny_config(tiny_model_dir, data, tmp_path / out, stage="dpo", adapter_name_or_path=str(sft_adapter),
                           max_steps=6, save_steps=3, learning_rate=1e-2, pref_beta=0.5, pref_ftx=1.0,
                           lr_scheduler_type="cosine")

    full = run_train(config("full"))

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                control.should_training_stop = True

    first = run_train(config("cut"), callbacks=[StopAt()])
    assert first.global_step == 3
    assert last_complete_checkpoint(tmp_path / "cut" / "checkpoints").name == "checkpoint-3"
    resumed = run_train(config("cut"), resume=True)

    assert resumed.global_step == 6 and resumed.stats["pairs"] == 12
    references = [(tmp_path / out / "reference_logps.jsonl").read_text().splitlines() for out in ("full", "cut")]
    assert len(references[0]) == 12
    for a, b in zip(*references, strict=True):
        a, b = json.loads(a), json.loads(b)
        assert a["pair_id"] == b["pair_id"]
        assert (a["chosen"], a["rejected"]) == pytest.approx((b["chosen"], b["rejected"]), rel=1e-5)
    assert [h["step"] for h in resumed.loss_history] == list(range(1, 7))
    for a, b in zip(full.loss_history, resumed.loss_history, strict=True):
        for key in ("loss", "margin", "chosen_nll"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
    _assert_same_adapter(full.adapter_dir, resumed.adapter_dir)


def test_incomplete_checkpoint_is_skipped(tmp_path):
    from agentrig.train.train import last_complete_checkpoint

    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text('{"glob')  # killed mid-write
    (tmp_path / "checkpoint-6").mkdir()  # killed before the state was written
    assert last_complete_checkpoint(tmp_path).name == "checkpoint-2"


def _write_config(path: Path, config) -> Path:
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@pytest.mark.slow
def test_sigkilled_process_resumes_and_finishes(tmp_path, tiny_model_dir):
    from agentrig.train.train import last_complete_checkpoint, run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=4))
    steps = 12
    reference = run_train(tiny_config(tiny_model_dir, data, tmp_path / "reference", max_steps=steps, save_steps=2))
    config = tiny_config(tiny_model_dir, data, tmp_path / "killed", max_steps=steps, save_steps=2)
    config_path = _write_config(tmp_path / "train.yaml", config)
    command = [sys.executable, "-m", "agentrig", "train", "--config", str(config_path)]
    checkpoints = tmp_path / "killed" / "checkpoints"

    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not checkpoints.is_dir() or last_complete_checkpoint(checkpoints) is None:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL  # it was killed, not finished
    killed_at = int(last_complete_checkpoint(checkpoints).name.split("-")[1])
    assert killed_at < steps
    assert not (tmp_path / "killed" / "adapter").exists()

    done = subprocess.run(command + ["--resume"], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{steps} steps" in done.stdout
    _assert_same_adapter(reference.adapter_dir, tmp_path / "killed" / "adapter")


@pytest.mark.slow
def test_accelerate_launch_one_cpu_process(tmp_path, tiny_model_dir):
    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4, seed=5))
    config_path = _write_config(tmp_path / "train.yaml",
                                tiny_config(tiny_model_dir, data, tmp_path / "run", max_steps=2, save_steps=2))
    # `python -m accelerate.commands.launch` is the `accelerate launch` CLI, found without the venv on PATH.
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no",
               "--dynamo_backend", "no", "--cpu", "-m", "agentrig", "train", "--config", str(config_path)]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 steps" in done.stdout
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
