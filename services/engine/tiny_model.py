"""A tiny Qwen2-shaped causal LM with a byte-level tokenizer, made here (no hub download).

The tokenizer maps every byte to one token (a BPE with no merges), so any text round-trips, plus three
special tokens; the chat template is compact (`<|im_start|>u:...<|im_end|>`) so prompts stay short. The model
is randomly initialised and saved in Hugging Face format (safetensors), which both vLLM and verl load.

    python -m services.engine.tiny_model data/models/tiny-qwen [--hidden 128] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)
# Roles shortened to their first letter: the model sees ~10 fewer tokens per message.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'][0] }}:{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>a:{% endif %}"
)
# Qwen2's pre-tokenizer pattern (words, single digits, punctuation runs, whitespace).
QWEN2_PIECES = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Written next to the weights: a model directory says how it was made.
RECIPE_FILE = "agl_tiny_model.json"


def build_tokenizer(corpus: Sequence[str] = (), vocab_size: int = 512):  # type: ignore[no-untyped-def]
    """Byte-level tokenizer. With a corpus, BPE merges are learned from it inside Qwen2's pre-tokenizer
    pieces (words, single digits): a task's fixed text then costs a token per word instead of one per byte,
    which is most of the compute on CPU. The pieces must be Qwen2's: transformers 5 loads any `qwen2` model's
    tokenizer as Qwen2Tokenizer, which re-splits text with that pattern before applying the merges, so merges
    across its pieces would silently not apply in the engine."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if corpus:
        core = Tokenizer(models.BPE())
        split = pre_tokenizers.Split(Regex(QWEN2_PIECES), behavior="isolated", invert=False)
        core.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=list(SPECIAL_TOKENS), show_progress=False
        )
        core.train_from_iterator(list(corpus), trainer=trainer)
    else:
        core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
        core.pre_tokenizer = byte_level
        core.add_special_tokens(list(SPECIAL_TOKENS))
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, bos_token=None, unk_token=None
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_readable(out_dir: Path) -> None:
    """Read permission for everyone on the model's files: safetensors writes its file 0600, and the engine and
    trainer images run as uid 10001 with the model directory bind-mounted."""
    for path in Path(out_dir).iterdir():
        if path.is_file():
            path.chmod(path.stat().st_mode | 0o044)


def build_tiny_model(
    out_dir: Path | str, *, hidden: int = 128, layers: int = 4, seed: int = 0, corpus: Sequence[str] = ()
) -> Path:
    """Writes tokenizer, config and random weights to out_dir; returns it. Deterministic for a given seed
    and corpus (see build_tokenizer)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden % 64:
        raise ValueError(f"hidden={hidden}: must be a multiple of 64 (the head size)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(corpus)
    tokenizer.save_pretrained(out)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = Qwen2Config(
        vocab_size=(len(tokenizer) + 63) // 64 * 64,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 128),
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        rope_theta=10000.0,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = eos_id
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    recipe = {
        "hidden": hidden,
        "layers": layers,
        "seed": seed,
        "vocab": len(tokenizer),
        "parameters": params,
        "warm_start": None,
    }
    (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
    make_readable(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.engine.tiny_model", description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = build_tiny_model(args.out_dir, hidden=args.hidden, layers=args.layers, seed=args.seed)
    recipe = json.loads((out / RECIPE_FILE).read_text())
    print(f"{out}: {recipe['parameters']:,} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
