"""Rooms to generate games in, from what the alfworld wheel ships.

`gen/layouts/FloorPlanN-openable.json` maps each static receptacle's THOR id to the pose
the agent stands at to use it; `FloorPlanN-objects.json` lists the object classes in the
room. A receptacle class the room has but `openable.json` leaves out (StoveBurner,
CoffeeMachine, Toaster, GarbageCan, Toilet, ...) gets one receptacle with a made-up id and
pose. Which class can hold which, what can be cleaned, heated, cooled or switched on, and
which room types suit which task come from the wheel's `gen/constants.py`.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from dataclasses import dataclass

GRID = 0.25  # THOR's step: poses become integer grid coordinates in location names
# Sink and Bathtub are not places to put things: their basins are.
_NOT_RECEPTACLES = frozenset({"Sink", "Bathtub", "PaintingHanger"})
LAMPS = ("DeskLamp", "FloorLamp")


@dataclass(frozen=True)
class Receptacle:
    thor_id: str
    cls: str
    location: str  # THOR-style location id, "loc|x|z|rotation|horizon"


@dataclass(frozen=True)
class Scene:
    number: int
    room: str  # Kitchen, LivingRoom, Bedroom, Bathroom
    receptacles: tuple[Receptacle, ...]
    object_classes: tuple[str, ...]  # pickupable classes some receptacle here can hold
    lamps: tuple[str, ...]

    def of_class(self, cls: str) -> tuple[Receptacle, ...]:
        return tuple(r for r in self.receptacles if r.cls == cls)

    @property
    def receptacle_classes(self) -> frozenset[str]:
        return frozenset(r.cls for r in self.receptacles)


@functools.cache
def constants():  # type: ignore[no-untyped-def]
    import alfworld.gen.constants as module

    return module


def can_contain(recep_cls: str, obj_cls: str) -> bool:
    return obj_cls in constants().VAL_RECEPTACLE_OBJECTS.get(recep_cls, ())


def has_property(obj_cls: str, prop: str) -> bool:
    """prop: Cleanable, Heatable, Coolable, Toggleable, Sliceable."""
    return obj_cls in constants().VAL_ACTION_OBJECTS[prop]


def openable(recep_cls: str) -> bool:
    return recep_cls in constants().OPENABLE_CLASS_SET


def static_receptacle_classes() -> frozenset[str]:
    c = constants()
    return frozenset(c.RECEPTACLES) - frozenset(c.MOVABLE_RECEPTACLES) - _NOT_RECEPTACLES


def room_of(number: int) -> str:
    for room, numbers in constants().SCENE_TYPE.items():
        if number in numbers:
            return room
    raise KeyError(number)


def _layouts():  # type: ignore[no-untyped-def]
    return importlib.resources.files("alfworld") / "gen" / "layouts"


@functools.cache
def scene_numbers() -> tuple[int, ...]:
    found = {int(p.name.removeprefix("FloorPlan").removesuffix("-openable.json"))
             for p in _layouts().iterdir() if p.name.endswith("-openable.json")}
    return tuple(n for n in sorted(found) if (_layouts() / f"FloorPlan{n}-objects.json").is_file())


def _class_of_id(thor_id: str) -> str:
    parts = thor_id.split("|")
    return parts[-1] if len(parts) > 4 else parts[0]


def _location(pose: list[float]) -> str:
    x, z, rotation, horizon = pose
    return f"loc|{round(x / GRID)}|{round(z / GRID)}|{round(rotation)}|{round(horizon)}"


@functools.cache
def load_scene(number: int) -> Scene:
    layouts = _layouts()
    poses = json.loads((layouts / f"FloorPlan{number}-openable.json").read_text())
    classes = set(json.loads((layouts / f"FloorPlan{number}-objects.json").read_text()))
    static = static_receptacle_classes()
    receptacles = [Receptacle(i, _class_of_id(i), _location(p)) for i, p in sorted(poses.items())
                   if _class_of_id(i) in static]
    taken = {r.location for r in receptacles}
    for k, cls in enumerate(sorted((classes & static) - {r.cls for r in receptacles})):
        receptacles.append(Receptacle(f"{cls}|+0{k}.00|+00.00|+00.00", cls, _free_location(k, taken)))
    receptacles = _distinct_locations(receptacles)
    holders = {r.cls for r in receptacles}
    pickable = sorted(c for c in classes - static if not c.endswith("Sliced")
                      and any(can_contain(h, c) for h in holders))
    return Scene(number, room_of(number), tuple(receptacles), tuple(pickable),
                 tuple(lamp for lamp in LAMPS if lamp in classes))


def _free_location(k: int, taken: set[str]) -> str:
    n = 0
    while (loc := f"loc|{40 + k}|{40 + n}|0|30") in taken:
        n += 1
    taken.add(loc)
    return loc


def _distinct_locations(receptacles: list[Receptacle]) -> list[Receptacle]:
    """One receptacle per location (a location's receptacles would otherwise share one
    "go to" command naming them all)."""
    seen: set[str] = set()
    out = []
    for r in receptacles:
        loc, n = r.location, 0
        while loc in seen:
            n += 1
            loc = f"{r.location}|{n}"
        seen.add(loc)
        out.append(Receptacle(r.thor_id, r.cls, loc))
    return out
