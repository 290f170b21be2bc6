/*
 * test-cuda-decode.c - the CUDA kernels' row decoders (cuda_common.cuh)
 * against the scalar oracle, on the host: no GPU needed, so every machine
 * that builds the CUDA codelets checks them.  For each type the kernels read
 * (F32, F16, Q8_0, Q4_0, Q4_1 and the K super-blocks Q4_K, Q5_K, Q6_K):
 *
 *  - elements: cu_row_elem (the column-wise down projection's decoder) must
 *    give si_dequantize_row()'s values exactly;
 *  - dots: the 32 lanes' shares of cu_row_dot_lane, summed in the warp's
 *    order, against the dot of the dequantized row in double, within 1e-5
 *    of sum |w_j x_j| (float sums of 1280 products in another order);
 *  - refusals: a row that is not a whole number of blocks, a misaligned row.
 *
 * tests/test-cuda-kernels runs the kernels themselves on a GPU.
 */
#include "codelets/codelets_cuda.h"
#include "model/quants.h"
#include "model/types.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

#define N    1280 /* five K super-blocks, forty 32-blocks */
#define ROWS 6

static uint64_t rng = 0x2545f4914f6cdd1dULL;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

int main(void)
{
    static const uint32_t types[] = {SI_TYPE_F32,  SI_TYPE_F16,  SI_TYPE_Q8_0, SI_TYPE_Q4_0,
                                     SI_TYPE_Q4_1, SI_TYPE_Q4_K, SI_TYPE_Q5_K, SI_TYPE_Q6_K};
    static float src[N], x[N], want[N], got[N];
    static _Alignas(16) uint8_t row[4 * N + 16];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const uint32_t t = types[k];
        int64_t bad_elems = 0;
        double worst = 0;
        for (int r = 0; r < ROWS; r++) {
            /* magnitudes that vary from block to block, and an offset row
             * (Q4_1's and the K types' minimums) */
            for (int j = 0; j < N; j++) {
                const float scale = 0.05f + (float)((j / 32 + r) % 7);
                src[j] = frand() * scale + (r == 3 ? 2.0f : 0.0f);
                x[j] = frand();
            }
            CHECK(si_quantize_row(t, src, row, N) > 0, "%s: quantize", si_type_name(t));
            si_dequantize_row(t, row, want, N);
            CHECK(si__cuda_host_row_elems(t, row, N, got) == 0, "%s: elements refused",
                  si_type_name(t));
            /* equal values (the AVX2 decoders' d q - 8 d gives +0 where
             * d (q - 8) gives -0 for a negative d: the sign of a zero) */
            for (int j = 0; j < N; j++)
                bad_elems += !(got[j] == want[j]);
            double exact = 0, mag = 0;
            for (int j = 0; j < N; j++) {
                exact += (double)want[j] * (double)x[j];
                mag += fabs((double)want[j] * (double)x[j]);
            }
            float dot = NAN;
            CHECK(si__cuda_host_row_dot(t, row, x, N, &dot) == 0, "%s: dot refused",
                  si_type_name(t));
            const double err = fabs((double)dot - exact) / mag;
            worst = err > worst || isnan(err) ? err : worst;
        }
        CHECK(bad_elems == 0, "%s: %lld elements differ from si_dequantize_row", si_type_name(t),
              (long long)bad_elems);
        CHECK(worst <= 1e-5, "%s: dot off by %.2e of sum |w x|", si_type_name(t), worst);
        /* refusals: 96 elements (not whole K super-blocks; for the 32-block
         * types 100), a row at an odd address */
        const int64_t short_n = t == SI_TYPE_Q4_K || t == SI_TYPE_Q5_K || t == SI_TYPE_Q6_K ? 96
                                : t == SI_TYPE_F32 || t == SI_TYPE_F16                      ? -1
                                                                                            : 100;
        float dot = 0;
        CHECK(si__cuda_host_row_dot(t, row, x, short_n, &dot) == -1 &&
                  si__cuda_host_row_elems(t, row, short_n, got) == -1,
              "%s: %lld elements accepted", si_type_name(t), (long long)short_n);
        CHECK(si__cuda_host_row_dot(t, row + 1, x, N, &dot) == -1,
              "%s: a row at an odd address accepted", si_type_name(t));
        printf("%-5s elements exact (%d rows of %d), dot max error %.2e of sum |w x|\n",
               si_type_name(t), ROWS, N, worst);
    }
    float dot = 0;
    CHECK(si__cuda_host_row_dot(SI_TYPE_Q5_0, row, x, N, &dot) == -1,
          "Q5_0 (no CUDA decoder) accepted");
    return test_result();
}
