"""Benchmarks: tokens/s, step time, achieved FLOP/s, MFU and peak memory of the jitted
forward pass or train step, optionally side by side with the `transformers` PyTorch
implementation of the same model in the same run.

  python -m launch.bench --config configs/bert.py:base --mode train --batch 8 --seq 128
  python -m launch.bench --config configs/bert.py:base --mode forward --compare-hf
  python -m launch.bench --config configs/roberta.py:base --mode train \\
      --packed=lognormal:32:1.0                       # packed vs padded documents
  ... [--iters 10 --warmup 2 --json out.json --config.model.attention_impl=einsum ...]
  python -m launch.bench --config configs/bert.py:tiny --mode loop --steps 100 \
      --compare-hf --workdir /tmp/loop_wd          # the whole training loop (loop.py)

How it measures:
- forward: the objective's inference forward (`model.apply` on every position, all heads
  the config has), jitted with the params and batch sharded by the config's mesh and
  logical rules.
- train: the real trainer step, `launch.trainer.build(config, tokenizer).train_step`
  (the objective's on-device transform, loss, grads, clipping, optimizer update, donated
  state), with the objective's settings (e.g. the MLM head on its prediction budget of
  gathered masked positions only).
- Batches are synthetic, built from the objective's batch spec (launch/perf/synthetic.py:
  what the pipeline's rows hold for this objective) and already on the device: no data
  pipeline, no host-to-device copy in the timing.
- The step is compiled ahead of the timing (compile time reported), run `--warmup` times,
  then timed `--iters` times one call at a time (each waited on); the median and the best
  iteration are reported. With `--compare-hf` the two frameworks' timed iterations
  alternate (ours, theirs, ours, ...), so background load on a shared machine hits both
  alike; the ratio is the median over iterations of theirs_i / ours_i (and best vs best).
- FLOPs: the objective's count (`flops_per_example`, from the family's count); MFU =
  achieved FLOP/s / peak, where peak is the chip's published bf16 peak on TPU/GPU
  (launch/trainer/devices.py), and on the CPU the best FLOP/s of a 2048^3 dense matmul in the
  compute dtype, measured by this run just before and just after its timed iterations
  (JAX's, and with `--compare-hf` torch's too; not the trainer's cached figure, since this
  machine's rate moves from day to day). The report prints each rate, warns when they
  moved more than 10% during the run, and gives transformers' share of the peak, so that
  a ratio from a run where the reference ran below its usual efficiency can be seen.
- Peak memory: XLA's buffer assignment of the compiled step (arguments + outputs -
  donated aliases + temporaries, per device); the device's measured peak where it reports
  one (TPU/GPU), else the process's peak RSS after our warmup (CPU).
- `--compare-hf`: our initial params are exported by the objective and loaded into
  the transformers class of the same architecture (identical weights; in forward mode
  the max |difference| of the last hidden state is printed as a check). Same batch,
  length and precision (bf16: torch autocast, params f32, as ours). Train step in torch:
  forward with the objective's labels (`reference_inputs`: MLM labels at ~15% of the
  tokens, the pair label when the objective has a pair task), backward, gradient
  clipping as configured, torch.optim.AdamW with the config's hyper-parameters and
  weight decay off biases/norms. transformers decodes
  every position in its MLM head; the FLOPs reported for it count that.
- `--packed=DIST`: effective (real-token) throughput of variable-length documents,
  packed into rows of `--seq` with segment ids vs one document per row padded to the
  batch maximum (rounded up to `--pad_multiple`, as a collator's pad_to_multiple_of
  would). `--batch * --iters` documents with lengths (special tokens included) from DIST:
  `uniform:LO:HI`, `lognormal:MEDIAN:SIGMA` (clipped to [8, seq]) or `fixed:N`. Both
  variants process exactly those documents; every shape is compiled and run once before
  the timed passes (`--passes`; packed and padded passes alternate, so a slow spell of
  the machine hits both; best pass reported, and the median of the back-to-back pairs).

- loop: see launch/perf/bench/loop.py (the real trainer loop by phase, CPU time and page
  faults, next to a same-work transformers loop). Every mode runs with the host
  allocator of launch/trainer/hostmem.py, as launch.pretrain does (`--malloc system`: glibc's
  defaults).

Layout: models.py (ours), theirs.py (transformers' side: torch), runs.py (the runs),
loop.py (--mode loop), report.py; the command is launch/bench.py.
"""
from launch.perf.bench.models import Ours
from launch.perf.bench.report import format_report
from launch.perf.bench.runs import bench_packed, bench_step

__all__ = ["Ours", "bench_step", "bench_packed", "format_report"]
