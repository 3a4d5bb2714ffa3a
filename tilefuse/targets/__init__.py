"""Models of the seed papers' machines: hardware descriptions as data (TOML) and `simulate`.

    import tilefuse
    report = tilefuse.simulate(tilefuse.compile(net), "ft-m7032", cores=8, AM="1MiB")
    print(report.table())

See docs/simulate.md.
"""
from .machine import CapacityError, Scratchpad, Timeline
from .simulate import LayerReport, ScalingReport, SimReport, SimulationError, scaling, simulate
from .spec import Param, Target, TargetError, builtin_names, load_target, parse_quantity
from .strategies.cambricon import ModeTimes, qinglong_modes
from .strategies.trainer004 import TrainingJob, fusion_speedup
from .strategies.vck5000 import FilterJob

__all__ = ["simulate", "scaling", "ScalingReport", "SimReport", "LayerReport", "SimulationError", "Target",
           "TargetError", "Param", "load_target", "builtin_names", "parse_quantity", "CapacityError",
           "Scratchpad", "Timeline", "FilterJob", "TrainingJob", "fusion_speedup", "qinglong_modes", "ModeTimes"]
