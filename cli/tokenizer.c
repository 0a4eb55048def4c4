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
 * ever merges.
 *
 * Byte-level BPE (GPT-2's, SmolLM2's) is the second kind: the same file
 * followed by a trailer, "BBPE", the pre-tokenizer, bos_id, eos_id and the
 * merges as pairs of ids (read_trailer checks it). What differs, and why:
 *
 *   - It works on bytes, not characters. Any text is a sequence of bytes, so
 *     256 starting pieces cover every string in every script and no
 *     character is ever "not in the vocabulary".
 *   - The pieces are stored as printable text. GPT-2's byte-to-unicode table
 *     names each byte by one character: the 188 printable bytes ('!'..'~',
 *     0xA1..0xAC, 0xAE..0xFF) stand for themselves, the other 68 (space,
 *     newline, other control bytes, 0x7F..0xA0, 0xAD) for U+0100, U+0101, ...
 *     in byte order. So the space is "Ġ" (U+0120), the newline "Ċ", and the
 *     piece for " the" is "Ġthe": every piece is a visible string, and no
 *     piece contains a space or a NUL.
 *   - Merges go by rank, not score. Training recorded the merges in the order
 *     it learned them, "Ġ t" first (rank 0), then "Ġ a", "i n", ...; encoding
 *     replays them: of all adjacent pairs that have a merge, the one with the
 *     lowest rank merges first (the leftmost of equal ranks). That can differ
 *     from merging the leftmost pair first: with the ranks "b c" 0, "a b" 1,
 *     "ab c" 2, "abc" is a + bc, not abc (test.c checks it). The heap of
 *     the legacy merging does it, with minus the rank as the priority.
 *   - A pre-tokenizer first cuts the text into chunks, and merges never cross
 *     a chunk: words, numbers, punctuation and whitespace are merged on their
 *     own, so a piece never glues the end of one word to the next. See
 *     gpt2_match below for GPT-2's rules; the "smollm" kind first makes every
 *     digit a chunk of its own (so "2024" is four tokens, the same four in
 *     every number).
 *
 * Special tokens such as "<|im_start|>" are pieces too, but text is only
 * text: the string "<|im_start|>" in a prompt is encoded as the characters
 * '<', '|', ... (Hugging Face would give the marker's id); a chat template
 * inserts the markers by id (kvt_piece_id). */
struct kvt_piece { char *str; int id; };
#include "unicode_ranges.h" /* uni_letter, uni_number, uni_space: the pre-tokenizer's classes */

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

/* A byte-level merge: the adjacent pieces (left, right) become piece `id`;
 * `rank` is its place in the file's list, 0 first. The table is sorted by
 * (left, right) and searched with bsearch, once per candidate pair. */
struct kvt_merge { int left, right, rank, id; };

static int merge_cmp(const void *a, const void *b) { /* by (left, right), then rank */
    const struct kvt_merge *x = (const struct kvt_merge *)a, *y = (const struct kvt_merge *)b;
    if (x->left != y->left) return x->left < y->left ? -1 : 1;
    if (x->right != y->right) return x->right < y->right ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}
static int merge_pair_cmp(const void *a, const void *b) { /* by (left, right) only: the search */
    const struct kvt_merge *x = (const struct kvt_merge *)a, *y = (const struct kvt_merge *)b;
    if (x->left != y->left) return x->left < y->left ? -1 : 1;
    return (x->right > y->right) - (x->right < y->right);
}
/* The merge of the adjacent pieces a, b, or NULL when they do not merge. */
static const struct kvt_merge *merge_lookup(const kvt_tokenizer *t, int a, int b) {
    if (t->n_merges == 0) return NULL; /* bytes only (t->merges is NULL: no bsearch on it) */
    struct kvt_merge key = {a, b, 0, 0};
    return (const struct kvt_merge *)bsearch(&key, t->merges, (size_t)t->n_merges, sizeof(key), merge_pair_cmp);
}

/* GPT-2's byte-to-unicode table. Byte b is printable when it is '!'..'~',
 * 0xA1..0xAC or 0xAE..0xFF: then it stands for itself, code point b. The
 * other 68 bytes, in increasing order, stand for U+0100, U+0101, ...: byte
 * 0x00 is U+0100 "Ā", the space 0x20 is U+0120 "Ġ", 0xAD is U+0143 "Ń". */
static int byte_printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }
static int byte_to_cp(int b) {
    if (byte_printable(b)) return b;
    int k = 0; /* b is the k-th byte (from 0) that is not printable */
    for (int c = 0; c < b; c++) k += !byte_printable(c);
    return 0x100 + k;
}
/* The inverse: the byte that code point cp stands for, or -1 (not in the table). */
static int cp_to_byte(int cp) {
    if (cp >= 0 && cp < 256) return byte_printable(cp) ? cp : -1;
    for (int b = 0, k = 0; b < 256; b++)
        if (!byte_printable(b) && 0x100 + k++ == cp) return b;
    return -1;
}
/* Byte b's piece in GPT-2's alphabet, as UTF-8 into s (one byte below 0x80,
 * else two: every code point is below 0x800). */
static const char *byte_char(int b, char s[3]) {
    int cp = byte_to_cp(b);
    s[0] = (char)cp; s[1] = s[2] = '\0';
    if (cp >= 0x80) { s[0] = (char)(0xC0 | (cp >> 6)); s[1] = (char)(0x80 | (cp & 0x3F)); }
    return s;
}

/* The code point starting text[0] (n >= 1 bytes left) and its length in
 * bytes. A byte that does not start a valid UTF-8 character (a stray
 * continuation byte, a truncated or overlong sequence, a surrogate) counts
 * as a character of one byte, code point -1: the pre-tokenizer treats it as
 * a symbol, and byte-level BPE encodes its byte like any other. */
static size_t utf8_next(const char *text, size_t n, int *cp) {
    const unsigned char *s = (const unsigned char *)text;
    size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
               : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    *cp = -1;
    if (len == 1) { *cp = s[0]; return 1; }
    if (len == 0 || len > n) return 1;
    int c = s[0] & (0x7F >> len); /* the lead byte's payload: 5, 4 or 3 bits */
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 1;
        c = (c << 6) | (s[k] & 0x3F);
    }
    static const int least[5] = {0, 0, 0x80, 0x800, 0x10000}; /* shorter forms are overlong */
    if (c < least[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 1;
    *cp = c;
    return len;
}

/* Is cp in one of the n sorted [first, last] ranges r? Binary search. */
static int uni_in(const uint32_t (*r)[2], int n, int cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if ((uint32_t)cp < r[mid][0]) hi = mid - 1;
        else if ((uint32_t)cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}
#define UNI_N(table) ((int)(sizeof(table) / sizeof(table[0])))

/* The pre-tokenizer's four classes of characters: \p{L} letters, \p{N}
 * numbers, \s whitespace, and the rest (punctuation, symbols, emoji,
 * combining marks, invalid bytes). */
enum { CH_OTHER, CH_LETTER, CH_NUMBER, CH_SPACE };

/* The class of the character at text[i] (i < end); *next = where the next one starts. */
static int class_at(const char *text, size_t i, size_t end, size_t *next) {
    int cp;
    *next = i + utf8_next(text + i, end - i, &cp);
    if (cp < 0) return CH_OTHER;
    if (uni_in(uni_letter, UNI_N(uni_letter), cp)) return CH_LETTER;
    if (uni_in(uni_number, UNI_N(uni_number), cp)) return CH_NUMBER;
    if (uni_in(uni_space, UNI_N(uni_space), cp)) return CH_SPACE;
    return CH_OTHER;
}

/* GPT-2's pre-tokenizer is one regular expression, matched again and again
 * from the end of the last match (each match is a chunk):
 *
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * (every character counts: " ?" is an optional space). The first
 * alternative that matches at the position wins, so in words:
 *   1. an apostrophe and s, t, re, ve, m, ll or d: "don't" -> "don" "'t".
 *      Lowercase only: "I'LL" -> "I" "'" "LL".
 *   2. a run of letters, a run of numbers, or a run of other symbols, each
 *      with at most one space (U+0020, not a tab) in front: "Hello, world"
 *      -> "Hello" "," " world". The space goes with the word after it.
 *   3. whitespace: the whole run when it reaches the end of the text (for
 *      "smollm": of the stretch before a digit); otherwise the run but its
 *      last character, which stays to be the space in front of the next
 *      word. (?!\S) is a lookahead: "not followed by a non-space
 *      character". When the greedy \s+ stops just before a non-space, the
 *      match gives back one character so that the lookahead holds; a run of
 *      one character cannot give one back, and the last alternative, plain
 *      \s+, takes it. "a  b" -> "a" " " " b"; "x\n\n y" -> "x" "\n\n" " y";
 *      "x\ny" -> "x" "\n" "y".
 * \p{L}, \p{N} and \s are Unicode's letters, numbers and White_Space (the
 * tables in unicode_ranges.h, generated by weights/make_unicode_ranges.py),
 * the classes Hugging Face tokenizers' regex engine (Oniguruma) uses.
 * Returns where the match at text[i] (i < end) ends. */
static size_t gpt2_match(const char *text, size_t i, size_t end) {
    const char *s = text + i;
    size_t left = end - i, j, k;
    if (s[0] == '\'' && left >= 2) { /* 1: the contractions */
        if (s[1] == 's' || s[1] == 't' || s[1] == 'm' || s[1] == 'd') return i + 2;
        if (left >= 3 && ((s[1] == 'r' && s[2] == 'e') || (s[1] == 'v' && s[2] == 'e') || (s[1] == 'l' && s[2] == 'l')))
            return i + 3;
    }
    int c = class_at(text, i, end, &j);
    if (s[0] == ' ' && j < end) { /* 2: an optional space, if a non-space follows it */
        int c2 = class_at(text, j, end, &k);
        if (c2 != CH_SPACE) { c = c2; j = k; }
    }
    if (c != CH_SPACE) { /* 2: then the run of one class */
        while (j < end && class_at(text, j, end, &k) == c) j = k;
        return j;
    }
    size_t last = i; /* 3: whitespace; `last` = where the run's last character starts */
    while (j < end && class_at(text, j, end, &k) == CH_SPACE) { last = j; j = k; }
    if (j == end) return end; /* \s+(?!\S): nothing follows the run */
    return last > i ? last : j; /* \s+(?!\S) gives one back; a run of one is plain \s+ */
}

void kvt_tokenizer_free(kvt_tokenizer *t) {
    if (t->vocab)
        for (int i = 0; i < t->vocab_size; i++) free(t->vocab[i]);
    if (t->text)
        for (int i = 0; i < t->vocab_size; i++) free(t->text[i]);
    free(t->vocab);
    free(t->text);
    free(t->scores);
    free(t->sorted);
    free(t->merges);
    memset(t, 0, sizeof(*t));
}

/* The most merges a trailer may list: far above any real vocabulary's (SmolLM2
 * has 48,900), low enough that a corrupt count cannot ask for gigabytes. */
#define KVT_LIMIT_MERGES (1 << 24)

/* A byte-level piece back to bytes, as Hugging Face's ByteLevel decoder does:
 * each character through the inverse table ("Ġthe" -> " the"). A piece with
 * a character the table lacks is its own text, byte for byte (a special token
 * written with a space, say; "<|im_start|>" needs no exception: printable
 * ASCII stands for itself). A NUL byte ("Ā" is byte 0x00) is left out:
 * kvt_decode returns a C string, and the text kvt_encode was given held no NUL. */
static char *piece_bytes(const char *piece) {
    size_t n = strlen(piece), m = 0;
    char *out = (char *)malloc(n + 1);
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        int cp;
        i += utf8_next(piece + i, n - i, &cp);
        int b = cp_to_byte(cp);
        if (b < 0) { memcpy(out, piece, n + 1); return out; }
        if (b != 0) out[m++] = (char)b;
    }
    out[m] = '\0';
    return out;
}

/* The byte-level trailer after the V pieces (the "BBPE" already read):
 * int32 pre_tokenizer, bos_id, eos_id, n_merges, then n_merges pairs of
 * int32 (left, right), rank = index. Every field is checked; the merged piece
 * (left's text followed by right's) must be in the vocabulary; the file must
 * end right after the last merge. */
static kvt_status read_trailer(kvt_tokenizer *t, FILE *f, const char *path) {
    int V = t->vocab_size, head[4];
    if (fread(head, sizeof(int), 4, f) != 4)
        return kvt_fail(KVT_EFORMAT, "tokenizer '%s': the byte-level trailer ends inside its header (pre_tokenizer, "
                        "bos_id, eos_id, n_merges)", path);
    if (head[0] != KVT_PRE_GPT2 && head[0] != KVT_PRE_SMOLLM)
        return kvt_fail(KVT_EFORMAT, "tokenizer '%s': unknown pre_tokenizer %d (1 = gpt2, 2 = smollm)", path, head[0]);
    if (head[1] < -1 || head[1] >= V || head[2] < 0 || head[2] >= V)
        return kvt_fail(KVT_EFORMAT, "tokenizer '%s': bos_id %d or eos_id %d is out of range (bos_id -1..%d, eos_id "
                        "0..%d)", path, head[1], head[2], V - 1, V - 1);
    if (head[3] < 0 || head[3] > KVT_LIMIT_MERGES)
        return kvt_fail(KVT_EFORMAT, "tokenizer '%s': n_merges %d is out of range [0, %d]", path, head[3],
                        KVT_LIMIT_MERGES);
    t->pre_tokenizer = (kvt_pre_tokenizer)head[0];
    t->bos_id = head[1];
    t->eos_id = head[2];
    int n = head[3], cap = 0;
    char *buf = (char *)malloc(2 * (size_t)t->max_token_length + 1);
    if (!buf) return kvt_fail(KVT_ENOMEM, "host out of memory (tokenizer)");
    kvt_status st = KVT_OK;
    for (int i = 0; i < n && st == KVT_OK; i++) {
        if (i == cap) { /* grow as the merges arrive: a short file with a big count fails early */
            cap = cap == 0 ? (n < 4096 ? n : 4096) : cap > n / 2 ? n : 2 * cap;
            struct kvt_merge *m = (struct kvt_merge *)realloc(t->merges, (size_t)cap * sizeof(*m));
            if (!m) { st = kvt_fail(KVT_ENOMEM, "host out of memory (tokenizer merges)"); break; }
            t->merges = m;
        }
        int pair[2];
        if (fread(pair, sizeof(int), 2, f) != 2) {
            st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': ends at merge %d of n_merges = %d", path, i, n);
            break;
        }
        if (pair[0] < 0 || pair[0] >= V || pair[1] < 0 || pair[1] >= V) {
            st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': merge %d (%d, %d): an id is out of range [0, %d]", path, i,
                          pair[0], pair[1], V - 1);
            break;
        }
        size_t la = strlen(t->vocab[pair[0]]), lb = strlen(t->vocab[pair[1]]);
        int id = -1;
        if (la + lb <= (size_t)t->max_token_length) { /* longer cannot be a piece */
            memcpy(buf, t->vocab[pair[0]], la);
            memcpy(buf + la, t->vocab[pair[1]], lb + 1);
            id = tok_lookup(t, buf);
        }
        if (id < 0)
            st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': merge %d (%d '%.40s', %d '%.40s'): the merged piece is not in "
                          "the vocabulary", path, i, pair[0], t->vocab[pair[0]], pair[1], t->vocab[pair[1]]);
        struct kvt_merge mg = {pair[0], pair[1], i, id};
        t->merges[i] = mg;
    }
    free(buf);
    if (st == KVT_OK && fgetc(f) != EOF)
        st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': bytes left after its %d merges", path, n);
    if (st != KVT_OK) return st;
    /* Sort by (left, right, rank). A pair listed twice keeps its later rank,
     * as in Hugging Face tokenizers and GPT-2's encoder.py (both build a map
     * from the list, and the later entry replaces the earlier). */
    if (n > 0) qsort(t->merges, (size_t)n, sizeof(struct kvt_merge), merge_cmp);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && !merge_pair_cmp(&t->merges[m - 1], &t->merges[i])) m--;
        t->merges[m++] = t->merges[i];
    }
    t->n_merges = m;
    return KVT_OK;
}

/* Every read is checked, every length is bounded by max_token_length (itself
 * bounded), a piece may not contain a NUL, and the file must end exactly after
 * the V-th token or after a byte-level trailer ("BBPE"): a tokenizer for
 * another vocabulary size is caught here. */
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
    if (st == KVT_OK) { /* the lookup table, which the trailer's checks use too */
        for (int i = 0; i < V; i++) { t->sorted[i].str = t->vocab[i]; t->sorted[i].id = i; }
        qsort(t->sorted, (size_t)V, sizeof(struct kvt_piece), piece_cmp);
    }
    t->bos_id = KVT_BOS; /* a legacy file's; a trailer replaces them */
    t->eos_id = KVT_EOS;
    char magic[4];
    size_t got = st == KVT_OK ? fread(magic, 1, 4, f) : 0;
    int alphabet = 0; /* a file cut before its trailer still holds GPT-2's 256 byte pieces ('Ġ', 'Ċ', ...) */
    for (int b = 0; b < 256 && st == KVT_OK && got == 0; b++) {
        char s[3];
        alphabet += tok_lookup(t, byte_char(b, s)) >= 0;
    }
    if (alphabet == 256)
        st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': its pieces are byte-level BPE's (all 256 byte pieces, 'Ġ' for a "
                      "space), but the file ends without the \"BBPE\" trailer: truncated? (export it again)", path);
    else if (st == KVT_OK && got == 4 && !memcmp(magic, "BBPE", 4)) st = read_trailer(t, f, path);
    else if (st == KVT_OK && got > 0)
        st = kvt_fail(KVT_EFORMAT, "tokenizer '%s': bytes left after V = %d tokens, and they are not a byte-level "
                      "trailer (\"BBPE\"): a tokenizer for another model?", path, V);
    fclose(f);
    if (st != KVT_OK) { kvt_tokenizer_free(t); return st; }
    for (int i = 0; i < 256; i++) { t->byte_piece[2 * i] = (char)i; t->byte_piece[2 * i + 1] = '\0'; }
    if (t->pre_tokenizer != KVT_PRE_NONE) { /* byte-level: the 256 starting pieces, and what each piece prints */
        for (int b = 0; b < 256; b++) {
            char s[3];
            t->byte_id[b] = tok_lookup(t, byte_char(b, s));
        }
        t->text = (char **)calloc((size_t)V, sizeof(char *));
        for (int i = 0; i < V && t->text; i++)
            if (!(t->text[i] = piece_bytes(t->vocab[i]))) break;
        if (!t->text || !t->text[V - 1]) {
            kvt_tokenizer_free(t);
            return kvt_fail(KVT_ENOMEM, "host out of memory (tokenizer)");
        }
        return KVT_OK;
    }
    /* Sentencepiece vocabularies (Llama's) list the 256 bytes as <0x00>..<0xFF>
     * at ids 3..258, and were trained with a space before the first word; a
     * character vocabulary (ours) has neither, so neither is applied. */
    t->byte_fallback = V >= 259 && !strcmp(t->vocab[3], "<0x00>") && !strcmp(t->vocab[258], "<0xFF>");
    t->dummy_prefix = t->byte_fallback;
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
 *     position ascending, the spec's tie-break (byte-level: rank ascending,
 *     then position; the same code with minus the rank as the score);
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
 * piece `id`; ver_l and ver_r are the two tokens' versions when it was pushed.
 * prio: higher merges first; the piece's score, or for a byte-level merge
 * minus its rank (a double holds every float score and every int rank exactly). */
typedef struct { double prio; int id, l, ver_l, ver_r; } bpe_cand;
/* A binary heap in an array: c[0] is the best, and c[i] comes before its
 * children c[2i+1] and c[2i+2]. */
typedef struct { bpe_cand *c; int n, cap; } bpe_heap;

/* Does candidate a merge before b? The higher priority; of equal ones, the leftmost. */
static int cand_before(const bpe_cand *a, const bpe_cand *b) {
    return a->prio > b->prio || (a->prio == b->prio && a->l < b->l);
}

/* A binary heap of merge candidates, best (highest priority, then leftmost) on
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

/* Push the pair (l, r) of adjacent tokens if they may merge: legacy, if their
 * texts make a piece; byte-level, if the merge table has the pair. */
static void push_pair(const kvt_tokenizer *t, bpe_heap *h, const int *tokens, const int *ver, int l, int r,
                      char *buf) {
    bpe_cand c;
    if (t->pre_tokenizer != KVT_PRE_NONE) {
        const struct kvt_merge *m = merge_lookup(t, tokens[l], tokens[r]);
        if (!m) return;
        c.prio = -(double)m->rank;
        c.id = m->id;
    } else {
        int id = pair_lookup(t, tokens[l], tokens[r], buf);
        if (id < 0 || t->scores[id] <= BPE_NO_MERGE) return; /* (the loader rejects NaN scores) */
        c.prio = t->scores[id];
        c.id = id;
    }
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

/* Byte-level: one chunk of the pre-tokenizer, one token per byte (the piece
 * of its character in GPT-2's table), then the merges; appends to tokens[*n..]. */
static kvt_status encode_chunk(const kvt_tokenizer *t, const char *text, size_t len, int *tokens, int *n) {
    int start = *n;
    for (size_t i = 0; i < len; i++) {
        int id = t->byte_id[(unsigned char)text[i]];
        if (id < 0)
            return kvt_fail(KVT_EARG, "text: byte 0x%02x has no piece in this byte-level vocabulary",
                            (unsigned char)text[i]);
        tokens[(*n)++] = id;
    }
    *n = start + bpe_merge(t, tokens + start, *n - start);
    return KVT_OK;
}

/* The byte-level pre-tokenizer: cut text[0..len) into chunks; ends[k] =
 * where chunk k ends (room for len). Returns the number of chunks. "smollm"
 * first makes every \p{N} character a chunk of its own (Hugging Face's Digits
 * pre-tokenizer, individual_digits), then GPT-2's pattern runs on the text
 * between them, each stretch as if it were the whole text: its end is an end
 * for the (?!\S) lookahead ("a  1" -> "a" "  " "1", where GPT-2's pattern
 * alone gives "a" " " " 1"). "gpt2" runs the pattern alone. (Digits tests
 * Rust's char::is_numeric, the same categories as \p{N}, but in the
 * tokenizers 0.23 wheel it also takes 13 code points that Unicode 16.0 has
 * not assigned, U+11DE0..U+11DE9 and U+16FF4..U+16FF6, numbers of Unicode
 * 17.0: those are the only characters where this split differs.) */
static int pre_tokenize(kvt_pre_tokenizer kind, const char *text, size_t len, size_t *ends) {
    int n = 0;
    for (size_t i = 0; i < len;) {
        size_t end = len, k;
        if (kind == KVT_PRE_SMOLLM) {
            if (class_at(text, i, len, &k) == CH_NUMBER) { /* a digit (of any script) alone */
                ends[n++] = i = k;
                continue;
            }
            for (end = i; end < len && class_at(text, end, len, &k) != CH_NUMBER;) end = k;
        }
        for (size_t j = i; j < end;) ends[n++] = j = gpt2_match(text, j, end); /* GPT-2's pattern on text[i..end) */
        i = end;
    }
    return n;
}

/* Byte-level: the pre-tokenizer's chunks, each encoded on its own. */
static kvt_status encode_byte_level(const kvt_tokenizer *t, const char *text, size_t len, int *tokens, int *n) {
    size_t *ends = (size_t *)malloc((len > 0 ? len : 1) * sizeof(size_t)); /* (len) at most one chunk a byte */
    if (!ends) return kvt_fail(KVT_ENOMEM, "host out of memory (encoding %zu bytes)", len);
    int n_chunks = pre_tokenize(t->pre_tokenizer, text, len, ends);
    kvt_status st = KVT_OK;
    size_t start = 0;
    for (int c = 0; c < n_chunks && st == KVT_OK; start = ends[c++])
        st = encode_chunk(t, text + start, ends[c] - start, tokens, n);
    free(ends);
    return st;
}

/* Encode `len` bytes of text, appending to tokens[*n..] (room for len + 1 more). */
static kvt_status encode_piece(const kvt_tokenizer *t, const char *text, size_t len, int dummy, int *tokens,
                               int *n) {
    if (t->pre_tokenizer != KVT_PRE_NONE) return encode_byte_level(t, text, len, tokens, n);
    int start = *n;
    kvt_status st = encode_chars(t, text, len, dummy, tokens, n);
    if (st == KVT_OK) *n = start + bpe_merge(t, tokens + start, *n - start);
    return st;
}

/* Encode into a scratch array sized for the worst case (one token per byte,
 * plus BOS and the dummy prefix), then copy out only if it fits: a prompt that
 * is too long is an error with its length, never a silent truncation. A token
 * holds at most max_token_length bytes of the text (a byte token <0xXX> holds
 * one; a byte-level piece is at least as long as its bytes), so a text of len
 * bytes is at least ceil(len / max_token_length) tokens: one that cannot fit
 * is rejected before it is encoded. BOS is t->bos_id; with -1 there is none. */
kvt_status kvt_encode(const kvt_tokenizer *t, const char *text, int bos, int *tokens, int max_tokens,
                      int *n_tokens) {
    size_t len = strlen(text), maxlen = (size_t)t->max_token_length;
    bos = bos && t->bos_id >= 0;
    size_t least = (bos ? 1 : 0) + (len + maxlen - 1) / maxlen;
    *n_tokens = 0;
    if (max_tokens >= 0 && least > (size_t)max_tokens)
        return kvt_fail(KVT_ECONTEXT, "the text is at least %zu tokens, more than the %d that fit", least, max_tokens);
    int *tmp = (int *)malloc((len + 3) * sizeof(int)), n = 0;
    if (!tmp) return kvt_fail(KVT_ENOMEM, "host out of memory (encoding %zu bytes)", len);
    if (bos) tmp[n++] = t->bos_id;
    kvt_status st = encode_piece(t, text, len, t->dummy_prefix, tmp, &n);
    if (st == KVT_OK && n > max_tokens)
        st = kvt_fail(KVT_ECONTEXT, "the text is %d tokens, more than the %d that fit", n, max_tokens);
    if (st == KVT_OK) memcpy(tokens, tmp, (size_t)n * sizeof(int));
    *n_tokens = st == KVT_OK ? n : 0;
    free(tmp);
    return st;
}

/* A piece to print: sentencepiece's word-initial space is dropped after BOS,
 * and a byte token "<0x41>" becomes the byte itself. A byte-level piece is
 * its bytes (piece_bytes, made at load time): "Ġthe" prints " the", and a
 * character of several bytes may come in two tokens, each printing a part. */
const char *kvt_decode(const kvt_tokenizer *t, int prev, int tok) {
    if (t->pre_tokenizer != KVT_PRE_NONE) return t->text[tok];
    const char *piece = t->vocab[tok];
    unsigned int byte;
    if (prev == t->bos_id && piece[0] == ' ') piece++; /* sentencepiece's leading space */
    if (sscanf(piece, "<0x%02X>", &byte) == 1 && strlen(piece) == 6) return t->byte_piece + 2 * byte;
    return piece;
}
