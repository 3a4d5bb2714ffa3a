"""Models of the seed papers' machines: hardware descriptions as data (TOML) and `simulate`.

    import tilefuse
    report = tilefuse.simulate(tilefuse.compile(net), "ft-m7032", cores=8, AM="1MiB")
    print(report.table())

See docs/simulate.md.
"""
from .machine import CapacityError, Scratchpad, Timeline
from .simulate import LayerReport, SimReport, SimulationError, simulate
from .spec import Param, Target, TargetError, builtin_names, load_target, parse_quantity

__all__ = ["simulate", "SimReport", "LayerReport", "SimulationError", "Target", "TargetError", "Param",
           "load_target", "builtin_names", "parse_quantity", "CapacityError", "Scratchpad", "Timeline"]
