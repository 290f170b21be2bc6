/* cli.c - helpers shared by the starinfer commands. */
#include "cli.h"
#include "progress.h"

#include "model/model.h"
#include "model/tokenizer.h"
#include "starinfer.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int si_cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(SI_PROG ": error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

const char *si_cli_value(int argc, char **argv, int *i)
{
    const char *flag = argv[*i];
    if (*i + 1 >= argc) {
        si_cli_error("%s needs a value", flag);
        return NULL;
    }
    return argv[++*i];
}

bool si_cli_int(const char *flag, const char *s, long long min, long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0') {
        si_cli_error("%s: '%s' is not a whole number", flag, s);
        return false;
    }
    if (errno == ERANGE) {
        si_cli_error("%s: %s is out of range [%lld, %lld]", flag, s, min, max);
        return false;
    }
    if (v < min || v > max) {
        si_cli_error("%s: %lld is out of range [%lld, %lld]", flag, v, min, max);
        return false;
    }
    *out = v;
    return true;
}

bool si_cli_float(const char *flag, const char *s, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || isnan(v)) {
        si_cli_error("%s: '%s' is not a number", flag, s);
        return false;
    }
    if (isinf(v) || (errno == ERANGE && v != 0)) {
        si_cli_error("%s: %s is out of range [%g, %g]", flag, s, min, max);
        return false;
    }
    if (v < min || v > max) {
        si_cli_error("%s: %g is out of range [%g, %g]", flag, v, min, max);
        return false;
    }
    *out = v;
    return true;
}

int si_cli_opt_str(int argc, char **argv, int *i, const char **out)
{
    return (*out = si_cli_value(argc, argv, i)) != NULL ? 1 : -1;
}

int si_cli_opt_int(int argc, char **argv, int *i, long long min, long long max, long long *out)
{
    const char *flag = argv[*i], *v = si_cli_value(argc, argv, i);
    return v != NULL && si_cli_int(flag, v, min, max, out) ? 1 : -1;
}

int si_cli_opt_float(int argc, char **argv, int *i, double min, double max, double *out)
{
    const char *flag = argv[*i], *v = si_cli_value(argc, argv, i);
    return v != NULL && si_cli_float(flag, v, min, max, out) ? 1 : -1;
}

int si_cli_opt_size(int argc, char **argv, int *i, int64_t *out)
{
    const char *flag = argv[*i], *v = si_cli_value(argc, argv, i);
    return v != NULL && si_cli_size(flag, v, out) ? 1 : -1;
}

int si_cli_opt_i32(int argc, char **argv, int *i, long long min, long long max, int32_t *out)
{
    long long n;
    if (si_cli_opt_int(argc, argv, i, min, max, &n) < 0)
        return -1;
    *out = (int32_t)n;
    return 1;
}

int si_cli_opt_f32(int argc, char **argv, int *i, double min, double max, float *out)
{
    double d;
    if (si_cli_opt_float(argc, argv, i, min, max, &d) < 0)
        return -1;
    *out = (float)d;
    return 1;
}

int si_cli_opt_range(int argc, char **argv, int *i, double lo, bool lo_in, double hi, bool hi_in,
                     double *out)
{
    const char *flag = argv[*i];
    if (si_cli_opt_float(argc, argv, i, -HUGE_VAL, HUGE_VAL, out) < 0)
        return -1;
    if (!((lo_in ? *out >= lo : *out > lo) && (hi_in ? *out <= hi : *out < hi)))
        return si_cli_error("%s: %g is out of range %c%g, %g%c", flag, *out, lo_in ? '[' : '(', lo,
                            hi, hi_in ? ']' : ')'),
               -1;
    return 1;
}

bool si_cli_size(const char *flag, const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(v) || v < 0) {
        si_cli_error("%s: '%s' is not a size (e.g. 512M, 1.5G)", flag, s);
        return false;
    }
    double scale = 1;
    const char *u = end;
    switch (*u == '\0' ? 'B' : (*u >= 'a' && *u <= 'z' ? *u - 32 : *u)) {
    case 'B':
        scale = 1;
        break;
    case 'K':
        scale = 1024.0;
        break;
    case 'M':
        scale = 1024.0 * 1024;
        break;
    case 'G':
        scale = 1024.0 * 1024 * 1024;
        break;
    case 'T':
        scale = 1024.0 * 1024 * 1024 * 1024;
        break;
    default:
        si_cli_error("%s: '%s' has an unknown unit (use K, M, G or T)", flag, s);
        return false;
    }
    if (*u != '\0') {
        u++;
        if (*u == 'i' || *u == 'I')
            u++;
        if (*u == 'b' || *u == 'B')
            u++;
        if (*u != '\0') {
            si_cli_error("%s: '%s' has an unknown unit (use K, M, G or T)", flag, s);
            return false;
        }
    }
    v *= scale;
    if (v > 9.0e18) {
        si_cli_error("%s: '%s' is too large", flag, s);
        return false;
    }
    *out = (int64_t)v;
    return true;
}

bool si_cli_find_in_path(const char *prog, char *buf, size_t size)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        return false;
    while (*path) {
        const char *end = strchr(path, ':');
        const size_t len = end ? (size_t)(end - path) : strlen(path);
        if (len + strlen(prog) + 2 < size) {
            snprintf(buf, size, "%.*s/%s", (int)len, len ? path : ".", prog);
            if (access(buf, X_OK) == 0)
                return true;
        }
        path += len + (end != NULL);
    }
    return false;
}

char *si_cli_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        si_cli_error("%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (ferror(f)) {
            si_cli_error("%s: %s", path, strerror(errno));
            free(buf);
            buf = NULL;
            break;
        }
        if (feof(f))
            break;
        char *nb = realloc(buf, cap *= 2);
        if (nb == NULL)
            free(buf);
        buf = nb;
    }
    fclose(f);
    if (buf == NULL)
        return NULL;
    buf[n] = '\0';
    *len = n;
    return buf;
}

char *si_cli_read_text(const char *path, size_t *len)
{
    char *text = si_cli_read_file(path, len);
    if (text != NULL && *len > 0 && text[*len - 1] == '\n')
        text[--*len] = '\0';
    return text;
}

int32_t *si_cli_tokenize_text(const struct si_tokenizer *tok, const char *text, size_t len,
                              const char *path, int64_t *n)
{
    const bool bos = si_tokenizer_add_bos(tok);
    const int64_t k = si_tokenize(tok, text, len, bos, false, NULL, 0);
    if (k < 0) {
        si_cli_error("cannot tokenize %s: %s", path, si_status_str((int)k));
        return NULL;
    }
    if (k == 0) {
        si_cli_error("%s: no tokens in the text", path);
        return NULL;
    }
    int32_t *toks = malloc((size_t)k * sizeof *toks);
    if (toks == NULL) {
        si_cli_error("out of memory");
        return NULL;
    }
    si_tokenize(tok, text, len, bos, false, toks, (size_t)k);
    *n = k;
    return toks;
}

int si_cli_load_model(const char *path, const char *predictors, struct si_model **m,
                      struct si_tokenizer **tok)
{
    char err[600];
    *m = NULL;
    if (tok != NULL)
        *tok = NULL;
    if (si_model_load(m, path, err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    if (predictors != NULL &&
        si_model_attach_predictors(*m, predictors, err, sizeof err) != SI_OK) {
        si_model_free(*m);
        *m = NULL;
        return si_cli_error("%s", err);
    }
    if (tok != NULL && si_tokenizer_load(tok, (*m)->gguf, err, sizeof err) != SI_OK) {
        si_model_free(*m);
        *m = NULL;
        return si_cli_error("%s: %s", path, err);
    }
    return 0;
}

bool si_cli_caller_worker(void)
{
    const char *v = getenv("STARINFER_CALLER_WORKER");
    return v == NULL || strcmp(v, "0") != 0;
}

int si_cli_runner_start(struct si_cli_runner *cr, const struct si_model *m, bool use_ref,
                        int32_t n_ctx, int32_t n_batch)
{
    memset(cr, 0, sizeof *cr);
    struct si_ref_params rp = si_ref_default_params();
    rp.n_ctx = n_ctx;
    if (use_ref) {
        cr->r = si_ffn_runner_ref(rp);
        return 0;
    }
    char err[600];
    if (si_runtime_start(&cr->rt, si_cli_caller_worker(), err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    struct si_engine_params ep = si_engine_default_params();
    ep.ref = rp;
    ep.mode = SI_SPARSITY_DENSE;
    ep.n_batch = n_batch;
    if (si_engine_init(&cr->e, m, ep, err, sizeof err) != SI_OK) {
        si_runtime_stop(&cr->rt);
        return si_cli_error("%s (--engine ref runs every model the reader loads)", err);
    }
    cr->r = si_engine_ffn_runner(cr->e);
    return 0;
}

void si_cli_runner_stop(struct si_cli_runner *cr)
{
    si_engine_free(cr->e);
    cr->e = NULL;
    si_runtime_stop(&cr->rt);
}

bool si_cli_engine_opt(const char *v, bool *use_ref)
{
    if (strcmp(v, "starpu") != 0 && strcmp(v, "ref") != 0) {
        si_cli_error("--engine: '%s' is neither starpu nor ref", v);
        return false;
    }
    *use_ref = !strcmp(v, "ref");
    return true;
}

int si_cli_kv_opt(int argc, char **argv, int *i, enum si_kv_type *k, enum si_kv_type *v)
{
    const char *a = argv[*i];
    const bool is_k = !strcmp(a, "--cache-type-k") || !strcmp(a, "-ctk");
    if (!is_k && strcmp(a, "--cache-type-v") && strcmp(a, "-ctv"))
        return 0;
    const char *val = si_cli_value(argc, argv, i);
    if (val == NULL)
        return -1;
    if (si_kv_type_parse(val, is_k ? k : v) != SI_OK) {
        si_cli_error("%s: '%s' is not a KV cache type (f16, q8_0 or q4_0)", a, val);
        return -1;
    }
    return 1;
}

static volatile sig_atomic_t sigint_seen;

static void on_sigint(int sig)
{
    (void)sig;
    sigint_seen = 1;
}

void si_cli_sigint_catch(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    /* once (a second Ctrl-C ends the process), and no SA_RESTART: a read
     * of the next chat turn returns instead of waiting on */
    sa.sa_flags = (int)SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
}

bool si_cli_interrupted(void)
{
    return sigint_seen != 0;
}

int si_cli_windows(const char *title, const int32_t *toks, int64_t n, int64_t n_ctx,
                   si_cli_window_fn fn, void *user, char *err, size_t err_size)
{
    struct si_progress pg;
    si_progress_begin(&pg, title, n, "tokens", 1);
    for (int64_t start = 0; start < n; start += n_ctx) {
        si_progress_update(&pg, start);
        const int rc = fn(user, toks + start, n - start < n_ctx ? n - start : n_ctx, err, err_size);
        if (rc != 0) {
            si_progress_end(&pg);
            return rc;
        }
    }
    si_progress_update(&pg, n);
    si_progress_end(&pg);
    return 0;
}

int si_cli_calib_pass(void *user, const int32_t *toks, int64_t n, char *err, size_t err_size)
{
    const struct si_cli_corpus *c = user;
    return si_profile_calib_collect(c->calib, c->m, c->run, toks, n, err, err_size);
}

bool si_cli_sparsity(const char *v, enum si_sparsity_mode *mode, float *input)
{
    static const char *const modes[SI_SPARSE_COUNT] = {"dense", "gate", "predictor"};
    const char *plus = strchr(v, '+');
    const char *in = plus != NULL ? plus + 1 : !strncmp(v, "input", 5) ? v : NULL;
    const size_t n = plus != NULL ? (size_t)(plus - v) : in != NULL ? 0 : strlen(v);
    *mode = SI_SPARSE_DENSE;
    *input = 0.0f;
    if (n > 0) {
        int k = 0;
        while (k < SI_SPARSE_COUNT && !(strlen(modes[k]) == n && !strncmp(v, modes[k], n)))
            k++;
        if (k == SI_SPARSE_COUNT) {
            si_cli_error("--sparsity: '%.*s' is not dense, gate or predictor (with +input[=S] "
                         "or alone: input[=S])",
                         (int)n, v);
            return false;
        }
        *mode = (enum si_sparsity_mode)k;
    }
    if (in == NULL)
        return true;
    if (strncmp(in, "input", 5) != 0 || (in[5] != '\0' && in[5] != '=')) {
        si_cli_error("--sparsity: '%s' is not input[=S]", in);
        return false;
    }
    double S = 0.4;
    if (in[5] == '=' && !si_cli_float("--sparsity input=S", in + 6, 0.0, 0.9, &S))
        return false;
    *input = (float)S;
    return true;
}

bool si_cli_gpu_attention(const char *flag, const char *v, int32_t *out)
{
    long long n;
    if (!strcmp(v, "auto"))
        *out = 0;
    else if (!strcmp(v, "none"))
        *out = -1;
    else if (!strcmp(v, "all"))
        *out = INT32_MAX;
    else if (si_cli_int(flag, v, 1, 100000, &n))
        *out = (int32_t)n;
    else
        return false;
    return true;
}

bool si_cli_prefill(const char *v, enum si_prefill_mode *mode)
{
    for (int k = 0; k < SI_PREFILL_COUNT; k++)
        if (!strcmp(v, si_prefill_mode_name((enum si_prefill_mode)k))) {
            *mode = (enum si_prefill_mode)k;
            return true;
        }
    si_cli_error("--prefill: '%s' is not auto, exact, int8 or blas", v);
    return false;
}

int si_cli_runtime_start(struct si_runtime *rt, bool mpi)
{
    char err[600];
    if (!si_runtime_set_mpi(mpi))
        return si_cli_error("%s", SI_RUNTIME_NO_MPI);
    if (si_runtime_start(rt, si_cli_caller_worker(), err, sizeof err) != SI_OK)
        return si_cli_error("%s", err);
    return 0;
}

/* The first of the launchers' variables that is set, as a number >= 0 (-1: none). */
static int env_int(const char *const *names)
{
    for (; *names != NULL; names++) {
        const char *v = getenv(*names);
        char *end;
        if (v != NULL && *v != '\0') {
            const long n = strtol(v, &end, 10);
            if (*end == '\0' && n >= 0 && n < 1 << 24)
                return (int)n;
        }
    }
    return -1;
}

int si_cli_mpi_rank(void)
{
    static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", NULL};
    const int r = env_int(names);
    return r > 0 ? r : 0;
}

int si_cli_mpi_size(void)
{
    static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", NULL};
    const int n = env_int(names);
    return n > 1 ? n : 1;
}
