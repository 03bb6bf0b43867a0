"""The commands that take a sweep's folder (SWEEP_URI): export, show, pull and aggregate."""

from __future__ import annotations

from pathlib import Path

import click

from thicket.cli.common import check_output_file, examples, write_text
from thicket.errors import BadInput


@click.command(short_help="Export a sweep's trees (tot-json) or its datasets as a Hub repository (hf).", epilog=examples(
    "thicket export out/demo-textcraft-mcts -o tot_agent_results.json",
    "thicket export s3://bucket/prefix/NAME --format tot-json -o - | gzip > tot.json.gz",
    "thicket export out/demo-textcraft-mcts --format hf -o hub/demo && hf upload you/demo hub/demo --repo-type dataset",
))
@click.argument("sweep_uri")
@click.option("--format", "fmt", type=click.Choice(["tot-json", "hf"]), default="tot-json", show_default=True,
              help="tot-json: the ToT pipeline's tot_agent_results.json, one episode per task with a path per leaf; "
                   "hf: the datasets folder, verified, as a Hugging Face Hub dataset repository holds it (-o: a new folder).")
@click.option("-o", "--output", type=click.Path(allow_dash=True), default=None,
              help="File to write; '-': stdout (the default only when stdout is not a terminal: exports are large). "
                   "With --format hf: the folder to write.")
def export(sweep_uri: str, fmt: str, output: str | None) -> None:
    """Export a sweep's committed trees in another pipeline's layout (tot-json: the ToT
    pipeline's tot_agent_results.json) to the file -o names, or (hf) its datasets to a folder
    ready for `hf upload REPO FOLDER --repo-type dataset`."""
    from thicket.export import export_tot_json

    if fmt == "hf":
        return export_hub(sweep_uri, output)
    if output is None:
        if click.get_text_stream("stdout").isatty():
            raise BadInput("export: give -o FILE (or -o - to print it on this terminal): an export is megabytes of JSON")
        output = "-"
    path = None if output == "-" else check_output_file(output)  # before the work
    text = export_tot_json(sweep_uri)
    if path is None:
        click.echo(text)
    else:
        write_text(path, text)
        click.echo(f"wrote {path}", err=True)


def export_hub(sweep_uri: str, output: str | None) -> None:
    from thicket.sweep_datasets import export_hub_folder

    if output in (None, "-"):
        raise BadInput("export --format hf: give -o FOLDER (a new or empty folder)")
    rows = export_hub_folder(sweep_uri, Path(output))
    full = ", ".join(f"{name} {count}" for name, count in sorted(rows.items()) if count) or "none"
    click.echo(f"wrote {output}: datasets (rows) {full}; upload: hf upload REPO {output} --repo-type dataset", err=True)


@click.command(short_help="Render one committed search tree as a standalone HTML page.", epilog=examples(
    "thicket show out/demo-textcraft-mcts --task 200          # writes tree-task-200.html",
    "thicket show s3://bucket/prefix/NAME --task 3 -o tree.html",
))
@click.argument("sweep_uri")
@click.option("--task", type=int, required=True, help="The task whose tree to show.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="HTML file to write (default: tree-task-N.html here; '-': stdout).")
def show(sweep_uri: str, task: int, output: str | None) -> None:
    """Render one committed search tree of SWEEP_URI as a standalone HTML page."""
    from thicket.show import show_html

    path = None if output == "-" else check_output_file(output or f"tree-task-{task}.html")  # before the work
    page = show_html(sweep_uri, task)
    if path is None:
        click.echo(page, nl=False)
        return
    write_text(path, page)
    click.echo(f"wrote {path}")


@click.command(short_help="Copy a sweep's committed trees and datasets/ into a folder.", epilog=examples(
    "thicket pull s3://bucket/prefix/NAME out/NAME",
    "thicket pull out/demo-textcraft-mcts /tmp/demo-copy --no-progress",
))
@click.argument("sweep_uri")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
def pull(sweep_uri: str, dest: str, progress: bool) -> None:
    """Copy a sweep's committed shards (checksums verified) and datasets/ to DEST; resumable."""
    from thicket.pull import pull_sweep

    for line in pull_sweep(sweep_uri, Path(dest), progress=progress).lines():
        click.echo(line)


@click.command(short_help="Build a sweep's datasets, stats and report under datasets/.", epilog=examples(
    "thicket aggregate out/demo-textcraft-mcts",
    "thicket aggregate s3://bucket/prefix/NAME --sft-min-reward 1 --workers 0",
))
@click.argument("sweep_uri")
@click.option("--verifier-url", help="OpenAI-compatible API root that judges revision steps (default: a heuristic).")
@click.option("--verifier-model", help="Model name served at --verifier-url.")
@click.option("--sft-min-reward", type=float, help="SFT: a path's return must reach this.")
@click.option("--sft-rows", type=click.Choice(["best", "distinct"]),
              help="SFT: per task the best success, or the best of each distinct action sequence (default: best).")
@click.option("--dpo-beta", type=float, help="DPO step pairs: minimum sibling value gap.")
@click.option("--dpo-min-visits", type=int, help="DPO step pairs: visits each sibling needs.")
@click.option("--max-trajectory-pairs", type=int, help="DPO trajectory pairs per task at most.")
@click.option("--dpo-thought-pairs/--no-dpo-thought-pairs", default=None,
              help="DPO: keep step pairs of the same action (differing thoughts) in deterministic envs (default: no).")
@click.option("--revision-alpha", type=float, help="Revision: a good path's value must exceed this.")
@click.option("--revision-beta", type=float, help="Revision: good minus bad value must exceed this.")
@click.option("--max-revisions", type=int, help="Revision trajectories per task at most.")
@click.option("--workers", type=click.IntRange(min=0), help="Processes building rows (default: by sweep size and cores; 0: none).")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
def aggregate(
    sweep_uri: str, verifier_url: str | None, verifier_model: str | None, workers: int | None, progress: bool,
    **flags: float | int | str | bool | None,
) -> None:
    """Build SWEEP_URI's datasets (SFT, DPO, revision, token rows), stats and report under datasets/."""
    from thicket.aggregate.driver import aggregate as build_datasets
    from thicket.aggregate.verifier import VerifierConfig

    if (verifier_url is None) != (verifier_model is None):
        raise BadInput("--verifier-url and --verifier-model go together")
    overrides = {
        "sft": {"min_reward": flags["sft_min_reward"], "rows": flags["sft_rows"]},
        "dpo": {"beta": flags["dpo_beta"], "min_visits": flags["dpo_min_visits"],
                "max_trajectory_pairs_per_task": flags["max_trajectory_pairs"], "thought_pairs": flags["dpo_thought_pairs"]},
        "revision": {"alpha": flags["revision_alpha"], "beta": flags["revision_beta"], "max_per_task": flags["max_revisions"]},
    }
    verifier = VerifierConfig(verifier_url, verifier_model) if verifier_url and verifier_model else None
    for line in build_datasets(sweep_uri, overrides, verifier, workers=workers, progress=progress).lines():
        click.echo(line)
