// Paged decode attention over an FP8 (e4m3) KV cache: one query row per sequence, head_dim 128, GQA
// groups of up to 8 q heads. Compiled at run time with NVRTC (fp8_decode_cuda.py); no headers needed.
//
// Why CUDA: the Triton kernel converts K/V tiles out of shared memory into dot-operand layouts and holds
// ~200 registers (2 programs per SM), which caps how fast it reads the cache. Here each thread copies its
// own bytes in 16-byte cp.async copies, in exactly the order mma.sync's fragments want them, into a ring
// of STAGES chunks per warp in shared memory, and reads back only what it copied itself: no barrier, no
// layout change, and STAGES - 1 chunks in flight per warp without holding them in registers. It reads
// the cache nearly as fast as the same copies with no math at all (NO_MATH); see docs/kernels.md for the
// variants measured.
//
// Fragment layout (mma.sync m16n8k16, f16 inputs, f32 sums). Lane = 4 * r + c (r in 0..7, c in 0..3).
// Rows of the A operand are the group's q heads (rows 8..15 are always zero: their registers are a
// constant zero and their sums go to a scratch register).
// * S = q K^T over a chunk of 16 tokens: n-tile j holds tokens 8j..8j+7, lane (r, c) loads token 8j + r,
//   bytes [16c, 16c + 16) and [64 + 16c, 64 + 16c + 16) of its row. Any permutation of the head dims gives
//   the same dot product if q is permuted alike, so k-step s takes the lane's bytes 4s..4s+3 (as logical
//   dims 2c, 2c+1, 2c+8, 2c+9) and lane (r, c) loads q's dims in the same order.
// * O += P V: the C fragment of S (row r, tokens 2c, 2c+1 of each n-tile) is already P's A fragment. The
//   output dims are permuted too: n-tile t, column n is dim 16n + t, so lane (r, c) loads bytes
//   [16r, 16r + 16) of tokens 2c, 2c+1, 2c+8, 2c+9 (one 16-byte load each) and pairs them with byte_perm;
//   it ends up holding output dims [32c, 32c + 32) of row r.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#ifndef WARPS
#define WARPS 4
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 3
#endif
#ifndef STAGES
#define STAGES 3
#endif
#define HEAD_DIM 128
#define CHUNK 16
static_assert(STAGES >= 2, "the warps' merge reuses the ring: 2 slots or more");
#define NEG_INF (-__int_as_float(0x7f800000))

struct Chunk {
  uint4 k[4];  // tokens r (k[0], k[1]) and 8 + r (k[2], k[3]), 32 bytes each
  uint4 v[4];  // tokens 2c, 2c+1, 2c+8, 2c+9: bytes [16r, 16r + 16)
};

__device__ __forceinline__ u32 word(const uint4& x, int i) {
  return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
}

// Four e4m3 values -> two f16x2 registers: bytes 0,1 -> lo, bytes 2,3 -> hi (the lower byte in the low half).
__device__ __forceinline__ void e4m3x4_to_f16(u32 w, u32& lo, u32& hi) {
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

__device__ __forceinline__ u32 pack_f16(float lo, float hi) {
  u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float q_value(u16 bits) {
#ifdef Q_BF16
  float x = __uint_as_float(((u32)bits) << 16);
#else
  float x;
  asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(bits));
#endif
  return fminf(fmaxf(x, -65504.f), 65504.f);  // saturate to fp16's range, as the Triton kernel does
}

__device__ __forceinline__ u16 out_bits(float x) {
  u16 d;
#ifdef Q_BF16
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(x));
#else
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(d) : "f"(x));
#endif
  return d;
}

// d0, d1 (row r of the 16 x 8 tile) += A (rows r: a0, a2; rows r + 8: zero) x B (b0, b1).
__device__ __forceinline__ void mma_top(float& d0, float& d1, u32 a0, u32 a2, u32 b0, u32 b1) {
  float s0, s1;  // rows r + 8: discarded
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%5}, {%7,%8}, "
      "{%0,%1,%9,%9};"
      : "+f"(d0), "+f"(d1), "=f"(s0), "=f"(s1)
      : "r"(a0), "r"(0u), "r"(a2), "r"(b0), "r"(b1), "f"(0.f));
  (void)s0;
  (void)s1;
}

__device__ __forceinline__ u32 shared_addr(const void* p) {
  u32 a;
  asm("{\n .reg .u64 t;\n cvta.to.shared.u64 t, %1;\n cvt.u32.u64 %0, t;\n}" : "=r"(a) : "l"(p));
  return a;
}

__device__ __forceinline__ void copy16(u32 dst, const unsigned char* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// A chunk's slot in the ring: 8 pieces x 32 lanes x 16 bytes (a piece's 32 lanes are 512 contiguous
// bytes, so the copies and the reads back are free of bank conflicts).
#define SLOT_BYTES (8 * 32 * 16)
// The ring, reused after the loop for the warps' merge: [WARPS][32][33] partial outputs, then m and l.
#define RING_BYTES (WARPS * STAGES * SLOT_BYTES)

// The lane's 8 pieces of one chunk: K of tokens r, 8 + r (two halves each), V of tokens 2c, 2c+1, 2c+8,
// 2c+9 (dims [16r, 16r + 16)).
__device__ __forceinline__ void copy_chunk(u32 slot, const unsigned char* kc, const unsigned char* vc, u64 base,
                                           int stride_ct, int lane, int r, int c) {
  const u64 kr0 = base + (u64)r * stride_ct, kr1 = base + (u64)(8 + r) * stride_ct;
  const u32 at = slot + 16 * lane;
  copy16(at + 0 * 512, kc + kr0 + 16 * c);
  copy16(at + 1 * 512, kc + kr0 + 64 + 16 * c);
  copy16(at + 2 * 512, kc + kr1 + 16 * c);
  copy16(at + 3 * 512, kc + kr1 + 64 + 16 * c);
  const int toks[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};
#pragma unroll
  for (int i = 0; i < 4; ++i) copy16(at + (4 + i) * 512, vc + base + (u64)toks[i] * stride_ct + 16 * r);
}

#ifdef TMA
// TMA variant (LaunchShape.tma, taken for launches of few programs per SM): lane 0 loads a chunk with two
// tensor-map copies (K and V: 16 rows x 128 bytes each, 128-byte swizzle: row R's 16-byte column q lands
// at column q ^ (R % 8)) completing on the slot's mbarrier; no per-lane copy instructions at all. Per-lane
// bulk copies moved the bytes alone faster than cp.async, but each lane's copy compiled to a 32-turn loop
// (the bulk copy takes uniform operands).
struct __align__(64) TmaDesc {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void tma_rows(u32 dst, const TmaDesc& map, int head, int offset, int page, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(&map)), "r"(0), "r"(head), "r"(offset), "r"(page), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void wait_phase(u32 bar, u32 parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra WAIT;\n}" ::"r"(
          bar),
      "r"(parity)
      : "memory");
}

// The lane's fragments from a slot of swizzled rows: K rows 0..15 at [0, 2048), V rows at [2048, 4096).
__device__ __forceinline__ void read_chunk_swizzled(Chunk& ch, const unsigned char* slot, int r, int c) {
  const int toks[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = r + 8 * (i / 2), col = 4 * (i % 2) + c;
    ch.k[i] = *reinterpret_cast<const uint4*>(slot + row * 128 + 16 * (col ^ (row & 7)));
    ch.v[i] = *reinterpret_cast<const uint4*>(slot + 2048 + toks[i] * 128 + 16 * (r ^ (toks[i] & 7)));
  }
}
#endif

__device__ __forceinline__ void read_chunk(Chunk& ch, const unsigned char* slot, int lane) {
  const uint4* p = reinterpret_cast<const uint4*>(slot) + lane;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    ch.k[i] = p[32 * i];
    ch.v[i] = p[32 * (4 + i)];
  }
}

struct RowState {
  float m, l;         // running max (log2 domain) and this lane's share of the sum
  float o[16][2];     // output dims 32c + t and 32c + 16 + t
};

// One chunk of 16 tokens starting at t0; tokens at or past hi are masked (their V bytes zeroed: unwritten
// slots may hold NaN patterns, and 0 * NaN is NaN).
__device__ __forceinline__ void attend_chunk(RowState& st, const Chunk& ch, const u32 (&qa)[8][2], int t0,
                                             int hi, float qk_scale, int c) {
  float s[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      u32 b0, b1;
      e4m3x4_to_f16(word(ch.k[2 * j + ks / 4], ks % 4), b0, b1);
      mma_top(s[j][0], s[j][1], qa[ks][0], qa[ks][1], b0, b1);
    }
  }
  float mx = NEG_INF;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool valid = t0 + 8 * j + 2 * c + e < hi;
      s[j][e] = valid ? s[j][e] * qk_scale : NEG_INF;
      mx = fmaxf(mx, s[j][e]);
    }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(st.m, mx);  // finite: a chunk starts below hi
  const float alpha = fast_exp2(st.m - m_new);
  float p[2][2], sum = 0.f;
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      p[j][e] = fast_exp2(s[j][e] - m_new);
      sum += p[j][e];
    }
  st.l = st.l * alpha + sum;
  st.m = m_new;
#pragma unroll
  for (int t = 0; t < 16; ++t) {
    st.o[t][0] *= alpha;
    st.o[t][1] *= alpha;
  }
  const u32 pa0 = pack_f16(p[0][0], p[0][1]), pa2 = pack_f16(p[1][0], p[1][1]);
  uint4 v[4];
  const int toks[4] = {2 * c, 2 * c + 1, 2 * c + 8, 2 * c + 9};
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = t0 + toks[i] < hi ? ch.v[i] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    // Tokens (2c, 2c+1) and (2c+8, 2c+9) paired per dim: byte t of word w is dim 16r + 4w + t.
    const u32 a01 = __byte_perm(word(v[0], w), word(v[1], w), 0x5140);
    const u32 a23 = __byte_perm(word(v[0], w), word(v[1], w), 0x7362);
    const u32 b01 = __byte_perm(word(v[2], w), word(v[3], w), 0x5140);
    const u32 b23 = __byte_perm(word(v[2], w), word(v[3], w), 0x7362);
    u32 lo0, hi0, lo1, hi1;
    e4m3x4_to_f16(a01, lo0, hi0);
    e4m3x4_to_f16(b01, lo1, hi1);
    mma_top(st.o[4 * w][0], st.o[4 * w][1], pa0, pa2, lo0, lo1);
    mma_top(st.o[4 * w + 1][0], st.o[4 * w + 1][1], pa0, pa2, hi0, hi1);
    e4m3x4_to_f16(a23, lo0, hi0);
    e4m3x4_to_f16(b23, lo1, hi1);
    mma_top(st.o[4 * w + 2][0], st.o[4 * w + 2][1], pa0, pa2, lo0, lo1);
    mma_top(st.o[4 * w + 3][0], st.o[4 * w + 3][1], pa0, pa2, hi0, hi1);
  }
}

// Grid (sequence, kv head, split), WARPS warps. A split's chunks go round-robin to its warps; each warp
// keeps its own softmax state, and the warps are merged through shared memory at the end. With splits,
// each writes its normalised partial and log2-sum-exp in the Triton merge kernel's layout.
extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) fp8_paged_decode(
    const u16* __restrict__ q,                // [T, Hq, 128]
    const unsigned char* __restrict__ kc,     // [num_blocks, block_size, Hkv, 128] e4m3
    const unsigned char* __restrict__ vc,
    u16* __restrict__ out,                    // [T, Hq, 128], when num_splits == 1
    float* __restrict__ part_acc,             // [B, Hq, num_splits, 128]
    float* __restrict__ part_lse,             // [B, Hq, num_splits], log2 domain
    const int* __restrict__ cu_q, const int* __restrict__ seq_lens, const int* __restrict__ block_tables,
    double qk_scale_d, double v_scale_d, int num_splits, int stride_qt, int stride_qh, int stride_ot,
    int stride_oh, int stride_cb, int stride_ct, int stride_ch, int stride_bt, int num_q_heads, int group,
    int block_size
#ifdef TMA
    ,
    const __grid_constant__ TmaDesc k_map,  // [num_blocks, block_size, Hkv, 128] as 4D, box 16 rows of a head
    const __grid_constant__ TmaDesc v_map
#endif
) {
#ifdef PDL
  // With programmatic dependent launch (fp8_decode_cuda.LAUNCH_WITH_PDL; off: decode steps were slower): the
  // programs are scheduled while the kernel before (rope_kv_write: this step's q and K/V) finishes, and
  // read nothing before it has; then the kernel after may be scheduled in turn.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, c = lane & 3;
  const int b = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int row = cu_q[b];
  const int q_len = cu_q[b + 1] - row;
  const int seq_len = q_len > 0 ? seq_lens[b] : 0;  // a padding sequence attends to nothing
  const float qk_scale = (float)qk_scale_d;
  const int chunks = (seq_len + CHUNK - 1) / CHUNK;
  const int share = (chunks + num_splits - 1) / num_splits;
  const int c_lo = split * share;
  const int n_chunks = max(0, min(share, chunks - c_lo));
  const int hi = min((c_lo + n_chunks) * CHUNK, seq_len);

  // q fragments of row r: dims 16c + [0, 16) and 64 + 16c + [0, 16), four per k-step.
  u32 qa[8][2];
  {
    uint4 raw[4] = {make_uint4(0u, 0u, 0u, 0u), make_uint4(0u, 0u, 0u, 0u), make_uint4(0u, 0u, 0u, 0u),
                    make_uint4(0u, 0u, 0u, 0u)};
    if (r < group) {
      const u16* qrow = q + (u64)row * stride_qt + (u64)(kv_head * group + r) * stride_qh;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        raw[i] = *reinterpret_cast<const uint4*>(qrow + 64 * (i / 2) + 16 * c + 8 * (i % 2));
    }
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const uint4& x = raw[ks / 2];
      const u32 w0 = word(x, 2 * (ks % 2)), w1 = word(x, 2 * (ks % 2) + 1);
      qa[ks][0] = pack_f16(q_value(w0 & 0xffff), q_value(w0 >> 16));
      qa[ks][1] = pack_f16(q_value(w1 & 0xffff), q_value(w1 >> 16));
    }
  }

  RowState st;
  st.m = NEG_INF;
  st.l = 0.f;
#pragma unroll
  for (int t = 0; t < 16; ++t) st.o[t][0] = st.o[t][1] = 0.f;

  const int* bt_row = block_tables + (u64)b * stride_bt;
  const u64 head_off = (u64)kv_head * stride_ch;
  auto chunk_base = [&](int i, int page) -> u64 {
    const int t0 = (c_lo + i) * CHUNK;
    return (u64)page * stride_cb + (u64)(t0 % block_size) * stride_ct + head_off;
  };
  // This warp's chunks are warp, warp + WARPS, ...: n_mine of them; chunk j of them goes to slot j % STAGES.
#ifdef TMA  // the swizzle follows address bits 4-9: slots start on 1 KiB boundaries (the launch adds 1 KiB)
  extern __shared__ __align__(1024) unsigned char ring_raw[];
  unsigned char* ring = ring_raw + ((1024 - (shared_addr(ring_raw) & 1023)) & 1023);
#else
  extern __shared__ __align__(16) unsigned char ring[];  // RING_BYTES, set at launch
#endif
  unsigned char* my_ring = ring + warp * STAGES * SLOT_BYTES;
  const u32 my_ring_addr = shared_addr(my_ring);
  const int n_mine = warp < n_chunks ? (n_chunks - warp + WARPS - 1) / WARPS : 0;
  auto chunk_of = [&](int j) { return warp + j * WARPS; };
  // Page numbers come 32 chunks at a time, lane i holding chunk base + i's: looking each one up just
  // before its copy put a dependent global load, long under load, in every iteration.
  auto pages_from = [&](int base) -> int {
    const int j = base + lane;
    return j < n_mine ? bt_row[(c_lo + chunk_of(j)) * CHUNK / block_size] : 0;
  };
  int window = 0, pages = pages_from(0), pages_next = pages_from(32);
  auto page_of_mine = [&](int j) -> int {  // j non-decreasing across calls, warp-uniform
    if (j >= window + 32) {
      window += 32;
      pages = pages_next;
      pages_next = pages_from(window + 32);
    }
    return __shfl_sync(0xffffffffu, pages, j - window);
  };
#ifdef TMA
  const u32 bars = shared_addr(ring + WARPS * STAGES * SLOT_BYTES) + 8 * STAGES * warp;
  if (lane == 0)
    for (int i = 0; i < STAGES; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + 8 * i));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  auto issue = [&](int j) {  // chunk j of this warp's into slot j % STAGES
    const int page = page_of_mine(j), offset = ((c_lo + chunk_of(j)) * CHUNK) % block_size;
    const u32 slot = my_ring_addr + (j % STAGES) * SLOT_BYTES, bar = bars + 8 * (j % STAGES);
    __syncwarp();  // every lane has read the slot's previous chunk
    if (lane == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(SLOT_BYTES) : "memory");
      tma_rows(slot, k_map, kv_head, offset, page, bar);
      tma_rows(slot + 2048, v_map, kv_head, offset, page, bar);
    }
  };
#else
  auto issue = [&](int j) {  // chunk j of this warp's into slot j % STAGES
    const u64 base = chunk_base(chunk_of(j), page_of_mine(j));
    const u32 slot = my_ring_addr + (j % STAGES) * SLOT_BYTES;
    copy_chunk(slot, kc, vc, base, stride_ct, lane, r, c);
  };
#endif
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j < n_mine) issue(j);
    commit_copies();
  }
  for (int j = 0; j < n_mine; ++j) {
    if (j + STAGES - 1 < n_mine) issue(j + STAGES - 1);
    commit_copies();
#ifdef TMA
    wait_phase(bars + 8 * (j % STAGES), (j / STAGES) & 1);  // chunk j has landed
#else
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1) : "memory");  // chunk j has landed
#endif
#ifndef NO_MATH  // an experiment: the copies alone, for the access pattern's own ceiling
    Chunk cur;
#ifdef TMA
    read_chunk_swizzled(cur, my_ring + (j % STAGES) * SLOT_BYTES, r, c);
#else
    read_chunk(cur, my_ring + (j % STAGES) * SLOT_BYTES, lane);
#endif
    attend_chunk(st, cur, qa, (c_lo + chunk_of(j)) * CHUNK, hi, qk_scale, c);
#endif
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);

  // Merge the warps: [warp][lane][33] keeps each lane's 32 dims on distinct banks.
  __syncthreads();  // every warp is done with the ring: its bytes now hold the partial outputs
  float(*sm_o)[32][33] = reinterpret_cast<float(*)[32][33]>(ring);
  float(*sm_m)[8] = reinterpret_cast<float(*)[8]>(ring + WARPS * 32 * 33 * 4);
  float(*sm_l)[8] = sm_m + WARPS;
  if (c == 0) {
    sm_m[warp][r] = st.m;
    sm_l[warp][r] = st.l;
  }
  __syncthreads();
  float m_all = NEG_INF;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) m_all = fmaxf(m_all, sm_m[w][r]);
  const float own = st.m == NEG_INF ? 0.f : fast_exp2(st.m - m_all);
#pragma unroll
  for (int t = 0; t < 16; ++t) {
    sm_o[warp][lane][t] = st.o[t][0] * own;
    sm_o[warp][lane][16 + t] = st.o[t][1] * own;
  }
  __syncthreads();
  const float v_scale = (float)v_scale_d;
  const int heads0 = kv_head * group;
  for (int idx = threadIdx.x; idx < group * HEAD_DIM; idx += WARPS * 32) {
    const int g = idx / HEAD_DIM, d = idx % HEAD_DIM;  // row g, dim d: lane 4g + d / 32, slot d % 32
    float m = NEG_INF, l = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) m = fmaxf(m, sm_m[w][g]);
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      l += sm_m[w][g] == NEG_INF ? 0.f : sm_l[w][g] * fast_exp2(sm_m[w][g] - m);
      acc += sm_o[w][4 * g + d / 32][d % 32];
    }
    const float res = l > 0.f ? acc * (v_scale / l) : 0.f;
    if (num_splits == 1) {
      if (q_len > 0) out[(u64)row * stride_ot + (u64)(heads0 + g) * stride_oh + d] = out_bits(res);
    } else {
      const u64 part = ((u64)b * num_q_heads + heads0 + g) * num_splits + split;
      part_acc[part * HEAD_DIM + d] = res;
      if (d == 0) part_lse[part] = l > 0.f ? m + __log2f(l) : NEG_INF;
    }
  }
}
