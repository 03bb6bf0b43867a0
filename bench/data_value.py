"""What thicket's trees are worth as training data (issue 37): one round of each method's own
recipe from one base policy, at the same generation budget, judged on goals the base never saw.

    bash bench/trl_venv.sh                          # TRL in bench/.venv-trl (CPU torch)
    .venv/bin/python bench/data_value.py [--seeds 0 1 2] [--arms sample tot mcts mcts_pw dense]
                                         [--second-round ARM] [--out data_value.json]
                                         [--work DIR] [--record bench/results/data_value]

1. pi0: the demo policy's recipe (`thicket make-model --train textcraft`), its expert tasks with
   the evaluation goals held out (TextCraft's task i is goal i mod 419: goals, not indices).
2. Per seed and search: pi0 grows trees on the training tasks (goals pi0 trained on, none of the
   evaluation's) at the same LLM-call budget a task, through the product (`run_tasks`,
   `aggregate`); generation CPU-seconds are the vLLM server's process tree and this process's.
3. Per search, its method's recipes, each training pi1 from pi0 with TRL (bench/trl_train.py in
   bench/.venv-trl), hyper-parameters fixed here before any run and the same for every arm:
     sft      every search: SFT on the successes (`sft`), the common baseline
     eto      sample (ETO explores by sampling): DPO on trajectory pairs (`dpo`, kind trajectory)
     agent_r  mcts, mcts_pw (Agent-R): SFT on revision trajectories (`revision`) and good paths (`sft`)
     dense    dense (DensePolicy): DPO on step pairs (`dpo`, kind step)
     tot_dpo  tot, tot_rollout: DPO on its step pairs (`dpo`, kind step)
4. Every pi1 and pi0 evaluated with thicket eval's path (`evaluate`) on the held-out goals; the
   gain in pass@1 over pi0, mean and sd over seeds, per 1,000 generation calls and per CPU-second.
5. `--second-round ARM:RECIPE`: ETO's iterative step for that arm: pi1 explores (same budget, the
   next training tasks), pi2 trains from pi1 the same way, gain over pi1 and over pi0.

Every step's figures are kept beside its output in --work (a stopped run resumes there) and under
--record, in the repository, with pi0 itself (2.3 MB): a later session takes them from there. A
pi0 made anew must hash the same as the one the kept figures were measured with, else the run
stops rather than mix two base policies.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from thicket.aggregate.driver import aggregate
from thicket.evaluation.run import evaluate
from thicket.rollout.sweep import raise_for_failures, run_tasks
from thicket.tiny_model import vllm_python
from thicket.training.demo_model import DEMO_RECIPE, FLOAT32, train_demo_model
from thicket.training.evaluate import pass_spec
from thicket.vllm_server import VLLMServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kept import Kept  # noqa: E402
from search_quality import SEARCHES, machine, sweep_spec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRL_PYTHON = ROOT / "bench" / ".venv-trl" / "bin" / "python"
TRAINER = ROOT / "bench" / "trl_train.py"
RECORD = ROOT / "bench" / "results" / "data_value"

BUDGET = 64  # LLM calls a tree at most
MAX_DEPTH = 12
EVAL_SAMPLES = 4


@dataclass(frozen=True)
class Plan:
    eval_goals: tuple[int, int]  # held out of pi0's expert tasks; evaluated as these task indices
    train_tasks: range  # pi0's own goals; round two explores the next as many
    training: dict[str, float]  # bench/trl_train.py's Settings


# Fixed before the runs, the same for every arm (no tuning on the evaluation goals).
FULL = Plan((200, 264), range(300, 332),
            {"steps": 40, "batch": 8, "sft_learning_rate": 5e-4, "dpo_learning_rate": 2e-4, "beta": 0.1})
SMOKE = Plan((200, 204), range(300, 306), {**FULL.training, "steps": 2})  # the plumbing only: no figures
RECIPES: dict[str, tuple[str, ...]] = {
    "sample": ("sft", "eto"),
    "tot": ("sft", "tot_dpo"),
    "tot_rollout": ("sft", "tot_dpo"),
    "mcts": ("sft", "agent_r"),
    "mcts_pw": ("sft", "agent_r"),
    "dense": ("sft", "dense"),
}


KEPT = Kept(Path(tempfile.gettempdir()) / "thicket-data-value")  # main() sets the run's


def kept(path: Path, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """make()'s figures, kept in `path` (and recorded): a rerun after a stop takes them instead of
    making them again (a sweep cut short resumes anyway: thicket skips the trees it committed)."""
    return KEPT.figures(path, make)


def weights_digest(model: Path) -> str:
    parts = sorted(model.glob("*.safetensors"))
    if not parts:
        raise SystemExit(f"{model} holds no *.safetensors weights")
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.read_bytes())
    return digest.hexdigest()


def check_same_base(pi0: Path, work: Path) -> None:
    """Figures kept by an earlier session were measured from its pi0: one retrained here must be
    the same weights (the recipe is seeded), else they must not be mixed."""
    digest = weights_digest(pi0)
    recorded = kept(work / "pi0.weights.json", lambda: {"sha256": digest})["sha256"]
    if recorded != digest:
        raise SystemExit(f"pi0's weights (sha256 {digest[:12]}) differ from those the kept figures were measured "
                         f"with ({recorded[:12]}): start from an empty --record folder")


def rows_of(datasets: Path, name: str) -> list[dict[str, Any]]:
    folder = datasets / name
    return [row for part in sorted(folder.glob("*.parquet")) for row in pq.read_table(part).to_pylist()]


def recipe_rows(recipe: str, datasets: Path) -> tuple[str, list[dict[str, Any]]]:
    """(trainer method, rows) of a recipe, from an aggregated sweep's datasets."""
    if recipe == "sft":
        return "sft", rows_of(datasets, "sft")
    if recipe == "agent_r":
        return "sft", rows_of(datasets, "revision") + rows_of(datasets, "sft")
    kind = "trajectory" if recipe == "eto" else "step"
    return "dpo", [row for row in rows_of(datasets, "dpo") if row["kind"] == kind]


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live descendants (/proc), as the kernel counts them."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        times[int(entry.name)] = (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / ticks
    total, stack = 0.0, [pid]
    while stack:
        node = stack.pop()
        total += times.get(node, 0.0)
        stack.extend(children.get(node, []))
    return total


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class Served:
    server: VLLMServer

    @property
    def cpu(self) -> float:
        pid = self.server.pid
        return (tree_cpu_seconds(pid) if pid else 0.0) + own_cpu_seconds()


def grow(policy_dir: Path, algorithm: str, tasks: range, seed: int, work: Path, to_train: bool,
         ) -> dict[str, Any]:
    """Trees of one search from a policy on `tasks`, aggregated: their datasets and what they cost.
    Kept figures whose datasets are gone (recorded from another machine's work folder) are grown
    again when a model has still to train on them (`to_train`)."""
    path = work / f"{algorithm}.grown.json"
    figures = kept(path, lambda: _grow(policy_dir, algorithm, tasks, seed, work))
    if to_train and not Path(figures["datasets"]).is_dir():
        KEPT.forget(path)
        figures = kept(path, lambda: _grow(policy_dir, algorithm, tasks, seed, work))
    return figures


def _grow(policy_dir: Path, algorithm: str, tasks: range, seed: int, work: Path) -> dict[str, Any]:
    args = argparse.Namespace(max_depth=MAX_DEPTH, budget=BUDGET, env="textcraft", env_args={}, tasks=tasks, seed=seed)
    with VLLMServer(str(policy_dir), served_name=policy_dir.name, python=vllm_python(),
                    log_path=work / f"vllm-{algorithm}-{seed}.log") as server:
        served = Served(server)
        spec = sweep_spec(algorithm, args, server.url, server.served_name, str(work / "trees"))
        cpu, started = served.cpu, time.perf_counter()
        summary = asyncio.run(run_tasks(spec, list(tasks), progress=False))
        raise_for_failures(summary)
        cpu = served.cpu - cpu
    stats = aggregate(spec.sweep_uri, workers=0).stats
    datasets = Path(spec.sweep_uri.removeprefix("file://")) / "datasets"
    return {"datasets": str(datasets), "llm_calls": stats["search_quality"]["llm_calls"], "cpu_s": cpu,
            "wall_s": time.perf_counter() - started, "successes": stats["search_quality"]["distinct_successful_trajectories"]}


def train_figures(model: Path) -> Path:
    return model.parent / f"{model.name}.train.json"


def still_to_train(model: Path, evaluations: Sequence[Path]) -> bool:
    """Whether the model has to be trained: never was, or was by a run whose work folder is gone
    before all its `evaluations` (their kept figures) were made (its weights are not here: those
    training figures are forgotten)."""
    figures = train_figures(model)
    if not KEPT.has(figures):
        return True
    evaluated = all(KEPT.has(path) for path in evaluations)
    if evaluated or (model / "config.json").is_file() or "skipped" in kept(figures, dict):
        return False
    KEPT.forget(figures)
    return True


def train(base: Path, recipe: str, datasets: str, seed: int, out: Path, plan: Plan) -> dict[str, Any]:
    return kept(train_figures(out), lambda: _train(base, recipe, Path(datasets), seed, out, plan))


def _train(base: Path, recipe: str, datasets: Path, seed: int, out: Path, plan: Plan) -> dict[str, Any]:
    method, rows = recipe_rows(recipe, datasets)
    if not rows:
        return {"recipe": recipe, "rows": 0, "skipped": "no rows"}
    out.mkdir(parents=True, exist_ok=True)
    data = out.parent / f"{out.name}.jsonl"
    data.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
    before = os.times()
    done = subprocess.run([str(TRL_PYTHON), str(TRAINER), method, str(base), str(data), str(out),
                           json.dumps({**plan.training, "seed": seed})], capture_output=True, text=True, cwd=ROOT)
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"training {recipe} failed:\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    return {"recipe": recipe, **summary, "cpu_s": round(cpu, 1)}


def pass_at_1(model: Path, seed: int, plan: Plan) -> dict[str, Any]:
    """pass@1 on the held-out goals, thicket eval's path; kept beside the model."""
    return kept(eval_figures(model, seed), lambda: _pass_at_1(model, seed, plan))


def eval_figures(model: Path, seed: int) -> Path:
    return model.parent / f"{model.name}.eval-s{seed}.json"


def _pass_at_1(model: Path, seed: int, plan: Plan) -> dict[str, Any]:
    tasks = range(*plan.eval_goals)
    scratch = model.parent / f"{model.name}-eval-s{seed}"
    scratch.mkdir(parents=True, exist_ok=True)
    with VLLMServer(str(model), served_name=model.name, python=vllm_python(), log_path=scratch / "vllm.log") as server:
        spec = pass_spec({"kind": "openai", "url": server.url, "model": server.served_name}, scratch, tasks,
                         EVAL_SAMPLES, seed)
        figures = evaluate(spec, tasks, (1,)).to_json()
    return {"pass_at_1": figures["pass_at_1"], "solved_tasks": figures["solved_tasks"]}


def base_policy(work: Path, reuse: Path | None, plan: Plan) -> Path:
    """pi0: `reuse`, else the work folder's, else the recorded one (2.3 MB, in the repository:
    retraining with the same recipe and seed on another day's machine gave other weights), else
    trained here and recorded."""
    if reuse is not None:
        return reuse
    pi0 = work / "pi0"
    recorded = KEPT.recorded(pi0)
    if not (pi0 / "training.json").is_file() and recorded is not None and (recorded / "training.json").is_file():
        shutil.copytree(recorded, pi0, dirs_exist_ok=True)
    if not (pi0 / "training.json").is_file():
        train_base_policy(pi0, plan)
    if recorded is not None and not (recorded / "training.json").is_file():
        shutil.copytree(pi0, recorded, dirs_exist_ok=True)
    return pi0


def train_base_policy(pi0: Path, plan: Plan) -> None:
    low, high = plan.eval_goals
    # float32: bfloat16 autocast (the committed demo's) is ~13x slower on a CPU without native bf16,
    # and took over an hour here at nice 19 beside CI.
    recipe = replace(DEMO_RECIPE, held_out_goals=(low, high), eval_start=low, eval_stop=high,
                     trainer={**DEMO_RECIPE.trainer, **FLOAT32})
    started = time.perf_counter()
    summary = train_demo_model(pi0, recipe, evaluate=False)
    print(f"pi0: {summary['conversations']} expert chats (goals {low}-{high - 1} held out), "
          f"{time.perf_counter() - started:.0f} s", flush=True)


def one_round(base: Path, arms: list[str], seeds: list[int], tasks: range, work: Path, plan: Plan,
              ) -> list[dict[str, Any]]:
    rows = []
    for seed in seeds:
        for arm in arms:
            models = [work / f"s{seed}" / f"{arm}-{recipe}" for recipe in RECIPES[arm]]
            to_train = [model for model in models if still_to_train(model, [eval_figures(model, seed)])]
            grown = grow(base, arm, tasks, seed, work / f"s{seed}", bool(to_train))
            print(f"seed {seed} {arm}: {grown['llm_calls']} calls, {grown['successes']} distinct successes, "
                  f"{grown['cpu_s']:.0f} CPU-s", flush=True)
            for recipe in RECIPES[arm]:
                model = work / f"s{seed}" / f"{arm}-{recipe}"
                trained = train(base, recipe, grown["datasets"], seed, model, plan)
                score = pass_at_1(model, seed, plan) if "skipped" not in trained else None
                row = {"seed": seed, "arm": arm, "recipe": recipe, "llm_calls": grown["llm_calls"],
                       "distinct_successes": grown["successes"], "generation_cpu_s": round(grown["cpu_s"], 1),
                       "training": trained, "eval": score}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def gains(rows: list[dict[str, Any]], base: dict[int, float]) -> dict[str, dict[str, float]]:
    """Per arm and recipe: mean and sd over seeds of the pass@1 gain over the base policy
    (evaluated with the same seed: the same sampling noise), per 1k calls, per CPU-second."""
    out: dict[str, dict[str, float]] = {}
    keys = sorted({(r["arm"], r["recipe"]) for r in rows})
    for arm, recipe in keys:
        runs = [r for r in rows if (r["arm"], r["recipe"]) == (arm, recipe) and r["eval"]]
        if not runs:
            continue
        gain = [r["eval"]["pass_at_1"]["mean"] - base[r["seed"]] for r in runs]
        per_call = [g * 1000 / r["llm_calls"] for g, r in zip(gain, runs)]
        per_cpu = [g / (r["generation_cpu_s"] + r["training"]["cpu_s"]) for g, r in zip(gain, runs)]
        out[f"{arm}/{recipe}"] = {
            "seeds": len(runs), "gain": statistics.mean(gain), "gain_sd": statistics.stdev(gain) if len(gain) > 1 else 0.0,
            "gain_per_1k_calls": statistics.mean(per_call), "gain_per_cpu_s": statistics.mean(per_cpu)}
    return out


def markdown(rows: list[dict[str, Any]], base: dict[int, float], gain: dict[str, dict[str, float]]) -> str:
    """The table for bench/README.md: per arm and recipe, what it trained on and what it gained."""
    lines = ["| arm | recipe | LLM calls a seed | distinct successes | rows trained | pass@1 per seed | gain over the base "
             "(mean ± sd) | gain per 1k calls | gain per CPU-s |", "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for name, g in gain.items():
        arm, recipe = name.split("/")
        runs = sorted((r for r in rows if (r["arm"], r["recipe"]) == (arm, recipe) and r["eval"]), key=lambda r: r["seed"])
        per_seed = ", ".join(f"{r['eval']['pass_at_1']['mean']:.3f} ({r['eval']['pass_at_1']['mean'] - base[r['seed']]:+.3f})"
                             for r in runs)
        lines.append(f"| {arm} | {recipe} | {statistics.mean(r['llm_calls'] for r in runs):,.0f} | "
                     f"{'/'.join(str(r.get('distinct_successes', '?')) for r in runs)} | "
                     f"{'/'.join(str(r['training']['rows']) for r in runs)} | {per_seed} | "
                     f"{g['gain']:+.3f} ± {g['gain_sd']:.3f} | {g['gain_per_1k_calls']:+.4f} | {g['gain_per_cpu_s']:+.6f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(RECIPES), choices=list(SEARCHES))
    parser.add_argument("--pi0", type=Path, help="a pi0 made before by this script (its work folder's pi0/)")
    parser.add_argument("--second-round", metavar="ARM:RECIPE", help="ETO's second round for this arm's recipe")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "thicket-data-value")
    parser.add_argument("--out", default="data_value.json")
    parser.add_argument("--record", type=Path, default=RECORD,
                        help="also keep every step's figures here (the repository's copy, for a later session)")
    parser.add_argument("--smoke", action="store_true", help="6 training tasks, 4 eval goals, 2 steps: plumbing only")
    args = parser.parse_args()
    second_arm, _, second_recipe = (args.second_round or "").partition(":")
    if args.second_round:
        if second_recipe not in RECIPES.get(second_arm, ()):
            parser.error(f"--second-round {args.second_round!r}: expected ARM:RECIPE, one of "
                         f"{', '.join(f'{a}:{r}' for a, rs in RECIPES.items() for r in rs)}")
    plan = SMOKE if args.smoke else FULL
    if not TRL_PYTHON.is_file():
        raise SystemExit("no bench/.venv-trl: run `bash bench/trl_venv.sh` first")
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    global KEPT
    KEPT = Kept(args.work, None if args.smoke else args.record.resolve())
    pi0 = base_policy(args.work, args.pi0, plan)
    check_same_base(pi0, args.work)
    base = {seed: pass_at_1(pi0, seed, plan) for seed in args.seeds}
    base_mean = {seed: figures["pass_at_1"]["mean"] for seed, figures in base.items()}
    print(f"pi0 pass@1 on held-out goals, per seed: {base_mean}", flush=True)
    if args.second_round:
        for seed in args.seeds:  # round two explores with pi1's weights: one trained elsewhere is made again
            pi1 = args.work / "round1" / f"s{seed}" / f"{second_arm}-{second_recipe}"
            if not (pi1 / "config.json").is_file():
                KEPT.forget(train_figures(pi1))
                KEPT.forget(eval_figures(pi1, seed))
    rows = one_round(pi0, args.arms, args.seeds, plan.train_tasks, args.work / "round1", plan)
    result: dict[str, Any] = {"date": datetime.date.today().isoformat(), "machine": machine(),
                              "smoke": args.smoke, "eval_goals": plan.eval_goals,
                              "train_tasks": [plan.train_tasks.start, plan.train_tasks.stop], "budget": BUDGET,
                              "training": plan.training, "pi0": base, "round1": rows,
                              "gains": gains(rows, base_mean)}
    if args.second_round:
        arm, recipe = second_arm, second_recipe
        second: list[dict[str, Any]] = []
        tasks = range(plan.train_tasks.stop, plan.train_tasks.stop + len(plan.train_tasks))
        for seed in args.seeds:
            pi1 = args.work / "round1" / f"s{seed}" / f"{arm}-{recipe}"
            pi2 = args.work / "round2" / f"s{seed}" / f"{arm}-{recipe}"
            grown = grow(pi1, arm, tasks, seed, args.work / "round2" / f"s{seed}",
                         still_to_train(pi2, [eval_figures(pi2, seed)]))
            trained = train(pi1, recipe, grown["datasets"], seed, pi2, plan)
            second.append({"seed": seed, "arm": arm, "recipe": recipe, "llm_calls": grown["llm_calls"],
                           "distinct_successes": grown["successes"], "generation_cpu_s": round(grown["cpu_s"], 1),
                           "training": trained,
                           "eval": pass_at_1(pi2, seed, plan) if "skipped" not in trained else None})
            print(json.dumps(second[-1]), flush=True)
        result["round2"] = second
        result["round2_gains_over_pi0"] = gains(second, base_mean)
        first = {r["seed"]: r["eval"]["pass_at_1"]["mean"] for r in rows
                 if (r["arm"], r["recipe"]) == (arm, recipe) and r["eval"]}
        result["round2_gains_over_pi1"] = gains([r for r in second if r["seed"] in first], first)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(markdown(rows, base_mean, result["gains"]))
    if args.second_round:
        print("\nRound two, gain over pi0:\n" + markdown(second, base_mean, result["round2_gains_over_pi0"]))
        print("\nRound two, gain over pi1:\n" + markdown(second, first, result["round2_gains_over_pi1"]))
    print(f"\npi0 pass@1 {statistics.mean(base_mean.values()):.3f}; gain in pass@1 over pi0 (mean ± sd over seeds):")
    for name, g in result["gains"].items():
        print(f"  {name:<18} {g['gain']:+.3f} ± {g['gain_sd']:.3f}   {g['gain_per_1k_calls']:+.4f} per 1k calls   "
              f"{g['gain_per_cpu_s']:+.6f} per CPU-s   ({g['seeds']} seeds)")
    print(f"figures in {args.out}")


if __name__ == "__main__":
    main()
