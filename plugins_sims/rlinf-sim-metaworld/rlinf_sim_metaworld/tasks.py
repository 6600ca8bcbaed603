"""Task names, benchmark task sets and instruction texts. Imports nothing heavy."""

from __future__ import annotations

# Meta-World's MT10 set (metaworld.env_dict.MT10_V3), in its order: task ids follow it.
MT10 = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)

# Short instructions for language-conditioned models; other tasks get one made from the name.
INSTRUCTIONS = {
    "reach-v3": "reach the goal position",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "door-open-v3": "open the door",
    "door-close-v3": "close the door",
    "drawer-open-v3": "open the drawer",
    "drawer-close-v3": "close the drawer",
    "button-press-v3": "press the button",
    "button-press-topdown-v3": "press the button from the top",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}


def all_tasks() -> tuple[str, ...]:
    """Every Meta-World v3 task (MT50), in Meta-World's order."""
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    return tuple(ALL_V3_ENVIRONMENTS)


def benchmark_tasks(name: str) -> tuple[str, ...]:
    if name == "MT10":
        return MT10
    if name == "MT50":
        return all_tasks()
    raise ValueError(f"unknown benchmark {name!r}")


def instruction(task: str) -> str:
    """The instruction text of a task, e.g. 'push the puck to the goal'."""
    return INSTRUCTIONS.get(task) or task.removesuffix("-v3").replace("-", " ")
