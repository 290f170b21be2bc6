/*
 * serve_api.c - OpenAI's request and response shapes for `starinfer serve`
 * (docs/server.md), with jansson: requests are checked field by field
 * (a wrong type or range is a 400 naming the field), turned into jobs for
 * the slots, and finished jobs or their text so far into responses or
 * server-sent events.
 */
#include "serve.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------ replies */

static void reply_json(struct si_api_reply *r, int status, json_t *o)
{
    r->status = status;
    r->content_type = "application/json";
    r->body = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (r->body == NULL) { /* out of memory */
        r->status = 500;
        r->body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}");
    }
}

static json_t *error_object(const char *type, const char *param, const char *code,
                            const char *msg)
{
    return json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error", "message", msg, "type", type, "param",
                     param, "code", code);
}

void si_api_error(struct si_api_reply *r, int status, const char *type, const char *param,
                  const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply_json(r, status, error_object(type, param, NULL, msg));
}

#define BAD(r, param, ...) si_api_error(r, 400, "invalid_request_error", param, __VA_ARGS__)

/* Text the model made may hold bytes that are not UTF-8 (a token ending a
 * character that never started); JSON strings must be UTF-8.  Each maximal
 * ill-formed subpart becomes one U+FFFD, as Unicode (ch. 3, "U+FFFD
 * Substitution of Maximal Subparts") and Python's decoder do.  Returns a
 * malloc'd string (NULL: out of memory). */
static char *utf8_clean(const char *s, size_t n, size_t *out_len)
{
    char *o = malloc(n * 3 + 1), *p = o;
    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                                : c >= 0xf0 && c <= 0xf4                   ? 4
                                                                           : 0;
        size_t m = k > 0 ? 1 : 0; /* bytes of a well-formed prefix */
        while (m > 0 && m < k && i + m < n) {
            const unsigned char b = (unsigned char)s[i + m];
            const unsigned char lo = m == 1 && c == 0xe0 ? 0xa0 : m == 1 && c == 0xf0 ? 0x90 : 0x80;
            const unsigned char hi = m == 1 && c == 0xed ? 0x9f : m == 1 && c == 0xf4 ? 0x8f : 0xbf;
            if (b < lo || b > hi)
                break;
            m++;
        }
        if (k > 0 && m == k) {
            memcpy(p, s + i, k);
            p += k;
            i += k;
        } else {
            memcpy(p, "\xef\xbf\xbd", 3);
            p += 3;
            i += m > 0 ? m : 1;
        }
    }
    *p = '\0';
    *out_len = (size_t)(p - o);
    return o;
}

static json_t *text_json(const char *s, size_t n)
{
    size_t len;
    char *c = utf8_clean(s, n, &len);
    json_t *v = c != NULL ? json_stringn(c, len) : NULL;
    free(c);
    return v;
}

/* ---------------------------------------------------------- request fields */

/* Optional fields: 0 absent (or null), 1 read, -1 wrong (the reply is set). */
static int get_num(json_t *o, const char *key, double min, double max, double *out,
                   struct si_api_reply *r)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_number(v)) {
        BAD(r, key, "'%s' must be a number", key);
        return -1;
    }
    double d = json_number_value(v);
    if (!(d >= min && d <= max)) {
        BAD(r, key, "'%s' must be between %g and %g (got %g)", key, min, max, d);
        return -1;
    }
    *out = d;
    return 1;
}

static int get_int(json_t *o, const char *key, long long min, long long max, long long *out,
                   struct si_api_reply *r)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_integer(v)) {
        BAD(r, key, "'%s' must be an integer", key);
        return -1;
    }
    long long i = json_integer_value(v);
    if (i < min || i > max) {
        BAD(r, key, "'%s' must be between %lld and %lld (got %lld)", key, min, max, i);
        return -1;
    }
    *out = i;
    return 1;
}

static int get_bool(json_t *o, const char *key, bool *out, struct si_api_reply *r)
{
    json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        BAD(r, key, "'%s' must be true or false", key);
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

/* Fields of OpenAI's API this server does not implement: refused when set
 * to anything but their neutral value, rather than silently ignored. */
static bool unsupported(json_t *o, struct si_api_reply *r)
{
    static const char *const zero[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++) {
        json_t *v = json_object_get(o, zero[i]);
        if (v != NULL && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0)) {
            BAD(r, zero[i], "'%s' is not supported (use 'repeat_penalty')", zero[i]);
            return true;
        }
    }
    static const char *const off[] = {"logprobs", "tools", "functions", "logit_bias", "suffix",
                                      "echo", "best_of", "response_format"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        json_t *v = json_object_get(o, off[i]);
        if (v != NULL && !json_is_null(v) && !json_is_false(v) &&
            !(json_is_array(v) && json_array_size(v) == 0) &&
            !(!strcmp(off[i], "best_of") && json_is_integer(v) && json_integer_value(v) == 1) &&
            !(!strcmp(off[i], "response_format") && json_is_object(v) &&
              json_is_string(json_object_get(v, "type")) &&
              !strcmp(json_string_value(json_object_get(v, "type")), "text"))) {
            BAD(r, off[i], "'%s' is not supported by this server", off[i]);
            return true;
        }
    }
    json_t *n = json_object_get(o, "n");
    if (n != NULL && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1)) {
        BAD(r, "n", "'n': one choice per request (n = 1) is all this server makes");
        return true;
    }
    return false;
}

static bool read_stop(json_t *o, struct si_job *j, struct si_api_reply *r)
{
    json_t *v = json_object_get(o, "stop");
    if (v == NULL || json_is_null(v))
        return true;
    json_t *one[1] = {v};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > SI_SERVE_MAX_STOP) {
            BAD(r, "stop", "'stop' takes at most %d sequences (got %zu)", SI_SERVE_MAX_STOP, n);
            return false;
        }
        items = NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = items != NULL ? items[i] : json_array_get(v, i);
        if (!json_is_string(s) || json_string_length(s) == 0) {
            BAD(r, "stop", "'stop' must be a non-empty string or an array of them");
            return false;
        }
        if ((j->stop[j->n_stop] = strdup(json_string_value(s))) == NULL) {
            si_api_error(r, 500, "server_error", NULL, "out of memory");
            return false;
        }
        j->n_stop++;
    }
    return true;
}

static bool read_sampling(struct si_serve *sv, json_t *o, struct si_job *j,
                          struct si_api_reply *r)
{
    struct si_sampling_params *p = &j->sampling;
    *p = sv->sampling;
    double d;
    long long i;
    int k;
    if ((k = get_num(o, "temperature", 0, 2, &d, r)) < 0)
        return false;
    if (k)
        p->temp = (float)d;
    if ((k = get_num(o, "top_p", 0, 1, &d, r)) < 0)
        return false;
    if (k)
        p->top_p = (float)d;
    if ((k = get_num(o, "min_p", 0, 1, &d, r)) < 0)
        return false;
    if (k)
        p->min_p = (float)d;
    if ((k = get_int(o, "top_k", 0, 1 << 30, &i, r)) < 0)
        return false;
    if (k)
        p->top_k = (int32_t)i;
    if ((k = get_num(o, "repeat_penalty", 1e-3, 100, &d, r)) < 0)
        return false;
    if (k)
        p->repeat_penalty = (float)d;
    if ((k = get_int(o, "seed", INT64_MIN, INT64_MAX, &i, r)) < 0)
        return false;
    static unsigned long long draws;
    /* Without a seed each request draws anew, as OpenAI's API does. */
    p->seed = k ? (uint64_t)i
                : (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^
                      __atomic_add_fetch(&draws, 1, __ATOMIC_RELAXED) * 0xbf58476d1ce4e5b9ull;
    long long mt = 0;
    if ((k = get_int(o, "max_completion_tokens", 1, 1 << 30, &mt, r)) < 0)
        return false;
    if (!k && (k = get_int(o, "max_tokens", 1, 1 << 30, &mt, r)) < 0)
        return false;
    j->max_tokens = k                           ? (int32_t)mt
                    : sv->default_max_tokens > 0 ? sv->default_max_tokens
                                                 : si_slots_n_ctx(sv->slots);
    j->ignore_eos = sv->ignore_eos;
    j->cache_prompt = sv->cache_prompt;
    if (get_bool(o, "cache_prompt", &j->cache_prompt, r) < 0 ||
        get_bool(o, "ignore_eos", &j->ignore_eos, r) < 0 || get_bool(o, "stream", &j->stream, r) < 0)
        return false;
    json_t *so = json_object_get(o, "stream_options");
    if (so != NULL && !json_is_null(so)) {
        if (!json_is_object(so)) {
            BAD(r, "stream_options", "'stream_options' must be an object");
            return false;
        }
        if (get_bool(so, "include_usage", &j->include_usage, r) < 0)
            return false;
    }
    return read_stop(o, j, r);
}

/* The chat's messages as the model's chat template formats them. */
static char *chat_text(struct si_serve *sv, json_t *o, struct si_api_reply *r)
{
    json_t *msgs = json_object_get(o, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        BAD(r, "messages", "'messages' must be a non-empty array");
        return NULL;
    }
    size_t n = json_array_size(msgs);
    struct si_chat_message *m = calloc(n, sizeof *m);
    char **owned = calloc(n, sizeof *owned);
    char *text = NULL;
    if (m == NULL || owned == NULL) {
        si_api_error(r, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(msgs, i), *role = json_object_get(e, "role"),
               *content = json_object_get(e, "content");
        if (!json_is_object(e) || !json_is_string(role)) {
            BAD(r, "messages", "messages[%zu] needs a 'role' string", i);
            goto out;
        }
        m[i].role = json_string_value(role);
        if (content == NULL || json_is_null(content)) {
            m[i].content = "";
        } else if (json_is_string(content)) {
            m[i].content = json_string_value(content);
        } else if (json_is_array(content)) { /* parts: the text ones, joined */
            size_t total = 1, k;
            json_t *part;
            json_array_foreach(content, k, part) {
                json_t *t = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(json_object_get(part, "type")) ||
                    strcmp(json_string_value(json_object_get(part, "type")), "text") != 0 ||
                    !json_is_string(t)) {
                    BAD(r, "messages", "messages[%zu].content[%zu]: only text parts are supported",
                        i, k);
                    goto out;
                }
                total += json_string_length(t);
            }
            if ((owned[i] = malloc(total)) == NULL) {
                si_api_error(r, 500, "server_error", NULL, "out of memory");
                goto out;
            }
            owned[i][0] = '\0';
            json_array_foreach(content, k, part)
                strcat(owned[i], json_string_value(json_object_get(part, "text")));
            m[i].content = owned[i];
        } else {
            BAD(r, "messages", "messages[%zu].content must be a string or an array of parts", i);
            goto out;
        }
    }
    int64_t need = si_llm_chat_apply(sv->llm, m, n, true, NULL, 0);
    if (need < 0) {
        si_api_error(r, 400, "invalid_request_error", "messages",
                     "the model's chat template cannot format this conversation: %s "
                     "(/v1/completions takes raw text)",
                     si_last_error());
        goto out;
    }
    if ((text = malloc((size_t)need + 1)) == NULL) {
        si_api_error(r, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    si_llm_chat_apply(sv->llm, m, n, true, text, (size_t)need + 1);
out:
    for (size_t i = 0; owned != NULL && i < n; i++)
        free(owned[i]);
    free(owned);
    free(m);
    return text;
}

static bool tokenize_into(struct si_serve *sv, const char *text, size_t len, bool add_bos,
                          int32_t **out, int64_t *n, struct si_api_reply *r)
{
    *n = si_llm_tokenize(sv->llm, text, len, add_bos, true, NULL, 0);
    *out = *n >= 0 ? malloc(((size_t)*n + 1) * sizeof **out) : NULL;
    if (*out == NULL) {
        si_api_error(r, *n < 0 ? 400 : 500, *n < 0 ? "invalid_request_error" : "server_error",
                     NULL, "%s", *n < 0 ? si_last_error() : "out of memory");
        return false;
    }
    si_llm_tokenize(sv->llm, text, len, add_bos, true, *out, (size_t)*n);
    return true;
}

/* A completion's prompt: a string, one string in an array, or token ids. */
static bool completion_tokens(struct si_serve *sv, json_t *o, struct si_job *j,
                              struct si_api_reply *r)
{
    json_t *p = json_object_get(o, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    int64_t n;
    if (json_is_string(p)) {
        if (!tokenize_into(sv, json_string_value(p), json_string_length(p),
                           si_llm_adds_bos(sv->llm), &j->tokens, &n, r))
            return false;
        j->n_tokens = (int32_t)n;
        return true;
    }
    if (!json_is_array(p) || json_array_size(p) == 0) {
        BAD(r, "prompt", "'prompt' must be a string, or an array of token ids");
        return false;
    }
    n = (int64_t)json_array_size(p);
    if ((j->tokens = malloc((size_t)n * sizeof *j->tokens)) == NULL) {
        si_api_error(r, 500, "server_error", NULL, "out of memory");
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        json_t *t = json_array_get(p, (size_t)i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) >= si_llm_n_vocab(sv->llm)) {
            BAD(r, "prompt",
                "'prompt': element %lld is not a token id of this model (0..%d); one prompt "
                "per request",
                (long long)i, si_llm_n_vocab(sv->llm) - 1);
            return false;
        }
        j->tokens[i] = (int32_t)json_integer_value(t);
    }
    j->n_tokens = (int32_t)n;
    return true;
}

static json_t *parse_body(const char *body, size_t len, struct si_api_reply *r)
{
    json_error_t e;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &e);
    if (o == NULL) {
        BAD(r, NULL, "malformed JSON: %s (line %d, column %d)", e.text, e.line, e.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        BAD(r, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return o;
}

struct si_job *si_api_job(struct si_serve *sv, enum si_job_kind kind, const char *body,
                          size_t len, struct si_api_reply *r)
{
    json_t *o = parse_body(body, len, r);
    if (o == NULL)
        return NULL;
    struct si_job *j = si_job_new(kind);
    char *text = NULL;
    bool ok = false;
    if (j == NULL) {
        si_api_error(r, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    if (unsupported(o, r) || !read_sampling(sv, o, j, r))
        goto out;
    if (kind == SI_JOB_CHAT) {
        int64_t n;
        if ((text = chat_text(sv, o, r)) == NULL ||
            !tokenize_into(sv, text, strlen(text), si_llm_adds_bos(sv->llm), &j->tokens, &n, r))
            goto out;
        j->n_tokens = (int32_t)n;
    } else if (!completion_tokens(sv, o, j, r)) {
        goto out;
    }
    const char *what = kind == SI_JOB_CHAT ? "messages" : "prompt";
    const int32_t n_ctx = si_slots_n_ctx(sv->slots);
    if (j->n_tokens == 0) {
        BAD(r, what, "the prompt is empty");
        goto out;
    }
    if (j->n_tokens >= n_ctx) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "the prompt is %d tokens and the context %d (--ctx-size): it leaves no room "
                 "to generate",
                 j->n_tokens, n_ctx);
        reply_json(r, 400,
                   error_object("invalid_request_error", what, "context_length_exceeded", msg));
        goto out;
    }
    static unsigned long long ids;
    snprintf(j->id, sizeof j->id, "%s-%llx%08llx", kind == SI_JOB_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)sv->started & 0xffffff,
             __atomic_add_fetch(&ids, 1, __ATOMIC_RELAXED));
    j->created = (int64_t)time(NULL);
    ok = true;
out:
    free(text);
    json_decref(o);
    if (!ok) {
        si_job_unref(j);
        return NULL;
    }
    return j;
}

/* --------------------------------------------------------------- responses */

static const char *finish_name(enum si_finish f)
{
    return f == SI_FINISH_LENGTH ? "length" : "stop";
}

static json_t *usage_json(const struct si_job *j)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", (json_int_t)j->n_prompt,
                     "completion_tokens", (json_int_t)j->n_generated, "total_tokens",
                     (json_int_t)(j->n_prompt + j->n_generated), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)j->n_cached);
}

/* llama-server's extension: the job's speeds. */
static json_t *timings_json(const struct si_job *j)
{
    const int32_t evaluated = j->n_prompt - j->n_cached;
    return json_pack("{s:i,s:f,s:f,s:i,s:f,s:f}", "prompt_n", (json_int_t)evaluated, "prompt_ms",
                     j->prompt_seconds * 1e3, "prompt_per_second",
                     j->prompt_seconds > 0 ? evaluated / j->prompt_seconds : 0.0,
                     "predicted_n", (json_int_t)j->n_generated, "predicted_ms",
                     j->generate_seconds * 1e3, "predicted_per_second",
                     j->generate_seconds > 0 ? j->n_generated / j->generate_seconds : 0.0);
}

void si_api_result(struct si_serve *sv, struct si_job *j, struct si_api_reply *r)
{
    pthread_mutex_lock(&j->mu);
    if (j->finish == SI_FINISH_ERROR) {
        si_api_error(r, 500, "server_error", NULL, "%s", j->error);
        pthread_mutex_unlock(&j->mu);
        return;
    }
    json_t *text = text_json(j->text.p != NULL ? j->text.p : "", j->text.n);
    json_t *choice =
        j->kind == SI_JOB_CHAT
            ? json_pack("{s:i,s:{s:s,s:o},s:n,s:s}", "index", 0, "message", "role", "assistant",
                        "content", text, "logprobs", "finish_reason", finish_name(j->finish))
            : json_pack("{s:o,s:i,s:n,s:s}", "text", text, "index", 0, "logprobs",
                        "finish_reason", finish_name(j->finish));
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o,s:o}", "id", j->id, "object",
                          j->kind == SI_JOB_CHAT ? "chat.completion" : "text_completion",
                          "created", (json_int_t)j->created, "model", sv->model_id, "choices",
                          choice, "usage", usage_json(j), "timings", timings_json(j));
    pthread_mutex_unlock(&j->mu);
    if (o == NULL) {
        si_api_error(r, 500, "server_error", NULL, "out of memory");
        return;
    }
    reply_json(r, 200, o);
}

/* One event: "data: JSON\n\n" appended to *buf. */
static bool put_event(char **buf, size_t *len, json_t *o)
{
    char *s = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s == NULL)
        return false;
    size_t n = strlen(s);
    char *b = realloc(*buf, *len + n + 9);
    if (b == NULL) {
        free(s);
        return false;
    }
    *len += (size_t)sprintf(b + *len, "data: %s\n\n", s);
    *buf = b;
    free(s);
    return true;
}

static json_t *chunk(struct si_serve *sv, const struct si_job *j, json_t *choice)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", j->id, "object",
                     j->kind == SI_JOB_CHAT ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)j->created, "model", sv->model_id, "choices", choice);
}

static json_t *delta(const struct si_job *j, json_t *text, const char *finish)
{
    if (j->kind == SI_JOB_CHAT)
        return json_pack("{s:i,s:o,s:n,s:s?}", "index", 0, "delta",
                         text != NULL ? json_pack("{s:o}", "content", text) : json_object(),
                         "logprobs", "finish_reason", finish);
    return json_pack("{s:o,s:i,s:n,s:s?}", "text", text != NULL ? text : json_string(""), "index",
                     0, "logprobs", "finish_reason", finish);
}

bool si_api_stream_next(struct si_serve *sv, struct si_job *j, struct si_stream_state *st,
                        char **buf, size_t *len, bool (*gone)(void *), void *gone_arg)
{
    *buf = NULL;
    *len = 0;
    if (st->over)
        return true;
    bool ok = true;
    pthread_mutex_lock(&j->mu);
    if (!st->started) {
        st->started = true;
        if (j->kind == SI_JOB_CHAT)
            ok = put_event(buf, len,
                           chunk(sv, j,
                                 json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", 0, "delta", "role",
                                           "assistant", "content", "", "logprobs",
                                           "finish_reason")));
        pthread_mutex_unlock(&j->mu);
        return ok;
    }
    while (j->safe <= st->sent && j->state != SI_JOB_DONE && !sv->stopping) {
        si_job_wait(j, 200);
        if (j->safe <= st->sent && j->state != SI_JOB_DONE && gone != NULL && gone(gone_arg)) {
            j->cancelled = true; /* the slot stops at its next token */
            st->over = true;
            pthread_mutex_unlock(&j->mu);
            return true;
        }
    }
    if (j->safe > st->sent) {
        ok = put_event(buf, len,
                       chunk(sv, j, delta(j, text_json(j->text.p + st->sent, j->safe - st->sent),
                                          NULL)));
        st->sent = j->safe;
    }
    if (ok && (j->state == SI_JOB_DONE || sv->stopping) && st->sent >= j->text.n) {
        if (j->finish == SI_FINISH_ERROR || j->state != SI_JOB_DONE)
            ok = put_event(buf, len,
                           error_object("server_error", NULL, NULL,
                                        j->state == SI_JOB_DONE ? j->error
                                                                : "the server is stopping"));
        else
            ok = put_event(buf, len, chunk(sv, j, delta(j, NULL, finish_name(j->finish))));
        if (ok && j->include_usage && j->state == SI_JOB_DONE) {
            json_t *u = chunk(sv, j, json_null());
            if (u != NULL) {
                json_object_set_new(u, "choices", json_array());
                json_object_set_new(u, "usage", usage_json(j));
            }
            ok = put_event(buf, len, u);
        }
        char *b = ok ? realloc(*buf, *len + 15) : NULL;
        if (b != NULL) {
            memcpy(b + *len, "data: [DONE]\n\n", 14);
            *len += 14;
            *buf = b;
        }
        ok = b != NULL;
        st->over = true;
    }
    pthread_mutex_unlock(&j->mu);
    return ok;
}

/* ------------------------------------------------------------ other routes */

void si_api_models(struct si_serve *sv, struct si_api_reply *r)
{
    reply_json(r, 200,
               json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:{s:s,s:i,s:i,s:I}}]}", "object", "list",
                         "data", "id", sv->model_id, "object", "model", "created",
                         (json_int_t)sv->started, "owned_by", "starinfer", "meta", "arch",
                         si_llm_arch(sv->llm), "n_ctx", (json_int_t)si_slots_n_ctx(sv->slots),
                         "n_vocab", (json_int_t)si_llm_n_vocab(sv->llm), "size",
                         (json_int_t)si_llm_weight_bytes(sv->llm)));
}

void si_api_health(struct si_serve *sv, struct si_api_reply *r)
{
    (void)sv;
    reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

void si_api_metrics(struct si_serve *sv, struct si_api_reply *r)
{
    const int n = si_slots_count(sv->slots);
    int32_t *used = calloc((size_t)n, sizeof *used);
    char *b = NULL;
    size_t len = 0;
    FILE *f = used != NULL ? open_memstream(&b, &len) : NULL;
    if (f == NULL) {
        free(used);
        si_api_error(r, 500, "server_error", NULL, "out of memory");
        return;
    }
    struct si_serve_counters c;
    si_slots_counters(sv->slots, &c, used);
#define M(name, type, help, fmt, ...)                                                              \
    fprintf(f,                                                                                     \
            "# HELP starinfer_" name " " help "\n# TYPE starinfer_" name " " type                 \
            "\nstarinfer_" name " " fmt "\n",                                                      \
            __VA_ARGS__)
    M("requests_total", "counter", "Requests accepted into the queue.", "%lld",
      (long long)c.requests);
    M("requests_failed_total", "counter", "Requests whose generation failed.", "%lld",
      (long long)c.requests_failed);
    M("requests_processing", "gauge", "Requests being generated.", "%d", c.running);
    M("requests_queued", "gauge", "Requests waiting for a slot.", "%d", c.queued);
    M("prompt_tokens_total", "counter", "Prompt tokens evaluated.", "%lld",
      (long long)c.prompt_tokens);
    M("prompt_tokens_cached_total", "counter",
      "Prompt tokens a slot's cache already held (not evaluated again).", "%lld",
      (long long)c.cached_tokens);
    M("tokens_generated_total", "counter", "Tokens generated.", "%lld",
      (long long)c.generated_tokens);
    M("prompt_seconds_total", "counter", "Time spent evaluating prompts.", "%.6f",
      c.prompt_seconds);
    M("generation_seconds_total", "counter", "Time spent generating.", "%.6f",
      c.generate_seconds);
    M("prompt_tokens_per_second", "gauge", "Prompt tokens per second over all requests.", "%.3f",
      c.prompt_seconds > 0 ? c.prompt_tokens / c.prompt_seconds : 0.0);
    M("generation_tokens_per_second", "gauge", "Generated tokens per second over all requests.",
      "%.3f", c.generate_seconds > 0 ? c.generated_tokens / c.generate_seconds : 0.0);
    M("ffn_neurons_computed_ratio", "gauge",
      "Share of FFN neurons computed over decoded tokens (1 in dense mode).", "%.4f",
      c.neurons_total > 0 ? (double)c.neurons_computed / (double)c.neurons_total : 0.0);
    M("kv_cache_size_tokens", "gauge", "Each slot's KV cache length.", "%d",
      si_slots_n_ctx(sv->slots));
#undef M
    fprintf(f, "# HELP starinfer_kv_cache_tokens Tokens in each slot's KV cache after its last "
               "request.\n# TYPE starinfer_kv_cache_tokens gauge\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "starinfer_kv_cache_tokens{slot=\"%d\"} %d\n", i, used[i]);
    free(used);
    if (fclose(f) != 0 || b == NULL) {
        free(b);
        si_api_error(r, 500, "server_error", NULL, "out of memory");
        return;
    }
    r->status = 200;
    r->body = b;
    r->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

void si_api_tokenize(struct si_serve *sv, const char *body, size_t len, struct si_api_reply *r)
{
    json_t *o = parse_body(body, len, r);
    if (o == NULL)
        return;
    json_t *c = json_object_get(o, "content");
    bool special = false;
    int32_t *t = NULL;
    int64_t n;
    if (!json_is_string(c))
        BAD(r, "content", "'content' must be a string");
    else if (get_bool(o, "add_special", &special, r) >= 0 &&
             tokenize_into(sv, json_string_value(c), json_string_length(c),
                           special && si_llm_adds_bos(sv->llm), &t, &n, r)) {
        json_t *a = json_array();
        for (int64_t i = 0; a != NULL && i < n; i++)
            json_array_append_new(a, json_integer(t[i]));
        reply_json(r, 200, json_pack("{s:o}", "tokens", a));
    }
    free(t);
    json_decref(o);
}

void si_api_detokenize(struct si_serve *sv, const char *body, size_t len,
                       struct si_api_reply *r)
{
    json_t *o = parse_body(body, len, r);
    if (o == NULL)
        return;
    json_t *a = json_object_get(o, "tokens");
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    char *text = NULL;
    if (!json_is_array(a)) {
        BAD(r, "tokens", "'tokens' must be an array of token ids");
        goto out;
    }
    if (ids == NULL) {
        si_api_error(r, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 ||
            json_integer_value(t) >= si_llm_n_vocab(sv->llm)) {
            BAD(r, "tokens", "tokens[%zu] is not a token id of this model (0..%d)", i,
                si_llm_n_vocab(sv->llm) - 1);
            goto out;
        }
        ids[i] = (int32_t)json_integer_value(t);
    }
    int64_t need = si_llm_detokenize(sv->llm, ids, n, false, NULL, 0);
    if (need < 0 || (text = malloc((size_t)need + 1)) == NULL) {
        si_api_error(r, 500, "server_error", NULL, "%s",
                     need < 0 ? si_last_error() : "out of memory");
        goto out;
    }
    si_llm_detokenize(sv->llm, ids, n, false, text, (size_t)need + 1);
    reply_json(r, 200, json_pack("{s:o}", "content", text_json(text, (size_t)need)));
out:
    free(text);
    free(ids);
    json_decref(o);
}
