#!/usr/bin/env bash
# A timed A/B of two commits: each checked out in a worktree of its own, then fusionplan-bench run on
# each in alternating rounds (old, new, old, new, ...) on the same GPU in one job, and the fused
# times compared per case (scripts/ab_compare.py: medians over rounds, geomean of new/old):
#   scripts/ab_commits.sh OLD NEW OUTDIR [fusionplan-bench options...]
# e.g. scripts/ab_commits.sh d3542b0 HEAD /tmp/ab --layers all --precisions fp16,bf16 --layouts NHWC,NCHW \
#        --modes CBNA --graph --baselines none --no-plots
# A first untimed run per tree compiles (each tree has a cache of its own); then ROUNDS (default 3)
# rounds per tree.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
old=${1:?usage: scripts/ab_commits.sh OLD NEW OUTDIR [bench options]} new=${2:?} out=${3:?}
shift 3
mkdir -p "$out"
root=$(mktemp -d)
git worktree add -q --detach "$root/old" "$old" && git worktree add -q --detach "$root/new" "$new" || exit 2
trap 'git worktree remove --force "$root/old"; git worktree remove --force "$root/new"; rm -rf "$root"' EXIT
bench() {  # TREE NAME: one run of the bench on TREE's sources and cache, into OUTDIR/NAME
  (cd "$root/$1" && PYTHONPATH="src" FUSIONPLAN_CACHE_DIR="$root/cache-$1" \
    python -m fusionplan.tools.bench.cli "${args[@]}" --out "$out/$2" > "$out/$2.log" 2>&1)
  echo "$2: exit $?"
}
args=("$@")
for tree in old new; do bench "$tree" "warm-$tree"; done  # compiles; not compared
for ((round = 1; round <= ${ROUNDS:-3}; round++)); do
  for tree in old new; do bench "$tree" "$tree-$round"; done
done
python scripts/ab_compare.py "$out"
