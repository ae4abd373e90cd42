"""A tiny randomly initialised Llama with a word-level tokenizer, built in-process for tests of
model machinery (cache reuse, crop, segment ends) that do not need model quality."""

from __future__ import annotations

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WORDS = (
    "the a licence code apache mit gpl notice file patent grant commercial use ship include copy "
    "source binary product company may must not can you your with under and or of to in it is "
    "what when who which question answer passage retrieved continue user assistant system"
).split()


def tiny_generator(seed: int = 0, use_cache: bool = True, layers: int = 2, device: str = "cpu", dtype: str = "float32"):
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from rigkit.generation import HFGenerator

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
        initializer_range=0.5,
    )
    model = LlamaForCausalLM(config).eval().to(device=device, dtype=getattr(torch, dtype))
    return HFGenerator(model, tokenizer, spec="tiny-random", source="test", use_cache=use_cache)
