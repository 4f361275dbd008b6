"""The interface between an objective and the one trainer (launch/trainer/).

The trainer, bench and aot know an objective only through this class: they never name an
objective or a batch key. An objective states:

- `modules`: collection name -> Flax module (the top-level keys of the params dict, e.g.
  "encoder"; ELECTRA: "generator" + "discriminator"; distillation: + "teacher");
- `trained` / `frozen`: which collections the optimizer updates. Frozen ones are kept out
  of the optimizer entirely: no optimizer state, no weight decay, no update;
- `check_config(config)` (a classmethod, at start-up): one-line errors for its bad
  settings (enums, rates), before any data work;
- `prepare_config(config)` (a classmethod, run before the data pipeline is built): config
  changes the objective implies, e.g. `init_from` (continued pretraining: the model
  section and the tokenizer come from an HF directory);
- `init(rng)`: boxed params {collection: params} (logical axes kept for sharding);
- `after_init(params, shardings)`: runs once on the initialised, sharded params of a new
  run (not on a resume); may load weights (`init_from`, a teacher), placed with
  `shardings`;
- `transform(batch, rng, train=True)`: the on-device batch transform (dynamic masking,
  ...) of the whole global batch, before any accumulation split, so its result does not
  depend on how the batch is split; `train=False` for held-out batches (the eval step,
  the baselines), which may be masked at another rate (`objective.eval_mask_rate`);
- `normalizers(batch)`: per loss term, the global normalizer computed from the whole
  transformed batch (MLM: the total mask weight; NSP/SOP: the number of counted pairs);
- `loss(params, batch, rng, train)`: (term SUMS, metric SUMS) on a transformed
  (micro-)batch. The trainer differentiates `combine(terms, normalizers)` =
  sum_k weight_k * term_k / N_k with the global N_k, so micro-batch gradients add up to
  the full-batch gradient exactly; metric sums add up across micro-batches, devices and
  eval batches (`objectives.losses.finalize_metrics` turns them into means);
- `flops_per_example(seq_len)`: model FLOPs of one example of a train step (trained
  modules forward + backward = 3x forward, frozen ones forward only); with `train=False`
  the inference forward, which runs only `forward_modules` (default: the trained ones;
  ELECTRA: the discriminator, not the generator; distillation: the student);
- `batch_spec()`: the arrays it reads and how to synthesise valid ones (objectives/spec.py);
- `check_batch(batch)`: host-side validation of a pipeline batch (no silent clamping);
- `baselines(train_batches, eval_items)`: trivial predictors scored on exactly the
  examples and masks the eval scores (the eval masks come from the same keys);
- `forward(params, batch)`: inference forward of the main module on every position;
- `export(params, path, tokenizer)`: an HF directory (weights, config, tokenizer);
- `demo_lines(params, tokenizer, eval_batches)`: what the end of a run shows the user
  (default: a fill-mask demo on held-out sentences where the model has an MLM head).
`reference_inputs` / `reference_diff` serve `launch.bench --compare-hf`.
"""
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

import encoders
from objectives import demo
from objectives import masking
from objectives import pretrained
from objectives.spec import BatchSpec

_OBJECTIVES: Dict[str, Callable] = {}


def register_objective(*names):
  def wrap(cls):
    for n in names:
      _OBJECTIVES[n] = cls
    return cls
  return wrap


def objective_class(config):
  name = config.objective.name
  if name not in _OBJECTIVES:
    raise ValueError(f"unknown objective {name!r}; available: {sorted(_OBJECTIVES)}")
  return _OBJECTIVES[name]


def get_objective(config, tokenizer):
  return objective_class(config)(config, tokenizer)


def prepare_config(config):
  """The objective's config changes, before the data pipeline is built (in place)."""
  objective_class(config).prepare_config(config)


def model_forward_flops(model_config, seq_len: int, mlm_positions=None) -> float:
  """Forward FLOPs of one sequence through a family's model, counted by the family."""
  return float(encoders.forward_flops(model_config, seq_len, mlm_positions))


class Objective:
  """What an objective gives the trainer (see the module docstring)."""
  name: str = ""
  modules: Dict[str, nn.Module]
  trained: Tuple[str, ...] = ("encoder",)
  frozen: Tuple[str, ...] = ()
  # the modules an inference forward runs (`forward`, bench --mode forward); None: `trained`
  forward_modules: Optional[Tuple[str, ...]] = None
  term_weights: Dict[str, float] = {}  # loss term -> weight in `combine` (default 1)
  tokenizer = None

  # -------------------------------------------------------------------- config, init

  @classmethod
  def check_config(cls, config):
    """Start-up validation of the objective's settings, before any data work (the
    trainer's launch/trainer/checks.py): raises a one-line ValueError naming the key.
    Default: the masking settings every masked-LM-style objective reads, where present."""
    masking.check_config(config.objective, int(config.data.seq_len))

  @classmethod
  def prepare_config(cls, config):
    """Default: `config.init_from` sets the model section and tokenizer (pretrained.py)."""
    pretrained.configure(config)

  def init(self, rng) -> Dict:
    raise NotImplementedError

  def after_init(self, params: Dict, shardings: Dict) -> Dict:
    """Default: with `init_from`, the "encoder" collection takes the directory's weights
    (heads the checkpoint lacks keep their fresh init)."""
    init_from = getattr(self, "init_from", "")
    if not init_from:
      return params
    out = dict(params)
    out["encoder"] = pretrained.load_into(init_from, params["encoder"],
                                          shardings["encoder"], self.model_config)
    return out

  # -------------------------------------------------------------------- the step

  def transform(self, batch, rng, train: bool = True) -> Dict:
    return batch

  def normalizers(self, batch) -> Dict[str, jax.Array]:
    raise NotImplementedError

  def loss(self, params, batch, rng, train: bool) -> Tuple[Dict, Dict]:
    raise NotImplementedError

  def combine(self, terms: Dict, normalizers: Dict) -> jax.Array:
    """sum_k weight_k * term_k / N_k (a zero normalizer counts as 1: its term is 0)."""
    total = jnp.zeros((), jnp.float32)
    for k, v in terms.items():
      n = jnp.asarray(normalizers[k], jnp.float32)
      total = total + self.term_weights.get(k, 1.0) * v / jnp.where(n > 0, n, 1.0)
    return total

  # -------------------------------------------------------------------- FLOPs

  def module_flops(self, name: str, seq_len: int, all_positions: bool = False) -> float:
    """Forward FLOPs of one sequence through module `name` as this objective runs it
    (`all_positions`: heads on every position, as `forward` and transformers do)."""
    raise NotImplementedError

  def flops_per_example(self, seq_len: int, train: bool = True,
                        all_positions: bool = False) -> float:
    """FLOPs of one example: in a train step, trained modules count forward + backward
    (3x forward) and frozen ones forward only; `train=False`: the forward of
    `forward_modules` only (what an inference forward runs)."""
    if not train:
      names = self.forward_modules if self.forward_modules is not None else self.trained
      return sum(self.module_flops(n, seq_len, all_positions) for n in names)
    total = 0.0
    for name in self.modules:
      f = self.module_flops(name, seq_len, all_positions)
      total += (3.0 if name in self.trained else 1.0) * f
    return total

  # -------------------------------------------------------------------- batches

  def batch_spec(self) -> BatchSpec:
    raise NotImplementedError

  def check_batch(self, batch):
    """Host-side validation of a pipeline batch; raises ValueError naming the problem."""
    self.batch_spec().check(batch)

  def baselines(self, train_batches: Iterable[Dict], eval_items: Sequence) -> Dict:
    """Trivial predictors' held-out metrics. `eval_items`: (batch, key) pairs, the keys
    the eval step transforms each batch with."""
    return {}

  # -------------------------------------------------------------------- outside the step

  def forward(self, params, batch):
    raise NotImplementedError

  def export(self, params, path: str, tokenizer=None):
    raise NotImplementedError

  def describe(self) -> Dict:
    """The objective's settings, for reports."""
    return {"name": self.name}

  def demo_lines(self, params, tokenizer, eval_batches) -> Sequence[str]:
    """Lines shown at the end of a run: a fill-mask demo on held-out sentences (objectives/
    demo.py) where the model has an MLM head, else none."""
    return demo.lines(self, params, tokenizer, eval_batches)

  def reference_inputs(self, batch, train: bool, seed: int = 0) -> Dict:
    """Keyword arrays for the exported model's transformers class (with labels when
    `train`), from a batch of this spec."""
    raise NotImplementedError

  def reference_diff(self, ours, theirs, batch) -> float:
    """Max |difference| of the last hidden state, ours vs transformers', on real tokens."""
    raise NotImplementedError


def select_heads(model_config, needed: Sequence[str], unused: Sequence[str], name: str):
  """Checks that the model has the `needed` heads and none of the `unused` ones (a head
  no loss trains would only be decayed toward 0)."""
  heads = tuple(model_config.heads)
  missing = [h for h in needed if h not in heads]
  extra = [h for h in unused if h in heads]
  if missing or extra:
    raise ValueError(
        f"objective {name!r} trains the model heads {tuple(needed)}; model.heads={heads}"
        + (f" lacks {missing}" if missing else "")
        + (f" has {extra}, which it does not train" if extra else "")
        + f": set --config.model.heads='{tuple(h for h in heads if h not in extra) + tuple(missing)}'")


def optional(config, section: str, key: str, default=None):
  sec = config.get(section, None)
  if sec is None:
    return default
  value = sec.get(key, None)
  return default if value is None else value
