"""Entry point: registers the text tasks (simulator kind, ``modality="text"``). Factories load on use."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("arithmetic", "rlinf_sim_reasoning.tasks:ArithmeticTask", modality="text",
             summary="Text: generated arithmetic (digits, terms, operators), exact-match reward, held-out split")
    register("jsonl", "rlinf_sim_reasoning.tasks:JsonlTask", modality="text",
             summary="Text: GSM8K/MATH-style local JSONL (question, answer); #### / \\boxed{} extraction")
    register("reasoning_gym", "rlinf_sim_reasoning.rgym:ReasoningGymTask", modality="text",
             summary="Text: any reasoning-gym dataset (sim.task=chain_sum, countdown, ...) scored by its own verifier")
    register("calculator", "rlinf_sim_reasoning.tool_tasks:CalculatorTask", modality="text",
             summary="Text, multi-turn: arithmetic with tool plugins (sim.tools, default calculator) one call away")
    register("word_problems", "rlinf_sim_reasoning.word_problems:WordProblemsTask", modality="text",
             summary="Text, multi-turn: 3-4 digit arithmetic word problems; sim.tools=[calculator|python], [] = control")
