"""vllm_recorder - records attnreplay traces (trace v1) from vLLM's V1 scheduler, and drives that
scheduler headless to check `attnreplay sim` against it.

  recorder.py   RecordingScheduler / RecordingAsyncScheduler for `--scheduler-cls`
  headless.py   vLLM's scheduler without a model or GPU, on a workload and a deterministic clock
  parity.py     step-by-step comparison of the sim and vLLM
  make_venv.sh  the pinned vLLM 0.33.0 environment (requirements-vllm.txt)

The recording classes are imported lazily, so `import vllm_recorder` does not import vLLM."""


def __getattr__(name):
    if name in ("RecordingScheduler", "RecordingAsyncScheduler"):
        from vllm_recorder import recorder
        return getattr(recorder, name)
    raise AttributeError(f"module vllm_recorder has no attribute {name}")
