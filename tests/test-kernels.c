/*
 * test-kernels.c - si_k_attn_f16's and si_k_attn_f16_tiled's AVX2 twins
 * against their portable code, bit for bit, and the F16C conversions they
 * rely on against the software ones.
 *
 * The conversions: every fp16 value to fp32 (the signalling NaN halves,
 * which F16C quiets, apart: both sides must give a NaN of the same sign and
 * payload but for the quiet bit), and fp32 to fp16 on every float whose low
 * byte is one of a few patterns (all exponents, all rounding cases: ties,
 * the subnormal range, overflow to infinity, NaN payloads) plus random ones.
 *
 * The attention, and the tiled attention (llama.cpp's path for long batches)
 * likewise: random heads (GQA groups included), head sizes, lengths and
 * windows, with plain values, values that overflow the fp16 accumulator,
 * scores that keep raising the maximum, and infinities, NaNs and subnormals
 * in the query and the cache.  Every output must have the same bits, NaNs
 * included (the tiled one's NaNs may differ in sign and payload).
 */
#include "model/act.h"
#include "model/kernels.h"
#include "model/quants.h"
#include "model/quants_dispatch.h"
#include "model/quants_impl.h"
#include "model/types.h"
#include "test.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x4b45524e454c53ull;

/* splitmix64. */
static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rng() >> 11) * 0x1p-53);
}

/* ------------------------------------------------------ conversions */

static void test_fp16_to_fp32(void)
{
    const si__dequantize_fn deq = si__quants_avx2.type[SI_TYPE_F16].dequantize;
    uint16_t *h = malloc(65536 * sizeof *h);
    float *got = malloc(65536 * sizeof *got);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    deq(h, got, 65536);
    int bad = 0, snan = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint32_t want = si_act_bits(si_fp16_to_fp32((uint16_t)i)), have = si_act_bits(got[i]);
        const bool is_snan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff) != 0 && !(i & 0x200);
        if (is_snan) {
            /* F16C quiets them (bit 22); the rest must agree. */
            snan += have != want;
            if ((have | 0x400000u) != (want | 0x400000u) || !isnan(got[i]))
                bad++;
        } else if (have != want) {
            if (bad++ < 5)
                fprintf(stderr, "fp16 %04x: software %08x, F16C %08x\n", i, want, have);
        }
    }
    CHECK(bad == 0, "%d of the 65536 fp16 values convert differently", bad);
    printf("fp16 -> fp32: 65536 values, equal but for %d signalling NaNs quieted by F16C\n", snan);
    free(h);
    free(got);
}

/* n floats to fp16 both ways; returns the mismatches. */
static int fp32_to_fp16_batch(const float *x, uint16_t *h, int n)
{
    si__quants_avx2.type[SI_TYPE_F16].quantize_act(x, h, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const uint16_t want = si_fp32_to_fp16(x[i]);
        if (h[i] != want && bad++ < 5)
            fprintf(stderr, "fp32 %08x: software %04x, F16C %04x\n", si_act_bits(x[i]), want, h[i]);
    }
    return bad;
}

static void test_fp32_to_fp16(void)
{
    enum { BATCH = 1 << 16 };
    float *x = malloc(BATCH * sizeof *x);
    uint16_t *h = malloc(BATCH * sizeof *h);
    const uint32_t low[] = {0x00, 0x01, 0x80, 0xff, 0x7f};
#ifdef __SANITIZE_ADDRESS__
    /* The sanitizers' pass looks for memory errors, not for values: one
     * pattern of the low bits and 8 random batches (the plain build's pass
     * sweeps them all; the conversions are most of this test's time). */
    const size_t n_low = 1;
    const int n_random = 8;
#else
    const size_t n_low = sizeof low / sizeof low[0];
    const int n_random = 64;
#endif
    long bad = 0, n = 0;
    /* The top 24 bits exhaustively: the bits fp16 keeps and its rounding
     * bits are all above bit 8, so every tie and every carry is seen. */
    for (size_t l = 0; l < n_low; l++) {
        for (uint64_t top = 0; top < (1u << 24); top += BATCH) {
            for (int i = 0; i < BATCH; i++)
                x[i] = si_act_float((uint32_t)((top + (uint64_t)i) << 8) | low[l]);
            bad += fp32_to_fp16_batch(x, h, BATCH);
            n += BATCH;
        }
    }
    for (int r = 0; r < n_random; r++) {
        for (int i = 0; i < BATCH; i++)
            x[i] = si_act_float((uint32_t)rng());
        bad += fp32_to_fp16_batch(x, h, BATCH);
        n += BATCH;
    }
    CHECK(bad == 0, "%ld of %ld floats convert differently", bad, n);
    printf("fp32 -> fp16: %ld floats, %ld differ\n", n, bad);
    free(x);
    free(h);
}

/* ------------------------------------------------------ attention */

enum fill { PLAIN, BIG, RISING, SPECIAL, N_FILLS };
static const char *const fill_name[N_FILLS] = {"plain", "big", "rising", "special"};

/* A float that is sometimes an infinity, a NaN (random payload) or a subnormal. */
static float special(float plain)
{
    switch (rng() % 16) {
    case 0:
        return rng() & 1 ? INFINITY : -INFINITY;
    case 1:
        return si_act_float(0x7f800000u | (uint32_t)(rng() & 0x7fffff) | 1u |
                          (uint32_t)(rng() & 1) << 31);
    case 2:
        return (float)(rng() % 1024) * 0x1p-24f; /* an fp16 subnormal */
    case 3:
        return 70000.0f; /* fp16 infinity */
    default:
        return plain;
    }
}

static void fill_case(enum fill f, float *q, size_t nq, uint16_t *k, uint16_t *v, size_t nc,
                      int head_dim, size_t kvd)
{
    for (size_t i = 0; i < nq; i++) {
        q[i] = uniform(-2.0f, 2.0f);
        if (f == SPECIAL && rng() % 64 == 0)
            q[i] = special(q[i]);
    }
    for (size_t i = 0; i < nc; i++) {
        float kv = uniform(-1.0f, 1.0f), vv = uniform(-3.0f, 3.0f);
        if (f == BIG)
            vv *= 20000.0f; /* sums past 65504: the accumulator overflows */
        if (f == RISING) /* scores that grow with the position: many rescales */
            kv += 0.05f * (float)(i / kvd) * (rng() % 4 == 0 ? -1.0f : 1.0f);
        if (f == SPECIAL && rng() % 256 == 0)
            kv = special(kv);
        if (f == SPECIAL && rng() % 256 == 0)
            vv = special(vv);
        k[i] = si_fp32_to_fp16(kv);
        v[i] = si_fp32_to_fp16(vv);
    }
    (void)head_dim;
}

/* si_k_attn_f16_tiled's arithmetic as it was first written (a query at a
 * time, one head after the other): what the tiles must reproduce. */
static void oracle_tiled(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                         int first, int n_kv, int h0, int h1, int n_head, int n_head_kv,
                         int head_dim, float scale, float *scratch)
{
    const int hd = head_dim, group = n_head / n_head_kv, T = SI_ATTN_TILE;
    const size_t kvd = (size_t)n_head_kv * hd;
    float *sc = scratch, *M = sc + T, *S = M + n_head;
    for (int h = h0; h < h1; h++) {
        M[h] = -INFINITY;
        S[h] = 0.0f;
    }
    memset(out + (size_t)h0 * hd, 0, (size_t)(h1 - h0) * hd * sizeof *out);
    for (int t0 = 0; t0 < n_kv; t0 += T) {
        const int lo = first > t0 ? first : t0, hi = n_kv < t0 + T ? n_kv : t0 + T;
        if (lo >= hi)
            continue;
        for (int h = h0; h < h1; h++) {
            const float *qh = q + (size_t)h * hd;
            const size_t koff = (size_t)(h / group) * hd;
            float *acc = out + (size_t)h * hd, m = -INFINITY;
            for (int j = 0; j < T; j++) {
                const int t = t0 + j;
                float s = -INFINITY;
                if (t >= lo && t < hi) {
                    const uint16_t *kt = k + (size_t)t * kvd + koff;
                    float d = 0.0f;
                    for (int i = 0; i < hd; i++)
                        d = fmaf(si_fp16_to_fp32(kt[i]), qh[i], d);
                    s = d * scale;
                }
                sc[j] = s;
                m = m > s ? m : s;
            }
            if (m == -INFINITY)
                continue;
            const float Mnew = fmaxf(M[h], m);
            if (Mnew > M[h]) {
                const float ms = expf(M[h] - Mnew);
                for (int i = 0; i < hd; i++)
                    acc[i] *= ms;
                S[h] *= ms;
            }
            M[h] = Mnew;
            S[h] = (float)((double)S[h] + si_act_exp_sum8(sc, T, Mnew));
            for (int t = lo; t < hi; t++) {
                const uint16_t *vt = v + (size_t)t * kvd + koff;
                const float pt = sc[t - t0];
                for (int i = 0; i < hd; i++)
                    acc[i] = fmaf(si_fp16_to_fp32(vt[i]), pt, acc[i]);
            }
        }
    }
    for (int h = h0; h < h1; h++) {
        const float inv = S[h] == 0.0f ? 0.0f : 1.0f / S[h];
        for (int i = 0; i < hd; i++)
            out[(size_t)h * hd + i] *= inv;
    }
}

/* si_k_attn_f16_tiled's steps over an implementation of the tiles. */
static void tiled_with(si__attn_tiled_fn fn, float *out, const float *q, const uint16_t *k,
                       const uint16_t *v, int first, int n_kv, int h0, int h1, int n_head,
                       int n_head_kv, int head_dim, float scale, float *scratch)
{
    const size_t o = (size_t)h0 * (size_t)head_dim;
    float *M = scratch + si_k_attn_tiles_scratch(head_dim), *S = M + n_head;
    const struct si_attn_query a = {q + o, out + o, M, S, first, n_kv};
    si_k_attn_query_start(&a, h1 - h0, head_dim);
    const struct si_kv kv = si_kv_f16(k, v, n_head_kv, head_dim);
    fn(&a, 1, &kv, h0, h1, n_head / n_head_kv, head_dim, scale, 0, n_kv, scratch);
    si_k_attn_query_finish(out + o, &a, h1 - h0, head_dim);
}

static int attn_case(int n_head, int n_head_kv, int head_dim, int first, int n_kv, enum fill f)
{
    const size_t nq = (size_t)n_head * head_dim, kvd = (size_t)n_head_kv * head_dim;
    const size_t nc = (size_t)(n_kv > 0 ? n_kv : 1) * kvd;
    float *q = malloc(nq * sizeof *q), *a = malloc(nq * sizeof *a), *b = malloc(nq * sizeof *b);
    uint16_t *k = malloc(nc * sizeof *k), *v = malloc(nc * sizeof *v);
    uint16_t *s1 = malloc(2 * (size_t)head_dim * sizeof *s1);
    uint16_t *s2 = malloc(2 * (size_t)head_dim * sizeof *s2);
    fill_case(f, q, nq, k, v, nc, head_dim, kvd);
    const float scale = 1.0f / sqrtf((float)head_dim) * (f == RISING ? 4.0f : 1.0f);
    memset(a, 0xa5, nq * sizeof *a);
    memset(b, 0x5a, nq * sizeof *b);
    si__k_attn_f16_portable(a, q, k, v, first, n_kv, 0, n_head, n_head, n_head_kv, head_dim,
                            scale, s1);
    si__quants_avx2.attn_f16(b, q, k, v, first, n_kv, 0, n_head, n_head, n_head_kv, head_dim,
                             scale, s2);
    int bad = 0;
    for (size_t i = 0; i < nq; i++) {
        if (si_act_bits(a[i]) != si_act_bits(b[i]) && bad++ < 3)
            fprintf(stderr, "attn %d/%d heads hd %d t %d..%d %s: out[%zu] %08x (%.9g) vs %08x (%.9g)\n",
                    n_head, n_head_kv, head_dim, first, n_kv, fill_name[f], i, si_act_bits(a[i]),
                    a[i], si_act_bits(b[i]), b[i]);
    }
    /* The public function runs the AVX2 code here. */
    si_k_attn_f16(a, q, k, v, first, n_kv, n_head, n_head_kv, head_dim, scale, s1);
    CHECK(memcmp(a, b, nq * sizeof *a) == 0, "si_k_attn_f16 is not the AVX2 code");
    /* Head ranges (one kv head's query heads at a time, as the engine's
     * attention tasks split them): each head the same bits, the others
     * untouched, in both implementations. */
    const int group = n_head / n_head_kv;
    for (int g = 0; g < n_head_kv; g++) {
        const int h0 = g * group, h1 = h0 + group;
        memset(a, 0x3c, nq * sizeof *a);
        si_k_attn_f16_heads(a, q, k, v, first, n_kv, h0, h1, n_head, n_head_kv, head_dim, scale,
                            s1);
        memset(s2, 0, 2 * (size_t)head_dim * sizeof *s2);
        float *c = malloc(nq * sizeof *c);
        memset(c, 0x3c, nq * sizeof *c);
        si__k_attn_f16_portable(c, q, k, v, first, n_kv, h0, h1, n_head, n_head_kv, head_dim,
                                scale, s2);
        for (size_t i = 0; i < nq; i++) {
            const bool in = i >= (size_t)h0 * head_dim && i < (size_t)h1 * head_dim;
            const uint32_t want = in ? si_act_bits(b[i]) : 0x3c3c3c3cu;
            if ((si_act_bits(a[i]) != want || si_act_bits(c[i]) != want) && bad++ < 3)
                fprintf(stderr, "attn heads [%d, %d) of %d: out[%zu] %08x / %08x, want %08x\n",
                        h0, h1, n_head, i, si_act_bits(a[i]), si_act_bits(c[i]), want);
        }
        free(c);
    }
    /* The tiled attention: the arithmetic as it was first written (the
     * oracle below), the portable tiles and the AVX2 twin. */
    float *t1 = malloc(si_k_attn_tiled_scratch(head_dim, n_head) * sizeof *t1);
    float *t2 = malloc(si_k_attn_tiled_scratch(head_dim, n_head) * sizeof *t2);
    float *c = malloc(nq * sizeof *c);
    memset(a, 0xa5, nq * sizeof *a);
    memset(b, 0x5a, nq * sizeof *b);
    memset(c, 0x3c, nq * sizeof *c);
    oracle_tiled(a, q, k, v, first, n_kv, 0, n_head, n_head, n_head_kv, head_dim, scale, t1);
    tiled_with(si__k_attn_tiles_portable, c, q, k, v, first, n_kv, 0, n_head, n_head, n_head_kv,
               head_dim, scale, t1);
    tiled_with(si__quants_avx2.attn_tiled, b, q, k, v, first, n_kv, 0, n_head, n_head, n_head_kv,
               head_dim, scale, t2);
    /* NaNs may differ in sign and payload: which operand of a fused
     * multiply-add a NaN comes from depends on the instruction's form. */
    for (size_t i = 0; i < nq; i++) {
        if ((si_act_bits(a[i]) != si_act_bits(c[i]) ||
             (si_act_bits(a[i]) != si_act_bits(b[i]) && !(isnan(a[i]) && isnan(b[i])))) &&
            bad++ < 3)
            fprintf(stderr,
                    "tiled attn %d/%d heads hd %d t %d..%d %s: out[%zu] %08x (%.9g) vs "
                    "portable %08x, AVX2 %08x (%.9g)\n",
                    n_head, n_head_kv, head_dim, first, n_kv, fill_name[f], i, si_act_bits(a[i]),
                    a[i], si_act_bits(c[i]), si_act_bits(b[i]), b[i]);
    }
    si_k_attn_f16_tiled(a, q, k, v, first, n_kv, 0, n_head, n_head, n_head_kv, head_dim, scale,
                        t1);
    CHECK(memcmp(a, b, nq * sizeof *a) == 0, "si_k_attn_f16_tiled is not the AVX2 code");
    /* Head ranges of the tiled one, as for the other. */
    for (int g = 0; g < n_head_kv; g++) {
        const int h0 = g * group, h1 = h0 + group;
        memset(a, 0x3c, nq * sizeof *a);
        tiled_with(si__k_attn_tiles_portable, a, q, k, v, first, n_kv, h0, h1, n_head, n_head_kv,
                   head_dim, scale, t1);
        memset(c, 0x3c, nq * sizeof *c);
        tiled_with(si__quants_avx2.attn_tiled, c, q, k, v, first, n_kv, h0, h1, n_head, n_head_kv,
                   head_dim, scale, t2);
        for (size_t i = 0; i < nq; i++) {
            const bool in = i >= (size_t)h0 * head_dim && i < (size_t)h1 * head_dim;
            const uint32_t want = in ? si_act_bits(b[i]) : 0x3c3c3c3cu;
            const bool nan_ok = in && isnan(b[i]);
            if (((si_act_bits(a[i]) != want && !(nan_ok && isnan(a[i]))) ||
                 (si_act_bits(c[i]) != want && !(nan_ok && isnan(c[i])))) && bad++ < 3)
                fprintf(stderr, "tiled attn heads [%d, %d) of %d: out[%zu] %08x / %08x, want "
                        "%08x\n", h0, h1, n_head, i, si_act_bits(a[i]), si_act_bits(c[i]), want);
        }
    }
    free(c);
    free(t1);
    free(t2);
    free(q);
    free(a);
    free(b);
    free(k);
    free(v);
    free(s1);
    free(s2);
    return bad;
}

/*
 * Many queries in one call of the tiles (a prompt's causal rows, windows,
 * a query that attends nothing), each against the oracle alone, in both
 * implementations: a query's bits must not depend on the others.
 */
static int queries_case(int n_head, int n_head_kv, int head_dim, int n_kv, int n_q, int window)
{
    const size_t nq = (size_t)n_head * head_dim, kvd = (size_t)n_head_kv * head_dim;
    float *q = malloc((size_t)n_q * nq * sizeof *q), *acc = malloc((size_t)n_q * nq * sizeof *acc);
    float *ms = malloc(2 * (size_t)n_q * (size_t)n_head * sizeof *ms),
          *want = malloc(nq * sizeof *want);
    uint16_t *k = malloc((size_t)n_kv * kvd * sizeof *k),
             *v = malloc((size_t)n_kv * kvd * sizeof *v);
    float *t1 = malloc(si_k_attn_tiled_scratch(head_dim, n_head) * sizeof *t1);
    struct si_attn_query *qs = malloc((size_t)n_q * sizeof *qs);
    fill_case(PLAIN, q, (size_t)n_q * nq, k, v, (size_t)n_kv * kvd, head_dim, kvd);
    const float scale = 1.0f / sqrtf((float)head_dim);
    int bad = 0;
    for (int impl = 0; impl < 2; impl++) {
        for (int r = 0; r < n_q; r++) {
            const int hi = n_kv - n_q + 1 + r; /* causal: the last n_q positions */
            const int lo = r == 1 ? hi : window > 0 && hi > window ? hi - window : 0;
            qs[r] = (struct si_attn_query){q + (size_t)r * nq,
                                           acc + (size_t)r * nq,
                                           ms + (size_t)r * n_head,
                                           ms + (size_t)(n_q + r) * n_head,
                                           lo,
                                           hi};
            si_k_attn_query_start(&qs[r], n_head, head_dim);
        }
        const struct si_kv kv = si_kv_f16(k, v, n_head_kv, head_dim);
        (impl ? si__quants_avx2.attn_tiled : si__k_attn_tiles_portable)(
            qs, n_q, &kv, 0, n_head, n_head / n_head_kv, head_dim, scale, 0, n_kv, t1);
        for (int r = 0; r < n_q; r++) {
            si_k_attn_query_finish(acc + (size_t)r * nq, &qs[r], n_head, head_dim);
            oracle_tiled(want, q + (size_t)r * nq, k, v, qs[r].lo, qs[r].hi, 0, n_head, n_head,
                         n_head_kv, head_dim, scale, t1);
            if (memcmp(want, acc + (size_t)r * nq, nq * sizeof *want) != 0 && bad++ < 3)
                fprintf(stderr,
                        "%s tiles, %d queries, %d/%d heads hd %d: query %d [%d, %d) differs\n",
                        impl ? "AVX2" : "portable", n_q, n_head, n_head_kv, head_dim, r, qs[r].lo,
                        qs[r].hi);
        }
    }
    free(q);
    free(acc);
    free(ms);
    free(want);
    free(k);
    free(v);
    free(t1);
    free(qs);
    return bad;
}

/* Double precision attention of query heads [0, n_head) over [first, n_kv). */
static void exact_attn(double *out, const float *q, const uint16_t *k, const uint16_t *v, int first,
                       int n_kv, int n_head, int n_head_kv, int hd, float scale)
{
    const size_t kvd = (size_t)n_head_kv * hd;
    for (int h = 0; h < n_head; h++) {
        const size_t ko = (size_t)(h / (n_head / n_head_kv)) * hd;
        double mx = -INFINITY, sum = 0.0;
        for (int t = first; t < n_kv; t++) {
            double d = 0.0;
            for (int i = 0; i < hd; i++)
                d += (double)si_fp16_to_fp32(k[t * kvd + ko + i]) * q[(size_t)h * hd + i];
            mx = fmax(mx, d * scale);
        }
        for (int i = 0; i < hd; i++)
            out[(size_t)h * hd + i] = 0.0;
        for (int t = first; t < n_kv; t++) {
            double d = 0.0;
            for (int i = 0; i < hd; i++)
                d += (double)si_fp16_to_fp32(k[t * kvd + ko + i]) * q[(size_t)h * hd + i];
            const double p = exp(d * scale - mx);
            sum += p;
            for (int i = 0; i < hd; i++)
                out[(size_t)h * hd + i] += p * si_fp16_to_fp32(v[t * kvd + ko + i]);
        }
        for (int i = 0; i < hd; i++) /* nothing attended: 0, as the kernels give */
            out[(size_t)h * hd + i] = sum > 0.0 ? out[(size_t)h * hd + i] / sum : 0.0;
    }
}

/*
 * Decoding's split: within one chunk it is the tiled attention, bits and
 * all; over several, chunk by chunk and merged, it is the exact attention
 * within what its float arithmetic allows.  Each output's error is bounded
 * by the sums' roundings: a chunk's sums run over at most SI_ATTN_CHUNK
 * positions and the merge over n chunks, each adding at most a relative
 * 2^-24 per term (on the numerator and the denominator alike), plus
 * si_act_exp's 1.5 ulp and a score's rounding over head_dim products
 * (head_dim 2^-24 times the largest sum of |q_i k_i| scale, through e^s),
 * all relative to the largest |v|.
 */
static int split_case(int n_head, int n_head_kv, int hd, int first, int n_kv)
{
    const size_t nq = (size_t)n_head * hd, kvd = (size_t)n_head_kv * hd;
    float *q = malloc(nq * sizeof *q), *a = malloc(nq * sizeof *a), *b = malloc(nq * sizeof *b);
    double *x = malloc(nq * sizeof *x);
    uint16_t *k = malloc((size_t)n_kv * kvd * sizeof *k),
             *v = malloc((size_t)n_kv * kvd * sizeof *v);
    float *t = malloc(si_k_attn_split_scratch(hd, n_head, n_kv) * sizeof *t);
    float *t2 = malloc(si_k_attn_tiled_scratch(hd, n_head) * sizeof *t2);
    fill_case(PLAIN, q, nq, k, v, (size_t)n_kv * kvd, hd, kvd);
    const float scale = 1.0f / sqrtf((float)hd);
    const struct si_kv kv = si_kv_f16(k, v, n_head_kv, hd);
    si_k_attn_split(a, q, &kv, first, n_kv, 0, n_head, n_head, n_head_kv, hd, scale, t);
    int bad = 0, c0;
    const int nc = si_k_attn_chunks(first, n_kv, &c0);
    if (nc == 1) {
        si_k_attn_f16_tiled(b, q, k, v, first, n_kv, 0, n_head, n_head, n_head_kv, hd, scale, t2);
        if (memcmp(a, b, nq * sizeof *a) != 0 && bad++ < 3)
            fprintf(stderr, "split over one chunk [%d, %d) is not the tiled attention\n", first,
                    n_kv);
    }
    exact_attn(x, q, k, v, first, n_kv, n_head, n_head_kv, hd, scale);
    double vmax = 0.0, smax = 0.0;
    for (size_t i = 0; i < (size_t)n_kv * kvd; i++)
        vmax = fmax(vmax, fabs(si_fp16_to_fp32(v[i])));
    for (int h = 0; h < n_head; h++)
        for (int tt = first; tt < n_kv; tt++) {
            double s = 0.0;
            for (int i = 0; i < hd; i++)
                s += fabs((double)si_fp16_to_fp32(
                              k[tt * kvd + (size_t)(h / (n_head / n_head_kv)) * hd + i]) *
                          q[(size_t)h * hd + i]);
            smax = fmax(smax, s * scale);
        }
    const double tol =
        vmax * 0x1p-24 * (2.0 * (SI_ATTN_CHUNK + nc + 2) + 2 * 1.5 * 2 + 2.0 * hd * smax);
    for (size_t i = 0; i < nq; i++)
        if (!(fabs(a[i] - x[i]) <= tol) && bad++ < 3)
            fprintf(stderr, "split [%d, %d), %d chunks: out[%zu] %.9g, exact %.9g, bound %.3g\n",
                    first, n_kv, nc, i, a[i], x[i], tol);
    free(q);
    free(a);
    free(b);
    free(x);
    free(k);
    free(v);
    free(t);
    free(t2);
    return bad;
}

/*
 * Quantized caches (q8_0, q4_0 for K and V in any pair): the portable
 * tiles and the AVX2 twin give the same bits, and both the attention of
 * the dequantized cache computed exactly within the split's bound (the
 * quantization's own error is the cache's, not the kernels').
 */
static int quant_case(uint32_t tk, uint32_t tv, int n_head, int n_head_kv, int hd, int first,
                      int n_kv)
{
    const size_t nq = (size_t)n_head * hd, kvd = (size_t)n_head_kv * hd;
    size_t kr = 0, vr = 0;
    si_type_row_size(tk, (int64_t)kvd, &kr);
    si_type_row_size(tv, (int64_t)kvd, &vr);
    float *q = malloc(nq * sizeof *q), *a = malloc(nq * sizeof *a), *b = malloc(nq * sizeof *b);
    float *kf = malloc((size_t)n_kv * kvd * sizeof *kf),
          *vf = malloc((size_t)n_kv * kvd * sizeof *vf);
    char *k = malloc((size_t)n_kv * kr), *v = malloc((size_t)n_kv * vr);
    float *m = malloc(4 * (size_t)n_head * sizeof *m);
    float *t = malloc(si_k_attn_split_scratch(hd, n_head, n_kv) * sizeof *t);
    for (size_t i = 0; i < nq; i++)
        q[i] = uniform(-1.0f, 1.0f);
    for (size_t i = 0; i < (size_t)n_kv * kvd; i++) {
        kf[i] = uniform(-1.0f, 1.0f);
        vf[i] = uniform(-0.5f, 0.5f);
    }
    for (int p = 0; p < n_kv; p++) {
        si_quantize_row(tk, kf + (size_t)p * kvd, k + (size_t)p * kr, (int64_t)kvd);
        si_quantize_row(tv, vf + (size_t)p * kvd, v + (size_t)p * vr, (int64_t)kvd);
    }
    const struct si_kv kv = {k, v, kr, vr, tk, tv};
    const float scale = 1.0f / sqrtf((float)hd);
    const struct si_attn_query qa = {q, a, m, m + n_head, first, n_kv},
                               qb = {q, b, m + 2 * n_head, m + 3 * n_head, first, n_kv};
    si_k_attn_query_start(&qa, n_head, hd);
    si_k_attn_query_start(&qb, n_head, hd);
    si__k_attn_tiles_portable(&qa, 1, &kv, 0, n_head, n_head / n_head_kv, hd, scale, 0, n_kv, t);
    si__quants_avx2.attn_tiled(&qb, 1, &kv, 0, n_head, n_head / n_head_kv, hd, scale, 0, n_kv, t);
    si_k_attn_query_finish(a, &qa, n_head, hd);
    si_k_attn_query_finish(b, &qb, n_head, hd);
    int bad = 0;
    if (memcmp(a, b, nq * sizeof *a) != 0 && bad++ < 3)
        fprintf(stderr, "%s/%s cache: the AVX2 tiles are not the portable code\n", si_type_name(tk),
                si_type_name(tv));
    /* against the exact attention of the dequantized cache, as fp16 can
     * hold it only approximately: in double directly */
    double *x = malloc(nq * sizeof *x), *sx = malloc((size_t)n_kv * sizeof *sx);
    for (int p = 0; p < n_kv; p++) {
        si_dequantize_row(tk, k + (size_t)p * kr, kf + (size_t)p * kvd, (int64_t)kvd);
        si_dequantize_row(tv, v + (size_t)p * vr, vf + (size_t)p * kvd, (int64_t)kvd);
    }
    double vmax = 0.0, smax = 0.0;
    for (int h = 0; h < n_head; h++) {
        const size_t ko = (size_t)(h / (n_head / n_head_kv)) * hd;
        double mx = -INFINITY, sum = 0.0;
        for (int p = first; p < n_kv; p++) {
            double d = 0.0, ad = 0.0;
            for (int i = 0; i < hd; i++) {
                d += (double)kf[(size_t)p * kvd + ko + i] * q[(size_t)h * hd + i];
                ad += fabs((double)kf[(size_t)p * kvd + ko + i] * q[(size_t)h * hd + i]);
                vmax = fmax(vmax, fabs(vf[(size_t)p * kvd + ko + i]));
            }
            sx[p] = d * scale;
            smax = fmax(smax, ad * scale);
            mx = fmax(mx, sx[p]);
        }
        for (int i = 0; i < hd; i++)
            x[(size_t)h * hd + i] = 0.0;
        for (int p = first; p < n_kv; p++) {
            const double w = exp(sx[p] - mx);
            sum += w;
            for (int i = 0; i < hd; i++)
                x[(size_t)h * hd + i] += w * vf[(size_t)p * kvd + ko + i];
        }
        for (int i = 0; i < hd; i++)
            x[(size_t)h * hd + i] /= sum;
    }
    const double tol = vmax * 0x1p-24 * (2.0 * (n_kv + 2) + 6.0 + 2.0 * hd * smax);
    for (size_t i = 0; i < nq; i++)
        if (!(fabs(a[i] - x[i]) <= tol) && bad++ < 3)
            fprintf(stderr, "%s/%s cache: out[%zu] %.9g, exact %.9g, bound %.3g\n",
                    si_type_name(tk), si_type_name(tv), i, a[i], x[i], tol);
    free(q);
    free(a);
    free(b);
    free(kf);
    free(vf);
    free(k);
    free(v);
    free(m);
    free(t);
    free(x);
    free(sx);
    return bad;
}

static void test_tiles(void)
{
    int bad = 0, cases = 0;
    static const int qcase[][6] = {{9, 3, 64, 300, 40, 0},   {9, 3, 64, 200, 64, 0},
                                   {4, 1, 128, 130, 7, 33},  {8, 8, 80, 65, 65, 0},
                                   {6, 2, 40, 500, 17, 100}, {2, 1, 7, 70, 3, 0}};
    for (size_t i = 0; i < sizeof qcase / sizeof qcase[0]; i++, cases++)
        bad += queries_case(qcase[i][0], qcase[i][1], qcase[i][2], qcase[i][3], qcase[i][4],
                            qcase[i][5]) != 0;
    static const int scase[][5] = {{9, 3, 64, 0, 512},  {9, 3, 64, 0, 2048}, {9, 3, 64, 700, 2100},
                                   {4, 1, 128, 0, 777}, {8, 2, 64, 10, 250}, {2, 2, 96, 255, 1025},
                                   {4, 4, 64, 300, 300}};
    for (size_t i = 0; i < sizeof scase / sizeof scase[0]; i++, cases++)
        bad += split_case(scase[i][0], scase[i][1], scase[i][2], scase[i][3], scase[i][4]) != 0;
    static const uint32_t types[] = {SI_TYPE_F16, SI_TYPE_Q8_0, SI_TYPE_Q4_0};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++, cases++)
            bad += quant_case(types[i], types[j], 9, 3, 64, i == j ? 0 : 5, 200 + 37 * i + j) != 0;
    bad += quant_case(SI_TYPE_Q8_0, SI_TYPE_Q8_0, 4, 1, 128, 0, 64) != 0;
    cases++;
    CHECK(bad == 0, "%d of %d tiles and split cases differ", bad, cases);
    printf("tiles (many queries) and split: %d cases, %d differ\n", cases, bad);
}

static void test_attn(void)
{
    static const int heads[][2] = {{1, 1}, {4, 4}, {8, 2}, {6, 3}, {16, 16}, {32, 8}, {4, 1}};
    static const int dims[] = {64, 128, 256, 80, 96, 40, 72, 65, 7, 1};
    static const int lens[] = {1, 2, 5, 50, 63, 64, 65, 129, 300};
    int cases = 0, bad_cases = 0;
    for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                const int n_kv = lens[li];
                /* All positions, a sliding window, a window of one. */
                const int firsts[3] = {0, n_kv > 4 ? n_kv / 3 : 0, n_kv - 1};
                for (int fi = 0; fi < 3; fi++) {
                    for (int f = 0; f < N_FILLS; f++) {
#ifdef __SANITIZE_ADDRESS__
                        /* (memory errors, not values: every shape and
                         * window, one fill each, in turn) */
                        if ((size_t)f != (hi + di + li + (size_t)fi) % N_FILLS)
                            continue;
#endif
                        cases++;
                        bad_cases += attn_case(heads[hi][0], heads[hi][1], dims[di], firsts[fi],
                                               n_kv, (enum fill)f) != 0;
                    }
                }
            }
        }
    }
    /* Nothing attended: zeros. */
    cases++;
    bad_cases += attn_case(4, 2, 64, 10, 10, PLAIN) != 0;
    CHECK(bad_cases == 0, "%d of %d attention cases differ", bad_cases, cases);
    printf("attention: %d cases, %d differ\n", cases, bad_cases);
}

int main(void)
{
    if (!si__quants_avx2_usable() || si__quants_avx2.attn_f16 == NULL)
        test_skip("no AVX2+FMA+F16C on this build or CPU");
    test_fp16_to_fp32();
    test_fp32_to_fp16();
    const char *no_simd = getenv("SI_NO_SIMD");
    if (no_simd != NULL && no_simd[0] != '\0' && strcmp(no_simd, "0") != 0) {
        /* The scalar kernels: si_k_attn_f16 is the portable code, whose dot
         * is then not the AVX2 one, so there is no twin to compare. */
        CHECK(si__quants_active()->attn_f16 == NULL,
              "SI_NO_SIMD=1 still uses the AVX2 attention");
        return test_result();
    }
    CHECK(si__quants_active()->attn_f16 == si__quants_avx2.attn_f16,
          "the AVX2 attention is not in use");
    test_attn();
    test_tiles();
    return test_result();
}
