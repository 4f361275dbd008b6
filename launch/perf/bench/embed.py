"""`pipelines.embed` against `SentenceTransformer(dir).encode` on the same texts, in one
process: texts/s of each in interleaved rounds (ours, theirs, ours, ...), the ratio per
round, and the worst cosine between the two sets of vectors.

    python -m launch.bench --mode embed --model DIR --texts 1000 --batch 32 --rounds 3

The texts are passages of the embedded default corpus's prose (launch/data/corpus.py):
single lines and short paragraphs of mixed length, and every `long_every`-th a
multi-paragraph document of several thousand characters (past a 256-token limit).
Each round embeds all of them; the first round includes both sides' warm-up (our
compiles, their first allocations) and is reported but not counted in the median.
"""
import statistics
import time
from typing import List

import numpy as np

from encoders import pipelines
from launch.data import corpus


def mixed_texts(n: int, long_every: int = 20, seed: int = 0) -> List[str]:
  """n passages of the default corpus's prose: lines, runs of lines and, every
  `long_every`-th, a multi-paragraph document (deterministic for a seed)."""
  rng = np.random.default_rng(seed)
  docs = [d for d in corpus.prose_documents() if len(d) > 4000]
  lines = [ln.strip() for d in docs for ln in d.splitlines() if len(ln.strip()) > 20]
  out = []
  for i in range(n):
    if long_every and i % long_every == long_every - 1:
      d = docs[int(rng.integers(len(docs)))]
      start = int(rng.integers(0, max(1, len(d) - 6000)))
      out.append(d[start:start + int(rng.integers(3000, 6000))])
    else:
      k = int(rng.choice([1, 1, 1, 2, 3, 6]))
      j = int(rng.integers(0, len(lines) - k))
      out.append(" ".join(lines[j:j + k]))
  return out


def bench_embed(model_dir: str, n_texts: int = 1000, batch: int = 32, rounds: int = 3,
                long_every: int = 20, seed: int = 0) -> dict:
  import torch  # why: the reference side only
  from sentence_transformers import SentenceTransformer  # why: the reference side only
  texts = mixed_texts(n_texts, long_every, seed)
  p = pipelines.load(model_dir, batch_size=batch)
  st = SentenceTransformer(model_dir, device="cpu")
  ours_tps, theirs_tps, worst = [], [], None
  for r in range(rounds + 1):
    t0 = time.perf_counter()
    ours = pipelines.embed(p, texts)
    t1 = time.perf_counter()
    with torch.inference_mode():
      theirs = st.encode(texts, batch_size=batch, convert_to_numpy=True,
                         show_progress_bar=False)
    t2 = time.perf_counter()
    ours_tps.append(n_texts / (t1 - t0))
    theirs_tps.append(n_texts / (t2 - t1))
    a, b = ours.astype(np.float64), theirs.astype(np.float64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    worst = float(cos.min()) if worst is None else min(worst, float(cos.min()))
    print(f"round {r}{' (warm-up)' if r == 0 else ''}: ours {ours_tps[-1]:.1f} texts/s, "
          f"sentence-transformers {theirs_tps[-1]:.1f} texts/s, "
          f"ratio {ours_tps[-1] / theirs_tps[-1]:.2f}x", flush=True)
  ratios = [o / t for o, t in zip(ours_tps[1:], theirs_tps[1:])]
  tokens = [len(e.ids) for e in p.encode(texts)]
  result = {"model": model_dir, "texts": n_texts, "batch": batch, "long_every": long_every,
            "max_seq_length": p.max_length, "tokens_median": int(np.median(tokens)),
            "tokens_max": int(max(tokens)), "truncated": int(sum(t >= p.max_length
                                                                 for t in tokens)),
            "ours_texts_per_s": ours_tps[1:], "theirs_texts_per_s": theirs_tps[1:],
            "ratios": ratios, "median_ratio": statistics.median(ratios),
            "worst_cosine": worst, "torch_threads": torch.get_num_threads()}
  print(f"median of {rounds} rounds: ours {statistics.median(ours_tps[1:]):.1f} texts/s, "
        f"sentence-transformers {statistics.median(theirs_tps[1:]):.1f} texts/s, ratio "
        f"{result['median_ratio']:.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"worst cosine {worst:.7f}; tokens median {result['tokens_median']}, "
        f"{result['truncated']} texts cut at {p.max_length}", flush=True)
  return result
