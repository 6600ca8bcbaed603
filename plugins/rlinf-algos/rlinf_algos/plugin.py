"""Entry point: registers the algorithms by name. Factories are imported on use."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_algorithms(register):
    register("ppo", "rlinf_algos.ppo:PPO", summary="PPO: GAE, clipped + dual-clip surrogate, clipped value loss", default=("rl",))
    register("grpo", "rlinf_algos.grpo:GRPO", summary="GRPO: group-relative outcome advantage, DAPO clip-higher, group filtering")
    register("rloo", "rlinf_algos.rloo:RLOO", summary="RLOO: leave-one-out baseline advantage, GRPO's clipped token-level loss")
    register("reinforce++", "rlinf_algos.reinforce_pp:ReinforcePP",
             summary="REINFORCE++: batch-normalised advantage (optional group baseline), clipped loss")
    register("sac", "rlinf_algos.sac:SAC",
             summary="SAC: twin Q, Polyak targets, learned temperature, UTD; replay buffer, demos= (RLPD)")
    register("bc", "rlinf_algos.bc:BC", summary="Behaviour cloning (NLL or MSE) for `rlinf sft`", default=("sft",))
