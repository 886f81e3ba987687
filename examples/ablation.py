"""One row of the ablation table in docs/training.md: collect -> data build -> LoRA SFT -> eval, through the
same functions the CLI stages call, with one knob changed per row. Writes /tmp/exps/NAME/row.json (settings,
times, per-task success, metrics) and prints the headline figures.

    python examples/ablation.py NAME [--episodes 400] [--faults 0.25] [--detours 0.1] [--steps 90]
        [--target all|qkvo|...] [--lr 1e-3] [--listing json|compact] [--split dev] [--limit 20] [--train-seed 0]

Each flag maps to one stage's setting: collect (`--episodes --faults --rename --detours --paraphrase
--listing`), train (`--steps --batch --target --lr --rank --seq`), eval (`--split --limit --eval-faults
--max-new`). `--adapter DIR` evaluates a trained adapter without training; `--data FILE` reuses episodes.
"""
import argparse
import json
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("name")
ap.add_argument("--episodes", type=int, default=400)
ap.add_argument("--faults", type=float, default=0.25)
ap.add_argument("--rename", type=float, default=0.2)
ap.add_argument("--detours", type=float, default=0.1)
ap.add_argument("--paraphrase", type=float, default=0.3)
ap.add_argument("--steps", type=int, default=90)
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--target", default="all")
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--rank", type=int, default=32)
ap.add_argument("--split", default="dev")
ap.add_argument("--limit", type=int, default=20)
ap.add_argument("--eval-faults", type=float, default=0.2)
ap.add_argument("--max-new", type=int, default=160)
ap.add_argument("--seq", type=int, default=2048)
ap.add_argument("--listing", default=None)
ap.add_argument("--adapter", default=None, help="skip training; evaluate this adapter")
ap.add_argument("--data", default=None, help="reuse this episodes file")
ap.add_argument("--root", default="/tmp/exps", help="folder of the experiment folders")
ap.add_argument("--train-seed", type=int, default=0, help="TrainConfig.seed: LoRA's initial weights and the row order")
a = ap.parse_args()

def main():

    root = Path(a.root) / a.name
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    times = {}
    from agentrig.harness import HarnessConfig

    hk = {} if a.listing is None else {"tool_listing": a.listing}
    if a.adapter is None:
        from agentrig.data.collect import CollectConfig, run_collect

        ep_file = a.data or str(root / "train.jsonl")
        if a.data is None:
            kw = {"max_steps": 12}
            run_collect(CollectConfig(env="datadesk", split="train", episodes=a.episodes, teacher="expert", faults=a.faults,
                                      rename=a.rename, detours=a.detours, paraphrase=a.paraphrase, seed=0, out=ep_file,
                                      workers=2, **hk), resume=Path(ep_file).exists(), progress=False)
        from agentrig.data.databuild import build_dataset

        build_dataset([ep_file], root / "data", model="smollm2-135m", max_seq_length=a.seq)
        card = json.loads((root / "data" / "data_card.json").read_text())
        times["data"] = time.perf_counter() - t0
        from agentrig.train.train import run_train
        from agentrig.train.trainconfig import TrainConfig

        target = "q_proj,k_proj,v_proj,o_proj" if a.target == "qkvo" else a.target
        tcfg = TrainConfig(dataset=str(root / "data"), model_name_or_path="smollm2-135m", stage="sft", output_dir=str(root / "sft"),
                           lora_rank=a.rank, lora_alpha=2 * a.rank, lora_target=target, learning_rate=a.lr,
                           lr_scheduler_type="cosine", warmup_ratio=0.05, per_device_train_batch_size=a.batch,
                           gradient_accumulation_steps=1, max_seq_length=a.seq, max_steps=a.steps, save_steps=max(5, a.steps // 4),
                           packing=True, seed=a.train_seed)
        t = time.perf_counter()
        res = run_train(tcfg, resume=True)
        times["train"] = time.perf_counter() - t
        adapter = res.adapter_dir
        losses = [r["loss"] for r in res.loss_history if "loss" in r]
    else:
        adapter, losses, card = a.adapter, [], {}
    from agentrig.evals.evaluate import EvalConfig, run_eval
    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.harness.trajectory import write_episodes

    t = time.perf_counter()
    policy = HFPolicy.from_pretrained("smollm2-135m", {"sft": adapter}, max_new_tokens=a.max_new, seed=0)
    cfg = EvalConfig(env="datadesk", splits=a.split.split(","), limit=a.limit, faults=a.eval_faults, seed=0, harness=HarnessConfig(**hk))
    r = run_eval(policy, cfg)
    times["eval"] = time.perf_counter() - t
    write_episodes(root / "eval_episodes.jsonl", r.episodes)
    m = r.metrics.to_dict()
    row = {"name": a.name, "args": vars(a), "times": times, "samples": card.get("samples"), "tokens": card.get("tokens"),
           "last10_loss": sum(losses[-10:]) / max(1, len(losses[-10:])) if losses else None,
           "success": {e.episode_id: bool(e.success) for e in r.episodes},
           "terminations": {e.episode_id: e.termination for e in r.episodes},
           "metrics": m}
    (root / "row.json").write_text(json.dumps(row, indent=1))
    print(json.dumps({k: row[k] for k in ("name", "times", "samples", "tokens", "last10_loss")}))
    head = {k: (v["hits"], v["total"]) for k, v in m.items() if isinstance(v, dict) and "hits" in v}
    print("completion", sum(row["success"].values()), "/", len(row["success"]), head)


if __name__ == "__main__":
    main()
