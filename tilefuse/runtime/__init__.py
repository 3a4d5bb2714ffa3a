"""Runtime: device memory, sessions (copy constants once, compute many), the pipeline."""
from .device import (DEV_TO_HOST, HOST_TO_DEV, CPUDevice, dev_free, dev_malloc, dev_memcpy)
from .stages import PipelineStats, run_pipeline
from .session import Session, resolve_direct, resolve_indirect

__all__ = ["CPUDevice", "Session", "run_pipeline", "PipelineStats", "dev_malloc", "dev_free",
           "dev_memcpy", "HOST_TO_DEV", "DEV_TO_HOST", "resolve_direct", "resolve_indirect"]
