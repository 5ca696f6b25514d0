#!/bin/bash
# Peak resident memory of `solar convert` on edge lists of 4·10^6 edges over 10^6 nodes (CSV,
# .csv.gz, .npy) at two budgets (issue 45; docs/performance.md "Graphs in").
# usage: bench/edge_lists.sh DIR   (DIR: scratch space for ~0.3 GB of inputs and outputs)
set -euo pipefail
D=${1:?scratch dir}; mkdir -p "$D"
python - "$D" <<'PY'
import gzip, shutil, sys
import numpy as np
d = sys.argv[1]
ids = np.random.default_rng(0).integers(0, 1_000_000, (4_000_000, 2))
np.savetxt(f"{d}/e4m.csv", ids, fmt="%d", delimiter=",", header="src,dst", comments="")
np.save(f"{d}/e4m.npy", ids)
with open(f"{d}/e4m.csv", "rb") as a, gzip.open(f"{d}/e4m.csv.gz", "wb", compresslevel=1) as b:
    shutil.copyfileobj(a, b)
PY
for mem in 16MiB 1GiB; do
  for src in e4m.csv e4m.csv.gz "e4m.npy --nodes 1000000"; do
    set -- $src
    out=$(/usr/bin/time -v solar convert "$D/$1" "$D/out.h5" --force --memory $mem "${@:2}" 2>&1)
    echo "$mem $src peak_kB=$(echo "$out" | awk '/Maximum resident/ {print $6}')" \
         "elapsed=$(echo "$out" | awk '/Elapsed/ {print $8}')"
  done
done
