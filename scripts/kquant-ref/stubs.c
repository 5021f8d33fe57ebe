/* The four symbols of ggml.c that ggml-quants.c links against and the reference quantizers never call. */
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char *file, int line, const char *fmt, ...) { fprintf(stderr, "ggml_abort at %s:%d\n", file, line); abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
size_t ggml_type_size(int type) { (void)type; abort(); }
const char *ggml_type_name(int type) { (void)type; return "?"; }
