/* gpu/matmul.cu - the GPU's tuned matmul kernels for decode and small batches
 * (§9 of kvtransformer.cu, included in its place, as cpu/matmul.c is for the
 * CPU). The spec is matmul_plain_cpu in the file, and the file's own GPU
 * kernel is the textbook tiled one (matmul_tiled_kernel), which --plain runs
 * for every call; the suite checks these kernels against both, in the C
 * emulation and on a GPU. KVT_LOAD4, float4 and KVT_INLINE below serve
 * gpu/attention.cu too. */
/* Decode kernel, built for the memory bound: a decode step reads every weight
 * once, so the kernel must keep enough bytes in flight to fill HBM (~20 KB per
 * SM on an H100/H200) and read each weight once for all its rows of x.
 * grid (ceil(d / (ROWS * KVT_WARPS)), ceil(n / X)), block KVT_THREADS. Each
 * warp owns ROWS consecutive output rows and up to X rows of x. Lane l reads
 * columns 4l..4l+3 of a weight row as one 16-byte load (a warp: 512 contiguous
 * bytes), then 4l+128.., and uses each loaded weight for all its rows of x; it
 * keeps ROWS x X <= 32 partial sums. A step's ROWS weight loads come first, one
 * after another: a row past d reads row d - 1 again (its sums are dropped), so
 * no branch stands between two loads and the warp has them all in flight.
 * The warp then transposes its sums through shared memory: lane i adds up the
 * 32 partials of (row, x) pair i. One barrier per warp's work.
 *
 *   part[warp]:   lane 0   lane 1  ...  lane 31      <- written as acc[i]
 *     pair 0    [  p00      p01    ...   p0,31 ]  -> summed by lane 0
 *     pair 1    [  p10      p11    ...   p1,31 ]  -> summed by lane 1 ...
 *
 * Two shapes, ROWS x X. matmul_rows_kernel, decode: on a GPU 4 x 4, so
 * d = 4096 gives 1024 warps (~8 per SM of an H200, each with 4 x 512 bytes in
 * flight per step), and up to 4 decode rows cost one pass over the weights (8
 * rows two); in the C build 32 x 1 (each barrier costs ~50 us there, so fewer,
 * larger work items). matmul_batch_kernel, batches of up to 16 rows: 2 x 16,
 * one pass over the weights, each weight used 16 times. Both run the same
 * body, matmul_rows_warp, always inlined: nvcc compiles one copy per constant
 * shape, its loops unrolled and its sums in registers.
 * k4: the columns read 4 at a time, k when x and w are 16-byte aligned and
 * 4 divides k (then every row is aligned too), else 0: one at a time. */
#ifdef __CUDACC__
#define KVT_LOAD4(p) (*(const float4 *)(p))
#else
typedef struct { float x, y, z, w; } float4;
static float4 kvt_load4(const float *p) { float4 v; memcpy(&v, p, sizeof(v)); return v; }
#define KVT_LOAD4(p) kvt_load4(p)
#endif
#define KVT_INLINE __device__ inline __attribute__((always_inline)) /* a kernel's body: a copy per call */
#if defined(__CUDACC__) || defined(KVT_GPU_SIZES)
#define KVT_MV_ROWS 4 /* weight rows per warp */
#define KVT_MV_X 4    /* rows of x per warp */
#else
#define KVT_MV_ROWS 32
#define KVT_MV_X 1
#endif
#define KVT_MB_ROWS 2 /* the batch kernel: 2 weight rows x 16 rows of x per warp */
#define KVT_MB_X 16
KVT_STATIC_ASSERT(KVT_MV_ROWS * KVT_MV_X <= 32 && KVT_MB_ROWS * KVT_MB_X <= 32, "one lane sums each (row, x) pair");
KVT_INLINE void matmul_rows_warp(float *out, const float *x, const float *w, int n, int k, int d, int ROWS, int X) {
    __shared__ float part[KVT_WARPS][32][33]; /* 33: no bank conflicts on the transpose */
    int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    int row0 = ((int)blockIdx.x * KVT_WARPS + warp) * ROWS, x0 = (int)blockIdx.y * X;
    int k4 = (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0 && k % 4 == 0 ? k : 0;
    float acc[32]; /* acc[i * X + j]: weight row row0 + i times row x0 + j of x */
    for (int i = 0; i < ROWS * X; i++) acc[i] = 0.0f;
    for (int c = 4 * lane; c < k4; c += 128) {
        float4 wv[32];
        for (int i = 0; i < ROWS; i++) /* the step's weight loads, back to back */
            wv[i] = KVT_LOAD4(w + (size_t)(row0 + i < d ? row0 + i : d - 1) * k + c);
        for (int j = 0; j < X; j++) { /* rows of x past n read row n - 1 again: their sums are dropped */
            float4 xv = KVT_LOAD4(x + (size_t)(x0 + j < n ? x0 + j : n - 1) * k + c);
            for (int i = 0; i < ROWS; i++)
                acc[i * X + j] += wv[i].x * xv.x + wv[i].y * xv.y + wv[i].z * xv.z + wv[i].w * xv.w;
        }
    }
    for (int c = k4 + lane; c < k; c += 32) /* the columns left over, one per lane */
        for (int i = 0; i < ROWS; i++)
            for (int j = 0; j < X; j++)
                acc[i * X + j] += w[(size_t)(row0 + i < d ? row0 + i : d - 1) * k + c] *
                                  x[(size_t)(x0 + j < n ? x0 + j : n - 1) * k + c];
    for (int i = 0; i < ROWS * X; i++) part[warp][i][lane] = acc[i];
    __syncthreads(); /* each lane now reads a column the other lanes wrote */
    int row = row0 + lane / X, xr = x0 + lane % X; /* lane = its pair's index */
    if (lane < ROWS * X && row < d && xr < n) {
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += part[warp][lane][j];
        out[(size_t)xr * d + row] = s;
    }
}
__global__ void matmul_rows_kernel(float *out, const float *x, const float *w, int n, int k, int d) {
    matmul_rows_warp(out, x, w, n, k, d, KVT_MV_ROWS, KVT_MV_X);
}
__global__ void matmul_batch_kernel(float *out, const float *x, const float *w, int n, int k, int d) {
    matmul_rows_warp(out, x, w, n, k, d, KVT_MB_ROWS, KVT_MB_X);
}
static void matmul_rows_gpu(float *out, const float *x, const float *w, int n, int k, int d) {
    KVT_LAUNCH(matmul_rows_kernel, kvt_cdiv(d, KVT_MV_ROWS * KVT_WARPS), kvt_cdiv(n, KVT_MV_X), KVT_THREADS, out, x, w, n, k, d);
}
static void matmul_batch_gpu(float *out, const float *x, const float *w, int n, int k, int d) {
    KVT_LAUNCH(matmul_batch_kernel, kvt_cdiv(d, KVT_MB_ROWS * KVT_WARPS), kvt_cdiv(n, KVT_MB_X), KVT_THREADS, out, x, w, n, k, d);
}
