from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("gymnasium", "rlinf_sim_gymnasium.sim:GymnasiumSimulator",
             summary="Any gymnasium env id: classic control, MuJoCo (dict observations, per-env seeds)", default=True)
