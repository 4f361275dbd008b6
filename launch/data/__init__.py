"""The pretraining input pipeline: documents -> tokens -> fixed-length rows -> Grain batches.

One module per stage:
- `sources`: where documents come from (`data.source`: default | text | tfds) and the
  held-out documents; `split`: held-out splits and their decontamination; `corpus`: the
  embedded default corpus; `badinput`: the bad-input policy (`data.bad_data`) every
  reader applies; `arrayrecord`: `data.source="arrayrecord"`, the pretokenized shards of
  `launch.preprocess`.
- `tokenization`: the tokenizers; `tokenized`: documents as token ids, and the cache.
- `packing`: the row format and document packing (`data.packing="documents"`); pairs
  (`data.packing="pairs"`, `data.pair_task` nsp | sop) are built by `launch.data.pairs`.
- `pipeline`: `make_pipeline(config, workdir)` -> `Pipeline`; `iteration`: the
  `Pipeline`, its Grain iteration and resumable iterator state.

Batches are dicts of numpy arrays with a leading per-process batch dimension B:
  input_ids int32 (B, T), segment_ids int32 (B, T), position_ids int32 (B, T),
  token_type_ids int32 (B, T), special_tokens_mask bool (B, T) ([CLS]/[SEP]/[PAD]: never
  masked), word_starts bool (B, T) (token begins a word; the first token after [CLS] or
  [SEP] always does), and for `pairs` the task's label int32 (B,): `next_sentence_label`
  (nsp, 1 = random) or `sentence_order_label` (sop, 1 = swapped). In evaluation batches,
  rows of padding only (label -1) fill the last batch.

Usage: `from launch import data as data_lib; data_lib.make_pipeline(config, workdir)`.
"""
from launch.data import corpus
from launch.data import tokenization
from launch.data.packing import DocumentRows, PAD_LABEL, finish_row, pack_documents, padding_row
from launch.data.iteration import (Batch, Pipeline, TrainIterator, iterator_state,
                                   restore_iterator)
from launch.data.pipeline import CACHE_VERSION, PACKINGS, make_pipeline, validate
from launch.data.sources import (DOCUMENT_SOURCES, SOURCES, TEXT_DOCUMENT_MODES,
                                 default_split, expand_globs, load_documents)
from launch.data.split import EVAL_SPLIT_SEED, decontaminate, grouped_holdout, random_holdout
from launch.data.tokenized import MAX_UNIT_CHARS, TokenizedDocuments, tokenize_documents
