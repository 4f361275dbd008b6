"""HF mapping tables: the one expander and every rule kind, on small numpy arrays, plus one
toy family that round-trips a fused qkv tensor and a computed table through files."""
import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import encoders
from encoders import base, hf
from encoders.hf import PerLayer, Rule
from encoders.hf import mapping as hf_mapping
from encoders.hf.rules import expand, export_rule, import_rule

D, H, K, F = 6, 2, 3, 5
CFG = ml_collections.ConfigDict(dict(vocab_size=7, hidden_size=D, num_attention_heads=H))


def _rand(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def _round_trip(rule, hf_tensors, expected):
  """import -> our params; export -> HF tensors again."""
  [rule] = expand([rule], CFG)
  ours = import_rule(rule, hf_tensors, expected, CFG)
  return ours, export_rule(rule, ours, CFG)


def test_expander_fills_arbitrary_index_dicts_and_computes_shapes():
  groups = [{"g": g, "j": j} for g in range(2) for j in range(3)]
  table = [Rule("emb", "embeddings.weight", "embedding"),
           PerLayer([Rule("encoder/group_{g}/layer_{j}/q/kernel",
                          "encoder.albert_layer_groups.{g}.albert_layers.{j}.attention.query"
                          ".weight", "linear", shape=lambda c: (c.hidden_size, H, K))], groups)]
  rules = expand(table, CFG)
  assert [r.ours for r in rules[1:3]] == ["encoder/group_0/layer_0/q/kernel",
                                          "encoder/group_0/layer_1/q/kernel"]
  assert rules[-1].hf == "encoder.albert_layer_groups.1.albert_layers.2.attention.query.weight"
  assert rules[-1].shape == (D, H, K) and len(rules) == 7
  assert [r["i"] for r in hf.layer_indices(3)] == [0, 1, 2]


@pytest.mark.parametrize("table, message", [
    ([PerLayer([Rule("l_{i}/b", "l.{i}.b"), Rule("l_0/b", "x")], hf.layer_indices(2))],
     "claimed by two rules"),
    ([Rule("a", "w"), Rule("b", "w")], "claimed by two rules"),
    ([PerLayer([Rule("l_{i}/b", "l.{k}.b")], [{"i": 0, "k": 0}]), Rule("x_{i}", "x")],
     "placeholder"),
    ([Rule("a", "w", "frobnicate")], "unknown rule kind"),
    ([Rule("a", "w", "split")], "malformed"),
    ([Rule("a", ("w1", "w2"), "concat", of="embedding", vocab=True)], "vocab"),
    ([Rule("a", "w", groups=2)], "groups"),
])
def test_expander_refuses_malformed_tables(table, message):
  with pytest.raises(ValueError, match=message):
    expand(table, CFG)


def test_linear_with_declared_reshape_round_trips():
  w = _rand(H * K, D)  # HF (out, in)
  rule = Rule("q/kernel", "q.weight", "linear", shape=(D, H, K))
  ours, back = _round_trip(rule, {"q.weight": w}, {"q/kernel": (D, H, K)})
  np.testing.assert_array_equal(ours["q/kernel"], w.T.reshape(D, H, K))
  np.testing.assert_array_equal(back["q.weight"], w)
  out = Rule("o/kernel", "o.weight", "linear", shape=(H, K, D), n_in=2)
  ours, back = _round_trip(out, {"o.weight": w.T}, {"o/kernel": (H, K, D)})
  np.testing.assert_array_equal(ours["o/kernel"], w.reshape(H, K, D))
  np.testing.assert_array_equal(back["o.weight"], w.T)


def test_same_size_transposed_tensor_is_an_error_naming_it():
  w = _rand(F, D)
  rule = Rule("wi/kernel", "wi.weight", "linear")
  with pytest.raises(ValueError, match=r"'wi\.weight' has shape \(6, 5\), expected \(5, 6\)"):
    _round_trip(rule, {"wi.weight": np.ascontiguousarray(w.T)}, {"wi/kernel": (D, F)})
  # an undeclared reshape is refused, even where the element count matches
  bias = Rule("q/bias", "q.bias")
  with pytest.raises(ValueError, match=r"'q\.bias' has shape \(6,\), expected \(2, 3\)"):
    _round_trip(bias, {"q.bias": _rand(H * K)}, {"q/bias": (H, K)})


def test_declared_shape_must_match_the_model():
  rule = Rule("q/kernel", "q.weight", "linear", shape=(D, K, H))
  with pytest.raises(ValueError, match="declares 'q/kernel'"):
    _round_trip(rule, {"q.weight": _rand(H * K, D)}, {"q/kernel": (D, H, K)})


def test_missing_tensor_is_named():
  with pytest.raises(ValueError, match=r"'q\.weight' \(needed for q/kernel\) is missing"):
    _round_trip(Rule("q/kernel", "q.weight", "linear"), {}, {"q/kernel": (D, D)})


def test_split_fused_qkv_round_trips():
  w, b = _rand(3 * H * K, D), _rand(3 * H * K, seed=1)
  names = ("query", "key", "value")
  kernel = Rule(tuple(f"{n}/kernel" for n in names), "qkv.weight", "split", of="linear",
                shape=(D, H, K))
  bias = Rule(tuple(f"{n}/bias" for n in names), "qkv.bias", "split", shape=(H, K))
  expected = {f"{n}/{p}": s for n in names for p, s in (("kernel", (D, H, K)),
                                                        ("bias", (H, K)))}
  ours, back = _round_trip(kernel, {"qkv.weight": w}, expected)
  for i, n in enumerate(names):
    np.testing.assert_array_equal(ours[f"{n}/kernel"],
                                  w[i * H * K:(i + 1) * H * K].T.reshape(D, H, K))
  np.testing.assert_array_equal(back["qkv.weight"], w)
  ours, back = _round_trip(bias, {"qkv.bias": b}, expected)
  np.testing.assert_array_equal(ours["value/bias"], b[2 * H * K:].reshape(H, K))
  np.testing.assert_array_equal(back["qkv.bias"], b)
  with pytest.raises(ValueError, match=r"'qkv\.weight' has shape \(6, 18\), expected "
                                       r"\(18, 6\)"):
    _round_trip(kernel, {"qkv.weight": np.ascontiguousarray(w.T)}, expected)


def test_grouped_split_takes_each_groups_rows_per_part():
  """groups=H: the HF rows are, per head, that head's q, k and v rows side by side
  (DeBERTa v1's in_proj); a plain split of the same tensor would mix heads."""
  w = _rand(3 * H * K, D)
  names = ("query", "key", "value")
  rule = Rule(tuple(f"{n}/kernel" for n in names), "in_proj.weight", "split", of="linear",
              shape=(D, H, K), groups=H)
  expected = {f"{n}/kernel": (D, H, K) for n in names}
  ours, back = _round_trip(rule, {"in_proj.weight": w}, expected)
  for part, n in enumerate(names):
    for h in range(H):
      rows = w[3 * K * h + K * part:3 * K * h + K * (part + 1)]
      np.testing.assert_array_equal(ours[f"{n}/kernel"][:, h, :], rows.T)
  np.testing.assert_array_equal(back["in_proj.weight"], w)
  plain, _ = _round_trip(dataclasses.replace(rule, groups=1), {"in_proj.weight": w}, expected)
  assert not np.array_equal(plain["key/kernel"], ours["key/kernel"])
  with pytest.raises(ValueError, match="do not divide into 4 groups"):
    _round_trip(dataclasses.replace(rule, groups=4), {"in_proj.weight": w}, expected)


def test_split_of_unequal_parts_follows_the_model_shapes():
  w = _rand(D + 2 * F, D)
  rule = Rule(("a/kernel", "b/kernel"), "ab.weight", "split", of="linear")
  ours, back = _round_trip(rule, {"ab.weight": w}, {"a/kernel": (D, D), "b/kernel": (D, 2 * F)})
  np.testing.assert_array_equal(ours["b/kernel"], w[D:].T)
  np.testing.assert_array_equal(back["ab.weight"], w)


def test_concat_round_trips_equal_and_given_sizes():
  gate, up = _rand(F, D), _rand(F, D, seed=1)
  rule = Rule("wi/kernel", ("gate.weight", "up.weight"), "concat", of="linear")
  ours, back = _round_trip(rule, {"gate.weight": gate, "up.weight": up},
                           {"wi/kernel": (D, 2 * F)})
  np.testing.assert_array_equal(ours["wi/kernel"], np.concatenate([gate, up]).T)
  np.testing.assert_array_equal(back["gate.weight"], gate)
  np.testing.assert_array_equal(back["up.weight"], up)
  a, b = _rand(2), _rand(3, seed=1)
  rule = Rule("v", ("a", "b"), "concat", sizes=(2, 3))
  ours, back = _round_trip(rule, {"a": a, "b": b}, {"v": (5,)})
  np.testing.assert_array_equal(ours["v"], np.concatenate([a, b]))
  np.testing.assert_array_equal(back["b"], b)
  with pytest.raises(ValueError, match=r"'b' has shape \(2,\), expected \(3,\)"):
    _round_trip(rule, {"a": a, "b": a}, {"v": (5,)})


def _table(cfg):
  return np.sin(np.arange(8 * cfg.hidden_size, dtype=np.float32)).reshape(8, cfg.hidden_size)


def test_computed_is_checked_not_loaded_and_written_on_export():
  rule = Rule("", "pos.weight", "computed", compute=_table)
  ours, back = _round_trip(rule, {"pos.weight": _table(CFG) + 1e-6}, {})
  assert ours == {}
  np.testing.assert_array_equal(back["pos.weight"], _table(CFG))
  assert _round_trip(rule, {}, {})[0] == {}  # absent: nothing to check, nothing to load
  wrong = _table(CFG)
  wrong[7, 1] += 0.01
  with pytest.raises(ValueError, match=r"'pos\.weight' differs from the table"):
    _round_trip(rule, {"pos.weight": wrong}, {})
  with pytest.raises(ValueError, match=r"'pos\.weight' has shape"):
    _round_trip(rule, {"pos.weight": _table(CFG)[:5]}, {})


def test_vocab_rows_are_padded_on_import_and_cut_on_export():
  dec = _rand(CFG.vocab_size, D)
  rule = Rule("decoder/kernel", "decoder.weight", "linear", vocab=True)
  ours, back = _round_trip(rule, {"decoder.weight": dec}, {"decoder/kernel": (D, 8)})
  assert ours["decoder/kernel"].shape == (D, 8)
  np.testing.assert_array_equal(ours["decoder/kernel"][:, 7], 0)
  np.testing.assert_array_equal(back["decoder.weight"], dec)


# ---- a toy family whose files fuse q/k/v and store a table we compute ----------------

class _Toy(nn.Module):
  config: object

  @nn.compact
  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
    c = self.config
    h, k = c.num_attention_heads, c.hidden_size // c.num_attention_heads
    init = nn.initializers.normal(1.0)
    x = self.param("emb", init, (c.vocab_size, c.hidden_size))[input_ids]
    x = x + jnp.asarray(_table(c))[:input_ids.shape[1]]
    q, kk, v = (jnp.einsum("btd,dhk->bthk", x, self.param(n, init, (c.hidden_size, h, k)))
                for n in ("q", "k", "v"))
    y = jnp.einsum("bthk,bshk->bths", q, kk).sum(-1, keepdims=True) * v
    return base.EncoderOutput(last_hidden_state=y.reshape(x.shape))


class _ToyMapping(hf.Mapping):
  model_types = ("toyfused",)
  architectures = {"ToyFusedModel": ("", ())}
  ignorable = ("buffer_ids",)

  def config_from_hf(self, cfg, heads):
    from encoders import bert
    m = bert.defaults()
    m.family, m.heads = "toyfused", ()
    m.vocab_size, m.hidden_size, m.num_attention_heads = (
        cfg["vocab_size"], cfg["hidden_size"], cfg["num_attention_heads"])
    return m

  def config_to_hf(self, cfg):
    return {"model_type": "toyfused", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "num_attention_heads": cfg.num_attention_heads}, "ToyFusedModel"

  def rules(self, cfg):
    shape = (cfg.hidden_size, cfg.num_attention_heads,
             cfg.hidden_size // cfg.num_attention_heads)
    return [Rule("emb", "emb.weight", "embedding"),
            Rule(("q", "k", "v"), "qkv.weight", "split", of="linear", shape=shape),
            Rule("", "pos.weight", "computed", compute=_table)]


@pytest.fixture
def toy_family():
  base.register_family("toyfused")(_Toy)
  hf.register_mapping(_ToyMapping)
  try:
    yield
  finally:
    base._FAMILIES.pop("toyfused", None)
    hf_mapping._MAPPINGS.pop("toyfused", None)


def test_fused_qkv_and_computed_table_round_trip_through_files(toy_family, tmp_path):
  from encoders import bert
  cfg = bert.defaults()
  cfg.family, cfg.heads, cfg.vocab_size, cfg.hidden_size, cfg.num_attention_heads = (
      "toyfused", (), 11, D, H)
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0), length=4)
  out = tmp_path / "toy"
  encoders.to_hf(model, params, str(out))
  files = load_file(out / "model.safetensors")
  assert sorted(files) == ["emb.weight", "pos.weight", "qkv.weight"]
  assert files["qkv.weight"].shape == (3 * D, D)
  np.testing.assert_array_equal(files["qkv.weight"][D:2 * D],
                                np.asarray(params["k"]).reshape(D, D).T)
  files["buffer_ids"] = np.arange(3)  # this mapping's ignorable key
  save_file(files, out / "model.safetensors", metadata={"format": "pt"})
  model2, params2 = encoders.from_hf(str(out))
  assert sorted(params2) == ["emb", "k", "q", "v"]
  for name in params:
    np.testing.assert_array_equal(params[name], params2[name])
  ids = jnp.array([[1, 2, 3, 4]])
  np.testing.assert_array_equal(model.apply({"params": params}, ids).last_hidden_state,
                                model2.apply({"params": params2}, ids).last_hidden_state)
  files["pos.weight"] = files["pos.weight"] * 2.0
  save_file(files, out / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"'pos\.weight' differs"):
    encoders.from_hf(str(out))
  assert json.loads((out / "config.json").read_text())["architectures"] == ["ToyFusedModel"]
