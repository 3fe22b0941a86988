#!/usr/bin/env python3
"""test_trace.py — the per-token trace's two formats, read by Python's json module.

tests/tools/trace_tool (found in $LOOM_BIN_DIR) writes a trace through loom_trace_write in
both formats: a synthetic one (four request/sample streams, awkward text pieces, busy-work
phases with real timings) and, when the Gemma 3 270M package is installed, one of real tokens
sampled by the sampler chain. For each it checks:
  jsonl   the file is strict UTF-8; a "meta" line first, then "step" and "token" lines with
          every documented field of the right type; each step's phases tile it (contiguous,
          from its start to its end) and their durations add up to the step's within 5%
          (exactly, by construction); tokens follow the step that produced them; pieces
          decode to the bytes written, with "piece_hex" exactly when bytes were replaced;
  chrome  a {"traceEvents", "displayTimeUnit"} document whose events have the fields Chrome
          and Perfetto require (ph, pid, tid, ts, dur for "X", numeric counter args); per step,
          the phase events lie inside the step event and their durations add up to it within
          5%; one instant and two counters per token; thread names for every tid used;
          the same step and token counts as the JSONL file.
Then examples/loom-trace-plot draws the synthetic trace to a PNG (skipped with a message when
matplotlib is missing) and must mark the entropy spike the tool puts at position 25.

The engine's own trace (loom_engine_params.trace, through the Python binding's loom.Trace):
  - a 6-layer synthetic model serving 4 concurrent requests (one with n = 2 samples, one with
    the sampler chain and EDT correction, mixed prompt lengths, chunked prefill): both formats
    pass the checks above; one token record per TOKEN event, with the same token ids, logprobs
    and entropies, positions and steps; every step has the phases schedule, forward.layers
    0-1 / 2-3 / 4-5, logits, sample, events in that order, n_seqs and n_tokens as scheduled;
    the text from loom_trace_write_buffer equals the file; loom-trace-plot draws it;
  - Gemma 3 270M (4 layer groups of 18 layers) for a few tokens of two requests;
  - loom-generate --trace in both formats (by --trace-format and by a .json name) on Gemma 3
    270M: a step per forward pass, a token record per generated token;
  - bad use: an unknown format, an unwritable path, closing a trace an engine still uses.
Exits 0 on success, 1 on failure, 77 when the tool was not built.
"""
import json
import math
import os
import subprocess
import sys

from gemma_pkg import gemma_path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BIN_DIR = os.environ.get("LOOM_BIN_DIR", os.path.join(ROOT, "build", "tests"))
TOOL = os.path.join(BIN_DIR, "trace_tool")
PLOT = os.path.join(ROOT, "examples", "loom-trace-plot")
TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
failures = []

INT, NUM, STR = (int,), (int, float), (str,)
META_FIELDS = {"format": STR, "version": INT, "clock": STR, "origin_ns": INT, "n_steps": INT,
               "n_tokens": INT, "dropped": INT}
STEP_FIELDS = {"step": INT, "start_ns": INT, "end_ns": INT, "dur_ns": INT, "n_seqs": INT,
               "n_tokens": INT, "phases": (list,)}
PHASE_FIELDS = {"name": STR, "start_ns": INT, "end_ns": INT, "dur_ns": INT}
TOKEN_FIELDS = {"request": INT, "sample": INT, "step": INT, "pos": INT, "token": INT,
                "piece": STR, "logprob_raw": NUM, "logprob_final": NUM, "entropy": NUM,
                "entropy_final": NUM, "varentropy": NUM, "temperature": NUM, "t_ns": INT,
                "since_arrival_ns": INT}


def fail(msg):
    failures.append(msg)
    print(f"FAIL {msg}")


def check_fields(where, rec, fields):
    for name, types in fields.items():
        if name not in rec:
            fail(f"{where}: no field {name!r}")
        elif not isinstance(rec[name], types) or isinstance(rec[name], bool):
            fail(f"{where}: {name} = {rec[name]!r} is not {types}")


def close(a, b, rel=0.05):
    return abs(a - b) <= rel * max(abs(b), 1e-9)


# ---- JSON Lines ---------------------------------------------------------------------------

def check_jsonl(path, label):
    raw = open(path, "rb").read()
    try:
        text = raw.decode("utf-8")  # strict: invalid bytes must have been replaced
    except UnicodeDecodeError as e:
        fail(f"{label}: not UTF-8: {e}")
        return None
    lines = text.split("\n")
    if lines[-1] != "":
        fail(f"{label}: the last line has no newline")
    recs = []
    for n, line in enumerate(lines[:-1], 1):
        try:
            recs.append(json.loads(line))
        except ValueError as e:
            fail(f"{label}:{n}: not JSON: {e}")
            return None
    if not recs or recs[0].get("type") != "meta":
        fail(f"{label}: the first line is not the meta record")
        return None
    meta = recs[0]
    check_fields(f"{label} meta", meta, META_FIELDS)
    steps = [r for r in recs if r.get("type") == "step"]
    tokens = [r for r in recs if r.get("type") == "token"]
    if len(steps) + len(tokens) + 1 != len(recs):
        fail(f"{label}: records of unknown type: {set(r.get('type') for r in recs)}")
    if meta.get("n_steps") != len(steps) or meta.get("n_tokens") != len(tokens):
        fail(f"{label}: meta counts {meta.get('n_steps')}/{meta.get('n_tokens')}, "
             f"file has {len(steps)}/{len(tokens)}")
    if meta.get("dropped") != 0:
        fail(f"{label}: {meta.get('dropped')} records dropped")
    for r in recs:
        if next(iter(r)) != "type":
            fail(f"{label}: a record does not start with 'type': {r}")
            break

    worst = 0.0
    for s in steps:
        where = f"{label} step {s.get('step')}"
        check_fields(where, s, STEP_FIELDS)
        if s["end_ns"] - s["start_ns"] != s["dur_ns"] or s["dur_ns"] < 0:
            fail(f"{where}: dur_ns {s['dur_ns']} vs [{s['start_ns']}, {s['end_ns']}]")
        at, total = s["start_ns"], 0
        for p in s["phases"]:
            check_fields(f"{where} phase", p, PHASE_FIELDS)
            if p["start_ns"] != at or p["dur_ns"] != p["end_ns"] - p["start_ns"] \
                    or p["dur_ns"] < 0:
                fail(f"{where}: phase {p['name']!r} [{p['start_ns']}, {p['end_ns']}] does not "
                     f"continue at {at}")
            at = p["end_ns"]
            total += p["dur_ns"]
        if not s["phases"] or at != s["end_ns"]:
            fail(f"{where}: phases end at {at}, the step at {s['end_ns']}")
        if not close(total, s["dur_ns"]):
            fail(f"{where}: phases sum to {total} ns, the step took {s['dur_ns']} ns")
        worst = max(worst, abs(total - s["dur_ns"]) / max(s["dur_ns"], 1))

    # Tokens follow the line of the step that produced them.
    current = None
    for r in recs[1:]:
        if r["type"] == "step":
            current = r["step"]
        else:
            check_fields(f"{label} token {r.get('pos')}", r, TOKEN_FIELDS)
            if current is not None and r["step"] != current and \
                    any(s["step"] == r["step"] for s in steps):
                fail(f"{label}: token of step {r['step']} after step {current}'s line")
            if ("piece_hex" in r) != ("\ufffd" in r["piece"]) and "piece_hex" in r:
                fail(f"{label}: piece_hex without a replaced byte: {r}")
    print(f"ok  {label}: {len(steps)} steps, {len(tokens)} tokens, phase sums off by at most "
          f"{worst:.2%}")
    return meta, steps, tokens


# ---- Chrome trace events ------------------------------------------------------------------

def check_chrome(path, label, n_steps, n_tokens):
    try:
        doc = json.load(open(path, encoding="utf-8"))
    except ValueError as e:
        fail(f"{label}: not JSON: {e}")
        return
    if doc.get("displayTimeUnit") != "ms" or not isinstance(doc.get("traceEvents"), list):
        fail(f"{label}: not a trace-event document: keys {list(doc)}")
        return
    evs = doc["traceEvents"]
    named_tids, used_tids = set(), set()
    steps, phases, instants, counters = [], [], [], []
    for e in evs:
        if not isinstance(e.get("ph"), str) or e.get("pid") != 1 or \
                not isinstance(e.get("name"), str):
            fail(f"{label}: event without ph/pid/name: {e}")
            return
        ph = e["ph"]
        if ph == "M":
            if e["name"] == "thread_name":
                named_tids.add(e["tid"])
            continue
        if not isinstance(e.get("ts"), (int, float)):
            fail(f"{label}: event without ts: {e}")
            return
        if ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                fail(f"{label}: X event without a valid dur: {e}")
            used_tids.add(e["tid"])
            (steps if e.get("cat") == "step" else phases).append(e)
        elif ph == "i":
            used_tids.add(e["tid"])
            instants.append(e)
        elif ph == "C":
            if not e.get("args") or not all(isinstance(v, (int, float)) and math.isfinite(v)
                                            for v in e["args"].values()):
                fail(f"{label}: counter with non-numeric args: {e}")
            counters.append(e)
        else:
            fail(f"{label}: unexpected ph {ph!r}")
    if used_tids - named_tids:
        fail(f"{label}: tids without a thread name: {sorted(used_tids - named_tids)}")
    if len(steps) != n_steps or len(instants) != n_tokens or len(counters) != 2 * n_tokens:
        fail(f"{label}: {len(steps)} steps, {len(instants)} instants, {len(counters)} counters "
             f"for {n_steps} steps and {n_tokens} tokens")
    by_step = {}
    for p in phases:
        by_step.setdefault(p["args"]["step"], []).append(p)
    worst = 0.0
    for s in steps:
        ps = by_step.get(s["args"]["step"], [])
        total = sum(p["dur"] for p in ps)
        lo, hi = s["ts"], s["ts"] + s["dur"]
        eps = 1e-3  # ts and dur carry three decimals of a microsecond
        if any(p["ts"] < lo - eps or p["ts"] + p["dur"] > hi + eps for p in ps):
            fail(f"{label}: a phase of step {s['args']['step']} lies outside it")
        if not ps or not close(total, s["dur"]):
            fail(f"{label}: step {s['args']['step']}: phases sum to {total} us of {s['dur']}")
        worst = max(worst, abs(total - s["dur"]) / max(s["dur"], 1e-9))
    print(f"ok  {label}: {len(evs)} events, {len(named_tids)} named threads, phase sums off by "
          f"at most {worst:.2%}")


def run_tool(prefix, *extra):
    r = subprocess.run([TOOL, prefix, *extra], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"trace_tool {' '.join(extra)}: rc {r.returncode}: {r.stderr.strip()}")
        return False
    return True


def check_synthetic_pieces(tokens):
    pieces = {(t["piece"], t.get("piece_hex")) for t in tokens}
    want = {("The", None), (" \"weaves\"", None), ("\\", None), ("\n", None),
            ("\ufffd\ufffd", "e282"), ("\ufffd", "ac"), ("caf\u00e9", None),
            ("\U0001f9f5", None), ("\x01", None)}
    if want - pieces:
        fail(f"synthetic pieces: missing {want - pieces}")
    else:
        print("ok  synthetic pieces: quotes, backslash, controls, invalid and multi-byte UTF-8")


# ---- the plot -----------------------------------------------------------------------------

def check_plot(jsonl):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIP loom-trace-plot: matplotlib is not installed (pip install -r "
              "python/requirements.txt)")
        return
    png = os.path.join(TMP, "trace-synthetic.png")
    if os.path.exists(png):
        os.remove(png)
    r = subprocess.run([sys.executable, PLOT, jsonl, "-o", png], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"loom-trace-plot: rc {r.returncode}: {r.stderr.strip()}")
        return
    data = open(png, "rb").read() if os.path.exists(png) else b""
    if len(data) < 1000 or not data.startswith(b"\x89PNG\r\n\x1a\n") or b"IEND" not in data[-16:]:
        fail(f"loom-trace-plot: {png} is not a complete PNG ({len(data)} bytes)")
        return
    spikes = [ln for ln in r.stdout.splitlines() if " pos 25 " in ln]
    if len(spikes) != 4:
        fail(f"loom-trace-plot: the spike at position 25 was not marked in all 4 streams:\n"
             f"{r.stdout}")
    print(f"ok  loom-trace-plot: {png}, {len(data)} bytes, {len(r.stdout.splitlines())} marks")

    png2 = os.path.join(TMP, "trace-request-2.png")
    r = subprocess.run([sys.executable, PLOT, jsonl, "-o", png2, "--request", "2"],
                       capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(png2) or \
            any(not ln.startswith("request 2 ") for ln in r.stdout.splitlines()):
        fail(f"loom-trace-plot --request 2: rc {r.returncode}: {r.stdout} {r.stderr}")
    r = subprocess.run([sys.executable, PLOT, jsonl, "-o", png2, "--request", "99"],
                       capture_output=True, text=True)
    if r.returncode != 1 or "request 99" not in r.stderr:
        fail(f"loom-trace-plot --request 99: rc {r.returncode}: {r.stderr}")
    r = subprocess.run([sys.executable, PLOT, os.path.join(TMP, "no-such.jsonl")],
                       capture_output=True, text=True)
    if r.returncode != 1:
        fail(f"loom-trace-plot on a missing file: rc {r.returncode}")
    r = subprocess.run([sys.executable, PLOT, "--help"], capture_output=True, text=True)
    if r.returncode != 0 or "median" not in r.stdout:
        fail("loom-trace-plot --help does not explain the marks")


# ---- the engine's trace -------------------------------------------------------------------

ENGINE_PHASES_HEAD = ["schedule"]
ENGINE_PHASES_TAIL = ["logits", "sample", "events"]


def layer_groups(n_layer):
    every = (n_layer + 3) // 4
    return [f"forward.layers {a}-{min(a + every, n_layer) - 1}" for a in range(0, n_layer, every)]


def run_engine_traced(loom, model, reqs, **eng):
    """Runs reqs through an engine with a trace; returns (trace, TOKEN events, stats)."""
    import time
    trace = loom.Trace()
    e = loom.Engine(model, trace=trace, **eng)
    ids = [e.submit(**r) for r in reqs]
    events = []
    wall = []  # each step() call's duration, seen from here
    while e.has_work():
        t0 = time.monotonic_ns()
        evs = e.step()
        wall.append(time.monotonic_ns() - t0)
        events += [ev for ev in evs if ev["kind"] == loom.EVENT_TOKEN]
    st = e.stats()
    st["wall_ns"] = wall
    try:
        trace.close()
        fail("closing a trace that an open engine records into succeeded")
    except RuntimeError:
        pass
    e.close()
    return trace, ids, events, st


def check_engine_trace(label, trace, ids, reqs, events, stats, n_layer):
    """Both formats of an engine's trace against the events the engine returned."""
    import numpy as np
    prefix = os.path.join(TMP, f"trace-{label}")
    trace.write(prefix + ".jsonl", "jsonl")
    trace.write(prefix + ".json", "chrome")
    if trace.to_string("jsonl") != open(prefix + ".jsonl", encoding="utf-8").read():
        fail(f"{label}: to_string differs from the written file")
    info = trace.info()
    got = check_jsonl(prefix + ".jsonl", f"{label} jsonl")
    if not got:
        return None
    meta, steps, tokens = got
    check_chrome(prefix + ".json", f"{label} chrome", len(steps), len(tokens))
    if info["n_steps"] != len(steps) or info["n_tokens"] != len(tokens) or \
            trace.count() != len(tokens):
        fail(f"{label}: info {info}, count {trace.count()}, file {len(steps)}/{len(tokens)}")

    # Every step that ran a batch is a record, numbered 0.. in order, phases in order.
    want_phases = ENGINE_PHASES_HEAD + layer_groups(n_layer) + ENGINE_PHASES_TAIL
    if [s["step"] for s in steps] != list(range(stats["steps"])):
        fail(f"{label}: step records {[s['step'] for s in steps][:10]}..., "
             f"the engine counted {stats['steps']} steps")
    bad = [s for s in steps if [p["name"] for p in s["phases"]] != want_phases]
    if bad:
        fail(f"{label}: step {bad[0]['step']} phases {[p['name'] for p in bad[0]['phases']]}, "
             f"want {want_phases}")
    if any(not (1 <= s["n_seqs"] <= s["n_tokens"]) for s in steps):
        fail(f"{label}: a step with n_seqs/n_tokens out of order")
    # The step records time the work of each step() call: never longer than the call seen from
    # Python, and most of it (the rest is the binding turning events into dicts).
    wall = stats["wall_ns"]
    if len(wall) == len(steps):
        longer = [s["step"] for s, w in zip(steps, wall) if s["dur_ns"] > w]
        share = sum(s["dur_ns"] for s in steps) / max(sum(wall), 1)
        if longer or share < 0.5:
            fail(f"{label}: step records vs step() calls: longer at {longer[:5]}, "
                 f"share {share:.0%}")
        print(f"ok  {label}: the step records cover {share:.0%} of the step() calls' time")

    # One token record per TOKEN event, in the same order, with the same values.
    if len(tokens) != len(events):
        fail(f"{label}: {len(tokens)} token records for {len(events)} TOKEN events")
    n_same = 0
    for t, ev in zip(tokens, events):
        inf = ev["info"]
        ok = (t["request"] == ev["id"] and t["sample"] == ev["sample"] and
              t["token"] == ev["token"] == inf["token"] and
              np.float32(t["logprob_raw"]) == np.float32(inf["logprob_raw"]) and
              np.float32(t["logprob_final"]) == np.float32(inf["logprob_final"]) and
              close(t["entropy"], inf["entropy"], 1e-8) and
              close(t["entropy_final"], inf["entropy_final"], 1e-8) and
              close(t["varentropy"], inf["varentropy"], 1e-8) and
              close(t["temperature"], inf["temperature"], 1e-8))
        n_same += ok
        if not ok and n_same + 1 == len(failures):  # report the first mismatch only
            fail(f"{label}: token record {t} differs from event {ev}")
    if n_same != len(events):
        fail(f"{label}: {len(events) - n_same} token records differ from their events")

    # Positions follow the prompt; steps and times fit their step records.
    by_step = {s["step"]: s for s in steps}
    n_prompt = {rid: len(r["tokens"]) for rid, r in zip(ids, reqs)}
    streams = {}
    for t in tokens:
        streams.setdefault((t["request"], t["sample"]), []).append(t)
        s = by_step.get(t["step"])
        if s is None or not (s["start_ns"] <= t["t_ns"] <= s["end_ns"]):
            fail(f"{label}: token at {t['t_ns']} outside its step {t['step']}")
            break
    for (rid, smp), recs in streams.items():
        pos = [t["pos"] for t in recs]
        if pos != list(range(n_prompt[rid], n_prompt[rid] + len(recs))):
            fail(f"{label}: request {rid} sample {smp}: positions {pos[:5]}...")
        arr = [t["since_arrival_ns"] for t in recs]
        if arr[0] <= 0 or arr != sorted(arr):
            fail(f"{label}: request {rid}: since_arrival_ns {arr[:5]}... not positive rising")
    want_streams = sum(r.get("n", 1) for r in reqs)
    if len(streams) != want_streams:
        fail(f"{label}: {len(streams)} token streams, want {want_streams}")
    print(f"ok  {label}: {len(steps)} steps with phases {', '.join(want_phases)}; "
          f"{n_same}/{len(events)} token records match their events")
    return prefix + ".jsonl"


def engine_synthetic(loom):
    import dataclasses
    import numpy as np
    try:
        import synth_llama
    except ImportError as e:
        print(f"SKIP the engine's trace on a synthetic model: synth_llama needs the gguf "
              f"package ({e})")
        return
    shape = dataclasses.replace(synth_llama.SHAPES[0], name="trace6", n_layer=6)
    path = os.path.join(TMP, "trace-engine-6l.gguf")
    synth_llama.write_llama(path, shape)
    model = loom.Model(path, n_threads=2)
    rng = np.random.default_rng(8)
    V = shape.n_vocab
    reqs = [dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 40)], max_tokens=12),
            dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 7)], max_tokens=16,
                 temperature=0.9, top_k=0, top_p=0.9, entropy_mode="edt", seed=4,
                 n_logprobs=3),
            dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 20)], max_tokens=10, n=2,
                 temperature=1.0, seed=5),
            dict(tokens=[1] + [int(t) for t in rng.integers(3, V, 3)], max_tokens=14,
                 temperature=0.7, seed=6)]
    trace, ids, events, st = run_engine_traced(loom, model, reqs, kv_bytes=32 << 20,
                                               max_batched_tokens=32, max_seqs=8)
    jsonl = check_engine_trace("engine-synthetic", trace, ids, reqs, events, st, shape.n_layer)
    if jsonl:
        plot_engine(jsonl, len({(e["id"], e["sample"]) for e in events}))
    try:
        trace.write(os.path.join(TMP, "no-such-dir", "x.jsonl"))
        fail("writing a trace to a missing directory succeeded")
    except loom.LoomError as err:
        if err.name != "ERR_IO" or "no-such-dir" not in str(err):
            fail(f"trace write to a missing directory: {err}")
    trace.clear()
    if trace.info() != {"n_steps": 0, "n_tokens": 0, "n_dropped": 0}:
        fail(f"trace.clear left {trace.info()}")
    trace.close()
    try:
        trace.count()
        fail("a closed trace was used")
    except ValueError:
        pass
    model.close()


def plot_engine(jsonl, n_streams):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIP loom-trace-plot on the engine's trace: matplotlib is not installed")
        return
    png = os.path.join(TMP, "trace-engine.png")
    if os.path.exists(png):
        os.remove(png)
    r = subprocess.run([sys.executable, PLOT, jsonl, "-o", png], capture_output=True, text=True)
    data = open(png, "rb").read() if os.path.exists(png) else b""
    if r.returncode != 0 or not data.startswith(b"\x89PNG\r\n\x1a\n") or len(data) < 1000:
        fail(f"loom-trace-plot on the engine's trace: rc {r.returncode}, {len(data)} bytes: "
             f"{r.stderr.strip()}")
        return
    print(f"ok  loom-trace-plot draws the engine's trace ({n_streams} streams): {png}, "
          f"{len(data)} bytes")


def engine_gemma(loom, model_path):
    model = loom.Model(model_path, n_threads=2)
    reqs = [dict(tokens=model.tokenize("The capital of France is"), max_tokens=4),
            dict(tokens=model.tokenize("Once upon a time"), max_tokens=5, temperature=0.8,
                 seed=3, entropy_mode="edt")]
    trace, ids, events, st = run_engine_traced(loom, model, reqs, kv_bytes=64 << 20,
                                               max_ctx=512)
    check_engine_trace("engine-gemma3", trace, ids, reqs, events, st, model.info.n_layer)
    trace.close()
    model.close()


def generate_cli(model_path):
    """loom-generate --trace: JSONL by default, Chrome by --trace-format or a .json name."""
    exe = os.path.join(os.path.dirname(os.path.abspath(BIN_DIR)), "loom-generate")
    if not os.path.exists(exe):
        fail(f"{exe} missing: loom-generate --trace was not checked")
        return
    base = [exe, "-m", model_path, "-p", "The capital of France is", "-n", "6", "-t", "2",
            "--temp", "0"]
    jl = os.path.join(TMP, "trace-generate.jsonl")
    ch1 = os.path.join(TMP, "trace-generate.json")
    ch2 = os.path.join(TMP, "trace-generate.chrome")
    runs = [(jl, []), (ch1, []), (ch2, ["--trace-format", "chrome"])]
    for path, extra in runs:
        if os.path.exists(path):
            os.remove(path)
        r = subprocess.run(base + ["--trace", path] + extra, capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0 or "trace: " not in r.stderr:
            fail(f"loom-generate --trace {path}: rc {r.returncode}: {r.stderr[-400:]}")
            return
    got = check_jsonl(jl, "loom-generate jsonl")
    if not got:
        return
    meta, steps, tokens = got
    for path in (ch1, ch2):
        check_chrome(path, f"loom-generate chrome ({os.path.basename(path)})", len(steps),
                     len(tokens))
    want = layer_groups(18) + ENGINE_PHASES_TAIL
    if len(tokens) != 6 or len(steps) != 6:
        fail(f"loom-generate: {len(steps)} steps and {len(tokens)} tokens, want 6 and 6")
    if any([p["name"] for p in s["phases"]] != want for s in steps):
        fail(f"loom-generate: phases {[p['name'] for p in steps[0]['phases']]}, want {want}")
    if [t["step"] for t in tokens] != list(range(6)) or steps[0]["n_tokens"] < 2 or \
            any(s["n_tokens"] != 1 for s in steps[1:]):
        fail("loom-generate: tokens/steps out of order or wrong batch sizes")
    if [t["pos"] for t in tokens] != list(range(steps[0]["n_tokens"],
                                                steps[0]["n_tokens"] + 6)):
        fail(f"loom-generate: positions {[t['pos'] for t in tokens]}")
    if any(t["temperature"] != 0 or t["logprob_final"] != 0 for t in tokens):
        fail("loom-generate --temp 0: a token record is not greedy")
    print(f"ok  loom-generate --trace: {len(steps)} steps, {len(tokens)} tokens; "
          f"'{''.join(t['piece'] for t in tokens)}'")
    r = subprocess.run(base + ["--trace", jl, "--trace-format", "xml"], capture_output=True,
                       text=True)
    if r.returncode != 2 or "--trace-format" not in r.stderr:
        fail(f"loom-generate --trace-format xml: rc {r.returncode}")
    r = subprocess.run(base + ["--trace", os.path.join(TMP, "no-such-dir", "t.jsonl")],
                       capture_output=True, text=True)
    if r.returncode != 1 or "no-such-dir" not in r.stderr:
        fail(f"loom-generate --trace into a missing directory: rc {r.returncode}")


def engine_traces(model_path):
    try:
        import loom
    except (ImportError, OSError) as e:
        fail(f"the Python binding does not load: {e}")
        return
    try:
        loom.Trace().write(os.path.join(TMP, "x.jsonl"), "xml")
        fail("an unknown trace format was accepted")
    except ValueError:
        pass
    engine_synthetic(loom)
    if model_path:
        engine_gemma(loom, model_path)
        generate_cli(model_path)


def main():
    if not os.path.exists(TOOL):
        print(f"SKIP: {TOOL} not built (set LOOM_BIN_DIR to the build's tests directory)")
        return 77
    os.makedirs(TMP, exist_ok=True)

    prefix = os.path.join(TMP, "trace-synthetic")
    if run_tool(prefix):
        got = check_jsonl(prefix + ".jsonl", "synthetic jsonl")
        if got:
            meta, steps, tokens = got
            check_chrome(prefix + ".json", "synthetic chrome", len(steps), len(tokens))
            check_synthetic_pieces(tokens)
            check_plot(prefix + ".jsonl")

    model = gemma_path("the real-model trace")
    if model:
        prefix = os.path.join(TMP, "trace-gemma3")
        if run_tool(prefix, model, "12"):
            got = check_jsonl(prefix + ".jsonl", "gemma3 jsonl")
            if got:
                meta, steps, tokens = got
                check_chrome(prefix + ".json", "gemma3 chrome", len(steps), len(tokens))
                prev = None
                for t in tokens:
                    if not (t["logprob_raw"] <= 0 and t["logprob_final"] <= 0 and
                            t["entropy"] >= 0 and t["entropy_final"] >= 0 and
                            t["varentropy"] >= 0 and t["temperature"] >= 0 and
                            t["since_arrival_ns"] >= 0):
                        fail(f"gemma3: implausible token record {t}")
                    if prev is not None and t["pos"] != prev + 1:
                        fail(f"gemma3: position {t['pos']} after {prev}")
                    prev = t["pos"]
                if len(tokens) < 2:
                    fail(f"gemma3: only {len(tokens)} tokens")

    engine_traces(model)

    if failures:
        print(f"FAILED: {len(failures)} problems")
        return 1
    print("trace formats ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
