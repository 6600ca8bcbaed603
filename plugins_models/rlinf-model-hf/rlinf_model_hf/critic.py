"""The causal LM's critic: a linear value head on the last hidden state, one value per position.

The value of completion token t is read where its log-prob is: at the position whose hidden state
predicts token t (the prompt's last token for t = 0), i.e. V(prompt + tokens before t). So values
come out in the same [B, T] layout as the log-probs, in sampling (``sampling.generate``) and in
training (``sampling.token_logprobs``) alike.

It starts at zero (weights and bias): a fresh head estimates 0 everywhere instead of random values
that would push the first advantages around. It is not part of the transformers model: checkpoints
keep it in ``value_head.safetensors`` beside ``hf/`` or ``adapter/`` (with LoRA it trains with the
adapter, peft never freezes it), and ``rlinf export`` leaves it out.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rlinf_cli.api import UserError

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueHead(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Values [...] of hidden states [..., H], in fp32 whatever the autocast (values feed returns
        and the value loss, where bf16's 8-bit mantissa would blur small differences)."""
        with torch.autocast(hidden.device.type, enabled=False):
            return self.linear(hidden.float()).squeeze(-1)


def hidden_size(lm: nn.Module) -> int:
    """The width of the hidden state the LM's output layer reads."""
    return int(lm.get_output_embeddings().weight.shape[1])


def save(head: ValueHead, directory: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}, str(directory / VALUE_HEAD_FILE))


def load(head: ValueHead, directory: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = directory / VALUE_HEAD_FILE
    if not path.is_file():
        raise UserError(f"checkpoint '{directory}' says its model has a value head (critic: true) but has no "
                        f"{VALUE_HEAD_FILE}; the checkpoint is damaged")
    try:
        head.load_state_dict(load_file(str(path), device=str(head.linear.weight.device)))
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise UserError(f"cannot read the value head {path}: {str(exc).splitlines()[0]}; the checkpoint is damaged") \
            from exc
