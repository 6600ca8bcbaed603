"""Entry point: registers the text tasks (simulator kind, ``modality="text"``). Factories load on use."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.1"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("arithmetic", "rlinf_sim_reasoning.tasks:ArithmeticTask", modality="text",
             summary="Text: generated arithmetic (digits, terms, operators), exact-match reward, held-out split")
    register("jsonl", "rlinf_sim_reasoning.tasks:JsonlTask", modality="text",
             summary="Text: GSM8K/MATH-style local JSONL (question, answer); #### / \\boxed{} extraction")
    register("reasoning_gym", "rlinf_sim_reasoning.rgym:ReasoningGymTask", modality="text",
             summary="Text: any reasoning-gym dataset (sim.task=chain_sum, countdown, ...) scored by its own verifier")
    register("calculator", "rlinf_sim_reasoning.tools:CalculatorTask", modality="text",
             summary="Text, multi-turn: the model may call a calculator tool and reads its result before answering")
