/* loom-server's shared declarations: the configuration, the server object, a request's job (its
 * engine requests and the log of their events), the parsed OpenAI request, and the metrics.
 *
 * Threads. libmicrohttpd runs one thread per connection (http.c); the engine runs its own
 * thread in background mode and calls srv_on_event there (job.c). A job is the meeting point:
 * the engine thread appends events to its log under the job's mutex and signals its condition
 * variable; the connection thread waits on it and reads the log from its cursor. A job is
 * reference counted: the connection holds one reference, the engine one per engine request
 * until that request's last event. */
#ifndef LOOM_SERVER_H
#define LOOM_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* ---- configuration ------------------------------------------------------------------------ */

typedef struct srv_config {
    const char *model_path;
    const char *model_name; /* served as "model"; default: the file's base name */
    const char *host;       /* default 127.0.0.1 */
    int port;               /* 0: any free port (printed) */
    const char *api_key;    /* NULL: no authentication */
    const char *backend;    /* NULL: auto */
    int threads;            /* <= 0: all cores */
    int64_t kv_bytes;
    float kv_fraction;
    int32_t max_ctx;
    int32_t max_seqs;
    int32_t max_batched_tokens;
    loom_kv_cache_type kv_type;
    size_t max_body_bytes;         /* larger bodies: 413 */
    int32_t max_queued;            /* requests waiting for their first token beyond it: 429 */
    int32_t max_tokens_ceiling;    /* a larger max_tokens: 400 */
    int32_t max_n;                 /* a larger n: 400 */
    double timeout_s;              /* a request running longer is cancelled (408 / stream error) */
    unsigned connection_timeout_s; /* idle keep-alive connections are closed after it */
} srv_config;

/* ---- metrics (metrics.c) ------------------------------------------------------------------- */

#define SRV_HIST_MAX_BOUNDS 24

typedef struct srv_histogram {
    const double *bounds; /* [n_bounds] upper bounds, increasing (the le labels) */
    int n_bounds;
    uint64_t counts[SRV_HIST_MAX_BOUNDS + 1]; /* per bucket, not cumulative; last: +Inf */
    uint64_t count;
    double sum;
} srv_histogram;

typedef enum srv_outcome {
    SRV_OUTCOME_STOP = 0,
    SRV_OUTCOME_LENGTH,
    SRV_OUTCOME_ABORT, /* cancelled: a client that went away, a timeout, a shutdown */
    SRV_OUTCOME_ERROR, /* the engine failed the request */
    SRV_OUTCOME_COUNT
} srv_outcome;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t prompt_tokens;
    uint64_t generation_tokens;
    uint64_t outcomes[SRV_OUTCOME_COUNT]; /* per finished sample */
    uint64_t disconnects;                 /* requests cancelled because the client went away */
    uint64_t timeouts;                    /* requests cancelled by --timeout-s */
    uint64_t rejected_queue_full;         /* 429: --max-queued */
    uint64_t rejected_overloaded;         /* 429: the engine's admission control */
    uint64_t http_4xx;
    uint64_t http_5xx;
    srv_histogram ttft;
    srv_histogram itl;
    srv_histogram e2e;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
void srv_histogram_observe(srv_histogram *h, double v); /* caller holds m->mu */

/* ---- the server ------------------------------------------------------------------------------ */

typedef struct srv {
    srv_config cfg;
    loom_model *model;
    loom_engine *engine;
    int32_t n_vocab;
    int32_t max_ctx; /* the engine's (cfg.max_ctx, or the model's capped default) */
    int32_t max_logprobs;
    srv_metrics metrics;
    atomic_int n_waiting; /* jobs submitted that have no token yet */
    atomic_bool stopping; /* shutting down: waiting connections give up */
    atomic_uint_fast64_t next_id;
    uint64_t id_salt; /* random, so ids differ between runs */
    double started_s;
} srv;

/* ---- a parsed request (openai_request.c) ---------------------------------------------------- */

typedef enum srv_endpoint {
    SRV_COMPLETIONS = 0,
    SRV_CHAT = 1,
} srv_endpoint;

typedef struct srv_prompt {
    loom_token *tokens;
    size_t n_tokens;
} srv_prompt;

typedef struct srv_error {
    int http;         /* 4xx / 5xx */
    const char *type; /* OpenAI's error type: "invalid_request_error", ... */
    const char *code; /* NULL or a code string ("context_length_exceeded") */
    char param[64];   /* the offending field, or "" */
    char message[512];
    double retry_after_s; /* > 0: a Retry-After header */
} srv_error;

typedef struct srv_parsed {
    srv_endpoint endpoint;
    bool stream;
    bool include_usage;
    int32_t n;
    int32_t max_tokens; /* per sample; 0: not given (the endpoint's default applies) */
    bool logprobs;      /* report log probabilities */
    int32_t top_logprobs;
    loom_sampler_params sampler;
    loom_logit_bias *logit_bias;
    size_t n_logit_bias;
    char **stop;
    size_t n_stop;
    loom_token *stop_tokens;
    size_t n_stop_tokens;
    bool ignore_eos;
    int32_t priority; /* loom's: higher first (the request's "priority" negated, as vLLM's) */
    double ttft_deadline_s;
    double tpot_deadline_s;
    uint64_t cache_salt;
    srv_prompt *prompts; /* [n_prompts]: completions may carry several; chat one */
    size_t n_prompts;
} srv_parsed;

/* Parses and validates a request body for endpoint; false fills *err (400 / 404). */
bool srv_parse_request(srv *s, srv_endpoint endpoint, const char *body, size_t len, srv_parsed *out,
                       srv_error *err);
void srv_parsed_free(srv_parsed *p);

/* ---- jobs (job.c) ------------------------------------------------------------------------------
 */

typedef enum srv_event_kind {
    SRV_EV_TOKEN = 0,
    SRV_EV_END = 1,
} srv_event_kind;

/* One entry of a job's log: a token of a choice, or the end of a choice. */
typedef struct srv_event {
    srv_event_kind kind;
    int32_t choice; /* prompt index * n + sample */
    loom_token token;
    uint32_t text_len;
    size_t text_off;     /* into job->text */
    uint32_t choice_off; /* bytes of the choice's text before this token's */
    float logprob;       /* of the token under the model's distribution */
    float entropy;       /* of that distribution, nats */
    float varentropy;
    size_t top_off; /* into job->top: [n_top] alternatives, best first */
    int32_t n_top;
    loom_finish_reason reason; /* END */
    loom_status status;        /* END: LOOM_OK, or why the engine failed the request */
    int32_t cached_tokens;     /* END */
} srv_event;

typedef struct srv_job srv_job;

/* What a job keeps per choice. */
typedef struct srv_choice {
    double last_s; /* time of the choice's last token, 0 before */
    uint32_t len;  /* bytes of text so far */
    bool ended;
    bool started; /* a stream has sent the choice's first chunk (chat: the role); the
                     connection's alone */
} srv_choice;

/* One engine request of a job: one prompt and its n samples. */
typedef struct srv_sub {
    srv_job *job;
    int32_t index; /* the prompt's index */
    loom_request_id id;
    int32_t prompt_tokens;
    int32_t samples_ended;
    bool submitted;
} srv_sub;

struct srv_job {
    atomic_int refs;
    srv *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* set before the first submit, read-only after */
    srv_endpoint endpoint;
    int32_t n; /* samples per prompt */
    int32_t n_choices;
    bool logprobs;
    int32_t top_logprobs;
    char id[48];
    int64_t created;  /* unix seconds */
    double arrival_s; /* loom_engine_now() */
    srv_sub *subs;    /* [n_subs] */
    int32_t n_subs;
    /* guarded by mu */
    srv_event *events;
    size_t n_events, cap_events;
    char *text;
    size_t n_text, cap_text;
    loom_token_logprob *top;
    size_t n_top, cap_top;
    srv_choice *choices;  /* [n_choices] */
    int32_t subs_open;    /* submitted engine requests that have not ended */
    bool submitting;      /* the connection is still submitting: not done yet */
    bool done;            /* every choice has ended */
    bool lost_events;     /* an allocation failed while logging: the output is incomplete */
    bool counted_waiting; /* counted in srv->n_waiting */
    int64_t completion_tokens;
    int64_t cached_tokens;
    atomic_bool cancelled; /* cancel requested (once) */
};

/* A new job for a parsed request, with one reference (the caller's). NULL: out of memory. */
srv_job *srv_job_create(srv *s, const srv_parsed *p);
void srv_job_release(srv_job *job);
/* Submits every prompt of p. false fills *err (nothing runs: what was submitted is cancelled). */
bool srv_job_submit(srv_job *job, const srv_parsed *p, srv_error *err);
/* Cancels what still runs (once; later calls do nothing). */
void srv_job_cancel(srv_job *job);
/* The engine's event callback (background mode). */
void srv_on_event(const loom_event *event, void *user_data);

typedef enum srv_wait_result {
    SRV_WAIT_READY = 0, /* new events, or the job is done */
    SRV_WAIT_GONE,      /* the client went away (the job was cancelled) */
    SRV_WAIT_TIMEOUT,   /* --timeout-s passed (the job was cancelled) */
    SRV_WAIT_STOPPING,  /* the server is shutting down (the job was cancelled) */
} srv_wait_result;

/* Waits until the job has more than `seen` events or is done, watching the client's socket
 * (fd; -1: not watched), the request timeout and shutdown. */
srv_wait_result srv_job_wait(srv_job *job, size_t seen, int fd);

/* ---- responses (openai_response.c) ------------------------------------------------------------
 */

typedef struct srv_buf {
    char *data;
    size_t len, cap;
    bool failed; /* an allocation failed: the content is incomplete */
} srv_buf;

void srv_buf_put(srv_buf *b, const char *s, size_t n);
void srv_buf_puts(srv_buf *b, const char *s);
void srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(srv_buf *b);

/* The whole (non-streaming) response body, malloc'd JSON. The job must be done. NULL: *err
 * says why (the engine failed a request: 500; out of memory: 503). */
char *srv_response_full(srv_job *job, const char *model_name, srv_error *err);
/* Appends the SSE chunks for events [from, to) of the job's log (the job's mutex held). */
void srv_response_chunks(srv_job *job, const char *model_name, size_t from, size_t to,
                         srv_buf *out);
/* Appends the closing chunks: the usage chunk when asked for, then "data: [DONE]". */
void srv_response_stream_end(srv_job *job, const char *model_name, bool include_usage,
                             srv_buf *out);
/* An OpenAI error object, malloc'd JSON; NULL: out of memory. */
char *srv_error_json(const srv_error *err);
/* Fills err from a loom status and loom_last_error() for an engine submit. */
void srv_error_from_status(srv_error *err, loom_status st);
void srv_error_set(srv_error *err, int http, const char *type, const char *param, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));

/* ---- metrics exposition (metrics.c) ------------------------------------------------------------
 */

/* The Prometheus text (version 0.0.4) for /metrics, malloc'd; NULL: out of memory. */
char *srv_metrics_text(srv *s, size_t *len);

/* ---- HTTP (http.c) ------------------------------------------------------------------------------
 */

struct MHD_Daemon;
/* Starts listening (thread per connection); *port gets the bound port. NULL: failed
 * (the reason is printed). */
struct MHD_Daemon *srv_http_start(srv *s, int *port);

#endif
