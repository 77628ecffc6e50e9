"""Rooms, floors and arrows inside rlhfless/runtime/, counted as issue 38 counts them.

    python scripts/runtime_rooms.py [PKG_ROOT]

A room is a module of runtime/ or a subfolder of it (a subfolder's modules are one room; __init__ is not a room);
an arrow is one room-to-room import edge, lazy imports included (tests/test_layering.py's graph); floors are the
rooms on the longest import path. Prints the three numbers and each room's imports.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
import test_layering as L  # noqa: E402

L.PKG = ROOT / "rlhfless"
graph = L._graph()


def room(mod: str) -> str | None:
    parts = mod.split(".")
    if parts[:2] != ["rlhfless", "runtime"] or len(parts) < 3:
        return None
    return parts[2]


rooms = sorted({room(m) for m in graph if room(m)})
arrows = sorted({(room(m), room(d)) for m, ds in graph.items() for d in ds
                 if room(m) and room(d) and room(m) != room(d)})
out = {r: sorted({b for a, b in arrows if a == r}) for r in rooms}


@lru_cache(None)
def depth(r: str) -> int:
    return 1 + max((depth(b) for b in out[r]), default=0)


print(f"rooms {len(rooms)}  floors {max(map(depth, rooms))}  arrows {len(arrows)}")
for r in rooms:
    print(f"  {r} (floor {depth(r)}): {', '.join(out[r])}")
