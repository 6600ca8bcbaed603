"""LoRA adapters on the causal LM, through peft (``model.lora.r > 0``).

The transformers model gets low-rank adapters on the layers ``model.lora.targets`` names and only
those train: peft freezes every base weight, and the engine's optimizer takes the parameters that
require gradients. Because the base never changes:

- the KL reference needs no second model: it is the same model with the adapter off, or, when the
  run began from a trained adapter (``init=``), with that adapter's weights swapped in for the
  call (:func:`reference`);
- a checkpoint holds the adapter (peft's own files) and what rebuilds the base: its source,
  checked on load by a fingerprint of its weights, or the base itself where no file rebuilds it
  (:class:`Base`);
- ``rlinf export`` merges the adapter into the base weights (:func:`merged_state_dict`).

This module needs peft only inside its functions: registering the plugin stays light.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from rlinf_cli.api import UserError

ADAPTER_DIR = "adapter"  # peft's adapter_config.json + adapter_model.safetensors
ADAPTER_FILE = "adapter_model.safetensors"
# the attention and MLP projections of Llama/Qwen2/Mistral-style decoders (SmolLM2, the tiny preset)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SAVE_BASE = ("auto", "always", "never")


@dataclass(frozen=True)
class LoraSettings:
    r: int = 0  # adapter rank; 0 = no adapter (every weight trains)
    alpha: float | None = None  # the adapter's output is scaled by alpha / r; null = 2 * r
    dropout: float = 0.0  # dropout on the adapter's input, training forward only
    targets: tuple[str, ...] | str = DEFAULT_TARGETS  # module names to adapt, or "all-linear"
    save_base: str = "auto"  # auto | always | never: store the base model in checkpoints (see Base.stored)

    def __post_init__(self) -> None:
        if self.r < 0:
            raise ValueError(f"r must be >= 0 (0 = no adapter), got {self.r}")
        if self.alpha is not None and self.alpha <= 0:
            raise ValueError(f"alpha must be > 0 (or null for 2 * r), got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.targets, str) and self.targets != "all-linear":
            raise ValueError(f"targets must be a list of module names or all-linear, got {self.targets!r}")
        if not self.targets:
            raise ValueError("targets must name at least one module (or be all-linear)")
        if self.save_base not in SAVE_BASE:
            raise ValueError(f"save_base must be one of {', '.join(SAVE_BASE)}, got {self.save_base!r}")

    @property
    def lora_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else 2.0 * self.r


# -- the base model -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Base:
    """Where a LoRA policy's frozen base model comes from, and whether its checkpoints store it."""

    source: str  # for messages: "the tiny preset", a directory, a GGUF file
    rebuild: dict[str, Any] | None  # the model-config keys (path, gguf_file) that load it again; None: nothing can
    own_output: bool  # an rlinf checkpoint: a run's output, which runs prune and users delete with the run
    fingerprint: str  # of its weights: a referenced base that changed is refused on load

    def stored(self, save_base: str) -> bool:
        """``auto`` stores the bases no file can rebuild (the tiny preset is randomly initialised)
        and those taken from rlinf checkpoints; it references transformers directories, GGUF files
        and the smollm2 preset, which the user keeps. ``always``: self-contained checkpoints."""
        if self.rebuild is None:
            if save_base == "never":
                raise UserError(f"model.lora.save_base=never, but the base model ({self.source}) has no file to "
                                f"rebuild it from: use save_base=auto or always")
            return True
        return save_base == "always" or (save_base == "auto" and self.own_output)

    def record(self, stored: bool) -> dict[str, Any]:
        return {**asdict(self), "stored": stored}


def fingerprint(lm: torch.nn.Module) -> str:
    """A hash of every tensor's name, shape and a strided sample of its values: cheap (a few
    thousand values a tensor), and any re-initialisation or fine-tuning of the base changes it."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in sorted(lm.state_dict().items()):
            flat = t.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 4096)][:4096].to(torch.float64).cpu()
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
            h.update(sample.numpy().tobytes())
    return h.hexdigest()[:32]


def base_of(cfg: Any, lm: torch.nn.Module, saved: Mapping[str, Any] | None, ckpt: Path | None) -> Base:
    """The base just loaded (before the adapter goes on): from ``cfg`` (``path``, ``gguf_file``,
    ``preset``), or from LoRA checkpoint ``ckpt`` whose record is ``saved`` (checked here)."""
    fp = fingerprint(lm)
    if saved is not None and ckpt is not None:
        if fp != saved.get("fingerprint"):
            raise UserError(f"LoRA checkpoint '{ckpt}': its base model ({saved.get('source')}) is not the one the "
                            f"adapter was trained on (its weights differ); restore that model (model.lora."
                            f"save_base=always keeps the base inside checkpoints)")
        if saved["stored"]:  # it stays stored in the checkpoints made from this one
            return Base(f"the base stored in {ckpt}", {"path": str((ckpt / "hf").resolve()), "gguf_file": None},
                        True, fp)
        return Base(str(saved["source"]), dict(saved["rebuild"]), bool(saved["own_output"]), fp)
    if cfg.path is None:
        if cfg.preset == "tiny":
            return Base("the tiny preset, randomly initialised", None, False, fp)
        return Base(f"the {cfg.preset} preset", {"path": None, "gguf_file": None}, False, fp)
    path = Path(cfg.path).resolve()
    if cfg.gguf_file:
        return Base(f"GGUF file {cfg.gguf_file} of {path}", {"path": str(path), "gguf_file": cfg.gguf_file}, False, fp)
    rlinf_checkpoint = (path / "config.json").is_file() and (path / "hf" / "config.json").is_file()
    return Base(str(path), {"path": str(path), "gguf_file": None}, rlinf_checkpoint, fp)


def is_lora_checkpoint(path: Path) -> bool:
    return (path / ADAPTER_DIR / "adapter_config.json").is_file()


# -- the adapter ----------------------------------------------------------------------------------
def attach(lm: torch.nn.Module, s: LoraSettings, adapter_dir: Path | None) -> Any:
    """Put adapters on ``lm`` in place; returns peft's wrapper (``disable_adapter``, saving). A
    fresh adapter starts as a no-op (peft: B = 0); ``adapter_dir`` loads a saved one, trainable."""
    import warnings

    import peft

    with warnings.catch_warnings():  # peft asks transformers a question that transformers 5 renamed
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        if adapter_dir is not None:
            try:
                return peft.PeftModel.from_pretrained(lm, str(adapter_dir), is_trainable=True)
            except (OSError, ValueError, RuntimeError, KeyError) as exc:
                raise UserError(f"cannot load the LoRA adapter in '{adapter_dir}': {_first_line(exc)}; the "
                                f"checkpoint is damaged") from exc
        targets = s.targets if isinstance(s.targets, str) else list(s.targets)
        conf = peft.LoraConfig(r=s.r, lora_alpha=s.lora_alpha, lora_dropout=s.dropout, target_modules=targets,
                               bias="none")
        try:
            return peft.get_peft_model(lm, conf)
        except ValueError as exc:
            return _no_targets(lm, targets, exc)


def _no_targets(lm: torch.nn.Module, targets: Any, exc: ValueError) -> Any:
    names = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear)})
    raise UserError(f"model.lora.targets {targets}: {_first_line(exc)}; this model's linear layers are "
                    f"{', '.join(names)} (or targets=all-linear)") from exc


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def adapter_parameters(lm: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in lm.named_parameters() if ".lora_" in n}


def save_adapter(peft_model: Any, directory: Path) -> None:
    peft_model.save_pretrained(str(directory), safe_serialization=True)
    (directory / "README.md").unlink(missing_ok=True)  # peft's model-card template, all placeholders


def base_state_dict(lm: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's weights under transformers' own names (peft renames a wrapped layer's
    weight ``<layer>.base_layer.weight``), without the adapter's."""
    return {k.replace(".base_layer.", "."): v for k, v in lm.state_dict().items() if ".lora_" not in k}


def merged_state_dict(peft_model: Any, lm: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base weights with the adapter's update added (W + alpha/r * B A) where it has one: a
    plain model that computes what the adapted one does. The policy's own weights stay as they are."""
    from peft.tuners.lora import LoraLayer

    adapter = peft_model.active_adapter
    state = base_state_dict(lm)
    with torch.no_grad():
        for name, module in lm.named_modules():
            if isinstance(module, LoraLayer) and adapter in module.lora_A:
                key = f"{name}.weight"
                state[key] = state[key] + module.get_delta_weight(adapter).to(state[key].dtype)
    return state


# -- the KL reference -----------------------------------------------------------------------------
class Reference:
    """A LoRA policy's KL reference on the policy's own weights. ``evaluate`` runs the policy (in
    eval mode, without gradients) with the adapter off, or with ``adapter``'s weights swapped in
    for the call. Only ``evaluate`` is offered: it is all a reference is asked for."""

    def __init__(self, policy: Any, adapter: dict[str, torch.Tensor] | None):
        self.policy, self.adapter = policy, adapter

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        lm = self.policy.lm
        was_training = lm.training
        lm.eval()
        try:
            with torch.no_grad(), self._weights():
                return self.policy.evaluate(*args, **kwargs)
        finally:
            lm.train(was_training)

    @contextlib.contextmanager
    def _weights(self) -> Iterator[None]:
        if self.adapter is None:
            with self.policy.peft.disable_adapter():
                yield
            return
        params = adapter_parameters(self.policy.lm)
        now = {n: p.detach().clone() for n, p in params.items()}
        for n, p in params.items():
            p.copy_(self.adapter[n])
        try:
            yield
        finally:
            for n, p in params.items():
                p.copy_(now[n])


def reference(policy: Any, start: Any) -> Reference | None:
    """The reference of ``Policy.reference`` for a LoRA policy; None where ``start`` does not share
    this policy's base (the caller then keeps a copy)."""
    if start is None:  # a resumed run that began from a fresh adapter, which began as a no-op: the base
        return Reference(policy, None)
    if start is not policy and (getattr(start, "peft", None) is None
                                or start.lora_base.fingerprint != policy.lora_base.fingerprint):
        return None
    weights = {n: p.detach().clone() for n, p in adapter_parameters(start.lm).items()}
    if weights.keys() != adapter_parameters(policy.lm).keys():
        return None
    if all(not t.any() for n, t in weights.items() if ".lora_B." in n or ".lora_embedding_B." in n):
        return Reference(policy, None)  # B = 0: the adapter adds nothing, switching it off is exact
    return Reference(policy, weights)
