"""The ablation runner (launch/ablate.py): study configs, one arm's pretraining and
evaluation, the study loop, and the report."""
