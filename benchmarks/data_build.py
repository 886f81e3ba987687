"""Benchmark: episodes per second through clean, window, render, tokenize and mask (target >= 1,000/s on 2 cores).

Episodes come from the real harness (scripted policy, 3-5 steps, unique arguments and results per episode, one
shared system prompt as in a collected data set). "ours" is `databuild`'s per-episode work, checks included,
in `--workers` processes. The peer, measured in the same run on the same episodes, is the common naive way:
for every assistant turn, `tokenizer.apply_chat_template` on the prefix (with the generation prompt) and on the
prefix plus the turn, labels from the difference. Run:

    python benchmarks/data_build.py --episodes 2000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from multiprocessing import get_context

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_episodes(n: int) -> list[dict]:
    """n episode dicts from the harness with a scripted policy."""
    from agentrig.harness import HarnessConfig, ScriptedPolicy, run_episode
    from agentrig.harness.tools import ToolSet, tool

    @tool
    def stock_level(sku: str, warehouse: str = "main") -> dict:
        """Units of a SKU in stock.

        Args:
            sku: the stock-keeping unit
            warehouse: which warehouse
        """
        return {"sku": sku, "warehouse": warehouse, "units": (len(sku) * 7) % 23}

    @tool
    def reorder(sku: str, qty: int) -> str:
        """Order more units of a SKU.

        Args:
            sku: the stock-keeping unit
            qty: how many units
        """
        return f"ordered {qty} x {sku}"

    from agentrig.harness.trajectory import TaskSpec

    tools = ToolSet([stock_level, reorder])
    out = []
    for i in range(n):
        k = 2 + i % 3
        skus = [f"SKU-{i}-{j}" for j in range(k)]
        replies = [("Checking. " if j == 0 else "") + "<tool_call>\n" + json.dumps(
            {"name": "stock_level", "arguments": {"sku": s}}) + "\n</tool_call>" for j, s in enumerate(skus)]
        replies.append(f"Stock of {', '.join(skus)} checked; nothing to reorder (episode {i}).")
        task = TaskSpec(id=f"b{i}", prompt=f"Check stock of {', '.join(skus)}.", env="bench", family=f"f{i % 4}")
        ep = run_episode(task, tools, ScriptedPolicy(replies), HarnessConfig(memory=False), episode_id=f"b{i}")
        ep.success = True
        out.append(ep.to_dict())
    return out


def _ours_worker(args: tuple[list[dict], str, int | None]) -> tuple[int, int]:
    from agentrig.data.databuild import BuildReport, _Builder
    from agentrig.data.render import Renderer
    from agentrig.harness.trajectory import Episode

    dicts, model, max_len = args
    renderer = Renderer.for_model(model)
    builder = _Builder(renderer, max_len, BuildReport([], "", model, renderer.template_name, max_len), None)
    samples = tokens = 0
    for d in dicts:
        for built in builder.add(Episode.from_dict(d)):
            samples += 1
            tokens += len(built.rendered.input_ids)
    return samples, tokens


def run_ours(dicts: list[dict], model: str, workers: int, max_len: int | None) -> float:
    """Seconds for our pipeline over all episodes in `workers` processes (renderer set-up excluded by warm-up)."""
    chunks = [dicts[w::workers] for w in range(workers)]
    ctx = get_context("fork")
    with ctx.Pool(workers) as pool:
        pool.map(_ours_worker, [(c[:20], model, max_len) for c in chunks])  # warm-up: imports, tokenizer load
        start = time.perf_counter()
        results = pool.map(_ours_worker, [(c, model, max_len) for c in chunks])
        seconds = time.perf_counter() - start
    print(f"  ours: {sum(r[0] for r in results)} samples, {sum(r[1] for r in results)} tokens")
    return seconds


def run_peer(dicts: list[dict], model: str) -> float:
    """Seconds for the naive per-turn apply_chat_template re-render approach, one process."""
    from agentrig.models import load_tokenizer
    from agentrig.data.render import hermes_template, template_messages

    tok = load_tokenizer(model)
    template = hermes_template()
    start = time.perf_counter()
    for d in dicts:
        msgs = template_messages(d["messages_full"])
        labels: list[int] = []
        ids: list[int] = []
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            prompt = tok.apply_chat_template(msgs[:k], chat_template=template, add_generation_prompt=True, tokenize=True,
                                             return_dict=False)
            full = tok.apply_chat_template(msgs[: k + 1], chat_template=template, tokenize=True, return_dict=False)
            labels = labels + [-100] * (len(prompt) - len(labels)) + full[len(prompt):]
            ids = full
    return time.perf_counter() - start


def main() -> int:
    """Measure and print both figures and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-seq-length", type=int, default=None)
    args = parser.parse_args()
    t0 = time.perf_counter()
    dicts = make_episodes(args.episodes)
    print(f"made {len(dicts)} harness episodes in {time.perf_counter() - t0:.1f} s "
          f"(cores: {os.cpu_count()}, load {os.getloadavg()[0]:.1f})")
    ours = run_ours(dicts, args.model, args.workers, args.max_seq_length)
    peer_n = min(len(dicts), 500)
    peer = run_peer(dicts[:peer_n], args.model)
    ours_rate, peer_rate = len(dicts) / ours, peer_n / peer
    print(f"ours ({args.workers} proc, clean+window+render+tokenize+mask+checks): {ours_rate:,.0f} episodes/s")
    print(f"peer (naive per-turn apply_chat_template, 1 proc, {peer_n} episodes): {peer_rate:,.0f} episodes/s")
    print(f"ratio: {ours_rate / peer_rate:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
