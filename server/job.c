/* A request's job: its engine requests, the log of their events (written on the engine's
 * thread by srv_on_event, read by the connection's thread), cancellation and waiting. */
#define _GNU_SOURCE

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server.h"

/* ---- lifetime ------------------------------------------------------------------------------- */

/* Frees what srv_job_create allocated (the mutex and condition variable are the caller's). */
static void job_free(srv_job *job) {
    free(job->events);
    free(job->text);
    free(job->top);
    free(job->choices);
    free(job->subs);
    free(job);
}

srv_job *srv_job_create(srv *s, const srv_parsed *p) {
    srv_job *job = calloc(1, sizeof *job);
    if (!job) return NULL;
    int32_t n_choices = (int32_t)p->n_prompts * p->n;
    job->subs = calloc(p->n_prompts, sizeof *job->subs);
    job->choices = calloc((size_t)n_choices, sizeof *job->choices);
    if (!job->subs || !job->choices || pthread_mutex_init(&job->mu, NULL) != 0) {
        job_free(job);
        return NULL;
    }
    if (pthread_cond_init(&job->cv, NULL) != 0) {
        pthread_mutex_destroy(&job->mu);
        job_free(job);
        return NULL;
    }
    atomic_init(&job->refs, 1);
    atomic_init(&job->cancelled, false);
    job->srv = s;
    job->endpoint = p->endpoint;
    job->n = p->n;
    job->n_choices = n_choices;
    job->logprobs = p->logprobs;
    job->top_logprobs = p->top_logprobs;
    job->n_subs = (int32_t)p->n_prompts;
    job->submitting = true;
    job->created = (int64_t)time(NULL);
    job->arrival_s = loom_engine_now();
    uint64_t serial = atomic_fetch_add(&s->next_id, 1);
    snprintf(job->id, sizeof job->id, "%s-%016llx%08llx",
             p->endpoint == SRV_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)s->id_salt,
             (unsigned long long)serial);
    for (int32_t i = 0; i < job->n_subs; i++) {
        job->subs[i].job = job;
        job->subs[i].index = i;
        job->subs[i].prompt_tokens = (int32_t)p->prompts[i].n_tokens;
    }
    return job;
}

void srv_job_release(srv_job *job) {
    if (!job || atomic_fetch_sub(&job->refs, 1) != 1) return;
    pthread_cond_destroy(&job->cv);
    pthread_mutex_destroy(&job->mu);
    job_free(job);
}

/* Called with job->mu held: the job stops counting as waiting for its first token. */
static void job_stop_waiting(srv_job *job) {
    if (job->counted_waiting) {
        job->counted_waiting = false;
        atomic_fetch_sub(&job->srv->n_waiting, 1);
    }
}

/* ---- submitting ------------------------------------------------------------------------------ */

bool srv_job_submit(srv_job *job, const srv_parsed *p, srv_error *err) {
    srv *s = job->srv;
    loom_request_params rp = loom_request_default_params();
    rp.sampler = &p->sampler;
    rp.n = p->n;
    rp.stop_tokens = p->stop_tokens;
    rp.n_stop_tokens = p->n_stop_tokens;
    rp.stop_strings = (const char *const *)p->stop;
    rp.n_stop_strings = p->n_stop;
    rp.ignore_eos = p->ignore_eos;
    rp.priority = p->priority;
    rp.ttft_deadline_s = p->ttft_deadline_s;
    rp.tpot_deadline_s = p->tpot_deadline_s;
    rp.cache_salt = p->cache_salt;
    rp.arrival_s = job->arrival_s;

    pthread_mutex_lock(&job->mu);
    job->counted_waiting = true;
    atomic_fetch_add(&s->n_waiting, 1);
    pthread_mutex_unlock(&job->mu);

    int64_t prompt_tokens = 0;
    for (int32_t i = 0; i < job->n_subs; i++) {
        srv_sub *sub = &job->subs[i];
        rp.prompt_tokens = p->prompts[i].tokens;
        rp.n_prompt_tokens = p->prompts[i].n_tokens;
        rp.user_data = sub;
        /* max_tokens not given: as far as the context allows, up to the ceiling */
        int32_t room = s->max_ctx - (int32_t)p->prompts[i].n_tokens;
        rp.max_tokens = p->max_tokens > 0                  ? p->max_tokens
                        : room < 1                         ? 1
                        : room < s->cfg.max_tokens_ceiling ? room
                                                           : s->cfg.max_tokens_ceiling;
        if (p->max_tokens == 0 && p->endpoint == SRV_COMPLETIONS && rp.max_tokens > 16)
            rp.max_tokens = 16;          /* OpenAI's default for completions */
        atomic_fetch_add(&job->refs, 1); /* the engine's, until the request's last event */
        pthread_mutex_lock(&job->mu);
        job->subs_open++;
        pthread_mutex_unlock(&job->mu);
        loom_request_id id = 0;
        loom_status st = loom_engine_submit(s->engine, &rp, &id);
        if (st != LOOM_OK) {
            srv_error_from_status(err, st);
            pthread_mutex_lock(&job->mu);
            job->subs_open--;
            job->submitting = false;
            job_stop_waiting(job);
            pthread_mutex_unlock(&job->mu);
            atomic_fetch_sub(&job->refs, 1); /* the connection still holds one */
            srv_job_cancel(job);             /* the prompts submitted before this one */
            return false;
        }
        pthread_mutex_lock(&job->mu);
        sub->id = id;
        sub->submitted = true;
        pthread_mutex_unlock(&job->mu);
        prompt_tokens += (int64_t)p->prompts[i].n_tokens;
    }
    pthread_mutex_lock(&job->mu);
    job->submitting = false;
    if (job->subs_open == 0) job->done = true; /* everything ended before we got here */
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);

    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.prompt_tokens += (uint64_t)prompt_tokens;
    pthread_mutex_unlock(&s->metrics.mu);
    return true;
}

void srv_job_cancel(srv_job *job) {
    if (atomic_exchange(&job->cancelled, true)) return;
    pthread_mutex_lock(&job->mu);
    loom_request_id ids[64];
    int32_t n_ids = 0;
    for (int32_t i = 0; i < job->n_subs && n_ids < 64; i++)
        if (job->subs[i].submitted && job->subs[i].samples_ended < job->n)
            ids[n_ids++] = job->subs[i].id;
    pthread_mutex_unlock(&job->mu);
    /* outside the job's lock: the engine thread may be waiting for it in srv_on_event */
    bool failed = false;
    for (int32_t i = 0; i < n_ids; i++) {
        loom_status st = loom_engine_cancel(job->srv->engine, ids[i]);
        if (st == LOOM_ERR_OUT_OF_MEMORY) st = loom_engine_cancel(job->srv->engine, ids[i]);
        failed |= st == LOOM_ERR_OUT_OF_MEMORY;
    }
    if (failed) atomic_store(&job->cancelled, false); /* the next call tries again */
}

/* ---- the engine's events ------------------------------------------------------------------------
 */

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static srv_event *job_push(srv_job *job) {
    if (!grow((void **)&job->events, &job->cap_events, job->n_events + 1, sizeof(srv_event))) {
        job->lost_events = true;
        return NULL;
    }
    srv_event *e = &job->events[job->n_events++];
    memset(e, 0, sizeof *e);
    return e;
}

static srv_outcome outcome_of(loom_finish_reason r) {
    switch (r) {
    case LOOM_FINISH_EOS:
    case LOOM_FINISH_STOP_TOKEN:
    case LOOM_FINISH_STOP_STRING:
        return SRV_OUTCOME_STOP;
    case LOOM_FINISH_CANCELLED:
        return SRV_OUTCOME_ABORT;
    case LOOM_FINISH_LENGTH:
    case LOOM_FINISH_CONTEXT:
    default:
        return SRV_OUTCOME_LENGTH;
    }
}

static void log_token(srv_job *job, int32_t choice, const loom_event *ev, double now) {
    srv *s = job->srv;
    srv_event *e = job_push(job);
    if (!e) return;
    const loom_token_info *info = ev->info;
    e->kind = SRV_EV_TOKEN;
    e->choice = choice;
    e->token = ev->token;
    if (ev->text_len) {
        if (!grow((void **)&job->text, &job->cap_text, job->n_text + ev->text_len, 1)) {
            job->n_events--;
            job->lost_events = true;
            return;
        }
        memcpy(job->text + job->n_text, ev->text, ev->text_len);
        e->text_off = job->n_text;
        e->text_len = (uint32_t)ev->text_len;
        job->n_text += ev->text_len;
    }
    e->choice_off = job->choices[choice].len;
    job->choices[choice].len += e->text_len;
    if (info) {
        e->logprob = info->logprob_raw;
        e->entropy = (float)info->entropy;
        e->varentropy = (float)info->varentropy;
        int32_t k = job->logprobs ? job->top_logprobs : 0;
        if (k > info->n_top_raw) k = info->n_top_raw;
        if (k > 0) {
            if (!grow((void **)&job->top, &job->cap_top, job->n_top + (size_t)k,
                      sizeof(loom_token_logprob))) {
                job->lost_events = true;
                k = 0;
            } else {
                memcpy(job->top + job->n_top, info->top_raw, (size_t)k * sizeof *job->top);
                e->top_off = job->n_top;
                job->n_top += (size_t)k;
            }
        }
        e->n_top = k;
    }
    job->completion_tokens++;
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.generation_tokens++;
    if (job->counted_waiting) srv_histogram_observe(&s->metrics.ttft, now - job->arrival_s);
    if (job->choices[choice].last_s > 0)
        srv_histogram_observe(&s->metrics.itl, now - job->choices[choice].last_s);
    pthread_mutex_unlock(&s->metrics.mu);
    job->choices[choice].last_s = now;
    job_stop_waiting(job);
}

static void log_end(srv_job *job, int32_t choice, loom_finish_reason reason, loom_status status,
                    int32_t cached, double now) {
    srv *s = job->srv;
    if (job->choices[choice].ended) return;
    job->choices[choice].ended = true;
    srv_event *e = job_push(job);
    if (e) {
        e->kind = SRV_EV_END;
        e->choice = choice;
        e->reason = reason;
        e->status = status;
        e->cached_tokens = cached;
    }
    job->cached_tokens += cached;
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.outcomes[status != LOOM_OK ? SRV_OUTCOME_ERROR : outcome_of(reason)]++;
    srv_histogram_observe(&s->metrics.e2e, now - job->arrival_s);
    pthread_mutex_unlock(&s->metrics.mu);
}

void srv_on_event(const loom_event *ev, void *user_data) {
    (void)user_data;
    srv_sub *sub = ev->user_data;
    if (!sub) return;
    srv_job *job = sub->job;
    double now = loom_engine_now();
    bool sub_ended = false;
    pthread_mutex_lock(&job->mu);
    int32_t base = sub->index * job->n;
    if (ev->kind == LOOM_EVENT_TOKEN) {
        if (ev->sample >= 0 && ev->sample < job->n) log_token(job, base + ev->sample, ev, now);
    } else if (ev->kind == LOOM_EVENT_FINISHED) {
        if (ev->sample >= 0 && ev->sample < job->n && !job->choices[base + ev->sample].ended) {
            log_end(job, base + ev->sample, ev->reason, LOOM_OK, ev->cached_tokens, now);
            sub->samples_ended++;
        }
        sub_ended = sub->samples_ended >= job->n;
    } else { /* FAILED: nothing more comes for any of its samples */
        for (int32_t i = 0; i < job->n; i++)
            log_end(job, base + i, LOOM_FINISH_CANCELLED,
                    ev->status != LOOM_OK ? ev->status : LOOM_ERR_INTERNAL, 0, now);
        sub->samples_ended = job->n;
        sub_ended = true;
    }
    if (sub_ended) {
        job->subs_open--;
        if (job->subs_open == 0 && !job->submitting) job->done = true;
        job_stop_waiting(job);
    }
    pthread_cond_broadcast(&job->cv);
    pthread_mutex_unlock(&job->mu);
    if (sub_ended) srv_job_release(job); /* the engine's reference for this request */
}

/* ---- waiting ----------------------------------------------------------------------------------
 */

/* Whether the peer has closed (or reset) the connection, without reading from it. */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd pfd = {.fd = fd, .events = POLLRDHUP};
    int r = poll(&pfd, 1, 0);
    return r > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Whether the request should stop waiting for good: its client left, the server stops, or it
 * ran past --timeout-s (it is then cancelled). SRV_WAIT_READY: none of these. */
static srv_wait_result abandoned(srv_job *job, int fd) {
    srv *s = job->srv;
    if (client_gone(fd)) {
        if (!atomic_load(&job->cancelled)) {
            pthread_mutex_lock(&s->metrics.mu);
            s->metrics.disconnects++;
            pthread_mutex_unlock(&s->metrics.mu);
        }
        srv_job_cancel(job);
        return SRV_WAIT_GONE;
    }
    if (atomic_load(&s->stopping)) {
        srv_job_cancel(job);
        return SRV_WAIT_STOPPING;
    }
    if (s->cfg.timeout_s > 0 && loom_engine_now() - job->arrival_s > s->cfg.timeout_s) {
        if (!atomic_load(&job->cancelled)) {
            pthread_mutex_lock(&s->metrics.mu);
            s->metrics.timeouts++;
            pthread_mutex_unlock(&s->metrics.mu);
        }
        srv_job_cancel(job);
        return SRV_WAIT_TIMEOUT;
    }
    return SRV_WAIT_READY;
}

srv_wait_result srv_job_wait(srv_job *job, size_t seen, int fd) {
    /* Every call looks at the socket, the shutdown flag and the clock, even when events are
     * already there (tokens may come faster than any wait), and a wait wakes at least every
     * 10 ms to look again: a client that goes away is cancelled within about one step. */
    const long slice_ns = 10 * 1000 * 1000;
    for (;;) {
        pthread_mutex_lock(&job->mu);
        bool ready = job->n_events > seen || job->done, done = job->done;
        pthread_mutex_unlock(&job->mu);
        if (!done) {
            srv_wait_result r = abandoned(job, fd);
            if (r != SRV_WAIT_READY) return r;
        }
        if (ready) return SRV_WAIT_READY;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += slice_ns;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&job->mu);
        if (job->n_events <= seen && !job->done) pthread_cond_timedwait(&job->cv, &job->mu, &ts);
        pthread_mutex_unlock(&job->mu);
    }
}
