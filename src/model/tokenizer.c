/*
 * tokenizer.c - GPT-2 byte-level BPE and SentencePiece-style tokenization
 * from a GGUF file's tokenizer.* metadata, and chat formatting.
 *
 * Tokenizing runs in three stages:
 *
 *   1. Special tokens (CONTROL, UNKNOWN and USER_DEFINED) are cut out of the
 *      text, leftmost-longest; USER_DEFINED ones always, the others only when
 *      parse_special is true (the rule of HF tokenizers' added tokens and of
 *      llama.cpp).
 *   2. BPE: each stretch of plain text is split into pieces by the regexes of
 *      the pre-tokenizer (matched by hand below, one function per regex),
 *      each piece's bytes become GPT-2 byte-alphabet tokens, and merges are
 *      applied lowest rank first (ties: leftmost first) with a heap.
 *   3. SPM: spaces become U+2581, the text is split into UTF-8 characters and
 *      the adjacent pair whose concatenation is the highest-scoring vocabulary
 *      token is merged until none is left; characters outside the vocabulary
 *      become <0xXX> byte tokens.
 *
 * Every vocabulary lookup (token text, merge pair) goes through an
 * open-addressing hash table, so a 262k-token vocabulary costs no more per
 * lookup than a small one.  The tokenizer copies what it needs from the
 * file: the si_gguf may be freed once si_tokenizer_load() returns.
 */
#include "model/tokenizer.h"

#include "model/unicode.h"
#include "internal.h"
#include "starinfer.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tokenizer.ggml.token_type values. */
enum tok_type {
    TOK_UNDEFINED = 0,
    TOK_NORMAL = 1,
    TOK_UNKNOWN = 2,
    TOK_CONTROL = 3,
    TOK_USER_DEFINED = 4,
    TOK_UNUSED = 5,
    TOK_BYTE = 6,
};

enum tok_model { MODEL_BPE, MODEL_SPM };

/* "▁" (U+2581), SentencePiece's visible space. */
static const char SPM_SPACE[] = "\xe2\x96\x81";
#define SPM_SPACE_LEN 3

/* ------------------------------------------------------------ the regexes */

/*
 * A stretch of text decoded into code points: cp[i] and its class cls[i]
 * (si_unicode_class(), SI_UCAT_OTHER for an invalid byte) for i < end.
 */
struct seg {
    const uint32_t *cp;
    const uint8_t *cls;
    size_t end;
};

/* Length of the regex's match starting at pos (pos < s->end), 0 if none. */
typedef size_t (*match_fn)(const struct seg *s, size_t pos);

static bool is_l(const struct seg *s, size_t i)
{
    return i < s->end && si_unicode_is_letter(s->cls[i]);
}
static bool is_n(const struct seg *s, size_t i)
{
    return i < s->end && si_unicode_is_number(s->cls[i]);
}
static bool is_ws(const struct seg *s, size_t i)
{
    return i < s->end && si_unicode_is_space(s->cls[i]);
}
/* [^\s\p{L}\p{N}] */
static bool is_other(const struct seg *s, size_t i)
{
    return i < s->end && !si_unicode_is_space(s->cls[i]) && !si_unicode_is_letter(s->cls[i]) &&
           !si_unicode_is_number(s->cls[i]);
}
static bool is_crlf(const struct seg *s, size_t i)
{
    return i < s->end && (s->cp[i] == '\r' || s->cp[i] == '\n');
}
static uint32_t at(const struct seg *s, size_t i)
{
    return i < s->end ? s->cp[i] : 0;
}
static uint32_t lower(uint32_t c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* First index at or after i where pred fails. */
static size_t run(const struct seg *s, size_t i, bool (*pred)(const struct seg *, size_t))
{
    while (pred(s, i))
        i++;
    return i;
}

/*
 * 's|'t|'re|'ve|'m|'ll|'d, case-sensitive or (for (?i:...)) ASCII
 * case-insensitive: the length of the contraction at pos, or 0.
 */
static size_t match_contraction(const struct seg *s, size_t pos, bool fold)
{
    if (at(s, pos) != '\'')
        return 0;
    uint32_t a = at(s, pos + 1), b = at(s, pos + 2);
    if (fold) {
        a = lower(a);
        b = lower(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at pos, which is whitespace. */
static size_t match_trailing_space(const struct seg *s, size_t pos)
{
    size_t e = run(s, pos, is_ws);
    /* Followed by a non-space: give the last space to the next piece. */
    if (e < s->end && e - pos > 1)
        return e - 1 - pos;
    return e - pos;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const struct seg *s, size_t pos)
{
    size_t n = match_contraction(s, pos, false);
    if (n)
        return n;
    /* The optional space belongs to the following run when there is one. */
    size_t p = pos + (s->cp[pos] == ' ' && pos + 1 < s->end);
    if (is_l(s, p))
        return run(s, p, is_l) - pos;
    if (is_n(s, p))
        return run(s, p, is_n) - pos;
    if (is_other(s, p))
        return run(s, p, is_other) - pos;
    return match_trailing_space(s, pos);
}

/*
 * Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 */
static size_t match_llama3_like(const struct seg *s, size_t pos, size_t max_digits)
{
    size_t n = match_contraction(s, pos, true);
    if (n)
        return n;
    if (is_l(s, pos))
        return run(s, pos, is_l) - pos;
    if (!is_crlf(s, pos) && !is_n(s, pos) && is_l(s, pos + 1))
        return run(s, pos + 1, is_l) - pos;
    if (is_n(s, pos)) {
        size_t e = pos;
        while (e - pos < max_digits && is_n(s, e))
            e++;
        return e - pos;
    }
    size_t p = pos + (s->cp[pos] == ' ');
    if (is_other(s, p))
        return run(s, run(s, p, is_other), is_crlf) - pos;
    /* \s*[\r\n]+: the whitespace up to and including its last CR or LF. */
    size_t e = run(s, pos, is_ws);
    for (size_t j = e; j > pos; j--)
        if (is_crlf(s, j - 1))
            return j - pos;
    return match_trailing_space(s, pos);
}

static size_t match_llama3(const struct seg *s, size_t pos)
{
    return match_llama3_like(s, pos, 3);
}

static size_t match_qwen2(const struct seg *s, size_t pos)
{
    return match_llama3_like(s, pos, 1);
}

/* \p{N} */
static size_t match_digit(const struct seg *s, size_t pos)
{
    return is_n(s, pos);
}

/* \p{N}+ */
static size_t match_digits(const struct seg *s, size_t pos)
{
    return run(s, pos, is_n) - pos;
}

/* [\p{P}\$\+<=>\^~\|]+ */
static bool is_default_punct(const struct seg *s, size_t i)
{
    if (i >= s->end)
        return false;
    uint32_t c = s->cp[i];
    return si_unicode_is_punct(s->cls[i]) || c == '$' || c == '+' || c == '<' || c == '=' ||
           c == '>' || c == '^' || c == '~' || c == '|';
}
static size_t match_default_punct(const struct seg *s, size_t pos)
{
    return run(s, pos, is_default_punct) - pos;
}

/* [0-9][0-9][0-9] */
static size_t match_3digits(const struct seg *s, size_t pos)
{
    for (size_t i = pos; i < pos + 3; i++)
        if (at(s, i) < '0' || at(s, i) > '9')
            return 0;
    return 3;
}

#define MAX_REGEXES 4

/*
 * The pre-tokenizers: tokenizer.ggml.pre names and the regexes llama.cpp's
 * llama-vocab.cpp applies for them, in order.  Each regex splits every
 * piece the previous one made, its matches and the text between them
 * becoming pieces (HF tokenizers' Split with "isolated" behaviour).
 */
struct pre_tokenizer {
    const char *names[8];
    match_fn regex[MAX_REGEXES];
    bool ignore_merges; /* a piece that is a whole token skips the merges */
};

static const struct pre_tokenizer PRE_TOKENIZERS[] = {
    {{"default"}, {match_default_punct, match_gpt2, match_digits, match_3digits}, false},
    {{"gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion"}, {match_gpt2}, false},
    {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"},
     {match_digit, match_gpt2},
     false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}, {match_llama3}, true},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {match_qwen2}, false},
};

/* ------------------------------------------------------------ hash tables */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 1099511628211u;
    return h;
}

static uint64_t hash_pair(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdu;
    key ^= key >> 33;
    return key;
}

/* A merge: the pair (left, right) of token ids becomes `merged` at `rank`. */
struct merge_slot {
    uint64_t key; /* left << 32 | right, or EMPTY_KEY */
    int32_t rank;
    int32_t merged;
};
#define EMPTY_KEY UINT64_MAX

/* A special token, for the text scan. */
struct special {
    int32_t id;
    uint32_t len;
    const char *text;
};

struct si_tokenizer {
    enum tok_model model;
    const struct pre_tokenizer *pre; /* BPE only */
    int32_t n_vocab;

    /* Token i's text is text[off[i] .. off[i] + len[i]). */
    char *text;
    uint32_t *off;
    uint32_t *len;
    float *score;
    uint8_t *type;
    uint8_t *eog;

    /* Text to id: slots of ids (-1 empty), capacity a power of two. */
    int32_t *slots;
    size_t slot_mask;

    /* BPE merges by (left, right). */
    struct merge_slot *merges;
    size_t merge_mask;

    /* The token of each byte: GPT-2's alphabet character (BPE) or <0xXX>
     * (SPM); -1 when the vocabulary lacks it. */
    int32_t byte_tok[256];
    /* GPT-2's byte alphabet: byte -> code point, and code point -> byte
     * (or -1) for the code points below 0x144 the alphabet uses. */
    uint16_t byte_cp[256];
    int16_t cp_byte[0x144];

    /* Special tokens sorted by first byte, then longest first;
     * first_special[b] .. first_special[b + 1] are those starting with b. */
    struct special *specials;
    uint32_t first_special[257];

    int32_t bos, eos, eot, unk;
    bool add_bos;
    bool add_space_prefix;
};

static int32_t find_token(const struct si_tokenizer *tok, const char *p, size_t n)
{
    size_t h = (size_t)hash_bytes(p, n) & tok->slot_mask;
    for (;;) {
        int32_t id = tok->slots[h];
        if (id < 0)
            return -1;
        if (tok->len[id] == n && memcmp(tok->text + tok->off[id], p, n) == 0)
            return id;
        h = (h + 1) & tok->slot_mask;
    }
}

static const struct merge_slot *find_merge(const struct si_tokenizer *tok, int32_t a, int32_t b)
{
    if (tok->merges == NULL)
        return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = (size_t)hash_pair(key) & tok->merge_mask;
    for (;;) {
        const struct merge_slot *m = &tok->merges[h];
        if (m->key == key)
            return m;
        if (m->key == EMPTY_KEY)
            return NULL;
        h = (h + 1) & tok->merge_mask;
    }
}

/* ------------------------------------------------------------ loading */

static size_t pow2_at_least(size_t n)
{
    size_t cap = 16;
    while (cap < n)
        cap *= 2;
    return cap;
}

/*
 * GPT-2's byte alphabet: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ')
 * stand for themselves, the others map in byte order to U+0100, U+0101, ...
 */
static void init_byte_alphabet(struct si_tokenizer *tok)
{
    uint16_t next = 0x100;
    for (int i = 0; i < 0x144; i++)
        tok->cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        tok->byte_cp[b] = printable ? (uint16_t)b : next++;
        tok->cp_byte[tok->byte_cp[b]] = (int16_t)b;
    }
}

static int load_special_id(const struct si_gguf *g, const char *key, int32_t n_vocab, int32_t *out,
                           bool required_in_range, char *err, size_t err_size)
{
    int64_t v;
    int rc = si_gguf_get_i64(g, key, &v);
    if (rc == SI_E_NOT_FOUND)
        return SI_OK;
    if (rc != SI_OK)
        return si__errf(err, err_size, SI_E_FORMAT, "%s is not an integer", key);
    if (v < 0 || v >= n_vocab) {
        /* llama.cpp ignores out-of-range ids with a warning; BOS and EOS
         * matter too much to guess. */
        if (required_in_range)
            return si__errf(err, err_size, SI_E_FORMAT,
                        "%s = %" PRId64 " is outside the %" PRId32 "-token vocabulary", key, v,
                        n_vocab);
        return SI_OK;
    }
    *out = (int32_t)v;
    return SI_OK;
}

static int cmp_special(const void *a, const void *b)
{
    const struct special *x = a, *y = b;
    uint8_t fx = (uint8_t)x->text[0], fy = (uint8_t)y->text[0];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int load_vocab(struct si_tokenizer *tok, const struct si_gguf *g, char *err, size_t err_size)
{
    int64_t ik = si_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (ik < 0)
        return si__errf(err, err_size, SI_E_FORMAT, "missing key tokenizer.ggml.tokens");
    const struct si_gguf_kv *kt = &g->kv[ik];
    if (kt->type != SI_GGUF_ARRAY || kt->arr_type != SI_GGUF_STRING)
        return si__errf(err, err_size, SI_E_FORMAT, "tokenizer.ggml.tokens is not an array of strings");
    if (kt->arr_n == 0 || kt->arr_n > INT32_MAX / 2)
        return si__errf(err, err_size, SI_E_FORMAT, "tokenizer.ggml.tokens has %" PRIu64 " tokens",
                    kt->arr_n);
    const int32_t n = (int32_t)kt->arr_n;
    tok->n_vocab = n;

    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (kt->strs[i].len > UINT32_MAX / 2)
            return si__errf(err, err_size, SI_E_FORMAT, "token %" PRId32 " is too long", i);
        total += kt->strs[i].len;
    }
    if (total > UINT32_MAX - 1)
        return si__errf(err, err_size, SI_E_FORMAT, "token texts too large (%" PRIu64 " bytes)", total);
    tok->text = malloc((size_t)total + 1);
    tok->off = malloc((size_t)n * sizeof *tok->off);
    tok->len = malloc((size_t)n * sizeof *tok->len);
    tok->score = calloc((size_t)n, sizeof *tok->score);
    tok->type = malloc((size_t)n);
    tok->eog = calloc((size_t)n, 1);
    tok->slot_mask = pow2_at_least(2 * (size_t)n) - 1;
    tok->slots = malloc((tok->slot_mask + 1) * sizeof *tok->slots);
    if (!tok->text || !tok->off || !tok->len || !tok->score || !tok->type || !tok->eog ||
        !tok->slots)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for %" PRId32 " tokens", n);

    size_t pos = 0;
    for (int32_t i = 0; i < n; i++) {
        tok->off[i] = (uint32_t)pos;
        tok->len[i] = (uint32_t)kt->strs[i].len;
        if (kt->strs[i].len)
            memcpy(tok->text + pos, kt->strs[i].data, kt->strs[i].len);
        pos += kt->strs[i].len;
        tok->type[i] = TOK_NORMAL;
    }
    tok->text[pos] = '\0';

    /* Text to id; a text listed twice maps to its last id, like a
     * dictionary built from the list (HF and llama.cpp). */
    memset(tok->slots, 0xff, (tok->slot_mask + 1) * sizeof *tok->slots);
    for (int32_t i = 0; i < n; i++) {
        const char *p = tok->text + tok->off[i];
        size_t h = (size_t)hash_bytes(p, tok->len[i]) & tok->slot_mask;
        for (;;) {
            int32_t o = tok->slots[h];
            if (o < 0 || (tok->len[o] == tok->len[i] &&
                          memcmp(tok->text + tok->off[o], p, tok->len[i]) == 0)) {
                tok->slots[h] = i;
                break;
            }
            h = (h + 1) & tok->slot_mask;
        }
    }

    /* Scores and types are optional; when present they must match. */
    int64_t is = si_gguf_find_key(g, "tokenizer.ggml.scores");
    if (is >= 0) {
        const struct si_gguf_kv *ks = &g->kv[is];
        if (ks->type != SI_GGUF_ARRAY ||
            (ks->arr_type != SI_GGUF_FLOAT32 && ks->arr_type != SI_GGUF_FLOAT64) ||
            ks->arr_n != (uint64_t)n)
            return si__errf(err, err_size, SI_E_FORMAT,
                        "tokenizer.ggml.scores is not an array of %" PRId32 " floats", n);
        for (int32_t i = 0; i < n; i++) {
            struct si_gguf_kv e;
            si_gguf_arr_elem(ks, (uint64_t)i, &e);
            tok->score[i] = (float)e.v.f64;
        }
    }
    int64_t it = si_gguf_find_key(g, "tokenizer.ggml.token_type");
    if (it >= 0) {
        const struct si_gguf_kv *ky = &g->kv[it];
        if (ky->type != SI_GGUF_ARRAY || ky->arr_n != (uint64_t)n ||
            si_gguf_type_size(ky->arr_type) == 0 || ky->arr_type == SI_GGUF_FLOAT32 ||
            ky->arr_type == SI_GGUF_FLOAT64 || ky->arr_type == SI_GGUF_BOOL)
            return si__errf(err, err_size, SI_E_FORMAT,
                        "tokenizer.ggml.token_type is not an array of %" PRId32 " integers", n);
        bool is_signed = ky->arr_type == SI_GGUF_INT8 || ky->arr_type == SI_GGUF_INT16 ||
                         ky->arr_type == SI_GGUF_INT32 || ky->arr_type == SI_GGUF_INT64;
        for (int32_t i = 0; i < n; i++) {
            struct si_gguf_kv e;
            si_gguf_arr_elem(ky, (uint64_t)i, &e);
            int64_t t = is_signed ? e.v.i64 : (int64_t)e.v.u64;
            if (t < TOK_UNDEFINED || t > TOK_BYTE)
                return si__errf(err, err_size, SI_E_FORMAT, "token %" PRId32 " has type %" PRId64, i,
                            t);
            tok->type[i] = t == TOK_UNDEFINED ? TOK_NORMAL : (uint8_t)t;
        }
    }
    return SI_OK;
}

static int load_merges(struct si_tokenizer *tok, const struct si_gguf *g, char *err,
                       size_t err_size)
{
    int64_t im = si_gguf_find_key(g, "tokenizer.ggml.merges");
    if (im < 0)
        return si__errf(err, err_size, SI_E_FORMAT, "missing key tokenizer.ggml.merges");
    const struct si_gguf_kv *km = &g->kv[im];
    if (km->type != SI_GGUF_ARRAY || km->arr_type != SI_GGUF_STRING)
        return si__errf(err, err_size, SI_E_FORMAT, "tokenizer.ggml.merges is not an array of strings");
    if (km->arr_n > INT32_MAX / 4)
        return si__errf(err, err_size, SI_E_FORMAT, "tokenizer.ggml.merges has %" PRIu64 " merges",
                    km->arr_n);
    tok->merge_mask = pow2_at_least(2 * (size_t)km->arr_n) - 1;
    tok->merges = malloc((tok->merge_mask + 1) * sizeof *tok->merges);
    if (tok->merges == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for %" PRIu64 " merges", km->arr_n);
    for (size_t i = 0; i <= tok->merge_mask; i++)
        tok->merges[i].key = EMPTY_KEY;

    for (uint64_t r = 0; r < km->arr_n; r++) {
        struct si_gguf_str s = km->strs[r];
        /* "left right"; the search starts at 1 so that a left part may
         * itself begin with a space. */
        const char *sp = s.len > 1 ? memchr(s.data + 1, ' ', (size_t)s.len - 1) : NULL;
        if (sp == NULL)
            return si__errf(err, err_size, SI_E_FORMAT, "merge #%" PRIu64 " '%.*s' is not 'a b'", r,
                        (int)(s.len > 64 ? 64 : s.len), s.data);
        size_t ll = (size_t)(sp - s.data), rl = (size_t)s.len - ll - 1;
        int32_t a = find_token(tok, s.data, ll);
        int32_t b = find_token(tok, sp + 1, rl);
        if (a < 0 || b < 0)
            return si__errf(err, err_size, SI_E_FORMAT,
                        "merge #%" PRIu64 " '%.*s' references unknown token '%.*s'", r,
                        (int)(s.len > 64 ? 64 : s.len), s.data, (int)(a < 0 ? ll : rl),
                        a < 0 ? s.data : sp + 1);
        /* The merged text, found by concatenating the two tokens' texts. */
        char stack[256];
        char *cat = ll + rl <= sizeof stack ? stack : malloc(ll + rl);
        if (cat == NULL)
            return si__errf(err, err_size, SI_E_NOMEM, "out of memory reading merges");
        memcpy(cat, s.data, ll);
        memcpy(cat + ll, sp + 1, rl);
        int32_t ab = find_token(tok, cat, ll + rl);
        if (cat != stack)
            free(cat);
        if (ab < 0)
            return si__errf(err, err_size, SI_E_FORMAT,
                        "merge #%" PRIu64 " '%.*s' makes a token not in the vocabulary", r,
                        (int)(s.len > 64 ? 64 : s.len), s.data);

        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        size_t h = (size_t)hash_pair(key) & tok->merge_mask;
        while (tok->merges[h].key != EMPTY_KEY && tok->merges[h].key != key)
            h = (h + 1) & tok->merge_mask;
        /* A pair listed twice keeps its first (lowest) rank. */
        if (tok->merges[h].key == EMPTY_KEY)
            tok->merges[h] = (struct merge_slot){key, (int32_t)r, ab};
    }
    return SI_OK;
}

static int load_specials(struct si_tokenizer *tok, char *err, size_t err_size)
{
    size_t count = 0;
    for (int32_t i = 0; i < tok->n_vocab; i++)
        if ((tok->type[i] == TOK_CONTROL || tok->type[i] == TOK_USER_DEFINED ||
             tok->type[i] == TOK_UNKNOWN) &&
            tok->len[i] > 0)
            count++;
    tok->specials = malloc((count ? count : 1) * sizeof *tok->specials);
    if (tok->specials == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory for special tokens");
    size_t k = 0;
    for (int32_t i = 0; i < tok->n_vocab; i++)
        if ((tok->type[i] == TOK_CONTROL || tok->type[i] == TOK_USER_DEFINED ||
             tok->type[i] == TOK_UNKNOWN) &&
            tok->len[i] > 0)
            tok->specials[k++] = (struct special){i, tok->len[i], tok->text + tok->off[i]};
    qsort(tok->specials, count, sizeof *tok->specials, cmp_special);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < count && (uint8_t)tok->specials[j].text[0] < b)
            j++;
        tok->first_special[b] = (uint32_t)j;
    }
    return SI_OK;
}

static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>", "<|endoftext|>",
    "<EOT>",      "<|eom_id|>", "<|end_of_text|>", "<|return|>",    "<|call|>",
};

int si_tokenizer_load(struct si_tokenizer **out, const struct si_gguf *g, char *err,
                      size_t err_size)
{
    *out = NULL;
    int rc;
    struct si_gguf_str model, pre = {0, NULL};
    rc = si_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc == SI_E_NOT_FOUND)
        return si__errf(err, err_size, SI_E_FORMAT, "missing key tokenizer.ggml.model");
    if (rc != SI_OK)
        return si__errf(err, err_size, SI_E_FORMAT, "tokenizer.ggml.model is not a string");

    struct si_tokenizer *tok = calloc(1, sizeof *tok);
    if (tok == NULL)
        return si__errf(err, err_size, SI_E_NOMEM, "out of memory");
    tok->bos = tok->eos = tok->eot = tok->unk = -1;

    if (si_gguf_str_eq(model, "gpt2")) {
        tok->model = MODEL_BPE;
        rc = si_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
        if (rc == SI_E_FORMAT) {
            rc = si__errf(err, err_size, SI_E_FORMAT, "tokenizer.ggml.pre is not a string");
            goto error;
        }
        const char *name = rc == SI_E_NOT_FOUND ? "default" : NULL;
        for (size_t i = 0; i < sizeof PRE_TOKENIZERS / sizeof *PRE_TOKENIZERS; i++)
            for (size_t j = 0; j < 8 && PRE_TOKENIZERS[i].names[j] != NULL; j++)
                if (name != NULL ? strcmp(name, PRE_TOKENIZERS[i].names[j]) == 0
                                 : si_gguf_str_eq(pre, PRE_TOKENIZERS[i].names[j]))
                    tok->pre = &PRE_TOKENIZERS[i];
        if (tok->pre == NULL) {
            rc = si__errf(err, err_size, SI_E_UNSUPPORTED, "unknown pre-tokenizer '%.*s'",
                      (int)(pre.len > 64 ? 64 : pre.len), pre.data);
            goto error;
        }
        tok->add_bos = false;
        tok->add_space_prefix = false;
    } else if (si_gguf_str_eq(model, "llama")) {
        tok->model = MODEL_SPM;
        tok->add_bos = true;
        tok->add_space_prefix = true;
    } else {
        rc = si__errf(err, err_size, SI_E_UNSUPPORTED, "unknown tokenizer model '%.*s'",
                  (int)(model.len > 64 ? 64 : model.len), model.data);
        goto error;
    }

    if ((rc = load_vocab(tok, g, err, err_size)) != SI_OK)
        goto error;
    if (tok->model == MODEL_BPE && (rc = load_merges(tok, g, err, err_size)) != SI_OK)
        goto error;
    if ((rc = load_specials(tok, err, err_size)) != SI_OK)
        goto error;

    init_byte_alphabet(tok);
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t n;
        if (tok->model == MODEL_BPE)
            n = si_utf8_encode(tok->byte_cp[b], s);
        else
            n = (size_t)snprintf(s, sizeof s, "<0x%02X>", b);
        tok->byte_tok[b] = find_token(tok, s, n);
    }

    int32_t pad = -1, eom = -1;
    const int32_t n = tok->n_vocab;
    if ((rc = load_special_id(g, "tokenizer.ggml.bos_token_id", n, &tok->bos, true, err,
                              err_size)) != SI_OK ||
        (rc = load_special_id(g, "tokenizer.ggml.eos_token_id", n, &tok->eos, true, err,
                              err_size)) != SI_OK ||
        (rc = load_special_id(g, "tokenizer.ggml.eot_token_id", n, &tok->eot, false, err,
                              err_size)) != SI_OK ||
        (rc = load_special_id(g, "tokenizer.ggml.eom_token_id", n, &eom, false, err, err_size)) !=
            SI_OK ||
        (rc = load_special_id(g, "tokenizer.ggml.unknown_token_id", n, &tok->unk, false, err,
                              err_size)) != SI_OK ||
        (rc = load_special_id(g, "tokenizer.ggml.padding_token_id", n, &pad, false, err,
                              err_size)) != SI_OK)
        goto error;
    bool flag;
    if (si_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &flag) == SI_OK)
        tok->add_bos = flag;
    if (si_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &flag) == SI_OK)
        tok->add_space_prefix = flag;

    /* End of generation: EOS, EOT, EOM and the control tokens whose text
     * says so (as llama.cpp finds them). */
    if (tok->eos >= 0)
        tok->eog[tok->eos] = 1;
    if (tok->eot >= 0)
        tok->eog[tok->eot] = 1;
    if (eom >= 0)
        tok->eog[eom] = 1;
    for (size_t i = 0; i < sizeof EOG_TEXTS / sizeof *EOG_TEXTS; i++) {
        int32_t id = find_token(tok, EOG_TEXTS[i], strlen(EOG_TEXTS[i]));
        if (id >= 0 && tok->type[id] == TOK_CONTROL)
            tok->eog[id] = 1;
    }
    *out = tok;
    return SI_OK;

error:
    si_tokenizer_free(tok);
    return rc;
}

void si_tokenizer_free(struct si_tokenizer *tok)
{
    if (tok == NULL)
        return;
    free(tok->text);
    free(tok->off);
    free(tok->len);
    free(tok->score);
    free(tok->type);
    free(tok->eog);
    free(tok->slots);
    free(tok->merges);
    free(tok->specials);
    free(tok);
}

int32_t si_tokenizer_n_vocab(const struct si_tokenizer *tok)
{
    return tok->n_vocab;
}

int32_t si_tokenizer_bos(const struct si_tokenizer *tok)
{
    return tok->bos;
}

int32_t si_tokenizer_eos(const struct si_tokenizer *tok)
{
    return tok->eos;
}

bool si_tokenizer_is_eog(const struct si_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab && tok->eog[id];
}

bool si_tokenizer_add_bos(const struct si_tokenizer *tok)
{
    return tok->add_bos;
}

/* ------------------------------------------------------------ tokenizing */

/* A symbol of the merge loops: a token (BPE) or a span of text (SPM) in a
 * doubly linked list; a symbol merged into its left neighbour is dead. */
struct symbol {
    int32_t prev, next;
    int32_t id;        /* BPE: the token, -1 if none; SPM: unused */
    uint32_t off, len; /* SPM: the text span */
};

/* A candidate merge of symbol `left` with its right neighbour. */
struct cand {
    int32_t left;
    int32_t lid, rid; /* BPE: the ids when pushed */
    uint32_t size;    /* SPM: the merged length when pushed */
    float key;        /* SPM: the merged token's score */
    int32_t rank;     /* BPE: the merge's rank */
};

/* Scratch memory for one si_tokenize() call, grown as needed. */
struct work {
    const struct si_tokenizer *tok;
    int32_t *ids;
    size_t cap, n;
    int status;

    uint32_t *cp;
    uint8_t *cls;
    size_t *off;
    size_t cp_cap;

    struct symbol *sym;
    size_t sym_cap;
    struct cand *heap;
    size_t heap_n, heap_cap;

    char *spm;
    size_t spm_cap;
};

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (q == NULL)
        return false;
    *p = q;
    *cap = c;
    return true;
}

static void emit(struct work *w, int32_t id)
{
    if (w->n < w->cap)
        w->ids[w->n] = id;
    w->n++;
}

/* Heap order: the candidate to merge first is at the top. */
static bool before(const struct work *w, const struct cand *a, const struct cand *b)
{
    if (w->tok->model == MODEL_BPE) {
        if (a->rank != b->rank)
            return a->rank < b->rank;
    } else if (a->key != b->key) {
        return a->key > b->key;
    }
    return a->left < b->left;
}

static bool heap_push(struct work *w, struct cand c)
{
    if (!grow((void **)&w->heap, &w->heap_cap, w->heap_n + 1, sizeof *w->heap))
        return false;
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(w, &c, &w->heap[parent]))
            break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = c;
    return true;
}

static struct cand heap_pop(struct work *w)
{
    struct cand top = w->heap[0];
    struct cand last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && before(w, &w->heap[c + 1], &w->heap[c]))
            c++;
        if (!before(w, &w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0)
        w->heap[i] = last;
    return top;
}

/* Push the merge of symbol `left` with its right neighbour, if any. */
static bool bpe_try_pair(struct work *w, int32_t left)
{
    if (left < 0 || w->sym[left].next < 0)
        return true;
    const struct symbol *a = &w->sym[left], *b = &w->sym[a->next];
    if (a->id < 0 || b->id < 0)
        return true;
    const struct merge_slot *m = find_merge(w->tok, a->id, b->id);
    if (m == NULL)
        return true;
    return heap_push(w, (struct cand){.left = left, .lid = a->id, .rid = b->id, .rank = m->rank});
}

/* Byte-level BPE over the bytes p[0..n). */
static void bpe_piece(struct work *w, const uint8_t *p, size_t n)
{
    const struct si_tokenizer *tok = w->tok;
    if (!grow((void **)&w->sym, &w->sym_cap, n, sizeof *w->sym)) {
        w->status = SI_E_NOMEM;
        return;
    }
    for (size_t i = 0; i < n; i++)
        w->sym[i] = (struct symbol){(int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1,
                                    tok->byte_tok[p[i]], 0, 0};
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (!bpe_try_pair(w, (int32_t)i))
            goto nomem;
    while (w->heap_n > 0) {
        struct cand c = heap_pop(w);
        struct symbol *a = &w->sym[c.left];
        /* Stale when either side has changed since the push. */
        if (a->id != c.lid || a->next < 0 || w->sym[a->next].id != c.rid)
            continue;
        struct symbol *b = &w->sym[a->next];
        a->id = find_merge(tok, c.lid, c.rid)->merged;
        a->next = b->next;
        if (b->next >= 0)
            w->sym[b->next].prev = c.left;
        b->id = -2;
        if (!bpe_try_pair(w, a->prev) || !bpe_try_pair(w, c.left))
            goto nomem;
    }
    /* A byte whose alphabet character is not in the vocabulary (SmolLM2
     * lacks 0xC0, 0xFF and others that valid UTF-8 never uses) is dropped,
     * as HF tokenizers and llama.cpp do. */
    for (int32_t i = 0; i >= 0 && (size_t)i < n; i = w->sym[i].next)
        if (w->sym[i].id >= 0)
            emit(w, w->sym[i].id);
    return;
nomem:
    w->status = SI_E_NOMEM;
}

/* Split cp[start..end) with regexes level.. and hand the pieces to BPE. */
static void pre_split(struct work *w, const uint8_t *text, size_t start, size_t end, int level)
{
    const match_fn fn = level < MAX_REGEXES ? w->tok->pre->regex[level] : NULL;
    if (fn == NULL) {
        const uint8_t *p = text + w->off[start];
        size_t n = w->off[end] - w->off[start];
        if (w->tok->pre->ignore_merges) {
            /* A piece that is a whole token is that token. */
            char buf[1024];
            if (n * 2 <= sizeof buf) {
                size_t m = 0;
                for (size_t i = 0; i < n; i++)
                    m += si_utf8_encode(w->tok->byte_cp[p[i]], buf + m);
                int32_t id = find_token(w->tok, buf, m);
                if (id >= 0) {
                    emit(w, id);
                    return;
                }
            }
        }
        bpe_piece(w, p, n);
        return;
    }
    struct seg s = {w->cp + start, w->cls + start, end - start};
    size_t pos = 0;
    while (pos < s.end && w->status == SI_OK) {
        size_t m = fn(&s, pos);
        size_t e = pos + m;
        if (m == 0) {
            /* Text between matches is a piece too. */
            e = pos + 1;
            while (e < s.end && fn(&s, e) == 0)
                e++;
        }
        pre_split(w, text, start + pos, start + e, level + 1);
        pos = e;
    }
}

/* Decode text[0..n) into w->cp / cls / off; returns the code point count. */
static size_t decode(struct work *w, const char *text, size_t n)
{
    if (!grow((void **)&w->cp, &w->cp_cap, n + 1, sizeof *w->cp)) {
        w->status = SI_E_NOMEM;
        return 0;
    }
    /* cls and off follow cp's capacity. */
    uint8_t *cls = realloc(w->cls, w->cp_cap);
    if (cls != NULL)
        w->cls = cls;
    size_t *off = realloc(w->off, w->cp_cap * sizeof *off);
    if (off != NULL)
        w->off = off;
    if (cls == NULL || off == NULL) {
        w->status = SI_E_NOMEM;
        return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t c = si_utf8_decode(text + i, n - i, &len);
        w->cp[k] = c;
        w->cls[k] = (uint8_t)si_unicode_class(c);
        w->off[k] = i;
        k++;
        i += len;
    }
    w->off[k] = n;
    return k;
}

static void bpe_text(struct work *w, const char *text, size_t n)
{
    size_t k = decode(w, text, n);
    if (w->status == SI_OK && k > 0)
        pre_split(w, (const uint8_t *)text, 0, k, 0);
}

/* Push the merge of SPM symbol `left` with its right neighbour when their
 * text is a token. */
static bool spm_try_pair(struct work *w, int32_t left)
{
    if (left < 0 || w->sym[left].next < 0)
        return true;
    const struct symbol *a = &w->sym[left], *b = &w->sym[a->next];
    uint32_t size = a->len + b->len;
    int32_t id = find_token(w->tok, w->spm + a->off, size);
    if (id < 0)
        return true;
    return heap_push(w, (struct cand){.left = left, .size = size, .key = w->tok->score[id]});
}

static void spm_text(struct work *w, const char *text, size_t n, bool space_prefix)
{
    const struct si_tokenizer *tok = w->tok;
    /* Spaces become "▁", which is three bytes. */
    size_t need = (space_prefix ? SPM_SPACE_LEN : 0) + n * SPM_SPACE_LEN;
    if (need > UINT32_MAX || !grow((void **)&w->spm, &w->spm_cap, need + 1, 1) ||
        !grow((void **)&w->sym, &w->sym_cap, need + 1, sizeof *w->sym)) {
        w->status = SI_E_NOMEM;
        return;
    }
    size_t m = 0;
    if (space_prefix) {
        memcpy(w->spm, SPM_SPACE, SPM_SPACE_LEN);
        m = SPM_SPACE_LEN;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ') {
            memcpy(w->spm + m, SPM_SPACE, SPM_SPACE_LEN);
            m += SPM_SPACE_LEN;
        } else {
            w->spm[m++] = text[i];
        }
    }
    /* One symbol per UTF-8 character (per byte where it is invalid). */
    int32_t k = 0;
    for (size_t i = 0; i < m;) {
        size_t len;
        si_utf8_decode(w->spm + i, m - i, &len);
        w->sym[k] = (struct symbol){k - 1, -1, 0, (uint32_t)i, (uint32_t)len};
        if (k > 0)
            w->sym[k - 1].next = k;
        k++;
        i += len;
    }
    w->heap_n = 0;
    for (int32_t i = 0; i + 1 < k; i++)
        if (!spm_try_pair(w, i))
            goto nomem;
    while (w->heap_n > 0) {
        struct cand c = heap_pop(w);
        struct symbol *a = &w->sym[c.left];
        if (a->len == 0 || a->next < 0 || a->len + w->sym[a->next].len != c.size)
            continue;
        struct symbol *b = &w->sym[a->next];
        a->len += b->len;
        a->next = b->next;
        if (b->next >= 0)
            w->sym[b->next].prev = c.left;
        b->len = 0;
        if (!spm_try_pair(w, a->prev) || !spm_try_pair(w, c.left))
            goto nomem;
    }
    for (int32_t i = k > 0 ? 0 : -1; i >= 0; i = w->sym[i].next) {
        const struct symbol *s = &w->sym[i];
        int32_t id = find_token(tok, w->spm + s->off, s->len);
        if (id >= 0) {
            emit(w, id);
            continue;
        }
        /* Only single characters can be missing: fall back to bytes. */
        for (uint32_t j = 0; j < s->len; j++) {
            int32_t b = tok->byte_tok[(uint8_t)w->spm[s->off + j]];
            if (b >= 0)
                emit(w, b);
            else if (tok->unk >= 0)
                emit(w, tok->unk);
        }
    }
    return;
nomem:
    w->status = SI_E_NOMEM;
}

/* The longest special token at text[0..n) allowed here, or NULL. */
static const struct special *special_at(const struct si_tokenizer *tok, const char *text, size_t n,
                                        bool parse_special)
{
    uint8_t b = (uint8_t)text[0];
    for (uint32_t i = tok->first_special[b]; i < tok->first_special[b + 1]; i++) {
        const struct special *sp = &tok->specials[i];
        if (sp->len <= n && memcmp(sp->text, text, sp->len) == 0 &&
            (parse_special || tok->type[sp->id] == TOK_USER_DEFINED))
            return sp;
    }
    return NULL;
}

int64_t si_tokenize(const struct si_tokenizer *tok, const char *text, size_t len, bool add_bos,
                    bool parse_special, int32_t *ids, size_t cap)
{
    if (tok == NULL || (text == NULL && len > 0) || (ids == NULL && cap > 0))
        return SI_E_INVALID;
    struct work w = {.tok = tok, .ids = ids, .cap = cap, .status = SI_OK};
    if (add_bos && tok->bos >= 0)
        emit(&w, tok->bos);

    /* Plain text runs between special tokens; SPM puts its space prefix
     * at the start and after each special token (as llama.cpp does). */
    bool after_special = true;
    size_t start = 0;
    for (size_t i = 0; i <= len && w.status == SI_OK;) {
        const struct special *sp = NULL;
        if (i < len &&
            tok->first_special[(uint8_t)text[i]] < tok->first_special[(uint8_t)text[i] + 1])
            sp = special_at(tok, text + i, len - i, parse_special);
        if (sp == NULL && i < len) {
            i++;
            continue;
        }
        if (i > start) {
            if (tok->model == MODEL_BPE)
                bpe_text(&w, text + start, i - start);
            else
                spm_text(&w, text + start, i - start, tok->add_space_prefix && after_special);
            after_special = false;
        }
        if (sp == NULL)
            break;
        emit(&w, sp->id);
        after_special = true;
        i += sp->len;
        start = i;
    }
    free(w.cp);
    free(w.cls);
    free(w.off);
    free(w.sym);
    free(w.heap);
    free(w.spm);
    if (w.status != SI_OK)
        return w.status;
    return (int64_t)w.n;
}

/* ------------------------------------------------------------ detokenizing */

static int64_t copy_out(char *buf, size_t cap, const char *p, size_t n)
{
    if (cap > 0)
        memcpy(buf, p, n < cap ? n : cap);
    return (int64_t)n;
}

int64_t si_token_to_piece(const struct si_tokenizer *tok, int32_t id, bool special, char *buf,
                          size_t cap)
{
    if (tok == NULL || id < 0 || id >= tok->n_vocab || (buf == NULL && cap > 0))
        return SI_E_INVALID;
    const char *t = tok->text + tok->off[id];
    const size_t n = tok->len[id];
    switch (tok->type[id]) {
    case TOK_CONTROL:
    case TOK_UNKNOWN:
        return special ? copy_out(buf, cap, t, n) : 0;
    case TOK_USER_DEFINED:
        return copy_out(buf, cap, t, n);
    case TOK_UNUSED:
        return 0;
    case TOK_BYTE: {
        unsigned v;
        char c;
        if (n == 6 && sscanf(t, "<0x%2x>", &v) == 1) {
            c = (char)v;
            return copy_out(buf, cap, &c, 1);
        }
        return copy_out(buf, cap, t, n);
    }
    default:
        break;
    }
    size_t m = 0;
    if (tok->model == MODEL_SPM) {
        /* "▁" back to a space. */
        for (size_t i = 0; i < n;) {
            if (i + SPM_SPACE_LEN <= n && memcmp(t + i, SPM_SPACE, SPM_SPACE_LEN) == 0) {
                if (m < cap)
                    buf[m] = ' ';
                m++;
                i += SPM_SPACE_LEN;
            } else {
                if (m < cap)
                    buf[m] = t[i];
                m++;
                i++;
            }
        }
        return (int64_t)m;
    }
    /* GPT-2's byte alphabet back to bytes; a character outside it (not in
     * a well-formed vocabulary) is copied as it is. */
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t c = si_utf8_decode(t + i, n - i, &len);
        if (c < 0x144 && tok->cp_byte[c] >= 0) {
            if (m < cap)
                buf[m] = (char)tok->cp_byte[c];
            m++;
        } else {
            for (size_t j = 0; j < len; j++, m++)
                if (m < cap)
                    buf[m] = t[i + j];
        }
        i += len;
    }
    return (int64_t)m;
}

/* ------------------------------------------------------------ chat templates */

/* Output that counts what does not fit. */
struct sink {
    char *buf;
    size_t cap, n;
};

static void put(struct sink *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++, s->n++)
        if (s->n < s->cap)
            s->buf[s->n] = p[i];
}

static void put_cstr(struct sink *s, const char *p)
{
    put(s, p, strlen(p));
}

/* Text without leading and trailing ASCII whitespace, as Jinja's trim. */
static void put_trimmed(struct sink *s, const char *p)
{
    size_t n = strlen(p);
    while (n > 0 && (*p == ' ' || (*p >= '\t' && *p <= '\r'))) {
        p++;
        n--;
    }
    while (n > 0 && (p[n - 1] == ' ' || (p[n - 1] >= '\t' && p[n - 1] <= '\r')))
        n--;
    put(s, p, n);
}

static bool contains(struct si_gguf_str t, const char *needle)
{
    size_t n = strlen(needle);
    if (n > t.len)
        return false;
    for (size_t i = 0; i + n <= t.len; i++)
        if (memcmp(t.data + i, needle, n) == 0)
            return true;
    return false;
}

/*
 * The default system message of a chatml template: a string literal
 * '<|im_start|>system\n...<|im_end|>\n' in the template (SmolLM2, Qwen2.5),
 * written out with its escapes undone, when the first message is not
 * "system".
 */
static void put_default_system(struct sink *s, struct si_gguf_str t)
{
    static const char open[] = "<|im_start|>system";
    const size_t no = sizeof open - 1;
    for (size_t i = 1; i + no <= t.len; i++) {
        char q = t.data[i - 1];
        if ((q != '\'' && q != '"') || memcmp(t.data + i, open, no) != 0)
            continue;
        /* The literal ends at the next unescaped quote; it must hold a
         * complete message. */
        size_t j = i;
        while (j < t.len && t.data[j] != q)
            j += t.data[j] == '\\' ? 2 : 1;
        if (j > t.len)
            continue;
        struct si_gguf_str lit = {j - i, t.data + i};
        if (!contains(lit, "<|im_end|>") || contains(lit, "' +") || contains(lit, "\" +"))
            continue;
        for (size_t k = 0; k < lit.len; k++) {
            char c = lit.data[k];
            if (c == '\\' && k + 1 < lit.len) {
                c = lit.data[++k];
                c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
            }
            put(s, &c, 1);
        }
        return;
    }
}

int64_t si_chat_format(const struct si_gguf *g, const struct si_chat_msg *msgs, size_t n,
                       bool add_assistant, char *buf, size_t cap)
{
    if (g == NULL || (msgs == NULL && n > 0) || (buf == NULL && cap > 0))
        return SI_E_INVALID;
    for (size_t i = 0; i < n; i++)
        if (msgs[i].role == NULL || msgs[i].content == NULL)
            return SI_E_INVALID;
    struct si_gguf_str t;
    int rc = si_gguf_get_str(g, "tokenizer.chat_template", &t);
    if (rc == SI_E_FORMAT)
        return SI_E_UNSUPPORTED;
    /* No template: the architecture's own turn markers for gemma models
     * (their GGUF files often carry none), else chatml as llama.cpp assumes. */
    if (rc == SI_E_NOT_FOUND) {
        struct si_gguf_str arch;
        if (si_gguf_get_str(g, "general.architecture", &arch) == SI_OK && arch.len >= 5 &&
            memcmp(arch.data, "gemma", 5) == 0)
            t = (struct si_gguf_str){15, "<start_of_turn>"};
        else
            t = (struct si_gguf_str){12, "<|im_start|>"};
    }
    struct sink s = {buf, cap, 0};

    if (contains(t, "<|im_start|>")) {
        /* The template's loop adds its default system message before the
         * first message when that is not a system one. */
        if (n > 0 && strcmp(msgs[0].role, "system") != 0)
            put_default_system(&s, t);
        for (size_t i = 0; i < n; i++) {
            put_cstr(&s, "<|im_start|>");
            put_cstr(&s, msgs[i].role);
            put_cstr(&s, "\n");
            put_cstr(&s, msgs[i].content);
            put_cstr(&s, "<|im_end|>\n");
        }
        if (add_assistant)
            put_cstr(&s, "<|im_start|>assistant\n");
    } else if (contains(t, "<start_of_turn>")) {
        /* Gemma has no system role: system text goes at the top of the
         * next user turn, followed by a blank line. */
        const char *system = NULL;
        for (size_t i = 0; i < n; i++) {
            const char *role = msgs[i].role;
            if (strcmp(role, "system") == 0) {
                system = msgs[i].content;
                continue;
            }
            bool model = strcmp(role, "assistant") == 0 || strcmp(role, "model") == 0;
            put_cstr(&s, "<start_of_turn>");
            put_cstr(&s, model ? "model" : role);
            put_cstr(&s, "\n");
            if (system != NULL && !model) {
                put_trimmed(&s, system);
                put_cstr(&s, "\n\n");
                system = NULL;
            }
            put_trimmed(&s, msgs[i].content);
            put_cstr(&s, "<end_of_turn>\n");
        }
        if (add_assistant)
            put_cstr(&s, "<start_of_turn>model\n");
    } else if (contains(t, "[INST]")) {
        /* Llama 2: "[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST]assistant</s>"
         * and "<s>[INST] " before each later user turn; the BOS of the first
         * turn comes from tokenization. */
        const bool has_sys = contains(t, "<<SYS>>");
        const bool bos_inside = contains(t, "bos_token + '[INST]");
        const bool strip = contains(t, "content.strip()");
        bool in_turn = true;
        put_cstr(&s, "[INST] ");
        for (size_t i = 0; i < n; i++) {
            const char *role = msgs[i].role;
            if (!in_turn) {
                put_cstr(&s, bos_inside ? "<s>[INST] " : "[INST] ");
                in_turn = true;
            }
            if (strcmp(role, "system") == 0 && has_sys)
                put_cstr(&s, "<<SYS>>\n");
            if (strip)
                put_trimmed(&s, msgs[i].content);
            else
                put_cstr(&s, msgs[i].content);
            if (strcmp(role, "system") == 0) {
                put_cstr(&s, has_sys ? "\n<</SYS>>\n\n" : "\n");
            } else if (strcmp(role, "user") == 0) {
                put_cstr(&s, " [/INST]");
            } else {
                put_cstr(&s, "</s>");
                in_turn = false;
            }
        }
    } else {
        return SI_E_UNSUPPORTED;
    }
    return (int64_t)s.n;
}
