"""Models of the seed papers' machines: hardware descriptions as data (TOML) and `simulate`.

    import tilefuse
    report = tilefuse.simulate(tilefuse.compile(net), "ft-m7032", cores=8, AM="1MiB")
    print(report.table())

See docs/simulate.md.
"""
from .machine import CapacityError, Scratchpad, Timeline
from .load import builtin_names, load_target
from .report import LayerReport, ScalingReport, SimReport, SimulationError
from .simulate import scaling, simulate
from .spec import Param, Target, TargetError, parse_quantity
from .strategies.cambricon import ModeTimes, qinglong_modes
from .strategies.trainer004 import TrainingJob
from .strategies.vck5000 import FilterJob
from .studies import fusion_speedup

__all__ = ["simulate", "scaling", "ScalingReport", "SimReport", "LayerReport", "SimulationError", "Target",
           "TargetError", "Param", "load_target", "builtin_names", "parse_quantity", "CapacityError",
           "Scratchpad", "Timeline", "FilterJob", "TrainingJob", "fusion_speedup", "qinglong_modes", "ModeTimes"]
