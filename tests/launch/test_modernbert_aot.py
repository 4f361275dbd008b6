"""ModernBERT's splash paths (global layers: segment ids; local layers: a banded local
mask with segment ids) compiled ahead of time for a v5p slice, sharded over data and
tensor, scanned over the (local, local, global) period with remat. Slow (a TPU compile);
tests/encoders/test_modernbert.py runs the same kernel in the Pallas interpreter."""
import json

import pytest

from tests.launch.aot_helpers import run_aot
from tests.launch.aot_helpers import libtpu  # noqa: F401  (a fixture)

TINY = ["--config", "configs/modernbert.py:tiny", "--config.model.vocab_size=512",
        "--config.model.pad_token_id=0",
        "--config.model.num_hidden_layers=4", "--config.model.local_attention=128"]


@pytest.mark.slow
def test_splash_local_and_global_layers_compile_for_v5p(libtpu, tmp_path):  # noqa: F811
  out = tmp_path / "aot.json"
  p = run_aot(TINY + ["--topology", "v5p:2x2x1", "--global-batch", "8", "--seq", "512",
                   "--mesh=2,1,2", "--config.model.attention_impl=splash",
                   "--config.model.scan_layers=true", "--config.model.remat_policy=full",
                   "--json", str(out)], libtpu)
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  r = json.loads(out.read_text())
  assert r["fits"] and r["splash_kernel_in_hlo"]
  assert r["config"]["family"] == "modernbert" and r["config"]["attention_impl"] == "splash"
  assert r["estimated_step_s"] > 0 and 0 < r["estimated_mfu"] < 1
