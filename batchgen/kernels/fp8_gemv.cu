// FP8 (e4m3) product at decode row counts, per-token x per-channel scales:
//   C[M, N] = (A[M, K] . W[N, K]^T) * a_scale[M] * w_scale[N],  M <= 32, C in bf16 (Q_BF16) or fp16.
// Compiled at run time with NVRTC (fp8_gemv_cuda.py) for sm_90a (TMA, wgmma); no headers needed.
//
// Why CUDA: at M = 32 the product only streams the weights; the Triton kernel reads them at 2.0-3.0 TB/s
// (47-71 % of the H200's copy bandwidth) and needs a second kernel to sum its K splits. Here a program (one
// warpgroup) owns 32 weight rows (output columns) over the whole of K, in chunks of 128 K bytes. Thread 0
// copies a chunk with two TMA boxes (the activations: 64 rows x 128 bytes, rows past M zero-filled; the
// weights: 32 rows x 128 bytes; 128-byte swizzle) into a ring of STAGES slots, completing on the slot's
// mbarrier, and the warpgroup multiplies it with 4 wgmma m64n32k32 e4m3 reading both operands from shared
// memory: no conversions, no per-lane copies. The weights' copies for the whole ring are issued before
// griddepcontrol.wait (PDL): they do not depend on the kernel before, so their latency hides behind its end.
// (A first version with mma.sync e4m3 ran at 2.0-2.7 TB/s: on sm_90 those compile to an fp16 HMMA plus a
// convert of every byte.)
//
// Operands: A = the activations (M of wgmma = 64 tokens), B = the weights (N of wgmma = 32 rows), both
// K-major with 128-byte swizzle, as TMA writes them: 8-row atoms of 1 KiB, so the descriptors' stride
// byte offset is 1024 and a k-step of 32 bytes advances the start address by 32.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#ifndef STAGES
#define STAGES 8
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#define ROWS 32                          // weight rows (output columns) a program
#define CHUNK 128                        // K bytes a chunk: one swizzle atom's width
#define A_BYTES (64 * CHUNK)             // activations: 64 rows (wgmma's M), zero past M
#define B_BYTES (ROWS * CHUNK)
#define SLOT_BYTES (A_BYTES + B_BYTES)   // a multiple of 1 KiB: every slot stays atom-aligned
static_assert(STAGES >= 2, "a ring of one slot cannot overlap copies with products");

struct __align__(64) TmaDesc {
  unsigned long long opaque[16];
};

__device__ __forceinline__ u32 shared_addr(const void* p) {
  u32 a;
  asm("{\n .reg .u64 t;\n cvta.to.shared.u64 t, %1;\n cvt.u32.u64 %0, t;\n}" : "=r"(a) : "l"(p));
  return a;
}

// One box at (k, row) into dst, completing on bar.
__device__ __forceinline__ void tma_box(u32 dst, const TmaDesc& map, int k, int row, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(&map)), "r"(k), "r"(row), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void wait_phase(u32 bar, u32 parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra WAIT;\n}" ::"r"(
          bar),
      "r"(parity)
      : "memory");
}

// A shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ u64 smem_desc(u32 addr) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// d[64 x 32] (+)= A[64 x 32 bytes of K] . B[32 x 32 bytes]^T, both from shared memory.
__device__ __forceinline__ void wgmma_k32(float (&d)[16], u64 desc_a, u64 desc_b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ u32 pack_out(float lo, float hi) {
  u32 d;
#ifdef Q_BF16
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#else
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
#endif
  return d;
}

// Grid (cdiv(N, 32)), one warpgroup (128 threads).
extern "C" __global__ void __launch_bounds__(128, MIN_BLOCKS) fp8_gemv(
    u16* __restrict__ out,              // [M, N], row stride stride_om (even, 4-byte aligned)
    const float* __restrict__ a_scale,  // [M], stride stride_as
    const float* __restrict__ w_scale,  // [N]
    int M, int N, int K, int stride_om, int stride_as,
    const __grid_constant__ TmaDesc w_map,  // W [N, K] e4m3: box 128 bytes x 32 rows, 128-byte swizzle
    const __grid_constant__ TmaDesc a_map   // A [M, K] e4m3: box 128 bytes x 64 rows, likewise
) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * ROWS;
  const int chunks = (K + CHUNK - 1) / CHUNK;

  extern __shared__ __align__(1024) unsigned char ring_raw[];
  unsigned char* ring = ring_raw + ((1024 - (shared_addr(ring_raw) & 1023)) & 1023);
  const u32 ring_addr = shared_addr(ring);
  const u32 bars = ring_addr + STAGES * SLOT_BYTES;
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + 8 * i));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  // Chunk j into slot j % STAGES: the weights' box (expecting its bytes), then the activations' (expecting
  // theirs and arriving: the slot's phase completes when both have landed).
  auto issue_weights = [&](int j) {
    const u32 slot = ring_addr + (j % STAGES) * SLOT_BYTES, bar = bars + 8 * (j % STAGES);
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(B_BYTES) : "memory");
    tma_box(slot + A_BYTES, w_map, j * CHUNK, n0, bar);
  };
  auto issue_acts = [&](int j) {
    const u32 slot = ring_addr + (j % STAGES) * SLOT_BYTES, bar = bars + 8 * (j % STAGES);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(A_BYTES) : "memory");
    tma_box(slot, a_map, j * CHUNK, 0, bar);
  };

  if (threadIdx.x == 0)
    for (int j = 0; j < STAGES && j < chunks; ++j) issue_weights(j);
#ifdef PDL
  // The weights never depend on the kernel before; the activations and their scales do.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
  if (threadIdx.x == 0)
    for (int j = 0; j < STAGES && j < chunks; ++j) issue_acts(j);

  float d[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) d[i] = 0.f;
  for (int j = 0; j < chunks; ++j) {
    wait_phase(bars + 8 * (j % STAGES), (j / STAGES) & 1);
    const u32 slot = ring_addr + (j % STAGES) * SLOT_BYTES;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_k32(d, smem_desc(slot + 32 * s), smem_desc(slot + A_BYTES + 32 * s), j | s);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    __syncthreads();  // every warp's products have read the slot: refill it
    if (threadIdx.x == 0 && j + STAGES < chunks) {
      issue_weights(j + STAGES);
      issue_acts(j + STAGES);
    }
  }

  // d[i]: token 16 warp + g + 8 ((i / 2) % 2), weight row 8 (i / 4) + 2t + (i % 2). Warps 2 and 3 hold
  // tokens 32-63: zero rows.
  if (warp >= 2) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int token = 16 * warp + g + 8 * half;
    if (token >= M) continue;
    const float sa = a_scale[(u64)token * stride_as];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int n = n0 + 8 * nt + 2 * t;
      const float lo = d[4 * nt + 2 * half] * sa, hi = d[4 * nt + 2 * half + 1] * sa;
      u16* dst = out + (u64)token * stride_om + n;
      if (n + 1 < N) {
        *reinterpret_cast<u32*>(dst) = pack_out(lo * w_scale[n], hi * w_scale[n + 1]);
      } else if (n < N) {
        *dst = (u16)(pack_out(lo * w_scale[n], 0.f) & 0xffff);
      }
    }
  }
}
