"""Reference workloads: the study's two experiments, runnable on any machine.

- :mod:`.layoutlm_inference`: real-time document understanding with LayoutLM, driven to
  saturation by a load generator, :mod:`.loadgen` (``wattline workload layoutlm-inference``).
- :mod:`.layoutlm_serve`: the same model served over HTTP with Prometheus metrics, a service
  that never ends (``wattline workload layoutlm-serve``; batching: :mod:`.batcher`), and
  :mod:`.stepped_load`, open-loop load at stepped rates against such a service
  (``wattline workload load``).
- :mod:`.bert_pretrain`: BERT-Large masked-LM pre-training from scratch, one process or
  many under torchrun (``wattline workload bert-pretrain``).

Each builds its model from a config with random weights (random weights, no download:
measures compute, not accuracy), makes synthetic data and runs on CPU, CUDA or Neuron; the
two experiments count their units through the Job API, the service in its metrics. They need the optional extra
``pip install 'wattline[workloads]'`` (torch==2.13.0 first); :mod:`.common`, :mod:`.loadgen`,
:mod:`.batcher` and :mod:`.stepped_load` do not.
"""
