"""`rlinf pipeline`: expert -> collect -> sft -> rl -> eval in one command, with a summary table.

Each stage runs in this process with its own run directory under the pipeline's directory.
Overrides ``<stage>.<key>=value`` go to one stage (``rl.total_steps=50000``); any other
override goes to every stage that has the key (``sim.env_id=...``, ``seed=1``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rlinf_cli.config import compose, inherited_overrides, stage_groups
from rlinf_cli.errors import UserError
from rlinf_cli.registry import GROUP_TO_KIND, make_simulator
from rlinf_cli.tables import RESULT_HEADERS, RESULT_LEGEND, result_cells, with_notes
from rlinf_cli.validate import check_best, validate

STEPS = ("expert", "collect", "sft", "rl", "eval")
# The default story: a few demonstrations leave the cloned policy room that RL then closes.
DEFAULTS: dict[str, list[str]] = {
    "expert": ["total_steps=60000", "eval.episodes=5"],
    "collect": ["episodes=4"],
    "sft": ["algo.epochs=30", "eval.episodes=0"],
    "rl": ["total_steps=40000", "eval.episodes=0"],
    "eval": ["episodes=20"],
}
_STAGE_OF = {"expert": "rl", "collect": "collect", "sft": "sft", "rl": "rl", "eval": "eval"}


def _kept(rl_result: dict[str, Any]) -> str:
    """The policy an rl stage hands on: its best on validation with ``eval.best`` (the default),
    else its final one."""
    return (rl_result.get("best") or {}).get("checkpoint") or rl_result["checkpoint"]


def kept_label(rl_result: dict[str, Any]) -> str:
    """What the rl step handed on, for the summary: ``sft`` (RL never beat the clone on
    validation), ``iteration N`` or ``last`` (rl.eval.best=false)."""
    kept = str(rl_result.get("kept", "last"))
    return "sft" if kept == "init" else kept


def route(args: list[str]) -> dict[str, list[str]]:
    """Split pipeline overrides by step; shared ones go to every stage that knows the key."""
    out: dict[str, list[str]] = {step: list(DEFAULTS[step]) for step in STEPS}
    for arg in args:
        if "=" not in arg:
            raise UserError(f"bad override '{arg}': write key=value (or <step>.key=value, step one of {', '.join(STEPS)})")
        body = arg.lstrip("+~")
        prefix = arg[: len(arg) - len(body)]
        key, _, value = body.partition("=")
        head, _, rest = key.partition(".")
        if head in STEPS and rest:
            out[head].append(f"{prefix}{rest}={value}")
            continue
        group = head if head in GROUP_TO_KIND else None
        for step in STEPS:
            if group is None or group in stage_groups(_STAGE_OF[step]):
                out[step].append(arg)
    return out


def yield_to_recommendation(overrides: list[str], extra: list[str]) -> list[str]:
    """The rl step's overrides with the pipeline's own defaults (``DEFAULTS["rl"]``, the few-demo
    story's short budget) dropped where the task's fine-tuning recommendation sets the key: `rlinf
    pipeline sim=metaworld sim.task=pick-place-v3` fine-tunes at the grasping family's 64 envs over
    400k steps, not 64 envs over 40k (4 iterations). The user's own overrides still win."""
    n = len(DEFAULTS["rl"])
    if overrides[:n] != DEFAULTS["rl"]:
        return overrides
    mine = overrides[n:]
    cfg = compose("rl", mine + extra)
    rec = set((cfg.get("recommended") or {}).get("keys", ()))
    return [d for d in DEFAULTS["rl"] if d.split("=", 1)[0] not in rec] + mine


def _check(routed: dict[str, list[str]]) -> Any:
    """Every step's settings are checked before the first one runs (placeholders stand for the
    inputs that earlier steps produce); returns the composed collect config."""
    from rlinf_cli.collectors import check_pipeline

    probe = compose("collect", routed["collect"] + ["output=unused"])
    check_pipeline(probe.sim)
    placeholders = {"collect": ["output=unused"], "sft": ["dataset=unused"], "eval": ["checkpoint=random"]}
    cfgs = {}
    for step in STEPS:
        name = _STAGE_OF[step]
        cfgs[step] = compose(name, routed[step] + placeholders.get(name, []))
        validate(name, cfgs[step])
    # the rl step chooses on validation seeds: apart from those the eval step measures on too
    check_best(cfgs["rl"], (int(cfgs["eval"].seed), int(cfgs["eval"].episodes)))
    return probe


def _summary(title: str, summaries: dict[str, dict[str, float]], timings: dict[str, float],
             kept: str = "last", warning: str = "") -> Any:
    """The pipeline's table; the "sft + rl" row says which policy the rl step kept."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("policy")
    for col in (*RESULT_HEADERS, "time"):
        table.add_column(col, justify="right")
    stage_time = {"random": None, "expert": timings.get("expert"), "sft": timings["collect"] + timings["sft"],
                  "sft + rl": timings["rl"]}
    for label, s in summaries.items():
        t = stage_time[label]
        shown = f"{label} (kept: {kept})" if label == "sft + rl" and kept != "last" else label
        table.add_row(shown, *result_cells(s), "-" if t is None else f"{t:.0f} s")
    notes = [RESULT_LEGEND + "; time: the stages that made the policy"]
    if kept != "last":
        notes.append("kept: the policy of the rl step that scored best on validation seeds (rl.eval.best=false: the last)")
    return with_notes(table, notes + ([warning] if warning else []))


def run(args: list[str]) -> dict[str, Any]:
    from rich.console import Console

    from rlinf_cli.stages import collect, common, eval as eval_stage, rl, sft

    routed = route(args)
    probe = _check(routed)
    root = common.create_unique(Path(probe.runs_dir) / "pipeline" / time.strftime("%Y%m%d-%H%M%S"))
    console = Console()
    results: dict[str, dict[str, Any]] = {}
    timings: dict[str, float] = {}
    running: list[str] = []  # the step started last

    def stage(step: str, extra: list[str]) -> dict[str, Any]:
        running.append(step)
        mine = yield_to_recommendation(routed[step], extra) if step == "rl" else routed[step]
        overrides = mine + [f"run_dir={root / step}"] + extra  # extra may name its own run_dir
        name = _STAGE_OF[step]
        cfg = compose(name, overrides, inherited_overrides(name, overrides))
        validate(name, cfg)
        console.rule(f"[bold]{step}")
        t0 = time.time()
        results[step] = {"rl": rl, "collect": collect, "sft": sft, "eval": eval_stage}[name].run(cfg)
        timings[step] = time.time() - t0
        return results[step]

    try:
        return _steps(routed, probe, root, stage, results, timings, console)
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM: the step's own line, and where the others are
        inner = getattr(exc, "saved", "")
        where = f"in step {running[-1]}" + (f": {inner}" if inner else "") if running else "before the first step"
        exc.saved = f"{where}; the pipeline does not resume: the finished steps' outputs are in {root}"  # type: ignore[attr-defined]
        raise


def _steps(routed: dict[str, list[str]], probe: Any, root: Path, stage: Any, results: dict[str, Any],
           timings: dict[str, float], console: Any) -> dict[str, Any]:
    import json


    sim = make_simulator(probe.sim)
    if sim.expert() is not None:
        source = "expert"
        timings["expert"] = 0.0
    else:
        source = _kept(stage("expert", []))
    data = root / "data"
    stage("collect", [f"policy={source}", f"output={data}"])
    sft_ckpt = stage("sft", [f"dataset={data}"])["checkpoint"]
    rl_result = stage("rl", [f"init={sft_ckpt}"])
    rl_ckpt, kept = _kept(rl_result), kept_label(rl_result)
    warning = f"warning: the rl step ended below the clone on validation; kept: {kept}" if rl_result.get("below_start") else ""
    summaries, videos = {}, {}
    for label, ckpt in {"random": "random", "expert": source, "sft": sft_ckpt, "sft + rl": rl_ckpt}.items():
        result = stage("eval", [f"checkpoint={ckpt}", f"run_dir={root / 'eval' / label.replace(' + ', '_')}"])
        summaries[label], videos[label] = result["eval"], result.get("videos", [])
        timings[f"eval:{label}"] = timings.pop("eval")
    console.rule("[bold]summary")
    console.print(_summary(f"rlinf pipeline: {getattr(sim, 'label', None) or probe.sim.name}", summaries, timings,
                           kept, warning))
    for label, files in videos.items():  # eval.video=N
        for f in files:
            console.print(f"video ({label}): {f}")
    console.print(f"pipeline directory: {root}  (MLflow: rlinf ui)")
    out = {"eval": summaries, "kept": kept, "below_start": bool(warning), "seconds": timings, "videos": videos}
    (root / "summary.json").write_text(json.dumps(out, indent=2))
    return {**out, "dir": str(root)}
