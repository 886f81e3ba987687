"""Row 4 of docs/training.md again, with only the training seed changed: how much of a row is the seed.

    python examples/seed_rows.py OUT [--train-seed N] [--split test] [--episodes N] [--steps N] [--lora-layers N]
    [--neftune ALPHA] [--mixup-detours SHARE] [--borrow-detours SHARE] [--family-weights FAMILY=W,...]
    [--learning-rate LR] [--prompt-no-grad] [--tool-name-weight W] [--decision-weight W] [--sql-detours SHARE]
    [--detour-sentence] [--plan-first] [--figure-weight W] [--sequential] [--retry-round] [--max-steps N] [--echo-calls] [--retry-empty]
    python examples/seed_rows.py OUT --adapter DIR [--split dev]   # evaluate a trained adapter only

The default profile's stages through `run.py`'s own functions: collect (seed 0), build the data, LoRA SFT with
`TrainConfig.seed = N` (LoRA's initial weights and the row order; the data stay byte for byte the same), and the
evaluation of the adapter on the main job's 80 tasks (seed 0: the same tasks and faults). No curve, no base row.
`agentrig compare OUT_A/eval:sft OUT_B/eval:sft` then pairs two seeds task by task. About 40 minutes on 2 cores.
`--split test` evaluates one split only (40 tasks, about 5 minutes). `--episodes`, `--steps` and `--lora-layers` change
the profile's teacher episodes, SFT steps and LoRA's depth (`lora_num_layers`); `--neftune` turns on NEFTune noise
(`neftune_noise_alpha`); `--mixup-detours` sets the share of the teacher's mix-up detours (`collect
--mixup-detours`), `--borrow-detours` that of its borrowed-field detours (`collect --borrow-detours`), `--sql-detours` that of its
SQL detours (`collect --sql-detours`); `--detour-sentence` puts "That call was rejected; here is the corrected one."
back before the corrected call of its rejected-call detours (the profile's `quiet_detours` off: rows up to 31 were
trained so; `--quiet-detours`, row 32's flag, is the profile's default since);
`--family-weights` reweights the teacher's task families (`collect --family-weights`); `--learning-rate` sets SFT's
peak learning rate; `--prompt-no-grad` trains with `prompt_no_grad` (each sample's context without gradient);
`--tool-name-weight` sets SFT's `tool_name_weight` (the loss weight of the tokens that name a call's tool),
`--decision-weight` its `decision_weight` (the loss weight of each assistant turn's first token: call or answer),
`--figure-weight` its `figure_weight` (the loss weight of the tokens that hold a digit);
`--plan-first` has the teacher open each episode's first calls with a one-line plan (`collect --plan-first`);
`--sequential` has it send one call a turn (`collect --sequential`), `--retry-round` send a turn with a failed
call again whole (`collect --retry-round`, rows 39 and 39s1), and `--max-steps` sets the harness's step limit
at collection and evaluation (rows 38 and 38s1 use 16: sequential long tasks take up to 16 steps); `--echo-calls` has
each tool result open with the call it answers, at collection and evaluation (`HarnessConfig.echo_calls`, row 41); `--retry-empty` has the teacher send a look-up that answered "No result" once
more before its `run_sql` fallback (`collect --retry-empty`, row 42).
`--adapter DIR` skips collection and training and evaluates that adapter as the row would (the
learning-rate sweep's control on `dev`).
One knob per row: the rest of the profile stays.
"""
import argparse
import json
from dataclasses import replace
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--train-seed", type=int, default=0, help="TrainConfig.seed (the main job uses the run's seed, 0)")
    ap.add_argument("--split", default=None, help="comma-separated eval splits (default: the profile's, test + unseen)")
    ap.add_argument("--episodes", type=int, default=None, help="teacher episodes (default: the profile's, 400)")
    ap.add_argument("--steps", type=int, default=None, help="SFT steps (default: the profile's, 270; rows up to 39 trained 200)")
    ap.add_argument("--lora-layers", type=int, default=None, help="LoRA on the last N decoder layers (default: the profile's)")
    ap.add_argument("--neftune", type=float, default=None, help="NEFTune alpha, neftune_noise_alpha (default: the profile's, off)")
    ap.add_argument("--mixup-detours", type=float, default=None, help="share of mix-up detours (default: the profile's, 0)")
    ap.add_argument("--family-weights", default="", help="task family draw weights, e.g. ranking=2 (default: none)")
    ap.add_argument("--borrow-detours", type=float, default=None, help="share of detours with a borrowed field (default: 0)")
    ap.add_argument("--sql-detours", type=float, default=None, help="share of SQL detours (default: the profile's, 0)")
    ap.add_argument("--quiet-detours", action="store_true", help="the corrected call after a detour with no sentence "
                    "(the profile's default since row 32)")
    ap.add_argument("--detour-sentence", action="store_true", help="the sentence before a detour's corrected call, as "
                    "rows up to 31 were trained")
    ap.add_argument("--plan-first", action="store_true", help="the teacher's first calls behind a one-line plan "
                    "(collect --plan-first; default: the profile's)")
    ap.add_argument("--learning-rate", type=float, default=None, help="SFT peak learning rate (default: the profile's, 1e-3)")
    ap.add_argument("--prompt-no-grad", action="store_true", help="SFT with prompt_no_grad (default: the profile's)")
    ap.add_argument("--tool-name-weight", type=float, default=None, help="SFT tool_name_weight (default: the profile's, 5; 1 is the plain loss)")
    ap.add_argument("--decision-weight", type=float, default=None, help="SFT decision_weight (default: the profile's; 1 is the plain loss)")
    ap.add_argument("--figure-weight", type=float, default=None, help="SFT figure_weight (default: the profile's; 1 is the plain loss)")
    ap.add_argument("--sequential", action="store_true", help="the teacher sends one call a turn "
                    "(collect --sequential)")
    ap.add_argument("--retry-round", action="store_true", help="after a turn of several calls with a failure, the "
                    "teacher sends the whole turn again (collect --retry-round)")
    ap.add_argument("--retry-empty", action="store_true", help="the teacher sends a look-up that answered \"No "
                    "result\" once more before its run_sql fallback (collect --retry-empty)")
    ap.add_argument("--echo-calls", action="store_true", help="each tool result opens with the call it answers, "
                    "at collection and evaluation (HarnessConfig.echo_calls; default: the profile's)")
    ap.add_argument("--max-steps", type=int, default=None, help="harness step limit at collection and evaluation "
                    "(default: the profile's, 12)")
    ap.add_argument("--adapter", default=None, help="evaluate this trained adapter only (no collection, no training)")
    a = ap.parse_args()
    from agentrig import run
    from agentrig.data.collect import parse_family_weights

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    prof, cfg = run.PROFILES["default"], run.RunConfig(out=str(out))
    prof = replace(prof, train_episodes=a.episodes or prof.train_episodes, sft_steps=a.steps or prof.sft_steps,
                   lora_num_layers=a.lora_layers or prof.lora_num_layers, neftune_alpha=a.neftune or prof.neftune_alpha,
                   mixup_detours=prof.mixup_detours if a.mixup_detours is None else a.mixup_detours,
                   family_weights=tuple(parse_family_weights(a.family_weights).items()) or prof.family_weights,
                   learning_rate=a.learning_rate or prof.learning_rate,
                   prompt_no_grad=a.prompt_no_grad or prof.prompt_no_grad,
                   tool_name_weight=a.tool_name_weight or prof.tool_name_weight,
                   decision_weight=a.decision_weight or prof.decision_weight,
                   figure_weight=a.figure_weight or prof.figure_weight,
                   borrow_detours=prof.borrow_detours if a.borrow_detours is None else a.borrow_detours,
                   sql_detours=prof.sql_detours if a.sql_detours is None else a.sql_detours,
                   quiet_detours=(a.quiet_detours or prof.quiet_detours) and not a.detour_sentence,
                   plan_first=a.plan_first or prof.plan_first,
                   sequential_calls=a.sequential or prof.sequential_calls, retry_round=a.retry_round or prof.retry_round,
                   max_steps=a.max_steps or prof.max_steps, echo_calls=a.echo_calls or prof.echo_calls,
                   retry_empty=a.retry_empty or prof.retry_empty)
    splits = a.split.split(",") if a.split else None
    if a.adapter:
        ev = run._evaluate(cfg, prof, out, {"sft": a.adapter}, ["sft"], splits=splits)
        print(json.dumps({"adapter": a.adapter, "completion": ev["sft"]["metrics"]["completion"]}))
        return
    collect = run._collect(cfg, prof, out)
    data = run._build(cfg, prof, out, [collect["episodes_file"]])
    sft = run._train(replace(cfg, seed=a.train_seed), prof, out, "sft", data["data_dir"], prof.sft_steps)
    ev = run._evaluate(cfg, prof, out, {"sft": sft["adapter"]}, ["sft"], splits=splits)
    summary = {"train_seed": a.train_seed, "episodes": prof.train_episodes, "steps": prof.sft_steps,
               "lora_num_layers": prof.lora_num_layers, "neftune_alpha": prof.neftune_alpha,
               "mixup_detours": prof.mixup_detours, "learning_rate": prof.learning_rate,
               "borrow_detours": prof.borrow_detours, "sql_detours": prof.sql_detours,
               "quiet_detours": prof.quiet_detours, "plan_first": prof.plan_first, "prompt_no_grad": prof.prompt_no_grad,
               "tool_name_weight": prof.tool_name_weight, "decision_weight": prof.decision_weight,
               "figure_weight": prof.figure_weight, "sequential_calls": prof.sequential_calls,
               "max_steps": prof.max_steps, "retry_round": prof.retry_round, "echo_calls": prof.echo_calls, "retry_empty": prof.retry_empty,
               "family_weights": dict(prof.family_weights),
               "train_seconds": sft["train_seconds"],
               "completion": ev["sft"]["metrics"]["completion"], "failures": ev["sft"]["metrics"]["failures"]}
    (out / "seed_row.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
