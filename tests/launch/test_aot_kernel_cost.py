"""The roofline price of custom calls XLA cannot price (launch/perf/kernel_cost.py), on HLO
lines in the form the TPU compiler prints them (taken from a compiled Splash program:
forward, and the fused dq/dk/dv backward), whose FLOPs and bytes are known by hand."""
import pytest

from launch.perf import kernel_cost

B, H, T, K = 2, 4, 512, 64
QKV = "bf16[2,4,512,64]{3,2,1,0}"
FWD = ("  %splash_mha_fwd_segmented_residuals.1 = (f32[2,512,128]{2,1,0:T(8,128)}, "
       "bf16[2,4,512,64]{3,2,1,0:T(8,128)(2,1)}) custom-call(%c.7, %c.8, %q, %k, %v, %s, %t), "
       'custom_call_target="tpu_custom_call", operand_layout_constraints={s8[1,1,1]{2,1,0}, '
       f"s8[1,1,1]{{2,1,0}}, {QKV}, {QKV}, {QKV}, s32[2,512,128]{{2,1,0}}, "
       "s32[2,8,512]{2,1,0}}, frontend_attributes={kernel_metadata={}}")
DKV = ("  %splash_mha_dkv_segmented_no_residuals.3 = (bf16[2,1,4,512,64]{4,3,2,1,0}, "
       f"{QKV}, {QKV}) custom-call(%c.7, %c.8, %q, %k, %v, %do), "
       'custom_call_target="tpu_custom_call", operand_layout_constraints={s8[1,1,1]{2,1,0}, '
       f"s8[1,1,1]{{2,1,0}}, {QKV}, {QKV}, {QKV}, {QKV}}}, metadata={{op_name=\"x\"}}")
OTHER = ('  %my_kernel.2 = f32[8,128]{1,0} custom-call(%a), custom_call_target="tpu_custom_call", '
         "operand_layout_constraints={f32[8,128]{1,0}}")
NOT_TPU = ('  %sharding.1 = f32[8,128]{1,0} custom-call(%a), custom_call_target="Sharding"')
MATMUL = 2 * B * H * T * T * K  # one (T x T x K) matmul over all heads and rows
QKV_BYTES = 2 * B * H * T * K


def test_splash_forward_and_fused_backward_flops_and_bytes():
  calls = kernel_cost.custom_calls("\n".join([FWD, DKV, NOT_TPU]))
  assert [c["name"] for c in calls] == ["splash_mha_fwd_segmented_residuals.1",
                                       "splash_mha_dkv_segmented_no_residuals.3",
                                       "sharding.1"]
  fwd, dkv = calls[0], calls[1]
  assert kernel_cost.kernel_flops(fwd) == 2 * MATMUL  # QK^T, P V
  assert kernel_cost.kernel_flops(dkv) == 5 * MATMUL  # fused: dq comes out too
  assert kernel_cost.kernel_flops(dkv, has_dq_kernel=True) == 5 * MATMUL  # its dq result
  unfused = dict(dkv, results=dkv["results"][1:])
  assert kernel_cost.kernel_flops(unfused, has_dq_kernel=True) == 4 * MATMUL


@pytest.mark.parametrize("peak,bandwidth,bound", [(459e12, 1e12, "memory"),
                                                  (459e12, 1e15, "compute")])
def test_roofline_takes_the_larger_time_over_the_efficiency(peak, bandwidth, bound):
  fwd_bytes = 2 * 1 + 3 * QKV_BYTES + 4 * 2 * 512 * 128 + 4 * 2 * 8 * 512  # operands
  fwd_bytes += 4 * 2 * 512 * 128 + QKV_BYTES  # results
  r = kernel_cost.price(FWD, peak, bandwidth, efficiency=0.4)
  want = max(2 * MATMUL / peak, fwd_bytes / bandwidth) / 0.4
  assert r["calls"] == 1 and r["flops"] == 2 * MATMUL and r["bytes"] == fwd_bytes
  assert r["seconds"] == pytest.approx(want, rel=1e-12)
  (k,) = r["kernels"].values()
  assert k["bound"] == bound and r["unpriced"] == []


def test_unknown_kernels_are_listed_unpriced_and_other_custom_calls_ignored():
  r = kernel_cost.price("\n".join([FWD, OTHER, NOT_TPU]), 459e12, 2765e9)
  assert r["calls"] == 1 and r["unpriced"] == ["my_kernel.2"]
  with pytest.raises(ValueError, match="efficiency"):
    kernel_cost.price(FWD, 459e12, 2765e9, efficiency=0)


def test_bandwidth_table_covers_the_aot_topologies():
  for kind in ("TPU v5p", "TPU v5 lite", "TPU v6 lite", "TPU v4"):
    assert kernel_cost.hbm_bandwidth(kind) > 0


def _deberta_line(kernel, terms, n_tables):
  """An HLO line in the form the TPU compiler prints the fused DeBERTa kernels (from a
  compiled v5p step: the scalar-prefetched block bounds, seg, seg, q, k, v, tables, ...)."""
  table = "bf16[4,3,512,64]{3,2,1,0}"
  ops = ["s32[16]{0}"] + ["s32[2,1,512]{2,1,0}"] * 2 + [QKV] * 3 + [table] * n_tables
  return (f"  %{kernel}__{terms}.2 = ({QKV}, {QKV}) custom-call(%a, %b), "
          'custom_call_target="tpu_custom_call", operand_layout_constraints={'
          + ", ".join(ops) + "}, frontend_attributes={kernel_metadata={}}")


# K = 64: the backward's column reversal (128 x 128 per 128 columns) is 2 units per term
@pytest.mark.parametrize("kernel,terms,n_tables,units", [
    ("deberta_rel_fwd", "c2p_p2c", 2, 6), ("deberta_rel_bwd", "c2p_p2c", 4, 5 + 12 + 4),
    ("transpose_jvp_deberta_rel_bwd", "p2c", 2, 5 + 6 + 2), ("deberta_rel_bwd", "c2p", 2, 13),
    ("deberta_rel_fwd", "c2p", 1, 4)])
def test_deberta_fused_kernels_are_priced_by_their_matmul_units(kernel, terms, n_tables, units):
  (call,) = kernel_cost.custom_calls(_deberta_line(kernel, terms, n_tables))
  assert kernel_cost.kernel_flops(call) == units * MATMUL
  r = kernel_cost.price(_deberta_line(kernel, terms, n_tables), 459e12, 2765e9)
  assert r["calls"] == 1 and r["unpriced"] == [] and r["flops"] == units * MATMUL


def test_the_names_of_the_retired_two_kernel_backward_are_not_priced():
  """The backward is one kernel now; an HLO with the old dq / dkv names is not this
  code's kernel, so it is listed unpriced, not priced with stale units."""
  r = kernel_cost.price(_deberta_line("deberta_rel_dq", "c2p_p2c", 3), 459e12, 2765e9)
  assert r["calls"] == 0 and r["unpriced"] == ["deberta_rel_dq__c2p_p2c.2"]
