"""A vision-language-action policy: images, proprioception and the instruction in front of a
causal LM, actions out as LM tokens.

Sequence fed to the backbone, one row per env (left-padded to the longest instruction)::

    [pad ...] <bos> instruction tokens | image tokens | proprio token | action tokens a_1 .. a_D
    \\________ text, varies ________/   \\______ fixed length ______/   \\_ the head's output _/

The instruction comes first so that the part that changes every step (images, proprioception)
and the action tokens sit after it: the keys and values of ``<bos> instruction`` depend only on
the text and the weights, so rollouts (no gradient) compute them once per distinct instruction
and reuse them across steps and envs (``model.prefix_cache``; see ``_PrefixCache``). Passes with a
gradient (training) run each distinct instruction of the batch once and share its keys and
values, gradient included, among the rows that carry it (``_shared_instruction_kv``).

``tokens`` head (OpenVLA-style): each continuous action dimension is discretised into ``bins``
uniform bins over the action bounds, and bin ``i`` of every dimension is the vocabulary token
``action_ids[i]`` (the vocabulary's last ``bins`` ids for a real LM, new ids appended to a tiny
one). Actions are decoded one dimension after the other with a KV cache; the distribution of a
dimension is the LM's softmax restricted to the bin tokens. The log-prob of an action is the sum
of its token log-probs, so PPO, GRPO and BC use it like any policy's. The value head reads the
backbone's hidden state at the last prefix position (before the first action token). Discrete
action spaces are one token over ``num_actions`` ids.

The env receives bin centres, so ``evaluate`` maps an action back to exactly the bins it came
from; a demonstrated action is put in the bin that contains it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlinf_cli.api import (settings, TASK_KEY, EnvSpec, UserError, CONFIG_FILE, MODEL_FILE, ActOutput, EvalOutput,
                           Policy, read_model_config)
from rlinf_model_mlp.flow import CHAIN_KEY, FlowHead, FlowSettings, recorded_chain

from .flow_head import FlowTokens, flow_field

BACKBONE_DIR = "backbone"  # the LM's transformers config and tokenizer (weights live in model.safetensors)
VISION_DIR = "vision"  # vision=hf: the vision model's transformers config
HEADS = ("tokens", "chunk", "flow")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
SKIP_KEYS = (TASK_KEY, "video")  # the instruction, not a task id, tells the policy the task


@dataclass(frozen=True)
class VLAConfig:
    obs_keys: tuple[str, ...] | None = None  # entries the model reads; None = all but task_id and video
    head: str = "tokens"  # action head: tokens | chunk | flow
    chunk: int = 4  # chunk and flow heads: env actions per policy step (K), decoded in parallel
    log_std_init: float = -0.5  # chunk head: initial log std of the Gaussian over each action
    bins: int = 64  # tokens head: bins per continuous action dimension
    action_tokens: str = "auto"  # auto | append | last: which vocabulary ids are the bins
    temperature: float = 1.0  # sampling temperature of action tokens
    critic: bool = True  # value head on the backbone's hidden state
    max_instruction_tokens: int = 64  # instructions are cut to this many tokens
    prefix_cache: bool = True  # instruction keys/values once per instruction (rollouts) or per batch (training); exact
    vision: str = "cnn"  # cnn | hf
    vision_path: str | None = None  # vision=hf: local transformers vision model directory; None = tiny ViT
    image_tokens: int = 4  # tokens per image (hf: patch tokens average-pooled to this many; 0 = all)
    cnn_channels: tuple[int, ...] = (16, 32)
    cnn_kernels: tuple[int, ...] = (8, 4)
    cnn_strides: tuple[int, ...] = (4, 2)
    vit_hidden_size: int = 128
    vit_layers: int = 2
    vit_heads: int = 4
    vit_patch_size: int = 14
    backbone: dict[str, Any] = field(default_factory=dict)  # rlinf-model-hf's HFConfig keys
    flow_steps: int = 4  # flow head: denoising steps N per chunk (rlinf_model_mlp/flow.py)
    flow_noise: str = "sde"  # flow head: sde (Flow-SDE; measured to learn where noise did not) | noise (Flow-Noise)
    flow_sde_level: float = 0.5  # flow_noise=sde: noise level a
    flow_std_min: float = 0.02  # flow_noise=noise: bounds of the learned per-step std (scaled units)
    flow_std_max: float = 0.3
    flow_time_dim: int = 16  # flow head: width of the time embedding
    flow_batch_steps: bool = False  # flow head: score a chain's N steps in one call (accelerators; no faster on CPU)

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {self.head!r}")
        if self.head == "chunk" and self.chunk < 2:
            raise ValueError("chunk must be >= 2 (head=tokens acts one step at a time)")
        if self.head == "flow":
            if self.chunk < 1:
                raise ValueError("chunk must be >= 1")
            FlowSettings.from_model(self)  # validates the flow_* keys
        if self.bins < 2:
            raise ValueError("bins must be >= 2")
        if self.action_tokens not in ("auto", "append", "last"):
            raise ValueError("action_tokens must be auto, append or last")
        if self.vision not in ("cnn", "hf"):
            raise ValueError(f"vision must be cnn or hf, got {self.vision!r}")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")
        if not len(self.cnn_channels) == len(self.cnn_kernels) == len(self.cnn_strides):
            raise ValueError("cnn_channels, cnn_kernels and cnn_strides must have the same length")
        if self.image_tokens < 0 or (self.vision == "cnn" and self.image_tokens < 1):
            raise ValueError("image_tokens must be >= 1 for vision=cnn (>= 0 for hf)")


# -- vision encoders ---------------------------------------------------------------------------

class CNNImageTokens(nn.Module):
    """[B, H, W, C] uint8 -> [B, image_tokens, hidden]: a conv stack, then one linear projection."""

    def __init__(self, shape: Sequence[int], cfg: VLAConfig, hidden: int):
        super().__init__()
        h, w, c = shape
        layers: list[nn.Module] = []
        for out_c, k, s in zip(cfg.cnn_channels, cfg.cnn_kernels, cfg.cnn_strides):
            layers += [nn.Conv2d(c, out_c, k, s), nn.ReLU()]
            c = out_c
        self.conv = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            n = self.conv(torch.zeros(1, shape[2], h, w)).shape[1]
        self.tokens, self.hidden = cfg.image_tokens, hidden
        self.proj = nn.Linear(n, cfg.image_tokens * hidden)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        # in the weights' dtype: a model cast to bf16 (DeepSpeed's bf16) takes bf16 inputs
        x = img.permute(0, 3, 1, 2).to(self.proj.weight.dtype).mul(1.0 / 255.0)
        return self.proj(self.conv(x)).view(img.shape[0], self.tokens, self.hidden)


class HFImageTokens(nn.Module):
    """A transformers vision model (ViT, SigLIP, CLIP, DINOv2 ...) -> projected patch tokens.

    Images are resized to the model's input size and normalised with its processor's mean/std
    (``preprocessor_config.json`` when the directory has one, else 0.5/0.5).
    """

    def __init__(self, encoder: nn.Module, config: Any, mean: Sequence[float], std: Sequence[float],
                 tokens: int, hidden: int):
        super().__init__()
        self.encoder, self.config = encoder, config
        self.size = int(getattr(config, "image_size", 224))
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.tokens = tokens
        self.proj = nn.Linear(int(config.hidden_size), hidden)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = img.permute(0, 3, 1, 2).float().mul(1.0 / 255.0)
        if x.shape[-1] != self.size or x.shape[-2] != self.size:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        x = ((x - self.mean.float()) / self.std.float()).to(self.proj.weight.dtype)  # normalised in fp32
        h = self.encoder(pixel_values=x).last_hidden_state  # [B, patches (+ cls), Hv]
        if self.tokens and h.shape[1] > self.tokens:
            h = F.adaptive_avg_pool1d(h.transpose(1, 2), self.tokens).transpose(1, 2)
        return self.proj(h)


def _vision_from(cfg: VLAConfig, shape: Sequence[int], saved_dir: Path | None) -> tuple[nn.Module, Any, list, list]:
    """(encoder module, its config, mean, std) for vision=hf: from the saved config, a local
    directory, or a tiny ViT built from a config."""
    from transformers import AutoConfig, AutoModel, ViTConfig, ViTModel

    mean, std = [0.5] * 3, [0.5] * 3
    src = saved_dir or (Path(cfg.vision_path) if cfg.vision_path else None)
    if src is not None:
        pre = src / "preprocessor_config.json"
        if pre.is_file():
            p = json.loads(pre.read_text())
            mean, std = list(p.get("image_mean", mean)), list(p.get("image_std", std))
    if saved_dir is not None:  # weights come from model.safetensors
        config = AutoConfig.from_pretrained(str(saved_dir))
        model = AutoModel.from_config(config)
    elif cfg.vision_path:
        if not (Path(cfg.vision_path) / "config.json").is_file():
            raise UserError(f"model.vision_path '{cfg.vision_path}' is not a transformers model directory (no config.json)")
        try:
            model = AutoModel.from_pretrained(cfg.vision_path, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load a vision model from '{cfg.vision_path}': {str(exc).splitlines()[0]}") from exc
    else:
        config = ViTConfig(image_size=int(shape[0]), patch_size=cfg.vit_patch_size, hidden_size=cfg.vit_hidden_size,
                           num_hidden_layers=cfg.vit_layers, num_attention_heads=cfg.vit_heads,
                           intermediate_size=cfg.vit_hidden_size * 4)
        model = ViTModel(config, add_pooling_layer=False)
    # CLIP / SigLIP models hold a text tower too: keep the vision transformer alone (and its
    # own config, which is what a saved checkpoint rebuilds it from)
    encoder = getattr(model, "vision_model", model)
    if getattr(encoder, "pooler", None) is not None:  # ViT's pooler: unused here (patch tokens are)
        encoder.pooler = None
    config = getattr(encoder, "config", model.config)
    if hasattr(config, "vision_config"):
        config = config.vision_config
    return encoder, config, mean, std


class ChunkHead(nn.Module):
    """The chunk head's parameters, used only through module calls (DeepSpeed ZeRO-3 gathers a
    module's parameters just for its call): K query embeddings, the action projection and the
    Gaussian's log std."""

    def __init__(self, k: int, hidden: int, dims: int, log_std_init: float):
        super().__init__()
        self.queries = nn.Embedding(k, hidden)
        nn.init.normal_(self.queries.weight, std=0.02)
        self.out = nn.Linear(hidden, dims)
        nn.init.zeros_(self.out.bias)
        nn.init.normal_(self.out.weight, std=0.01)
        self.log_std = nn.Parameter(torch.full((k, dims), float(log_std_init)))

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.out(h), self.log_std + 0.0  # a tensor of its own: ZeRO-3 releases the parameter after the call


# -- the instruction's KV cache ---------------------------------------------------------------

# Optimizer steps taken in this process, by any optimizer (torch's global step post-hook; counted
# from the first VLAPolicy on). A step is how training changes weights, whatever the engine: torch
# and LeanAdam (whose flat buffers write parameters around their version counters) and
# DeepSpeed's ZeRO optimizers (which copy master weights in through ``.data``) all step a torch
# optimizer, so this catches what the parameters' own version counters miss.
_OPTIMIZER_STEPS = [0]
_STEP_HOOK: list[Any] = []


def _count_optimizer_steps() -> None:
    if not _STEP_HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def bump(optimizer: Any, args: Any, kwargs: Any) -> None:
            _OPTIMIZER_STEPS[0] += 1

        _STEP_HOOK.append(register_optimizer_step_post_hook(bump))


class _PrefixCache:
    """Keys and values of ``<bos> instruction`` for each distinct instruction, per weight version.

    A row's text tokens attend only to earlier text tokens (causal attention, left padding masked
    out, positions counted from the first real token), so their keys and values are those of the
    instruction run alone at positions ``0 .. n-1``. A batch is then the per-instruction caches
    left-padded to the longest one with the same attention mask as the full pass: the image,
    proprio and action tokens see exactly what they would see there.

    Everything is dropped when the weights may have changed: an optimizer step anywhere in the
    process, a ``load_state_dict`` on the policy, or a backbone parameter whose storage or version
    counter moved (an in-place edit, ``.to()``); ``VLAPolicy.invalidate_prefix_cache`` for anything else.
    """

    MAX_INSTRUCTIONS = 512  # distinct instructions kept per weight version (then start over)

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.rows: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.batch: tuple[tuple[tuple[int, ...], ...], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self.loads = 0  # load_state_dict calls on the policy
        self.computed = 0  # instructions run through the backbone (tests and the benchmark read it)

    def clear(self) -> None:
        self.key, self.batch = None, None
        self.rows.clear()

    def valid_for(self, params: Sequence[torch.Tensor]) -> None:
        key = (_OPTIMIZER_STEPS[0], self.loads, tuple((t.data_ptr(), t._version, t.dtype) for t in params))
        if key != self.key:
            self.clear()
            self.key = key


# -- the policy --------------------------------------------------------------------------------

class VLAPolicy(Policy):
    def __init__(self, config: Mapping[str, Any], env_spec: EnvSpec, *, _saved: Path | None = None):
        super().__init__(config, env_spec)
        from rlinf_model_hf.model import HFConfig, load_causal_lm, load_tokenizer

        cfg = settings.build(VLAConfig, self.config, "model")
        self.cfg = cfg
        self.lm_cfg = settings.build(HFConfig, cfg.backbone, "model.backbone")
        if self.lm_cfg.lora.r:  # the loader below builds the plain LM; adapters are model=hf's (HFCausalLM)
            raise UserError("model.backbone.lora: model=vla trains its whole backbone; LoRA adapters are for model=hf")
        keys = cfg.obs_keys if cfg.obs_keys is not None else tuple(k for k in env_spec.observation if k not in SKIP_KEYS)
        missing = [k for k in keys if k not in env_spec.observation]
        if missing:
            raise UserError(f"model.obs_keys {list(keys)}: the simulator has no {missing}; it gives {sorted(env_spec.observation)}")
        self._keys = tuple(keys)
        obs = env_spec.observation
        self._text = [k for k in keys if obs[k].is_text]
        self._images = [k for k in keys if not obs[k].is_text and len(obs[k].shape) == 3]
        self._flat = [k for k in keys if k not in self._text and k not in self._images]

        # language backbone: rlinf-model-hf's loader (a saved checkpoint rebuilds it from its config)
        if _saved is not None:
            from transformers import AutoConfig, AutoModelForCausalLM

            self.lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(_saved / BACKBONE_DIR)),
                                                       dtype=torch.float32)
            self.tokenizer = load_tokenizer(_saved / BACKBONE_DIR)
        else:
            self.lm, self.tokenizer = load_causal_lm(self.lm_cfg)
        hidden = int(self.lm.get_input_embeddings().weight.shape[1])
        self.hidden = hidden

        # action head
        # read by the runtime (rlinf_cli.runtime.chunking)
        self.action_chunk = cfg.chunk if cfg.head in ("chunk", "flow") else 1
        if env_spec.discrete:
            if cfg.head != "tokens":
                raise UserError(f"model.head={cfg.head} needs continuous actions; use model.head=tokens for discrete ones")
            self.dims, self.nbins = 1, int(env_spec.num_actions)
        else:
            a = env_spec.action
            bounded = a.low is not None and a.high is not None
            if cfg.head == "tokens" and not bounded:
                raise UserError("model=vla discretises actions over their bounds: the simulator's action space has none")
            self.dims, self.nbins = math.prod(a.shape), cfg.bins
            for name, bound in (("low", a.low), ("high", a.high)) if bounded else ():
                full = np.array(np.broadcast_to(np.asarray(bound, np.float32), a.shape)).reshape(-1)
                self.register_buffer(name, torch.from_numpy(full), persistent=False)
        if cfg.head == "tokens":
            self.register_buffer("action_ids", self._action_token_ids(), persistent=False)
        elif cfg.head == "chunk":  # K query tokens after the prefix; their hidden states are the K actions' means
            self.chunk_head = ChunkHead(cfg.chunk, hidden, self.dims, cfg.log_std_init)
        else:  # K noisy action tokens after the prefix; their hidden states are the velocity (flow_head.py)
            flow = FlowSettings.from_model(cfg)
            self.flow_tokens = FlowTokens(cfg.chunk, self.dims, hidden, flow.time_dim)
            bounds = [getattr(self, n).repeat(cfg.chunk) for n in ("low", "high")] if hasattr(self, "low") else []
            self.flow = FlowHead(flow, cfg.chunk * self.dims, hidden, *bounds)

        # encoders of the other inputs
        self.vision = nn.ModuleDict()
        for k in self._images:
            if cfg.vision == "cnn":
                self.vision[k] = CNNImageTokens(obs[k].shape, cfg, hidden)
            else:
                enc, vcfg, mean, std = _vision_from(cfg, obs[k].shape, _saved / VISION_DIR / k if _saved else None)
                self.vision[k] = HFImageTokens(enc, vcfg, mean, std, cfg.image_tokens, hidden)
        flat_dim = sum(math.prod(obs[k].shape) or 1 for k in self._flat)
        self.proprio = nn.Linear(flat_dim, hidden) if self._flat else None
        self.has_critic = cfg.critic
        if cfg.critic:
            self.critic = nn.Linear(hidden, 1)
            nn.init.zeros_(self.critic.weight)
            nn.init.zeros_(self.critic.bias)
        self._ids_cache: dict[str, list[int]] = {}
        self._prefix_kv = _PrefixCache()
        _count_optimizer_steps()
        self.register_load_state_dict_post_hook(VLAPolicy._weights_loaded)
        # dropout in the backbone would make the cached keys one draw and the full pass another
        lm_cfg = self.lm.config.to_dict()
        self._lm_dropout = any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                               for k, v in lm_cfg.items() if "dropout" in k) \
            or any(isinstance(m, nn.Dropout) and m.p > 0 for m in self.lm.modules())

    def _action_token_ids(self) -> torch.Tensor:
        """The vocabulary ids of the bins: the last ``nbins`` ids of a large vocabulary (OpenVLA
        overwrites its least used tokens), or ids appended after the tokenizer's vocabulary."""
        base = len(self.tokenizer)
        mode = self.cfg.action_tokens
        if mode == "auto":
            mode = "last" if base >= 1000 + self.nbins else "append"
        if mode == "last":
            if base < self.nbins + 4:
                raise UserError(f"model.action_tokens=last: the vocabulary ({base}) is too small for {self.nbins} bins")
            return torch.arange(base - self.nbins, base)
        need = base + self.nbins
        if self.lm.get_input_embeddings().weight.shape[0] < need:
            self.lm.resize_token_embeddings(need, mean_resizing=False)
        return torch.arange(base, need)

    @property
    def observation_keys(self) -> tuple[str, ...]:
        return self._keys

    # -- inputs ----------------------------------------------------------------------------
    def _text_ids(self, text: str) -> list[int]:
        ids = self._ids_cache.get(text)
        if ids is None:
            tok = self.tokenizer
            bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
            ids = bos + list(tok.encode(text, add_special_tokens=False))[: self.cfg.max_instruction_tokens]
            if len(self._ids_cache) < 10_000:
                self._ids_cache[text] = ids
        return ids

    def _text_rows(self, obs: Mapping[str, Any], batch: int) -> list[list[int]]:
        """Token ids of each row's ``<bos> instruction`` (the text entries joined by spaces)."""
        texts = [" ".join(str(obs[k][i]) for k in self._text) for i in range(batch)] if self._text else [""] * batch
        return [self._text_ids(t) for t in texts]

    def _rest(self, obs: Mapping[str, Any], batch: int) -> torch.Tensor:
        """Embeddings [B, R, H] of the per-step part of the prefix: image tokens, then the proprio token."""
        dev = self.lm.get_input_embeddings().weight.device
        parts = [self.vision[k](obs[k].to(dev)) for k in self._images]
        if self.proprio is not None:
            flat = torch.cat([obs[k].reshape(batch, -1).to(dev, self.proprio.weight.dtype) for k in self._flat], dim=-1)
            parts.append(self.proprio(flat).unsqueeze(1))
        if not parts:
            return torch.zeros((batch, 0, self.hidden), device=dev, dtype=self.lm.get_input_embeddings().weight.dtype)
        return torch.cat(parts, dim=1)

    def _forward(self, obs: Mapping[str, Any], extra: torch.Tensor | None = None, keep_cache: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """The backbone over ``[pad] <bos> instruction | image | proprio | extra``.

        Returns the hidden states [B, 1 + E, H] of the prefix's last token (what the value head
        and the first action read) and of the E ``extra`` embeddings after it, the attention mask
        [B, W + R + E] of the whole sequence (W: the longest instruction, R: the image and proprio
        tokens), the last token's position [B, 1] and, with ``keep_cache``, the KV cache to decode
        further tokens from. The instruction's keys and values come from the prefix cache when no
        gradient is taken (``_use_prefix_cache``), and from one pass over the batch's distinct
        instructions when one is (``_share_prefix``).
        """
        embed = self.lm.get_input_embeddings()
        dev = embed.weight.device
        batch = self._batch_size(obs)
        rows = self._text_rows(obs, batch)
        width = max(len(r) for r in rows)
        lengths = torch.tensor([len(r) for r in rows], device=dev)
        text_attn = (torch.arange(width, device=dev) >= width - lengths.unsqueeze(1)).long()  # left padding
        tail = self._rest(obs, batch)
        if extra is not None:
            tail = torch.cat([tail, extra], dim=1)
        n, rest = tail.shape[1], tail.shape[1] - (0 if extra is None else extra.shape[1])
        attn = torch.cat([text_attn, torch.ones((batch, n), dtype=torch.long, device=dev)], dim=1)
        from transformers import DynamicCache

        past = None
        if self._use_prefix_cache(width, rest):
            past = self._instruction_kv(rows, width, dev)
        elif self._share_prefix(rows, width, rest):
            past = self._shared_instruction_kv(rows, width, dev)
        if past is not None:  # the instruction's keys/values are there: run the tail against them
            positions = lengths.unsqueeze(1) + torch.arange(n, device=dev)  # as if the instruction were there
            h, past = self._backbone(tail, attn, past, positions)
            return h[:, rest - 1:], attn, positions[:, -1:], past if keep_cache else None
        ids, _ = self._left_padded(rows, width)
        x = torch.cat([embed(ids.to(dev)), tail], dim=1)
        positions = (attn.cumsum(1) - 1).clamp_min(0)
        h, past = self._backbone(x, attn, DynamicCache() if keep_cache else None, positions)
        return h[:, width + rest - 1:], attn, positions[:, -1:], past

    def _use_prefix_cache(self, width: int, rest: int) -> bool:
        # exact only without a gradient (cached keys carry none), with no dropout drawn in the
        # backbone, and when a token after the instruction exists to read the value from;
        # ZeRO-3's partitioned parameters have no storage that tells a weight version apart
        return (self.cfg.prefix_cache and width > 0 and rest > 0 and not torch.is_grad_enabled()
                and not (self.training and self._lm_dropout)
                and not hasattr(self.lm.get_input_embeddings().weight, "ds_id"))

    def _left_padded(self, rows: Sequence[Sequence[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids [N, width] of the rows, left-padded with the pad id, and their attention mask."""
        pad = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            if r:
                ids[i, width - len(r):] = torch.tensor(r)
                attn[i, width - len(r):] = 1
        return ids, attn

    def _share_prefix(self, rows: list[list[int]], width: int, rest: int) -> bool:
        # with a gradient: worth it only where rows repeat an instruction (a rollout's batch: one
        # instruction per task); dropout draws a mask per row, so rows must run separately then
        return (self.cfg.prefix_cache and width > 0 and rest > 0 and torch.is_grad_enabled()
                and not (self.training and self._lm_dropout) and all(rows)
                and len(set(map(tuple, rows))) < len(rows))

    def _shared_instruction_kv(self, rows: list[list[int]], width: int, dev: torch.device) -> Any:
        """Keys/values of the batch's instructions with their gradient: one left-padded pass over
        the distinct instructions, then each row takes its instruction's entries (``index_select``,
        so the gradients of the rows sharing one add up, as in the full pass). Same layout, mask
        and positions as the full pass; the tail then attends to these keys."""
        from transformers import DynamicCache

        distinct = list(dict.fromkeys(tuple(r) for r in rows))
        slot = {r: i for i, r in enumerate(distinct)}
        pick = torch.tensor([slot[tuple(r)] for r in rows], device=dev)
        past = DynamicCache()
        for layer, (k, v) in enumerate(self._instruction_pass(distinct, width, dev)):
            past.update(k.index_select(0, pick), v.index_select(0, pick), layer)
        return past

    def _instruction_pass(self, rows: Sequence[Sequence[int]], width: int, dev: torch.device
                          ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The rows (instructions) through the backbone in one left-padded pass: (keys, values)
        [N, kv_heads, width, d] per layer, with a gradient where one is being taken."""
        from transformers import DynamicCache

        ids, attn = self._left_padded(rows, width)
        _, past = self._backbone(self.lm.get_input_embeddings()(ids.to(dev)), attn.to(dev), DynamicCache())
        return [(entry[0], entry[1]) for entry in past]

    def _instruction_kv(self, rows: list[list[int]], width: int, dev: torch.device) -> Any:
        """A DynamicCache of the batch's instruction tokens, [B, kv_heads, W, d] per layer, rows
        left-padded with zeros (masked out by the attention mask) like the full pass's inputs."""
        from transformers import DynamicCache

        cache = self._prefix_kv
        cache.valid_for(list(self.lm.base_model.parameters()))
        batch_key = tuple(tuple(r) for r in rows)
        if cache.batch is None or cache.batch[0] != batch_key:
            self._fill_instruction_kv([r for r in dict.fromkeys(batch_key) if r and r not in cache.rows], dev)
            per_row = [cache.rows[r] if r else None for r in batch_key]
            layers = []
            for layer in range(len(next(kv for kv in per_row if kv is not None))):
                ref_k, ref_v = next(kv[layer] for kv in per_row if kv is not None)
                k = ref_k.new_zeros((len(rows), ref_k.shape[1], width, ref_k.shape[3]))
                v = ref_v.new_zeros((len(rows), ref_v.shape[1], width, ref_v.shape[3]))
                for i, kv in enumerate(per_row):
                    if kv is not None:
                        n = kv[layer][0].shape[2]
                        k[i, :, width - n:] = kv[layer][0][0]
                        v[i, :, width - n:] = kv[layer][1][0]
                layers.append((k, v))
            cache.batch = (batch_key, layers)  # envs keep their instructions from step to step
        past = DynamicCache()
        for layer, (k, v) in enumerate(cache.batch[1]):
            past.update(k, v, layer)  # copies: decoding appends to these, never to the stored tensors
        return past

    def _fill_instruction_kv(self, missing: list[tuple[int, ...]], dev: torch.device) -> None:
        """Run the instructions not cached yet through the backbone, all in one left-padded pass
        (the full pass's layout), and keep each one's keys/values without its padding."""
        cache = self._prefix_kv
        if not missing:
            return
        if len(cache.rows) + len(missing) > cache.MAX_INSTRUCTIONS:
            cache.rows.clear()
        width = max(len(r) for r in missing)
        layers = self._instruction_pass(missing, width, dev)
        for i, r in enumerate(missing):
            cache.rows[r] = [(k[i:i + 1, :, width - len(r):].clone(), v[i:i + 1, :, width - len(r):].clone())
                             for k, v in layers]
        cache.computed += len(missing)

    def invalidate_prefix_cache(self) -> None:
        """Drop the cached instruction keys/values. Optimizer steps, ``load_state_dict`` and
        in-place edits of backbone parameters do this already; call it after changing weights
        some other way (writing through ``.data`` of a parameter, for one)."""
        self._prefix_kv.clear()

    @staticmethod
    def _weights_loaded(module: nn.Module, incompatible: Any) -> None:
        module._prefix_kv.loads += 1

    def _batch_size(self, obs: Mapping[str, Any]) -> int:
        for k in self._keys:
            return len(obs[k])
        raise UserError("model=vla reads no observation entries (model.obs_keys is empty)")

    def _backbone(self, x: torch.Tensor, attn: torch.Tensor, past: Any = None, positions: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, Any]:
        if positions is None:
            positions = (attn.cumsum(1) - 1).clamp_min(0)
        from rlinf_model_hf.sampling import cache_kw, out_cache

        base = self.lm.base_model
        out = base(inputs_embeds=x, attention_mask=attn, position_ids=positions, use_cache=past is not None,
                   **({cache_kw(base): past} if past is not None else {}))
        return out.last_hidden_state, out_cache(out) if past is not None else None

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the bin tokens only (the LM head's rows of those ids), at the sampling temperature."""
        head = self.lm.get_output_embeddings()
        if hasattr(head.weight, "ds_id"):  # DeepSpeed ZeRO-3 gathers the weight only inside the module's call
            return head(h)[..., self.action_ids].float() / self.cfg.temperature
        w = head.weight[self.action_ids]
        b = head.bias[self.action_ids] if getattr(head, "bias", None) is not None else None
        return F.linear(h, w, b).float() / self.cfg.temperature  # log-probs in fp32 whatever the weights

    def _value(self, h_last: torch.Tensor) -> torch.Tensor:
        return self.critic(h_last).squeeze(-1).float() if self.has_critic \
            else h_last.new_zeros(h_last.shape[0], dtype=torch.float32)

    # -- actions <-> bins ------------------------------------------------------------------
    def to_bins(self, action: torch.Tensor) -> torch.Tensor:
        if self.env_spec.discrete:
            return action.long().reshape(-1, 1)
        a = action.reshape(action.shape[0], -1).float()
        low, high = self.low.float(), self.high.float()  # a model cast to bf16 casts these buffers too
        scaled = (a - low) / (high - low) * self.nbins
        return scaled.floor().long().clamp_(0, self.nbins - 1)

    def from_bins(self, bins: torch.Tensor) -> torch.Tensor:
        if self.env_spec.discrete:
            return bins[:, 0]
        low, high = self.low.float(), self.high.float()
        a = low + (bins.float() + 0.5) * (high - low) / self.nbins
        return a.view(bins.shape[0], *self.env_spec.action.shape)

    # -- policy interface ------------------------------------------------------------------
    def _teacher_forced(self, obs: Mapping[str, Any], bins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bin logits [B, D, nbins] of every dimension given the previous ones, and the value [B]."""
        prev = self.lm.get_input_embeddings()(self.action_ids[bins[:, :-1]]) if self.dims > 1 else None
        h, _, _, _ = self._forward(obs, prev)
        return self._logits(h), self._value(h[:, 0])

    # -- chunk head ------------------------------------------------------------------------
    def _chunk_means(self, obs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Means [B, K, d] of the K actions (one pass: K query tokens after the prefix), their
        log std [K, d] and the value [B]."""
        b = self._batch_size(obs)
        dev = self.lm.get_input_embeddings().weight.device
        queries = self.chunk_head.queries(torch.arange(self.action_chunk, device=dev)).expand(b, -1, -1)
        h, _, _, _ = self._forward(obs, queries)
        means, log_std = self.chunk_head(h[:, 1:])
        shape = (self.action_chunk, *self.env_spec.action.shape)
        # the Gaussian in fp32 whatever the weights' dtype
        return means.float().view(b, *shape), log_std.float().view(shape), self._value(h[:, 0])

    @staticmethod
    def _chunk_logp(action: torch.Tensor, means: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        z = (action - means) * torch.exp(-log_std)
        return (-0.5 * z * z - log_std - _LOG_SQRT_2PI).flatten(1).sum(-1)

    def set_action_std(self, std: float | None, trainable: bool = True) -> bool:
        if self.cfg.head != "chunk":
            return False
        if std is not None:
            with torch.no_grad():
                self.chunk_head.log_std.fill_(math.log(std))
        self.chunk_head.log_std.requires_grad_(trainable)
        return True

    # -- policy interface ------------------------------------------------------------------
    def act(self, obs: dict[str, Any], deterministic: bool = False) -> ActOutput:
        """tokens: decode the action tokens one dimension at a time, reusing the KV cache of the
        prefix. chunk: K Gaussian actions from one pass. flow: N denoising steps of K action
        tokens against the prefix's cache; the chain is returned in ``extras``."""
        if self.cfg.head == "flow":
            field, cond, value = flow_field(self, obs)
            action, logp, chain = self.flow.sample(field, cond, deterministic)
            shape = (self.action_chunk, *self.env_spec.action.shape)
            return ActOutput(action.view(action.shape[0], *shape), logp, value, {CHAIN_KEY: chain})
        if self.cfg.head == "chunk":
            means, log_std, value = self._chunk_means(obs)
            action = means if deterministic else means + torch.exp(log_std) * torch.randn_like(means)
            return ActOutput(action, self._chunk_logp(action, means, log_std), value)

        h, attn, positions, past = self._forward(obs, keep_cache=True)
        value = self._value(h[:, -1])
        h = h[:, -1]
        bins, logp = [], torch.zeros(h.shape[0], device=h.device)
        for d in range(self.dims):
            lp = torch.log_softmax(self._logits(h), dim=-1)
            b = lp.argmax(-1) if deterministic else torch.multinomial(lp.exp(), 1).squeeze(-1)
            logp = logp + lp.gather(-1, b.unsqueeze(-1)).squeeze(-1)
            bins.append(b)
            if d + 1 < self.dims:
                attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
                positions = positions + 1
                emb = self.lm.get_input_embeddings()(self.action_ids[b]).unsqueeze(1)
                h, past = self._backbone(emb, attn, past, positions)
                h = h[:, -1]
        return ActOutput(self.from_bins(torch.stack(bins, dim=1)), logp, value)

    def evaluate(self, obs: dict[str, Any], action: torch.Tensor) -> EvalOutput:
        if self.cfg.head == "flow":  # the recorded chain's log-prob under these weights
            field, cond, value = flow_field(self, obs)
            logp, entropy = self.flow.score(field, cond, recorded_chain(obs))
            return EvalOutput(logp, entropy, value)
        if self.cfg.head == "chunk":
            means, log_std, value = self._chunk_means(obs)
            entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum().expand(means.shape[0])
            return EvalOutput(self._chunk_logp(action.float(), means, log_std), entropy, value)
        bins = self.to_bins(action)
        logits, value = self._teacher_forced(obs, bins)
        lp = torch.log_softmax(logits, dim=-1)
        logp = lp.gather(-1, bins.unsqueeze(-1)).squeeze(-1).sum(-1)
        entropy = -(lp.exp() * lp).sum(-1).sum(-1)
        return EvalOutput(logp, entropy, value)

    def get_value(self, obs: dict[str, Any]) -> torch.Tensor:
        return self._value(self._forward(obs)[0][:, 0])

    def mean_action(self, obs: dict[str, Any]) -> torch.Tensor:
        """Expected bin centre of each dimension given the greedy choice of the previous ones
        (differentiable), for ``algo.loss=mse``; ``nll`` (the default) is the natural BC loss here."""
        if self.cfg.head == "chunk":
            return self._chunk_means(obs)[0]
        if self.cfg.head == "flow":
            raise UserError("model.head=flow has no mean action to regress: clone it with algo.loss=nll "
                            "(the default; the flow-matching loss for this head)")
        if self.env_spec.discrete:
            raise UserError("model=vla on discrete actions: use algo.loss=nll")
        with torch.no_grad():
            greedy = self.to_bins(self.act(obs, deterministic=True).action)
        logits, _ = self._teacher_forced(obs, greedy)
        low, high = self.low.float(), self.high.float()
        centres = low.unsqueeze(-1) + (torch.arange(self.nbins, device=logits.device) + 0.5) * \
            ((high - low) / self.nbins).unsqueeze(-1)  # [D, nbins]
        mean = (logits.softmax(-1) * centres).sum(-1)
        return mean.view(mean.shape[0], *self.env_spec.action.shape)

    def imitation_loss(self, obs: dict[str, Any], actions: torch.Tensor) -> torch.Tensor | None:
        """flow: the flow-matching loss (one backbone pass of the prefix, one of the K noisy action
        tokens at a random time per row); other heads: None (their log-likelihood)."""
        if self.cfg.head != "flow":
            return None
        field, _, _ = flow_field(self, obs)
        return self.flow.loss(field, actions)

    def critic_parameters(self) -> list[nn.Parameter]:
        return list(self.critic.parameters()) if self.has_critic else []

    # -- persistence -----------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> None:
        """``model.safetensors`` (every weight) + ``config.json``, and the configs needed to rebuild
        the modules without the original directories: ``backbone/`` (LM config, tokenizer) and
        ``vision/<key>/`` (vision=hf)."""
        from safetensors.torch import save_file

        from rlinf_cli.api import __version__

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.lm.config.save_pretrained(path / BACKBONE_DIR)
        self.tokenizer.save_pretrained(path / BACKBONE_DIR)
        for k, enc in self.vision.items():
            if isinstance(enc, HFImageTokens):
                enc.config.save_pretrained(path / VISION_DIR / k)
                mean = enc.mean.flatten().tolist()
                std = enc.std.flatten().tolist()
                (path / VISION_DIR / k / "preprocessor_config.json").write_text(
                    json.dumps({"image_mean": mean, "image_std": std}))
        # tied LM weights once; every other tensor copied out (an engine may keep parameters as
        # views of one flat buffer, which safetensors' save_model refuses)
        state: dict[str, torch.Tensor] = {}
        seen: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
        for k, v in self.state_dict().items():
            key = (v.data_ptr(), tuple(v.shape), v.dtype)
            if key not in seen:
                seen.add(key)
                state[k] = v.detach().clone().contiguous()
        save_file(state, str(path / MODEL_FILE))
        meta = {"model": {**self.config, "backbone": {**self.config.get("backbone", {}), "path": None, "gguf_file": None},
                          "vision_path": None},
                "env_spec": self.env_spec.to_dict(), "rlinf_version": __version__}
        (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2))

    @classmethod
    def from_pretrained(cls, path: str | Path, map_location: str | torch.device = "cpu") -> "VLAPolicy":
        from safetensors import SafetensorError
        from safetensors.torch import load_model

        path = Path(path)
        meta = read_model_config(path)
        if not (path / BACKBONE_DIR / "config.json").is_file():
            raise UserError(f"'{path}' is not a model=vla checkpoint (no {BACKBONE_DIR}/config.json)")
        policy = cls(meta["model"], EnvSpec.from_dict(meta["env_spec"]), _saved=path)
        try:
            load_model(policy, str(path / MODEL_FILE), strict=True, device=str(map_location))
        except (SafetensorError, OSError, RuntimeError) as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            raise UserError(f"cannot load {path / MODEL_FILE} into model=vla: {lines[-1] if lines else exc}; "
                            "the checkpoint is damaged or was saved by another model") from exc
        return policy.to(map_location)
