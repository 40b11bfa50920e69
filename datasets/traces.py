"""Request traces that ship with the repository (datasets/data/, checksummed at load).

`mooncake-conversation`: the Mooncake FAST'25 conversation trace (Apache-2.0; attribution in
datasets/data/mooncake/README.md): one hour, 12,031 requests, prefix blocks of 512 tokens.
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

from claimbench import inputs

TRACES = ("mooncake-conversation",)
BLOCK_TOKENS = {"mooncake-conversation": 512}


def requests(name: str = "mooncake-conversation", limit: int | None = None) -> Iterator[dict]:
    """The trace's requests in arrival order: timestamp (ms), input_length, output_length,
    hash_ids (one per prefix block)."""
    if name not in TRACES:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
    with gzip.open(inputs.path(name), "rt") as f:
        for n, line in enumerate(f):
            if limit is not None and n >= limit:
                return
            yield json.loads(line)
