/* Quantizes the f32 values of file argv[1] (an int64 count, then the values) with ggml's reference
 * quantizers and writes the blocks to argv[2] (Q4_K), argv[3] (Q5_K) and argv[4] (Q6_K).
 * Built and run by scripts/make-kquant-refs.sh against llama.cpp's ggml-quants.c. */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "ggml-quants.h"

static void write_file(const char *path, const void *data, size_t bytes) {
    FILE *out = fopen(path, "wb");
    if (!out || fwrite(data, 1, bytes, out) != bytes) { perror(path); exit(1); }
    fclose(out);
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: harness IN Q4_K Q5_K Q6_K\n"); return 2; }
    FILE *in = fopen(argv[1], "rb");
    int64_t n = 0;
    if (!in || fread(&n, 8, 1, in) != 1 || n <= 0 || n % 256 != 0) { fprintf(stderr, "bad input\n"); return 1; }
    float *x = malloc(n * sizeof(float));
    if (fread(x, sizeof(float), n, in) != (size_t)n) { fprintf(stderr, "short input\n"); return 1; }
    fclose(in);
    int64_t blocks = n / 256;
    block_q4_K *q4 = malloc(blocks * sizeof(block_q4_K));
    block_q5_K *q5 = malloc(blocks * sizeof(block_q5_K));
    block_q6_K *q6 = malloc(blocks * sizeof(block_q6_K));
    quantize_row_q4_K_ref(x, q4, n);
    quantize_row_q5_K_ref(x, q5, n);
    quantize_row_q6_K_ref(x, q6, n);
    write_file(argv[2], q4, blocks * sizeof(block_q4_K));
    write_file(argv[3], q5, blocks * sizeof(block_q5_K));
    write_file(argv[4], q6, blocks * sizeof(block_q6_K));
    return 0;
}
