"""Progress of long stages (collect, train, the DPO reference pass, eval), on a terminal and off it.

On a terminal it is a rich bar (description, bar, done/total, the stage's own fields, ETA). Written to a
file or a CI log, where a bar shows nothing until it ends, it is a plain line every `interval_s` seconds
(`AGENTRIG_PROGRESS_INTERVAL`, default 30) and one at the end:

    train smollm2-135m: 120/200 (60%), 9m12s elapsed, ETA 6m08s, loss 0.4123, 440 tok/s

The line's ETA is the rate after the first unit times what is left: a stage's first step carries its warm-up
(with `torch_compile`, about a minute of compilation), which an average from the start would spread over the
whole stage.

Usage: `with progress("eval sft", total=40, fields=fmt) as bar: bar.update(advance=1, loss=0.3)`, where
`fmt(fields) -> str` renders the stage's fields (loss, counts) for both forms.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

DEFAULT_INTERVAL_S = 30.0


def _interval() -> float:
    raw = os.environ.get("AGENTRIG_PROGRESS_INTERVAL", "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Bar:
    """One stage's progress; `update(completed=, advance=, **fields)` moves it."""

    def __init__(self, description: str, total: int, completed: int, fields: Callable[[dict[str, Any]], str] | None,
                 stream: IO[str], terminal: bool, transient: bool, interval_s: float | None):
        self.description, self.total, self.completed = description, total, completed
        self.fmt = fields or (lambda f: "")
        self.stream, self.terminal = stream, terminal
        self.interval_s = _interval() if interval_s is None else interval_s
        self.values: dict[str, Any] = {}
        self.started = time.monotonic()
        self.first = completed  # resumed stages: the rate counts only this run's work
        # (time, count) when the first unit of this run ended: the rate is taken after it, since the first step of a
        # stage carries its warm-up (a compiled model's compilation, allocator growth) and can take minutes
        self.warm: tuple[float, int] | None = None
        self.last_line = self.started
        self.rich: Any = None
        if terminal:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.rich = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[extra]}"), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=Console(file=stream), transient=transient)
            self.rich.start()
            self.task = self.rich.add_task(description, total=total, completed=completed, extra="")

    def update(self, completed: int | None = None, advance: int = 0, **fields: Any) -> None:
        """Set or advance the count and the stage's fields; off a terminal, print a line when one is due."""
        self.completed = (self.completed if completed is None else completed) + advance
        self.values.update(fields)
        if self.warm is None and self.completed > self.first:
            self.warm = (time.monotonic(), self.completed)
        if self.rich is not None:
            self.rich.update(self.task, completed=self.completed, extra=self.fmt(self.values))
        elif time.monotonic() - self.last_line >= self.interval_s and self.completed < self.total:
            self.line()

    def line(self) -> None:
        """One plain progress line (what a log file or CI shows)."""
        now = time.monotonic()
        self.last_line = now
        elapsed = now - self.started
        done = self.completed - self.first
        pct = 100 * self.completed / self.total if self.total else 100.0
        text = f"{self.description}: {self.completed}/{self.total} ({pct:.0f}%), {_clock(elapsed)} elapsed"
        if 0 < done and self.completed < self.total:
            since, at = self.warm if self.warm and self.completed > self.warm[1] else (self.started, self.first)
            text += f", ETA {_clock((now - since) / (self.completed - at) * (self.total - self.completed))}"
        extra = self.fmt(self.values)
        print(text + (f", {extra}" if extra else ""), file=self.stream, flush=True)

    def close(self) -> None:
        """The final state: the bar drawn (or removed when transient), or the last line."""
        if self.rich is not None:
            self.rich.stop()
        else:
            self.line()


@contextmanager
def progress(description: str, total: int, completed: int = 0, *,
             fields: Callable[[dict[str, Any]], str] | None = None, stream: IO[str] | None = None,
             transient: bool = False, interval_s: float | None = None,
             enabled: bool = True) -> Iterator[Bar | None]:
    """A `Bar` on `stream` (default stderr): rich on a terminal, plain lines otherwise; None when disabled."""
    if not enabled:
        yield None
        return
    stream = sys.stderr if stream is None else stream
    terminal = bool(getattr(stream, "isatty", lambda: False)())
    bar = Bar(description, total, completed, fields, stream, terminal, transient, interval_s)
    try:
        yield bar
    finally:
        bar.close()
