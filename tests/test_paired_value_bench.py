"""bench/paired_value.py's analysis (issue 52), on outcomes made up here with figures worked by hand:
the design it prints before evaluating, and the table it makes after, so that the bench cannot rot
between the (hour-long) runs that measure it. Evaluating, growing and training are the product's
and data_value.py's own steps, tested elsewhere."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import paired_value as pv  # noqa: E402

GOALS = 8


def figures(successes: list[int], samples: int, seed: int = 0) -> dict:
    return {"seed": seed, "samples": samples,
            "outcomes": [[200 + goal, samples, c, 0] for goal, c in enumerate(successes)]}


def arm(name: str, sampled: list[int], greedy: list[int], calls: int) -> dict:
    return {"seed": 0, "arm": name, "llm_calls": calls, "distinct_successes": 9, "training": {"rows": 5},
            "sampled": figures(sampled, 4), "greedy": figures(greedy, 1)}


def test_the_design_from_a_pilot_by_hand():
    # Two goals at 2 of 4 (spread 0.25 x 4/3 -> capped at 0.25: q' = 0.5), six never solved.
    pilot = figures([2, 2, 0, 0, 0, 0, 0, 0], 4)
    design = pv.design(pilot, 32)
    z = 1.959964 + 0.841621
    assert design["goals"] == GOALS and design["goals_ever_solved"] == 2
    assert design["mde_sampled"] == pytest.approx(z * math.sqrt(2 * 2 * 0.25 / 32) / GOALS, rel=1e-5)
    assert design["mde_greedy"] == pytest.approx(z * math.sqrt(2 * 2 * 0.25) / GOALS, rel=1e-5)
    # Greedy at this spread (0.25 x 2/8 = 0.0625 a goal): (z / 0.02)^2 x 2 x 0.0625 goals for 0.02.
    assert design["greedy_goals_for_target"] == pytest.approx((z / 0.02) ** 2 * 2 * 0.0625, rel=1e-5)


def test_the_table_pairs_every_arm_with_pi0_and_with_sampling():
    base = {"sampled": figures([0, 1, 0, 0, 0, 0, 0, 0], 4), "greedy": figures([0] * 8, 1)}
    rows = [arm("sample", [1, 1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], 1000),
            arm("mcts", [2, 2, 1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0], 2000)]
    table = pv.comparisons(base, rows)
    sample, mcts = table
    for how in pv.Resampling:
        assert sample["gain"][how].mean == pytest.approx(1 / 4 / GOALS)  # one more success in 4 on one goal
        assert mcts["gain"][how].mean == pytest.approx(4 / 4 / GOALS)
        assert mcts["vs_baseline"][how].mean == pytest.approx(3 / 4 / GOALS)
        # Per call: mcts gains 0.125 over 2k calls, sampling 0.03125 over 1k: 0.0625 / 0.03125 = 2.
        assert mcts["ratio_per_call"][how].mean == pytest.approx(2.0)
        assert mcts["ratio_per_call"][how].low is None  # sampling's gain is <= 0 in some resamples: unbounded
    assert "vs_baseline" not in sample  # the baseline is not compared with itself
    # Greedy: mcts solves 3 goals pi0 never does: 3 discordant, all one way, p = 2 / 8.
    assert mcts["greedy_p_vs_pi0"] == pytest.approx(0.25)
    assert mcts["greedy_p_vs_baseline"] == pytest.approx(0.5)  # 2 discordant, one way: 2 / 4
    text = pv.markdown(table)
    assert text.count("\n") == 3 and "| mcts |" in text and "unbounded" in text
    # Each figure's point once, then the two kinds' intervals.
    gain = mcts["gain"]
    assert (f"| +0.125 [{gain[pv.Resampling.SAMPLES].low:.3f}, {gain[pv.Resampling.SAMPLES].high:.3f}] · goals "
            f"[{gain[pv.Resampling.TASKS].low:.3f}, {gain[pv.Resampling.TASKS].high:.3f}] |") in text
    assert "| 2.00 [unbounded, unbounded] · goals [unbounded, unbounded] |" in text
    for how in pv.Resampling:
        interval = mcts["vs_baseline"][how]
        assert pv.achieved_mde(table, how) == pytest.approx(
            pv.z_sum() * (interval.high - interval.low) / 2 / 1.96, rel=1e-6)
    seeds = pv.over_seeds(table + [{**mcts, "seed": 1, "vs_baseline": {
        pv.Resampling.SAMPLES: replace(mcts["vs_baseline"][pv.Resampling.SAMPLES], mean=0.0)}}])
    assert seeds["mcts"]["vs_baseline"]["per_seed"] == pytest.approx([3 / 4 / GOALS, 0.0])
    assert seeds["mcts"]["vs_baseline"]["sd"] == pytest.approx(3 / 4 / GOALS / math.sqrt(2))
    assert seeds["mcts"]["gain"]["per_seed"] == pytest.approx([4 / 4 / GOALS] * 2)
    assert "vs_baseline" not in seeds["sample"] and seeds["sample"]["gain"]["t95"] is None  # one seed: no interval
    assert pv.as_json({pv.Resampling.TASKS: mcts["gain"][pv.Resampling.TASKS]})["TASKS"]["tasks"] == GOALS


def test_a_goal_missing_from_an_evaluation_stops_the_comparison():
    broken = figures([1, 0], 4)
    broken["outcomes"][1][1] = 0  # no evaluated sample on the second goal
    with pytest.raises(SystemExit, match="not paired"):
        pv.per_goal(broken)


def test_held_out_goals_are_explored_on_other_instances_of_the_evaluated_goals():
    """--explore held-out-goals: trees grow on the evaluated goals (TextCraft's task i is goal
    i mod 419), never on an evaluated task, and never on a goal pi0 trained on."""
    from thicket.envs.textcraft import make_task
    from thicket.training.demo_model import DEMO_RECIPE

    explored, evaluated = pv.EXPLORE["held-out-goals"], range(*pv.dv.FULL.eval_goals)
    assert len(explored) == len(evaluated) == 64 and not set(explored) & set(evaluated)
    for tree_task, eval_task in zip(explored, evaluated):
        there, here = make_task(tree_task), make_task(eval_task)
        assert there.goal == here.goal and there.text != here.text  # the same goal, drawn anew
    pi0 = replace(DEMO_RECIPE, held_out_goals=pv.dv.FULL.eval_goals)
    assert not {task % 419 for task in pi0.expert_tasks()} & {task % 419 for task in explored}
    assert pv.EXPLORE["own-goals"] == pv.dv.FULL.train_tasks


def test_a_model_is_trained_again_only_where_its_weights_and_an_evaluation_are_missing(tmp_path, monkeypatch):
    """data_value.still_to_train, which both benches use to resume on another machine: kept training
    figures without the weights are forgotten unless every evaluation the run needs was kept."""
    from kept import Kept

    work, record = tmp_path / "work", tmp_path / "record"
    monkeypatch.setattr(pv.dv, "KEPT", Kept(work, record))
    model = work / "s0" / "mcts-sft"
    sampled, greedy = work / "s0" / "mcts-sft.eval.json", work / "s0" / "mcts-sft.greedy.json"
    assert pv.dv.still_to_train(model, [sampled, greedy])  # never trained
    pv.dv.KEPT.figures(pv.dv.train_figures(model), lambda: {"rows": 4})
    pv.dv.KEPT.figures(sampled, lambda: {"pass_at_1": 0.1})
    # Trained on another machine, one evaluation kept: the other needs the weights, so train again.
    assert pv.dv.still_to_train(model, [sampled, greedy])
    assert not pv.dv.KEPT.has(pv.dv.train_figures(model))
    pv.dv.KEPT.figures(pv.dv.train_figures(model), lambda: {"rows": 4})
    pv.dv.KEPT.figures(greedy, lambda: {"pass_at_1": 0.1})
    assert not pv.dv.still_to_train(model, [sampled, greedy])  # every evaluation kept
    assert pv.dv.still_to_train(model, [work / "s0" / "mcts-sft.other.json"])
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    pv.dv.KEPT.figures(pv.dv.train_figures(model), lambda: {"rows": 4})
    assert not pv.dv.still_to_train(model, [work / "s0" / "mcts-sft.other.json"])  # the weights are here


def test_the_interval_over_seeds_is_students_t_worked_by_hand():
    # Round two's MCTS against sampling at seeds 0-2: mean 0.011/3, sd 0.019142 (sum of squared
    # deviations 0.00073267 / 2), t(2, 0.975) = 4.3027 (any t table): half-width 4.3027 x 0.019142 / sqrt(3).
    values = [-0.014, 0.001, 0.024]
    low, high = pv.t_interval(values)
    half = 4.302653 * math.sqrt(0.00073267 / 2) / math.sqrt(3)
    assert (low, high) == pytest.approx((0.011 / 3 - half, 0.011 / 3 + half), abs=1e-5)
    assert high - low == pytest.approx(2 * 0.04755, abs=1e-4)
    # Six seeds at the same spread: t(5, 0.975) = 2.5706, so the half-width falls to 2.5706 x sd / sqrt(6).
    six = values * 2
    low6, high6 = pv.t_interval(six)
    assert (high6 - low6) / 2 == pytest.approx(2.570582 * pv.statistics.stdev(six) / math.sqrt(6), rel=1e-5)
    assert pv.t_interval([0.01]) is None
    text = "\n".join(pv.over_seeds_lines({"mcts": {"gain": {"seeds": 3, "per_seed": values, "mean": 0.011 / 3,
                                                              "sd": 0.019, "t95": (low, high)}}}))
    assert "mcts: gain over pi0, over 3 seed(s): +0.004 [-0.044, +0.051]" in text
