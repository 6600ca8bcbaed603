"""Meta-World as an rlinf simulator. Importing this module imports neither metaworld nor mujoco."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("metaworld", "rlinf_sim_metaworld.sim:MetaWorldSimulator",
             summary="Meta-World v3 manipulation (50 tasks, MT10/MT50): state or pixels, scripted experts, success")
