"""rlinf's model contract for `{{name}}`: the checks `rlinf check-plugin {{name}}` runs (seeded
construction, act/evaluate/get_value shapes and agreement, gradients, save/load), on a discrete
and a continuous action space. Install the package first (`pip install -e .`), then `pytest tests/`.
Add your own tests beside it."""

from rlinf_cli.testing import check_model


def test_the_model_contract():
    check_model("{{name}}")  # fails naming each broken check, e.g. "act() returned logprob of shape (6, 1); expected (6,)"
