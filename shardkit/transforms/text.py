"""A text transform for captioned images: captions as byte ids, with no vocabulary to load.

For a real model pass a tokenizer (any picklable ``list[str] -> LongTensor [B, L]``) as
``ShardLoader(text_transform=...)``; this one is what ``shardkit bench --captions`` gives every
contender and what the contrastive recipe uses when it is run without one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ByteTokenizer"]


class ByteTokenizer:
    """Captions as UTF-8 byte ids + 1 (0 pads), cut or padded to ``length``, as one int64
    ``[B, length]`` tensor (picklable: it runs in the loader's workers).

    >>> ByteTokenizer(4)(["hé", "abcdef"]).tolist()
    [[105, 196, 170, 0], [98, 99, 100, 101]]
    """

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        out = torch.zeros((len(texts), self.length), dtype=torch.int64)
        for i, text in enumerate(texts):
            ids = list(text.encode("utf-8"))[: self.length]
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64) + 1
        return out
