"""`python -m rigkit.cli`: the same as the `rigkit` command."""

import sys

from rigkit.cli import main

sys.exit(main())
