/* kvtransformer.cu - a Llama-style decoder with a KV cache, in one file.
 *
 * What it is: the forward pass of a Llama model (llama2.c checkpoints), with a
 * KV cache that can be switched off, stored in chunks, kept as fp32/fp16/int8,
 * and read by a naive or a fused (online-softmax) attention. Every op has a CPU
 * version (plain loops, OpenBLAS for matmuls: the spec) and right below it the
 * CUDA kernel and its launcher. Without nvcc the same kernels run on the CPU
 * through a small emulation (§2), so every kernel is tested everywhere.
 *
 * Build, run, test:   make        make run        make test       make debug
 *   nvcc build: nvcc -x cu kvtransformer.cu ... (real GPU kernels)
 *   C build:    cc -x c -fopenmp kvtransformer.cu ... (kernels emulated by OpenMP)
 *
 * Map (grep -n "// §" kvtransformer.cu):
 *   §1  includes, errors, timers          §11 attention, naive (3 kernels)
 *   §2  CUDA, or its emulation on the CPU §12 attention, fused (+ split/merge)
 *   §3  device memory helpers             §13 swiglu
 *   §4  checkpoint loading, random model  §14 residual add
 *   §5  fp16 and int8 number formats      §15 the engine and the forward pass
 *   §6  the KV chunk pool, sequences      §16 tokenizer
 *   §7  embedding                         §17 sampling
 *   §8  rmsnorm                           §18 checks (compare two arrays)
 *   §9  matmul (loops/sgemm; kernels)     §19 benchmarks
 *   §10 rope, kv write (+ quantize)       §20 command line
 * (§16-§20, the memory probe in §3 (cli/memory.c), the random model at the
 * end of §4 and the pool's printer and checks at the end of §15 are the
 * harness around the lesson: files in cli/ and bench/, included in their
 * place, so it is still one compile. So are
 * the CPU's tuned loops, in cpu/matmul.c (§9, with prefill's sgemm split
 * over the cores) and cpu/attention.c (§10's
 * vector loops and §12's tiled fused attention), and the GPU's tuned
 * kernels, in gpu/matmul.cu (§9) and gpu/attention.cu (§12): the specs and
 * plain kernels they are checked against stay here, and --plain runs those.)
 *
 * Dimensions: L layers, D model dim, NH query heads, NKV kv heads, HS head size,
 *   KVD = NKV*HS, HD FFN hidden, V vocab, T positions so far, TMAX max positions,
 *   CH positions per cache chunk, G channels per int8 scale, n rows in one call.
 */

// §1 includes, errors, timers ------------------------------------------------
#define _POSIX_C_SOURCE 200809L /* clock_gettime, fseeko, strdup */
#define _DEFAULT_SOURCE 1        /* madvise (huge pages, host_alloc) */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <cblas.h>
#include <omp.h>
#if defined(__AVX__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h> /* fp16/int8 conversions, horizontal sums (cpu/) */
#endif
#include "kvtransformer.h"

/* Why two kinds of error: user input (a file, a flag, a prompt) can be wrong, and
 * the caller must be able to say so and go on, so those paths return a status and
 * leave one line here. A broken invariant or a failed CUDA call means a bug: it
 * stops in kvt_fatal (put a gdb breakpoint there to stop at every failure). */
static char kvt_errbuf[1024];

const char *kvt_last_error(void) { return kvt_errbuf; }

/* Errors a user can cause (a bad flag, a short file, a full pool) are values,
 * not exits: kvt_fail formats the one line that explains it into kvt_errbuf
 * and returns the status, every caller passes the status up unchanged, and
 * only the command line (cli_fail, §20) prints the line and exits with 1. A
 * library user (test.c, an embedding program) reads kvt_last_error() and can
 * recover: nothing is left half-done. */
static kvt_status kvt_fail(kvt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvt_errbuf, sizeof(kvt_errbuf), fmt, ap);
    va_end(ap);
    return st;
}

/* A broken invariant inside this program (KVT_ASSERT, a CUDA call that
 * failed) is a bug, not an input error: say where, and stop. Several OpenMP
 * threads can reach the same failure at once (every thread of an emulated
 * block checks its team size): the first one prints the line, in one write,
 * and exits; the others wait for the exit instead of printing it again. */
static void kvt_fatal(const char *file, int line, const char *fmt, ...) {
    static int dying;
    struct timespec second = {1, 0};
    if (__atomic_exchange_n(&dying, 1, __ATOMIC_SEQ_CST))
        for (;;) nanosleep(&second, NULL);
    char msg[1200];
    int k = snprintf(msg, sizeof(msg), "[KVT ERROR] %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + k, sizeof(msg) - (size_t)k, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", msg);
    exit(EXIT_FAILURE);
}
#define KVT_ASSERT(cond) \
    do { if (!(cond)) kvt_fatal(__FILE__, __LINE__, "assertion failed: %s", #cond); } while (0)

/* Allocations made through kvt_malloc and host_alloc (buf_alloc's host
 * buffers), counted: test.c checks that a forward call after the first makes
 * none. */
static long kvt_alloc_count;
static void *kvt_malloc(size_t bytes) { /* invariant-level allocation (small) */
    kvt_alloc_count++;
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (!p) kvt_fatal(__FILE__, __LINE__, "out of host memory (%zu bytes)", bytes);
    return p;
}
/* A big host buffer (the weights, the KV pool, scratch; NULL when there is
 * no memory), freed with free(). From 2 MiB on it starts on a 2 MiB boundary
 * and asks Linux for huge pages (transparent huge pages, which the common
 * "madvise" setting gives only on request): the weights of a decode step are
 * then read through 1 TLB entry per 2 MiB instead of one per 4 KiB page (110M
 * shape: 220 instead of 107,000), fewer page walks on every decode step.
 * Where the kernel says no, the pages are just small. */
static void *host_alloc(size_t bytes) {
    size_t huge = (size_t)2 << 20;
    kvt_alloc_count++;
    if (bytes < huge) return malloc(bytes > 0 ? bytes : 1);
    void *p = NULL;
    if (posix_memalign(&p, huge, bytes) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* a hint: its failure changes nothing else */
#endif
    return p;
}

/* Open a user's file for reading. On failure the message says why, in the C
 * library's words ("No such file or directory", "Permission denied"); a
 * directory is refused here, because fopen accepts one on Linux and only the
 * first read fails (or ftello reports 2^63 bytes). what: "checkpoint", ... */
static kvt_status kvt_open_read(FILE **f, const char *path, const char *what) {
    struct stat sb;
    *f = fopen(path, "rb");
    if (!*f) return kvt_fail(KVT_EIO, "cannot open %s '%s': %s", what, path, strerror(errno));
    if (fstat(fileno(*f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(*f);
        *f = NULL;
        return kvt_fail(KVT_EIO, "cannot read %s '%s': it is a directory", what, path);
    }
    return KVT_OK;
}
/* Sizes. A buffer's size is a product of numbers a user picked (TMAX, V, --fork,
 * --chunk, --chunks, max_rows): 4096 sequences x 2^20 one-position chunks is 2^32
 * table entries, past any int, and a pool of 2^28 chunks of a 1024-layer model
 * passes even 2^64 bytes. Every such product goes through kvt_mul_ok, so a size
 * that cannot exist is reported and never wraps around to a small number. */
/* *out = a * b and 1; or *out = SIZE_MAX and 0 when the product passes size_t. */
static int kvt_mul_ok(size_t a, size_t b, size_t *out) {
    if (b != 0 && a > SIZE_MAX / b) { *out = SIZE_MAX; return 0; }
    *out = a * b;
    return 1;
}
/* *bytes = n1 * n2 * n3 * n4 (pass 1 for a factor not needed), or a KVT_ENOMEM
 * line naming `what` and the factors when the product does not fit. */
static kvt_status kvt_bytes(size_t *bytes, const char *what, size_t n1, size_t n2, size_t n3, size_t n4) {
    size_t n12, n123;
    if (kvt_mul_ok(n1, n2, &n12) && kvt_mul_ok(n12, n3, &n123) && kvt_mul_ok(n123, n4, bytes)) return KVT_OK;
    return kvt_fail(KVT_ENOMEM, "out of memory: %s would need %zu x %zu x %zu x %zu bytes, more than %zu",
                    what, n1, n2, n3, n4, (size_t)SIZE_MAX);
}

static double kvt_now(void) { /* seconds, monotonic */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// §2 CUDA, or its emulation on the CPU -----------------------------------------
/* Our kernels use: a 2-D grid of 1-D blocks, threadIdx.x, blockIdx.x/.y,
 * blockDim.x, gridDim.x/.y, __shared__ arrays, __syncthreads(), and one warp
 * shuffle (__shfl_xor_sync on floats). No atomics (reductions stay deterministic).
 *
 * With nvcc these are CUDA itself. With a plain C compiler this section supplies
 * them: a launch runs the grid's blocks one after another; the threads of a block
 * are an OpenMP team (one OS thread per CUDA thread, so gdb shows each as a
 * thread); __syncthreads() is the team barrier; __shared__ is `static`, so the
 * team shares it; threadIdx/blockIdx are thread-local.
 *
 * Rules the emulation needs (real CUDA needs them too, it just forgives more):
 *  - every thread of a block reaches every __syncthreads() and every shuffle the
 *    same number of times (no barrier inside `if (tid < n)`);
 *  - blockDim.x is a multiple of 32 for kernels that shuffle;
 *  - a barrier costs ~50 us (2 cores, 32 threads), so the C build launches small
 *    blocks (KVT_THREADS) and small tiles (KVT_TILE).
 * It checks logic (indexing, tiling, barriers), not what only hardware shows
 * (races between warps without a barrier, occupancy, speed). */
#define KVT_MAX_THREADS 256 /* largest block any launcher uses (the tiled matmul's 16 x 16) */
#define KVT_MAX_HS 256      /* largest head size the attention kernels hold */
#define KVT_MAX_ROWS 4096   /* most rows (new tokens) in one forward call */
#define KVT_MAX_SEQS 4096   /* most sequences in one engine (max_seqs) */

/* Launches per kernel, counted by name in both builds (KVT_LAUNCH calls it;
 * the table and kvt_launch_count are in cli/inspect.c): a test can ask
 * whether a path really ran a kernel. */
static void kvt_launch_counted(const char *name);

#ifdef __CUDACC__
#include <cuda_runtime.h>
#define KVT_THREADS 128 /* threads per block for row kernels */
#define KVT_TILE 16     /* tiled matmul: (16 x 16) outputs, 256 threads */
#define KVT_ROW_BLOCKS 256 /* element-wise kernels: most blocks per row (then threads loop) */
#define KVT_HD static __host__ __device__ /* a function for both CPU and GPU code */

static int kvt_sync_launches = -1; /* KVT_SYNC=1: synchronize after every launch */
static void kvt_launch_check(const char *name, const char *file, int line) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) {
        if (kvt_sync_launches < 0) kvt_sync_launches = getenv("KVT_SYNC") != NULL;
        if (kvt_sync_launches) err = cudaDeviceSynchronize();
    }
    if (err != cudaSuccess) kvt_fatal(file, line, "kernel %s: %s", name, cudaGetErrorString(err));
}
/* The one place the two builds differ in how a kernel is started. */
#define KVT_LAUNCH(kernel, gx, gy, bx, ...)                                   \
    do {                                                                      \
        kvt_launch_counted(#kernel);                                          \
        kernel<<<dim3((gx), (gy)), (bx)>>>(__VA_ARGS__);                      \
        kvt_launch_check(#kernel, __FILE__, __LINE__);                        \
    } while (0)
#define KVT_EMULATED 0

#else /* ---- the emulation: plain C + OpenMP ---- */
#ifdef KVT_GPU_SIZES /* the GPU build's blocks, to test the kernels as the GPU runs them (make test-gpu-sizes) */
#define KVT_THREADS 128
#define KVT_TILE 16
#define KVT_ROW_BLOCKS 256
#else
#define KVT_THREADS 32 /* one warp: barriers are cheap only in small teams */
#define KVT_TILE 8     /* tiled matmul: (8 x 8) outputs, 64 threads */
#define KVT_ROW_BLOCKS 2 /* each block ends in a barrier of the team: few blocks, threads loop */
#endif
#define KVT_HD static
#define __global__ static
#define __device__ static
#define __shared__ static /* one copy, shared by the team that runs the block */
#define KVT_EMULATED 1

typedef struct { unsigned int x, y, z; } dim3;
static _Thread_local dim3 threadIdx; /* each OpenMP thread is one CUDA thread */
static _Thread_local dim3 blockIdx;
static dim3 blockDim, gridDim;
static int emu_nblocks;                  /* gridDim.x * gridDim.y */
static float emu_shfl[2][KVT_MAX_THREADS]; /* exchange slots for shuffles */
static _Thread_local int emu_shfl_parity;

/* A block's threads are one OpenMP team, so a CUDA barrier is an OpenMP
 * barrier: no thread of the team passes it before all have reached it. As on
 * a GPU, a barrier that some threads skip (inside an `if` on threadIdx) hangs:
 * the emulation keeps CUDA's rule instead of hiding its violation. */
static void __syncthreads(void) {
    _Pragma("omp barrier")
}

/* Lane i gets lane (i ^ mask)'s value. Every thread publishes its value, waits
 * at a barrier, then reads its partner's. Two alternating slot arrays make one
 * barrier enough: a thread can only rewrite an array after the next shuffle's
 * barrier, which no thread passes before everyone read this one's values. */
static float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
    (void)mask;
    int tid = (int)threadIdx.x, p = emu_shfl_parity;
    emu_shfl_parity ^= 1;
    emu_shfl[p][tid] = v;
    __syncthreads();
    return emu_shfl[p][(tid & ~31) | ((tid & 31) ^ lane_mask)];
}

/* The three steps of an emulated launch: set the grid for everyone, then in
 * each OpenMP thread set its threadIdx, then per block set blockIdx. */
static void emu_launch_begin(const char *name, int gx, int gy, int bx) {
    if (gx < 1 || gy < 1 || bx < 1 || bx > KVT_MAX_THREADS)
        kvt_fatal(__FILE__, __LINE__, "kernel %s: bad launch grid (%d,%d) block %d", name, gx, gy, bx);
    gridDim.x = (unsigned)gx; gridDim.y = (unsigned)gy; gridDim.z = 1;
    blockDim.x = (unsigned)bx; blockDim.y = 1; blockDim.z = 1;
    emu_nblocks = gx * gy;
    omp_set_dynamic(0); /* we need exactly bx threads, not "up to" */
}
static void emu_thread_begin(const char *name) {
    if (omp_get_num_threads() != (int)blockDim.x)
        kvt_fatal(__FILE__, __LINE__, "kernel %s: got %d threads for a block of %u "
                  "(built without -fopenmp, or OMP_THREAD_LIMIT too low?)",
                  name, omp_get_num_threads(), blockDim.x);
    threadIdx.x = (unsigned)omp_get_thread_num(); threadIdx.y = 0; threadIdx.z = 0;
    emu_shfl_parity = 0;
}
static void emu_block_begin(int b) {
    blockIdx.x = (unsigned)b % gridDim.x; blockIdx.y = (unsigned)b / gridDim.x; blockIdx.z = 0;
}
/* A launch: one team of bx threads walks the grid block by block; the barrier
 * after each block keeps a fast thread from starting the next block (and
 * overwriting __shared__ arrays) while others still use them. */
#define KVT_LAUNCH(kernel, gx, gy, bx, ...)                                   \
    do {                                                                      \
        kvt_launch_counted(#kernel);                                          \
        emu_launch_begin(#kernel, (gx), (gy), (bx));                          \
        _Pragma("omp parallel num_threads(blockDim.x)")                       \
        {                                                                     \
            emu_thread_begin(#kernel);                                        \
            for (int emu_b = 0; emu_b < emu_nblocks; emu_b++) {               \
                emu_block_begin(emu_b);                                       \
                kernel(__VA_ARGS__);                                          \
                _Pragma("omp barrier")                                        \
            }                                                                 \
        }                                                                     \
        kvt_launch_check(#kernel, __FILE__, __LINE__);                        \
    } while (0)

/* The CUDA runtime calls we use, on host memory. */
/* Device memory is host memory here, so a "device pointer" can be printed in
 * gdb like any other, and buf_upload/buf_download are plain copies. */
typedef int cudaError_t;
#define cudaSuccess 0
#define cudaErrorMemoryAllocation 2
typedef enum { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice } cudaMemcpyKind;
/* As in CUDA, a failed call is also kept as the runtime's last error, which
 * the next launch's check reads (cudaGetLastError returns it and clears it):
 * a failure that is handled must be cleared where it is handled. */
static cudaError_t emu_last_error;
static cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu_last_error;
    emu_last_error = cudaSuccess;
    return e;
}
static cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = host_alloc(bytes);
    if (!*p) emu_last_error = cudaErrorMemoryAllocation;
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
static cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    (void)kind;
    if (bytes) memcpy(dst, src, bytes);
    return cudaSuccess;
}
static const char *cudaGetErrorString(cudaError_t e) { return e ? "out of memory" : "no error"; }
static void kvt_launch_check(const char *name, const char *file, int line) { /* after every launch, as on a GPU */
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) kvt_fatal(file, line, "kernel %s: %s", name, cudaGetErrorString(err));
}
#endif

/* Block sizes the kernels rely on: whole warps (shuffles), and no launch larger
 * than the emulation's shuffle slots. Shared arrays indexed by warp are sized
 * by the real block, KVT_WARPS. */
#ifdef __cplusplus
#define KVT_STATIC_ASSERT static_assert
#else
#define KVT_STATIC_ASSERT _Static_assert
#endif
KVT_STATIC_ASSERT(KVT_THREADS % 32 == 0 && KVT_THREADS <= KVT_MAX_THREADS,
                  "row kernels: whole warps, <= KVT_MAX_THREADS");
KVT_STATIC_ASSERT(KVT_TILE * KVT_TILE <= KVT_MAX_THREADS, "tiled matmul: KVT_TILE^2 threads, <= KVT_MAX_THREADS");
#define KVT_WARPS (KVT_THREADS / 32) /* warps of a row kernel's block */

/* Every CUDA runtime call goes through this: a failure is a bug or a broken
 * device, so it stops with the call's text and CUDA's reason. */
#define KVT_CUDA(call)                                                        \
    do {                                                                      \
        cudaError_t err_ = (call);                                            \
        if (err_ != cudaSuccess)                                              \
            kvt_fatal(__FILE__, __LINE__, "%s: %s", #call, cudaGetErrorString(err_)); \
    } while (0)

/* Sum (op 0) or max (op 1) of one value per thread over the whole block; every
 * thread gets the result. Warp step: a butterfly of 5 shuffles leaves the warp's
 * total in every lane. Block step: lane 0 of each warp writes it to shared
 * memory and every thread adds the warp totals in the same fixed order, so the
 * result is bit-identical in every thread and every run (no atomics). */
#define KVT_SUM 0
#define KVT_MAX 1
__device__ float block_reduce(float v, int op) {
    __shared__ float warp_part[KVT_WARPS]; /* callers are row kernels: blocks of KVT_THREADS */
    int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    for (int m = 16; m > 0; m >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, m);
        v = op == KVT_SUM ? v + o : fmaxf(v, o);
    }
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    float r = warp_part[0];
    for (int i = 1; i < KVT_WARPS; i++) r = op == KVT_SUM ? r + warp_part[i] : fmaxf(r, warp_part[i]);
    __syncthreads(); /* warp_part may be reused by the next call */
    return r;
}

static int kvt_cdiv(long a, long b) { return (int)((a + b - 1) / b); }
/* The blocks an element-wise kernel gives one row of `count` values: one value
 * per thread, but at most KVT_ROW_BLOCKS (the threads then loop). */
static int row_blocks(int count) {
    int b = kvt_cdiv(count, KVT_THREADS);
    return b < KVT_ROW_BLOCKS ? b : KVT_ROW_BLOCKS;
}

// §3 device memory helpers -----------------------------------------------------
/* Buffers of the engine live on the device it runs on: host_alloc (§1) for the CPU
 * path, cudaMalloc for the GPU path (host memory again in the emulated build).
 * Out of memory is a user-facing error: the model or the pool may simply be too
 * big for this machine, and the message says how many bytes were asked for. */
/* `what` names the buffer in the message ("the KV cache pool needs ... bytes"),
 * so a user knows which flag to lower. */
static kvt_status buf_alloc(int gpu, void **p, size_t bytes, const char *what) {
    *p = NULL;
    if (gpu) {
        if (cudaMalloc(p, bytes) != cudaSuccess) {
            (void)cudaGetLastError(); /* handled here: else the next launch's check reports this failure */
            *p = NULL;
            return kvt_fail(KVT_ENOMEM, "device out of memory: %s needs %zu bytes (%.1f MiB)",
                            what, bytes, (double)bytes / (1 << 20));
        }
    } else {
        *p = host_alloc(bytes);
        if (!*p)
            return kvt_fail(KVT_ENOMEM, "host out of memory: %s needs %zu bytes (%.1f MiB)",
                            what, bytes, (double)bytes / (1 << 20));
    }
    return KVT_OK;
}
/* Free a buffer of either kind; NULL is fine (a half-built engine frees all). */
static void buf_free(int gpu, void *p) {
    if (!p) return;
    if (gpu) KVT_CUDA(cudaFree(p));
    else free(p);
}
/* Copy between host memory and a buffer of the engine (either device). */
static void buf_upload(int gpu, void *dst, const void *src, size_t bytes) {
    if (gpu) KVT_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    else if (bytes) memcpy(dst, src, bytes);
}
/* Device -> host (a plain copy for a CPU buffer). cudaMemcpy waits for the
 * kernels before it, so a download is also where the host syncs with the GPU. */
static void buf_download(int gpu, void *dst, const void *src, size_t bytes) {
    if (gpu) KVT_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    else if (bytes) memcpy(dst, src, bytes);
}
/* Within one buffer's device (a chunk copied on write, rows gathered). */
static void buf_copy(int gpu, void *dst, const void *src, size_t bytes) {
    if (gpu) KVT_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    else if (bytes) memcpy(dst, src, bytes);
}

/* Host memory is checked before the big allocations (weights, pool, scratch):
 * Linux lets malloc promise more memory than there is, and the process is killed
 * without a word when the pages are first written (after minutes of filling a
 * large --random model). Checked first, the answer is one line, at once. How
 * many bytes are available (KVT_MEM_LIMIT, else /proc/meminfo) is read by
 * kvt_mem_available in cli/memory.c, included here. */
#include "cli/memory.c"
/* Do the host bytes about to be allocated fit? weights (not counted when
 * `loaded`: then they are only named), cache (the KV pool), scratch (everything
 * else); 0 for what is not part of this allocation. */
/* (Bytes as double: a sum of sizes near SIZE_MAX must not wrap either.) */
static kvt_status kvt_mem_check(double weights, int loaded, double cache, double scratch) {
    const char *source = "";
    size_t avail;
    kvt_status st = kvt_mem_available(&avail, &source);
    if (st != KVT_OK) return st;
    if (avail == 0 || (loaded ? 0.0 : weights) + cache + scratch <= (double)avail) return KVT_OK;
    char rest[128] = "";
    if (cache > 0 || scratch > 0)
        snprintf(rest, sizeof(rest), ", cache %.3g GB, scratch %.3g GB", cache / 1e9, scratch / 1e9);
    return kvt_fail(KVT_ENOMEM, "not enough host memory: weights %.3g GB%s%s, available %.3g GB (%s)",
                    weights / 1e9, loaded ? " (loaded)" : "", rest, (double)avail / 1e9, source);
}

/* 1 when GPU kernels can run: a CUDA device, or the emulation. */
static int kvt_gpu_available(void) {
#ifdef __CUDACC__
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return 1;
#endif
}
/* The GPU's multiprocessors (SMs): the automatic split (attn_split, §15) makes
 * enough attention blocks to give each KVT_SPLIT_BLOCKS_PER_SM of them. The
 * emulation stands for a small GPU of 8. */
static int kvt_gpu_sms(void) {
#ifdef __CUDACC__
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 1;
    return n > 0 ? n : 1;
#else
    return 8;
#endif
}
static const char *kvt_gpu_name(void) {
#ifdef __CUDACC__
    static char name[300];
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "no CUDA device";
    snprintf(name, sizeof(name), "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
    return name;
#else
    return "GPU kernels emulated on the CPU (C build, OpenMP)";
#endif
}

// §4 checkpoint loading, random model -----------------------------------------
/* llama2.c's format (legacy "version 0"): a header of 7 int32 (kvt_config), then
 * fp32 tensors in the order of kvt_weights, with two RoPE tables (TMAX, HS/2)
 * between rms_final and wcls that we skip (RoPE is computed on the fly). A
 * negative vocab_size means the file ends with its own classifier wcls (V, D).
 * llama2.c's RoPE base is 10000; a model trained with another (SmolLM2: 1e5,
 * Llama 3: 5e5) carries it in our one extension: 4 bytes "rope" and a float32
 * base right after the header (file 8 bytes longer; exporters write it only
 * for a base other than 10000, so every llama2.c file stays as it was).
 *
 * Every size is computed in 64 bits from a validated header and compared with
 * the file's length before anything is allocated or read: a truncated download
 * or a file from another exporter is reported, never read past its end. */
#define KVT_LIMIT_DIM 65536
#define KVT_LIMIT_LAYERS 1024
#define KVT_LIMIT_VOCAB (1 << 22)
#define KVT_LIMIT_SEQ (1 << 20)

/* Every header field is checked against a range before it is used for any
 * arithmetic: a garbage header (a random file, a text file, another format)
 * then fails here, with the field named, instead of asking for terabytes.
 * The limits are far above any real model (Llama-2-70B: dim 8192, 80 layers). */
kvt_status kvt_config_check(const kvt_config *c) {
    struct { const char *name; long v, lo, hi; } f[] = {
        {"dim", c->dim, 1, KVT_LIMIT_DIM},
        {"hidden_dim", c->hidden_dim, 1, 16L * KVT_LIMIT_DIM},
        {"n_layers", c->n_layers, 1, KVT_LIMIT_LAYERS},
        {"n_heads", c->n_heads, 1, KVT_LIMIT_DIM},
        {"n_kv_heads", c->n_kv_heads, 1, KVT_LIMIT_DIM},
        {"vocab_size", labs((long)c->vocab_size), 1, KVT_LIMIT_VOCAB},
        {"seq_len", c->seq_len, 1, KVT_LIMIT_SEQ},
    };
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (f[i].v < f[i].lo || f[i].v > f[i].hi)
            return kvt_fail(KVT_EFORMAT, "header field %s = %ld is out of range [%ld, %ld]",
                            f[i].name, f[i].v, f[i].lo, f[i].hi);
    if (c->dim % c->n_heads)
        return kvt_fail(KVT_EFORMAT, "header: n_heads = %d does not divide dim = %d", c->n_heads, c->dim);
    if (c->n_heads % c->n_kv_heads)
        return kvt_fail(KVT_EFORMAT, "header: n_kv_heads = %d does not divide n_heads = %d",
                        c->n_kv_heads, c->n_heads);
    int hs = c->dim / c->n_heads;
    if (hs % 2 || hs > KVT_MAX_HS)
        return kvt_fail(KVT_EFORMAT, "header: head size dim/n_heads = %d must be even and <= %d",
                        hs, KVT_MAX_HS);
    return KVT_OK;
}

/* Number of floats after the header, in 64-bit arithmetic. */
/* Sizes fit easily in 64 bits after kvt_config_check (no kvt_mul_ok needed):
 * at most 2 * 2^22 * 2^16 (embeddings) + 2^10 * (4 * 2^32 + 3 * 2^20 * 2^16)
 * (layers) + 2^20 * 2^8 (RoPE) floats < 2^48, i.e. < 2^50 bytes. */
static size_t kvt_checkpoint_floats(const kvt_config *c, int shared) {
    size_t D = (size_t)c->dim, HD = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t V = (size_t)labs((long)c->vocab_size), HS = D / (size_t)c->n_heads;
    size_t KVD = (size_t)c->n_kv_heads * HS;
    size_t n = V * D                        /* token_embedding */
             + L * D                        /* rms_att */
             + L * (D * D + 2 * KVD * D + D * D) /* wq wk wv wo */
             + L * D                        /* rms_ffn */
             + L * 3 * HD * D               /* w1 w2 w3 */
             + D                            /* rms_final */
             + (size_t)c->seq_len * HS;     /* two RoPE tables, skipped */
    return shared ? n : n + V * D;          /* wcls */
}

/* Point each weight at its place in one buffer, in the file's order. The
 * same function maps the host copy and the device copy (same layout). */
static void kvt_weights_map(kvt_weights *w, float *p, const kvt_config *c, int shared) {
    size_t D = (size_t)c->dim, HD = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t V = (size_t)c->vocab_size, HS = D / (size_t)c->n_heads;
    size_t KVD = (size_t)c->n_kv_heads * HS;
    w->token_embedding = p; p += V * D;
    w->rms_att = p;         p += L * D;
    w->wq = p;              p += L * D * D;
    w->wk = p;              p += L * KVD * D;
    w->wv = p;              p += L * KVD * D;
    w->wo = p;              p += L * D * D;
    w->rms_ffn = p;         p += L * D;
    w->w1 = p;              p += L * HD * D;
    w->w2 = p;              p += L * D * HD;
    w->w3 = p;              p += L * HD * D;
    w->rms_final = p;       p += D;
    p += (size_t)c->seq_len * HS; /* freq_cis_real, freq_cis_imag */
    w->wcls = shared ? w->token_embedding : p;
}

/* Fill in the derived sizes and allocate the weight buffer (host). */
static kvt_status kvt_model_setup(kvt_model *m, kvt_config c, int shared) {
    memset(m, 0, sizeof(*m));
    m->c = c;
    m->shared_classifier = shared;
    m->head_size = c.dim / c.n_heads;
    m->kv_dim = c.n_kv_heads * m->head_size;
    m->rope_theta = 10000.0f;
    m->n_floats = kvt_checkpoint_floats(&c, shared);
    kvt_status st = kvt_mem_check(4.0 * (double)m->n_floats, 0, 0.0, 0.0);
    if (st != KVT_OK) return st;
    m->data = (float *)host_alloc(m->n_floats * sizeof(float));
    if (!m->data)
        return kvt_fail(KVT_ENOMEM, "host out of memory: model weights need %zu bytes",
                        m->n_floats * sizeof(float));
    kvt_weights_map(&m->w, m->data, &c, shared);
    return KVT_OK;
}

/* Load order: file length, header, header check, expected length == file
 * length, then one allocation and one fread. Nothing is allocated for a file
 * that fails any check, and nothing is read past the end of a good one. */
kvt_status kvt_model_load(kvt_model *m, const char *path) {
    memset(m, 0, sizeof(*m));
    FILE *f;
    kvt_status st = kvt_open_read(&f, path, "checkpoint");
    if (st != KVT_OK) return st;
    long long file_bytes = fseeko(f, 0, SEEK_END) == 0 ? (long long)ftello(f) : -1;
    if (file_bytes < 0 || fseeko(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return kvt_fail(KVT_EIO, "checkpoint '%s': cannot find its size (a pipe or device? give a regular file)", path);
    }
    kvt_config c;
    if (file_bytes < (long long)sizeof(c) || fread(&c, sizeof(c), 1, f) != 1) {
        fclose(f);
        return kvt_fail(KVT_EFORMAT, "checkpoint '%s': %lld bytes, too short for the 28-byte header",
                        path, file_bytes);
    }
    if (c.dim == 0x616b3432) { /* "ak42": llama2.c's newer export versions */
        fclose(f);
        return kvt_fail(KVT_EFORMAT, "checkpoint '%s' has llama2.c's versioned header (magic 'ak42'); "
                        "export it in the legacy version 0 format", path);
    }
    st = kvt_config_check(&c);
    if (st != KVT_OK) {
        fclose(f);
        char msg[sizeof(kvt_errbuf)];
        snprintf(msg, sizeof(msg), "%s", kvt_errbuf);
        return kvt_fail(st, "checkpoint '%s': %s", path, msg);
    }
    int shared = c.vocab_size > 0;
    c.vocab_size = abs(c.vocab_size);
    long long want = (long long)sizeof(c) + 4LL * (long long)kvt_checkpoint_floats(&c, shared);
    struct { char magic[4]; float theta; } ext = {{0}, 10000.0f}; /* the RoPE-base extension */
    if (file_bytes == want + 8 && (fread(&ext, 8, 1, f) != 1 || memcmp(ext.magic, "rope", 4))) {
        fclose(f);
        return kvt_fail(KVT_EFORMAT, "checkpoint '%s': 8 bytes after the header are not \"rope\" and a RoPE base "
                        "(the extension), and the file is 8 bytes too long for llama2.c's format", path);
    }
    if (!(ext.theta > 1.0f && ext.theta < 1e30f)) { /* weights/kvt_files.py's theta_problem: the same rule */
        fclose(f);
        return kvt_fail(KVT_EFORMAT, "checkpoint '%s': the \"rope\" extension's base %g is outside (1, 1e30)",
                        path, (double)ext.theta);
    }
    if (file_bytes != want && file_bytes != want + 8) {
        fclose(f);
        return kvt_fail(KVT_EFORMAT, "checkpoint '%s': its header (dim %d, hidden_dim %d, n_layers %d, "
                        "n_heads %d, n_kv_heads %d, vocab_size %d%s, seq_len %d) needs %lld bytes, "
                        "the file has %lld (%s)", path, c.dim, c.hidden_dim, c.n_layers, c.n_heads,
                        c.n_kv_heads, c.vocab_size, shared ? " shared" : " unshared", c.seq_len,
                        want, file_bytes, file_bytes < want ? "truncated" : "extra bytes at the end");
    }
    st = kvt_model_setup(m, c, shared);
    if (st != KVT_OK) { fclose(f); return st; }
    m->rope_theta = ext.theta;
    size_t got = fread(m->data, sizeof(float), m->n_floats, f);
    fclose(f);
    if (got != m->n_floats) {
        kvt_model_free(m);
        return kvt_fail(KVT_EIO, "checkpoint '%s': read %zu of %zu floats", path, got, m->n_floats);
    }
    return KVT_OK;
}

/* The random model that --random, the tests and the benchmarks build (a
 * fixed generator, weights of a sensible size for any shape, filled on all
 * cores) is in cli/random_model.c, included here. */
#include "cli/random_model.c"

void kvt_model_free(kvt_model *m) {
    free(m->data);
    if (m->d_data) KVT_CUDA(cudaFree(m->d_data));
    memset(m, 0, sizeof(*m));
}

/* The weights on the device (uploaded once, on first use by a GPU engine). */
static kvt_status kvt_model_upload(kvt_model *m) {
    if (m->d_data) return KVT_OK;
    void *p;
    kvt_status st = buf_alloc(1, &p, m->n_floats * sizeof(float), "model weights");
    if (st != KVT_OK) return st;
    m->d_data = (float *)p;
    buf_upload(1, m->d_data, m->data, m->n_floats * sizeof(float));
    kvt_weights_map(&m->d_w, m->d_data, &m->c, m->shared_classifier);
    return KVT_OK;
}

// §5 fp16 and int8 number formats ---------------------------------------------
/* fp16 (IEEE half): 1 sign, 5 exponent (bias 15), 10 mantissa bits. The cache
 * stores halves as uint16_t bits and all arithmetic stays fp32. These two
 * functions are plain bit manipulation, so the C build needs no compiler
 * extension, and the CPU and GPU paths round identically (nearest, ties to even). */
typedef union { float f; uint32_t u; } kvt_bits;

/* float -> half, the spec: sign, 5 exponent bits (bias 15), 10 mantissa bits.
 * Out of range -> inf; below 2^-14 the half is subnormal (no implicit 1), and
 * the bits shifted out decide the rounding: more than half up, exactly half
 * to the even neighbour. */
KVT_HD uint16_t f32_to_f16(float f) {
    kvt_bits b;
    b.f = f;
    uint32_t sign = (b.u >> 16) & 0x8000u, a = b.u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u)); /* inf, nan */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                /* below 2^-14: a subnormal half (or 0) */
        if (a <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25 rounds to 0 */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23);  /* value / 2^-24 = mant >> shift */
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = (a - 0x38000000u) >> 13; /* rebias exponent 127 -> 15, drop 13 bits */
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry may bump the exponent: right */
    return (uint16_t)(sign | h);
}
/* half -> float is exact: rebias the exponent (15 -> 127) and widen the
 * mantissa; subnormal halves are m * 2^-24, inf and nan keep their payload. */
KVT_HD float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    kvt_bits b;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    b.u = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13);
    return b.f;
}

/* int8, symmetric, one fp32 scale per group of g channels:
 *   scale = max|x| / 127,  q = clamp(round(x / scale), -127, 127),  x ~ scale * q.
 * Rounding to nearest makes |x - scale*q| <= scale/2. Why per group and not per
 * tensor: one outlier channel would otherwise blow up the scale of everything.
 * Why -127 and not -128: a symmetric range keeps 0 exact and makes
 * q(-x) = -q(x).
 * An all-zero group gets scale 0 and q = 0: no division by zero. */
KVT_HD float quantize_group(const float *x, int8_t *q, int g) {
    float amax = 0.0f;
    for (int i = 0; i < g; i++) amax = fmaxf(amax, fabsf(x[i]));
    float scale = amax / 127.0f;
    for (int i = 0; i < g; i++) {
        float v = scale > 0.0f ? roundf(x[i] / scale) : 0.0f;
        v = v != v ? 0.0f : fminf(127.0f, fmaxf(-127.0f, v)); /* NaN -> 0, clamp */
        q[i] = (int8_t)v;
    }
    return scale;
}

uint16_t kvt_f32_to_f16(float x) { return f32_to_f16(x); }
float kvt_f16_to_f32(uint16_t h) { return f16_to_f32(h); }
float kvt_quantize_group(const float *x, int8_t *q, int g) { return quantize_group(x, q, g); }

/* Bits per stored value, and bytes of n values (n even: a 4-bit type would pack two per byte). */
static size_t kvt_dtype_bits(kvt_dtype t) { return t == KVT_FP32 ? 32 : t == KVT_FP16 ? 16 : 8; }
static size_t kvt_dtype_size(kvt_dtype t, size_t n) { return n * kvt_dtype_bits(t) / 8; }
static const char *kvt_dtype_name(kvt_dtype t) { return t == KVT_FP32 ? "fp32" : t == KVT_FP16 ? "fp16" : "int8"; }

// §6 the KV chunk pool, sequences ---------------------------------------------
/* Picture of the cache:
 *
 *   sequence (kvt_seq)          pool (kvt_pool): n_chunks chunks of CH positions
 *   table: [ 7 | 2 | 5 ]  --->  chunk 2: layer 0: K (CH, NKV, HS)  V (CH, NKV, HS)
 *   len:   2*CH + 3                      layer 1: K ...            V ...
 *                                        ...
 *   position t lives in chunk table[t / CH], slot t % CH.
 *
 * Why chunks: a sequence takes memory as it grows, one chunk at a time, instead
 * of reserving TMAX positions up front; at most CH-1 slots per sequence sit
 * unused. CH = TMAX is the classic preallocated contiguous buffer, so the same
 * code shows both strategies. Free chunks sit on a stack (free_list). Each chunk
 * has a reference count so that sequences can share chunks (kvt_seq_fork); a
 * shared chunk is copied before anyone writes into it (copy-on-write). */
#define KVT_LIMIT_CHUNKS (1 << 28) /* chunks in a pool; chunk-table entries of an engine */

/* A pool is made in two steps, so that an engine can check the sizes of
 * everything it needs before it allocates any of it: pool_shape (the fields and
 * the bytes, no memory), then pool_alloc. */
static kvt_status pool_shape(kvt_pool *p, int gpu, int L, int NKV, int HS, int CH,
                             int n_chunks, kvt_dtype dt, int G, size_t *data_bytes, size_t *scale_bytes) {
    memset(p, 0, sizeof(*p));
    p->L = L; p->NKV = NKV; p->HS = HS; p->CH = CH; p->n_chunks = n_chunks;
    p->dtype = dt; p->G = G; p->on_device = gpu;
    *data_bytes = *scale_bytes = 0;
    kvt_status st = kvt_bytes(&p->chunk_elems, "a KV cache chunk", 2 * (size_t)L, (size_t)CH, (size_t)NKV, (size_t)HS);
    p->chunk_scales = dt == KVT_INT8 ? p->chunk_elems / (size_t)G : 0;
    if (st == KVT_OK)
        st = kvt_bytes(data_bytes, "the KV cache pool", kvt_dtype_size(dt, p->chunk_elems), (size_t)n_chunks, 1, 1);
    if (st == KVT_OK)
        st = kvt_bytes(scale_bytes, "the int8 KV scales", p->chunk_scales, sizeof(float), (size_t)n_chunks, 1);
    return st;
}
/* The pool's memory, in one piece per array (sizes from pool_shape, checked
 * there): the chunks' data, int8 scales, and the host-side bookkeeping (free
 * list, refcounts, prefix hashes). Every chunk starts on the free list. */
static kvt_status pool_alloc(kvt_pool *p, size_t data_bytes, size_t scale_bytes) {
    int gpu = p->on_device, n_chunks = p->n_chunks;
    kvt_status st = buf_alloc(gpu, &p->data, data_bytes, "the KV cache pool");
    if (st == KVT_OK && p->dtype == KVT_INT8) {
        void *s;
        st = buf_alloc(gpu, &s, scale_bytes, "the int8 KV scales");
        p->scales = (float *)s;
    }
    if (st != KVT_OK) { buf_free(gpu, p->data); p->data = NULL; return st; }
    p->refcount = (int *)kvt_malloc((size_t)n_chunks * sizeof(int));
    p->free_list = (int *)kvt_malloc((size_t)n_chunks * sizeof(int));
    p->prefix_hash = (uint64_t *)calloc((size_t)n_chunks, sizeof(uint64_t));
    KVT_ASSERT(p->prefix_hash);
    for (int i = 0; i < n_chunks; i++) {
        p->refcount[i] = 0;
        p->free_list[i] = n_chunks - 1 - i; /* pop order 0, 1, 2, ...: easy to follow in gdb */
    }
    p->n_free = n_chunks;
    return KVT_OK;
}
/* The host swap area: n_swap slots of one chunk (data, scales, its prefix
 * hash), in host memory on either device; every slot starts free. */
static size_t pool_chunk_bytes(const kvt_pool *p) { return kvt_dtype_size(p->dtype, p->chunk_elems); }
static kvt_status pool_swap_alloc(kvt_pool *p, int n_swap) {
    p->n_swap = p->n_swap_free = n_swap;
    if (n_swap == 0) return KVT_OK;
    kvt_status st = buf_alloc(0, (void **)&p->swap_data, pool_chunk_bytes(p) * (size_t)n_swap, "the host swap area");
    if (st == KVT_OK && p->chunk_scales)
        st = buf_alloc(0, (void **)&p->swap_scales, p->chunk_scales * sizeof(float) * (size_t)n_swap,
                       "the host swap area's int8 scales");
    if (st != KVT_OK) return st;
    p->swap_free = (int *)kvt_malloc((size_t)n_swap * sizeof(int));
    p->swap_hash = (uint64_t *)calloc((size_t)n_swap, sizeof(uint64_t));
    KVT_ASSERT(p->swap_hash);
    for (int i = 0; i < n_swap; i++) p->swap_free[i] = n_swap - 1 - i;
    return KVT_OK;
}
static void pool_free(kvt_pool *p) {
    buf_free(p->on_device, p->data);
    buf_free(p->on_device, p->scales);
    free(p->refcount);
    free(p->free_list);
    free(p->prefix_hash);
    free(p->swap_data);
    free(p->swap_scales);
    free(p->swap_free);
    free(p->swap_hash);
    memset(p, 0, sizeof(*p));
}
/* Take a free chunk for one holder: the top of the free list (a stack), its
 * refcount 1; peak_used keeps the most chunks in use at once (--stats). */
static int pool_take(kvt_pool *p) { /* caller checked n_free > 0 */
    KVT_ASSERT(p->n_free > 0);
    int id = p->free_list[--p->n_free];
    KVT_ASSERT(p->refcount[id] == 0);
    p->refcount[id] = 1;
    int used = p->n_chunks - p->n_free;
    if (used > p->peak_used) p->peak_used = used;
    return id;
}
/* One holder fewer. A chunk returns to the free list only when its last
 * holder lets go: a forked sequence's shared prefix stays while any fork
 * still uses it. A freed chunk's prefix hash is forgotten with it. */
static void pool_release(kvt_pool *p, int id) {
    KVT_ASSERT(id >= 0 && id < p->n_chunks && p->refcount[id] > 0);
    if (--p->refcount[id] == 0) {
        p->free_list[p->n_free++] = id;
        p->prefix_hash[id] = 0; /* its contents are about to be overwritten */
    }
}
/* Copy chunk src into chunk dst (data and scales), on whichever device holds them. */
static void pool_copy_chunk(kvt_pool *p, int dst, int src) {
    size_t eb = kvt_dtype_size(p->dtype, p->chunk_elems), sn = p->chunk_scales;
    char *d = (char *)p->data;
    buf_copy(p->on_device, d + (size_t)dst * eb, d + (size_t)src * eb, eb);
    if (sn) buf_copy(p->on_device, p->scales + (size_t)dst * sn, p->scales + (size_t)src * sn, sn * sizeof(float));
}

/* 1 when growing s past s->len writes into a shared, partly filled chunk. */
static int seq_needs_cow(const kvt_pool *p, const kvt_seq *s, int new_len) {
    return s->len % p->CH != 0 && new_len > s->len && p->refcount[s->table[s->len / p->CH]] > 1;
}
/* Chunks s must take from the pool to hold positions [0, new_len). */
static int seq_chunks_needed(const kvt_pool *p, const kvt_seq *s, int new_len) {
    return kvt_cdiv(new_len, p->CH) - s->n_table + seq_needs_cow(p, s, new_len);
}

/* Make room for positions [0, new_len) of s: one chunk per CH positions, plus a
 * private copy of a shared chunk that the next position would be written into.
 * Nothing changes unless all of it fits (so an exhausted pool loses nothing). */
static kvt_status seq_reserve(kvt_pool *p, kvt_seq *s, int new_len, const char *who) {
    int want = kvt_cdiv(new_len, p->CH), cow = seq_needs_cow(p, s, new_len);
    int need = seq_chunks_needed(p, s, new_len);
    if (need > p->n_free)
        return kvt_fail(KVT_EPOOL, "KV cache pool exhausted: %s needs %d more chunk(s) of %d positions "
                        "to reach %d positions, but only %d of %d chunks are free; raise --chunks "
                        "(or use a larger --chunk)", who, need, p->CH, new_len, p->n_free, p->n_chunks);
    if (cow) { /* copy-on-write: the partly filled last chunk is shared */
        int i = s->len / p->CH, fresh = pool_take(p);
        pool_copy_chunk(p, fresh, s->table[i]);
        pool_release(p, s->table[i]);
        s->table[i] = fresh;
        s->how[i] = 'c'; /* remembered for kvt_pool_print only */
        p->cow_copies++;
    }
    for (; s->n_table < want; s->n_table++) {
        s->table[s->n_table] = pool_take(p);
        s->how[s->n_table] = 0;
    }
    return KVT_OK;
}

/* Prefix reuse (as in vLLM's automatic prefix caching): the K/V of a full chunk
 * depend only on the tokens up to its end, so a chunk can be named by a hash of
 * those tokens. A new sequence whose prompt starts with the same full chunks as
 * a live sequence points its table at those chunks instead of recomputing them.
 * FNV-1a over the token ids; a lookup scans the pool (small and plain). */
int kvt_prefix_hash_bits = 64; /* the tests' hook (kvtransformer.h): fewer bits, more collisions */
/* The name of tokens[0 .. n): FNV-1a from h = 1469598103934665603, for each
 * id h ^= (uint32_t)id then h *= 1099511628211; kept to its low
 * kvt_prefix_hash_bits bits, and never 0 (which means "no hash": 0 -> 1). */
static uint64_t prefix_hash_of(const int *tokens, int n) {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) { h ^= (uint32_t)tokens[i]; h *= 1099511628211ULL; }
    if (kvt_prefix_hash_bits < 64) h &= (1ULL << kvt_prefix_hash_bits) - 1;
    return h ? h : 1; /* 0 means "no hash" */
}
/* A hash can collide: a hit is used only when some live sequence holds chunk c
 * as its entry k and its tokens up to the chunk's end are ours. */
static int prefix_confirmed(const kvt_pool *p, const kvt_seq *live, int c, int k, const int *tokens) {
    size_t n = (size_t)(k + 1) * (size_t)p->CH;
    for (const kvt_seq *h = live; h; h = h->live_next)
        if (h->n_table > k && h->table[k] == c && (size_t)h->len >= n && !memcmp(h->tokens, tokens, n * sizeof(int)))
            return 1;
    return 0;
}
/* Attach the live chunks that hold a prefix of tokens[0..n) to the empty s;
 * the last token is always left to compute (its logits are wanted). live: the
 * engine's list of live sequences, to confirm each hit. Returns the number of
 * positions attached. */
static int prefix_attach(kvt_pool *p, const kvt_seq *live, kvt_seq *s, const int *tokens, int n) {
    int k = 0;
    KVT_ASSERT(s->len == 0 && s->n_table == 0);
    while ((k + 1) * p->CH <= n - 1) {
        uint64_t h = prefix_hash_of(tokens, (k + 1) * p->CH);
        int hit = -1;
        for (int c = 0; c < p->n_chunks && hit < 0; c++)
            if (p->refcount[c] > 0 && p->prefix_hash[c] == h) {
                if (prefix_confirmed(p, live, c, k, tokens)) hit = c;
                else p->prefix_collisions++;
            }
        if (hit < 0) break;
        s->how[k] = '+';
        s->table[k++] = hit;
        p->refcount[hit]++;
    }
    p->prefix_hits += k;
    p->prefix_misses += kvt_cdiv(n, p->CH) - k;
    s->n_table = k;
    s->len = k * p->CH;
    memcpy(s->tokens, tokens, (size_t)s->len * sizeof(int));
    return s->len;
}
/* Name the chunks of s that became full since it had old_len positions
 * (prefix_hash of the chunk: the hash of all tokens up to its end); a chunk
 * that has a name already keeps it. */
static void prefix_register(kvt_pool *p, const kvt_seq *s, int old_len) {
    for (int i = old_len / p->CH; (i + 1) * p->CH <= s->len; i++)
        if (p->prefix_hash[s->table[i]] == 0) p->prefix_hash[s->table[i]] = prefix_hash_of(s->tokens, (i + 1) * p->CH);
}

/* Swap to host memory (vLLM's swap preemption; the seeds' CPU offload). A
 * sequence that must make room gives up the chunks it alone holds: each is
 * copied into a slot of the host swap area and freed, and its table entry
 * becomes KVT_SWAPPED(slot). A chunk shared with another sequence (a system
 * prompt attached by prefix reuse) frees nothing when one holder lets go, so
 * it stays where it is, pinned by the swapped sequence's reference. Swapping
 * back needs exactly the chunks given up; they may come back under other ids
 * (the table says where a position lives, so nothing else has to change). On
 * the GPU the copies cross the host link (PCIe); on the CPU they are memcpy. */
static void swap_copy(kvt_pool *p, int slot, int chunk, int out) {
    size_t eb = pool_chunk_bytes(p), sn = p->chunk_scales;
    char *dev = (char *)p->data + (size_t)chunk * eb, *host = p->swap_data + (size_t)slot * eb;
    if (out) buf_download(p->on_device, host, dev, eb);
    else buf_upload(p->on_device, dev, host, eb);
    if (!sn) return;
    float *ds = p->scales + (size_t)chunk * sn, *hs = p->swap_scales + (size_t)slot * sn;
    if (out) buf_download(p->on_device, hs, ds, sn * sizeof(float));
    else buf_upload(p->on_device, ds, hs, sn * sizeof(float));
}
static int seq_private_chunks(const kvt_pool *p, const kvt_seq *s) {
    int n = 0;
    for (int i = 0; i < s->n_table; i++) n += s->table[i] >= 0 && p->refcount[s->table[i]] == 1;
    return n;
}
static kvt_status seq_swap_out(kvt_pool *p, kvt_seq *s) {
    int need = seq_private_chunks(p, s);
    if (s->n_swapped) return kvt_fail(KVT_EARG, "sequence %d is swapped out already", s->id);
    if (need > p->n_swap_free)
        return kvt_fail(KVT_EPOOL, "host swap area full: sequence %d needs %d slot(s), %d of %d are free", s->id,
                        need, p->n_swap_free, p->n_swap);
    double t0 = kvt_now();
    for (int i = 0; i < s->n_table; i++) {
        int c = s->table[i];
        if (c < 0 || p->refcount[c] != 1) continue; /* shared: stays, pinned */
        int slot = p->swap_free[--p->n_swap_free];
        swap_copy(p, slot, c, 1);
        p->swap_hash[slot] = p->prefix_hash[c];
        pool_release(p, c); /* refcount 1 -> 0: back on the free list */
        s->table[i] = KVT_SWAPPED(slot);
        s->n_swapped++;
    }
    p->swap_out_chunks += s->n_swapped;
    p->t_swap_out += kvt_now() - t0;
    return KVT_OK;
}
static kvt_status seq_swap_in(kvt_pool *p, kvt_seq *s) {
    if (s->n_swapped > p->n_free)
        return kvt_fail(KVT_EPOOL, "KV cache pool exhausted: sequence %d needs %d chunk(s) to swap in, %d of %d are "
                        "free", s->id, s->n_swapped, p->n_free, p->n_chunks);
    double t0 = kvt_now();
    for (int i = 0; i < s->n_table; i++) {
        if (s->table[i] > -2) continue;
        int slot = KVT_SWAP_SLOT(s->table[i]), c = pool_take(p);
        swap_copy(p, slot, c, 0);
        p->prefix_hash[c] = p->swap_hash[slot];
        p->swap_hash[slot] = 0;
        p->swap_free[p->n_swap_free++] = slot;
        s->table[i] = c;
    }
    p->swap_in_chunks += s->n_swapped;
    s->n_swapped = 0;
    p->t_swap_in += kvt_now() - t0;
    return KVT_OK;
}
/* A sequence that is dropped while swapped out gives its slots back. */
static void swap_release(kvt_pool *p, int entry) {
    int slot = KVT_SWAP_SLOT(entry);
    KVT_ASSERT(slot >= 0 && slot < p->n_swap);
    p->swap_hash[slot] = 0;
    p->swap_free[p->n_swap_free++] = slot;
}

// §7 embedding ------------------------------------------------------------------
/* x[r, :] = token_embedding[tokens[r], :]        PyTorch: x = emb(tokens)
 * tokens (n), table (V, D) -> x (n, D). Tokens were range-checked by the caller. */
static void embed_cpu(float *x, const float *table, const int *tokens, int n, int D) {
    for (int r = 0; r < n; r++)
        memcpy(x + (size_t)r * D, table + (size_t)tokens[r] * D, (size_t)D * sizeof(float));
}
/* grid (n), block (KVT_THREADS): one block per row, threads stride over channels. */
__global__ void embed_kernel(float *x, const float *table, const int *tokens, int n, int D) {
    int r = (int)blockIdx.x;
    if (r >= n) return;
    for (int c = (int)threadIdx.x; c < D; c += (int)blockDim.x)
        x[(size_t)r * D + c] = table[(size_t)tokens[r] * D + c];
}
static void embed_gpu(float *x, const float *table, const int *tokens, int n, int D) {
    KVT_LAUNCH(embed_kernel, n, 1, KVT_THREADS, x, table, tokens, n, D);
}

// §8 rmsnorm ---------------------------------------------------------------------
/* out = x / sqrt(mean(x^2) + eps) * w             PyTorch: F.rms_norm(x, (D,), w, 1e-5)
 * Zhang & Sennrich 2019. x (n, D), w (D) -> out (n, D). out may equal x. */
#define KVT_RMS_EPS 1e-5f
static void rmsnorm_cpu(float *out, const float *x, const float *w, int n, int D) {
#pragma omp parallel for if ((long)n * D > 32768) /* rows are independent (a prefill has hundreds) */
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * D;
        float ss = 0.0f;
        for (int c = 0; c < D; c++) ss += xr[c] * xr[c];
        float inv = 1.0f / sqrtf(ss / (float)D + KVT_RMS_EPS);
        for (int c = 0; c < D; c++) out[(size_t)r * D + c] = w[c] * (xr[c] * inv);
    }
}
/* grid (n), block (KVT_THREADS): one block per row; each thread sums the squares
 * of its channels, block_reduce adds the partial sums, then each thread scales
 * its channels. A thread reads x[c] before writing out[c], so out == x is safe. */
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int n, int D) {
    int r = (int)blockIdx.x;
    const float *xr = x + (size_t)r * D;
    float ss = 0.0f;
    for (int c = (int)threadIdx.x; c < D; c += (int)blockDim.x) ss += xr[c] * xr[c];
    ss = block_reduce(ss, KVT_SUM); /* every thread of the block must reach this */
    float inv = 1.0f / sqrtf(ss / (float)D + KVT_RMS_EPS);
    for (int c = (int)threadIdx.x; c < D; c += (int)blockDim.x) out[(size_t)r * D + c] = w[c] * (xr[c] * inv);
    (void)n;
}
static void rmsnorm_gpu(float *out, const float *x, const float *w, int n, int D) {
    KVT_LAUNCH(rmsnorm_kernel, n, 1, KVT_THREADS, out, x, w, n, D);
}

// §9 matmul ----------------------------------------------------------------------
/* out = x @ w^T                                   PyTorch: F.linear(x, w)
 * x (n, k), w (d, k) (rows = outputs, as nn.Linear stores them) -> out (n, d).
 * Decode (n = 1) reads every weight once to do 2 flops with it: the speed limit
 * is memory bandwidth, which is why a small KV cache read next to it is cheap.
 * A batch of n decode rows does 2n flops per weight read, so up to a few rows
 * are nearly free; only around n ~ 8-16 does arithmetic become the limit here.
 *
 * The spec is matmul_spec_cpu, a dot product per output. The CPU path the
 * engine runs: tuned loops of our own for decode and batches (matmul_rows_cpu:
 * each weight row read from memory once for all n rows, one weight row at a
 * time up to KVT_ROW_X rows, tiles of 4 weight rows from there; with the
 * vector type kvt_vec that attention uses too, they are in cpu/matmul.c,
 * included here), OpenBLAS's sgemm for prefill pieces of KVT_SGEMM_ROWS rows
 * and more. --plain runs the spec instead of the tuned loops. */
static void matmul_spec_cpu(float *out, const float *x, const float *w, int n, int k, int d) {
    /* weight row i is read once from memory and stays in cache for the n rows of x */
#pragma omp parallel for schedule(static) if ((long)n * d * k > 65536)
    for (int i = 0; i < d; i++)
        for (int r = 0; r < n; r++) {
            const float *wi = w + (size_t)i * k, *xr = x + (size_t)r * k;
            float s = 0.0f;
            for (int c = 0; c < k; c++) s += wi[c] * xr[c];
            out[(size_t)r * d + i] = s;
        }
}
#include "cpu/matmul.c" /* also prefill's sgemm split over the cores, matmul_sgemm_cpu */

/* The CPU's matmul: our own loops for decode and small batches (each weight
 * row read from memory once for all rows of x), OpenBLAS sgemm from
 * KVT_SGEMM_ROWS rows on, where its blocking for the caches wins
 * (`--bench matmul` prints the crossover). */
static void matmul_cpu(float *out, const float *x, const float *w, int n, int k, int d) {
    if (n >= KVT_SGEMM_ROWS && !kvt_blas_generic()) matmul_sgemm_cpu(out, x, w, n, k, d);
    else matmul_rows_cpu(out, x, w, n, k, d);
}
/* --plain: the spec's loop where the tuned loops would run (sgemm stays for
 * prefill: a plain loop there would make a long prompt crawl). */
static void matmul_plain_cpu(float *out, const float *x, const float *w, int n, int k, int d) {
    if (n >= KVT_SGEMM_ROWS && !kvt_blas_generic()) matmul_sgemm_cpu(out, x, w, n, k, d);
    else matmul_spec_cpu(out, x, w, n, k, d);
}

/* The kernels matmul_gpu runs for decode and batches of up to 16 rows (each
 * weight read once for all rows of x, 16-byte loads, sums in registers) are
 * machine tuning: gpu/matmul.cu, included here. */
#include "gpu/matmul.cu"

/* Prefill kernel, the textbook tiled matmul. grid (ceil(d/TILE), ceil(n/TILE)),
 * block (TILE*TILE): thread (ty, tx) computes out[row0+ty][col0+tx]. The k axis
 * is walked in TILE-wide steps; each step loads a TILE x TILE tile of x and of w
 * into shared memory (each thread loads one element of each), so every element
 * loaded from global memory is used TILE times.
 *   first barrier: the tiles are complete before anyone reads them;
 *   second barrier: nobody overwrites a tile another thread still reads. */
__global__ void matmul_tiled_kernel(float *out, const float *x, const float *w, int n, int k, int d) {
    __shared__ float xs[KVT_TILE][KVT_TILE + 1];
    __shared__ float ws[KVT_TILE][KVT_TILE + 1];
    int tx = (int)threadIdx.x % KVT_TILE, ty = (int)threadIdx.x / KVT_TILE;
    int row = (int)blockIdx.y * KVT_TILE + ty;    /* row of x and out */
    int col = (int)blockIdx.x * KVT_TILE + tx;    /* output column = row of w */
    int wrow = (int)blockIdx.x * KVT_TILE + ty;   /* the w row this thread loads */
    float acc = 0.0f;
    /* Out-of-range loads read 0, so partial tiles at the edges need no special
     * case in the inner loop (0 * anything adds nothing). */
    for (int k0 = 0; k0 < k; k0 += KVT_TILE) {
        xs[ty][tx] = row < n && k0 + tx < k ? x[(size_t)row * k + k0 + tx] : 0.0f;
        ws[ty][tx] = wrow < d && k0 + tx < k ? w[(size_t)wrow * k + k0 + tx] : 0.0f;
        __syncthreads();
        for (int j = 0; j < KVT_TILE; j++) acc += xs[ty][j] * ws[tx][j];
        __syncthreads();
    }
    if (row < n && col < d) out[(size_t)row * d + col] = acc;
}
static void matmul_tiled_gpu(float *out, const float *x, const float *w, int n, int k, int d) {
    KVT_LAUNCH(matmul_tiled_kernel, kvt_cdiv(d, KVT_TILE), kvt_cdiv(n, KVT_TILE), KVT_TILE * KVT_TILE,
               out, x, w, n, k, d);
}
/* The plain decode kernel, matmul_spec_cpu's loop with one thread per output:
 * thread (i, r) computes out[r][i], a whole dot product. grid (ceil(d /
 * KVT_THREADS), n), block (KVT_THREADS). Neighbouring threads read weight rows
 * k floats apart, so a warp's 32 loads share no memory transaction and the
 * kernel runs far below the bandwidth: the tuned kernels (gpu/matmul.cu) make
 * a warp read one row together. --plain runs it for decode and small batches. */
__global__ void matmul_dot_kernel(float *out, const float *x, const float *w, int n, int k, int d) {
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x), r = (int)blockIdx.y;
    if (i >= d || r >= n) return;
    float s = 0.0f;
    for (int c = 0; c < k; c++) s += w[(size_t)i * k + c] * x[(size_t)r * k + c];
    out[(size_t)r * d + i] = s;
}
static void matmul_plain_gpu(float *out, const float *x, const float *w, int n, int k, int d) {
    if (n > KVT_MB_X) matmul_tiled_gpu(out, x, w, n, k, d); /* prefill: the tiled kernel, as without --plain */
    else KVT_LAUNCH(matmul_dot_kernel, kvt_cdiv(d, KVT_THREADS), n, KVT_THREADS, out, x, w, n, k, d);
}
/* Decode and small batches (up to 2 passes of KVT_MV_X rows) read the weights
 * with the rows kernel, batches of up to 16 rows with the batch kernel (one
 * pass); prefill reuses each loaded tile of weights KVT_TILE times. */
static void matmul_gpu(float *out, const float *x, const float *w, int n, int k, int d) {
    if (n <= 2 * KVT_MV_X) matmul_rows_gpu(out, x, w, n, k, d);
    else if (n <= KVT_MB_X) matmul_batch_gpu(out, x, w, n, k, d);
    else matmul_tiled_gpu(out, x, w, n, k, d);
}

// §10 rope, kv write (+ quantize) -------------------------------------------------
/* RoPE (Su et al. 2021): inside each head, channels (2i, 2i+1) are a point in the
 * plane, rotated by the angle pos * freq[i], freq[i] = theta^(-2i/HS), theta the
 * model's RoPE base (10000 unless its checkpoint says otherwise, §4). The dot
 * product of a rotated q and k then depends only on their distance in
 * positions. This is llama2.c's (and Meta's) adjacent-pair layout, not the
 * "rotate_half" layout of HF exports. The frequencies depend only on the
 * channel, so the engine computes them once (rope_freqs, in float64) and each
 * row computes one cosine and sine per channel pair, shared by all its heads.
 * q (n, NH*HS), k (n, NKV*HS), freq (HS/2), row_pos (n): rotated in place. */
static void rope_freqs(float *freq, int HS, double theta) {
    for (int i = 0; i < HS / 2; i++) freq[i] = (float)pow(theta, -2.0 * i / HS);
}
KVT_HD void rope_rotate(float *v, float cs, float sn) { /* v[0], v[1]: one channel pair */
    float x0 = v[0], x1 = v[1];
    v[0] = x0 * cs - x1 * sn;
    v[1] = x0 * sn + x1 * cs;
}
/* Each row's angle for channel pair i is its position times freq[i] (the
 * table of rope_freqs, computed once per engine); one cos/sin pair serves
 * every query head and every kv head of the row. Only the row's own position
 * matters: a cached K was rotated once, when it was written. */
static void rope_cpu(float *q, float *k, const float *freq, const int *row_pos, int n, int NH, int NKV, int HS) {
#pragma omp parallel for if (n > 8)
    for (int r = 0; r < n; r++)
        for (int i = 0; i < HS / 2; i++) {
            float a = (float)row_pos[r] * freq[i], cs = cosf(a), sn = sinf(a);
            for (int h = 0; h < NH; h++) rope_rotate(q + ((size_t)r * NH + h) * HS + 2 * i, cs, sn);
            for (int h = 0; h < NKV; h++) rope_rotate(k + ((size_t)r * NKV + h) * HS + 2 * i, cs, sn);
        }
}
/* grid (row_blocks(pairs), n), block (KVT_THREADS): the threads of row
 * blockIdx.y rotate pairs j of its q heads, then k heads, (NH + NKV) * HS / 2
 * pairs, in a grid-stride loop (as swiglu_kernel, §13). */
__global__ void rope_kernel(float *q, float *k, const float *freq, const int *row_pos, int n, int NH, int NKV,
                            int HS) {
    int r = (int)blockIdx.y;
    for (int j = (int)(blockIdx.x * blockDim.x + threadIdx.x); j < (NH + NKV) * HS / 2; j += (int)(gridDim.x * blockDim.x)) {
        int i = 2 * j, c = i % HS; /* c: the pair's first channel within its head */
        float a = (float)row_pos[r] * freq[c / 2], cs = cosf(a), sn = sinf(a);
        if (i < NH * HS) rope_rotate(q + (size_t)r * NH * HS + i, cs, sn);
        else rope_rotate(k + (size_t)r * NKV * HS + (i - NH * HS), cs, sn);
    }
    (void)n;
}
static void rope_gpu(float *q, float *k, const float *freq, const int *row_pos, int n, int NH, int NKV, int HS) {
    KVT_LAUNCH(rope_kernel, row_blocks((NH + NKV) * HS / 2), n, KVT_THREADS, q, k, freq, row_pos, n, NH, NKV, HS);
}

/* The cache as the attention and kv-write code sees it: the pool's storage plus,
 * for each of the n rows of this call, where its sequence's chunk table starts
 * in `tables`, its position, and its sequence's length after this call. Rows of
 * one call may belong to different sequences (batched decode). */
typedef struct {
    void *data;          /* pool storage (n_chunks, L, 2, CH, NKV, HS), dtype */
    float *scales;       /* int8: one per G consecutive elements of data */
    int dtype, G, CH, NKV, HS;
    int HG;              /* int8 scales per head row, HS / G: loops step by it, no division per key */
    size_t chunk_elems;  /* L * 2 * CH * NKV * HS */
    const int *tables;   /* chunk tables of the sequences in this call, concatenated */
    const int *row_tab;  /* (n) offset of row r's table in tables */
    const int *row_pos;  /* (n) position of row r */
    const int *row_len;  /* (n) length of row r's sequence once this call is done */
    char *work;          /* the CPU's tiled attention: work_bytes of scratch per thread (the engine's) */
    size_t work_bytes;
    int work_threads;    /* threads that have scratch: its parallel loop uses at most this many */
} kvt_kv;
/* The one place a kvt_kv is filled in: the storage and shape of pool p, with
 * these chunk tables and rows (NULL where the caller has no rows). A field
 * added to kvt_kv is set here, or is 0 everywhere. */
static kvt_kv kv_view(const kvt_pool *p, const int *tables, const int *row_tab, const int *row_pos,
                      const int *row_len) {
    kvt_kv kv;
    memset(&kv, 0, sizeof(kv)); /* (not = {0}: C++ compilers, nvcc's host pass, warn on it) */
    kv.data = p->data;
    kv.scales = p->scales;
    kv.dtype = (int)p->dtype;
    kv.G = p->G;
    kv.CH = p->CH;
    kv.NKV = p->NKV;
    kv.HS = p->HS;
    kv.HG = p->G > 0 ? p->HS / p->G : 0;
    kv.chunk_elems = p->chunk_elems;
    kv.tables = tables;
    kv.row_tab = row_tab;
    kv.row_pos = row_pos;
    kv.row_len = row_len;
    return kv;
}

/* Element index in the pool of channel 0 of head h, K (which 0) or V (1), of
 * layer l, at position pos of the sequence whose table starts at tables[tab]. */
KVT_HD size_t kv_index(const kvt_kv *kv, int l, int which, int tab, int pos, int h) {
    int chunk = kv->tables[tab + pos / kv->CH], slot = pos % kv->CH;
    return (size_t)chunk * kv->chunk_elems +
           ((size_t)(l * 2 + which) * kv->CH + slot) * (size_t)(kv->NKV * kv->HS) + (size_t)h * kv->HS;
}
/* One cached value as fp32: this is where fp16 and int8 are decoded, inside the
 * attention loops ("in registers"), never in a separate pass over the cache. */
/* (si: the int8 scale's index, i / G. A kernel that walks many rows finds each
 * row's first scale once, since rows start on a group boundary, and adds c / G
 * for channel c: no 64-bit division per value.) */
KVT_HD float kv_load_at(const kvt_kv *kv, size_t i, size_t si) {
    if (kv->dtype == KVT_FP32) return ((const float *)kv->data)[i];
    if (kv->dtype == KVT_FP16) return f16_to_f32(((const uint16_t *)kv->data)[i]);
    return (float)((const int8_t *)kv->data)[i] * kv->scales[si];
}
KVT_HD float kv_load(const kvt_kv *kv, size_t i) {
    return kv_load_at(kv, i, kv->scales ? i / (size_t)kv->G : 0);
}
/* The two loops attention spends its time in, over one cached row of HS
 * values starting at element i: a dot product with q, and acc += w * row.
 * Same values as kv_load, but the type test sits outside the loop and int8
 * applies one scale per group of G (sum q*k in integers' units, then scale),
 * which keeps the CPU path fast enough to measure. */
KVT_HD float kv_dot(const kvt_kv *kv, size_t i, const float *q, int HS) {
    float s = 0.0f;
    if (kv->dtype == KVT_FP32) {
        const float *k = (const float *)kv->data + i;
#pragma omp simd reduction(+ : s) /* the CPU may add in vector lanes (an order of its own) */
        for (int c = 0; c < HS; c++) s += q[c] * k[c];
    } else if (kv->dtype == KVT_FP16) {
        const uint16_t *k = (const uint16_t *)kv->data + i;
        for (int c = 0; c < HS; c++) s += q[c] * f16_to_f32(k[c]);
    } else {
        const int8_t *k = (const int8_t *)kv->data + i;
        for (int g = 0; g < HS; g += kv->G) {
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (int c = g; c < g + kv->G; c++) part += q[c] * (float)k[c];
            s += part * kv->scales[(i + (size_t)g) / (size_t)kv->G];
        }
    }
    return s;
}
/* acc (HS) += w * the stored row at element i, decoded like kv_dot: the
 * attention's weighted sum of V, one row at a time (the spec, which §11 and
 * §12's spec use; the tuned kv_rows_axpy_cpu does many rows per pass). */
KVT_HD void kv_axpy(const kvt_kv *kv, size_t i, float w, float *acc, int HS) {
    if (kv->dtype == KVT_FP32) {
        const float *v = (const float *)kv->data + i;
        for (int c = 0; c < HS; c++) acc[c] += w * v[c];
    } else if (kv->dtype == KVT_FP16) {
        const uint16_t *v = (const uint16_t *)kv->data + i;
        for (int c = 0; c < HS; c++) acc[c] += w * f16_to_f32(v[c]);
    } else {
        const int8_t *v = (const int8_t *)kv->data + i;
        for (int g = 0; g < HS; g += kv->G) {
            float ws = w * kv->scales[(i + (size_t)g) / (size_t)kv->G];
            for (int c = g; c < g + kv->G; c++) acc[c] += ws * (float)v[c];
        }
    }
}

/* The CPU's tuned attention loops are in cpu/attention.c, included here:
 * vector loops over cached rows (fp16 and int8 converted in registers, four
 * dot products at a time, V summed 32 channels at a time, prefetch, e^x) and
 * §12's tiled loop that runs on them (attention_piece_cpu). */
#include "cpu/attention.c"

/* Store `count` values at element i: copy, round to half, or quantize as one
 * group (int8 callers pass count = G, so i is a multiple of G). */
KVT_HD void kv_store(const kvt_kv *kv, size_t i, const float *src, int count) {
    if (kv->dtype == KVT_FP32) {
        for (int c = 0; c < count; c++) ((float *)kv->data)[i + c] = src[c];
    } else if (kv->dtype == KVT_FP16) {
        for (int c = 0; c < count; c++) ((uint16_t *)kv->data)[i + c] = f32_to_f16(src[c]);
    } else {
        kv->scales[i / (size_t)kv->G] = quantize_group(src, (int8_t *)kv->data + i, count);
    }
}

/* Write the new rows' K and V into their chunks (quantizing on the way in).
 * k, v (n, KVD) -> pool slots at (layer l, row_pos[r]). The CPU stores a head's
 * row (HS values) at a time, or one group of G values for int8 (a scale covers
 * the whole group); a GPU thread stores one value, or one group for int8. */
static void kv_write_cpu(kvt_kv kv, const float *k, const float *v, int l, int n) {
    int unit = kv.dtype == KVT_INT8 ? kv.G : kv.HS, KVD = kv.NKV * kv.HS; /* the CPU stores a head's row at once */
#pragma omp parallel for if (n > 8) /* every row writes its own slot */
    for (int r = 0; r < n; r++)
        for (int which = 0; which < 2; which++)
            for (int h = 0; h < kv.NKV; h++) {
                size_t i = kv_index(&kv, l, which, kv.row_tab[r], kv.row_pos[r], h);
                for (int c = 0; c < kv.HS; c += unit)
                    kv_store(&kv, i + c, (which ? v : k) + (size_t)r * KVD + h * kv.HS + c, unit);
            }
}
/* grid (row_blocks(units), n), block (KVT_THREADS): the threads of row
 * blockIdx.y store units u of its 2 * KVD / unit (K, then V) in a grid-stride
 * loop; a unit is one value, or one int8 group (which shares a scale). */
__global__ void kv_write_kernel(kvt_kv kv, const float *k, const float *v, int l, int n, int unit) {
    int r = (int)blockIdx.y, KVD = kv.NKV * kv.HS;
    for (int u = (int)(blockIdx.x * blockDim.x + threadIdx.x); u < 2 * KVD / unit; u += (int)(gridDim.x * blockDim.x)) {
        /* unit u -> K or V (which), then the element e of the row, its head and channel */
        int which = u / (KVD / unit), e = (u % (KVD / unit)) * unit, h = e / kv.HS, c = e % kv.HS;
        const float *src = (which ? v : k) + (size_t)r * KVD + e;
        kv_store(&kv, kv_index(&kv, l, which, kv.row_tab[r], kv.row_pos[r], h) + c, src, unit);
    }
    (void)n;
}
static void kv_write_gpu(kvt_kv kv, const float *k, const float *v, int l, int n) {
    int unit = kv.dtype == KVT_INT8 ? kv.G : 1;
    KVT_LAUNCH(kv_write_kernel, row_blocks(2 * kv.NKV * kv.HS / unit), n, KVT_THREADS, kv, k, v, l, n, unit);
}

// §11 attention, naive ------------------------------------------------------------
/* For row r (position p = row_pos[r]) and query head h, with kv head
 * kh = h / (NH/NKV) (grouped-query attention: NH/NKV query heads share one K/V):
 *   s[t] = q . K[t] / sqrt(HS) for t <= p,   s[t] = -inf for p < t < row_len[r]
 *   a = softmax(s),   out = sum_t a[t] V[t]
 * PyTorch: F.scaled_dot_product_attention(q, k, v, is_causal=True) only when
 * queries and keys are the same positions (a prefill from 0): PyTorch's causal
 * mask is aligned top-left, so one decode query at position p would see key 0
 * only. Here the mask compares positions (t <= p), which is right for both;
 * in PyTorch a decode step passes no mask at all. Vaswani 2017.
 * The naive form materializes the score row s (scores: (n, NH, TMAX)): simple,
 * and the reference for the fused form. Why -inf and not a large negative
 * number: exp(-inf) is exactly 0, so a masked position gets exactly no weight.
 * Positions after p exist in the cache when a prefill writes all its rows first:
 * the mask is what keeps row r from seeing its future.
 * out (n, NH*HS), q (n, NH*HS). */
static void attention_naive_cpu(float *out, const float *q, kvt_kv kv, int l, int n, int NH,
                                float *scores, int TMAX) {
    int HS = kv.HS, group = NH / kv.NKV;
    float scale = 1.0f / sqrtf((float)HS);
    /* every (row, head) is independent, with its own score row: one per core at a time */
#pragma omp parallel for collapse(2) schedule(dynamic) if (n * NH > 1)
    for (int r = 0; r < n; r++) {
        for (int h = 0; h < NH; h++) {
            int p = kv.row_pos[r], T = kv.row_len[r];
            const float *qh = q + ((size_t)r * NH + h) * HS;
            float *s = scores + ((size_t)r * NH + h) * TMAX;
            for (int t = 0; t < T; t++) {
                if (t > p) { s[t] = -INFINITY; continue; } /* the causal mask */
                size_t ki = kv_index(&kv, l, 0, kv.row_tab[r], t, h / group);
                s[t] = kv_dot(&kv, ki, qh, HS) * scale;
            }
            float mx = -INFINITY, sum = 0.0f; /* softmax, shifted by the max so exp never overflows */
            for (int t = 0; t < T; t++) mx = fmaxf(mx, s[t]);
            for (int t = 0; t < T; t++) { s[t] = expf(s[t] - mx); sum += s[t]; }
            for (int t = 0; t < T; t++) s[t] /= sum;
            float *oh = out + ((size_t)r * NH + h) * HS;
            for (int c = 0; c < HS; c++) oh[c] = 0.0f;
            for (int t = 0; t <= p; t++) kv_axpy(&kv, kv_index(&kv, l, 1, kv.row_tab[r], t, h / group), s[t], oh, HS);
        }
    }
}
/* The GPU version is three kernels with the score row in global memory.
 * 1) scores: grid (NH, n), block (KVT_THREADS): thread j computes s[t] for t = j, j+blockDim, ... */
__global__ void attn_scores_kernel(float *scores, const float *q, kvt_kv kv, int l, int NH, int TMAX) {
    int h = (int)blockIdx.x, r = (int)blockIdx.y, HS = kv.HS, p = kv.row_pos[r];
    const float *qh = q + ((size_t)r * NH + h) * HS;
    float *s = scores + ((size_t)r * NH + h) * TMAX, scale = 1.0f / sqrtf((float)HS);
    for (int t = (int)threadIdx.x; t < kv.row_len[r]; t += (int)blockDim.x) {
        if (t > p) { s[t] = -INFINITY; continue; }
        s[t] = kv_dot(&kv, kv_index(&kv, l, 0, kv.row_tab[r], t, h / (NH / kv.NKV)), qh, HS) * scale;
    }
}
/* 2) softmax: grid (NH, n), block (KVT_THREADS): a block-wide max, exp, a
 *    block-wide sum, divide. Each thread owns the same t's in every loop. */
__global__ void attn_softmax_kernel(float *scores, kvt_kv kv, int NH, int TMAX) {
    int h = (int)blockIdx.x, r = (int)blockIdx.y, T = kv.row_len[r];
    float *s = scores + ((size_t)r * NH + h) * TMAX;
    float mx = -INFINITY, sum = 0.0f;
    for (int t = (int)threadIdx.x; t < T; t += (int)blockDim.x) mx = fmaxf(mx, s[t]);
    mx = block_reduce(mx, KVT_MAX);
    for (int t = (int)threadIdx.x; t < T; t += (int)blockDim.x) { s[t] = expf(s[t] - mx); sum += s[t]; }
    sum = block_reduce(sum, KVT_SUM);
    for (int t = (int)threadIdx.x; t < T; t += (int)blockDim.x) s[t] /= sum;
}
/* 3) weighted sum: grid (NH, n), block (KVT_THREADS): thread c sums channel c. */
__global__ void attn_values_kernel(float *out, const float *scores, kvt_kv kv, int l, int NH, int TMAX) {
    int h = (int)blockIdx.x, r = (int)blockIdx.y, HS = kv.HS;
    const float *s = scores + ((size_t)r * NH + h) * TMAX;
    for (int c = (int)threadIdx.x; c < HS; c += (int)blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t <= kv.row_pos[r]; t++)
            acc += s[t] * kv_load(&kv, kv_index(&kv, l, 1, kv.row_tab[r], t, h / (NH / kv.NKV)) + c);
        out[((size_t)r * NH + h) * HS + c] = acc;
    }
}
static void attention_naive_gpu(float *out, const float *q, kvt_kv kv, int l, int n, int NH,
                                float *scores, int TMAX) {
    KVT_LAUNCH(attn_scores_kernel, NH, n, KVT_THREADS, scores, q, kv, l, NH, TMAX);
    KVT_LAUNCH(attn_softmax_kernel, NH, n, KVT_THREADS, scores, kv, NH, TMAX);
    KVT_LAUNCH(attn_values_kernel, NH, n, KVT_THREADS, out, scores, kv, l, NH, TMAX);
}

// §12 attention, fused (+ split/merge) ---------------------------------------------
/* The same result in one pass over the positions, without a score row: the
 * online softmax (Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022).
 * Keep a running max m, a running sum l of exp(s - m) and an accumulator
 * acc = sum exp(s - m) V. When new scores raise the max to m', everything so
 * far was scaled by exp(-m) instead of exp(-m'), so multiply l and acc by
 * exp(m - m') (the "rescale") and go on. At the end out = acc / l.
 *
 * Split (FlashDecoding, Dao et al. 2023): cut positions 0..p into pieces of
 * split_len, run the loop on each piece independently (in parallel), and keep
 * (m_i, l_i, acc_i) per piece. The merge rescales each to the global max M:
 *   l = sum l_i e^(m_i - M),  out = sum acc_i e^(m_i - M) / l.
 * With one split this is the plain fused loop.
 *
 * The spec, attention_fused_spec_cpu: the loop above for one query and one
 * piece at a time, key by key, then the merge; with it the plain GPU kernel,
 * attn_fused_plain_kernel, the same loop a tile of keys at a time. --plain
 * runs these two. The tuned paths the engine runs by default, checked
 * against the spec by test.c: on the CPU attention_fused_cpu, work items of
 * (block of rows, piece) over the cores, each running the tiled loop of
 * cpu/attention.c (a tile of keys serves a block of queries,
 * FlashAttention's loop order), then the merge; on the GPU the kernels of
 * gpu/attention.cu, one block per (row, kv head, piece) for all the query
 * heads of the kv head, 16-byte loads.
 * part: (n, NH, nsplit, 2 + HS), the (m, l, acc) of every piece. */

/* out = the merge of the pieces (with one piece: M = m, so out = acc / l);
 * part holds each piece's (m, l, acc), pieces of one (row, head) side by side. */
static void attention_merge_cpu(float *out, const float *part, int n, int NH, int HS, int nsplit) {
#pragma omp parallel for schedule(static) if (n * NH * nsplit > 64)
    for (int rh = 0; rh < n * NH; rh++) {
        const float *pr = part + (size_t)rh * nsplit * (2 + HS);
        float *oh = out + (size_t)rh * HS, M = -INFINITY, sum = 0.0f;
        for (int sp = 0; sp < nsplit; sp++) M = fmaxf(M, pr[sp * (2 + HS)]);
        for (int c = 0; c < HS; c++) oh[c] = 0.0f;
        for (int sp = 0; sp < nsplit; sp++) {
            const float *pp = pr + sp * (2 + HS);
            if (pp[1] == 0.0f) continue; /* an empty piece (past this row's position) */
            float wgt = expf(pp[0] - M);
            sum += pp[1] * wgt;
            for (int c = 0; c < HS; c++) oh[c] += pp[2 + c] * wgt;
        }
        for (int c = 0; c < HS; c++) oh[c] /= sum;
    }
}
/* The spec: for each query (row r, head h) and each piece of its keys
 * (positions sp * split_len .. up to p = row_pos[r]), the online softmax over
 * the piece's keys one at a time, read through the same accessors as the
 * naive form (§11): kv_index finds the key's row through the chunk table,
 * kv_dot and kv_axpy decode fp16 and int8 as they read. Each piece's
 * (m, l, acc) goes to part, then the merge above (one piece: out = acc / l).
 * Plain loops on one core: --plain runs it as the engine's fused attention
 * (slower than the tuned loops, which test.c checks against it). out, q
 * (n, NH*HS); part (n, NH, nsplit, 2 + HS). */
static void attention_fused_spec_cpu(float *out, const float *q, kvt_kv kv, int l, int n, int NH,
                                     float *part, int split_len, int nsplit) {
    int HS = kv.HS, group = NH / kv.NKV; /* GQA: query heads h of one group share kv head h / group */
    float scale = 1.0f / sqrtf((float)HS);
    for (int r = 0; r < n; r++)
        for (int h = 0; h < NH; h++)
            for (int sp = 0; sp < nsplit; sp++) {
                int p = kv.row_pos[r], kh = h / group, t0 = sp * split_len;
                int t1 = p + 1 < t0 + split_len ? p + 1 : t0 + split_len; /* the causal mask: keys after p are not read */
                const float *qh = q + ((size_t)r * NH + h) * HS;
                float *pp = part + (((size_t)r * NH + h) * nsplit + sp) * (2 + HS), *acc = pp + 2;
                float m = -INFINITY, sum = 0.0f; /* the running max m and sum l: no key seen yet */
                for (int c = 0; c < HS; c++) acc[c] = 0.0f;
                for (int t = t0; t < t1; t++) {
                    float s = kv_dot(&kv, kv_index(&kv, l, 0, kv.row_tab[r], t, kh), qh, HS) * scale;
                    if (s > m) { /* a new max m' = s: the rescale (first key: exp(-inf) = 0 times nothing) */
                        float corr = expf(m - s);
                        sum *= corr;
                        for (int c = 0; c < HS; c++) acc[c] *= corr;
                        m = s;
                    }
                    float w = expf(s - m); /* <= 1: s - m <= 0, so exp never overflows */
                    sum += w;
                    kv_axpy(&kv, kv_index(&kv, l, 1, kv.row_tab[r], t, kh), w, acc, HS);
                }
                pp[0] = m; /* a piece past p keeps l = 0: the merge skips it */
                pp[1] = sum;
            }
    attention_merge_cpu(out, part, n, NH, HS, nsplit); /* the softmax's division, once at the end */
}
/* The CPU path the engine runs. Its work items are (block of rows, piece),
 * spread over the cores; a block is up to KVT_ATTN_QROWS consecutive rows of
 * one sequence with all their NH heads (one attention_piece_cpu call walks
 * every kv head). So the heads of a row are never split between cores: a
 * decode row is one block, and it reaches several cores only through its
 * pieces (attn_split, §15, cuts calls of up to KVT_CPU_SPLIT_ROWS rows into
 * pieces of KVT_CPU_SPLIT positions); a batch of rows of different sequences
 * is many blocks. Each item writes only its own queries' (m, l, acc), so the
 * result does not depend on the number of threads. */
static void attention_fused_cpu(float *out, const float *q, kvt_kv kv, int l, int n, int NH,
                                float *part, int split_len, int nsplit) {
    /* query blocks: runs of up to KVT_ATTN_QROWS consecutive rows of one sequence */
    int first[KVT_MAX_ROWS + 1], nb = 0;
    for (int r = 0; r < n; r++)
        if (r == 0 || kv.row_tab[r] != kv.row_tab[r - 1] || r - first[nb - 1] == KVT_ATTN_QROWS) first[nb++] = r;
    first[nb] = n;
    int items = nb * nsplit;
    KVT_ASSERT(kv.work && kv.work_threads > 0); /* the scratch of attention_piece_cpu, one per thread */
#pragma omp parallel for schedule(dynamic) if (items > 1) num_threads(kv.work_threads)
    for (int it = 0; it < items; it++)
        attention_piece_cpu(part, q, &kv, l, NH, first[it / nsplit], first[it / nsplit + 1], it % nsplit, split_len, nsplit);
    attention_merge_cpu(out, part, n, NH, kv.HS, nsplit);
}
/* The kernels attention_fused_gpu launches (one block per row, kv head and
 * piece; the online softmax over the piece's keys, tile by tile, with 16-byte
 * loads and register accumulators) are machine tuning: gpu/attention.cu,
 * included here. */
#include "gpu/attention.cu"
/* The plain kernel, the spec's loop a tile of keys at a time: one block per
 * (query head, piece, row), grid (NH * nsplit, n), block (KVT_THREADS).
 *   step 1: thread j scores key t0 + j of the tile (a whole dot product) into s[j]
 *   step 2: every thread takes the tile's max m' and rescales by exp(m - m')
 *   step 3: thread c adds e_j V[t0+j][c] for every key j of the tile to its
 *           channels c, c + blockDim, .. (e_j = exp(s_j - m'))
 * Each thread keeps its own copy of m and l (the same values in all). The
 * first barrier: s[] is complete before anyone reads it; the second: nobody
 * overwrites s[] while another thread still reads it. The piece's (m, l, acc)
 * go to part; attn_merge_kernel below makes out. The tuned kernels in
 * gpu/attention.cu compute the same thing for a whole group of heads at once. */
__global__ void attn_fused_plain_kernel(float *part, const float *q, kvt_kv kv, int l, int NH, int split_len,
                                        int nsplit) {
    __shared__ float s[KVT_THREADS];
    int h = (int)blockIdx.x / nsplit, sp = (int)blockIdx.x % nsplit, r = (int)blockIdx.y, HS = kv.HS;
    int kh = h / (NH / kv.NKV), p = kv.row_pos[r], t0 = sp * split_len, tid = (int)threadIdx.x;
    int t1 = p + 1 < t0 + split_len ? p + 1 : t0 + split_len;
    const float *qh = q + ((size_t)r * NH + h) * HS;
    float scale = 1.0f / sqrtf((float)HS), m = -INFINITY, sum = 0.0f, acc[KVT_MAX_HS / KVT_THREADS];
    for (int u = 0; u < KVT_MAX_HS / KVT_THREADS; u++) acc[u] = 0.0f;
    for (int tile = t0; tile < t1; tile += KVT_THREADS) {
        int nt = t1 - tile < KVT_THREADS ? t1 - tile : KVT_THREADS;
        if (tid < nt) s[tid] = kv_dot(&kv, kv_index(&kv, l, 0, kv.row_tab[r], tile + tid, kh), qh, HS) * scale;
        __syncthreads();
        float mt = m;
        for (int j = 0; j < nt; j++) mt = fmaxf(mt, s[j]);
        float corr = expf(m - mt); /* the first tile: exp(-inf) = 0 */
        sum *= corr;
        for (int u = 0; u < KVT_MAX_HS / KVT_THREADS; u++) acc[u] *= corr;
        for (int j = 0; j < nt; j++) {
            float e = expf(s[j] - mt);
            size_t vi = kv_index(&kv, l, 1, kv.row_tab[r], tile + j, kh);
            sum += e;
            for (int c = tid, u = 0; c < HS; c += KVT_THREADS, u++) acc[u] += e * kv_load(&kv, vi + (size_t)c);
        }
        m = mt;
        __syncthreads();
    }
    float *pp = part + (((size_t)r * NH + h) * nsplit + sp) * (2 + HS);
    if (tid == 0) { pp[0] = m; pp[1] = sum; } /* a piece past p: l = 0, skipped by the merge */
    for (int c = tid, u = 0; c < HS; c += KVT_THREADS, u++) pp[2 + c] = acc[u];
}
/* grid (NH, n), block (KVT_THREADS): thread c merges channel c of all pieces. */
__global__ void attn_merge_kernel(float *out, const float *part, int NH, int HS, int nsplit) {
    int h = (int)blockIdx.x, r = (int)blockIdx.y;
    const float *pr = part + ((size_t)r * NH + h) * nsplit * (2 + HS);
    float M = -INFINITY;
    for (int sp = 0; sp < nsplit; sp++) M = fmaxf(M, pr[sp * (2 + HS)]);
    for (int c = (int)threadIdx.x; c < HS; c += (int)blockDim.x) {
        float sum = 0.0f, o = 0.0f;
        for (int sp = 0; sp < nsplit; sp++) {
            const float *pp = pr + sp * (2 + HS);
            if (pp[1] == 0.0f) continue;
            float wgt = expf(pp[0] - M);
            sum += pp[1] * wgt;
            o += pp[2 + c] * wgt;
        }
        out[((size_t)r * NH + h) * HS + c] = o / sum;
    }
}
/* --plain: the plain kernel, then the merge (also for one piece: out = acc / l). */
static void attention_fused_plain_gpu(float *out, const float *q, kvt_kv kv, int l, int n, int NH,
                                      float *part, int split_len, int nsplit) {
    KVT_LAUNCH(attn_fused_plain_kernel, NH * nsplit, n, KVT_THREADS, part, q, kv, l, NH, split_len, nsplit);
    KVT_LAUNCH(attn_merge_kernel, NH, n, KVT_THREADS, out, part, NH, kv.HS, nsplit);
}
/* W: values per 16-byte load of this cache (int8: when G is a multiple of
 * 16); 1 for other types, or when rows do not start on 16 bytes. */
static void attention_fused_gpu(float *out, const float *q, kvt_kv kv, int l, int n, int NH,
                                float *part, int split_len, int nsplit) {
    int W = kv.dtype == KVT_FP32 ? 4 : kv.dtype == KVT_FP16 ? 8 : kv.dtype == KVT_INT8 && kv.G % 16 == 0 ? 16 : 1;
    int gx = kv.NKV * nsplit;
    if (kv.HS % W || (uintptr_t)kv.data % 16) W = 1;
    if (W == 4) KVT_LAUNCH(attn_fused_fp32_kernel, gx, n, KVT_THREADS, out, part, q, kv, l, NH, split_len, nsplit);
    else if (W == 8) KVT_LAUNCH(attn_fused_fp16_kernel, gx, n, KVT_THREADS, out, part, q, kv, l, NH, split_len, nsplit);
    else if (W == 16) KVT_LAUNCH(attn_fused_int8_kernel, gx, n, KVT_THREADS, out, part, q, kv, l, NH, split_len, nsplit);
    else KVT_LAUNCH(attn_fused_kernel, gx, n, KVT_THREADS, out, part, q, kv, l, NH, split_len, nsplit);
    if (nsplit > 1) KVT_LAUNCH(attn_merge_kernel, NH, n, KVT_THREADS, out, part, NH, kv.HS, nsplit);
}

// §13 swiglu -------------------------------------------------------------------------
/* hb = silu(hb) * hb2, silu(x) = x * sigmoid(x)  PyTorch: F.silu(w1(x)) * w3(x)
 * Shazeer 2020. hb, hb2 (n, HD). */
static void swiglu_cpu(float *hb, const float *hb2, int n, int HD) {
    long N = (long)n * HD;
#pragma omp parallel for if (N > 32768) /* one expf per value: worth both cores from a few rows on */
    for (long i = 0; i < N; i++) hb[i] = hb[i] / (1.0f + expf(-hb[i])) * hb2[i];
}
/* grid (row_blocks(HD), n), block (KVT_THREADS): the threads of row
 * blockIdx.y's blocks take its values in turn (a grid-stride loop; on the GPU
 * one value each up to 256 blocks). One block per row would leave a decode
 * step, n = 1, on one SM, its threads looping over HD; the element-wise
 * kernels of §10 and §14 are shaped the same way. */
__global__ void swiglu_kernel(float *hb, const float *hb2, int n, int HD) {
    size_t r = blockIdx.y;
    for (int c = (int)(blockIdx.x * blockDim.x + threadIdx.x); c < HD; c += (int)(gridDim.x * blockDim.x))
        hb[r * HD + c] = hb[r * HD + c] / (1.0f + expf(-hb[r * HD + c])) * hb2[r * HD + c];
    (void)n;
}
static void swiglu_gpu(float *hb, const float *hb2, int n, int HD) {
    KVT_LAUNCH(swiglu_kernel, row_blocks(HD), n, KVT_THREADS, hb, hb2, n, HD);
}

// §14 residual add --------------------------------------------------------------------
/* x += y (the residual stream)                    PyTorch: x = x + y
 * x, y (n, D). */
static void residual_cpu(float *x, const float *y, int n, int D) {
    long N = (long)n * D;
#pragma omp parallel for if (N > 65536)
    for (long i = 0; i < N; i++) x[i] += y[i];
}
/* grid (row_blocks(D), n), block (KVT_THREADS): a grid-stride loop over row blockIdx.y. */
__global__ void residual_kernel(float *x, const float *y, int n, int D) {
    size_t r = blockIdx.y;
    for (int c = (int)(blockIdx.x * blockDim.x + threadIdx.x); c < D; c += (int)(gridDim.x * blockDim.x))
        x[r * D + c] += y[r * D + c];
    (void)n;
}
static void residual_gpu(float *x, const float *y, int n, int D) {
    KVT_LAUNCH(residual_kernel, row_blocks(D), n, KVT_THREADS, x, y, n, D);
}

// §15 the engine and the forward pass -----------------------------------------------
/* Each op has a CPU and a GPU version with the same arguments; the forward pass
 * calls them through this table, so one forward serves both devices (and a
 * debugger steps straight into whichever runs). */
typedef struct {
    void (*embed)(float *x, const float *table, const int *tokens, int n, int D);
    void (*rmsnorm)(float *out, const float *x, const float *w, int n, int D);
    void (*matmul)(float *out, const float *x, const float *w, int n, int k, int d);
    void (*rope)(float *q, float *k, const float *freq, const int *row_pos, int n, int NH, int NKV, int HS);
    void (*kv_write)(kvt_kv kv, const float *k, const float *v, int l, int n);
    void (*attention_naive)(float *out, const float *q, kvt_kv kv, int l, int n, int NH, float *scores, int TMAX);
    void (*attention_fused)(float *out, const float *q, kvt_kv kv, int l, int n, int NH, float *part,
                            int split_len, int nsplit);
    void (*swiglu)(float *hb, const float *hb2, int n, int HD);
    void (*residual)(float *x, const float *y, int n, int D);
} kvt_ops;
static const kvt_ops kvt_cpu_ops = {embed_cpu, rmsnorm_cpu, matmul_cpu, rope_cpu, kv_write_cpu,
                                    attention_naive_cpu, attention_fused_cpu, swiglu_cpu, residual_cpu};
static const kvt_ops kvt_gpu_ops = {embed_gpu, rmsnorm_gpu, matmul_gpu, rope_gpu, kv_write_gpu,
                                    attention_naive_gpu, attention_fused_gpu, swiglu_gpu, residual_gpu};
/* --plain (kvt_options.plain): the file's own version of every op, what a
 * reader steps into in gdb. Only matmul and fused attention have tuned
 * versions elsewhere (cpu/, gpu/); the plain ones are matmul_spec_cpu and
 * matmul_dot_kernel (prefill keeps sgemm and the tiled kernel),
 * attention_fused_spec_cpu and attn_fused_plain_kernel. */
static const kvt_ops kvt_cpu_plain_ops = {embed_cpu, rmsnorm_cpu, matmul_plain_cpu, rope_cpu, kv_write_cpu,
                                          attention_naive_cpu, attention_fused_spec_cpu, swiglu_cpu, residual_cpu};
static const kvt_ops kvt_gpu_plain_ops = {embed_gpu, rmsnorm_gpu, matmul_plain_gpu, rope_gpu, kv_write_gpu,
                                          attention_naive_gpu, attention_fused_plain_gpu, swiglu_gpu, residual_gpu};

/* GPU automatic split: one block per (row, kv head, piece) of the fused
 * attention (§12). Decode has few rows (NKV x 1 = 32 blocks for one 7B sequence
 * on 132 SMs: three quarters of the GPU idle), so cut the positions into as
 * many pieces as give KVT_SPLIT_BLOCKS_PER_SM blocks per SM, but none shorter
 * than a tile of KVT_THREADS keys. 16 rows of a 7B fill the GPU unsplit. */
#define KVT_SPLIT_BLOCKS_PER_SM 2
/* CPU automatic split: a call of at most KVT_CPU_SPLIT_ROWS rows (decode, a small
 * batch) cuts each row's positions into pieces of KVT_CPU_SPLIT, so that one
 * sequence still makes enough work items for every core (§12); more rows
 * make enough items by themselves. A fixed rule, not one that depends on the
 * number of threads, so results do not change with OMP_NUM_THREADS. */
#define KVT_CPU_SPLIT 128
#define KVT_CPU_SPLIT_ROWS 8

/* An engine is one model on one device, one KV pool, and the scratch
 * buffers of a forward call. Sequences (kvt_seq) are small host-side handles:
 * a chunk table and a length. Any number of them share the engine's pool, so
 * "how many sequences fit" is a question of chunks, not of engines.
 *
 *   kvt_engine ── m (weights, host + device copy)
 *       │      ── pool: n_chunks x (L, 2, CH, NKV, HS)   <- every sequence's K/V
 *       │      ── x, xb, q, k, v, att, hb, ... (rows, .)  <- one call's activations
 *       └─ op: kvt_cpu_ops or kvt_gpu_ops (--plain: *_plain_ops) <- who computes
 */
struct kvt_engine {
    kvt_model *m;
    kvt_options o;
    int gpu;                 /* 1: buffers and pool on the GPU (or the emulation) */
    int sms;                 /* GPU: its multiprocessors (kvt_gpu_sms), for the automatic split */
    const kvt_ops *op;
    const kvt_weights *w;    /* host or device weights */
    kvt_pool pool;
    int rows;                /* most rows per call (o.max_rows) */
    size_t part_cap;         /* most (row, piece) pairs of the fused attention in one call */
    /* activations, on the engine's device; names as in llama2.c */
    float *x;      /* (rows, D) residual stream */
    float *xb;     /* (rows, D) normed input of a block / scratch */
    float *xb2;    /* (rows, D) attention output projection */
    float *q;      /* (rows, NH*HS) */
    float *k, *v;  /* (rows, KVD) the new rows' keys and values */
    float *att;    /* (rows, NH*HS) attention output */
    float *hb;     /* (rows, HD) FFN gate, then silu(gate) * up */
    float *hb2;    /* (rows, HD) FFN up */
    float *logits; /* (rows, V) */
    float *freq;   /* (HS/2) RoPE frequency of each channel pair (computed once) */
    float *scores; /* (rows, NH, TMAX) naive attention's score rows (1 row for a fused engine) */
    float *part;   /* (n, NH, nsplit, 2 + HS) fused attention's pieces, n * nsplit <= part_cap */
    int *tokens;   /* (rows) */
    int *row_pos, *row_len, *row_tab; /* (rows) see kvt_kv */
    int *tables;   /* (max_seqs * ceil(TMAX/CH)) chunk tables of this call */
    int *h_pos, *h_len, *h_tab; /* (rows) host staging of row_pos, row_len, row_tab */
    int *h_tables; /* (max_seqs * ceil(TMAX/CH)) host staging of tables */
    int *h_out;    /* (rows) the rows whose logits a batch wants: each sequence's last */
    int *h_cow;    /* (rows) kvt_forward_batch's plan: the shared chunks its forks will copy */
    char *h_work;  /* CPU engines: the tiled attention's scratch, attn_work_bytes per thread */
    int work_threads; /* the team size at create (omp_get_max_threads), which h_work is sized for */
    float *h_scores; /* (rows, NH, TMAX) host copy of the weights for o.attn_probe (one float without it) */
    /* counters for --stats */
    double t_prefill, t_decode;
    long n_prefill, n_decode;
    /* The sequences made on this engine and not yet freed, oldest first: only
     * kvt_pool_print reads this list (a debugger has the engine, not the CLI's
     * array of sequences). next_id numbers them as kvt_seq_init makes them. */
    kvt_seq *live;
    int next_id;
};

/* The int8 group size for head size HS when the caller chose none (0): 32,
 * else 16 when it divides HS (the CPU's loops take 8 or 16 channels of one scale
 * at a time, §10), else HS's largest divisor below 32 (HS 40 -> 20, HS 8 -> 8). */
int kvt_kv_group_auto(int HS) {
    if (HS % 32 == 0) return 32;
    if (HS % 16 == 0) return 16;
    int G = HS < 31 ? HS : 31;
    while (HS % G) G--;
    return G;
}

/* The defaults, and why:
 *  - fused attention: one pass over the cache; naive is the reference;
 *  - CH = 16: at most 15 unused slots per sequence, while a chunk is still
 *    large enough that the table lookup per position costs nothing;
 *  - n_chunks 0: room for max_seqs sequences at full length (never exhausted);
 *  - int8 groups of 32 channels: llama.cpp's q8_0 block size;
 *  - max_rows 256: a prompt is prefilled 256 rows per call, bounding scratch
 *    (~32 MB of logits for V = 32000); sgemm needs a few hundred rows to reuse
 *    each weight enough (64-row pieces make a prefill clearly slower);
 *  - prefix reuse on: free when nothing matches, a big saving when it does. */
void kvt_options_default(kvt_options *o) {
    memset(o, 0, sizeof(*o));
#ifdef __CUDACC__
    static int said = 0;
    if (!said && !kvt_gpu_available()) fprintf(stderr, "[kvt] no CUDA device found: running on the CPU\n");
    said = 1;
#endif
    o->device = kvt_gpu_available() && !KVT_EMULATED ? KVT_GPU : KVT_CPU;
    o->attn = KVT_ATTN_FUSED;
    o->kv_cache = 1;
    o->CH = 16;
    o->n_chunks = 0;
    o->max_seqs = 1;
    o->kv_dtype = KVT_FP32;
    o->kv_group = 0; /* automatic: kvt_kv_group_auto */
    o->split_len = 0;
    o->max_rows = 256;
    o->prefix_reuse = 1;
    o->attn_layer = -1; /* an attn_probe, when set, sees every layer */
}

static void engine_free_buffers(kvt_engine *e) {
    float **fb[] = {&e->x, &e->xb, &e->xb2, &e->q, &e->k, &e->v, &e->att, &e->hb, &e->hb2,
                    &e->logits, &e->scores, &e->part, &e->freq};
    int **ib[] = {&e->tokens, &e->row_pos, &e->row_len, &e->row_tab, &e->tables};
    for (size_t i = 0; i < sizeof(fb) / sizeof(fb[0]); i++) { buf_free(e->gpu, *fb[i]); *fb[i] = NULL; }
    for (size_t i = 0; i < sizeof(ib) / sizeof(ib[0]); i++) { buf_free(e->gpu, *ib[i]); *ib[i] = NULL; }
}

void kvt_engine_free(kvt_engine *e) {
    if (!e) return;
    engine_free_buffers(e);
    pool_free(&e->pool);
    free(e->h_pos);
    free(e->h_len);
    free(e->h_tab);
    free(e->h_tables);
    free(e->h_out);
    free(e->h_scores);
    free(e->h_cow);
    free(e->h_work);
    free(e);
}

/* An engine: one model with one set of options (cache type, chunk size,
 * attention, device), its KV pool and its scratch buffers. In order: every
 * option checked against the model, the device picked; every size computed
 * with overflow checks; one check that all of it fits in memory
 * (kvt_mem_check); only then the allocations and the weights' upload (GPU), so
 * a failure leaves nothing behind. The scratch here is sized for the largest
 * call (max_rows rows, max_seqs sequences; the CPU attention's work space
 * per thread of the team), so a forward call allocates nothing and cannot
 * fail for lack of memory halfway through (test_no_alloc). Sequences are created separately
 * (kvt_seq_init) and hold only chunk ids of this engine's pool. */
kvt_status kvt_engine_create(kvt_engine **out, kvt_model *m, const kvt_options *o) {
    *out = NULL;
    const kvt_config *c = &m->c;
    int HS = m->head_size, TMAX = c->seq_len;
    if (o->CH < 1 || o->CH > TMAX)
        return kvt_fail(KVT_EARG, "--chunk %d is out of range [1, %d] (1 to the model's context TMAX)", o->CH, TMAX);
    if (o->kv_dtype == KVT_INT8 && (o->kv_group < 0 || (o->kv_group > 0 && HS % o->kv_group)))
        return kvt_fail(KVT_EARG, "--kv-group %d must divide the head size HS = %d", o->kv_group, HS);
    if (o->max_seqs < 1 || o->max_seqs > KVT_MAX_SEQS)
        return kvt_fail(KVT_EARG, "max_seqs %d is out of range [1, %d]", o->max_seqs, KVT_MAX_SEQS);
    if (o->n_chunks < 0 || o->n_chunks > KVT_LIMIT_CHUNKS)
        return kvt_fail(KVT_EARG, "--chunks %d is out of range [1, %d] (0: enough for every sequence)",
                        o->n_chunks, KVT_LIMIT_CHUNKS);
    if (o->split_len < -1 || o->split_len > TMAX)
        return kvt_fail(KVT_EARG, "--split %d is out of range [-1, %d] (-1 never, 0 automatic)", o->split_len, TMAX);
    if (o->max_rows < 1 || o->max_rows > KVT_MAX_ROWS)
        return kvt_fail(KVT_EARG, "max_rows %d is out of range [1, %d]", o->max_rows, KVT_MAX_ROWS);
    if (o->swap_chunks < 0 || o->swap_chunks > KVT_LIMIT_CHUNKS)
        return kvt_fail(KVT_EARG, "swap_chunks %d is out of range [0, %d]", o->swap_chunks, KVT_LIMIT_CHUNKS);
    /* Chunk tables: a sequence of TMAX positions holds ceil(TMAX/CH) chunks, and
     * a batch stages the tables of max_seqs sequences; the default pool has room
     * for all of them. Counted in size_t and capped: the tables are indexed by
     * int, and --fork 2048 --chunk 1 with TMAX 2^20 would be 2^31 entries. */
    int ntab = kvt_cdiv(TMAX, o->CH);
    size_t tab_entries;
    if (!kvt_mul_ok((size_t)o->max_seqs, (size_t)ntab, &tab_entries) || tab_entries > KVT_LIMIT_CHUNKS)
        return kvt_fail(KVT_EARG, "%d sequences x %d chunks each (TMAX %d / --chunk %d) = %zu chunk-table entries, "
                        "more than %d: use a larger --chunk or fewer sequences", o->max_seqs, ntab, TMAX, o->CH,
                        tab_entries, KVT_LIMIT_CHUNKS);
    if (o->device == KVT_GPU && !kvt_gpu_available()) /* asked for by name: falling back would hide it */
        return kvt_fail(KVT_EARG, "--device gpu: no CUDA device found (this build needs one; --device cpu "
                        "runs the CPU path)");
    int n_chunks = o->n_chunks > 0 ? o->n_chunks : (int)tab_entries;
    kvt_engine *e = (kvt_engine *)calloc(1, sizeof(kvt_engine));
    if (!e) return kvt_fail(KVT_ENOMEM, "host out of memory (engine)");
    e->m = m;
    e->o = *o;
    if (e->o.kv_group == 0) e->o.kv_group = kvt_kv_group_auto(HS); /* the caller left it to us */
    e->gpu = e->o.device == KVT_GPU;
    openblas_set_num_threads(1); /* sgemm runs inside our parallel loops (§9) */
    e->op = e->o.plain ? (e->gpu ? &kvt_gpu_plain_ops : &kvt_cpu_plain_ops) : e->gpu ? &kvt_gpu_ops : &kvt_cpu_ops;
    e->rows = o->max_rows;
    e->work_threads = omp_get_max_threads();
    /* The split scratch is sized for the most pieces any call can need (attn_split). */
    size_t R = (size_t)e->rows, cpu_parts = (size_t)KVT_CPU_SPLIT_ROWS * (size_t)kvt_cdiv(TMAX, KVT_CPU_SPLIT);
    e->sms = e->gpu ? kvt_gpu_sms() : 0;
    if (o->split_len > 0) kvt_mul_ok(R, (size_t)kvt_cdiv(TMAX, o->split_len), &e->part_cap);
    else if (e->gpu) /* n rows x ceil(B / (NKV n)) pieces <= B / NKV + n, with B the blocks wanted */
        e->part_cap = R + (size_t)kvt_cdiv(KVT_SPLIT_BLOCKS_PER_SM * e->sms, c->n_kv_heads);
    else e->part_cap = R > cpu_parts ? R : cpu_parts;
    /* Every size first, in size_t with overflow checks; then one check that they
     * fit in memory; only then the allocations. The scratch table's shapes are
     * those of struct kvt_engine; every element is 4 bytes (float or int). */
    size_t D = (size_t)c->dim, HD = (size_t)c->hidden_dim, KVD = (size_t)m->kv_dim, V = (size_t)c->vocab_size;
    size_t NH = (size_t)c->n_heads, T = (size_t)TMAX;
    struct { void **p; const char *name; size_t n1, n2, n3; size_t bytes; } b[] = {
        {(void **)&e->x, "x", R, D, 1, 0}, {(void **)&e->xb, "xb", R, D, 1, 0}, {(void **)&e->xb2, "xb2", R, D, 1, 0},
        {(void **)&e->q, "q", R, D, 1, 0}, {(void **)&e->k, "k", R, KVD, 1, 0}, {(void **)&e->v, "v", R, KVD, 1, 0},
        {(void **)&e->att, "att", R, D, 1, 0}, {(void **)&e->hb, "hb", R, HD, 1, 0}, {(void **)&e->hb2, "hb2", R, HD, 1, 0},
        {(void **)&e->logits, "logits", R, V, 1, 0},
        {(void **)&e->scores, "scores", o->attn == KVT_ATTN_NAIVE || o->attn_probe ? R : 1, NH, T, 0},
        {(void **)&e->part, "part", e->part_cap, NH, 2 + (size_t)HS, 0},
        {(void **)&e->freq, "freq", (size_t)HS / 2, 1, 1, 0},
        {(void **)&e->tokens, "tokens", R, 1, 1, 0}, {(void **)&e->row_pos, "row_pos", R, 1, 1, 0},
        {(void **)&e->row_len, "row_len", R, 1, 1, 0}, {(void **)&e->row_tab, "row_tab", R, 1, 1, 0},
        {(void **)&e->tables, "tables", tab_entries, 1, 1, 0},
        /* host staging, always in host memory */
        {(void **)&e->h_pos, "h_pos", R, 1, 1, 0}, {(void **)&e->h_len, "h_len", R, 1, 1, 0},
        {(void **)&e->h_tab, "h_tab", R, 1, 1, 0}, {(void **)&e->h_tables, "h_tables", tab_entries, 1, 1, 0},
        {(void **)&e->h_out, "h_out", R, 1, 1, 0},
        {(void **)&e->h_scores, "h_scores", o->attn_probe ? R : 1, o->attn_probe ? NH : 1, o->attn_probe ? T : 1, 0},
        {(void **)&e->h_cow, "h_cow", R, 1, 1, 0},
        {(void **)&e->h_work, "h_work", e->gpu ? 1 : (size_t)e->work_threads, e->gpu ? 1 : attn_work_bytes((int)NH, HS) / 4, 1, 0},
    };
    const int n_bufs = (int)(sizeof(b) / sizeof(b[0])), n_dev = n_bufs - 8; /* the first n_dev: engine's device */
    size_t pool_data = 0, pool_scales = 0;
    kvt_status st = pool_shape(&e->pool, e->gpu, c->n_layers, c->n_kv_heads, HS, o->CH, n_chunks, o->kv_dtype,
                               e->o.kv_group, &pool_data, &pool_scales);
    for (int i = 0; i < n_bufs && st == KVT_OK; i++) {
        char what[64];
        snprintf(what, sizeof(what), "the scratch buffer %s", b[i].name);
        st = kvt_bytes(&b[i].bytes, what, b[i].n1, b[i].n2, b[i].n3, 4);
    }
    /* Host bytes: the device's buffers too when the device is the host (CPU
     * engine, or the emulated GPU); the pool's bookkeeping is 16 bytes a chunk.
     * A real GPU's memory is checked by cudaMalloc itself (buf_alloc). */
    int dev_on_host = !e->gpu || KVT_EMULATED;
    double cache = dev_on_host ? (double)pool_data + (double)pool_scales : 0.0, scratch = 16.0 * n_chunks;
    if (n_chunks > 0) /* the swap area is host memory on every device */
        cache += ((double)pool_data + (double)pool_scales) / n_chunks * o->swap_chunks + 12.0 * o->swap_chunks;
    for (int i = 0; i < n_bufs; i++) scratch += i >= n_dev || dev_on_host ? (double)b[i].bytes : 0.0;
    if (st == KVT_OK)
        st = kvt_mem_check(4.0 * (double)m->n_floats, 1, cache, scratch);
    if (st == KVT_OK && e->gpu) st = kvt_model_upload(m);
    e->w = e->gpu ? &m->d_w : &m->w;
    if (st == KVT_OK) st = pool_alloc(&e->pool, pool_data, pool_scales);
    if (st == KVT_OK) st = pool_swap_alloc(&e->pool, o->swap_chunks);
    for (int i = 0; i < n_bufs && st == KVT_OK; i++)
        st = buf_alloc(i < n_dev ? e->gpu : 0, b[i].p, b[i].bytes, i < n_dev ? "activation buffers" : "host staging buffers");
    if (st != KVT_OK) { kvt_engine_free(e); return st; }
    float freq[KVT_MAX_HS / 2];
    rope_freqs(freq, HS, m->rope_theta);
    buf_upload(e->gpu, e->freq, freq, (size_t)HS / 2 * sizeof(float));
    *out = e;
    return KVT_OK;
}

kvt_pool *kvt_engine_pool(kvt_engine *e) { return &e->pool; }

/* The engine's list of live sequences: a new one goes last, so the list is in
 * the order of the ids; a freed one is unlinked. The sequences are the
 * caller's memory, so a kvt_seq must not be moved or copied while live. */
static void seq_link(kvt_engine *e, kvt_seq *s) {
    kvt_seq **at = &e->live, *prev = NULL;
    while (*at) { prev = *at; at = &(*at)->live_next; }
    *at = s;
    s->live_prev = prev;
    s->live_next = NULL;
}
static void seq_unlink(kvt_engine *e, kvt_seq *s) {
    if (s->live_prev) s->live_prev->live_next = s->live_next;
    else if (e->live == s) e->live = s->live_next;
    if (s->live_next) s->live_next->live_prev = s->live_prev;
    s->live_prev = s->live_next = NULL;
}

/* A sequence starts empty: no chunk is taken until its first forward call. */
kvt_status kvt_seq_init(kvt_engine *e, kvt_seq *s) {
    memset(s, 0, sizeof(*s));
    s->max_table = kvt_cdiv(e->m->c.seq_len, e->pool.CH);
    s->table = (int *)malloc((size_t)s->max_table * sizeof(int));
    s->tokens = (int *)malloc((size_t)e->m->c.seq_len * sizeof(int));
    s->how = (char *)calloc((size_t)s->max_table, 1);
    if (!s->table || !s->tokens || !s->how) {
        free(s->table);
        free(s->tokens);
        free(s->how);
        memset(s, 0, sizeof(*s)); /* so that kvt_seq_free on it does nothing */
        return kvt_fail(KVT_ENOMEM, "host out of memory (chunk table)");
    }
    s->id = e->next_id++;
    seq_link(e, s);
    return KVT_OK;
}
/* Give every chunk back (a shared chunk only loses one reference). */
void kvt_seq_reset(kvt_engine *e, kvt_seq *s) {
    for (int i = 0; i < s->n_table; i++)
        if (s->table[i] >= 0) pool_release(&e->pool, s->table[i]);
        else if (s->table[i] <= -2) swap_release(&e->pool, s->table[i]); /* swapped out: its host slot */
    s->n_table = 0;
    s->n_swapped = 0;
    s->len = 0;
}
/* Give the chunks back (kvt_seq_reset), leave the engine's list of live
 * sequences, and free the handle's own arrays. */
void kvt_seq_free(kvt_engine *e, kvt_seq *s) {
    if (s->table) { /* else never made, or freed already */
        kvt_seq_reset(e, s);
        seq_unlink(e, s);
    }
    free(s->table);
    free(s->tokens);
    free(s->how);
    memset(s, 0, sizeof(*s));
}

/* A new sequence that shares all of src's chunks (same prompt, another
 * continuation): one holder more for each chunk, and shared_hits counts the
 * chunks shared (--stats). Nothing is copied now: full chunks stay shared for
 * good, and the partly filled last chunk is copied by the first write
 * (seq_reserve). A swapped-out src cannot be forked (some of its chunks are in
 * host memory): an error, and dst is left as it was. */
kvt_status kvt_seq_fork(kvt_engine *e, kvt_seq *dst, const kvt_seq *src) {
    if (src->n_swapped)
        return kvt_fail(KVT_EARG, "fork: sequence %d is swapped out (swap it in first)", src->id);
    kvt_status st = kvt_seq_init(e, dst);
    if (st != KVT_OK) return st;
    for (int i = 0; i < src->n_table; i++) {
        dst->table[i] = src->table[i];
        e->pool.refcount[src->table[i]]++;
    }
    dst->n_table = src->n_table;
    dst->len = src->len;
    memcpy(dst->tokens, src->tokens, (size_t)src->len * sizeof(int));
    e->pool.shared_hits += src->n_table;
    return KVT_OK;
}
/* Prefix reuse and swapping, for a caller that schedules sequences itself
 * (cli/serve.c): the pool's own functions (§6) with the engine's checks. */
int kvt_seq_attach(kvt_engine *e, kvt_seq *s, const int *tokens, int n) {
    KVT_ASSERT(s->len == 0 && s->n_table == 0 && n <= e->m->c.seq_len);
    if (!e->o.prefix_reuse || !e->o.kv_cache || n < 2) return 0;
    return prefix_attach(&e->pool, e->live, s, tokens, n);
}
int kvt_seq_private_chunks(const kvt_engine *e, const kvt_seq *s) { return seq_private_chunks(&e->pool, s); }
kvt_status kvt_seq_swap_out(kvt_engine *e, kvt_seq *s) { return seq_swap_out(&e->pool, s); }
kvt_status kvt_seq_swap_in(kvt_engine *e, kvt_seq *s) {
    return s->n_swapped ? seq_swap_in(&e->pool, s) : KVT_OK;
}

/* How the fused attention cuts positions 0..max_pos into pieces. */
static void attn_split(const kvt_engine *e, int max_pos, int n_rows, int *split_len, int *nsplit) {
    int T = max_pos + 1, len = e->o.split_len;
    if (len == 0 && !e->gpu) /* CPU: work items are (block of rows, piece); a few rows need pieces to fill the cores */
        len = n_rows <= KVT_CPU_SPLIT_ROWS && T > KVT_CPU_SPLIT ? KVT_CPU_SPLIT : T;
    if (len == 0) { /* GPU: KVT_SPLIT_BLOCKS_PER_SM blocks per SM, pieces of at least a tile */
        int want = kvt_cdiv(KVT_SPLIT_BLOCKS_PER_SM * e->sms, e->m->c.n_kv_heads * n_rows), most = kvt_cdiv(T, KVT_THREADS);
        len = kvt_cdiv(T, want < most ? want : most);
    }
    if (len < 0 || len > T) len = T;
    *split_len = len;
    *nsplit = kvt_cdiv(T, len);
}

/* The cache as this call's rows see it, with the engine's attention scratch
 * (the CPU's tiled loop works there: a forward call allocates nothing). */
static kvt_kv engine_kv(const kvt_engine *e) {
    kvt_kv kv = kv_view(&e->pool, e->tables, e->row_tab, e->row_pos, e->row_len);
    kv.work = e->h_work;
    kv.work_bytes = attn_work_bytes(e->m->c.n_heads, e->m->head_size);
    kv.work_threads = e->work_threads;
    return kv;
}

/* The hook of --dump-attn (kvt_options.attn_probe), in cli/inspect.c. */
static void attn_probe_rows(kvt_engine *e, kvt_kv kv, int l, int n);

/* The transformer on n rows whose row_pos/row_len/row_tab and chunk tables are
 * already on the device. Writes each row's K/V into the cache, and into
 * e->logits (n_out, V) the logits of the rows out[0..n_out) (host row indices,
 * ascending), or of every row when out is NULL. The classifier is the widest
 * matmul (V = 32000 against D = 288 on the 15M model: 2.5x a row's other
 * work), so a prefill or a batch computes it only for the rows it samples. */
/* Shapes through one layer, for n rows:
 *   x (n, D) -rmsnorm-> xb (n, D) -wq,wk,wv-> q (n, D), k v (n, KVD) -rope-> q k
 *   k v -> cache;  attention(q, cache) -> att (n, D) -wo-> xb2 (n, D);  x += xb2
 *   x -rmsnorm-> xb -w1,w3-> hb hb2 (n, HD) -swiglu-> hb -w2-> xb (n, D);  x += xb
 * The rows may be one prompt (prefill), one token (decode), or one token of
 * each of several sequences (batch): forward_rows cannot tell, only the row
 * arrays (positions, tables) differ. */
static void forward_rows(kvt_engine *e, int n, const int *out, int n_out) {
    const kvt_config *c = &e->m->c;
    const kvt_weights *w = e->w;
    const kvt_ops *op = e->op;
    int D = c->dim, HD = c->hidden_dim, NH = c->n_heads, NKV = c->n_kv_heads, HS = e->m->head_size;
    int KVD = e->m->kv_dim, V = c->vocab_size, TMAX = c->seq_len;
    kvt_kv kv = engine_kv(e);
    int max_pos = 0, split_len, nsplit;
    for (int r = 0; r < n; r++) max_pos = e->h_pos[r] > max_pos ? e->h_pos[r] : max_pos;
    attn_split(e, max_pos, n, &split_len, &nsplit);
    KVT_ASSERT((size_t)n * (size_t)nsplit <= e->part_cap);

    op->embed(e->x, w->token_embedding, e->tokens, n, D);
    for (int l = 0; l < c->n_layers; l++) {
        size_t lD = (size_t)l * D;
        /* attention block: x += wo @ attention(rope(wq @ xb), rope(wk @ xb), wv @ xb) */
        op->rmsnorm(e->xb, e->x, w->rms_att + lD, n, D);
        op->matmul(e->q, e->xb, w->wq + lD * D, n, D, D);
        op->matmul(e->k, e->xb, w->wk + lD * KVD, n, D, KVD);
        op->matmul(e->v, e->xb, w->wv + lD * KVD, n, D, KVD);
        op->rope(e->q, e->k, e->freq, e->row_pos, n, NH, NKV, HS);
        op->kv_write(kv, e->k, e->v, l, n); /* the cache grows here */
        if (e->o.attn == KVT_ATTN_NAIVE) op->attention_naive(e->att, e->q, kv, l, n, NH, e->scores, TMAX);
        else op->attention_fused(e->att, e->q, kv, l, n, NH, e->part, split_len, nsplit);
        if (e->o.attn_probe && (e->o.attn_layer < 0 || e->o.attn_layer == l)) attn_probe_rows(e, kv, l, n);
        op->matmul(e->xb2, e->att, w->wo + lD * D, n, D, D);
        op->residual(e->x, e->xb2, n, D);
        /* feed-forward block: x += w2 @ (silu(w1 @ xb) * (w3 @ xb)) */
        op->rmsnorm(e->xb, e->x, w->rms_ffn + lD, n, D);
        op->matmul(e->hb, e->xb, w->w1 + lD * HD, n, D, HD);
        op->matmul(e->hb2, e->xb, w->w3 + lD * HD, n, D, HD);
        op->swiglu(e->hb, e->hb2, n, HD);
        op->matmul(e->xb, e->hb, w->w2 + lD * HD, n, HD, D);
        op->residual(e->x, e->xb, n, D);
    }
    if (!out) { /* every row */
        op->rmsnorm(e->xb, e->x, w->rms_final, n, D);
        op->matmul(e->logits, e->xb, w->wcls, n, D, V);
        return;
    }
    for (int i = 0; i < n_out; i++) /* gather the wanted rows of x into xb2 (free from here on) */
        buf_copy(e->gpu, e->xb2 + (size_t)i * D, e->x + (size_t)out[i] * D, (size_t)D * sizeof(float));
    op->rmsnorm(e->xb, e->xb2, w->rms_final, n_out, D);
    op->matmul(e->logits, e->xb, w->wcls, n_out, D, V);
}

/* A forward call describes its rows to the kernels with small int arrays
 * (position, sequence length, where the sequence's table starts) plus the
 * tables themselves. They are filled on the host and copied to the device
 * once per call: a few hundred bytes, next to megabytes of weights.
 * Staging, on the host: rows [r0, r0+n) are n new tokens of sequence s at
 * positions pos0.., and its chunk table goes to h_tables[tab..]. */
static void stage_seq(kvt_engine *e, int r0, const kvt_seq *s, int n, int pos0, int tab) {
    for (int r = r0; r < r0 + n; r++) {
        e->h_pos[r] = pos0 + r - r0;
        e->h_len[r] = pos0 + n;
        e->h_tab[r] = tab;
    }
    memcpy(e->h_tables + tab, s->table, (size_t)s->n_table * sizeof(int));
}
/* ... then to the device: n rows of tokens and row arrays, ntab table entries. */
static void stage_upload(kvt_engine *e, const int *tokens, int n, int ntab) {
    buf_upload(e->gpu, e->tokens, tokens, (size_t)n * sizeof(int));
    buf_upload(e->gpu, e->row_pos, e->h_pos, (size_t)n * sizeof(int));
    buf_upload(e->gpu, e->row_len, e->h_len, (size_t)n * sizeof(int));
    buf_upload(e->gpu, e->row_tab, e->h_tab, (size_t)n * sizeof(int));
    buf_upload(e->gpu, e->tables, e->h_tables, (size_t)ntab * sizeof(int));
}

/* Token ids index the embedding table: one out of range would read past it. */
static kvt_status check_tokens(const kvt_engine *e, const int *tokens, int n) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->m->c.vocab_size)
            return kvt_fail(KVT_EARG, "token %d at index %d is out of range [0, %d)", tokens[i], i,
                            e->m->c.vocab_size);
    return KVT_OK;
}

/* The public forward: check everything first, so that an error leaves the
 * sequence and the pool exactly as they were; then reuse a cached prefix (a
 * new sequence only), take the chunks, run the rows in pieces of max_rows,
 * and only then append the tokens to the sequence. So in a debugger, during
 * a prefill s->len is still the length before these rows (0 for a new
 * sequence; the transcript so far in a chat's later turn): the rows' positions
 * are in e->h_pos, and the chunks already taken in s->table[0 .. n_table). */
kvt_status kvt_forward(kvt_engine *e, kvt_seq *s, const int *tokens, int n, float *logits, int all_logits) {
    int TMAX = e->m->c.seq_len, V = e->m->c.vocab_size, share = e->o.prefix_reuse && e->o.kv_cache;
    kvt_pool *p = &e->pool;
    if (n < 1) return kvt_fail(KVT_EARG, "forward needs at least one token (got %d)", n);
    if ((long)s->len + n > TMAX)
        return kvt_fail(KVT_ECONTEXT, "%d cached + %d new positions exceed the model's context TMAX = %d",
                        s->len, n, TMAX);
    kvt_status st = check_tokens(e, tokens, n);
    if (st != KVT_OK) return st;
    if (s->n_swapped) return kvt_fail(KVT_EARG, "sequence %d is swapped out: swap it in first", s->id);
    int skip = s->len == 0 && share && !all_logits ? prefix_attach(p, e->live, s, tokens, n) : 0;
    st = seq_reserve(p, s, s->len + n - skip, "the sequence");
    if (st != KVT_OK) {
        if (skip) kvt_seq_reset(e, s); /* give back what prefix_attach took */
        return st;
    }
    tokens += skip; /* these positions are already in the attached chunks */
    n -= skip;
    double t0 = kvt_now();
    for (int done = 0; done < n; done += e->rows) { /* a long prefill goes in pieces of `rows` */
        int piece = n - done < e->rows ? n - done : e->rows, last = done + piece == n;
        stage_seq(e, 0, s, piece, s->len + done, 0);
        stage_upload(e, tokens + done, piece, s->n_table);
        int lastrow = piece - 1;
        forward_rows(e, piece, all_logits ? NULL : &lastrow, all_logits ? piece : 1);
        if (all_logits)
            buf_download(e->gpu, logits + (size_t)done * V, e->logits, (size_t)piece * V * sizeof(float));
        else if (last)
            buf_download(e->gpu, logits, e->logits, (size_t)V * sizeof(float));
    }
    memcpy(s->tokens + s->len, tokens, (size_t)n * sizeof(int));
    s->len += n;
    if (share) prefix_register(p, s, s->len - n);
    double dt = kvt_now() - t0; /* the logits download above waited for the GPU */
    if (n == 1) { e->t_decode += dt; e->n_decode++; }
    else { e->t_prefill += dt; e->n_prefill += n; }
    return KVT_OK;
}

/* The batched forward. The rows of all sequences go through every matmul
 * together (one weight read serves them all: that is the point of batching);
 * attention gives each row its own position, length and chunk table, so
 * sequences of different lengths need no padding. As in kvt_forward, all
 * checks (and the count of chunks needed) come before anything changes. */
kvt_status kvt_forward_batch(kvt_engine *e, kvt_seq *const *seqs, int n_seqs, const int *tokens, const int *ntok,
                             float *logits) {
    kvt_pool *p = &e->pool;
    int TMAX = e->m->c.seq_len, V = e->m->c.vocab_size, rows = 0, need = 0, tab = 0;
    if (n_seqs < 1 || n_seqs > e->o.max_seqs)
        return kvt_fail(KVT_EARG, "a batch of %d sequences: this engine takes 1..%d (max_seqs)", n_seqs, e->o.max_seqs);
    for (int i = 0; i < n_seqs; i++) {
        const kvt_seq *s = seqs[i];
        if (ntok[i] < 1) return kvt_fail(KVT_EARG, "sequence %d of the batch: %d new tokens", i, ntok[i]);
        if ((long)s->len + ntok[i] > TMAX)
            return kvt_fail(KVT_ECONTEXT, "sequence %d of the batch: %d cached + %d new positions exceed TMAX = %d",
                            i, s->len, ntok[i], TMAX);
        for (int j = 0; j < i; j++)
            if (seqs[j] == s) return kvt_fail(KVT_EARG, "sequence %d of the batch is also sequence %d", i, j);
        if (s->n_swapped) return kvt_fail(KVT_EARG, "sequence %d of the batch is swapped out: swap it in first", i);
        rows += ntok[i];
    }
    if (rows > e->rows) return kvt_fail(KVT_EARG, "a batch of %d rows: at most max_rows = %d", rows, e->rows);
    kvt_status st = check_tokens(e, tokens, rows);
    if (st != KVT_OK) return st;
    /* All chunks the batch needs, before any is taken, counted in the order
     * seq_reserve will take them. Forks that write into the same shared, partly
     * filled chunk each copy it, except the last holder, which then has it to
     * itself: each planned copy lowers the chunk's refcount here as
     * seq_reserve's release will, and the counts are put back afterwards. */
    int *copied = e->h_cow, n_copied = 0, cow = 0; /* at most one copy per sequence: n_seqs <= rows */
    for (int i = 0; i < n_seqs && st == KVT_OK; i++) {
        const kvt_seq *s = seqs[i];
        int c = seq_needs_cow(p, s, s->len + ntok[i]);
        need += seq_chunks_needed(p, s, s->len + ntok[i]);
        if (c) {
            copied[n_copied] = s->table[s->len / p->CH];
            p->refcount[copied[n_copied++]]--;
            cow++;
        }
        if (need > p->n_free)
            st = kvt_fail(KVT_EPOOL, "KV cache pool exhausted: sequence %d of the batch cannot grow to %d positions "
                          "(the batch needs %d more chunk(s) so far, %d of them copies of a shared chunk a fork "
                          "writes into; %d of %d are free): raise --chunks", i, s->len + ntok[i], need, cow,
                          p->n_free, p->n_chunks);
    }
    for (int k = 0; k < n_copied; k++) p->refcount[copied[k]]++;
    if (st != KVT_OK) return st;
    for (int i = 0, r = 0; i < n_seqs; i++) {
        kvt_seq *s = seqs[i];
        st = seq_reserve(p, s, s->len + ntok[i], "a sequence of the batch");
        KVT_ASSERT(st == KVT_OK); /* counted above */
        stage_seq(e, r, s, ntok[i], s->len, tab);
        r += ntok[i];
        e->h_out[i] = r - 1; /* only its last row's logits are used */
        tab += s->n_table;
    }
    double t0 = kvt_now();
    stage_upload(e, tokens, rows, tab);
    forward_rows(e, rows, e->h_out, n_seqs);
    buf_download(e->gpu, logits, e->logits, (size_t)n_seqs * V * sizeof(float));
    for (int i = 0, r = 0; i < n_seqs; i++) {
        kvt_seq *s = seqs[i];
        memcpy(s->tokens + s->len, tokens + r, (size_t)ntok[i] * sizeof(int));
        r += ntok[i];
        s->len += ntok[i];
        if (e->o.prefix_reuse && e->o.kv_cache) prefix_register(p, s, s->len - ntok[i]);
    }
    e->t_decode += kvt_now() - t0;
    e->n_decode += rows;
    return KVT_OK;
}

/* One generation step, the way the options say. With the cache, the
 * sequence already holds history[0 .. len) and only the new tokens run (one,
 * after the prompt). Without it, the sequence is emptied and all of history
 * runs again: the same logits, at a cost that grows with the length. A
 * history no longer than what is cached is an error (KVT_EARG). */
kvt_status kvt_step(kvt_engine *e, kvt_seq *s, const int *history, int n_hist, float *logits) {
    if (!e->o.kv_cache) kvt_seq_reset(e, s); /* no cache: forget everything, recompute */
    if (s->len >= n_hist)
        return kvt_fail(KVT_EARG, "step: %d tokens of history but %d already cached", n_hist, s->len);
    return kvt_forward(e, s, history + s->len, n_hist - s->len, logits, 0);
}

/* The pool seen from outside: the figures of --stats, the text of --trace
 * (kvt_pool_print, which gdb can call), the pool's consistency check and a
 * cached position read back as fp32 (the tests): cli/inspect.c, included
 * here. They read the engine's bookkeeping and change nothing. */
#include "cli/inspect.c"

// §16 tokenizer --------------------------------------------------------------------
/* Text to token ids and back: cli/tokenizer.c, included here. It reads
 * llama2.c's tokenizer.bin (BPE by merge score) and its byte-level variant
 * (GPT-2's byte alphabet, BPE by merge rank); the engine never sees text,
 * only ids. */
#include "cli/tokenizer.c"

// §17 sampling -----------------------------------------------------------------------
/* temperature 0: argmax (greedy). Otherwise softmax(logits / T) and a draw;
 * with top-p, only among the most likely tokens (nucleus sampling): the text
 * around the model, in cli/sampler.c, included here. */
#include "cli/sampler.c"

// §18 checks (compare two arrays) -------------------------------------------------------
/* One helper compares two arrays (GPU against CPU, a kernel against its
 * float64 spec) and says where they differ: make test and --check use it.
 * It is in cli/check.c, included here. */
#include "cli/check.c"

// §19 benchmarks ------------------------------------------------------------------------
/* The measurements behind --bench (bandwidth, decode, context, attention,
 * matmul, ...) are in bench/bench.c, included here: they are the harness
 * around the lesson, and only the command line uses them. */
#include "bench/bench.c"

// §20 command line ------------------------------------------------------------------------
/* The program around the engine (flags, the generation loop, --ppl,
 * --prompts, main) is in cli/cli.c, included here. */
#include "cli/cli.c"
