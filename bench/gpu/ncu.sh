#!/usr/bin/env bash
# ncu.sh — Nsight Compute over loom's decode step and prefill (bench/gpu/check.sh's ncu step).
# Usage: bench/gpu/ncu.sh OUT_DIR DRIVER SECONDS
#   DRIVER: build-gpu/bench/loom-gpu-ncu (profiles only its region: --profile-from-start off).
# For each of decode, prefill and prefill-wgmma (the prefill with LOOM_CUDA_MATH=bf16
# LOOM_CUDA_WGMMA=1: the wgmma GEMM on Hopper, elsewhere the BF16-math mma.sync GEMM): a first
# pass times every kernel of the region; the three
# kernels with the most time (summed over their launches) then get a second pass with the
# Speed Of Light, memory, compute and warp-state sections. Writes OUT_DIR/ncu.md (a table per
# region: time share, DRAM throughput, SM throughput, tensor-pipe use where ncu reports it, the
# top stall reasons) and the raw CSVs OUT_DIR/ncu-<label>-{times,detail}.csv.
set -uo pipefail
out=${1:?usage: ncu.sh OUT_DIR DRIVER SECONDS}
drv=${2:?driver}
secs=${3:-90}
end=$(($(date +%s) + secs))
left() { local l=$((end - $(date +%s))); echo $((l > 5 ? l : 5)); }
: >"$out/ncu.md"
echo "Nsight Compute ($(ncu --version 2>/dev/null | tail -1)), synthetic Llama-3-8B shape, Q4_K, 2 layers, default (invariant) mode; prefill-wgmma with LOOM_CUDA_MATH=bf16 LOOM_CUDA_WGMMA=1:" >>"$out/ncu.md"
for label in decode prefill prefill-wgmma; do
    region=${label%-wgmma}
    envs=()
    [ "$label" = prefill-wgmma ] && envs=(LOOM_CUDA_MATH=bf16 LOOM_CUDA_WGMMA=1)
    times="$out/ncu-$label-times.csv"
    detail="$out/ncu-$label-detail.csv"
    timeout "$(left)" env "${envs[@]}" ncu --profile-from-start off --metrics gpu__time_duration.sum \
        --csv --page raw "$drv" "$region" >"$times" 2>>"$out/ncu-$label.log"
    top=$(python3 - "$times" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if len(rows) < 3:
    sys.exit(0)
head = rows[0]
ki, ti = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
tot = collections.Counter()
for r in rows[2:]:  # rows[1]: units
    base = r[ki].split("(")[0].split("<")[0].split()[-1]
    try:
        tot[base] += float(r[ti].replace(",", ""))
    except ValueError:
        pass
print("|".join(k for k, _ in tot.most_common(3)))
PY
)
    if [ -z "$top" ]; then
        echo "- $label: the timing pass gave nothing (ncu-$label.log)" >>"$out/ncu.md"
        continue
    fi
    timeout "$(left)" env "${envs[@]}" ncu --profile-from-start off --kernel-name-base function \
        --kernel-name "regex:^($top)\$" --launch-count 12 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section WarpStateStats --csv --page raw "$drv" "$region" >"$detail" 2>>"$out/ncu-$label.log"
    python3 - "$times" "$detail" "$label" >>"$out/ncu.md" <<'PY'
import csv, sys, collections
def load(path):
    rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
    return (rows[0], rows[2:]) if len(rows) >= 3 else (None, [])
def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None
def base(name):
    return name.split("(")[0].split("<")[0].split()[-1]
th, tr = load(sys.argv[1])
dh, dr = load(sys.argv[2])
region = sys.argv[3]
tot = collections.Counter()
if th:
    ki, ti = th.index("Kernel Name"), th.index("gpu__time_duration.sum")
    for r in tr:
        tot[base(r[ki])] += num(r[ti]) or 0
all_ns = sum(tot.values()) or 1
print(f"\n{region}: {len(tr)} kernel launches, {all_ns/1e3:.1f} µs in all; the three heaviest:\n")
print("| kernel | share of time | launches profiled | DRAM throughput % of peak | SM throughput % | tensor pipe % | top stalls (warp-cycles per issue) |")
print("|---|---:|---:|---:|---:|---:|---|")
if not dh:
    print("| (the detail pass gave nothing: see ncu-%s.log) | | | | | | |" % region)
    sys.exit(0)
ki = dh.index("Kernel Name")
def col(pred):
    return [i for i, h in enumerate(dh) if pred(h)]
dram = col(lambda h: h == "dram__throughput.avg.pct_of_peak_sustained_elapsed")
sm = col(lambda h: h == "sm__throughput.avg.pct_of_peak_sustained_elapsed")
tensor = col(lambda h: "pipe_tensor" in h and h.endswith("pct_of_peak_sustained_active"))
stalls = col(lambda h: h.startswith("smsp__average_warp_latency_issue_stalled_") or
             (h.startswith("smsp__average_warps_issue_stalled_") and h.endswith("_per_issue_active.ratio")))
by = collections.defaultdict(list)
for r in dr:
    by[base(r[ki])].append(r)
def mean(rows, idx):
    v = [num(r[i]) for r in rows for i in idx[:1] if num(r[i]) is not None]
    return f"{sum(v)/len(v):.0f}" if v else "n/a"
for k, _ in tot.most_common(3):
    rows = by.get(k, [])
    st = collections.Counter()
    for r in rows:
        for i in stalls:
            st[dh[i].replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "").replace("smsp__average_warp_latency_issue_stalled_", "")] += num(r[i]) or 0
    top = ", ".join(f"{n} {v/len(rows):.1f}" for n, v in st.most_common(3)) if rows else "n/a"
    print(f"| {k} | {100*tot[k]/all_ns:.0f}% | {len(rows)} | {mean(rows, dram)} | {mean(rows, sm)} | "
          f"{mean(rows, tensor)} | {top} |")
PY
done
