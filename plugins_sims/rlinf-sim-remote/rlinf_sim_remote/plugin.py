from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("remote", "rlinf_sim_remote.sim:RemoteSimulator",
             summary="Envs on `rlinf env serve` servers (other Python environments, machines, robots): sim.address=host:port",
             hosted=True)  # its envs need a running server (contract tests start one)
