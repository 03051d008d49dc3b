"""``python -m tidemq`` runs the command line."""

from tidemq.cli import main

main()
