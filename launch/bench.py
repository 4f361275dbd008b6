"""Benchmarks: tokens/s, step time, achieved FLOP/s, MFU and peak memory of the jitted
forward pass or train step, optionally side by side with the `transformers` PyTorch
implementation of the same model in the same run.

  python -m launch.bench --config configs/bert.py:base --mode train --batch 8 --seq 128
  python -m launch.bench --config configs/bert.py:base --mode forward --compare-hf
  python -m launch.bench --config configs/roberta.py:base --mode train \\
      --packed=lognormal:32:1.0                       # packed vs padded documents
  ... [--iters 10 --warmup 2 --json out.json --config.model.attention_impl=einsum ...]

How it measures:
- forward: `model.apply` on every position (all heads the config has), jitted with the
  params and batch sharded by the config's mesh and logical rules.
- train: the real trainer step, `launch.train.build(config, tokenizer).train_step`
  (on-device masking, loss, grads, clipping, AdamW update, donated state), with the
  objective's settings (e.g. `objective.max_predictions`: the MLM head on gathered
  masked positions only).
- Batches are synthetic, shaped like the data pipeline's (input_ids, segment_ids,
  token_type_ids, position_ids, special_tokens_mask, word_starts [, next_sentence_label])
  and already on the device: no data pipeline, no host-to-device copy in the timing.
- The step is compiled ahead of the timing (compile time reported), run `--warmup` times,
  then timed `--iters` times one call at a time (each waited on); the median and the best
  iteration are reported. With `--compare-hf` the two frameworks' timed iterations
  alternate (ours, theirs, ours, ...), so background load on a shared machine hits both
  alike; the ratio is the median over iterations of theirs_i / ours_i (and best vs best).
- FLOPs: `launch.flops` (documented there); MFU = achieved FLOP/s / peak, where peak is
  the chip's published bf16 peak on TPU/GPU, and on the CPU the measured FLOP/s of a large
  dense matmul in the compute dtype (measured by this run).
- Peak memory: XLA's buffer assignment of the compiled step (arguments + outputs -
  donated aliases + temporaries, per device); the device's measured peak where it reports
  one (TPU/GPU), else the process's peak RSS after our warmup (CPU).
- `--compare-hf`: our initial params are exported with `encoders.to_hf` and loaded into
  the transformers class of the same architecture (identical weights; in forward mode
  the max |difference| of the last hidden state is printed as a check). Same batch,
  length and precision (bf16: torch autocast, params f32, as ours). Train step in torch:
  forward with labels (MLM labels at ~15% of the tokens, NSP labels when the
  objective has NSP), backward, gradient clipping as configured, torch.optim.AdamW with
  the config's hyper-parameters and weight decay off biases/norms. transformers decodes
  every position in its MLM head; the FLOPs reported for it count that.
- `--packed=DIST`: effective (real-token) throughput of variable-length documents,
  packed into rows of `--seq` with segment ids vs one document per row padded to the
  batch maximum (rounded up to `--pad_multiple`, as a collator's pad_to_multiple_of
  would). `--batch * --iters` documents with lengths (special tokens included) from DIST:
  `uniform:LO:HI`, `lognormal:MEDIAN:SIGMA` (clipped to [8, seq]) or `fixed:N`. Both
  variants process exactly those documents; every shape is compiled and run once before
  the timed passes (`--passes`, best pass reported).
"""
import dataclasses
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

FIRST_REGULAR_ID = 6  # ids below are reserved for the synthetic special tokens
MIN_DOC_LEN = 8


# ---------------------------------------------------------------------------- inputs


@dataclasses.dataclass
class SyntheticTokenizer:
  """What the trainer and objectives need of a tokenizer, without one: the vocabulary
  size and the special ids (the model's pad id; the other specials are small ids)."""
  vocab_size: int
  pad_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  unk_id: int

  @classmethod
  def for_model(cls, model_config) -> "SyntheticTokenizer":
    pad = int(model_config.pad_token_id)
    others = [i for i in range(FIRST_REGULAR_ID) if i != pad]
    return cls(vocab_size=int(model_config.vocab_size), pad_id=pad, cls_id=others[0],
               sep_id=others[1], mask_id=others[2], unk_id=others[3])

  @property
  def special_ids(self):
    return (self.cls_id, self.sep_id, self.pad_id, self.mask_id, self.unk_id)


def _empty_rows(batch: int, seq: int, tok: SyntheticTokenizer) -> Dict[str, np.ndarray]:
  return {
      "input_ids": np.full((batch, seq), tok.pad_id, np.int32),
      "segment_ids": np.zeros((batch, seq), np.int32),
      "token_type_ids": np.zeros((batch, seq), np.int32),
      "position_ids": np.zeros((batch, seq), np.int32),
      "special_tokens_mask": np.ones((batch, seq), bool),
      "word_starts": np.ones((batch, seq), bool),
  }


def _place(b, row: int, start: int, length: int, segment: int, tok, rng, pair=False):
  """Writes one document ([CLS] ... [SEP], or [CLS] A [SEP] B [SEP] when `pair`)."""
  sl = slice(start, start + length)
  ids = rng.randint(FIRST_REGULAR_ID, tok.vocab_size, length).astype(np.int32)
  special = np.zeros(length, bool)
  types = np.zeros(length, np.int32)
  ids[0], ids[-1] = tok.cls_id, tok.sep_id
  special[0] = special[-1] = True
  if pair and length >= 5:
    mid = length // 2
    ids[mid] = tok.sep_id
    special[mid] = True
    types[mid + 1:] = 1
  b["input_ids"][row, sl] = ids
  b["segment_ids"][row, sl] = segment
  b["position_ids"][row, sl] = np.arange(length)
  b["token_type_ids"][row, sl] = types
  b["special_tokens_mask"][row, sl] = special
  b["word_starts"][row, sl] = special | (rng.rand(length) < 0.75)


def full_batch(config, batch: int, seq: int, seed: int = 0) -> Dict[str, np.ndarray]:
  """`batch` rows of one full-length document each (a sentence pair when the objective
  has NSP), like the pipeline's rows."""
  tok = SyntheticTokenizer.for_model(config.model)
  rng = np.random.RandomState(seed)
  b = _empty_rows(batch, seq, tok)
  nsp = config.objective.name == "mlm_nsp"
  for r in range(batch):
    _place(b, r, 0, seq, 1, tok, rng, pair=nsp)
  if nsp:
    b["next_sentence_label"] = rng.randint(0, 2, batch).astype(np.int32)
  return b


def doc_lengths(spec: str, count: int, seq: int, seed: int = 0) -> np.ndarray:
  """Document lengths (special tokens included) from `uniform:LO:HI`,
  `lognormal:MEDIAN:SIGMA` or `fixed:N`, clipped to [MIN_DOC_LEN, seq]."""
  rng = np.random.RandomState(seed)
  kind, *args = spec.split(":")
  try:
    vals = [float(a) for a in args]
  except ValueError:
    vals = None
  if kind == "uniform" and vals and len(vals) == 2:
    n = rng.randint(int(vals[0]), int(vals[1]) + 1, count)
  elif kind == "lognormal" and vals and len(vals) == 2:
    n = np.round(vals[0] * np.exp(vals[1] * rng.randn(count)))
  elif kind == "fixed" and vals and len(vals) == 1:
    n = np.full(count, vals[0])
  else:
    raise ValueError(f"--packed={spec!r}: use uniform:LO:HI, lognormal:MEDIAN:SIGMA or "
                     "fixed:N")
  return np.clip(n, MIN_DOC_LEN, seq).astype(np.int64)


def pack_first_fit(lengths: Sequence[int], seq: int) -> List[List[int]]:
  """Document indices per row: each document goes to the first row with room."""
  rows, room = [], []
  for i, n in enumerate(lengths):
    for r, free in enumerate(room):
      if free >= n:
        rows[r].append(i)
        room[r] -= n
        break
    else:
      rows.append([i])
      room.append(seq - n)
  return rows


def packed_batches(config, lengths, batch: int, seq: int, seed: int = 0):
  """Documents packed into rows of `seq` (segment ids 1, 2, ... per row), `batch` rows
  per batch; the last batch is filled up with empty rows."""
  tok = SyntheticTokenizer.for_model(config.model)
  rng = np.random.RandomState(seed)
  rows = pack_first_fit(lengths, seq)
  out = []
  for s in range(0, len(rows), batch):
    b = _empty_rows(batch, seq, tok)
    for r, docs in enumerate(rows[s:s + batch]):
      p = 0
      for k, d in enumerate(docs, 1):
        _place(b, r, p, int(lengths[d]), k, tok, rng)
        p += int(lengths[d])
    _add_nsp(config, b, rng)
    out.append(b)
  return out


def padded_batches(config, lengths, batch: int, seq: int, pad_multiple: int, seed: int = 0):
  """One document per row, `batch` documents per batch in the given order, padded to the
  longest of the batch rounded up to `pad_multiple` (at most `seq`)."""
  tok = SyntheticTokenizer.for_model(config.model)
  rng = np.random.RandomState(seed)
  out = []
  for s in range(0, len(lengths), batch):
    group = [int(n) for n in lengths[s:s + batch]]
    t = min(seq, -(-max(group) // pad_multiple) * pad_multiple)
    b = _empty_rows(batch, t, tok)
    for r, n in enumerate(group):
      _place(b, r, 0, n, 1, tok, rng)
    _add_nsp(config, b, rng)
    out.append(b)
  return out


def _add_nsp(config, b, rng):
  if config.objective.name == "mlm_nsp":
    b["next_sentence_label"] = rng.randint(0, 2, b["input_ids"].shape[0]).astype(np.int32)


def real_tokens(b) -> int:
  return int((b["segment_ids"] > 0).sum())


# ---------------------------------------------------------------------------- helpers


def machine_info() -> Dict[str, Any]:
  import jax
  cpu = platform.processor() or ""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  dev = jax.devices()[0]
  info = {"cpu": cpu, "cpu_cores": os.cpu_count(), "platform": dev.platform,
          "device_kind": getattr(dev, "device_kind", ""), "devices": jax.device_count(),
          "jax": jax.__version__, "python": platform.python_version(),
          "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "hostname": platform.node()}
  try:
    import torch
    import transformers
    info.update(torch=torch.__version__, transformers=transformers.__version__,
                torch_threads=torch.get_num_threads())
  except ImportError:
    pass
  return info


def memory_bytes(compiled) -> Optional[int]:
  """Per-device bytes XLA assigned to the compiled program's buffers at once: arguments
  + outputs - donated (aliased) + temporaries."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pragma: no cover - backends without the analysis
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
             + m.temp_size_in_bytes)


def measured_peak_bytes() -> Dict[str, Any]:
  import jax
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    return {"device_peak_bytes": int(stats["peak_bytes_in_use"])}
  return {"process_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _median(xs):
  return statistics.median(xs) if xs else float("nan")


def _stats(times, tokens, flops, peak, devices) -> Dict[str, Any]:
  t, best = _median(times), min(times)
  return {"step_time_s": t, "best_step_time_s": best,
          "step_times_s": [round(x, 6) for x in times],
          "tokens_per_s": tokens / t, "best_tokens_per_s": tokens / best,
          "flops_per_step": flops, "flops_per_s": flops / t,
          "mfu": flops / t / (peak * devices) if peak else None,
          "best_mfu": flops / best / (peak * devices) if peak else None}


def _config_copy(config, batch: int, seq: int):
  import jax
  import ml_collections
  from encoders import base
  c = ml_collections.ConfigDict(config.to_dict())
  c.data.global_batch = batch
  c.data.seq_len = seq
  base.resolve_auto(c.model, jax.devices()[0].platform)  # explicit in the run and report
  return c


# ---------------------------------------------------------------------------- ours


class Ours:
  """Our jitted step (forward or train) for one config, with per-shape compiled programs."""

  def __init__(self, config, mode: str, devices=None):
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import encoders
    from launch import sharding as shard_lib
    self.config, self.mode = config, mode
    self.compiled, self.compile_s, self.memory = {}, {}, {}
    if mode == "train":
      from launch import train
      self.tok = SyntheticTokenizer.for_model(config.model)
      self.setup = train.build(config, self.tok, devices)
      self.mesh, self.batch_sharding = self.setup.mesh, self.setup.batch_sharding
      self.rules = shard_lib.rules_tuple(config.mesh.rules)
      self.state = self.setup.init_state()
      self.model = self.setup.objective.modules["encoder"]  # what --compare-hf exports
      self.fn = self.setup.train_step
    elif mode == "forward":
      self.mesh = shard_lib.make_mesh(config.mesh.shape, devices)
      self.rules = shard_lib.rules_tuple(config.mesh.rules)
      self.model = model = encoders.build(config.model)
      ids = jnp.zeros((1, config.data.seq_len), jnp.int32)
      init = lambda key: model.init(key, ids)["params"]
      key = jax.random.PRNGKey(config.train.seed)
      with nn.logical_axis_rules(self.rules):
        boxed = jax.eval_shape(init, key)
      shardings = shard_lib.logical_shardings(boxed, self.mesh, self.rules)

      def init_unboxed(k):
        with nn.logical_axis_rules(self.rules):
          return nn.unbox(init(k))

      self.params = jax.jit(init_unboxed, out_shardings=shardings)(key)
      self.batch_sharding = shard_lib.batch_sharding(self.mesh, self.rules)

      def forward(params, b):  # the pipeline's segment ids: packed rows stay apart
        with nn.logical_axis_rules(self.rules):
          return model.apply({"params": params}, b["input_ids"],
                             attention_mask=(b["segment_ids"] > 0).astype(jnp.int32),
                             token_type_ids=b["token_type_ids"],
                             segment_ids=b["segment_ids"])

      self.fn = shard_lib.MeshJit(
          self.mesh, jax.jit(forward, in_shardings=(shardings, self.batch_sharding)))
    else:
      raise ValueError(f"--mode must be forward or train, got {mode!r}")

  def device_batch(self, host_batch):
    from launch import sharding as shard_lib
    return shard_lib.global_batch(host_batch, self.batch_sharding)

  def params_for_export(self):
    import jax
    if self.mode == "train":
      return jax.device_get(self.state.params["encoder"])
    return jax.device_get(self.params)

  def _shape_key(self, b):
    return tuple(b["input_ids"].shape)

  def compile(self, b):
    key = self._shape_key(b)
    if key not in self.compiled:
      t = time.perf_counter()
      args = (self.state, b) if self.mode == "train" else (self.params, b)
      self.compiled[key] = self.fn.lower(*args).compile()
      self.compile_s[key] = time.perf_counter() - t
      self.memory[key] = memory_bytes(self.compiled[key])
    return self.compiled[key]

  def step(self, b):
    """Runs one step on a device batch and waits for it; returns seconds."""
    import jax
    fn = self.compile(b)
    t = time.perf_counter()
    if self.mode == "train":
      self.state, sums = fn(self.state, b)
      jax.block_until_ready((self.state, sums))
    else:
      jax.block_until_ready(fn(self.params, b))
    return time.perf_counter() - t

  def forward_flops_per_row(self, seq: int, all_positions: bool = False) -> float:
    from launch import flops
    if self.mode == "train" and not all_positions:
      return self.setup.objective.forward_flops(seq)
    return flops.encoder_forward_flops(self.config.model, seq)

  def step_flops(self, batch: int, seq: int) -> float:
    mult = 3.0 if self.mode == "train" else 1.0
    return mult * batch * self.forward_flops_per_row(seq)


# ---------------------------------------------------------------------------- theirs


class Theirs:
  """The transformers PyTorch model of the same architecture, loaded with our weights."""

  def __init__(self, config, mode: str, model, params):
    import torch
    import transformers
    import encoders
    self.config, self.mode = config, mode
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "hf")
      encoders.to_hf(model, params, path)
      with open(os.path.join(path, "config.json")) as f:
        self.arch = json.load(f)["architectures"][0]
      self.model = getattr(transformers, self.arch).from_pretrained(path)
    self.attn_implementation = getattr(self.model.config, "_attn_implementation", None)
    self.autocast = config.model.dtype != "float32"
    self.torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        config.model.dtype)
    if mode == "train":
      self.model.train()
      o = config.optimizer
      if o.name != "adamw":
        raise ValueError("--compare-hf trains transformers with AdamW; set "
                         "--config.optimizer.name=adamw")
      decay = [p for n, p in self.model.named_parameters()
               if p.ndim >= 2 and "norm" not in n.lower()]
      no_decay = [p for n, p in self.model.named_parameters()
                  if not (p.ndim >= 2 and "norm" not in n.lower())]
      self.opt = torch.optim.AdamW(
          [{"params": decay, "weight_decay": o.weight_decay},
           {"params": no_decay, "weight_decay": 0.0}],
          lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    else:
      self.model.eval()

  def inputs(self, host_batch, seed: int = 0):
    import torch
    b = host_batch
    x = {"input_ids": torch.from_numpy(b["input_ids"].astype(np.int64)),
         "attention_mask": torch.from_numpy((b["segment_ids"] > 0).astype(np.int64)),
         "token_type_ids": torch.from_numpy(b["token_type_ids"].astype(np.int64))}
    if self.mode == "train":
      # The data collator's work (outside the timed step): ~15% of the tokens masked.
      rng = np.random.RandomState(seed)
      cand = ~b["special_tokens_mask"]
      pick = cand & (rng.rand(*cand.shape) < self.config.objective.mask_rate)
      labels = np.where(pick, b["input_ids"], -100).astype(np.int64)
      ids = np.where(pick, SyntheticTokenizer.for_model(self.config.model).mask_id,
                     b["input_ids"]).astype(np.int64)
      x["input_ids"] = torch.from_numpy(ids)
      x["labels"] = torch.from_numpy(labels)
      if self.arch.endswith("ForPreTraining"):
        x["next_sentence_label"] = torch.from_numpy(
            b["next_sentence_label"].astype(np.int64))
    return x

  def _autocast(self):
    import contextlib
    import torch
    if not self.autocast:
      return contextlib.nullcontext()
    return torch.autocast(device_type="cpu", dtype=self.torch_dtype)

  def run(self, x):
    import torch
    if self.mode == "train":
      with self._autocast():
        loss = self.model(**x).loss
      loss.backward()
      clip = self.config.optimizer.clip_norm
      if clip and clip > 0:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
      self.opt.step()
      self.opt.zero_grad(set_to_none=True)
      return loss
    with torch.inference_mode(), self._autocast():
      return self.model(**x, output_hidden_states=True)

  def step(self, x) -> float:
    t = time.perf_counter()
    self.run(x)
    return time.perf_counter() - t

  def step_flops(self, batch: int, seq: int) -> float:
    from launch import flops
    mult = 3.0 if self.mode == "train" else 1.0
    return mult * batch * flops.encoder_forward_flops(self.config.model, seq)


# ---------------------------------------------------------------------------- runs


def peak(config) -> float:
  import jax
  from launch import flops
  return flops.peak_flops(jax.devices()[0], config.model.dtype)


def _check_platform(config):
  import jax
  if config.model.attention_impl == "splash" and jax.devices()[0].platform != "tpu":
    raise SystemExit("attention_impl=splash is a TPU kernel and cannot run on "
                     f"{jax.devices()[0].platform}; check it with `python -m launch.aot` "
                     "(compiles for a Cloud TPU topology) or pick xla/einsum here.")


def bench_step(config, mode: str = "train", batch: int = 8, seq: int = 0, iters: int = 10,
               warmup: int = 2, compare_hf: bool = False, seed: int = 0,
               log=print) -> Dict[str, Any]:
  """Times our step (and transformers' with `compare_hf`) on full-length rows."""
  import jax
  seq = seq or config.data.seq_len
  config = _config_copy(config, batch, seq)
  _check_platform(config)
  result = {"mode": mode, "batch": batch, "seq": seq, "iters": iters, "warmup": warmup,
            "dtype": config.model.dtype, "config": _config_summary(config)}
  pk = peak(config)
  result["peak_flops_per_device"] = pk
  ours = Ours(config, mode)
  host = full_batch(config, batch, seq, seed)
  b = ours.device_batch(host)
  ours.compile(b)
  key = ours._shape_key(b)
  result["compile_s"] = ours.compile_s[key]
  for _ in range(warmup):
    ours.step(b)
  memory = {"xla_buffers_bytes": ours.memory[key], **measured_peak_bytes()}
  theirs = x = None
  if compare_hf:
    theirs = Theirs(config, mode, ours.model, ours.params_for_export())
    x = theirs.inputs(host, seed)
    if mode == "forward":
      result["max_abs_diff_last_hidden"] = _max_diff(ours, theirs, b, x, host)
    for _ in range(warmup):
      theirs.step(x)
  t_ours, t_theirs = [], []
  for _ in range(iters):
    t_ours.append(ours.step(b))
    if theirs is not None:
      t_theirs.append(theirs.step(x))
  n = jax.device_count()
  result["ours"] = _stats(t_ours, batch * seq, ours.step_flops(batch, seq), pk, n)
  result["ours"]["memory"] = memory
  if theirs is not None:
    result["theirs"] = _stats(t_theirs, batch * seq, theirs.step_flops(batch, seq), pk, 1)
    result["theirs"].update(architecture=theirs.arch,
                            attn_implementation=theirs.attn_implementation)
    # Iterations alternate, so iteration i of each side saw the same background load:
    # the median of the paired ratios is the headline; best-vs-best is shown too.
    result["ratio_tokens_per_s"] = _median([b / a for a, b in zip(t_ours, t_theirs)])
    result["ratio_best_tokens_per_s"] = min(t_theirs) / min(t_ours)
  return result


def _max_diff(ours, theirs, b, x, host) -> float:
  import jax
  out = ours.compile(b)(ours.params, b)
  mine = np.asarray(jax.device_get(out.last_hidden_state), np.float32)
  ref = theirs.run(x).hidden_states[-1].float().numpy()
  real = host["segment_ids"] > 0
  return float(np.abs(mine[real] - ref[real]).max())


def bench_packed(config, spec: str, mode: str = "train", batch: int = 8, seq: int = 0,
                 iters: int = 10, pad_multiple: int = 16, passes: int = 2, seed: int = 0,
                 log=print) -> Dict[str, Any]:
  """Real-token throughput of the same documents packed vs padded to the batch maximum."""
  import jax
  seq = seq or config.data.seq_len
  config = _config_copy(config, batch, seq)
  _check_platform(config)
  lengths = doc_lengths(spec, batch * iters, seq, seed)
  variants = {"packed": packed_batches(config, lengths, batch, seq, seed),
              "padded": padded_batches(config, lengths, batch, seq, pad_multiple, seed)}
  pk = peak(config)
  result = {"mode": mode, "batch": batch, "seq": seq, "docs": int(len(lengths)),
            "doc_lengths": spec, "pad_multiple": pad_multiple, "passes": passes,
            "mean_doc_len": float(lengths.mean()), "real_tokens": int(lengths.sum()),
            "dtype": config.model.dtype, "config": _config_summary(config),
            "peak_flops_per_device": pk}
  ours = Ours(config, mode)
  n = jax.device_count()
  for name, host_batches in variants.items():
    dev = [ours.device_batch(h) for h in host_batches]
    for b in dev:  # compile every shape, and run it once
      ours.step(b)
    totals = []
    for _ in range(passes):
      totals.append(sum(ours.step(b) for b in dev))
    best = min(totals)
    slots = sum(int(np.prod(h["input_ids"].shape)) for h in host_batches)
    flops = sum(ours.step_flops(h["input_ids"].shape[0], h["input_ids"].shape[1])
                for h in host_batches)
    result[name] = {
        "batches": len(host_batches), "shapes": sorted({tuple(h["input_ids"].shape)
                                                        for h in host_batches}),
        "token_slots": slots, "fill": result["real_tokens"] / slots,
        "time_s": best, "pass_times_s": [round(t, 4) for t in totals],
        "real_tokens_per_s": result["real_tokens"] / best,
        "slot_tokens_per_s": slots / best, "flops_per_s": flops / best,
        "mfu": flops / best / (pk * n) if pk else None}
  result["ratio_real_tokens_per_s"] = (result["packed"]["real_tokens_per_s"]
                                       / result["padded"]["real_tokens_per_s"])
  return result


def _config_summary(config) -> Dict[str, Any]:
  m, o = config.model, config.objective
  return {"family": m.family, "variant": m.variant, "layers": m.num_hidden_layers,
          "hidden": m.hidden_size, "heads": m.num_attention_heads,
          "intermediate": m.intermediate_size, "vocab_size": m.vocab_size,
          "vocab_pad_multiple": m.vocab_pad_multiple, "model_heads": list(m.heads),
          "dtype": m.dtype, "attention_impl": m.attention_impl,
          "remat_policy": m.remat_policy, "scan_layers": m.scan_layers,
          "hidden_dropout": m.hidden_dropout_prob,
          "attention_dropout": m.attention_probs_dropout_prob,
          "objective": o.name, "max_predictions": o.max_predictions,
          "mesh": list(config.mesh.shape)}


# ---------------------------------------------------------------------------- report


def _fmt_bytes(n):
  return "-" if n is None else f"{n / 2**30:.2f} GiB"


def _fmt_rate(x):
  return "-" if x is None else f"{x / 1e9:,.1f} GFLOP/s" if x < 1e12 else f"{x / 1e12:,.1f} TFLOP/s"


def _fmt_mfu(x):
  return "-" if x is None else f"{100 * x:.1f}%"


def format_report(r: Dict[str, Any]) -> str:
  c, m = r["config"], r.get("machine", {})
  lines = [f"encoder-zoo bench: {c['family']} {c['variant']} (L{c['layers']} H{c['hidden']} "
           f"A{c['heads']}), mode={r['mode']}, batch {r['batch']} x seq {r['seq']}, "
           f"{c['dtype']}, attention={c['attention_impl']}, remat={c['remat_policy']}, "
           f"scan_layers={c['scan_layers']}, objective={c['objective']} "
           f"(max_predictions={c['max_predictions']}), vocab_pad_multiple="
           f"{c['vocab_pad_multiple']}"]
  if m:
    lines.append(f"machine: {m.get('cpu')} ({m.get('cpu_cores')} cores), jax "
                 f"{m.get('platform')} x{m.get('devices')} {m.get('device_kind')}, "
                 f"{m.get('date')}")
  lines.append(f"peak per device: {_fmt_rate(r['peak_flops_per_device'])}"
               + (" (measured dense matmul)" if m.get("platform") == "cpu" else ""))
  if "ours" in r:
    o, t = r["ours"], r.get("theirs")
    lines.append(f"compile: {r['compile_s']:.1f} s")
    rows = [("step time (median)", lambda s: f"{s['step_time_s'] * 1e3:,.1f} ms"),
            ("step time (best)", lambda s: f"{s['best_step_time_s'] * 1e3:,.1f} ms"),
            ("tokens/s (median)", lambda s: f"{s['tokens_per_s']:,.0f}"),
            ("tokens/s (best)", lambda s: f"{s['best_tokens_per_s']:,.0f}"),
            ("FLOPs/step", lambda s: f"{s['flops_per_step'] / 1e9:,.1f} G"),
            ("achieved FLOP/s", lambda s: _fmt_rate(s["flops_per_s"])),
            ("MFU (median)", lambda s: _fmt_mfu(s["mfu"])),
            ("MFU (best)", lambda s: _fmt_mfu(s["best_mfu"]))]
    head = f"{'':22}{'ours (jax)':>22}"
    if t:
      head += f"{'transformers (torch)':>24}"
    lines.append(head)
    for name, f in rows:
      line = f"{name:22}{f(o):>22}"
      if t:
        line += f"{f(t):>24}"
      lines.append(line)
    mem = o["memory"]
    lines.append(f"{'peak memory':22}{_fmt_bytes(mem.get('xla_buffers_bytes')):>22}"
                 "  (XLA buffers per device)")
    if "device_peak_bytes" in mem:
      lines.append(f"{'':22}{_fmt_bytes(mem['device_peak_bytes']):>22}  (device peak)")
    else:
      lines.append(f"{'':22}{_fmt_bytes(mem.get('process_max_rss_bytes')):>22}"
                   "  (process max RSS after warmup)")
    if t:
      lines.append(f"transformers: {t['architecture']}, attn_implementation="
                   f"{t['attn_implementation']}")
      if "max_abs_diff_last_hidden" in r:
        lines.append(f"check: max |ours - theirs| of the last hidden state "
                     f"{r['max_abs_diff_last_hidden']:.2e}")
      lines.append(f"ratio ours/theirs (tokens/s): {r['ratio_tokens_per_s']:.2f}x (median of "
                   f"paired iterations), {r['ratio_best_tokens_per_s']:.2f}x (best vs best)")
  if "packed" in r:
    lines.append(f"{r['docs']} documents ({r['doc_lengths']}, mean {r['mean_doc_len']:.1f} "
                 f"tokens, {r['real_tokens']} real tokens); padded to the batch max rounded "
                 f"up to {r['pad_multiple']}")
    lines.append(f"{'':10}{'batches':>9}{'fill':>8}{'time':>11}{'real tok/s':>13}"
                 f"{'slot tok/s':>13}{'MFU':>8}")
    for name in ("padded", "packed"):
      v = r[name]
      lines.append(f"{name:10}{v['batches']:>9}{100 * v['fill']:>7.1f}%{v['time_s']:>10.2f}s"
                   f"{v['real_tokens_per_s']:>13,.0f}{v['slot_tokens_per_s']:>13,.0f}"
                   f"{_fmt_mfu(v['mfu']):>8}")
    lines.append(f"ratio packed/padded (real tokens/s): {r['ratio_real_tokens_per_s']:.2f}x")
  return "\n".join(lines)


# ---------------------------------------------------------------------------- CLI


def _define_flags():
  from absl import flags
  from ml_collections import config_flags
  if "mode" in flags.FLAGS:
    return flags.FLAGS
  config_flags.DEFINE_config_file("config", None, "config file[:arg]", lock_config=True)
  flags.DEFINE_enum("mode", "train", ["forward", "train"], "what to time")
  flags.DEFINE_integer("batch", 8, "rows per step (the global batch)")
  flags.DEFINE_integer("seq", 0, "sequence length (0: config.data.seq_len)")
  flags.DEFINE_integer("iters", 10, "timed iterations (with --packed: documents = "
                       "batch * iters)")
  flags.DEFINE_integer("warmup", 2, "untimed iterations after compiling")
  flags.DEFINE_bool("compare_hf", False, "also time transformers' PyTorch model")
  flags.DEFINE_string("packed", "", "document length distribution: time packed vs padded "
                      "documents (uniform:LO:HI, lognormal:MEDIAN:SIGMA, fixed:N)")
  flags.DEFINE_integer("pad_multiple", 16, "--packed: pad each batch to a multiple of this")
  flags.DEFINE_integer("passes", 2, "--packed: timed passes over the documents (best kept)")
  flags.DEFINE_integer("seed", 0, "seed of the synthetic batches")
  flags.DEFINE_string("json", "", "also write the full result to this JSON file")
  flags.mark_flag_as_required("config")
  return flags.FLAGS


def normalize_argv(argv: Sequence[str]) -> List[str]:
  """Accepts --compare-hf style spellings of our flags (not of --config.* overrides)."""
  out = []
  for a in argv:
    if a.startswith("--") and not a.startswith("--config"):
      name, eq, value = a[2:].partition("=")
      a = "--" + name.replace("-", "_") + eq + value
    out.append(a)
  return out


def main(argv):
  del argv
  import logging
  for noisy in ("absl", "jax", "orbax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  F = _define_flags()
  config = F.config
  if F.packed and F.compare_hf:
    raise SystemExit("--packed and --compare-hf do not combine: transformers' BERT has no "
                     "segment-aware attention for packed rows")
  if F.packed:
    result = bench_packed(config, F.packed, F.mode, F.batch, F.seq, F.iters, F.pad_multiple,
                          F.passes, F.seed)
  else:
    result = bench_step(config, F.mode, F.batch, F.seq, F.iters, F.warmup, F.compare_hf,
                        F.seed)
  result["machine"] = machine_info()
  result["command"] = "python -m launch.bench " + " ".join(sys.argv[1:])
  print(format_report(result))
  if F.json:
    with open(F.json, "w") as f:
      json.dump(result, f, indent=1, default=str)
  return 0


if __name__ == "__main__":
  from absl import app
  _define_flags()
  app.run(main, argv=normalize_argv(sys.argv))
