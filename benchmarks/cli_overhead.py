"""Fixed costs every command pays before any work: composing the config and opening a new embedded
MLflow store, each the way rlinf does it now against the way it did before, interleaved in one
process (medians over --repeats).

- compose: one Hydra composition plus Hydra's override step on it (``rlinf_cli.config.compose``)
  vs two full compositions (the group choices alone, then again with the value overrides).
- new store: a new sqlite store copied from the cached empty one (``tracking_store.new_client``) vs
  MLflow creating it by its migrations (an empty cache directory each time).
- optimizer: a fresh process making rlinf's LeanAdam and taking a first step vs the same with
  ``torch.optim.Adam`` (what LeanAdam's first step and constructor went through before: torch's
  wrappers import ``torch._dynamo`` on first call); both after ``import torch``.

    python benchmarks/cli_overhead.py --repeats 9
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402

OVERRIDES = ["sim=gymnasium", "algo=ppo", "sim.env_id=Acrobot-v1", "algo.lr=1e-4", "total_steps=20000",
             "model.hidden_sizes=[64,64]", "eval.episodes=3"]
CHOICES: dict[str, dict[str, str]] = {}  # every plugin group's option, as compose() chose them


def compose_twice(stage: str, overrides: list[str]) -> object:
    """The former path: compose with the group choices, check, compose again with every override."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rlinf_cli.config import CORE_CONF, GROUP_TO_KIND, compose, search_dirs

    searchpath = "hydra.searchpath=[" + ",".join(f"file://{d}" for d in search_dirs()[1:]) + "]"
    groups = [f"{g}={c}" for g, c in CHOICES.setdefault(stage, dict(compose(stage, overrides).choices)).items()]
    values = [o for o in overrides if o.split("=")[0] not in GROUP_TO_KIND]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CORE_CONF), version_base="1.3"):
            hydra_compose(stage, overrides=[searchpath, *groups])
            return hydra_compose(stage, overrides=[searchpath, *groups, *values])
    finally:
        GlobalHydra.instance().clear()


def new_store(root: Path, cache: Path) -> None:
    from rlinf_cli import tracking_store

    os.environ["RLINF_CACHE_DIR"] = str(cache)
    root.mkdir(parents=True)
    db = root / "mlflow.db"
    client = tracking_store.new_client(f"sqlite:///{db}", db)
    client.get_experiment("0")


OPTIM = """
import time, torch
t0 = time.perf_counter()
from rlinf_cli.runtime.optim import LeanAdam
m = torch.nn.Linear(8, 8)
opt = {cls}(m.parameters(), lr=1e-3)
m(torch.ones(2, 8)).sum().backward()
opt.step()
print(time.perf_counter() - t0)
"""


def optimizer_start(cls: str) -> float:
    import subprocess

    out = subprocess.run([sys.executable, "-c", OPTIM.format(cls=cls)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    print(machine_line())
    import logging

    from rlinf_cli.config import compose

    compose("rl", OVERRIDES)  # imports and plugin discovery out of the way
    compose_twice("rl", OVERRIDES)
    times: dict[str, list[float]] = {k: [] for k in ("compose once", "compose twice", "store copy", "store migrate",
                                                      "lean", "torch adam")}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        new_store(work / "warm", work / "cache")  # makes the cached copy; MLflow imported
        for name in ("alembic", "mlflow", "sqlalchemy"):
            logging.getLogger(name).setLevel(logging.ERROR)
        for i in range(args.repeats):
            for key, fn in (("compose once", lambda: compose("rl", OVERRIDES)),
                            ("compose twice", lambda: compose_twice("rl", OVERRIDES)),
                            ("store copy", lambda: new_store(work / f"c{i}", work / "cache")),
                            ("store migrate", lambda: new_store(work / f"m{i}", work / f"empty{i}"))):
                t0 = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t0)
            for key, cls in (("lean", "LeanAdam"), ("torch adam", "torch.optim.Adam")):
                times[key].append(optimizer_start(cls))
    rows = [["compose the rl config", f"{median(times['compose twice']) * 1e3:.0f}",
             f"{median(times['compose once']) * 1e3:.0f}",
             f"{median(times['compose twice']) / median(times['compose once']):.2f}x"],
            ["open a new MLflow store", f"{median(times['store migrate']) * 1e3:.0f}",
             f"{median(times['store copy']) * 1e3:.0f}",
             f"{median(times['store migrate']) / median(times['store copy']):.2f}x"],
            ["make the optimizer, first step (fresh process)", f"{median(times['torch adam']) * 1e3:.0f}",
             f"{median(times['lean']) * 1e3:.0f}", f"{median(times['torch adam']) / median(times['lean']):.2f}x"]]
    print(table(["fixed cost", "before ms", "now ms", "speed-up"], rows))


if __name__ == "__main__":
    main()
