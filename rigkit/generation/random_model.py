"""Models with random weights, built from a config offline: for checks of the model machinery
(placement on a device, KV-cache reuse, crop, the deciders' model internals) that need no
trained weights and no download. Their text is noise; their mechanics are the real model's.

`tiny_parts` is a 2-layer Llama with a word-level tokenizer (the test suite's model,
`tests/tiny_model.py`); `random_parts` is the architecture of a model folder's `config.json` with its own tokenizer and
chat template (only those small files are read, never weights). `save_model` writes either as
a model folder that `rigkit.build.build_generator` loads like any other (`generator.model=DIR`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rigkit.errors import ModelNotFoundError

__all__ = ["CHAT_TEMPLATE", "WORDS", "random_parts", "save_model", "tiny_parts"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WORDS = (
    "the a licence code apache mit gpl notice file patent grant commercial use ship include copy "
    "source binary product company may must not can you your with under and or of to in it is "
    "what when who which question answer passage retrieved continue user assistant system"
).split()


def tiny_parts(seed: int = 0, layers: int = 2) -> tuple[Any, Any]:
    """(model, tokenizer): a tiny random Llama (float32, CPU) over `WORDS`, seeded."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|im_end|>", "<|im_start|>", "<unk>"]
    vocab = {w: i for i, w in enumerate(specials + [" ", "\n", ".", "?", ",", ":", "[", "]"] + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\w+|[^\w\s]|\s"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", unk_token="<unk>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        eos_token_id=0, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False,
        initializer_range=0.5,  # peaked next-token distributions: greedy text is not one token repeated
    )
    return LlamaForCausalLM(config).eval(), tokenizer


def random_parts(folder: str | Path, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer): `folder`'s architecture with random weights (float32, CPU), seeded,
    and `folder`'s tokenizer and chat template. Needs config.json and a tokenizer file there."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder).expanduser()
    missing = [n for n in ("config.json", "tokenizer.json") if not (folder / n).exists()]
    if missing:
        raise ModelNotFoundError(f"{folder} lacks {', '.join(missing)}: no config to build a random model from")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    config = AutoConfig.from_pretrained(str(folder))
    if hasattr(config, "quantization_config"):  # a dequantised GGUF copy may still name it
        del config.quantization_config
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), tokenizer


def save_model(model: Any, tokenizer: Any, target: str | Path) -> Path:
    """Write `model` and `tokenizer` as a model folder (safetensors, tokenizer, chat template)."""
    target = Path(target)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
