"""test_replay.py — deterministic replay through the Python binding, on Gemma 3 270M.

An engine records its inputs (record_path) while requests of every kind arrive over its first
steps — greedy and sampled with the full chain, n = 2, stop strings, priorities, a tight TTFT
deadline, log-probabilities — one is cancelled mid-decode, and the caller sleeps between steps
so the scheduler's clock moves as it would under load. An engine made from the record
(Engine(model, replay=path)) runs the same steps flat out and gives, step by step, the same
events: ids, tokens, texts, finish reasons, and each token's log probabilities and entropies
to the bit. A record refused by another model, and a submit refused by a replay engine, are
checked too (the C tests cover malformed records: tests/engine/test_replay.c).
"""
import os
import sys
import time

import loom
import synth_llama
from gemma_pkg import gemma_path

TMP = os.environ.get("LOOM_TEST_TMP", "/tmp/loom-conf")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL", msg)


REQUESTS = [
    dict(prompt="The capital of France is", max_tokens=12),
    dict(prompt="Write a haiku about rivers.", max_tokens=20, temperature=0.8, top_k=40,
         top_p=0.95, seed=7, n=2),
    dict(prompt="List three colors:", max_tokens=16, stop=["\n\n", "4."], priority=2),
    dict(prompt="Once upon a time", max_tokens=24, temperature=0.9, top_k=0, top_p=0.9,
         min_p=0.02, entropy_mode="edt", repeat_penalty=1.3, seed=11, n_logprobs=3),
    dict(prompt="1, 2, 3,", max_tokens=18, ttft_deadline_s=0.001, priority=1),
    dict(prompt="The quick brown fox", max_tokens=30, temperature=0.7, seed=3),
]


def events_of(step_events):
    out = []
    for ev in step_events:
        d = {k: ev[k] for k in ("kind", "id", "sample", "token", "text", "reason", "status")}
        info = ev.get("info")
        if info:
            d["info"] = {k: info[k] for k in ("logprob_raw", "logprob_final", "entropy",
                                               "temperature")}
            d["top"] = [t[0] if isinstance(t, (list, tuple)) else t
                        for t in info.get("top_raw", [])]
        out.append(d)
    return out


def recorded_run(model, path):
    e = loom.Engine(model, record_path=path, kv_bytes=5 << 20, max_ctx=256, max_seqs=4,
                    max_batched_tokens=32, max_logprobs=4, starvation_s=0.01)
    steps, ids, pending = [], [], list(REQUESTS)
    t = 0
    while pending or e.has_work():
        if pending and t % 2 == 0:
            ids.append(e.submit(**pending.pop(0)))
        if t == 9:
            e.cancel(ids[1])
        steps.append(events_of(e.step()))
        time.sleep(0.002 * (t % 3))
        t += 1
        if t > 5000:
            raise RuntimeError("the recorded run never ended")
    e.close()
    return steps


def main():
    path = gemma_path("the replay test")
    if not path:
        return 77
    os.makedirs(TMP, exist_ok=True)
    rec = os.path.join(TMP, "replay-gemma3.rec")
    model = loom.Model(path, n_threads=2)
    live = recorded_run(model, rec)
    tokens = sum(1 for s in live for ev in s if ev["kind"] == loom.EVENT_TOKEN)
    cancelled = sum(1 for s in live for ev in s
                    if ev["kind"] == loom.EVENT_FINISHED and ev["reason"] == 4)
    check(tokens > 60, f"the recorded run made only {tokens} tokens")
    check(cancelled >= 1, "the recorded run cancelled nothing")

    t0 = time.time()
    r = loom.Engine(model, replay=rec, n_sample_threads=2)
    again = []
    while r.has_work():
        again.append(events_of(r.step()))
    check(r.step() == [], "a step past the record's end made events")
    try:
        r.submit(prompt="hi")
        check(False, "a replay engine accepted a submit")
    except loom.LoomError as err:
        check("replay" in str(err), f"submit on a replay engine: {err}")
    r.close()
    check(len(again) == len(live), f"replay: {len(again)} steps, recorded {len(live)}")
    for k, (a, b) in enumerate(zip(live, again)):
        if a != b:
            check(False, f"replay step {k}: {b} differs from the recorded {a}")
            break
    print(f"replay: {len(live)} steps, {tokens} tokens, {cancelled} cancelled, replayed in "
          f"{time.time() - t0:.1f} s: equal event by event")

    other_path = os.path.join(TMP, "replay-other.gguf")
    synth_llama.write_llama(other_path, synth_llama.SHAPES[0])
    other = loom.Model(other_path, n_threads=1)
    try:
        loom.Engine(other, replay=rec)
        check(False, "another model replayed the record")
    except loom.LoomError as err:
        check("record was made with" in str(err), f"another model: {err}")
    os.remove(rec)
    if failures:
        print(f"FAILED: {len(failures)} problems")
        return 1
    print("replay ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
