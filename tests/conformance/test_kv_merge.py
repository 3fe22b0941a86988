"""test_kv_merge.py — merged layer pairs (MiniCache-style cross-layer KV reuse: "merge B A" in a
kv_plan file) against an independent float64 reference (ref_merge.py).

On a 4-layer synthetic llama (F32 weights, GQA 2:1, float32 activations, f32 pages, 16-position
blocks):
  1. a session's logits at every position of a 56-token sequence equal the reference's within
     2e-5 relative, for one pair and for two, retaining 0, 4 and 16 tokens per block, at two
     interpolation weights, run as one step and in steps of 5 and of 1 positions (merging
     depends on the steps: the earlier layer reads its own step's tokens unmerged), and they
     move the logits away from the unmerged model's — except retaining every token, which
     must give the unmerged logits back within float32 rounding;
  2. kv_read: both layers of a pair read back what the reference's cache holds at the end;
  3. F16 and BF16 pages: the logits within their page rounding of the reference;
  4. an engine with a merged plan: the block bytes hold layer A's pages and the merge block and
     nothing of layer B's; one request's greedy tokens equal a session's fed the same steps;
     under KV pressure that swaps requests out and back, every request's tokens are those it
     gives without pressure (the merge blocks travel with their blocks); the record replays;
  5. bad plans and combinations are refused with the reason: a layer in two pairs, a pair
     whose layer another layer shares from, a pair with a later layer, merge-retain and
     merge-t outside [0, 1], FP8 pages and the Hadamard rotation with merged pairs.
"""
import os
import sys

import numpy as np

try:
    import gguf  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

import loom
import ref_llama
import ref_merge
import synth_llama
from conf_checks import check, expect_error, finish, rel_err

TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
TOL_REF = 2e-5
BS = 16
SHAPE = synth_llama.Shape("merge", n_vocab=512, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                          n_layer=4)






def write_plan(name, body):
    path = os.path.join(TMP, f"merge-{name}.plan")
    with open(path, "w") as f:
        f.write("loom-kv-plan 1\nlayers 4\n" + body)
    return path


def merge_plan(name, pairs, retain=None, t=None):
    body = "".join(f"merge {b} {a}\n" for b, a in sorted(pairs.items()))
    if retain is not None:
        body += f"merge-retain {retain}\n"
    if t is not None:
        body += f"merge-t {t}\n"
    return write_plan(name, body)


def session_logits(m, tokens, plan, chunk=None, kv_type="f32"):
    s = loom.Session(m, n_ctx=256, kv_type=kv_type, kv_plan=plan, block_size=BS)
    chunk = chunk or len(tokens)
    out = [np.array(s.decode(tokens[i:i + chunk], all_logits=True))
           for i in range(0, len(tokens), chunk)]
    return s, np.concatenate(out)




def check_reference(m, W, tokens, base):
    cases = [  # name, pairs {b: a}, retained fraction, rows per block, t
        ("2:1 r0", {2: 1}, 0.0, 0, None),
        ("2:1 r.25", {2: 1}, 0.25, 4, None),
        ("2:1 r.25 t.3", {2: 1}, 0.25, 4, 0.3),
        ("1:0,3:2 r.1", {1: 0, 3: 2}, 0.1, 2, None),
    ]
    for name, pairs, frac, rows, t in cases:
        plan = merge_plan(name.replace(":", "-").replace(",", "_").replace(" ", "_"), pairs,
                          retain=frac, t=t)
        for chunk in (None, 5, 1):
            s, got = session_logits(m, tokens, plan, chunk)
            kv = {}
            ref = ref_merge.forward(W, SHAPE, tokens, pairs, rows, BS, t=0.6 if t is None else t,
                                    chunk=chunk, kv_out=kv)
            e = rel_err(got, ref)
            check(e <= TOL_REF, f"merge {name}, steps of {chunk or len(tokens)}: logits vs "
                                f"float64 reference, rel err {e:.2e}")
            d = rel_err(got, base)
            check(d > 100 * TOL_REF, f"merge {name}, steps of {chunk or len(tokens)}: moves the "
                                     f"logits (rel diff {d:.2e})")
            if chunk == 5:  # 2. what each layer of a pair reads back
                for b, a in pairs.items():
                    for il in (a, b):
                        k, v = s.kv_read(il)
                        ek = rel_err(k, kv[il][0])
                        ev = rel_err(v, kv[il][1])
                        check(max(ek, ev) <= 1e-5, f"merge {name}: kv_read({il}) = the reference "
                                                   f"cache's K/V at the end, rel err {ek:.1e} {ev:.1e}")
            s.close()
    # Retaining every token merges none: the unmerged model, whatever the steps.
    plan = merge_plan("all", {2: 1}, retain=1)
    for chunk in (None, 3):
        s, got = session_logits(m, tokens, plan, chunk)
        s.close()
        e = rel_err(got, base)
        check(e <= TOL_REF, f"merge-retain 1 (steps of {chunk or len(tokens)}): the unmerged "
                            f"logits, rel err {e:.2e}")
    # 3. F16 and BF16 pages: within their rounding of the reference.
    plan = merge_plan("r25", {2: 1}, retain=0.25)
    ref = ref_merge.forward(W, SHAPE, tokens, {2: 1}, 4, BS, chunk=7)
    for kv_type, tol in (("f16", 5e-3), ("bf16", 4e-2)):
        s, got = session_logits(m, tokens, plan, 7, kv_type=kv_type)
        s.close()
        e = rel_err(got, ref)
        check(e <= tol, f"merge 2:1 r.25 over {kv_type} pages: rel err {e:.2e} (<= {tol})")


def run_engine(m, plan, prompts, n_tokens, kv_bytes, max_ctx=256, **kw):
    e = loom.Engine(m, kv_bytes=kv_bytes, max_ctx=max_ctx, max_seqs=8, block_size=BS,
                    kv_plan=plan, **kw)
    ids = [e.submit(tokens=p, max_tokens=n_tokens, temperature=0.0, ignore_eos=True)
           for p in prompts]
    e.run()
    out = [list(e.outputs[i][0]["tokens"]) for i in ids]
    stats = e.stats()
    groups = e.kv_groups()
    e.close()
    return out, stats, groups


def check_engine(m, tokens):
    plan = merge_plan("engine", {2: 1}, retain=0.25)
    e0 = loom.Engine(m, kv_bytes=1 << 20, max_ctx=256, block_size=BS)
    bytes0 = e0.kv_groups()[0]["block_bytes"]
    e0.close()
    prompt = tokens[:20]
    rec = os.path.join(TMP, "merge-engine.rec")
    out, _, groups = run_engine(m, plan, [prompt], 12, 1 << 20, record_path=rec)
    g = groups[0]
    hd, H = SHAPE.head_dim, SHAPE.n_head_kv
    page = BS * H * hd * 2  # one layer's K (or V) block of f16
    merge_block = BS * H * 16 + BS * 8 + 4 * 2 * H * hd * 2
    merge_block = (merge_block + 15) // 16 * 16
    check(g["block_bytes"] == bytes0 - 2 * page + merge_block,
          f"engine merge 2:1: block bytes {g['block_bytes']} = {bytes0} - layer 2's pages "
          f"{2 * page} + the merge block {merge_block}")
    # The session fed the engine's steps: the prompt in one step, then one token per step.
    s = loom.Session(m, n_ctx=256, kv_plan=plan, block_size=BS)
    last, want = s.decode(prompt), []
    for _ in range(12):
        want.append(int(np.argmax(last)))
        last = s.decode([want[-1]])
    s.close()
    check(out[0] == want, f"engine merge 2:1: greedy tokens {out[0]} = the session's {want}")
    r = loom.Engine(m, replay=rec)
    r.run()
    again = [list(o[0]["tokens"]) for o in r.outputs.values() if o]
    r.close()
    check(again == [out[0]], f"engine merge 2:1: the record replays the same tokens ({again})")
    # Swap: 6 prompts whose decodes outgrow a small pool; each request's tokens as without
    # pressure (prompts prefill in one step either way; decodes are one token per step).
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, SHAPE.n_vocab, size=24)] for _ in range(6)]
    free, _, _ = run_engine(m, plan, prompts, 40, 8 << 20, max_ctx=96, max_batched_tokens=256)
    tight, st, _ = run_engine(m, plan, prompts, 40, 14 * bytes0, max_ctx=96,
                              max_batched_tokens=256, preempt=1)  # LOOM_PREEMPT_SWAP
    check(st["preemptions"] > 0, f"engine merge under pressure: {st['preemptions']} "
                                 f"preemptions by swap")
    check(tight == free, "engine merge: swapped requests give their unpressured tokens")


def check_bad(m):
    fp = merge_plan("ok", {2: 1})
    cases = [
        ("two-pairs", "merge 2 1\nmerge 3 1\n", ["layer 1 is already in a merged pair"]),
        ("shared-from", "merge 2 1\nshare 3 1\n", ["merged pair"]),
        ("chain", "merge 2 1\nshare 3 2\n", ["no chains"]),
        ("later", "merge 1 2\n", ["later layer"]),
        ("self", "merge 2 2\n", ["itself"]),
        ("retain", "merge 2 1\nmerge-retain 1.5\n", ["merge-retain", "[0, 1]"]),
        ("t", "merge 2 1\nmerge-t -0.1\n", ["merge-t", "[0, 1]"]),
        ("missing", "merge 5 1\n", ["layer 5", "0 .. 3"]),
    ]
    for name, body, needles in cases:
        p = write_plan(f"bad-{name}", body)
        expect_error(lambda: loom.Session(m, n_ctx=64, kv_plan=p), f"plan {name}", needles)
        expect_error(lambda: loom.Engine(m, kv_bytes=1 << 20, max_ctx=64, kv_plan=p),
                     f"engine plan {name}", needles)
    expect_error(lambda: loom.Session(m, n_ctx=64, kv_plan=fp, kv_type="fp8_e4m3"),
                 "merged pairs over FP8 pages", ["merged pairs", "fp8"])
    expect_error(lambda: loom.Engine(m, kv_bytes=1 << 20, max_ctx=64, kv_plan=fp,
                                     kv_type="fp8_e4m3"),
                 "engine: merged pairs over FP8 pages", ["merged pairs", "fp8"])
    expect_error(lambda: loom.Session(m, n_ctx=64, kv_plan=fp, kv_rotate=True),
                 "merged pairs with kv_rotate", ["merged pairs", "kv_rotate"])
    expect_error(lambda: loom.Engine(m, kv_bytes=1 << 20, max_ctx=64, kv_plan=fp,
                                     kv_rotate=True),
                 "engine: merged pairs with kv_rotate", ["merged pairs", "kv_rotate"])


def main():
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "kv-merge.gguf")
    synth_llama.write_llama(path, SHAPE, seed=97531)
    W = ref_llama.load_weights(path)
    m = loom.Model(path, n_threads=2, f32_activations=True, backend="cpu")
    rng = np.random.default_rng(13)
    tokens = [int(t) for t in rng.integers(3, SHAPE.n_vocab, size=56)]
    s, base = session_logits(m, tokens, None)
    s.close()
    e = rel_err(base, ref_llama.forward(W, SHAPE, tokens))
    check(e <= TOL_REF, f"no plan: logits vs float64 reference, rel err {e:.2e}")
    check_reference(m, W, tokens, base)
    check_engine(m, tokens)
    check_bad(m)
    m.close()
    return finish("kv merge")


if __name__ == "__main__":
    sys.exit(main())
