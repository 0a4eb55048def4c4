/* kvtransformer.cu §16: the tokenizer (llama2.c's tokenizer.bin), included by
 * kvtransformer.cu in the place of its section; it is the text around the model,
 * not part of the lesson on the cache. */
/* llama2.c's tokenizer.bin: int32 max_token_length, then per token: float32
 * score, int32 length, the bytes. Encoding is greedy BPE: start from one token
 * per UTF-8 character (or per byte, "<0xXX>", when the vocabulary has byte
 * fallback), then repeatedly merge the adjacent pair whose concatenation is the
 * vocabulary entry with the highest score (the leftmost of equal scores); a
 * heap makes that O(n log n) in the text length (bpe_merge). A character-level
 * vocabulary (the default model) has no multi-character entries, so nothing
 * ever merges. */
struct kvt_piece { char *str; int id; };

/* Lookup of a piece's id: the vocabulary sorted by text, then bsearch. */
static int piece_cmp(const void *a, const void *b) {
    return strcmp(((const struct kvt_piece *)a)->str, ((const struct kvt_piece *)b)->str);
}
/* The id of a vocabulary piece, or -1: binary search in the pieces sorted
 * once at load time (encoding looks up every candidate merge). */
static int tok_lookup(const kvt_tokenizer *t, const char *str) {
    struct kvt_piece key = {(char *)str, 0};
    const struct kvt_piece *hit = (const struct kvt_piece *)bsearch(&key, t->sorted, (size_t)t->vocab_size,
                                                                    sizeof(key), piece_cmp);
    return hit ? hit->id : -1;
}

/* The public form of tok_lookup: an exact piece, as a chat template's markers
 * ("<s>", "</s>") must be found; -1 when the vocabulary has no such piece. */
int kvt_piece_id(const kvt_tokenizer *t, const char *piece) { return tok_lookup(t, piece); }

void kvt_tokenizer_free(kvt_tokenizer *t) {
    if (t->vocab)
        for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
    free(t->vocab);
    free(t->scores);
    free(t->sorted);
    memset(t, 0, sizeof(*t));
}

/* Every read is checked, every length is bounded by max_token_length (itself
 * bounded), a piece may not contain a NUL, and the file must end exactly after
 * the V-th token: a tokenizer for another vocabulary size is caught here. */
kvt_status kvt_tokenizer_load(kvt_tokenizer *t, const char *path, int V) {
    memset(t, 0, sizeof(*t));
    FILE *f;
    kvt_status st = kvt_open_read(&f, path, "tokenizer");
    if (st != KVT_OK) return st;
    t->vocab_size = V;
    t->vocab = (char **)calloc((size_t)V, sizeof(char *));
    t->scores = (float *)malloc((size_t)V * sizeof(float));
    t->sorted = (struct kvt_piece *)malloc((size_t)V * sizeof(struct kvt_piece));
    if (!t->vocab || !t->scores || !t->sorted) st = kvt_fail(KVT_ENOMEM, "host out of memory (tokenizer)");
    if (st == KVT_OK && fread(&t->max_token_length, sizeof(int), 1, f) != 1)
        st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': too short for its 4-byte header", path);
    if (st == KVT_OK && (t->max_token_length < 1 || t->max_token_length > 1024))
        st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': max_token_length %d is out of range [1, 1024]",
                      path, t->max_token_length);
    for (int i = 0; i < V && st == KVT_OK; i++) {
        int len;
        if (fread(&t->scores[i], sizeof(float), 1, f) != 1 || fread(&len, sizeof(int), 1, f) != 1) {
            st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': ends at token %d, the model has V = %d tokens",
                          path, i, V);
            break;
        }
        if (len < 0 || len > t->max_token_length || t->scores[i] != t->scores[i]) {
            st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': token %d has length %d (allowed 0..%d) or a NaN score",
                          path, i, len, t->max_token_length);
            break;
        }
        t->vocab[i] = (char *)malloc((size_t)len + 1);
        if (!t->vocab[i]) { st = kvt_fail(KVT_ENOMEM, "host out of memory (tokenizer)"); break; }
        if (len > 0 && fread(t->vocab[i], 1, (size_t)len, f) != (size_t)len) {
            st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': ends inside token %d", path, i);
            break;
        }
        t->vocab[i][len] = '\0';
        if (strlen(t->vocab[i]) != (size_t)len) {
            st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': token %d contains a NUL byte", path, i);
            break;
        }
    }
    if (st == KVT_OK && fgetc(f) != EOF)
        st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': bytes left after V = %d tokens (a tokenizer for "
                      "another model?)", path, V);
    fclose(f);
    if (st != KVT_OK) { kvt_tokenizer_free(t); return st; }
    for (int i = 0; i < V; i++) { t->sorted[i].str = t->vocab[i]; t->sorted[i].id = i; }
    qsort(t->sorted, (size_t)V, sizeof(struct kvt_piece), piece_cmp);
    /* Sentencepiece vocabularies (Llama's) list the 256 bytes as <0x00>..<0xFF>
     * at ids 3..258, and were trained with a space before the first word; a
     * character vocabulary (ours) has neither, so neither is applied. */
    t->byte_fallback = V >= 259 && !strcmp(t->vocab[3], "<0x00>") && !strcmp(t->vocab[258], "<0xFF>");
    t->dummy_prefix = t->byte_fallback;
    for (int i = 0; i < 256; i++) { t->byte_piece[2 * i] = (char)i; t->byte_piece[2 * i + 1] = '\0'; }
    return KVT_OK;
}

/* One token per UTF-8 character of `len` bytes of text (or one per byte,
 * <0xXX>, for a character the vocabulary lacks, when it has byte fallback),
 * after a " " when `dummy`; appends to tokens[*n..] (room for len + 1 more). */
static kvt_status encode_chars(const kvt_tokenizer *t, const char *text, size_t len, int dummy, int *tokens,
                               int *n) {
    char buf[8]; /* one character: at most 4 bytes */
    if (dummy && len > 0) {
        int id = tok_lookup(t, " ");
        if (id >= 0) tokens[(*n)++] = id;
    }
    for (size_t i = 0; i < len;) { /* one UTF-8 character: a lead byte and its continuation bytes */
        size_t cl = 1;
        while (i + cl < len && cl < 4 && ((unsigned char)text[i + cl] & 0xC0) == 0x80) cl++;
        memcpy(buf, text + i, cl);
        buf[cl] = '\0';
        int id = tok_lookup(t, buf);
        if (id >= 0) {
            tokens[(*n)++] = id;
        } else if (t->byte_fallback) {
            for (size_t j = 0; j < cl; j++) tokens[(*n)++] = (unsigned char)text[i + j] + 3;
        } else {
            return kvt_fail(KVT_EARG, "text: character '%s' (byte 0x%02x at offset %zu) is not in the vocabulary",
                            buf, (unsigned char)text[i], i);
        }
        i += cl;
    }
    return KVT_OK;
}

/* The id of the piece whose text is token a's followed by token b's, or -1.
 * buf has room for 2 * max_token_length + 1 bytes: no piece is longer than
 * max_token_length (the loader checks). */
static int pair_lookup(const kvt_tokenizer *t, int a, int b, char *buf) {
    size_t la = strlen(t->vocab[a]);
    memcpy(buf, t->vocab[a], la);
    strcpy(buf + la, t->vocab[b]);
    return tok_lookup(t, buf);
}

/* BPE merging. The spec is llama2.c's greedy loop:
 *
 *     repeat:
 *         for every adjacent pair (tokens[i], tokens[i+1]), look up the text
 *             vocab[tokens[i]] followed by vocab[tokens[i+1]];
 *         among the pairs that are pieces take the highest score; among equal
 *             scores the leftmost (the scan keeps the first strictly greater);
 *         none: stop;
 *         tokens[i] = that piece; shift tokens[i+2..] left by one.
 *
 * Every round rescans all pairs and a text of n characters can take n - 1
 * rounds: O(n^2) lookups (57 s for 20 KB of 'a' with the pieces "aa", "aaaa",
 * "aaaaaaaa"). bpe_merge gives the same tokens in O(n log n):
 *
 *   - the tokens are a doubly linked list over their first positions
 *     (prev[i], next[i]). A merge keeps the left token's position and unlinks
 *     the right one, so positions stay in text order: "leftmost" is
 *     "smallest position";
 *   - a heap holds the candidate merges, best first: score descending, then
 *     position ascending, the spec's tie-break;
 *   - a merge changes just two pairs, (left neighbour, merged token) and
 *     (merged token, right neighbour): only those are looked up and pushed;
 *   - the pairs a merge destroyed stay in the heap (taking an entry out of the
 *     middle of a heap is awkward). Each token has a version, bumped when it
 *     changes or leaves the list; a popped candidate whose tokens' versions
 *     are not the ones it was pushed with is stale and skipped.
 *
 *     position   0   1   2   3                   merge 1+2, the best:   0   1    3
 *     token      a   a   b   c                                          a   ab   c
 *     heap       (5, 1) "ab", (4, 0) "aa", (3, 2) "bc"      (score, position)
 *
 *     ver[1]++ and ver[2]++ make (4, 0) and (3, 2) stale; the new pairs
 *     (0, 1) "aab" and (1, 3) "abc" are pushed if they are pieces.
 *
 * Every pair in the list is in the heap with its current versions, so the
 * best valid candidate is the pair the spec's scan picks, and the result is
 * the same token for token (test.c compares the two on random text). A piece
 * scored at or below BPE_NO_MERGE never merges: that is the spec's starting
 * "best". */
#define BPE_NO_MERGE (-1e30f)

/* A candidate merge: the token at position l and its right neighbour make the
 * piece `id`; ver_l and ver_r are the two tokens' versions when it was pushed. */
typedef struct { float score; int id, l, ver_l, ver_r; } bpe_cand;
/* A binary heap in an array: c[0] is the best, and c[i] comes before its
 * children c[2i+1] and c[2i+2]. */
typedef struct { bpe_cand *c; int n, cap; } bpe_heap;

/* Does candidate a merge before b? The higher score; of equal scores, the leftmost. */
static int cand_before(const bpe_cand *a, const bpe_cand *b) {
    return a->score > b->score || (a->score == b->score && a->l < b->l);
}

/* A binary heap of merge candidates, best (highest score, then leftmost) on
 * top: push and pop are O(log n), so encoding n characters is O(n log n)
 * instead of rescanning all pairs after every merge. */
static void heap_push(bpe_heap *h, bpe_cand c) {
    if (h->n == h->cap) { /* at most n - 1 first pairs and 2 per merge, usually far fewer at once */
        h->cap = 2 * h->cap + 16;
        h->c = (bpe_cand *)realloc(h->c, (size_t)h->cap * sizeof(bpe_cand));
        KVT_ASSERT(h->c);
    }
    int i = h->n++;
    while (i > 0 && cand_before(&c, &h->c[(i - 1) / 2])) { /* sift up: worse parents move down into the hole */
        h->c[i] = h->c[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->c[i] = c;
}

static bpe_cand heap_pop(bpe_heap *h) {
    bpe_cand top = h->c[0], last = h->c[--h->n];
    int i = 0;
    for (;;) { /* sift down: the hole at i takes `last`, or the better child moves up into it */
        int k = 2 * i + 1;
        if (k >= h->n) break;
        if (k + 1 < h->n && cand_before(&h->c[k + 1], &h->c[k])) k++;
        if (!cand_before(&h->c[k], &last)) break;
        h->c[i] = h->c[k];
        i = k;
    }
    h->c[i] = last;
    return top;
}

/* Push the pair (l, r) of adjacent tokens if their texts make a piece that may merge. */
static void push_pair(const kvt_tokenizer *t, bpe_heap *h, const int *tokens, const int *ver, int l, int r,
                      char *buf) {
    int id = pair_lookup(t, tokens[l], tokens[r], buf);
    if (id < 0 || t->scores[id] <= BPE_NO_MERGE) return; /* (the loader rejects NaN scores) */
    bpe_cand c;
    c.score = t->scores[id];
    c.id = id;
    c.l = l;
    c.ver_l = ver[l];
    c.ver_r = ver[r];
    heap_push(h, c);
}

/* Merge tokens[0..n) in place (the spec above); returns the new count. */
static int bpe_merge(const kvt_tokenizer *t, int *tokens, int n) {
    if (n < 2) return n;
    int *prev = (int *)kvt_malloc(3 * (size_t)n * sizeof(int)), *next = prev + n, *ver = next + n; /* (n) each */
    char *buf = (char *)kvt_malloc(2 * (size_t)t->max_token_length + 1);
    bpe_heap h = {NULL, 0, 0};
    for (int i = 0; i < n; i++) {
        prev[i] = i - 1;             /* -1: none */
        next[i] = i + 1 < n ? i + 1 : -1;
        ver[i] = 0;
    }
    for (int i = 0; i + 1 < n; i++) push_pair(t, &h, tokens, ver, i, i + 1, buf);
    while (h.n > 0) {
        bpe_cand c = heap_pop(&h);
        int l = c.l, r = next[l];
        /* l unchanged (still in the list, nothing merged into it) means its right
         * neighbour is still the token it was pushed with; that one must be unchanged too. */
        if (ver[l] != c.ver_l || ver[r] != c.ver_r) continue;
        tokens[l] = c.id;
        ver[l]++;
        ver[r]++;
        next[l] = next[r]; /* unlink r */
        if (next[r] >= 0) prev[next[r]] = l;
        if (prev[l] >= 0) push_pair(t, &h, tokens, ver, prev[l], l, buf);
        if (next[l] >= 0) push_pair(t, &h, tokens, ver, l, next[l], buf);
    }
    int m = 0; /* walk the list from position 0 (the first token is never merged away: it has no left neighbour) */
    for (int i = 0; i >= 0; i = next[i]) tokens[m++] = tokens[i];
    free(h.c);
    free(buf);
    free(prev);
    return m;
}

/* Encode `len` bytes of text, appending to tokens[*n..] (room for len + 1 more). */
static kvt_status encode_piece(const kvt_tokenizer *t, const char *text, size_t len, int dummy, int *tokens,
                               int *n) {
    int start = *n;
    kvt_status st = encode_chars(t, text, len, dummy, tokens, n);
    if (st == KVT_OK) *n = start + bpe_merge(t, tokens + start, *n - start);
    return st;
}

/* Encode into a scratch array sized for the worst case (one token per byte,
 * plus BOS and the dummy prefix), then copy out only if it fits: a prompt that
 * is too long is an error with its length, never a silent truncation. A token
 * holds at most max_token_length bytes of the text (a byte token <0xXX> holds
 * one), so a text of len bytes is at least ceil(len / max_token_length) tokens:
 * one that cannot fit is rejected before it is encoded. */
kvt_status kvt_encode(const kvt_tokenizer *t, const char *text, int bos, int *tokens, int max_tokens,
                      int *n_tokens) {
    size_t len = strlen(text), maxlen = (size_t)t->max_token_length;
    size_t least = (bos ? 1 : 0) + (len + maxlen - 1) / maxlen;
    *n_tokens = 0;
    if (max_tokens >= 0 && least > (size_t)max_tokens)
        return kvt_fail(KVT_ECONTEXT, "the text is at least %zu tokens, more than the %d that fit", least, max_tokens);
    int *tmp = (int *)malloc((len + 3) * sizeof(int)), n = 0;
    if (!tmp) return kvt_fail(KVT_ENOMEM, "host out of memory (encoding %zu bytes)", len);
    if (bos) tmp[n++] = KVT_BOS;
    kvt_status st = encode_piece(t, text, len, t->dummy_prefix, tmp, &n);
    if (st == KVT_OK && n > max_tokens)
        st = kvt_fail(KVT_ECONTEXT, "the text is %d tokens, more than the %d that fit", n, max_tokens);
    if (st == KVT_OK) memcpy(tokens, tmp, (size_t)n * sizeof(int));
    *n_tokens = st == KVT_OK ? n : 0;
    free(tmp);
    return st;
}

/* A piece to print: sentencepiece's word-initial space is dropped after BOS,
 * and a byte token "<0x41>" becomes the byte itself. */
const char *kvt_decode(const kvt_tokenizer *t, int prev, int tok) {
    const char *piece = t->vocab[tok];
    unsigned int byte;
    if (prev == KVT_BOS && piece[0] == ' ') piece++; /* sentencepiece's leading space */
    if (sscanf(piece, "<0x%02X>", &byte) == 1 && strlen(piece) == 6) return t->byte_piece + 2 * byte;
    return piece;
}
