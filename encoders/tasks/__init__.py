"""Fine-tuning tasks on every family: each task is one registered unit in its own file
(encoders/tasks/<name>.py: sequence, regression, token, qa), all on one generic task
model (encoders/tasks/base.py, which documents the contract).

    from encoders import tasks
    task = tasks.get("token")                    # the registered unit (ValueError: names)
    model = tasks.build(config.model, "sequence", labels=("neg", "pos"))  # or hf.tasks.from_hf
    out = model.apply({"params": params}, input_ids, attention_mask, token_type_ids)
    out.logits              # sequence / regression (B,N) | token (B,T,N)
    out.start_logits, out.end_logits                               # qa (B,T)
    tasks.embed(model_or_encoder, params, ids, mask)               # (B,D) masked mean

A task defined elsewhere registers itself the same way when its module is imported.
"""
import importlib
import pkgutil

from encoders.tasks.base import (HEAD_KINDS, IGNORE, POOLINGS, Head, Task, TaskHead,
                                 TaskModel, TaskOutput, build, embed, family_heads, get,
                                 head_spec, init_params, mean_pool, names, register,
                                 registered, task_config)

# Every task file registers itself: a new task is one file here, with no list to edit.
for _info in pkgutil.iter_modules(__path__):
  if _info.name not in ("base", "data", "metrics"):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["HEAD_KINDS", "IGNORE", "POOLINGS", "Head", "Task", "TaskHead", "TaskModel",
           "TaskOutput", "build", "embed", "family_heads", "get", "head_spec", "init_params",
           "mean_pool", "names", "register", "registered", "task_config"]
