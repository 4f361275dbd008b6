"""launch.aot plumbing: the real sharded train step compiled ahead of time for a Cloud TPU
topology (Splash attention, tensor sharding, scan + remat included), HBM against capacity,
XLA's estimate, and the exit status when it does not fit.

Needs libtpu (the TPU compiler). When the environment has none it is installed into
`.cache/libtpu` of the repository (not into the environment: an installed libtpu makes
every JAX process probe for a TPU); the tests skip, saying why, only if that fails.
"""
import json
import os
import subprocess
import sys

import pytest

from launch.perf import aot
from tests.launch.aot_helpers import REPO, run_aot
from tests.launch.aot_helpers import libtpu  # noqa: F401  (a fixture)

TINY = ["--config", "configs/bert.py:tiny", "--config.model.num_hidden_layers=1",
        "--config.model.vocab_size=512"]


def test_tpu_recipe_gets_splash_and_compiles_sharded_for_v5p(libtpu, tmp_path):
  """No attention flags: the TPU recipe (attention dropout 0) resolves `auto` to Splash at
  seq 128, and the sharded step compiles and is priced for a v5p slice."""
  out = tmp_path / "aot.json"
  p = run_aot(["--config", "configs/bert.py:mini", "--config.model.num_hidden_layers=1",
            "--config.model.vocab_size=512", "--topology", "v5p:2x2x1", "--global-batch",
            "8", "--seq", "128", "--mesh=2,1,2", "--breakdown", "6", "--json", str(out)],
           libtpu, timeout=1500)  # three compiles: the step and its stand-in twin
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  r = json.loads(out.read_text())
  assert r["config"]["attention_impl"] == "splash" and r["splash_kernel_in_hlo"]
  assert "attention: auto -> splash" in p.stdout.splitlines()[2]
  assert r["fits"] and r["devices"] == 4 and r["device_kind"].startswith("TPU v5")
  assert r["mesh"] == {"data": 2, "fsdp": 1, "tensor": 2}
  assert r["config"]["dtype"] == "bfloat16"  # "auto" resolved for the TPU target
  assert 0 < r["memory"]["total"] < r["hbm_capacity_bytes"] == 95 * 2**30
  assert r["estimated_step_s"] > 0 and 0 < r["estimated_mfu"] < 1
  # The real step (masking included) is priced directly, except that XLA cannot see into
  # the Splash kernels: its part comes from a twin with elementwise stand-ins for them.
  assert r["estimate_notes"] == [
      "XLA's part priced on a twin with each Pallas kernel replaced by an elementwise "
      "stand-in (same inputs and output); the kernels by roofline"]
  assert r["xla_with_opaque_kernels_s"] > 0
  assert "HBM per device" in p.stdout and "implied MFU" in p.stdout
  # each program's compile time apart: the step, then its stand-in twin
  assert [name for name, _ in r["compile_programs"]] == ["the train step",
                                                         "the kernel stand-in twin"]
  assert all(s > 0 for _, s in r["compile_programs"])
  assert "2 programs compiled: the train step" in p.stdout
  # the config's scoped-VMEM limit is what the step was compiled with, and the report says so
  assert r["compiler_options"] == {"xla_tpu_scoped_vmem_limit_kib": 98304}
  assert ("TPU compiler options: xla_tpu_scoped_vmem_limit_kib=98304 "
          "(train.tpu_scoped_vmem_kib)") in p.stdout
  # XLA cannot price the Splash kernels: their roofline is added and shown apart. Per
  # device: 4 rows x 2 heads (mini's 4 over tensor=2), the forward's 2 and the fused
  # backward's 5 T x T x K matmuls.
  kr = r["kernel_roofline"]
  assert kr["flops"] == 7 * 2 * 4 * 2 * 128 * 128 * 64 and kr["unpriced"] == []
  assert r["estimated_step_s"] == pytest.approx(r["xla_priced_s"] + kr["seconds"])
  assert kr["seconds"] > 0 and "roofline estimate of 2 Pallas kernel call(s)" in p.stdout
  # XLA's own FLOP and byte counts of the program it priced (the twin), beside its price
  pc = r["xla_priced_counts"]
  assert pc["flops"] > 0 and pc["bytes"] > 0
  assert pc["hbm_bandwidth"] == 2765e9 / r["devices_per_chip"]
  assert "XLA's part against its own counts" in p.stdout
  # --breakdown: the priced twin's ops by the compiler's per-op cycle estimates, grouped by
  # source op with the autodiff pass named; the stand-ins, not the kernels, are in it
  b = r["breakdown"]
  assert b["total_cycles"] > 0 and sum(g["share"] for g in b["groups"]) == pytest.approx(1)
  names = [g["group"] for g in b["groups"]]
  assert "fwd Bert/encoder/layer_*/mlp/wi/dot_general" in names
  assert "bwd Bert/encoder/layer_*/mlp/wo/dot_general" in names
  assert not [g for g in b["groups"] if g["opcode"] == "custom-call"]
  assert "where the time goes" in p.stdout and "more groups" in p.stdout


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_scanned_remat_step_is_priced_on_its_unrolled_twin(libtpu, tmp_path):
  out = tmp_path / "aot.json"
  p = run_aot(TINY + ["--config.model.num_hidden_layers=2", "--topology", "v5p:2x2x1",
                   "--global_batch", "8", "--seq", "128", "--config.model.scan_layers=true",
                   "--config.model.remat_policy=dots_saveable", "--json", str(out)], libtpu)
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  r = json.loads(out.read_text())
  assert r["fits"] and r["config"]["scan_layers"] and r["estimated_step_s"] > 0
  # XLA prices a loop body once: the estimate comes from the unrolled twin, and says so.
  assert r["estimate_notes"] == [
      "layers unrolled and no accumulation loop (XLA prices a loop body once)"]
  assert "estimated on a twin of the step" in p.stdout


@pytest.mark.slow  # default-suite time (~20 s); .ci/run runs it when time allows
def test_rbg_prng_gives_no_estimate_instead_of_a_crash(libtpu):
  """With JAX's rbg PRNG (4-word keys) the dropout masks come from RngBitGenerator, which
  XLA's TPU cost model cannot price: the fallback twin (its key shaped for the default
  PRNG, not a fixed 2 words) still compiles, and the report says there is no estimate."""
  p = run_aot(TINY + ["--topology", "v5p:2x2x1", "--global_batch", "8", "--seq", "128"],
           libtpu, JAX_DEFAULT_PRNG_IMPL="rbg")
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  assert "XLA reported no step-time estimate for this program" in p.stdout


def test_does_not_fit_exits_nonzero_with_a_clear_message(libtpu):
  p = run_aot(TINY + ["--topology", "v5e:2x2", "--global_batch", "4", "--seq", "64",
                   "--config.model.scan_layers=true", "--config.model.remat_policy=full",
                   "--hbm_gib", "0.001"], libtpu)
  assert p.returncode == aot.EXIT_DOES_NOT_FIT, p.stdout + p.stderr[-3000:]
  assert "DOES NOT FIT" in p.stdout and "per device" in p.stdout


def test_bad_topology_is_a_usage_error(libtpu):
  p = run_aot(TINY + ["--topology", "v5p:banana", "--global_batch", "8"], libtpu)
  assert p.returncode == aot.EXIT_USAGE
  assert "v5p:banana" in p.stderr


def test_compiler_options_are_for_tpu_only_and_refuse_bad_values():
  from configs import common
  from launch import trainer
  c = common.base_config()
  assert trainer.compiler_options(c, "tpu") == {"xla_tpu_scoped_vmem_limit_kib": 98304}
  assert trainer.compiler_options(c, "cpu") is None
  assert trainer.compiler_options(c, "gpu") is None
  # a generation's own options join the config's (v6e: no windowed reduce-scatter matmuls)
  v6e = trainer.compiler_options(c, "tpu", "TPU v6 lite")
  assert v6e == {"xla_tpu_scoped_vmem_limit_kib": 98304,
                 "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False}
  assert trainer.compiler_options(c, "tpu", "TPU v5") == {"xla_tpu_scoped_vmem_limit_kib": 98304}
  assert trainer.compiler_options(c, "cpu", "TPU v6 lite") is None
  assert "GENERATION_OPTIONS" in trainer.compiler_options_line(v6e)
  assert "GENERATION_OPTIONS" not in trainer.compiler_options_line(
      trainer.compiler_options(c, "tpu", "TPU v5"))
  c.train.tpu_scoped_vmem_kib = 0  # the compiler's own default
  assert trainer.compiler_options(c, "tpu") is None
  assert trainer.compiler_options(c, "tpu", "TPU v6 lite") == {
      "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False}
  for bad in (-1, True):
    c.train.tpu_scoped_vmem_kib = bad
    with pytest.raises(ValueError, match="train.tpu_scoped_vmem_kib must be an integer"):
      trainer.compiler_options(c, "cpu")  # refused wherever the run is


def test_train_step_is_compiled_with_the_scoped_vmem_limit(libtpu):
  """trainer.build hands the config's limit to the train and eval steps' jit for a TPU
  mesh, and the limit is one the compiler acts on: BERT-base's 768 -> 768 projection at
  16,384 rows per device (the issue's batch of 128 x 512 over 4 chips) prices cheaper on
  v5p with it than with the compiler's default."""
  code = r"""
from launch.perf import aot
aot.find_libtpu()
aot.quiet_libtpu_env()
import jax, jax.numpy as jnp
from jax.sharding import SingleDeviceSharding
from configs import bert
from launch import trainer
from launch.perf import synthetic
devices = aot.get_topology("v5p:2x2x1").devices
seen = []
real_jit = jax.jit
def recording_jit(*a, **k):
  seen.append(k.get("compiler_options"))
  return real_jit(*a, **k)
jax.jit = recording_jit
c = bert.get_config("tiny")
c.model.attention_probs_dropout_prob = 0.0
trainer.build(c, synthetic.SyntheticTokenizer.for_model(c.model), devices=list(devices))
jax.jit = real_jit
print("SEEN", seen)
d0 = SingleDeviceSharding(devices[0])
args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=d0) for s in ((16384, 768), (768, 768))]
for opts in (None, trainer.compiler_options(c, "tpu")):
  cost = aot.xla_cost(jax.jit(lambda x, w: x @ w).lower(*args).compile(compiler_options=opts))
  print("PRICE", cost["optimal_seconds"])
"""
  env = dict(os.environ, TPU_LIBRARY_PATH=libtpu, XLA_FLAGS="")
  p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  seen = [line for line in p.stdout.splitlines() if line.startswith("SEEN")][0]
  # init and make-state jits take no options; the train and eval steps both do
  assert seen.count("{'xla_tpu_scoped_vmem_limit_kib': 98304}") == 2, seen
  default, limited = [float(line.split()[1]) for line in p.stdout.splitlines()
                      if line.startswith("PRICE")]
  from launch.trainer import devices as devices_lib
  at_peak = 2 * 16384 * 768 * 768 / devices_lib.chip_peak_flops("TPU v5")
  assert at_peak < limited < 0.8 * default, (default, limited, at_peak)


def test_mesh_flag_parsing_and_tables():
  assert aot.parse_mesh("-1,1,1") == (-1, 1, 1) and aot.parse_mesh("2x1x2") == (2, 1, 2)
  with pytest.raises(aot.AotError, match="data,fsdp,tensor"):
    aot.parse_mesh("4")
  assert aot.hbm_per_chip("TPU v5") == 95 * 2**30
  assert aot.hbm_per_chip("TPU v5 lite") == 16 * 2**30
  assert aot.hbm_per_chip("TPU v6 lite") == 32 * 2**30
  assert aot.hbm_per_chip("Banana v1") is None


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_fallback_twin_prices_the_step_with_the_transform_done_beforehand():
  # The fallback for programs XLA's cost model cannot price, run on this host's CPU
  # devices (no libtpu): the step is lowered on the transform's output shapes with an
  # identity transform, and the objective's own transform is back afterwards.
  import jax
  from configs import bert as bert_configs
  from launch import trainer
  from launch.perf import synthetic
  c = bert_configs.get_config("tiny").unlock()
  c.model.num_hidden_layers, c.model.vocab_size = 1, 512
  c.data.global_batch, c.data.seq_len, c.mesh.shape = 4, 32, (2, 1, 1)
  tok = synthetic.SyntheticTokenizer.for_model(c.model)
  devices = jax.devices()[:2]
  setup = trainer.build(c, tok, devices=devices)
  batch = synthetic.abstract_batch(setup.objective, 4, 32, setup.batch_sharding)
  before = setup.objective.transform
  programs = []
  est, notes, hlo, counts = aot._step_time_estimate(c, tok, devices, setup, batch, None, "",
                                                    {}, programs)
  assert hlo  # the priced program, for the kernel roofline
  assert counts["flops"] > 0 and counts["bytes"] > 0  # XLA's counts of the priced program
  # each compile is timed apart, under its name
  assert [name for name, _ in programs] == ["the twin without the batch transform"]
  assert programs[0][1] > 0
  assert notes[0] == ("without the objective's batch transform, which XLA's TPU cost "
                      "model could not price")
  # (XLA:CPU lowers JAX's threefry key derivation as a while loop, hence maybe this note.)
  assert set(notes[1:]) <= {"the priced program still has a loop: the estimate is a lower "
                            "bound"}
  assert setup.objective.transform == before  # the identity stand-in is gone again
  assert "mlm_weights" in setup.objective.transform(
      synthetic.full_batch(setup.objective, 4, 32), jax.random.PRNGKey(0))


_CONCAT = ('  %custom-call{} = bf16[768,3072]{{1,0:T(8,128)(2,1)S(1)}} custom-call(%slice-done, '
           '%slice-done.1), custom_call_target="ConcatBitcast", backend_config={{}}')
_OTHER = ('  %custom-call.9 = f32[8,128]{1,0} custom-call(%p), '
          'custom_call_target="SomethingUnpriced"')


def test_free_concat_bitcasts_get_their_minus_one_second_back():
  """XLA's TPU cost model charges -1 s for each op it cannot price. v5e/v6e programs join
  prefetched weight slices with ConcatBitcast custom calls (no data moved): those are
  counted at 0; any other unpriced op still leaves no estimate."""
  hlo = "\n".join(["HloModule m", _CONCAT.format(""), _CONCAT.format(".1"), _OTHER])
  assert aot.free_custom_calls(hlo) == 2
  assert aot._optimal_seconds({"optimal_seconds": 0.0016 - 2.0}, hlo) == pytest.approx(0.0016)
  # a third unpriced op (-3 s in all): still negative, so still no estimate
  assert aot._optimal_seconds({"optimal_seconds": 0.0016 - 3.0}, hlo) < 0
  # priced programs and programs without such calls are left as XLA priced them
  assert aot._optimal_seconds({"optimal_seconds": 0.0123}, hlo) == 0.0123
  assert aot._optimal_seconds({"optimal_seconds": -0.9984}, _OTHER) == -0.9984
  assert aot._optimal_seconds({}, hlo) is None


def test_v5e_program_with_prefetched_weights_is_priced(libtpu):
  """A two-matmul forward + backward at BERT-base's MLP size compiled for v5e: the
  compiler joins prefetched weight slices with ConcatBitcast, XLA's own time is below
  -1 s, and with those calls at 0 it is a positive time above the matmuls' roofline."""
  code = r"""
from launch.perf import aot
aot.find_libtpu()
aot.quiet_libtpu_env()
import jax, jax.numpy as jnp
from jax.sharding import SingleDeviceSharding
d0 = SingleDeviceSharding(aot.get_topology("v5e:2x2").devices[0])
bf = jnp.bfloat16
f = jax.grad(lambda x, w1, w2, c: (((x @ w1) @ w2).astype(jnp.float32)
                                   * c.astype(jnp.float32)).sum(), argnums=(0, 1))
args = [jax.ShapeDtypeStruct(s, bf, sharding=d0)
        for s in ((16384, 768), (768, 3072), (3072, 768), (16384, 768))]
c = jax.jit(f).lower(*args).compile()
hlo = c.as_text()
cost = aot.xla_cost(c)
print(cost["optimal_seconds"], aot.free_custom_calls(hlo), aot._optimal_seconds(cost, hlo))
"""
  env = dict(os.environ, TPU_LIBRARY_PATH=libtpu, XLA_FLAGS="")
  p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                     text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  raw, free, fixed = p.stdout.split()[-3:]
  assert float(raw) < -1 + 0.01 and int(free) >= 1
  # at least its four matmuls (forward x2, the gradients of x and w1) at v5e's peak
  from launch.trainer import devices
  assert float(fixed) > 4 * 2 * 16384 * 768 * 3072 / devices.chip_peak_flops("TPU v5 lite")


@pytest.mark.slow  # default-suite time (~30 s); .ci/run runs it when time allows
def test_deberta_tpu_recipe_gets_the_fused_relative_kernel_and_prices_it(libtpu, tmp_path):
  """DeBERTa's TPU recipe (attention dropout 0) resolves `relative_impl: auto` to the fused
  Pallas kernel; the sharded step compiles for v5p and each of its three kernels is priced
  by roofline with the FLOPs of its matmul units (encoders/layers/relative_kernel.py): the
forward and the one fused backward.
  Two layers: the recipe's enhanced mask decoder reruns the last one twice, on the kernel
  too; the last layer's own pass feeds nothing the MLM loss reads, and XLA drops it, so
  each kernel runs three times, the layer passes `forward_flops` counts."""
  out = tmp_path / "aot.json"
  p = run_aot(["--config", "configs/deberta.py:base", "--config.model.num_hidden_layers=2",
            "--config.model.vocab_size=512", "--topology", "v5p:2x2x1", "--global-batch",
            "8", "--seq", "128", "--mesh=2,1,2", "--breakdown", "6", "--json", str(out)],
           libtpu, timeout=1500)
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  r = json.loads(out.read_text())
  assert "relative attention: auto -> fused" in r["attention_choice"]
  roof = r["kernel_roofline"]
  assert roof["unpriced"] == []
  names = " ".join(roof["kernels"])
  for kernel in ("deberta_rel_fwd__c2p_p2c", "deberta_rel_bwd__c2p_p2c"):
    assert kernel in names, names
  assert len(roof["kernels"]) == 2
  # per device: 8 / 2 rows (data=2), 12 / 2 heads (tensor=2), T = 128, K = 64; units: the
  # forward 6, the backward 5 + 6 per term + 128 / K per term (the column reversal) = 21;
  # layer 0 + the decoder's 2 passes
  assert r["config"]["enhanced_mask_decoder"]
  assert all(k["calls"] == 3 for k in roof["kernels"].values()), roof["kernels"]
  assert roof["flops"] == 3 * (6 + 21) * 2 * 4 * 6 * 128 * 128 * 64
  assert r["estimated_step_s"] > r["xla_priced_s"] > 0 and 0 < r["estimated_mfu"] < 1
