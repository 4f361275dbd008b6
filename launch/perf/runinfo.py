"""What a benchmark or AOT report says about its run: the machine, the config in brief,
and the command-line spelling shared by launch.bench and launch.aot."""
import os
import platform
import time
from typing import Any, Dict, List, Sequence

import jax


def machine_info() -> Dict[str, Any]:
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
    import torch  # optional (the hf extra): named in the report when installed
    import transformers  # optional (the hf extra)
    info.update(torch=torch.__version__, transformers=transformers.__version__,
                torch_threads=torch.get_num_threads())
  except ImportError:
    pass
  return info


def config_summary(config, objective=None) -> Dict[str, Any]:
  """The model's shape and execution settings, and the objective's own description."""
  m = config.model
  out = {"family": m.family, "variant": m.get("variant", ""),
         "layers": m.num_hidden_layers, "hidden": m.hidden_size,
         "heads": m.num_attention_heads, "intermediate": m.intermediate_size,
         "vocab_size": m.vocab_size, "vocab_pad_multiple": m.get("vocab_pad_multiple", 1),
         "model_heads": list(m.heads), "dtype": m.dtype,
         "attention_impl": m.attention_impl, "remat_policy": m.remat_policy,
         "scan_layers": m.scan_layers, "hidden_dropout": m.get("hidden_dropout_prob"),
         "attention_dropout": m.get("attention_probs_dropout_prob",
                                    m.get("attention_dropout")),
         "mesh": list(config.mesh.shape),
         "state_over_data": bool(config.mesh.get("shard_state_over_data", False))}
  if m.get("enhanced_mask_decoder"):  # DeBERTa's: two more passes of the last layer
    out["enhanced_mask_decoder"] = True
  out["objective"] = objective.describe() if objective is not None else {
      "name": config.objective.name}
  return out


def objective_text(summary: Dict[str, Any]) -> str:
  """`name (key=value, ...)` of a config summary's objective."""
  o = dict(summary["objective"])
  name = o.pop("name", "?")
  return name + (" (" + ", ".join(f"{k}={v}" for k, v in o.items()) + ")" if o else "")


def normalize_argv(argv: Sequence[str]) -> List[str]:
  """Accepts --compare-hf style spellings of our flags (not of --config.* overrides)."""
  out = []
  for a in argv:
    if a.startswith("--") and not a.startswith("--config"):
      name, eq, value = a[2:].partition("=")
      a = "--" + name.replace("-", "_") + eq + value
    out.append(a)
  return out
