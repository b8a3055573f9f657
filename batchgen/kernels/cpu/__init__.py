"""The CPU path's kernels in torch: per-sequence paged attention, oneDNN linears, rotary + KV write."""
