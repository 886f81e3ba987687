"""What a training run shows and leaves behind: a progress bar, token counts, the loss curve.

`TokenMeter` is filled by the trainers' `compute_loss` (tokens and supervised tokens actually run);
`ProgressCallback` shows progress with loss, the latest validation loss, tokens/s and ETA on the main
process (a bar on a terminal, a line at a steady interval in a log: `agentrig.progress`);
`save_loss_curve` writes the `Trainer` log history as `loss_curve.json` and `loss_curve.png`, the
validation loss (`eval_loss`, on the rows of the steps it was measured at) as a second line. The log
history is part of every checkpoint, so a resumed run's curve covers the whole run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

CURVE_KEYS = ("loss", "learning_rate", "epoch", "grad_norm", "margin", "reward_margin", "accuracy", "chosen_nll")
VALIDATION_KEY = "eval_loss"


@dataclass
class TokenMeter:
    """Tokens run through the model in this process since the meter was created."""

    tokens: int = 0
    supervised_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, tokens: int, supervised: int) -> None:
        """Count one micro-batch."""
        self.tokens += tokens
        self.supervised_tokens += supervised

    def rates(self) -> tuple[float, float]:
        """(tokens/s, supervised tokens/s) since the meter started."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return self.tokens / elapsed, self.supervised_tokens / elapsed


class ProgressCallback(TrainerCallback):
    """Progress of training (`agentrig.progress`: a bar on a terminal, else a line at a steady interval):
    step, loss, tokens/s, supervised tokens/s, ETA (main process only)."""

    def __init__(self, meter: TokenMeter, description: str) -> None:
        self.meter = meter
        self.description = description
        self.stack: ExitStack | None = None
        self.bar: Any = None
        self.loss = float("nan")
        self.val_loss: float | None = None
        self.pending: Any = None  # a finished step whose loss is logged after on_step_end (the Trainer's order)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start at the (possibly resumed) global step."""
        if not state.is_world_process_zero:
            return
        from agentrig.progress import progress

        self.stack = ExitStack()
        self.bar = self.stack.enter_context(progress(self.description, state.max_steps, state.global_step,
                                                     fields=_train_fields))
        self.meter.started = time.perf_counter()
        self.meter.tokens = self.meter.supervised_tokens = 0

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        """Remember the latest logged loss and validation loss."""
        if logs and "loss" in logs:
            self.loss = float(logs["loss"])
        if logs and VALIDATION_KEY in logs:
            self.val_loss = float(logs[VALIDATION_KEY])
        if self.pending is not None:
            state, self.pending = self.pending, None
            self._show(state)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Advance after each optimizer step; a step that will log its loss is shown when it does (the Trainer
        calls on_log after on_step_end), so the line never shows the step before's loss, nor `nan` at step 1."""
        if self.bar is not None and getattr(control, "should_log", False):
            self.pending = state
            return
        self._show(state)

    def _show(self, state: Any) -> None:
        if self.bar is None:
            return
        tps, sps = self.meter.rates()
        self.bar.update(completed=state.global_step, loss=self.loss, val=self.val_loss, tps=tps, sps=sps)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Show the final state and release the terminal."""
        if self.bar is not None and self.stack is not None:
            self._show(state)
            self.stack.close()
            self.bar = self.stack = None


def _train_fields(f: dict[str, Any]) -> str:
    if "tps" not in f:
        return ""
    val = f", val {f['val']:.4f}" if f.get("val") is not None else ""
    return f"loss {f['loss']:.4f}{val}, {f['tps']:.0f} tok/s ({f['sps']:.0f} supervised)"


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """Progress on stderr for work outside `Trainer` (DPO's reference pass); yields `advance(n)`."""
    from agentrig.progress import progress

    with progress(description, total) as bar:
        assert bar is not None
        yield lambda n: bar.update(advance=n)


def loss_history(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per-step training records (step, loss and whatever else was logged) from `Trainer` log history; the
    validation loss goes on the row of the step it was measured at (every step has one: it logs each step)."""
    rows: dict[int, dict[str, float]] = {}
    for entry in log_history:
        if "loss" in entry:
            row = rows.setdefault(int(entry["step"]), {"step": int(entry["step"])})
            row.update({k: float(entry[k]) for k in CURVE_KEYS if k in entry})
    for entry in log_history:
        if VALIDATION_KEY in entry and int(entry["step"]) in rows:
            rows[int(entry["step"])][VALIDATION_KEY] = float(entry[VALIDATION_KEY])
    return [rows[step] for step in sorted(rows)]


def save_loss_curve(history: list[dict[str, float]], folder: str | Path, title: str) -> tuple[Path, Path]:
    """Write `loss_curve.json` and `loss_curve.png` into `folder`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, png_path = folder / "loss_curve.json", folder / "loss_curve.png"
    json_path.write_text(json.dumps(history, indent=1))
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], marker="." if len(history) < 60 else None,
            label="training")
    validated = [h for h in history if VALIDATION_KEY in h]
    if validated:
        ax.plot([h["step"] for h in validated], [h[VALIDATION_KEY] for h in validated], marker="o", label="validation")
        ax.legend()
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return json_path, png_path


class SnapshotCallback(TrainerCallback):
    """Save the adapter at chosen optimizer steps (`folder/step-N`), with the training seconds spent so far.

    For a completion-against-training-time curve: the checkpoints `--resume` needs are pruned as training
    goes, these snapshots are not. `seconds.json` in `folder` maps each snapshot's step to the seconds of
    training before it (this process's; a resumed run adds the seconds recorded before the resume point).
    """

    def __init__(self, folder: str | Path, steps: list[int]) -> None:
        self.folder = Path(folder)
        self.steps = set(steps)
        self.started = time.perf_counter()
        self.offset = 0.0

    def _record(self) -> dict[str, float]:
        path = self.folder / "seconds.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start the clock, counting the seconds of snapshots taken before a resume."""
        self.started = time.perf_counter()
        before = {int(k): v for k, v in self._record().items() if int(k) <= state.global_step}
        self.offset = max(before.values(), default=0.0)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Save the adapter when this step is one of the chosen ones (main process only)."""
        if state.global_step not in self.steps or not state.is_world_process_zero or model is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(self.folder / f"step-{state.global_step}")
        record = self._record()
        record[str(state.global_step)] = round(self.offset + time.perf_counter() - self.started, 1)
        (self.folder / "seconds.json").write_text(json.dumps(record, indent=1))
