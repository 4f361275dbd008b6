#!/bin/bash
# The measurement campaign of docs/benchmarks.md, one benchmark at a time
# (run it on an otherwise idle machine). Writes reports and JSON to ${OUT:-runs/bench}.
# Needs the test environment (torch, transformers) and, for the last three, libtpu.
set -u
cd "$(dirname "$0")/.."
O=${OUT:-runs/bench}
mkdir -p "$O"
B="python -m launch.bench --config configs/bert.py:base --batch 8 --seq 128 --compare-hf"
for i in 1 2 3; do
  $B --mode forward --iters 16 --json $O/C2_fwd_$i.json > $O/C2_fwd_$i.txt 2>&1
  $B --mode train --iters 10 --json $O/C1_train_$i.json > $O/C1_train_$i.txt 2>&1
done
$B --mode forward --iters 16 --config.model.attention_impl=xla --json $O/C2_fwd_xla.json > $O/C2_fwd_xla.txt 2>&1
$B --mode train --iters 10 --config.model.attention_impl=xla --json $O/C1_train_xla.json > $O/C1_train_xla.txt 2>&1
$B --mode train --iters 10 --config.objective.max_predictions=0 --json $O/C3_train_allpos.json > $O/C3_train_allpos.txt 2>&1
L="python -m launch.bench --config configs/albert.py:base --batch 8 --seq 128 --compare-hf"
for i in 1 2 3; do
  $L --mode forward --iters 16 --json $O/AL_fwd_$i.json > $O/AL_fwd_$i.txt 2>&1
  $L --mode train --iters 10 --json $O/AL_train_$i.json > $O/AL_train_$i.txt 2>&1
done
R="python -m launch.bench --config configs/roberta.py:base --batch 8 --seq 128 --mode train --config.objective.max_predictions=20 --iters 10"
$R --packed=lognormal:32:1.0 --json $O/P1.json > $O/P1.txt 2>&1
$R --packed=uniform:8:128 --json $O/P2.json > $O/P2.txt 2>&1
A="python -m launch.aot --config configs/bert.py:base --topology v5p:2x2x1 --global_batch 128 --seq 512 --config.objective.max_predictions=80 --config.model.attention_probs_dropout_prob=0"
$A --config.model.attention_impl=splash --json $O/A3.json > $O/A3.txt 2>&1
$A --config.model.attention_impl=xla --json $O/A2.json > $O/A2.txt 2>&1
$A --config.model.attention_impl=splash --global_batch 256 --json $O/A9.json > $O/A9.txt 2>&1
python -m launch.aot --config configs/albert.py:base --topology v5p:2x2x1 --global_batch 128 --json $O/AL_aot.json > $O/AL_aot.txt 2>&1
grep -H "ratio\|implied MFU" $O/*.txt
