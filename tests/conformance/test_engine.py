"""test_engine.py — the engine: continuous batching that is batch-invariant.

On a synthetic llama model and on Gemma 3 270M (two KV groups: global and sliding-window):
  - 16 concurrent requests of different lengths (greedy and seeded sampling) give exactly the
    tokens each gives alone;
  - chunked prefill (a small token budget) changes nothing;
  - the same prompt twice hits the prefix cache and gives identical output;
  - a KV budget too small for all requests forces preemptions (recompute, and swap) and still
    gives identical outputs;
  - n = 4 samples share the prompt's blocks (block count) and sample 0 equals n = 1;
  - cancellation mid-prefill and mid-decode frees everything;
  - bad input gets a clear status while the engine keeps serving the others;
  - the full sampler chain (bias, penalties, entropy correction, top-p, min-p) gives the same
    tokens and per-token info alone, in a batch of 16 mixed requests and with 1 or 2 threads;
    each token's raw logprob, top alternatives and entropy match float64 references computed
    from a session's teacher-forced logits (so the engine hands the chain the right logits and
    the right penalty history); bad sampler settings fail at submit, naming the field;
  - statistics: TTFT and TPOT (mean, p50, p99) and tokens/s (lifetime and recent) equal the
    same figures computed from the engine's trace, whose token times are the engine's own,
    and agree with the wall clock;
  - a caller's arrival_s: two requests submitted in one order with arrivals in the other are
    served by arrival (max_seqs = 1, priority and FCFS policies); the TTFT deadline, the TTFT
    statistics and the trace count from it; bad arrivals fail at submit;
  - loom_engine_generate: the same tokens, text and finish reason as the step-driven path,
    with another request running beside it (whose events reach the callback and whose output
    is unchanged); n > 1 and bad input refused; BUSY in background mode;
  - KV pool sizing (engine_kv.c): a sliding-window group gets no more blocks than max_seqs
    running sequences can hold (plus copy-on-write and prefix-cache headroom) and the rest of
    the budget goes to the full-attention group, whose block count (kv_blocks_total) equals
    the documented formula on a synthetic Gemma-3-shaped model and on Gemma 3 270M; one-group
    and sliding-only models keep budget / block bytes; many concurrent long requests on a
    budget where the full group binds preempt (recompute and swap) without the sliding pool
    ever running short, and give exactly the tokens each gives alone; the smallest budget
    works and one byte less fails with OUT_OF_MEMORY naming what one request needs.
"""
import math
import os
import sys

import numpy as np

try:
    import gguf
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

import loom
import synth_llama
from gemma_pkg import gemma_path

# Which backend every model of this test runs on: the library's default, or (CTest's
# conf_test_engine_cpuplugin) the CPU backend loaded as a plugin.
BACKEND = os.environ.get("LOOM_TEST_BACKEND") or None
loom.Model.default_backend = BACKEND

TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
failures = []

# A chain with every stage on: bias (one ban), penalties over a window, EDT correction,
# temperature, top-p and min-p; top-k off so top-p's partial selection path runs.
CHAIN = dict(temperature=0.9, top_k=0, top_p=0.9, min_p=0.02, entropy_mode="edt",
             edt_n=0.8, edt_theta=1.0, repeat_penalty=1.3, presence_penalty=0.2,
             frequency_penalty=0.1, penalty_last_n=24,
             logit_bias={5: 2.0, 7: float("-inf"), 11: -1.5}, n_logprobs=5)


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL", msg)


def run_alone(model, req, **eng):
    e = loom.Engine(model, **eng)
    rid = e.submit(**req)
    out = e.run()[rid]
    e.close()
    return out


def same(a, b):
    return all(a[k]["tokens"] == b[k]["tokens"] for k in a) and a.keys() == b.keys()


def batch_invariance(model, requests, label, **eng):
    e = loom.Engine(model, **eng)
    ids = [e.submit(**r) for r in requests]
    out = e.run()
    st = e.stats()
    e.close()
    alone = [run_alone(model, r, kv_bytes=eng.get("kv_bytes", 0), max_ctx=eng.get("max_ctx", 0))
             for r in requests]
    n_same = sum(same(out[i], a) for i, a in zip(ids, alone))
    print(f"{label}: {n_same}/{len(requests)} requests identical to running alone; "
          f"steps {st['steps']}, preemptions {st['preemptions']}, "
          f"prefix hits {st['prefix_hit_tokens']}/{st['prefix_query_tokens']}")
    check(n_same == len(requests), f"{label}: {len(requests) - n_same} requests differ")
    check(st["kv_blocks_used"] == 0, f"{label}: {st['kv_blocks_used']} blocks still used")
    return st


def synthetic(model, shape):
    V = shape.n_vocab
    rng = np.random.default_rng(3)
    lens = [1, 3, 7, 15, 16, 17, 31, 33, 48, 64, 90, 120, 5, 11, 70, 200]
    reqs = []
    for k, L in enumerate(lens):
        toks = [1] + [int(t) for t in rng.integers(3, V, L)]
        sampled = k % 2 == 1
        reqs.append(dict(tokens=toks, max_tokens=12 + k % 5,
                         temperature=0.9 if sampled else 0.0, seed=100 + k))
    budget = 64 << 20
    batch_invariance(model, reqs, "synthetic, 16 concurrent", kv_bytes=budget)
    batch_invariance(model, reqs, "synthetic, chunked prefill (budget 32 tokens)",
                     kv_bytes=budget, max_batched_tokens=32, max_seqs=16)
    # A budget for ~3 requests at once: preemptions must happen and change nothing.
    block_bytes = shape.n_layer * 2 * 16 * shape.n_head_kv * shape.head_dim * 2  # f16 K and V
    small = 40 * block_bytes
    # Prompts that fit together at admission but whose generations outgrow the cache.
    grow = [dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 20 + 3 * k)], max_tokens=56,
                 temperature=0.0 if k % 2 == 0 else 0.8, seed=50 + k) for k in range(8)]
    for mode, name in ((0, "recompute"), (1, "swap")):
        st = batch_invariance(model, grow, f"synthetic, small KV, preempt by {name}",
                              kv_bytes=small, max_seqs=8, preempt=mode)
        check(st["preemptions"] > 0, f"preempt by {name}: no preemption happened")

    # Prefix cache: the same prompt twice, one after the other.
    e = loom.Engine(model, kv_bytes=budget)
    p = reqs[15]
    a = e.submit(**p)
    e.run()
    b = e.submit(**p)
    out = e.run()
    st = e.stats()
    print(f"prefix cache: second run reused {st['prefix_hit_tokens']} of "
          f"{st['prefix_query_tokens']} prompt tokens")
    check(st["prefix_hit_tokens"] >= 192, "the second identical prompt missed the cache")
    check(out[a][0]["tokens"] == out[b][0]["tokens"], "prefix-cache hit changed the output")
    check(out[a][0]["cached_tokens"] == 0 and out[b][0]["cached_tokens"] == 192,
          f"per-request hit counts {out[a][0]['cached_tokens']}, {out[b][0]['cached_tokens']}")
    e.close()

    # Salts isolate tenants end to end (issue 18, bug 9: a change that dropped the salt inside
    # the engine passed every test): the same prompt under another salt finds nothing cached,
    # under its own salt everything, and the salt never changes the tokens.
    e = loom.Engine(model, kv_bytes=budget)
    runs = []
    for salt in (7, 8, 7, 0, 8):
        rid = e.submit(**p, cache_salt=salt)
        runs.append((salt, e.run()[rid][0]))
    hits = [o["cached_tokens"] for _, o in runs]
    check(hits == [0, 0, 192, 0, 192], f"cache_salt isolation: hits {hits}, want "
          f"[0, 0, 192, 0, 192] for salts 7, 8, 7, 0, 8")
    check(all(o["tokens"] == out[a][0]["tokens"] for _, o in runs),
          "cache_salt changed the tokens")
    # Concurrently too: in one step, the cached tenant hits and a new one does not.
    x = e.submit(**p, cache_salt=7)
    y = e.submit(**p, cache_salt=12)
    both = e.run()
    check(both[x][0]["cached_tokens"] == 192 and both[y][0]["cached_tokens"] == 0,
          f"salts 7 and 12 at once: hits {both[x][0]['cached_tokens']}, "
          f"{both[y][0]['cached_tokens']}, want 192 and 0")
    e.close()

    # n = 4 samples share the prompt's blocks.
    e = loom.Engine(model, kv_bytes=budget, block_size=16)
    prompt = [1] + [int(t) for t in rng.integers(3, V, 160)]  # 161 tokens: 10 full blocks
    rid = e.submit(tokens=prompt, n=4, max_tokens=24, temperature=1.0, seed=9)
    peak = 0
    while e.has_work():
        e.step()
        peak = max(peak, e.stats()["kv_blocks_used"])
    out = e.outputs[rid]
    alone = run_alone(model, dict(tokens=prompt, max_tokens=24, temperature=1.0, seed=9),
                      kv_bytes=budget)
    unshared = 4 * ((161 + 24 + 15) // 16)
    print(f"n = 4: peak {peak} blocks used (unshared would be {unshared}); "
          f"samples distinct: {len({tuple(o['tokens']) for o in out.values()})}")
    check(len(out) == 4, "n = 4 gave fewer samples")
    check(peak <= 10 + 4 * 3, f"n = 4 does not share the prompt's blocks (peak {peak})")
    check(out[0]["tokens"] == alone[0]["tokens"], "sample 0 of n = 4 differs from n = 1")
    e.close()

    # Cancellation mid-prefill and mid-decode.
    e = loom.Engine(model, kv_bytes=budget, max_batched_tokens=32, max_seqs=16)
    long_p = [1] + [int(t) for t in rng.integers(3, V, 150)]
    c1 = e.submit(tokens=long_p, max_tokens=50)
    c2 = e.submit(tokens=reqs[2]["tokens"], max_tokens=50)
    keep = e.submit(tokens=reqs[3]["tokens"], max_tokens=10)
    e.step()
    e.step()  # c1 is mid-prefill (150 tokens at 32 per step), c2 is decoding
    e.cancel(c1)
    e.cancel(c2)
    out = e.run()
    st = e.stats()
    check(out[c1][0]["reason"] == "cancelled" and out[c2][0]["reason"] == "cancelled",
          "cancelled requests did not finish as cancelled")
    check(out[keep][0]["tokens"] == run_alone(model, dict(tokens=reqs[3]["tokens"],
                                                          max_tokens=10))[0]["tokens"],
          "a request beside cancelled ones changed")
    check(st["kv_blocks_used"] == 0, "cancelled requests left blocks in use")
    try:
        e.cancel(c1)
        check(False, "cancelling a finished request succeeded")
    except loom.LoomError as err:
        check(err.name == "ERR_NOT_FOUND", f"cancel of a finished id: {err}")

    # Bad input: each a clear status naming what is wrong; the engine keeps serving.
    good = e.submit(tokens=reqs[4]["tokens"], max_tokens=8)
    good_chain = e.submit(tokens=reqs[5]["tokens"], max_tokens=8, **CHAIN)
    nan = float("nan")
    for kw, want, field in (
            (dict(tokens=[1, V + 5]), "ERR_BAD_INPUT", "prompt token"),
            (dict(tokens=[1, -3]), "ERR_BAD_INPUT", "prompt token"),
            (dict(tokens=list(range(3, 3 + 300))), "ERR_CONTEXT_FULL", "prompt"),
            (dict(tokens=[1, 5], max_tokens=0), "ERR_INVALID_ARG", "max_tokens"),
            (dict(tokens=[1, 5], temperature=-1.0), "ERR_INVALID_ARG", "temperature"),
            (dict(tokens=[1, 5], top_p=1.5), "ERR_INVALID_ARG", "top_p"),
            (dict(tokens=[1, 5], top_p=0.0), "ERR_INVALID_ARG", "top_p"),
            (dict(tokens=[1, 5], min_p=1.5), "ERR_INVALID_ARG", "min_p"),
            (dict(tokens=[1, 5], typical_p=0.0), "ERR_INVALID_ARG", "typical_p"),
            (dict(tokens=[1, 5], logit_bias={-1: 1.0}), "ERR_INVALID_ARG", "logit bias"),
            (dict(tokens=[1, 5], logit_bias={V: 1.0}), "ERR_INVALID_ARG", "logit bias"),
            (dict(tokens=[1, 5], logit_bias={3: nan}), "ERR_INVALID_ARG", "logit bias"),
            (dict(tokens=[1, 5], n_logprobs=21), "ERR_INVALID_ARG", "n_logprobs"),
            (dict(tokens=[1, 5], n_logprobs=-1), "ERR_INVALID_ARG", "n_logprobs"),
            (dict(tokens=[1, 5], presence_penalty=nan), "ERR_INVALID_ARG", "presence_penalty"),
            (dict(tokens=[1, 5], frequency_penalty=nan), "ERR_INVALID_ARG",
             "frequency_penalty"),
            (dict(tokens=[1, 5], repeat_penalty=nan), "ERR_INVALID_ARG", "repeat_penalty"),
            (dict(tokens=[1, 5], penalty_last_n=-2), "ERR_INVALID_ARG", "penalty_last_n"),
            (dict(tokens=[1, 5], entropy_mode=9), "ERR_INVALID_ARG", "entropy mode"),
            (dict(tokens=[1, 5], entropy_mode="edt", edt_n=1.5), "ERR_INVALID_ARG", "EDT"),
            (dict(tokens=[1, 5], entropy_mode="exp", exp_beta=-1.0), "ERR_INVALID_ARG", "EXP"),
            (dict(tokens=[1, 5], entropy_mode="dynatemp", dyn_t_min=2.0, dyn_t_max=1.0),
             "ERR_INVALID_ARG", "DYNATEMP"),
            (dict(tokens=[]), "ERR_INVALID_ARG", "no tokens"),
            # durations a cast to int64 microseconds would overflow (issue 18, bug 4)
            (dict(tokens=[1, 5], ttft_deadline_s=1e300), "ERR_INVALID_ARG", "ttft_deadline_s"),
            (dict(tokens=[1, 5], ttft_deadline_s=nan), "ERR_INVALID_ARG", "ttft_deadline_s"),
            (dict(tokens=[1, 5], ttft_deadline_s=-1.0), "ERR_INVALID_ARG", "ttft_deadline_s"),
            (dict(tokens=[1, 5], tpot_deadline_s=1e300), "ERR_INVALID_ARG", "tpot_deadline_s"),
            (dict(tokens=[1, 5], tpot_deadline_s=-float("inf")), "ERR_INVALID_ARG",
             "tpot_deadline_s"),
            (dict(prompt=b"\xff\xfe"), "ERR_BAD_INPUT", "UTF-8")):
        try:
            e.submit(**kw)
            check(False, f"submit {kw} succeeded")
        except loom.LoomError as err:
            check(err.name == want, f"submit {kw}: {err.name}, want {want}")
            check(field.lower() in str(err).lower(), f"submit {kw}: {err} does not name {field}")
    try:
        e.cancel(987654321)
        check(False, "cancel of an unknown id succeeded")
    except loom.LoomError as err:
        check(err.name == "ERR_NOT_FOUND", f"cancel unknown: {err}")
    # starvation_s: +inf never promotes (as 0); a duration past int64 microseconds is refused
    for bad in (1e300, float("nan"), -1.0):
        try:
            loom.Engine(model, kv_bytes=32 << 20, starvation_s=bad).close()
            check(False, f"starvation_s {bad} was accepted")
        except loom.LoomError as err:
            check(err.name == "ERR_INVALID_ARG" and "starvation_s" in str(err),
                  f"starvation_s {bad}: {err}")
    loom.Engine(model, kv_bytes=32 << 20, starvation_s=float("inf")).close()
    # max_tokens is bounded by the context, not reserved up front (issue 18, bug 5: INT32_MAX
    # x 255 samples reserved 2.1 TB): every sample runs until the context is full
    # +inf is "no deadline", as 0 is: it runs like a request without one
    inf = float("inf")
    no_deadline = e.submit(tokens=reqs[4]["tokens"], max_tokens=8, ttft_deadline_s=inf,
                           tpot_deadline_s=inf)
    out = e.run()
    check(out[good][0]["reason"] == "length" and len(out[good][0]["tokens"]) == 8,
          "the engine stopped serving after bad input")
    check(out[no_deadline][0]["tokens"] == out[good][0]["tokens"],
          "a request with infinite deadlines did not run as one without")
    e2 = loom.Engine(model, kv_bytes=budget, max_ctx=40)
    huge = e2.submit(tokens=[1, 5, 9], max_tokens=2**31 - 1, n=8)
    out2 = e2.run()[huge]
    check(len(out2) == 8 and all(o.get("reason") == "context" for o in out2.values()),
          f"max_tokens = 2^31 - 1: {[o.get('reason') for o in out2.values()]}")
    lens = {len(o["tokens"]) for o in out2.values()}
    check(lens == {40 - 3}, f"max_tokens = 2^31 - 1: samples of {lens} tokens, not 37")
    e2.close()
    check(out[good_chain][0]["reason"] == "length" and len(out[good_chain][0]["tokens"]) == 8,
          "a request with the full chain did not complete beside bad input")
    e.close()


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x[np.isfinite(x)].max()
    return x - (m + math.log(np.exp(x[np.isfinite(x)] - m).sum()))


def chain_logits(lg, history, req):
    """Steps 1-2 of the chain (bias, then penalties over the window of history), in float32
    as the library computes them."""
    x = np.array(lg, dtype=np.float32)
    for t, b in req.get("logit_bias", {}).items():
        x[t] = np.float32(x[t] + np.float32(b))
    n = req.get("penalty_last_n", 64)
    window = history if n < 0 else history[max(0, len(history) - n):] if n > 0 else []
    r = np.float32(req.get("repeat_penalty", 1.0))
    pres = np.float32(req.get("presence_penalty", 0.0))
    freq = np.float32(req.get("frequency_penalty", 0.0))
    for t in set(window):
        c = window.count(t)
        v = x[t] / r if x[t] > 0 else x[t] * r
        x[t] = np.float32(v - np.float32(pres + np.float32(c) * freq))
    return x


def entropy(x):
    lp = log_softmax(x)
    p = np.exp(lp[np.isfinite(lp)])
    return float(-(p * lp[np.isfinite(lp)]).sum())


def sampler_chain(path, shape):
    """The full chain through the engine: determinism and float64 checks of what it reports."""
    V = shape.n_vocab
    m1 = loom.Model(path, n_threads=1)
    m2 = loom.Model(path, n_threads=2)
    rng = np.random.default_rng(21)
    modes = [dict(CHAIN), dict(CHAIN, entropy_mode="exp", exp_beta=0.3, top_p=0.95),
             dict(CHAIN, entropy_mode="dynatemp", dyn_t_min=0.4, dyn_t_max=1.6, top_p=1.0,
                  typical_p=0.9),
             dict(temperature=0.0, n_logprobs=3)]
    reqs = []
    for k in range(16):
        toks = [1] + [int(t) for t in rng.integers(3, V, 5 + 11 * k % 97)]
        reqs.append(dict(modes[k % 4], tokens=toks, max_tokens=14 + k % 3, seed=300 + k))

    # Alone (twice), with 1 and 2 threads; in a batch of 16 with 2 threads.
    alone = [run_alone(m2, r, kv_bytes=64 << 20)[0] for r in reqs]
    again = [run_alone(m2, r, kv_bytes=64 << 20)[0] for r in reqs[:4]]
    one_thread = [run_alone(m1, r, kv_bytes=64 << 20)[0] for r in reqs]
    e = loom.Engine(m2, kv_bytes=64 << 20)
    ids = [e.submit(**r) for r in reqs]
    batch = e.run()
    e.close()
    n_same = sum(batch[i][0]["tokens"] == a["tokens"] and batch[i][0]["info"] == a["info"]
                 for i, a in zip(ids, alone))
    n_thr = sum(o["tokens"] == a["tokens"] and o["info"] == a["info"]
                for o, a in zip(one_thread, alone))
    n_again = sum(o["info"] == a["info"] for o, a in zip(again, alone))
    distinct = len({tuple(a["tokens"]) for a in alone})
    print(f"sampler chain: {n_same}/16 identical (tokens and per-token info) in a batch of 16, "
          f"{n_thr}/16 with 1 thread as with 2, {n_again}/4 on a second run; "
          f"{distinct} distinct outputs")
    check(n_same == 16, f"sampler chain: {16 - n_same} requests differ in a batch")
    check(n_thr == 16, f"sampler chain: {16 - n_thr} requests differ between 1 and 2 threads")
    check(n_again == 4, "sampler chain: a second run differs")
    check(distinct == 16, "sampler chain: requests with different prompts and seeds coincide")
    banned = sum(a["tokens"].count(7) for a, r in zip(alone, reqs) if "logit_bias" in r)
    check(banned == 0, f"sampler chain: the banned token 7 was drawn {banned} times")

    # Against a session's teacher-forced logits: the raw logprob and top alternatives of every
    # token, the entropy after bias and penalties (so the history the engine passed), and the
    # effective temperature of each mode.
    s = loom.Session(m2, n_ctx=512)
    sampler = loom.Sampler(V)
    replayed = 0  # tokens loom_sampler_run reproduces from the session's logits
    worst = {"logprob": 0.0, "entropy": 0.0, "temperature": 0.0}
    prompt_matters = 0  # steps whose penalties see prompt tokens (else the check proves little)
    for r, a in zip(reqs, alone):
        prompt, gen = r["tokens"], a["tokens"]
        s.reset()
        rows = s.decode(prompt + gen[:-1], all_logits=True)[len(prompt) - 1:]
        settings = {k: v for k, v in r.items() if k not in ("tokens", "max_tokens")}
        for j, (tok, info) in enumerate(zip(gen, a["info"])):
            # The public sampler with the same history, seed and draw index (the position).
            replayed += sampler.run(rows[j], prompt + gen[:j], len(prompt) + j,
                                    **settings) == info
            lp = log_softmax(rows[j])
            worst["logprob"] = max(worst["logprob"], abs(info["logprob_raw"] - lp[tok]))
            want_top = [int(t) for t in np.argsort(-lp, kind="stable")[:r["n_logprobs"]]]
            check([t for t, _ in info["top_raw"]] == want_top,
                  f"top_raw ids {info['top_raw']} != {want_top}")
            for t, v in info["top_raw"]:
                worst["logprob"] = max(worst["logprob"], abs(v - lp[t]))
            check(info["token"] == tok, "info token differs from the event's")
            if r["temperature"] == 0:
                check(tok == int(np.argmax(rows[j])) and info["logprob_final"] == 0
                      and info["n_candidates"] == 1, "greedy info is not a point mass")
                continue
            h = entropy(chain_logits(rows[j], prompt + gen[:j], r))
            prompt_matters += abs(entropy(chain_logits(rows[j], gen[:j], r)) - h) > 1e-6
            worst["entropy"] = max(worst["entropy"], abs(info["entropy"] - h) / max(h, 1))
            mode, t0 = r["entropy_mode"], r["temperature"]
            if mode == "edt":
                t = t0 * r["edt_n"] ** (r["edt_theta"] / max(h, 1e-3))
            elif mode == "exp":
                t = t0 * math.exp(r["exp_beta"] * h)
            else:
                n = int(np.isfinite(chain_logits(rows[j], prompt + gen[:j], r)).sum())
                t = r["dyn_t_min"] + (r["dyn_t_max"] - r["dyn_t_min"]) * min(h / math.log(n), 1)
            worst["temperature"] = max(worst["temperature"],
                                       abs(info["temperature"] - t) / max(t, 1e-30))
            check(0 < info["n_candidates"] <= V and info["logprob_final"] <= 1e-6,
                  f"final distribution: {info}")
    s.close()
    sampler.close()
    n_tokens = sum(len(a["tokens"]) for a in alone)
    print(f"loom_sampler_run over the session's logits: {replayed}/{n_tokens} tokens with the "
          f"engine's token and info")
    check(replayed == n_tokens, "loom_sampler_run does not replay the engine's draws")
    print(f"sampler chain vs float64 from session logits: max |logprob error| "
          f"{worst['logprob']:.2e}, entropy rel. error {worst['entropy']:.2e}, "
          f"temperature rel. error {worst['temperature']:.2e}; {prompt_matters} steps penalize "
          f"prompt tokens")
    check(worst["logprob"] <= 1e-5, f"raw logprobs off by {worst['logprob']:.2e}")
    check(worst["entropy"] <= 1e-5, f"entropy after bias/penalties off by {worst['entropy']:.2e}")
    check(worst["temperature"] <= 1e-4, f"effective temperature off by {worst['temperature']:.2e}")
    check(prompt_matters > 20, f"only {prompt_matters} steps depend on the prompt's penalties")

    # More alternatives on request: the engine's limit is a parameter.
    e = loom.Engine(m2, kv_bytes=64 << 20, max_logprobs=64)
    rid = e.submit(tokens=reqs[0]["tokens"], max_tokens=3, n_logprobs=64, temperature=1.0,
                   top_k=0, top_p=1.0)
    out = e.run()[rid][0]
    check(all(len(i["top_raw"]) == 64 and len(i["top_final"]) == 64 for i in out["info"]),
          "max_logprobs = 64 did not give 64 alternatives")
    e.close()
    try:
        loom.Engine(m2, kv_bytes=64 << 20, max_logprobs=-1)
        check(False, "max_logprobs = -1 was accepted")
    except loom.LoomError as err:
        check(err.name == "ERR_INVALID_ARG" and "max_logprobs" in str(err), f"{err}")
    m1.close()
    m2.close()


def generate_cli(path):
    """loom-generate (loom_generate over a session, its on_token_info callback) with the chain's
    flags draws what the engine draws for the same prompt and seed, and --logprobs prints it."""
    import re
    import subprocess
    exe = os.path.join(os.path.dirname(os.path.abspath(os.environ.get("LOOM_BIN_DIR", "."))),
                       "loom-generate")
    if not os.path.exists(exe):
        failures.append(f"{exe} missing: loom-generate's sampler flags were not checked")
        return
    flags = ["--temp", "0.9", "--top-k", "0", "--top-p", "0.9", "--min-p", "0.02", "--entropy",
             "edt", "--edt-theta", "1.0", "--repeat-penalty", "1.3", "--presence-penalty", "0.2",
             "--frequency-penalty", "0.1", "--penalty-last-n", "24", "--seed", "77"]
    backend = ["--backend", BACKEND] if BACKEND else []
    proc = subprocess.run([exe, "-m", path, "-p", "hello world", "-n", "12", "-t", "2",
                           "--logprobs", "3"] + backend + flags, capture_output=True,
                          encoding="utf-8", errors="replace", timeout=300)
    check(proc.returncode == 0, f"loom-generate exit {proc.returncode}: {proc.stderr[-500:]}")
    rows = re.findall(r"^\s*(\d+)\s+(\d+) \".*\"  logprob (\S+) / (\S+)  H (\S+) / (\S+)",
                      proc.stderr, re.M)
    model = loom.Model(path, n_threads=2)
    e = loom.Engine(model, kv_bytes=64 << 20)
    chain = dict(CHAIN, seed=77, n_logprobs=3)
    del chain["logit_bias"]  # no flag for it
    rid = e.submit(prompt="hello world", max_tokens=12, ignore_eos=False, **chain)
    out = e.run()[rid][0]
    e.close()
    model.close()
    got = [int(t) for _, t, *_ in rows]
    same_lp = all(abs(float(r[2]) - i["logprob_raw"]) < 1e-4 and
                  abs(float(r[4]) - i["entropy"]) < 1e-3 for r, i in zip(rows, out["info"]))
    print(f"loom-generate with the chain's flags: {len(got)} tokens, "
          f"{'the same as' if got == out['tokens'] else 'DIFFERENT FROM'} the engine's; "
          f"--logprobs table {'matches' if same_lp else 'DIFFERS'}")
    check(len(got) > 0 and got == out["tokens"], f"loom-generate drew {got}, the engine "
          f"{out['tokens']}")
    check(same_lp, "loom-generate --logprobs values differ from the engine's")
    bad = subprocess.run([exe, "-m", path, "-n", "2", "--top-p", "1.5"], capture_output=True,
                         encoding="utf-8", errors="replace", timeout=300)
    check(bad.returncode == 1 and "top_p" in bad.stderr,
          f"loom-generate --top-p 1.5: exit {bad.returncode}, {bad.stderr[-200:]!r}")


def background(model, V):
    """Background mode: the engine's own thread steps and calls back per event; submit and
    cancel come from this (another) thread."""
    import ctypes as C
    import threading
    import time
    done = threading.Event()
    got = {}
    lock = threading.Lock()
    finished = []

    @C.CFUNCTYPE(None, C.POINTER(loom.Event), C.c_void_p)
    def on_event(evp, user):
        ev = evp[0]
        with lock:
            if ev.kind == loom.EVENT_TOKEN:
                got.setdefault(ev.id, []).append(ev.token)
            else:
                finished.append(ev.id)
                if len(finished) == 4:
                    done.set()

    rng = np.random.default_rng(11)
    reqs = [dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 10 + 9 * k)], max_tokens=10)
            for k in range(4)]
    e = loom.Engine(model, kv_bytes=64 << 20, on_event=C.cast(on_event, C.c_void_p).value)
    ids = [e.submit(**r) for r in reqs]
    ok = done.wait(120)
    try:
        e.step()
        check(False, "step() in background mode succeeded")
    except loom.LoomError as err:
        check(err.name == "ERR_BUSY", f"step in background mode: {err}")
    e.close()
    check(ok, "background mode: requests did not finish within 120 s")
    same_n = sum(got.get(i) == run_alone(model, r)[0]["tokens"] for i, r in zip(ids, reqs))
    print(f"background mode: {same_n}/4 requests identical to running alone")
    check(same_n == 4, "background mode changed outputs")


def concurrent_submit(model, V):
    """submit and cancel from 4 threads while this thread steps: every request finishes once,
    ids are unique, nothing is lost or seen twice."""
    import threading
    e = loom.Engine(model, kv_bytes=64 << 20)
    ids, lock = [], threading.Lock()
    rng = np.random.default_rng(13)
    prompts = [[1] + [int(t) for t in rng.integers(3, V, 4 + k % 9)] for k in range(100)]

    def client(part):
        for k in range(part, 100, 4):
            rid = e.submit(tokens=prompts[k], max_tokens=3)
            if k % 10 == 0:
                try:
                    e.cancel(rid)
                except loom.LoomError:
                    pass  # it may have finished already
            with lock:
                ids.append(rid)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) or e.has_work():
        e.step()
    for t in threads:
        t.join()
    done = [i for i in ids if e.outputs.get(i, {}).get(0, {}).get("reason")]
    print(f"concurrent submit: {len(set(ids))} unique ids, {len(done)} finished")
    check(len(set(ids)) == 100 and len(done) == 100, "concurrent submit lost or repeated requests")
    e.close()


def sliding_window(path_dir):
    """A llama model with a 16-token sliding window: the KV manager releases blocks that left
    the window (table entries become -1) and the engine must still match a plain session,
    which keeps every block."""
    shape = synth_llama.SWA_SHAPE
    path = os.path.join(path_dir, "engine-swa.gguf")
    synth_llama.write_llama(path, shape)
    model = loom.Model(path, n_threads=2)
    rng = np.random.default_rng(5)
    reqs = [dict(tokens=[1] + [int(t) for t in rng.integers(3, shape.n_vocab, 30 + 20 * k)],
                 max_tokens=20) for k in range(6)]
    batch_invariance(model, reqs, "sliding window 16, 6 concurrent", kv_bytes=16 << 20,
                     max_batched_tokens=64, max_seqs=8)
    e = loom.Engine(model, kv_bytes=16 << 20)
    rid = e.submit(**reqs[5])
    got = e.run()[rid][0]["tokens"]
    e.close()
    s = loom.Session(model, n_ctx=256)
    lg = s.decode(reqs[5]["tokens"])
    want = []
    for _ in range(20):
        want.append(int(np.argmax(lg)))
        lg = s.decode([want[-1]])
    check(got == want, "sliding-window engine output differs from a session's")
    print(f"sliding window: engine {'matches' if got == want else 'DIFFERS FROM'} a session "
          "holding every block")
    model.close()


def gemma_engine(path):
    model = loom.Model(path, n_threads=2)
    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time",
               "List three fruits:", "The GNU General Public License is",
               "In 1969, astronauts", "Water boils at", "A haiku about rain:\n",
               "SELECT name FROM", "The quick brown fox", "Photosynthesis is",
               "Dear diary, today", "1, 2, 3, 4,", "To be or not to be", "Bonjour, je",
               "The largest planet in the solar system is"]
    reqs = [dict(prompt=p, max_tokens=6, temperature=0.0 if k % 2 == 0 else 0.8, seed=k)
            for k, p in enumerate(prompts)]
    batch_invariance(model, reqs, "gemma3 270M, 16 concurrent", kv_bytes=64 << 20, max_ctx=512)
    # Pool sizes at 64 MiB, block size 16: 3 global layers (49152 bytes a block) and 15 local
    # ones with window 512 (245760 bytes). With 64 sequences the local layers could use 2524
    # blocks, more than an equal split's 227, so both keep 227; with 4 sequences (and 512
    # tokens a step) they can use at most 204 and the global pool grows from 227 to 345.
    for kw, want in ((dict(max_ctx=512), 227), (dict(max_ctx=2048, max_seqs=4), 345),
                     (dict(max_ctx=2048, max_seqs=4, prefix_cache=False), 510)):
        c = sliding_cap(512, 16, kw.get("max_seqs", 64), 512, kw["max_ctx"],
                        kw.get("prefix_cache", True))
        check(full_blocks(64 << 20, 49152, 245760, c) == want, f"gemma3 formula {kw}")
        got = pool_blocks(model, kv_bytes=64 << 20, block_size=16, **kw)
        print(f"gemma3 270M, 64 MiB {kw}: global pool {got} blocks (equal split: 227)")
        check(got == want, f"gemma3 270M pools {kw}: {got}, want {want}")
    model.close()


# A Gemma-3-shaped synthetic model: five sliding-window layers (window 32) then one global
# layer, one KV head of 64, so a KV block of 16 tokens is 2048 bytes per layer and K or V.
GEMMA_SHAPE = dict(n_vocab=512, n_embd=128, n_head=2, n_head_kv=1, n_ff=256, n_layer=6,
                   n_ctx=512, window=32)


def write_gemma3(path, seed=77):
    s = GEMMA_SHAPE
    rng = np.random.default_rng(seed)
    D, F, hd = s["n_embd"], s["n_ff"], s["n_embd"] // s["n_head"]
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name("synthetic-gemma3")
    w.add_context_length(s["n_ctx"])
    w.add_embedding_length(D)
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(F)
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_sliding_window(s["window"])
    w.add_file_type(0)
    tokens, scores, types = synth_llama.spm_vocab(s["n_vocab"])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    # Tied output: logits have a spread of a few units (rows scaled by 0.3, times sqrt(D)).
    w.add_tensor("token_embd.weight",
                 (0.3 * rng.standard_normal((s["n_vocab"], D))).astype(np.float32))
    w.add_tensor("output_norm.weight", norm(D))
    for il in range(s["n_layer"]):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm(D))
        w.add_tensor(p + "attn_q.weight", mat(s["n_head"] * hd, D))
        w.add_tensor(p + "attn_k.weight", mat(s["n_head_kv"] * hd, D))
        w.add_tensor(p + "attn_v.weight", mat(s["n_head_kv"] * hd, D))
        w.add_tensor(p + "attn_q_norm.weight", norm(hd))
        w.add_tensor(p + "attn_k_norm.weight", norm(hd))
        w.add_tensor(p + "attn_output.weight", mat(D, s["n_head"] * hd))
        w.add_tensor(p + "post_attention_norm.weight", norm(D))
        w.add_tensor(p + "ffn_norm.weight", norm(D))
        w.add_tensor(p + "ffn_gate.weight", mat(F, D))
        w.add_tensor(p + "ffn_up.weight", mat(F, D))
        w.add_tensor(p + "ffn_down.weight", mat(D, F))
        w.add_tensor(p + "post_ffw_norm.weight", norm(D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _lib_get_group(e, g):
    """loom_engine_get_kv_group straight through the binding (bad-argument checks)."""
    info = loom.KvGroupInfo()
    loom._check(loom._lib.loom_engine_get_kv_group(e._h, g, loom.C.byref(info)))
    return info


def pool_blocks(model, **eng):
    """Group 0's pool (kv_blocks_total: full attention when the model has any)."""
    e = loom.Engine(model, **eng)
    e.step()  # the statistics are filled by a step, even an empty one
    n = e.stats()["kv_blocks_total"]
    e.close()
    return n


def sliding_cap(window, bs, max_seqs, tokens, max_ctx, prefix_cache=True):
    """engine_kv.c's formula: the most blocks a sliding group can have in use at once."""
    span, table = window + 2 * bs - 3, -(-max_ctx // bs)
    held = min((max_seqs * span + tokens) // bs, max_seqs * table)
    share = -(-max_seqs // 8) * min(span // bs, table) if prefix_cache else 0
    return held + max_seqs + share


def full_blocks(budget, full_bytes, slide_bytes, cap):
    """Blocks of the full group: the largest n with n * full + min(cap, n) * slide <= budget."""
    n = budget // (full_bytes + slide_bytes)
    return n if n <= cap else (budget - cap * slide_bytes) // full_bytes


def kv_sizing(path_dir, llama_model, llama_shape):
    """Per-group KV pools (see the module docstring)."""
    # One full-attention group (llama) and one sliding group (Mistral-style): as before.
    block = llama_shape.n_layer * 2 * 16 * llama_shape.n_head_kv * llama_shape.head_dim * 2
    for budget in (64 << 20, 3 << 20):
        got = pool_blocks(llama_model, kv_bytes=budget, max_seqs=4)
        check(got == budget // block, f"llama, {budget} bytes: {got} blocks, want "
                                      f"{budget // block}")
    swa = synth_llama.SWA_SHAPE
    swa_path = os.path.join(path_dir, "engine-swa.gguf")
    synth_llama.write_llama(swa_path, swa)
    m = loom.Model(swa_path, n_threads=1)
    block = swa.n_layer * 2 * 16 * swa.n_head_kv * swa.head_dim * 2
    got = pool_blocks(m, kv_bytes=16 << 20, max_seqs=4)
    check(got == (16 << 20) // block, f"sliding-only: {got} blocks, want {(16 << 20) // block}")
    m.close()

    path = os.path.join(path_dir, "engine-gemma3-synth.gguf")
    write_gemma3(path)
    model = loom.Model(path, n_threads=2)
    g, bs = GEMMA_SHAPE, 16
    per_layer = 2 * bs * g["n_head_kv"] * (g["n_embd"] // g["n_head"]) * 2  # K and V, f16
    full_b, slide_b = 1 * per_layer, 5 * per_layer
    eng = dict(block_size=bs, max_seqs=8, max_batched_tokens=64, max_ctx=256)
    cap = sliding_cap(g["window"], bs, 8, 64, 256)
    check(cap == 45, f"synthetic gemma3: sliding cap {cap}, want 45")
    budget = cap * slide_b + 64 * full_b  # the full group gets 64 blocks, an equal split 48
    got = pool_blocks(model, kv_bytes=budget, **eng)
    before = budget // (full_b + slide_b)
    print(f"synthetic gemma3, {budget} bytes: full-attention pool {got} blocks "
          f"(equal split: {before}); sliding pool {cap}")
    check(got == 64 and before == 48, f"synthetic gemma3: {got} full blocks, want 64")
    for b2, kw in ((4 << 20, {}), (4 << 20, dict(prefix_cache=False)), (1 << 20, {})):
        c2 = sliding_cap(g["window"], bs, 8, 64, 256, kw.get("prefix_cache", True))
        want = full_blocks(b2, full_b, slide_b, c2)
        got2 = pool_blocks(model, kv_bytes=b2, **eng, **kw)
        check(got2 == want, f"synthetic gemma3, {b2} bytes {kw}: {got2} blocks, want {want}")

    # The smallest budget: one request of max_ctx 256 needs 17 blocks in the full group (and
    # gets as many in the sliding one, under its cap); a byte less fails clearly.
    smallest = 17 * (full_b + slide_b)
    check(pool_blocks(model, kv_bytes=smallest, **eng) == 17, "smallest budget")
    try:
        loom.Engine(model, kv_bytes=smallest - 1, **eng)
        check(False, "a budget one byte too small was accepted")
    except loom.LoomError as err:
        check(err.name == "ERR_OUT_OF_MEMORY" and "max_ctx 256 needs 17" in str(err),
              f"too small a budget: {err}")

    # Many concurrent long requests on the budget above: prompts of 20 to 65 tokens that fit
    # at admission, then 120 or more generated tokens each (contexts far past the window), so
    # the full group binds (8 running want more than its 64 blocks) and requests are
    # preempted. The sliding pool, at its cap, must never run short (a short pool fails the
    # request), and every output must equal the request's output alone.
    rng = np.random.default_rng(11)
    reqs = [dict(tokens=[1] + [int(t) for t in rng.integers(3, g["n_vocab"], 20 + 3 * k)],
                 max_tokens=120 + k, temperature=0.0 if k % 2 == 0 else 0.8, seed=300 + k)
            for k in range(12)]
    alone = [run_alone(model, r, kv_bytes=budget, max_ctx=256)[0]["tokens"] for r in reqs]
    for mode, name in ((0, "recompute"), (1, "swap")):
        e = loom.Engine(model, kv_bytes=budget, preempt=mode, **eng)
        ids = [e.submit(**r) for r in reqs]
        peak, frag_peak = 0, 0.0
        while e.has_work():
            e.step()
            peak = max(peak, e.stats()["kv_blocks_used"])
            for k, gi in enumerate(e.kv_groups()):  # the per-group accounting adds up
                check(gi["blocks_total"] == gi["blocks_used"] + gi["blocks_cached"]
                      + gi["blocks_free"], f"gemma3 sizing, group {k}: counts {gi}")
                check(0 <= gi["slots_unused"] <= gi["blocks_used"] * (bs - 1) + bs,
                      f"gemma3 sizing, group {k}: {gi['slots_unused']} unused slots")
            full = e.kv_groups()[0]
            frag_peak = max(frag_peak, full["slots_unused"] / (full["blocks_total"] * bs))
        groups = e.kv_groups()
        check([(gi["window"], gi["n_layers"], gi["block_bytes"], gi["blocks_total"])
               for gi in groups] == [(0, 1, full_b, 64), (g["window"], 5, slide_b, cap)],
              f"gemma3 sizing, {name}: groups {groups}")
        check(groups[1]["window_releases"] > 0 and groups[0]["window_releases"] == 0,
              f"gemma3 sizing, {name}: window releases {groups}")
        check(all(gi["blocks_used"] == 0 and gi["slots_unused"] == 0 for gi in groups),
              f"gemma3 sizing, {name}: still in use at the end {groups}")
        print(f"synthetic gemma3, {name}: sliding pool released {groups[1]['window_releases']} "
              f"blocks; internal fragmentation peaked at {100 * frag_peak:.2f}% of the full pool")
        try:
            e.kv_groups_bad = _lib_get_group(e, 2)
            check(False, "KV group 2 of 2 was accepted")
        except loom.LoomError as err:
            check(err.name == "ERR_INVALID_ARG", f"KV group 2: {err}")
        st = e.stats()
        out = e.outputs
        e.close()
        n_same = sum(out[i][0]["tokens"] == a for i, a in zip(ids, alone))
        n = len(reqs)
        reasons = {out[i][0]["reason"] for i in ids}
        print(f"synthetic gemma3, {n} long requests, preempt by {name}: {n_same}/{n} identical "
              f"to alone; {st['preemptions']} preemptions; full pool peak {peak}/"
              f"{st['kv_blocks_total']}; finish reasons {sorted(reasons)}")
        check(reasons == {"length"}, f"gemma3 sizing, {name}: finish reasons {reasons}")
        check(n_same == n, f"gemma3 sizing, {name}: {n - n_same} requests differ")
        check(st["preemptions"] > 0, f"gemma3 sizing, {name}: no preemption happened")
        check(peak >= 64 - 17, f"gemma3 sizing, {name}: the full pool peaked at {peak}")
        check(st["kv_blocks_used"] == 0, f"gemma3 sizing, {name}: blocks still used")

    # n = 4 samples of a prompt three windows long: samples 1-3 start from sample 0's cached
    # blocks, which in the sliding group are the last window's only (the rest was released).
    prompt = [1] + [int(t) for t in rng.integers(3, g["n_vocab"], 99)]
    e = loom.Engine(model, kv_bytes=budget, **eng)
    rid = e.submit(tokens=prompt, n=4, max_tokens=20, temperature=1.0, seed=5)
    out = e.run()[rid]
    e.close()
    one = run_alone(model, dict(tokens=prompt, max_tokens=20, temperature=1.0, seed=5),
                    kv_bytes=budget, max_ctx=256)[0]
    hits = [out[k]["cached_tokens"] for k in range(1, 4)]
    print(f"synthetic gemma3, n = 4 on a 100-token prompt: samples 1-3 reused {hits} tokens")
    check(hits == [96, 96, 96], f"gemma3 sizing, n = 4: prefix hits {hits}, want 96 each")
    check(out[0]["tokens"] == one["tokens"], "gemma3 sizing: sample 0 of n = 4 differs")
    model.close()


def trace_records(trace):
    import json
    recs = [json.loads(line) for line in trace.to_string("jsonl").splitlines()]
    return ([r for r in recs if r["type"] == "step"], [r for r in recs if r["type"] == "token"])


def nearest_rank(values, q):
    v = sorted(values)
    return v[max(1, math.ceil(q * len(v))) - 1] if v else 0.0


def statistics(model, V):
    """loom_engine_stats' latency and throughput figures against the trace and the clock."""
    import time
    e0 = loom.Engine(model, kv_bytes=64 << 20)
    st0 = e0.stats()
    check(all(st0[k] == 0 for k in ("ttft_count", "ttft_mean_s", "tpot_count", "tpot_p99_s",
                                    "busy_s", "tokens_per_s", "tokens_per_s_recent")),
          f"a new engine's latency/rate figures are not 0: {st0}")
    e0.close()

    rng = np.random.default_rng(17)
    reqs = [dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 3 + 13 * k % 61)],
                 max_tokens=4 + 3 * k % 17, temperature=0.8 if k % 3 else 0.0, seed=k)
            for k in range(14)]
    reqs[3]["n"] = 3          # TPOT over three samples
    reqs[5]["max_tokens"] = 1  # a first token, no TPOT
    trace = loom.Trace()
    # A small batch: more steps than the recent-rate window holds.
    e = loom.Engine(model, trace=trace, kv_bytes=64 << 20, max_batched_tokens=16, max_seqs=3)
    t0 = time.monotonic()
    ids = [e.submit(**r) for r in reqs]
    cancelled = False
    while e.has_work():
        e.step()
        if not cancelled and len(e.outputs[ids[11]].get(0, {}).get("tokens", [])) >= 2:
            e.cancel(ids[11])  # cancelled after its first tokens: still counted
            cancelled = True
    elapsed = time.monotonic() - t0
    st = e.stats()
    e_outputs = e.outputs
    e.close()
    steps, tokens = trace_records(trace)
    trace.close()

    streams = {}
    for t in tokens:
        streams.setdefault(t["request"], {}).setdefault(t["sample"], []).append(t)
    ttft = [min(s[0]["since_arrival_ns"] for s in smp.values()) * 1e-9
            for smp in streams.values()]
    tpot = []
    for smp in streams.values():
        span = sum(s[-1]["t_ns"] - s[0]["t_ns"] for s in smp.values() if len(s) >= 2)
        n = sum(len(s) - 1 for s in smp.values() if len(s) >= 2)
        if n:
            tpot.append(span * 1e-9 / n)
    busy_ns = sum(s["dur_ns"] for s in steps)
    per_step = {}
    for t in tokens:
        per_step[t["step"]] = per_step.get(t["step"], 0) + 1
    recent = steps[-loom.RATE_WINDOW:]
    recent_rate = sum(per_step.get(s["step"], 0) for s in recent) / \
        (sum(s["dur_ns"] for s in recent) * 1e-9)
    want = {"ttft_count": len(ttft), "ttft_mean_s": sum(ttft) / len(ttft),
            "ttft_p50_s": nearest_rank(ttft, 0.5), "ttft_p99_s": nearest_rank(ttft, 0.99),
            "tpot_count": len(tpot), "tpot_mean_s": sum(tpot) / len(tpot),
            "tpot_p50_s": nearest_rank(tpot, 0.5), "tpot_p99_s": nearest_rank(tpot, 0.99),
            "busy_s": busy_ns * 1e-9, "tokens_per_s": len(tokens) / (busy_ns * 1e-9),
            "tokens_per_s_recent": recent_rate}
    off = {k: (st[k], v) for k, v in want.items() if abs(st[k] - v) > 1e-9 * max(abs(v), 1e-9)}
    print(f"statistics: {len(reqs)} requests, {st['steps']} steps; TTFT mean "
          f"{st['ttft_mean_s'] * 1e3:.1f} ms p50 {st['ttft_p50_s'] * 1e3:.1f} p99 "
          f"{st['ttft_p99_s'] * 1e3:.1f}; TPOT mean {st['tpot_mean_s'] * 1e3:.2f} ms p50 "
          f"{st['tpot_p50_s'] * 1e3:.2f} p99 {st['tpot_p99_s'] * 1e3:.2f}; "
          f"{st['tokens_per_s']:.0f} tokens/s over {st['busy_s'] * 1e3:.0f} ms busy of "
          f"{elapsed * 1e3:.0f} ms, recent {st['tokens_per_s_recent']:.0f}; "
          f"{'equal to' if not off else 'DIFFERENT FROM'} the trace's figures")
    check(not off, f"statistics differ from the trace's: {off}")
    check(cancelled and e_outputs[ids[11]][0]["reason"] == "cancelled",
          "the request to cancel finished first")
    check(st["ttft_count"] == len(reqs) and st["tpot_count"] == len(reqs) - 1,
          f"ttft_count {st['ttft_count']}, tpot_count {st['tpot_count']}")
    check(0 < st["ttft_p50_s"] <= st["ttft_p99_s"] <= elapsed and
          0 < st["tpot_p50_s"] <= st["tpot_p99_s"] <= elapsed, "latency figures implausible")
    check(st["tokens_generated"] == len(tokens), "tokens_generated differs from the trace")
    check(0.5 * elapsed <= st["busy_s"] <= elapsed,
          f"busy {st['busy_s']:.3f} s of {elapsed:.3f} s stepping")
    check(abs(st["tokens_per_s"] - st["tokens_generated"] / st["busy_s"]) <=
          1e-9 * st["tokens_per_s"], "tokens_per_s is not tokens_generated / busy_s")
    wall_rate = st["tokens_generated"] / elapsed
    check(wall_rate <= st["tokens_per_s"] <= 2 * wall_rate,
          f"tokens/s {st['tokens_per_s']:.0f} vs {wall_rate:.0f} over the wall clock")


def first_token_order(model, reqs, **eng):
    """Submits reqs (in order) to an engine serving one sequence at a time; returns the indices
    of reqs in the order of their first tokens, the stats and the trace's token records."""
    trace = loom.Trace()
    e = loom.Engine(model, trace=trace, kv_bytes=32 << 20, max_seqs=1, max_batched_tokens=64,
                    **eng)
    ids = [e.submit(**r) for r in reqs]
    order = []
    while e.has_work():
        for ev in e.step():
            if ev["kind"] == loom.EVENT_TOKEN and ids.index(ev["id"]) not in order:
                order.append(ids.index(ev["id"]))
    st = e.stats()
    e.close()
    _, tokens = trace_records(trace)
    trace.close()
    return order, st, tokens


def arrival(model, V):
    rng = np.random.default_rng(23)
    a = dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 9)], max_tokens=4)
    b = dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 12)], max_tokens=4)
    order, _, _ = first_token_order(model, [a, b])
    check(order == [0, 1], f"arrival: without arrival_s the submit order should hold: {order}")
    for policy in ({}, {"fcfs": True}):
        now = loom.engine_now()
        order, st, tokens = first_token_order(model, [dict(a, arrival_s=now - 0.4),
                                                      dict(b, arrival_s=now - 0.8)], **policy)
        first_b = min(t["since_arrival_ns"] for t in tokens if t["request"] == 2)
        print(f"arrival_s ({'fcfs' if policy else 'priority'}): first tokens in order "
              f"{['a', 'b'][order[0]]}, {['a', 'b'][order[1]]}; TTFT p50 "
              f"{st['ttft_p50_s']:.3f} s; b's first token {first_b * 1e-9:.3f} s after arrival")
        check(order == [1, 0], f"arrival_s: submitted a, b arriving b, a: served {order}")
        check(st["ttft_count"] == 2 and st["ttft_p50_s"] >= 0.4 and st["ttft_mean_s"] >= 0.6,
              f"arrival_s: TTFT does not count from the arrival: {st['ttft_mean_s']}")
        check(first_b >= 0.8e9, "arrival_s: the trace's since_arrival_ns ignores it")
    # The TTFT deadline runs from the arrival: b (deadline 0.3 s from its submit) goes first,
    # unless a arrived 1 s ago with 3 s (so it is due in 2 s, before b's 3 s).
    order, _, _ = first_token_order(model, [dict(b, ttft_deadline_s=0.3),
                                            dict(a, ttft_deadline_s=0.5)])
    check(order == [0, 1], f"deadlines from submit: {order}")
    order, _, _ = first_token_order(model, [dict(b, ttft_deadline_s=3.0),
                                            dict(a, ttft_deadline_s=3.0,
                                                 arrival_s=loom.engine_now() - 1.0)])
    check(order == [1, 0], f"arrival_s: the TTFT deadline does not count from it: {order}")
    # A request already past its deadline (a: 0.5 s, arrived 1 s ago) yields to one that can
    # still meet its own (b): serving the overdue first would make both late.
    order, _, _ = first_token_order(model, [dict(b, ttft_deadline_s=3.0),
                                            dict(a, ttft_deadline_s=0.5,
                                                 arrival_s=loom.engine_now() - 1.0)])
    check(order == [0, 1], f"an overdue request went before one that can still make it: {order}")

    e = loom.Engine(model, kv_bytes=32 << 20)
    for bad in (float("nan"), float("inf"), -1.0, loom.engine_now() + 10):
        try:
            e.submit(**dict(a, arrival_s=bad))
            check(False, f"arrival_s {bad} was accepted")
        except loom.LoomError as err:
            check(err.name == "ERR_INVALID_ARG" and "arrival_s" in str(err),
                  f"arrival_s {bad}: {err}")
    ok = e.submit(**dict(a, arrival_s=loom.engine_now() + 0.0005))  # within the slack
    out = e.run()[ok][0]
    check(out["reason"] == "length", "an arrival within the slack did not run")
    e.close()


def admission(model, V):
    """Admission control through the binding: predict_ttft before and after a step, a
    reject_late engine refusing a request it predicts late with ERR_OVERLOADED (nothing
    queued), and the per-class figures."""
    rng = np.random.default_rng(29)
    req = dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 15)], max_tokens=3)
    e = loom.Engine(model, kv_bytes=1 << 22, max_seqs=2, max_batched_tokens=16,
                    admission="reject_late")
    check(e.predict_ttft(**req) == -1.0, "predict_ttft before any step should be -1")
    e.submit(**req)
    while e.has_work():
        e.step()
    t = e.predict_ttft(**req)
    check(t > 0, f"predict_ttft after a step: {t}")
    for _ in range(4):
        e.submit(**dict(req, priority=1))
    try:
        e.submit(**dict(req, priority=1, ttft_deadline_s=1e-6))
        check(False, "reject_late admitted a request predicted late")
    except loom.LoomError as err:
        check(err.status == 14, f"reject_late: status {err.status}, not ERR_OVERLOADED")
    ok = e.submit(**dict(req, priority=1, ttft_deadline_s=1e6))
    while e.has_work():
        e.step()
    st, cs = e.stats(), e.class_stats(1)
    print(f"admission: predicted TTFT {t * 1e3:.2f} ms on an idle engine; class 1: {cs['admitted']}"
          f" admitted, {cs['rejected']} rejected, {cs['ttft_met']}/{cs['ttft_deadlines']} deadlines"
          f" met; step cost {st['step_base_s'] * 1e3:.3f} ms + {st['step_per_token_s'] * 1e3:.3f}"
          f" ms/token")
    check(st["rejected"] == 1 and cs["rejected"] == 1 and cs["admitted"] == 5,
          f"admission counts: {st['rejected']} {cs}")
    check(cs["ttft_deadlines"] == 1 and cs["ttft_met"] == 1, f"class deadlines: {cs}")
    check(ok in e.outputs, "the admitted request has no output")
    e.close()


def engine_generate(model, V, gemma_path=None):
    rng = np.random.default_rng(29)
    req = dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 30)], max_tokens=14,
               temperature=0.8, seed=7, n_logprobs=2)
    other = dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 50)], max_tokens=24,
                 temperature=0.0)
    alone = run_alone(model, req, kv_bytes=32 << 20)[0]
    other_alone = run_alone(model, other, kv_bytes=32 << 20)[0]

    e = loom.Engine(model, kv_bytes=32 << 20)
    oid = e.submit(**other)
    seen = []
    g = e.generate(on_event=seen.append, **req)
    same = (g["tokens"] == alone["tokens"] and g["text"] == alone["text"] and
            g["reason"] == alone["reason"])
    ids_seen = {ev["id"] for ev in seen}
    check(same, f"engine_generate: {g} differs from the step-driven {alone['tokens']}")
    check(ids_seen == {oid, g["id"]}, f"engine_generate: events of {ids_seen} reached on_event")
    got_other = len(e.outputs[oid][0]["tokens"])
    e.run()
    check(e.outputs[oid][0]["tokens"] == other_alone["tokens"],
          "engine_generate: the request beside it changed")
    print(f"engine_generate: {len(g['tokens'])} tokens, reason {g['reason']}, "
          f"{'the same as' if same else 'DIFFERENT FROM'} the step-driven path; the other "
          f"request got {got_other} tokens meanwhile, through on_event")

    # Without a callback, other requests still run (their events are not recorded).
    g2 = e.generate(**dict(req, max_tokens=1))
    check(g2["tokens"] == alone["tokens"][:1] and g2["reason"] == "length",
          f"engine_generate max_tokens=1: {g2}")
    # A stop string taken from the output: the text stops before it.
    text = alone["text"]
    cut = next((k for k in range(4, len(text) - 2) if all(32 < c < 127 for c in text[k:k + 2])
                and text[:k].find(text[k:k + 2]) < 0), None)
    check(cut is not None, f"no printable stop string in {text!r}")
    if cut is not None:
        g3 = e.generate(**dict(req, stop=[text[cut:cut + 2].decode()]))
        check(g3["text"] == text[:cut] and g3["reason"] == "stop_string",
              f"engine_generate with a stop string: {g3['text']!r} / {text[:cut]!r}")
    for kw, want in ((dict(req, n=2), "ERR_INVALID_ARG"),
                     (dict(req, tokens=[1, V + 3]), "ERR_BAD_INPUT"),
                     (dict(req, max_tokens=0), "ERR_INVALID_ARG")):
        try:
            e.generate(**kw)
            check(False, f"engine_generate {kw} succeeded")
        except loom.LoomError as err:
            check(err.name == want, f"engine_generate {kw}: {err}")
    e.close()

    import ctypes as C
    noop = loom.EVENT_FN(lambda ev, user: None)
    bg = loom.Engine(model, kv_bytes=32 << 20, on_event=C.cast(noop, C.c_void_p).value)
    try:
        bg.generate(**req)
        check(False, "engine_generate in background mode succeeded")
    except loom.LoomError as err:
        check(err.name == "ERR_BUSY", f"engine_generate in background mode: {err}")
    bg.close()

    if gemma_path:
        m = loom.Model(gemma_path, n_threads=2)
        e = loom.Engine(m, kv_bytes=64 << 20, max_ctx=512)
        # Two full blocks of prompt: the second run finds them in the prefix cache.
        r = dict(prompt="The capital of France is Paris, the capital of Germany is Berlin, and "
                        "the capital of Italy is", max_tokens=6, ignore_eos=False)
        rid = e.submit(**r)
        stepped = e.run()[rid][0]
        g = e.generate(**r)
        check(g["tokens"] == stepped["tokens"] and g["text"] == stepped["text"],
              f"gemma3 engine_generate {g} vs {stepped}")
        check(g["cached_tokens"] >= 16,
              f"gemma3 engine_generate: the second run reused {g['cached_tokens']} tokens")
        print(f"engine_generate on gemma3: {g['text']!r} ({g['reason']}), as stepped")
        e.close()
        m.close()


def main():
    os.makedirs(TMP, exist_ok=True)
    shape = synth_llama.SHAPES[0]  # MHA, separate output: logits spread enough to sample
    path = os.path.join(TMP, "engine-mha.gguf")
    synth_llama.write_llama(path, shape)
    model = loom.Model(path, n_threads=2)
    synthetic(model, shape)
    sampler_chain(path, shape)
    generate_cli(path)
    background(model, shape.n_vocab)
    concurrent_submit(model, shape.n_vocab)
    statistics(model, shape.n_vocab)
    arrival(model, shape.n_vocab)
    admission(model, shape.n_vocab)
    gemma = gemma_path("the real-model engine checks")
    engine_generate(model, shape.n_vocab, gemma)
    sliding_window(TMP)
    kv_sizing(TMP, model, shape)
    model.close()
    if gemma:
        gemma_engine(gemma)
    else:
        failures.append("gemma3 package missing: the real-model engine test did not run")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("engine: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
