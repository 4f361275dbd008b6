"""The end-of-run plot `loss.png`: one column per loss term of the objective (MLM, NSP, SOP,
RTD, ...), its loss on top and its accuracy below, train as a line and held-out eval as
dots. A baseline (the objective's trivial predictor, e.g. always the most frequent token)
is drawn on the accuracy panel of the metric it belongs to, labeled with that metric, so
the NSP loss does not share an axis with the much larger MLM loss and no baseline line
seems to apply to a metric it does not score."""
import os

_BASE_SUFFIX = "_majority_accuracy"


def _terms(records):
  """Loss-term prefixes in the records: `mlm` for mlm_loss/mlm_accuracy, and so on."""
  keys = {k for r in records if r.get("split") in ("train", "eval") for k in r}
  prefixes = {k.rsplit("_", 1)[0] for k in keys
              if k.endswith(("_loss", "_accuracy"))}
  return sorted(prefixes, key=lambda p: (p != "mlm", p))  # MLM first


def _series(records, split, key):
  return [(r["step"], r[key]) for r in records if r.get("split") == split and key in r]


def _baseline_label(base, prefix):
  what = {"mlm": "always the most frequent token", "nsp": "always the majority label",
          "sop": "always the majority label"}.get(prefix, "majority")
  token = base.get(f"{prefix}_majority_token_text")
  if token is not None:
    what = f"always {token!r}"
  return f"{prefix.upper()} baseline ({what}) {100 * base[prefix + _BASE_SUFFIX]:.1f}%"


def pyplot():
  """matplotlib.pyplot, drawing to files (the Agg backend)."""
  import matplotlib  # slow to import; only a plot needs it
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # slow to import; only a plot needs it
  return plt


def figure(records, title=None):
  """The matplotlib figure of `records` (metrics.jsonl rows): 2 x (loss terms) panels."""
  plt = pyplot()
  terms = _terms(records) or ["loss"]
  base = [r for r in records if r.get("split") == "baseline"]
  base = base[-1] if base else {}
  fig, axes = plt.subplots(2, len(terms), figsize=(4.6 * len(terms), 6.4), squeeze=False)
  for col, prefix in enumerate(terms):
    top, bottom = axes[0, col], axes[1, col]
    for split, style in (("train", "-"), ("eval", "o-")):
      for ax, key in ((top, f"{prefix}_loss"), (bottom, f"{prefix}_accuracy")):
        pts = _series(records, split, key)
        if pts:
          ax.plot(*zip(*pts), style,
                  label="held-out eval" if split == "eval" else "train batches")
    if prefix + _BASE_SUFFIX in base:
      bottom.axhline(base[prefix + _BASE_SUFFIX], color="gray", ls="--",
                     label=_baseline_label(base, prefix))
    top.set_title(f"{prefix.upper()} loss")
    top.set_ylabel(f"{prefix.upper()} loss (cross-entropy, nats)")
    bottom.set_title(f"{prefix.upper()} accuracy")
    bottom.set_ylabel(f"{prefix.upper()} accuracy (fraction correct)")
    for ax in (top, bottom):
      ax.set_xlabel("training step")
      ax.grid(alpha=0.3)
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  return fig


def plot(records, path, title=None):
  """Draws `records` into the PNG `path`; returns `path`."""
  plt = pyplot()
  fig = figure(records, title)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
