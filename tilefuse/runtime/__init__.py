"""Runtime: device memory, sessions (copy constants once, compute many), the pipeline."""
from .device import CPUDevice
from .stages import PipelineStats, run_pipeline
from .session import Session, resolve_direct, resolve_indirect

__all__ = ["CPUDevice", "Session", "run_pipeline", "PipelineStats", "resolve_direct", "resolve_indirect"]
