"""Task index -> a generated ALFWorld game: a room, where every object starts, a goal of
one of ALFWorld's six task types, its PDDL problem, and a gold path.

Task `i` is of type TASK_TYPES[i % 6], drawn by `random.Random` seeded with a string (the
same on every machine and under every PYTHONHASHSEED). The room is a FloorPlan whose room
type ALFWorld allows for that task type; each object class of the room gets 1-3 objects,
each in a receptacle that can hold it (ALFWorld's own table). The goal's PDDL and the task
text templates are ALFWorld's (`gen/goal_library.py`). `attempt` > 0 draws again: the
cache moves to it when the engine does not confirm a draw (see `cache`).

These are NOT ALFWorld's benchmark games (those come from ALFRED's recorded THOR scenes):
the rooms and goals are of the same kind, the placements are ours.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from thicket.envs.alfworld import scenes
from thicket.envs.alfworld.names import display_names, mangle
from thicket.envs.alfworld.scenes import Receptacle, Scene
from thicket.envs.alfworld.wording import Wording, put_command

GENERATOR_VERSION = 1
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)


@dataclass(frozen=True)
class Treatment:
    prop: str  # the object property the appliance acts on
    appliance: str  # the receptacle class that does it
    verb: str


TREATMENTS = {
    "pick_clean_then_place_in_recep": Treatment("Cleanable", "SinkBasin", "clean"),
    "pick_heat_then_place_in_recep": Treatment("Heatable", "Microwave", "heat"),
    "pick_cool_then_place_in_recep": Treatment("Coolable", "Fridge", "cool"),
}
# Where a lamp stands (the first of these the room has), else any receptacle that needs no opening.
_LAMP_STANDS = ("SideTable", "Desk", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand")
# Classes the domain names as constants: always declared.
_DOMAIN_TYPES = ("SinkBasin", "Microwave", "Fridge", "Knife", "ButterKnife")
MAX_DRAWS = 200


@dataclass(frozen=True)
class Thing:
    thor_id: str
    cls: str
    recep: Receptacle


@dataclass(frozen=True)
class Goal:
    task_type: str
    obj: str  # object class, e.g. Apple
    recep: str  # receptacle class ("" for look_at_obj_in_light)
    toggle: str  # lamp class ("" unless look_at_obj_in_light)


@dataclass(frozen=True)
class Game:
    task: int
    attempt: int
    scene: Scene
    goal: Goal
    things: tuple[Thing, ...]  # objects (and the lamp), each in its receptacle
    start: str  # the agent's location
    task_text: str

    @property
    def names(self) -> dict[str, str]:
        ids = [r.thor_id for r in self.scene.receptacles] + [t.thor_id for t in self.things]
        ids += [r.location for r in self.scene.receptacles] + [self.start]
        names = display_names(mangle(i) for i in ids)
        return {i: names[mangle(i)] for i in ids}

    def traj_data(self) -> dict[str, object]:
        """traj_data.json as ALFWorld's games carry it (the fields its loader reads)."""
        g = self.goal
        return {
            "task_type": g.task_type,
            "task_id": f"thicket_{self.task}",
            "pddl_params": {"object_target": g.obj, "parent_target": g.recep, "toggle_target": g.toggle,
                            "mrecep_target": "", "object_sliced": False},
            "scene": {"floor_plan": f"FloorPlan{self.scene.number}", "scene_num": self.scene.number},
            "turk_annotations": {"anns": [{"task_desc": self.task_text}]},
        }


def task_type_of(task: int) -> str:
    return TASK_TYPES[task % len(TASK_TYPES)]


def make_game(task: int, attempt: int = 0) -> Game:
    if task < 0:
        raise ValueError(f"task index {task} is negative")
    rng = random.Random(f"thicket-alfworld:{GENERATOR_VERSION}:{task}:{attempt}")
    task_type = task_type_of(task)
    rooms = scenes.constants().GOALS_VALID[task_type]
    candidates = [n for n in scenes.scene_numbers() if scenes.room_of(n) in rooms]
    for _ in range(MAX_DRAWS):
        scene = scenes.load_scene(rng.choice(candidates))
        goal = _draw_goal(task_type, scene, rng)
        if goal is not None:
            things = _place(scene, goal, rng)
            start = f"loc|{rng.randint(-20, 20)}|{rng.randint(-20, 20)}|{rng.choice((0, 90, 180, 270))}|30"
            while start in {r.location for r in scene.receptacles}:
                start += "|0"
            template = rng.choice(_templates(task_type))
            text = template.format(obj=goal.obj.lower(), recep=goal.recep.lower(), toggle=goal.toggle.lower(),
                                   mrecep="")
            return Game(task, attempt, scene, goal, things, start, text)
    raise RuntimeError(f"no room fits task {task} ({task_type})")


def _templates(task_type: str) -> list[str]:
    import alfworld.gen.goal_library as glib

    return list(glib.gdict[task_type]["templates"])


def _draw_goal(task_type: str, scene: Scene, rng: random.Random) -> Goal | None:
    objs = list(scene.object_classes)
    if task_type == "look_at_obj_in_light":
        if not scene.lamps:
            return None
        return Goal(task_type, rng.choice(objs), "", rng.choice(scene.lamps))
    treatment = TREATMENTS.get(task_type)
    if treatment is not None:
        if treatment.appliance not in scene.receptacle_classes:
            return None
        objs = [o for o in objs if scenes.has_property(o, treatment.prop)]
    if not objs:
        return None
    obj = rng.choice(objs)
    holders = sorted(c for c in scene.receptacle_classes if scenes.can_contain(c, obj)
                     and (treatment is None or c != treatment.appliance))
    # The object must have somewhere else to start.
    holders = [c for c in holders if any(scenes.can_contain(o, obj) for o in scene.receptacle_classes - {c})]
    if not holders:
        return None
    return Goal(task_type, obj, rng.choice(holders), "")


def _place(scene: Scene, goal: Goal, rng: random.Random) -> tuple[Thing, ...]:
    things: list[Thing] = []
    for cls in scene.object_classes:
        holders = [r for r in scene.receptacles if scenes.can_contain(r.cls, cls)]
        if cls == goal.obj:  # it starts away from where it must go
            holders = [r for r in holders if r.cls != goal.recep] or holders
        low = 2 if cls == goal.obj and goal.task_type == "pick_two_obj_and_place" else 1
        for k in range(rng.randint(low, 3)):
            things.append(Thing(f"{cls}|+{k:02d}.00|+00.00|+00.00", cls, rng.choice(holders)))
    if goal.toggle:
        stands = [r for c in _LAMP_STANDS for r in scene.of_class(c)][:1]
        stands = stands or [r for r in scene.receptacles if not scenes.openable(r.cls)]
        things.append(Thing(f"{goal.toggle}|+00.00|+00.00|+00.00", goal.toggle, stands[0]))
    return tuple(things)


# --- the PDDL problem ---


def problem(game: Game) -> str:
    receps, things = game.scene.receptacles, game.things
    rtypes = sorted({r.cls for r in receps} | (set(_DOMAIN_TYPES) & scenes.static_receptacle_classes()))
    otypes = sorted({t.cls for t in things} | (set(_DOMAIN_TYPES) - scenes.static_receptacle_classes()))
    locations = sorted({r.location for r in receps} | {game.start})
    objects = ["agent1 - agent"]
    objects += [f"{mangle(c)}type - otype" for c in otypes] + [f"{mangle(c)}type - rtype" for c in rtypes]
    objects += [f"{mangle(r.thor_id)} - receptacle" for r in receps]
    objects += [f"{mangle(t.thor_id)} - object" for t in things]
    objects += [f"{mangle(loc)} - location" for loc in locations]
    init = ["(= (total-cost) 0)", f"(atLocation agent1 {mangle(game.start)})"]
    for r in receps:
        name = mangle(r.thor_id)
        init += [f"(receptacleAtLocation {name} {mangle(r.location)})", f"(receptacleType {name} {mangle(r.cls)}type)"]
        if scenes.openable(r.cls):
            init.append(f"(openable {name})")
    for t in things:
        init += _thing_facts(t)
    init += [f"(canContain {mangle(r)}type {mangle(o)}type)"
             for r in rtypes for o in otypes if scenes.can_contain(r, o)]
    return (
        f"(define (problem thicket_alfworld_{game.task})\n(:domain alfred)\n(:objects\n    "
        + "\n    ".join(objects) + "\n)\n(:init\n    " + "\n    ".join(init) + "\n)\n" + _goal_pddl(game.goal)
    )


def _thing_facts(t: Thing) -> list[str]:
    name = mangle(t.thor_id)
    facts = [f"(inReceptacle {name} {mangle(t.recep.thor_id)})",
             f"(objectAtLocation {name} {mangle(t.recep.location)})",
             f"(objectType {name} {mangle(t.cls)}type)"]
    if t.cls in scenes.LAMPS:
        return [*facts, f"(toggleable {name})"]
    facts.append(f"(pickupable {name})")
    for prop, fact in (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable")):
        if scenes.has_property(t.cls, prop):
            facts.append(f"({fact} {name})")
    return facts


def _goal_pddl(goal: Goal) -> str:
    import alfworld.gen.goal_library as glib

    text = glib.gdict[goal.task_type]["pddl"].format(obj=goal.obj, recep=goal.recep, toggle=goal.toggle, mrecep="")
    return text.replace("#", "-")


# --- paths through the game ---


class _Walker:
    """Writes commands while tracking where the agent is and what it opened."""

    def __init__(self, game: Game, wording: Wording) -> None:
        self.names, self.wording = game.names, wording
        self.at: Receptacle | None = None
        self.opened: set[str] = set()
        self.commands: list[str] = []

    def go(self, r: Receptacle) -> None:
        if self.at != r:
            self.commands.append(f"go to {self.names[r.thor_id]}")
            self.at = r

    def reach_inside(self, r: Receptacle) -> None:
        self.go(r)
        if scenes.openable(r.cls) and r.thor_id not in self.opened:
            self.commands.append(f"open {self.names[r.thor_id]}")
            self.opened.add(r.thor_id)

    def take(self, t: Thing) -> None:
        self.reach_inside(t.recep)
        self.commands.append(f"take {self.names[t.thor_id]} from {self.names[t.recep.thor_id]}")

    def put(self, t: Thing, r: Receptacle) -> None:
        self.reach_inside(r)
        self.commands.append(put_command(self.wording, self.names[t.thor_id], self.names[r.thor_id]))

    def treat(self, t: Thing, verb: str, r: Receptacle) -> None:
        self.go(r)
        self.commands.append(f"{verb} {self.names[t.thor_id]} with {self.names[r.thor_id]}")

    def use(self, lamp: Thing) -> None:
        self.go(lamp.recep)
        self.commands.append(f"use {self.names[lamp.thor_id]}")


def _targets(game: Game) -> list[Thing]:
    return [t for t in game.things if t.cls == game.goal.obj]


def gold_path(game: Game, wording: Wording) -> tuple[str, ...]:
    """A winning command sequence, written from where everything is."""
    return _path(game, wording, wrong=False)


def wrong_path(game: Game, wording: Wording) -> tuple[str, ...]:
    """The gold path with the step that matters left out (the treatment, the lamp, the
    second object, or the last placement): it must not win."""
    return _path(game, wording, wrong=True)


def _path(game: Game, wording: Wording, wrong: bool) -> tuple[str, ...]:
    goal, walker = game.goal, _Walker(game, wording)
    first = _targets(game)[0]
    if goal.task_type == "look_at_obj_in_light":
        lamp = next(t for t in game.things if t.cls == goal.toggle)
        walker.take(first)
        walker.go(lamp.recep)
        if not wrong:
            walker.use(lamp)
        return tuple(walker.commands)
    place = game.scene.of_class(goal.recep)[0]
    walker.take(first)
    treatment = TREATMENTS.get(goal.task_type)
    if treatment is not None and not wrong:
        walker.treat(first, treatment.verb, game.scene.of_class(treatment.appliance)[0])
    if goal.task_type == "pick_and_place_simple" and wrong:
        place = next((r for r in game.scene.receptacles
                      if r.cls != goal.recep and scenes.can_contain(r.cls, goal.obj)), place)
    walker.put(first, place)
    if goal.task_type == "pick_two_obj_and_place" and not wrong:
        second = _targets(game)[1]
        walker.take(second)
        walker.put(second, place)
    return tuple(walker.commands)
