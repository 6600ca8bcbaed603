from rlinf_cli.api import hookimpl


@hookimpl
def register_simulators(register):
    register("gymnasium", "rlinf_sim_gymnasium.sim:GymnasiumSimulator",
             summary="Any gymnasium env id: classic control, MuJoCo (dict observations, per-env seeds)", default=True)
