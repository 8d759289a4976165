#!/usr/bin/env bash
# One stretch on a lent GPU machine (engine/nets/PROVENANCE.md, "A GPU stretch"): Stockfish labels
# on every core for LABEL_S seconds, then the bundled 6x64 continued on the GPU on those labels
# (config teacher-6x64-gpu) for at most TRAIN_S seconds. Such a machine starts bare and keeps
# nothing, so what must come back goes into OUT_DIR: the labels (the run's replay store, in parts
# of 15 MB: about 90 bytes a position), the last checkpoint (in parts), the logs and the run's
# JSON records.
#   docs/recipes/gpu-stretch.sh OUT_DIR LABEL_S TRAIN_S [STOCKFISH] [DEVICE] [SEED]
# What comes back from such a machine is at most 8 files of 16 MB, 64 MB in all: with the checkpoint
# and the four small files that leaves three parts of labels, about 500,000 positions, which 16
# cores label in about 290 s (1,690 positions/s measured); give LABEL_S no more than that.
# Here again:  cat OUT/replay.tar.part-* | tar -x -C RUN   (a run directory of its own, or merge
# the chunks into another run: copy replay/chunks/* and append replay/manifest.jsonl to its own)
#              cat OUT/checkpoint.pt.part-* > step.pt; cyzero-train export --checkpoint step.pt ...
set -u
out=${1:?OUT_DIR}; label_s=${2:?LABEL_S}; train_s=${3:?TRAIN_S}
teacher=${4:-/usr/games/stockfish}; device=${5:-cuda:0}; seed=${6:-7}
run=${STRETCH_RUN:-/tmp/stretch-run}
mkdir -p "$out" "$run"
stamp() { echo "$(date -u +%H:%M:%S) $*" | tee -a "$out/stretch.log"; }
stamp "start: $(nproc) cores, labels for ${label_s}s, then $device for at most ${train_s}s"
# SIGTERM ends the labelling: the games already committed stay in the store, those in play are lost
timeout -s TERM "$label_s" cyzero-train bootstrap "$run" --teacher "$teacher" --positions 100000000 \
  --workers "$(nproc)" --seed "$seed" --no-progress > "$out/bootstrap.log" 2>&1
stamp "labels done (exit $?)"
cyzero-train status "$run" | tee -a "$out/stretch.log"
tar -C "$run" -cf - replay/manifest.jsonl replay/chunks | split -b 15M -d -a 1 - "$out/replay.tar.part-"
# the learner stops at the config's cap of samples per position, or answers SIGTERM with a final checkpoint
timeout -s TERM "$train_s" cyzero-train learn "$run" --devices "$device" --config teacher-6x64-gpu \
  --init-from "$PWD/engine/nets/default.onnx" --no-progress > "$out/learn.log" 2>&1
stamp "learning done (exit $?)"
cyzero-train status "$run" | tee -a "$out/stretch.log"
last=$(ls "$run"/checkpoints/step-*.pt 2>/dev/null | sort | tail -1)
if [ -n "$last" ]; then
  stamp "checkpoint $(basename "$last") $(stat -c %s "$last") bytes, sha256 $(sha256sum "$last" | cut -c1-64)"
  split -b 15M -d -a 1 "$last" "$out/checkpoint.pt.part-"
fi
tar -C "$run" -czf "$out/records.tgz" --ignore-failed-read metrics.jsonl generations.jsonl \
  config.effective.toml 2>/dev/null
stamp "end"
