"""The default logical-axis rules: logical axis name -> mesh axis (None = replicated).

Model code names only logical axes; this table is the one place that maps them onto the
(data, fsdp, tensor) mesh. It lives in encoders/ so that `encoders.from_hf(..., mesh=)`
can place params without importing configs/; configs/common.py takes it from here.
"""

DEFAULT_RULES = (
    ("act_batch", ("data", "fsdp")),
    ("act_len", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv", None),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("layers", None),
)


def rules_tuple(rules):
  """Rules as hashable tuples (a config may hold lists): ((name, axes), ...)."""
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in rules)
