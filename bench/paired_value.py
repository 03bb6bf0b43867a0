"""What the trees are worth, with the power to tell the arms apart (issue 52): data_value.py's first
round, SFT on each search's successes from the same pi0 at the same call budget, judged by a paired
evaluation whose minimum detectable effect is computed before it runs.

    bash bench/trl_venv.sh                       # TRL in bench/.venv-trl (CPU torch)
    .venv/bin/python bench/paired_value.py [--seeds 0] [--arms sample mcts dense] [--samples 32]
                                           [--work DIR] [--record bench/results/data_value]

1. Pilot: pi0 on the held-out goals at data_value.py's 4 samples a goal. From its per-goal rates,
   the minimum detectable effect (80% power, two-sided 0.05) of the sampled design (--samples a
   goal) and of greedy decoding (one outcome a goal), printed before anything else is evaluated.
2. pi0 and every pi1 evaluated on the same goals, with the same sampling seed: --samples a goal at
   the demo policy's temperature, and greedily (temperature 0). Each goal's outcomes are kept.
3. Per arm: pass@1, its gain over pi0 and its difference from sampling's pi1, paired over goals,
   and the ratio of its gain per call to sampling's, each with two bootstrap intervals: the goals
   fixed and their samples redrawn (could sampling noise give this?), and the goals redrawn (would
   it hold on other goals like these?); McNemar's exact test on the greedy outcomes. The achieved
   MDE of each kind (2.80 x the observed standard error of the differences) is printed too.

Trees are grown and pi1s trained by data_value.py's own steps (same budget and training settings),
in their own folder (`paired/`), so its recorded round one is left as it was measured. Where the
trees grow (--explore):

- `own-goals` (round one's): tasks 300-331, goals pi0 trained on. Asks whether a search's data
  transfers to goals no policy has seen; pi0 is at ~0.04 there, and the data never aims at them.
- `held-out-goals`: the held-out goals' other instances, tasks 619-682 (TextCraft's task i is goal
  i mod 419, drawn with its own distractors and line order; pi0 saw none of these goals). The
  evaluation stays on tasks 200-263. Asks what a search is for: does its data teach pi0 the goals
  it fails, better than sampling's at the same calls? The room to improve is then pi0's whole
  failure rate, not what transfers from other goals.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data_value as dv  # noqa: E402
from kept import Kept  # noqa: E402
from scipy.stats import t as student_t  # noqa: E402
from search_quality import machine  # noqa: E402

from thicket.envs.env_args import distinct_tasks  # noqa: E402
from thicket.estimators import LEVEL  # noqa: E402
from thicket.evaluation.paired import (  # noqa: E402
    Ratio, Resampling, gain_ratio, mcnemar_exact, minimum_detectable_effect, paired_difference, pass_at_1, pilot_rates,
    z_sum)
from thicket.evaluation.run import evaluate  # noqa: E402
from thicket.tiny_model import vllm_python  # noqa: E402
from thicket.training.evaluate import pass_spec  # noqa: E402
from thicket.vllm_server import VLLMServer  # noqa: E402

PILOT_SAMPLES = dv.EVAL_SAMPLES
SAMPLES = 32
TARGET_MDE = 0.02
BASELINE = "sample"
GOALS = distinct_tasks("textcraft", {})  # TextCraft's task i is goal i mod this (419)
assert GOALS is not None
EXPLORE = {"own-goals": dv.FULL.train_tasks,
           "held-out-goals": range(dv.FULL.eval_goals[0] + GOALS, dv.FULL.eval_goals[1] + GOALS)}


def outcomes_of(model: Path, scratch: Path, tasks: range, samples: int, seed: int, temperature: float | None,
                ) -> dict[str, Any]:
    """The model's outcomes on the tasks, thicket eval's path: per goal [task, samples, successes, excluded]."""
    scratch.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with VLLMServer(str(model), served_name=model.name, python=vllm_python(), log_path=scratch / "vllm.log") as server:
        policy = {"kind": "openai", "url": server.url, "model": server.served_name}
        if temperature is not None:
            policy["temperature"] = temperature
        evaluation = evaluate(pass_spec(policy, scratch, tasks, samples, seed), tasks, (1,))
    return {"samples": samples, "seed": seed, "temperature": temperature,
            "pass_at_1": evaluation.to_json()["pass_at_1"], "wall_s": round(time.perf_counter() - started, 1),
            "outcomes": [[o.task, o.samples, o.successes, o.excluded] for o in evaluation.outcomes]}


def evaluated(model: Path, at: Path, samples: int, seed: int, temperature: float | None) -> dict[str, Any]:
    """The model's outcomes, kept in `at`.json (and recorded); the evaluation's sweep in folder `at`."""
    tasks = range(*dv.FULL.eval_goals)
    return dv.kept(at.with_name(f"{at.name}.json"),
                   lambda: outcomes_of(model, at, tasks, samples, seed, temperature))


def per_goal(figures: dict[str, Any]) -> list[tuple[int, int]]:
    """Each goal's (evaluated samples, successes), in task order; a goal with no evaluated sample is
    an error here: the paired comparison needs every goal under every policy."""
    rows = sorted(figures["outcomes"])
    if any(samples == 0 for _, samples, _, _ in rows):
        raise SystemExit(f"a goal has no evaluated sample (seed {figures['seed']}): the comparison is not paired")
    return [(samples, successes) for _, samples, successes, _ in rows]


def solved(figures: dict[str, Any]) -> list[bool]:
    return [c > 0 for _, c in per_goal(figures)]


def design(pilot: dict[str, Any], samples: int) -> dict[str, Any]:
    rates = pilot_rates([(n, c) for _, n, c, _ in pilot["outcomes"]])
    goals, mde_greedy = len(rates), minimum_detectable_effect(rates, 1)
    # Greedy (one outcome a goal): the MDE falls as 1/sqrt(goals) at this spread, so this many reach the target.
    greedy_goals = goals * (mde_greedy / TARGET_MDE) ** 2
    return {"goals": goals, "pilot_samples": PILOT_SAMPLES, "goals_ever_solved": sum(1 for _, _, c, _ in pilot["outcomes"] if c),
            "mde_sampled": minimum_detectable_effect(rates, samples), "mde_greedy": mde_greedy,
            "samples": samples, "greedy_goals_for_target": greedy_goals}


def arm_model(work: Path, seed: int, arm: str, explore: str) -> Path:
    folder = work / "paired" if explore == "own-goals" else work / "paired" / f"explore-{explore}"
    return folder / f"s{seed}" / f"{arm}-sft"


def pi1(pi0: Path, arm: str, seed: int, work: Path, samples: int, explore: str) -> dict[str, Any]:
    """One arm at one seed: its trees (on the tasks `explore` names), its pi1 (SFT on the
    successes), pi1's two evaluations."""
    model = arm_model(work, seed, arm, explore)
    sampled, greedy = (model.with_name(f"{model.name}.{name}") for name in (f"eval-s{seed}-x{samples}", "greedy"))
    to_train = dv.still_to_train(model, [at.with_name(f"{at.name}.json") for at in (sampled, greedy)])
    grown = dv.grow(pi0, arm, EXPLORE[explore], seed, model.parent, to_train)
    trained = dv.train(pi0, "sft", grown["datasets"], seed, model, dv.FULL)
    row = {"seed": seed, "arm": arm, "recipe": "sft", "llm_calls": grown["llm_calls"],
           "distinct_successes": grown["successes"], "generation_cpu_s": round(grown["cpu_s"], 1), "training": trained}
    if "skipped" not in trained:
        row["sampled"] = evaluated(model, sampled, samples, seed, None)
        row["greedy"] = evaluated(model, greedy, 1, seed, 0.0)
    return row


def comparisons(base: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm at one seed: gain over pi0 and difference from sampling's pi1, paired over goals, each
    with both intervals (sampling noise on these goals; other goals like these)."""
    baseline = next((r for r in rows if r["arm"] == BASELINE and "sampled" in r), None)
    out = []
    for row in rows:
        if "sampled" not in row:
            continue
        base_s, arm_s = per_goal(base["sampled"]), per_goal(row["sampled"])
        figures = {"seed": row["seed"], "arm": row["arm"], "rows": row["training"]["rows"], "llm_calls": row["llm_calls"],
                   "distinct_successes": row["distinct_successes"], "sampled": pass_at_1(arm_s),
                   "gain": {how: paired_difference(base_s, arm_s, how) for how in Resampling},
                   "greedy": pass_at_1(per_goal(row["greedy"])),
                   "greedy_gain": pass_at_1(per_goal(row["greedy"])) - pass_at_1(per_goal(base["greedy"])),
                   "greedy_p_vs_pi0": mcnemar_exact(solved(base["greedy"]), solved(row["greedy"]))}
        if baseline is not None and baseline is not row:
            low_s = per_goal(baseline["sampled"])
            figures["vs_baseline"] = {how: paired_difference(low_s, arm_s, how) for how in Resampling}
            figures["ratio_per_call"] = {how: gain_ratio(base_s, low_s, arm_s, baseline["llm_calls"] / 1000,
                                                         row["llm_calls"] / 1000, how) for how in Resampling}
            figures["greedy_p_vs_baseline"] = mcnemar_exact(solved(baseline["greedy"]), solved(row["greedy"]))
        out.append(figures)
    return out


def markdown(table: list[dict[str, Any]]) -> str:
    """One line an arm: each paired figure with its interval against sampling noise, then over goals."""
    def both(figure: dict[Resampling, Any]) -> str:
        """The point once, then each kind's interval: `+0.024 [0.014, 0.034] · goals [-0.019, 0.073]`."""
        samples, goals = figure[Resampling.SAMPLES], figure[Resampling.TASKS]
        if isinstance(samples, Ratio):
            return f"{samples} · goals {str(goals).partition(' ')[2]}"
        return f"{samples.mean:+.3f} [{samples.low:.3f}, {samples.high:.3f}] · goals [{goals.low:.3f}, {goals.high:.3f}]"

    lines = ["| seed | arm (SFT) | LLM calls | distinct successes | rows | pass@1 | gain over pi0 [95%: samples · goals] "
             "| vs sample/sft [95%: samples · goals] | gain per call / sample's [95%: samples · goals] | greedy pass@1 "
             "(gain; McNemar p vs pi0, vs sample) |", "|---:|---|---:|---:|---:|---:|---|---|---|---|"]
    for f in table:
        p_base = f.get("greedy_p_vs_baseline")
        lines.append(f"| {f['seed']} | {f['arm']} | {f['llm_calls']:,} | {f['distinct_successes']} | {f['rows']} | "
                     f"{f['sampled']:.3f} | {both(f['gain'])} | {both(f['vs_baseline']) if 'vs_baseline' in f else '—'} | "
                     f"{both(f['ratio_per_call']) if 'ratio_per_call' in f else '—'} | {f['greedy']:.3f} "
                     f"({f['greedy_gain']:+.3f}; p {f['greedy_p_vs_pi0']:.2f}, "
                     f"{'—' if p_base is None else f'{p_base:.2f}'}) |")
    return "\n".join(lines)


def achieved_mde(table: list[dict[str, Any]], how: Resampling) -> float | None:
    """z_sum x the standard error (half the 95% interval / 1.96) of the arm-against-sampling
    differences, the largest over arms: what this run could in fact detect, by either kind."""
    widths = [(f["vs_baseline"][how].high - f["vs_baseline"][how].low) / 2 / 1.96 for f in table if "vs_baseline" in f]
    return z_sum() * max(widths) if widths else None


def t_interval(values: list[float], level: float = LEVEL) -> tuple[float, float] | None:
    """Student's t interval for the mean of independent replicates (None below two): with a handful
    of seeds a bootstrap over them would be too narrow (it uses the normal's quantile and the
    plug-in sd)."""
    if len(values) < 2:
        return None
    half = student_t.ppf((1 + level) / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    mean = statistics.mean(values)
    return mean - half, mean + half


def over_seeds(table: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm, one value a seed: its gain over pi0 and (not for sampling) its difference from
    sampling's pi1, each with its mean, sd and t interval over seeds. Each seed grows its own trees,
    trains its own pi1s and draws its own evaluation samples, so the spread between seeds holds all
    three: this interval asks whether the recipe's advantage holds at another seed, which one
    seed's intervals (its trees and pi1s fixed) cannot."""
    def summary(values: list[float]) -> dict[str, Any]:
        return {"seeds": len(values), "per_seed": values, "mean": statistics.mean(values),
                "sd": statistics.stdev(values) if len(values) > 1 else 0.0, "t95": t_interval(values)}

    out: dict[str, dict[str, Any]] = {}
    for arm in dict.fromkeys(f["arm"] for f in table):
        rows = [f for f in table if f["arm"] == arm]
        out[arm] = {"gain": summary([f["gain"][Resampling.SAMPLES].mean for f in rows])}
        against = [f["vs_baseline"][Resampling.SAMPLES].mean for f in rows if "vs_baseline" in f]
        if against:
            out[arm]["vs_baseline"] = summary(against)
    return out


def over_seeds_lines(seeds: dict[str, dict[str, Any]]) -> list[str]:
    def line(what: str, s: dict[str, Any]) -> str:
        interval = "" if s["t95"] is None else f" [{s['t95'][0]:+.3f}, {s['t95'][1]:+.3f}]"
        return (f"{what}, over {s['seeds']} seed(s): {s['mean']:+.3f}{interval} (t 95%; sd {s['sd']:.3f}; per seed "
                f"{', '.join(f'{v:+.3f}' for v in s['per_seed'])})")

    lines = []
    for arm, figures in seeds.items():
        lines.append(line(f"{arm}: gain over pi0", figures["gain"]))
        if "vs_baseline" in figures:
            lines.append(line(f"{arm} against {BASELINE}", figures["vs_baseline"]))
    return lines


def as_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {(k.name if isinstance(k, Resampling) else k): as_json(v) for k, v in value.items()}
    return value.__dict__ if hasattr(value, "__dict__") else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--arms", nargs="+", default=[BASELINE, "mcts", "dense"], choices=list(dv.RECIPES))
    parser.add_argument("--samples", type=int, default=SAMPLES, help="samples a goal of the sampled evaluation")
    parser.add_argument("--explore", choices=list(EXPLORE), default="own-goals",
                        help="where the arms grow their trees (see the module's docstring)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "thicket-data-value")
    parser.add_argument("--record", type=Path, default=dv.RECORD)
    parser.add_argument("--out", default="paired_value.json")
    args = parser.parse_args()
    if not dv.TRL_PYTHON.is_file():
        raise SystemExit("no bench/.venv-trl: run `bash bench/trl_venv.sh` first")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    dv.KEPT = Kept(work, args.record.resolve())
    pi0 = dv.base_policy(work, None, dv.FULL)
    dv.check_same_base(pi0, work)

    plan = {}
    for seed in args.seeds:
        pilot = evaluated(pi0, work / "paired" / f"pi0.pilot-s{seed}", PILOT_SAMPLES, seed, None)
        plan[seed] = design(pilot, args.samples)
        d = plan[seed]
        print(f"design (seed {seed}): {d['goals']} held-out goals; pilot pi0 at {PILOT_SAMPLES} a goal solved "
              f"{d['goals_ever_solved']} of them at least once. Minimum detectable effect at 80% power, two-sided "
              f"0.05: {d['mde_sampled']:.4f} at {args.samples} samples a goal, {d['mde_greedy']:.4f} greedy (greedy "
              f"would need {d['greedy_goals_for_target']:,.0f} goals at this spread for {TARGET_MDE})", flush=True)

    table, rows_all = [], []
    for seed in args.seeds:
        at = work / "paired" / "pi0"
        base = {"sampled": evaluated(pi0, at.with_name(f"pi0.eval-s{seed}-x{args.samples}"), args.samples, seed, None),
                "greedy": evaluated(pi0, at.with_name("pi0.greedy"), 1, seed, 0.0)}
        rows = [pi1(pi0, arm, seed, work, args.samples, args.explore) for arm in args.arms]
        rows_all.extend(rows)
        table.extend(comparisons(base, rows))
        print(f"seed {seed}: pi0 pass@1 {pass_at_1(per_goal(base['sampled'])):.3f} sampled, "
              f"{pass_at_1(per_goal(base['greedy'])):.3f} greedy", flush=True)

    achieved = {how.name: achieved_mde(table, how) for how in Resampling}
    seeds = over_seeds(table)
    tasks = EXPLORE[args.explore]
    result = {"date": datetime.date.today().isoformat(), "machine": machine(), "explore": args.explore,
              "tree_tasks": [tasks.start, tasks.stop], "design": plan, "rows": rows_all,
              "table": [as_json(f) for f in table], "achieved_mde": achieved, "over_seeds": seeds}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(markdown(table))
    for how in Resampling:
        if achieved[how.name] is not None:
            print(f"achieved MDE of the arm-against-sampling differences, resampling {how.value}: "
                  f"{achieved[how.name]:.4f}")
    for line in over_seeds_lines(seeds):
        print(line)
    print(f"figures in {args.out}")


if __name__ == "__main__":
    main()
