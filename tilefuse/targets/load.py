"""Loading target files: the built-in ones (package data) by name, or any .toml path."""
from __future__ import annotations

import copy
import tomllib
from importlib import resources
from pathlib import Path

from .spec import Target, TargetError, parse_target
from .strategies import STRATEGIES


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("tilefuse.targets").iterdir()
                  if p.name.endswith(".toml"))


def load_target(target, **overrides) -> Target:
    """A built-in target by name ('ft-m7032'), a path to a .toml file, or a Target; overrides
    as in Target.with_overrides."""
    if isinstance(target, Target):
        return target.with_overrides(**overrides) if overrides else target
    if not isinstance(target, (str, Path)):
        raise TypeError(f"target must be a name, a path or a Target, got {type(target).__name__}")
    s = str(target)
    if s in builtin_names():
        data = resources.files("tilefuse.targets").joinpath(s + ".toml").read_bytes()
        where = f"{s}.toml"
    else:
        p = Path(s)
        if not p.is_file():
            raise TargetError(s, f"no such target: not a built-in ({', '.join(builtin_names())}) and "
                                 f"not a file")
        data, where = p.read_bytes(), str(p)
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TargetError(where, f"not UTF-8 text: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise TargetError(where, f"not valid TOML: {e}") from None
    tgt = parse_target(copy.deepcopy(doc), where, STRATEGIES)
    return tgt.with_overrides(**overrides) if overrides else tgt
