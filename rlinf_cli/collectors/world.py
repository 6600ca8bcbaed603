"""The two sets of roles: an embodied world (a simulator's envs) and a text world (a task's
prompts). They differ only in the rollout, evaluator and recorder they plug in; the batches
come from the runtime (``runtime/batches.py``)."""

from __future__ import annotations

from typing import Any

from rlinf_cli.api import TEXT, TEXT_SPEC
from rlinf_cli.collectors.embodied_env import EmbodiedEnv
from rlinf_cli.collectors.embodied_eval import EmbodiedEvaluator
from rlinf_cli.collectors.embodied_record import EmbodiedRecorder
from rlinf_cli.collectors.embodied_rollout import EmbodiedRollout
from rlinf_cli.collectors.roles import RoleSettings, World
from rlinf_cli.collectors.text_eval import TextEvaluator
from rlinf_cli.collectors.text_record import TextRecorder
from rlinf_cli.collectors.text_rollout import TextRollout
from rlinf_cli.collectors.text_tools import NO_TOOLS, Toolbox
from rlinf_cli.errors import UserError
from rlinf_cli.policy_factory import EmbodiedPolicies, TextPolicies
from rlinf_cli.registry import make_simulator
from rlinf_cli.runtime.batches import GroupBatches, ReplayStore, SampleBatches


def embodied_world(sim_node: Any, settings: RoleSettings, ctx: Any) -> World:
    """Envs placed by an executor; the simulator is built on first use (a dataset's need not be
    installed for `sft` to train)."""
    env = EmbodiedEnv(sim_node, settings.env)
    policies = EmbodiedPolicies(env, settings.policy)
    store = ReplayStore()  # filled by the rollout (off-policy), sampled by the batches
    return World("embodied", policies,
                 EmbodiedRollout(env, settings.rollout, store, getattr(ctx, "log", None)),
                 SampleBatches(env.device, store),
                 EmbodiedEvaluator(env, policies, settings.eval),
                 EmbodiedRecorder(env, policies, settings.record, getattr(ctx, "note", print)),
                 lambda: env.spec, lambda: env.label)


def text_world(task_node: Any, settings: RoleSettings, ctx: Any) -> World:
    """A text task's prompts (none for a JSONL dataset that names no task)."""
    task, label, tools = None, "jsonl", NO_TOOLS
    if task_node is not None and task_node.get("name"):
        task = make_simulator(task_node)
        if getattr(task, "modality", None) != TEXT:
            raise UserError(f"sim '{task_node.get('name')}' is not a text task")
        label = str(task_node.get("name"))
        tools = Toolbox.for_task(task)  # once per run: a search index is built here
        for line in tools.describe():  # which limits and isolation are in force, on this machine
            getattr(ctx, "note", print)(line)
    policies = TextPolicies(settings.policy)
    return World("text", policies, TextRollout(task, settings.rollout, tools, settings.env), GroupBatches(),
                 TextEvaluator(task, policies, settings.eval, tools),
                 TextRecorder(task, policies, settings.record, settings.policy.device, tools),
                 lambda: TEXT_SPEC, lambda: label)
