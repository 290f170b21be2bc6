/*
 * attn_types.h - the data of the tiled attention kernels (model/kernels.h
 * declares them; their AVX2 twin, quants_avx2_attn.c, reads these without
 * its caller's header).
 */
#ifndef SI_MODEL_ATTN_TYPES_H
#define SI_MODEL_ATTN_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* Positions per tile of si_k_attn_tiles (llama.cpp's KV tile), in its
 * portable code (model/attn_tiles.c) and its AVX2 twin alike. */
#define SI_ATTN_TILE 64

/*
 * A layer's K and V caches as the tiled kernels read them: position t's K
 * row at k + t * k_row bytes, of type k_type (SI_TYPE_F16, SI_TYPE_Q8_0 or
 * SI_TYPE_Q4_0; quantized rows hold whole blocks per kv head), kv head g
 * its elements [g * head_dim, (g + 1) * head_dim); V likewise.  Quantized
 * rows are read as floats through si_dequantize_row's arithmetic.
 */
struct si_kv {
    const void *k, *v;
    size_t k_row, v_row;
    uint32_t k_type, v_type;
};

/*
 * One query of si_k_attn_tiles, over query heads [h0, h1) of the call: its
 * query (head h at q + (h - h0) * head_dim), its accumulators laid out
 * alike, each head's running maximum M[h - h0] and sum S[h - h0], and the
 * positions it attends, [lo, hi).  si_k_attn_query_start sets acc to 0, M
 * to -inf and S to 0; si_k_attn_query_finish writes out = acc * (1 / S), 0
 * where S is 0 (out may be acc).
 */
struct si_attn_query {
    const float *q;
    float *acc, *M, *S;
    int lo, hi;
};

#endif /* SI_MODEL_ATTN_TYPES_H */
