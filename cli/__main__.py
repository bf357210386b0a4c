"""`python -m cli`: the same entry point as the `xclp` script."""

import sys

from cli.main import main

sys.exit(main())
