"""A tiny Qwen2-shaped causal LM with a byte-level tokenizer, made here (no hub download).

The tokenizer maps every byte to one token (a BPE with no merges), so any text round-trips, plus three
special tokens; the chat template is compact (`<|im_start|>u:...<|im_end|>`) so prompts stay short. The model
is randomly initialised and saved in Hugging Face format (safetensors), which both vLLM and verl load.

A long-context variant (`positions=LONG_POSITIONS`) holds the first prompt of a real harness (13-19k tokens with
their tokenizers, 20-40k with this one): the same weights (rotary positions have none), a config whose
max_position_embeddings is 65,536 and whose RoPE base is Qwen2.5's, so the slowest rotation (~4 M positions) is far
longer than any prompt. The default (512 positions, base 10,000) is the demo's model and stays as it is.

    python -m services.engine.tiny_model data/models/tiny-qwen [--hidden 128] [--layers 4] [--positions 65536]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
# Hermes/Qwen2.5-style tool-call markers, one token each: vLLM's `hermes` tool-call parser finds calls between
# them, and as special tokens the text around a call is tokenized apart from it, so re-rendering a call the model
# made gives back the tokens it sampled.
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN, TOOL_CALL_START, TOOL_CALL_END)


def _chat_template(strip_past_reasoning: bool) -> str:
    """The tiny model's chat template. Roles are shortened to their first letter (~10 fewer tokens a message).

    Tools: the offered tools are one line of signatures, `tools: calculator(expression)`, appended to the system
    message (or a system message of their own); an assistant's tool calls are rendered after its text as
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, with the JSON spelled as json.dumps spells it
    (vLLM's hermes parser re-serialises the arguments that way), so a call rendered back into the history is the
    text the model wrote. Tool results are `t:` messages.

    strip_past_reasoning: `<think>...</think>` is dropped from assistant turns before the last user message, as
    Qwen3's template does: the history is then not a pure append (tests and bench/ measure what that does)."""
    tools = (
        "{%- set ns = namespace(sigs=[], last_user=-1) -%}"
        "{%- for t in tools or [] -%}{%- set f = t.function if t.function is defined else t -%}"
        "{%- set ns.sigs = ns.sigs + [f.name ~ '(' ~ ((((f.parameters or {}).properties) or {}) | list | join(','))"
        " ~ ')'] -%}{%- endfor -%}"
        "{%- set tool_line = 'tools: ' ~ (ns.sigs | join(' ')) -%}"
        "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
        "{%- endfor -%}"
    )
    content = (
        "{%- set text = m.content if m.content is string else "
        "((m.content or []) | map(attribute='text') | join('')) -%}"
    )
    if strip_past_reasoning:
        content += (
            "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in text -%}"
            "{%- set text = text.split('</think>')[-1] -%}{%- endif -%}"
        )
    calls = (
        "{%- for tc in m.tool_calls or [] -%}{%- set f = tc.function if tc.function is defined else tc -%}"
        '<tool_call>{"name": {{ f.name | tojson }}, "arguments": '
        "{{ f.arguments if f.arguments is string else (f.arguments | tojson) }}{{ '}' }}</tool_call>"
        "{%- endfor -%}"
    )
    return (
        tools + "{%- for m in messages -%}"
        "{%- if loop.first and tools and m.role != 'system' -%}<|im_start|>s:{{ tool_line }}<|im_end|>{%- endif -%}"
        + content
        + "<|im_start|>{{ m.role[0] }}:{{ text }}"
        "{%- if m.role == 'system' and tools -%}{{ '\\n' ~ tool_line }}{%- endif -%}"
        + calls
        + "<|im_end|>{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>a:{%- endif -%}"
    )


CHAT_TEMPLATE = _chat_template(strip_past_reasoning=False)
# A template whose history is not a pure append (see _chat_template): for measuring and testing segment rows.
REASONING_STRIPPING_CHAT_TEMPLATE = _chat_template(strip_past_reasoning=True)
# Qwen2's pre-tokenizer pattern (words, single digits, punctuation runs, whitespace).
QWEN2_PIECES = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Written next to the weights: a model directory says how it was made.
RECIPE_FILE = "agl_tiny_model.json"
# Positions: the demo's model has 512 (its rows are 256 + 256 tokens); the long-context variant holds a harness.
POSITIONS = 512
LONG_POSITIONS = 65_536
# RoPE's base: 10,000 at 512 positions (the slowest of the 32 rotations of a 64-wide head turns once in ~47,000
# positions, beyond which positions alias); 1,000,000 beyond (Qwen2.5's, for 32k-128k contexts: ~4 M positions).
ROPE_THETA = 10_000.0
LONG_ROPE_THETA = 1_000_000.0


def rope_theta(positions: int) -> float:
    return ROPE_THETA if positions <= POSITIONS else LONG_ROPE_THETA


def build_tokenizer(  # type: ignore[no-untyped-def]
    corpus: Sequence[str] = (), vocab_size: int = 512, chat_template: str = CHAT_TEMPLATE
):
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
    tokenizer.chat_template = chat_template
    return tokenizer


def make_readable(out_dir: Path) -> None:
    """Read permission for everyone on the model's files: safetensors writes its file 0600, and the engine and
    trainer images run as uid 10001 with the model directory bind-mounted."""
    for path in Path(out_dir).iterdir():
        if path.is_file():
            path.chmod(path.stat().st_mode | 0o044)


def build_tiny_model(
    out_dir: Path | str,
    *,
    hidden: int = 128,
    layers: int = 4,
    seed: int = 0,
    corpus: Sequence[str] = (),
    chat_template: str = CHAT_TEMPLATE,
    positions: int = POSITIONS,
) -> Path:
    """Writes tokenizer, config and random weights to out_dir; returns it. Deterministic for a given seed
    and corpus (see build_tokenizer); the weights do not depend on `positions` (the model's context length)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards": noise around the demo's own lines

    if hidden % 64:
        raise ValueError(f"hidden={hidden}: must be a multiple of 64 (the head size)")
    if positions < POSITIONS:
        raise ValueError(f"positions={positions}: at least {POSITIONS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(corpus, chat_template=chat_template)
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
        max_position_embeddings=positions,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        rope_theta=rope_theta(positions),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # A turn also ends at a tool call's closing marker: text after it is dropped by the engine's tool-call parser,
    # so it could never be rendered back into the history (the next prompt would not continue the row). Stopping
    # there keeps every tool-call turn a pure append (its <|im_end|> comes back as context).
    model.generation_config.eos_token_id = [eos_id, tokenizer.convert_tokens_to_ids(TOOL_CALL_END)]
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    recipe = {
        "hidden": hidden,
        "layers": layers,
        "seed": seed,
        "vocab": len(tokenizer),
        "parameters": params,
        "warm_start": None,
        # Only where it is not the default: the demo's recipe (and so its cached model) stays as it was.
        **({"positions": positions} if positions != POSITIONS else {}),
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
    parser.add_argument("--positions", type=int, default=POSITIONS, help=f"context length ({LONG_POSITIONS}: long)")
    args = parser.parse_args(argv)
    out = build_tiny_model(
        args.out_dir, hidden=args.hidden, layers=args.layers, seed=args.seed, positions=args.positions
    )
    recipe = json.loads((out / RECIPE_FILE).read_text())
    print(f"{out}: {recipe['parameters']:,} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
