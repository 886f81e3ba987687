"""`python -m agentrig` (and `accelerate launch -m agentrig train ...`) runs the CLI."""

import sys

from agentrig.cli import main

sys.exit(main())
