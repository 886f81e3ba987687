"""`agentrig collect`: ordered, labelled output; SIGKILL or Ctrl-C + --resume equals an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrig.data.collect import CollectConfig, resume_point, run_collect, without_timing
from agentrig.errors import ConfigError

N = 150


def _lines(path: Path) -> list[str]:
    return [json.dumps(without_timing(json.loads(line))) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "train.jsonl"
    run_collect(CollectConfig(episodes=N, out=str(out), faults=0.25, rename=0.2, seed=3), progress=False)
    return out


def test_output_is_complete_labelled_and_deterministic(reference, tmp_path):
    lines = [json.loads(x) for x in reference.read_text().splitlines()]
    assert len(lines) == N
    assert all(ep["success"] in (True, False) and ep["check"]["reasons"] for ep in lines)
    assert any(ep["faults"] for ep in lines) and any(not ep["success"] for ep in lines)
    assert [ep["task"]["metadata"]["collect"]["index"] for ep in lines] == list(range(N))
    again = tmp_path / "again.jsonl"
    run_collect(CollectConfig(episodes=N, out=str(again), faults=0.25, rename=0.2, seed=3, workers=2), progress=False)
    assert _lines(again) == _lines(reference)


@pytest.mark.slow
def test_sigkill_at_several_points_then_resume_equals_uninterrupted(reference, tmp_path):
    out = tmp_path / "train.jsonl"
    cmd = [sys.executable, "-m", "agentrig", "collect", "--episodes", str(N), "--out", str(out), "--faults", "0.25",
           "--rename", "0.2", "--seed", "3", "--no-progress"]
    env = dict(os.environ)
    kills = 0
    for target in (20, 60, 110):
        proc = subprocess.Popen(cmd + (["--resume"] if out.exists() else []), env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.stat().st_size and out.read_bytes().count(b"\n") >= target:
                break
            time.sleep(0.01)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    # a torn last line, as a kill mid-write leaves it
    with open(out, "ab") as fh:
        fh.write(b'{"episode_id": "torn", "ste')
    subprocess.run(cmd + ["--resume"], env=env, check=True)
    assert kills >= 1
    assert _lines(out) == _lines(reference)


@pytest.mark.slow
def test_ctrl_c_stops_the_collector_and_resume_equals_uninterrupted(reference, tmp_path):
    out = tmp_path / "train.jsonl"
    # The child gets the terminal's default Ctrl-C even when this test runs from a background job (`make test &`
    # in a script starts pytest, and so every child, with SIGINT ignored): Python keeps an ignored SIGINT ignored.
    python = [sys.executable, "-c", "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "sys.argv[0] = 'agentrig'; runpy.run_module('agentrig', run_name='__main__')"]
    cmd = python + ["collect", "--episodes", str(N), "--out", str(out), "--faults", "0.25",
                    "--rename", "0.2", "--seed", "3", "--no-progress"]
    interrupted = 0
    for target in (30, 90):
        proc = subprocess.Popen(cmd + (["--resume"] if out.exists() else []), stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= target:
                break
            time.sleep(0.01)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the user's Ctrl-C: never an observation, the run stops
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 130 and "agentrig collect: interrupted" in err and "Traceback" not in err, err
            interrupted += 1
            assert out.read_bytes().count(b"\n") < N
        proc.wait()
    subprocess.run(cmd + ["--resume"], check=True)
    assert interrupted >= 1
    assert _lines(out) == _lines(reference)


def test_resume_point_cuts_a_torn_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    assert resume_point(p) == 2 and p.read_bytes() == b'{"a": 1}\n{"b": 2}\n'


def test_resume_with_other_settings_is_refused(reference, tmp_path):
    out = tmp_path / "t.jsonl"
    run_collect(CollectConfig(episodes=5, out=str(out), seed=3), progress=False)
    with pytest.raises(ConfigError, match="seed"):
        run_collect(CollectConfig(episodes=10, out=str(out), seed=4), resume=True, progress=False)


def test_cli_and_custom_env(tmp_path, capsys):
    from agentrig.cli import main

    out = tmp_path / "shop.jsonl"
    example = Path(__file__).resolve().parents[1] / "examples" / "my_env.py"
    assert main(["collect", "--env", f"{example}:make_env", "--episodes", "6", "--out", str(out), "--faults", "0",
                 "--detours", "0"]) == 0
    eps = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(eps) == 6 and all(e["success"] for e in eps)
    assert "buy" in capsys.readouterr().err


def test_openai_teacher_against_a_local_stub(tmp_path, monkeypatch):
    """An OpenAI-compatible endpoint as teacher: one tool call, then an answer; failures are kept, labelled."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = []

    class Stub(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            if body["messages"][-1]["role"] == "user":
                msg = {"role": "assistant", "content": "",
                       "tool_calls": [{"id": "a", "type": "function",
                                       "function": {"name": "list_tables", "arguments": "{}"}}]}
            else:
                msg = {"role": "assistant", "content": "I do not know."}
            data = json.dumps({"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            return None

    server = HTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    out = tmp_path / "o.jsonl"
    try:
        summary = run_collect(CollectConfig(episodes=3, out=str(out), teacher="openai", model="stub",
                                            base_url=f"http://127.0.0.1:{server.server_port}/v1", faults=0.0,
                                            split="dev"), progress=False)
    finally:
        server.shutdown()
    eps = [json.loads(x) for x in out.read_text().splitlines()]
    assert summary.episodes == 3 and len(eps) == 3
    assert all(e["steps"][0]["calls"][0]["name"] == "list_tables" for e in eps)
    assert all(e["success"] in (True, False) and e["check"]["reasons"] for e in eps)
    assert seen and seen[0]["model"] == "stub"


def test_no_progress_hides_the_bar_but_not_the_summary(tmp_path, capsys):
    from agentrig.cli import main

    assert main(["collect", "--episodes", "6", "--out", str(tmp_path / "e.jsonl"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "6 episodes" in err and "faults injected" in err and "tool calls (balance)" in err


def test_renaming_never_gives_two_tools_one_name():
    import random

    from agentrig.data.augment import rename_spec

    aliases = {"get": [("fetch", "d")], "put": [("get", "d1"), ("store", "d2")], "add": [("store", "d3")]}
    for seed in range(40):
        spec = rename_spec(["get", "put", "add", "fetch"], random.Random(seed), aliases)
        names = [spec["tools"].get(n, n) for n in ["get", "put", "add", "fetch"]]
        assert len(set(names)) == 4, names
        assert "get" not in spec["tools"] and spec["tools"]["put"] == "store"  # `fetch` and `get` are offered
        assert "add" not in spec["tools"]  # its only alias went to `put`


def test_resume_reads_a_meta_file_from_before_save_config(tmp_path):
    """OUT.meta.json used to hold only the identity (and no tool_listing); such a file still resumes."""
    out = tmp_path / "old.jsonl"
    cfg = CollectConfig(episodes=4, out=str(out), seed=2, tool_listing="json")
    run_collect(cfg, progress=False)
    first = out.read_text().splitlines()
    old = cfg.identity()
    old.pop("tool_listing")
    (tmp_path / "old.jsonl.meta.json").write_text(json.dumps(old))
    run_collect(CollectConfig(episodes=6, out=str(out), seed=2, tool_listing="json"), resume=True, progress=False)
    lines = out.read_text().splitlines()
    assert lines[:4] == first and len(lines) == 6
    with pytest.raises(ConfigError, match="settings differ.*seed"):
        run_collect(CollectConfig(episodes=8, out=str(out), seed=3, tool_listing="json"), resume=True, progress=False)


def _collect_script(out: Path) -> str:
    return ("from agentrig.data.collect import CollectConfig, run_collect\n"
            f"run_collect(CollectConfig(episodes=4, out={str(out)!r}, workers=2), progress=False)\n")


def test_workers_from_a_script_without_a_main_guard_fail_with_what_to_do(tmp_path):
    """Spawned workers re-run such a script and die starting; the pool is reported broken, not respawned forever."""
    script = tmp_path / "collect_it.py"
    script.write_text(_collect_script(tmp_path / "train.jsonl"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert 'if __name__ == "__main__":' in proc.stderr and "--workers 1" in proc.stderr, proc.stderr[-2000:]


def test_workers_from_stdin_run_in_this_process(tmp_path):
    """`python - <<EOF` has no main file for a worker to import: the episodes are collected here instead."""
    out = tmp_path / "train.jsonl"
    proc = subprocess.run([sys.executable, "-"], input=_collect_script(out), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "running in this process" in proc.stderr
    assert len(out.read_text().splitlines()) == 4


def test_family_weights_shift_the_family_draw_and_bad_weights_say_what_to_do(tmp_path, capsys):
    from collections import Counter

    from agentrig.cli import main

    def families(name, *flags):
        out = tmp_path / f"{name}.jsonl"
        assert main(["collect", "--episodes", "60", "--out", str(out), "--faults", "0", "--detours", "0",
                     "--no-progress", *flags]) == 0
        return Counter(json.loads(x)["task"]["family"] for x in out.read_text().splitlines())

    plain = families("plain")
    weighted = families("weighted", "--family-weights", "ranking=6,arithmetic=0")
    assert weighted["arithmetic"] == 0 < plain["arithmetic"]
    assert weighted["ranking"] > 2 * max(plain["ranking"], 1)
    meta = json.loads((tmp_path / "weighted.jsonl.meta.json").read_text())
    assert meta["family_weights"] == {"ranking": 6.0, "arithmetic": 0.0}
    for flags, message in ((["--family-weights", "rankings=2"], "no family 'rankings'"),
                           (["--family-weights", "ranking:2"], "FAMILY=WEIGHT"),
                           (["--family-weights", "ranking=-1"], "FAMILY=WEIGHT"),
                           (["--family-weights", "ranking=2", "--balance"], "use one of them")):
        capsys.readouterr()
        try:
            code = main(["collect", "--episodes", "2", "--out", str(tmp_path / "bad.jsonl"), "--no-progress", *flags])
        except SystemExit as exc:  # argparse: a flag's text that does not parse
            code = exc.code
        assert code == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad.jsonl").exists()
