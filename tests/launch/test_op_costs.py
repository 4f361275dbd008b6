"""launch.perf.op_costs: the per-op breakdown of a compiled TPU program by the compiler's own
cycle estimates (`launch.aot --breakdown`). A real v5p compile is checked in test_aot.py."""
import pytest

from launch.perf import op_costs

_FUSION = ('  %fusion.{i} = bf16[8,128]{{1,0}} fusion(%a, %b), kind=kOutput, '
           'calls=%fused_computation, metadata={{op_name="jit(train_step)/{op}"}}, '
           'backend_config={{"flag_configs":[],"estimated_cycles":"{cycles}"}}')
_HLO = "\n".join([
    "HloModule m", "",
    "%fused_computation (p: bf16[8,128]) -> bf16[8,128] {",
    "  %p = bf16[8,128]{1,0} parameter(0)",
    '  ROOT %t = bf16[8,128]{1,0} tanh(%p), backend_config={"estimated_cycles":"999999"}',
    "}", "",
    "ENTRY %main (a: bf16[8,128], b: bf16[128,128]) -> bf16[8,128] {",
    "  %a = bf16[8,128]{1,0} parameter(0)",
    "  %b = bf16[128,128]{1,0} parameter(1)",
    _FUSION.format(i=1, op="jvp(Bert)/encoder/layer_0/mlp/wi/dot_general", cycles=300),
    _FUSION.format(i=2, op="jvp(Bert)/encoder/layer_11/mlp/wi/dot_general", cycles=300),
    _FUSION.format(i=3, op="transpose(jvp(Bert))/encoder/layer_0/mlp/wi/dot_general",
                   cycles=600),
    "  %copy-start = (bf16[8,128]{1,0}, bf16[8,128]{1,0}, u32[]) copy-start(%fusion.3), "
    'backend_config={"estimated_cycles":"200"}',
    "  %copy-done = bf16[8,128]{1,0} copy-done(%copy-start)",
    '  ROOT %add.1 = bf16[8,128]{1,0} add(%copy-done, %a), '
    'metadata={op_name="jit(train_step)/add"}',
    "}", ""])


def test_groups_fold_layers_and_name_the_autodiff_pass():
  b = op_costs.breakdown(_HLO)
  # the entry's four estimated instructions; the fused tanh's estimate is inside fusion.1-3
  # and is not counted again; the add without an estimate is left out
  assert b["instructions"] == 4 and b["total_cycles"] == 1400
  groups = {(g["group"], g["opcode"]): g for g in b["groups"]}
  fwd = groups[("fwd Bert/encoder/layer_*/mlp/wi/dot_general", "fusion")]
  assert fwd["count"] == 2 and fwd["cycles"] == 600
  bwd = groups[("bwd Bert/encoder/layer_*/mlp/wi/dot_general", "fusion")]
  assert bwd["cycles"] == 600 and bwd["share"] == pytest.approx(600 / 1400)
  assert groups[("(no source op)", "copy-start")]["cycles"] == 200
  assert sum(g["share"] for g in b["groups"]) == pytest.approx(1.0)
  assert [g["cycles"] for g in b["groups"]] == sorted((g["cycles"] for g in b["groups"]),
                                                     reverse=True)
  text = "\n".join(op_costs.format_breakdown(b, 1))
  assert "42.9%" in text and "2 more groups" in text


@pytest.mark.parametrize("op_name,group", [
    ("jit(train_step)/jvp(Bert)/encoder/layer_3/mlp/wi/dot_general",
     "fwd Bert/encoder/layer_*/mlp/wi/dot_general"),
    ("jit(f)/transpose(jvp(Bert))/encoder/layers_11/x", "bwd Bert/encoder/layers_*/x"),
    ("jit(train_step)/jvp()/reduce_sum", "fwd reduce_sum"),
    ("jit(train_step)/jvp(jit(take_along_axis))/gather", "fwd jit(take_along_axis)/gather"),
    ("jit(train_step)/transpose(jvp())/add_any", "bwd add_any"),
    ("jit(train_step)/jit(_where)/select_n", "jit(_where)/select_n"),
    ("jit(train_step)/jvp(unbalanced/x", "jvp(unbalanced/x"),
])
def test_source_group(op_name, group):
  assert op_costs.source_group(op_name) == group


def test_no_estimates_says_so():
  b = op_costs.breakdown("HloModule m\n\nENTRY %e () -> f32[] {\n  ROOT %c = f32[] "
                         "constant(1)\n}\n")
  assert b["total_cycles"] == 0 and b["groups"] == []
  assert "no per-op cycle estimates" in op_costs.format_breakdown(b, 5)[0]
  assert op_costs.breakdown("not an hlo module")["groups"] == []
