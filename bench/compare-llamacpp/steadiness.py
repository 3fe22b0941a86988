#!/usr/bin/env python3
"""steadiness.py — how much one-sequence decode varies from run to run, loom beside llama.cpp.

compare.py's ratios hide the spread behind medians; this runs the decode measurement alone, many
times, the two sides alternated (A B A B) in one process on the same file, threads and token
ids, and prints for each side the distribution of tokens/s over the runs: min, quartiles, max,
and the coefficient of variation. With --hog K, K busy loops (other processes, one each) run the
whole time, as neighbours on a shared VM do: with two vCPUs and one hog, one of each side's two
compute threads has to share a CPU. --duty F --period P makes each hog busy for F x P seconds
of every P and asleep for the rest, as a neighbour compiling or testing in bursts is.

  .venv/bin/python bench/compare-llamacpp/steadiness.py --models q4_k_m,q8_0 --runs 20
  .venv/bin/python bench/compare-llamacpp/steadiness.py --models q4_k_m --runs 20 --hog 1
  .venv/bin/python bench/compare-llamacpp/steadiness.py --models q4_k_m --hog 1 --duty 0.3

Uses compare.py's model cache and its two sides (LoomSide, LlamaSide).
"""
import argparse
import multiprocessing as mp
import os
import statistics as st
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(HERE, "..", "..", "python"))

import numpy as np  # noqa: E402

import compare  # noqa: E402


def hog(stop_at, duty, period):
    """Busy for duty x period seconds, asleep for the rest, until stop_at (duty 1: always)."""
    while time.time() < stop_at:
        t0 = time.time()
        while time.time() - t0 < duty * period:
            pass
        if duty < 1:
            time.sleep((1 - duty) * period)


def quantiles(xs):
    xs = sorted(xs)
    q = st.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return xs[0], q[0], q[1], q[2], xs[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="q4_k_m,q8_0")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--hog", type=int, default=0, help="busy loops running beside")
    ap.add_argument("--duty", type=float, default=1.0,
                    help="fraction of each --period a hog is busy (a bursty neighbour)")
    ap.add_argument("--period", type=float, default=0.05, help="a hog's cycle, seconds")
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/loom-bench"))
    ap.add_argument("--md", help="also write the table as markdown to this file")
    a = ap.parse_args()

    names = a.models.split(",")
    paths = compare.model_paths(names, a.cache_dir, lambda m: print(m, file=sys.stderr))
    hogs = [mp.Process(target=hog, args=(time.time() + 24 * 3600, a.duty, a.period)) for _ in range(a.hog)]
    for h in hogs:
        h.start()
    rows = []
    load0 = os.getloadavg()
    try:
        for name in names:
            sides = [compare.LoomSide(paths[name], a.threads, 512, 128, 1, engine=False),
                     compare.LlamaSide(paths[name], a.threads, 512, 128, 1)]
            rng = np.random.default_rng(compare.SEED)
            prompt = compare.token_ids(rng, 16, sides[0].n_vocab)
            ids = compare.token_ids(rng, a.tg, sides[0].n_vocab)
            for s in sides:  # warm-up: page the weights in
                s.decode(prompt, ids[:8])
            got = {s.name: [] for s in sides}
            for r in range(a.runs):
                for s in (sides if r % 2 == 0 else sides[::-1]):
                    got[s.name].append(s.decode(prompt, ids))
            for s in sides:
                xs = got[s.name]
                lo, q1, med, q3, hi = quantiles(xs)
                cv = st.pstdev(xs) / st.mean(xs)
                rows.append((name, s.name, lo, q1, med, q3, hi, cv))
                print(f"{name} {s.name}: min {lo:.1f} q1 {q1:.1f} median {med:.1f} q3 {q3:.1f} "
                      f"max {hi:.1f} tok/s, cv {100 * cv:.1f}%", file=sys.stderr)
            for s in sides:
                s.close()
    finally:
        for h in hogs:
            h.terminate()
    load1 = os.getloadavg()
    lines = [f"- {a.runs} runs of decode {a.tg} per side, alternated; {a.threads} threads; "
             f"{a.hog} busy loop(s) beside (busy {100 * a.duty:.0f}% of each "
             f"{1000 * a.period:.0f} ms); load average at start {load0[0]:.2f}, at end "
             f"{load1[0]:.2f}", "",
             "| model | side | min | q1 | median | q3 | max | cv |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, side, lo, q1, med, q3, hi, cv in rows:
        lines.append(f"| {name} | {side} | {lo:.1f} | {q1:.1f} | {med:.1f} | {q3:.1f} | "
                     f"{hi:.1f} | {100 * cv:.1f}% |")
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
