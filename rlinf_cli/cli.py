"""The `rlinf` command line. Commands parse arguments, compose the config and call a stage.

Heavy modules (torch, hydra, mlflow, simulators) are imported inside the commands that need
them, so `rlinf --help` and `rlinf plugins list` stay fast.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer

from rlinf_cli import __version__, stops
from rlinf_cli.errors import UserError, error_line, one_line

app = typer.Typer(
    name="rlinf",
    help="RL for embodied and agentic AI, one command per stage: collect -> sft -> rl -> eval.\n\n"
    "Configure any stage with key=value overrides after the command, e.g. "
    "`rlinf rl --algo ppo sim.env_id=CartPole-v1 total_steps=200000`. "
    "`rlinf config show rl` prints the composed config; `rlinf plugins list` what is installed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
plugins_app = typer.Typer(help="Installed plugins (simulators, models, algorithms, accelerators, executors, tools).", no_args_is_help=True)
config_app = typer.Typer(help="Inspect the composed configuration.", no_args_is_help=True)
env_app = typer.Typer(help="Serve simulators to other Python environments and machines (sim=remote).", no_args_is_help=True)
app.add_typer(plugins_app, name="plugins")
app.add_typer(config_app, name="config")
app.add_typer(env_app, name="env")

OVERRIDES = {"allow_extra_args": True, "ignore_unknown_options": True}


def _compose(stage: str, overrides: list[str]) -> Any:
    from rlinf_cli.config import compose, inherited_overrides

    return compose(stage, overrides, inherited_overrides(stage, overrides))


def _run_stage(stage: str, overrides: list[str]) -> None:
    import importlib

    from rlinf_cli.validate import validate

    cfg = _compose(stage, overrides)
    validate(stage, cfg)
    if stage == "rl":
        from rlinf_cli.stages.ranks import launch

        if launch(stage, cfg) is not None:  # placement.trainer.ranks > 1: the executor's ranks ran it
            return
    importlib.import_module(f"rlinf_cli.stages.{stage}").run(cfg)


@app.command(context_settings=OVERRIDES)
def collect(ctx: typer.Context) -> None:
    """Run a policy in a simulator and write (or append to) a dataset.

    Example: rlinf collect sim.env_id=CartPole-v1 policy=expert episodes=50 output=data/cartpole
    """
    _run_stage("collect", ctx.args)


@app.command(context_settings=OVERRIDES)
def sft(ctx: typer.Context) -> None:
    """Supervised fine-tuning / behaviour cloning of a model on a dataset.

    Example: rlinf sft dataset=data/cartpole model=mlp algo.epochs=30
    """
    _run_stage("sft", ctx.args)


@app.command(context_settings=OVERRIDES)
def rl(
    ctx: typer.Context,
    algo: Optional[str] = typer.Option(None, "--algo", help="Algorithm name (sugar for algo=NAME): ppo, grpo, ..."),
) -> None:
    """RL training against a simulator, from scratch (default) or from a checkpoint (init=PATH).

    Example: rlinf rl --algo ppo sim.env_id=CartPole-v1 total_steps=150000
    Resume a stopped run: rlinf rl resume=rlinf_runs/rl/<run>/checkpoints/iter_000010
    """
    _run_stage("rl", ([f"algo={algo}"] if algo else []) + list(ctx.args))


@app.command("eval", context_settings=OVERRIDES)
def eval_(ctx: typer.Context) -> None:
    """Evaluate a checkpoint on fixed seeds: return, success rate, episode length (table + JSON).

    Example: rlinf eval checkpoint=rlinf_runs/rl/<run>/checkpoints/final episodes=50
    """
    _run_stage("eval", ctx.args)


@app.command("export", context_settings=OVERRIDES)
def export(ctx: typer.Context) -> None:
    """Write a checkpoint's policy for use outside rlinf, in its model's own format (model=hf: a plain
    transformers directory, a LoRA adapter merged into the weights).

    Example: rlinf export checkpoint=rlinf_runs/rl/<run>/checkpoints/final output=exported/
    """
    from rlinf_cli.stages.export import run

    typer.echo(run(list(ctx.args)))


@app.command(context_settings=OVERRIDES)
def pipeline(ctx: typer.Context) -> None:
    """The whole loop in one command: expert -> collect -> sft -> rl -> eval, then a summary table.

    Overrides prefixed with a stage name apply to that stage only (rl.total_steps=50000);
    others apply to every stage (sim.env_id=..., seed=...).
    """
    from rlinf_cli.stages import pipeline as pl

    pl.run(list(ctx.args))


@config_app.command("show", context_settings=OVERRIDES)
def config_show(
    ctx: typer.Context,
    stage: str = typer.Argument(..., help="collect | sft | rl | eval | serve (rlinf env serve)"),
    algo: Optional[str] = typer.Option(None, "--algo", help="Algorithm name (sugar for algo=NAME; rl and sft)"),
    diff: Optional[str] = typer.Option(
        None, "--diff", metavar="OLD[..NEW]",
        help="Instead, print which defaults of STAGE changed from release OLD to NEW (default: this install), "
             "for the groups picked in the overrides (e.g. --diff 0.1.0 sim=metaworld)."),
) -> None:
    """Print the composed config of STAGE with the given overrides applied, each value that is not a
    default marked with where it came from (your override, the checkpoint, the task's recommendation).

    Example: rlinf config show rl --algo grpo algo.group_size=16
    """
    overrides = ([f"algo={algo}"] if algo else []) + list(ctx.args)
    if diff is not None:
        from rlinf_cli.confhistory import report

        typer.echo(report(stage, diff, overrides))
        return
    from rlinf_cli.config import annotated_yaml, compose, inherited_overrides, origins

    inherited = inherited_overrides(stage, overrides)
    cfg = compose(stage, overrides, inherited)
    typer.echo(annotated_yaml(cfg, origins(cfg, overrides, inherited)), nl=False)


def _default_mark(stages: tuple[str, ...]) -> str:
    """`` *`` for a default of every stage, `` *rl,sft`` for some, nothing for none."""
    from rlinf_cli.registry import STAGES

    return "" if not stages else " *" if set(stages) >= set(STAGES) else " *" + ",".join(stages)


@plugins_app.command("list")
def plugins_list(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Every registered component: kind, name, package, version, summary."""
    from rlinf_cli.registry import get_registry

    reg = get_registry()
    specs = reg.all_specs()
    if as_json:
        typer.echo(json.dumps([{"kind": s.kind, "name": s.name, "package": s.package, "version": s.version,
                                "summary": s.summary, "default": bool(s.default), "default_stages": list(s.default),
                                "factory": s.factory, "compatible": s.problem is None,
                                "api_warning": s.warning} for s in specs], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    # a plugin built for another plugin API major is listed, marked, and named below the table
    rows = [(s.kind, s.name + _default_mark(s.default) + (" (incompatible)" if s.problem else ""), s.package,
             s.version, s.summary) for s in specs]
    heads = ("kind", "name", "package", "version", "summary")
    widths = [max(len(r[i]) for r in [heads, *rows]) for i in range(len(heads))]
    console = Console()
    # one line a row: a summary wrapped in what is left of 80 columns took 5-10 lines a row. It gets
    # the rest of the line and is cut there, or left out where too little is left to read
    room = console.width - sum(widths[:-1]) - 3 * len(heads) - 1
    shown = heads if room >= 20 else heads[:-1]
    table = Table(title="rlinf plugins")
    for col in shown:
        table.add_column(col, no_wrap=True, overflow="ellipsis", max_width=room if col == "summary" else None)
    for row in rows:
        table.add_row(*row[:len(shown)])
    console.print(table)
    for problem in reg.incompatible.values():
        typer.echo(f"incompatible: {problem}")
    for note in reg.api_notes.values():
        typer.echo(f"note: {note}")
    note = "" if widths[-1] <= room else "; summaries cut to the terminal's width" if len(shown) == len(heads) else \
        "; no room for summaries at this width"
    console.print(f"* default when none is chosen (*rl: for `rlinf rl` only){note}" + (" (`rlinf plugins list --json` has them whole)" if note else ""),
                  style="dim")


@plugins_app.command("new")
def plugins_new(
    name: str = typer.Argument(..., help="Component name users will type, e.g. mysim"),
    kind: str = typer.Option("simulator", "--kind", help="simulator | model | algorithm | robot (a simulator driving hardware)"),
    directory: str = typer.Option(".", "--dir", help="Where to create the package directory"),
) -> None:
    """Scaffold a plugin package that installs with pip and shows up in `rlinf plugins list`."""
    from rlinf_cli.scaffold import new_plugin

    path = new_plugin(name, kind, directory)
    typer.echo(f"created {path}; install it with: pip install -e {path}")


@app.command("check-sim", context_settings=OVERRIDES)
def check_sim(ctx: typer.Context) -> None:
    """Check a simulator plugin against rlinf's simulator contract (for plugin authors).

    Example: rlinf check-sim sim=mysim sim.some_key=3
    """
    from rich.console import Console
    from rich.table import Table

    from rlinf_cli.checks import check_simulator, check_text_task
    from rlinf_cli.registry import make_simulator

    cfg = _compose("serve", list(ctx.args))  # the sim group alone: no executor or accelerator plugin needed (a served env)
    sim = make_simulator(cfg.sim)
    rows = check_text_task(sim) if getattr(sim, "modality", None) == "text" else check_simulator(sim)
    table = Table(title=f"rlinf check-sim: {cfg.sim.name}")
    for col in ("check", "result", "detail"):
        table.add_column(col)
    for name, ok, detail in rows:
        table.add_row(name, "[green]pass" if ok else "[red]FAIL", detail)
    Console().print(table)
    failed = [r for r in rows if not r[1]]
    if failed:
        raise UserError(f"{len(failed)} contract check(s) failed for simulator '{cfg.sim.name}': {failed[0][0]}: {failed[0][2]}")


@app.command("check-plugin")
def check_plugin(
    name: str = typer.Argument(..., help="The plugin's registered name (`rlinf plugins list`)"),
    kind: Optional[str] = typer.Option(None, "--kind", help="model | algorithm | simulator | accelerator | executor | tool "
                                       "(only when NAME is registered under several kinds)"),
) -> None:
    """Check an installed plugin against its kind's contract (for plugin authors): a table of checks.

    Example: rlinf check-plugin mymodel   (exit 2 and one line per failed check when any fails)
    """
    from rlinf_cli.testing.command import check_plugin as run

    raise typer.Exit(run(name, kind))


@env_app.command("serve", context_settings=OVERRIDES)
def env_serve(ctx: typer.Context) -> None:
    """Serve a simulator plugin over gRPC to `rlinf rl sim=remote sim.address=HOST:PORT` (no torch needed here).

    Example: rlinf env serve sim=maniskill sim.task=PushCube-v1 port=50051
    Binds 127.0.0.1; host=0.0.0.0 needs token=... (or RLINF_ENV_TOKEN). Ctrl-C stops it.
    """
    import logging

    from rlinf_cli.remote.server import ServeConfig, make_served_simulator, serve_forever
    from rlinf_cli.settings import build, plain

    cfg = _compose("serve", list(ctx.args))
    opts = {k: v for k, v in plain(cfg).items() if k not in ("sim", "stage", "choices", "log_level")}
    serve_cfg = build(ServeConfig, opts, "serve")
    level = str(cfg.get("log_level", "info")).upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sim, label = make_served_simulator(cfg.sim)
    serve_forever(sim, serve_cfg, label)


@app.command()
def doctor() -> None:
    """What is installed and usable here: plugins, accelerators, tracking store."""
    from rlinf_cli.doctor import report

    report()


@app.command()
def ui(
    port: int = typer.Option(5000, help="Port for the MLflow UI"),
    runs_dir: str = typer.Option("rlinf_runs", help="runs_dir whose embedded store to show"),
) -> None:
    """Start the MLflow UI on 127.0.0.1 for the embedded tracking store."""
    from pathlib import Path

    from rlinf_cli.tracking import default_uri
    from rlinf_cli.ui import serve

    uri = default_uri(Path(runs_dir))
    if not (Path(runs_dir) / "mlflow.db").exists():
        raise UserError(f"no tracking store at {runs_dir}/mlflow.db yet; run a stage first (or pass --runs-dir)")
    raise typer.Exit(serve(uri, port))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlinf {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version.")) -> None:
    pass


def _usage_error() -> type[Exception]:
    """The usage-error class the installed typer raises: typer 0.2x vendors click (``typer._click``,
    and no longer installs click), older typer raises click's own."""
    try:
        from typer._click.exceptions import UsageError
    except ImportError:
        from click.exceptions import UsageError
    return UsageError


def main(argv: list[str] | None = None) -> None:
    """Console entry point: bad input -> one line on stderr and exit code 2; SIGINT and SIGTERM
    -> one line saying what stopped and what was saved, exit code 130 / 143."""
    usage_error = _usage_error()
    previous = stops.install()
    try:
        code = app(args=argv, standalone_mode=False)
        if stops.STOPS and code == 130:  # typer turns KeyboardInterrupt into exit code 130: the stop itself is kept here
            _stopped(stops.STOPS[0])
    except UserError as exc:
        _fail(str(exc))
    except usage_error as exc:
        ctx = getattr(exc, "ctx", None)
        _fail(exc.format_message() + (f" (see `rlinf {ctx.command_path.split(' ', 1)[-1]} --help`)" if ctx else ""))
    except (typer.Abort, KeyboardInterrupt) as exc:  # click turns KeyboardInterrupt into Abort
        _stopped(exc)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    finally:
        stops.restore(previous)
    sys.exit(code if isinstance(code, int) else 0)


def _stopped(exc: BaseException) -> None:
    import signal

    if stops.STOPS:
        exc = stops.STOPS[0]
    cause = exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__ or exc.__context__
    signum = getattr(cause, "signum", signal.SIGINT)
    saved = getattr(cause, "saved", "")
    name = signal.Signals(signum).name
    # not cut like an error line: the resume command in it must stay whole
    print(one_line(f"stopped by {name}" + (f": {saved}" if saved else "")), file=sys.stderr)
    sys.exit(128 + signum)


def _fail(message: str) -> None:
    print(f"error: {error_line(message)}", file=sys.stderr)
    sys.exit(2)
