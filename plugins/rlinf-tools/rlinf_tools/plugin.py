"""Entry point: registers the tools (plugin kind ``tool``, API 1.1). Factories load on use."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_tools(register):
    register("calculator", "rlinf_tools.calculator:Calculator",
             summary="Exact arithmetic (+ - * / parentheses) over fractions; model output is parsed, never eval-ed")
    register("python", "rlinf_tools.sandbox:PythonTool",
             summary="Runs Python code in a sandboxed process (CPU, memory, process, file and wall-clock limits, no network)")
    register("search", "rlinf_tools.search:SearchTool",
             summary="BM25 search over a local folder of .txt/.md files; returns the top passages")
