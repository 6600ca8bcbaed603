"""rlinf's simulator contract for the robot `{{name}}`, on its fake robot (conf/sim/{{name}}.yaml
says hardware: fake): the checks `rlinf check-sim sim={{name}}` runs. Install the package first
(`pip install -e .`), then `pytest tests/`. Add your own tests beside it (keep real hardware out of
them, or behind a marker)."""

from rlinf_cli.testing import check_simulator


def test_the_simulator_contract_on_the_fake_robot():
    check_simulator("{{name}}")
