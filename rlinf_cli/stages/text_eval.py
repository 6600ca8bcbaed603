"""`rlinf eval` and `rlinf collect` on a text task.

eval: greedy pass@1 (``accuracy``) on held-out prompts ``seed .. seed+episodes-1``, sampled
pass@k with ``text.pass_k=k``, and a table of example completions.
collect: a JSONL of prompt/completion pairs for `rlinf sft`, from the task's reference solutions
(``policy=expert``) or sampled from a checkpoint (``only_success=true`` keeps correct ones:
rejection sampling). A ``<output>.meta.json`` beside it records the task, so `rlinf sft` knows it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlinf_cli.errors import UserError
from rlinf_cli.stages import common, text_common as tc


def run_eval(cfg: Any) -> dict[str, Any]:
    from rlinf_cli.config import flatten
    from rlinf_cli.progress import Progress

    import torch

    source = str(cfg.checkpoint)
    if source in ("random", "expert"):
        raise UserError(f"checkpoint={source} is for embodied simulators; text eval needs a model checkpoint directory")
    task = tc.make_task(cfg.sim)
    ctx = common.start(cfg, "eval", f"{cfg.sim.name}-{Path(source).name}")
    policy = tc.build_policy(cfg, source, ctx.device)
    t = cfg.text
    n = int(cfg.episodes)
    with ctx.track(cfg, {**common.plugin_tags(cfg), "rlinf.checkpoint": source,
                                            "rlinf.modality": "text"}) as tracker, \
            Progress(ctx.log, "eval", n, "prompts", enabled=bool(cfg.progress)) as progress:
        tracker.log_params(flatten(cfg))
        generator = torch.Generator(device=policy.device).manual_seed(int(cfg.seed))
        summary, examples = tc.evaluate(policy, task, n, int(cfg.seed), tc.max_new_tokens(t, task), int(t.pass_k),
                                        int(t.batch), generator, on_batch=lambda k: progress.update(k))
        progress.close()
        tracker.log_metrics({f"eval/{k}": v for k, v in summary.items()}, 0)
        result = {"stage": "eval", "modality": "text", "checkpoint": source, "run_dir": str(ctx.run_dir),
                  "seconds": round(time.time() - ctx.started, 2), "eval": summary,
                  "examples": tc.examples_json(examples, int(t.examples)), "mlflow_run_id": tracker.run_id}
        table = tc.summary_table({Path(source).name: summary}, f"rlinf eval: {cfg.sim.name} (seeds {cfg.seed}..{int(cfg.seed) + n - 1})")
        common.write_result(ctx, tracker, result, table)
        if cfg.output:
            Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
            Path(cfg.output).write_text(json.dumps(result, indent=2))
        ctx.console.print(table)
        if int(t.examples) > 0:
            ctx.console.print(tc.examples_table(examples, int(t.examples)))
        ctx.console.print_json(json.dumps({"checkpoint": source, **summary}))
    return result


def run_collect(cfg: Any) -> dict[str, Any]:
    from rlinf_cli.runtime.text import sample_completions
    from rlinf_cli.settings import plain

    import torch

    task = tc.make_task(cfg.sim)
    out = Path(str(cfg.output))
    if out.suffix != ".jsonl":
        raise UserError(f"output '{out}': text tasks write a JSONL file; use output=<name>.jsonl")
    from rlinf_cli.locks import FileLock

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create '{out.parent}': {exc.strerror}; choose a writable output=...") from exc
    lock = FileLock(out.with_name(f".{out.name}.lock")).acquire(  # released when this process ends
        blocking=False, busy=f"'{out}' is being written by another rlinf collect (pid {{pid}}); wait for it or "
                             f"choose another output=")
    ctx = common.start(cfg, "collect", f"{cfg.sim.name}-{Path(str(cfg.policy)).name}")
    n = int(cfg.episodes)
    # training split (never the eval seeds); each append draws new prompts
    appended = len((tc.read_meta(str(out)) or {}).get("provenance", [])) if out.exists() else 0
    seeds = common.training_seeds(int(cfg.seed), appended, n)
    samples = task.prompts(seeds)
    rows: list[dict[str, Any]] = []
    if cfg.policy == "expert":
        rows = [{"prompt": s.prompt, "completion": s.solution, "answer": s.answer, "seed": s.seed} for s in samples]
    elif cfg.policy == "random":
        raise UserError("policy=random has no meaning for text tasks; use policy=expert or a checkpoint directory")
    else:
        policy = tc.build_policy(cfg, str(cfg.policy), ctx.device)
        k = int(cfg.text.samples)
        gen = torch.Generator(device=policy.device).manual_seed(int(cfg.seed))
        for start in range(0, n, 64):
            chunk = samples[start:start + 64]
            comps = sample_completions(policy, task, chunk, k, tc.max_new_tokens(cfg.text, task),
                                       greedy=bool(cfg.deterministic) and k == 1, generator=gen)
            rows += [{"prompt": c.sample.prompt, "completion": c.text, "answer": c.sample.answer, "seed": c.sample.seed,
                      "correct": bool(c.score.correct)} for c in comps if c.score.correct or not cfg.only_success]
    ctx.open()
    out.parent.mkdir(parents=True, exist_ok=True)
    mode = "a" if out.exists() else "w"
    with out.open(mode, encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    meta_path = Path(str(out) + tc.META_SUFFIX)
    meta = tc.read_meta(str(out)) or {"format": "rlinf-text-jsonl", "fields": ["prompt", "completion", "answer", "seed"],
                                       "provenance": []}
    meta["provenance"].append({"sim": plain(cfg.sim), "sim_choice": cfg.choices.sim, "policy": str(cfg.policy),
                               "rows": len(rows), "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    meta_path.write_text(json.dumps(meta, indent=2))
    lock.release()
    result = {"stage": "collect", "modality": "text", "output": str(out), "rows": len(rows), "prompts": n,
              "run_dir": str(ctx.run_dir)}
    ctx.console.print_json(json.dumps(result))
    return result
