"""multi_turn_base: BFCL's pure-Python backends, a safe call dispatcher, and BFCL's state/response checker.

BFCL's own executor rewrites each call string and `eval()`s it. agentrig never evaluates text: a call
string is parsed with `ast` and accepted only when it is one plain call `name(arg, key=value)` whose
arguments are literals; structured calls from the harness (`ToolCall`) skip parsing. Either way the call is
dispatched to a public method of the entry's backend instances. Results are formatted as BFCL formats them
(strings as they are, dicts as JSON, errors as `Error during execution: ...`), so the model sees what a
BFCL run would show it.

Scoring (bfcl_eval/eval_checker/multi_turn_eval/multi_turn_checker.py): the model's calls and the
ground-truth calls are executed turn by turn on two fresh sets of instances; after each turn with
ground-truth calls, the model must have made a call, the public state of every instance must equal the
ground truth's, and every ground-truth result of that turn must appear among the model's results so far
(unordered, with multiplicity). Turns whose ground truth is empty are not checked (BFCL imports but does
not apply its multi-turn irrelevance check); their calls still execute so later states stay comparable.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrig.bfcl.checker import PASS, CheckResult
from agentrig.harness.trajectory import ToolCall

_BACKEND_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"

# Backend class -> module under _BACKEND_PACKAGE (CLASS_FILE_PATH_MAPPING in BFCL, multi-turn classes only).
BACKEND_MODULES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}

# Classes without a scenario to load (STATELESS_CLASSES in BFCL).
STATELESS = frozenset({"MathAPI"})


class UnsafeCall(ValueError):
    """Call text that is not one plain call with literal arguments; it is refused, never evaluated."""


@dataclass(frozen=True)
class BackendCall:
    """A call to a backend method: positional and keyword arguments, all plain literals."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_tool_call(cls, call: ToolCall) -> BackendCall:
        """The backend call of a harness tool call (arguments copied, so a backend cannot alter the record)."""
        return cls(call.name, (), copy.deepcopy(call.arguments))


def parse_call(text: str) -> BackendCall:
    """Parse `name(literal, key=literal)` with `ast`; anything else raises UnsafeCall."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise UnsafeCall(f"not a Python call: {text!r} ({exc.msg})") from exc
    node = tree.body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise UnsafeCall(f"not a plain call of a function name: {text!r}")
    try:
        args = tuple(ast.literal_eval(arg) for arg in node.args)
        kwargs: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise UnsafeCall(f"`**` arguments are not accepted: {text!r}")
            kwargs[keyword.arg] = ast.literal_eval(keyword.value)
    except ValueError as exc:
        raise UnsafeCall(f"arguments must be literals: {text!r}") from exc
    return BackendCall(node.func.id, args, kwargs)


def format_result(value: Any) -> str:
    """A method's return value as BFCL shows it: str as is, dict as JSON (str() if not serializable), else str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class BackendSession:
    """The backend instances of one entry, loaded with its initial configuration, and a dispatcher."""

    def __init__(self, classes: list[str], initial_config: dict[str, Any]) -> None:
        """Instantiate each class (scenario deep-copied from `initial_config`) and index its public methods."""
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, Callable[..., Any]] = {}
        for name in classes:
            if name not in BACKEND_MODULES:
                raise KeyError(f"unknown BFCL backend class {name!r}")
            module = importlib.import_module(f"{_BACKEND_PACKAGE}.{BACKEND_MODULES[name]}")
            instance = getattr(module, name)()
            if name not in STATELESS:
                instance._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=False)
            self.instances[name] = instance
            # Later classes win a shared method name, as in BFCL's mapping.
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self._methods[method_name] = method

    @property
    def method_names(self) -> list[str]:
        """The callable public method names."""
        return sorted(self._methods)

    def as_keywords(self, call: BackendCall) -> BackendCall:
        """The same call with positional arguments named (how a JSON tool call writes it); unknown names unchanged."""
        method = self._methods.get(call.name)
        if method is None or not call.args:
            return call
        bound = inspect.signature(method).bind(*call.args, **call.kwargs)
        return BackendCall(call.name, (), dict(bound.arguments))

    def execute(self, call: BackendCall) -> str:
        """Run one call; never raises: a model's bad call becomes BFCL's `Error during execution: ...` text."""
        method = self._methods.get(call.name)
        if method is None:
            return f"Error during execution: name '{call.name}' is not defined"
        try:
            return format_result(method(*call.args, **call.kwargs))
        except Exception as exc:  # noqa: BLE001 - any backend failure is the model's observation, as in BFCL
            return f"Error during execution: {exc}"

    def state(self) -> dict[str, dict[str, Any]]:
        """Public attributes of every instance: the state BFCL compares."""
        return {name: {k: v for k, v in vars(obj).items() if not k.startswith("_")} for name, obj in self.instances.items()}


def state_differences(model: BackendSession, truth: BackendSession) -> dict[str, list[str]]:
    """Per class, the public attributes whose values differ between the model's and the ground truth's run."""
    differences: dict[str, list[str]] = {}
    for name, truth_instance in truth.instances.items():
        model_instance = model.instances[name]
        changed = [
            attr
            for attr in vars(truth_instance)
            if not attr.startswith("_") and getattr(model_instance, attr) != getattr(truth_instance, attr)
        ]
        if changed:
            differences[name] = changed
    return differences


def _missing_results(expected: list[str], produced: list[str]) -> list[str]:
    pool = list(produced)
    missing: list[str] = []
    for item in expected:
        if item in pool:
            pool.remove(item)
        else:
            missing.append(item)
    return missing


def check_multi_turn(
    classes: list[str],
    initial_config: dict[str, Any],
    ground_truth: list[list[str]],
    model_turns: list[list[list[BackendCall]]],
) -> CheckResult:
    """Score a multi-turn answer: `model_turns[t]` lists the model's steps in turn t, each step its calls.

    Steps without calls should be left out (BFCL drops steps it cannot decode or that hold no call).
    """
    if len(model_turns) != len(ground_truth):
        return CheckResult(
            False, "multi_turn:force_terminated", f"{len(model_turns)} turn(s) answered of {len(ground_truth)}"
        )
    model = BackendSession(classes, initial_config)
    truth = BackendSession(classes, initial_config)
    model_results: list[str] = []
    for turn, (truth_calls, steps) in enumerate(zip(ground_truth, model_turns)):
        for step in steps:
            model_results.extend(model.execute(call) for call in step)
        truth_results = [truth.execute(parse_call(text)) for text in truth_calls]
        if not truth_calls:
            continue
        if not any(steps):
            return CheckResult(False, "multi_turn:empty_turn_model_response", f"turn {turn}: no call made")
        differences = state_differences(model, truth)
        if differences:
            return CheckResult(False, "multi_turn:instance_state_mismatch", f"turn {turn}: state differs in {differences}")
        missing = _missing_results(truth_results, model_results)
        if missing:
            return CheckResult(False, "multi_turn:execution_response_mismatch", f"turn {turn}: missing results {missing}")
    return PASS
