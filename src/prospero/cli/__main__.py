"""`python -m prospero.cli`."""

from prospero.cli.main import main

main()
