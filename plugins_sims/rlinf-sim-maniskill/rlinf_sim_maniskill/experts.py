"""Scripted experts for ManiSkill cube tasks, reading the flattened state (``pd_ee_delta_pos``).

Each expert maps one env's observation to ``[dx, dy, dz, gripper]`` in [-1, 1]: the controller
moves the tool by ``0.1 m x`` the action per step, gripper 1 = open, -1 = closed. They are
stateless proportional controllers over waypoints chosen from the current state (so any env
index, any step, works), written here from the tasks' documented success conditions.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

Layout = dict[str, tuple[int, int]]
STEP_M = 0.1  # pd_ee_delta_pos: action 1.0 moves the target by this many metres


def _get(state: np.ndarray, layout: Layout, key: str) -> np.ndarray:
    lo, hi = layout[key]
    return np.asarray(state[lo:hi], dtype=np.float64)


def _move(tcp: np.ndarray, target: np.ndarray, grip: float, gain: float = 1.0) -> np.ndarray:
    delta = np.clip((target - tcp) / STEP_M * gain, -1.0, 1.0)
    return np.array([*delta, grip], dtype=np.float32)


def push_cube(layout: Layout) -> Callable[[dict, int], np.ndarray]:
    """Get behind the cube (seen from the goal), lower to the table, push through the goal."""

    def act(obs: dict, index: int) -> np.ndarray:
        s = obs["state"]
        tcp = _get(s, layout, "extra/tcp_pose")[:3]
        cube = _get(s, layout, "extra/obj_pose")[:3]
        goal = _get(s, layout, "extra/goal_pos")[:3]
        d = goal[:2] - cube[:2]
        d = d / max(np.linalg.norm(d), 1e-6)
        behind = cube[:2] - d * 0.05
        rel = tcp[:2] - cube[:2]
        along = float(rel @ d)
        lateral = float(np.linalg.norm(rel - along * d))
        if along < -0.025 and lateral < 0.012 and tcp[2] < 0.035:  # in place: push towards (past) the goal
            target = np.array([*(goal[:2] + d * 0.02), 0.02])
        elif np.linalg.norm(tcp[:2] - behind) < 0.012:  # above the pre-push point: go down
            target = np.array([*behind, 0.02])
        elif tcp[2] < 0.06 and np.linalg.norm(tcp[:2] - behind) > 0.02:  # low and elsewhere: lift first
            target = np.array([*tcp[:2], 0.1])
        else:
            target = np.array([*behind, 0.1])
        return _move(tcp, target, -1.0)

    return act


def _pick_and_place(layout: Layout, obj_key: str, goal_of: Callable[[np.ndarray], np.ndarray],
                    release: bool) -> Callable[[dict, int], np.ndarray]:
    def act(obs: dict, index: int) -> np.ndarray:
        s = obs["state"]
        tcp = _get(s, layout, "extra/tcp_pose")[:3]
        obj = _get(s, layout, obj_key)[:3]
        goal = goal_of(s)
        fingers = _get(s, layout, "agent/qpos")[7:9].sum()  # ~0.08 open, ~0.04 holding a 4 cm cube
        held = np.linalg.norm(tcp - obj) < 0.02 and fingers < 0.06
        if held:
            if release and np.linalg.norm(obj - goal) < 0.012:
                return _move(tcp, tcp, 1.0)
            return _move(tcp, goal + (tcp - obj), -1.0)
        if np.linalg.norm(tcp[:2] - obj[:2]) > 0.01:  # above the object first
            return _move(tcp, np.array([*obj[:2], max(obj[2] + 0.06, tcp[2])]), 1.0)
        if tcp[2] - obj[2] > 0.005:
            return _move(tcp, obj, 1.0)
        return _move(tcp, obj, -1.0)  # close on it

    return act


def pick_cube(layout: Layout) -> Callable[[dict, int], np.ndarray]:
    """Above the cube, down, close, carry it to the goal point."""
    return _pick_and_place(layout, "extra/obj_pose", lambda s: _get(s, layout, "extra/goal_pos"), release=False)


def stack_cube(layout: Layout) -> Callable[[dict, int], np.ndarray]:
    """Pick cube A, carry it just above cube B, let go."""
    return _pick_and_place(layout, "extra/cubeA_pose",
                           lambda s: _get(s, layout, "extra/cubeB_pose")[:3] + np.array([0.0, 0.0, 0.042]), release=True)


EXPERTS: dict[str, Callable[[Layout], Callable[[dict, int], np.ndarray]]] = {
    "PushCube-v1": push_cube,
    "PickCube-v1": pick_cube,
    "StackCube-v1": stack_cube,
}
