#!/usr/bin/env bash
# Trace the teacher on a split in chunks and commit every finished chunk with its provenance, so
# an interrupted run loses at most one chunk. Run it from a separate worktree
# (`git worktree add ../long-job`) so refactors in the main checkout do not disturb it:
#
#   tools/trace_in_chunks.sh SPLIT CHUNK UNTIL [PROFILE]
#   e.g. tools/trace_in_chunks.sh train 250 1500      # requests 1-250, 251-500, ... of the subset order
#
# Each chunk is `python -m ooospec.training.teacher --limit N --commit <profile>-<split>-<N> --new-only`: the
# stage for limit N reuses every record traced for smaller limits, traces the rest, and commits
# only the records no committed set holds yet (artifacts/committed/teacher/<name>/).
set -euo pipefail
split=${1:?split}; chunk=${2:?chunk size}; until=${3:?last limit}; profile=${4:-cpu}
py=${PYTHON:-.venv/bin/python}
for ((limit = chunk; limit <= until; limit += chunk)); do
  name=$(printf '%s-%s-%05d' "$profile" "$split" "$limit")
  [[ -d artifacts/committed/teacher/$name ]] && continue
  OMP_NUM_THREADS=1 "$py" -m ooospec.training.teacher --split "$split" --limit "$limit" --profile "$profile" \
      --threads 1 --commit "$name" --new-only
  if [[ -d artifacts/committed/teacher/$name ]]; then
    git add "artifacts/committed/teacher/$name"
    git commit -q -m "Teacher traces: $split requests up to $limit of the subset order ($name)"
  fi
done
