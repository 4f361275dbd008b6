"""Knowledge distillation (Sanh et al. 2019, DistilBERT): a frozen teacher and its
student in one sharded, jitted step.

- Teacher: any zoo model with an MLM head, from an HF directory or one of our work
  directories (its `hf/` export) — `objective.teacher=DIR`. Without a directory,
  `objective.teacher_model` (a model section) gives a randomly initialised teacher, for
  `launch.aot` / `launch.bench` and tests only (logged as such). The teacher is the
  frozen collection "teacher": no optimizer state, no weight decay, no update; its params
  carry the same logical axes as any model's, so the mesh rules shard it like the student
  (FSDP splits a teacher larger than one device). It runs forward, deterministic, inside
  the train step, on the same masked input the student sees.
- Student: the run's `model` section, any family; its vocabulary must equal the
  teacher's (the run takes the teacher's tokenizer). After init it takes the teacher's
  layers (`objective.student_init`: "every_other" — student layer i <- teacher layer 2i —
  a list of teacher layers "0,2,4", or "random"), its embeddings and its MLM head, tensor
  by tensor where shapes allow; otherwise it stays random. The log says which.
- Loss (term sums over counted positions, each divided by its global count):
    alpha_ce  * T^2 * KL(teacher_T || student_T)   soft targets at temperature T
  + alpha_mlm * MLM cross-entropy at the masked positions
  + alpha_cos * (1 - cos(h_student, h_teacher))    last hidden states (same width)
  + alpha_mse * sum_v (z_student - z_teacher)^2     the MSE-on-logits option
  KL, cosine and MSE count every real token (`ce_positions="all"`, DistilBERT's default)
  or the masked ones only (`"masked"`). Defaults: DistilBERT's T=2, alphas 5/2/1, MSE 0.
- Metrics: each term (kd_loss, mlm_loss, cos_loss, mse_loss), the student's MLM
  accuracy, the teacher's MLM loss/accuracy on the same masks, and teacher/student top-1
  agreement at the masked positions (agreement_top1).
- FLOPs: student forward + backward and the teacher's forward (frozen: 1x), so MFU counts
  the teacher's work.
- Export: the student, as an HF directory (the MLM objective's export).
"""
import json
import logging
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

import encoders
from encoders import hf as hf_lib
from encoders import layers
from objectives import losses, mlm, pretrained
from objectives.base import model_forward_flops, register_objective

log = logging.getLogger("encoder_zoo")

TERMS = ("kd", "mlm", "cos", "mse")
# Execution settings the teacher takes from the run's model section (not from its files).
EXECUTION = ("dtype", "attention_impl", "remat_policy", "scan_layers", "vocab_pad_multiple")


def teacher_dir(path: str) -> str:
  """An HF directory, or our work directory holding one under `hf/`."""
  for d in (path, os.path.join(path, "hf")):
    if os.path.isfile(os.path.join(d, "config.json")) and (
        os.path.isfile(os.path.join(d, "model.safetensors"))
        or os.path.isfile(os.path.join(d, "model.safetensors.index.json"))):
      return d
  raise ValueError(f"objective.teacher={path!r}: neither it nor {path}/hf is a Hugging Face "
                   "directory (config.json + model.safetensors); a work directory holds its "
                   "export under hf/ once its run has finished")


def teacher_config_from_dir(path: str, run_model) -> ml_collections.ConfigDict:
  """The teacher's model section from its config.json (MLM head only), with the run's
  execution settings."""
  hf = hf_lib.hf_config(path)
  mapping = hf_lib.mapping_for(hf.get("model_type"))
  archs = [a for a in hf.get("architectures") or [] if a in mapping.architectures]
  if archs and "mlm" not in mapping.architectures[archs[0]][1]:
    raise ValueError(f"teacher {path}: {archs[0]} has no MLM head; distillation needs the "
                     "teacher's token predictions (a ...ForMaskedLM / ...ForPreTraining "
                     "checkpoint)")
  cfg = mapping.config_from_hf(hf, ("mlm",))
  for k in EXECUTION:
    if k in run_model:
      cfg[k] = run_model[k]
  return cfg


def _set_tokenizer(config, path: str):
  """The run takes the teacher's tokenizer: `spm.model` (our exports, with the teacher
  run's lowercase setting when its work directory says it), else tokenizer.json /
  vocab.txt."""
  spm = os.path.join(path, "spm.model")
  if os.path.isfile(spm):
    config.tokenizer.kind, config.tokenizer.path = "sentencepiece", spm
    run_cfg = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if os.path.basename(os.path.abspath(path)) == "hf" and os.path.isfile(run_cfg):
      with open(run_cfg) as f:
        config.tokenizer.lowercase = bool(json.load(f).get("tokenizer", {}).get(
            "lowercase", False))
  else:
    config.tokenizer.kind, config.tokenizer.path = "hf", pretrained.tokenizer_file(path)


def layer_map(spec: str, n_student: int, n_teacher: int):
  """Teacher layer of each student layer, or (None, reason) when there is none."""
  spec = str(spec).strip()
  if spec == "random":
    return None, "student_init='random'"
  if spec == "every_other":
    picks = [2 * i for i in range(n_student)]
  else:
    try:
      picks = [int(x) for x in spec.split(",")]
    except ValueError:
      raise ValueError(f"objective.student_init={spec!r}: use 'every_other', 'random' or "
                       "a comma-separated list of teacher layers") from None
    if len(picks) != n_student:
      raise ValueError(f"objective.student_init={spec!r} names {len(picks)} teacher layers "
                       f"for a student of {n_student}")
  if max(picks) >= n_teacher or min(picks) < 0:
    return None, (f"student_init={spec!r} needs teacher layers {picks}, the teacher has "
                  f"{n_teacher}")
  return picks, ""


def _hook(cfg, name):
  default = ((lambda c, p: layers.stack_layer_params(p, c.num_hidden_layers))
             if name == "scan_params" else (lambda c, p: layers.unstack_layer_params(p)))
  return hf_lib.family_hook(cfg, name, default)


@register_objective("distill")
class Distillation(mlm.MaskedLM):
  """A frozen teacher (collection "teacher") and a trained student ("encoder")."""

  @classmethod
  def check_config(cls, config):
    """The masking settings, the temperature, the loss weights, ce_positions and the
    student_init spelling (one-line errors; the layer count is checked at init)."""
    super().check_config(config)
    o = config.objective
    t = o.get("temperature", 1.0)
    if not isinstance(t, (int, float)) or not t > 0:
      raise ValueError(f"objective.temperature={t!r} must be > 0")
    alphas = {k: o.get(k, 0.0) for k in ("alpha_ce", "alpha_mlm", "alpha_cos", "alpha_mse")}
    bad = {k: v for k, v in alphas.items() if not isinstance(v, (int, float)) or v < 0}
    if bad or not any(alphas.values()):
      raise ValueError(f"objective alphas must be numbers >= 0 and not all 0, got {alphas}")
    if o.get("ce_positions", "all") not in ("all", "masked"):
      raise ValueError(f"objective.ce_positions={o.ce_positions!r}; choose from "
                       "('all', 'masked')")
    spec = str(o.get("student_init", "every_other")).strip()
    if spec not in ("every_other", "random"):
      try:
        [int(x) for x in spec.split(",")]
      except ValueError:
        raise ValueError(f"objective.student_init={spec!r}: use 'every_other', 'random' or "
                         "a comma-separated list of teacher layers") from None

  def __init__(self, config, tokenizer):
    c = ml_collections.ConfigDict(config.to_dict())
    c.objective.name = "mlm"
    super().__init__(c, tokenizer)  # the student, masking, batch spec, export
    self.name = "distill"
    o = config.objective
    self.cfg = o
    self.temperature = float(o.temperature)
    if self.temperature <= 0:
      raise ValueError(f"objective.temperature must be > 0, got {self.temperature}")
    self.alphas = {"kd": float(o.alpha_ce), "mlm": float(o.alpha_mlm),
                   "cos": float(o.alpha_cos), "mse": float(o.alpha_mse)}
    if any(a < 0 for a in self.alphas.values()) or not any(self.alphas.values()):
      raise ValueError(f"objective alphas must be >= 0 and not all 0, got {self.alphas}")
    if o.ce_positions not in ("all", "masked"):
      raise ValueError(f"objective.ce_positions must be 'all' or 'masked', got "
                       f"{o.ce_positions!r}")
    self.all_positions = o.ce_positions == "all"
    self.teacher_path = str(o.get("teacher", "") or "")
    tcfg = o.get("teacher_model", None)
    if self.teacher_path:  # the directory's architecture, whatever teacher_model says
      tcfg = teacher_config_from_dir(teacher_dir(self.teacher_path), config.model)
    if tcfg is None or not tcfg.get("family", ""):
      raise ValueError("distillation needs a teacher: set objective.teacher=DIR (an HF "
                       "directory or a finished work directory)")
    tcfg = ml_collections.ConfigDict(tcfg.to_dict() if hasattr(tcfg, "to_dict") else tcfg)
    tcfg.heads = ("mlm",)
    for k in EXECUTION:  # the run's execution settings (aot resolves them for its target)
      if k in config.model:
        tcfg[k] = config.model[k]
    if int(tcfg.vocab_size) != int(self.model_config.vocab_size):
      raise ValueError(
          f"the teacher's vocabulary ({tcfg.vocab_size} tokens) differs from the student's "
          f"({self.model_config.vocab_size}): distillation compares the two models' "
          "predictions token by token, so both need the same tokenizer")
    if tokenizer.vocab_size != int(tcfg.vocab_size):
      raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the teacher "
                       f"{tcfg.vocab_size}: use the teacher's tokenizer")
    self.same_width = int(tcfg.hidden_size) == int(self.model_config.hidden_size)
    if self.alphas["cos"] > 0 and not self.same_width:
      raise ValueError(f"alpha_cos > 0 needs the student's hidden size "
                       f"({self.model_config.hidden_size}) to equal the teacher's "
                       f"({tcfg.hidden_size}); set objective.alpha_cos=0")
    self.teacher_config = tcfg
    self.teacher = encoders.build(tcfg)
    self.modules = {"encoder": self.model, "teacher": self.teacher}
    self.trained, self.frozen = ("encoder",), ("teacher",)
    self.term_weights = dict(self.alphas)
    self.init_report = {}

  # -------------------------------------------------------------------- config, init

  @classmethod
  def prepare_config(cls, config):
    """The student's `init_from` (if any), then the teacher: its directory resolved, its
    model section read, and its tokenizer made the run's."""
    pretrained.configure(config)
    path = config.objective.get("teacher", "")
    if not path:
      return
    d = teacher_dir(path)
    config.objective.teacher = d
    config.objective.teacher_model = teacher_config_from_dir(d, config.model)
    _set_tokenizer(config, d)
    t = config.objective.teacher_model
    log.info("teacher %s: %s, %d layers, hidden %d, vocab %d; tokenizer %s", d, t.family,
             t.num_hidden_layers, t.hidden_size, t.vocab_size, config.tokenizer.path)

  def init(self, rng):
    return {"encoder": encoders.init_boxed(self.model, rng, length=self.seq_len),
            "teacher": encoders.init_boxed(self.teacher, jax.random.fold_in(rng, 1),
                                           length=self.seq_len)}

  def after_init(self, params, shardings):
    out = dict(params)
    if self.teacher_path:
      out["teacher"] = self._load_teacher(params["teacher"], shardings["teacher"])
    else:
      log.warning("distillation with a RANDOM teacher (no objective.teacher directory): "
                  "only for compile/benchmark/test runs")
    if self.init_from:
      out["encoder"] = pretrained.load_into(self.init_from, params["encoder"],
                                            shardings["encoder"], self.model_config)
      self.init_report = {"student_init": f"init_from {self.init_from}"}
      return out
    out["encoder"] = self._student_from_teacher(out["teacher"], params["encoder"],
                                                shardings["encoder"])
    return out

  def _load_teacher(self, params, shardings):
    d = teacher_dir(self.teacher_path)
    overrides = {k: self.teacher_config[k] for k in EXECUTION if k in self.teacher_config}
    _, theirs = encoders.from_hf(d, **overrides)
    flat_t, ours, flat_s = traverse_util.flatten_dict(theirs), traverse_util.flatten_dict(params), traverse_util.flatten_dict(shardings)
    missing = sorted("/".join(p) for p in ours if p not in flat_t)
    if missing:
      raise ValueError(f"teacher {d}: the checkpoint lacks {missing[:8]} (the teacher needs "
                       "its MLM head)")
    out = {}
    for p, target in ours.items():
      value = np.asarray(jax.device_get(flat_t[p]))
      if value.shape != tuple(target.shape):
        raise ValueError(f"teacher {d}: {'/'.join(p)} has shape {value.shape}, the model "
                         f"{tuple(target.shape)}")
      value = value.astype(target.dtype)
      out[p] = jax.make_array_from_callback(value.shape, flat_s[p],
                                            lambda idx, v=value: v[idx])
    unused = sorted("/".join(p) for p in flat_t if p not in ours)
    log.info("teacher %s: loaded %d tensors (frozen); not used: %s", d, len(out),
             ", ".join(unused) or "none")
    return traverse_util.unflatten_dict(out)

  def _student_from_teacher(self, teacher, student, shardings):
    """Copies the teacher's layers (per `student_init`), embeddings and MLM head into the
    student where shapes allow; logs what happened."""
    scfg, tcfg = self.model_config, self.teacher_config
    picks, why = layer_map(self.cfg.student_init, int(scfg.num_hidden_layers),
                           int(tcfg.num_hidden_layers))
    if picks is None:
      self.init_report = {"student_init": "random", "reason": why}
      log.info("student init: random (%s)", why)
      return student
    t_flat = traverse_util.flatten_dict(_hook(tcfg, "unscan_params")(tcfg, teacher))
    s_flat = traverse_util.flatten_dict(_hook(scfg, "unscan_params")(scfg, student))
    source = {}
    for path in s_flat:
      if len(path) > 1 and path[0] == "encoder" and path[1].startswith("layer_"):
        i = int(path[1].split("_")[1])
        source[path] = ("encoder", f"layer_{picks[i]}") + path[2:]
      else:
        source[path] = path
    # The layers must all fit, or none is copied (a half-copied layer is no init at all).
    layer_paths = [p for p in s_flat if p[0] == "encoder"]
    bad = [p for p in layer_paths if source[p] not in t_flat
           or tuple(t_flat[source[p]].shape) != tuple(s_flat[p].shape)]
    if bad:
      why = (f"teacher layer tensors do not fit the student's, e.g. "
             f"{'/'.join(bad[0])} (student {tuple(s_flat[bad[0]].shape)})")
      self.init_report = {"student_init": "random", "reason": why}
      log.info("student init: random (%s)", why)
      return student
    out, copied, fresh = {}, [], []
    for p, target in s_flat.items():
      src = t_flat.get(source[p])
      if src is not None and tuple(src.shape) == tuple(target.shape):
        out[p] = src.astype(target.dtype)
        copied.append("/".join(p))
      else:
        out[p] = target
        fresh.append("/".join(p))
    tree = _hook(scfg, "scan_params")(scfg, traverse_util.unflatten_dict(out))
    # Copies, not the teacher's buffers: the state's init donates both collections.
    tree = jax.tree.map(lambda x, s: jax.device_put(jnp.array(x, copy=True), s), tree,
                        shardings)
    self.init_report = {"student_init": "teacher layers", "teacher_layers": picks,
                        "copied": len(copied), "fresh": fresh}
    log.info("student init: teacher layers %s -> student layers 0..%d; copied %d tensors, "
             "fresh init for %d (%s)", picks, len(picks) - 1, len(copied), len(fresh),
             ", ".join(fresh[:8]) or "none")
    return tree

  # -------------------------------------------------------------------- the step

  def normalizers(self, batch):
    mlm_n = jnp.sum(batch["mlm_weights"].astype(jnp.float32))
    if self.all_positions:
      n = jnp.sum((batch["segment_ids"] > 0).astype(jnp.float32))
    else:
      n = mlm_n
    return {"kd": n, "mlm": mlm_n, "cos": n, "mse": n}

  def _run(self, module, params, batch, train, rng=None, positions=None):
    c = module.config
    types = batch["token_type_ids"] if c.get("type_vocab_size", 0) else None
    return module.apply(
        {"params": params}, batch["input_ids"],
        attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32), token_type_ids=types,
        segment_ids=batch["segment_ids"], masked_positions=positions,
        deterministic=not train, rngs={"dropout": rng} if rng is not None else None)

  def loss(self, params, batch, rng, train):
    masked = batch.get("masked_positions")
    positions = None if self.all_positions else masked
    s = self._run(self.model, params["encoder"], batch, train, rng, positions)
    t = self._run(self.teacher, params["teacher"], batch, False, None, positions)
    t_logits = jax.lax.stop_gradient(t.mlm_logits).astype(jnp.float32)
    t_hidden = jax.lax.stop_gradient(t.last_hidden_state).astype(jnp.float32)
    s_logits = s.mlm_logits.astype(jnp.float32)
    if self.all_positions:
      w = (batch["segment_ids"] > 0).astype(jnp.float32)
    else:
      w = batch["mlm_weights"].astype(jnp.float32)

    def at_masked(x):  # (B,T,...) -> (B,M,...) at the masked positions
      if masked is None or not self.all_positions:
        return x
      return jnp.take_along_axis(x, masked.astype(jnp.int32)[:, :, None], axis=1)

    tau = self.temperature
    log_ps = jax.nn.log_softmax(s_logits / tau, -1)
    log_pt = jax.nn.log_softmax(t_logits / tau, -1)
    kl = jnp.sum(jnp.exp(log_pt) * (log_pt - log_ps), -1) * tau ** 2
    mse = jnp.sum(jnp.square(s_logits - t_logits), -1)
    metrics = {"kd_loss_sum": jnp.sum(kl * w), "kd_weight_sum": jnp.sum(w),
               "mse_loss_sum": jnp.sum(mse * w), "mse_weight_sum": jnp.sum(w)}
    terms = {"kd": metrics["kd_loss_sum"], "mse": metrics["mse_loss_sum"]}
    if self.same_width:
      hs = s.last_hidden_state.astype(jnp.float32)
      hpos = w if self.all_positions else (batch["segment_ids"] > 0).astype(jnp.float32)
      cos = jnp.sum(hs * t_hidden, -1) / jnp.maximum(
          jnp.linalg.norm(hs, axis=-1) * jnp.linalg.norm(t_hidden, axis=-1), 1e-8)
      if not self.all_positions:  # the masked positions' hidden states only
        if masked is not None:
          cos = jnp.take_along_axis(cos, masked.astype(jnp.int32), axis=1)
        hpos = w
      metrics.update(cos_loss_sum=jnp.sum((1.0 - cos) * hpos), cos_weight_sum=jnp.sum(hpos))
      terms["cos"] = metrics["cos_loss_sum"]
    s_mask_logits, t_mask_logits = at_masked(s_logits), at_masked(t_logits)
    labels, weights = batch["mlm_labels"], batch["mlm_weights"]
    _, m = losses.mlm_loss_and_metrics(s_mask_logits, labels, weights)
    _, tm = losses.weighted_cross_entropy(t_mask_logits, labels, weights,
                                          prefix="teacher_mlm")
    terms["mlm"] = m["mlm_loss_sum"]
    counted = weights.astype(jnp.float32) > 0
    agree = jnp.argmax(s_mask_logits, -1) == jnp.argmax(t_mask_logits, -1)
    metrics.update(m)
    metrics.update(tm)
    metrics.update(agreement_top1_sum=jnp.sum(jnp.where(counted & agree, 1.0, 0.0)),
                   agreement_weight_sum=jnp.sum(counted.astype(jnp.float32)))
    return terms, metrics

  # -------------------------------------------------------------------- FLOPs

  def module_flops(self, name, seq_len, all_positions=False):
    positions = None if (all_positions or self.all_positions or not self.max_predictions) \
        else self.max_predictions
    cfg = self.model.config if name == "encoder" else self.teacher.config
    return model_forward_flops(cfg, seq_len, positions)

  def describe(self):
    t = self.teacher_config
    return {"name": self.name, "teacher": self.teacher_path or "random",
            "teacher_model": f"{t.family} L{t.num_hidden_layers} H{t.hidden_size}",
            "temperature": self.temperature, **{f"alpha_{k}": v for k, v in
                                                self.alphas.items()},
            "ce_positions": self.cfg.ce_positions, "student_init": self.cfg.student_init,
            "max_predictions": self.max_predictions, "mask_rate": float(self.cfg.mask_rate),
            "eval_mask_rate": self.eval_mask_rate,
            **self.init_report}
