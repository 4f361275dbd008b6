"""Helpers for the study files (configs/ablations/study_*.py, run by launch.ablate):
the shared defaults of a CPU-scale study and the arm record."""
import ml_collections

NOT_CHECKED = "not checked"


def arm(config, label, note="", paper=(), overrides=(), match_flops_of=""):
  return dict(config=config, overrides=tuple(overrides), label=label, note=note,
              paper=tuple(paper), match_flops_of=match_flops_of)


def finetune_default(**kw):
  """BBC News topics (docs/finetune_real.py): 2,000 documents, 20% held out, 3 seeds, two
  epochs at a tiny model's learning rate (the CPU scale). Not Rotten Tomatoes ("rt"): too
  hard for a 150-step tiny model to leave the majority class (docs/ablations/)."""
  ft = dict(dataset="bbc", max_rows=2000, eval_fraction=0.2, split_seed=0, epochs=2,
            seeds=(0, 1, 2), seq_len=64, global_batch=32, learning_rate=1e-3,
            text_column="text", label_column="label")
  ft.update(kw)
  return ft


def probe_default(**kw):
  """The frozen-feature linear probe (launch/ablation/probe.py) on BBC News topics
  (docs/finetune_real.py's `bbc`, all 2,225 documents, 25% held out, 200 of the rest to
  train on: the features of fewer documents cost less, and with fewer labels a random
  encoder's bag of words is further behind) at length 128, on the MLM head's
  predicted-token distribution averaged over the tokens (pool="mlm"). At
  CPU scale it told a pretrained tiny BERT from the same model at random init, where
  mean-pooled hidden states (on BBC or on Rotten Tomatoes sentiment) did not
  (docs/ablations/README.md). A model without an MLM head (ELECTRA's discriminator)
  needs pool="mean"."""
  p = dict(dataset="bbc", max_rows=-1, eval_fraction=0.25, split_seed=0, max_train=200,
           seq_len=128, pool="mlm", text_column="text", label_column="label")
  p.update(kw)
  return p


def compare(higher, lower, metric, paper):
  """The paper's claim: `higher` scores above `lower` on `metric` (tested paired by seed)."""
  return dict(higher=higher, lower=lower, metric=metric, paper=paper)


def study(name, paper, table, question, arms, paper_columns=(), paper_compare="",
          not_run=(), mlm=True, pair_tasks=(), finetune=None, steps=150, seq_len=64,
          global_batch=32, variant="tiny", seeds=(0,), evals=4, probe=None, claim=None,
          learning_rate=0.0):
  """A study ConfigDict; `arms` is a list of (name, arm(...)) in run order. `finetune`
  None: BBC fine-tuning (finetune_default); False: no fine-tuning."""
  c = ml_collections.ConfigDict()
  c.name, c.paper, c.table, c.question = name, paper, table, question
  c.scale = ml_collections.ConfigDict(dict(
      variant=variant, steps=steps, seq_len=seq_len, global_batch=global_batch,
      checkpoint_every=max(1, steps // 2), learning_rate=learning_rate,
      seeds=tuple(seeds), evals=evals))
  if claim is not None:
    c.compare = ml_collections.ConfigDict(claim)
  c.paper_columns = tuple(paper_columns)
  c.paper_compare = paper_compare
  c.order = tuple(n for n, _ in arms)
  c.arms = ml_collections.ConfigDict({n: a for n, a in arms})
  c.not_run = tuple(not_run)
  ev = dict(mlm=mlm, pair_tasks=tuple(pair_tasks))
  if finetune is not False:
    ev["finetune"] = finetune if finetune is not None else finetune_default()
  if probe is not None:
    ev["probe"] = probe
  c.evaluate = ml_collections.ConfigDict(ev)
  return c
