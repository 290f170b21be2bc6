/* types.c - block sizes of GGUF tensor types. */
#include "model/types.h"

#include <limits.h>

/* Block layouts (bytes): Q4_0 = f16 d + 16 nibble bytes; Q4_1 = d, m + 16;
 * Q5_0 = d + 4 high bits + 16; Q5_1 = d, m + 4 + 16; Q8_0 = d + 32; K-quants
 * use super-blocks of 256 elements. */
static const struct si_type_traits traits[SI_TYPE_COUNT] = {
    [SI_TYPE_F32] = {"F32", 1, 4},
    [SI_TYPE_F16] = {"F16", 1, 2},
    [SI_TYPE_Q4_0] = {"Q4_0", 32, 18},
    [SI_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [SI_TYPE_Q5_0] = {"Q5_0", 32, 22},
    [SI_TYPE_Q5_1] = {"Q5_1", 32, 24},
    [SI_TYPE_Q8_0] = {"Q8_0", 32, 34},
    [SI_TYPE_Q8_1] = {"Q8_1", 32, 36},
    [SI_TYPE_Q2_K] = {"Q2_K", 256, 84},
    [SI_TYPE_Q3_K] = {"Q3_K", 256, 110},
    [SI_TYPE_Q4_K] = {"Q4_K", 256, 144},
    [SI_TYPE_Q5_K] = {"Q5_K", 256, 176},
    [SI_TYPE_Q6_K] = {"Q6_K", 256, 210},
    [SI_TYPE_Q8_K] = {"Q8_K", 256, 292},
    [SI_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66},
    [SI_TYPE_IQ2_XS] = {"IQ2_XS", 256, 74},
    [SI_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98},
    [SI_TYPE_IQ1_S] = {"IQ1_S", 256, 50},
    [SI_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18},
    [SI_TYPE_IQ3_S] = {"IQ3_S", 256, 110},
    [SI_TYPE_IQ2_S] = {"IQ2_S", 256, 82},
    [SI_TYPE_IQ4_XS] = {"IQ4_XS", 256, 136},
    [SI_TYPE_I8] = {"I8", 1, 1},
    [SI_TYPE_I16] = {"I16", 1, 2},
    [SI_TYPE_I32] = {"I32", 1, 4},
    [SI_TYPE_I64] = {"I64", 1, 8},
    [SI_TYPE_F64] = {"F64", 1, 8},
    [SI_TYPE_IQ1_M] = {"IQ1_M", 256, 56},
    [SI_TYPE_BF16] = {"BF16", 1, 2},
    [SI_TYPE_TQ1_0] = {"TQ1_0", 256, 54},
    [SI_TYPE_TQ2_0] = {"TQ2_0", 256, 66},
    [SI_TYPE_MXFP4] = {"MXFP4", 32, 17},
};

const struct si_type_traits *si_type_get(uint32_t t)
{
    if (t >= SI_TYPE_COUNT || traits[t].name == NULL)
        return NULL;
    return &traits[t];
}

const char *si_type_name(uint32_t t)
{
    const struct si_type_traits *tr = si_type_get(t);
    return tr ? tr->name : "?";
}

uint32_t si_type_from_pwri(uint32_t file_type)
{
    switch (file_type) {
    case 16: return SI_TYPE_I8;
    case 17: return SI_TYPE_I16;
    case 18: return SI_TYPE_I32;
    default: return file_type;
    }
}

uint32_t si_type_to_pwri(uint32_t t)
{
    switch (t) {
    case SI_TYPE_I8: return 16;
    case SI_TYPE_I16: return 17;
    case SI_TYPE_I32: return 18;
    case SI_TYPE_IQ2_XXS:
    case SI_TYPE_IQ2_XS:
    case SI_TYPE_IQ3_XXS: return UINT32_MAX;
    default: return t;
    }
}

bool si_type_row_size(uint32_t t, int64_t n, size_t *bytes)
{
    const struct si_type_traits *tr = si_type_get(t);
    if (tr == NULL || n < 0 || n % tr->block != 0)
        return false;
    uint64_t blocks = (uint64_t)(n / tr->block);
    if (blocks > SIZE_MAX / tr->size)
        return false;
    *bytes = (size_t)blocks * tr->size;
    return true;
}
