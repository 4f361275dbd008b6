"""XLM-RoBERTa <-> Hugging Face (XLMRobertaModel, XLMRobertaForMaskedLM and the
XLMRoberta task models): RoBERTa's tensor table (encoders/hf/bert.py) under the base
prefix "roberta", with model_type "xlm-roberta"."""
from encoders import xlm_roberta as family
from encoders.hf.bert import BertMapping
from encoders.hf.mapping import register_mapping


@register_mapping
class XlmRobertaMapping(BertMapping):
  model_types = ("xlm-roberta",)
  architectures = {
      "XLMRobertaModel": ("", ("pooler",)),
      "XLMRobertaForMaskedLM": ("roberta", ("mlm",)),
  }
  task_class_prefix = "XLMRoberta"

  def defaults(self):
    return family.defaults()

  def base_prefix(self, hf):
    return "roberta"

  def task_prefix(self, cfg):
    return self.task_class_prefix

  def config_from_hf(self, hf, heads):
    if "nsp" in heads:
      raise ValueError("XLM-RoBERTa has no NSP head in transformers")
    m = super().config_from_hf(hf, heads)
    m.family = "xlm-roberta"
    m.position_style = "roberta"
    m.vocab_pad_multiple = 1  # as stored; a training config pads (configs/xlm_roberta.py)
    return m

  def config_to_hf(self, cfg):
    if "nsp" in cfg.heads:
      raise ValueError("XLM-RoBERTa has no NSP head in transformers")
    hf, _ = super().config_to_hf(cfg)
    hf["model_type"] = "xlm-roberta"
    arch = "XLMRobertaForMaskedLM" if "mlm" in cfg.heads else "XLMRobertaModel"
    return hf, arch
