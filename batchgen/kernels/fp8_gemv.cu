// FP8 (e4m3) product at decode row counts, per-token x per-channel scales:
//   C[M, N] = (A[M, K] . W[N, K]^T) * a_scale[M] * w_scale[N],  M <= 32, C in bf16 (Q_BF16) or fp16.
// Compiled at run time with NVRTC (fp8_gemv_cuda.py), sm_90+ (TMA); no headers needed.
//
// Why CUDA: at M = 32 the product only streams the weights; the Triton kernel reads them at 2.0-3.0 TB/s
// (47-71 % of the H200's copy bandwidth) and needs a second kernel to sum its K splits. Here a program
// owns 32 weight rows (output columns) over the whole of K; its warps take every WARPS-th chunk of 128 K
// bytes. Lane 0 of a warp copies a chunk with four TMA boxes (weights and activations, 64 bytes x 32 rows
// each) into the warp's ring of STAGES slots, completing on the slot's mbarrier: no per-lane copy
// instructions. The weights' copies for the first slots are issued before griddepcontrol.wait (PDL): they
// do not depend on the kernel before, so their latency hides behind its end. The warps' partial sums
// meet in shared memory at the end; no split of K across programs, no second kernel.
//
// Fragments (mma.sync m16n8k32, e4m3 inputs, f32 sums; lane = 4 * g + t): the weights are the A operand
// (16 rows an m-tile, two m-tiles), the activations B (8 tokens an n-tile, four n-tiles). The order of K
// inside a chunk is free if A and B use the same one: k-step s takes, for lane t, word s of bytes
// [16t, 16t + 16) of the chunk's first half as logical k [4t, 4t + 4), and of its second half as
// [16 + 4t, ...). Rows of a box are 64 bytes apart, so a quarter-warp's 16-byte reads (rows g, g + 1, t
// = 0..3) hit 32 distinct banks.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#ifndef WARPS
#define WARPS 4
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#define ROWS 32                         // weight rows (output columns) a program
#define TOKENS 32                       // activation rows: the boxes zero-fill rows past M
#define HALF_BYTES (32 * 64)            // one box: 32 rows x 64 bytes
#define SLOT_BYTES (4 * HALF_BYTES)     // weights' two halves, then the activations'
static_assert(STAGES >= 2, "a ring of one slot cannot overlap copies with products");

struct __align__(64) TmaDesc {
  unsigned long long opaque[16];
};

__device__ __forceinline__ u32 shared_addr(const void* p) {
  u32 a;
  asm("{\n .reg .u64 t;\n cvta.to.shared.u64 t, %1;\n cvt.u32.u64 %0, t;\n}" : "=r"(a) : "l"(p));
  return a;
}

__device__ __forceinline__ u32 word(const uint4& x, int i) {
  return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
}

// One box of 64 bytes x 32 rows at (k, row), completing on bar.
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

__device__ __forceinline__ void mma_e4m3(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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

// Grid (cdiv(N, 32)), WARPS warps.
extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS) fp8_gemv(
    u16* __restrict__ out,              // [M, N], row stride stride_om
    const float* __restrict__ a_scale,  // [M], stride stride_as
    const float* __restrict__ w_scale,  // [N]
    int M, int N, int K, int stride_om, int stride_as,
    const __grid_constant__ TmaDesc w_map,  // W [N, K] e4m3: box 64 bytes x 32 rows
    const __grid_constant__ TmaDesc a_map   // A [M, K] e4m3: likewise
) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * ROWS;
  const int chunks = (K + 127) / 128;
  const int n_mine = warp < chunks ? (chunks - warp + WARPS - 1) / WARPS : 0;  // chunks warp, warp + WARPS..

  extern __shared__ __align__(1024) unsigned char ring_raw[];
  unsigned char* ring = ring_raw + ((1024 - (shared_addr(ring_raw) & 1023)) & 1023);
  unsigned char* my_ring = ring + warp * STAGES * SLOT_BYTES;
  const u32 my_ring_addr = shared_addr(my_ring);
  const u32 bars = shared_addr(ring + WARPS * STAGES * SLOT_BYTES) + 8 * STAGES * warp;
  if (lane == 0)
    for (int i = 0; i < STAGES; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + 8 * i));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();

  // Chunk j of this warp's (K bytes 128 * (warp + j * WARPS) ..) into slot j % STAGES: the weights' boxes
  // (expecting their bytes), then the activations' (expecting theirs, and arriving: the phase completes).
  auto issue_weights = [&](int j) {
    const int k = 128 * (warp + j * WARPS);
    const u32 slot = my_ring_addr + (j % STAGES) * SLOT_BYTES, bar = bars + 8 * (j % STAGES);
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(2 * HALF_BYTES)
                 : "memory");
    tma_box(slot, w_map, k, n0, bar);
    tma_box(slot + HALF_BYTES, w_map, k + 64, n0, bar);
  };
  auto issue_acts = [&](int j) {
    const int k = 128 * (warp + j * WARPS);
    const u32 slot = my_ring_addr + (j % STAGES) * SLOT_BYTES, bar = bars + 8 * (j % STAGES);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(2 * HALF_BYTES)
                 : "memory");
    tma_box(slot + 2 * HALF_BYTES, a_map, k, 0, bar);
    tma_box(slot + 3 * HALF_BYTES, a_map, k + 64, 0, bar);
  };

  if (lane == 0)
    for (int j = 0; j < STAGES - 1 && j < n_mine; ++j) issue_weights(j);
#ifdef PDL
  // The weights never depend on the kernel before; the activations and their scales do.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
  if (lane == 0)
    for (int j = 0; j < STAGES - 1 && j < n_mine; ++j) issue_acts(j);

  float acc[2][4][4];  // [m-tile][n-tile][fragment]: rows 16 mt + g (+ 8), tokens 8 nt + 2t (+ 1)
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  for (int j = 0; j < n_mine; ++j) {
    if (j + STAGES - 1 < n_mine) {
      __syncwarp();  // every lane has read slot (j - 1) % STAGES, which the copies below refill
      if (lane == 0) {
        issue_weights(j + STAGES - 1);
        issue_acts(j + STAGES - 1);
      }
    }
    wait_phase(bars + 8 * (j % STAGES), (j / STAGES) & 1);
    const unsigned char* slot = my_ring + (j % STAGES) * SLOT_BYTES;
    uint4 w[2][2][2], a[4][2];  // w[m-tile][row g / g + 8][half], a[n-tile][half]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int rh = 0; rh < 2; ++rh)
          w[mt][rh][h] = *reinterpret_cast<const uint4*>(slot + h * HALF_BYTES + (16 * mt + 8 * rh + g) * 64 + 16 * t);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        a[nt][h] = *reinterpret_cast<const uint4*>(slot + (2 + h) * HALF_BYTES + (8 * nt + g) * 64 + 16 * t);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          mma_e4m3(acc[mt][nt], word(w[mt][0][0], s), word(w[mt][1][0], s), word(w[mt][0][1], s),
                   word(w[mt][1][1], s), word(a[nt][0], s), word(a[nt][1], s));
  }

  // The warps' sums meet in the ring: red[warp][row][token], 33 columns so a row's tokens and a token's
  // rows both spread over the banks.
  __syncthreads();
  float(*red)[ROWS][TOKENS + 1] = reinterpret_cast<float(*)[ROWS][TOKENS + 1]>(ring);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][16 * mt + g + 8 * (i / 2)][8 * nt + 2 * t + (i % 2)] = acc[mt][nt][i];
  __syncthreads();
  for (int idx = threadIdx.x; idx < ROWS * TOKENS; idx += WARPS * 32) {
    const int token = idx / ROWS, row = idx % ROWS, n = n0 + row;
    if (token >= M || n >= N) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += red[w][row][token];
    out[(u64)token * stride_om + n] = out_bits(sum * a_scale[(u64)token * stride_as] * w_scale[n]);
  }
}
