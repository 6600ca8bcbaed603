"""rlinf's algorithm contract for `{{name}}`: the checks `rlinf check-plugin {{name}}` runs. On a
fixed batch: finite advantages of shape [T, N], a loss that gradient steps lower; then tiny
`rlinf rl` runs (CartPole, the MLP model, the local executor: rlinf-sim-gymnasium, rlinf-model-mlp
and rlinf-executor-local must be installed): finite metrics, two seeded runs that agree, a resumed
run that ends with the same weights. Install the package first (`pip install -e .`), then
`pytest tests/`. Add your own tests beside it."""

from rlinf_cli.testing import check_algorithm


def test_the_algorithm_contract(tmp_path):
    check_algorithm("{{name}}", tmp_path)  # fails naming each broken check, e.g. "the loss did not fall: ..."
