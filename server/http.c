/* HTTP on libmicrohttpd, one thread per connection: routing, the body limit, authentication,
 * and the two ways a generation is answered — a JSON body once the job is done, or a
 * Server-Sent-Events stream whose reader blocks in the connection's thread until the engine
 * has more. Either way the connection's thread watches its socket while it waits, so a client
 * that goes away has its request cancelled (and its KV blocks freed) at the engine's next
 * step, not when the generation would have ended. */
#define _GNU_SOURCE

#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <cjson/cJSON.h>

#include "server.h"

/* ---- per connection, per stream ------------------------------------------------------------ */

typedef struct srv_conn {
    srv *s;
    int fd;
    srv_buf body;
    bool too_big;
    srv_job *job; /* a generation's job (one reference), until the request completes */
} srv_conn;

typedef struct srv_stream {
    srv *s;
    srv_job *job; /* one reference */
    int fd;
    bool include_usage;
    size_t cursor; /* events of the job's log already written */
    srv_buf pending;
    size_t pending_off;
    bool ended;
} srv_stream;

/* ---- responses ----------------------------------------------------------------------------------
 */

static enum MHD_Result send_body(struct MHD_Connection *c, unsigned code, char *body, size_t len,
                                 const char *content_type, double retry_after_s) {
    struct MHD_Response *r =
        body ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(strlen("{}"), (void *)"{}", MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (retry_after_s > 0) {
        char v[32];
        snprintf(v, sizeof v, "%.0f", retry_after_s < 1 ? 1 : retry_after_s);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    if (code == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned code, char *json,
                                 double retry_after_s) {
    return send_body(c, code, json, json ? strlen(json) : 0, "application/json", retry_after_s);
}

static enum MHD_Result send_error(srv *s, struct MHD_Connection *c, const srv_error *err) {
    pthread_mutex_lock(&s->metrics.mu);
    if (err->http >= 500)
        s->metrics.http_5xx++;
    else
        s->metrics.http_4xx++;
    pthread_mutex_unlock(&s->metrics.mu);
    return send_json(c, (unsigned)err->http, srv_error_json(err), err->retry_after_s);
}

static enum MHD_Result fail(srv *s, struct MHD_Connection *c, int http, const char *type,
                            const char *message) {
    srv_error err;
    srv_error_set(&err, http, type, "", "%s", message);
    return send_error(s, c, &err);
}

/* ---- authentication
 * ------------------------------------------------------------------------------- */

/* "Bearer <key>" against the configured key, in time that depends only on the key's length. */
static bool authorized(const srv *s, struct MHD_Connection *c) {
    const char *key = s->cfg.api_key;
    if (!key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    const char *got = h + 7;
    size_t got_len = strlen(got), key_len = strlen(key);
    volatile unsigned diff = (unsigned)(got_len != key_len);
    for (size_t i = 0; i < key_len; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)(i < got_len ? got[i] : 0);
    return diff == 0;
}

/* ---- streams
 * --------------------------------------------------------------------------------------- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_stream *st = cls;
    srv_job *job = st->job;
    for (;;) {
        if (st->pending_off < st->pending.len) {
            size_t n = st->pending.len - st->pending_off;
            if (n > max) n = max;
            memcpy(buf, st->pending.data + st->pending_off, n);
            st->pending_off += n;
            return (ssize_t)n;
        }
        st->pending.len = 0;
        st->pending_off = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        /* returns at once when events are there, after looking at the socket and the clock */
        srv_wait_result w = srv_job_wait(job, st->cursor, st->fd);
        if (w == SRV_WAIT_GONE || w == SRV_WAIT_STOPPING) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (w == SRV_WAIT_TIMEOUT) {
            srv_error err;
            srv_error_set(&err, 408, "timeout", "", "the request ran past the server's %g s limit",
                          st->s->cfg.timeout_s);
            char *e = srv_error_json(&err);
            if (e) srv_buf_printf(&st->pending, "data: %s\n\n", e);
            free(e);
            srv_buf_puts(&st->pending, "data: [DONE]\n\n");
            st->ended = true;
            continue;
        }
        pthread_mutex_lock(&job->mu);
        /* a bounded slice at a time: the engine thread waits for this lock to log events */
        size_t n_events = job->n_events;
        if (n_events > st->cursor + 64) n_events = st->cursor + 64;
        if (n_events > st->cursor) {
            srv_response_chunks(job, st->s->cfg.model_name, st->cursor, n_events, &st->pending);
            st->cursor = n_events;
        }
        if (job->done && st->cursor == job->n_events) {
            srv_response_stream_end(job, st->s->cfg.model_name, st->include_usage, &st->pending);
            st->ended = true;
        }
        pthread_mutex_unlock(&job->mu);
        if (st->pending.failed) {
            srv_job_cancel(job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    srv_stream *st = cls;
    pthread_mutex_lock(&st->job->mu);
    bool done = st->job->done;
    pthread_mutex_unlock(&st->job->mu);
    if (!done) { /* the response ended early: MHD could not write (the client left) */
        if (!atomic_load(&st->job->cancelled)) {
            pthread_mutex_lock(&st->s->metrics.mu);
            st->s->metrics.disconnects++;
            pthread_mutex_unlock(&st->s->metrics.mu);
        }
        srv_job_cancel(st->job);
    }
    srv_job_release(st->job);
    srv_buf_free(&st->pending);
    free(st);
}

/* ---- generation endpoints
 * --------------------------------------------------------------------------- */

static enum MHD_Result generate(srv *s, srv_conn *cc, struct MHD_Connection *c,
                                srv_endpoint endpoint) {
    srv_parsed p;
    srv_error err;
    if (!srv_parse_request(s, endpoint, cc->body.data ? cc->body.data : "", cc->body.len, &p,
                           &err)) {
        srv_parsed_free(&p);
        return send_error(s, c, &err);
    }
    if (atomic_load(&s->n_waiting) >= s->cfg.max_queued) {
        srv_parsed_free(&p);
        pthread_mutex_lock(&s->metrics.mu);
        s->metrics.rejected_queue_full++;
        pthread_mutex_unlock(&s->metrics.mu);
        srv_error_set(&err, 429, "rate_limit_error", "",
                      "%d requests are already waiting for their first token (--max-queued)",
                      s->cfg.max_queued);
        err.retry_after_s = 1;
        return send_error(s, c, &err);
    }
    srv_job *job = srv_job_create(s, &p);
    if (!job) {
        srv_parsed_free(&p);
        return fail(s, c, 503, "server_error", "out of memory");
    }
    if (!srv_job_submit(job, &p, &err)) {
        srv_parsed_free(&p);
        srv_job_release(job);
        if (err.http == 429) {
            pthread_mutex_lock(&s->metrics.mu);
            s->metrics.rejected_overloaded++;
            pthread_mutex_unlock(&s->metrics.mu);
        }
        return send_error(s, c, &err);
    }
    bool stream = p.stream, include_usage = p.include_usage;
    srv_parsed_free(&p);
    cc->job = job;
    /* libmicrohttpd's idle timeout counts from the socket's last read or write, which a long
     * generation (or a long wait for the first token) has none of: off until the request
     * completes. The socket watch and --timeout-s bound the request instead. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);

    if (stream) {
        srv_stream *st = calloc(1, sizeof *st);
        if (!st) {
            srv_job_cancel(job);
            return fail(s, c, 503, "server_error", "out of memory");
        }
        atomic_fetch_add(&job->refs, 1);
        st->s = s;
        st->job = job;
        st->fd = cc->fd;
        st->include_usage = include_usage;
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
        if (!r) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return ret;
    }

    for (size_t seen = 0;;) {
        pthread_mutex_lock(&job->mu);
        bool done = job->done;
        seen = job->n_events;
        pthread_mutex_unlock(&job->mu);
        if (done) break;
        srv_wait_result w = srv_job_wait(job, seen, cc->fd);
        if (w == SRV_WAIT_GONE) return MHD_NO; /* nobody to answer: close */
        if (w == SRV_WAIT_STOPPING)
            return fail(s, c, 503, "server_error", "the server is shutting down");
        if (w == SRV_WAIT_TIMEOUT) {
            srv_error_set(&err, 408, "timeout", "", "the request ran past the server's %g s limit",
                          s->cfg.timeout_s);
            return send_error(s, c, &err);
        }
    }
    char *body = srv_response_full(job, s->cfg.model_name, &err);
    if (!body) return send_error(s, c, &err);
    return send_json(c, MHD_HTTP_OK, body, 0);
}

/* ---- other endpoints
 * ------------------------------------------------------------------------------- */

static enum MHD_Result models(srv *s, struct MHD_Connection *c) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->cfg.model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)(int64_t)s->started_s);
    cJSON_AddStringToObject(m, "owned_by", "loom");
    cJSON_AddNumberToObject(m, "max_model_len", s->max_ctx);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return send_json(c, MHD_HTTP_OK, json, 0);
}

static enum MHD_Result metrics(srv *s, struct MHD_Connection *c) {
    size_t len = 0;
    char *text = srv_metrics_text(s, &len);
    if (!text) return fail(s, c, 503, "server_error", "out of memory");
    return send_body(c, MHD_HTTP_OK, text, len, "text/plain; version=0.0.4; charset=utf-8", 0);
}

/* ---- routing
 * ------------------------------------------------------------------------------------- */

typedef struct route {
    const char *path;
    const char *method;
    bool authenticated;
} route;

static const route routes[] = {
    {"/v1/completions", "POST", true}, {"/v1/chat/completions", "POST", true},
    {"/v1/models", "GET", true},       {"/health", "GET", false},
    {"/metrics", "GET", false},
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    srv_conn *cc = *con_cls;
    if (!cc) { /* headers are in: set the request up */
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        cc->s = s;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        cc->fd = ci ? ci->connect_fd : -1;
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) cc->too_big = true;
        *con_cls = cc;
        return MHD_YES;
    }
    if (*upload_data_size) { /* a piece of the body */
        if (!cc->too_big) {
            if (cc->body.len + *upload_data_size > s->cfg.max_body_bytes) {
                cc->too_big = true;
                srv_buf_free(&cc->body);
            } else {
                srv_buf_put(&cc->body, upload_data, *upload_data_size);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }

    const route *r = NULL;
    bool path_known = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path)) continue;
        path_known = true;
        if (!strcmp(method, routes[i].method)) r = &routes[i];
    }
    if (!path_known) {
        srv_error err;
        srv_error_set(&err, 404, "not_found_error", "", "no route %.200s", url);
        return send_error(s, c, &err);
    }
    if (!r) {
        srv_error err;
        srv_error_set(&err, 405, "invalid_request_error", "", "%s is not allowed on %.200s", method,
                      url);
        return send_error(s, c, &err);
    }
    if (r->authenticated && !authorized(s, c)) {
        srv_error err;
        srv_error_set(&err, 401, "authentication_error", "",
                      "a valid API key is required (Authorization: Bearer <key>)");
        err.code = "invalid_api_key";
        return send_error(s, c, &err);
    }
    if (cc->too_big) {
        srv_error err;
        srv_error_set(&err, 413, "invalid_request_error", "",
                      "the request body is larger than this server's limit of %zu bytes",
                      s->cfg.max_body_bytes);
        return send_error(s, c, &err);
    }
    if (cc->body.failed) return fail(s, c, 503, "server_error", "out of memory");
    if (!strcmp(url, "/v1/completions")) return generate(s, cc, c, SRV_COMPLETIONS);
    if (!strcmp(url, "/v1/chat/completions")) return generate(s, cc, c, SRV_CHAT);
    if (!strcmp(url, "/v1/models")) return models(s, c);
    if (!strcmp(url, "/metrics")) return metrics(s, c);
    char *ok = strdup("{\"status\":\"ok\"}");
    return send_json(c, MHD_HTTP_OK, ok, 0);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    srv *s = cls;
    srv_conn *cc = *con_cls;
    if (!cc) return;
    if (cc->job) {
        pthread_mutex_lock(&cc->job->mu);
        bool done = cc->job->done;
        pthread_mutex_unlock(&cc->job->mu);
        if (!done && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
            if (!atomic_load(&cc->job->cancelled)) {
                pthread_mutex_lock(&s->metrics.mu);
                s->metrics.disconnects++;
                pthread_mutex_unlock(&s->metrics.mu);
            }
            srv_job_cancel(cc->job);
        }
        srv_job_release(cc->job);
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->cfg.connection_timeout_s);
    }
    srv_buf_free(&cc->body);
    free(cc);
    *con_cls = NULL;
}

/* ---- start
 * ---------------------------------------------------------------------------------------- */

struct MHD_Daemon *srv_http_start(srv *s, int *port) {
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port_text[16];
    snprintf(port_text, sizeof port_text, "%d", s->cfg.port);
    int rc = getaddrinfo(s->cfg.host, port_text, &hints, &ai);
    if (rc != 0 || !ai) {
        fprintf(stderr, "loom-server: cannot resolve --host %s: %s\n", s->cfg.host,
                gai_strerror(rc));
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)s->cfg.port, NULL, NULL, on_request, s, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT,
        s->cfg.connection_timeout_s, MHD_OPTION_CONNECTION_LIMIT, 1024u, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "loom-server: cannot listen on %s:%d (in use, or not allowed)\n",
                s->cfg.host, s->cfg.port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = di ? di->port : s->cfg.port;
    return d;
}
