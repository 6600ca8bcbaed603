"""Isaac Lab 3 as an rlinf simulator. Importing this module imports neither isaaclab nor torch."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("isaaclab", "rlinf_sim_isaaclab.sim:IsaacLabSimulator",
             summary="Isaac Lab 3 tasks (Isaac-Cartpole-Direct, Isaac-Ant-Direct, ...): one batched env, kit-less "
                     "Newton physics; Python 3.12 (serve from .venv-isaaclab)")
