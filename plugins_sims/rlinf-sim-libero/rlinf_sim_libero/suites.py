"""Suite names, episode limits and the seed -> (task, initial state) map. Imports nothing heavy.

LIBERO evaluates each task from a fixed list of initial states (50 per task in the five standard
suites), not from freshly sampled ones. rlinf's episodes are functions of a seed, so a seed names
one (task, initial state) pair:

- Seeds below ``EVAL_SEED_START`` (1,000,000) are training seeds, seeds from it on evaluation seeds
  (rlinf's ``eval.seed`` default). Let ``k`` be the seed counted from the start of its range and
  ``T`` the number of selected tasks: the task is ``tasks[k % T]`` and the initial state is number
  ``k // T`` (modulo the states available to that range). Evaluation seeds ``1,000,000 + i`` for
  ``i < 50 T`` therefore visit every (task, initial state) pair once: LIBERO's standard protocol.
- ``held_out = h > 0`` splits the states: training seeds use states ``0 .. n-h-1`` only, evaluation
  seeds states ``n-h .. n-1`` only, so evaluation starts from states training never saw.
  ``held_out = 0`` (the default, as in LIBERO's papers) evaluates on the states training also uses.
"""

from __future__ import annotations

EVAL_SEED_START = 1_000_000

# Short names users type -> LIBERO's benchmark names. Any other name LIBERO registers (the
# LIBERO-PRO variants such as libero_spatial_lan) is accepted as given, with or without "libero_".
SUITES = {"spatial": "libero_spatial", "object": "libero_object", "goal": "libero_goal",
          "10": "libero_10", "90": "libero_90"}

# Episode limits LIBERO evaluations commonly use (steps at 20 Hz; the longest demonstration of the
# suite plus a margin). Other suites get DEFAULT_MAX_STEPS.
MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
DEFAULT_MAX_STEPS = 400


def benchmark_name(suite: str | int) -> str:
    """``spatial`` / ``10`` / ``libero_goal`` -> LIBERO's benchmark name."""
    s = str(suite).strip().lower()
    if s in SUITES:
        return SUITES[s]
    return s if s.startswith("libero_") else f"libero_{s}"


def seed_to_state(seed: int, n_tasks: int, n_states: int, held_out: int = 0) -> tuple[int, int]:
    """``(task index into the selected tasks, initial-state index)`` of an episode seed."""
    if n_tasks < 1 or n_states < 1:
        raise ValueError("n_tasks and n_states must be >= 1")
    if not 0 <= held_out < n_states:
        raise ValueError(f"held_out must be in 0..{n_states - 1}, got {held_out}")
    seed = int(seed)
    evaluation = seed >= EVAL_SEED_START
    k = seed - EVAL_SEED_START if evaluation else seed
    if k < 0:
        raise ValueError(f"episode seeds must be >= 0, got {seed}")
    task, j = k % n_tasks, k // n_tasks
    if held_out == 0:
        return task, j % n_states
    if evaluation:
        return task, n_states - held_out + j % held_out
    return task, j % (n_states - held_out)
