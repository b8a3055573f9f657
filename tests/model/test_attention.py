"""The paged attention function behind transformers' AttentionInterface."""

import pytest
import torch

from batchgen.model.attention import paged_attention_forward
from batchgen.model.backends import PagedContext, TorchBackend


class _Layer(torch.nn.Module):
    layer_idx = 0


def _context(block_size=4, blocks=4, kv_heads=1, dim=8):
    cache = (torch.zeros(blocks, block_size, kv_heads, dim), torch.zeros(blocks, block_size, kv_heads, dim))
    return PagedContext(
        [cache],
        slot_mapping=torch.tensor([4, 5, 6]),
        cu_seqlens_q=torch.tensor([0, 3], dtype=torch.int32),
        seq_lens=torch.tensor([3], dtype=torch.int32),
        block_tables=torch.tensor([[1, 0]], dtype=torch.int32),
        max_q_len=3,
        max_seq_len=3,
        backend=TorchBackend(),
    )


def test_writes_the_cache_and_matches_causal_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    ctx = _context()
    out, weights = paged_attention_forward(_Layer(), q, k, v, None, scaling=0.5, batchgen=ctx)
    assert weights is None and out.shape == (1, 3, 2, 8)
    torch.testing.assert_close(ctx.kv_caches[0][0][1, :3], k[0].transpose(0, 1))  # block 1, slots 4..6
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.expand(1, 2, 3, 8), v.expand(1, 2, 3, 8), is_causal=True, scale=0.5
    )
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_unsupported_attention_features_fail_loudly():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    with pytest.raises(NotImplementedError, match="softcap"):
        paged_attention_forward(_Layer(), q, k, v, None, batchgen=_context(), softcap=30.0)
    with pytest.raises(RuntimeError, match="without its context"):
        paged_attention_forward(_Layer(), q, k, v, None)
