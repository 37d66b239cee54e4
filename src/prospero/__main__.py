"""`python -m prospero`: the `prospero` CLI (the daemon is `python -m prospero.daemon`)."""

from prospero.cli.main import main

main()
