"""`python -m thicket.cli`: the `thicket` command (how thicket.envs.process starts `serve-env`)."""

from thicket.cli import main

main()
