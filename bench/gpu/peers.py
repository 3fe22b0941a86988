"""peers.py — the same work as loom-gpu-bench's, done by PyTorch on the same GPU in the same run,
and the table bench/gpu/check.sh commits.

Reads loom-gpu-bench's JSON lines (argv[1]); for each matmul shape times torch.matmul on bf16
(cuBLAS), for each attention shape torch's scaled_dot_product_attention with the flash backend
(bf16, GQA through enable_gqa), each the median of 25 CUDA-event timings after warm-up with
inputs rotated past the L2. Then, time allowing (--hf-seconds), Hugging Face transformers
generating with a randomly initialised Llama-3-8B-shaped model (bf16, static cache, no
download). Prints Markdown: ratios are peer time / loom time (above 1: loom is faster)."""
import json
import sys
import time

import torch

RUNS = 25


def cuda_time(fn, copies, reps=10):
    """Median seconds per call: each of RUNS timings queues reps calls between two events (as
    loom-gpu-bench queues reps calls per synchronisation), so Python's dispatch overlaps the
    GPU's work instead of adding to one call's time."""
    for i in range(3):
        fn(i % copies)
    torch.cuda.synchronize()
    ts = []
    c = 0
    for r in range(RUNS):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn(c % copies)
            c += 1
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3 / reps)
    ts.sort()
    return ts[RUNS // 2]


def copies_for(nbytes):
    return max(1, min(8, (200 << 20) // max(1, nbytes) + 1))


def torch_matmul(k, n, t):
    nbytes = k * n * 2
    c = copies_for(nbytes)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(c)]
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    return cuda_time(lambda i: torch.matmul(x, ws[i].t()), c)


def torch_attention(batch, ctx, new_rows, n_head, n_kv, hd):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kvb = 2 * batch * n_kv * ctx * hd * 2
    c = copies_for(kvb)
    ks = [torch.randn(batch, n_kv, ctx, hd, device="cuda", dtype=torch.bfloat16) for _ in range(c)]
    vs = [torch.randn(batch, n_kv, ctx, hd, device="cuda", dtype=torch.bfloat16) for _ in range(c)]
    q = torch.randn(batch, n_head, new_rows, hd, device="cuda", dtype=torch.bfloat16)
    causal = new_rows > 1
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel(backend):
                f = lambda i: torch.nn.functional.scaled_dot_product_attention(
                    q, ks[i], vs[i], is_causal=causal, enable_gqa=True)
                f(0)
                return cuda_time(f, c), str(backend).split(".")[-1].lower()
        except RuntimeError:
            continue
    return float("nan"), "none"


def hf_generate(seconds):
    """Decode tokens/s of transformers generating with a random Llama-3-8B-shaped model."""
    from transformers import LlamaConfig, LlamaForCausalLM
    t0 = time.time()
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=8192, rope_theta=500000.0)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 16), device="cuda")
    out = {}
    # Each length run twice, the second timed: a static cache's set-up (and any compilation
    # transformers does for it) is paid in the first.
    for new in (8, 72):
        for timed in (False, True):
            if time.time() - t0 > seconds:
                return None
            torch.cuda.synchronize()
            a = time.time()
            model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           cache_implementation="static")
            torch.cuda.synchronize()
            if timed:
                out[new] = time.time() - a
    # the difference of a long and a short run: 64 decode steps, prefill and set-up cancelled
    d = out[72] - out[8]
    return 64.0 / d if d > 0 else None


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
    hf_seconds = float(sys.argv[sys.argv.index("--hf-seconds") + 1]) if "--hf-seconds" in sys.argv else 0
    ceil = {r["name"]: r for r in rows if r["kind"] == "ceiling"}
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}\n")
    print("| ceiling | measured |\n|---|---:|")
    if "d2d copy" in ceil:
        print(f"| device-to-device copy (read + write) | {ceil['d2d copy']['gbs_rw']:.0f} GB/s |")
    if "cublas bf16 gemm" in ceil:
        print(f"| cuBLAS BF16 GEMM 8192³ | {ceil['cublas bf16 gemm']['tflops']:.0f} TFLOP/s |")
    print("\nBandwidth % is of the copy's read+write rate (the memory's whole bandwidth, which a "
          "kernel that only reads can use for reads); TFLOP/s % is of the cuBLAS GEMM. torch "
          "runs bf16 weights (cuBLAS) and bf16 K/V (flash SDPA) whatever loom's type: for the "
          "quantized rows the ratio compares loom's kernel with the bf16 work it replaces.\n")
    print("| kernel | shape | loom µs | loom | % of ceiling | torch µs (bf16) | torch/loom |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("mode") in ("fast", "wgmma-regs") or r.get("blocks") == "shuffled":
            continue  # the fast mode's rows, the shuffled and register tiles': tables below
        m16 = {"bf16-math": " (bf16 math)", "wgmma": " (bf16 math, wgmma)"}.get(r.get("mode"), "")
        if r["kind"] == "matmul":
            peer = torch_matmul(r["k"], r["n"], r["t"])
            big = r["t"] > 16
            what = f"{r['tflops']:.1f} TFLOP/s" if big else f"{r['gbs']:.0f} GB/s"
            pct = r["pct_gemm"] if big else r["pct_bw"]
            print(f"| matmul {r['type']}{m16} | K={r['k']} N={r['n']} T={r['t']} | {r['s']*1e6:.1f} | "
                  f"{what} | {pct:.0f}% | {peer*1e6:.1f} | {peer / r['s']:.2f} |")
        elif r["kind"] == "attention":
            peer, be = torch_attention(r["batch"], r["ctx"], r["new_rows"], r["n_head"], r["n_kv"],
                                       r["hd"])
            kind = "decode" if r["new_rows"] == 1 else "prefill"
            big = r["new_rows"] > 1
            what = f"{r['tflops']:.1f} TFLOP/s" if big else f"{r['gbs']:.0f} GB/s"
            pct = 100.0 * r["tflops"] / ceil["cublas bf16 gemm"]["tflops"] if big else r["pct_bw"]
            print(f"| attention {kind}{m16} ({r.get('kv', 'f16')} pages; torch {be}, bf16) | "
                  f"B={r['batch']} ctx={r['ctx']} "
                  f"rows={r['new_rows']} H={r['n_head']}/{r['n_kv']} hd={r['hd']} | "
                  f"{r['s']*1e6:.1f} | {what} | {pct:.0f}% | {peer*1e6:.1f} | {peer / r['s']:.2f} |")
        sys.stdout.flush()
    # FP8 pages against F16 pages on the same decode shape (goal: >= 1.6x at >= 8k positions)
    att = [r for r in rows if r["kind"] == "attention" and r["new_rows"] == 1]
    key = lambda r: (r["batch"], r["ctx"], r["n_head"], r["n_kv"], r["hd"])
    f16 = {key(r): r for r in att if r.get("kv", "f16") == "f16"}
    pairs = [(r, f16[key(r)]) for r in att if r.get("kv") == "fp8_e4m3" and key(r) in f16]
    if pairs:
        print("\n| decode attention, FP8 E4M3 pages vs F16 pages | F16 µs | FP8 µs | FP8 speed-up |")
        print("|---|---:|---:|---:|")
        for r8, r16 in pairs:
            print(f"| B={r8['batch']} ctx={r8['ctx']} H={r8['n_head']}/{r8['n_kv']} hd={r8['hd']} "
                  f"| {r16['s']*1e6:.1f} | {r8['s']*1e6:.1f} | {r16['s'] / r8['s']:.2f}x |")
    # a matmul or attention row's shape, as the comparison tables name it
    what = lambda r: (f"matmul {r['type']} K={r['k']} N={r['n']} T={r['t']}" if r["kind"] == "matmul"
                      else f"attention B={r['batch']} ctx={r['ctx']} rows={r['new_rows']} "
                           f"hd={r['hd']} {r.get('kv', 'f16')} pages")
    shape = lambda r: (r["kind"], r.get("type"), r.get("k"), r.get("n"), r.get("t"), r.get("batch"),
                       r.get("ctx"), r.get("new_rows"), r.get("n_head"), r.get("hd"), r.get("kv"),
                       r.get("blocks"))
    # the cost of batch invariance (the default) against LOOM_CUDA_BATCH_INVARIANT=0, same shapes
    inv = {shape(r): r for r in rows if r.get("mode") == "invariant"}
    fast = [(r, inv[shape(r)]) for r in rows if r.get("mode") == "fast" and shape(r) in inv]
    if fast:
        print("\n| batch invariance's cost (default vs LOOM_CUDA_BATCH_INVARIANT=0) | default "
              "kernel, µs | fast kernel, µs | default / fast |")
        print("|---|---:|---:|---:|")
        for rf, ri in fast:
            print(f"| {what(rf)} | {ri['kernel']} {ri['s']*1e6:.1f} | {rf['kernel']} {rf['s']*1e6:.1f} "
                  f"| {ri['s'] / rf['s']:.2f} |")
    def speedup(title, base_mode, base_label, new_mode, new_label):
        """new_mode's rows against base_mode's of the same shape: each one's µs, base / new."""
        base = {shape(r): r for r in rows if r.get("mode") == base_mode}
        pairs = [(r, base[shape(r)]) for r in rows if r.get("mode") == new_mode and shape(r) in base]
        if not pairs:
            return
        print(f"\n| {title} | {base_label} µs | {new_label} µs | speed-up |")
        print("|---|---:|---:|---:|")
        for rn, rb in pairs:
            print(f"| {what(rn)} | {rb['s']*1e6:.1f} | {rn['s']*1e6:.1f} | {rb['s'] / rn['s']:.2f}x |")
    # BF16 math (LOOM_CUDA_MATH=bf16) against the default's float32 accuracy, same shapes
    speedup("BF16 math (LOOM_CUDA_MATH=bf16) vs the default (float32 accuracy)", "invariant",
            "default", "bf16-math", "bf16 math")
    # the wgmma kernels (LOOM_CUDA_WGMMA=1) against the mma.sync ones, both in BF16 math
    speedup("BF16 math: wgmma vs mma.sync", "bf16-math", "mma.sync", "wgmma", "wgmma")
    # the wgmma attention warp-specialised (the default) against its register path
    speedup("wgmma attention: warp-specialised, a producer warpgroup's cp.async into a ring of "
            "stages (default), vs through registers (LOOM_CUDA_ATTN_ASYNC=0)", "wgmma-regs",
            "registers", "wgmma", "warp-specialised")
    # the wgmma GEMM over BF16 weights warp-specialised (the default) against its block's own
    # warps copying two chunks ahead
    speedup("wgmma GEMM, BF16 weights: warp-specialised (default) vs copies from its own warps "
            "(LOOM_CUDA_GEMM_WS=0)", "wgmma-plain", "own warps", "wgmma", "warp-specialised")
    # ... and its producer's copies: one thread's TMA (the default) against 128 threads' cp.async
    speedup("wgmma GEMM, BF16 weights, warp-specialised: TMA copies (default) vs cp.async "
            "(LOOM_CUDA_GEMM_TMA=0)", "wgmma-cp", "cp.async", "wgmma", "TMA")
    for r in rows:
        if r["kind"] == "note":
            print(f"\nNote: {r['what']}")
    # paged (the block table shuffled) against contiguous (in order), the same kernel and shape
    # (goal: paged >= 90% of contiguous)
    ordered = {shape(r)[:-1] + (r.get("mode"),): r for r in rows
               if r["kind"] == "attention" and r.get("blocks") == "in order"}
    paged = [(r, ordered[shape(r)[:-1] + (r.get("mode"),)]) for r in rows
             if r["kind"] == "attention" and r.get("blocks") == "shuffled"
             and shape(r)[:-1] + (r.get("mode"),) in ordered]
    if paged:
        print("\n| attention, paged (shuffled block table) vs contiguous (in order) | contiguous µs "
              "| paged µs | paged rate / contiguous |")
        print("|---|---:|---:|---:|")
        for rp, rc in paged:
            print(f"| B={rp['batch']} ctx={rp['ctx']} rows={rp['new_rows']} hd={rp['hd']} "
                  f"{rp.get('kv')} pages ({rp['mode']}) | {rc['s']*1e6:.1f} | {rp['s']*1e6:.1f} "
                  f"| {100.0 * rc['s'] / rp['s']:.0f}% |")
    qk = [r for r in rows if r["kind"] == "qk"]
    if qk:
        print("\n| a layer's q/k norms, rope and KV write (F16 pages) | five launches µs | "
              "one launch (norm_rope_store) µs | five / one |")
        print("|---|---:|---:|---:|")
        for r in qk:
            print(f"| {r['rows']} rows, {r['n_head']}/{r['n_kv']} heads of {r['hd']}"
                  f"{', normed' if r['norms'] else ''} | {r['s_separate']*1e6:.1f} "
                  f"| {r['s_fused']*1e6:.1f} | {r['s_separate'] / r['s_fused']:.2f} |")
    samp = [r for r in rows if r["kind"] == "sampling"]
    if samp:
        print("\n| sampling, Gemma 3's 262,144-token vocabulary | summaries µs (KB to host) | "
              "whole rows µs (MB to host) | rows / summaries |")
        print("|---|---:|---:|---:|")
        for r in samp:
            print(f"| batch {r['batch']} | {r['s_summary']*1e6:.1f} ({r['bytes_summary']/1024:.0f}) "
                  f"| {r['s_rows']*1e6:.1f} ({r['bytes_rows']/2**20:.0f}) "
                  f"| {r['s_rows'] / r['s_summary']:.2f} |")
    if hf_seconds > 0:
        try:
            tps = hf_generate(hf_seconds)
            print(f"\nHugging Face transformers, random Llama-3-8B shape, bf16, static cache, "
                  f"batch 1: {'%.1f decode tokens/s' % tps if tps else 'skipped (time)'}")
        except Exception as e:  # the peer's failure is reported, not fatal
            print(f"\nHugging Face transformers: failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
