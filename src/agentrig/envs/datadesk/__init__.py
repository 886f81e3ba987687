"""The built-in `datadesk` environment: "look up and summarize the data I name" over a seeded SQLite business DB.

`db.py` generates the database, `tools.py` defines the tools, `tasks.py` the task families and splits,
`checker.py` the success rules, `teacher.py` the expert teacher for these families. Its facts for
augmentation and faults (tool and parameter aliases, drift names, side-effect tools) are in `tools.py`,
offered through the `Environment` attributes, so `collect` needs no datadesk-specific code.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from agentrig.envs.base import CheckResult, Environment
from agentrig.envs.datadesk.checker import check_datadesk
from agentrig.envs.datadesk.db import ensure_db, open_readonly
from agentrig.envs.datadesk.tasks import FAMILIES, TaskFactory
from agentrig.envs.datadesk.tools import (ALL_TOOLS, DRIFT_NAMES, PARAM_ALIASES, SEEN_TOOLS, SIDE_EFFECT_TOOLS,
                                          TOOL_ALIASES, DatadeskState, bind_tools)
from agentrig.harness.tools import ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec


class DatadeskEnv(Environment):
    """Seeded business-data tasks; the database is generated on first use into the agentrig cache."""

    name = "datadesk"
    tool_aliases = TOOL_ALIASES
    param_aliases = PARAM_ALIASES
    drift_names = DRIFT_NAMES
    side_effect_tools = SIDE_EFFECT_TOOLS

    def __init__(self, db_seed: int = 0):
        self.db_seed = db_seed
        self.db_file: Path = ensure_db(db_seed)
        self._conn: sqlite3.Connection | None = None
        self._factory: TaskFactory | None = None

    @property
    def factory(self) -> TaskFactory:
        """The task generator (opened lazily, so a pickled env opens its own connection per process)."""
        if self._factory is None:
            self._conn = open_readonly(self.db_file)
            self._factory = TaskFactory(self._conn, self.db_seed)
        return self._factory

    def __getstate__(self) -> dict[str, Any]:
        return {"db_seed": self.db_seed, "db_file": self.db_file, "_conn": None, "_factory": None}

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0,
              family_weights: dict[str, float] | None = None) -> list[TaskSpec]:
        """Tasks start..start+n-1 of `split`; `family_weights` reweights the family draw (tool balance)."""
        self.check_split(split)
        return [self.factory.task(split, seed, i, family_weights) for i in range(start, start + n)]

    def setup(self, task: TaskSpec) -> tuple[ToolSet, DatadeskState]:
        """All tools of the task's split bound to a fresh state; held-out ticket tools exist only for unseen tasks."""
        state = DatadeskState(self.db_file)
        names = ALL_TOOLS if task.metadata.get("unseen_tools") else SEEN_TOOLS
        return ToolSet(bind_tools(state, names), allowed=list(task.allowed_tools)), state

    def check(self, task: TaskSpec, state: DatadeskState, episode: Episode) -> CheckResult:
        """See `agentrig.envs.datadesk.checker`."""
        return check_datadesk(task, state, episode)

    def close(self, state: DatadeskState) -> None:
        """Close the episode's database connections."""
        state.close()

    def families(self, split: str, seed: int = 0) -> dict[str, list[str]]:
        """The seen families (in `FAMILIES` order), each with the tools a sample of 200 tasks of `split` needs."""
        sample = self.tasks(split, 200, seed=10_000 + seed)
        tools: dict[str, dict[str, None]] = {f: {} for f in FAMILIES}
        for t in sample:  # the union over the family's variants, in the order they first appear
            tools.setdefault(t.family, {}).update(dict.fromkeys(t.expected.get("needed_tools", [])))
        return {f: list(tools[f]) for f in FAMILIES}

    def expert(self, detour_rate: float = 0.0, seed: int = 0, repeat_rate: float = 0.0, mixup_rate: float = 0.0,
               borrow_rate: float = 0.0, sql_rate: float = 0.0, quiet_detours: bool = False,
               plan_first: bool = False, sequential: bool = False, retry_round: bool = False,
               retry_empty: bool = False) -> Any:
        """The programmatic teacher (`agentrig.envs.datadesk.teacher.ExpertTeacher`); `repeat_rate`: its repeat
        detours (a call that answered, sent again with weight 0, then the right next step); `mixup_rate`: its mix-up
        detours (the request's name sent to the look-up of another kind of thing, weight 0, then the right call);
        `borrow_rate`: the share of its `detour_rate` detours that add a field borrowed from another offered tool;
        `sql_rate`: its SQL detours (an episode's first `run_sql` query sent with a wrong column, weight 0, then the
        right one); `quiet_detours`: the step after a `detour_rate` detour is the corrected call alone, with no
        "That call was rejected; here is the corrected one." before it; `plan_first`: the first step's calls come
        behind a one-line plan of the task's happy path (`teacher.plan_line`); `sequential`: the calls a step needs go
        out one a turn, each result right after its call; `retry_round`: after a turn of several calls in which some
        failed, the next turn sends that whole turn again (the failed calls retried or switched, the others as they
        were), so its results come back together and in order; `retry_empty`: a look-up that answers "No result" is
        sent once more before the `run_sql` fallback."""
        from agentrig.envs.datadesk.teacher import ExpertTeacher

        return ExpertTeacher(detour_rate=detour_rate, seed=seed, repeat_rate=repeat_rate, mixup_rate=mixup_rate,
                             borrow_rate=borrow_rate, sql_rate=sql_rate, quiet_detours=quiet_detours,
                             plan_first=plan_first, sequential=sequential, retry_round=retry_round,
                             retry_empty=retry_empty)
