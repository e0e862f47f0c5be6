#!/usr/bin/env bash
# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
#
# Runs commands side by side, every line of a command's output prefixed with its label; waits for all of them and
# exits 1 if any failed (each one's exit status printed last, and a failed command's last 60 lines again: a CI log
# that keeps only its tail still shows which tests failed, also when the other command ran longer).
#
#   bash tools/side_by_side.sh LABEL COMMAND [LABEL COMMAND ...]
#
# `make test` runs the two stacks' suites this way: on 2 cores one suite alone leaves them partly idle (much of its
# time goes to process start-up: Ray, sglang's scheduler, verl's workers); the README gives both ways' CI timings.
set -uo pipefail

(($# >= 2 && $# % 2 == 0)) || { echo "usage: $0 LABEL COMMAND [LABEL COMMAND ...]" >&2; exit 2; }
labels=() pids=() logs=()
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT
while (($#)); do
  label=$1 command=$2
  shift 2
  # unbuffered: a line reaches the log when it is written, also when the command is killed
  log="$log_dir/${#labels[@]}.log"
  (set -o pipefail; PYTHONUNBUFFERED=1 bash -c "$command" 2>&1 | sed -u "s/^/[$label] /" | tee "$log") &
  labels+=("$label") pids+=($!) logs+=("$log")
done
status=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "[${labels[$i]}] passed"
  else
    rc=$?
    echo "[${labels[$i]}] FAILED (exit $rc); its last 60 lines again:"
    tail -n 60 "${logs[$i]}"
    status=1
  fi
done
exit $status
