"""Progress off a terminal: long stages print a plain line at a steady interval and one at the end (issue 17)."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from test_train import synthetic_samples, tiny_config, tiny_model_dir, write_jsonl  # noqa: F401 (fixture)

from agentrig.cli import main
from agentrig.progress import progress
from agentrig.train.trainlog import ProgressCallback, TokenMeter


def test_a_log_gets_a_line_per_interval_and_the_final_state():
    out = io.StringIO()
    with progress("stage", 4, fields=lambda f: f"loss {f['loss']:.2f}" if f else "", stream=out,
                  interval_s=0) as bar:
        for i in range(4):
            bar.update(advance=1, loss=1.0 / (i + 1))
    lines = out.getvalue().splitlines()
    assert len(lines) == 4  # steps 1-3 when due (every update at interval 0) and the final line; no bar codes
    assert lines[0].startswith("stage: 1/4 (25%), ") and "ETA" in lines[0] and lines[0].endswith("loss 1.00")
    assert re.fullmatch(r"stage: 4/4 \(100%\), \d+s elapsed, loss 0\.25", lines[-1])
    quiet = io.StringIO()
    with progress("stage", 100, stream=quiet, interval_s=3600) as bar:
        for _ in range(100):
            bar.update(advance=1)
    assert quiet.getvalue().count("\n") == 1  # the interval holds back all but the final line
    with progress("off", 3, enabled=False) as none:
        assert none is None


def test_training_progress_prints_lines_when_not_on_a_terminal(capsys, monkeypatch):
    monkeypatch.setenv("AGENTRIG_PROGRESS_INTERVAL", "0")
    cb = ProgressCallback(TokenMeter(), "sft tiny")
    state = SimpleNamespace(is_world_process_zero=True, max_steps=3, global_step=0)
    cb.on_train_begin(None, state, None)
    for step in (1, 2, 3):  # the Trainer's order: on_step_end (should_log set by its flow callback), then on_log
        state.global_step = step
        cb.meter.add(100, 40)
        cb.on_step_end(None, state, SimpleNamespace(should_log=True))
        cb.on_log(None, state, None, logs={"loss": 2.0 / step})
    cb.on_train_end(None, state, None)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].startswith("sft tiny: 1/3 (33%)") and "loss 2.0000" in lines[0] and "tok/s" in lines[0], err
    assert "loss 1.0000" in lines[1] and "nan" not in err
    assert err.rstrip().splitlines()[-1].startswith("sft tiny: 3/3 (100%)")


def test_agentrig_eval_to_a_log_shows_progress_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AGENTRIG_PROGRESS_INTERVAL", "0")
    rc = main(["eval", "--policy", "expert", "--split", "test", "--limit", "3", "--faults", "0", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "eval expert: 1/3 (33%)" in err and "1 completed" in err
    assert "eval expert: 3/3 (100%)" in err and "3 completed" in err


def test_a_real_training_run_logs_progress_and_no_library_noise(tmp_path, tiny_model_dir, capfd, monkeypatch):
    import warnings

    from agentrig.train.train import run_train

    monkeypatch.setenv("AGENTRIG_PROGRESS_INTERVAL", "0")
    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4, seed=3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_train(tiny_config(tiny_model_dir, data, tmp_path / "run", max_steps=3, save_steps=3))
    err = capfd.readouterr().err
    assert re.search(r": 1/3 \(33%\), .*loss \d", err) and re.search(r": 3/3 \(100%\)", err), err
    assert "loss nan" not in err  # step 1's line shows step 1's loss, not the one before it
    assert "is_gradient_checkpointing" not in err
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


def test_the_eta_leaves_out_the_first_unit_and_its_warm_up(monkeypatch):
    """A stage whose first step takes a minute (compilation) and the rest 2 s each: once a second step is done the
    ETA is the steady rate times what is left, not the average over the warm-up."""
    import agentrig.progress as prog

    clock = [1000.0]
    monkeypatch.setattr(prog.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with progress("sft", 11, stream=out, interval_s=0) as bar:
        clock[0] += 60.0
        bar.update(advance=1)  # the first step: compilation
        for _ in range(4):
            clock[0] += 2.0
            bar.update(advance=1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "sft: 1/11 (9%), 1m00s elapsed, ETA 10m00s"  # one step seen: the only rate there is
    assert lines[1] == "sft: 2/11 (18%), 1m02s elapsed, ETA 18s"  # 9 steps left at 2 s, not at 31 s
    assert lines[4] == "sft: 5/11 (45%), 1m08s elapsed, ETA 12s"
