"""A small English text kept in this package (story.txt, written for edge-remat; no licence
concerns) and a byte-level tokenizer that needs no download: token = 3 + byte value, with
0 = padding, 1 = beginning and 2 = end of text, so any vocabulary of 259 or more holds it
(TinyLlama's 32000 included: the ids above 258 simply never occur).

    for input_ids, labels in text_batches(batch=1, seq=128, seed=0): ...

Three layouts: "next-token" (the zoo's language models: input_ids and the next token as
labels), "causal-lm" (transformers' causal LMs: input_ids, an attention mask of ones and
labels equal to input_ids, unshifted, because the model shifts them itself) and "seq2seq-lm"
(transformers' encoder-decoder LMs, T5, BART: a window of the story as input_ids, a mask of
ones, and the window that follows it as labels: the model learns to continue the text, and
shifts the labels into its decoder's inputs itself).
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Iterator

FILE = "story.txt"
PAD, BOS, EOS, OFFSET = 0, 1, 2, 3
SMALLEST_VOCAB = OFFSET + 256
LAYOUTS = ("next-token", "causal-lm", "seq2seq-lm")


def encode(text: str) -> list[int]:
    return [BOS] + [OFFSET + b for b in text.encode("utf-8")] + [EOS]


def decode(ids) -> str:
    return bytes(int(i) - OFFSET for i in ids if int(i) >= OFFSET).decode("utf-8", "replace")


@functools.lru_cache(maxsize=1)
def story_tokens() -> tuple[int, ...]:
    text = importlib.resources.files(__package__).joinpath(FILE).read_text("utf-8")
    return tuple(encode(text))


def text_batches(batch: int, seq: int, seed: int = 0,
                 layout: str = "next-token") -> Iterator[tuple]:
    """Batches of `layout` (above) forever: windows of the story at starts shuffled with
    `seed`, a fresh shuffle each pass."""
    import torch
    tokens = torch.tensor(story_tokens(), dtype=torch.int64)
    span = 2 * seq if layout == "seq2seq-lm" else seq + 1  # the source and its continuation
    if tokens.numel() < span:
        raise ValueError(f"the bundled text has {tokens.numel()} tokens, fewer than {span}")
    starts = torch.arange(0, tokens.numel() - span + 1, max(1, seq // 2))
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = starts[torch.randperm(len(starts), generator=generator)]
        for k in range(0, len(order) - batch + 1, batch):
            windows = torch.stack([tokens[s:s + span] for s in order[k:k + batch].tolist()])
            yield _arranged(windows, layout, seq)


def _arranged(windows, layout: str, seq: int) -> tuple:
    """[batch, span] token windows -> the model's arguments."""
    import torch
    if layout == "seq2seq-lm":
        source = windows[:, :seq].clone()
        return source, torch.ones_like(source), windows[:, seq:].clone()
    ids = windows[:, :-1].clone()
    if layout == "causal-lm":
        return ids, torch.ones_like(ids), ids.clone()
    return ids, windows[:, 1:].clone()
