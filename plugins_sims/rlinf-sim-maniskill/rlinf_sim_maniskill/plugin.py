"""ManiSkill3 as an rlinf simulator. Importing this module imports neither mani_skill nor torch."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("maniskill", "rlinf_sim_maniskill.sim:ManiSkillSimulator",
             summary="ManiSkill3 manipulation (PickCube, PushCube, StackCube, PegInsertionSide, ...): state or pixels, success")
