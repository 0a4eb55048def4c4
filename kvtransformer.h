/* kvtransformer.h - the public C API of kvtransformer.cu (declarations only).
 *
 * Dimension legend (used in every shape comment, here and in the .cu file):
 *   L layers, D model dim, NH query heads, NKV kv heads, HS head size (D/NH),
 *   KVD = NKV*HS, HD FFN hidden, V vocab, T positions so far, TMAX max positions,
 *   CH positions per cache chunk, G channels per int8 quantization scale,
 *   n rows (new tokens) in one forward call.
 *
 * Errors: every function that faces user input returns a kvt_status; on failure
 * kvt_last_error() holds one readable line saying what was expected and found.
 * Nothing here calls exit(); broken invariants and CUDA failures stop the program
 * through kvt_fatal ("[KVT ERROR] file:line: ...").
 */
#ifndef KVTRANSFORMER_H
#define KVTRANSFORMER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h> /* FILE, for kvt_pool_print */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVT_OK = 0,
    KVT_EIO,       /* a file could not be opened or read */
    KVT_EFORMAT,   /* a file is truncated, oversized or inconsistent */
    KVT_EARG,      /* an option or argument is out of range */
    KVT_ECONTEXT,  /* more positions than the model's context TMAX */
    KVT_EPOOL,     /* the KV chunk pool has no free chunk left */
    KVT_ENOMEM,    /* host or device allocation failed */
} kvt_status;

const char *kvt_last_error(void);

/* ---- model ------------------------------------------------------------- */

/* The 7 int32 header of a llama2.c checkpoint, in file order. */
typedef struct {
    int dim;        /* D */
    int hidden_dim; /* HD */
    int n_layers;   /* L */
    int n_heads;    /* NH */
    int n_kv_heads; /* NKV */
    int vocab_size; /* V (negative in the file: unshared classifier) */
    int seq_len;    /* TMAX */
} kvt_config;

/* Pointers into one float buffer, in the checkpoint's order. */
typedef struct {
    float *token_embedding; /* (V, D) */
    float *rms_att;         /* (L, D) */
    float *wq;              /* (L, D, D)   rows = outputs (NH*HS), cols = inputs */
    float *wk;              /* (L, KVD, D) */
    float *wv;              /* (L, KVD, D) */
    float *wo;              /* (L, D, D) */
    float *rms_ffn;         /* (L, D) */
    float *w1;              /* (L, HD, D)  gate */
    float *w2;              /* (L, D, HD)  down */
    float *w3;              /* (L, HD, D)  up */
    float *rms_final;       /* (D) */
    float *wcls;            /* (V, D)  == token_embedding when shared */
} kvt_weights;

typedef struct {
    kvt_config c;         /* vocab_size here is always positive */
    int shared_classifier;/* 1: wcls is the token embedding */
    int head_size;        /* HS = D / NH */
    int kv_dim;           /* KVD = NKV * HS */
    float rope_theta;     /* RoPE base: 10000 (llama2.c's), or the file's "rope" extension */
    float *data;          /* every weight, (n_floats) */
    size_t n_floats;
    kvt_weights w;        /* host pointers into data */
    float *d_data;        /* device copy (GPU path only), else NULL */
    kvt_weights d_w;      /* device pointers into d_data */
} kvt_model;

/* Load a llama2.c (legacy, version 0) checkpoint, or one with the RoPE-base
 * extension (4 bytes "rope" and a float32 base after the header). Sizes are
 * checked against the file length before anything is allocated. */
kvt_status kvt_model_load(kvt_model *m, const char *path);
/* A deterministic random model of the given shape (for tests and benchmarks). */
kvt_status kvt_model_random(kvt_model *m, kvt_config c, uint64_t seed);
/* Validate a header; used by both of the above. */
kvt_status kvt_config_check(const kvt_config *c);
void kvt_model_free(kvt_model *m);

/* ---- tokenizer ----------------------------------------------------------- */

struct kvt_piece; /* (text, id), defined in cli/tokenizer.c (§16) */
struct kvt_merge; /* (left, right) -> (rank, id), defined in cli/tokenizer.c (§16) */
struct kvt_prob;  /* (probability, id), defined in cli/sampler.c (§17) */

/* How a byte-level file splits text before merging (its trailer says which). */
typedef enum { KVT_PRE_NONE = 0, KVT_PRE_GPT2 = 1, KVT_PRE_SMOLLM = 2 } kvt_pre_tokenizer;

typedef struct {
    int vocab_size;        /* V */
    char **vocab;          /* (V) NUL-terminated pieces (byte-level: in GPT-2's byte-to-unicode form, "Ġthe") */
    float *scores;         /* (V) BPE merge priority (legacy files) */
    int max_token_length;
    struct kvt_piece *sorted; /* (V) pieces sorted by text, for lookup */
    int byte_fallback;     /* 1: ids 3..258 are <0x00>..<0xFF> */
    int dummy_prefix;      /* 1: prepend " " (sentencepiece vocabularies: those with byte fallback) */
    char byte_piece[512];  /* (256) one-char strings for raw bytes */
    int bos_id, eos_id;    /* legacy files: KVT_BOS, KVT_EOS; byte-level: the trailer's (bos_id -1: none) */
    kvt_pre_tokenizer pre_tokenizer; /* KVT_PRE_NONE: a legacy file (greedy merges by score) */
    int n_merges;
    struct kvt_merge *merges; /* (n_merges) byte-level merge table sorted by (left, right) */
    int byte_id[256];      /* byte-level: the id of each byte's one-character piece, -1 if none */
    char **text;           /* (V) byte-level: each piece's bytes, what decode returns */
} kvt_tokenizer;

#define KVT_BOS 1 /* the legacy (llama2.c) ids; a tokenizer's own are bos_id, eos_id */
#define KVT_EOS 2

kvt_status kvt_tokenizer_load(kvt_tokenizer *t, const char *path, int vocab_size);
void kvt_tokenizer_free(kvt_tokenizer *t);
/* Encode text (bos_id first when bos != 0 and bos_id >= 0) into tokens (at most max_tokens). */
kvt_status kvt_encode(const kvt_tokenizer *t, const char *text, int bos,
                      int *tokens, int max_tokens, int *n_tokens);
/* The text of token `tok` when it follows `prev` ("<0x41>" becomes "A"; a
 * byte-level piece its raw bytes, maybe part of a UTF-8 character). */
const char *kvt_decode(const kvt_tokenizer *t, int prev, int tok);
/* The id of the piece spelled exactly `piece` (no encoding, no merging), or -1:
 * how a chat template finds its markers, such as "<s>" and "</s>". */
int kvt_piece_id(const kvt_tokenizer *t, const char *piece);

/* ---- KV cache: a pool of chunks, a chunk table per sequence ------------- */

typedef enum { KVT_FP32 = 0, KVT_FP16 = 1, KVT_INT8 = 2 } kvt_dtype;

typedef struct {
    int L, NKV, HS;      /* shape of one position: L layers x (K, V) x NKV x HS */
    int CH;              /* positions per chunk */
    int n_chunks;        /* capacity */
    kvt_dtype dtype;
    int G;               /* int8: channels per scale */
    size_t chunk_elems;  /* elements per chunk: L * 2 * CH * NKV * HS */
    size_t chunk_scales; /* scales per chunk (int8): L * 2 * CH * NKV * HS/G */
    void *data;          /* (n_chunks, L, 2, CH, NKV, HS) fp32/fp16 bits/int8 */
    float *scales;       /* (n_chunks, L, 2, CH, NKV, HS/G) int8 only, else NULL */
    int on_device;       /* data/scales are device pointers */
    int *refcount;       /* (n_chunks) host bookkeeping */
    int *free_list;      /* (n_chunks) stack of free chunk ids */
    int n_free;
    int peak_used;
    long shared_hits;    /* times a chunk was shared instead of copied (fork) */
    long cow_copies;     /* copy-on-write copies */
    uint64_t *prefix_hash; /* (n_chunks) for a full chunk: hash of all tokens up to its end; 0 = none */
    long prefix_hits;    /* prompt chunks found cached in another live sequence */
    long prefix_misses;  /* prompt chunks that had to be computed */
    long prefix_collisions; /* hash hits whose tokens differed (a 64-bit hash can collide): not attached */
    /* The host swap area (kvt_options.swap_chunks): slots of one chunk each, in
     * host memory whichever device holds the pool. A sequence swapped out keeps
     * its table; each entry it alone held becomes KVT_SWAPPED(slot). */
    int n_swap;          /* slots */
    int n_swap_free;
    int *swap_free;      /* (n_swap) stack of free slot ids */
    char *swap_data;     /* (n_swap, chunk bytes) the chunks' data */
    float *swap_scales;  /* (n_swap, chunk_scales) int8 only, else NULL */
    uint64_t *swap_hash; /* (n_swap) the prefix hash each chunk had (restored by swap-in) */
    long swap_out_chunks, swap_in_chunks; /* chunks copied out / back in */
    double t_swap_out, t_swap_in;         /* seconds the copies took */
} kvt_pool;
/* A table entry that is in the host swap area's slot k (see kvt_seq_swap_out). */
#define KVT_SWAPPED(k) (-2 - (k))
#define KVT_SWAP_SLOT(entry) (-2 - (entry))

typedef struct kvt_seq {
    int len;          /* T: positions cached */
    int n_table;      /* chunks owned (ceil(len / CH) after a forward) */
    int max_table;    /* ceil(TMAX / CH) */
    int *table;       /* (max_table) logical chunk -> physical chunk id */
    int *tokens;      /* (TMAX) the tokens whose K/V are cached (for prefix reuse) */
    char *how;        /* (max_table) how this sequence got each entry's chunk: 0 taken from the pool
                       * (or shared by kvt_seq_fork), 'c' copied on write, '+' attached by prefix reuse */
    int n_swapped;    /* table entries now in the host swap area (0: the sequence can run) */
    int id;           /* 0, 1, 2, ... in the order kvt_seq_init made them on this engine (a caller may
                       * renumber: --serve sets it to the request's number) */
    struct kvt_seq *live_prev, *live_next; /* the engine's list of live sequences (kvt_pool_print) */
} kvt_seq;

/* ---- engine: a model on a device with a pool and scratch buffers -------- */

typedef enum { KVT_CPU = 0, KVT_GPU = 1 } kvt_device;
typedef enum { KVT_ATTN_NAIVE = 0, KVT_ATTN_FUSED = 1 } kvt_attn;

typedef struct {
    kvt_device device;
    kvt_attn attn;
    int kv_cache;     /* 1: cached decode; 0: recompute the whole sequence each step */
    int CH;           /* positions per chunk (1..TMAX) */
    int n_chunks;     /* pool size; 0 = enough for max_seqs full sequences */
    int max_seqs;     /* sequences that may be live at once (default 1) */
    kvt_dtype kv_dtype;
    int kv_group;     /* G for int8 (must divide HS); 0 = automatic (kvt_kv_group_auto: 32, 16, or HS's largest divisor < 32) */
    /* A look at the attention weights (--dump-attn): when attn_probe is set, every
     * forward call hands it, layer by layer (only layer attn_layer when that is >= 0),
     * the softmax weights of its n rows: w (n, NH, TMAX), row r's head h at
     * w[(r * NH + h) * TMAX + t] for the keys t <= pos[r] (pos (n): the rows'
     * positions). The naive path has them; the fused path, which never forms them,
     * computes them once more from the same q and cached K (§15, attn_probe_rows). */
    void (*attn_probe)(void *ctx, int layer, int n, const int *pos, const float *w, int NH, int TMAX);
    void *attn_ctx;
    int attn_layer;   /* -1 (the default): every layer */
    int split_len;    /* fused attention (CPU and GPU): positions per split; 0 = automatic, -1 = never */
    int max_rows;     /* most rows per forward call (longer prefills are cut) */
    int prefix_reuse; /* 1: a new sequence reuses full chunks of a live one with the same prefix */
    int swap_chunks;  /* host swap area, in chunks (kvt_seq_swap_out); 0: none */
    int plain;        /* 1: every op runs the file's own version (no cpu/ or gpu/ tuning): slower, for reading and gdb */
} kvt_options;

void kvt_options_default(kvt_options *o);
int kvt_kv_group_auto(int HS); /* the int8 group an engine picks for head size HS when kv_group is 0 */

typedef struct kvt_engine kvt_engine; /* opaque; defined in kvtransformer.cu */

kvt_status kvt_engine_create(kvt_engine **e, kvt_model *m, const kvt_options *o);
void kvt_engine_free(kvt_engine *e);
kvt_pool *kvt_engine_pool(kvt_engine *e);

kvt_status kvt_seq_init(kvt_engine *e, kvt_seq *s);
void kvt_seq_reset(kvt_engine *e, kvt_seq *s); /* return its chunks; len = 0 */
void kvt_seq_free(kvt_engine *e, kvt_seq *s);
/* dst shares all of src's chunks (refcounts go up); writing copies a shared
 * partly filled chunk first (copy-on-write). */
kvt_status kvt_seq_fork(kvt_engine *e, kvt_seq *dst, const kvt_seq *src);
/* Prefix reuse by hand, for a caller that batches (kvt_forward does it by
 * itself): point the empty s at the live chunks that hold full chunks of
 * tokens[0..n), always leaving the last token to compute. A hash hit counts only
 * when a live holder's tokens confirm it. Returns the positions attached
 * (s->len); they need no forward. */
int kvt_seq_attach(kvt_engine *e, kvt_seq *s, const int *tokens, int n);
/* Chunks only s holds (refcount 1): what kvt_seq_reset or a swap-out frees. */
int kvt_seq_private_chunks(const kvt_engine *e, const kvt_seq *s);
/* Swap out: copy the chunks only s holds into free slots of the host swap area
 * (device to host on the GPU), free them, and mark their table entries
 * KVT_SWAPPED(slot); chunks shared with another sequence stay, pinned. Fails
 * (KVT_EPOOL, nothing changed) when the area lacks the slots. Swap in: copy them
 * into whatever chunks are free, restoring the table and the prefix hashes
 * (KVT_EPOOL, nothing changed, when the pool lacks the chunks). A swapped-out
 * sequence cannot run or be forked; kvt_seq_reset frees its slots. */
kvt_status kvt_seq_swap_out(kvt_engine *e, kvt_seq *s);
kvt_status kvt_seq_swap_in(kvt_engine *e, kvt_seq *s);
/* Test hook: the prefix hash keeps only its low kvt_prefix_hash_bits bits (64:
 * all). 1 makes nearly every chunk collide, so the tests can see that a hit is
 * confirmed against the tokens before it is shared. */
extern int kvt_prefix_hash_bits;
/* Refcounts match the tables of these live sequences; nothing free is held; each
 * '+' entry (how) is a full chunk that still has its prefix hash; each swap
 * slot is held by exactly one table entry or is free. seqs NULL: the
 * engine's own list of live sequences (made by kvt_seq_init or _fork, not yet freed). */
kvt_status kvt_pool_check(kvt_engine *e, const kvt_seq *const *seqs, int n_seqs);

/* The pool as plain ASCII text, for --trace, the tests and gdb (`call
 * kvt_pool_print(stdout, e)`). It only reads (refcounts, free list, tables) and
 * flushes f. One line per sequence, its table in order, then the pool, then totals
 * (here: a second request that found the first 3 chunks of a live one cached):
 *
 *   seq 0 [ 0* 1* 2* 3 4 (3/4) ] len 19
 *   seq 1 [ 0*+ 1*+ 2*+ 5 6 (2/4) ] len 18
 *   pool [***####.........]
 *   totals: in use 7, free 9, shared 3 (of 16 chunks); 10 table entries: sharing saves 3 x 4096 = 12288 bytes
 *
 * seq N: the sequence's id; each entry is a chunk id, then * when the chunk is shared
 * (refcount > 1), then c when this sequence copied it on write (2c), or + when it
 * attached it by prefix reuse; (f/CH): the last chunk holds f < CH positions; len T.
 * An entry in the host swap area shows as hK (slot K); any other entry < 0 holds
 * no chunk and shows as -. pool: one character per chunk, . free,
 * # held by one table, * shared, 64 to a row; a pool of more than 64 follows each row
 * with the chunk ids it shows (0..63), draws the first 512 and counts the rest on one
 * line ("+ chunks 512..4095 not drawn: in use 3, shared 1, free 3581"). totals: from
 * the refcounts alone; table entries - chunks in use = the chunks sharing saves
 * (bytes_unshared - bytes_used of kvt_cache_usage_of). With the cache off (kv_cache
 * 0), one line says so instead. */
void kvt_pool_print_seqs(FILE *f, kvt_engine *e, const kvt_seq *const *seqs, int n_seqs);
/* The same for every live sequence of the engine, in the order they were made. */
void kvt_pool_print(FILE *f, kvt_engine *e);
/* That format's legend, 4 lines (--trace prints it once, first). */
void kvt_pool_legend(FILE *f);

/* Run n new tokens at positions seq->len .. seq->len+n-1. They attend causally to
 * the cached positions and to each other; their K/V are appended to the cache.
 * logits: (n, V) when all_logits, else (V) for the last token. On any error
 * nothing has been written and seq is unchanged. */
kvt_status kvt_forward(kvt_engine *e, kvt_seq *seq, const int *tokens, int n,
                       float *logits, int all_logits);

/* Batched forward: ntok[i] new tokens for sequence seqs[i] (tokens concatenated
 * in sequence order, at most max_rows in all), each at its own position and
 * attending over its own chunk table; one matmul serves all rows. logits
 * (n_seqs, V): the last row of each sequence. On an error (the message names
 * the sequence) no sequence has changed. */
kvt_status kvt_forward_batch(kvt_engine *e, kvt_seq *const *seqs, int n_seqs, const int *tokens,
                             const int *ntok, float *logits);

/* One generation step as the options say: with the cache, run the tokens not yet
 * cached, history[seq->len .. n_hist) (one, after the prompt); without it
 * (kv_cache = 0), reset seq and re-run all of history[0..n_hist). */
kvt_status kvt_step(kvt_engine *e, kvt_seq *seq, const int *history, int n_hist,
                    float *logits);

/* What the cache holds for these live sequences. */
typedef struct {
    int chunks_used;       /* distinct chunks the sequences hold */
    long slots_allocated;  /* chunks_used * CH */
    long slots_unused;     /* allocated slots no sequence has written (chunk tails) */
    double bytes_used;     /* chunks_used * bytes per chunk */
    double bytes_unshared; /* what the same sequences would hold with no sharing */
    double bits_per_value; /* 32, 16, or 8 + 32/G */
} kvt_cache_usage;
void kvt_cache_usage_of(kvt_engine *e, const kvt_seq *const *seqs, int n_seqs, kvt_cache_usage *u);

/* Read back cached K or V (dequantized to fp32) of one position: out (NKV, HS). */
void kvt_cache_read(kvt_engine *e, const kvt_seq *s, int layer, int kv, int pos,
                    float *out);

/* ---- sampling ------------------------------------------------------------ */

typedef struct {
    float temperature; /* 0 = greedy */
    float topp;        /* nucleus threshold in (0, 1]; 1 = off */
    uint64_t state;    /* xorshift state (from the seed) */
    struct kvt_prob *cand; /* (V) scratch for top-p */
} kvt_sampler;

void kvt_sampler_init(kvt_sampler *s, int V, float temperature, float topp, uint64_t seed);
void kvt_sampler_free(kvt_sampler *s);
int kvt_sample(kvt_sampler *s, float *logits, int V); /* modifies logits */
int kvt_argmax(const float *x, int n);

/* ---- int8 / fp16 helpers (exposed for tests) ----------------------------- */

uint16_t kvt_f32_to_f16(float x);
float kvt_f16_to_f32(uint16_t h);
/* Quantize one group of g values: returns the scale, writes q (g). */
float kvt_quantize_group(const float *x, int8_t *q, int g);

#ifdef __cplusplus
}
#endif
#endif
