"""`python -m logitreplay` (and `torchrun -m logitreplay replay ...`): the same command as the
`logitreplay` script."""

import sys

from logitreplay.cli import main

sys.exit(main())
