"""rlinf's simulator contract for `{{name}}`: the checks `rlinf check-sim sim={{name}}` runs (spec,
pickling, observations that match the spec, seeded determinism, replay, expert) on
conf/sim/{{name}}.yaml. Install the package first (`pip install -e .`), then `pytest tests/`.
Add your own tests beside it."""

from rlinf_cli.testing import check_simulator


def test_the_simulator_contract():
    check_simulator("{{name}}")
