"""The plugin API: one ``register_<kind>`` hook per plugin kind.

Every hook receives a ``register`` callback and calls it once per component it provides::

    register(name, factory, *, summary="", default=False, **attrs)

- ``name``: the string users type (``sim=metaworld``, ``--algo grpo``). Names are unique per
  kind; a duplicate fails loudly at load time.
- ``factory``: a lazy ``"module:attr"`` string. It is imported only when the component is used,
  so registering never imports torch or a simulator.
- ``summary``: one line for ``rlinf plugins list``.
- ``default``: the stages this component is the group's default for when the user picks none:
  ``True`` = every stage, a tuple of stage names (``("rl",)``) = those only, ``False`` = none.
- ``attrs``: kind-specific metadata (for example ``priority`` for accelerators).

The hook module declares the plugin API it is built for, ``RLINF_API = "1.5"``
(:data:`rlinf_cli.api.API_VERSION`); the registry refuses another major version in one line.

A plugin ships its config options as YAML under a ``conf`` directory beside the module that
implements the hooks (``conf/sim/<name>.yaml``); the registry adds it to Hydra's search path.
"""

from __future__ import annotations

import pluggy

# The plugin API this core speaks, "MAJOR.MINOR". A plugin's hook module declares the version it
# was built for (``RLINF_API = "1.5"``); the registry refuses a plugin of another MAJOR (named in
# one line) and warns about one that declares a newer MINOR or nothing (docs/plugins.md). MAJOR
# goes up when a name here is removed or its contract changes; MINOR when one is added
# (1.1: tools, the ``register_tools`` hook and the tool names of rlinf_cli.api; 1.2: the
# ``Policy.add_critic`` method with its default; 1.3: ``ActOutput.extras``, what a policy needs back in
# ``evaluate``, and the ``Policy.imitation_loss`` method with its default, for the flow head; trainer
# ranks started by executors: ``RankJob``, ``RankDied``, ``TrainerPlacement``, ``run_rank`` and the
# optional ``Executor.start_ranks`` / ``cluster_report``; 1.4: generation workers started by executors:
# ``GenerationPlan``, ``GenerationPlacement``, ``GenerationWorker``, ``start_generation_processes``, the
# optional ``Executor.start_generation_workers`` / ``publish_weights``, and a text policy's optional
# ``generate(..., part=)``; 1.5: the ``Algorithm.demo_coef``, ``demo_loss`` and ``start`` methods and the
# ``Policy.residual`` method, each with a default that does what a 1.4 plugin did).
API_VERSION = "1.5"

hookspec = pluggy.HookspecMarker("rlinf")
hookimpl = pluggy.HookimplMarker("rlinf")


@hookspec
def register_simulators(register):
    """Register simulators (embodied environments and text tasks). Factory: ``(cfg) -> Simulator``."""


@hookspec
def register_models(register):
    """Register policy models. Factory: ``(cfg, env_spec) -> Policy``; class with ``from_pretrained``."""


@hookspec
def register_algorithms(register):
    """Register training algorithms. Factory: ``(cfg) -> Algorithm``."""


@hookspec
def register_accelerators(register):
    """Register accelerator backends. Factory: ``() -> Accelerator``; attr ``priority`` orders ``auto``."""


@hookspec
def register_executors(register):
    """Register executors that place env workers. Factory: ``(cfg) -> Executor``."""


@hookspec
def register_tools(register):
    """Register tools a language model may call in a text task's episode (API 1.1). Factory:
    ``(cfg) -> Tool`` (rlinf_cli.api.Tool); a text task lists the tools it offers in ``sim.tools``."""
