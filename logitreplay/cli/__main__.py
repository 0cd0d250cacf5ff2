"""`python -m logitreplay.cli`: the same command as the `logitreplay` script."""

import sys

from logitreplay.cli import main

sys.exit(main())
