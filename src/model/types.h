/*
 * types.h - tensor element types of GGUF files (ggml's numbering).
 *
 * A quantized type stores blocks of `block` elements in `size` bytes; a tensor
 * row of n elements (n a multiple of `block`) takes n / block * size bytes.
 * The numbering is part of the file format: values never change.
 */
#ifndef SI_MODEL_TYPES_H
#define SI_MODEL_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum si_type {
    SI_TYPE_F32 = 0,
    SI_TYPE_F16 = 1,
    SI_TYPE_Q4_0 = 2,
    SI_TYPE_Q4_1 = 3,
    SI_TYPE_Q5_0 = 6,
    SI_TYPE_Q5_1 = 7,
    SI_TYPE_Q8_0 = 8,
    SI_TYPE_Q8_1 = 9,
    SI_TYPE_Q2_K = 10,
    SI_TYPE_Q3_K = 11,
    SI_TYPE_Q4_K = 12,
    SI_TYPE_Q5_K = 13,
    SI_TYPE_Q6_K = 14,
    SI_TYPE_Q8_K = 15,
    SI_TYPE_IQ2_XXS = 16,
    SI_TYPE_IQ2_XS = 17,
    SI_TYPE_IQ3_XXS = 18,
    SI_TYPE_IQ1_S = 19,
    SI_TYPE_IQ4_NL = 20,
    SI_TYPE_IQ3_S = 21,
    SI_TYPE_IQ2_S = 22,
    SI_TYPE_IQ4_XS = 23,
    SI_TYPE_I8 = 24,
    SI_TYPE_I16 = 25,
    SI_TYPE_I32 = 26,
    SI_TYPE_I64 = 27,
    SI_TYPE_F64 = 28,
    SI_TYPE_IQ1_M = 29,
    SI_TYPE_BF16 = 30,
    SI_TYPE_TQ1_0 = 34,
    SI_TYPE_TQ2_0 = 35,
    SI_TYPE_MXFP4 = 39,
    SI_TYPE_COUNT = 40
};

struct si_type_traits {
    const char *name; /* NULL for numbers that name no type */
    int64_t block;    /* elements per block */
    size_t size;      /* bytes per block */
};

/* Traits of type t, or NULL when t is not a known type. */
const struct si_type_traits *si_type_get(uint32_t t);

/* Name of type t ("F32", "Q4_K", ...), or "?" when unknown. */
const char *si_type_name(uint32_t t);

/*
 * Bytes of a row of n elements of type t into *bytes.  False when t is
 * unknown, n is negative or not a multiple of the block size, or the size
 * overflows.
 */
bool si_type_row_size(uint32_t t, int64_t n, size_t *bytes);

/*
 * PowerInfer's files ("PWRI") number types as its ggml did before the IQ
 * types: 0 to 15 as here, then I8, I16, I32 as 16, 17, 18, which ggml
 * later gave to IQ2_XXS, IQ2_XS, IQ3_XXS (and I8, I16, I32 became 24, 25,
 * 26).  si_type_from_pwri gives the type of a PWRI file's number (other
 * numbers as they are: starinfer read and wrote 24 to 26 there before);
 * si_type_to_pwri the number PowerInfer reads for type t, or UINT32_MAX
 * for IQ2_XXS, IQ2_XS and IQ3_XXS, which a PWRI file cannot name.
 */
uint32_t si_type_from_pwri(uint32_t file_type);
uint32_t si_type_to_pwri(uint32_t t);

#endif /* SI_MODEL_TYPES_H */
