"""Reference workloads: the study's two experiments, runnable on any machine.

- :mod:`.layoutlm_inference`: real-time document understanding with LayoutLM, driven to
  saturation by a load generator, :mod:`.loadgen` (``wattline workload layoutlm-inference``).
- :mod:`.bert_pretrain`: BERT-Large masked-LM pre-training from scratch, one process or
  many under torchrun (``wattline workload bert-pretrain``).

Both build their models from a config with random weights (random weights, no download:
measures compute, not accuracy), make synthetic data, count their units through the Job
API and run on CPU, CUDA or Neuron. They need the optional extra
``pip install 'wattline[workloads]'`` (torch==2.13.0 first); :mod:`.common` and :mod:`.loadgen` do not.
"""
