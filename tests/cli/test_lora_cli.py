"""LoRA through the command line on tiny models: sft and GRPO train the adapter alone, the KL
reference is the base, resume continues the same adapter exactly, eval and export read the
checkpoints, and export refuses bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TINY = {"name": "hf", "hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate_size": 64}
TINY_ARGS = ["model=hf", *(f"model.{k}={v}" for k, v in TINY.items() if k != "name")]
QUIET = ["tracking.enabled=false", "progress=false"]
# a reward for any number in the answer: completions of an untrained model differ in reward (GRPO learns only
# from groups that do), and the adapter trains from the first iteration
GRPO = ["text.iterations=2", "algo.groups=2", "algo.group_size=4", "algo.epochs=1", "algo.lr=1e-2", "algo.kl_coef=0.05",
        "sim.format_reward=0.5", "eval.episodes=4", "checkpoint.interval=1"]


def _adapter(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))


def _base(ckpt: Path) -> dict[str, torch.Tensor]:
    from rlinf_cli.policy import load_policy
    from rlinf_model_hf.lora import base_state_dict

    return base_state_dict(load_policy(ckpt).lm)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _b_nonzero(adapter: dict[str, torch.Tensor]) -> bool:
    return all(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)


@pytest.mark.slow
def test_lora_sft_then_grpo_resume_eval_export(cli, workdir):
    from rlinf_model_hf.model import HFCausalLM

    torch.manual_seed(0)
    HFCausalLM(TINY).export(workdir / "base")  # a plain transformers directory: the checkpoints reference it
    original = HFCausalLM({**TINY, "path": str(workdir / "base")}).lm.state_dict()
    r = cli("collect", "sim=arithmetic", "sim.digits=1", "policy=expert", "episodes=64", "output=data/add.jsonl", *QUIET)
    assert r.code == 0, r.err
    r = cli("sft", "dataset=data/add.jsonl", *TINY_ARGS, "model.path=base", "model.lora.r=8", "algo.epochs=1",
            "algo.minibatch_size=16", "algo.lr=1e-2", "eval.episodes=4", "run_dir=sft", *QUIET)
    assert r.code == 0, r.err
    sft = workdir / "sft/checkpoints/best"
    assert (sft / "adapter/adapter_config.json").is_file() and not (sft / "hf").exists()  # the base is referenced
    assert _b_nonzero(_adapter(sft))  # the adapter (B = 0 at the start) trained ...
    assert _same(_base(sft), original)  # ... the base did not

    # GRPO continues the same adapter from the SFT checkpoint, with a KL to it (the adapter swapped in)
    r = cli("rl", "--algo", "grpo", f"init={sft}", *GRPO, "run_dir=rl", *QUIET)
    assert r.code == 0, r.err
    final = workdir / "rl/checkpoints/final"
    assert _adapter(final).keys() == _adapter(sft).keys() and not _same(_adapter(final), _adapter(sft))
    assert _same(_base(final), original)
    kl = [m["train/kl_ref"] for m in _metrics(workdir / "rl") if "train/kl_ref" in m]
    assert kl[0] == 0.0 and kl[1] > 0  # the reference is the starting policy: equal at first, then apart

    # resume from the first iteration: the same adapter, trained on to the same weights (its KL reference
    # rebuilt from init=: the SFT adapter again, on the resumed policy's base)
    r = cli("rl", f"resume={workdir / 'rl/checkpoints/iter_000001'}", "run_dir=resumed", *QUIET)
    assert r.code == 0, r.err
    assert _same(_adapter(workdir / "resumed/checkpoints/final"), _adapter(final))

    r = cli("eval", f"checkpoint={final}", "episodes=4", *QUIET)
    assert r.code == 0, r.err
    assert 0.0 <= r.json_tail()["accuracy"] <= 1.0

    r = cli("export", f"checkpoint={final}", "output=merged")
    assert r.code == 0, r.err
    assert "LoRA adapter merged" in r.out
    _check_merged(final, workdir / "merged")


def _check_merged(ckpt: Path, merged_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rlinf_cli.policy import load_policy

    policy = load_policy(ckpt)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)  # no rlinf, no peft
    ids = torch.tensor([policy.encode_prompts(["3+4=7"])[0]])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, policy.lm(input_ids=ids).logits, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_grpo_with_lora_on_the_tiny_preset_stores_its_base(cli, workdir):
    # 3 iterations of 4 x 8: an untrained 1-layer model rarely answers with a number, and an iteration
    # whose groups all score alike does not update (which one first has signal depends on the draws)
    r = cli("rl", "--algo", "grpo", "sim=arithmetic", "sim.digits=1", *TINY_ARGS, "model.lora.r=8", *GRPO,
            "text.iterations=3", "algo.groups=4", "algo.group_size=8", "run_dir=rl", *QUIET)
    assert r.code == 0, r.err
    kl = [m["train/kl_ref"] for m in _metrics(workdir / "rl") if "train/kl_ref" in m]
    assert kl[0] == 0.0 and max(kl[1:]) > 0  # the reference: the base, which the fresh adapter (B = 0) began as
    first, final = workdir / "rl/checkpoints/iter_000002", workdir / "rl/checkpoints/final"  # (iter 1: rotated out)
    # the tiny preset is randomly initialised: no file can rebuild it, so every checkpoint stores it
    assert (first / "hf/model.safetensors").is_file() and (final / "hf/model.safetensors").is_file()
    assert _same(load_file(str(first / "hf/model.safetensors")), load_file(str(final / "hf/model.safetensors")))
    assert _b_nonzero(_adapter(final)) and not _same(_adapter(first), _adapter(final))


def test_export_bad_input_is_one_line(cli, workdir):
    from rlinf_model_hf.model import HFCausalLM

    torch.manual_seed(0)
    HFCausalLM(TINY).save_pretrained(workdir / "ckpt")
    (workdir / "full").mkdir()
    (workdir / "full" / "x").write_text("keep me")
    for args, message in [(["checkpoint=nope", "output=out"], "checkpoint 'nope' does not exist"),
                          (["checkpoint=ckpt", "output=full"], "output 'full' exists and is not an empty directory"),
                          (["checkpoint=ckpt"], "rlinf export needs output=..."),
                          (["checkpoint=ckpt", "output=o", "device=cpu"], "takes checkpoint=PATH output=DIR, not 'device=cpu'")]:
        r = cli("export", *args)
        assert r.code == 2 and message in r.err, (args, r.err)
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    assert (workdir / "full" / "x").read_text() == "keep me" and not (workdir / "out").exists()
    (workdir / "empty").mkdir()
    r = cli("export", "checkpoint=ckpt", "output=empty")  # an empty directory is fine; without LoRA: the model as is
    assert r.code == 0, r.err
    assert (workdir / "empty/config.json").is_file() and "merged" not in r.out
    assert not list(workdir.glob(".empty.export-*"))
