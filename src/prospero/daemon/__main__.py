"""`python -m prospero.daemon` runs prosperod."""

import sys

from prospero.daemon.main import main

sys.exit(main())
