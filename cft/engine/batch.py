"""The running batch: one row per request over one left-padded KV cache.

The cache is a transformers `DynamicCache`; row i holds its request's tokens in its last
`length` columns, and the columns before them are zeros that the attention mask hides. A row
joins by appending its own one-row cache (the shorter side is padded on the left) and leaves by
being dropped, after which the leading columns no remaining row needs are trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cft.engine.request import GenRequest


@dataclass
class Row:
    """One request in the running batch: row i of the batched cache."""

    req: GenRequest
    key: str | None  # PEFT adapter key; None for the base
    length: int  # its tokens in the cache (they are the last `length` columns)
    next_id: int  # the sampled token the next step feeds


class RunningBatch:
    """The requests being decoded together and their shared KV cache."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.cache: Any = None

    def keys(self) -> set[str]:
        """PEFT keys of the adapters the rows decode with."""
        return {r.key for r in self.rows if r.key is not None}

    def join(self, row: Row, cache: Any) -> None:
        """Add a row whose prefill produced cache, a one-row cache of row.length tokens."""
        import torch
        import torch.nn.functional as F

        self.rows.append(row)
        if self.cache is None:
            self.cache = cache
            return

        def pad(t: Any, left: int) -> Any:
            return F.pad(t, (0, 0, left, 0)) if left else t

        n = row.length
        width = self.cache.get_seq_length()
        new_width = max(width, n)
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            # Pad dim -2 (positions) on the left; padded columns are masked out.
            old.keys = torch.cat([pad(old.keys, new_width - width), pad(new.keys, new_width - n)])
            old.values = torch.cat(
                [pad(old.values, new_width - width), pad(new.values, new_width - n)]
            )

    def decode_inputs(self) -> dict[str, Any]:
        """The forward's arguments for one decode step: each row feeds its next token."""
        import torch

        width = self.cache.get_seq_length()
        lengths = torch.tensor([r.length for r in self.rows])
        # Row i attends to its own last lengths[i] cached columns plus the new token.
        mask = (torch.arange(width + 1)[None, :] >= (width - lengths)[:, None]).long()
        return {
            "input_ids": torch.tensor([[r.next_id] for r in self.rows]),
            "attention_mask": mask,
            "position_ids": lengths.unsqueeze(1),
            "cache": self.cache,
        }

    def decoded(self, cache: Any) -> None:
        """Take the cache a decode step returned: every row has one more token in it."""
        self.cache = cache
        for row in self.rows:
            row.length += 1

    def drop_finished(self) -> bool:
        """Remove finished and cancelled rows and trim unused columns; True if it removed any."""
        import torch

        keep = [i for i, r in enumerate(self.rows) if r.req.active]
        if len(keep) == len(self.rows):
            return False
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.cache = None
            return True
        index = torch.tensor(keep)
        width = self.cache.get_seq_length()
        start = width - max(r.length for r in self.rows)
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, start:, :]
            layer.values = layer.values[index, :, start:, :]
        return True

    def clear(self) -> None:
        """Drop every row and the cache."""
        self.rows, self.cache = [], None
