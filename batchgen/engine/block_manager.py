"""Paged KV block bookkeeping: free list, reference counts and a content-addressed prefix cache.

Pure Python. A block's identity in the prefix cache is (hash of everything before it, its tokens): two
requests whose first k full blocks hold the same tokens share those k blocks. Freed blocks keep their
content and stay findable until they are handed out again (least recently freed first).
"""

from __future__ import annotations

from collections import OrderedDict

from batchgen.engine.request import Request

BlockKey = tuple[int, tuple[int, ...]]


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._ref = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockKey, int] = {}  # block key -> block id
        self._key_of: dict[int, BlockKey] = {}  # block id -> its key (only registered blocks)
        self._hash_of: dict[int, int] = {}  # block id -> chain hash of the prefix up to its end
        self.hit_tokens = 0
        self.query_tokens = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- allocation -------------------------------------------------------------------------------

    def can_grow(self, req: Request, num_tokens: int) -> bool:
        return self.blocks_for(num_tokens) - len(req.block_table) <= self.num_free

    def grow(self, req: Request, num_tokens: int) -> None:
        """Give ``req`` enough blocks to hold ``num_tokens`` positions (caller checked can_grow)."""
        for _ in range(self.blocks_for(num_tokens) - len(req.block_table)):
            req.block_table.append(self._pop_free())

    def release(self, req: Request) -> None:
        """Drop ``req``'s references; blocks reaching zero return to the free list (content kept)."""
        for block in reversed(req.block_table):  # tail first: prefix blocks are evicted last
            if self._ref[block] <= 0:
                raise RuntimeError(f"block {block} freed twice")
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None
        req.block_table = []
        req.num_cached_blocks = 0

    def shrink(self, req: Request, num_tokens: int) -> int:
        """Return ``req``'s blocks past the first ``num_tokens`` positions (rejected guesses' blocks: never
        registered, as their tokens were not known), newest first; how many were returned."""
        keep = self.blocks_for(num_tokens)
        returned = max(0, len(req.block_table) - keep)
        while len(req.block_table) > keep:
            block = req.block_table.pop()
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None
                self._free.move_to_end(block, last=False)  # handed out first: nothing cached in it
        return returned

    def _pop_free(self) -> int:
        block, _ = self._free.popitem(last=False)
        key = self._key_of.pop(block, None)
        if key is not None and self._cached.get(key) == block:
            del self._cached[key]
        self._hash_of.pop(block, None)
        self._ref[block] = 1
        return block

    # --- prefix cache -----------------------------------------------------------------------------

    def _root(self, req: Request) -> int:
        # With prefix caching off, blocks are still shared between the samples of one row.
        return 0 if self.prefix_caching else hash(("row", req.index, req.params.seed))

    def match_prefix(self, req: Request) -> None:
        """Attach cached blocks for ``req``'s leading full blocks (a fresh request holding no blocks).

        At least one token is always left to compute, so the step that ends the prefill has logits.
        """
        usable = (len(req.tokens) - 1) // self.block_size
        parent = self._root(req)
        for i in range(usable):
            tokens = tuple(req.tokens[i * self.block_size : (i + 1) * self.block_size])
            block = self._cached.get((parent, tokens))
            if block is None:
                break
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1
            req.block_table.append(block)
            parent = self._hash_of[block]
        req.num_cached_blocks = len(req.block_table)
        req.num_computed = req.num_cached_blocks * self.block_size

    def count_lookup(self, req: Request) -> None:
        """Account an admitted request's prefix hit (for the hit rate)."""
        self.hit_tokens += req.num_computed
        self.query_tokens += len(req.tokens)

    def register_full_blocks(self, req: Request, upto: int) -> None:
        """Make ``req``'s full blocks below position ``upto`` findable (their tokens must be known: never a
        guess held for an in-flight verify step)."""
        cached = req.num_cached_blocks
        full = min(upto, req.num_confirmed) // self.block_size
        if full > cached:
            self.register_blocks(req, cached, full)
            req.num_cached_blocks = full

    def register_blocks(self, req: Request, first: int, end: int) -> None:
        """Make ``req``'s blocks ``first`` to ``end`` - 1 findable, those before them already being so
        (the caller advances ``num_cached_blocks``: the scheduler does it for many rows at once)."""
        size, table, tokens = self.block_size, req.block_table, req.tokens
        parent = self._hash_of[table[first - 1]] if first else self._root(req)
        for i in range(first, end):
            block = table[i]
            key = (parent, tuple(tokens[i * size : (i + 1) * size]))
            parent = self._hash_of[block] = hash(key)
            if key not in self._cached:
                self._cached[key] = block
                self._key_of[block] = key
