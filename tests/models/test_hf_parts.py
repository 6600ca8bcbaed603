"""model=hf's ``generate(..., part=)``: a batch split over generation workers samples, part by part,
the bits the whole batch samples, and leaves the generator where the whole batch leaves it, at the
batch shapes where this machine's matrix products give a row the same bits whatever the row count.
The probe the text rollout asks per shape, ``parts_are_exact``, says where (MKL's default path: the
shapes here; ``MKL_CBWR=COMPATIBLE``, which ``make test-portable`` sets, computes a block's last rows
with other kernels: there it says no at most shapes, the tests of those shapes skip, and the rollout
does not split such a batch at max_staleness=0). A probe that said yes at its own shape and was
trusted at another let the portable run's parts differ: each test asks at its own shape."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlinf_cli.collectors.text_gen import TextGeneration, parts_are_exact
from rlinf_model_hf.model import HFCausalLM
from rlinf_model_hf.sampling import BATCH_INVARIANT_ROWS, pad_part

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

TINY = {"name": "hf", "hidden_size": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate_size": 128}
# prompts of several lengths (a padded batch), and of one length
MIXED = ["1+2=", "34+5=", "7+8=", "123+45=", "9+9=", "11+2=", "5+55=", "8+1=", "1+1=", "2+22="]
SAME = ["1+2=", "7+8=", "9+9=", "8+1=", "3+3=", "4+5=", "6+1=", "2+2="]


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return HFCausalLM(TINY)


def _runs(cuts):
    return list(zip(cuts, cuts[1:]))


def _exact(policy, P, G, cuts) -> bool:
    return parts_are_exact(policy, P, G, _runs(cuts))


NOT_HERE = ("this machine's matrix products give parts of this batch shape other bits (the probe says so); "
            "the text rollout does not split such a batch at max_staleness=0")


def _parts(policy, prompts, G, cuts, seed=7, values=False):
    """The whole batch's generation and generator state, and the parts' merged."""
    whole_gen = torch.Generator().manual_seed(seed)
    whole = policy.generate(prompts, samples=G, max_new_tokens=10, generator=whole_gen, values=values)
    lengths = [len(p) for p in prompts]
    width, padded = max(lengths), min(lengths) < max(lengths)
    outs, states = [], []
    for lo, hi in zip(cuts, cuts[1:]):
        g = torch.Generator().manual_seed(seed)
        rows = list(range(lo * G, hi * G))
        outs.append(policy.generate(prompts[lo:hi], samples=G, max_new_tokens=10, generator=g, values=values,
                                    part=(rows, len(prompts) * G, width, padded)))
        states.append((int(outs[-1].lengths.max()), g.get_state()))
    T = whole.tokens.shape[1]
    pad = lambda t, v: torch.nn.functional.pad(t, (0, T - t.shape[1]), value=v)  # noqa: E731
    merged = {"tokens": torch.cat([pad(o.tokens, policy.pad_token_id) for o in outs]),
              "logprobs": torch.cat([pad(o.logprobs, 0.0) for o in outs]),
              "lengths": torch.cat([o.lengths for o in outs]), "finish": sum((o.finish for o in outs), [])}
    if values:
        merged["values"] = torch.cat([pad(o.values, 0.0) for o in outs])
    furthest = max(states, key=lambda s: s[0])[1]  # the part that drew the most steps
    return whole, whole_gen.get_state(), merged, furthest


def test_a_part_draws_its_rows_of_the_batchs_tokens_and_leaves_the_generator_where_the_batch_does():
    from rlinf_model_hf.sampling import draw

    probs = torch.softmax(torch.randn(16, 300, generator=torch.Generator().manual_seed(0)), -1)
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    whole = draw(probs, a)
    rows = torch.tensor([3, 4, 5, 11])
    part = draw(probs[rows], b, (rows, 16))
    assert torch.equal(part, whole[rows]) and torch.equal(a.get_state(), b.get_state())


def test_the_inverse_cdf_draw_follows_the_distribution_and_never_takes_a_zero():
    """Frequencies over 200,000 draws from a fixed generator against the probabilities (each within 5
    standard errors), zero-probability tokens (top-p's cut) never drawn, unnormalised rows allowed."""
    from rlinf_model_hf.sampling import draw

    p = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.0, 0.05])
    g = torch.Generator().manual_seed(11)
    counts = torch.zeros(6)
    for _ in range(20):
        tok = draw((3.0 * p).expand(10_000, 6), g)  # rows summing to 3: drawn by their own mass
        counts += torch.bincount(tok, minlength=6).float()
    freq, n = counts / counts.sum(), counts.sum()
    se = (p * (1 - p) / n).sqrt()
    assert counts[1] == 0 and counts[4] == 0
    assert ((freq - p).abs() <= 5 * se + 1e-9).all(), (freq, p)


@pytest.mark.parametrize("P, G, cuts", [(8, 4, [0, 4, 8]), (8, 4, [0, 1, 8]), (2, 4, [0, 1, 2]), (3, 1, [0, 1, 3]),
                                        (10, 2, [0, 5, 10]), (4, 2, [0, 1, 2, 3, 4])])
def test_parts_of_a_padded_batch_sample_its_bits(policy, P, G, cuts):
    if not _exact(policy, P, G, cuts):
        pytest.skip(NOT_HERE)
    prompts = policy.encode_prompts(MIXED[:P])
    assert len({len(p) for p in prompts}) > 1  # a padded batch
    whole, state, merged, furthest = _parts(policy, prompts, G, cuts)
    assert torch.equal(merged["tokens"], whole.tokens) and torch.equal(merged["logprobs"], whole.logprobs)
    assert torch.equal(merged["lengths"], whole.lengths) and merged["finish"] == whole.finish
    assert torch.equal(furthest, state)  # the trainer's generator continues as after the whole batch


class _Skewed:
    """The policy, but a part whose rows do not start the batch returns log-probs one ulp off: parts
    that differ from the whole batch as a lesser kernel makes them differ."""

    def __init__(self, policy):
        self.policy, self.device = policy, policy.device

    def encode_prompts(self, texts):
        return self.policy.encode_prompts(texts)

    def generate(self, prompts, *, part=None, **kw):
        out = self.policy.generate(prompts, part=part, **kw)
        if part is not None and min(part[0]) > 0:
            out.logprobs = torch.nextafter(out.logprobs, torch.full_like(out.logprobs, -1.0))
        return out


def test_the_probe_says_no_where_parts_differ_and_a_model_without_parts_never_splits(policy):
    assert not parts_are_exact(_Skewed(policy), 8, 4, _runs([0, 1, 5, 8]))
    assert not parts_are_exact(SimpleNamespace(generate=lambda prompts, *, samples, **kw: None), 8, 4)


def test_the_rollout_asks_the_probe_once_per_batch_shape(policy):
    asked = []

    def probe(pol, prompts, samples, runs):
        asked.append((prompts, samples, tuple(runs)))
        return prompts == 8

    gen = TextGeneration(SimpleNamespace(num_workers=2), SimpleNamespace(max_turns=1), SimpleNamespace(schemas=[]),
                         True, probe)
    assert gen.exact_parts(policy, 8, 4, [(0, 4), (4, 8)]) and gen.exact_parts(policy, 8, 4, [(0, 4), (4, 8)])
    assert not gen.exact_parts(policy, 6, 4, [(0, 3), (3, 6)])
    assert asked == [(8, 4, ((0, 4), (4, 8))), (6, 4, ((0, 3), (3, 6)))]


def test_parts_with_a_value_head(policy):
    policy.add_critic()
    try:
        with torch.no_grad():
            policy.value_head.linear.weight.normal_(generator=torch.Generator().manual_seed(1))
        if not _exact(policy, 8, 1, [0, 3, 8]):  # the probe samples values too once the policy has a critic
            pytest.skip(NOT_HERE)
        whole, _, merged, _ = _parts(policy, policy.encode_prompts(MIXED[:8]), 1, [0, 3, 8], values=True)
        assert torch.equal(merged["values"], whole.values) and torch.equal(merged["tokens"], whole.tokens)
    finally:
        policy.value_head, policy.has_critic = None, False
        policy.config["critic"] = False


def test_parts_of_a_batch_of_one_prompt_length_sample_the_same_distribution(policy):
    """transformers attends without a mask until one of the whole batch's rows ends: a part cannot
    know when that happens elsewhere, so its bits may differ from the whole batch's (they did on the
    CPU this test was written on and are equal on another: the kernels decide), and the text rollout does not
    split such a batch when it must be exact. What holds everywhere: the same tokens' log-probs to
    float rounding."""
    prompts = policy.encode_prompts(SAME)
    assert len({len(p) for p in prompts}) == 1
    whole, _, merged, _ = _parts(policy, prompts, 4, [0, 4, 8])
    if torch.equal(merged["tokens"], whole.tokens):  # the usual case; a rounding flip may change a draw
        assert torch.allclose(merged["logprobs"], whole.logprobs, atol=1e-4)


def test_pad_part_rows():
    # a part of 1 prompt of a 2-prompt batch computes the batch's 2 prompts (its own twice)
    prompts, rows = pad_part([[5, 6, 7]], 4, ([4, 5, 6, 7], 8, 3, False))
    assert prompts == [[5, 6, 7], [5, 6, 7]] and rows == [4, 5, 6, 7, 4, 5, 6, 7]
    # enough rows already, but the batch is padded and this part is not: one copy a token shorter
    prompts, rows = pad_part([[1, 2, 3]] * BATCH_INVARIANT_ROWS, 1, (list(range(4)), 10, 3, True))
    assert prompts[-1] == [2, 3] and len(prompts) == BATCH_INVARIANT_ROWS + 1 and rows[-1] == 0
    # the whole batch: nothing added
    assert pad_part([[1], [2, 3]], 2, ([0, 1, 2, 3], 4, 2, True)) == ([[1], [2, 3]], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="one row index"):
        pad_part([[1]], 2, ([0], 4, 1, False))
